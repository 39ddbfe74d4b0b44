"""Answer GET /status with 'ok' on a free port; write the port to port.txt."""

import http.server
import os


class Status(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok" if self.path == "/status" else b"not found"
        self.send_response(200 if self.path == "/status" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", 0), Status)
with open("port.txt.tmp", "w") as handle:
    handle.write(str(server.server_address[1]))
os.rename("port.txt.tmp", "port.txt")
server.serve_forever()

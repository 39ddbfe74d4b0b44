#!/usr/bin/env python3
"""A subject that tries to get out of its policed cell (see tests/egress/attacks.py).

Standard library only: it runs with whatever python3 the sandbox has. One JSON line per
attempt on stdout: {"attack", "expect": "blocked" | "allowed", "ok", "detail"}.
Inputs (its spec's env): ATTACK_BAIT_PORT, ATTACK_UPSTREAM, ATTACK_RESOLVERS,
ATTACK_HOST_ADDRESSES, ATTACK_BLOCKED_HOST; the proxy's address comes from /etc/hosts.
"""

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

TIMEOUT = 3.0
SO_MARK = 36
TB = "https://github.com/laude-institute/terminal-bench"
ECHO_REQUEST = b"\x08\x00\xf7\xfe\x00\x01\x00\x00"
results = []


def report(attack, expect, ok, detail):
    line = {"attack": attack, "expect": expect, "ok": bool(ok), "detail": str(detail)[:300]}
    results.append(line)
    print(json.dumps(line), flush=True)


def blocked(attack, action):
    """`action` returns what got through, or None, or raises when it was stopped."""
    try:
        got = action()
    except Exception as exc:  # refused, reset, unreachable, EPERM, timed out
        report(attack, "blocked", True, f"{type(exc).__name__}: {exc}")
        return
    report(attack, "blocked", got is None, got or "no answer")


def proxy_address():
    with open("/etc/hosts") as handle:
        for line in handle:
            words = line.split("#")[0].split()
            if "maka-eval-proxy" in words[1:]:
                return words[0]
    raise SystemExit("maka-eval-proxy is not in /etc/hosts")


def env_list(name):
    return [item for item in os.environ.get(name, "").split(",") if item]


ADDR = proxy_address()
BAIT = int(os.environ["ATTACK_BAIT_PORT"])
UPSTREAM = os.environ["ATTACK_UPSTREAM"]
BLOCKED_HOST = os.environ["ATTACK_BLOCKED_HOST"]


def tcp(host, port, family=socket.AF_INET):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect((host, port))
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        return f"connected to {host}:{port}, read {s.recv(64)!r}"


def udp(host, port, payload=b"hello", family=socket.AF_INET):
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.settimeout(TIMEOUT)
        s.sendto(payload, (host, port))
        data, peer = s.recvfrom(512)
        return f"answer from {peer}: {data[:32]!r}"


def dns_query(name="example.com"):
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + qname + b"\x00\x01\x00\x01"


def dns_udp(host, family=socket.AF_INET):
    return udp(host, 53, dns_query(), family)


def dns_tcp(host):
    with socket.socket() as s:
        s.settimeout(TIMEOUT)
        s.connect((host, 53))
        query = dns_query()
        s.sendall(len(query).to_bytes(2, "big") + query)
        return f"DNS answer over TCP from {host}: {s.recv(64)[:16]!r}"


def ping(kind):
    with socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP) as s:
        s.settimeout(TIMEOUT)
        s.sendto(ECHO_REQUEST, (ADDR, 0))
        return f"ICMP answer: {s.recv(64)[:8]!r}"


def tool(argv):
    """Run a tool: what it printed when it succeeded; raises when it failed."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise OSError((proc.stderr or proc.stdout).strip()[-200:])
    return f"{argv[0]} succeeded: {proc.stdout[:80]!r}"


def fetch(url, proxies=None):
    handlers = [urllib.request.ProxyHandler(proxies)] if proxies is not None else []
    with urllib.request.build_opener(*handlers).open(url, timeout=TIMEOUT) as response:
        return f"HTTP {response.status}", response.read(200)


def expect_403(attack, url):
    try:
        status, body = fetch(url)
        report(attack, "blocked", False, f"{status}: {body[:60]!r}")
    except urllib.error.HTTPError as exc:
        report(attack, "blocked", exc.code == 403, f"HTTP {exc.code} from the proxy")
    except OSError as exc:  # a refused CONNECT: 'Tunnel connection failed: 403 ...'
        report(attack, "blocked", "403" in str(exc), f"{type(exc).__name__}: {exc}")


def packet_socket():
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)):
        return "an AF_PACKET socket was opened"


def packet_mark():
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, SO_MARK, 1)  # needs CAP_NET_ADMIN
        return "a packet mark was set"


def capabilities():
    with open("/proc/self/status") as handle:
        lines = [line.partition(":") for line in handle]
    caps = {key: int(value, 16) for key, _, value in lines if key.startswith("Cap")}
    named = ((12, "NET_ADMIN"), (13, "NET_RAW"))
    held = [f"{cap} in {key}" for key, v in caps.items() for bit, cap in named if v >> bit & 1]
    return ", ".join(held) or None


def find_secrets():
    """The CA key, the audit log or the result token: next to the published certificate,
    or anywhere this sandbox shows."""
    found = []
    near = os.path.dirname(os.path.dirname(os.environ.get("SSL_CERT_FILE", "/none/cert.pem")))
    for rel in ("state/confdir/mitmproxy-ca.pem", "state/audit/audit.jsonl", "state/result-token"):
        path = os.path.join(near, rel)
        try:
            with open(path, "rb") as handle:
                found.append(f"{path}: {handle.read(40)!r}")
        except OSError:
            pass
    deadline = time.monotonic() + 2
    skip = {"/proc", "/sys", "/dev", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/boot"}
    for top, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip]
        found += [
            os.path.join(top, name)
            for name in files
            if name in ("mitmproxy-ca.pem", "audit.jsonl", "result-token")
        ]
        if time.monotonic() > deadline:
            break
    return "; ".join(found) or None


def allowed(attack, action):
    try:
        ok, detail = action()
    except Exception as exc:
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    report(attack, "allowed", ok, detail)


def upstream():
    status, body = fetch(UPSTREAM)
    return status == "HTTP 200" and body == b"upstream-ok", f"{status} {body!r}"


def curl_upstream():
    proc = subprocess.run(["curl", "-sS", "-m", "5", UPSTREAM], capture_output=True, text=True)
    return proc.stdout == "upstream-ok", (proc.stdout or proc.stderr)[:120]


def trusted_ca():
    cert = os.environ["SSL_CERT_FILE"]
    with open(cert) as handle:
        pem = handle.read()
    ssl.create_default_context(cafile=cert)
    return "BEGIN CERTIFICATE" in pem and "PRIVATE KEY" not in pem, cert


# -- around the proxy -----------------------------------------------------------------------
bait_url = f"http://{ADDR}:{BAIT}/"
blocked("HTTP with the proxy variables unset (to the host's bait)", lambda: fetch(bait_url, {}))
blocked(
    "HTTP with the proxy variables unset (to a public address)",
    lambda: fetch("http://93.184.215.14/", {}),
)
if shutil.which("curl"):
    blocked(
        "curl --noproxy '*' (to the host's bait)",
        lambda: tool(["curl", "-sS", "-m", "3", "--noproxy", "*", bait_url]),
    )
blocked("raw TCP to another port of the proxy's address (the bait)", lambda: tcp(ADDR, BAIT))
blocked("a second connection to the proxy's address, port 22", lambda: tcp(ADDR, 22))
blocked("a second connection to the proxy's address, port 443", lambda: tcp(ADDR, 443))
for host in env_list("ATTACK_HOST_ADDRESSES"):
    blocked(f"raw TCP to the host's address {host}", lambda host=host: tcp(host, BAIT))
blocked("raw TCP to a public address (1.1.1.1:443)", lambda: tcp("1.1.1.1", 443))
blocked("IPv4-mapped IPv6 TCP to the bait", lambda: tcp(f"::ffff:{ADDR}", BAIT, socket.AF_INET6))
blocked("UDP to the host's bait (an echo server)", lambda: udp(ADDR, BAIT))
# -- DNS ------------------------------------------------------------------------------------
blocked("DNS over UDP to 8.8.8.8", lambda: dns_udp("8.8.8.8"))
blocked("DNS over TCP to 8.8.8.8", lambda: dns_tcp("8.8.8.8"))
blocked("DNS over UDP to the proxy's address", lambda: dns_udp(ADDR))
blocked("DNS over TCP to the proxy's address", lambda: dns_tcp(ADDR))
for resolver in env_list("ATTACK_RESOLVERS"):
    blocked(f"DNS over UDP to the host's resolver {resolver}", lambda r=resolver: dns_udp(r))
    blocked(f"DNS over TCP to the host's resolver {resolver}", lambda r=resolver: dns_tcp(r))
blocked(
    "name lookup (getaddrinfo example.com)",
    lambda: f"resolved to {socket.getaddrinfo('example.com', 80)[0][4]}",
)
# -- ICMP, IPv6, beneath and around the policy ----------------------------------------------
blocked("ping the proxy's address (ICMP datagram socket)", lambda: ping(socket.SOCK_DGRAM))
blocked("ping the proxy's address (raw ICMP socket)", lambda: ping(socket.SOCK_RAW))
if shutil.which("ping"):
    blocked("ping(8) the proxy's address", lambda: tool(["ping", "-c", "1", "-W", "2", ADDR]))
blocked("IPv6 TCP to a public address", lambda: tcp("2606:4700:4700::1111", 443, socket.AF_INET6))
blocked("IPv6 DNS to a public resolver", lambda: dns_udp("2001:4860:4860::8888", socket.AF_INET6))
blocked(
    "IPv6 to the link-local all-nodes address",
    lambda: udp("ff02::1%maka0", BAIT, b"x", socket.AF_INET6),
)
blocked("an AF_PACKET socket (frames beneath the policy)", packet_socket)
blocked("a packet mark (CAP_NET_ADMIN)", packet_mark)
if shutil.which("nft"):
    blocked("nft flush ruleset", lambda: tool(["nft", "flush", "ruleset"]))
blocked("NET_RAW or NET_ADMIN in any capability set", capabilities)
# -- through the proxy: the blocklist ---------------------------------------------------------
encoded_twice = urllib.parse.quote(urllib.parse.quote(f"http://{BLOCKED_HOST}/x", safe=""))
expect_403("a blocked URL through the proxy", "http://github.com/laude-institute/terminal-bench")
expect_403("a blocked URL wrapped in an archive mirror", f"http://web.archive.org/web/2024/{TB}")
expect_403(
    "a blocked URL percent-encoded in a query",
    f"{UPSTREAM}?next={urllib.parse.quote(TB, safe='')}",
)
expect_403(
    "a blocked URL base64-encoded in a query",
    f"{UPSTREAM}?u={base64.urlsafe_b64encode(TB.encode()).decode()}",
)
expect_403("a blocked host over HTTPS (CONNECT)", "https://www.tbench.ai/")
expect_403("the spec's own blocked host", f"http://{BLOCKED_HOST}/")
expect_403("the spec's own blocked host, double-encoded", f"{UPSTREAM}?to={encoded_twice}")
# -- what the proxy keeps -----------------------------------------------------------------------
blocked("read the proxy's CA key, audit log or result token", find_secrets)
# -- what must work -----------------------------------------------------------------------------
allowed("the allowed upstream through the proxy", upstream)
if shutil.which("curl"):
    allowed("curl to the allowed upstream through the proxy", curl_upstream)
allowed("the proxy's CA certificate is trusted (SSL_CERT_FILE)", trusted_ca)
with open("done.txt", "w") as handle:
    handle.write(json.dumps(results))

#!/bin/sh
# Detach the server from this script's session; it must outlive the subject.
here="$(dirname "$0")"
setsid nohup python3 "$here/server.py" > /dev/null 2>&1 &
for _ in $(seq 1 100); do [ -s port.txt ] && exit 0; sleep 0.05; done
echo "the server did not start" >&2
exit 1

#!/bin/sh
logs="${MAKA_EVAL_VERIFIER_LOGS_DIR:-/logs/verifier}"
port="$(tr -d '[:space:]' < port.txt 2>/dev/null)"
body="$(python3 -c "
import sys, urllib.request
try:
    print(urllib.request.urlopen('http://127.0.0.1:$port/status', timeout=5).read().decode())
except Exception as exc:
    print('unreachable', exc, file=sys.stderr)
" 2>/dev/null)"
if [ "$body" = "ok" ]; then echo 1 > "$logs/reward.txt"; else echo 0 > "$logs/reward.txt"; fi

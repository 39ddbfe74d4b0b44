#!/bin/sh
logs="${MAKA_EVAL_VERIFIER_LOGS_DIR:-/logs/verifier}"
answer="$(tr -d '[:space:]' < answer.txt 2>/dev/null)"
if [ "$answer" = "1200" ]; then echo 1 > "$logs/reward.txt"; else echo 0 > "$logs/reward.txt"; fi

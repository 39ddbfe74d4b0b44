#!/bin/sh
# Harbor-style verifier: score the workspace the subject left, write the reward.
logs="${MAKA_EVAL_VERIFIER_LOGS_DIR:-/logs/verifier}"
if [ "$(cat greeting.txt 2>/dev/null)" = "Hello, world!" ]; then
  echo 1 > "$logs/reward.txt"
else
  echo 0 > "$logs/reward.txt"
fi

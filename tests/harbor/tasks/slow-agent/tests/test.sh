#!/bin/bash
# Partial credit is a reward too: 0.5 for progress, 1 for the answer.
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then r=1
elif [ -f /app/progress.txt ]; then r=0.5
else r=0; fi
echo "$r" > /logs/verifier/reward.txt

#!/bin/sh
# Partial credit: reward.json carries the score and a detail metric.
logs="${MAKA_EVAL_VERIFIER_LOGS_DIR:-/logs/verifier}"
expected="alice Bob charlie Dave maria Zoe"
got="$(tr '\n' ' ' < sorted.txt 2>/dev/null | sed 's/ *$//')"
if [ "$got" = "$expected" ]; then
  echo '{"reward": 1.0, "lines_in_place": 6}' > "$logs/reward.json"
else
  in_place=0
  i=1
  for name in $expected; do
    [ "$(sed -n "${i}p" sorted.txt 2>/dev/null)" = "$name" ] && in_place=$((in_place + 1))
    i=$((i + 1))
  done
  echo "{\"reward\": 0.0, \"lines_in_place\": $in_place}" > "$logs/reward.json"
fi

#!/bin/bash
# 1 only for the answer in a container whose one network interface is loopback.
mkdir -p /logs/verifier
interfaces=$(grep -c ':' /proc/net/dev)
if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ] && [ "$interfaces" = 1 ]; then echo 1; else echo 0; fi \
  > /logs/verifier/reward.txt

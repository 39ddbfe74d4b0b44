#!/bin/bash
# A broken verifier: it checks the answer but never writes a reward file.
cat /app/answer.txt 2>/dev/null || echo "no answer"

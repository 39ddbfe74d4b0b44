#!/bin/sh
awk '{ s += $1 } END { print s }' numbers.txt > answer.txt

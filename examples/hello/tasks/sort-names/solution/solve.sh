#!/bin/sh
sort -f names.txt > sorted.txt

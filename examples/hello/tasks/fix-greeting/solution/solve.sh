#!/bin/sh
printf 'Hello, world!\n' > greeting.txt

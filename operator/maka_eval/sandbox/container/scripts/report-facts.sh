# shellcheck shell=sh
# What the image holds, read on its own (the holder did not report it).
facts

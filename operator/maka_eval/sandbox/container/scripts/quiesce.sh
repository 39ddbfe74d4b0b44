# shellcheck shell=sh
# Everything but PID 1, this script, the holder ($1, its pid) and what the image's
# ENTRYPOINT started before it (its services: a lower pid than the holder's, which is made
# before anything the subject runs; pids only grow in a new namespace): frozen first
# (nothing forks away while the list is walked), then killed; what is spared runs on.
h=$1
kill -STOP -1 2>/dev/null
for p in /proc/[0-9]*; do
  p=${p#/proc/}
  [ "$p" = $$ ] || [ "$p" = 1 ] || { [ -n "$h" ] && [ "$p" -le "$h" ]; } \
    || kill -KILL "$p" 2>/dev/null
done
for p in /proc/[0-9]*; do
  p=${p#/proc/}
  [ "$p" = $$ ] || kill -CONT "$p" 2>/dev/null
done
true

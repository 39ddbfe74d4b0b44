# shellcheck shell=sh
# Where each path really is, every link along it followed (`readlink -f`, busybox's), one
# line per path: `PATH<TAB>RESOLVED`, RESOLVED empty when it cannot be resolved.
for p; do
  printf '%s\t%s\n' "$p" "$(readlink -f -- "$p" 2>/dev/null)"
done

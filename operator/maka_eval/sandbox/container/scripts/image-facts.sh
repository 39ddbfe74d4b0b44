# shellcheck shell=sh
# facts: what the image holds (`sandbox.changes.ImageFacts`, parsed by
# container/image_facts.py): the PATH folders, resolved, and their names; the links PATH
# and the libraries go through; Python's installed modules.
# The listings are reports read line by line, in ls's order; the folders are the image's
# own, read before the subject runs.
# shellcheck disable=SC2012
facts() {
  old=$IFS; IFS=:
  for d in $PATH; do
    IFS=$old
    case $d in /*) ;; *) continue ;; esac
    real=$(readlink -f "$d" 2>/dev/null) || real=$d
    [ -n "$real" ] || real=$d
    [ "$real" = "$d" ] || echo "link $d"
    echo "in $real"
    [ ! -d "$real" ] || ls -A "$real" | sed 's/^/- /'
  done
  IFS=$old
  for l in /bin /sbin /lib /lib32 /lib64 /libx32 /usr/lib64 /usr/local/bin /usr/local/lib; do
    [ ! -L "$l" ] || echo "link $l"
  done
  for s in /usr/lib/python3*/*-packages /usr/local/lib/python3*/*-packages \
      /opt/*/lib/python3*/site-packages; do
    [ ! -d "$s" ] || ls -A "$s" | sed 's/^/m /'
  done
  c=/etc/ld.so.cache
  [ ! -f $c ] || [ -L $c ] || echo "ldcache $(head -c 16777216 $c | base64 -w 0)"
}

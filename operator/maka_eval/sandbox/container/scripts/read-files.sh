# shellcheck shell=sh
# Regular files of the container, for the rules of sandbox.changes: `file BASE64 PATH`,
# or `none - PATH` (missing, a link, not a file).
for f; do
  if [ -f "$f" ] && [ ! -L "$f" ]; then
    echo "file $(head -c 16777217 "$f" | base64 -w 0) $f"
  else
    echo "none - $f"
  fi
done

# shellcheck shell=sh
# user_ids: $u (user[:group], names or numbers) -> $ids (maka-setpriv options), $uid,
# $gid, $home, read from /etc/passwd and /etc/group with awk (no name service, whose
# modules the container holds). An unknown user or group ends the script (exit 126).
# Each program uses some of what it sets.
# shellcheck disable=SC2034
user_ids() {
  ids='' uid=0 gid=0 home=/root
  if [ -n "$u" ]; then
    user=${u%%:*} group=''
    case $u in *:*) group=${u#*:} ;; esac
    entry=$(awk -F: -v k="$user" '$1 == k { print; exit }' /etc/passwd)
    case $user in
      *[!0-9]*) [ -n "$entry" ] || { echo "maka-eval: unknown user: $user" >&2; exit 126; } ;;
      *) [ -n "$entry" ] || entry=$(awk -F: -v k="$user" '$3 == k { print; exit }' /etc/passwd) ;;
    esac
    uid=$user name=''
    [ -z "$entry" ] || { uid=$(echo "$entry" | cut -d: -f3); name=${entry%%:*}; }
    if [ -n "$group" ]; then
      gid=$(awk -F: -v k="$group" '$1 == k { print $3; exit }' /etc/group)
      [ -n "$gid" ] || gid=$group
    else
      gid=$(echo "$entry" | cut -d: -f4); [ -n "$gid" ] || gid=$uid
    fi
    case "$uid$gid" in *[!0-9]*|'') echo "maka-eval: unknown user or group: $u" >&2; exit 126 ;; esac
    groups=''
    [ -z "$name" ] || groups=$(awk -F: -v u="$name" -v g="$gid" '
      { n = split($4, m, ","); for (i = 1; i <= n; i++) if (m[i] == u && $3 != g) printf ",%s", $3 }
    ' /etc/group)
    home=$(echo "$entry" | cut -d: -f6)
    ids="--uid $uid --gid $gid --groups $gid$groups"
  fi
}

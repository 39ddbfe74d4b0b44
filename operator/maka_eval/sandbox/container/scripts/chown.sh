# shellcheck shell=sh
# Hand uploaded files ("$@" after the user) to a user (a later step's workdir files).
u=$1; shift
user_ids
chown -R -- "$uid:$gid" "$@"

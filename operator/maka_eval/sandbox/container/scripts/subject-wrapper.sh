# shellcheck shell=sh
# The subject's program ("$@"), as $MAKA_EVAL_S_USER (empty: root), without the one
# capability that lets a process look into the verifier's holder.
u=$MAKA_EVAL_S_USER; unset MAKA_EVAL_S_USER
user_ids
[ -z "$u" ] || export HOME="${home:-/}"
# $ids is a list of maka-setpriv options (empty for root): split on purpose.
# shellcheck disable=SC2086
exec @TOOLBOX_SETPRIV@ $ids --drop-bounding @MARKER_CAP@ -- "$@"

# shellcheck shell=sh
# The verifier's private /tests, /logs/verifier and /.maka-tools/private: tmpfs mounts in
# a mount namespace that a holder process keeps (see container/sandbox.py). Arguments: the
# uploaded paths to hand to the agent user; answers `ready PID DEV DEV` or `fail WHY`,
# after what the image holds when asked (facts).
u=$MAKA_EVAL_H_USER want=$MAKA_EVAL_H_FACTS
unset MAKA_EVAL_H_USER MAKA_EVAL_H_FACTS
T=@TOOLBOX_BIN@
[ -x $T/maka-setpriv ] || { echo "fail the verifier's toolbox is not in the container"; exit 0; }
if [ $# != 0 ] && [ -n "$u" ]; then (
  user_ids
  chown -R -- "$uid:$gid" "$@"
) >/dev/null 2>&1; fi
[ -z "$want" ] || facts
out=$(unshare -m --propagation private true 2>&1) \
  || { echo "fail the engine refused a mount namespace: $out" | head -c 300; exit 0; }
# The holder lives on in the background and answers on fd 3, which it closes before it
# sleeps: this exec's output ends, and the exec with it, as soon as the holder is ready.
# The holder's own script is single-quoted: it expands in the holder's shell.
# shellcheck disable=SC2016
answer=$(unshare -m --propagation private $T/busybox sh -c '
  T=@TOOLBOX_BIN@
  mkdir -p @TESTS_PATH@ @VERIFIER_LOGS_PATH@ \
    && mount -t tmpfs -o mode=0755 maka-tests @TESTS_PATH@ \
    && mount -t tmpfs -o mode=0755 maka-verifier @VERIFIER_LOGS_PATH@ \
    && mount -t tmpfs -o mode=0755 maka-private @TOOLBOX_PRIVATE@ \
    || { echo "fail cannot mount a tmpfs in the container" >&3; exit 0; }
  hex=0
  while read -r key value; do [ "$key" = CapBnd: ] && hex=$value; done </proc/1/status
  echo "ready $$ $(stat -c %d @TESTS_PATH@) $(stat -c %d @VERIFIER_LOGS_PATH@)" >&3
  exec 3>&-
  exec $T/maka-setpriv --keep-bounding "$hex" -- $T/busybox sleep infinity' \
  3>&1 </dev/null >/dev/null 2>&1 &)
echo "$answer"

# shellcheck shell=sh
# The verifier ("$@") in its private folders, reached through the holder's /proc root
# (see container/sandbox.py). Reports go to stderr as `\nMARKER WORD ...` lines, under a
# marker only this wrapper and the helper know: ready, done DIGEST, tar, agent, stale,
# decoy, tampered, fail.
m=$MAKA_EVAL_EXEC_MARKER d=$MAKA_EVAL_V_DIR sum=$MAKA_EVAL_V_SHA u=$MAKA_EVAL_V_USER
h=$MAKA_EVAL_V_HOLDER w=$MAKA_EVAL_V_WORKDIR reset=$MAKA_EVAL_V_RESET
unset MAKA_EVAL_EXEC_MARKER MAKA_EVAL_V_DIR MAKA_EVAL_V_SHA MAKA_EVAL_V_USER
unset MAKA_EVAL_V_HOLDER MAKA_EVAL_V_WORKDIR MAKA_EVAL_V_RESET
say() { printf '\n%s %s\n' "$m" "$*" >&2; }
fail() { say fail "$*"; exit 202; }
# $h is "PID DEV DEV" (the holder and its two mounts): split on purpose.
# shellcheck disable=SC2086
set -- $h "$@"; h=$1 dt=$2 dl=$3; shift 3
r=/proc/$h/root
p=$r@TOOLBOX_PRIVATE@
# The private folders are the holder's tmpfs mounts (their devices): not if the holder
# was killed, nor if the subject removed the folders they are mounted on.
private() {
  [ "$(stat -c %d "$r@TESTS_PATH@" 2>/dev/null)" = "$dt" ] \
    && [ "$(stat -c %d "$r@VERIFIER_LOGS_PATH@" 2>/dev/null)" = "$dl" ]
}
private || { say tampered "the verifier's private folders were taken away"; exit 201; }
# A later step's verifier: the previous one's tests, output, HOME and TMPDIR go first.
empty() { for f; do rm -rf -- "${f:?}"/* "$f"/.[!.]* "$f"/..?* || return 1; done; }
[ -z "$reset" ] || empty "$r@TESTS_PATH@" "$r@VERIFIER_LOGS_PATH@" "$p" \
  || fail "cannot empty the previous step's @TESTS_PATH@ and @VERIFIER_LOGS_PATH@"
# The names are only quoted in a report.
# shellcheck disable=SC2012
left=$(ls -A @VERIFIER_LOGS_PATH@ 2>/dev/null | head -n 20 | tr '\n' ' ')
[ -z "$left" ] || { say stale "$left"; empty @VERIFIER_LOGS_PATH@ 2>/dev/null; }
cp "$d/tests.tar" "$r@TESTS_PATH@/.maka-tests.tar" || fail "the tests were not uploaded"
rm -f "$d/tests.tar"
printf '%s  %s\n' "$sum" "$r@TESTS_PATH@/.maka-tests.tar" | sha256sum -c -s - \
  || { say tampered "the tests changed between upload and use"; exit 201; }
# A && B || C: C (the failure report) is meant to run when A or B failed.
# shellcheck disable=SC2015
tar -xf "$r@TESTS_PATH@/.maka-tests.tar" -C "$r@TESTS_PATH@" \
  && rm -f "$r@TESTS_PATH@/.maka-tests.tar" || fail "cannot unpack the tests"
user_ids
# shellcheck disable=SC2015
mkdir -p "$p/home" "$p/tmp" "$p/pycache" && chmod 0700 "$p/home" "$p/tmp" "$p/pycache" \
  || fail "cannot make the verifier's HOME and TMPDIR"
if [ -n "$ids" ]; then
  chown "$uid:$gid" "$r@VERIFIER_LOGS_PATH@" "$p/home" "$p/tmp" "$p/pycache"
  ids="$ids --ambient @MARKER_CAP@"
fi
say ready
# $ids is a list of maka-setpriv options (empty for root): split on purpose.
# shellcheck disable=SC2086
@TOOLBOX_SETPRIV@ --root "$r" --cd "$w" $ids -- "$@"
rc=$?
private || { say tampered "the verifier's private folders were taken away as it ran"; exit 201; }
tar -C "$r@VERIFIER_LOGS_PATH@" -cf "$d/verifier.tar" . || fail "cannot pack @VERIFIER_LOGS_PATH@"
# sha256sum prints "DIGEST  FILE": split on purpose, the digest is $1.
# shellcheck disable=SC2046
set -- $(sha256sum "$d/verifier.tar")
say 'done' "$1"
# A small result travels with the reports: no second trip to the engine to fetch it.
if [ "$(stat -c %s "$d/verifier.tar")" -le 1048576 ]; then
  say tar "$(base64 -w 0 "$d/verifier.tar" 2>/dev/null)"
fi
# So does what the subject left in /logs/agent (the relay fetches it when this is cut).
if [ -n "$(ls -A @AGENT_LOGS_PATH@ 2>/dev/null)" ]; then
  say agent "$(tar -C @AGENT_LOGS_PATH@ -cf - . 2>/dev/null | head -c 1048577 | base64 -w 0)"
fi
# shellcheck disable=SC2012
late=$(ls -A @VERIFIER_LOGS_PATH@ 2>/dev/null | head -n 20 | tr '\n' ' ')
[ -z "$late" ] || say decoy "$late"
exit $rc

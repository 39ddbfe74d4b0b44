# shellcheck shell=sh
# Fresh shared /tests and /logs/verifier where the engine cannot make private ones:
# arguments: the upload folder and the digest of its tests.tar.
d=$1 sum=$2
# The names are only quoted in a report.
# shellcheck disable=SC2012
left=$(ls -A @VERIFIER_LOGS_PATH@ 2>/dev/null | head -n 20 | tr '\n' ' ')
[ -z "$left" ] || echo "stale $left"
# A && B || C: C (the failure report) is meant to run when A or B failed.
# shellcheck disable=SC2015
rm -rf @TESTS_PATH@ @VERIFIER_LOGS_PATH@ && mkdir -p @TESTS_PATH@ @VERIFIER_LOGS_PATH@ \
  && chmod 0777 @VERIFIER_LOGS_PATH@ || { echo "fail cannot make @TESTS_PATH@ and @VERIFIER_LOGS_PATH@"; exit 0; }
printf '%s  %s\n' "$sum" "$d/tests.tar" | sha256sum -c -s - \
  || { echo "tampered the tests changed between upload and use"; exit 0; }
# shellcheck disable=SC2015
tar -xf "$d/tests.tar" -C @TESTS_PATH@ && rm -f "$d/tests.tar" || echo "fail cannot unpack the tests"

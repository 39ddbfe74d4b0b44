# shellcheck shell=sh
# What the last verifier left in the container (its upload folders) goes before the next
# step.
rm -rf @VERIFIER_BOX_PREFIX@*

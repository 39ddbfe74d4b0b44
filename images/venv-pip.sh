#!/bin/sh
# `venv-pip VENV ARGS...`: the virtualenv's pip with ARGS, in an image build. The build's
# pip cache is a cache mount (/root/.cache/pip); when the build is given the secret
# `build-ca` (a CA bundle: `--secret id=build-ca,src=FILE`), pip trusts it, for networks
# whose TLS goes through an intercepting proxy. Nothing of either stays in a layer.
set -eu
venv=$1
shift
if [ -s /run/secrets/build-ca ]; then
  export PIP_CERT=/run/secrets/build-ca
fi
exec "$venv/bin/pip" --disable-pip-version-check "$@"

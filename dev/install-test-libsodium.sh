#!/usr/bin/env bash
# Debian's libsodium (libsodium23): `audit verify` checks signatures with the system's libsodium
# when there is one (the same function as PyNaCl's bundled copy, in a faster build), and the tests
# compare the two on the same signatures (tests/test_journal_verify.py).
# Idempotent: nothing is installed when it is present.
set -euo pipefail
if dpkg-query -W -f='${Status}' libsodium23 2>/dev/null | grep -q "install ok installed"; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "dev/install-test-libsodium.sh: need root to install libsodium23 (or install it yourself)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends libsodium23 >/dev/null

#!/usr/bin/env bash
# Go's reference packages for the interoperability tests (tests/test_witness_interop.py):
# Debian's golang-go and golang-golang-x-mod-dev (golang.org/x/mod/sumdb/note and sumdb/tlog,
# under /usr/share/gocode). The tests build their Go program offline against them.
# Idempotent: nothing is installed when both are present.
set -euo pipefail
missing=()
for pkg in golang-go golang-golang-x-mod-dev; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "dev/install-test-go.sh: need root to install ${missing[*]} (or install them yourself)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

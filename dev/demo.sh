#!/usr/bin/env bash
# Install apollia-nb into .venv and run the headless tour on a fresh home.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
home=$(mktemp -d "${TMPDIR:-/tmp}/apollia-demo.XXXXXX")
exec .venv/bin/apollia-os demo --home "$home" "$@"

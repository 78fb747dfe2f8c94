#!/usr/bin/env bash
# Mutation testing of the trusted core (governance decision and shell check, journal Merkle proofs and
# verification, runtime states and breaker). Not part of .ci/run: it takes minutes to hours.
# Usage: bash dev/mutation.sh [--sample N] [--seed S] [--list] [-v] [MODULE ...]
# Modules: decision shellcheck merkle verify states breaker (all when none is named).
# See docs/mutation-testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
exec "$PY" dev/mutation.py "$@"

#!/usr/bin/env bash
# Install everything the test suite needs into .venv, then run the whole suite.
# Extra arguments go to pytest (e.g. `bash dev/test.sh -k journal`).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# Prerequisites beside Python 3.11+: Node.js with npm (the install builds the JupyterLab panel in
# labextension/, and an MCP server the federation tests talk to is installed from npm) and bash. Say what is missing, in one line, before installing anything.
for tool in "$PYTHON" node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "dev/test.sh: '$tool' is not on PATH: the suite needs Python 3.11+, Node.js and npm (see README, Set up)" >&2
    exit 1
  fi
done
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
# Third-party servers, browsers and tools the tests talk to, each installed the way users install them
# (dev/install-test-go.sh: Debian's Go and golang.org/x/mod, with apt-get, for the witness interop tests).
for extra in dev/install-test-*.sh; do
  if [ -e "$extra" ]; then bash "$extra"; fi
done
# The suite runs in worker processes (pytest-xdist): more workers than cores, as most tests wait on a
# subprocess, a server or fsync; a test file stays on one worker (pyproject.toml), its module fixtures made once.
# Arguments given here come after these and win: `-n 0` runs it in this one process, `-n 4` in four.
# pytest exits 5 when it collects no test: that is a failure here, never a pass. The 40 slowest tests are
# listed at the end, so a run shows where its time goes.
exec .venv/bin/python -m pytest -n 3 --durations=40 "$@"

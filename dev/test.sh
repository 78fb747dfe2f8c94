#!/usr/bin/env bash
# Install everything the test suite needs into .venv, then run the whole suite.
# Extra arguments go to pytest (e.g. `bash dev/test.sh -k journal`).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
# Third-party servers and browsers the tests talk to, each installed the way users install them.
for extra in dev/install-test-*.sh; do
  if [ -e "$extra" ]; then bash "$extra"; fi
done
# pytest exits 5 when it collects no test: that is a failure here, never a pass.
exec .venv/bin/python -m pytest "$@"

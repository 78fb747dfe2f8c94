#!/usr/bin/env bash
# Install apollia-nb into .venv and open JupyterLab on the tour notebook.
# The tour makes its own fresh home in a temporary folder; extra arguments go to `jupyter lab`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e . pandas matplotlib
exec .venv/bin/jupyter lab notebooks/01-tour.ipynb "$@"

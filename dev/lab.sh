#!/usr/bin/env bash
# Install apollia-nb into .venv and open JupyterLab on the tour notebook.
# JupyterLab serves the clone's root (the notebooks and docs/ are in its file browser) and opens
# the tour; the URL it prints, with the token, once it listens is the tour's. The tour makes its
# own fresh home in a temporary folder; extra arguments go to `jupyter lab` (e.g. --no-browser on
# a machine without one).
# Installing from the clone builds the apollia side panel (labextension/) with Node.js and npm;
# it shows in JupyterLab's right sidebar (the shield icon, or Alt Shift P).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
for tool in "$PYTHON" node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "dev/lab.sh: '$tool' is not on PATH: installing from the clone needs Python 3.11+, Node.js and npm (see README, Set up)" >&2
    exit 1
  fi
done
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e . pandas matplotlib
lab=()
if [ "$(id -u)" = 0 ]; then
  echo "dev/lab.sh: running as root, so JupyterLab starts with --allow-root" >&2
  lab+=(--allow-root)
fi
tour=notebooks/01-tour.ipynb
echo "dev/lab.sh: JupyterLab serves $PWD and opens $tour (the apollia panel: right sidebar, Alt Shift P); open the URL it prints below" >&2
exec .venv/bin/jupyter lab ${lab[@]+"${lab[@]}"} --ServerApp.root_dir="$PWD" --LabApp.default_url="/lab/tree/$tour" "$@"

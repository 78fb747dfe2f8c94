#!/usr/bin/env bash
# A real JupyterHub for the tests of identity from the hub (tests/test_jupyterhub_identity.py), installed
# the way a hub admin installs it, in its own environments under .test-peers/ (git-ignored):
#   .test-peers/venv-jupyterhub   jupyterhub from PyPI, in its own virtual environment
#   .test-peers/npm-jupyterhub    configurable-http-proxy from npm (the proxy the hub starts)
# Idempotent: a peer already at the pinned version is left alone, so a second run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
JUPYTERHUB_VERSION=6.1.1
CHP_VERSION=5.3.0
PEERS=.test-peers
mkdir -p "$PEERS"

if ! "$PEERS/venv-jupyterhub/bin/python" -c "
import importlib.metadata as m, sys
sys.exit(m.version('jupyterhub') != '$JUPYTERHUB_VERSION')" 2>/dev/null; then
  rm -rf "$PEERS/venv-jupyterhub"
  "$PYTHON" -m venv "$PEERS/venv-jupyterhub"
  "$PEERS/venv-jupyterhub/bin/python" -m pip install --quiet --disable-pip-version-check \
    "jupyterhub==$JUPYTERHUB_VERSION"
fi

installed=$(node -e "try{console.log(require('./$PEERS/npm-jupyterhub/node_modules/configurable-http-proxy/package.json').version)}catch(e){}" 2>/dev/null || true)
if [ "$installed" != "$CHP_VERSION" ]; then
  npm install --prefix "$PEERS/npm-jupyterhub" --no-audit --no-fund --loglevel=error \
    "configurable-http-proxy@$CHP_VERSION" >/dev/null
fi

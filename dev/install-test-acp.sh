#!/usr/bin/env bash
# The Agent Client Protocol peers the ACP proxy's tests talk to over stdio: the Python ACP SDK
# from PyPI (`agent-client-protocol`), installed the way its users install it, in its own virtual
# environment (git-ignored):
#   .test-peers/venv-acp   agent-client-protocol, for the test client and the test agent
# Idempotent: a peer already at the pinned version is left alone, so a second run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
ACP_VERSION=0.12.1
PEERS=.test-peers
mkdir -p "$PEERS"

if ! "$PEERS/venv-acp/bin/python" -c "
import importlib.metadata as m, sys
sys.exit(m.version('agent-client-protocol') != '$ACP_VERSION')" 2>/dev/null; then
  rm -rf "$PEERS/venv-acp"
  "$PYTHON" -m venv "$PEERS/venv-acp"
  "$PEERS/venv-acp/bin/python" -m pip install --quiet --disable-pip-version-check "agent-client-protocol==$ACP_VERSION"
fi

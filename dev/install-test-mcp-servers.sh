#!/usr/bin/env bash
# Third-party MCP servers the federation tests talk to over stdio, each installed the
# way its users install it, in its own environment under .test-peers/ (git-ignored):
#   .test-peers/venv-time   mcp-server-time from PyPI, in its own virtual environment
#   .test-peers/npm         @modelcontextprotocol/server-filesystem and server-everything from npm
# Idempotent: a peer already at the pinned version is left alone, so a second run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TIME_VERSION=2026.10.19
FILESYSTEM_VERSION=2026.8.31
EVERYTHING_VERSION=2026.8.31
PEERS=.test-peers
mkdir -p "$PEERS"

if ! "$PEERS/venv-time/bin/python" -c "
import importlib.metadata as m, sys
sys.exit(m.version('mcp-server-time') != '$TIME_VERSION')" 2>/dev/null; then
  rm -rf "$PEERS/venv-time"
  "$PYTHON" -m venv "$PEERS/venv-time"
  "$PEERS/venv-time/bin/python" -m pip install --quiet --disable-pip-version-check "mcp-server-time==$TIME_VERSION"
fi

installed=$(node -e "try{console.log(require('./$PEERS/npm/node_modules/@modelcontextprotocol/server-filesystem/package.json').version)}catch(e){}" 2>/dev/null || true)
if [ "$installed" != "$FILESYSTEM_VERSION" ]; then
  npm install --prefix "$PEERS/npm" --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/server-filesystem@$FILESYSTEM_VERSION" >/dev/null
fi

installed=$(node -e "try{console.log(require('./$PEERS/npm/node_modules/@modelcontextprotocol/server-everything/package.json').version)}catch(e){}" 2>/dev/null || true)
if [ "$installed" != "$EVERYTHING_VERSION" ]; then
  npm install --prefix "$PEERS/npm" --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION" >/dev/null
fi

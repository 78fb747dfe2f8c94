#!/usr/bin/env bash
# The browser the JupyterLab panel test drives, installed the way its users install them:
#   /usr/bin/chromium          Debian's Chromium (apt), left alone when present
#   .test-peers/playwright     playwright-core from npm (it drives Chromium; it downloads no browser)
#                              and axe-core (the accessibility checks the test runs in the page)
# Idempotent: a second run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
PLAYWRIGHT_VERSION=1.65.1
AXE_VERSION=4.14.1
PEERS=.test-peers
mkdir -p "$PEERS"

if [ ! -x /usr/bin/chromium ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

installed=$(node -e "try{console.log(require('./$PEERS/playwright/node_modules/playwright-core/package.json').version)}catch(e){}" 2>/dev/null || true)
if [ "$installed" != "$PLAYWRIGHT_VERSION" ]; then
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix "$PEERS/playwright" --no-audit --no-fund --loglevel=error \
    "playwright-core@$PLAYWRIGHT_VERSION" >/dev/null
fi

installed=$(node -e "try{console.log(require('./$PEERS/playwright/node_modules/axe-core/package.json').version)}catch(e){}" 2>/dev/null || true)
if [ "$installed" != "$AXE_VERSION" ]; then
  npm install --prefix "$PEERS/playwright" --no-audit --no-fund --loglevel=error "axe-core@$AXE_VERSION" >/dev/null
fi

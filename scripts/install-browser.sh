#!/usr/bin/env bash
# Debian's Chromium for the console's browser tests (Playwright drives this
# installed browser; it never downloads one), and axe-core (npm, one file:
# axe.min.js) for their accessibility test. Does nothing for what is installed.
set -euo pipefail
AXE_DIR="${AXE_CORE_DIR:-$HOME/.cache/reservo/axe-core}"
if [ ! -f "$AXE_DIR/node_modules/axe-core/axe.min.js" ]; then
  if command -v npm >/dev/null; then
    echo "installing axe-core into $AXE_DIR for the console's accessibility test ..."
    npm install --prefix "$AXE_DIR" --no-save --no-audit --no-fund axe-core@4
  else
    echo "!!! npm is not installed: axe-core cannot be fetched and the console's" \
         "accessibility test (tests/browser/test_console_accessibility.py) will be SKIPPED." \
         "Install Debian's 'npm' package. !!!" >&2
  fi
fi
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's chromium for the console's browser tests ..."
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
else
  echo "!!! chromium is not installed and this user cannot apt-get it:" \
       "the console's browser tests (tests/browser) will be SKIPPED." \
       "Install Debian's 'chromium' package. !!!" >&2
fi

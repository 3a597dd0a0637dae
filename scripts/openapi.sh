#!/usr/bin/env bash
# Regenerates docs/openapi.json, the checked-in copy of the OpenAPI document the
# service serves at /openapi.json (tests/integration/test_openapi_contract.py fails
# while the two differ). Commit the diff with the change that caused it.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" -m reservo.cli openapi -o docs/openapi.json
echo "docs/openapi.json regenerated"

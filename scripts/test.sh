#!/usr/bin/env bash
# The whole test suite. Uses the PostgreSQL/Redis already running on this
# machine when they answer on their default ports (or the RESERVO_TEST_* URLs you
# set); otherwise the suite starts embedded ones itself.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
[ -x "$venv/bin/pytest" ] || scripts/install.sh "$venv"
export PATH="$PWD/$venv/bin:$PATH"
scripts/install-browser.sh
# pg_auto_failover for the failover scenarios (tests/chaos/test_failover.py);
# they are skipped where it cannot be installed (not root, not Debian).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then scripts/ha.sh install || true; fi

if [ -z "${RESERVO_TEST_DATABASE_URL:-}" ] && command -v pg_isready >/dev/null \
   && pg_isready -q -h 127.0.0.1 -p 5432 -U postgres; then
  export RESERVO_TEST_DATABASE_URL="postgresql://postgres@127.0.0.1:5432/postgres"
fi
if [ -z "${RESERVO_TEST_REDIS_URL:-}" ] && command -v redis-cli >/dev/null \
   && [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; then
  export RESERVO_TEST_REDIS_URL="redis://127.0.0.1:6379/0"
fi
echo "PostgreSQL: ${RESERVO_TEST_DATABASE_URL:-embedded}  Redis: ${RESERVO_TEST_REDIS_URL:-embedded}"

ruff check src tests bench
ruff format --check src tests bench
mypy
lint-imports
pytest "$@"

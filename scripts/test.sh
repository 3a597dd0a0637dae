#!/usr/bin/env bash
# The whole test suite. Uses the PostgreSQL/Redis already running on this
# machine when they answer on their default ports (or the RESERVO_TEST_* URLs you
# set); otherwise the suite starts embedded ones itself.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
[ -x "$venv/bin/pytest" ] || scripts/install.sh "$venv"
export PATH="$(cd "$venv" && pwd)/bin:$PATH"  # VENV may be relative or absolute
scripts/install-browser.sh
# pg_auto_failover for the failover scenarios (tests/chaos/test_failover.py);
# they are skipped where it cannot be installed (not root, not Debian).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then scripts/ha.sh install || true; fi
# The partition scenarios' network lab (tests/chaos/netns.py: ip, nft) and
# libfaketime (tests/e2e/test_clock_skew.py runs a worker 30 s ahead); those tests
# skip, saying why, without them.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
   && ! { command -v nft && command -v ip && command -v faketime; } >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends iproute2 nftables faketime >/dev/null; } \
    || echo "test.sh: iproute2/nftables/faketime not installed: the partition and clock skew tests will skip"
fi
# podman, buildah, mmdebstrap (and kubectl) for the container image and the Kubernetes
# manifests (tests/e2e/test_container_image.py builds the image once, then reuses
# it while src/ is unchanged); those tests skip, saying why, without them.
scripts/image.sh install || echo "test.sh: container tools not installed: the container image test will skip"

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

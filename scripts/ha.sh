#!/usr/bin/env bash
# The HA topology on one machine (tests/ha.py): a PostgreSQL primary and two
# synchronous standbys under pg_auto_failover, and a Redis Cluster of three
# masters with a replica each; loopback only, every node its own port and data
# directory under DIR. The failover test (tests/chaos/test_failover.py) starts
# the same thing.
#
#   scripts/ha.sh install      # pg_auto_failover from Debian, when missing (root)
#   scripts/ha.sh start DIR    # prints the RESERVO_* variables (also in DIR/ha.env)
#   scripts/ha.sh stop DIR     # stops every process (data kept)
set -euo pipefail
cd "$(dirname "$0")/.."

install() {
    if command -v pg_autoctl >/dev/null; then return; fi
    if [ "$(id -u)" != 0 ]; then
        echo "pg_autoctl missing: run 'scripts/ha.sh install' as root" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15-auto-failover
}

python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
case "${1:-}" in
    install) install ;;
    start)
        install
        PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m tests.ha start "${2:?DIR}"
        ;;
    stop) PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m tests.ha stop "${2:?DIR}" ;;
    *)
        sed -n '2,10p' "$0"
        exit 2
        ;;
esac

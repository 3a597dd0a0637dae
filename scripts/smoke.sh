#!/usr/bin/env bash
# Starts `reservo up --demo` with embedded PostgreSQL and Redis in a temporary
# folder, waits for /readyz, books one slot through HTTP, then stops it with SIGINT.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
data=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log="$data/up.log"
env -u RESERVO_DATABASE_URL -u RESERVO_REDIS_URL RESERVO_DATA_DIR="$data" \
  "$venv/bin/reservo" up --demo --port "$port" >"$log" 2>&1 &
pid=$!
cleanup() { kill -INT "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$data"; }
trap cleanup EXIT
base="http://127.0.0.1:$port"
for _ in $(seq 1 120); do
  if curl -fsS "$base/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then cat "$log"; echo "reservo up died"; exit 1; fi
  sleep 1
done
curl -fsS "$base/readyz"; echo
# Signed with the throwaway secret the demo generated in its data folder.
admin=$(RESERVO_DATA_DIR="$data" "$venv/bin/reservo" token --role admin --sub 1)
patient=$(RESERVO_DATA_DIR="$data" "$venv/bin/reservo" token --role patient --sub 4242)
day=$(date -u -d '+2 days' +%F)
slot=$(curl -fsS -H "Authorization: Bearer $admin" "$base/api/doctors/1/slots?date=$day" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
code=$(curl -sS -o "$data/booking.json" -w '%{http_code}' -X POST "$base/api/appointments" \
  -H "Authorization: Bearer $patient" -H "Idempotency-Key: smoke-$$" \
  -H 'Content-Type: application/json' -d "{\"slotId\": $slot, \"patientId\": 4242}")
cat "$data/booking.json"; echo
[ "$code" = "201" ] || { echo "booking answered $code"; cat "$log"; exit 1; }
kill -INT "$pid"; wait "$pid" || { echo "reservo up did not stop cleanly"; cat "$log"; exit 1; }
trap - EXIT; rm -rf "$data"
echo "smoke: ok"

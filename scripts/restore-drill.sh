#!/usr/bin/env bash
# Restore drill (docs/DEPLOY.md, "Backups and restore"): proves that a backup of
# reservo's PostgreSQL database restores into a working database whose money adds up.
#
#   scripts/restore-drill.sh [--keep] SOURCE
#
# SOURCE is either a PostgreSQL URL, dumped now with pg_dump (one consistent
# snapshot, taken while the service keeps running), or a file made with
# `pg_dump --format=custom` (last night's backup). The drill then
#   1. restores it into a new scratch database (pg_restore --exit-on-error),
#   2. runs `reservo db migrate` on it (a backup of the running release: nothing
#      to apply; an older one is brought up to this release),
#   3. checks the invariants: every currency's balances sum to 0, every account's
#      balance is the sum of its ledger entries, every transfer is exactly two
#      entries (its amount out of one account, into the other), no customer
#      balance below 0, every slot's booked_count is its BOOKED appointments,
#   4. drops the scratch database (kept with --keep, its URL printed).
# Exit 0: restored, migrated and balanced. Anything else: the drill failed.
#
# Environment:
#   RESTORE_ADMIN_URL  a URL of the server (and a role that may CREATE DATABASE)
#                      to restore on; default: SOURCE's server, database postgres.
#                      Required when SOURCE is a file.
#   RESERVO            the reservo command of the release (default: reservo on PATH).
# pg_dump/pg_restore/psql must be of the server's major version or newer.
set -euo pipefail

keep=0
if [ "${1:-}" = "--keep" ]; then keep=1; shift; fi
[ $# -eq 1 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 64; }
source="$1"
reservo="${RESERVO:-reservo}"
work=$(mktemp -d)
scratch="reservo_drill_$(date +%Y%m%d%H%M%S)_$$"
created=0

with_database() { # URL DB -> the same URL naming database DB (query string kept)
  python3 - "$1" "$2" <<'PY'
import sys
from urllib.parse import urlsplit, urlunsplit
parts = urlsplit(sys.argv[1])
print(urlunsplit(parts._replace(path="/" + sys.argv[2])))
PY
}

case "$source" in
  postgres://* | postgresql://*) admin="${RESTORE_ADMIN_URL:-$(with_database "$source" postgres)}" ;;
  *) admin="${RESTORE_ADMIN_URL:?RESTORE_ADMIN_URL must name the server to restore on}" ;;
esac
target=$(with_database "$admin" "$scratch")

cleanup() {
  if [ "$created" = 1 ] && [ "$keep" = 0 ]; then
    psql -X -q "$admin" -c "DROP DATABASE IF EXISTS \"$scratch\" WITH (FORCE)" >/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

step() { printf 'restore-drill: %s\n' "$*"; }

if [ -f "$source" ]; then
  dump="$source"
  step "backup file $dump"
else
  dump="$work/reservo.dump"
  step "dumping the live database (one snapshot) ..."
  pg_dump --format=custom --no-owner --no-privileges --file "$dump" "$source"
fi
step "dump: $(du -h "$dump" | cut -f1)"

psql -X -q -v ON_ERROR_STOP=1 "$admin" -c "CREATE DATABASE \"$scratch\"" >/dev/null
created=1
step "restoring into $scratch ..."
pg_restore --exit-on-error --no-owner --no-privileges --dbname "$target" "$dump"

if ! migrated=$(RESERVO_DATABASE_URL="$target" "$reservo" db migrate 2>&1); then
  step "FAILED: reservo db migrate: $migrated"
  exit 1
fi
step "migrated: ${migrated##*$'\n'}"

# Each check counts what breaks its rule: all must be 0.
checks=$(cat <<'SQL'
SELECT 'currencies whose balances do not sum to 0', count(*) FROM (
  SELECT currency FROM wallet_account GROUP BY currency HAVING sum(balance) <> 0) x
UNION ALL
SELECT 'accounts whose balance is not the sum of their entries', count(*) FROM (
  SELECT a.id FROM wallet_account a LEFT JOIN wallet_entry e ON e.account_id = a.id
   GROUP BY a.id, a.balance HAVING a.balance <> coalesce(sum(e.amount), 0)) x
UNION ALL
SELECT 'transfers that are not two entries moving their amount', count(*) FROM (
  SELECT t.id FROM wallet_transfer t LEFT JOIN wallet_entry e ON e.transfer_id = t.id
   GROUP BY t.id
  HAVING count(e.id) <> 2 OR coalesce(sum(e.amount), 0) <> 0
      OR count(*) FILTER (WHERE e.account_id = t.from_account_id AND e.amount = -t.amount) <> 1
      OR count(*) FILTER (WHERE e.account_id = t.to_account_id AND e.amount = t.amount) <> 1) x
UNION ALL
SELECT 'entries without their transfer', count(*) FROM wallet_entry e
 WHERE NOT EXISTS (SELECT 1 FROM wallet_transfer t WHERE t.id = e.transfer_id)
UNION ALL
SELECT 'customer accounts below 0', count(*) FROM wallet_account
 WHERE kind = 'CUSTOMER' AND balance < 0
UNION ALL
SELECT 'slots whose booked_count is not their BOOKED appointments', count(*) FROM (
  SELECT s.id FROM time_slot s LEFT JOIN appointment a ON a.slot_id = s.id AND a.status = 'BOOKED'
   GROUP BY s.id, s.booked_count, s.capacity
  HAVING s.booked_count <> count(a.id) OR s.booked_count > s.capacity) x
SQL
)
results=$(psql -X -A -t -v ON_ERROR_STOP=1 "$target" -c "$checks")
[ "$(printf '%s\n' "$results" | wc -l)" = 6 ] || { step "FAILED: the checks did not run"; exit 1; }
failed=0
while IFS='|' read -r rule broken; do
  if [ "$broken" = 0 ]; then step "ok: 0 $rule"; else step "FAILED: $broken $rule"; failed=1; fi
done <<<"$results"

summary=$(psql -X -A -t -v ON_ERROR_STOP=1 "$target" -c "
  SELECT format('%s accounts, %s transfers, %s entries, %s appointments, %s bets',
    (SELECT count(*) FROM wallet_account), (SELECT count(*) FROM wallet_transfer),
    (SELECT count(*) FROM wallet_entry), (SELECT count(*) FROM appointment),
    (SELECT count(*) FROM betting_bet))")
step "restored: $summary"
[ "$keep" = 1 ] && step "kept: $target"
if [ "$failed" = 1 ]; then
  step "FAILED: the restored database breaks the invariants above"
  exit 1
fi
step "ok: restored, migrated, the ledger balances"

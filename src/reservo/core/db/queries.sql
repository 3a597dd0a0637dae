-- Named queries of core/db: the WAL positions the replica probe compares.

-- name: primary_wal_position
-- Where the primary's WAL ends now, in bytes (the read replicas' yardstick).
SELECT pg_current_wal_lsn() - '0/0'::pg_lsn;

-- name: replica_replay_position
-- Whether this server is a standby, and how much WAL it has replayed, in bytes.
SELECT pg_is_in_recovery() AS in_recovery,
       pg_last_wal_replay_lsn() - '0/0'::pg_lsn AS replayed;

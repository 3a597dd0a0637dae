-- Named queries of core/db: the WAL positions the replica probe compares.

-- name: primary_wal_position
-- Where the primary's WAL ends now, in bytes (the read replicas' yardstick).
SELECT pg_current_wal_lsn() - '0/0'::pg_lsn;

-- name: replica_replay_position
-- Whether this server is a standby, and how much WAL it has replayed, in bytes.
SELECT pg_is_in_recovery() AS in_recovery,
       pg_last_wal_replay_lsn() - '0/0'::pg_lsn AS replayed;

-- name: clock_now
-- PostgreSQL's clock as the statement runs (clock_timestamp, not the
-- transaction's start): what every process reads its time from (core/db/clock.py).
SELECT clock_timestamp();

-- name: commit_probe
-- The commit guard's probe: a write of the one row of db_commit_probe, whose
-- (autocommit) commit waits for the synchronous standbys like any write's.
INSERT INTO db_commit_probe (id, at) VALUES (1, now())
ON CONFLICT (id) DO UPDATE SET at = excluded.at;

-- name: sync_standby_names
-- Whether this server's commits wait for synchronous standbys at all (empty: no).
-- The commit guard probes only then: a slow commit on a server without
-- synchronous standbys is load, not a partition.
SELECT current_setting('synchronous_standby_names');

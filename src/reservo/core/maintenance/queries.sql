-- Named queries of core/maintenance: retention batches and day partitions.

-- name: prune_by_ctid
-- Retention (core/maintenance/retention.py): one batch, at most $2, of a table's rows that a
-- module's `*_prunable` query finds (their ctids, oldest first, older than the
-- cutoff $1); the table and the query are filled in by prune_by_ctid there.
-- Every *_prune statement has this shape: ($1 cutoff, $2 batch size) -> one row
-- counting the deleted rows per table. FOR UPDATE SKIP LOCKED: a row a request
-- holds right now is left for the next run, so pruning never waits on the hot
-- path. The LIMIT on a line of its own: a comment ending the query must not
-- take it.
WITH gone AS (
    DELETE FROM {table}
     WHERE ctid = ANY (ARRAY({prunable}
                              LIMIT $2 FOR UPDATE SKIP LOCKED))
    RETURNING 1
)
SELECT count(*) AS {table} FROM gone;

-- name: partition_list
-- The day partitions of table $1 with their bounds, oldest first (migration 0025).
SELECT name, lower_bound, upper_bound FROM history_partitions($1);

-- name: partition_add
-- Creates table $1's partition for day $2 (UTC) unless it exists; true when created.
SELECT history_partition_add($1, $2::date);

-- name: partition_lock_timeout
-- How long the partition DDL of this transaction waits for a lock before giving up.
SELECT set_config('lock_timeout', $1::text || 'ms', true);

-- name: partition_lock
-- ACCESS EXCLUSIVE on table $1 for the rest of the transaction (a retirement's first step).
SELECT history_partition_lock($1);

-- name: partition_retire
-- Detaches and drops partition $2 of table $1, re-inserting its rows whose
-- column $3 is one of $4 (they land in the default partition). NULL: gone already.
SELECT history_partition_retire($1, $2, $3, $4::text[]);

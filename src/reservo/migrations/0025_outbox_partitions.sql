-- The outbox, partitioned by day of created_at (UTC), so that retention drops a
-- whole day of delivered events (a catalog change and an unlink: no per-row
-- WAL, no dead tuples, no vacuum) instead of deleting it 5,000 rows at a time.
-- reservo.core.maintenance.partitions creates the days ahead and retires the old ones; a
-- DEFAULT partition takes any row no day partition covers, so an insert never
-- fails (the batch pruner keeps pruning it). docs/OPERATIONS.md, Retention.
--
-- Why the outbox only: the inbox and the notification table are dedup tables
-- (their unique keys refuse a second application of an event); a partitioned
-- table can only enforce a unique key that contains the partition key, and no
-- time of theirs is the same on every delivery of an event, so partitioning
-- them would let a redelivery through. job_execution's rows go with their job
-- (scheduled_job, the live queue, stays one table). docs/SCALING.md says more.

-- 1. Generic partition maintenance (any table partitioned by range on one
--    timestamptz column, with <parent>_default as its default partition).

-- The day partitions of a table, with their bounds (the default partition is
-- not listed): parsed from the bound expression PostgreSQL stores.
CREATE FUNCTION history_partitions(parent text)
RETURNS TABLE (name text, lower_bound timestamptz, upper_bound timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT c.relname::text,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)'))[1]::timestamptz,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz
      FROM pg_inherits i
      JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = to_regclass(quote_ident(parent))
       AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
     ORDER BY 2
$$;

-- Creates <parent>_pYYYYMMDD for [day, day + 1) in UTC unless it exists; true
-- when created. Rows that landed in the default partition for that day (the
-- day was not created in time) move into it first: attaching a partition
-- whose range the default still holds rows of is refused.
CREATE FUNCTION history_partition_add(parent text, day date)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    part text := parent || '_p' || to_char(day, 'YYYYMMDD');
    lo timestamptz := day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
    col text;
BEGIN
    -- The locks ATTACH takes, taken first. The parent's (SHARE UPDATE
    -- EXCLUSIVE: writers pass, another add or a retirement waits) makes two
    -- maintenance processes take turns, always parent first; the default
    -- partition's keeps any insert from reaching it between the move below
    -- and the attach's check of it.
    EXECUTE format('LOCK TABLE %I IN SHARE UPDATE EXCLUSIVE MODE', parent);
    IF to_regclass(quote_ident(part)) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', parent || '_default');
    SELECT a.attname INTO STRICT col
      FROM pg_partitioned_table p
      JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
     WHERE p.partrelid = to_regclass(quote_ident(parent));
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                   part, parent);
    EXECUTE format('WITH moved AS (DELETE FROM %I WHERE %I >= $1 AND %I < $2 RETURNING *) '
                   'INSERT INTO %I SELECT * FROM moved',
                   parent || '_default', col, col, part) USING lo, hi;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   parent, part, lo, hi);
    RETURN true;
END $$;

-- The lock a retirement takes first, before any check: ACCESS EXCLUSIVE on the
-- parent (what DETACH and DROP take anyway), so the check that all the
-- partition's rows are finished and the drop see the same rows. The parent
-- first, as every statement on the table locks it: no lock-order deadlock.
CREATE FUNCTION history_partition_lock(parent text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', parent);
END $$;

-- Detaches and drops one day partition; its rows whose keep_column is one of
-- keep_values (rows kept forever, e.g. DEAD events waiting for a replay) are
-- re-inserted first and land in the default partition. The caller has checked,
-- under history_partition_lock, that every other row may go. Returns the rows
-- kept, or NULL when the partition is no longer there (another process retired it).
CREATE FUNCTION history_partition_retire(parent text, part text, keep_column text,
                                         keep_values text[])
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    kept bigint;
BEGIN
    -- The caller holds history_partition_lock: nobody else adds or retires now.
    IF part = parent || '_default' OR NOT EXISTS (
           SELECT 1 FROM pg_inherits
            WHERE inhparent = to_regclass(quote_ident(parent))
              AND inhrelid = to_regclass(quote_ident(part))) THEN
        RETURN NULL;
    END IF;
    EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', parent, part);
    EXECUTE format('INSERT INTO %I SELECT * FROM %I WHERE %I = ANY ($1)',
                   parent, part, keep_column) USING keep_values;
    GET DIAGNOSTICS kept = ROW_COUNT;
    EXECUTE format('DROP TABLE %I', part);
    RETURN kept;
END $$;

-- 2. The outbox, rebuilt partitioned. Same columns, same ids (the sequence is
--    kept), same indexes per partition. Keys must contain the partition key:
--    the primary key becomes (id, created_at) (ids still come from one
--    sequence) and event_id is unique per created_at (event ids are random
--    UUIDs minted by reservo.core.messaging.outbox.emit; nothing looks an event up by it
--    on a hot path, and consumers deduplicate through their own inboxes).
ALTER TABLE outbox RENAME TO outbox_before_0025;
ALTER TABLE outbox_before_0025 RENAME CONSTRAINT outbox_pkey TO outbox_before_0025_pkey;
ALTER TABLE outbox_before_0025
    RENAME CONSTRAINT outbox_event_id_key TO outbox_before_0025_event_id_key;
ALTER INDEX outbox_pending RENAME TO outbox_before_0025_pending;
ALTER INDEX outbox_dead RENAME TO outbox_before_0025_dead;
ALTER INDEX IF EXISTS outbox_done_published RENAME TO outbox_before_0025_done_published;
-- LIKE below copies the status check with its name. Databases that ran this
-- file when it spelled the columns out got outbox_status_check1 (the old
-- table still held outbox_status_check then): every database gets that name.
ALTER TABLE outbox_before_0025 RENAME CONSTRAINT outbox_status_check TO outbox_status_check1;

CREATE TABLE outbox (
    -- The columns, their defaults (id's from the same sequence) and the status
    -- check, as 0001 defined them.
    LIKE outbox_before_0025 INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    CONSTRAINT outbox_pkey PRIMARY KEY (id, created_at),
    CONSTRAINT outbox_event_id_key UNIQUE (event_id, created_at)
) PARTITION BY RANGE (created_at);
ALTER SEQUENCE outbox_id_seq OWNED BY outbox.id;

CREATE TABLE outbox_default PARTITION OF outbox DEFAULT;
-- The relay's claim (ORDER BY id over the pending rows: a merge of each
-- partition's small index), the dead list, and the batch pruner's walk.
CREATE INDEX outbox_pending ON outbox (id) WHERE status = 'PENDING';
CREATE INDEX outbox_dead ON outbox (id) WHERE status = 'DEAD';
CREATE INDEX outbox_done_published ON outbox (published_at) WHERE status = 'DONE';

-- Today and the next 7 days (the maintenance role keeps
-- RESERVO_RETENTION_PARTITION_DAYS_AHEAD days ahead from then on). Rows from
-- before today go to the default partition, which the batch pruner empties of
-- its DONE rows within the retention period.
SELECT history_partition_add('outbox', (now() AT TIME ZONE 'UTC')::date + d)
  FROM generate_series(0, 7) AS d;

-- Same columns in the same order (LIKE above).
INSERT INTO outbox SELECT * FROM outbox_before_0025;

DROP TABLE outbox_before_0025;
ANALYZE outbox;

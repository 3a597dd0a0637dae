-- The commit guard's probe (core/db/guard.py): every process updates this one row
-- about once a second, an autocommit that writes a commit record and so waits for
-- the synchronous standbys like any write. Expand-only: a new table, read by no
-- code of an earlier release.
CREATE TABLE IF NOT EXISTS db_commit_probe (
    id smallint PRIMARY KEY CHECK (id = 1),
    at timestamptz NOT NULL
);

"""PostgreSQL: the pool and named SQL (database), the replicas and the stale reads
built over the pool, migrations, rows. Imports only core.aio and core.kernel."""

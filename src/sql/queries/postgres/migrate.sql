-- One simple-protocol query: PostgreSQL runs its statements as one transaction, under the
-- advisory lock of the table; without the notices of what exists already ("relation ...
-- already exists, skipping"), which sqlx logs at info, one per statement.
SELECT pg_advisory_xact_lock(hashtext('tower_idempotency:{table}'));
SET LOCAL client_min_messages = warning;
{schema}

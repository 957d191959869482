-- $1 after this key, $2 now, $3 limit, then the filter's $4 to $9. The first $3 dead letters
-- matching the filter after the key $1, by key, queued again now ($2) as `requeue.sql` does;
-- the keys re-queued. On a dead letter every condition of `matching.sql` is exact. The choice
-- is materialized: a semi-join may run a LIMIT subquery again for each row it joins, and
-- re-queue more than $3.
WITH chosen AS MATERIALIZED (
    SELECT key FROM {table}
    WHERE key > $1 AND state = 'dead' AND {matching}
    ORDER BY key LIMIT $3{row_locks}
)
UPDATE {table} SET state = 'queued', attempts = 0, next_at = $2, last_error = NULL
WHERE key IN (SELECT key FROM chosen) AND state = 'dead'
RETURNING key, next_at AS at

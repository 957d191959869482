-- $1 the most rows to delete, $2 now. Done keys past their retention, a batch at a time.
DELETE FROM {table}
WHERE key IN (
    SELECT key FROM {table} WHERE state = 'done' AND expires_at <= $2
    ORDER BY expires_at LIMIT $1{row_locks}
) AND state = 'done' AND expires_at <= $2

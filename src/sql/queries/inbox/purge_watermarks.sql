-- $1 the most rows to delete, $2 now. Watermarks past their retention, a batch at a time.
DELETE FROM {table}_objects
WHERE object IN (
    SELECT object FROM {table}_objects WHERE expires_at <= $2
    ORDER BY expires_at LIMIT $1{row_locks}
) AND expires_at <= $2

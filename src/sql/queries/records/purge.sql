-- $1 the most rows to delete. Deletes in batches (short transactions); the condition is
-- checked again on the rows selected.
DELETE FROM {table}
WHERE key IN (
    SELECT key FROM {table} WHERE expires_at <= {now}
    ORDER BY expires_at LIMIT $1{row_locks}
) AND expires_at <= {now}

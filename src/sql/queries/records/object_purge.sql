-- $1 the most rows to delete: objects whose lease and watermark have both expired.
DELETE FROM {objects}
WHERE object IN (
    SELECT object FROM {objects} WHERE expires_at <= {now}
    ORDER BY expires_at LIMIT $1{row_locks}
) AND expires_at <= {now}

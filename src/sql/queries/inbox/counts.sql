-- $1 now. Pending (a lease that ran out counts), in flight, dead, the oldest enqueue time:
-- read through the partial indexes of the live rows (`<table>_take_idx`) and of the dead ones
-- (`<table>_dead_idx`), never the done keys, which outnumber them (a worker counts every
-- second).
SELECT
    COALESCE(SUM(CASE WHEN state = 'queued' OR lease_until <= $1 THEN 1 ELSE 0 END), 0),
    COALESCE(SUM(CASE WHEN state = 'running' AND lease_until > $1 THEN 1 ELSE 0 END), 0),
    (SELECT COUNT(*) FROM {table} WHERE state = 'dead'),
    MIN(enqueued_at)
FROM {table} WHERE state IN ('queued', 'running')

-- $1 max, $2 lease end, $3 token, $4 now, $5 now in µs, $6 worker. The entries taken, then
-- `stale`.
--
-- The due entries (queued and due, or running with a lease that ran out), locked and skipped
-- when another take holds them. An ordered one only when it is its object's next: a queued one
-- when none of its object is running and no queued one stands before it (by position, then
-- key); a running one (taken over) whatever is queued before it, since an object's entry in
-- flight is the only one of it that runs until it settles.
--
-- Read through `<table>_take_idx`, in due order, until $1 entries are found: its cost follows
-- the entries it passes over (locked by another take, or waiting behind their object's), not
-- the backlog; never a sort of the table. The choice is materialized: a semi-join may run a
-- LIMIT subquery again for each row it joins, and under SKIP LOCKED a second run can choose
-- other rows, so a take could lease more than $1 entries.
WITH chosen AS MATERIALIZED (
    SELECT e.key FROM {table} AS e
    WHERE e.state IN ('queued', 'running') AND {due_at} <= $4
      AND NOT EXISTS (SELECT 1 FROM {table}_paused)
      AND (e.object IS NULL OR NOT EXISTS (
        SELECT 1 FROM {table} AS o
        WHERE o.object = e.object AND o.key <> e.key AND o.state IN ('queued', 'running')
          AND ((o.state = 'running' AND e.state = 'queued')
            OR (o.state = e.state AND (o.position < e.position
                OR (o.position = e.position AND o.key < e.key))))))
    ORDER BY {due_at}, e.key
    LIMIT $1{row_locks}
)
UPDATE {table}
SET state = 'running', attempts = attempts + 1, lease_token = $3, lease_until = $2,
    history = CASE WHEN state = 'running' AND started_us IS NOT NULL
        THEN {appended_lost} ELSE history END,
    started_us = $5, worker = $6
WHERE key IN (SELECT key FROM chosen)
RETURNING {entry_columns}, EXISTS (
    SELECT 1 FROM {table}_objects AS w
    WHERE w.object = {table}.object AND w.expires_at > $4
        AND (w.watermark > {table}.position
            OR ({table}.equal_stale = 1 AND w.watermark = {table}.position))
) AS stale

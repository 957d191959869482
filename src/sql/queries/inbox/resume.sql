-- $1 now. A row when it resumed; told like an enqueue due now: every idle worker takes again.
DELETE FROM {table}_paused RETURNING 'resumed' AS key, $1 AS at

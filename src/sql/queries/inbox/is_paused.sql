-- Whether paused (a count).
SELECT COUNT(*) FROM {table}_paused

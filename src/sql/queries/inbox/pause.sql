-- $1 now.
INSERT INTO {table}_paused (one, paused_at) VALUES (1, $1)
ON CONFLICT (one) DO NOTHING

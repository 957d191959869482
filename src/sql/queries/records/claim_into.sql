-- The head of a claim's insert (`claim.sql`, and PostgreSQL's `reserve_many.sql`).
INSERT INTO {table} AS cur (key, state, token, fingerprint, record, expires_at, created_at)

-- The columns of a PostgreSQL record store's objects table (see records/schema.sql).
    object          text        PRIMARY KEY,
    token           bytea,
    lease_until     timestamptz,
    watermark       bytea,
    watermark_until timestamptz,
    expires_at      timestamptz NOT NULL

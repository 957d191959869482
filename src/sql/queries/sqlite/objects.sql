-- The columns of an SQLite record store's objects table (see records/schema.sql).
    object          TEXT    NOT NULL PRIMARY KEY,
    token           BLOB,
    lease_until     INTEGER,
    watermark       BLOB,
    watermark_until INTEGER,
    expires_at      INTEGER NOT NULL

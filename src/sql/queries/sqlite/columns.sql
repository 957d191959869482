-- The columns of an SQLite record store's keys table (see records/schema.sql).
    key         TEXT    NOT NULL PRIMARY KEY,
    state       TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed')),
    token       BLOB,
    fingerprint BLOB    NOT NULL,
    record      BLOB,
    expires_at  INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    CHECK ((state = 'in_flight') = (token IS NOT NULL)),
    CHECK ((state = 'completed') = (record IS NOT NULL))

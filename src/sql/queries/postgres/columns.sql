-- The columns of a PostgreSQL record store's keys table (see records/schema.sql).
    key         text        PRIMARY KEY,
    state       text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    token       bytea,
    fingerprint bytea       NOT NULL,
    record      bytea,
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((state = 'in_flight') = (token IS NOT NULL)),
    CHECK ((state = 'completed') = (record IS NOT NULL))

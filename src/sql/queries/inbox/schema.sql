-- The schema of an inbox: the entries, their objects' watermarks and the pause flag, with
-- the indexes the take, the purge and the dead letters read. Names: {table} (maybe
-- schema-qualified), {index} (its bare name), {schema_prefix} (the schema part of {table},
-- with its dot, or nothing), {bytes} (the dialect's column type of bytes), {due_at} (the
-- take's order, due_at.sql) and {added} (the ALTER TABLEs of the columns added since the
-- first release, where the dialect takes ADD COLUMN IF NOT EXISTS). The comments below this
-- header are kept: they are what an operator reads in the schema.

CREATE TABLE IF NOT EXISTS {table} (
    key            text    NOT NULL PRIMARY KEY,
    state          text    NOT NULL CHECK (state IN ('queued', 'running', 'dead', 'done')),
    body           {bytes},
    headers        {bytes},
    object         text,
    position       {bytes},
    correlation_id text    NOT NULL,
    attempts       bigint  NOT NULL,
    next_at        bigint  NOT NULL,
    lease_token    {bytes},
    lease_until    bigint,
    last_error     text,
    enqueued_at    bigint  NOT NULL,
    expires_at     bigint,
    -- The delivery's key as the route derived it, and the route: what operators find it by.
    id             text    NOT NULL DEFAULT '',
    route          text    NOT NULL DEFAULT '',
    -- The attempts that ended, one line each (the crate's `admin::history` form); the one
    -- that runs is `attempts`, `started_us` (µs since the epoch) and `worker`.
    history        text    NOT NULL DEFAULT '',
    started_us     bigint,
    worker         text,
    -- 1 when a position equal to the object's watermark is stale (the route's rule), else 0.
    equal_stale    bigint  NOT NULL DEFAULT 0,
    -- A done key keeps the token that completed it.
    CHECK (state = 'done' OR (state = 'running') = (lease_token IS NOT NULL)),
    CHECK ((state = 'done') = (expires_at IS NOT NULL))
);
{added}-- The take's order, over what it may take: a take is an index scan that stops at its limit.
CREATE INDEX IF NOT EXISTS {index}_take_idx ON {table} (({due_at}), key)
    WHERE state IN ('queued', 'running');
-- Replaced by the take's index (SQLite's planner preferred it and sorted the backlog).
DROP INDEX IF EXISTS {schema_prefix}{index}_due_idx;
-- The purge's order over the done keys, and the dead letters' over the dead entries.
CREATE INDEX IF NOT EXISTS {index}_expires_idx ON {table} (expires_at) WHERE state = 'done';
CREATE INDEX IF NOT EXISTS {index}_dead_idx ON {table} (enqueued_at, key) WHERE state = 'dead';
CREATE INDEX IF NOT EXISTS {index}_object_idx ON {table} (object, position);
-- One entry of an object in flight: the database's own guard (see the take).
CREATE UNIQUE INDEX IF NOT EXISTS {index}_in_flight_idx ON {table} (object)
    WHERE state = 'running';
-- An object's watermark lasts for the retention of the last completion of its events, as
-- the done keys do.
CREATE TABLE IF NOT EXISTS {table}_objects (
    object     text    NOT NULL PRIMARY KEY,
    watermark  {bytes} NOT NULL,
    expires_at bigint  NOT NULL
);
CREATE INDEX IF NOT EXISTS {index}_objects_expires_idx ON {table}_objects (expires_at);
-- One row while taking is paused (every take reads it).
CREATE TABLE IF NOT EXISTS {table}_paused (
    one       integer NOT NULL PRIMARY KEY CHECK (one = 1),
    paused_at bigint  NOT NULL
);

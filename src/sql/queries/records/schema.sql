-- The schema of a record store: the keys table, with the dialect's {columns}, the objects
-- table of ordered events, with its {objects}, and the indexes the purge uses. Names: {table}
-- (the table, maybe schema-qualified) and {index} (its bare name, which the indexes start
-- with).

CREATE TABLE IF NOT EXISTS {table} (
{columns}
);
CREATE INDEX IF NOT EXISTS {index}_expires_at_idx ON {table} (expires_at);
CREATE TABLE IF NOT EXISTS {table}_objects (
{objects}
);
CREATE INDEX IF NOT EXISTS {index}_objects_expires_at_idx ON {table}_objects (expires_at);

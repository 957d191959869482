-- $1 key. The row as `INFO_COLUMNS`.
SELECT {info_columns} FROM {table} WHERE key = $1

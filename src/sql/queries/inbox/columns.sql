-- The names of the table's columns (SQLite), for `migrate`.
SELECT name FROM pragma_table_info('{table}')

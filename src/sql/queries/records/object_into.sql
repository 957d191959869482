-- The head of an insert into the table of objects.
INSERT INTO {objects} AS cur (object, token, lease_until, watermark, watermark_until, expires_at)

//! The statements of the SQL stores, written once for every [`Dialect`]: parameters are `$1`,
//! `$2`, ... (SQLite reads `$N` as `?N`), and the dialect writes the time (the database's
//! `now()`, or a clock bound after the statement's own parameters), the shape of a claim, the
//! purge's row locks and the schema.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::Dialect;

/// The text of one statement (or script), shared: handing it to sqlx clones an `Arc`, never
/// the text.
///
/// sqlx (0.9) runs only SQL it is told is safe: a `&'static str`, or a string wrapped in
/// [`AssertSqlSafe`]. Ours are built at start-up by `format!` from this crate's own literals
/// and the table name, which `validate_table` restricts to an SQL identifier (optionally
/// schema-qualified) before it is written into them; every value is a bound parameter. That is
/// what [`sql_str`](Self::sql_str), the one place that asserts it, relies on.
pub struct Sql(Arc<str>);

impl Sql {
    /// The statement, as sqlx takes it.
    pub(super) fn sql_str(&self) -> SqlStr {
        // Safe: see the type's docs (our literals and a validated identifier, no values).
        AssertSqlSafe(Arc::clone(&self.0)).into_sql_str()
    }
}

impl From<String> for Sql {
    fn from(text: String) -> Self {
        Sql(text.into())
    }
}

impl Deref for Sql {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Sql {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
impl PartialEq<&str> for Sql {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

/// The text of every statement of a store, for one table.
#[derive(Debug)]
pub(super) struct Statements {
    /// The table name.
    pub(super) table: String,
    /// `CREATE TABLE IF NOT EXISTS` and `CREATE INDEX IF NOT EXISTS`.
    pub(super) schema: String,
    /// The script `migrate` runs.
    pub(super) migrate: Sql,
    /// $1 key, $2 token, $3 fingerprint, $4 lease (ms). One row when the claim is ours
    /// (`acquired` true); or, where the dialect reads it in the same statement, the live row
    /// holding the key (`acquired` false, `state`, `fingerprint`, `record`).
    pub(super) reserve: Sql,
    /// $1 key. The live row holding the key, as in `reserve`, for dialects whose `reserve`
    /// does not read it.
    pub(super) read_live: Option<Sql>,
    /// $1 the keys, comma-separated (a [`StoreKey`](crate::store::StoreKey) has no comma),
    /// then as in `reserve`: one row per key, in order, as `reserve` returns them (with
    /// `state` `NULL` when the key is to be claimed again). `None`: one `reserve` per key.
    pub(super) reserve_many: Option<Sql>,
    /// $1 key, $2 token, $3 fingerprint, $4 record, $5 retention (ms).
    pub(super) complete: Sql,
    /// $1 key, $2 token.
    pub(super) release: Sql,
    /// $1 key, $2 token, $3 lease (ms).
    pub(super) renew: Sql,
    /// $1 key. The live completed record, after a `complete` that updated no row.
    pub(super) read_record: Sql,
    /// $1 the most rows to delete.
    pub(super) purge: Sql,
    /// $1 object, $2 token, $3 lease (ms). Takes the object's lease for the token when free,
    /// expired or the token's already: one row, the live watermark (or `NULL`); no row when
    /// another claim holds the object.
    pub(super) lease_object: Sql,
    /// $1 object, $2 position (16 bytes), $3 retention (ms). Raises the watermark to the
    /// position when it is higher (or there is none).
    pub(super) raise_watermark: Sql,
    /// $1 object, $2 token. Lets go of the object's lease when the token holds it.
    pub(super) unlock_object: Sql,
    /// $1 object, $2 token, $3 lease (ms). Extends the object's lease when the token holds it.
    pub(super) renew_object: Sql,
    /// $1 the most rows to delete: objects whose lease and watermark have both expired.
    pub(super) purge_objects: Sql,
}

impl Statements {
    pub(super) fn new<DB: Dialect>(table: &str) -> Self {
        // `now(n)`: the current time in a statement of n - 1 parameters (SQLite binds its
        // clock as parameter n); `live_claim(n)`: the row is the live claim of the token in $2.
        let now = DB::now;
        let live_claim = |clock| {
            format!(
                "key = $1 AND state = 'in_flight' AND token = $2 AND expires_at > {}",
                now(clock)
            )
        };
        // Inserts the row, or takes over in place a row that expired (or is our own claim,
        // sent again); returns a row only when the claim is ours.
        let insert = format!(
            "INSERT INTO {table} AS cur (key, state, token, fingerprint, record, expires_at, created_at)"
        );
        let on_conflict = format!(
            "ON CONFLICT (key) DO UPDATE
    SET state = 'in_flight', token = EXCLUDED.token, fingerprint = EXCLUDED.fingerprint,
        record = NULL, expires_at = EXCLUDED.expires_at, created_at = EXCLUDED.created_at
    WHERE cur.expires_at <= {now}
       OR (cur.state = 'in_flight' AND cur.token = EXCLUDED.token)",
            now = now(5),
        );
        let claim = format!(
            "{insert}
VALUES ($1, 'in_flight', $2, $3, NULL, {lease_end}, {now})
{on_conflict}
RETURNING true AS acquired",
            now = now(5),
            lease_end = DB::plus_millis(&now(5), "$4"),
        );
        let read_live = format!(
            "SELECT false AS acquired, state, fingerprint, record, {left} AS left_ms FROM {table}
WHERE key = $1 AND expires_at > {now}",
            left = DB::millis_until("expires_at", &now(2)),
            now = now(2)
        );
        let (reserve, read_live) = DB::reserve(&claim, &read_live);
        let reserve_many = DB::reserve_many(table, &insert, &on_conflict);
        let schema = DB::schema(table);
        let objects = format!("{table}_objects");
        let objects_sql = ObjectStatements::new::<DB>(&objects);
        let migrate = DB::migrate(table, &schema).into();
        Statements {
            table: table.to_owned(),
            schema,
            migrate,
            reserve: reserve.into(),
            read_live: read_live.map(Sql::from),
            reserve_many: reserve_many.map(Sql::from),
            complete: format!(
                "UPDATE {table}
SET state = 'completed', token = NULL, fingerprint = $3, record = $4, expires_at = {}
WHERE {}",
                DB::plus_millis(&now(6), "$5"),
                live_claim(6)
            )
            .into(),
            release: format!("DELETE FROM {table}\nWHERE {}", live_claim(3)).into(),
            renew: format!(
                "UPDATE {table} SET expires_at = {}\nWHERE {}",
                DB::plus_millis(&now(4), "$3"),
                live_claim(4)
            )
            .into(),
            read_record: format!(
                "SELECT record FROM {table}
WHERE key = $1 AND state = 'completed' AND expires_at > {}",
                now(2)
            )
            .into(),
            // Deletes in batches (short transactions); the condition is checked again on the
            // rows selected.
            purge: format!(
                "DELETE FROM {table}
WHERE key IN (
    SELECT key FROM {table} WHERE expires_at <= {now}
    ORDER BY expires_at LIMIT $1{locks}
) AND expires_at <= {now}",
                now = now(2),
                locks = DB::PURGE_LOCKS,
            )
            .into(),
            lease_object: objects_sql.lease.into(),
            raise_watermark: objects_sql.raise.into(),
            unlock_object: objects_sql.unlock.into(),
            renew_object: objects_sql.renew.into(),
            purge_objects: objects_sql.purge.into(),
        }
    }
}

/// The statements on the table of objects.
struct ObjectStatements {
    lease: String,
    raise: String,
    unlock: String,
    renew: String,
    purge: String,
}

impl ObjectStatements {
    fn new<DB: Dialect>(objects: &str) -> Self {
        let now = DB::now;
        let insert = format!(
            "INSERT INTO {objects} AS cur (object, token, lease_until, watermark, watermark_until, expires_at)"
        );
        let until = |millis: &str, clock: usize| DB::plus_millis(&now(clock), millis);
        ObjectStatements {
            lease: format!(
                "{insert}
VALUES ($1, $2, {lease_end}, NULL, NULL, {lease_end})
ON CONFLICT (object) DO UPDATE
    SET token = EXCLUDED.token, lease_until = EXCLUDED.lease_until,
        expires_at = {greatest}
    WHERE cur.token IS NULL OR cur.lease_until <= {now} OR cur.token = EXCLUDED.token
RETURNING CASE WHEN watermark_until > {now} THEN watermark END AS watermark",
                lease_end = until("$3", 4),
                greatest = DB::greatest("cur.expires_at", "EXCLUDED.lease_until"),
                now = now(4),
            ),
            raise: format!(
                "{insert}
VALUES ($1, NULL, NULL, $2, {end}, {end})
ON CONFLICT (object) DO UPDATE
    SET watermark = EXCLUDED.watermark, watermark_until = EXCLUDED.watermark_until,
        expires_at = {greatest}
    WHERE cur.watermark IS NULL OR cur.watermark_until <= {now}
       OR cur.watermark < EXCLUDED.watermark",
                end = until("$3", 4),
                greatest = DB::greatest("cur.expires_at", "EXCLUDED.watermark_until"),
                now = now(4),
            ),
            unlock: format!(
                "UPDATE {objects} SET token = NULL, lease_until = NULL
WHERE object = $1 AND token = $2"
            ),
            renew: format!(
                "UPDATE {objects} SET lease_until = {end}, expires_at = {greatest}
WHERE object = $1 AND token = $2 AND lease_until > {now}",
                end = until("$3", 4),
                greatest = DB::greatest("expires_at", &until("$3", 4)),
                now = now(4),
            ),
            purge: format!(
                "DELETE FROM {objects}
WHERE object IN (
    SELECT object FROM {objects} WHERE expires_at <= {now}
    ORDER BY expires_at LIMIT $1{locks}
) AND expires_at <= {now}",
                now = now(2),
                locks = DB::PURGE_LOCKS,
            ),
        }
    }
}

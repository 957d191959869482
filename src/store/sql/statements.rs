//! The statements of the SQL stores, written once for every [`Dialect`]: parameters are `$1`,
//! `$2`, ... (SQLite reads `$N` as `?N`), and the dialect writes the time (the database's
//! `now()`, or a clock bound after the statement's own parameters), the shape of a claim, the
//! purge's row locks and the schema.

use super::Dialect;

/// The text of every statement of a store, for one table.
#[derive(Debug)]
pub(super) struct Statements {
    /// The table name.
    pub(super) table: String,
    /// `CREATE TABLE IF NOT EXISTS` and `CREATE INDEX IF NOT EXISTS`.
    pub(super) schema: String,
    /// The script `migrate` runs.
    pub(super) migrate: String,
    /// $1 key, $2 token, $3 fingerprint, $4 lease (ms). One row when the claim is ours
    /// (`acquired` true); or, where the dialect reads it in the same statement, the live row
    /// holding the key (`acquired` false, `state`, `fingerprint`, `record`).
    pub(super) reserve: String,
    /// $1 key. The live row holding the key, as in `reserve`, for dialects whose `reserve`
    /// does not read it.
    pub(super) read_live: Option<String>,
    /// $1 the keys, comma-separated (a [`StoreKey`](crate::store::StoreKey) has no comma),
    /// then as in `reserve`: one row per key, in order, as `reserve` returns them (with
    /// `state` `NULL` when the key is to be claimed again). `None`: one `reserve` per key.
    pub(super) reserve_many: Option<String>,
    /// $1 key, $2 token, $3 fingerprint, $4 record, $5 retention (ms).
    pub(super) complete: String,
    /// $1 key, $2 token.
    pub(super) release: String,
    /// $1 key, $2 token, $3 lease (ms).
    pub(super) renew: String,
    /// $1 key. The live completed record, after a `complete` that updated no row.
    pub(super) read_record: String,
    /// $1 key. The live completed record and the milliseconds it has left.
    pub(super) remaining: String,
    /// $1 the most rows to delete.
    pub(super) purge: String,
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
            "SELECT false AS acquired, state, fingerprint, record FROM {table}
WHERE key = $1 AND expires_at > {}",
            now(2)
        );
        let (reserve, read_live) = DB::reserve(&claim, &read_live);
        let reserve_many = DB::reserve_many(table, &insert, &on_conflict);
        let schema = DB::schema(table);
        Statements {
            table: table.to_owned(),
            migrate: DB::migrate(table, &schema),
            schema,
            reserve,
            read_live,
            reserve_many,
            complete: format!(
                "UPDATE {table}
SET state = 'completed', token = NULL, fingerprint = $3, record = $4, expires_at = {}
WHERE {}",
                DB::plus_millis(&now(6), "$5"),
                live_claim(6)
            ),
            release: format!("DELETE FROM {table}\nWHERE {}", live_claim(3)),
            renew: format!(
                "UPDATE {table} SET expires_at = {}\nWHERE {}",
                DB::plus_millis(&now(4), "$3"),
                live_claim(4)
            ),
            read_record: format!(
                "SELECT record FROM {table}
WHERE key = $1 AND state = 'completed' AND expires_at > {}",
                now(2)
            ),
            remaining: format!(
                "SELECT record, {} FROM {table}
WHERE key = $1 AND state = 'completed' AND expires_at > {}",
                DB::millis_until("expires_at", &now(2)),
                now(2)
            ),
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
            ),
        }
    }
}

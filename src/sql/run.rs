//! What the record store and the inbox share of running their statements on a pool: errors
//! classified by the dialect, connections and transactions, rows counted or read, the
//! migration and the batched purge. Each keeps only what is its own (the statements, and
//! whether they read a bound clock).

use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::{Pool, Transaction};

use super::query::Param;
use super::statements::Sql;
use super::{Dialect, InvalidTable, purge_in_batches, store_error, validate_table};
use crate::store::StoreError;

/// Maps an sqlx error to a [`StoreError`], classified by the dialect.
pub(crate) fn error<DB: Dialect>(error: sqlx::Error) -> StoreError {
    store_error(error, DB::classify)
}

/// The statements `new` builds for `table`, once `table` is known to be an SQL identifier the
/// dialect accepts (it is written into the statements as it is).
pub(super) fn statements_for<DB: Dialect, S>(
    table: &str,
    new: impl FnOnce(&str) -> S,
) -> Result<Arc<S>, InvalidTable> {
    validate_table(table, DB::QUALIFIED_TABLES)?;
    Ok(Arc::new(new(table)))
}

/// A connection from `pool`.
pub(super) async fn acquire<DB: Dialect>(
    pool: &Pool<DB>,
) -> Result<PoolConnection<DB>, StoreError> {
    pool.acquire().await.map_err(error::<DB>)
}

/// A transaction on a connection from `pool`.
pub(super) async fn begin<DB: Dialect>(
    pool: &Pool<DB>,
) -> Result<Transaction<'static, DB>, StoreError> {
    pool.begin().await.map_err(error::<DB>)
}

/// Runs `sql` with `params`, then `clock` when given (see `Dialect::clock`), on `conn`;
/// returns how many rows it wrote.
pub(super) async fn execute<DB: Dialect>(
    conn: &mut DB::Connection,
    sql: &Sql,
    params: &[Param<'_>],
    clock: Option<i64>,
) -> Result<u64, StoreError> {
    let done = DB::execute(conn, sql, params, clock)
        .await
        .map_err(error::<DB>)?;
    Ok(DB::rows_affected(&done))
}

/// Runs `sql` like [`execute`] and returns its rows.
pub(super) async fn fetch<DB: Dialect>(
    conn: &mut DB::Connection,
    sql: &Sql,
    params: &[Param<'_>],
    clock: Option<i64>,
) -> Result<Vec<DB::Row>, StoreError> {
    DB::fetch_all(conn, sql, params, clock)
        .await
        .map_err(error::<DB>)
}

/// Runs the `migrate` script of a table on `pool`.
pub(super) async fn migrate<DB: Dialect>(pool: &Pool<DB>, script: &Sql) -> Result<(), StoreError> {
    DB::execute_script(pool, script)
        .await
        .map_err(error::<DB>)?;
    Ok(())
}

/// Runs each of the purge `statements` in batches of at most `batch_size` rows (see
/// [`purge_in_batches`]), each batch on a connection of its own from `pool` so that a batch
/// holds nothing up for long, with the parameters `params(limit)` and then `clock()`; returns
/// how many rows they deleted.
pub(super) async fn purge<DB: Dialect>(
    pool: &Pool<DB>,
    statements: [&Sql; 2],
    batch_size: u32,
    params: impl Fn(i64) -> Vec<Param<'static>>,
    clock: fn() -> Option<i64>,
) -> Result<u64, StoreError> {
    let mut deleted = 0;
    for statement in statements {
        deleted += purge_in_batches(batch_size, |limit| {
            let params = params(limit);
            async move {
                let mut conn = acquire(pool).await?;
                execute::<DB>(&mut conn, statement, &params, clock()).await
            }
        })
        .await?;
    }
    Ok(deleted)
}

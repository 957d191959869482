//! Statements run on any sqlx database: parameters bound, rows counted, columns read.
//!
//! The one place that spells out what the store needs of sqlx's traits (an executor for the
//! pool, encoders and decoders of a few types), in a blanket impl: the store itself asks only
//! for `DB: Dialect`.

use std::future::Future;

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Row, Type};

use super::statements::Sql;

/// A value bound to a statement parameter.
#[derive(Clone, Copy, Debug)]
pub enum Param<'a> {
    /// `text` / `TEXT`.
    Text(&'a str),
    /// `bytea` / `BLOB`.
    Bytes(&'a [u8]),
    /// `bigint` / `INTEGER`.
    Int(i64),
    /// `text` / `TEXT`, or `NULL`.
    MaybeText(Option<&'a str>),
}

/// What the SQL store runs on an sqlx database. Implemented for every database sqlx's traits
/// allow; the store's dialects are PostgreSQL and SQLite.
pub trait Backend: Database {
    /// Runs `sql` with `params`, then `clock` when given (see `Dialect::clock`), on `conn`.
    fn execute<'a>(
        conn: &'a mut Self::Connection,
        sql: &Sql,
        params: &[Param<'_>],
        clock: Option<i64>,
    ) -> impl Future<Output = Result<Self::QueryResult, sqlx::Error>> + Send + 'a;

    /// Runs `sql` like [`execute`](Self::execute) and returns its rows.
    fn fetch_all<'a>(
        conn: &'a mut Self::Connection,
        sql: &Sql,
        params: &[Param<'_>],
        clock: Option<i64>,
    ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send + 'a;

    /// Runs the statements of `script`, without parameters.
    fn execute_script<'a>(
        pool: &'a Pool<Self>,
        script: &Sql,
    ) -> impl Future<Output = Result<Self::QueryResult, sqlx::Error>> + Send + 'a;

    /// The boolean in `column` of `row`.
    fn flag(row: &Self::Row, column: usize) -> Result<bool, sqlx::Error>;

    /// The text in `column` of `row`, `None` for `NULL`.
    fn text(row: &Self::Row, column: usize) -> Result<Option<&str>, sqlx::Error>;

    /// The bytes in `column` of `row`, `None` for `NULL`.
    fn bytes(row: &Self::Row, column: usize) -> Result<Option<&[u8]>, sqlx::Error>;

    /// The integer in `column` of `row`, `None` for `NULL`.
    fn int(row: &Self::Row, column: usize) -> Result<Option<i64>, sqlx::Error>;
}

impl<DB> Backend for DB
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'r> bool: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
    DB::Arguments: IntoArguments<DB>,
{
    fn execute<'a>(
        conn: &'a mut DB::Connection,
        sql: &Sql,
        params: &[Param<'_>],
        clock: Option<i64>,
    ) -> impl Future<Output = Result<DB::QueryResult, sqlx::Error>> + Send + 'a {
        conn.execute(query(sql, params, clock))
    }

    fn fetch_all<'a>(
        conn: &'a mut DB::Connection,
        sql: &Sql,
        params: &[Param<'_>],
        clock: Option<i64>,
    ) -> impl Future<Output = Result<Vec<DB::Row>, sqlx::Error>> + Send + 'a {
        conn.fetch_all(query(sql, params, clock))
    }

    fn execute_script<'a>(
        pool: &'a Pool<DB>,
        script: &Sql,
    ) -> impl Future<Output = Result<DB::QueryResult, sqlx::Error>> + Send + 'a {
        pool.execute(sqlx::raw_sql(script.sql_str()))
    }

    fn flag(row: &DB::Row, column: usize) -> Result<bool, sqlx::Error> {
        row.try_get(column)
    }

    fn text(row: &DB::Row, column: usize) -> Result<Option<&str>, sqlx::Error> {
        row.try_get(column)
    }

    fn bytes(row: &DB::Row, column: usize) -> Result<Option<&[u8]>, sqlx::Error> {
        row.try_get(column)
    }

    fn int(row: &DB::Row, column: usize) -> Result<Option<i64>, sqlx::Error> {
        row.try_get(column)
    }
}

/// `sql` with `params` bound (encoded, copied) in order, then `clock`.
fn query<DB>(
    sql: &Sql,
    params: &[Param<'_>],
    clock: Option<i64>,
) -> sqlx::query::Query<'static, DB, DB::Arguments>
where
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let query = params
        .iter()
        .fold(sqlx::query(sql.sql_str()), |query, param| match *param {
            Param::Text(text) => query.bind(text),
            Param::Bytes(bytes) => query.bind(bytes),
            Param::Int(int) => query.bind(int),
            Param::MaybeText(text) => query.bind(text),
        });
    match clock {
        Some(now) => query.bind(now),
        None => query,
    }
}

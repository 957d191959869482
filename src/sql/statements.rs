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
/// [`AssertSqlSafe`]. Ours are rendered at start-up (see [`render`]) from this crate's own
/// templates (`queries/`) and the table name, which `validate_table` restricts to an SQL
/// identifier (optionally schema-qualified) before it is written into them; every value is a
/// bound parameter. That is
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
pub struct Statements {
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
        let objects = format!("{table}_objects");
        let fragments = [
            (
                "claim_into",
                file(include_str!("queries/records/claim_into.sql")),
            ),
            (
                "claim_conflict",
                file(include_str!("queries/records/claim_conflict.sql")),
            ),
            (
                "live_claim",
                file(include_str!("queries/records/live_claim.sql")),
            ),
            (
                "object_into",
                file(include_str!("queries/records/object_into.sql")),
            ),
            ("claim", file(include_str!("queries/records/claim.sql"))),
            (
                "read_live",
                file(include_str!("queries/records/read_live.sql")),
            ),
        ];
        let mut names = vec![("table", table), ("objects", objects.as_str())];
        names.extend(fragments.iter().map(|(name, text)| (*name, text.as_str())));
        let sql = |text: &str| render::<DB>(text, &names);
        let (reserve, read_live) = match DB::RESERVE {
            Some(reserve) => (sql(reserve), None),
            None => (sql("{claim}"), Some(sql("{read_live}"))),
        };
        let schema = DB::schema(table);
        Statements {
            table: table.to_owned(),
            migrate: migrate::<DB>(table, &schema).into(),
            schema,
            reserve: reserve.into(),
            read_live: read_live.map(Sql::from),
            reserve_many: DB::RESERVE_MANY.map(|text| sql(text).into()),
            complete: sql(include_str!("queries/records/complete.sql")).into(),
            release: sql(include_str!("queries/records/release.sql")).into(),
            renew: sql(include_str!("queries/records/renew.sql")).into(),
            read_record: sql(include_str!("queries/records/read_record.sql")).into(),
            purge: sql(include_str!("queries/records/purge.sql")).into(),
            lease_object: sql(include_str!("queries/records/object_lease.sql")).into(),
            raise_watermark: sql(include_str!("queries/records/object_raise.sql")).into(),
            unlock_object: sql(include_str!("queries/records/object_unlock.sql")).into(),
            renew_object: sql(include_str!("queries/records/object_renew.sql")).into(),
            purge_objects: sql(include_str!("queries/records/object_purge.sql")).into(),
        }
    }
}

/// The script `migrate` runs for `table`, whose `CREATE` statements are `schema`: the dialect's
/// [`MIGRATE`](super::dialect::Sealed::MIGRATE) around it.
pub(super) fn migrate<DB: Dialect>(table: &str, schema: &str) -> String {
    render::<DB>(DB::MIGRATE, &[("table", table), ("schema", schema)])
}

/// The statement written by `template` (a file of `queries/`, or a text naming one) for `DB`.
///
/// A template is SQL with placeholders in braces. First every `{name}` of `names` is replaced
/// by its text, which may hold placeholders of its own (a table name, or a fragment of a
/// statement in a file of its own). Then the dialect writes the rest:
/// - `{now}`: the current time; `{now + $N ms}`: that time plus the milliseconds of
///   parameter `$N`; `{ms until COLUMN}`: the whole milliseconds from now to the time in
///   `COLUMN`. Where the dialect binds its clock (SQLite), the clock is the parameter after
///   the highest `$N` of the statement: every time in it is the same instant.
/// - `{greatest}`: the function of the greater of two values; `{find_text}`: the function of
///   where a text starts in another (from 1, 0 if nowhere: `strpos`, `instr`); `{row_locks}`:
///   what follows the `SELECT` of rows a statement deletes or takes (PostgreSQL: `FOR UPDATE
///   SKIP LOCKED`).
///
/// The template's lines that start with `--` (a file's comments) are left out, and its last
/// line break; the texts of `names` are written as they are (see [`file`]), and read as
/// templates in their turn: a `{` in them opens a placeholder, and a `$N` in them counts for
/// the clock (a table name, which `validate_table` allows neither in, is safe).
///
/// # Panics
///
/// On a placeholder it does not know or an unclosed brace: the templates are this crate's
/// own, and a unit test renders every one of them for every dialect.
pub(super) fn render<DB: Dialect>(template: &str, names: &[(&str, &str)]) -> String {
    let text = fill(template, names);
    let clock = highest_parameter(&text) + 1;
    let now = DB::now(clock);
    let mut out = String::with_capacity(text.len() + 64);
    let mut rest = text.as_str();
    while let Some((start, end)) = placeholder(rest, 0) {
        out.push_str(&rest[..start]);
        let token = &rest[start + 1..end];
        match token {
            "now" => out.push_str(&now),
            "greatest" => out.push_str(DB::GREATEST),
            "row_locks" => out.push_str(DB::PURGE_LOCKS),
            "find_text" => out.push_str(DB::FIND_TEXT),
            _ => {
                if let Some(millis) = token
                    .strip_prefix("now + ")
                    .and_then(|t| t.strip_suffix(" ms"))
                {
                    out.push_str(&DB::plus_millis(&now, millis));
                } else if let Some(column) = token.strip_prefix("ms until ") {
                    out.push_str(&DB::millis_until(column, &now));
                } else {
                    panic!("unknown placeholder {{{token}}} in an SQL template");
                }
            }
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The first step of [`render`] alone: `template` without its comments, with every `{name}` of
/// `names` replaced by its text, again and again until none is left (a fragment may name
/// another); the dialect's placeholders stay. For a fragment used with several values.
pub(super) fn fill(template: &str, names: &[(&str, &str)]) -> String {
    substitute(file(template), names)
}

/// `text` with each `{name}` of `names` replaced by its value; other placeholders are left.
pub(super) fn substitute(mut text: String, names: &[(&str, &str)]) -> String {
    let mut from = 0;
    while let Some((start, end)) = placeholder(&text, from) {
        match names
            .iter()
            .find(|(name, _)| *name == &text[start + 1..end])
        {
            Some((_, value)) => text.replace_range(start..=end, value),
            None => from = end + 1,
        }
    }
    text
}

/// The text of a schema file of `queries/`: without its header (the `--` lines it starts with,
/// and the blank line after them), the rest as it is. Unlike a statement's, a schema's own
/// comments are kept: an operator who runs [`schema`](crate::sql::SqlStore::schema) with their
/// own migrations reads them.
pub(super) fn ddl(text: &str) -> String {
    let mut rest = text;
    while rest.starts_with("--") {
        rest = rest.split_once('\n').map_or("", |(_, after)| after);
    }
    rest.strip_prefix('\n').unwrap_or(rest).to_owned()
}

/// The text of a file of `queries/` as a template or a fragment: without its lines that start
/// with `--` (its comments) and without its last line break. A line inside a string literal
/// that spans lines (`appended.sql` writes its line breaks so) must not start with `--`: it
/// would be taken for a comment.
pub(super) fn file(text: &str) -> String {
    let kept: Vec<&str> = text
        .lines()
        .filter(|line| !line.starts_with("--"))
        .collect();
    kept.join("\n")
}

/// The next `{...}` of `text` at or after `from`: the positions of its braces.
fn placeholder(text: &str, from: usize) -> Option<(usize, usize)> {
    let start = from + text[from..].find('{')?;
    let end = start
        + text[start..]
            .find('}')
            .expect("an SQL template's brace is closed");
    Some((start, end))
}

/// The highest `$N` in `text` (0 when none).
fn highest_parameter(text: &str) -> usize {
    text.split('$')
        .skip(1)
        .filter_map(|after| {
            let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            after[..digits].parse().ok()
        })
        .max()
        .unwrap_or(0)
}

#[cfg(all(test, feature = "sqlite", feature = "postgres"))]
mod tests {
    use sqlx::{Postgres, Sqlite};

    use super::*;

    #[test]
    fn the_bound_clock_follows_the_statements_parameters() {
        let template =
            "-- a comment\nUPDATE {table} SET at = {now + $2 ms}\nWHERE key = $1 AND at > {now}\n";
        let names = [("table", "t")];
        assert_eq!(
            render::<Sqlite>(template, &names),
            "UPDATE t SET at = $3 + $2\nWHERE key = $1 AND at > $3"
        );
        assert_eq!(
            render::<Postgres>(template, &names),
            "UPDATE t SET at = now() + $2::bigint * interval '1 millisecond'\nWHERE key = $1 AND at > now()"
        );
    }

    #[test]
    fn names_are_written_before_the_dialect_and_may_name_others() {
        let names = [
            ("outer", "{inner} = {now}"),
            ("inner", "{table}.x"),
            ("table", "t"),
        ];
        assert_eq!(
            render::<Sqlite>("SELECT $1 WHERE {outer}", &names),
            "SELECT $1 WHERE t.x = $2"
        );
    }

    #[test]
    #[should_panic(expected = "unknown placeholder {later}")]
    fn an_unknown_placeholder_is_a_bug() {
        render::<Sqlite>("SELECT {later}", &[]);
    }

    #[test]
    fn a_schema_keeps_its_own_comments_but_not_its_header() {
        let text = "-- the header, {table}\n-- over two lines\n\nCREATE TABLE {table} (\n    -- why this column\n    a text\n);\n";
        let schema = substitute(ddl(text), &[("table", "t")]);
        assert_eq!(
            schema,
            "CREATE TABLE t (\n    -- why this column\n    a text\n);\n"
        );
    }
}

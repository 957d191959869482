//! [`InboxAdmin`] on [`RedisInbox`]: find and list read the entry hashes (a done entry is one
//! until its retention ends), list pages through a `SCAN` of each partition's node, requeue
//! queues a dead letter again, discard makes one done, and pausing is one key per partition
//! that `take` checks.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use fred::interfaces::{KeysInterface, LuaInterface};
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand, Value};
use futures_util::future::join_all;

use super::{RedisInbox, Row, concat, corrupt, flag, from_micros, micros, one, rows};
use crate::inbox::admin::{DeadLetter, EntryInfo, Filter, InboxAdmin, Page};
use crate::inbox::store::KeyState;
use crate::redis::records::errors::store_error;
use crate::redis::records::scripts::{bytes_of, unexpected};
use crate::store::{StoreError, StoreErrorKind, StoreKey, millis};

/// `find` and `list`: KEYS = leased; ARGV[1] = prefix, [2] = `1` to read bodies and headers,
/// then keys. One row per key: nothing when the inbox does not know it, else its state, dead
/// letter's error, history, body (nil when done or not read), the entry's time to live (ms: a
/// done entry's retention left), its lease end (µs, when running), then the fields
/// `Row::entry` reads (the headers nil when not read).
const READ_LUA: &str = include_str!("lua/admin_read.lua");

/// `requeue`: KEYS = entry, due, live, dead; ARGV[1] = prefix, [2] = key, [3] = now (µs).
/// Announced as an enqueue is.
const REQUEUE_LUA: &str = include_str!("lua/requeue.lua");

/// `discard`: KEYS = entry, dead; ARGV[1] = prefix, [2] = key, [3] = retention (ms). A dead
/// letter becomes done for the retention as a completed entry does (its body, headers and
/// error dropped, its history kept), without raising its object's watermark; `fail` took it
/// out of the other sets and its object's queue already. 1, or 0 when the entry is not dead.
const DISCARD_LUA: &str = include_str!("lua/admin_discard.lua");

/// `pause` and `resume`: KEYS = paused; ARGV[1] = `1` to pause (else resume), [2] = prefix, [3]
/// = now (µs). Resuming publishes now on `<prefix>wake`, which wakes every idle worker.
const PAUSE_LUA: &str = include_str!("lua/admin_pause.lua");

static READ: LazyLock<Script> = LazyLock::new(|| Script::from_lua(READ_LUA));
static REQUEUE: LazyLock<Script> = LazyLock::new(|| Script::from_lua(REQUEUE_LUA));
static DISCARD: LazyLock<Script> = LazyLock::new(|| Script::from_lua(DISCARD_LUA));
static PAUSE: LazyLock<Script> = LazyLock::new(|| Script::from_lua(PAUSE_LUA));

/// The most `SCAN` calls one `list` makes before it answers (with fewer entries than asked
/// when the inbox's keys are sparse on the node), so that a call stays short.
const SCANS_PER_PAGE: usize = 64;

/// Where a listing stands: the partition, the `SCAN` cursor on its node, and the last key of
/// that cursor's batch listed already (a batch can hold more than a page). A batch is read in
/// key order, so the rest of it is the keys after that one, whatever left the batch since (a
/// count of keys listed would skip one for each that expired meanwhile).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ListCursor {
    partition: usize,
    scan: u64,
    after: Option<StoreKey>,
}

impl ListCursor {
    /// The cursor's text: `partition-scan-` and the last key listed, if any.
    fn encode(&self) -> String {
        let after = self.after.as_ref().map_or("", StoreKey::as_str);
        format!("{}-{}-{after}", self.partition, self.scan)
    }

    fn parse(text: &str) -> Option<ListCursor> {
        let mut parts = text.splitn(3, '-');
        let partition = parts.next()?.parse().ok()?;
        let scan = parts.next()?.parse().ok()?;
        let after = match parts.next()? {
            "" => None,
            key => Some(StoreKey::parse(key)?),
        };
        Some(ListCursor {
            partition,
            scan,
            after,
        })
    }
}

/// `text` with the characters `SCAN`'s `MATCH` treats as a pattern escaped.
fn glob_escaped(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len() + 4);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// What a `READ` row tells of `key`, or `None` when the inbox does not know it.
fn entry_info(key: StoreKey, row: Value, now: SystemTime) -> Result<Option<EntryInfo>, StoreError> {
    let mut row = Row::new(row, "find")?;
    if row.is_empty() {
        return Ok(None);
    }
    let state = row.bytes()?;
    let dead = row.optional()?;
    let history = row.optional_text()?;
    let body = row.optional()?.unwrap_or_default();
    let ttl = row.int()?;
    let lease = match row.optional()? {
        // A sorted set's score is a double in the reply: integral here, in any notation.
        Some(score) => std::str::from_utf8(&score)
            .ok()
            .and_then(|score| score.parse::<f64>().ok())
            .map(|score| from_micros(score as i64)),
        None => None,
    };
    let entry = row.entry(key, body)?;
    let text = |bytes: bytes::Bytes| String::from_utf8_lossy(&bytes).into_owned();
    let (state, until, dead) = match &state[..] {
        b"q" => (KeyState::Queued, Some(entry.next_attempt_at), None),
        b"r" => (KeyState::Running, lease, None),
        b"d" => (
            KeyState::Dead,
            None,
            Some(dead.map(text).unwrap_or_default()),
        ),
        b"k" => {
            let left = Duration::from_millis(ttl.max(0) as u64);
            (KeyState::Done, (ttl >= 0).then_some(now + left), None)
        }
        _ => return Err(corrupt("an entry in an unknown state")),
    };
    Ok(Some(EntryInfo::of(entry, state, until, &history, dead)))
}

impl<C> RedisInbox<C>
where
    C: LuaInterface + KeysInterface + Send + Sync + 'static,
{
    /// What partition `p` holds of each of `keys` (one script), their bodies and headers read
    /// when `bodies`.
    async fn read_in(
        &self,
        p: usize,
        keys: &[StoreKey],
        bodies: bool,
    ) -> Result<Vec<Option<EntryInfo>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let args = || {
            let mut args = Vec::with_capacity(2 + keys.len());
            args.push(Value::from(&*self.prefixes[p]));
            args.push(Value::from(if bodies { "1" } else { "0" }));
            args.extend(keys.iter().map(|key| Value::from(key.as_str())));
            args
        };
        let now = SystemTime::now();
        let rows = rows(
            self.run(&READ, vec![self.set(p, "leased")], args).await?,
            "find",
        )?;
        if rows.len() != keys.len() {
            return Err(corrupt("find answered another number of rows"));
        }
        (keys.iter().zip(rows))
            .map(|(key, row)| entry_info(key.clone(), row, now))
            .collect()
    }

    /// One `SCAN` of partition `p`'s entries from `cursor`, on the node that holds the
    /// partition's hash slot: the next cursor (0 once the scan went round) and the keys found.
    async fn scan_in(
        &self,
        p: usize,
        cursor: u64,
        count: usize,
    ) -> Result<(u64, Vec<StoreKey>), StoreError> {
        let prefix = &self.prefixes[p];
        let slot = fred::util::redis_keyslot(prefix.as_bytes());
        let scan = CustomCommand::new_static("SCAN", ClusterHash::Custom(slot), false);
        let pattern = concat(&[&glob_escaped(prefix), "e:*"]);
        let args = vec![
            Value::from(cursor.to_string()),
            Value::from("MATCH"),
            Value::from(pattern),
            Value::from("COUNT"),
            Value::Integer(count as i64),
        ];
        let reply: Value = self.client.custom(scan, args).await.map_err(store_error)?;
        let Value::Array(mut parts) = reply else {
            return Err(unexpected("SCAN", &reply));
        };
        let (Some(Value::Array(names)), Some(next)) = (parts.pop(), parts.pop()) else {
            return Err(corrupt("SCAN answered another shape"));
        };
        let next = bytes_of(next)
            .and_then(|next| std::str::from_utf8(&next).ok()?.parse().ok())
            .ok_or_else(|| corrupt("SCAN answered a cursor that is not a number"))?;
        let skipped = prefix.len() + 2;
        let keys = names
            .into_iter()
            .filter_map(bytes_of)
            .filter_map(|name| StoreKey::from_stored(name.get(skipped..)?))
            .collect();
        Ok((next, keys))
    }

    /// The partitions where `key` may be: its own first, then the others (an ordered entry is
    /// in its object's, which the key alone does not tell).
    fn partitions_of_key(&self, key: &StoreKey) -> impl Iterator<Item = usize> {
        let first = self.partition_of_key(key);
        std::iter::once(first).chain((0..self.prefixes.len()).filter(move |&p| p != first))
    }

    async fn requeue_in(&self, p: usize, key: &StoreKey) -> Result<bool, StoreError> {
        let keys = self.entry_keys(p, key, &["due", "live", "dead"]);
        let now = micros(SystemTime::now());
        let args = || {
            vec![
                Value::from(&*self.prefixes[p]),
                Value::from(key.as_str()),
                Value::Integer(now),
            ]
        };
        flag(self.run_written(&REQUEUE, keys, args, one).await?)
    }

    async fn discard_in(
        &self,
        p: usize,
        key: &StoreKey,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let keys = self.entry_keys(p, key, &["dead"]);
        let args = || {
            vec![
                Value::from(&*self.prefixes[p]),
                Value::from(key.as_str()),
                Value::Integer(millis(retention)),
            ]
        };
        flag(self.run_written(&DISCARD, keys, args, one).await?)
    }

    /// Pauses (or resumes) every partition, at once.
    async fn set_paused(&self, paused: bool) -> Result<(), StoreError> {
        let now = micros(SystemTime::now());
        let each = (0..self.prefixes.len()).map(|p| {
            let args = move || {
                vec![
                    Value::from(if paused { "1" } else { "" }),
                    Value::from(&*self.prefixes[p]),
                    Value::Integer(now),
                ]
            };
            self.run(&PAUSE, vec![self.set(p, "paused")], args)
        });
        for done in join_all(each).await {
            done?;
        }
        Ok(())
    }
}

/// Entries are the hashes `{inbox:N}:e:<key>`, a done one kept with the retention's `PX`, so
/// `find` reads one hash (of the key's partition first; an ordered entry is in its object's,
/// so the others are asked when it is not there). `list` pages through a `SCAN ... MATCH
/// {inbox:N}:e:*` of each partition in turn, on the node that holds the partition's hash slot
/// (on Redis Cluster too), reading each page's keys in one script and checking the filter on
/// what it read; its cursor is the partition and the scan's cursor. A page takes whole batches
/// (each `SCAN` asks for about what the page has room for), since one cursor scanned again may
/// cover other buckets once keys around it came and went; only a batch larger than a page is
/// split, by key, the next page reading on after the last key listed (an entry that joins that
/// one bucket between the two calls, sorted before that key, is then not listed). As any
/// `SCAN`, a listing sees every entry present from its start to its end at least once (Redis
/// may repeat one while it resizes its table, and a reshard that moves a slot while a listing
/// runs restarts nothing: keep listings to a stable cluster). A page holds at most `limit`
/// entries (at most 1000), fewer (even none) when the node's keys are mostly others'.
///
/// `requeue` runs one script on the key's entry (its partition is not known from the key
/// alone, so each is tried in turn), as `discard` does.
///
/// Pausing writes `{inbox:N}:paused` in every partition; `take` checks it in its script, and
/// `resume` deletes it and publishes on `{inbox:N}:wake`.
impl<C> InboxAdmin for RedisInbox<C>
where
    C: LuaInterface + KeysInterface + Send + Sync + 'static,
{
    async fn find(&self, key: &StoreKey) -> Result<Option<EntryInfo>, StoreError> {
        let mut partitions = self.partitions_of_key(key);
        let first = partitions.next().unwrap_or_default();
        let found = self.read_in(first, std::slice::from_ref(key), true).await?;
        if let Some(info) = found.into_iter().next().flatten() {
            return Ok(Some(info));
        }
        let keys = std::slice::from_ref(key);
        let others = partitions.map(|p| self.read_in(p, keys, true));
        for found in join_all(others).await {
            if let Some(info) = found?.into_iter().next().flatten() {
                return Ok(Some(info));
            }
        }
        Ok(None)
    }

    async fn list(
        &self,
        filter: &Filter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let mut at = match cursor {
            None => ListCursor::default(),
            Some(text) => ListCursor::parse(text)
                .filter(|at| at.partition < self.prefixes.len())
                .ok_or_else(|| StoreError::with_source(StoreErrorKind::Other, "not a cursor"))?,
        };
        let limit = limit.clamp(1, 1_000);
        let mut entries = Vec::with_capacity(limit);
        for _ in 0..SCANS_PER_PAGE {
            if entries.len() >= limit {
                break;
            }
            let p = at.partition;
            // A batch of about what the page has room for: a page takes whole batches, since
            // the same cursor scanned again may cover other buckets (the keys around it came
            // and went), so a place inside a batch does not hold from one call to the next.
            let room = limit - entries.len();
            let (next, mut keys) = self.scan_in(p, at.scan, room).await?;
            keys.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
            if let Some(after) = &at.after {
                keys.retain(|key| key.as_str() > after.as_str());
            }
            let infos = self.read_in(p, &keys, filter.with_bodies).await?;
            let mut matching: Vec<EntryInfo> = (infos.into_iter().flatten())
                .filter(|info| filter.matches(info))
                .collect();
            if matching.len() > room {
                if !entries.is_empty() {
                    // Not this page's: the next one starts with this batch.
                    break;
                }
                // A batch larger than a page (a bucket's keys come together): the page is its
                // first keys, and the next one reads on after the last of them, from the same
                // cursor (what the batch covers then may differ: documented).
                matching.truncate(room);
                at.after = matching.last().map(|info| info.entry.key.clone());
                entries.extend(matching);
                break;
            }
            entries.extend(matching);
            at = match (next, p + 1 < self.prefixes.len()) {
                (0, false) => return Ok(Page::new(entries, None)),
                (0, true) => ListCursor {
                    partition: p + 1,
                    ..ListCursor::default()
                },
                (scan, _) => ListCursor {
                    partition: p,
                    scan,
                    after: None,
                },
            };
        }
        Ok(Page::new(entries, Some(at.encode())))
    }

    /// The oldest first, across the partitions.
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let each = limit.min(i64::MAX as usize) as i64;
        let asked = (0..self.prefixes.len()).map(|p| self.dead_in(p, each));
        let mut dead = Vec::new();
        for letters in join_all(asked).await {
            dead.extend(letters?);
        }
        dead.sort_by_key(|letter| letter.entry.enqueued_at);
        dead.truncate(limit);
        Ok(dead)
    }

    /// The key's partition is not known from the key alone (an ordered entry is in its
    /// object's): each partition is tried in turn.
    async fn requeue(&self, key: &StoreKey) -> Result<bool, StoreError> {
        for p in 0..self.prefixes.len() {
            if self.requeue_in(p, key).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn discard(&self, key: &StoreKey, retention: Duration) -> Result<bool, StoreError> {
        for p in self.partitions_of_key(key) {
            if self.discard_in(p, key, retention).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn pause(&self) -> Result<(), StoreError> {
        self.set_paused(true).await
    }

    async fn resume(&self) -> Result<(), StoreError> {
        self.set_paused(false).await
    }

    /// Paused when any partition is (a pause or resume cut short leaves some).
    async fn is_paused(&self) -> Result<bool, StoreError> {
        let names: Vec<String> = (0..self.prefixes.len())
            .map(|p| self.set(p, "paused"))
            .collect();
        let each = names
            .iter()
            .map(|name| self.client.exists::<i64, _>(name.as_str()));
        for paused in join_all(each).await {
            if paused.map_err(store_error)? > 0 {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_and_garbage_is_refused() {
        let key = StoreKey::new("list", None, "a key whose digits may hold a -");
        let at = ListCursor {
            partition: 3,
            scan: u64::MAX,
            after: Some(key),
        };
        assert_eq!(ListCursor::parse(&at.encode()), Some(at));
        let start = ListCursor::default();
        assert_eq!(ListCursor::parse(&start.encode()), Some(start));
        assert_eq!(ListCursor::parse("3-x-"), None);
        assert_eq!(ListCursor::parse("3-1"), None);
        assert_eq!(ListCursor::parse("3-1-not a key"), None);
    }

    #[test]
    fn a_scan_pattern_escapes_the_inbox_name() {
        assert_eq!(glob_escaped("{inbox:a*b[1]?}:"), "{inbox:a\\*b\\[1\\]\\?}:");
    }
}

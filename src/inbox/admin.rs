//! [`InboxAdmin`]: the operator's side of the queue contract, beside the hot path: find an
//! entry, list by state and filter, re-queue (one or all matching), discard, pause and resume.

use std::future::Future;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::entry::InboxEntry;
use super::store::{InboxStore, KeyState};
use crate::store::{ObjectKey, StoreError, StoreKey};

/// How many attempts an entry keeps in its [`history`](EntryInfo::history): the last ones.
pub(crate) const KEPT_ATTEMPTS: usize = 10;

/// The most bytes of an attempt's error text an entry keeps (cut at a character boundary).
pub(crate) const KEPT_ERROR_BYTES: usize = 512;

/// One attempt at an entry: when it started, how long it took, how it ended, and which worker
/// process ran it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// Its number, from 1 ([`InboxEntry::attempts`] once taken; a re-queued dead letter counts
    /// from 1 again).
    pub number: u32,
    /// When the worker took the entry (the store's clock).
    pub started_at: SystemTime,
    /// How long it ran, once it ended; `None` while it runs, or when its lease ran out.
    pub duration: Option<Duration>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The process that took it: `host/pid`, the host from `HOSTNAME` or `/etc/hostname`
    /// (`localhost` when neither names one).
    pub worker: String,
}

/// How an [`Attempt`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// It runs (its lease is held, or ran out and nobody took the entry since).
    Running,
    /// The handler succeeded and the entry was completed (or it was settled as stale).
    Succeeded,
    /// The handler failed, with this error (its first 512 bytes at most, cut at a character
    /// boundary).
    Failed(String),
    /// Its lease ran out unsettled and another attempt took the entry over.
    LeaseLost,
}

/// An entry that ran out of attempts, with the last attempt's error.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// The entry as it was last taken.
    pub entry: InboxEntry,
    /// The last attempt's error.
    pub last_error: String,
}

/// An entry as an operator sees it: the entry, where it stands, and its attempts.
///
/// A done entry is kept for its retention without its body and headers (empty here). A
/// [`list`](InboxAdmin::list) reads bodies and headers only when its filter asks
/// ([`Filter::with_bodies`]); [`find`](InboxAdmin::find) always reads them.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EntryInfo {
    /// The entry (without body and headers when done, or listed without
    /// [`with_bodies`](Filter::with_bodies)).
    pub entry: InboxEntry,
    /// Queued (first time or a retry), running, dead or done.
    pub state: KeyState,
    /// Queued: when it is due; running: when its lease ends; dead: `None`; done: until when
    /// its key is kept.
    pub until: Option<SystemTime>,
    /// The last failed attempt's error (a dead letter's reason), if any.
    pub last_error: Option<String>,
    /// Its last 10 attempts, oldest first.
    pub history: Vec<Attempt>,
}

impl EntryInfo {
    /// `entry` in `state`, with no due time, error or attempts yet: what an inbox of your own
    /// builds in [`find`](InboxAdmin::find) and [`list`](InboxAdmin::list), then sets the rest
    /// of (the fields are public; the struct is `#[non_exhaustive]`, so a literal cannot be
    /// written outside this crate).
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use bytes::Bytes;
    /// use tower_idempotency::inbox::{EntryInfo, InboxEntry, KeyState};
    /// use tower_idempotency::store::StoreKey;
    /// # use tower_idempotency::inbox::Attempt;
    /// # let now = SystemTime::now();
    /// # let entry = InboxEntry {
    /// #     key: StoreKey::new("email", None, "evt_1"), id: "evt_1".into(),
    /// #     route: "email".into(), body: Bytes::new(), headers: Default::default(),
    /// #     order: None, correlation_id: "req-1".into(), attempts: 1,
    /// #     next_attempt_at: now, enqueued_at: now,
    /// # };
    /// # let attempts: Vec<Attempt> = Vec::new();
    /// // A running entry, as a store that keeps its own attempts reads it back.
    /// let mut info = EntryInfo::new(entry, KeyState::Running);
    /// info.until = Some(now + Duration::from_secs(30));
    /// info.history = attempts;
    /// info.last_error = None;
    /// assert_eq!(info.state, KeyState::Running);
    /// ```
    pub fn new(entry: InboxEntry, state: KeyState) -> Self {
        EntryInfo {
            entry,
            state,
            until: None,
            last_error: None,
            history: Vec::new(),
        }
    }

    /// What an operator sees of `entry` in `state`, from its stored `history`; a dead letter's
    /// `dead` error is its last error, else the last failed attempt's.
    pub(crate) fn of(
        entry: InboxEntry,
        state: KeyState,
        until: Option<SystemTime>,
        stored: &str,
        dead: Option<String>,
    ) -> Self {
        let history = history::decode(stored);
        let last_error = dead.or_else(|| {
            history
                .iter()
                .rev()
                .find_map(|attempt| match &attempt.outcome {
                    AttemptOutcome::Failed(error) => Some(error.clone()),
                    _ => None,
                })
        });
        EntryInfo {
            entry,
            state,
            until,
            last_error,
            history,
        }
    }
}

/// Which entries a [`list`](InboxAdmin::list) returns: all that match every condition set
/// (`Filter::default()` matches every entry; set the conditions wanted), and whether their
/// bodies are read.
///
/// ```
/// use tower_idempotency::inbox::{Filter, KeyState};
///
/// let mut poison = Filter::default();
/// poison.state = Some(KeyState::Dead);
/// poison.error_contains = Some("timeout".into());
/// # let _ = poison;
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Filter {
    /// Only entries in this state.
    pub state: Option<KeyState>,
    /// Only entries whose delivery id ([`InboxEntry::id`]) starts with this.
    pub id_prefix: Option<String>,
    /// Only entries of this route ([`InboxEntry::route`]).
    pub route: Option<String>,
    /// Only entries of this object (ordered routes).
    pub object: Option<ObjectKey>,
    /// Only the entries of this correlation id.
    pub correlation_id: Option<String>,
    /// Only entries whose last error contains this text.
    pub error_contains: Option<String>,
    /// Read each listed entry's body and kept headers too. Off by default: a page of entries
    /// (as many as its limit, each body up to the route's body limit) reads only what a list
    /// shows, and the entries' [`body`](InboxEntry::body) and [`headers`](InboxEntry::headers)
    /// are empty. Not a condition: it changes what is read, not which entries match.
    pub with_bodies: bool,
}

impl Filter {
    /// `info` as a listing with this filter returns it: without its body and headers unless
    /// [`with_bodies`](Self::with_bodies) (what a backend that read them anyway does).
    pub(crate) fn listed(&self, mut info: EntryInfo) -> EntryInfo {
        if !self.with_bodies {
            info.entry.body = bytes::Bytes::new();
            info.entry.headers = http::HeaderMap::new();
        }
        info
    }

    /// Whether `info` matches every condition set (what a backend that cannot filter in the
    /// store checks on what it read).
    pub(crate) fn matches(&self, info: &EntryInfo) -> bool {
        self.matches_entry(&info.entry, info.state)
            && (self.error_contains.as_deref()).is_none_or(|text| {
                info.last_error
                    .as_deref()
                    .is_some_and(|error| error.contains(text))
            })
    }

    /// Whether an entry in `state` matches every condition but the error text (what a backend
    /// checks before it reads an entry's attempts).
    pub(crate) fn matches_entry(&self, entry: &InboxEntry, state: KeyState) -> bool {
        self.state.is_none_or(|wanted| wanted == state)
            && (self.id_prefix.as_deref()).is_none_or(|prefix| entry.id.starts_with(prefix))
            && (self.route.as_deref()).is_none_or(|route| entry.route == route)
            && (self.object.as_ref())
                .is_none_or(|object| entry.order.as_ref().is_some_and(|o| o.object == *object))
            && (self.correlation_id.as_deref()).is_none_or(|id| entry.correlation_id == id)
    }
}

/// A page of a [`list`](InboxAdmin::list): the entries, and where the next page starts.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Page {
    /// The entries of this page (fewer than asked, even none, does not mean the last page).
    pub entries: Vec<EntryInfo>,
    /// The cursor of the next page; `None` on the last one.
    pub next: Option<String>,
}

impl Page {
    /// A page of `entries`, followed by the page at `next`, if any.
    pub(crate) fn new(entries: Vec<EntryInfo>, next: Option<String>) -> Self {
        Page { entries, next }
    }
}

/// What a bulk re-queue ([`requeue_matching`](InboxAdmin::requeue_matching)) did in one call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Requeued {
    /// How many dead letters it re-queued.
    pub requeued: u64,
    /// Where the next call goes on; `None` once every matching dead letter was seen.
    pub next: Option<String>,
}

/// The operator's side of an inbox: find, list, re-queue, discard, pause. Implemented by every
/// built-in inbox; the hot path ([`InboxStore`]) does not depend on it.
///
/// Listing reads in an order of the backend's (by store key in memory and on SQL, the scan's
/// on Redis) through an opaque cursor, so a listing goes on where it stopped however large the
/// inbox; what changes meanwhile may be seen or not. Filters other than the state may be
/// checked on what was read (a page can then hold fewer entries than asked, none even, and
/// still not be the last). A listing that is a scan of the server's keys (Redis) may list an
/// entry twice while the server resizes its table; in memory and on SQL it never does.
///
/// Pausing is stored in the backend: while paused, every worker of every process takes
/// nothing (a take returns no entry), and what runs finishes; resuming is announced, which
/// wakes idle workers.
pub trait InboxAdmin: InboxStore {
    /// The entry of `key` in any state (a done one while its key is kept), or `None`.
    fn find(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Option<EntryInfo>, StoreError>> + Send;

    /// Up to `limit` entries matching `filter`, from `cursor` (`None`: the start). Their bodies
    /// and kept headers are empty unless [`filter.with_bodies`](Filter::with_bodies) (or
    /// [`find`](Self::find) one entry).
    fn list(
        &self,
        filter: &Filter,
        cursor: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Page, StoreError>> + Send;

    /// Up to `limit` dead letters, oldest first (by [`enqueued_at`](InboxEntry::enqueued_at),
    /// not by when they died), each with its last error: read through the
    /// dead letters' own index (a sorted set, an index by state), where [`list`](Self::list)
    /// with a dead filter pages through entries in key order.
    fn dead_letters(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, StoreError>> + Send;

    /// Queues a dead letter again, due now, its attempts reset, and announces it as an enqueue
    /// (idle workers take it at once); `false` if `key` is not dead.
    fn requeue(&self, key: &StoreKey) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Re-queues the dead letters matching `filter` (whatever state it names), reading at most
    /// one page of `limit` from `cursor`: call again with [`Requeued::next`] until it is `None`.
    fn requeue_matching(
        &self,
        filter: &Filter,
        cursor: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Requeued, StoreError>> + Send {
        async move {
            let dead = Filter {
                state: Some(KeyState::Dead),
                with_bodies: false,
                ..filter.clone()
            };
            let page = self.list(&dead, cursor, limit).await?;
            let mut requeued = 0;
            for info in &page.entries {
                if self.requeue(&info.entry.key).await? {
                    requeued += 1;
                }
            }
            Ok(Requeued {
                requeued,
                next: page.next,
            })
        }
    }

    /// Drops the dead letter of `key` without applying it; its key is kept as done for
    /// `retention`, so that a later delivery of it is a duplicate. `false` if `key` is not dead.
    fn discard(
        &self,
        key: &StoreKey,
        retention: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Pauses taking, in every process, until [`resume`](Self::resume).
    fn pause(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Resumes taking and wakes the idle workers (announced, due now, as an enqueue is).
    fn resume(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether taking is paused.
    fn is_paused(&self) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// This process as the attempts it runs name it: `host/pid` (the host from `HOSTNAME` or
/// `/etc/hostname`).
pub(crate) fn worker_id() -> &'static str {
    static ID: LazyLock<String> = LazyLock::new(|| {
        let host = std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
            .map(|host| host.trim().to_owned())
            .filter(|host| !host.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        format!("{host}/{}", std::process::id())
    });
    &ID
}

/// `error` cut to [`KEPT_ERROR_BYTES`] at a character boundary.
pub(crate) fn kept_error(error: &str) -> &str {
    if error.len() <= KEPT_ERROR_BYTES {
        return error;
    }
    let mut end = KEPT_ERROR_BYTES;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    &error[..end]
}

/// The attempt history's one stored form, shared by the backends that store it as text (SQL,
/// Redis): one line an attempt, its fields separated by tabs: number, start (µs since the
/// epoch), duration (µs, empty when none), outcome (`r` running, `s` succeeded, `f` failed,
/// `l` lease lost), worker, error (failed only; tabs and line breaks made spaces).
pub(crate) mod history {
    use super::*;

    /// A new attempt, running: the line a take appends.
    pub(crate) fn started(number: u32, at: SystemTime, worker: &str) -> String {
        format!("{number}\t{}\t\tr\t{}\t", micros(at), clean(worker))
    }

    /// An ended attempt's `error` as its line keeps it (cut to [`KEPT_ERROR_BYTES`], tabs and
    /// line breaks made spaces): what a backend that writes the lines in its own statements or
    /// scripts is sent.
    #[cfg(any(feature = "postgres", feature = "sqlite", feature = "redis"))]
    pub(crate) fn error_field(error: &str) -> String {
        clean(kept_error(error))
    }

    /// A `worker`'s name as a line keeps it (tabs and line breaks made spaces).
    #[cfg(any(feature = "postgres", feature = "sqlite", feature = "redis"))]
    pub(crate) fn worker_field(worker: &str) -> String {
        clean(worker)
    }

    /// `history` with `line` appended, the attempt before it (still running: its lease ran out)
    /// marked lost, and only the last [`KEPT_ATTEMPTS`] kept.
    pub(crate) fn push(history: &str, line: &str) -> String {
        let mut lines: Vec<String> = history.lines().map(str::to_owned).collect();
        if let Some(last) = lines.last_mut() {
            if let Some(attempt) = parse(last) {
                if attempt.outcome == AttemptOutcome::Running {
                    *last = format_line(&Attempt {
                        outcome: AttemptOutcome::LeaseLost,
                        ..attempt
                    });
                }
            }
        }
        lines.push(line.to_owned());
        let skip = lines.len().saturating_sub(KEPT_ATTEMPTS);
        lines[skip..].join("\n")
    }

    /// `history` with its last attempt, if running, ended at `at` as `outcome`.
    pub(crate) fn end(history: &str, at: SystemTime, outcome: AttemptOutcome) -> String {
        let mut attempts = decode(history);
        if let Some(last) = attempts.last_mut() {
            if last.outcome == AttemptOutcome::Running {
                last.duration = Some(at.duration_since(last.started_at).unwrap_or_default());
                last.outcome = match outcome {
                    AttemptOutcome::Failed(error) => {
                        AttemptOutcome::Failed(kept_error(&error).to_owned())
                    }
                    other => other,
                };
            }
        }
        encode(&attempts)
    }

    /// The attempts of a stored history (lines that do not parse are skipped).
    pub(crate) fn decode(history: &str) -> Vec<Attempt> {
        history.lines().filter_map(parse).collect()
    }

    pub(crate) fn encode(attempts: &[Attempt]) -> String {
        let lines: Vec<String> = attempts.iter().map(format_line).collect();
        lines.join("\n")
    }

    fn format_line(attempt: &Attempt) -> String {
        let duration = attempt
            .duration
            .map(|duration| duration.as_micros().to_string())
            .unwrap_or_default();
        let (outcome, error) = match &attempt.outcome {
            AttemptOutcome::Running => ("r", ""),
            AttemptOutcome::Succeeded => ("s", ""),
            AttemptOutcome::Failed(error) => ("f", error.as_str()),
            AttemptOutcome::LeaseLost => ("l", ""),
        };
        format!(
            "{}\t{}\t{duration}\t{outcome}\t{}\t{}",
            attempt.number,
            micros(attempt.started_at),
            clean(&attempt.worker),
            clean(error)
        )
    }

    fn parse(line: &str) -> Option<Attempt> {
        let mut fields = line.splitn(6, '\t');
        let number = fields.next()?.parse().ok()?;
        let started: u64 = fields.next()?.parse().ok()?;
        let duration = match fields.next()? {
            "" => None,
            micros => Some(Duration::from_micros(micros.parse().ok()?)),
        };
        let outcome = fields.next()?;
        let worker = fields.next()?.to_owned();
        let error = fields.next().unwrap_or_default();
        let outcome = match outcome {
            "r" => AttemptOutcome::Running,
            "s" => AttemptOutcome::Succeeded,
            "f" => AttemptOutcome::Failed(error.to_owned()),
            "l" => AttemptOutcome::LeaseLost,
            _ => return None,
        };
        Some(Attempt {
            number,
            started_at: UNIX_EPOCH + Duration::from_micros(started),
            duration,
            outcome,
            worker,
        })
    }

    fn micros(at: SystemTime) -> u128 {
        at.duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros()
    }

    fn clean(text: &str) -> String {
        text.replace(['\t', '\n', '\r'], " ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_keeps_its_last_attempts_and_marks_a_lost_lease() {
        let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut stored = String::new();
        for number in 1..=12 {
            let at = start + Duration::from_secs(number.into());
            stored = history::push(&stored, &history::started(number, at, "h\t1/2"));
            if number % 2 == 0 {
                let ended = at + Duration::from_millis(5);
                let why = AttemptOutcome::Failed(format!("boom\n{}", "é".repeat(400)));
                stored = history::end(&stored, ended, why);
            }
        }
        let attempts = history::decode(&stored);
        assert_eq!(attempts.len(), KEPT_ATTEMPTS);
        assert_eq!(attempts[0].number, 3);
        assert_eq!(attempts[0].outcome, AttemptOutcome::LeaseLost);
        assert_eq!(attempts[0].duration, None);
        assert_eq!(attempts[0].worker, "h 1/2");
        let AttemptOutcome::Failed(error) = &attempts[1].outcome else {
            panic!("attempt 4 failed: {:?}", attempts[1]);
        };
        assert!(error.starts_with("boom "), "{error:?}");
        assert!(error.len() <= KEPT_ERROR_BYTES, "{}", error.len());
        assert_eq!(attempts[1].duration, Some(Duration::from_millis(5)));
        assert_eq!(attempts[9].number, 12);
    }

    #[test]
    fn an_error_is_cut_at_a_character_boundary() {
        let long = "ä".repeat(KEPT_ERROR_BYTES);
        let kept = kept_error(&long);
        assert!(kept.len() <= KEPT_ERROR_BYTES && kept.len() > KEPT_ERROR_BYTES - 2);
        assert_eq!(kept_error("short"), "short");
    }
}

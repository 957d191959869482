//! The commands of the Redis store: the Lua scripts that compare the owner token, how they are
//! sent (`EVALSHA`, `EVAL` on `NOSCRIPT`, one pipeline for a batch), and what their replies
//! mean.

use std::sync::LazyLock;

use bytes::Bytes;
use fred::clients::Client;
use fred::error::{Error as FredError, ErrorKind as FredErrorKind};
use fred::interfaces::{ClientLike, KeysInterface, LuaInterface};
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand, Expiration, MultipleKeys, SetOptions, Value};

use super::errors::store_error;
use crate::order::Position;
use crate::store::record::StoredValue;
use crate::store::{Claim, Completion, Order, Reservation, StoreError, Target};
use crate::store::{StoreErrorKind, StoreKey};
use crate::util::in_box;

/// `complete`: KEYS[1] = key, ARGV[1] = owner prefix (17 bytes), ARGV[2] = encoded record,
/// ARGV[3] = retention in milliseconds. Returns 1 when the record was written, 2 when the key
/// already holds a record of this owner (a retried completion whose first attempt landed:
/// the record's bytes 2 to 4, its owner tag, are the owner prefix's bytes 2 to 4, the
/// token's first `OWNER_LEN` bytes, read from ARGV[1] rather than sent apart), 0 otherwise.
pub(super) const COMPLETE_LUA: &str = include_str!("lua/complete.lua");

// The scripts compare an owner tag as the owner prefix's bytes 2 to 4.
const _: () = assert!(crate::store::record::OWNER_LEN == 3);

/// `renew`: KEYS[1] = key, ARGV[1] = owner prefix (17 bytes), ARGV[2] = lease in
/// milliseconds. Returns 1 when the claim's lease was extended, 0 otherwise.
pub(super) const RENEW_LUA: &str = include_str!("lua/renew.lua");

/// `release`: KEYS[1] = key, ARGV[1] = owner prefix (17 bytes). Returns 1 when the claim was
/// deleted, 0 otherwise.
pub(super) const RELEASE_LUA: &str = include_str!("lua/release.lua");

/// Byte-wise `a < b` of two positions (16 bytes each). Lua's own `<` on strings goes through
/// the C library's `strcoll`, which depends on the server's locale: never used here.
pub(crate) const LESS_LUA: &str = include_str!("lua/less.lua");

/// `reserve_ordered`, one event: KEYS[1] = the event's key, KEYS[2] = its object's lease,
/// KEYS[3] = its object's watermark (one hash slot: see `ordered_keys`); ARGV[1] = the
/// in-flight value (its bytes 2 to 17 are the owner token), ARGV[2] = the lease in
/// milliseconds, ARGV[3] = the position (16 bytes), ARGV[4] = `1` when an equal position is
/// stale. Returns `{1, value}` when another claim or a record holds the key, `{2}` when another
/// claim holds the object, else takes the key and the object's lease and returns `{3,
/// watermark}` when the event is stale, `{0}` otherwise.
static RESERVE_ORDERED_LUA: LazyLock<String> =
    LazyLock::new(|| LESS_LUA.to_owned() + include_str!("lua/reserve_ordered.lua"));

/// `complete_ordered`, one event: KEYS as for `reserve_ordered`; ARGV[1..3] as for
/// `complete`, ARGV[4] = the position. Writes the record and raises the watermark (same
/// retention) when the key holds this claim; lets go of the object's lease when this claim
/// holds it, whatever the key holds. Returns as `complete` does.
static COMPLETE_ORDERED_LUA: LazyLock<String> =
    LazyLock::new(|| LESS_LUA.to_owned() + include_str!("lua/complete_ordered.lua"));

/// `release_ordered`, one event: KEYS as for `reserve_ordered`, ARGV[1] = owner prefix.
/// Deletes the key and the object's lease, each when this claim holds it; returns 1 when the
/// key was deleted.
pub(super) const RELEASE_ORDERED_LUA: &str = include_str!("lua/release_ordered.lua");

/// `renew_ordered`, one event: KEYS as for `reserve_ordered`, ARGV[1] = owner prefix, ARGV[2]
/// = lease in milliseconds. Extends the key and the object's lease, each when this claim holds
/// it; returns 1 when the key was extended.
pub(super) const RENEW_ORDERED_LUA: &str = include_str!("lua/renew_ordered.lua");

pub(super) static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::from_lua(COMPLETE_LUA));
pub(super) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::from_lua(RELEASE_LUA));
pub(super) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::from_lua(RENEW_LUA));
pub(super) static RESERVE_ORDERED: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(RESERVE_ORDERED_LUA.as_str()));
pub(super) static COMPLETE_ORDERED: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(COMPLETE_ORDERED_LUA.as_str()));
pub(super) static RELEASE_ORDERED: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(RELEASE_ORDERED_LUA));
pub(super) static RENEW_ORDERED: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(RENEW_ORDERED_LUA));

/// Every script of the store, for `load_scripts`.
pub(super) fn all() -> [&'static Script; 7] {
    [
        &COMPLETE,
        &RELEASE,
        &RENEW,
        &RESERVE_ORDERED,
        &COMPLETE_ORDERED,
        &RELEASE_ORDERED,
        &RENEW_ORDERED,
    ]
}

/// The keys one script call touches, all in one hash slot.
pub(crate) enum Keys<'a> {
    /// One event's key (`ti:` and 16 digits).
    One(&'a StoreKey),
    /// An ordered event: its key, its object's lease and its object's watermark, each carrying
    /// the object's digits as its hash tag (`ti:{O}E`, `tl:{O}`, `tw:{O}`), so that one script
    /// settles all three, on one node of a cluster.
    Ordered([String; 3]),
    /// Keys named by their caller, all under one hash tag (the inbox's keys).
    Tagged(Vec<String>),
}

impl<'a> Keys<'a> {
    /// The three keys of an ordered event: its `key` under its `order`'s object.
    pub(super) fn event(key: &StoreKey, order: &Order) -> Keys<'a> {
        let object = order.object.digits();
        Keys::Ordered([
            format!("ti:{{{object}}}{}", key.digits()),
            format!("tl:{{{object}}}"),
            format!("tw:{{{object}}}"),
        ])
    }

    /// The keys of `target` when it is an ordered event.
    pub(super) fn of_event(target: &Target) -> Option<Keys<'a>> {
        Some(Keys::event(&target.key, target.order.as_ref()?))
    }

    /// The Redis name of the first key.
    pub(super) fn first(&self) -> &str {
        match self {
            Keys::One(key) => key.as_str(),
            Keys::Ordered(names) => &names[0],
            Keys::Tagged(names) => names.first().map_or("", String::as_str),
        }
    }

    /// The hash slot of every key.
    pub(super) fn slot(&self) -> u16 {
        fred::util::redis_keyslot(self.first().as_bytes())
    }

    fn count(&self) -> i64 {
        match self {
            Keys::One(_) => 1,
            Keys::Ordered(_) => 3,
            Keys::Tagged(names) => names.len() as i64,
        }
    }

    pub(crate) fn multiple(&self) -> MultipleKeys {
        match self {
            // Bytes: no UTF-8 check of a key that is ASCII by construction.
            Keys::One(key) => key.as_bytes().as_slice().into(),
            Keys::Ordered(names) => names.to_vec().into(),
            Keys::Tagged(names) => names.clone().into(),
        }
    }

    fn push_into(&self, out: &mut Vec<Value>) {
        match self {
            Keys::One(key) => out.push(Value::from(key.as_str())),
            Keys::Ordered(names) => out.extend(names.iter().map(|n| Value::from(n.as_str()))),
            Keys::Tagged(names) => out.extend(names.iter().map(|n| Value::from(n.as_str()))),
        }
    }
}

/// `SET key value NX PX lease GET`: nil when the key was absent (and is now ours), else the
/// value already there.
///
/// fred's command futures are large (kilobytes): each is boxed where it is made (see
/// [`in_box`]), so that the futures around it stay small and are never copied whole.
pub(super) async fn set_nx_get<X: KeysInterface>(
    client: &X,
    key: Bytes,
    value: Bytes,
    lease_ms: i64,
) -> Result<Value, FredError> {
    in_box(|| {
        client.set(
            key,
            value,
            Some(Expiration::PX(lease_ms)),
            Some(SetOptions::NX),
            true,
        )
    })
    .await
}

/// `EVALSHA`, and on `NOSCRIPT` the same call as `EVAL`, which also puts the script back in the
/// cache of the server that owns the keys. `call` makes the keys and the arguments: once, and
/// again only for the `EVAL` (a copy kept for a rare retry would cost an allocation per
/// argument).
pub(crate) async fn evalsha_with_reload<X: LuaInterface>(
    client: &X,
    script: &Script,
    call: impl Fn() -> (MultipleKeys, Vec<Value>),
) -> Result<Value, FredError> {
    // Boxed where made, like the `SET` of `set_nx_get`.
    let sha = script.sha1().clone();
    let result = in_box(|| {
        let (keys, args) = call();
        client.evalsha(sha, keys, Value::Array(args))
    })
    .await;
    match result {
        Err(error) if is_noscript(&error) => {
            let lua = script.lua().cloned().unwrap_or_default();
            in_box(|| {
                let (keys, args) = call();
                client.eval(lua, keys, Value::Array(args))
            })
            .await
        }
        result => result,
    }
}

/// `script` on every target (each with its own arguments), in one pipeline on `client`: one
/// reply per target, in order. The targets whose reply is `NOSCRIPT` are sent again with
/// `EVAL`, in a second pipeline (which also puts the script back in the cache of each server
/// that lacked it). A pipeline that fails as a whole fails the call.
pub(super) async fn scripts_pipelined(
    client: &Client,
    script: &Script,
    targets: &[(Keys<'_>, Vec<Value>)],
) -> Result<Vec<Value>, StoreError> {
    let mut replies = script_pipeline(client, script, true, targets.iter())
        .await
        .map_err(store_error)?;
    let missing: Vec<usize> = (0..replies.len())
        .filter(|&i| matches!(&replies[i], Err(e) if is_noscript(e)))
        .collect();
    if !missing.is_empty() {
        let again = missing.iter().map(|&i| &targets[i]);
        let retried = script_pipeline(client, script, false, again)
            .await
            .map_err(store_error)?;
        for (i, reply) in missing.into_iter().zip(retried) {
            replies[i] = reply;
        }
    }
    replies
        .into_iter()
        .map(|reply| reply.map_err(store_error))
        .collect()
}

/// `EVALSHA` (or `EVAL`) of `script` on each target, in one pipeline on `client`: one reply per
/// target, or the error that failed the pipeline as a whole.
async fn script_pipeline<'t, 'k: 't>(
    client: &Client,
    script: &Script,
    by_hash: bool,
    targets: impl ExactSizeIterator<Item = &'t (Keys<'k>, Vec<Value>)>,
) -> Result<Vec<Result<Value, FredError>>, FredError> {
    let expected = targets.len();
    let pipeline = client.pipeline();
    for (keys, args) in targets {
        let (cmd, script_args) = script_command(script, by_hash, keys, args);
        // Queued in memory: the reply is `QUEUED`, the answer comes with the pipeline's.
        let () = pipeline.custom(cmd, script_args).await?;
    }
    pipeline_replies(pipeline.try_all::<Value>().await, expected)
}

/// The replies of a pipeline of `expected` commands
/// ([`Pipeline::try_all`](fred::clients::Pipeline::try_all)), one per command, or the error
/// that failed the pipeline as a whole (fred then answers with that one error).
pub(super) fn pipeline_replies(
    replies: Vec<Result<Value, FredError>>,
    expected: usize,
) -> Result<Vec<Result<Value, FredError>>, FredError> {
    if replies.len() == expected {
        return Ok(replies);
    }
    Err(replies
        .into_iter()
        .find_map(Result::err)
        .unwrap_or_else(|| FredError::new(FredErrorKind::Protocol, "missing pipeline replies")))
}

/// Whether a script call failed because the server's script cache lacks the script.
pub(super) fn is_noscript(error: &FredError) -> bool {
    error.details().starts_with("NOSCRIPT")
}

/// `EVALSHA sha n keys.. args..` (or `EVAL lua n keys.. args..`) as a custom command routed by
/// the keys' slot: fred's pipelines have no Lua interface.
pub(super) fn script_command(
    script: &Script,
    by_hash: bool,
    keys: &Keys<'_>,
    args: &[Value],
) -> (CustomCommand, Vec<Value>) {
    let (name, body) = if by_hash {
        ("EVALSHA", script.sha1().clone())
    } else {
        ("EVAL", script.lua().cloned().unwrap_or_default())
    };
    let mut script_args = Vec::with_capacity(5 + args.len());
    script_args.push(Value::from(body));
    script_args.push(Value::Integer(keys.count()));
    keys.push_into(&mut script_args);
    script_args.extend_from_slice(args);
    let cmd = CustomCommand::new_static(name, ClusterHash::Custom(keys.slot()), false);
    (cmd, script_args)
}

/// The integer reply of the `complete`, `release` and `renew` scripts (ordered or not).
pub(super) fn script_reply(reply: Value) -> Result<i64, StoreError> {
    match reply {
        Value::Integer(n @ 0..=2) => Ok(n),
        other => Err(unexpected("script", &other)),
    }
}

/// The error for a reply of an unexpected shape.
pub(crate) fn unexpected(what: &str, reply: &Value) -> StoreError {
    StoreError::with_source(
        StoreErrorKind::Corrupt,
        format!("unexpected {what} reply of type {:?}", reply.kind()),
    )
}

/// The [`Completion`] of a `complete` script's reply.
pub(super) fn completion(reply: i64) -> Completion {
    match reply {
        1 => Completion::Written,
        2 => Completion::AlreadyWritten,
        _ => Completion::Lost,
    }
}

/// The bytes of a bulk-string reply.
pub(crate) fn bytes_of(reply: Value) -> Option<Bytes> {
    match reply {
        Value::Bytes(bytes) => Some(bytes),
        Value::String(s) => Some(s.into_inner()),
        _ => None,
    }
}

/// The [`Reservation`] that a value already held under a key means for `claim` (nil: the key
/// was absent and is now ours).
pub(super) fn reservation(held: Value, claim: &Claim) -> Result<Reservation, StoreError> {
    if held.is_null() {
        return Ok(Reservation::Acquired);
    }
    let old = bytes_of(held).ok_or_else(|| {
        StoreError::with_source(
            StoreErrorKind::Corrupt,
            "unexpected SET reply: not a bulk string",
        )
    })?;
    Ok(match StoredValue::decode(&old)? {
        // Our own claim: the client retried a SET whose reply was lost with the connection.
        StoredValue::InFlight { token, .. } if token == *claim.token() => Reservation::Acquired,
        StoredValue::InFlight { fingerprint, .. } => Reservation::InFlight { fingerprint },
        StoredValue::Completed(record) => Reservation::Completed(record),
    })
}

/// The [`Reservation`] of a `reserve_ordered` script's reply.
pub(super) fn ordered_reservation(reply: Value, claim: &Claim) -> Result<Reservation, StoreError> {
    let Value::Array(mut parts) = reply else {
        return Err(unexpected("reserve_ordered", &reply));
    };
    let code = match parts.first() {
        Some(Value::Integer(code)) => *code,
        _ => return Err(unexpected("reserve_ordered", &Value::Array(parts))),
    };
    let value = (parts.len() > 1).then(|| parts.swap_remove(1));
    match (code, value) {
        (0, _) => Ok(Reservation::Acquired),
        (1, Some(held)) => reservation(held, claim),
        (2, _) => Ok(Reservation::ObjectBusy),
        (3, Some(watermark)) => {
            let bytes = bytes_of(watermark).unwrap_or_default();
            let bytes: [u8; Position::LEN] = bytes[..].try_into().map_err(|_| {
                StoreError::with_source(StoreErrorKind::Corrupt, "a watermark of the wrong length")
            })?;
            Ok(Reservation::Stale {
                watermark: Position::from_bytes(bytes),
            })
        }
        _ => Err(StoreError::with_source(
            StoreErrorKind::Corrupt,
            format!("unexpected reserve_ordered reply code {code}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::store::ObjectKey;

    #[test]
    fn batch_scripts_are_routed_by_their_keys() {
        let key = StoreKey::new("unit", None, "item");
        let args = [Value::Integer(7)];
        let (cmd, sent) = script_command(&RENEW, true, &Keys::One(&key), &args);
        let slot = fred::util::redis_keyslot(key.as_str().as_bytes());
        assert_eq!(&*cmd.cmd, "EVALSHA");
        assert_eq!(cmd.cluster_hash, ClusterHash::Custom(slot));
        assert!(!cmd.blocking);
        assert_eq!(
            sent,
            [
                Value::from(RENEW.sha1().clone()),
                Value::Integer(1),
                Value::from(key.as_str()),
                Value::Integer(7),
            ]
        );
        let (cmd, sent) = script_command(&RENEW, false, &Keys::One(&key), &args);
        assert_eq!(&*cmd.cmd, "EVAL");
        assert_eq!(sent[0], Value::from(RENEW_LUA));
    }

    #[test]
    fn an_ordered_events_keys_share_its_objects_slot() {
        let event = Target::ordered(
            StoreKey::new("unit", None, "evt"),
            ObjectKey::new("unit", None, "msg"),
            Position::new(1),
        );
        let keys = Keys::of_event(&event).unwrap();
        let Keys::Ordered(names) = &keys else {
            unreachable!()
        };
        let slots: Vec<u16> = names
            .iter()
            .map(|n| fred::util::redis_keyslot(n.as_bytes()))
            .collect();
        assert_eq!(slots, [keys.slot(); 3]);
        assert!(names[0].ends_with(event.key.digits()));
        assert!(names[0].contains(event.order.as_ref().unwrap().object.digits()));
        let (_, sent) = script_command(&RESERVE_ORDERED, true, &keys, &[]);
        assert_eq!(sent[1], Value::Integer(3));
    }

    #[test]
    fn a_pipeline_that_failed_as_a_whole_is_one_error() {
        let ok = || Ok(Value::Integer(1));
        let replies = pipeline_replies(vec![ok(), ok()], 2).unwrap();
        assert_eq!(replies.len(), 2);
        // Per-command errors stay with their command.
        let noscript = FredError::new(FredErrorKind::Unknown, "NOSCRIPT No matching script.");
        let replies = pipeline_replies(vec![ok(), Err(noscript)], 2).unwrap();
        assert!(matches!(&replies[1], Err(e) if is_noscript(e)));
        // fred answers a failed pipeline with its one error.
        let closed = FredError::new(FredErrorKind::Canceled, "Connection closed");
        let error = pipeline_replies(vec![Err(closed)], 3).unwrap_err();
        assert_eq!(*error.kind(), FredErrorKind::Canceled);
        let error = pipeline_replies(vec![ok()], 3).unwrap_err();
        assert_eq!(*error.kind(), FredErrorKind::Protocol);
    }

    #[test]
    fn scripts_hash_like_the_server() {
        // The SHA-1 Redis computes for the script text is what EVALSHA sends.
        assert_eq!(COMPLETE.sha1().len(), 40);
        let shas: std::collections::HashSet<_> = all().iter().map(|s| s.sha1().clone()).collect();
        assert_eq!(shas.len(), all().len(), "no two scripts alike");
    }

    #[test]
    fn ordered_replies_decode() {
        let claim = Claim::new(Fingerprint::NONE);
        let reply = |parts: Vec<Value>| ordered_reservation(Value::Array(parts), &claim);
        assert_eq!(
            reply(vec![Value::Integer(0)]).unwrap(),
            Reservation::Acquired
        );
        assert_eq!(
            reply(vec![Value::Integer(2)]).unwrap(),
            Reservation::ObjectBusy
        );
        let mark = Position::new(-5);
        let stale = reply(vec![
            Value::Integer(3),
            Value::Bytes(Bytes::copy_from_slice(&mark.to_bytes())),
        ]);
        assert_eq!(stale.unwrap(), Reservation::Stale { watermark: mark });
        let record = crate::store::record::Record::ack(Fingerprint::NONE);
        let held = reply(vec![Value::Integer(1), Value::Bytes(record.encode())]);
        assert_eq!(held.unwrap(), Reservation::Completed(record));
        assert!(reply(vec![Value::Integer(3), Value::from("short")]).is_err());
        assert!(reply(vec![Value::Integer(9)]).is_err());
        assert!(ordered_reservation(Value::Integer(0), &claim).is_err());
    }
}

//! Durable completion: the `complete` script and a `WAIT` pipelined on one connection, so
//! that a record is acknowledged by replicas before the response (see the [store
//! docs](super#durable-completion)).

use fred::clients::Client;
use fred::error::{Error as FredError, ErrorKind as FredErrorKind};
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::config::{Options, Server};
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand, Value};

use super::errors::store_error;
use super::scripts::{Keys, completion, is_noscript, script_command, script_reply, unexpected};
use super::{Durability, NotReplicated};
use crate::store::{Completion, StoreError, StoreErrorKind, millis};

/// `complete` with [`Durability`]: the script and a `WAIT` pipelined on one connection of
/// `client` (the script sent again as `EVAL` on `NOSCRIPT`), then the `WAIT` repeated on the
/// new owner if the key's slot moved meanwhile.
///
/// fred answers a pipeline as a whole: when its connection closes with the `WAIT` in flight
/// (which is never re-sent alone, see [`wait_options`]) the pipeline fails, while fred may
/// still re-send the script on the next connection without telling anyone. The pair is then
/// sent once more; if the script then finds the claim gone, it may be our own re-sent script
/// that completed it, so the outcome is unknown and reported as an error.
pub(super) async fn complete_durably<C>(
    client: &Client,
    durability: Durability<C>,
    script: &Script,
    keys: &Keys<'_>,
    args: Vec<Value>,
) -> Result<Completion, StoreError> {
    let slot = keys.slot();
    let owner = slot_owner(client, slot);
    let mut aborted: Option<FredError> = None;
    for _ in 0..2 {
        let mut pair = script_then_wait(client, script, true, keys, &args, durability).await;
        if matches!(&pair, Ok((Err(e), _)) if is_noscript(e)) {
            pair = script_then_wait(client, script, false, keys, &args, durability).await;
        }
        let (written, acknowledged) = match pair {
            Ok(replies) => replies,
            Err(error) => {
                let timed_out = *error.kind() == FredErrorKind::Timeout;
                aborted = Some(error);
                if timed_out {
                    break;
                }
                continue;
            }
        };
        // An interrupted first attempt that did land shows as 2 (our own record): the WAIT
        // behind the retry still counts it, since it covers every write of the connection
        // and the replicas receive writes in order.
        let outcome = completion(script_reply(written.map_err(store_error)?)?);
        if outcome == Completion::Lost {
            return Ok(Completion::Lost);
        }
        replicated(client, slot, owner, acknowledged, durability).await?;
        return Ok(outcome);
    }
    let error = aborted.unwrap_or_else(FredError::new_canceled);
    Err(store_error(error))
}

/// `script` on `keys` with a `WAIT` behind it on one connection of `client` (sent again as
/// `EVAL` on `NOSCRIPT`): the script's reply once `durability.replicas` replicas acknowledged
/// every write of that connection, a [`NotReplicated`] error when fewer did in time. A reply
/// that `wrote` says wrote nothing is returned whatever the `WAIT` counted (it counts the
/// connection's earlier writes, not this script's).
///
/// Sent once: a pipeline that fails is an error, and the caller's retry finds what the script
/// may have written (the inbox's scripts tell a repeat by the key's state or the lease's token).
pub(crate) async fn script_replicated<C>(
    client: &Client,
    durability: Durability<C>,
    script: &Script,
    keys: &Keys<'_>,
    args: &[Value],
    wrote: fn(&Value) -> bool,
) -> Result<Value, StoreError> {
    let slot = keys.slot();
    let owner = slot_owner(client, slot);
    let mut pair = script_then_wait(client, script, true, keys, args, durability).await;
    if matches!(&pair, Ok((Err(e), _)) if is_noscript(e)) {
        pair = script_then_wait(client, script, false, keys, args, durability).await;
    }
    let (written, acknowledged) = pair.map_err(store_error)?;
    let written = written.map_err(store_error)?;
    if wrote(&written) {
        replicated(client, slot, owner, acknowledged, durability).await?;
    }
    Ok(written)
}

/// Checks `WAIT`'s reply: enough replicas acknowledged, or a [`NotReplicated`] error. When the
/// slot's owner changed since `owner` (the write was redirected after the `WAIT` had left for
/// the former owner), the `WAIT` is sent again to the new one.
async fn replicated<C>(
    client: &Client,
    slot: u16,
    owner: Option<Server>,
    mut acknowledged: Result<Value, FredError>,
    durability: Durability<C>,
) -> Result<(), StoreError> {
    if slot_owner(client, slot) != owner {
        acknowledged = wait_for_replicas(client, slot, durability).await;
    }
    let acknowledged = match acknowledged.map_err(store_error)? {
        Value::Integer(n) => u32::try_from(n).unwrap_or(0),
        other => return Err(unexpected("WAIT", &other)),
    };
    if acknowledged < durability.replicas {
        return Err(StoreError::with_source(
            StoreErrorKind::NotReplicated,
            NotReplicated {
                acknowledged,
                required: durability.replicas,
                timeout: durability.timeout,
            },
        ));
    }
    Ok(())
}

/// The replies of a script and the `WAIT` behind it, or the error that failed the pipeline.
type ScriptAndWait = Result<(Result<Value, FredError>, Result<Value, FredError>), FredError>;

/// `EVALSHA` (or `EVAL`) of `script` on `keys`, then `WAIT`, in one pipeline: one round trip,
/// both on the connection `client` has to the node owning their slot.
async fn script_then_wait<C>(
    client: &Client,
    script: &Script,
    by_hash: bool,
    keys: &Keys<'_>,
    args: &[Value],
    durability: Durability<C>,
) -> ScriptAndWait {
    // fred's pipelines have no Lua interface: the script goes as a custom command, routed by
    // the keys' slot like the WAIT behind it.
    let (cmd, script_args) = script_command(script, by_hash, keys, args);
    let pipeline = client.pipeline();
    let () = pipeline.custom(cmd, script_args).await?;
    let (cmd, wait_args) = wait_command(keys.slot(), durability);
    let () = pipeline
        .with_options(&wait_options())
        .custom(cmd, wait_args)
        .await?;
    let mut replies = pipeline.try_all::<Value>().await.into_iter();
    match (replies.next(), replies.next()) {
        (Some(written), Some(acknowledged)) => Ok((written, acknowledged)),
        (Some(Err(error)), None) => Err(error),
        _ => Err(FredError::new(
            FredErrorKind::Protocol,
            "missing pipeline replies",
        )),
    }
}

/// A lone `WAIT` to the current owner of `slot`.
async fn wait_for_replicas<C>(
    client: &Client,
    slot: u16,
    durability: Durability<C>,
) -> Result<Value, FredError> {
    let (cmd, args) = wait_command(slot, durability);
    client.with_options(&wait_options()).custom(cmd, args).await
}

/// `WAIT replicas timeout`, routed like the key (a cluster client would otherwise hash its
/// first argument). Not flagged blocking for fred: its wait is bounded by `timeout`, and fred's
/// `Blocking::Interrupt` / `Blocking::Error` policies must not cut it short or fail the other
/// commands sharing the connection.
pub(super) fn wait_command<C>(slot: u16, durability: Durability<C>) -> (CustomCommand, Vec<Value>) {
    let cmd = CustomCommand::new_static("WAIT", ClusterHash::Custom(slot), false);
    let args = vec![
        Value::Integer(i64::from(durability.replicas)),
        Value::Integer(millis(durability.timeout)),
    ];
    (cmd, args)
}

/// A `WAIT` must never be re-sent alone on a new connection, where it would count the
/// acknowledgements of nothing (a new connection has written nothing): one write attempt only,
/// so that it fails when its connection closes.
pub(super) fn wait_options() -> Options {
    Options {
        max_attempts: Some(1),
        ..Options::default()
    }
}

/// The primary `client` currently routes `slot` to (`None` unless clustered).
fn slot_owner(client: &Client, slot: u16) -> Option<Server> {
    if !client.is_clustered() {
        return None;
    }
    client
        .cached_cluster_state()
        .and_then(|state| state.get_server(slot).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::records::PickClient;

    #[test]
    fn wait_is_routed_like_the_key_and_never_waits_forever() {
        let durability = Durability::<Client> {
            replicas: 1,
            timeout: std::time::Duration::ZERO,
            pick: Client::pick_client,
        };
        let (cmd, args) = wait_command(4242, durability);
        assert_eq!(&*cmd.cmd, "WAIT");
        assert_eq!(cmd.cluster_hash, ClusterHash::Custom(4242));
        assert!(!cmd.blocking);
        // `WAIT 1 0` would block until a replica answers: the timeout is at least 1 ms.
        assert_eq!(args, [Value::Integer(1), Value::Integer(1)]);
        assert_eq!(wait_options().max_attempts, Some(1));
    }
}

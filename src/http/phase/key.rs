//! Phase 3: the idempotency key of a request, its payload fingerprint and, on routes that order
//! events, each event's object and position, as the store will see them.

use bytes::Bytes;
use http::request::Parts;
use sha2::{Digest, Sha256};

use crate::claim::guard::{OneOrMany, Targets};
use crate::fingerprint::Fingerprint;
use crate::http::config::Settings;
use crate::http::rejection::Rejection;
use crate::key::{ExtractKey, IdempotencyKey, KeyInput};
use crate::order::{Placed, Position};
use crate::store::{ObjectKey, StoreKey, Target};

/// What a request is, for its claim.
pub(crate) struct Derived {
    /// The key, handed to the inner service.
    pub(crate) key: IdempotencyKey,
    /// What the claim is on.
    pub(crate) targets: Targets,
    pub(crate) fingerprint: Fingerprint,
    /// A batch's item ids, in the targets' order.
    pub(crate) items: Option<Vec<String>>,
    /// Ordered events' positions, in the targets' order.
    pub(crate) positions: Vec<Position>,
    /// The targets are the key, then the signed content: the key does not come from what the
    /// signature covers, so a replay of the signed bytes under another key is a duplicate.
    pub(crate) signed: bool,
}

/// The key of a request (`None`: it carries none), or the rejection of a malformed one.
pub(crate) fn derive<K: ExtractKey>(
    extractor: &K,
    settings: &Settings,
    parts: &Parts,
    data: Option<&Bytes>,
) -> Result<Option<Derived>, Rejection> {
    let input = KeyInput::new(parts, data);
    let order = settings.order.as_deref();
    if let Some(placed) = order.and_then(|order| order.items_of(&input)) {
        let placed = placed.map_err(Rejection::MalformedOrder)?;
        if !placed.is_empty() {
            return ordered_items(settings, parts, placed).map(Some);
        }
        // No items: the key extractor's key, unordered (a callback of another kind).
        return plain(extractor, settings, parts, &input, data, false);
    }
    plain(extractor, settings, parts, &input, data, order.is_some())
}

/// The key from the layer's extractor: one key, the items of a batch, or one ordered event.
fn plain<K: ExtractKey>(
    extractor: &K,
    settings: &Settings,
    parts: &Parts,
    input: &KeyInput<'_>,
    data: Option<&Bytes>,
    ordered: bool,
) -> Result<Option<Derived>, Rejection> {
    let Some(key) = extractor
        .extract_key(input)
        .map_err(Rejection::MalformedKey)?
    else {
        return Ok(None);
    };
    // Items of a batch are keyed one by one: an item may come again in another batch, so a
    // payload fingerprint means nothing for them.
    let fingerprint = match data {
        Some(data) if settings.intake.fingerprint && !key.is_items() => Fingerprint::of_bytes(data),
        _ => Fingerprint::NONE,
    };
    let (namespace, scope) = (
        settings.claim.policy.observer.namespace(),
        settings.intake.scope.of(parts),
    );
    let store_key = |text: &str| StoreKey::new(namespace, scope.as_deref(), text);
    let (targets, items, positions) = match settings.order.as_deref().filter(|_| ordered) {
        Some(order) => {
            let placed = order
                .place(input, &key)
                .map_err(Rejection::MalformedOrder)?;
            let positions = placed.iter().map(|p| p.position).collect();
            (events(settings, parts, placed), None, positions)
        }
        // One store key per item of a batch; otherwise one for the whole key (a composite key
        // is one key: its sorted, joined values).
        None if key.is_items() => {
            let keys = key
                .parts()
                .map(|part| Target::key(store_key(part)))
                .collect();
            let items = key.parts().map(str::to_owned).collect();
            (OneOrMany::Many(keys), Some(items), Vec::new())
        }
        None => (
            OneOrMany::One(Target::key(store_key(key.as_str()))),
            None,
            Vec::new(),
        ),
    };
    name_the_key(&targets);
    let (targets, signed) = match (&targets, signed_content(extractor, settings, parts, data)) {
        (OneOrMany::One(one), Some(content)) => (
            OneOrMany::Many(vec![one.clone(), Target::key(store_key(&content))]),
            true,
        ),
        _ => (targets, false),
    };
    Ok(Some(Derived {
        key,
        targets,
        fingerprint,
        items,
        positions,
        signed,
    }))
}

/// The ordered items of a batch: each its own key, object and position, in the order of their
/// keys (the order of the key's parts).
fn ordered_items(
    settings: &Settings,
    parts: &Parts,
    mut placed: Vec<Placed>,
) -> Result<Derived, Rejection> {
    placed.sort_by(|a, b| a.key.cmp(&b.key));
    let key = IdempotencyKey::items(placed.iter().map(|p| p.key.clone()))
        .map_err(Rejection::MalformedOrder)?
        .ok_or(Rejection::MissingKey { expected: None })?;
    let items = placed.iter().map(|p| p.key.clone()).collect();
    let positions = placed.iter().map(|p| p.position).collect();
    let targets = events(settings, parts, placed);
    name_the_key(&targets);
    Ok(Derived {
        key,
        targets,
        fingerprint: Fingerprint::NONE,
        items: Some(items),
        positions,
        signed: false,
    })
}

/// The store's view of placed events: each its key with its order, the route's rule for equal
/// positions included.
fn events(settings: &Settings, parts: &Parts, placed: Vec<Placed>) -> Targets {
    let (namespace, scope) = (
        settings.claim.policy.observer.namespace(),
        settings.intake.scope.of(parts),
    );
    let scope = scope.as_deref();
    let equal = settings
        .order
        .as_ref()
        .map(|o| o.equal())
        .unwrap_or_default();
    OneOrMany::Many(
        placed
            .into_iter()
            .map(|p| {
                let key = StoreKey::new(namespace, scope, &p.key);
                let object = ObjectKey::new(namespace, scope, &p.object);
                Target::ordered(key, object, p.position).equal_positions(equal)
            })
            .collect(),
    )
}

/// On a verified route whose extractor's keys the signature does not cover (a header it does
/// not sign, a fallback to one, a closure), the key text of the request's signed content: a
/// SHA-256 of the scheme's signed context and the body, each length-prefixed. `None` when the
/// keys are covered (from the body, or a signed header) or nothing verifies.
///
/// The text starts with a NUL, which no extracted key may hold: it never meets a real key.
fn signed_content<K: ExtractKey>(
    extractor: &K,
    settings: &Settings,
    parts: &Parts,
    data: Option<&Bytes>,
) -> Option<String> {
    let verifier = settings.intake.verifier.as_deref()?;
    if extractor.covered_by(verifier) {
        return None;
    }
    let body = data.map_or(&[][..], |data| &data[..]);
    let mut hasher = Sha256::new();
    for value in verifier.signed_context(parts).into_iter().chain([body]) {
        hasher.update((value.len() as u64).to_be_bytes());
        hasher.update(value);
    }
    let mut text = String::with_capacity(8 + 64);
    text.push_str("\0signed:");
    crate::util::push_hex(&mut text, &hasher.finalize());
    Some(text)
}

/// Names the hashed key in the request's span, when there is one.
fn name_the_key(targets: &Targets) {
    if let Some(key) = targets.single_key() {
        if let Some(span) = crate::claim::observe::request_span() {
            span.record("key", key.as_str());
        }
    }
}

#[cfg(all(test, feature = "verify"))]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::key::{HeaderKey, JsonPathKey};
    use crate::verify::StandardWebhooks;

    fn derived<K: ExtractKey>(key: &K, id: &str, body: &'static [u8]) -> Derived {
        let verifier = StandardWebhooks::new(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]).unwrap();
        let mut settings = Settings::default();
        settings.intake.verifier = Some(Arc::new(verifier));
        let (parts, ()) = http::Request::post("/hook")
            .header("webhook-id", id)
            .header("webhook-timestamp", "1614265330")
            .header("x-delivery", "d-1")
            .body(())
            .unwrap()
            .into_parts();
        let body = Bytes::from_static(body);
        derive(key, &settings, &parts, Some(&body))
            .unwrap()
            .unwrap()
    }

    /// A covered key is claimed alone (one store key, the single-key path); an uncovered one
    /// with the signed content, which the signed id and the body change.
    #[test]
    fn only_an_uncovered_key_claims_the_signed_content() {
        let covered = [
            derived(&HeaderKey::new("webhook-id").unwrap(), "msg_1", b"{}"),
            derived(
                &JsonPathKey::new("$.id").unwrap(),
                "msg_1",
                br#"{"id":"a"}"#,
            ),
        ];
        for derived in covered {
            assert!(!derived.signed);
            assert!(matches!(derived.targets, OneOrMany::One(_)));
        }
        let uncovered = HeaderKey::new("x-delivery").unwrap();
        let content = |id, body| match derived(&uncovered, id, body) {
            Derived {
                signed: true,
                targets: OneOrMany::Many(keys),
                ..
            } if keys.len() == 2 => keys[1].key.clone(),
            _ => panic!("the signed content was not claimed"),
        };
        assert_eq!(content("msg_1", b"{}"), content("msg_1", b"{}"));
        assert_ne!(content("msg_1", b"{}"), content("msg_2", b"{}"));
        assert_ne!(content("msg_1", b"{}"), content("msg_1", b"[]"));
        let fallback = HeaderKey::new("webhook-id")
            .unwrap()
            .or(HeaderKey::new("x-delivery").unwrap());
        assert!(derived(&fallback, "msg_1", b"{}").signed);
    }
}

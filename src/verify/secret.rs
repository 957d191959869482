//! Turning configured secrets into keys: as given (Stripe, GitHub, Shopify, Slack) or as
//! Standard Webhooks `whsec_<base64>` secrets and `whpk_<base64>` public keys. Secrets are
//! checked at start-up, so a typo is a configuration error rather than every request answered
//! 401.

use std::fmt;

use base64::Engine;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};

use super::ed25519::{BadKey, PublicKeys};
use super::hmac::Keys;
use crate::{ConfigError, ConfigErrorKind};

/// The prefix of Standard Webhooks secrets.
const WHSEC_PREFIX: &str = "whsec_";
/// The prefix of Standard Webhooks Ed25519 public keys (`v1a` signatures).
const WHPK_PREFIX: &str = "whpk_";
/// The prefix of Standard Webhooks Ed25519 private keys: the sender's, never a receiver's.
const WHSK_PREFIX: &str = "whsk_";

/// Standard base64, padding optional: a secret copied without its `=` is still the same secret.
const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why a secret or a scheme's setting cannot be used (a [`ConfigError`] of kind
/// [`Secret`](ConfigErrorKind::Secret), or [`HeaderName`](ConfigErrorKind::HeaderName) for a
/// scheme's header). [`Display`](fmt::Display) says which secret (by position, from 1) and what
/// is wrong, never the secret itself.
#[derive(Clone, Debug)]
pub(crate) struct InvalidSecret {
    problem: Problem,
}

#[derive(Clone, Debug)]
enum Problem {
    NoSecret,
    Empty { position: usize },
    Whitespace { position: usize },
    NotBase64 { position: usize },
    Rejected { position: usize },
    PublicKey { position: usize, why: &'static str },
    PrivateKey { position: usize },
    HeaderName { name: String },
}

impl InvalidSecret {
    fn at(position: usize, problem: fn(usize) -> Problem) -> Self {
        InvalidSecret {
            problem: problem(position),
        }
    }

    /// The `i`-th secret (from 0) is a `whpk_` key that cannot be used, because of `why`.
    fn public_key(i: usize, why: &'static str) -> Self {
        InvalidSecret {
            problem: Problem::PublicKey {
                position: i + 1,
                why,
            },
        }
    }

    /// A header name that is not valid (a setting of the scheme, not a secret: it is shown).
    pub(crate) fn header_name(name: &str) -> Self {
        InvalidSecret {
            problem: Problem::HeaderName {
                name: name.to_owned(),
            },
        }
    }
}

impl fmt::Display for InvalidSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.problem {
            Problem::NoSecret => f.write_str("no secret was configured; at least one is needed"),
            Problem::Empty { position } => write!(f, "secret #{position} is empty"),
            Problem::Whitespace { position } => write!(
                f,
                "secret #{position} starts or ends with whitespace (a newline read from a file?)"
            ),
            Problem::NotBase64 { position } => write!(
                f,
                "secret #{position} is not valid base64 after the optional `{WHSEC_PREFIX}` prefix"
            ),
            Problem::Rejected { position } => {
                write!(f, "secret #{position} cannot be used as an HMAC key")
            }
            Problem::PublicKey { position, why } => {
                write!(
                    f,
                    "secret #{position} is not a valid `{WHPK_PREFIX}` public key: {why}"
                )
            }
            Problem::PrivateKey { position } => write!(
                f,
                "secret #{position} is a `{WHSK_PREFIX}` private key, the sender's signing key: \
                 a receiver needs the `{WHPK_PREFIX}` public key (and the private key, \
                 now exposed, should be rotated)"
            ),
            Problem::HeaderName { name } => write!(f, "invalid header name {name:?}"),
        }
    }
}

impl std::error::Error for InvalidSecret {}

impl From<InvalidSecret> for ConfigError {
    fn from(why: InvalidSecret) -> Self {
        let kind = match why.problem {
            Problem::HeaderName { .. } => ConfigErrorKind::HeaderName,
            _ => ConfigErrorKind::Secret,
        };
        ConfigError::new(kind, why)
    }
}

/// Keys whose bytes are the secrets as given (the whole `whsec_...` string for Stripe).
pub(crate) fn as_given<I, S>(secrets: I) -> Result<Keys, InvalidSecret>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let secrets = checked(secrets)?;
    keys(secrets.iter().map(|secret| secret.as_ref().as_bytes()))
}

/// Keys of Standard Webhooks secrets, in any mix: HMAC secrets (`whsec_<base64>` or the bare
/// base64, the decoded bytes being the key) and Ed25519 public keys (`whpk_<base64>` of 32
/// bytes). A `whsk_` private key is refused: it signs, and has no place at a receiver.
pub(crate) fn standard_webhooks<I, S>(secrets: I) -> Result<(Keys, PublicKeys), InvalidSecret>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let secrets = checked(secrets)?;
    let mut hmac = Vec::new();
    let mut public = Vec::new();
    for (i, secret) in secrets.iter().enumerate() {
        let secret = secret.as_ref();
        if secret.starts_with(WHSK_PREFIX) {
            return Err(InvalidSecret::at(i + 1, |position| Problem::PrivateKey {
                position,
            }));
        }
        if let Some(encoded) = secret.strip_prefix(WHPK_PREFIX) {
            public.push((i, public_key(i, encoded)?));
            continue;
        }
        let encoded = secret.strip_prefix(WHSEC_PREFIX).unwrap_or(secret);
        match SECRET_BASE64.decode(encoded) {
            Ok(key) if !key.is_empty() => hmac.push(key),
            Ok(_) => {
                return Err(InvalidSecret::at(i + 1, |position| Problem::Empty {
                    position,
                }));
            }
            Err(_) => {
                return Err(InvalidSecret::at(i + 1, |position| Problem::NotBase64 {
                    position,
                }));
            }
        }
    }
    let public_keys = PublicKeys::new(public.iter().map(|(_, key)| key)).map_err(|(j, bad)| {
        let why = match bad {
            BadKey::NotAPoint => "its 32 bytes are not an Ed25519 curve point",
            BadKey::Weak => "it is a point of small order, which no one can sign for",
        };
        InvalidSecret::public_key(public[j].0, why)
    })?;
    Ok((keys(hmac.iter().map(Vec::as_slice))?, public_keys))
}

/// The 32 bytes of the `i`-th secret, a public key (after its `whpk_`).
fn public_key(i: usize, encoded: &str) -> Result<[u8; 32], InvalidSecret> {
    let decoded = SECRET_BASE64
        .decode(encoded)
        .map_err(|_| InvalidSecret::public_key(i, "it is not base64"))?;
    decoded
        .try_into()
        .map_err(|_| InvalidSecret::public_key(i, "it does not decode to 32 bytes"))
}

/// The secrets, at least one, none empty or padded with whitespace.
fn checked<I, S>(secrets: I) -> Result<Vec<S>, InvalidSecret>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let secrets: Vec<S> = secrets.into_iter().collect();
    if secrets.is_empty() {
        return Err(InvalidSecret {
            problem: Problem::NoSecret,
        });
    }
    for (i, secret) in secrets.iter().enumerate() {
        let secret = secret.as_ref();
        if secret.is_empty() {
            return Err(InvalidSecret::at(i + 1, |position| Problem::Empty {
                position,
            }));
        }
        if secret.trim() != secret {
            return Err(InvalidSecret::at(i + 1, |position| Problem::Whitespace {
                position,
            }));
        }
    }
    Ok(secrets)
}

fn keys<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Result<Keys, InvalidSecret> {
    // HMAC takes keys of any length, so this is not expected; an error all the same, not a
    // panic.
    Keys::new(secrets)
        .map_err(|i| InvalidSecret::at(i + 1, |position| Problem::Rejected { position }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message<T: fmt::Debug>(result: Result<T, InvalidSecret>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn at_least_one_secret() {
        assert!(message(as_given(Vec::<String>::new())).contains("no secret"));
        assert!(message(standard_webhooks(Vec::<&str>::new())).contains("no secret"));
    }

    #[test]
    fn no_empty_secret() {
        assert_eq!(message(as_given(["a", ""])), "secret #2 is empty");
        assert_eq!(message(standard_webhooks([""])), "secret #1 is empty");
        // Nothing after the prefix is an empty key.
        assert_eq!(message(standard_webhooks(["whsec_"])), "secret #1 is empty");
    }

    #[test]
    fn no_whitespace_around_a_secret() {
        let err = message(as_given(["It's a Secret to Everybody\n"]));
        assert!(
            err.contains("secret #1 starts or ends with whitespace"),
            "{err}"
        );
        assert!(!err.contains("Everybody"), "{err}");
        // Inside a secret, spaces are the secret's own.
        assert!(as_given(["It's a Secret to Everybody"]).is_ok());
    }

    #[test]
    fn standard_webhooks_secrets_are_base64() {
        assert_eq!(
            standard_webhooks(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])
                .unwrap()
                .0
                .len(),
            1
        );
        assert!(standard_webhooks(["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]).is_ok());
        // Padding is optional: the same key either way.
        assert!(standard_webhooks(["whsec_dGVzdA=="]).is_ok());
        assert!(standard_webhooks(["whsec_dGVzdA"]).is_ok());
        let err = message(standard_webhooks([
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_not base64!",
        ]));
        assert!(err.starts_with("secret #2 is not valid base64"), "{err}");
        assert!(!err.contains("not base64!"), "{err}");
    }

    #[test]
    fn public_keys_beside_secrets() {
        // RFC 8032's first test key (7.1, TEST 1), as Standard Webhooks writes it.
        let public = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
        let (hmac, ed25519) =
            standard_webhooks(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", public]).unwrap();
        assert_eq!((hmac.len(), ed25519.len()), (1, 1));
        let (hmac, ed25519) = standard_webhooks([public]).unwrap();
        assert_eq!((hmac.len(), ed25519.len()), (0, 1));
        // Padding is optional here too.
        assert!(standard_webhooks(["whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo"]).is_ok());
        for (bad, why) in [
            ("whpk_not base64!", "it is not base64"),
            ("whpk_", "it does not decode to 32 bytes"),
            ("whpk_dGVzdA==", "it does not decode to 32 bytes"),
            (
                "whpk_AgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                "its 32 bytes are not an Ed25519 curve point",
            ),
            (
                "whpk_AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                "it is a point of small order, which no one can sign for",
            ),
        ] {
            let err = message(standard_webhooks([public, bad]));
            assert_eq!(
                err,
                format!("secret #2 is not a valid `whpk_` public key: {why}"),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_private_key_is_refused() {
        let err = message(standard_webhooks([
            "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=",
        ]));
        assert!(
            err.starts_with("secret #1 is a `whsk_` private key"),
            "{err}"
        );
        assert!(err.contains("needs the `whpk_` public key"), "{err}");
        assert!(!err.contains("nWGx"), "{err}");
    }

    #[test]
    fn a_header_name_is_shown() {
        assert_eq!(
            InvalidSecret::header_name("bad header").to_string(),
            r#"invalid header name "bad header""#
        );
    }
}

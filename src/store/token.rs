//! [`Token`]: the random owner token of one claim.

use std::fmt;

use sha2::{Digest, Sha256};

/// The random owner token of one claim: 128 bits from the operating system's generator.
///
/// Never logged: its `Debug` output is redacted.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token([u8; 16]);

impl Token {
    /// A fresh random token: what a store of your own mints for each claim it grants and each
    /// lease its inbox's `take` hands out, so that only the holder can settle it.
    ///
    /// The bytes come from the operating system's generator, read 256 tokens at a time into a
    /// per-thread buffer, so that a claim does not wait on a system call of its
    /// own; each buffered token is handed out once and erased from the buffer. Should the
    /// generator fail, the token is a hash of a process-wide counter, the process id and the
    /// time: unique, though not secret.
    ///
    /// ```
    /// use tower_idempotency::store::Token;
    ///
    /// assert_ne!(Token::random(), Token::random());
    /// ```
    pub fn random() -> Self {
        TOKEN_POOL_BUFFER
            .try_with(|pool| pool.borrow_mut().take())
            .ok()
            .flatten()
            .unwrap_or_else(|| {
                let mut bytes = [0u8; 16];
                if getrandom::fill(&mut bytes).is_err() {
                    // The OS generator is unavailable; fall back to a per-process unique value.
                    bytes = fallback_token();
                }
                Token(bytes)
            })
    }

    /// A token from raw bytes (for store implementations decoding their own encoding).
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Token(bytes)
    }

    /// The raw bytes of the token.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

/// How many tokens [`Token::random`] reads from the OS generator at a time, per thread (4 KiB:
/// one `getrandom` call per 256 claims).
const TOKEN_POOL: usize = 256;

/// A per-thread buffer of random bytes for [`Token::random`].
struct TokenPool {
    bytes: [u8; 16 * TOKEN_POOL],
    next: usize,
}

impl TokenPool {
    /// The next unused token, refilling the buffer when it is spent; `None` when the OS
    /// generator fails.
    fn take(&mut self) -> Option<Token> {
        if self.next == TOKEN_POOL {
            getrandom::fill(&mut self.bytes).ok()?;
            self.next = 0;
        }
        let slot = &mut self.bytes[self.next * 16..(self.next + 1) * 16];
        let mut token = [0u8; 16];
        token.copy_from_slice(slot);
        slot.fill(0);
        self.next += 1;
        Some(Token(token))
    }
}

thread_local! {
    static TOKEN_POOL_BUFFER: std::cell::RefCell<TokenPool> = const {
        std::cell::RefCell::new(TokenPool { bytes: [0; 16 * TOKEN_POOL], next: TOKEN_POOL })
    };
}

fn fallback_token() -> [u8; 16] {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = Sha256::new();
    hasher.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    hasher.update(std::process::id().to_be_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    hasher.update(now.as_nanos().to_be_bytes());
    let digest = hasher.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    out
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_redacted() {
        let a = Token::random();
        let b = Token::random();
        assert_ne!(a, b);
        assert_eq!(format!("{a:?}"), "Token(<redacted>)");
    }

    #[test]
    fn pooled_tokens_are_unique_across_refills_and_threads() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10 * TOKEN_POOL {
            assert!(seen.insert(Token::random()));
        }
        let other =
            std::thread::spawn(|| (0..TOKEN_POOL).map(|_| Token::random()).collect::<Vec<_>>())
                .join()
                .unwrap();
        for token in other {
            assert!(seen.insert(token));
        }
        assert!(!seen.contains(&Token::from_bytes([0; 16])));
    }
}

//! Small helpers shared by several modules.

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends the lowercase hex digits of `bytes` to `out`.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    for b in bytes {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 0xf) as usize] as char);
    }
}

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Writes the unpadded base64url digits of `bytes` (a multiple of 3 bytes long) into `out`
/// (4 digits per 3 bytes).
pub(crate) fn write_base64url(out: &mut [u8], bytes: &[u8]) {
    debug_assert!(bytes.len().is_multiple_of(3) && out.len() == bytes.len() / 3 * 4);
    for (chunk, digits) in bytes.chunks_exact(3).zip(out.chunks_exact_mut(4)) {
        let n = (u32::from(chunk[0]) << 16) | (u32::from(chunk[1]) << 8) | u32::from(chunk[2]);
        for (digit, shift) in digits.iter_mut().zip([18, 12, 6, 0]) {
            *digit = BASE64URL[((n >> shift) & 63) as usize];
        }
    }
}

/// The lowercase hex digits of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    out
}

/// The value `make` makes, built in its box: allocated first, so that the value is written
/// there rather than built aside and then copied in whole (for a future, all of its states,
/// mostly not even set yet: kilobytes for a fred command). Pinned, as boxed futures are.
pub(crate) fn in_box<T>(make: impl FnOnce() -> T) -> std::pin::Pin<Box<T>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

/// `fut` polled once, now: its output if it was ready. A call bounded by a timer arms the
/// timer only when this finds it still pending (a call answered at once costs none).
pub(crate) async fn ready_now<F: std::future::Future>(
    mut fut: std::pin::Pin<&mut F>,
) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match fut.as_mut().poll(cx) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

/// A type holding one backend chosen at run time (`AnyStore`, `AnyInbox`): a public,
/// non-exhaustive enum `$any` with a variant per backend (each but memory behind its feature),
/// a `From` of each backend's type into it, and the backend's name (`$any::name`). The
/// attributes given before the name (its docs) go on the enum.
macro_rules! run_time_backends {
    ($(#[$meta:meta])* $any:ident { memory: $memory:ty, redis: $redis:ty, postgres: $postgres:ty, sqlite: $sqlite:ty $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Debug)]
        #[non_exhaustive]
        pub enum $any {
            /// In this process.
            Memory($memory),
            /// On Redis.
            #[cfg(feature = "redis")]
            #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
            Redis($redis),
            /// On PostgreSQL.
            #[cfg(feature = "postgres")]
            #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
            Postgres($postgres),
            /// On SQLite.
            #[cfg(feature = "sqlite")]
            #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
            Sqlite($sqlite),
        }

        impl $any {
            /// The backend's name: `memory`, `redis`, `postgres` or `sqlite`.
            fn name(&self) -> &'static str {
                match self {
                    $any::Memory(_) => "memory",
                    #[cfg(feature = "redis")]
                    $any::Redis(_) => "redis",
                    #[cfg(feature = "postgres")]
                    $any::Postgres(_) => "postgres",
                    #[cfg(feature = "sqlite")]
                    $any::Sqlite(_) => "sqlite",
                }
            }
        }

        impl From<$memory> for $any {
            fn from(backend: $memory) -> Self {
                $any::Memory(backend)
            }
        }

        #[cfg(feature = "redis")]
        impl From<$redis> for $any {
            fn from(backend: $redis) -> Self {
                $any::Redis(backend)
            }
        }

        #[cfg(feature = "postgres")]
        impl From<$postgres> for $any {
            fn from(backend: $postgres) -> Self {
                $any::Postgres(backend)
            }
        }

        #[cfg(feature = "sqlite")]
        impl From<$sqlite> for $any {
            fn from(backend: $sqlite) -> Self {
                $any::Sqlite(backend)
            }
        }
    };
}

pub(crate) use run_time_backends;

//! The Redis backend, on `fred`: the record store ([`RedisStore`](crate::RedisStore)), the
//! inbox ([`RedisInbox`](crate::inbox::RedisInbox)) and the relay of its wake-ups, each with its
//! Lua scripts in files of their own.

pub(crate) mod inbox;
pub(crate) mod records;
pub(crate) mod relay;

//! [`Slot`]: a store key (or an object's lease or watermark) as two machine words, and
//! [`SlotHasher`], the seeded hash the [`ExpiringMap`](super::map::ExpiringMap) indexes them with.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};

use super::{KEY_PREFIX, ObjectKey, StoreKey};

/// A store key without its constant prefix: 16 base64url digits of a BLAKE3, as two words.
/// Copied into the map and the expiry queues without an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Slot([u64; 2]);

impl Slot {
    /// Marks an expiry item whose entry was re-set or removed since: it is dropped when it
    /// reaches the head of its queue without a map lookup. No key maps to it (digits are ASCII).
    pub(super) const RETIRED: Slot = Slot([0, 0]);

    pub(super) fn of(key: &StoreKey) -> Slot {
        Slot::of_digits(key.as_bytes())
    }

    /// The slot of an object's lease: its digits with the top bit of every byte of the first
    /// word set, which no key's digits (ASCII) have.
    pub(super) fn object_lease(object: &ObjectKey) -> Slot {
        let Slot([first, second]) = Slot::of_digits(object.as_bytes());
        Slot([first ^ HIGH_BITS, second])
    }

    /// The slot of an object's watermark: the top bits set in the second word.
    pub(super) fn watermark(object: &ObjectKey) -> Slot {
        let Slot([first, second]) = Slot::of_digits(object.as_bytes());
        Slot([first, second ^ HIGH_BITS])
    }

    fn of_digits(bytes: &[u8; super::STORE_KEY_LEN]) -> Slot {
        let word = |at: usize| u64::from_le_bytes(std::array::from_fn(|i| bytes[at + i]));
        Slot([word(KEY_PREFIX.len()), word(KEY_PREFIX.len() + 8)])
    }
}

impl Hash for Slot {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0[0]);
        state.write_u64(self.0[1]);
    }
}

/// The top bit of every byte of a word.
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// A seeded multiply-fold hash of slots. The digits are already a cryptographic hash of the
/// key, so a cheap mix is enough; the random seed keeps an attacker who precomputes keys from
/// aiming them at one bucket.
#[derive(Clone, Copy, Debug)]
pub(super) struct SlotHasher {
    seed: u64,
}

impl Default for SlotHasher {
    fn default() -> Self {
        SlotHasher {
            seed: RandomState::new().hash_one(0x5EED_u64),
        }
    }
}

impl BuildHasher for SlotHasher {
    type Hasher = SlotState;

    fn build_hasher(&self) -> SlotState {
        SlotState(self.seed)
    }
}

pub(super) struct SlotState(u64);

/// Multiplies and folds the 128-bit product: every input bit reaches every output bit.
fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

impl Hasher for SlotState {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = fold(self.0 ^ word, 0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

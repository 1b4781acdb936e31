// SPDX-License-Identifier: Apache-2.0
//! Hostile edits of a snapshot's state, for tests and fuzz targets
//! (feature `test-utils`). The binary encoding has no field names, so a
//! test that names the state's type edits it as JSON and encodes it again
//! ([`state_json`], [`with_state`]); one that does not edits what the
//! fields are made of: numbers (varints) and bytes ([`mutate`]).

use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

use crate::Snapshot;

/// The state of `snapshot`, of type `T`, as JSON.
pub fn state_json<T: Serialize + DeserializeOwned>(snapshot: &Snapshot) -> Value {
    let state: T = snapshot
        .state(&snapshot.id, snapshot.version)
        .unwrap_or_else(|e| panic!("state: {e}"));
    serde_json::to_value(state).unwrap_or_else(|e| panic!("to JSON: {e}"))
}

/// A snapshot of the same component and version whose state is `value`;
/// `None` when `value` no longer fits `T` (a value the binary encoding
/// cannot hold either, such as 256 in a `u8`).
pub fn with_state<T: Serialize + DeserializeOwned>(
    snapshot: &Snapshot,
    value: Value,
) -> Option<Snapshot> {
    let state: T = serde_json::from_value(value).ok()?;
    Some(
        Snapshot::new(&snapshot.id, snapshot.version, &state)
            .unwrap_or_else(|e| panic!("encode: {e}")),
    )
}

/// Where [`mutate`]'s choices come from: a fuzzer's input or a seeded
/// generator.
pub trait Choices {
    fn u8(&mut self) -> u8;
    fn u16(&mut self) -> u16;
    fn u64(&mut self) -> u64;
}

/// xorshift64*: reproducible noise for tests (a failure reproduces from
/// the seed) without a dependency, and [`Choices`] from it.
#[derive(Clone, Debug)]
pub struct Seeded(pub u64);

impl Seeded {
    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.u64().checked_rem(n as u64).unwrap_or(0) as usize
    }
}

impl Choices for Seeded {
    fn u8(&mut self) -> u8 {
        self.u64() as u8
    }

    fn u16(&mut self) -> u16 {
        self.u64() as u16
    }

    fn u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// `v` as a varint (LEB128), as the encoding writes lengths and numbers.
pub fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// The varint at the start of `bytes` and its length (at most 10 bytes).
pub fn read_varint(bytes: &[u8]) -> (u64, usize) {
    let mut v = 0u64;
    for (i, b) in bytes.iter().take(10).enumerate() {
        v |= u64::from(b & 0x7f) << (7 * i as u32).min(63);
        if b & 0x80 == 0 {
            return (v, i + 1);
        }
    }
    (v, bytes.len().min(10))
}

/// Values that sit on a boundary of some field or limit.
const BOUNDARIES: [u64; 12] = [
    0,
    1,
    0xff,
    0x100,
    0xffff,
    0x1_0000,
    0xffff_ffff,
    0x1_0000_0000,
    4095,
    4096,
    i64::MAX as u64,
    u64::MAX,
];

/// One hostile change to the encoded state `state` at byte `at` (modulo
/// its length): the number there replaced (by any, a small one, a
/// boundary, or one near the old value), a bit flipped, or a range of up
/// to 16 bytes removed, duplicated or copied from elsewhere.
pub fn mutate(state: &mut Vec<u8>, at: usize, choices: &mut impl Choices) {
    let Some(at) = at.checked_rem(state.len()) else {
        return;
    };
    let (old, len) = read_varint(&state[at..]);
    let number = match choices.u8() % 8 {
        0 => Some(choices.u64()),
        1 => Some(choices.u8().into()),
        2 => Some(BOUNDARIES[usize::from(choices.u8()) % BOUNDARIES.len()]),
        // Near the old value: off by a little either way.
        3 => Some(old.wrapping_add_signed(i64::from(choices.u8() as i8))),
        4 => {
            state[at] ^= 1 << (choices.u8() % 8);
            None
        }
        5 => {
            let end = (at + usize::from(choices.u8() % 16) + 1).min(state.len());
            state.drain(at..end);
            None
        }
        6 => {
            let end = (at + usize::from(choices.u8() % 16) + 1).min(state.len());
            let copy = state[at..end].to_vec();
            state.splice(at..at, copy);
            None
        }
        _ => {
            let from = usize::from(choices.u16()) % state.len();
            let end = (from + usize::from(choices.u8() % 16) + 1).min(state.len());
            let copy = state[from..end].to_vec();
            let to = (at + copy.len()).min(state.len());
            state.splice(at..to, copy);
            None
        }
    };
    if let Some(n) = number {
        state.splice(at..at + len, varint(n));
    }
}

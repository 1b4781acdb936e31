// SPDX-License-Identifier: Apache-2.0
//! 24-bit packet sequence numbers (IBA 9.7.1).
//!
//! PSNs wrap at 2^24 and are compared in a window of half the space, as
//! rxe's `psn_compare` does (`(a - b) << 8` as a signed value). The
//! newtype makes an unmasked PSN unrepresentable.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

/// Mask of the 24 PSN bits in the BTH.
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// A packet sequence number, always < 2^24.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "u32", into = "u32")]
pub struct Psn(u32);

impl Psn {
    /// Masks `v` to 24 bits.
    pub const fn new(v: u32) -> Self {
        Psn(v & PSN_MASK)
    }

    /// The raw 24-bit value.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    pub const fn add(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_add(n))
    }

    /// `self - n` modulo 2^24.
    pub const fn sub(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// Forward distance from `from` to `self` modulo 2^24.
    pub const fn distance_from(self, from: Psn) -> u32 {
        self.0.wrapping_sub(from.0) & PSN_MASK
    }
}

impl From<u32> for Psn {
    fn from(v: u32) -> Self {
        Psn::new(v)
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

/// rxe's `psn_compare`: orders `a` and `b` as if they were within 2^23 of
/// each other.
pub fn psn_compare(a: Psn, b: Psn) -> Ordering {
    // Shift the 24-bit difference into the top of an i32 so its sign is
    // the sign of the wrapped difference.
    let diff = (a.0.wrapping_sub(b.0) << 8).cast_signed();
    diff.cmp(&0)
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_wraps() {
        assert_eq!(Psn::new(0x1ff_ffff).get(), 0xff_ffff);
        assert_eq!(Psn::new(0xff_ffff).add(1), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), Psn::new(0xff_ffff));
        assert_eq!(Psn::new(2).distance_from(Psn::new(0xff_fffe)), 4);
    }

    #[test]
    fn compare_is_windowed() {
        use Ordering::*;
        let cases = [
            (5, 5, Equal),
            (6, 5, Greater),
            (5, 6, Less),
            (0, 0xff_ffff, Greater),
            (0xff_ffff, 0, Less),
            (0x7f_ffff, 0, Greater),
            (0x80_0000, 0, Less),
        ];
        for (a, b, want) in cases {
            assert_eq!(
                psn_compare(Psn::new(a), Psn::new(b)),
                want,
                "{a:#x} vs {b:#x}"
            );
        }
    }

    #[test]
    fn serde_roundtrip_masks() {
        let p: Psn = serde_json::from_str("33554431").unwrap();
        assert_eq!(p.get(), 0xff_ffff);
        assert_eq!(serde_json::to_string(&Psn::new(7)).unwrap(), "7");
    }
}

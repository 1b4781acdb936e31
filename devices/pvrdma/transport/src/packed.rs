// SPDX-License-Identifier: Apache-2.0
//! Plain fields of saved state packed by hand into one byte string.
//!
//! Through serde, every field of a saved struct is a call into the format
//! and back (and, on a migration's destination, through the bounded
//! decoder's wrappers too): some 50-100 instructions a field, and a QP's
//! state has about 80 fields, so with thousands of QPs serde's layers were
//! most of a restore's decoding, inside the blackout. A [`Packed`] value is
//! written as one byte string of LEB128 varints (the same encoding
//! postcard gives integers, so the state does not grow) and read back by
//! straight-line code, checked as strictly as serde's derive: booleans
//! and option tags are 0 or 1, an integer must fit its type, an enum's
//! value must be known, and the bytes must be used up exactly. Packing is
//! for fixed-size values only (nothing it decodes allocates): sequences
//! stay serde's, where the bounded decoder charges their elements.

use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserializer, Serializer};

/// A value written as bytes by [`Writer`] and read back by [`Reader`].
pub trait Packed: Sized {
    /// Appends the value.
    fn pack(&self, w: &mut Writer);
    /// Reads a value; `None` if the bytes do not hold a valid one.
    fn unpack(r: &mut Reader<'_>) -> Option<Self>;
}

/// The bytes being written.
#[derive(Default)]
pub struct Writer(Vec<u8>);

impl Writer {
    /// Appends `v` as a LEB128 varint (1 to 10 bytes).
    #[inline]
    pub fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            // Truncation intended: the low 7 bits and the continuation bit.
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    /// Appends raw bytes.
    pub fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }

    /// The bytes written.
    pub fn into_inner(self) -> Vec<u8> {
        self.0
    }
}

/// The bytes being read.
pub struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// Reads from the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader(bytes)
    }

    /// A LEB128 varint of at most 10 bytes that fits a `u64`.
    #[inline]
    pub fn varint(&mut self) -> Option<u64> {
        // Most fields take one byte: inlined; the rest out of line.
        match self.0.split_first() {
            Some((&b, rest)) if b < 0x80 => {
                self.0 = rest;
                Some(u64::from(b))
            }
            _ => self.long_varint(),
        }
    }

    #[inline(never)]
    fn long_varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for (i, &b) in self.0.iter().enumerate().take(10) {
            let low = u64::from(b & 0x7f);
            // The 10th byte holds the top bit only.
            if i == 9 && b > 1 {
                return None;
            }
            v |= low << (7 * i);
            if b & 0x80 == 0 {
                self.0 = self.0.get(i + 1..)?;
                return Some(v);
            }
        }
        None
    }

    /// The next `N` raw bytes.
    pub fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    /// The next `n` raw bytes.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    /// Whether every byte was read.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

macro_rules! packed_uint {
    ($($t:ty),*) => {$(
        impl Packed for $t {
            #[inline]
            fn pack(&self, w: &mut Writer) {
                w.varint(*self as u64);
            }
            #[inline]
            fn unpack(r: &mut Reader<'_>) -> Option<Self> {
                r.varint()?.try_into().ok()
            }
        }
    )*};
}

packed_uint!(u8, u16, u32, u64, usize);

impl Packed for bool {
    #[inline]
    fn pack(&self, w: &mut Writer) {
        w.varint(u64::from(*self));
    }
    #[inline]
    fn unpack(r: &mut Reader<'_>) -> Option<Self> {
        match r.varint()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }
}

impl<T: Packed> Packed for Option<T> {
    fn pack(&self, w: &mut Writer) {
        match self {
            None => w.varint(0),
            Some(v) => {
                w.varint(1);
                v.pack(w);
            }
        }
    }
    fn unpack(r: &mut Reader<'_>) -> Option<Self> {
        match bool::unpack(r)? {
            false => Some(None),
            true => T::unpack(r).map(Some),
        }
    }
}

impl<const N: usize> Packed for [u8; N] {
    fn pack(&self, w: &mut Writer) {
        w.bytes(self);
    }
    fn unpack(r: &mut Reader<'_>) -> Option<Self> {
        r.array()
    }
}

impl Packed for IpAddr {
    fn pack(&self, w: &mut Writer) {
        match self {
            IpAddr::V4(a) => {
                w.varint(0);
                w.bytes(&a.octets());
            }
            IpAddr::V6(a) => {
                w.varint(1);
                w.bytes(&a.octets());
            }
        }
    }
    fn unpack(r: &mut Reader<'_>) -> Option<Self> {
        match r.varint()? {
            0 => Some(Ipv4Addr::from(r.array::<4>()?).into()),
            1 => Some(Ipv6Addr::from(r.array::<16>()?).into()),
            _ => None,
        }
    }
}

impl<A: Packed, B: Packed> Packed for (A, B) {
    fn pack(&self, w: &mut Writer) {
        self.0.pack(w);
        self.1.pack(w);
    }
    fn unpack(r: &mut Reader<'_>) -> Option<Self> {
        Some((A::unpack(r)?, B::unpack(r)?))
    }
}

impl<A: Packed, B: Packed, C: Packed> Packed for (A, B, C) {
    fn pack(&self, w: &mut Writer) {
        self.0.pack(w);
        self.1.pack(w);
        self.2.pack(w);
    }
    fn unpack(r: &mut Reader<'_>) -> Option<Self> {
        Some((A::unpack(r)?, B::unpack(r)?, C::unpack(r)?))
    }
}

/// Packs a struct as its fields in order; every field must be
/// [`Packed`], and every field must be named (a field added later and
/// not named here does not compile).
#[macro_export]
#[doc(hidden)]
macro_rules! packed_struct {
    ($($t:ty { $($f:ident),* $(,)? })*) => {$(
        impl $crate::packed::Packed for $t {
            fn pack(&self, w: &mut $crate::packed::Writer) {
                $( $crate::packed::Packed::pack(&self.$f, w); )*
            }
            fn unpack(r: &mut $crate::packed::Reader<'_>) -> Option<Self> {
                Some(Self { $( $f: $crate::packed::Packed::unpack(r)?, )* })
            }
        }
    )*};
}

thread_local! {
    /// What [`serialize_with`] packs into, kept between calls: a save of
    /// thousands of QPs allocates it once, not once a value.
    static BUF: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Serializes what `pack` writes as one byte string.
pub fn serialize_with<S: Serializer>(
    s: S,
    pack: impl FnOnce(&mut Writer),
) -> Result<S::Ok, S::Error> {
    let mut w = Writer(BUF.take());
    w.0.clear();
    pack(&mut w);
    let done = s.serialize_bytes(&w.0);
    BUF.set(w.0);
    done
}

/// Deserializes a byte string that `unpack` reads exactly (or, from a
/// self-describing format such as JSON, the same bytes as a sequence of
/// numbers).
pub fn deserialize_with<'de, T, D: Deserializer<'de>>(
    d: D,
    unpack: fn(&mut Reader<'_>) -> Option<T>,
) -> Result<T, D::Error> {
    d.deserialize_bytes(PackedVisitor(unpack))
}

/// Most bytes a packed value takes from a sequence (what JSON makes of a
/// byte string); a QP's engine packs into a few hundred.
const MAX_SEQ_BYTES: usize = 4096;

struct PackedVisitor<T>(fn(&mut Reader<'_>) -> Option<T>);

impl<'de, T> Visitor<'de> for PackedVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("packed fields")
    }

    fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<T, E> {
        let mut r = Reader::new(bytes);
        match (self.0)(&mut r) {
            Some(v) if r.is_empty() => Ok(v),
            _ => Err(E::custom("malformed packed fields")),
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
        let mut bytes = Vec::new();
        while let Some(b) = seq.next_element::<u8>()? {
            if bytes.len() >= MAX_SEQ_BYTES {
                return Err(de::Error::custom("packed fields too long"));
            }
            bytes.push(b);
        }
        self.visit_bytes(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round<T: Packed + PartialEq + std::fmt::Debug>(v: T) {
        let mut w = Writer::default();
        v.pack(&mut w);
        let bytes = w.into_inner();
        let mut r = Reader::new(&bytes);
        assert_eq!(T::unpack(&mut r), Some(v));
        assert!(r.is_empty());
    }

    #[test]
    fn values_round_trip() {
        for v in [0u64, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            round(v);
        }
        round(u8::MAX);
        round(Some(true));
        round(None::<u32>);
        round([1u8, 2, 3, 4, 5, 6]);
        round(IpAddr::from([10, 0, 0, 1]));
        round(IpAddr::from(Ipv6Addr::LOCALHOST));
    }

    /// What serde's derive would refuse is refused: out-of-range
    /// integers, booleans and tags other than 0 and 1, overlong varints,
    /// truncated input.
    #[test]
    fn invalid_bytes_are_refused() {
        type Refused = fn(&mut Reader<'_>) -> bool;
        let bad: &[(&[u8], Refused)] = &[
            (&[0x80, 0x02], |r| u8::unpack(r).is_none()),
            (&[2], |r| bool::unpack(r).is_none()),
            (&[2, 0], |r| Option::<u8>::unpack(r).is_none()),
            (&[0xff; 11], |r| u64::unpack(r).is_none()),
            (
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
                |r| u64::unpack(r).is_none(),
            ),
            (&[0x80], |r| u32::unpack(r).is_none()),
            (&[0, 1, 2, 3], |r| IpAddr::unpack(r).is_none()),
            (&[2, 1, 2, 3, 4], |r| IpAddr::unpack(r).is_none()),
        ];
        for (bytes, refused) in bad {
            assert!(refused(&mut Reader::new(bytes)), "{bytes:?}");
        }
    }
}

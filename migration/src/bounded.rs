// SPDX-License-Identifier: Apache-2.0
//! Decoding a snapshot from another host without letting it choose how
//! much memory we spend.
//!
//! A postcard length prefix says how many elements follow; each element
//! takes at least a byte of input, but many times more in memory (a `u64`
//! that encodes in one byte takes eight, a QP's send WQE slot over ten
//! times its encoding), so a hostile 512 MiB state could make a
//! destination allocate many GiB. [`decode`] wraps postcard's deserializer
//! so that, before the visitor of a sequence, map or string sees anything:
//! - a sequence may not claim more elements than bytes are left in the
//!   input (postcard gives a sequence no size hint exactly then);
//! - every element is charged its size in memory (`size_of` of its type,
//!   at least one byte; a string or byte string its length) against a
//!   budget, and the decoding stops with an error once the budget is
//!   spent, before the element is built.
//!
//! Nothing else changes: what decodes within the budget decodes as
//! postcard alone would decode it.

use std::cell::Cell;
use std::fmt;
use std::mem::size_of;

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess,
    VariantAccess, Visitor,
};

/// Why [`decode`] refused its input.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("A sequence claims more elements than the input has bytes left")]
    BeyondInput,
    #[error("The decoded state would take more than {0} bytes of memory")]
    OverBudget(usize),
    #[error("Bytes left over after the state")]
    Trailing,
    #[error("Malformed state")]
    Postcard(#[source] postcard::Error),
}

/// `T` from all of `bytes`, spending at most `budget` bytes of memory on
/// the elements of its sequences, maps and strings.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], budget: usize) -> Result<T, DecodeError> {
    let mut left = budget;
    decode_within(bytes, &mut left)
}

/// [`decode`], taking what the elements spend from `left`: values nested
/// as byte strings in a state (decoded one by one, each on its own) share
/// one budget this way.
pub fn decode_within<T: DeserializeOwned>(
    bytes: &[u8],
    left: &mut usize,
) -> Result<T, DecodeError> {
    let budget = Budget {
        left: Cell::new(*left),
        limit: *left,
        refused: Cell::new(None),
    };
    let value = decode_budgeted(bytes, &budget);
    *left = budget.left.get();
    value
}

fn decode_budgeted<T: DeserializeOwned>(bytes: &[u8], budget: &Budget) -> Result<T, DecodeError> {
    let mut de = postcard::Deserializer::from_bytes(bytes);
    let value = T::deserialize(Bounded {
        de: &mut de,
        budget,
    });
    match (value, budget.refused.take()) {
        (_, Some(refusal)) => Err(refusal),
        (Err(e), None) => Err(DecodeError::Postcard(e)),
        (Ok(value), None) => match de.finalize() {
            Ok([]) => Ok(value),
            Ok(_) => Err(DecodeError::Trailing),
            Err(e) => Err(DecodeError::Postcard(e)),
        },
    }
}

struct Budget {
    left: Cell<usize>,
    limit: usize,
    /// The first refusal, reported instead of the format's error.
    refused: Cell<Option<DecodeError>>,
}

impl Budget {
    /// Takes `bytes` from the budget, or records the refusal.
    fn charge<E: de::Error>(&self, bytes: usize) -> Result<(), E> {
        match self.left.get().checked_sub(bytes.max(1)) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => Err(self.refuse(DecodeError::OverBudget(self.limit))),
        }
    }

    fn refund(&self, bytes: usize) {
        self.left
            .set(self.left.get().saturating_add(bytes.max(1)).min(self.limit));
    }

    fn refuse<E: de::Error>(&self, why: DecodeError) -> E {
        let message = why.to_string();
        let first = self.refused.take().unwrap_or(why);
        self.refused.set(Some(first));
        E::custom(message)
    }
}

/// postcard's deserializer, with every visitor, sequence, map and enum it
/// hands out wrapped so that nested values are checked too.
struct Bounded<'b, D> {
    de: D,
    budget: &'b Budget,
}

struct Wrap<'b, X> {
    inner: X,
    budget: &'b Budget,
    /// A visitor of a sequence (not a tuple or struct, whose fields may
    /// take no bytes): its length is checked against the input.
    seq: bool,
}

fn wrap<X>(inner: X, budget: &Budget) -> Wrap<'_, X> {
    Wrap {
        inner,
        budget,
        seq: false,
    }
}

macro_rules! forward {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
                self.de.$method($($arg,)* wrap(visitor, self.budget))
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Bounded<'_, D> {
    type Error = D::Error;

    forward! {
        deserialize_any();
        deserialize_bool();
        deserialize_i8();
        deserialize_i16();
        deserialize_i32();
        deserialize_i64();
        deserialize_i128();
        deserialize_u8();
        deserialize_u16();
        deserialize_u32();
        deserialize_u64();
        deserialize_u128();
        deserialize_f32();
        deserialize_f64();
        deserialize_char();
        deserialize_str();
        deserialize_string();
        deserialize_bytes();
        deserialize_byte_buf();
        deserialize_option();
        deserialize_unit();
        deserialize_unit_struct(name: &'static str);
        deserialize_newtype_struct(name: &'static str);
        deserialize_tuple(len: usize);
        deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_map();
        deserialize_struct(name: &'static str, fields: &'static [&'static str]);
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
        deserialize_identifier();
        deserialize_ignored_any();
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let visitor = Wrap {
            seq: true,
            ..wrap(visitor, self.budget)
        };
        self.de.deserialize_seq(visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.de.is_human_readable()
    }
}

macro_rules! visit {
    ($($method:ident($ty:ty);)*) => {
        $(
            fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
                self.inner.$method(v)
            }
        )*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }

    visit! {
        visit_bool(bool);
        visit_i8(i8);
        visit_i16(i16);
        visit_i32(i32);
        visit_i64(i64);
        visit_i128(i128);
        visit_u8(u8);
        visit_u16(u16);
        visit_u32(u32);
        visit_u64(u64);
        visit_u128(u128);
        visit_f32(f32);
        visit_f64(f64);
        visit_char(char);
    }

    // Strings and byte strings are copied by most visitors: charged.
    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.budget.charge(v.len())?;
        self.inner.visit_str(v)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        self.budget.charge(v.len())?;
        self.inner.visit_borrowed_str(v)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        self.budget.charge(v.len())?;
        self.inner.visit_string(v)
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<V::Value, E> {
        self.budget.charge(v.len())?;
        self.inner.visit_bytes(v)
    }

    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<V::Value, E> {
        self.budget.charge(v.len())?;
        self.inner.visit_borrowed_bytes(v)
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<V::Value, E> {
        self.budget.charge(v.len())?;
        self.inner.visit_byte_buf(v)
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        self.inner.visit_some(Bounded {
            de,
            budget: self.budget,
        })
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        self.inner.visit_newtype_struct(Bounded {
            de,
            budget: self.budget,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        // postcard hints a sequence's length unless it claims more
        // elements than there are bytes left: refuse that at once.
        if self.seq && seq.size_hint().is_none() {
            return Err(self.budget.refuse(DecodeError::BeyondInput));
        }
        self.inner.visit_seq(wrap(seq, self.budget))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(wrap(map, self.budget))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.inner.visit_enum(wrap(data, self.budget))
    }
}

/// A seed whose deserializer is wrapped too.
struct Seed<'b, S> {
    seed: S,
    budget: &'b Budget,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(Bounded {
            de,
            budget: self.budget,
        })
    }
}

/// Charges one element of `S`'s type, then decodes it through `next`;
/// refunds the charge when there was none. `last` says the format
/// announced the end, so nothing is charged for it.
fn element<'de, 'b, S, E, F>(
    budget: &'b Budget,
    last: bool,
    seed: S,
    next: F,
) -> Result<Option<S::Value>, E>
where
    S: DeserializeSeed<'de>,
    E: de::Error,
    F: FnOnce(Seed<'b, S>) -> Result<Option<S::Value>, E>,
{
    if last {
        return next(Seed { seed, budget });
    }
    let size = size_of::<S::Value>();
    budget.charge::<E>(size)?;
    let value = next(Seed { seed, budget })?;
    if value.is_none() {
        budget.refund(size);
    }
    Ok(value)
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Wrap<'_, A> {
    type Error = A::Error;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, A::Error> {
        let inner = &mut self.inner;
        let last = inner.size_hint() == Some(0);
        element(self.budget, last, seed, |s| inner.next_element_seed(s))
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Wrap<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let inner = &mut self.inner;
        let last = inner.size_hint() == Some(0);
        element(self.budget, last, seed, |s| inner.next_key_seed(s))
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        let inner = &mut self.inner;
        element(self.budget, false, seed, |s| {
            inner.next_value_seed(s).map(Some)
        })?
        .ok_or_else(|| de::Error::custom("no map value"))
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, 'b, A: EnumAccess<'de>> EnumAccess<'de> for Wrap<'b, A> {
    type Error = A::Error;
    type Variant = Wrap<'b, A::Variant>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Self::Variant), A::Error> {
        let budget = self.budget;
        let (value, variant) = self.inner.variant_seed(Seed { seed, budget })?;
        Ok((value, wrap(variant, budget)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Wrap<'_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }

    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, A::Error> {
        let budget = self.budget;
        self.inner.newtype_variant_seed(Seed { seed, budget })
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.inner.tuple_variant(len, wrap(visitor, self.budget))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.inner
            .struct_variant(fields, wrap(visitor, self.budget))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    use super::*;

    /// One byte on the wire for `Small`, 264 in memory: what a hostile
    /// state multiplies (a QP's send queue slot is such a type).
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[expect(clippy::large_enum_variant, reason = "the point of the test")]
    enum Wide {
        Small,
        Large([u64; 32]),
    }

    fn varint(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }

    /// A length prefix of `claim`, then `n` one-byte elements.
    fn claiming(claim: u64, n: usize) -> Vec<u8> {
        let mut bytes = varint(claim);
        bytes.resize(bytes.len() + n, 0);
        bytes
    }

    #[test]
    fn what_fits_decodes_as_postcard_decodes_it() {
        let state = (
            vec![Wide::Small, Wide::Large([7; 32])],
            BTreeMap::from([(1u32, "one".to_string()), (2, "two".into())]),
            Some(vec![1u8, 2, 3]),
            String::from("x"),
        );
        let bytes = postcard::to_stdvec(&state).unwrap();
        assert_eq!(
            decode::<(Vec<Wide>, BTreeMap<u32, String>, Option<Vec<u8>>, String)>(&bytes, 1 << 20)
                .unwrap(),
            state
        );
    }

    /// 64 Ki one-byte elements would take 16.5 MiB: refused at the budget,
    /// before the element past it is built.
    #[test]
    fn elements_are_charged_their_size_in_memory() {
        let n = 64 << 10;
        let bytes = claiming(n as u64, n);
        assert!(matches!(
            decode::<Vec<Wide>>(&bytes, 1 << 20),
            Err(DecodeError::OverBudget(_))
        ));
        // The same input within a budget that holds it.
        assert_eq!(
            decode::<Vec<Wide>>(&bytes, n * size_of::<Wide>())
                .unwrap()
                .len(),
            n
        );
        // Nested: every inner vector's elements count towards one budget,
        // and a map's keys and values too.
        let inner = postcard::to_stdvec(&vec![vec![0u64; 1000]; 100]).unwrap();
        assert!(matches!(
            decode::<Vec<Vec<u64>>>(&inner, 100 * 8 * 1000 - 1),
            Err(DecodeError::OverBudget(_))
        ));
        let map = postcard::to_stdvec(&(0..1000u32).map(|k| (k, 0u64)).collect::<BTreeMap<_, _>>())
            .unwrap();
        assert!(matches!(
            decode::<BTreeMap<u32, u64>>(&map, 1000 * 12 - 1),
            Err(DecodeError::OverBudget(_))
        ));
        assert!(decode::<BTreeMap<u32, u64>>(&map, 1000 * 12).is_ok());
    }

    /// Values decoded one by one within one budget share it: what one
    /// spends, the next cannot.
    #[test]
    fn decodes_within_one_budget_share_it() {
        let part = postcard::to_stdvec(&vec![0u64; 1000]).unwrap();
        let mut left = 2 * 8 * 1000;
        for _ in 0..2 {
            assert_eq!(
                decode_within::<Vec<u64>>(&part, &mut left).unwrap().len(),
                1000
            );
        }
        assert_eq!(left, 0);
        assert!(matches!(
            decode_within::<Vec<u64>>(&part, &mut left),
            Err(DecodeError::OverBudget(_))
        ));
    }

    /// A length prefix beyond the input is refused before the sequence's
    /// visitor (which would reserve room for it) runs.
    #[test]
    fn a_claim_beyond_the_input_is_refused_at_once() {
        for claim in [11, 1 << 20, u64::MAX >> 1] {
            let bytes = claiming(claim, 10);
            assert!(
                matches!(
                    decode::<Vec<Wide>>(&bytes, usize::MAX),
                    Err(DecodeError::BeyondInput)
                ),
                "claim {claim}"
            );
        }
        // Strings and byte strings cannot claim past the input either.
        let bytes = claiming(1 << 40, 10);
        assert!(decode::<String>(&bytes, usize::MAX).is_err());
        assert!(decode::<Vec<u8>>(&bytes, usize::MAX).is_err());
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = postcard::to_stdvec(&vec![1u32, 2]).unwrap();
        bytes.push(0);
        assert!(matches!(
            decode::<Vec<u32>>(&bytes, 1 << 20),
            Err(DecodeError::Trailing)
        ));
    }
}

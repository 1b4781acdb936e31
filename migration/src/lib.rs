// SPDX-License-Identifier: Apache-2.0
//! Live migration for pvrdma-vmm, modelled on cloud-hypervisor's
//! vm-migration: small traits that every stateful component implements
//! ([`Pausable`], [`Snapshottable`]), the versioned [`Snapshot`] they
//! exchange, the wire [`protocol`] between two VMMs and its
//! [`transport`]s, each of which yields a [`stream::Stream`].
//!
//! State is serde-encoded behind [`Snapshot::new`] / [`Snapshot::state`]:
//! device code never sees the encoding. The architecture named versionize
//! for this; it is unmaintained and kvm-bindings dropped its Versionize
//! support, so we keep serde and version each component's layout
//! explicitly instead (a mismatch is refused, never misread). The encoding
//! is postcard: compact (varints, no field names), with a documented,
//! stable wire format; it replaced JSON, whose text made a 4096-QP
//! device's state 7 MB and its decoding most of a migration's restore
//! time. Decoding goes through [`bounded`], so that the length prefixes of
//! a hostile snapshot cannot make it allocate more than
//! [`MAX_DECODED_BYTES`], nor reserve room for more elements than the
//! input holds.

// Guest input is hostile: no unwrap/expect outside tests (clippy.toml
// allows them in #[cfg(test)] code).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod bounded;
pub mod protocol;
pub mod stream;
#[cfg(any(test, feature = "test-pki"))]
pub mod test_pki;
#[cfg(feature = "test-utils")]
pub mod test_utils;
pub mod tls;
pub mod transport;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Errors of a migration step, named after the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum MigratableError {
    #[error("Failed to pause")]
    Pause(#[source] std::io::Error),
    #[error("Failed to resume")]
    Resume(#[source] std::io::Error),
    #[error("Failed to save the state of {0}")]
    Snapshot(String, #[source] postcard::Error),
    #[error("State of {id} is version {got}, this VMM reads version {want}")]
    Version { id: String, got: u32, want: u32 },
    #[error("Snapshot is of {got}, expected {want}")]
    WrongId { got: String, want: String },
    #[error("Snapshot is {0}, this VMM reads encoding {ENCODING}")]
    Encoding(String),
    #[error("Failed to restore {0}")]
    Restore(String, #[source] Box<dyn std::error::Error + Send + Sync>),
}

/// What [`Snapshot::to_bytes`] starts with, then [`ENCODING`] (2 bytes,
/// little-endian): a snapshot in any other encoding is refused by it.
pub const MAGIC: [u8; 6] = *b"PVSNAP";
/// The encoding of a whole snapshot, nested components included: 1 was
/// JSON (which had no header), 2 is postcard.
pub const ENCODING: u16 = 2;

/// The saved state of one component: who it is, the version of its state
/// layout, and the state itself (every field is checked again on restore:
/// a snapshot may come from another host).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub id: String,
    pub version: u32,
    /// The state, encoded; a byte string in the snapshot that nests it.
    #[serde(with = "bytes")]
    pub data: Vec<u8>,
}

/// Serde for a byte string as one (length, bytes) item rather than a
/// sequence of byte values: a VM's snapshot nests its devices' states.
/// Postcard writes a `Vec<u8>` with the same bytes either way, so a field
/// may take this without a new layout; it decodes in one step instead of
/// one call per byte.
pub mod bytes {
    use serde::de::{Error, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(data)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl Visitor<'_> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
        }
        d.deserialize_byte_buf(Bytes)
    }
}

/// A value nested in a component's state as a byte string, encoded and
/// decoded on its own: a component can compare a part of its state with
/// what it sent before, or decode a part sent ahead of the rest, without
/// knowing the encoding.
pub mod nested {
    use serde::{de::DeserializeOwned, Deserialize, Deserializer, Serialize, Serializer};

    /// Such a value's bytes inside a state: borrowed (`&[u8]`) when
    /// saved, owned (`Vec<u8>`) when read, as one byte string
    /// ([`crate::bytes`]).
    pub struct Bytes<B>(pub B);

    impl<B: AsRef<[u8]>> Serialize for Bytes<B> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            crate::bytes::serialize(self.0.as_ref(), s)
        }
    }

    impl<'de> Deserialize<'de> for Bytes<Vec<u8>> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            crate::bytes::deserialize(d).map(Bytes)
        }
    }

    /// Appends `value`'s encoding to `out`.
    pub fn encode_into<T: Serialize>(value: &T, out: &mut Vec<u8>) -> Result<(), String> {
        let taken = std::mem::take(out);
        *out = postcard::to_extend(value, taken).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// `T` from all of `bytes`, spending at most `left` of memory and
    /// taking what it spent from it (see [`crate::bounded`]).
    pub fn decode<T: DeserializeOwned>(bytes: &[u8], left: &mut usize) -> Result<T, String> {
        crate::bounded::decode_within(bytes, left).map_err(|e| e.to_string())
    }
}

/// Memory a decoded snapshot or state may take: as much as the largest
/// state the migration protocol carries ([`protocol::MAX_STATE_BYTES`]),
/// however its length prefixes multiply that (see [`bounded`]).
pub const MAX_DECODED_BYTES: usize = protocol::MAX_STATE_BYTES as usize;

/// `T` from all of `bytes` (trailing bytes are refused, as a sign of a
/// layout this VMM does not know), within [`MAX_DECODED_BYTES`].
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bounded::DecodeError> {
    bounded::decode(bytes, MAX_DECODED_BYTES)
}

impl Snapshot {
    /// The snapshot of `state`, layout `version`, of component `id`.
    pub fn new<T: Serialize>(id: &str, version: u32, state: &T) -> Result<Self, MigratableError> {
        let data =
            postcard::to_stdvec(state).map_err(|e| MigratableError::Snapshot(id.into(), e))?;
        Ok(Self {
            id: id.into(),
            version,
            data,
        })
    }

    /// The snapshot as bytes, to cross the network or sit in a file:
    /// [`MAGIC`], [`ENCODING`], then the snapshot.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data.len().saturating_add(64));
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&ENCODING.to_le_bytes());
        // A String, a u32 and a byte string always encode.
        postcard::to_extend(self, out).unwrap_or_default()
    }

    /// A snapshot from [`Snapshot::to_bytes`]' output; another encoding
    /// is refused by its header.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, MigratableError> {
        let header = MAGIC.len().saturating_add(2);
        let (magic, rest) = bytes.split_at(header.min(bytes.len()));
        match magic.split_at(MAGIC.len().min(magic.len())) {
            (m, [lo, hi]) if *m == MAGIC => {
                let encoding = u16::from_le_bytes([*lo, *hi]);
                if encoding != ENCODING {
                    return Err(MigratableError::Encoding(format!("encoding {encoding}")));
                }
            }
            _ if bytes.first() == Some(&b'{') => {
                return Err(MigratableError::Encoding(
                    "JSON, from an older VMM (encoding 1)".into(),
                ))
            }
            _ => return Err(MigratableError::Encoding("not a snapshot".into())),
        }
        decode(rest).map_err(|e| MigratableError::Restore("snapshot".into(), Box::new(e)))
    }

    /// The state of component `id` in layout `version`: refuses another
    /// component's snapshot or another version.
    pub fn state<T: DeserializeOwned>(&self, id: &str, version: u32) -> Result<T, MigratableError> {
        if self.id != id {
            return Err(MigratableError::WrongId {
                got: self.id.clone(),
                want: id.into(),
            });
        }
        if self.version != version {
            return Err(MigratableError::Version {
                id: id.into(),
                got: self.version,
                want: version,
            });
        }
        decode(&self.data).map_err(|e| MigratableError::Restore(id.into(), Box::new(e)))
    }
}

/// A component whose state can be saved and put back (live migration,
/// snapshots), as cloud-hypervisor's `Snapshottable`. The component must be
/// quiesced (paused) around both calls.
pub trait Snapshottable {
    /// Stable name of the component in a VM's snapshot.
    fn id(&self) -> String;
    fn snapshot(&mut self) -> Result<Snapshot, MigratableError>;
    fn restore(&mut self, snapshot: &Snapshot) -> Result<(), MigratableError>;
    /// What a destination could make ahead of the restore, taken while the
    /// component runs: at a migration's start, and again after its last
    /// pre-copy pass (each names what is new since the one before, such as
    /// state that may stay the same until the pause). Work that scales
    /// with the state (descriptors per object) then leaves the blackout.
    /// `None`: no such work.
    fn restore_hint(&mut self) -> Option<Snapshot> {
        None
    }
    /// Makes ahead what a source's [`Self::restore_hint`] names, before
    /// its state arrives. Only a hint: the restore must not depend on it,
    /// and what it makes is bounded by this component's own limits.
    fn prepare_restore(&mut self, _hint: &Snapshot) -> Result<(), MigratableError> {
        Ok(())
    }
    /// The migration that took [`Self::restore_hint`] ended, either way: a
    /// component whose saves left out what the hint sent ahead saves all
    /// of it again (a snapshot to a file, a later migration).
    fn forget_hint(&mut self) {}
}

/// A component that can be stopped and restarted in place: vCPUs now,
/// devices (quiesce) as migration arrives.
pub trait Pausable {
    fn pause(&mut self) -> Result<(), MigratableError> {
        Ok(())
    }
    fn resume(&mut self) -> Result<(), MigratableError> {
        Ok(())
    }
    /// Resumes while the VM's vCPUs are still parked; [`Pausable::released`]
    /// follows once they run. A device may leave until then the work that
    /// would take the CPU from them: on a host with fewer CPUs than busy
    /// threads, a migrated guest would wait for it. By default, all of
    /// `resume`.
    fn resume_parked(&mut self) -> Result<(), MigratableError> {
        self.resume()
    }
    /// The vCPUs run again after [`Pausable::resume_parked`].
    fn released(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_state_is_a_byte_string_not_byte_values() {
        let inner = Snapshot::new("dev", 1, &vec!["abc"; 100]).unwrap();
        let outer = Snapshot::new("vm", 1, &vec![inner.clone()]).unwrap();
        let bytes = outer.to_bytes();
        assert!(bytes.starts_with(b"PVSNAP\x02\x00"));
        assert!(
            bytes.len() < inner.data.len() + 32,
            "{} bytes for {} of state",
            bytes.len(),
            inner.data.len()
        );
        let back = Snapshot::from_bytes(&bytes).unwrap();
        assert_eq!(back.state::<Vec<Snapshot>>("vm", 1).unwrap(), vec![inner]);
    }

    #[test]
    fn snapshots_name_their_component_and_version() {
        let s = Snapshot::new("dev", 3, &vec![1u32, 2]).unwrap();
        assert_eq!(s.state::<Vec<u32>>("dev", 3).unwrap(), vec![1, 2]);
        for older_or_newer in [2, 4] {
            assert!(matches!(
                s.state::<Vec<u32>>("dev", older_or_newer),
                Err(MigratableError::Version { got: 3, .. })
            ));
        }
        assert!(matches!(
            s.state::<Vec<u32>>("other", 3),
            Err(MigratableError::WrongId { .. })
        ));
        // Too few bytes, or bytes left over: not the layout of `T`.
        assert!(matches!(
            s.state::<[u32; 4]>("dev", 3),
            Err(MigratableError::Restore(..))
        ));
        assert!(matches!(
            s.state::<[u32; 1]>("dev", 3),
            Err(MigratableError::Restore(..))
        ));
        assert_eq!(Snapshot::from_bytes(&s.to_bytes()).unwrap(), s);
    }

    #[test]
    fn other_encodings_are_refused_by_their_header() {
        let s = Snapshot::new("dev", 3, &vec![1u32, 2]).unwrap();
        let good = s.to_bytes();
        // What a VMM of encoding 1 wrote.
        let json = br#"{"id":"dev","version":3,"data":[1,2]}"#;
        let mut newer = good.clone();
        newer[6] = 3;
        let cases: [(&[u8], &str); 5] = [
            (json, "JSON"),
            (&newer, "encoding 3"),
            (&good[..7], "not a snapshot"),
            (b"", "not a snapshot"),
            (b"PVSNAQ\x02\x00", "not a snapshot"),
        ];
        for (bytes, what) in cases {
            match Snapshot::from_bytes(bytes) {
                Err(MigratableError::Encoding(e)) => assert!(e.contains(what), "{e}"),
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    /// Hostile snapshots: lengths beyond the input, cut input, garbage
    /// after it; refused without allocating what they claim.
    #[test]
    fn hostile_bytes_are_refused() {
        let s = Snapshot::new("dev", 3, &vec![7u64; 1000]).unwrap();
        let good = s.to_bytes();
        for cut in 0..good.len() {
            assert!(Snapshot::from_bytes(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(Snapshot::from_bytes(&trailing).is_err());
        // A state claiming 2^63 elements, and a data length of 2^63.
        let huge = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        let claim = Snapshot {
            data: huge.to_vec(),
            ..s.clone()
        };
        // Refused for the claim itself, before anything is reserved for it.
        fn beyond<T>(r: Result<T, MigratableError>) -> bool {
            match r {
                Err(MigratableError::Restore(_, e)) => matches!(
                    e.downcast_ref::<bounded::DecodeError>(),
                    Some(bounded::DecodeError::BeyondInput)
                ),
                _ => false,
            }
        }
        assert!(beyond(claim.state::<Vec<u64>>("dev", 3)));
        assert!(beyond(claim.state::<Vec<Vec<u8>>>("dev", 3)));
        // A claim just past what is left, inside a valid outer vector.
        let mut inner = vec![2, 0, 5];
        inner.extend_from_slice(&[0; 4]);
        let nested = Snapshot {
            data: inner,
            ..s.clone()
        };
        assert!(beyond(nested.state::<Vec<Vec<u64>>>("dev", 3)));
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&ENCODING.to_le_bytes());
        bytes.extend_from_slice(&[3, b'd', b'e', b'v', 3]);
        bytes.extend_from_slice(&huge);
        assert!(Snapshot::from_bytes(&bytes).is_err());
    }
}

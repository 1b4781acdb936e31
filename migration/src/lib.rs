// SPDX-License-Identifier: Apache-2.0
//! Live migration for pvrdma-vmm, modelled on cloud-hypervisor's
//! vm-migration: small traits that every stateful component implements
//! ([`Pausable`], [`Snapshottable`]), the versioned [`Snapshot`] they
//! exchange, the wire [`protocol`] between two VMMs and its
//! [`transport`]s.
//!
//! State is serde-encoded behind [`Snapshot::new`] / [`Snapshot::state`]:
//! device code never sees the encoding. The architecture named versionize
//! for this; it is unmaintained and kvm-bindings dropped its Versionize
//! support, so we keep serde and version each component's layout
//! explicitly instead (a mismatch is refused, never misread).

// Guest input is hostile: no unwrap/expect outside tests (clippy.toml
// allows them in #[cfg(test)] code).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod protocol;
#[cfg(any(test, feature = "test-pki"))]
pub mod test_pki;
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
    Snapshot(String, #[source] serde_json::Error),
    #[error("State of {id} is version {got}, this VMM reads version {want}")]
    Version { id: String, got: u32, want: u32 },
    #[error("Snapshot is of {got}, expected {want}")]
    WrongId { got: String, want: String },
    #[error("Failed to restore {0}")]
    Restore(String, #[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The saved state of one component: who it is, the version of its state
/// layout, and the state itself (JSON; every field is checked again on
/// restore: a snapshot may come from another host).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub id: String,
    pub version: u32,
    /// JSON text, embedded as it is in the snapshot's own JSON.
    #[serde(with = "raw_json")]
    pub data: Vec<u8>,
}

/// Embeds a component's JSON state as JSON rather than as an array of byte
/// values: a VM's snapshot nests its devices' snapshots, and arrays of
/// numbers made the state of a two-QP guest 760 KB, whose decoding was
/// most of a migration's restore time.
mod raw_json {
    use serde::de::Error as _;
    use serde::ser::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::value::RawValue;

    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        let text = std::str::from_utf8(data).map_err(S::Error::custom)?;
        let raw: &RawValue = serde_json::from_str(text).map_err(S::Error::custom)?;
        raw.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let raw = Box::<RawValue>::deserialize(d).map_err(D::Error::custom)?;
        Ok(raw.get().as_bytes().to_vec())
    }
}

impl Snapshot {
    /// The snapshot of `state`, layout `version`, of component `id`.
    pub fn new<T: Serialize>(id: &str, version: u32, state: &T) -> Result<Self, MigratableError> {
        let data =
            serde_json::to_vec(state).map_err(|e| MigratableError::Snapshot(id.into(), e))?;
        Ok(Self {
            id: id.into(),
            version,
            data,
        })
    }

    /// The snapshot as bytes, to cross the network or sit in a file.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Only a hand-made snapshot whose data is not JSON fails here; its
        // bytes are then empty, which `from_bytes` refuses.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A snapshot from [`Snapshot::to_bytes`]' output.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, MigratableError> {
        serde_json::from_slice(bytes)
            .map_err(|e| MigratableError::Restore("snapshot".into(), Box::new(e)))
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
        serde_json::from_slice(&self.data)
            .map_err(|e| MigratableError::Restore(id.into(), Box::new(e)))
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_state_is_embedded_as_json_not_as_byte_values() {
        let inner = Snapshot::new("dev", 1, &vec!["abc"; 100]).unwrap();
        let outer = Snapshot::new("vm", 1, &vec![inner.clone()]).unwrap();
        let bytes = outer.to_bytes();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.starts_with(
            r#"{"id":"vm","version":1,"data":[{"id":"dev","version":1,"data":["abc""#
        ));
        assert!(
            bytes.len() < inner.data.len() + 100,
            "{} bytes",
            bytes.len()
        );
        let back = Snapshot::from_bytes(&bytes).unwrap();
        assert_eq!(back.state::<Vec<Snapshot>>("vm", 1).unwrap(), vec![inner]);
        // Data that is not JSON (only a hand-made snapshot) does not encode.
        let bad = Snapshot {
            data: b"{not json".to_vec(),
            ..outer
        };
        assert!(bad.to_bytes().is_empty());
        assert!(Snapshot::from_bytes(&bad.to_bytes()).is_err());
    }

    #[test]
    fn snapshots_name_their_component_and_version() {
        let s = Snapshot::new("dev", 3, &vec![1u32, 2]).unwrap();
        assert_eq!(s.state::<Vec<u32>>("dev", 3).unwrap(), vec![1, 2]);
        assert!(matches!(
            s.state::<Vec<u32>>("dev", 4),
            Err(MigratableError::Version {
                got: 3,
                want: 4,
                ..
            })
        ));
        assert!(matches!(
            s.state::<Vec<u32>>("other", 3),
            Err(MigratableError::WrongId { .. })
        ));
        assert!(matches!(
            s.state::<String>("dev", 3),
            Err(MigratableError::Restore(..))
        ));
        assert_eq!(Snapshot::from_bytes(&s.to_bytes()).unwrap(), s);
        assert!(Snapshot::from_bytes(b"{").is_err());
    }
}

// SPDX-License-Identifier: Apache-2.0
//! Field-by-field edits of a snapshot's state, for hostile-state tests
//! (feature `test-utils`): the binary encoding has no field names, so a
//! test that names the state's type edits it as JSON and encodes it again.

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

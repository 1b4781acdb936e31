// SPDX-License-Identifier: Apache-2.0
//! Snapshots: a paused VM's configuration, RAM and state as files in a
//! directory, and the VM built back from them.

use std::io::{Read, Write};
use std::path::Path;

use api::{ActionError, ApiResponse, ResponseBody};
use vm_memory::Bytes;

use super::{all_ranges, copy_range, MigrationError, Target, CHUNK_BYTES};
use crate::config::{SerialConfig, VmConfig};
use crate::machine::{Guest, Machine, VmmError};
use crate::memory::GuestMemory;

/// Names of a snapshot's files in its directory.
const SNAPSHOT_CONFIG: &str = "config.json";
const SNAPSHOT_MEMORY: &str = "memory.ram";
/// Binary (`vm_migration::Snapshot::to_bytes`: its header names the encoding and version).
const SNAPSHOT_STATE: &str = "state.bin";
/// Where VMMs before the binary state encoding wrote it, as JSON: recognised only to refuse it
/// by name.
const OLD_SNAPSHOT_STATE: &str = "state.json";

fn file_error(path: &Path) -> impl FnOnce(std::io::Error) -> MigrationError + '_ {
    move |e| MigrationError::File(path.display().to_string(), e)
}

/// Writes a paused VM's configuration, RAM (regions back to back) and
/// state into `dir` (created if needed).
pub fn write_snapshot(
    dir: &Path,
    config: &VmConfig,
    mem: &GuestMemory,
    state: &[u8],
) -> Result<(), MigrationError> {
    std::fs::create_dir_all(dir).map_err(file_error(dir))?;
    let path = dir.join(SNAPSHOT_CONFIG);
    let json = config
        .to_json()
        .map_err(|e| MigrationError::Config(e.to_string()))?;
    std::fs::write(&path, json).map_err(file_error(&path))?;
    let path = dir.join(SNAPSHOT_MEMORY);
    let mut file = std::fs::File::create(&path).map_err(file_error(&path))?;
    let mut buf = vec![0u8; CHUNK_BYTES];
    for &(gpa, len) in all_ranges(mem).ranges() {
        copy_range(gpa, len, &mut buf, |chunk, addr| {
            mem.read_slice(chunk, addr)
                .map_err(MigrationError::Memory)?;
            file.write_all(chunk).map_err(file_error(&path))
        })?;
    }
    file.sync_all().map_err(file_error(&path))?;
    let path = dir.join(SNAPSHOT_STATE);
    std::fs::write(&path, state).map_err(file_error(&path))?;
    Ok(())
}

/// The configuration of the snapshot in `dir`.
pub fn read_snapshot_config(dir: &Path) -> Result<VmConfig, MigrationError> {
    let path = dir.join(SNAPSHOT_CONFIG);
    let bytes = std::fs::read(&path).map_err(file_error(&path))?;
    VmConfig::from_json(&bytes).map_err(|e| MigrationError::Config(e.to_string()))
}

/// Loads the snapshot in `dir` into a VM built from its configuration.
pub fn restore_snapshot<T: Target>(dir: &Path, target: &mut T) -> Result<(), MigrationError> {
    if !dir.join(SNAPSHOT_STATE).exists() && dir.join(OLD_SNAPSHOT_STATE).exists() {
        return Err(MigrationError::Restore(format!(
            "{} holds a snapshot of an older pvrdma-vmm ({OLD_SNAPSHOT_STATE}, JSON state), which \
             this version cannot restore",
            dir.display()
        )));
    }
    let path = dir.join(SNAPSHOT_MEMORY);
    let mut file = std::fs::File::open(&path).map_err(file_error(&path))?;
    let mem = target.memory();
    let ranges = all_ranges(mem);
    let expected = ranges.bytes();
    let actual = file.metadata().map_err(file_error(&path))?.len();
    if actual != expected {
        return Err(MigrationError::Config(format!(
            "{} holds {actual} bytes, the VM has {expected} bytes of RAM",
            path.display()
        )));
    }
    let mut buf = vec![0u8; CHUNK_BYTES];
    for &(gpa, len) in ranges.ranges() {
        copy_range(gpa, len, &mut buf, |chunk, addr| {
            file.read_exact(chunk).map_err(file_error(&path))?;
            mem.write_slice(chunk, addr).map_err(MigrationError::Memory)
        })?;
    }
    let path = dir.join(SNAPSHOT_STATE);
    let bytes = std::fs::read(&path).map_err(file_error(&path))?;
    target.restore(&bytes).map_err(MigrationError::Restore)
}

/// `vm.snapshot`: writes the paused `guest` into the directory of
/// `params`' `file://` URL.
pub(crate) fn take(guest: &Guest, params: &api::SnapshotParams) -> ApiResponse {
    if !guest.paused {
        return Err(ActionError::InvalidState(
            "pause the VM before taking a snapshot".into(),
        ));
    }
    let dir = vm_migration::transport::parse_file_url(&params.destination_url)
        .map_err(|e| ActionError::BadRequest(e.to_string()))?;
    let state = guest.save_state().map_err(ActionError::Failed)?;
    write_snapshot(&dir, &guest.config, &guest.mem, &state)
        .map_err(|e| ActionError::Failed(crate::error_chain(&e)))?;
    log::info!("Snapshot written to {}", dir.display());
    Ok(ResponseBody::Empty)
}

/// Builds the VM saved in snapshot directory `dir`, its console on
/// `serial`.
pub(crate) fn load(dir: &Path, serial: SerialConfig) -> Result<Machine, VmmError> {
    let mut config =
        read_snapshot_config(dir).map_err(|e| VmmError::Restore(crate::error_chain(&e)))?;
    config.serial = serial;
    let mut machine = Machine::build(config, true)?;
    restore_snapshot(dir, &mut machine).map_err(|e| VmmError::Restore(crate::error_chain(&e)))?;
    Ok(machine)
}

#[cfg(test)]
mod tests {
    use super::super::test_target::{config, Memory};
    use super::*;

    /// A snapshot directory an older VMM wrote (JSON state in state.json) is refused by name,
    /// before its memory is read.
    #[test]
    fn an_older_snapshot_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("old-snap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(OLD_SNAPSHOT_STATE), b"{}").unwrap();
        let mut target = Memory::build(config(16 << 20)).unwrap();
        let err = restore_snapshot(&dir, &mut target).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.contains("snapshot of an older pvrdma-vmm"), "{err}");
    }
}

// SPDX-License-Identifier: Apache-2.0
//! Live migration and snapshots of a VM: the source's pre-copy loop, the
//! destination's receiver and the files of a snapshot. The wire format is
//! `vm_migration::protocol`; what travels is guest RAM, the VM
//! configuration and a [`VmSnapshot`].
//!
//! Source: connect, send the configuration (the destination builds the VM
//! and opens its devices, or refuses) and each vCPU's CPUID (the
//! destination refuses one its CPU cannot give), turn on KVM dirty logging, send all
//! RAM, then pass after pass what was written meanwhile — by vCPUs (KVM's
//! log) or by devices (the VMM's own bitmap: the RDMA engine, NIC receive
//! and disk reads all write guest memory behind KVM's back) — until the
//! expected blackout fits the asked downtime. Then the control loop pauses
//! the VM and saves its state, the last dirty pages and the state go
//! across, and `Complete` hands the VM over.
//!
//! Never both: the destination runs the VM only once it has read
//! `Complete`, which the source sends only after the destination restored
//! the state, and from which on the source never resumes the VM by
//! itself. A failure before `Complete` leaves the destination nothing to
//! run and resumes the VM on the source; a failure after it (no answer)
//! leaves the source unable to tell whether the destination runs the VM,
//! so it stays paused there with a [`MigrationError::InDoubt`] error for
//! the operator, who resumes it (`vm.resume`) only if the destination
//! does not run it. A destination that does not read the whole of
//! `Complete` drops the VM.
//!
//! The roles have a module each: [`source`] (pre-copy and the switch-over),
//! [`destination`] (receive, build, restore) and [`snapshot`] (the files of
//! a snapshot); this one holds what they share: the state, the errors, the
//! progress report and guest-RAM copying.

use std::sync::{Arc, Mutex};

use api::{MigrationDirection, MigrationInfo, MigrationStatus};
use kvm_bindings::kvm_cpuid_entry2;
use serde::{Deserialize, Serialize};
use vm_memory::{GuestAddress, GuestMemoryBackend as _, GuestMemoryRegion};
use vm_migration::protocol::{MemoryRangeTable, ProtocolError};
use vm_migration::tls::TlsFiles;
use vm_migration::{MigratableError, Snapshot};

use crate::arch::state::{VcpuState, VmState};
use crate::config::VmConfig;
use crate::device_manager::DevicesSnapshot;
use crate::memory::GuestMemory;

pub mod destination;
pub mod snapshot;
pub mod source;

/// The VM in a snapshot or migration: KVM's part and every device.
#[derive(Debug, Serialize, Deserialize)]
pub struct VmSnapshot {
    pub vcpus: Vec<VcpuState>,
    pub vm: VmState,
    pub devices: DevicesSnapshot,
}

const VM_ID: &str = "vm";
/// 3: vCPUs carry their debug registers and TSC rate (postcard has no
/// defaults, so version 2 snapshots are refused by name).
/// 4: vCPUs carry the CPUID the guest booted with (a version 3 state has
/// none to check or give back, and is refused by its version).
const VM_VERSION: u32 = 4;

impl VmSnapshot {
    pub fn to_bytes(&self) -> Result<Vec<u8>, MigratableError> {
        Ok(Snapshot::new(VM_ID, VM_VERSION, self)?.to_bytes())
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, MigratableError> {
        Snapshot::from_bytes(bytes)?.state(VM_ID, VM_VERSION)
    }
}

/// The CPUID of each vCPU, as a migration's `Cpuid` request carries it
/// ahead of the memory (the same as in the state, which comes last).
#[derive(Debug, Serialize, Deserialize)]
pub struct VcpuCpuids(pub Vec<Vec<kvm_cpuid_entry2>>);

const CPUID_ID: &str = "cpuid";
const CPUID_VERSION: u32 = 1;

impl VcpuCpuids {
    pub fn to_bytes(&self) -> Result<Vec<u8>, MigratableError> {
        Ok(Snapshot::new(CPUID_ID, CPUID_VERSION, self)?.to_bytes())
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, MigratableError> {
        Snapshot::from_bytes(bytes)?.state(CPUID_ID, CPUID_VERSION)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error("Cannot connect to {0}")]
    Connect(String, #[source] std::io::Error),
    #[error("Cannot listen on {0}")]
    Listen(String, #[source] std::io::Error),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error("Failed to track dirty pages")]
    DirtyLog(#[source] crate::kvm::KvmError),
    #[error("Guest memory range {0:#x}+{1:#x} is outside guest RAM")]
    Range(u64, u64),
    #[error("Guest memory access failed")]
    Memory(#[source] vm_memory::GuestMemoryError),
    #[error("Timed out after {0} s; the VM keeps running here")]
    Timeout(u64),
    #[error("Cancelled through the API; the VM keeps running here")]
    Cancelled,
    #[error("The VM could not be paused for the switch-over: {0}")]
    Switchover(String),
    #[error("The devices' restore hints could not be taken: {0}")]
    Hints(String),
    #[error("Invalid configuration from the source: {0}")]
    Config(String),
    #[error("Failed to build the VM: {0}")]
    Build(String),
    #[error("Failed to restore the VM's state: {0}")]
    Restore(String),
    #[error("Failed to prepare the VM's restore: {0}")]
    Prepare(String),
    /// The message names the vCPU and why.
    #[error("{0}")]
    Cpuid(String),
    #[error("The source abandoned the migration")]
    Abandoned,
    #[error(
        "The destination may run the VM: it got the hand-over, its answer did not come back. \
         The VM stays paused here; if the destination does not run it, resume it here"
    )]
    InDoubt(#[source] ProtocolError),
    #[error("Snapshot I/O on {0} failed")]
    File(String, #[source] std::io::Error),
}

/// Progress shared with the control loop, which reports it in `vm.info`.
pub type Progress = Arc<Mutex<Option<MigrationInfo>>>;

pub(crate) fn update(progress: &Progress, f: impl FnOnce(&mut MigrationInfo)) {
    if let Some(info) = crate::lock(progress).as_mut() {
        f(info);
    }
}

/// A fresh report for a migration starting now.
pub fn start_info(
    direction: MigrationDirection,
    url: &str,
    status: MigrationStatus,
) -> MigrationInfo {
    MigrationInfo {
        direction,
        status,
        url: url.to_string(),
        pass: 0,
        memory_bytes: 0,
        bytes_transferred: 0,
        dirty_bytes: 0,
        dirty_rate_bytes_per_s: 0,
        bandwidth_bytes_per_s: 0,
        expected_downtime_ms: 0,
        downtime_ms: None,
        blackout: None,
        total_ms: 0,
        error: None,
    }
}

/// Copy granularity between guest RAM and the stream.
const CHUNK_BYTES: usize = 1 << 20;
const PAGE_SIZE: u64 = 4096;

/// Every byte of guest RAM, region by region.
fn all_ranges(mem: &GuestMemory) -> MemoryRangeTable {
    let mut table = MemoryRangeTable::default();
    for region in mem.iter() {
        table.push(region.start_addr().0, region.len());
    }
    table
}

/// Runs `f` over `gpa..gpa+len` in chunks of `buf`'s size.
fn copy_range(
    gpa: u64,
    len: u64,
    buf: &mut [u8],
    mut f: impl FnMut(&mut [u8], GuestAddress) -> Result<(), MigrationError>,
) -> Result<(), MigrationError> {
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        let chunk = buf.get_mut(..n).ok_or(MigrationError::Range(gpa, len))?;
        f(chunk, GuestAddress(gpa + done))?;
        done += n as u64;
    }
    Ok(())
}

/// The PEM files of an API request's `tls`.
pub fn tls_files(params: &api::TlsParams) -> TlsFiles {
    TlsFiles {
        cert: params.cert.clone(),
        key: params.key.clone(),
        ca: params.ca.clone(),
    }
}

/// What an incoming migration needs from the VMM: building a VM from a
/// configuration and restoring a state into it.
pub trait Target: Sized {
    /// Builds the VM (memory, KVM, devices) without running it.
    fn build(config: VmConfig) -> Result<Self, String>;
    fn memory(&self) -> &GuestMemory;
    /// Checks [`VcpuCpuids`] from their bytes against this host's CPUs,
    /// before the memory comes (the restore checks them again).
    fn check_cpuid(&self, cpuids: &[u8]) -> Result<(), String>;
    /// Makes ahead what the devices' restore hints (a source's `Hints`)
    /// name, before the state comes: work left out of the blackout.
    fn prepare_restore(&mut self, hints: &[u8]) -> Result<(), String>;
    /// Restores a [`VmSnapshot`] from its bytes; the VM stays stopped.
    fn restore(&mut self, state: &[u8]) -> Result<(), String>;
    /// Readies a restored VM to run at once when handed over (its vCPU
    /// threads spawned and parked), before the restore is acknowledged.
    fn prepare(&mut self) -> Result<(), String>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version 3 state (vCPUs without their CPUID) is refused by its
    /// version, not misread.
    #[test]
    fn a_state_without_cpuid_is_refused_by_its_version() {
        let old = Snapshot::new(VM_ID, 3, &Vec::<u8>::new())
            .unwrap()
            .to_bytes();
        let e = VmSnapshot::from_bytes(&old).unwrap_err().to_string();
        assert_eq!(e, "State of vm is version 3, this VMM reads version 4");
    }
}

/// A VM that is only its memory, and a configuration for it: what the
/// destination and snapshot tests build.
#[cfg(test)]
pub(crate) mod test_target {
    use std::str::FromStr;

    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use api::{MigrationDirection, MigrationStatus};

    use super::{start_info, Progress, Target};
    use crate::config::{NetConfig, SerialConfig, VmConfig};
    use crate::incoming::HostSettings;
    use crate::memory::GuestMemory;

    /// Guest memory, and the state last restored into it.
    pub(crate) struct Memory(GuestMemory, Vec<u8>);

    impl Target for Memory {
        fn build(config: VmConfig) -> Result<Self, String> {
            crate::memory::create_guest_memory(config.memory)
                .map(|m| Memory(m, Vec::new()))
                .map_err(|e| e.to_string())
        }
        fn memory(&self) -> &GuestMemory {
            &self.0
        }
        /// The CPUID [`LACKING`] is refused, any other taken.
        fn check_cpuid(&self, cpuids: &[u8]) -> Result<(), String> {
            match cpuids {
                LACKING => Err("this host lacks AVX-512".into()),
                _ => Ok(()),
            }
        }
        /// Any hints are taken (a VM of memory only has nothing to make).
        fn prepare_restore(&mut self, _hints: &[u8]) -> Result<(), String> {
            Ok(())
        }
        fn restore(&mut self, state: &[u8]) -> Result<(), String> {
            self.1 = state.to_vec();
            Ok(())
        }
        /// A VM restored from the state [`UNPREPARABLE`] cannot be readied.
        fn prepare(&mut self) -> Result<(), String> {
            match self.1.as_slice() {
                UNPREPARABLE => Err("no thread for its vCPUs".into()),
                _ => Ok(()),
            }
        }
    }

    pub(crate) const MAC: &str = "52:54:00:00:00:01";
    /// A CPUID the test target refuses.
    pub(crate) const LACKING: &[u8] = b"AVX-512";
    /// A state the test target restores and then cannot prepare to run.
    pub(crate) const UNPREPARABLE: &[u8] = b"unpreparable";

    /// A destination host that maps [`MAC`]'s TAP and takes up to 256 MiB.
    pub(crate) fn host() -> HostSettings {
        HostSettings {
            taps: [(MAC.to_owned(), "tap-dst".to_owned())].into(),
            disks: BTreeMap::new(),
            disk_dirs: Vec::new(),
            max_memory: 256 << 20,
            serial: SerialConfig::Off,
        }
    }

    pub(crate) fn progress() -> Progress {
        Arc::new(Mutex::new(Some(start_info(
            MigrationDirection::Receive,
            "tcp:",
            MigrationStatus::Listening,
        ))))
    }

    pub(crate) fn config(memory: u64) -> VmConfig {
        VmConfig {
            kernel: "/boot/vmlinux".into(),
            initramfs: None,
            cmdline: String::new(),
            cpus: 1,
            memory,
            disks: Vec::new(),
            nets: vec![NetConfig::from_str(&format!("tap=tap-src,mac={MAC}")).unwrap()],
            pvrdma: Vec::new(),
            serial: SerialConfig::Tty,
        }
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The PVRDMA PCI function (VMware 15ad:0820) of pvrdma-vmm: what the
//! unmodified Linux `vmw_pvrdma` driver and rdma-core's `libvmw_pvrdma`
//! talk to. The guest-visible ABI is `docs/pvrdma-abi.md`; its structures
//! are in the `pvrdma-abi` crate.
//!
//! # Wiring
//!
//! One PCI slot per `--pvrdma tap=NAME,mac=MAC[,gid=roce-v2|roce-v1]`:
//!
//! ```text
//! let port = Arc::new(Port::new(mac, false));                 // shared
//! let nic = Vmxnet3::new(&Vmxnet3Config { mac, multifunction: true },
//!                        port.clone(), tap, guest_mem.clone(), hooks.clone())?;
//! let rdma = Pvrdma::new(&PvrdmaConfig { gid_type, ..Default::default() },
//!                        port, guest_mem, hooks)?;            // gid: "roce-v2".parse()
//! let counters = rdma.counters();                             // for vm.counters
//! bus.add_device(slot, 0, Arc::new(Mutex::new(nic)))?;
//! bus.add_device(slot, 1, Arc::new(Mutex::new(rdma)))?;
//! ```
//!
//! The function has three BARs: BAR0 (8 KiB, 32-bit) holds the MSI-X table
//! (3 vectors: command response, async events, CQ notifications) and PBA,
//! BAR1 (4 KiB, 32-bit) the registers, BAR2 (64-bit, `max_uar` pages, 2 MiB
//! by default, not prefetchable) the UAR doorbell pages. There is no INTx
//! or MSI. `new` starts a worker thread (dropping the device stops it and
//! removes every ioeventfd). Doorbells are ioeventfds with datamatch,
//! registered through `hooks.ioevents` while memory decoding is on: one
//! eventfd per QP, two per CQ, one per SRQ, plus one device-wide; raise
//! RLIMIT_NOFILE accordingly (a registration KVM refuses is counted and
//! that doorbell exits to the VMM instead, which still works).

// Guest input is hostile: no unwrap/expect outside tests (clippy.toml
// allows them in #[cfg(test)] code).
#![deny(clippy::unwrap_used, clippy::expect_used)]

//! # Structure
//!
//! `regs` the register BAR, `dsr` the DSR handshake, `cmd` the command
//! channel with one `handle_*` per command in `objects` and `port`; `pdir`
//! page directories, `ring` rings; `uar` doorbells, `worker` the thread that
//! handles them, `events` interrupts and the event rings; [`namespace`]
//! every identifier the guest sees, deterministic and saveable for
//! migration. `sim_driver` (feature `test-utils`) simulates the guest
//! driver for tests, on the hypervisor hooks of `pci::test_utils`.

#[macro_use]
mod metrics;

mod caps;
mod cmd;
mod config;
mod datapath;
mod device;
mod dsr;
mod env;
mod error;
mod events;
pub mod namespace;
mod objects;
mod pdir;
mod port;
mod regs;
mod ring;
mod snapshot;
mod state;
mod uar;
mod worker;

// Test support (a simulated guest driver), not device code: a step that
// fails is a failed test, so it may panic.
#[cfg(feature = "test-utils")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub mod sim_driver;

pub use config::{GidType, Limits, LimitsError, PvrdmaConfig, DEFAULT_BUSY_POLL, MAX_QP};
pub use device::{Pvrdma, PvrdmaError};
pub use namespace::{IdAllocatorState, Namespace, NamespaceError, NamespaceState};
pub use worker::SpawnError;

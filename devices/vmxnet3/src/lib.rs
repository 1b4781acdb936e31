// SPDX-License-Identifier: Apache-2.0
//! VMware's vmxnet3 NIC (PCI 15ad:07b0, revision 1), as Linux's `vmxnet3`
//! driver expects it: the Ethernet function 0 of the PVRDMA slot, whose
//! netdev gives the paired `vmw_pvrdma` its GIDs, link state and RoCE
//! addresses. Frames go to and come from a [`net_port::FrameBackend`] (a
//! TAP); the MAC, link and MTU are published on the shared
//! [`net_port::Port`] that the PVRDMA function follows.
//!
//! # Wiring
//!
//! ```text
//! let tap = Arc::new(Tap::open("tap0")?);              // --net tap=tap0,mac=..
//! if let (true, Some(mtu)) = (tap.created(), mtu) {    // ..,mtu=N
//!     tap.set_mtu(mtu)?;
//! }
//! let port = Arc::new(Port::new(mac, false));          // shared with PVRDMA
//! let nic = Vmxnet3::new(&Vmxnet3Config { mac, multifunction: true },
//!                        port.clone(), tap.clone(), guest_mem, hooks)?;
//! let counters = nic.metrics();                        // for vm.counters
//! bus.add_device(slot, 0, Arc::new(Mutex::new(nic)))?; // PVRDMA at (slot, 1)
//! ```
//!
//! `new` sets the port's MAC and carrier and starts the device's worker
//! thread; dropping the device stops it. The function declares three
//! 32-bit, non-prefetchable memory BARs (0: 4 KiB interrupt masks and
//! doorbells, 1: 4 KiB registers, 2: 8 KiB MSI-X table and PBA), allocates
//! 25 MSI-X vectors from `hooks.msi` and registers the eight TX doorbells
//! (`BAR0 + 0x600 + 8q`, no datamatch) with `hooks.ioevents` while memory
//! decoding is on. There is no INTx or MSI.
//!
//! # What the guest gets
//!
//! - Probe: VRRS = revision 1, UVRS = 1, MAC from MACL/MACH, interrupt
//!   configuration AUTO (MSI-X, auto-masking), GET_LINK = the port's
//!   carrier (10 Gbps).
//! - ACTIVATE_DEV validates DriverShared and every queue descriptor (up to
//!   8 TX and 8 RX queues, ring sizes, interrupt indexes, MTU 60-9000, all
//!   rings in RAM) and reads back non-zero when anything is off.
//! - TX with checksum offload, TSO and VLAN tag insertion, handed to the
//!   host kernel through the backend's virtio-net header.
//! - RX into HEAD/BODY buffers for MTUs up to 9000; every frame goes to RX
//!   queue 0. Receive filtering is promiscuous.
//! - Link changes of the port's carrier become ECR LINK events.
//! - Per-queue statistics for GET_STATS; device counters for the VMM
//!   ([`Vmxnet3::counters`]).
//!
//! # Migration
//!
//! The device is `Pausable` and `Snapshottable`. Pausing parks the worker
//! between two batches; doorbells and backend frames wait until resume.
//! A snapshot holds the registers, interrupt and MSI-X state, statistics
//! and the queues with the device's place in every ring; `restore` checks
//! it all against guest memory, re-registers the doorbells where the
//! restored BAR 0 is and leaves the device paused. The next resume first
//! sends RARP announcements of the MAC, so switches learn the new port.
//!
//! # Testing
//!
//! `harness` (feature `test-utils`) puts the function on a real PCI bus
//! with mock hypervisor hooks and a mock backend (`test_utils`), and plays
//! the guest driver; the unit tests and the fuzz targets drive the device
//! through it.

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

#[macro_use]
mod metrics;

mod announce;
mod device;
#[cfg(any(test, feature = "test-utils"))]
pub mod harness;
mod interrupt;
mod persist;
mod regs;
mod ring;
mod rx;
mod shared;
mod stats;
#[cfg(any(test, feature = "test-utils"))]
pub mod test_utils;
mod tx;
mod worker;

pub use device::{Vmxnet3, Vmxnet3Config, Vmxnet3Error};
pub use metrics::{Counter, Vmxnet3Counters, Vmxnet3Metrics};
pub use worker::SpawnError;

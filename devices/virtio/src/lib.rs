// SPDX-License-Identifier: Apache-2.0
//! virtio-pci transport (modern, VIRTIO 1.x) and the virtio-blk device.
//!
//! The public surface is [`Block`]: a PCI function (1af4:1042) the VMM adds
//! to its bus. The transport and the device logic behind it are
//! crate-internal, joined by a small `VirtioDevice` trait so further virtio
//! devices can reuse the transport.
//!
//! # Wiring
//!
//! ```text
//! let block = Block::new(&BlockConfig { path, readonly, id }, guest_mem, hooks)?;
//! let counters = block.counters();                   // for vm.counters
//! bus.add_device(slot, 0, Arc::new(Mutex::new(block)))?;
//! ```
//!
//! `new` opens the image and starts the device's worker thread; dropping
//! the device stops it. The function declares one 32 KiB, 64-bit,
//! non-prefetchable memory BAR (BAR 0, slots 0-1) holding every virtio
//! structure and the MSI-X table; the bus places it. Two MSI-X vectors are
//! allocated from `hooks.msi` (config, queue 0); the doorbell at BAR 0 +
//! 0x3000 is registered with `hooks.ioevents` (no datamatch; the guest
//! writes 2 bytes) whenever memory decoding is on. There is no INTx.
//!
//! # Migration
//!
//! `Block` is `Pausable` (once `pause` returns, every request the worker
//! took is complete and the image is flushed; notifications wait for
//! `resume`) and `Snapshottable` (id `virtio-blk`). Restore onto a `Block`
//! created with the same `BlockConfig`, after guest memory and (by the
//! bus) the configuration space are back: an active device starts serving
//! its rings at once, from the saved queue positions.
#![deny(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod ratelimit;

mod block;
mod transport;

pub use block::{Block, BlockConfig, BlockError, DiskError, SpawnError};
pub use transport::pci::TransportError;

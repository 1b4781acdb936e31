// SPDX-License-Identifier: Apache-2.0
//! The PVRDMA PCI function (VMware 15ad:0820) of pvrdma-vmm.

mod config;
pub mod namespace;
mod pdir;
mod ring;

pub use config::{GidType, Limits, LimitsError, PvrdmaConfig};
pub use namespace::{IdAllocatorState, Namespace, NamespaceError, NamespaceState};

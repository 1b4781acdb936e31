// SPDX-License-Identifier: Apache-2.0
//! One network port shared by the functions of a converged NIC slot:
//! vmxnet3 at function 0 owns it (the guest programs its MAC and brings it
//! up), PVRDMA at function 1 follows it (port state, RoCE source MAC and
//! GIDs), exactly as a RoCE NIC shares one wire between Ethernet and RDMA.
//!
//! The wire itself is a [`FrameBackend`]: a [`Tap`] in production, which
//! every function of the port may send through.

// Guest input is hostile: no unwrap/expect outside tests (clippy.toml
// allows them in #[cfg(test)] code).
#![deny(clippy::unwrap_used, clippy::expect_used)]

mod backend;
mod port;
mod tap;
mod vlans;

pub use backend::{
    FrameBackend, VnetHdr, MAX_FRAME_LEN, VNET_HDR_F_NEEDS_CSUM, VNET_HDR_GSO_ECN,
    VNET_HDR_GSO_NONE, VNET_HDR_GSO_TCPV4, VNET_HDR_GSO_TCPV6, VNET_HDR_LEN,
};
pub use port::{Port, PortEvent, PortState};
pub use tap::{Tap, TapError};
pub use vlans::SeenVlans;

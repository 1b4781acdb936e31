// SPDX-License-Identifier: Apache-2.0
//! One network port shared by the functions of a converged NIC slot:
//! vmxnet3 at function 0 owns it (the guest programs its MAC and brings it
//! up), PVRDMA at function 1 follows it (port state, RoCE source MAC and
//! GIDs), exactly as a RoCE NIC shares one wire between Ethernet and RDMA.

mod port;

pub use port::{Port, PortEvent, PortState};

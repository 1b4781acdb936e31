// SPDX-License-Identifier: Apache-2.0
//! The RoCE transport engine of pvrdma-vmm, as a pure library: no KVM,
//! no PCI, no guest memory types, no I/O, no clocks, no threads.
//!
//! The device model feeds it work requests and received frames and gives
//! it three small capabilities (a packet sink, a completion sink and a
//! memory-region table); the engine answers with frames to send and work
//! completions. Keeping it pure makes every state machine testable on any
//! host, deterministically, with hostile input.
//!
//! # Structure
//!
//! [`opcode`] the IBA opcode table; [`hdr`] transport headers, [`psn`]
//! 24-bit sequence numbers, [`icrc`] the invariant CRC, [`net`] the
//! framing (Ethernet with an optional 802.1Q tag, then IP and UDP for
//! RoCE v2 or a GRH for RoCE v1), [`packet`] whole frames; [`verbs`] statuses,
//! opcodes, access rights and the MR/completion/packet traits; [`req`] the
//! requester's pure packet planner, [`comp`] the completer, [`resp`] the
//! responder; [`sgl`] scatter/gather over SGE lists; [`qp`] the driver
//! looping the three roles of one QP; [`metrics`] its counters.

// Guest input is hostile: no unwrap/expect outside tests (clippy.toml
// allows them in #[cfg(test)] code).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod comp;
pub mod hdr;
pub mod icrc;
pub mod metrics;
pub mod net;
pub mod opcode;
pub mod packed;
pub mod packet;
pub mod psn;
pub mod qp;
pub mod req;
pub mod resp;
pub mod sgl;
pub mod verbs;

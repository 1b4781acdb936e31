// SPDX-License-Identifier: Apache-2.0
//! The verbs opcodes a guest's code speaks, and how each guest writer turns
//! them into WQE and CQE values, written from the guest's sources (Linux's
//! `include/rdma/ib_verbs.h` and `vmw_pvrdma/pvrdma.h`, rdma-core's
//! `providers/vmw_pvrdma`) and deliberately not from the device's ABI
//! constants: a test that posts through these posts what the real driver
//! would, so a device that reads another numbering fails it.
//!
//! The kernel driver translates with `ib_wr_opcode_to_pvrdma` and
//! `pvrdma_wc_opcode_to_ib`; rdma-core casts `ibv_wr_opcode` and
//! `ibv_wc_opcode` through unchanged. The ibverbs numbers equal the kernel's
//! for every opcode below except REG_MR, which userspace cannot post.

/// Kernel `enum ib_wr_opcode` (ibverbs `enum ibv_wr_opcode` for 0-10).
pub mod wr {
    pub const RDMA_WRITE: u32 = 0;
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    pub const SEND: u32 = 2;
    pub const SEND_WITH_IMM: u32 = 3;
    pub const RDMA_READ: u32 = 4;
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    pub const LOCAL_INV: u32 = 7;
    pub const BIND_MW: u32 = 8;
    pub const SEND_WITH_INV: u32 = 9;
    pub const LSO: u32 = 10;
    pub const RDMA_READ_WITH_INV: u32 = 11;
    pub const MASKED_ATOMIC_CMP_AND_SWP: u32 = 12;
    pub const MASKED_ATOMIC_FETCH_AND_ADD: u32 = 13;
    /// Kernel only: fast registration.
    pub const REG_MR: u32 = 0x20;
}

/// Kernel `enum ib_wc_opcode` (ibverbs `enum ibv_wc_opcode` for 0-7, 128
/// and 129).
pub mod wc {
    pub const SEND: u32 = 0;
    pub const RDMA_WRITE: u32 = 1;
    pub const RDMA_READ: u32 = 2;
    pub const COMP_SWAP: u32 = 3;
    pub const FETCH_ADD: u32 = 4;
    pub const BIND_MW: u32 = 5;
    pub const LOCAL_INV: u32 = 6;
    pub const LSO: u32 = 7;
    pub const REG_MR: u32 = 8;
    pub const MASKED_COMP_SWAP: u32 = 9;
    pub const MASKED_FETCH_ADD: u32 = 10;
    pub const RECV: u32 = 128;
    pub const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// Who wrote a QP's WQEs: the kernel driver (a QP of a kernel PD) or
/// rdma-core (a QP of a user context).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    Kernel,
    User,
}

impl Writer {
    /// The WQE `opcode` this writer stores for verbs opcode `op`.
    pub fn wqe_opcode(self, op: u32) -> u32 {
        match self {
            Writer::Kernel => ib_wr_opcode_to_pvrdma(op),
            Writer::User => op,
        }
    }

    /// The verbs opcode this writer reads from a CQE's `opcode`.
    pub fn wc_opcode(self, cqe_opcode: u32) -> u32 {
        match self {
            Writer::Kernel => pvrdma_wc_opcode_to_ib(cqe_opcode),
            Writer::User => cqe_opcode,
        }
    }
}

/// The kernel driver's `ib_wr_opcode_to_pvrdma`: into `enum
/// pvrdma_wr_opcode`, PVRDMA_WR_ERROR (16) for what it cannot map.
pub fn ib_wr_opcode_to_pvrdma(op: u32) -> u32 {
    match op {
        wr::RDMA_WRITE => 0,
        wr::RDMA_WRITE_WITH_IMM => 1,
        wr::SEND => 2,
        wr::SEND_WITH_IMM => 3,
        wr::RDMA_READ => 4,
        wr::ATOMIC_CMP_AND_SWP => 5,
        wr::ATOMIC_FETCH_AND_ADD => 6,
        wr::LSO => 7,
        wr::SEND_WITH_INV => 8,
        wr::RDMA_READ_WITH_INV => 9,
        wr::LOCAL_INV => 10,
        wr::REG_MR => 11,
        wr::MASKED_ATOMIC_CMP_AND_SWP => 12,
        wr::MASKED_ATOMIC_FETCH_AND_ADD => 13,
        _ => 16,
    }
}

/// The kernel driver's `pvrdma_wc_opcode_to_ib`: from `enum
/// pvrdma_wc_opcode`, IB_WC_SEND for what it does not know (BIND_MW and
/// LSO among them).
pub fn pvrdma_wc_opcode_to_ib(op: u32) -> u32 {
    match op {
        1 => wc::RDMA_WRITE,
        2 => wc::RDMA_READ,
        3 => wc::COMP_SWAP,
        4 => wc::FETCH_ADD,
        7 => wc::LOCAL_INV,
        8 => wc::REG_MR,
        9 => wc::MASKED_COMP_SWAP,
        10 => wc::MASKED_FETCH_ADD,
        128 => wc::RECV,
        129 => wc::RECV_RDMA_WITH_IMM,
        _ => wc::SEND,
    }
}

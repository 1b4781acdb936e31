// SPDX-License-Identifier: Apache-2.0
//! Ring entries: completion queue entries, async events, CQ notifications
//! and the work request headers of the send, receive and shared receive
//! queues (ABI doc 4.2-4.6).

wire_struct! {
    /// `pvrdma_cqe`.
    pub struct Cqe = 64 {
        pub wr_id: u64,
        /// The QP handle (the guest indexes its QP table with `qp & 0xFFFF`).
        pub qp: u64,
        /// [`wc_opcode`] for the kernel, [`uverbs_wc_opcode`] for rdma-core.
        pub opcode: u32,
        /// [`wc_status`].
        pub status: u32,
        pub byte_len: u32,
        /// Big-endian.
        pub imm_data: u32,
        pub src_qp: u32,
        pub wc_flags: u32,
        pub vendor_err: u32,
        pub pkey_index: u16,
        pub slid: u16,
        pub sl: u8,
        pub dlid_path_bits: u8,
        pub port_num: u8,
        pub smac: [u8; 6],
        pub network_hdr_type: u8,
        pub reserved: [u8; 6],
    }
}

wire_struct! {
    /// `pvrdma_eqe`: one async event.
    pub struct Eqe = 8 {
        /// [`event`] type.
        pub event_type: u32,
        /// Object handle or port number.
        pub info: u32,
    }
}

wire_struct! {
    /// `pvrdma_cqne`: one CQ notification.
    pub struct Cqne = 4 {
        /// The CQ handle.
        pub info: u32,
    }
}

wire_struct! {
    /// `pvrdma_sge`.
    pub struct Sge = 16 {
        pub addr: u64,
        pub length: u32,
        pub lkey: u32,
    }
}

wire_struct! {
    /// `pvrdma_rq_wqe_hdr`, followed by `num_sge` SGEs.
    pub struct RqWqeHdr = 16 {
        pub wr_id: u64,
        pub num_sge: u32,
        /// Stale in rdma-core; ignore.
        pub total_len: u32,
    }
}

wire_struct! {
    /// `pvrdma_sq_wqe_hdr`, followed by `num_sge` SGEs.
    pub struct SqWqeHdr = 80 {
        pub wr_id: u64,
        pub num_sge: u32,
        pub total_len: u32,
        /// [`send_opcode`] from the kernel, [`uverbs_send_opcode`] above 6 from
        /// rdma-core.
        pub opcode: u32,
        /// [`send_flags`].
        pub send_flags: u32,
        /// `imm_data` (big-endian) or `invalidate_rkey`.
        pub ex: u32,
        pub reserved: u32,
        /// The `wr` union (rdma, atomic, fast_reg, ud), by opcode.
        pub wr: [u64; 6],
    }
}

/// Bytes of one SGE.
pub const SGE_SIZE: u32 = 16;

/// Stride of a send queue WQE: `next_pow2(80 + 16 * max_sge)`.
pub const fn sq_stride(max_sge: u32) -> Option<u32> {
    stride(80, max_sge)
}

/// Stride of a receive or shared receive queue WQE:
/// `next_pow2(16 + 16 * max_sge)`.
pub const fn rq_stride(max_sge: u32) -> Option<u32> {
    stride(16, max_sge)
}

const fn stride(header: u32, max_sge: u32) -> Option<u32> {
    match max_sge.checked_mul(SGE_SIZE) {
        Some(sges) => match header.checked_add(sges) {
            Some(bytes) => bytes.checked_next_power_of_two(),
            None => None,
        },
        None => None,
    }
}

/// Async event types (`pvrdma_eqe_type`, 1:1 with `ib_event_type`).
pub mod event {
    pub const CQ_ERR: u32 = 0;
    pub const QP_FATAL: u32 = 1;
    pub const QP_REQ_ERR: u32 = 2;
    pub const QP_ACCESS_ERR: u32 = 3;
    pub const COMM_EST: u32 = 4;
    pub const SQ_DRAINED: u32 = 5;
    pub const PATH_MIG: u32 = 6;
    pub const PATH_MIG_ERR: u32 = 7;
    pub const DEVICE_FATAL: u32 = 8;
    pub const PORT_ACTIVE: u32 = 9;
    pub const PORT_ERR: u32 = 10;
    pub const LID_CHANGE: u32 = 11;
    pub const PKEY_CHANGE: u32 = 12;
    pub const SM_CHANGE: u32 = 13;
    pub const SRQ_ERR: u32 = 14;
    pub const SRQ_LIMIT_REACHED: u32 = 15;
    pub const QP_LAST_WQE_REACHED: u32 = 16;
    pub const CLIENT_REREGISTER: u32 = 17;
    pub const GID_CHANGE: u32 = 18;
}

/// `ib_wc_status` values the device produces.
pub mod wc_status {
    pub const SUCCESS: u32 = 0;
    pub const LOC_LEN_ERR: u32 = 1;
    pub const LOC_QP_OP_ERR: u32 = 2;
    pub const LOC_PROT_ERR: u32 = 4;
    pub const WR_FLUSH_ERR: u32 = 5;
    pub const REM_ACCESS_ERR: u32 = 10;
    pub const GENERAL_ERR: u32 = 21;
}

/// CQE opcodes as the kernel driver reads them (`enum pvrdma_wc_opcode`,
/// mapped by `pvrdma_wc_opcode_to_ib`; ABI doc 4.4). rdma-core casts the
/// value to `ibv_wc_opcode` instead: see [`uverbs_wc_opcode`].
pub mod wc_opcode {
    pub const SEND: u32 = 0;
    pub const RDMA_WRITE: u32 = 1;
    pub const RDMA_READ: u32 = 2;
    pub const COMP_SWAP: u32 = 3;
    pub const FETCH_ADD: u32 = 4;
    pub const BIND_MW: u32 = 5;
    pub const LSO: u32 = 6;
    pub const LOCAL_INV: u32 = 7;
    pub const FAST_REG_MR: u32 = 8;
    pub const MASKED_COMP_SWAP: u32 = 9;
    pub const MASKED_FETCH_ADD: u32 = 10;
    pub const RECV: u32 = 128;
    pub const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// CQE opcodes of a user context where they differ from [`wc_opcode`]:
/// rdma-core's provider casts the CQE's value to `ibv_wc_opcode`, which
/// agrees with the ABI for 0-5, 128 and 129 only.
pub mod uverbs_wc_opcode {
    pub const LOCAL_INV: u32 = 6;
    pub const TSO: u32 = 7;
}

/// CQE `wc_flags` (kernel `ib_wc_flags` numbering; rdma-core copies the
/// value into `ibv_wc`, where only GRH and WITH_IMM mean the same).
pub mod wc_flags {
    pub const GRH: u32 = 1;
    pub const WITH_IMM: u32 = 2;
    pub const WITH_INVALIDATE: u32 = 4;
    pub const WITH_NETWORK_HDR_TYPE: u32 = 0x40;
}

/// CQE `network_hdr_type` (`rdma_network_type`).
pub mod network_type {
    /// `PVRDMA_NETWORK_ROCE_V1` (= `PVRDMA_NETWORK_IB`).
    pub const ROCE_V1: u8 = 0;
    pub const IPV4: u8 = 1;
    pub const IPV6: u8 = 2;
}

/// Send WQE opcodes as the kernel driver writes them (`enum
/// pvrdma_wr_opcode`: `ib_wr_opcode_to_pvrdma` translates every kernel WR;
/// ABI doc 4.5). rdma-core casts `ibv_wr_opcode` through instead, which
/// agrees for 0-6 only: see [`uverbs_send_opcode`].
pub mod send_opcode {
    pub const RDMA_WRITE: u32 = 0;
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    pub const SEND: u32 = 2;
    pub const SEND_WITH_IMM: u32 = 3;
    pub const RDMA_READ: u32 = 4;
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    pub const LSO: u32 = 7;
    pub const SEND_WITH_INV: u32 = 8;
    pub const RDMA_READ_WITH_INV: u32 = 9;
    pub const LOCAL_INV: u32 = 10;
    /// Kernel `IB_WR_REG_MR` (fast registration).
    pub const FAST_REG_MR: u32 = 11;
    pub const MASKED_ATOMIC_CMP_AND_SWP: u32 = 12;
    pub const MASKED_ATOMIC_FETCH_AND_ADD: u32 = 13;
    pub const BIND_MW: u32 = 14;
    pub const REG_SIG_MR: u32 = 15;
    /// What the kernel driver writes for a WR it cannot translate.
    pub const ERROR: u32 = 16;
}

/// Send WQE opcodes of a user context above 6, where rdma-core's cast of
/// `ibv_wr_opcode` differs from [`send_opcode`].
pub mod uverbs_send_opcode {
    pub const LOCAL_INV: u32 = 7;
    pub const BIND_MW: u32 = 8;
    pub const SEND_WITH_INV: u32 = 9;
    pub const TSO: u32 = 10;
}

/// Send WQE `send_flags`.
pub mod send_flags {
    pub const FENCE: u32 = 1 << 0;
    pub const SIGNALED: u32 = 1 << 1;
    pub const SOLICITED: u32 = 1 << 2;
    pub const INLINE: u32 = 1 << 3;
    pub const IP_CSUM: u32 = 1 << 4;
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::*;

    #[test]
    fn cqe_layout() {
        assert_eq!(offset_of!(Cqe, qp), 8);
        assert_eq!(offset_of!(Cqe, opcode), 16);
        assert_eq!(offset_of!(Cqe, status), 20);
        assert_eq!(offset_of!(Cqe, imm_data), 28);
        assert_eq!(offset_of!(Cqe, wc_flags), 36);
        assert_eq!(offset_of!(Cqe, pkey_index), 44);
        assert_eq!(offset_of!(Cqe, sl), 48);
        assert_eq!(offset_of!(Cqe, port_num), 50);
        assert_eq!(offset_of!(Cqe, smac), 51);
        assert_eq!(offset_of!(Cqe, network_hdr_type), 57);
    }

    #[test]
    fn wqe_layout() {
        assert_eq!(offset_of!(SqWqeHdr, opcode), 16);
        assert_eq!(offset_of!(SqWqeHdr, send_flags), 20);
        assert_eq!(offset_of!(SqWqeHdr, ex), 24);
        assert_eq!(offset_of!(SqWqeHdr, wr), 32);
        assert_eq!(offset_of!(RqWqeHdr, num_sge), 8);
        assert_eq!(offset_of!(Sge, lkey), 12);
        assert_eq!(offset_of!(Eqe, info), 4);
    }

    #[test]
    fn strides_match_abi_examples() {
        for (sges, stride) in [(0, 128), (1, 128), (3, 128), (4, 256), (11, 256), (12, 512)] {
            assert_eq!(sq_stride(sges), Some(stride), "sq {sges}");
        }
        for (sges, stride) in [(1, 32), (2, 64), (3, 64), (4, 128), (7, 128), (8, 256)] {
            assert_eq!(rq_stride(sges), Some(stride), "rq {sges}");
        }
        assert_eq!(sq_stride(u32::MAX), None);
        assert_eq!(rq_stride(0x1000_0000), None);
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The command channel: command codes, the response codes derived from
//! them, and the request/response layouts (ABI doc 3).

use crate::verbs::{PortAttr, QpAttr, SrqAttr};

/// `sizeof(union pvrdma_cmd_req)`: bytes the device reads from the slot.
pub const REQ_SIZE: usize = 184;
/// `sizeof(union pvrdma_cmd_resp)`: the most the device may write back.
pub const RESP_SIZE: usize = 176;
/// Response codes are the command code with this bit set.
pub const RESP_BIT: u32 = 1 << 31;

/// `PVRDMA_CMD_*`, in ABI order.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CmdCode {
    QueryPort = 0,
    QueryPkey = 1,
    CreatePd = 2,
    DestroyPd = 3,
    CreateMr = 4,
    DestroyMr = 5,
    CreateCq = 6,
    ResizeCq = 7,
    DestroyCq = 8,
    CreateQp = 9,
    ModifyQp = 10,
    QueryQp = 11,
    DestroyQp = 12,
    CreateUc = 13,
    DestroyUc = 14,
    CreateBind = 15,
    DestroyBind = 16,
    CreateSrq = 17,
    ModifySrq = 18,
    QuerySrq = 19,
    DestroySrq = 20,
}

/// Every command, in code order.
pub const ALL_COMMANDS: [CmdCode; 21] = [
    CmdCode::QueryPort,
    CmdCode::QueryPkey,
    CmdCode::CreatePd,
    CmdCode::DestroyPd,
    CmdCode::CreateMr,
    CmdCode::DestroyMr,
    CmdCode::CreateCq,
    CmdCode::ResizeCq,
    CmdCode::DestroyCq,
    CmdCode::CreateQp,
    CmdCode::ModifyQp,
    CmdCode::QueryQp,
    CmdCode::DestroyQp,
    CmdCode::CreateUc,
    CmdCode::DestroyUc,
    CmdCode::CreateBind,
    CmdCode::DestroyBind,
    CmdCode::CreateSrq,
    CmdCode::ModifySrq,
    CmdCode::QuerySrq,
    CmdCode::DestroySrq,
];

impl CmdCode {
    /// The `ack` the driver expects in the response (`PVRDMA_CMD_*_RESP`).
    pub const fn ack(self) -> u32 {
        self as u32 | RESP_BIT
    }
}

impl TryFrom<u32> for CmdCode {
    type Error = u32;

    fn try_from(code: u32) -> Result<Self, u32> {
        usize::try_from(code)
            .ok()
            .and_then(|i| ALL_COMMANDS.get(i).copied())
            .ok_or(code)
    }
}

wire_struct! {
    /// `pvrdma_cmd_hdr`.
    pub struct CmdHdr = 16 {
        /// Opaque key, echoed in the response.
        pub response: u64,
        pub cmd: u32,
        pub reserved: u32,
    }
}

wire_struct! {
    /// `pvrdma_cmd_resp_hdr`.
    pub struct RespHdr = 16 {
        pub response: u64,
        pub ack: u32,
        pub err: u8,
        pub reserved: [u8; 3],
    }
}

/// A request with one `u32` handle after the header (DESTROY_*,
/// CREATE_PD's `ctx_handle`, QUERY_SRQ).
macro_rules! handle_req {
    ($(#[$m:meta])* $name:ident, $field:ident) => {
        wire_struct! {
            $(#[$m])*
            pub struct $name = 24 {
                pub hdr: CmdHdr,
                pub $field: u32,
                pub reserved: u32,
            }
        }
    };
}

wire_struct! {
    pub struct QueryPortReq = 24 {
        pub hdr: CmdHdr,
        pub port_num: u8,
        pub reserved: [u8; 7],
    }
}

wire_struct! {
    pub struct QueryPortResp = 64 {
        pub hdr: RespHdr,
        pub attrs: PortAttr,
    }
}

wire_struct! {
    pub struct QueryPkeyReq = 24 {
        pub hdr: CmdHdr,
        pub port_num: u8,
        pub index: u8,
        pub reserved: [u8; 6],
    }
}

wire_struct! {
    pub struct QueryPkeyResp = 24 {
        pub hdr: RespHdr,
        pub pkey: u16,
        pub reserved: [u8; 6],
    }
}

wire_struct! {
    pub struct CreateUcReq = 24 {
        pub hdr: CmdHdr,
        /// `pfn64`; only the low half (`pfn`) before version 19.
        pub pfn64: u64,
    }
}

/// A response with one `u32` after the header.
macro_rules! handle_resp {
    ($(#[$m:meta])* $name:ident, $field:ident) => {
        wire_struct! {
            $(#[$m])*
            pub struct $name = 24 {
                pub hdr: RespHdr,
                pub $field: u32,
                pub reserved: u32,
            }
        }
    };
}

handle_resp!(CreateUcResp, ctx_handle);
handle_req!(DestroyUcReq, ctx_handle);
handle_req!(
    /// `ctx_handle` 0 creates a kernel PD.
    CreatePdReq,
    ctx_handle
);
handle_resp!(CreatePdResp, pd_handle);
handle_req!(DestroyPdReq, pd_handle);

wire_struct! {
    pub struct CreateMrReq = 56 {
        pub hdr: CmdHdr,
        /// User VA of the region (the IOVA SGEs use).
        pub start: u64,
        pub length: u64,
        /// 0 for DMA and FRMR MRs.
        pub pdir_dma: u64,
        pub pd_handle: u32,
        pub access_flags: u32,
        /// `verbs::mr_flags`.
        pub flags: u32,
        /// User MR: pages spanned; FRMR: `max_num_sg`.
        pub nchunks: u32,
    }
}

wire_struct! {
    pub struct CreateMrResp = 32 {
        pub hdr: RespHdr,
        pub mr_handle: u32,
        pub lkey: u32,
        pub rkey: u32,
        pub reserved: u32,
    }
}

handle_req!(DestroyMrReq, mr_handle);

wire_struct! {
    pub struct CreateCqReq = 40 {
        pub hdr: CmdHdr,
        pub pdir_dma: u64,
        pub ctx_handle: u32,
        /// Ring size, a power of two.
        pub cqe: u32,
        /// Pages including the header page.
        pub nchunks: u32,
        pub reserved: u32,
    }
}

wire_struct! {
    pub struct CreateCqResp = 24 {
        pub hdr: RespHdr,
        pub cq_handle: u32,
        /// The guest uses this as the ring size.
        pub cqe: u32,
    }
}

wire_struct! {
    pub struct ResizeCqReq = 24 {
        pub hdr: CmdHdr,
        pub cq_handle: u32,
        pub cqe: u32,
    }
}

handle_resp!(ResizeCqResp, cqe);
handle_req!(DestroyCqReq, cq_handle);

wire_struct! {
    pub struct CreateQpReq = 80 {
        pub hdr: CmdHdr,
        pub pdir_dma: u64,
        pub pd_handle: u32,
        pub send_cq_handle: u32,
        pub recv_cq_handle: u32,
        /// Valid if `is_srq`.
        pub srq_handle: u32,
        pub max_send_wr: u32,
        pub max_recv_wr: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
        pub lkey: u32,
        pub access_flags: u32,
        /// Header page + SQ pages + RQ pages.
        pub total_chunks: u16,
        /// SQ pages, excluding the header page.
        pub send_chunks: u16,
        pub max_atomic_arg: u16,
        pub sq_sig_all: u8,
        /// `verbs::qp_type`.
        pub qp_type: u8,
        pub is_srq: u8,
        pub reserved: [u8; 3],
    }
}

wire_struct! {
    /// CREATE_QP response before version 20: `qpn` is also the handle.
    pub struct CreateQpResp = 40 {
        pub hdr: RespHdr,
        pub qpn: u32,
        pub max_send_wr: u32,
        pub max_recv_wr: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
    }
}

wire_struct! {
    /// CREATE_QP response from version 20 (`pvrdma_cmd_create_qp_resp_v2`).
    pub struct CreateQpRespV2 = 48 {
        pub hdr: RespHdr,
        /// The wire QPN.
        pub qpn: u32,
        /// Doorbell, CQE and event handle; never 0.
        pub qp_handle: u32,
        pub max_send_wr: u32,
        pub max_recv_wr: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
        pub reserved: u32,
    }
}

wire_struct! {
    /// The largest request.
    pub struct ModifyQpReq = 184 {
        pub hdr: CmdHdr,
        pub qp_handle: u32,
        /// `verbs::qp_attr_mask` bits.
        pub attr_mask: u32,
        pub attrs: QpAttr,
    }
}

wire_struct! {
    pub struct QueryQpReq = 24 {
        pub hdr: CmdHdr,
        pub qp_handle: u32,
        pub attr_mask: u32,
    }
}

wire_struct! {
    /// The largest response.
    pub struct QueryQpResp = 176 {
        pub hdr: RespHdr,
        pub attrs: QpAttr,
    }
}

handle_req!(DestroyQpReq, qp_handle);
handle_resp!(DestroyQpResp, events_reported);

wire_struct! {
    pub struct CreateBindReq = 48 {
        pub hdr: CmdHdr,
        pub mtu: u32,
        /// 0xFFF = no VLAN.
        pub vlan: u32,
        /// GID table slot.
        pub index: u32,
        pub new_gid: [u8; 16],
        /// `dsr::GID_TYPE_*`.
        pub gid_type: u8,
        pub reserved: [u8; 3],
    }
}

wire_struct! {
    pub struct DestroyBindReq = 40 {
        pub hdr: CmdHdr,
        pub index: u32,
        pub dest_gid: [u8; 16],
        pub reserved: u32,
    }
}

wire_struct! {
    pub struct CreateSrqReq = 56 {
        pub hdr: CmdHdr,
        pub pdir_dma: u64,
        pub pd_handle: u32,
        /// Pages including the header page.
        pub nchunks: u32,
        pub attrs: SrqAttr,
        /// `verbs::SRQ_TYPE_BASIC` only.
        pub srq_type: u8,
        pub reserved: [u8; 7],
    }
}

handle_resp!(
    /// `srqn` is the SRQ handle.
    CreateSrqResp,
    srqn
);

wire_struct! {
    pub struct ModifySrqReq = 40 {
        pub hdr: CmdHdr,
        pub srq_handle: u32,
        /// `verbs::srq_attr_mask` bits.
        pub attr_mask: u32,
        pub attrs: SrqAttr,
    }
}

handle_req!(QuerySrqReq, srq_handle);

wire_struct! {
    pub struct QuerySrqResp = 32 {
        pub hdr: RespHdr,
        pub attrs: SrqAttr,
    }
}

handle_req!(DestroySrqReq, srq_handle);

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    #[test]
    fn codes_and_acks() {
        for (i, code) in ALL_COMMANDS.iter().enumerate() {
            assert_eq!(*code as usize, i);
            assert_eq!(CmdCode::try_from(i as u32), Ok(*code));
            assert_eq!(code.ack(), 0x8000_0000 + i as u32);
        }
        assert_eq!(CmdCode::try_from(21), Err(21));
        assert_eq!(CmdCode::try_from(u32::MAX), Err(u32::MAX));
        assert_eq!(CmdCode::ModifyQp.ack(), 0x8000_000a);
        assert_eq!(CmdCode::DestroySrq.ack(), 0x8000_0014);
    }

    #[test]
    fn header_layouts() {
        assert_eq!(offset_of!(CmdHdr, cmd), 8);
        assert_eq!(offset_of!(RespHdr, ack), 8);
        assert_eq!(offset_of!(RespHdr, err), 12);
    }

    #[test]
    fn request_layouts() {
        assert_eq!(offset_of!(QueryPkeyReq, index), 17);
        assert_eq!(offset_of!(CreateMrReq, pdir_dma), 32);
        assert_eq!(offset_of!(CreateMrReq, nchunks), 52);
        assert_eq!(offset_of!(CreateCqReq, nchunks), 32);
        assert_eq!(offset_of!(CreateQpReq, max_inline_data), 56);
        assert_eq!(offset_of!(CreateQpReq, total_chunks), 68);
        assert_eq!(offset_of!(CreateQpReq, send_chunks), 70);
        assert_eq!(offset_of!(CreateQpReq, sq_sig_all), 74);
        assert_eq!(offset_of!(CreateQpReq, qp_type), 75);
        assert_eq!(offset_of!(CreateQpReq, is_srq), 76);
        assert_eq!(offset_of!(ModifyQpReq, attrs), 24);
        assert_eq!(offset_of!(CreateBindReq, new_gid), 28);
        assert_eq!(offset_of!(CreateBindReq, gid_type), 44);
        assert_eq!(offset_of!(DestroyBindReq, dest_gid), 20);
        assert_eq!(offset_of!(CreateSrqReq, attrs), 32);
        assert_eq!(offset_of!(CreateSrqReq, srq_type), 48);
        assert_eq!(offset_of!(ModifySrqReq, attrs), 24);
        assert_eq!(size_of::<ModifyQpReq>(), REQ_SIZE);
    }

    #[test]
    fn response_layouts() {
        assert_eq!(offset_of!(CreateMrResp, rkey), 24);
        assert_eq!(offset_of!(CreateQpResp, max_inline_data), 36);
        assert_eq!(offset_of!(CreateQpRespV2, qp_handle), 20);
        assert_eq!(offset_of!(CreateQpRespV2, max_inline_data), 40);
        assert_eq!(size_of::<QueryQpResp>(), RESP_SIZE);
        assert_eq!(size_of::<QueryPortResp>(), 64);
    }
}

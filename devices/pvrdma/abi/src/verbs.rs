// SPDX-License-Identifier: Apache-2.0
//! Verbs attribute structures carried by commands, and the IB enumerations
//! they use (ABI doc 3.4).

wire_struct! {
    /// `pvrdma_port_attr`.
    pub struct PortAttr = 48 {
        /// [`port_state`].
        pub state: u32,
        /// [`mtu`] enum.
        pub max_mtu: u32,
        pub active_mtu: u32,
        pub gid_tbl_len: u32,
        pub port_cap_flags: u32,
        pub max_msg_sz: u32,
        pub bad_pkey_cntr: u32,
        pub qkey_viol_cntr: u32,
        pub pkey_tbl_len: u16,
        pub lid: u16,
        pub sm_lid: u16,
        pub lmc: u8,
        pub max_vl_num: u8,
        pub sm_sl: u8,
        pub subnet_timeout: u8,
        pub init_type_reply: u8,
        /// 1 = 1X, 2 = 4X, 4 = 8X, 8 = 12X.
        pub active_width: u8,
        /// 1 SDR, 2 DDR, 4 QDR, 8 FDR10, 16 FDR, 32 EDR.
        pub active_speed: u8,
        /// 5 = LinkUp, 3 = Disabled.
        pub phys_state: u8,
        pub reserved: [u8; 2],
    }
}

wire_struct! {
    /// `pvrdma_qp_cap`.
    pub struct QpCap = 24 {
        pub max_send_wr: u32,
        pub max_recv_wr: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
        pub reserved: u32,
    }
}

wire_struct! {
    /// `pvrdma_global_route`.
    pub struct GlobalRoute = 24 {
        pub dgid: [u8; 16],
        pub flow_label: u32,
        pub sgid_index: u8,
        pub hop_limit: u8,
        pub traffic_class: u8,
        pub reserved: u8,
    }
}

wire_struct! {
    /// `pvrdma_ah_attr`.
    pub struct AhAttr = 40 {
        pub grh: GlobalRoute,
        pub dlid: u16,
        pub vlan_id: u16,
        pub sl: u8,
        pub src_path_bits: u8,
        pub static_rate: u8,
        /// [`AH_FLAG_GRH`].
        pub ah_flags: u8,
        pub port_num: u8,
        pub dmac: [u8; 6],
        pub reserved: u8,
    }
}

/// `ah_flags`: the address carries a GRH (always, for RoCE).
pub const AH_FLAG_GRH: u8 = 1;

wire_struct! {
    /// `pvrdma_qp_attr`.
    pub struct QpAttr = 160 {
        /// [`qp_state`].
        pub qp_state: u32,
        pub cur_qp_state: u32,
        pub path_mtu: u32,
        pub path_mig_state: u32,
        pub qkey: u32,
        pub rq_psn: u32,
        pub sq_psn: u32,
        pub dest_qp_num: u32,
        pub qp_access_flags: u32,
        pub pkey_index: u16,
        pub alt_pkey_index: u16,
        pub en_sqd_async_notify: u8,
        pub sq_draining: u8,
        pub max_rd_atomic: u8,
        pub max_dest_rd_atomic: u8,
        pub min_rnr_timer: u8,
        pub port_num: u8,
        pub timeout: u8,
        pub retry_cnt: u8,
        pub rnr_retry: u8,
        pub alt_port_num: u8,
        pub alt_timeout: u8,
        pub reserved: [u8; 5],
        pub cap: QpCap,
        pub ah_attr: AhAttr,
        pub alt_ah_attr: AhAttr,
    }
}

wire_struct! {
    /// `pvrdma_srq_attr`.
    pub struct SrqAttr = 16 {
        pub max_wr: u32,
        pub max_sge: u32,
        pub srq_limit: u32,
        pub reserved: u32,
    }
}

/// `ib_port_state`.
pub mod port_state {
    pub const DOWN: u32 = 1;
    pub const INIT: u32 = 2;
    pub const ARMED: u32 = 3;
    pub const ACTIVE: u32 = 4;
}

/// `ib_port_phys_state` values the device reports.
pub mod phys_state {
    pub const DISABLED: u8 = 3;
    pub const LINK_UP: u8 = 5;
}

/// `ib_mtu`: 1 = 256 ... 5 = 4096 bytes.
pub mod mtu {
    pub const MTU_256: u32 = 1;
    pub const MTU_1024: u32 = 3;
    pub const MTU_4096: u32 = 5;

    /// Bytes of an MTU enum value (1..=5).
    pub const fn bytes(mtu: u32) -> Option<u32> {
        match mtu {
            1..=5 => Some(128 << mtu),
            _ => None,
        }
    }
}

/// `ib_qp_state`.
pub mod qp_state {
    pub const RESET: u32 = 0;
    pub const INIT: u32 = 1;
    pub const RTR: u32 = 2;
    pub const RTS: u32 = 3;
    pub const SQD: u32 = 4;
    pub const SQE: u32 = 5;
    pub const ERR: u32 = 6;
}

/// `pvrdma_qp_type` (CREATE_QP `qp_type`).
pub mod qp_type {
    pub const SMI: u8 = 0;
    pub const GSI: u8 = 1;
    pub const RC: u8 = 2;
    pub const UC: u8 = 3;
    pub const UD: u8 = 4;
}

/// `path_mig_state`: MIGRATED, REARM, ARMED.
pub const MAX_PATH_MIG_STATE: u32 = 2;

/// MODIFY_QP / QUERY_QP `attr_mask` bits (IB numbering).
pub mod qp_attr_mask {
    pub const STATE: u32 = 1 << 0;
    pub const CUR_STATE: u32 = 1 << 1;
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const PORT: u32 = 1 << 5;
    pub const QKEY: u32 = 1 << 6;
    pub const AV: u32 = 1 << 7;
    pub const PATH_MTU: u32 = 1 << 8;
    pub const TIMEOUT: u32 = 1 << 9;
    pub const RETRY_CNT: u32 = 1 << 10;
    pub const RNR_RETRY: u32 = 1 << 11;
    pub const RQ_PSN: u32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub const ALT_PATH: u32 = 1 << 14;
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    pub const SQ_PSN: u32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    pub const CAP: u32 = 1 << 19;
    pub const DEST_QPN: u32 = 1 << 20;
    /// Every bit the driver may send.
    pub const ALL: u32 = (1 << 21) - 1;
}

/// IB access flags (`ib_access_flags`) for MRs and QPs.
pub mod access {
    pub const LOCAL_WRITE: u32 = 1 << 0;
    pub const REMOTE_WRITE: u32 = 1 << 1;
    pub const REMOTE_READ: u32 = 1 << 2;
    pub const REMOTE_ATOMIC: u32 = 1 << 3;
    pub const MW_BIND: u32 = 1 << 4;
    pub const ZERO_BASED: u32 = 1 << 5;
    pub const ON_DEMAND: u32 = 1 << 6;
    /// `IB_ACCESS_OPTIONAL`: hints (relaxed ordering, ...) a device may ignore.
    pub const OPTIONAL: u32 = 0x3ff0_0000;
}

/// CREATE_MR `flags`.
pub mod mr_flags {
    /// Whole-GPA "DMA MR" (`local_dma_lkey` for kernel ULPs).
    pub const DMA: u32 = 1 << 0;
    /// Fast-register MR, filled later by a REG_MR work request.
    pub const FRMR: u32 = 1 << 1;
}

/// MODIFY_SRQ `attr_mask` bits (`ib_srq_attr_mask`).
pub mod srq_attr_mask {
    pub const MAX_WR: u32 = 1 << 0;
    pub const LIMIT: u32 = 1 << 1;
}

/// CREATE_SRQ `srq_type`: only `IB_SRQT_BASIC`.
pub const SRQ_TYPE_BASIC: u8 = 0;

/// IB port capability bit: the port supports the connection manager.
pub const PORT_CAP_CM_SUP: u32 = 1 << 16;

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::*;

    #[test]
    fn port_attr_layout() {
        assert_eq!(offset_of!(PortAttr, max_msg_sz), 20);
        assert_eq!(offset_of!(PortAttr, pkey_tbl_len), 32);
        assert_eq!(offset_of!(PortAttr, lmc), 38);
        assert_eq!(offset_of!(PortAttr, active_width), 43);
        assert_eq!(offset_of!(PortAttr, phys_state), 45);
    }

    #[test]
    fn qp_attr_layout() {
        assert_eq!(offset_of!(QpAttr, qp_access_flags), 32);
        assert_eq!(offset_of!(QpAttr, pkey_index), 36);
        assert_eq!(offset_of!(QpAttr, en_sqd_async_notify), 40);
        assert_eq!(offset_of!(QpAttr, alt_timeout), 50);
        assert_eq!(offset_of!(QpAttr, cap), 56);
        assert_eq!(offset_of!(QpAttr, ah_attr), 80);
        assert_eq!(offset_of!(QpAttr, alt_ah_attr), 120);
    }

    #[test]
    fn ah_attr_layout() {
        assert_eq!(offset_of!(GlobalRoute, flow_label), 16);
        assert_eq!(offset_of!(GlobalRoute, sgid_index), 20);
        assert_eq!(offset_of!(GlobalRoute, traffic_class), 22);
        assert_eq!(offset_of!(AhAttr, dlid), 24);
        assert_eq!(offset_of!(AhAttr, vlan_id), 26);
        assert_eq!(offset_of!(AhAttr, sl), 28);
        assert_eq!(offset_of!(AhAttr, ah_flags), 31);
        assert_eq!(offset_of!(AhAttr, port_num), 32);
        assert_eq!(offset_of!(AhAttr, dmac), 33);
    }

    #[test]
    fn mtu_bytes() {
        assert_eq!(mtu::bytes(mtu::MTU_256), Some(256));
        assert_eq!(mtu::bytes(mtu::MTU_1024), Some(1024));
        assert_eq!(mtu::bytes(mtu::MTU_4096), Some(4096));
        assert_eq!(mtu::bytes(0), None);
        assert_eq!(mtu::bytes(6), None);
        assert_eq!(qp_attr_mask::ALL, 0x1f_ffff);
    }
}

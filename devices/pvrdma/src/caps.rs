// SPDX-License-Identifier: Apache-2.0
//! The capabilities the device advertises in the DSR: the configured
//! limits, plus fixed properties of this implementation.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use pvrdma_abi::dsr::{atomic_ops, bmme, device_cap, DeviceCaps, MODE_ROCE};
use pvrdma_abi::regs::{PCI_DEVICE_ID_PVRDMA, PCI_VENDOR_ID_VMWARE};
use pvrdma_abi::PAGE_SIZE;

use crate::config::PvrdmaConfig;

/// Firmware version 1.0.0 (major in bits 63..32).
const FW_VERSION: u64 = 1 << 32;
const HW_VERSION: u32 = 1;
/// Outstanding RDMA READ / atomic operations per QP, either direction.
pub(crate) const MAX_RD_ATOMIC: u32 = 16;
/// The only P_Key table entry is the default full-membership key.
pub(crate) const MAX_PKEYS: u16 = 1;
pub(crate) const DEFAULT_PKEY: u16 = 0xffff;
/// `PVRDMA_MAX_FAST_REG_PAGES`: the driver's own limit on FRMR pages.
pub(crate) const MAX_FAST_REG_PAGES: u32 = 128;
/// 4.096 us * 2^15: about 134 ms, what Soft-RoCE reports.
const LOCAL_CA_ACK_DELAY: u8 = 15;
/// The device has one port, number 1.
pub(crate) const PORT_NUM: u8 = 1;

/// The EUI-64 of `mac` (universal/local bit flipped, FF:FE in the middle)
/// as the big-endian `node_guid` field: its bytes in memory are the GUID's
/// bytes in order.
pub(crate) fn node_guid(mac: [u8; 6]) -> u64 {
    let [m0, m1, m2, m3, m4, m5] = mac;
    u64::from_le_bytes([m0 ^ 0x02, m1, m2, 0xff, 0xfe, m3, m4, m5])
}

/// The capabilities for `config`, with the node GUID of `mac`.
pub(crate) fn device_caps(config: &PvrdmaConfig, mac: [u8; 6]) -> DeviceCaps {
    let l = &config.limits;
    let guid = node_guid(mac);
    DeviceCaps {
        fw_ver: FW_VERSION,
        node_guid: guid,
        sys_image_guid: guid,
        max_mr_size: l.max_mr_size,
        page_size_cap: PAGE_SIZE,
        vendor_id: u32::from(PCI_VENDOR_ID_VMWARE),
        vendor_part_id: u32::from(PCI_DEVICE_ID_PVRDMA),
        hw_ver: HW_VERSION,
        max_qp: l.max_qp,
        max_qp_wr: l.max_qp_wr,
        device_cap_flags: device_cap::SYS_IMAGE_GUID | device_cap::CURR_QP_STATE_MOD,
        max_sge: l.max_sge,
        max_sge_rd: l.max_sge,
        max_cq: l.max_cq,
        max_cqe: l.max_cqe,
        max_mr: l.max_mr,
        max_pd: l.max_pd,
        max_qp_rd_atom: MAX_RD_ATOMIC,
        max_qp_init_rd_atom: MAX_RD_ATOMIC,
        max_ah: l.max_ah,
        max_srq: l.max_srq,
        max_srq_wr: l.max_srq_wr,
        max_srq_sge: l.max_srq_sge,
        max_uar: l.max_uar,
        gid_tbl_len: l.gid_tbl_len,
        max_pkeys: MAX_PKEYS,
        local_ca_ack_delay: LOCAL_CA_ACK_DELAY,
        phys_port_cnt: PORT_NUM,
        mode: MODE_ROCE,
        atomic_ops: atomic_ops::CMP_SWAP | atomic_ops::FETCH_ADD,
        bmme_flags: bmme::LOCAL_INV | bmme::REMOTE_INV | bmme::FAST_REG_WR,
        gid_types: config.gid_type.abi(),
        max_fast_reg_page_list_len: MAX_FAST_REG_PAGES,
        ..DeviceCaps::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GidType, Limits};

    #[test]
    fn node_guid_is_eui64_big_endian() {
        let guid = node_guid([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
        assert_eq!(
            guid.to_le_bytes(),
            [0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56]
        );
    }

    /// Pitfall 9: the caps pass the driver's checks for any valid limits.
    #[test]
    fn caps_are_consistent() {
        for gid_type in [GidType::RoceV1, GidType::RoceV2] {
            for limits in [
                Limits::default(),
                Limits {
                    max_uar: 2,
                    max_qp: crate::config::MAX_QP,
                    gid_tbl_len: 256,
                    ..Limits::default()
                },
            ] {
                limits.check().unwrap_or_else(|e| panic!("{e}"));
                let caps = device_caps(
                    &PvrdmaConfig {
                        gid_type,
                        limits,
                        ..Default::default()
                    },
                    [2; 6],
                );
                assert!(caps.max_uar.is_power_of_two());
                assert!(caps.max_qp <= crate::config::MAX_QP);
                assert!(matches!(caps.gid_types, 1 | 2));
                assert_eq!((caps.mode, caps.phys_port_cnt), (0, 1));
                assert!(caps.max_pkeys >= 1);
                assert!(caps.page_size_cap & PAGE_SIZE != 0);
            }
        }
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The device shared region (`pvrdma_device_shared_region`) and the
//! capabilities the device fills in it (ABI doc 2.2, 2.3).

wire_struct! {
    /// `pvrdma_ring_page_info`: a device ring described by a page directory.
    pub struct RingPageInfo = 16 {
        /// Header page plus data pages (the driver uses 4).
        pub num_pages: u32,
        pub reserved: u32,
        /// GPA of the page directory.
        pub pdir_dma: u64,
    }
}

wire_struct! {
    /// `pvrdma_device_caps`, at DSR offset 72; written by the device when
    /// the driver writes DSRHIGH.
    pub struct DeviceCaps = 208 {
        /// major = bits 63..32, minor = 31..16, sub = 15..0.
        pub fw_ver: u64,
        /// Big-endian (EUI-64 of the port MAC).
        pub node_guid: u64,
        /// Big-endian.
        pub sys_image_guid: u64,
        pub max_mr_size: u64,
        pub page_size_cap: u64,
        pub atomic_arg_sizes: u64,
        pub ex_comp_mask: u32,
        pub device_cap_flags2: u32,
        pub max_fa_bit_boundary: u32,
        pub log_max_atomic_inline_arg: u32,
        pub vendor_id: u32,
        pub vendor_part_id: u32,
        pub hw_ver: u32,
        /// Sizes the guest's QP table; at most 0xFFFF.
        pub max_qp: u32,
        pub max_qp_wr: u32,
        pub device_cap_flags: u32,
        pub max_sge: u32,
        pub max_sge_rd: u32,
        pub max_cq: u32,
        pub max_cqe: u32,
        pub max_mr: u32,
        pub max_pd: u32,
        pub max_qp_rd_atom: u32,
        pub max_ee_rd_atom: u32,
        pub max_res_rd_atom: u32,
        pub max_qp_init_rd_atom: u32,
        pub max_ee_init_rd_atom: u32,
        pub max_ee: u32,
        pub max_rdd: u32,
        pub max_mw: u32,
        pub max_raw_ipv6_qp: u32,
        pub max_raw_ethy_qp: u32,
        pub max_mcast_grp: u32,
        pub max_mcast_qp_attach: u32,
        pub max_total_mcast_qp_attach: u32,
        pub max_ah: u32,
        pub max_fmr: u32,
        pub max_map_per_fmr: u32,
        pub max_srq: u32,
        pub max_srq_wr: u32,
        pub max_srq_sge: u32,
        /// Number of UAR pages; must be a power of two.
        pub max_uar: u32,
        pub gid_tbl_len: u32,
        pub max_pkeys: u16,
        pub local_ca_ack_delay: u8,
        /// Must be 1.
        pub phys_port_cnt: u8,
        /// [`MODE_ROCE`].
        pub mode: u8,
        /// [`atomic_ops`] bits.
        pub atomic_ops: u8,
        /// [`bmme`] bits.
        pub bmme_flags: u8,
        /// Exactly one of [`GID_TYPE_ROCE_V1`], [`GID_TYPE_ROCE_V2`].
        pub gid_types: u8,
        pub max_fast_reg_page_list_len: u32,
    }
}

wire_struct! {
    /// `pvrdma_device_shared_region` (packed in C; naturally aligned here).
    pub struct Dsr = 280 {
        /// `PVRDMA_VERSION` of the guest driver.
        pub driver_version: u32,
        pub pad: u32,
        /// dword 0 is a bitfield, see [`GosInfo`]; dword 1 is padding.
        pub gos_info: u64,
        pub cmd_slot_dma: u64,
        pub resp_slot_dma: u64,
        pub async_ring_pages: RingPageInfo,
        pub cq_ring_pages: RingPageInfo,
        /// `uar_pfn64`, or `uar_pfn` in the low half for versions < 19.
        pub uar_pfn64: u64,
        pub caps: DeviceCaps,
    }
}

/// Byte offset of `caps` in the DSR.
pub const DSR_CAPS_OFFSET: u64 = 72;

/// `gos_info` dword 0: guest OS bits, type, version and misc fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GosInfo(pub u32);

impl GosInfo {
    /// 1 = 32-bit, 2 = 64-bit.
    pub const fn bits(self) -> u32 {
        self.0 & 0x3
    }
    /// 1 = Linux.
    pub const fn os_type(self) -> u32 {
        (self.0 >> 2) & 0xf
    }
    pub const fn version(self) -> u32 {
        (self.0 >> 6) & 0xffff
    }
    pub const fn misc(self) -> u32 {
        self.0 >> 22
    }
}

/// `PVRDMA_DEVICE_MODE_ROCE`, the only mode the driver accepts.
pub const MODE_ROCE: u8 = 0;
/// `caps.gid_types` and CREATE_BIND `gid_type` values.
pub const GID_TYPE_ROCE_V1: u8 = 1;
pub const GID_TYPE_ROCE_V2: u8 = 2;

/// `caps.atomic_ops` bits.
pub mod atomic_ops {
    pub const CMP_SWAP: u8 = 1 << 0;
    pub const FETCH_ADD: u8 = 1 << 1;
    pub const MASKED_CMP_SWAP: u8 = 1 << 2;
    pub const MASKED_FETCH_ADD: u8 = 1 << 3;
}

/// `caps.bmme_flags` bits; all three enable FRWR in the guest.
pub mod bmme {
    pub const LOCAL_INV: u8 = 1 << 0;
    pub const REMOTE_INV: u8 = 1 << 1;
    pub const FAST_REG_WR: u8 = 1 << 2;
}

/// IB `device_cap_flags` bits the device may report.
pub mod device_cap {
    pub const CURR_QP_STATE_MOD: u32 = 1 << 7;
    pub const SYS_IMAGE_GUID: u32 = 1 << 11;
    pub const RC_RNR_NAK_GEN: u32 = 1 << 12;
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::*;

    #[test]
    fn dsr_layout() {
        assert_eq!(offset_of!(Dsr, driver_version), 0);
        assert_eq!(offset_of!(Dsr, gos_info), 8);
        assert_eq!(offset_of!(Dsr, cmd_slot_dma), 16);
        assert_eq!(offset_of!(Dsr, resp_slot_dma), 24);
        assert_eq!(offset_of!(Dsr, async_ring_pages), 32);
        assert_eq!(offset_of!(Dsr, cq_ring_pages), 48);
        assert_eq!(offset_of!(Dsr, uar_pfn64), 64);
        assert_eq!(offset_of!(Dsr, caps) as u64, DSR_CAPS_OFFSET);
        assert_eq!(offset_of!(RingPageInfo, pdir_dma), 8);
    }

    #[test]
    fn caps_layout() {
        for (offset, expected) in [
            (offset_of!(DeviceCaps, fw_ver), 0),
            (offset_of!(DeviceCaps, max_mr_size), 24),
            (offset_of!(DeviceCaps, page_size_cap), 32),
            (offset_of!(DeviceCaps, ex_comp_mask), 48),
            (offset_of!(DeviceCaps, vendor_id), 64),
            (offset_of!(DeviceCaps, max_qp), 76),
            (offset_of!(DeviceCaps, device_cap_flags), 84),
            (offset_of!(DeviceCaps, max_sge_rd), 92),
            (offset_of!(DeviceCaps, max_cqe), 100),
            (offset_of!(DeviceCaps, max_qp_init_rd_atom), 124),
            (offset_of!(DeviceCaps, max_total_mcast_qp_attach), 160),
            (offset_of!(DeviceCaps, max_ah), 164),
            (offset_of!(DeviceCaps, max_srq), 176),
            (offset_of!(DeviceCaps, max_uar), 188),
            (offset_of!(DeviceCaps, gid_tbl_len), 192),
            (offset_of!(DeviceCaps, max_pkeys), 196),
            (offset_of!(DeviceCaps, local_ca_ack_delay), 198),
            (offset_of!(DeviceCaps, phys_port_cnt), 199),
            (offset_of!(DeviceCaps, mode), 200),
            (offset_of!(DeviceCaps, atomic_ops), 201),
            (offset_of!(DeviceCaps, bmme_flags), 202),
            (offset_of!(DeviceCaps, gid_types), 203),
            (offset_of!(DeviceCaps, max_fast_reg_page_list_len), 204),
        ] {
            assert_eq!(offset, expected);
        }
    }

    #[test]
    fn gos_info_fields() {
        // 64-bit Linux, version 1: what the Linux driver writes.
        let gos = GosInfo(2 | 1 << 2 | 1 << 6 | 5 << 22);
        assert_eq!(
            (gos.bits(), gos.os_type(), gos.version(), gos.misc()),
            (2, 1, 1, 5)
        );
    }
}

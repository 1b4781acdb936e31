// SPDX-License-Identifier: Apache-2.0
//! BAR layout, registers, commands and register values: the one home for
//! everything Linux's `vmxnet3_defs.h` says about the register interface
//! (revision 1, which is all this device offers), and the register
//! values the function keeps itself ([`Regs`], saved by `persist`).
//!
//! | BAR | size | contents |
//! |-----|------|----------|
//! | 0 "PT" | 4 KiB | `IMR[i]` 0x000 + 8i, `TXPROD[q]` 0x600 + 8q, `RXPROD[q]` 0x800 + 8q, `RXPROD2[q]` 0xA00 + 8q |
//! | 1 "VD" | 4 KiB | VRRS, UVRS, DSAL, DSAH, CMD, MACL, MACH, ICR, ECR (0x00..=0x40, 8 apart) |
//! | 2 | 8 KiB | MSI-X table (0x0000) and PBA (0x1000), [`NUM_VECTORS`] vectors |
//!
//! Every register is 32 bits wide; other access sizes are ignored.

use serde::{Deserialize, Serialize};

/// BAR 0: interrupt masks and doorbells.
pub(crate) const PT_BAR: usize = 0;
/// BAR 1: device registers.
pub(crate) const VD_BAR: usize = 1;
/// BAR 2: MSI-X table and pending-bit array.
pub(crate) const MSIX_BAR: usize = 2;
/// `VMXNET3_PT_REG_SIZE` and `VMXNET3_VD_REG_SIZE`.
pub(crate) const REG_BAR_SIZE: u64 = 0x1000;
pub(crate) const MSIX_BAR_SIZE: u64 = 0x2000;
pub(crate) const MSIX_TABLE_OFFSET: u32 = 0;
pub(crate) const MSIX_PBA_OFFSET: u32 = 0x1000;
/// `VMXNET3_MAX_INTRS`: one per queue (8 TX + 16 RX) plus the event
/// vector. Linux asks for TX + RX + 1 (at most 17 on revision 1).
pub(crate) const NUM_VECTORS: u16 = 25;

/// `VMXNET3_REG_ALIGN`: registers are 8 bytes apart.
const REG_STRIDE: u64 = 8;
const REG_IMR: u64 = 0x000;
const REG_TXPROD: u64 = 0x600;
const REG_RXPROD: u64 = 0x800;
/// End of the `RXPROD2` array (at 0xA00, 16 queues).
const REG_PT_END: u64 = 0xa80;

/// Revision-1 limits: `VMXNET3_MAX_TX_QUEUES`, and the 8 RX queues QEMU
/// and ESXi support before revision 6 (Linux asks for at most as many as
/// it has CPUs, rounded down to a power of two, capped at 8).
pub(crate) const MAX_TX_QUEUES: usize = 8;
pub(crate) const MAX_RX_QUEUES: usize = 8;

/// A BAR 0 register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PtReg {
    /// Interrupt mask of vector `n` (1 = masked).
    Imr(usize),
    /// TX doorbell of queue `n`; the value (next to fill) is not needed,
    /// the descriptors' generation bits tell what is new.
    TxProd(usize),
    /// RX producer of either ring: only written at activation and when the
    /// device asks for it (`updateRxProd`, which it never does). Free
    /// buffers are found through their generation bits instead.
    RxProd,
}

impl PtReg {
    pub(crate) fn decode(offset: u64) -> Option<Self> {
        if !offset.is_multiple_of(REG_STRIDE) || offset >= REG_PT_END {
            return None;
        }
        let (base, reg): (u64, fn(usize) -> Self) = match offset {
            REG_IMR..REG_TXPROD => (REG_IMR, Self::Imr),
            REG_TXPROD..REG_RXPROD => (REG_TXPROD, Self::TxProd),
            _ => (REG_RXPROD, |_| Self::RxProd),
        };
        let index = usize::try_from(offset.checked_sub(base)? / REG_STRIDE).ok()?;
        match reg(index) {
            Self::Imr(i) if i >= usize::from(NUM_VECTORS) => None,
            Self::TxProd(q) if q >= MAX_TX_QUEUES => None,
            reg => Some(reg),
        }
    }
}

/// Guest-physical address of queue `queue`'s TX doorbell when BAR 0 is at
/// `bar0`.
pub(crate) fn txprod_address(bar0: u64, queue: usize) -> Option<u64> {
    let offset = u64::try_from(queue).ok()?.checked_mul(REG_STRIDE)?;
    bar0.checked_add(REG_TXPROD)?.checked_add(offset)
}

/// The BAR 1 registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VdReg {
    /// Revision report/select.
    Vrrs,
    /// UPT version report/select.
    Uvrs,
    /// DriverShared address, low and high halves.
    Dsal,
    Dsah,
    /// Command; reads return the result of the last command.
    Cmd,
    /// MAC bytes 0-3, and 4-5 in the low half.
    Macl,
    Mach,
    /// Interrupt cause, for INTx only (not offered: reads 0).
    Icr,
    /// Event acknowledgement: written bits are cleared in DriverShared `ecr`.
    Ecr,
}

impl VdReg {
    const ALL: [(u64, VdReg); 9] = [
        (0x00, VdReg::Vrrs),
        (0x08, VdReg::Uvrs),
        (0x10, VdReg::Dsal),
        (0x18, VdReg::Dsah),
        (0x20, VdReg::Cmd),
        (0x28, VdReg::Macl),
        (0x30, VdReg::Mach),
        (0x38, VdReg::Icr),
        (0x40, VdReg::Ecr),
    ];

    pub(crate) fn decode(offset: u64) -> Option<Self> {
        Self::ALL
            .iter()
            .find(|(o, _)| *o == offset)
            .map(|(_, reg)| *reg)
    }
}

/// `VRRS`: revision 1 only (bit 0), which keeps the data rings, coalescing,
/// RSS field selection and everything newer off.
pub(crate) const VRRS_REV1: u32 = 1;
/// `UVRS`: UPT version 1.
pub(crate) const UVRS_V1: u32 = 1;
/// `GET_CONF_INTR`: interrupt type AUTO (Linux picks MSI-X) and mask mode
/// AUTO (the device masks a vector when it fires).
pub(crate) const CONF_INTR_AUTO: u32 = 0;
/// `GET_LINK` answers: bit 0 up, bits 16-31 the speed in Mbps
/// (`VMXNET3_LINK_UP`, 10 Gbps).
pub(crate) const LINK_UP: u32 = 10_000 << 16 | 1;
pub(crate) const LINK_DOWN: u32 = 0;
/// What `CMD` reads after a failed ACTIVATE_DEV (the driver only tests for
/// non-zero and logs the value).
pub(crate) const ACTIVATE_FAILED: u32 = 1;

/// DriverShared `ecr` bits the device sets.
pub(crate) const ECR_RQERR: u32 = 1 << 0;
pub(crate) const ECR_TQERR: u32 = 1 << 1;
pub(crate) const ECR_LINK: u32 = 1 << 2;

/// Queue status `error` when a packet has no end (`VMXNET3_ERR_NOEOP`).
pub(crate) const ERR_NOEOP: u32 = 0x8000_0000;
/// Queue status `error` for a descriptor the device cannot use
/// (`VMXNET3_ERR_DESC_NOT_SPT`).
pub(crate) const ERR_DESC_NOT_SPT: u32 = 0x8000_0003;

/// Commands written to `CMD` (`VMXNET3_CMD_*`). SET commands read back 0
/// unless they fail; GET commands leave their answer in `CMD`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Command {
    ActivateDev = 0xcafe_0000,
    QuiesceDev = 0xcafe_0001,
    ResetDev = 0xcafe_0002,
    UpdateRxMode = 0xcafe_0003,
    UpdateMacFilters = 0xcafe_0004,
    UpdateVlanFilters = 0xcafe_0005,
    UpdateRssidt = 0xcafe_0006,
    UpdateIml = 0xcafe_0007,
    UpdatePmcfg = 0xcafe_0008,
    UpdateFeature = 0xcafe_0009,
    LoadPlugin = 0xcafe_000b,
    SetCoalesce = 0xcafe_000e,
    RegisterMemregs = 0xcafe_000f,
    SetRssFields = 0xcafe_0010,
    GetQueueStatus = 0xf00d_0000,
    GetStats = 0xf00d_0001,
    GetLink = 0xf00d_0002,
    GetPermMacLo = 0xf00d_0003,
    GetPermMacHi = 0xf00d_0004,
    GetDidLo = 0xf00d_0005,
    GetDidHi = 0xf00d_0006,
    GetDevExtraInfo = 0xf00d_0007,
    GetConfIntr = 0xf00d_0008,
    GetTxdataDescSize = 0xf00d_000a,
    GetCoalesce = 0xf00d_000b,
    GetRssFields = 0xf00d_000c,
    GetMaxQueuesConf = 0xf00d_000f,
}

impl Command {
    const ALL: [Command; 27] = [
        Command::ActivateDev,
        Command::QuiesceDev,
        Command::ResetDev,
        Command::UpdateRxMode,
        Command::UpdateMacFilters,
        Command::UpdateVlanFilters,
        Command::UpdateRssidt,
        Command::UpdateIml,
        Command::UpdatePmcfg,
        Command::UpdateFeature,
        Command::LoadPlugin,
        Command::SetCoalesce,
        Command::RegisterMemregs,
        Command::SetRssFields,
        Command::GetQueueStatus,
        Command::GetStats,
        Command::GetLink,
        Command::GetPermMacLo,
        Command::GetPermMacHi,
        Command::GetDidLo,
        Command::GetDidHi,
        Command::GetDevExtraInfo,
        Command::GetConfIntr,
        Command::GetTxdataDescSize,
        Command::GetCoalesce,
        Command::GetRssFields,
        Command::GetMaxQueuesConf,
    ];

    pub(crate) fn from_u32(value: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|c| *c as u32 == value)
    }
}

/// The registers the function keeps itself (the rest of its state is the
/// worker's too); any value is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Regs {
    /// DSAL, DSAH.
    pub(crate) dsa: [u32; 2],
    /// What CMD reads: the result of the last command.
    pub(crate) cmd_result: u32,
    /// What MACL/MACH hold.
    pub(crate) mac: [u8; 6],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar0_registers() {
        assert_eq!(PtReg::decode(0), Some(PtReg::Imr(0)));
        assert_eq!(PtReg::decode(24 * 8), Some(PtReg::Imr(24)));
        assert_eq!(PtReg::decode(25 * 8), None, "no vector 25");
        assert_eq!(PtReg::decode(0x600), Some(PtReg::TxProd(0)));
        assert_eq!(PtReg::decode(0x638), Some(PtReg::TxProd(7)));
        assert_eq!(PtReg::decode(0x640), None, "no TX queue 8");
        assert_eq!(PtReg::decode(0x800), Some(PtReg::RxProd));
        assert_eq!(PtReg::decode(0xa78), Some(PtReg::RxProd));
        assert_eq!(PtReg::decode(0xa80), None);
        assert_eq!(PtReg::decode(0x604), None, "unaligned");
        assert_eq!(txprod_address(0x1000, 3), Some(0x1618));
        assert_eq!(txprod_address(u64::MAX, 0), None);
    }

    #[test]
    fn bar1_registers_and_commands_match_vmxnet3_defs() {
        assert_eq!(VdReg::decode(0x20), Some(VdReg::Cmd));
        assert_eq!(VdReg::decode(0x40), Some(VdReg::Ecr));
        assert_eq!(VdReg::decode(0x44), None);
        // Enum order in vmxnet3_defs.h, counting from FIRST_SET / FIRST_GET.
        for (cmd, value) in [
            (Command::UpdateFeature, 0xcafe_0009),
            (Command::LoadPlugin, 0xcafe_000b),
            (Command::SetRssFields, 0xcafe_0010),
            (Command::GetConfIntr, 0xf00d_0008),
            (Command::GetRssFields, 0xf00d_000c),
        ] {
            assert_eq!(cmd as u32, value);
        }
        for cmd in Command::ALL {
            assert_eq!(Command::from_u32(cmd as u32), Some(cmd));
        }
        assert_eq!(Command::from_u32(0xcafe_000a), None, "reserved");
        assert_eq!(LINK_UP, 0x2710_0001);
    }
}

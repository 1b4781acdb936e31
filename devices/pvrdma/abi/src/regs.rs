// SPDX-License-Identifier: Apache-2.0
//! PCI identity, BARs, the register file (BAR1), interrupt vectors and the
//! UAR doorbell layout (BAR2). ABI doc sections 1, 2.1 and 5.

/// PCI vendor id of VMware.
pub const PCI_VENDOR_ID_VMWARE: u16 = 0x15ad;
/// `PCI_DEVICE_ID_VMWARE_PVRDMA`.
pub const PCI_DEVICE_ID_PVRDMA: u16 = 0x0820;
/// `PCI_DEVICE_ID_VMWARE_VMXNET3`: the function 0 the driver pairs with.
pub const PCI_DEVICE_ID_VMXNET3: u16 = 0x07b0;

/// `pvrdma_pci_resource`: BAR0 holds the MSI-X table and PBA.
pub const BAR_MSIX: usize = 0;
/// BAR1: the device registers.
pub const BAR_REG: usize = 1;
/// BAR2: UAR (doorbell) pages, one 4 KiB page per user context.
pub const BAR_UAR: usize = 2;

/// Device API versions (`VERSION` register, `driver_version` in the DSR).
pub mod version {
    /// RoCE v1 only.
    pub const BASE: u32 = 17;
    /// RoCE v2 capable; honours `max_sge_rd` and `max_fast_reg_page_list_len`.
    pub const ROCEV2: u32 = 18;
    /// 64-bit UAR PFNs in the DSR and CREATE_UC.
    pub const PPN64: u32 = 19;
    /// CREATE_QP responses carry a `qp_handle` besides the QPN.
    pub const QP_HANDLE: u32 = 20;
}

/// Who may access a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Access {
    pub const fn readable(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }

    pub const fn writable(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// The 32-bit registers of BAR1 (`PVRDMA_REG_*`), by byte offset.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reg {
    /// Device API version, read once at probe.
    Version = 0x00,
    /// Low half of the DSR GPA; written first.
    DsrLow = 0x04,
    /// High half of the DSR GPA; the device loads the DSR on this write.
    DsrHigh = 0x08,
    /// Device control, one of [`Ctl`].
    Ctl = 0x0c,
    /// Writing 0 executes the command in the command slot.
    Request = 0x10,
    /// Status of the last CTL or REQUEST write; non-zero means failure.
    Err = 0x14,
    /// Interrupt cause, [`icr`] bits; read-to-clear.
    Icr = 0x18,
    /// Interrupt mask; non-zero suppresses every interrupt.
    Imr = 0x1c,
    /// MAC bytes 0-3 (unused by Linux).
    MacLow = 0x20,
    /// MAC bytes 4-5 (unused by Linux).
    MacHigh = 0x24,
}

/// Every register with its access rights: the one table the device
/// decodes BAR1 accesses with.
pub const REGISTERS: [(Reg, Access); 10] = [
    (Reg::Version, Access::Read),
    (Reg::DsrLow, Access::Write),
    (Reg::DsrHigh, Access::Write),
    (Reg::Ctl, Access::Write),
    (Reg::Request, Access::Write),
    (Reg::Err, Access::Read),
    (Reg::Icr, Access::Read),
    (Reg::Imr, Access::ReadWrite),
    (Reg::MacLow, Access::ReadWrite),
    (Reg::MacHigh, Access::ReadWrite),
];

impl Reg {
    /// The register at byte `offset` of BAR1, with its access rights.
    pub fn at(offset: u64) -> Option<(Reg, Access)> {
        REGISTERS
            .iter()
            .copied()
            .find(|(reg, _)| u64::from(*reg as u32) == offset)
    }

    pub const fn offset(self) -> u64 {
        self as u32 as u64
    }
}

/// Values of the CTL register (`PVRDMA_DEVICE_CTL_*`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ctl {
    /// Once at probe, after the caps were read.
    Activate = 0,
    /// On every netdev UP.
    Unquiesce = 1,
    /// At driver removal: drop every resource and mapping.
    Reset = 2,
}

impl TryFrom<u32> for Ctl {
    type Error = u32;

    fn try_from(value: u32) -> Result<Self, u32> {
        match value {
            0 => Ok(Ctl::Activate),
            1 => Ok(Ctl::Unquiesce),
            2 => Ok(Ctl::Reset),
            other => Err(other),
        }
    }
}

/// The MSI-X vectors the driver requests (`pvrdma_intr_vector`).
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vector {
    /// A command response is in the response slot.
    Response = 0,
    /// Entries were added to the async event ring.
    Async = 1,
    /// Entries were added to the CQ notification ring.
    Cq = 2,
}

/// Number of MSI-X vectors (`PVRDMA_MAX_INTERRUPTS`).
pub const NUM_VECTORS: u16 = 3;

/// ICR cause bits: bit n mirrors vector n.
pub mod icr {
    pub const RESPONSE: u32 = 1 << 0;
    pub const ASYNC: u32 = 1 << 1;
    pub const CQ: u32 = 1 << 2;
}

/// One UAR page: the doorbell offsets and the flag bits ORed into the
/// 24-bit object handle written there (ABI doc 5.1).
pub mod uar {
    /// QP doorbell: `qp_handle | SEND` or `qp_handle | RECV`.
    pub const QP_OFFSET: u64 = 0x0;
    /// CQ doorbell: `cq_handle | ARM`, `| ARM_SOL` or `| POLL`.
    pub const CQ_OFFSET: u64 = 0x4;
    /// SRQ doorbell: `srq_handle | SRQ_RECV`.
    pub const SRQ_OFFSET: u64 = 0x8;

    pub const QP_SEND: u32 = 1 << 30;
    pub const QP_RECV: u32 = 1 << 31;
    pub const CQ_ARM: u32 = 1 << 30;
    pub const CQ_ARM_SOL: u32 = 1 << 29;
    pub const CQ_POLL: u32 = 1 << 31;
    pub const SRQ_RECV: u32 = 1 << 30;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_table_matches_abi() {
        let offsets: Vec<u64> = REGISTERS.iter().map(|(r, _)| r.offset()).collect();
        assert_eq!(
            offsets,
            [0x00, 0x04, 0x08, 0x0c, 0x10, 0x14, 0x18, 0x1c, 0x20, 0x24]
        );
        assert_eq!(Reg::at(0x14), Some((Reg::Err, Access::Read)));
        assert_eq!(Reg::at(0x08), Some((Reg::DsrHigh, Access::Write)));
        assert_eq!(Reg::at(0x28), None);
        assert_eq!(Reg::at(0x02), None);
        assert!(Access::ReadWrite.readable() && Access::ReadWrite.writable());
        assert!(!Access::Write.readable() && !Access::Read.writable());
    }

    #[test]
    fn ctl_values() {
        assert_eq!(Ctl::try_from(0), Ok(Ctl::Activate));
        assert_eq!(Ctl::try_from(1), Ok(Ctl::Unquiesce));
        assert_eq!(Ctl::try_from(2), Ok(Ctl::Reset));
        assert_eq!(Ctl::try_from(3), Err(3));
    }

    #[test]
    fn icr_bits_mirror_vectors() {
        assert_eq!(icr::RESPONSE, 1 << Vector::Response as u32);
        assert_eq!(icr::ASYNC, 1 << Vector::Async as u32);
        assert_eq!(icr::CQ, 1 << Vector::Cq as u32);
        assert_eq!(NUM_VECTORS, 3);
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The verbs-level vocabulary the engine shares with the device model:
//! work-request opcodes, work-completion opcodes and IBTA status codes
//! (numbered as `ib_wc_status`/`ib_wc_opcode`, which the PVRDMA CQE passes
//! through unchanged), MR access rights, and the small traits through
//! which the engine reaches memory regions and emits completions.
//!
//! The engine never trusts a key: [`check_mr`] validates key state, PD,
//! access rights and bounds against the caller's own table for every
//! access, local or remote.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use bitflags::bitflags;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::packet::{Located, Payload};

/// Work completion status (`ib_wc_status`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WcStatus {
    /// Success.
    Success = 0,
    /// Local length error (receive buffer too small).
    LocLenErr = 1,
    /// Local QP operation error.
    LocQpOpErr = 2,
    /// Local protection error (lkey, bounds, rights).
    LocProtErr = 4,
    /// Flushed because the QP is in the error state.
    WrFlushErr = 5,
    /// Local access error.
    LocAccessErr = 8,
    /// Remote invalid request (NAK invalid request).
    RemInvReqErr = 9,
    /// Remote access error (NAK remote access).
    RemAccessErr = 10,
    /// Remote operational error.
    RemOpErr = 11,
    /// Transport retry counter exceeded.
    RetryExcErr = 12,
    /// RNR retry counter exceeded.
    RnrRetryExcErr = 13,
    /// General error.
    GeneralErr = 21,
}

/// Work completion opcode. The engine's own: the device maps it to what
/// its guest reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WcOpcode {
    /// SEND (any flavour).
    Send,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA READ.
    RdmaRead,
    /// Compare and swap.
    CompSwap,
    /// Fetch and add.
    FetchAdd,
    /// Local invalidate.
    LocalInv,
    /// Fast registration.
    RegMr,
    /// Receive.
    Recv,
    /// Receive of an RDMA WRITE with immediate.
    RecvRdmaWithImm,
}

/// Send work request opcode. The engine's own: the device decodes what its
/// guest writes into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WrOpcode {
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA WRITE with immediate.
    RdmaWriteWithImm,
    /// SEND.
    Send,
    /// SEND with immediate.
    SendWithImm,
    /// RDMA READ.
    RdmaRead,
    /// Atomic compare and swap.
    AtomicCmpAndSwp,
    /// Atomic fetch and add.
    AtomicFetchAndAdd,
    /// Local invalidate.
    LocalInv,
    /// SEND with invalidate.
    SendWithInv,
    /// Fast registration (`IB_WR_REG_MR`).
    RegMr,
}

impl WrOpcode {
    /// RDMA READ and atomics: the peer answers with data, not just an ACK,
    /// and keeps the result for replay.
    pub const fn needs_response(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }

    /// Completion opcode of a send WR.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => WcOpcode::Send,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            WrOpcode::LocalInv => WcOpcode::LocalInv,
            WrOpcode::RegMr => WcOpcode::RegMr,
        }
    }
}

bitflags! {
    /// MR access rights (`ib_access_flags`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Access: u32 {
        /// Local write.
        const LOCAL_WRITE = 1;
        /// Remote write.
        const REMOTE_WRITE = 2;
        /// Remote read.
        const REMOTE_READ = 4;
        /// Remote atomic.
        const REMOTE_ATOMIC = 8;
    }
}

/// Serde of [`Access`] as its bits; unknown bits are refused.
pub mod access_bits {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    use super::Access;

    pub fn serialize<S: Serializer>(access: &Access, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(access.bits())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Access, D::Error> {
        let bits = u32::deserialize(d)?;
        Access::from_bits(bits).ok_or_else(|| D::Error::custom("unknown access bits"))
    }
}

/// What the caller's MR table says about a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrInfo {
    /// Protection domain handle.
    pub pd: u32,
    /// Rights granted.
    pub access: Access,
    /// First valid IOVA.
    pub iova: u64,
    /// Length in bytes.
    pub len: u64,
}

/// A memory error reported by the caller's MR table.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error("Memory access failed")]
pub struct MemError;

/// The caller's memory regions: the device model implements it over guest
/// memory, tests over a `Vec<u8>`. Keys are looked up here on every use.
pub trait MrTable {
    /// The MR with this lkey or rkey, if it exists and is valid.
    fn lookup(&self, key: u32) -> Option<MrInfo>;
    /// Reads `buf.len()` bytes at `iova` of the MR `key` (already checked).
    fn read(&self, key: u32, iova: u64, buf: &mut [u8]) -> Result<(), MemError>;
    /// Writes `data` at `iova` of the MR `key` (already checked).
    fn write(&mut self, key: u32, iova: u64, data: &[u8]) -> Result<(), MemError>;
    /// Writes `data`'s pieces one after the other from `iova` of the MR
    /// `key` (already checked for all of them), as [`MrTable::write`] of
    /// each piece does.
    fn write_payload(&mut self, key: u32, iova: u64, data: Payload<'_>) -> Result<(), MemError> {
        let mut at = iova;
        for piece in data.pieces() {
            self.write(key, at, piece)?;
            at = at.saturating_add(piece.len() as u64);
        }
        Ok(())
    }
    /// Invalidates `key` (LOCAL_INV, SEND_WITH_INV); false if it is not
    /// an invalidatable key of this PD.
    fn invalidate(&mut self, key: u32, pd: u32) -> bool;
    /// Executes a fast registration (REG_MR) of PD `pd`; false if the MR
    /// cannot take it (unknown, wrong PD, still valid, page list too long).
    fn fast_reg(&mut self, fr: &FastReg, pd: u32) -> bool;
    /// Appends to `out` the runs of `[iova, iova + len)` of the MR `key`
    /// (already checked) in the memory a same-host peer maps (see
    /// [`PacketSink::shares_memory`]), in order ([`Located::push`]); an
    /// error where there is none (the default) or `out` is full.
    fn locate(
        &self,
        _key: u32,
        _iova: u64,
        _len: usize,
        _out: &mut Located,
    ) -> Result<(), MemError> {
        Err(MemError)
    }
}

/// The operands of a fast registration WQE (`IB_WR_REG_MR`): the page
/// list stays in guest memory until the requester reaches the WQE, so
/// registrations happen in send-queue order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FastReg {
    /// The MR's new key (same index, new key byte).
    pub key: u32,
    /// First IOVA of the registration.
    pub iova: u64,
    /// Length in bytes.
    pub len: u64,
    /// Rights (`ib_access_flags`).
    pub access: u32,
    /// Guest address of the page list's page directory.
    pub page_list: u64,
    /// Entries of the page list.
    pub pages: u32,
}

/// Why an MR access was refused.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum MrCheckError {
    /// No such (valid) key.
    #[error("Unknown or invalid key {0:#x}")]
    BadKey(u32),
    /// The MR belongs to another PD.
    #[error("Key {0:#x} belongs to another PD")]
    WrongPd(u32),
    /// The MR lacks a required right.
    #[error("Key {0:#x} lacks access {1:?}")]
    NoAccess(u32, Access),
    /// The range is not inside the MR (or overflows).
    #[error("Range outside key {0:#x}")]
    OutOfBounds(u32),
}

/// Checks that `[iova, iova+len)` of `key` may be accessed with `need`
/// rights from PD `pd` (IBA 10.6.3 / 9.7.5.1.2 for remote keys).
pub fn check_mr(
    table: &dyn MrTable,
    key: u32,
    pd: u32,
    iova: u64,
    len: u64,
    need: Access,
) -> Result<MrInfo, MrCheckError> {
    let mr = table.lookup(key).ok_or(MrCheckError::BadKey(key))?;
    if mr.pd != pd {
        return Err(MrCheckError::WrongPd(key));
    }
    if !mr.access.contains(need) {
        return Err(MrCheckError::NoAccess(key, need));
    }
    let end = iova
        .checked_add(len)
        .ok_or(MrCheckError::OutOfBounds(key))?;
    let mr_end = mr
        .iova
        .checked_add(mr.len)
        .ok_or(MrCheckError::OutOfBounds(key))?;
    if iova < mr.iova || end > mr_end {
        return Err(MrCheckError::OutOfBounds(key));
    }
    Ok(mr)
}

/// A scatter/gather element of a WQE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sge {
    /// IOVA in the MR.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key.
    pub lkey: u32,
}

/// A work completion, before the device maps it into a `pvrdma_cqe`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkCompletion {
    /// WR id copied from the WQE.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode.
    pub opcode: WcOpcode,
    /// Bytes received (receives) or transferred.
    pub byte_len: u32,
    /// Immediate data (with `WITH_IMM`) or invalidated rkey (`WITH_INV`).
    pub imm_or_inv: Option<ImmOrInv>,
    /// Local QPN.
    pub qpn: u32,
    /// Source QPN (UD/GSI receives).
    pub src_qpn: u32,
    /// Where a UD/GSI receive came from (the GRH area's network type).
    pub ud_src: Option<UdSource>,
    /// A receive whose message had the solicited event bit (BTH SE) set:
    /// it wakes a CQ armed for solicited completions only.
    #[serde(default)]
    pub solicited: bool,
}

/// The sender of a UD/GSI receive, for the CQE's `smac` and
/// `network_hdr_type` (needed to parse the GRH area).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UdSource {
    /// RoCE v2 over IPv6 (else IPv4); for RoCE v1 whether the source GID
    /// is not IPv4-mapped.
    pub ipv6: bool,
    /// Source MAC of the frame.
    pub smac: [u8; 6],
    /// A RoCE v1 frame: the GRH area holds its GRH.
    pub roce_v1: bool,
}

/// Immediate data or an invalidated key of a receive completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImmOrInv {
    /// `IB_WC_WITH_IMM`.
    Imm(u32),
    /// `IB_WC_WITH_INVALIDATE`.
    Inv(u32),
}

/// Where completions go (the device maps them into its CQ rings).
pub trait CompletionSink {
    /// Pushes one completion for the send (`send == true`) or receive queue.
    fn complete(&mut self, wc: WorkCompletion, send: bool);
}

/// Where outgoing frames go.
pub trait PacketSink {
    /// Sends one frame, built unsealed: [`crate::packet::seal`] it if it
    /// goes onto a wire.
    fn send(&mut self, frame: Vec<u8>);

    /// Sends a frame of `len` bytes that `write` writes in place; false,
    /// and nothing sent, when `write` fails. A sink that can have it
    /// written where it goes (a same-host ring) saves a copy of it; this
    /// default builds it in a buffer and [`PacketSink::send`]s that.
    fn send_in_place(&mut self, len: usize, write: &mut dyn FnMut(&mut [u8]) -> bool) -> bool {
        crate::packet::build_in_buffer(len, write).is_some_and(|frame| {
            self.send(frame);
            true
        })
    }

    /// Whether the peer maps our memory and copies payloads from it
    /// itself (the same-host channel's one-copy path): then a frame with
    /// payload may be sent as [`PacketSink::send_described`].
    fn shares_memory(&self) -> bool {
        false
    }

    /// Sends a frame of `len` bytes that `write` writes in place, built
    /// for an empty payload, that stands for the `payload_len` bytes
    /// `located` (runs from [`MrTable::locate`], in the MRs of its keys);
    /// false, and nothing sent, when it cannot (the caller then sends the
    /// payload itself).
    fn send_described(
        &mut self,
        _len: usize,
        _located: &Located,
        _payload_len: usize,
        _write: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> bool {
        false
    }
}

/// One MR over a byte vector, for the role tests: key 1, PD 0, IOVA 0,
/// every right.
#[cfg(test)]
pub(crate) struct TestMr(pub Vec<u8>);

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
impl MrTable for TestMr {
    fn lookup(&self, key: u32) -> Option<MrInfo> {
        (key == 1).then_some(MrInfo {
            pd: 0,
            access: Access::all(),
            iova: 0,
            len: self.0.len() as u64,
        })
    }
    fn read(&self, _: u32, iova: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let i = iova as usize;
        buf.copy_from_slice(&self.0[i..i + buf.len()]);
        Ok(())
    }
    fn write(&mut self, _: u32, iova: u64, data: &[u8]) -> Result<(), MemError> {
        let i = iova as usize;
        self.0[i..i + data.len()].copy_from_slice(data);
        Ok(())
    }
    /// The vector is its own view: one run at the IOVA.
    fn locate(&self, _: u32, iova: u64, len: usize, out: &mut Located) -> Result<(), MemError> {
        out.push(iova, u32::try_from(len).map_err(|_| MemError)?)
            .ok_or(MemError)
    }
    fn invalidate(&mut self, _: u32, _: u32) -> bool {
        false
    }
    fn fast_reg(&mut self, _: &FastReg, _: u32) -> bool {
        false
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests {
    use super::*;

    struct One(MrInfo);
    impl MrTable for One {
        fn lookup(&self, key: u32) -> Option<MrInfo> {
            (key == 5).then_some(self.0)
        }
        fn read(&self, _: u32, _: u64, _: &mut [u8]) -> Result<(), MemError> {
            Ok(())
        }
        fn write(&mut self, _: u32, _: u64, _: &[u8]) -> Result<(), MemError> {
            Ok(())
        }
        fn invalidate(&mut self, _: u32, _: u32) -> bool {
            false
        }
        fn fast_reg(&mut self, _: &FastReg, _: u32) -> bool {
            false
        }
    }

    #[test]
    fn check_mr_rules() {
        let t = One(MrInfo {
            pd: 1,
            access: Access::REMOTE_READ,
            iova: 0x1000,
            len: 0x100,
        });
        let r = Access::REMOTE_READ;
        assert!(check_mr(&t, 5, 1, 0x1000, 0x100, r).is_ok());
        assert!(check_mr(&t, 5, 1, 0x1100, 0, r).is_ok());
        assert_eq!(
            check_mr(&t, 6, 1, 0x1000, 1, r),
            Err(MrCheckError::BadKey(6))
        );
        assert_eq!(
            check_mr(&t, 5, 2, 0x1000, 1, r),
            Err(MrCheckError::WrongPd(5))
        );
        let w = Access::REMOTE_WRITE;
        assert_eq!(
            check_mr(&t, 5, 1, 0x1000, 1, w),
            Err(MrCheckError::NoAccess(5, w))
        );
        assert_eq!(
            check_mr(&t, 5, 1, 0xfff, 1, r),
            Err(MrCheckError::OutOfBounds(5))
        );
        assert_eq!(
            check_mr(&t, 5, 1, 0x1001, 0x100, r),
            Err(MrCheckError::OutOfBounds(5))
        );
        assert_eq!(
            check_mr(&t, 5, 1, u64::MAX, 2, r),
            Err(MrCheckError::OutOfBounds(5))
        );
    }
}

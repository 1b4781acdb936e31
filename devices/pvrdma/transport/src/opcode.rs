// SPDX-License-Identifier: Apache-2.0
//! The RC and UD opcodes of IBA 9.2 (table 38) as used by RoCE v2, and the
//! one table that says which extension headers each carries and what class
//! of operation it is.
//!
//! Linux rxe keeps the same facts in `rxe_opcode[256]` with hand-computed
//! offsets and one mask mixing header presence and class bits; that let an
//! 8-bit opcode be compared against a class mask above 255 for years
//! ("RDMA/rxe: Fix incorrect responder length checking"). Here headers
//! ([`Hdrs`]) and classes ([`OpClass`]) are distinct types and every offset
//! is derived by [`hdr_offset`] from the header set, so the table holds
//! only what the spec states.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use bitflags::bitflags;
use thiserror::Error;

/// Base Transport Header length (IBA 9.2).
pub const BTH_LEN: usize = 12;
/// RDMA Extended Transport Header length (IBA 9.3.3).
pub const RETH_LEN: usize = 16;
/// ACK Extended Transport Header length (IBA 9.3.5).
pub const AETH_LEN: usize = 4;
/// Datagram Extended Transport Header length (IBA 9.3.2).
pub const DETH_LEN: usize = 8;
/// Immediate Data header length (IBA 9.3.8).
pub const IMMDT_LEN: usize = 4;
/// Invalidate Extended Transport Header length (IBA 9.3.9).
pub const IETH_LEN: usize = 4;
/// Atomic Extended Transport Header length (IBA 9.3.4).
pub const ATMETH_LEN: usize = 28;
/// Atomic Acknowledge Extended Transport Header length (IBA 9.3.6).
pub const ATMACK_LEN: usize = 8;
/// Invariant CRC length.
pub const ICRC_LEN: usize = 4;

bitflags! {
    /// Extension headers following the BTH, in wire order (the declaration
    /// order here is the order they appear in a packet).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct Hdrs: u8 {
        /// Datagram ETH (UD only).
        const DETH = 1 << 0;
        /// RDMA ETH: virtual address, rkey, DMA length.
        const RETH = 1 << 1;
        /// ACK ETH: syndrome and MSN.
        const AETH = 1 << 2;
        /// Atomic ETH: address, rkey, swap/add and compare.
        const ATMETH = 1 << 3;
        /// Atomic ACK ETH: original remote value.
        const ATMACK = 1 << 4;
        /// Immediate data.
        const IMMDT = 1 << 5;
        /// Invalidate ETH: the rkey to invalidate.
        const IETH = 1 << 6;
    }
}

bitflags! {
    /// What an opcode does (the class half of rxe's mask).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct OpClass: u16 {
        /// Sent by a requester.
        const REQ = 1 << 0;
        /// Sent by a responder (ACK, read response, atomic ACK).
        const ACK = 1 << 1;
        /// SEND family.
        const SEND = 1 << 2;
        /// RDMA WRITE family.
        const WRITE = 1 << 3;
        /// RDMA READ request or response.
        const READ = 1 << 4;
        /// Atomic request or atomic ACK.
        const ATOMIC = 1 << 5;
        /// First packet of a multi-packet message.
        const FIRST = 1 << 6;
        /// Middle packet of a multi-packet message.
        const MIDDLE = 1 << 7;
        /// Last packet of a multi-packet message.
        const LAST = 1 << 8;
        /// Single-packet message.
        const ONLY = Self::FIRST.bits() | Self::LAST.bits();
        /// Carries payload after the headers.
        const PAYLOAD = 1 << 9;
        /// Consumes a receive WQE at the responder (sends, write with imm).
        const RECV = 1 << 10;
        /// Completes a receive WQE (last/only of a RECV message).
        const COMP = 1 << 11;
        /// Unreliable datagram.
        const UD = 1 << 12;
    }
}

/// Table facts for one opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo {
    /// Extension headers after the BTH.
    pub hdrs: Hdrs,
    /// Operation class.
    pub class: OpClass,
}

/// Unknown or reserved opcode value.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error("Unknown opcode {0:#04x}")]
pub struct UnknownOpcode(pub u8);

macro_rules! opcodes {
    ($( $(#[$m:meta])* $name:ident = $val:literal => [$($h:ident)|*], [$($c:ident)|+] ),+ $(,)?) => {
        /// A BTH opcode (IBA 9.2 table 38; RC = 0x00.., UD = 0x60..).
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum Opcode { $( $(#[$m])* $name = $val ),+ }

        impl TryFrom<u8> for Opcode {
            type Error = UnknownOpcode;
            fn try_from(v: u8) -> Result<Self, UnknownOpcode> {
                match v { $( $val => Ok(Opcode::$name), )+ _ => Err(UnknownOpcode(v)) }
            }
        }

        impl Opcode {
            /// Every opcode, in value order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name),+];

            /// The table row for this opcode.
            pub const fn info(self) -> OpInfo {
                match self { $( Opcode::$name => OpInfo {
                    hdrs: Hdrs::empty()$(.union(Hdrs::$h))*,
                    class: OpClass::empty()$(.union(OpClass::$c))+,
                }, )+ }
            }
        }
    };
}

opcodes! {
    /// RC SEND First
    RcSendFirst = 0x00 => [], [REQ | SEND | FIRST | PAYLOAD | RECV],
    /// RC SEND Middle
    RcSendMiddle = 0x01 => [], [REQ | SEND | MIDDLE | PAYLOAD | RECV],
    /// RC SEND Last
    RcSendLast = 0x02 => [], [REQ | SEND | LAST | PAYLOAD | RECV | COMP],
    /// RC SEND Last with Immediate
    RcSendLastWithImmediate = 0x03 => [IMMDT], [REQ | SEND | LAST | PAYLOAD | RECV | COMP],
    /// RC SEND Only
    RcSendOnly = 0x04 => [], [REQ | SEND | ONLY | PAYLOAD | RECV | COMP],
    /// RC SEND Only with Immediate
    RcSendOnlyWithImmediate = 0x05 => [IMMDT], [REQ | SEND | ONLY | PAYLOAD | RECV | COMP],
    /// RC RDMA WRITE First
    RcRdmaWriteFirst = 0x06 => [RETH], [REQ | WRITE | FIRST | PAYLOAD],
    /// RC RDMA WRITE Middle
    RcRdmaWriteMiddle = 0x07 => [], [REQ | WRITE | MIDDLE | PAYLOAD],
    /// RC RDMA WRITE Last
    RcRdmaWriteLast = 0x08 => [], [REQ | WRITE | LAST | PAYLOAD],
    /// RC RDMA WRITE Last with Immediate
    RcRdmaWriteLastWithImmediate = 0x09 => [IMMDT], [REQ | WRITE | LAST | PAYLOAD | RECV | COMP],
    /// RC RDMA WRITE Only
    RcRdmaWriteOnly = 0x0a => [RETH], [REQ | WRITE | ONLY | PAYLOAD],
    /// RC RDMA WRITE Only with Immediate
    RcRdmaWriteOnlyWithImmediate = 0x0b => [RETH | IMMDT], [REQ | WRITE | ONLY | PAYLOAD | RECV | COMP],
    /// RC RDMA READ Request
    RcRdmaReadRequest = 0x0c => [RETH], [REQ | READ | ONLY],
    /// RC RDMA READ response First
    RcRdmaReadResponseFirst = 0x0d => [AETH], [ACK | READ | FIRST | PAYLOAD],
    /// RC RDMA READ response Middle
    RcRdmaReadResponseMiddle = 0x0e => [], [ACK | READ | MIDDLE | PAYLOAD],
    /// RC RDMA READ response Last
    RcRdmaReadResponseLast = 0x0f => [AETH], [ACK | READ | LAST | PAYLOAD],
    /// RC RDMA READ response Only
    RcRdmaReadResponseOnly = 0x10 => [AETH], [ACK | READ | ONLY | PAYLOAD],
    /// RC Acknowledge
    RcAcknowledge = 0x11 => [AETH], [ACK | ONLY],
    /// RC ATOMIC Acknowledge
    RcAtomicAcknowledge = 0x12 => [AETH | ATMACK], [ACK | ATOMIC | ONLY],
    /// RC CmpSwap
    RcCompareSwap = 0x13 => [ATMETH], [REQ | ATOMIC | ONLY],
    /// RC FetchAdd
    RcFetchAdd = 0x14 => [ATMETH], [REQ | ATOMIC | ONLY],
    /// RC SEND Last with Invalidate
    RcSendLastWithInvalidate = 0x16 => [IETH], [REQ | SEND | LAST | PAYLOAD | RECV | COMP],
    /// RC SEND Only with Invalidate
    RcSendOnlyWithInvalidate = 0x17 => [IETH], [REQ | SEND | ONLY | PAYLOAD | RECV | COMP],
    /// UD SEND Only
    UdSendOnly = 0x64 => [DETH], [REQ | SEND | ONLY | PAYLOAD | RECV | COMP | UD],
    /// UD SEND Only with Immediate
    UdSendOnlyWithImmediate = 0x65 => [DETH | IMMDT], [REQ | SEND | ONLY | PAYLOAD | RECV | COMP | UD],
}

/// Length of one extension header.
pub const fn hdr_len(h: Hdrs) -> usize {
    match h.bits() {
        b if b == Hdrs::DETH.bits() => DETH_LEN,
        b if b == Hdrs::RETH.bits() => RETH_LEN,
        b if b == Hdrs::AETH.bits() => AETH_LEN,
        b if b == Hdrs::ATMETH.bits() => ATMETH_LEN,
        b if b == Hdrs::ATMACK.bits() => ATMACK_LEN,
        b if b == Hdrs::IMMDT.bits() => IMMDT_LEN,
        b if b == Hdrs::IETH.bits() => IETH_LEN,
        _ => 0,
    }
}

/// Byte offset (from the start of the BTH) of header `which` in a packet
/// carrying `present`; headers are laid out in [`Hdrs`] bit order.
/// `which == Hdrs::empty()` gives the total header length (BTH included),
/// i.e. the payload offset.
#[allow(clippy::arithmetic_side_effects)] // at most 12 + 7 headers of <= 28 bytes
pub const fn hdr_offset(present: Hdrs, which: Hdrs) -> usize {
    let mut off = BTH_LEN;
    let mut bit = 0;
    while bit < 8 {
        let h = Hdrs::from_bits_truncate(1 << bit);
        if !h.is_empty() && h.bits() == which.bits() {
            return off;
        }
        if present.contains(h) {
            off += hdr_len(h);
        }
        bit += 1;
    }
    off
}

impl Opcode {
    /// Total length of BTH plus extension headers.
    pub const fn hdr_len(self) -> usize {
        hdr_offset(self.info().hdrs, Hdrs::empty())
    }

    /// Offset of extension header `h` (meaningful only if present).
    pub const fn offset(self, h: Hdrs) -> usize {
        hdr_offset(self.info().hdrs, h)
    }

    /// Whether this opcode has every bit of `c`.
    pub const fn is(self, c: OpClass) -> bool {
        self.info().class.contains(c)
    }

    /// Whether this opcode has extension header `h`.
    pub const fn has(self, h: Hdrs) -> bool {
        self.info().hdrs.contains(h)
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

    /// IBA 9.2 table 38 opcode values and (rxe_opcode.c) total header
    /// lengths including the BTH, written out independently of the table.
    const SPEC: &[(u8, usize)] = &[
        (0x00, 12),
        (0x01, 12),
        (0x02, 12),
        (0x03, 16),
        (0x04, 12),
        (0x05, 16),
        (0x06, 28),
        (0x07, 12),
        (0x08, 12),
        (0x09, 16),
        (0x0a, 28),
        (0x0b, 32),
        (0x0c, 28),
        (0x0d, 16),
        (0x0e, 12),
        (0x0f, 16),
        (0x10, 16),
        (0x11, 16),
        (0x12, 24),
        (0x13, 40),
        (0x14, 40),
        (0x16, 16),
        (0x17, 16),
        (0x64, 20),
        (0x65, 24),
    ];

    #[test]
    fn table_matches_spec_values_and_lengths() {
        assert_eq!(Opcode::ALL.len(), SPEC.len());
        for &(v, len) in SPEC {
            let op = Opcode::try_from(v).unwrap();
            assert_eq!(op as u8, v);
            assert_eq!(op.hdr_len(), len, "{op:?}");
        }
        for v in 0..=255u8 {
            assert_eq!(Opcode::try_from(v).is_ok(), SPEC.iter().any(|s| s.0 == v));
        }
    }

    #[test]
    fn offsets_follow_wire_order() {
        use Opcode::*;
        // rxe_opcode.c offsets.
        assert_eq!(RcRdmaWriteOnlyWithImmediate.offset(Hdrs::RETH), 12);
        assert_eq!(RcRdmaWriteOnlyWithImmediate.offset(Hdrs::IMMDT), 28);
        assert_eq!(RcAtomicAcknowledge.offset(Hdrs::AETH), 12);
        assert_eq!(RcAtomicAcknowledge.offset(Hdrs::ATMACK), 16);
        assert_eq!(UdSendOnlyWithImmediate.offset(Hdrs::DETH), 12);
        assert_eq!(UdSendOnlyWithImmediate.offset(Hdrs::IMMDT), 20);
        assert_eq!(RcSendOnlyWithInvalidate.offset(Hdrs::IETH), 12);
        assert_eq!(RcCompareSwap.offset(Hdrs::ATMETH), 12);
    }

    #[test]
    fn classes_are_consistent() {
        for &op in Opcode::ALL {
            let c = op.info().class;
            assert!(
                c.contains(OpClass::REQ) ^ c.contains(OpClass::ACK),
                "{op:?}"
            );
            let kinds = [
                OpClass::SEND,
                OpClass::WRITE,
                OpClass::READ,
                OpClass::ATOMIC,
            ];
            assert!(kinds.iter().filter(|k| c.contains(**k)).count() <= 1);
            if c.contains(OpClass::COMP) {
                assert!(c.contains(OpClass::LAST) && c.contains(OpClass::RECV));
            }
            if op.is(OpClass::WRITE) {
                assert_eq!(op.is(OpClass::RECV), op.has(Hdrs::IMMDT), "{op:?}");
            }
        }
    }
}

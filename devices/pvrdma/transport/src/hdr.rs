// SPDX-License-Identifier: Apache-2.0
//! IBA transport headers (BTH and the extension headers of IBA 9.3): parse
//! from and write to length-checked byte slices, big-endian, with the
//! 24-bit QPN/PSN/MSN fields masked.
//!
//! Headers are at most 28 bytes, so parsing decodes them into small `Copy`
//! values the state machines can keep and compare; the payload is never
//! copied (see `packet`). Every read is bounds-checked and a short buffer is
//! a typed error, never a panic: the bytes come from an untrusted peer.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::opcode::{ATMACK_LEN, ATMETH_LEN, BTH_LEN, DETH_LEN, IETH_LEN, IMMDT_LEN, RETH_LEN};
use crate::psn::Psn;

/// Mask of a 24-bit QPN.
pub const QPN_MASK: u32 = 0x00ff_ffff;
/// The only defined BTH transport header version.
pub const BTH_TVER: u8 = 0;
/// Default partition key (full membership).
pub const DEFAULT_PKEY: u16 = 0xffff;
/// Well-known Q_Key of the GSI QP (QP1, IBA 13.4.6.1).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// Why a header could not be read or written.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum HdrError {
    /// The buffer ends inside the header.
    #[error("{hdr} truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Header name.
        hdr: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// An AETH syndrome with a reserved encoding.
    #[error("Reserved AETH syndrome {0:#04x}")]
    BadSyndrome(u8),
}

fn check(hdr: &'static str, buf: &[u8], need: usize) -> Result<(), HdrError> {
    if buf.len() < need {
        return Err(HdrError::Truncated {
            hdr,
            need,
            have: buf.len(),
        });
    }
    Ok(())
}

/// Reads `W` bytes at `off`; callers have checked the length.
fn rd<const W: usize>(buf: &[u8], off: usize) -> [u8; W] {
    buf.get(off..)
        .and_then(|s| s.first_chunk::<W>())
        .copied()
        .unwrap_or([0; W])
}

/// Writes `v` at `off`; callers have checked the length.
fn wr(buf: &mut [u8], off: usize, v: &[u8]) {
    if let Some(dst) = buf.get_mut(off..).and_then(|s| s.get_mut(..v.len())) {
        dst.copy_from_slice(v);
    }
}

/// Declares a plain extension header of big-endian fields.
macro_rules! ext_header {
    ($(#[$m:meta])* $name:ident, $len:expr, { $($(#[$fm:meta])* $f:ident: $t:ident @ $off:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct $name { $($(#[$fm])* pub $f: $t),+ }

        impl $name {
            /// Wire length.
            pub const LEN: usize = $len;

            /// Reads the header from the start of `buf`.
            pub fn parse(buf: &[u8]) -> Result<Self, HdrError> {
                check(stringify!($name), buf, $len)?;
                Ok(Self { $($f: <$t>::from_be_bytes(rd(buf, $off))),+ })
            }

            /// Writes the header at the start of `buf`.
            pub fn write(&self, buf: &mut [u8]) -> Result<(), HdrError> {
                check(stringify!($name), buf, $len)?;
                $(wr(buf, $off, &self.$f.to_be_bytes());)+
                Ok(())
            }
        }
    };
}

ext_header!(
    /// RDMA Extended Transport Header (IBA 9.3.3).
    Reth, RETH_LEN, {
        /// Remote virtual address.
        va: u64 @ 0,
        /// Remote key.
        rkey: u32 @ 8,
        /// DMA length of the whole message.
        len: u32 @ 12,
    }
);

ext_header!(
    /// Atomic Extended Transport Header (IBA 9.3.4).
    AtomicEth, ATMETH_LEN, {
        /// Remote virtual address (8-byte aligned).
        va: u64 @ 0,
        /// Remote key.
        rkey: u32 @ 8,
        /// Swap value (CmpSwap) or addend (FetchAdd).
        swap_add: u64 @ 12,
        /// Compare value (CmpSwap).
        compare: u64 @ 20,
    }
);

ext_header!(
    /// Atomic Acknowledge Extended Transport Header (IBA 9.3.6).
    AtomicAckEth, ATMACK_LEN, {
        /// The remote value before the operation.
        orig: u64 @ 0,
    }
);

ext_header!(
    /// Immediate data (IBA 9.3.8), carried opaque (big-endian on the wire
    /// and in the CQE).
    ImmDt, IMMDT_LEN, {
        /// Immediate value.
        imm: u32 @ 0,
    }
);

ext_header!(
    /// Invalidate Extended Transport Header (IBA 9.3.9).
    Ieth, IETH_LEN, {
        /// The rkey the responder invalidates.
        rkey: u32 @ 0,
    }
);

/// Datagram Extended Transport Header (IBA 9.3.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deth {
    /// Queue key.
    pub qkey: u32,
    /// Source QPN (24 bits).
    pub src_qpn: u32,
}

impl Deth {
    /// Wire length.
    pub const LEN: usize = DETH_LEN;

    /// Reads the header from the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, HdrError> {
        check("Deth", buf, DETH_LEN)?;
        Ok(Deth {
            qkey: u32::from_be_bytes(rd(buf, 0)),
            src_qpn: u32::from_be_bytes(rd(buf, 4)) & QPN_MASK,
        })
    }

    /// Writes the header at the start of `buf`.
    pub fn write(&self, buf: &mut [u8]) -> Result<(), HdrError> {
        check("Deth", buf, DETH_LEN)?;
        wr(buf, 0, &self.qkey.to_be_bytes());
        wr(buf, 4, &(self.src_qpn & QPN_MASK).to_be_bytes());
        Ok(())
    }
}

/// Base Transport Header (IBA 9.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bth {
    /// Raw opcode (validated by `packet`).
    pub opcode: u8,
    /// Solicited event.
    pub se: bool,
    /// Migration state.
    pub mig: bool,
    /// Pad count (0..=3) before the ICRC.
    pub pad: u8,
    /// Transport header version.
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward explicit congestion notification.
    pub fecn: bool,
    /// Backward explicit congestion notification.
    pub becn: bool,
    /// Destination QPN (24 bits).
    pub dqpn: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl Bth {
    /// Wire length.
    pub const LEN: usize = BTH_LEN;

    /// Reads the header from the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, HdrError> {
        check("Bth", buf, BTH_LEN)?;
        let [opcode, flags] = rd(buf, 0);
        let qpn_word = u32::from_be_bytes(rd(buf, 4));
        let psn_word = u32::from_be_bytes(rd(buf, 8));
        Ok(Bth {
            opcode,
            se: flags & 0x80 != 0,
            mig: flags & 0x40 != 0,
            pad: (flags >> 4) & 0x3,
            tver: flags & 0xf,
            pkey: u16::from_be_bytes(rd(buf, 2)),
            fecn: qpn_word & 0x8000_0000 != 0,
            becn: qpn_word & 0x4000_0000 != 0,
            dqpn: qpn_word & QPN_MASK,
            ack_req: psn_word & 0x8000_0000 != 0,
            psn: Psn::new(psn_word),
        })
    }

    /// Writes the header at the start of `buf` (reserved bits zero).
    pub fn write(&self, buf: &mut [u8]) -> Result<(), HdrError> {
        check("Bth", buf, BTH_LEN)?;
        let flags = u8::from(self.se) << 7
            | u8::from(self.mig) << 6
            | (self.pad & 0x3) << 4
            | (self.tver & 0xf);
        let qpn_word =
            u32::from(self.fecn) << 31 | u32::from(self.becn) << 30 | self.dqpn & QPN_MASK;
        let psn_word = u32::from(self.ack_req) << 31 | self.psn.get();
        wr(buf, 0, &[self.opcode, flags]);
        wr(buf, 2, &self.pkey.to_be_bytes());
        wr(buf, 4, &qpn_word.to_be_bytes());
        wr(buf, 8, &psn_word.to_be_bytes());
        Ok(())
    }
}

/// NAK codes of the AETH syndrome (IBA 9.7.5.2.8, table 44).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[repr(u8)]
pub enum NakCode {
    /// PSN sequence error: the responder expected another PSN.
    PsnSeqError = 0,
    /// Invalid request (opcode, length, sequence).
    InvalidRequest = 1,
    /// Remote access error (rkey, bounds, rights, PD).
    RemoteAccessError = 2,
    /// Remote operational error.
    RemoteOperationalError = 3,
    /// Invalid RD request (not used by RC).
    InvalidRdRequest = 4,
}

/// Decoded AETH syndrome (IBA 9.7.5.2.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Syndrome {
    /// Positive acknowledgement with an end-to-end credit count
    /// (0x1f = unlimited, as rxe sends).
    Ack {
        /// Credit count (5 bits).
        credits: u8,
    },
    /// Receiver not ready, retry after the encoded time ([`rnr_timer_ns`]).
    RnrNak {
        /// Encoded RNR timer (5 bits).
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
}

/// Credit count meaning "no flow control" (rxe's `AETH_ACK_UNLIMITED`).
pub const ACK_UNLIMITED: u8 = 0x1f;

impl Syndrome {
    /// Encodes the syndrome byte.
    pub const fn to_u8(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(code) => 0x60 | code as u8,
        }
    }
}

impl TryFrom<u8> for Syndrome {
    type Error = HdrError;
    fn try_from(b: u8) -> Result<Self, HdrError> {
        let low = b & 0x1f;
        match b >> 5 {
            0 => Ok(Syndrome::Ack { credits: low }),
            1 => Ok(Syndrome::RnrNak { timer: low }),
            3 => match low {
                0 => Ok(Syndrome::Nak(NakCode::PsnSeqError)),
                1 => Ok(Syndrome::Nak(NakCode::InvalidRequest)),
                2 => Ok(Syndrome::Nak(NakCode::RemoteAccessError)),
                3 => Ok(Syndrome::Nak(NakCode::RemoteOperationalError)),
                4 => Ok(Syndrome::Nak(NakCode::InvalidRdRequest)),
                _ => Err(HdrError::BadSyndrome(b)),
            },
            _ => Err(HdrError::BadSyndrome(b)),
        }
    }
}

/// ACK Extended Transport Header (IBA 9.3.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Aeth {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Aeth {
    /// Wire length.
    pub const LEN: usize = crate::opcode::AETH_LEN;

    /// Reads the header from the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, HdrError> {
        check("Aeth", buf, Self::LEN)?;
        let w = u32::from_be_bytes(rd(buf, 0));
        Ok(Aeth {
            syndrome: Syndrome::try_from(rd::<1>(buf, 0)[0])?,
            msn: w & QPN_MASK,
        })
    }

    /// Writes the header at the start of `buf`.
    pub fn write(&self, buf: &mut [u8]) -> Result<(), HdrError> {
        check("Aeth", buf, Self::LEN)?;
        let w = u32::from(self.syndrome.to_u8()) << 24 | self.msn & QPN_MASK;
        wr(buf, 0, &w.to_be_bytes());
        Ok(())
    }
}

/// RNR NAK timer encodings in units of 10 µs (IBA 9.7.5.2.8 table 45;
/// code 0 is 655.36 ms).
const RNR_TIMER_10US: [u32; 32] = [
    65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

/// The delay an RNR NAK timer code asks for, in nanoseconds.
pub fn rnr_timer_ns(code: u8) -> u64 {
    let units = RNR_TIMER_10US
        .get(usize::from(code & 0x1f))
        .copied()
        .unwrap_or(65536);
    u64::from(units).saturating_mul(10_000)
}

/// Local ACK timeout for the modify_qp `timeout` field: 4.096 µs × 2^t
/// (IBA 11.2.4.2); 0 means infinite (`None`).
pub fn ack_timeout_ns(t: u8) -> Option<u64> {
    if t == 0 {
        return None;
    }
    Some(
        4096u64
            .checked_shl(u32::from(t.min(31)))
            .unwrap_or(u64::MAX),
    )
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

    #[test]
    fn bth_roundtrip_and_masks() {
        let b = Bth {
            opcode: 0x0a,
            se: true,
            mig: true,
            pad: 3,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: true,
            dqpn: 0x12_3456,
            ack_req: true,
            psn: Psn::new(0xab_cdef),
        };
        let mut buf = [0u8; 12];
        b.write(&mut buf).unwrap();
        assert_eq!(
            buf,
            [0x0a, 0xf0, 0xff, 0xff, 0x40, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd, 0xef]
        );
        assert_eq!(Bth::parse(&buf).unwrap(), b);
        // Reserved bits set by a peer are ignored, 24-bit fields masked.
        buf[4] = 0x3f;
        buf[8] = 0x7f;
        let p = Bth::parse(&buf).unwrap();
        assert_eq!(
            (p.dqpn, p.psn.get(), p.ack_req),
            (0x12_3456, 0xab_cdef, false)
        );
    }

    #[test]
    fn ext_headers_roundtrip() {
        let mut buf = [0u8; 28];
        let r = Reth {
            va: 0x1122_3344_5566_7788,
            rkey: 0xdead_beef,
            len: 4096,
        };
        r.write(&mut buf).unwrap();
        assert_eq!(
            &buf[..12],
            &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xde, 0xad, 0xbe, 0xef]
        );
        assert_eq!(Reth::parse(&buf).unwrap(), r);
        let a = AtomicEth {
            va: 8,
            rkey: 7,
            swap_add: 6,
            compare: 5,
        };
        a.write(&mut buf).unwrap();
        assert_eq!(buf[27], 5);
        assert_eq!(AtomicEth::parse(&buf).unwrap(), a);
        let d = Deth {
            qkey: GSI_QKEY,
            src_qpn: 1,
        };
        d.write(&mut buf).unwrap();
        assert_eq!(&buf[..8], &[0x80, 0x01, 0, 0, 0, 0, 0, 1]);
        assert_eq!(Deth::parse(&buf).unwrap(), d);
    }

    #[test]
    fn truncated_is_an_error() {
        assert!(matches!(
            Bth::parse(&[0; 11]),
            Err(HdrError::Truncated {
                need: 12,
                have: 11,
                ..
            })
        ));
        assert!(Reth::parse(&[0; 15]).is_err());
        assert!(AtomicEth::parse(&[0; 27]).is_err());
        assert!(Aeth::parse(&[0; 3]).is_err());
        assert!(Deth::parse(&[]).is_err());
        assert!(Reth {
            va: 0,
            rkey: 0,
            len: 0
        }
        .write(&mut [0; 4])
        .is_err());
    }

    #[test]
    fn syndromes() {
        let cases = [
            (0x1f, Syndrome::Ack { credits: 0x1f }),
            (0x20 | 14, Syndrome::RnrNak { timer: 14 }),
            (0x60, Syndrome::Nak(NakCode::PsnSeqError)),
            (0x61, Syndrome::Nak(NakCode::InvalidRequest)),
            (0x62, Syndrome::Nak(NakCode::RemoteAccessError)),
            (0x63, Syndrome::Nak(NakCode::RemoteOperationalError)),
        ];
        for (b, s) in cases {
            assert_eq!(Syndrome::try_from(b).unwrap(), s);
            assert_eq!(s.to_u8(), b);
        }
        for bad in [0x40, 0x65, 0x7f, 0x80, 0xff] {
            assert_eq!(Syndrome::try_from(bad), Err(HdrError::BadSyndrome(bad)));
        }
        let a = Aeth {
            syndrome: Syndrome::RnrNak { timer: 1 },
            msn: 0xff_ffff,
        };
        let mut buf = [0; 4];
        a.write(&mut buf).unwrap();
        assert_eq!(buf, [0x21, 0xff, 0xff, 0xff]);
        assert_eq!(Aeth::parse(&buf).unwrap(), a);
    }

    #[test]
    fn timers() {
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(14), Some(67_108_864));
        assert!(ack_timeout_ns(31).is_some());
    }
}

// SPDX-License-Identifier: Apache-2.0
//! Work requests as the guest writes them (ABI doc 4.5, 4.6), decoded into
//! the engine's types. Each decode reads one ring entry, at most a stride
//! (a page) long, and trusts nothing in it: SGE counts are checked against
//! the queue's own maximum, lengths against overflow, opcodes against the
//! QP type, and only the `wr` union member of the opcode is read.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::mem::size_of;

use pvrdma_abi::wqe::{send_flags, RqWqeHdr, SqWqeHdr, SGE_SIZE};
use pvrdma_abi::PAGE_SIZE;
use rdma_transport::qp::SendEntry;
use rdma_transport::req::{Remote, SendWqe};
use rdma_transport::resp::{RecvQueue, RecvWqe};
use rdma_transport::sgl::{sge_total, MAX_SGE};
use rdma_transport::verbs::{FastReg, Sge, WrOpcode};
use vm_memory::{ByteValued, GuestMemory};

use crate::objects::ctx::Numbering;
use crate::ring::{ConsumerRing, RingError};

/// Largest ring entry: rings refuse strides above a page.
const MAX_STRIDE: usize = PAGE_SIZE as usize;
/// Strides read into a stack buffer; larger ones go to the heap.
const SMALL_STRIDE: usize = 512;
/// The `wr` union starts here; a UD WQE's address vector at 40.
const WR_OFFSET: usize = 32;
const AV_OFFSET: usize = 40;
/// Fast registration supports 4 KiB pages only (the guest driver's size).
const FAST_REG_PAGE_SHIFT: u32 = 12;

#[derive(Debug, thiserror::Error)]
pub(crate) enum WqeError {
    #[error(transparent)]
    Ring(#[from] RingError),
    #[error("{0} SGEs exceed the queue's {1}")]
    TooManySges(u32, u32),
    #[error("Unknown send opcode {0:#x}")]
    Opcode(u32),
    #[error("Opcode {0:?} is not allowed on this QP type")]
    NotAllowed(WrOpcode),
    #[error("SGE lengths overflow")]
    Length,
    #[error("Unsupported fast registration (page shift {0})")]
    FastReg(u32),
}

/// A ring entry as read from guest memory: on the stack for the usual
/// strides, on the heap above them (zeroing a page-sized buffer for every
/// WQE showed on the latency path).
struct Entry {
    small: [u8; SMALL_STRIDE],
    large: Vec<u8>,
}

impl Entry {
    fn new() -> Self {
        Self {
            small: [0; SMALL_STRIDE],
            large: Vec::new(),
        }
    }

    /// The entry at `ring`'s consumer index, one stride long.
    fn read<M: GuestMemory>(&mut self, mem: &M, ring: &ConsumerRing) -> Result<&[u8], RingError> {
        let stride = (ring.ring().stride() as usize).min(MAX_STRIDE);
        let buf: &mut [u8] = match self.small.get_mut(..stride) {
            Some(small) => small,
            None => {
                self.large.resize(stride, 0);
                &mut self.large
            }
        };
        ring.peek_bytes(mem, buf)?;
        Ok(buf)
    }
}

/// Reads a `T` at `off` of `buf` (no alignment needed).
fn read<T: ByteValued + Default>(buf: &[u8], off: usize) -> Option<T> {
    let mut v = T::default();
    let src = buf.get(off..off.checked_add(size_of::<T>())?)?;
    v.as_mut_slice().copy_from_slice(src);
    Some(v)
}

fn u32_at(buf: &[u8], off: usize) -> Option<u32> {
    read::<u32>(buf, off)
}

fn u64_at(buf: &[u8], off: usize) -> Option<u64> {
    read::<u64>(buf, off)
}

/// The `num_sge` SGEs after a header of `hdr_len` bytes.
fn sges(buf: &[u8], hdr_len: usize, num: u32, max: u32) -> Result<Vec<Sge>, WqeError> {
    let max = max.min(MAX_SGE as u32);
    if num > max {
        return Err(WqeError::TooManySges(num, max));
    }
    let mut out = Vec::with_capacity(num as usize);
    for i in 0..num as usize {
        let off = i
            .checked_mul(SGE_SIZE as usize)
            .and_then(|o| o.checked_add(hdr_len))
            .ok_or(WqeError::TooManySges(num, max))?;
        let sge = read::<pvrdma_abi::wqe::Sge>(buf, off).ok_or(WqeError::TooManySges(num, max))?;
        out.push(Sge {
            addr: sge.addr,
            len: sge.length,
            lkey: sge.lkey,
        });
    }
    Ok(out)
}

/// The destination of a UD send (`pvrdma_av`), resolved by the caller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Av {
    pub(crate) dgid: [u8; 16],
    pub(crate) dmac: [u8; 6],
    pub(crate) gid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) tclass: u8,
    pub(crate) flow_label: u32,
}

fn av(buf: &[u8]) -> Option<Av> {
    let sl_tclass_flowlabel = u32_at(buf, AV_OFFSET.checked_add(4)?)?;
    Some(Av {
        dgid: read(buf, AV_OFFSET.checked_add(8)?)?,
        gid_index: read(buf, AV_OFFSET.checked_add(25)?)?,
        hop_limit: read(buf, AV_OFFSET.checked_add(27)?)?,
        dmac: read(buf, AV_OFFSET.checked_add(28)?)?,
        tclass: (sl_tclass_flowlabel >> 20) as u8,
        flow_label: sl_tclass_flowlabel & 0xf_ffff,
    })
}

/// A decoded send WQE; a UD send's destination still to be resolved.
#[derive(Debug)]
pub(crate) struct DecodedSend {
    pub(crate) entry: SendEntry,
    pub(crate) av: Option<Av>,
}

/// What a send WQE that failed to decode still tells: its wr_id and
/// opcode, for the error completion.
#[derive(Debug)]
pub(crate) struct BadSend {
    pub(crate) wr_id: u64,
    pub(crate) opcode: u32,
    pub(crate) error: WqeError,
}

/// Decodes the send WQE at the ring's consumer index (not consumed).
pub(crate) fn peek_send<M: GuestMemory>(
    mem: &M,
    ring: &ConsumerRing,
    numbering: Numbering,
    max_sge: u32,
    ud: bool,
    sig_all: bool,
) -> Result<DecodedSend, BadSend> {
    let bad = |error: WqeError| BadSend {
        wr_id: 0,
        opcode: 0,
        error,
    };
    let mut entry = Entry::new();
    let buf = entry.read(mem, ring).map_err(|e| bad(e.into()))?;
    let hdr: SqWqeHdr = read(buf, 0).unwrap_or_default();
    let fail = |error: WqeError| BadSend {
        wr_id: hdr.wr_id,
        opcode: hdr.opcode,
        error,
    };
    let opcode = numbering
        .wr_opcode(hdr.opcode)
        .ok_or_else(|| fail(WqeError::Opcode(hdr.opcode)))?;
    let allowed = if ud {
        matches!(opcode, WrOpcode::Send | WrOpcode::SendWithImm)
    } else {
        true
    };
    if !allowed {
        return Err(fail(WqeError::NotAllowed(opcode)));
    }
    let local = matches!(opcode, WrOpcode::LocalInv | WrOpcode::RegMr);
    let sges = if local {
        Vec::new()
    } else {
        sges(buf, size_of::<SqWqeHdr>(), hdr.num_sge, max_sge).map_err(fail)?
    };
    let len = sge_total(&sges).ok_or_else(|| fail(WqeError::Length))?;
    let w = |i: usize| u64_at(buf, WR_OFFSET.saturating_add(i.saturating_mul(8))).unwrap_or(0);
    let lo = |v: u64| v as u32;
    let hi = |v: u64| (v >> 32) as u32;
    let remote = match opcode {
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead => Remote {
            addr: w(0),
            rkey: lo(w(1)),
            ..Remote::default()
        },
        WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => Remote {
            addr: w(0),
            compare_add: w(1),
            swap: w(2),
            rkey: lo(w(3)),
            ..Remote::default()
        },
        _ if ud => Remote {
            ud_qpn: lo(w(0)),
            ud_qkey: hi(w(0)),
            ..Remote::default()
        },
        _ => Remote::default(),
    };
    let fast_reg = if opcode == WrOpcode::RegMr {
        if lo(w(2)) != FAST_REG_PAGE_SHIFT {
            return Err(fail(WqeError::FastReg(lo(w(2)))));
        }
        Some(FastReg {
            iova: w(0),
            page_list: w(1),
            pages: hi(w(2)),
            len: u64::from(lo(w(3))),
            access: hi(w(3)),
            key: lo(w(4)),
        })
    } else {
        None
    };
    let imm_or_inv = match opcode {
        // imm_data is big-endian in the WQE; the engine works in host order.
        WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm => hdr.ex.swap_bytes(),
        _ => hdr.ex,
    };
    Ok(DecodedSend {
        entry: SendEntry {
            wqe: SendWqe {
                wr_id: hdr.wr_id,
                opcode,
                len,
                solicited: hdr.send_flags & send_flags::SOLICITED != 0,
                imm_or_inv,
                remote,
            },
            sges,
            signaled: sig_all || hdr.send_flags & send_flags::SIGNALED != 0,
            ah: None,
            fast_reg,
        },
        av: if ud { av(buf) } else { None },
    })
}

/// Decodes the receive WQE at the ring's consumer index (not consumed).
pub(crate) fn peek_recv<M: GuestMemory>(
    mem: &M,
    ring: &ConsumerRing,
    max_sge: u32,
) -> Result<RecvWqe, WqeError> {
    let mut entry = Entry::new();
    let buf = entry.read(mem, ring)?;
    let hdr: RqWqeHdr = read(buf, 0).unwrap_or_default();
    let sges = sges(buf, size_of::<RqWqeHdr>(), hdr.num_sge, max_sge)?;
    sge_total(&sges).ok_or(WqeError::Length)?;
    Ok(RecvWqe {
        wr_id: hdr.wr_id,
        sges,
    })
}

/// A guest receive ring (a QP's RQ or an SRQ) as the responder's receive
/// queue: WQEs are taken from guest memory only when a message needs one,
/// so nothing is buffered in the engine. A bad WQE or index stops the
/// queue and is reported through `error`.
pub(crate) struct GuestRecvQueue<'a, M> {
    pub(crate) mem: &'a M,
    pub(crate) ring: &'a mut ConsumerRing,
    pub(crate) max_sge: u32,
    /// Set when the ring or a WQE was invalid.
    pub(crate) error: Option<WqeError>,
    /// WQEs taken.
    pub(crate) taken: u32,
}

impl<'a, M: GuestMemory> GuestRecvQueue<'a, M> {
    pub(crate) fn new(mem: &'a M, ring: &'a mut ConsumerRing, max_sge: u32) -> Self {
        Self {
            mem,
            ring,
            max_sge,
            error: None,
            taken: 0,
        }
    }

    fn try_take(&mut self) -> Result<Option<RecvWqe>, WqeError> {
        if self.ring.pending(self.mem)? == 0 {
            return Ok(None);
        }
        let wqe = peek_recv(self.mem, self.ring, self.max_sge)?;
        self.ring.advance();
        self.ring.publish(self.mem)?;
        self.taken = self.taken.saturating_add(1);
        Ok(Some(wqe))
    }
}

impl<M: GuestMemory> RecvQueue for GuestRecvQueue<'_, M> {
    fn take(&mut self) -> Option<RecvWqe> {
        if self.error.is_some() {
            return None;
        }
        self.try_take().unwrap_or_else(|e| {
            self.error = Some(e);
            None
        })
    }
}

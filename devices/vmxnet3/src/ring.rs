// SPDX-License-Identifier: Apache-2.0
//! The generation-bit rings of vmxnet3. Every ring is an array of 16-byte
//! descriptors; whoever produces entries writes them with its current
//! generation bit (starting at 1) and flips that bit each time it wraps.
//! An entry belongs to the consumer while its generation bit equals the
//! consumer's own, which flips in step. There are no shared indices to
//! trust: both sides keep their position privately.
//!
//! - [`CmdRing`]: filled by the driver, consumed by the device (TX
//!   descriptors, RX buffers). The generation bit sits in dword 2.
//! - [`CompRing`]: filled by the device (TX and RX completions). The
//!   generation bit is bit 31 of dword 3, written last.
//!
//! Ring sizes are validated at activation (≤ 8192, so indices fit u32 and
//! every entry lies in guest RAM); this module only assumes `size > 0`.

use std::sync::atomic::{fence, Ordering};

use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress, GuestMemory};

use crate::regs::{ERR_DESC_NOT_SPT, ERR_NOEOP};

/// Bytes per descriptor of every ring.
pub(crate) const DESC_SIZE: u64 = 16;
/// Byte offset of dword 2, which holds the generation bit of driver rings.
const DWORD2: u64 = 8;
/// Byte offset of dword 3, the last one written to a completion.
const DWORD3: u64 = 12;
/// Generation bit of a completion, in dword 3.
const COMP_GEN: u32 = 1 << 31;

#[derive(Debug, thiserror::Error)]
#[error("Failed to access ring entry {index} at {addr:#x}")]
pub(crate) struct RingError {
    index: u32,
    addr: u64,
    #[source]
    source: vm_memory::GuestMemoryError,
}

/// Where the device is in a ring: the entry it looks at next and the
/// generation that entry carries when it is the device's. Saved for
/// migration; checked against the ring's size when restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RingPos {
    pub(crate) next: u32,
    pub(crate) gen: bool,
}

impl RingPos {
    /// The start of a ring: entry 0, generation 1.
    const START: RingPos = RingPos { next: 0, gen: true };

    /// The position `count` entries on in a ring of `size` (`next < size`
    /// and `count <= size`, so the sum cannot overflow u32): past the end
    /// it wraps and the generation flips.
    fn ahead(self, count: u32, size: u32) -> RingPos {
        let pos = self.next.wrapping_add(count);
        match pos.checked_sub(size) {
            Some(wrapped) => RingPos {
                next: wrapped,
                gen: !self.gen,
            },
            None => RingPos {
                next: pos,
                gen: self.gen,
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("Position {next} is not below the ring size {size}")]
pub(crate) struct PosError {
    next: u32,
    size: u32,
}

/// `pos` if it lies inside a ring of `size` entries.
fn check_pos(pos: RingPos, size: u32) -> Result<RingPos, PosError> {
    if pos.next < size {
        Ok(pos)
    } else {
        Err(PosError {
            next: pos.next,
            size,
        })
    }
}

/// A fault that stops a queue until the driver resets the device: the
/// device sets the queue's status, raises TQERR/RQERR and serves it no more.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QueueFault {
    #[error("The packet starting at descriptor {0} has no end-of-packet descriptor")]
    NoEop(u32),
    #[error("RX ring {ring} buffer {index} is unusable (zero length, or a HEAD buffer in ring 1)")]
    BadRxBuffer { ring: usize, index: u32 },
    #[error(transparent)]
    Ring(#[from] RingError),
}

impl QueueFault {
    /// The queue status error code the driver reads (`VMXNET3_ERR_*`).
    pub(crate) fn code(&self) -> u32 {
        match self {
            QueueFault::NoEop(_) => ERR_NOEOP,
            QueueFault::BadRxBuffer { .. } | QueueFault::Ring(_) => ERR_DESC_NOT_SPT,
        }
    }
}

/// The guest-physical address of entry `index` of a ring at `base`.
fn entry_addr(base: GuestAddress, index: u32) -> GuestAddress {
    // Below 8192 * 16 past a base whose whole ring lies in guest RAM.
    GuestAddress(
        base.0
            .wrapping_add(u64::from(index).wrapping_mul(DESC_SIZE)),
    )
}

/// A ring the driver fills and the device consumes.
#[derive(Debug)]
pub(crate) struct CmdRing {
    base: GuestAddress,
    size: u32,
    /// Next entry the device looks at, and the generation an entry must
    /// carry to be the device's.
    pos: RingPos,
    /// The generation bit within dword 2.
    gen_mask: u32,
}

impl CmdRing {
    /// A ring at `base` of `size` entries whose generation bit is bit
    /// `gen_bit` of dword 2, in its reset state.
    pub(crate) fn new(base: GuestAddress, size: u32, gen_bit: u32) -> Self {
        CmdRing {
            base,
            size,
            pos: RingPos::START,
            gen_mask: 1u32.checked_shl(gen_bit).unwrap_or(0),
        }
    }

    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    pub(crate) fn pos(&self) -> RingPos {
        self.pos
    }

    /// Moves to a saved position.
    pub(crate) fn set_pos(&mut self, pos: RingPos) -> Result<(), PosError> {
        self.pos = check_pos(pos, self.size)?;
        Ok(())
    }

    /// Entry `ahead` places after the next one: `Some((index, copy))` if
    /// the driver has handed it over, `None` if not (or `ahead` is a whole
    /// ring or more). The copy is taken after the generation bit was seen,
    /// so it holds what the driver wrote before flipping that bit.
    pub(crate) fn peek<M: GuestMemory>(
        &self,
        mem: &M,
        ahead: u32,
    ) -> Result<Option<(u32, [u8; 16])>, RingError> {
        if ahead >= self.size {
            return Ok(None);
        }
        let RingPos { next: index, gen } = self.pos.ahead(ahead, self.size);
        let addr = entry_addr(self.base, index);
        let err = |source| RingError {
            index,
            addr: addr.0,
            source,
        };
        let dword2: u32 = mem
            .read_obj(GuestAddress(addr.0.wrapping_add(DWORD2)))
            .map_err(err)?;
        if (dword2 & self.gen_mask != 0) != gen {
            return Ok(None);
        }
        fence(Ordering::Acquire);
        let desc: [u8; 16] = mem.read_obj(addr).map_err(err)?;
        Ok(Some((index, desc)))
    }

    /// Gives `count` (at most a ring) entries back to the driver.
    pub(crate) fn advance(&mut self, count: u32) {
        self.pos = self.pos.ahead(count.min(self.size), self.size);
    }
}

/// A ring the device fills (completions) and the driver consumes.
#[derive(Debug)]
pub(crate) struct CompRing {
    base: GuestAddress,
    size: u32,
    /// Next entry the device writes, and the generation it writes there.
    pos: RingPos,
}

impl CompRing {
    pub(crate) fn new(base: GuestAddress, size: u32) -> Self {
        CompRing {
            base,
            size,
            pos: RingPos::START,
        }
    }

    pub(crate) fn pos(&self) -> RingPos {
        self.pos
    }

    /// Moves to a saved position.
    pub(crate) fn set_pos(&mut self, pos: RingPos) -> Result<(), PosError> {
        self.pos = check_pos(pos, self.size)?;
        Ok(())
    }

    /// Writes completion `desc` (its generation bit is set here) to the next
    /// entry: dwords 0-2 first, dword 3 with the generation bit last, so
    /// the driver never sees a half-written completion.
    pub(crate) fn push<M: GuestMemory>(
        &mut self,
        mem: &M,
        desc: [u32; 4],
    ) -> Result<(), RingError> {
        let [d0, d1, d2, d3] = desc;
        let index = self.pos.next;
        let addr = entry_addr(self.base, index);
        let err = |source| RingError {
            index,
            addr: addr.0,
            source,
        };
        let mut head = [0u8; 12];
        for (chunk, dword) in head.chunks_exact_mut(4).zip([d0, d1, d2]) {
            chunk.copy_from_slice(&dword.to_le_bytes());
        }
        mem.write_slice(&head, addr).map_err(err)?;
        fence(Ordering::Release);
        let d3 = if self.pos.gen {
            d3 | COMP_GEN
        } else {
            d3 & !COMP_GEN
        };
        mem.write_obj(d3.to_le(), GuestAddress(addr.0.wrapping_add(DWORD3)))
            .map_err(err)?;
        self.pos = self.pos.ahead(1, self.size);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::arithmetic_side_effects)]

    use vm_memory::GuestMemoryMmap;

    use super::*;

    fn mem() -> GuestMemoryMmap<()> {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    fn post(mem: &GuestMemoryMmap<()>, index: u64, gen: bool, tag: u8) {
        let dword2 = u32::from(tag) | u32::from(gen) << 14;
        mem.write_obj(u64::from(tag), GuestAddress(0x1000 + index * 16))
            .unwrap();
        mem.write_obj(dword2, GuestAddress(0x1008 + index * 16))
            .unwrap();
    }

    #[test]
    fn cmd_ring_follows_generations_across_wraps() {
        let m = mem();
        let mut ring = CmdRing::new(GuestAddress(0x1000), 4, 14);
        // Zeroed memory: generation 0, nothing for the device yet.
        assert!(ring.peek(&m, 0).unwrap().is_none());
        for i in 0..4 {
            post(&m, i, true, i as u8);
        }
        let (index, desc) = ring.peek(&m, 3).unwrap().unwrap();
        assert_eq!((index, desc[0]), (3, 3));
        assert!(
            ring.peek(&m, 4).unwrap().is_none(),
            "never a whole ring ahead"
        );
        ring.advance(3);
        // Entry 0 of the next lap needs generation 0.
        assert!(ring.peek(&m, 1).unwrap().is_none());
        post(&m, 0, false, 9);
        assert_eq!(ring.peek(&m, 1).unwrap().unwrap().0, 0);
        ring.advance(2);
        assert_eq!(ring.peek(&m, 0).unwrap(), None, "entry 1 still has gen 1");
        post(&m, 1, false, 10);
        assert_eq!(ring.peek(&m, 0).unwrap().unwrap().1[0], 10);
    }

    #[test]
    fn comp_ring_writes_generation_last_and_flips_on_wrap() {
        let m = mem();
        let mut ring = CompRing::new(GuestAddress(0x2000), 2);
        for round in 0..3u32 {
            ring.push(&m, [round, 1, 2, 0x0300_0000 | COMP_GEN])
                .unwrap();
        }
        let d3 = |i: u64| m.read_obj::<u32>(GuestAddress(0x200c + 16 * i)).unwrap();
        // Entry 0 rewritten in the second lap with generation 0.
        assert_eq!(d3(0), 0x0300_0000);
        assert_eq!(d3(1), 0x0300_0000 | COMP_GEN);
        assert_eq!(m.read_obj::<u32>(GuestAddress(0x2000)).unwrap(), 2);
        let outside = CompRing::new(GuestAddress(0xfff8), 1).push(&m, [0; 4]);
        assert!(outside.is_err());
    }

    #[test]
    fn positions_round_trip_and_stay_inside_the_ring() {
        let m = mem();
        let mut ring = CmdRing::new(GuestAddress(0x1000), 4, 14);
        ring.advance(3);
        let mut copy = CmdRing::new(GuestAddress(0x1000), 4, 14);
        copy.set_pos(ring.pos()).unwrap();
        post(&m, 3, true, 7);
        assert_eq!(copy.peek(&m, 0).unwrap().unwrap().0, 3);
        let wrapped = RingPos {
            next: 1,
            gen: false,
        };
        copy.set_pos(wrapped).unwrap();
        assert_eq!(copy.pos(), wrapped);
        let outside = RingPos { next: 4, gen: true };
        assert!(copy.set_pos(outside).is_err());
        assert_eq!(copy.pos(), wrapped, "unchanged on error");

        let mut comp = CompRing::new(GuestAddress(0x2000), 2);
        comp.set_pos(wrapped).unwrap();
        comp.push(&m, [0; 4]).unwrap();
        assert_eq!(comp.pos(), RingPos { next: 0, gen: true });
        assert_eq!(m.read_obj::<u32>(GuestAddress(0x201c)).unwrap(), 0);
        assert!(comp.set_pos(RingPos { next: 2, gen: true }).is_err());
    }
}

// SPDX-License-Identifier: Apache-2.0
//! `Vmxnet3_DriverShared` (revision-1 layout, 720 bytes) and the queue
//! descriptors it points to (`Vmxnet3_TxQueueDesc` / `Vmxnet3_RxQueueDesc`,
//! 256 bytes each), as Linux's `vmxnet3_defs.h` and `upt1_defs.h` lay
//! them out.
//!
//! At ACTIVATE_DEV the device copies both once into local buffers and
//! validates every field it will use ([`check_device_conf`]); what it keeps
//! is the validated [`DeviceConf`], never a guest pointer it has not
//! checked. Later the device writes a few fields back: `ecr`, the TX
//! threshold, and each queue's status and statistics.
//!
//! A [`DeviceConf`] restored from a migration stream is checked again
//! ([`check_restored_conf`]) with the same rules, against this host's
//! guest memory.

use std::fmt;

use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError, Permissions};

use crate::regs::{MAX_RX_QUEUES, MAX_TX_QUEUES, NUM_VECTORS};
use crate::ring::DESC_SIZE;

/// `sizeof(struct Vmxnet3_DriverShared)` before revision 6.
const SHARED_LEN: usize = 720;
/// `VMXNET3_REV1_MAGIC`.
const REV1_MAGIC: u32 = 0xbabe_fee1;
// Offsets in DriverShared (devRead.misc at 8, intrConf at 80).
const DS_MAGIC: usize = 0;
const DS_QUEUE_DESC_PA: usize = 40;
const DS_MTU: usize = 56;
const DS_NUM_TX_QUEUES: usize = 62;
const DS_NUM_RX_QUEUES: usize = 63;
const DS_AUTO_MASK: usize = 80;
const DS_NUM_INTRS: usize = 81;
const DS_EVENT_INTR_IDX: usize = 82;
const DS_ECR: u64 = 696;

/// Bytes of each queue descriptor.
const QUEUE_DESC_LEN: usize = 256;
// Offsets in a queue descriptor (conf at 16, status at 80, stats at 88).
const TQ_THRESHOLD: u64 = 4;
const TQ_RING_PA: usize = 16;
const TQ_COMP_PA: usize = 32;
const TQ_RING_SIZE: usize = 56;
const TQ_COMP_SIZE: usize = 64;
const RQ_RING_PA: [usize; 2] = [16, 24];
const RQ_COMP_PA: usize = 32;
const RQ_RING_SIZE: [usize; 2] = [56, 60];
const RQ_COMP_SIZE: usize = 64;
const Q_INTR_IDX: usize = 72;
const Q_STATUS: u64 = 80;
const Q_STATS: u64 = 88;

/// `VMXNET3_MIN_MTU` / `VMXNET3_MAX_MTU`.
const MIN_MTU: u32 = 60;
const MAX_MTU: u32 = 9000;
/// Ring sizes are multiples of `VMXNET3_RING_SIZE_ALIGN`...
const RING_ALIGN: u32 = 32;
/// ...up to `VMXNET3_TX_RING_MAX_SIZE` (all TX rings and RX buffer rings)
/// and `VMXNET3_RC_RING_MAX_SIZE` (RX completions: both buffer rings).
const RING_MAX: u32 = 4096;
const RX_COMP_RING_MAX: u32 = 8192;
/// The TX threshold written at activation: the driver rings TXPROD for
/// every packet, since the device does not poll.
const TX_THRESHOLD: u32 = 1;

/// A queue, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QueueId {
    Tx(usize),
    Rx(usize),
}

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueId::Tx(q) => write!(f, "TX queue {q}"),
            QueueId::Rx(q) => write!(f, "RX queue {q}"),
        }
    }
}

/// Why ACTIVATE_DEV was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ActivateError {
    #[error("DriverShared at {0:#x} is not in guest RAM")]
    SharedOutsideMemory(u64, #[source] GuestMemoryError),
    #[error("DriverShared magic {0:#x} is not VMXNET3_REV1_MAGIC")]
    BadMagic(u32),
    #[error("{tx} TX and {rx} RX queues requested; 1 to 8 of each are supported")]
    QueueCount { tx: u8, rx: u8 },
    #[error("MTU {0} is outside {MIN_MTU}-{MAX_MTU}")]
    Mtu(u32),
    #[error("{0} interrupts requested; 1 to {NUM_VECTORS} are supported")]
    IntrCount(u8),
    #[error("Event interrupt {idx} is not below the {count} interrupts")]
    EventIntr { idx: u8, count: u8 },
    #[error("Queue descriptors at {0:#x} are not in guest RAM")]
    QueueDescOutsideMemory(u64, #[source] GuestMemoryError),
    #[error("{queue}: interrupt {idx} is not below the {count} interrupts")]
    QueueIntr { queue: QueueId, idx: u8, count: u8 },
    #[error("{queue}: {ring} has {size} entries, not a multiple of {RING_ALIGN} from {RING_ALIGN} to {max}")]
    RingSize {
        queue: QueueId,
        ring: &'static str,
        size: u32,
        max: u32,
    },
    #[error("{queue}: {ring} at {addr:#x} is not in guest RAM")]
    RingOutsideMemory {
        queue: QueueId,
        ring: &'static str,
        addr: u64,
    },
}

/// A validated ring: `size` entries at `base`, all in guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingConf {
    pub(crate) base: GuestAddress,
    pub(crate) size: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TxQueueConf {
    /// This queue's `Vmxnet3_TxQueueDesc`.
    pub(crate) desc: GuestAddress,
    pub(crate) ring: RingConf,
    pub(crate) comp: RingConf,
    pub(crate) intr: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RxQueueConf {
    /// This queue's `Vmxnet3_RxQueueDesc`.
    pub(crate) desc: GuestAddress,
    /// Ring 0 (HEAD and BODY buffers) and ring 1 (BODY buffers).
    pub(crate) rings: [RingConf; 2],
    pub(crate) comp: RingConf,
    pub(crate) intr: u8,
}

/// What ACTIVATE_DEV found in DriverShared, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceConf {
    /// Where DriverShared is (for `ecr`).
    pub(crate) shared: GuestAddress,
    pub(crate) mtu: u16,
    /// The device masks a vector when it fires (`intrConf.autoMask`).
    pub(crate) auto_mask: bool,
    pub(crate) event_intr: u8,
    pub(crate) tx: Vec<TxQueueConf>,
    pub(crate) rx: Vec<RxQueueConf>,
}

/// Little-endian fields of a local copy; offsets are this module's
/// constants, always inside the copy.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn bytes<const N: usize>(&self, at: usize) -> [u8; N] {
        at.checked_add(N)
            .and_then(|end| self.0.get(at..end))
            .and_then(|s| s.try_into().ok())
            .unwrap_or([0; N])
    }
    fn u8(&self, at: usize) -> u8 {
        self.0.get(at).copied().unwrap_or(0)
    }
    fn u32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.bytes(at))
    }
    fn u64(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.bytes(at))
    }
}

/// Copies DriverShared at `shared` and its queue descriptors out of guest
/// memory and validates everything the device will use.
pub(crate) fn check_device_conf<M: GuestMemory>(
    mem: &M,
    shared: GuestAddress,
) -> Result<DeviceConf, ActivateError> {
    let mut ds = [0u8; SHARED_LEN];
    mem.read_slice(&mut ds, shared)
        .map_err(|e| ActivateError::SharedOutsideMemory(shared.0, e))?;
    let ds = Fields(&ds);
    let magic = ds.u32(DS_MAGIC);
    if magic != REV1_MAGIC {
        return Err(ActivateError::BadMagic(magic));
    }
    let (num_tx, num_rx) = (ds.u8(DS_NUM_TX_QUEUES), ds.u8(DS_NUM_RX_QUEUES));
    let (ntx, nrx) = (usize::from(num_tx), usize::from(num_rx));
    if !(1..=MAX_TX_QUEUES).contains(&ntx) || !(1..=MAX_RX_QUEUES).contains(&nrx) {
        return Err(ActivateError::QueueCount {
            tx: num_tx,
            rx: num_rx,
        });
    }
    let mtu = check_mtu(ds.u32(DS_MTU))?;
    let num_intrs = ds.u8(DS_NUM_INTRS);
    if num_intrs == 0 || u16::from(num_intrs) > NUM_VECTORS {
        return Err(ActivateError::IntrCount(num_intrs));
    }
    let event_intr = ds.u8(DS_EVENT_INTR_IDX);
    if event_intr >= num_intrs {
        return Err(ActivateError::EventIntr {
            idx: event_intr,
            count: num_intrs,
        });
    }

    // At most 16 descriptors: 4 KiB, on the stack.
    let mut descs = [0u8; QUEUE_DESC_LEN * (MAX_TX_QUEUES + MAX_RX_QUEUES)];
    let table = GuestAddress(ds.u64(DS_QUEUE_DESC_PA));
    let used = descs
        .get_mut(..QUEUE_DESC_LEN.saturating_mul(ntx.saturating_add(nrx)))
        .unwrap_or_default();
    mem.read_slice(used, table)
        .map_err(|e| ActivateError::QueueDescOutsideMemory(table.0, e))?;
    let mut chunks = used.chunks_exact(QUEUE_DESC_LEN);
    let mut desc_addr = table;
    let mut next_desc = || {
        let addr = desc_addr;
        desc_addr = GuestAddress(addr.0.wrapping_add(QUEUE_DESC_LEN as u64));
        (addr, Fields(chunks.next().unwrap_or_default()))
    };
    let check_intr = |queue, idx| {
        if idx < num_intrs {
            Ok(idx)
        } else {
            Err(ActivateError::QueueIntr {
                queue,
                idx,
                count: num_intrs,
            })
        }
    };

    let mut tx = Vec::with_capacity(ntx);
    for q in 0..ntx {
        let (desc, f) = next_desc();
        let queue = QueueId::Tx(q);
        tx.push(TxQueueConf {
            desc,
            ring: check_ring(
                mem,
                queue,
                "TX ring",
                &f,
                TQ_RING_PA,
                TQ_RING_SIZE,
                RING_MAX,
            )?,
            comp: check_ring(
                mem,
                queue,
                "completion ring",
                &f,
                TQ_COMP_PA,
                TQ_COMP_SIZE,
                RING_MAX,
            )?,
            intr: check_intr(queue, f.u8(Q_INTR_IDX))?,
        });
    }
    let mut rx = Vec::with_capacity(nrx);
    for q in 0..nrx {
        let (desc, f) = next_desc();
        let queue = QueueId::Rx(q);
        let [pa0, pa1] = RQ_RING_PA;
        let [size0, size1] = RQ_RING_SIZE;
        rx.push(RxQueueConf {
            desc,
            rings: [
                check_ring(mem, queue, "ring 0", &f, pa0, size0, RING_MAX)?,
                check_ring(mem, queue, "ring 1", &f, pa1, size1, RING_MAX)?,
            ],
            comp: check_ring(
                mem,
                queue,
                "completion ring",
                &f,
                RQ_COMP_PA,
                RQ_COMP_SIZE,
                RX_COMP_RING_MAX,
            )?,
            intr: check_intr(queue, f.u8(Q_INTR_IDX))?,
        });
    }
    Ok(DeviceConf {
        shared,
        mtu,
        auto_mask: ds.u8(DS_AUTO_MASK) != 0,
        event_intr,
        tx,
        rx,
    })
}

/// An MTU from `VMXNET3_MIN_MTU` to `VMXNET3_MAX_MTU`.
fn check_mtu(mtu: u32) -> Result<u16, ActivateError> {
    u16::try_from(mtu)
        .ok()
        .filter(|_| (MIN_MTU..=MAX_MTU).contains(&mtu))
        .ok_or(ActivateError::Mtu(mtu))
}

/// The ring whose base and size are at `pa_at` and `size_at` of queue
/// descriptor `f`, checked by [`check_ring_conf`].
fn check_ring<M: GuestMemory>(
    mem: &M,
    queue: QueueId,
    ring: &'static str,
    f: &Fields<'_>,
    pa_at: usize,
    size_at: usize,
    max: u32,
) -> Result<RingConf, ActivateError> {
    let conf = RingConf {
        base: GuestAddress(f.u64(pa_at)),
        size: f.u32(size_at),
    };
    check_ring_conf(mem, queue, ring, conf, max)?;
    Ok(conf)
}

/// A ring of a non-zero multiple of 32 entries up to `max`, every entry in
/// guest RAM.
fn check_ring_conf<M: GuestMemory>(
    mem: &M,
    queue: QueueId,
    ring: &'static str,
    RingConf { base, size }: RingConf,
    max: u32,
) -> Result<(), ActivateError> {
    if size == 0 || !size.is_multiple_of(RING_ALIGN) || size > max {
        return Err(ActivateError::RingSize {
            queue,
            ring,
            size,
            max,
        });
    }
    // size <= 8192, so the byte length is at most 128 KiB.
    let len = usize::try_from(u64::from(size).saturating_mul(DESC_SIZE)).unwrap_or(usize::MAX);
    if !mem.check_range(base, len, Permissions::ReadWrite) {
        return Err(ActivateError::RingOutsideMemory {
            queue,
            ring,
            addr: base.0,
        });
    }
    Ok(())
}

/// Checks a configuration that comes from a migration stream rather than
/// from DriverShared as ACTIVATE_DEV checks what it reads: DriverShared
/// and every queue descriptor in guest RAM, 1 to 8 queues of each kind,
/// the MTU, interrupt indexes below the vectors the device has (the
/// driver's `numIntrs` is not kept), and every ring.
pub(crate) fn check_restored_conf<M: GuestMemory>(
    mem: &M,
    conf: &DeviceConf,
) -> Result<(), ActivateError> {
    let mut ds = [0u8; SHARED_LEN];
    mem.read_slice(&mut ds, conf.shared)
        .map_err(|e| ActivateError::SharedOutsideMemory(conf.shared.0, e))?;
    let (ntx, nrx) = (conf.tx.len(), conf.rx.len());
    if !(1..=MAX_TX_QUEUES).contains(&ntx) || !(1..=MAX_RX_QUEUES).contains(&nrx) {
        return Err(ActivateError::QueueCount {
            tx: u8::try_from(ntx).unwrap_or(u8::MAX),
            rx: u8::try_from(nrx).unwrap_or(u8::MAX),
        });
    }
    check_mtu(u32::from(conf.mtu))?;
    // 25 vectors.
    let count = u8::try_from(NUM_VECTORS).unwrap_or(u8::MAX);
    if conf.event_intr >= count {
        return Err(ActivateError::EventIntr {
            idx: conf.event_intr,
            count,
        });
    }
    let check_queue = |queue, desc: GuestAddress, idx| {
        let mut copy = [0u8; QUEUE_DESC_LEN];
        mem.read_slice(&mut copy, desc)
            .map_err(|e| ActivateError::QueueDescOutsideMemory(desc.0, e))?;
        if idx >= count {
            return Err(ActivateError::QueueIntr { queue, idx, count });
        }
        Ok(())
    };
    for (q, tx) in conf.tx.iter().enumerate() {
        let queue = QueueId::Tx(q);
        check_queue(queue, tx.desc, tx.intr)?;
        check_ring_conf(mem, queue, "TX ring", tx.ring, RING_MAX)?;
        check_ring_conf(mem, queue, "completion ring", tx.comp, RING_MAX)?;
    }
    for (q, rx) in conf.rx.iter().enumerate() {
        let queue = QueueId::Rx(q);
        let [r0, r1] = rx.rings;
        check_queue(queue, rx.desc, rx.intr)?;
        check_ring_conf(mem, queue, "ring 0", r0, RING_MAX)?;
        check_ring_conf(mem, queue, "ring 1", r1, RING_MAX)?;
        check_ring_conf(mem, queue, "completion ring", rx.comp, RX_COMP_RING_MAX)?;
    }
    Ok(())
}

/// Sets the TX threshold of the queue descriptor at `desc` (at activation).
pub(crate) fn write_tx_threshold<M: GuestMemory>(
    mem: &M,
    desc: GuestAddress,
) -> Result<(), GuestMemoryError> {
    mem.write_obj(TX_THRESHOLD.to_le(), offset(desc, TQ_THRESHOLD))
}

/// Writes a queue's `Vmxnet3_QueueStatus`: `stopped` and the error code.
pub(crate) fn write_queue_status<M: GuestMemory>(
    mem: &M,
    desc: GuestAddress,
    stopped: bool,
    error: u32,
) -> Result<(), GuestMemoryError> {
    let [e0, e1, e2, e3] = error.to_le_bytes();
    let status = [u8::from(stopped), 0, 0, 0, e0, e1, e2, e3];
    mem.write_slice(&status, offset(desc, Q_STATUS))
}

/// Writes a queue's UPT1 statistics (ten u64 counters, in the order of
/// `UPT1_TxStats` / `UPT1_RxStats`) at `desc`.
pub(crate) fn write_queue_stats<M: GuestMemory>(
    mem: &M,
    desc: GuestAddress,
    stats: &[u64; 10],
) -> Result<(), GuestMemoryError> {
    let mut bytes = [0u8; 80];
    for (chunk, value) in bytes.chunks_exact_mut(8).zip(stats) {
        chunk.copy_from_slice(&value.to_le_bytes());
    }
    mem.write_slice(&bytes, offset(desc, Q_STATS))
}

/// Read-modify-writes DriverShared `ecr`: sets `set`, then clears `clear`.
/// Callers serialize (the device state lock), as the guest only reads it.
pub(crate) fn update_ecr<M: GuestMemory>(
    mem: &M,
    shared: GuestAddress,
    set: u32,
    clear: u32,
) -> Result<(), GuestMemoryError> {
    let at = offset(shared, DS_ECR);
    let ecr = u32::from_le(mem.read_obj::<u32>(at)?);
    mem.write_obj(((ecr | set) & !clear).to_le(), at)
}

fn offset(base: GuestAddress, off: u64) -> GuestAddress {
    GuestAddress(base.0.wrapping_add(off))
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use vm_memory::GuestMemoryMmap;

    use super::*;
    use crate::test_utils::{DriverLayout, SHARED};

    fn setup() -> (GuestMemoryMmap<()>, DriverLayout) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap();
        let layout = DriverLayout::new(2, 1, 64, 9000);
        layout.write(&mem);
        (mem, layout)
    }

    #[test]
    fn valid_conf_is_parsed() {
        let (mem, layout) = setup();
        let conf = check_device_conf(&mem, GuestAddress(SHARED)).unwrap();
        assert_eq!(conf.mtu, 9000);
        assert!(conf.auto_mask);
        assert_eq!(conf.event_intr, 2);
        assert_eq!(conf.tx.len(), 2);
        assert_eq!(
            conf.tx[1].ring,
            RingConf {
                base: GuestAddress(layout.tx_ring(1)),
                size: 64
            }
        );
        assert_eq!(conf.tx[1].intr, 1);
        assert_eq!(conf.rx[0].rings[1].base, GuestAddress(layout.rx_ring(0, 1)));
        assert_eq!(conf.rx[0].comp.size, 128);
        assert_eq!(conf.rx[0].desc, GuestAddress(layout.queue_desc(2)));
    }

    #[test]
    fn every_bad_field_is_refused() {
        type Change = fn(&mut DriverLayout);
        let cases: [(&str, Change); 15] = [
            ("magic", |l| l.magic = 0xbabe_fee2),
            ("no tx", |l| l.num_tx = 0),
            ("9 rx", |l| l.num_rx = 9),
            ("mtu", |l| l.mtu = 9001),
            ("mtu", |l| l.mtu = 59),
            ("intrs", |l| l.num_intrs = 26),
            ("intrs", |l| l.num_intrs = 0),
            ("event", |l| l.event_intr = 3),
            ("queue intr", |l| l.tx_intr[0] = 3),
            ("ring size", |l| l.ring_size = 48),
            ("ring size", |l| l.ring_size = 8192),
            ("ring size", |l| l.ring_size = 0),
            ("comp size", |l| l.rx_comp_size = 8224),
            ("ring base", |l| l.tx_ring_base[1] = 0x3f_ff00),
            ("table", |l| l.queue_table = 0x3f_fe00),
        ];
        for (what, change) in cases {
            let (mem, mut layout) = setup();
            change(&mut layout);
            layout.write(&mem);
            let err = check_device_conf(&mem, GuestAddress(SHARED));
            assert!(err.is_err(), "{what} accepted");
        }
        let (mem, _) = setup();
        assert!(matches!(
            check_device_conf(&mem, GuestAddress(0x3f_ff00)),
            Err(ActivateError::SharedOutsideMemory(..))
        ));
    }

    #[test]
    fn device_written_fields() {
        let (mem, layout) = setup();
        let shared = GuestAddress(SHARED);
        update_ecr(&mem, shared, 0b110, 0).unwrap();
        update_ecr(&mem, shared, 0, 0b010).unwrap();
        assert_eq!(mem.read_obj::<u32>(offset(shared, DS_ECR)).unwrap(), 0b100);
        let desc = GuestAddress(layout.queue_desc(0));
        write_tx_threshold(&mem, desc).unwrap();
        write_queue_status(&mem, desc, true, 0x8000_0000).unwrap();
        write_queue_stats(&mem, desc, &[7; 10]).unwrap();
        assert_eq!(mem.read_obj::<u32>(offset(desc, 4)).unwrap(), 1);
        assert_eq!(mem.read_obj::<u8>(offset(desc, 80)).unwrap(), 1);
        assert_eq!(mem.read_obj::<u32>(offset(desc, 84)).unwrap(), 0x8000_0000);
        assert_eq!(mem.read_obj::<u64>(offset(desc, 88 + 72)).unwrap(), 7);
    }
}

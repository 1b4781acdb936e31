// SPDX-License-Identifier: Apache-2.0
//! The virtio-blk worker thread: all disk I/O happens here, never on a vCPU.
//!
//! The thread runs an event-manager loop with one subscriber,
//! [`BlockWorker`], woken by the queue eventfd (signalled by KVM through an
//! ioeventfd, or by the transport on an MMIO notify) and by a kill eventfd
//! that [`device_worker::WorkerHandle`]'s `Drop` uses to stop it.
//!
//! The queue and the disk sit in a mutex shared with the device
//! ([`Backend`]): activation puts the queue there and reset takes it away.
//! The worker holds the lock for a whole batch, interrupt included, so once
//! reset has the lock the worker can no longer touch guest memory or raise
//! an interrupt (§2.4.1), and once pause has it every request taken is
//! complete.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::num::Wrapping;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use device_worker::Stoppable;
use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use log::error;
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemory};
use vmm_sys_util::eventfd::EventFd;

use super::disk::Disk;
use super::request::handle_request;
use crate::transport::interrupt::Interrupt;

/// Event-manager user data of the queue eventfd.
const QUEUE_EVENT: u32 = 0;
/// Event-manager user data of the kill eventfd.
const KILL_EVENT: u32 = 1;

/// A queue the driver activated, with the means to interrupt it.
pub(crate) struct ActiveQueue {
    pub(crate) queue: Queue,
    pub(crate) interrupt: Interrupt,
}

/// What the device (activate/reset on a vCPU thread, pause/resume and
/// snapshots on the VMM's) shares with the worker.
pub(crate) struct Backend {
    pub(crate) disk: Disk,
    /// The queue being served: `None` before DRIVER_OK, after a reset, or
    /// once the ring turned out corrupt.
    pub(crate) active: Option<ActiveQueue>,
    /// Set while the VM is paused: notifications are left for `resume`,
    /// which kicks the worker once (a pass drains the whole ring).
    pub(crate) paused: bool,
}

impl Backend {
    pub(crate) fn new(disk: Disk) -> Self {
        Self {
            disk,
            active: None,
            paused: false,
        }
    }
}

pub(crate) type SharedBackend = Arc<Mutex<Backend>>;

/// Locks `backend`; a worker that panicked mid-batch left it consistent
/// enough to stop or reset.
pub(crate) fn lock(backend: &SharedBackend) -> MutexGuard<'_, Backend> {
    backend.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The ring itself is corrupt: the driver claims more new buffers than the
/// queue holds. Nothing sensible can be served until a reset.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QueueError {
    #[error("Available index {avail} is more than a queue ahead of {next}")]
    AvailIndex { avail: u16, next: u16 },
    #[error("Failed to access the ring")]
    Ring(#[source] virtio_queue::Error),
}

/// Serves every available request on `queue`, calling `notify` whenever
/// the driver must be interrupted (EVENT_IDX is honoured by virtio-queue).
pub(crate) fn process_queue<M: GuestMemory>(
    queue: &mut Queue,
    disk: &mut Disk,
    mem: &M,
    mut notify: impl FnMut(),
) -> Result<(), QueueError> {
    let mut empty_passes = 0u8;
    loop {
        // Ask the driver not to notify while we drain: we will look again.
        queue.disable_notification(mem).map_err(QueueError::Ring)?;
        check_avail_index(queue, mem)?;
        // At most a queue's worth per pass, so that completions are
        // signalled while a busy driver keeps adding requests.
        let (mut served, mut used) = (0u16, false);
        while served < queue.size() {
            let Some(chain) = queue.pop_descriptor_chain(mem) else {
                break;
            };
            let head = chain.head_index();
            let len = handle_request(disk, chain, mem);
            // A head outside the table names no buffer the driver can get
            // back; handle_request already dropped it as empty.
            if head < queue.size() {
                queue.add_used(mem, head, len).map_err(QueueError::Ring)?;
                used = true;
            }
            served = served.saturating_add(1);
        }
        if used && queue.needs_notification(mem).map_err(QueueError::Ring)? {
            notify();
        }
        // True when buffers arrived after the last pop: go round again. One
        // empty pass is that race; a second in a row means the ring entry
        // cannot be read, so stop instead of spinning.
        let more = queue.enable_notification(mem).map_err(QueueError::Ring)?;
        empty_passes = if served == 0 {
            empty_passes.saturating_add(1)
        } else {
            0
        };
        if !more || empty_passes > 1 {
            return Ok(());
        }
    }
}

/// Rejects an available index more than a queue ahead (the check virtio-queue
/// makes inside `pop_descriptor_chain`, where it would only log and return
/// nothing, at error level, on every notification).
fn check_avail_index<M: GuestMemory>(queue: &Queue, mem: &M) -> Result<(), QueueError> {
    let avail = queue
        .avail_idx(mem, Ordering::Acquire)
        .map_err(QueueError::Ring)?;
    let next = Wrapping(queue.next_avail());
    if (avail - next).0 > queue.size() {
        return Err(QueueError::AvailIndex {
            avail: avail.0,
            next: next.0,
        });
    }
    Ok(())
}

/// The event subscriber that serves the queue.
pub(crate) struct BlockWorker<M> {
    mem: M,
    queue_evt: EventFd,
    kill_evt: EventFd,
    backend: SharedBackend,
    stopped: bool,
}

impl<M: GuestAddressSpace> BlockWorker<M> {
    pub(crate) fn new(
        mem: M,
        queue_evt: EventFd,
        kill_evt: EventFd,
        backend: SharedBackend,
    ) -> Self {
        Self {
            mem,
            queue_evt,
            kill_evt,
            backend,
            stopped: false,
        }
    }

    fn serve(&mut self) {
        let mut guard = lock(&self.backend);
        let Backend {
            disk,
            active,
            paused,
        } = &mut *guard;
        // Paused: resume comes back here. Not activated yet, or reset: the
        // notification is stale.
        let Some(queue) = active.as_mut().filter(|_| !*paused) else {
            return;
        };
        let mem = self.mem.memory();
        let interrupt = &queue.interrupt;
        let result = process_queue(&mut queue.queue, disk, &*mem, || interrupt.signal_queue(0));
        if let Err(e) = result {
            disk.counters.queue_broken.inc();
            guest_warn!("virtio-blk: queue broken, device needs reset: {e}");
            queue.interrupt.report_failure();
            // Serve nothing more until the driver resets the device.
            *active = None;
        }
    }
}

impl<M: GuestAddressSpace> MutEventSubscriber for BlockWorker<M> {
    fn init(&mut self, ops: &mut EventOps) {
        for (fd, data) in [(&self.queue_evt, QUEUE_EVENT), (&self.kill_evt, KILL_EVENT)] {
            if let Err(e) = ops.add(Events::with_data(fd, data, EventSet::IN)) {
                error!("virtio-blk: failed to watch worker eventfd {data}: {e}");
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        match events.data() {
            QUEUE_EVENT => {
                // The count is irrelevant: one pass drains the whole ring.
                let _ = self.queue_evt.read();
                self.serve();
            }
            KILL_EVENT => self.stopped = true,
            other => error!("virtio-blk: unexpected worker event {other}"),
        }
    }
}

impl<M: GuestAddressSpace> Stoppable for BlockWorker<M> {
    fn kill_evt(&self) -> &EventFd {
        &self.kill_evt
    }

    fn stopped(&self) -> bool {
        self.stopped
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use virtio_bindings::virtio_blk::{VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN};
    use virtio_bindings::virtio_ring::VRING_DESC_F_NEXT;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Address, Bytes, GuestAddress};
    use vmm_sys_util::tempfile::TempFile;

    use super::*;
    use crate::block::test_utils::*;

    const NEXT: u16 = VRING_DESC_F_NEXT as u16;
    const QSIZE: u16 = 16;
    /// Where the used ring goes: MockSplitQueue's own overlaps the end of
    /// its avail ring (its `end()` adds the entry count, not bytes), which
    /// clobbers `used_event`.
    const USED: u64 = 0x8000;

    struct Fixture {
        mem: Mem,
        disk: Disk,
        _file: TempFile,
    }

    impl Fixture {
        fn new() -> Self {
            let file = image(8);
            let disk = Disk::open(file.as_path(), false, "w").unwrap();
            Self {
                mem: guest_memory(),
                disk,
                _file: file,
            }
        }

        fn queue(&self, vq: &MockSplitQueue<'_, Mem>) -> Queue {
            let mut q: Queue = vq.create_queue().unwrap();
            q.try_set_used_ring_address(GuestAddress(USED)).unwrap();
            q
        }

        /// Runs the queue; returns how many interrupts it asked for.
        fn process(&mut self, queue: &mut Queue) -> Result<usize, QueueError> {
            let mut interrupts = 0;
            process_queue(queue, &mut self.disk, &self.mem, || interrupts += 1)?;
            Ok(interrupts)
        }

        fn used_idx(&self) -> u16 {
            self.mem.read_obj(GuestAddress(USED + 2)).unwrap()
        }

        /// (id, len) of used ring entry `i`.
        fn used(&self, i: u64) -> (u32, u32) {
            let at = USED + 4 + 8 * i;
            (
                self.mem.read_obj(GuestAddress(at)).unwrap(),
                self.mem.read_obj(GuestAddress(at + 4)).unwrap(),
            )
        }

        /// Queues a read of sector 1 at descriptors 0-2 and a GET_ID at 3-5.
        fn two_requests(&self, vq: &MockSplitQueue<'_, Mem>) {
            write_header(&self.mem, HDR, VIRTIO_BLK_T_IN, 1);
            write_header(&self.mem, HDR + 16, VIRTIO_BLK_T_GET_ID, 0);
            vq.add_desc_chains(
                &[
                    desc(HDR, 16, NEXT, 1),
                    desc(DATA, 512, W | NEXT, 2),
                    desc(STATUS, 1, W, 0),
                    desc(HDR + 16, 16, NEXT, 4),
                    desc(DATA + 0x1000, 20, W | NEXT, 5),
                    desc(STATUS + 1, 1, W, 0),
                ],
                0,
            )
            .unwrap();
        }
    }

    #[test]
    fn serves_every_chain_and_fills_the_used_ring() {
        let mut f = Fixture::new();
        let vq = MockSplitQueue::new(&f.mem, QSIZE);
        f.two_requests(&vq);
        let mut queue = f.queue(&vq);

        assert_eq!(f.process(&mut queue).unwrap(), 1, "one interrupt per batch");
        assert_eq!(f.used_idx(), 2);
        assert_eq!(f.used(0), (0, 513));
        assert_eq!(f.used(1), (3, 21));
        assert_eq!(f.mem.read_obj::<u16>(GuestAddress(STATUS)).unwrap(), 0);
        assert_eq!(
            f.mem.read_obj::<u8>(GuestAddress(DATA)).unwrap(),
            pattern(512)
        );
        // Without EVENT_IDX, NO_NOTIFY was set while draining and cleared after.
        assert_eq!(f.mem.read_obj::<u16>(GuestAddress(USED)).unwrap(), 0);

        // Nothing new: no interrupt.
        assert_eq!(f.process(&mut queue).unwrap(), 0);
    }

    fn event_idx_run(used_event: u16) -> (usize, u16) {
        let mut f = Fixture::new();
        let vq = MockSplitQueue::new(&f.mem, QSIZE);
        f.two_requests(&vq);
        let mut queue = f.queue(&vq);
        queue.set_event_idx(true);
        let used_event_addr = vq.avail_addr().unchecked_add(4 + 2 * u64::from(QSIZE));
        f.mem.write_obj(used_event, used_event_addr).unwrap();
        let notify = f.process(&mut queue).unwrap();
        assert_eq!(f.used_idx(), 2);
        let avail_event = f
            .mem
            .read_obj(GuestAddress(USED + 4 + 8 * u64::from(QSIZE)))
            .unwrap();
        (notify, avail_event)
    }

    #[test]
    fn event_idx_decides_interrupts() {
        // used_event 0 or 1: the driver wants to hear once entry 0 or 1 is used.
        assert_eq!(event_idx_run(0), (1, 2));
        assert_eq!(event_idx_run(1), (1, 2));
        // used_event 5: not until later. avail_event asks for the next buffer.
        assert_eq!(event_idx_run(5), (0, 2));
    }

    #[test]
    fn corrupt_avail_index_is_an_error() {
        let mut f = Fixture::new();
        let vq = MockSplitQueue::new(&f.mem, QSIZE);
        let mut queue = f.queue(&vq);
        vq.avail().idx().store(QSIZE + 1);
        assert!(matches!(
            f.process(&mut queue),
            Err(QueueError::AvailIndex { avail: 17, next: 0 })
        ));
        assert_eq!(f.used_idx(), 0);
    }

    #[test]
    fn head_outside_the_table_is_skipped() {
        let mut f = Fixture::new();
        let vq = MockSplitQueue::new(&f.mem, QSIZE);
        vq.avail().ring().ref_at(0).unwrap().store(QSIZE + 3);
        vq.avail().idx().store(1);
        let mut queue = f.queue(&vq);
        assert_eq!(f.process(&mut queue).unwrap(), 0);
        assert_eq!(f.used_idx(), 0);
        assert_eq!(
            queue.next_avail(),
            1,
            "the bad entry is consumed, not retried"
        );
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The device's saved state (live migration, snapshots): the registers,
//! the interrupt masks and MSI-X table, the guest-visible statistics, the
//! link state the guest last read and, while the device is activated, the
//! queues as ACTIVATE_DEV validated them with the device's place in every
//! ring (next entry and generation). What the rings, DriverShared and the
//! queue descriptors hold is guest memory, which migrates on its own.
//!
//! A snapshot may come from anywhere: [`load`] checks every queue against
//! this host's guest memory with the rules ACTIVATE_DEV applies and every
//! ring position against its ring, before anything changes.

use pci::{MsixError, MsixState};
use serde::{Deserialize, Serialize};
use vm_memory::{GuestAddress, GuestMemory};
use vm_migration::{MigratableError, Snapshot};

use crate::interrupt::{Interrupts, IntrState};
use crate::regs::{Regs, MAX_RX_QUEUES, MAX_TX_QUEUES};
use crate::ring::{PosError, RingPos};
use crate::rx::RxQueue;
use crate::shared::{
    check_restored_conf, ActivateError, DeviceConf, QueueId, RingConf, RxQueueConf, TxQueueConf,
};
use crate::stats::{RxStats, TxStats};
use crate::tx::TxQueue;
use crate::worker::{Active, DeviceState, RunState};

/// The component name in a VM snapshot.
pub(crate) const ID: &str = "vmxnet3";
/// Layout of [`Saved`]; bump on any change.
pub(crate) const VERSION: u32 = 1;

/// Why a snapshot was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RestoreError {
    #[error("Saved queues are invalid")]
    Conf(#[from] ActivateError),
    #[error("Saved ring position of {0} is invalid")]
    Position(QueueId, #[source] PosError),
    #[error("Saved MSI-X table does not fit")]
    Msix(#[source] MsixError),
}

#[derive(Serialize, Deserialize)]
struct Saved {
    regs: Regs,
    intr: IntrState,
    msix: MsixState,
    tx_stats: [TxStats; MAX_TX_QUEUES],
    rx_stats: [RxStats; MAX_RX_QUEUES],
    reported_link: bool,
    active: Option<SavedActive>,
}

#[derive(Serialize, Deserialize)]
struct SavedActive {
    shared: u64,
    mtu: u16,
    event_intr: u8,
    tx: Vec<SavedTxQueue>,
    rx: Vec<SavedRxQueue>,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
struct SavedRing {
    base: u64,
    size: u32,
}

#[derive(Serialize, Deserialize)]
struct SavedTxQueue {
    desc: u64,
    intr: u8,
    ring: SavedRing,
    comp: SavedRing,
    /// In the TX ring and the completion ring.
    positions: [RingPos; 2],
    stopped: bool,
}

#[derive(Serialize, Deserialize)]
struct SavedRxQueue {
    desc: u64,
    intr: u8,
    rings: [SavedRing; 2],
    comp: SavedRing,
    /// In ring 0, ring 1 and the completion ring.
    positions: [RingPos; 3],
    stopped: bool,
}

impl From<RingConf> for SavedRing {
    fn from(ring: RingConf) -> Self {
        SavedRing {
            base: ring.base.0,
            size: ring.size,
        }
    }
}

impl From<SavedRing> for RingConf {
    fn from(ring: SavedRing) -> Self {
        RingConf {
            base: GuestAddress(ring.base),
            size: ring.size,
        }
    }
}

/// The snapshot of a device whose registers are `regs`, shared state `st`
/// and interrupts `intr`.
pub(crate) fn save(
    regs: &Regs,
    st: &DeviceState,
    intr: &Interrupts,
) -> Result<Snapshot, MigratableError> {
    let saved = Saved {
        regs: *regs,
        intr: intr.save(),
        msix: intr.msix().state(),
        tx_stats: st.tx_stats,
        rx_stats: st.rx_stats,
        reported_link: st.reported_link,
        active: st.active.as_ref().map(save_active),
    };
    Snapshot::new(ID, VERSION, &saved)
}

fn save_active(active: &Active) -> SavedActive {
    let tx = active.tx.iter().map(|q| SavedTxQueue {
        desc: q.conf.desc.0,
        intr: q.conf.intr,
        ring: q.conf.ring.into(),
        comp: q.conf.comp.into(),
        positions: q.positions(),
        stopped: q.stopped,
    });
    let rx = active.rx.iter().map(|q| SavedRxQueue {
        desc: q.conf.desc.0,
        intr: q.conf.intr,
        rings: q.conf.rings.map(SavedRing::from),
        comp: q.conf.comp.into(),
        positions: q.positions(),
        stopped: q.stopped,
    });
    SavedActive {
        shared: active.shared.0,
        mtu: active.mtu,
        event_intr: active.event_intr,
        tx: tx.collect(),
        rx: rx.collect(),
    }
}

/// A checked snapshot, for the device to put in place.
pub(crate) struct Restored {
    pub(crate) regs: Regs,
    pub(crate) intr: IntrState,
    pub(crate) msix: MsixState,
    /// Paused: the worker waits for the device to resume.
    pub(crate) state: DeviceState,
}

/// Reads and checks `snapshot` against guest memory `mem`.
pub(crate) fn load<M: GuestMemory>(
    snapshot: &Snapshot,
    mem: &M,
) -> Result<Restored, MigratableError> {
    let saved: Saved = snapshot.state(ID, VERSION)?;
    let active = saved
        .active
        .as_ref()
        .map(|active| load_active(mem, active))
        .transpose()
        .map_err(restore_error)?;
    Ok(Restored {
        regs: saved.regs,
        intr: saved.intr,
        msix: saved.msix,
        state: DeviceState {
            run: RunState::Paused,
            active,
            tx_stats: saved.tx_stats,
            rx_stats: saved.rx_stats,
            reported_link: saved.reported_link,
            announce: None,
        },
    })
}

fn load_active<M: GuestMemory>(mem: &M, saved: &SavedActive) -> Result<Active, RestoreError> {
    let conf = DeviceConf {
        shared: GuestAddress(saved.shared),
        mtu: saved.mtu,
        // Kept with the interrupts; unused past activation.
        auto_mask: false,
        event_intr: saved.event_intr,
        tx: saved
            .tx
            .iter()
            .map(|q| TxQueueConf {
                desc: GuestAddress(q.desc),
                ring: q.ring.into(),
                comp: q.comp.into(),
                intr: q.intr,
            })
            .collect(),
        rx: saved
            .rx
            .iter()
            .map(|q| RxQueueConf {
                desc: GuestAddress(q.desc),
                rings: q.rings.map(RingConf::from),
                comp: q.comp.into(),
                intr: q.intr,
            })
            .collect(),
    };
    check_restored_conf(mem, &conf)?;
    let tx = conf
        .tx
        .iter()
        .zip(&saved.tx)
        .enumerate()
        .map(|(q, (conf, s))| {
            TxQueue::restore(*conf, s.positions, s.stopped)
                .map_err(|e| RestoreError::Position(QueueId::Tx(q), e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let queues = conf.rx.len();
    let rx = conf
        .rx
        .iter()
        .zip(&saved.rx)
        .enumerate()
        .map(|(q, (conf, s))| {
            RxQueue::restore(*conf, q, queues, s.positions, s.stopped)
                .map_err(|e| RestoreError::Position(QueueId::Rx(q), e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Active {
        shared: conf.shared,
        mtu: conf.mtu,
        event_intr: conf.event_intr,
        tx,
        rx,
    })
}

fn restore_error(e: RestoreError) -> MigratableError {
    MigratableError::Restore(ID.into(), Box::new(e))
}

/// A saved MSI-X table the function's cannot take.
pub(crate) fn msix_error(e: MsixError) -> MigratableError {
    restore_error(RestoreError::Msix(e))
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use std::thread;
    use std::time::{Duration, Instant};

    use net_port::VnetHdr;
    use serde_json::{json, Value};
    use vm_memory::Bytes;
    use vm_migration::test_utils::{Choices, Seeded};
    use vm_migration::{Pausable, Snapshottable};

    use super::*;
    use crate::announce::{rarp_announcement, ANNOUNCE_AT};
    use crate::harness::*;
    use crate::regs::{PT_BAR, VD_BAR};
    use crate::test_utils::{frame, DriverLayout};

    /// Frame `i` of a test's stream: its length tells which it is.
    fn numbered(i: usize) -> Vec<u8> {
        frame(60 + i, i as u8)
    }

    fn number(frame: &[u8]) -> usize {
        frame.len() - 60
    }

    /// Posts frames `range` on TX queue `q` (buffer `i % 64` each) and
    /// rings its doorbell if `ring`.
    fn post(h: &mut Harness, q: usize, range: std::ops::Range<usize>, ring: bool) {
        for i in range {
            let f = numbered(i);
            let addr = h.put_frame(i as u64 % 64, &f);
            h.post_tx(q, &[(addr, f.len() as u32)], Sop::default(), true);
        }
        if ring {
            h.write(PT_BAR, 0x600 + 8 * q as u64, h.tx[q].fill);
        }
    }

    /// The numbers of the frames the backend sent, RARPs left out.
    fn sent(h: &Harness) -> Vec<usize> {
        h.backend
            .take_sent()
            .into_iter()
            .filter(|(_, f)| f[12..14] != [0x80, 0x35])
            .map(|(_, f)| number(&f))
            .collect()
    }

    /// Consumes `n` RX completions (single-buffer frames), re-posting a
    /// buffer for each as Linux does; returns the frames' numbers.
    fn receive(h: &mut Harness, n: usize) -> Vec<usize> {
        let comps = h.wait_rx_completions(0, n);
        assert_eq!(comps.len(), n);
        comps
            .iter()
            .map(|c| {
                assert!(c.sop && c.eop);
                let f = h.read_rx(0, c.idx, c.len);
                assert_eq!(f, numbered(number(&f)), "frame intact");
                h.post_rx(0, 0, 1, 1536, |_| false);
                number(&f)
            })
            .collect()
    }

    /// Sends `frames` through a harness's backend in batches the rings
    /// take, consuming them as they come.
    fn receive_all(h: &mut Harness, frames: std::ops::Range<usize>) -> Vec<usize> {
        let mut got = Vec::new();
        let all: Vec<usize> = frames.collect();
        for batch in all.chunks(20) {
            for &i in batch {
                h.backend.inject(numbered(i));
            }
            got.extend(receive(h, batch.len()));
        }
        got
    }

    #[test]
    fn traffic_continues_across_a_migration() {
        let mut src = Harness::new();
        // 32-entry rings and a 64-entry RX completion ring: 100 frames
        // wrap them all, so generations flip on both hosts.
        assert_eq!(src.activate_with(DriverLayout::new(2, 1, 32, 1500)), 0);
        src.post_rx(0, 0, 31, 1536, |_| false);
        let mut tx = Vec::new();
        let mut rx = Vec::new();

        // Source: TX on both queues, RX of which the guest has not yet
        // seen the last 5 completions.
        post(&mut src, 0, 0..20, true);
        src.wait_tx_completions(0, 20);
        post(&mut src, 1, 20..30, true);
        src.wait_tx_completions(1, 10);
        rx.extend(receive_all(&mut src, 0..20));
        for i in 20..25 {
            src.backend.inject(numbered(i));
        }
        wait_until("RX on the source", || src.counters().rx_frames == 25);
        tx.extend(sent(&src));
        assert_eq!(tx.len(), 30);
        // Packets the source never serves: posted without a doorbell, then
        // with doorbells rung while paused (MMIO and ioeventfd).
        post(&mut src, 0, 30..35, false);
        src.bus.pause().unwrap();
        post(&mut src, 0, 35..40, true);
        post(&mut src, 1, 40..42, false);
        src.ioevents.doorbells()[1].1.write(1).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(sent(&src).is_empty(), "paused");

        let mut dst = Harness::migrate(&src);
        let src_backend = src.backend.clone();
        drop(src);
        assert!(
            src_backend.take_sent().is_empty(),
            "the source sent no more"
        );
        assert_eq!(dst.ioevents.count(), 8, "doorbells at the restored BAR 0");
        assert!(dst.router.routed(0), "MSI-X routes installed");
        dst.bus.resume().unwrap();

        // Destination: the packets left behind go out once, the guest
        // finds the completions it had not read, and traffic goes on.
        let mut left = dst.wait_tx_completions(0, 10);
        left.extend(dst.wait_tx_completions(1, 2));
        assert_eq!(left.len(), 12);
        wait_until("TX on the destination", || {
            tx.extend(sent(&dst));
            tx.len() == 42
        });
        rx.extend(receive(&mut dst, 5));
        rx.extend(receive_all(&mut dst, 25..100));
        for chunk in (42..100).collect::<Vec<_>>().chunks(16) {
            let q = chunk[0] % 2;
            post(&mut dst, q, chunk[0]..chunk[0] + chunk.len(), true);
            dst.wait_tx_completions(q, chunk.len());
        }
        wait_until("all TX", || {
            tx.extend(sent(&dst));
            tx.len() >= 100
        });

        assert_eq!(rx, (0..100).collect::<Vec<_>>(), "RX in order, once each");
        let mut sorted = tx.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>(), "TX once each");
        // In order per queue (queues are served independently).
        let on_q1 = |i: usize| match i {
            20..30 | 40..42 => true,
            0..42 => false,
            _ => (i - 42) / 16 % 2 == 1,
        };
        for q1 in [false, true] {
            let order: Vec<_> = tx.iter().filter(|&&i| on_q1(i) == q1).collect();
            assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
        }
        // The statistics the guest reads carried over.
        assert_eq!(dst.cmd(GET_STATS), 0);
        let rx_desc = dst.layout.queue_desc(2);
        let ucast_rx: u64 = dst.mem.read_obj(GuestAddress(rx_desc + 88 + 16)).unwrap();
        assert_eq!(ucast_rx, 100);
        let c = dst.counters();
        assert_eq!((c.rx_frames, c.tx_frames), (75, 70), "this host's share");
    }

    #[test]
    fn restored_device_announces_its_mac_on_resume() {
        let mut src = Harness::new();
        src.activate(1, 1, 1500);
        let mac = [0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee];
        src.write(VD_BAR, MACL, u32::from_le_bytes([0x02, 0xaa, 0xbb, 0xcc]));
        src.write(VD_BAR, MACH, 0xeedd);
        src.write(PT_BAR, 8 * 5, 0);
        src.bus.pause().unwrap();
        src.bus.resume().unwrap();
        assert!(src.backend.take_sent().is_empty(), "never restored");
        src.bus.pause().unwrap();

        let dst = Harness::migrate(&src);
        assert_eq!(dst.port.state().mac, mac);
        assert_eq!(dst.read(VD_BAR, MACH), 0xeedd);
        let imr = |v: u64| dst.read(PT_BAR, 8 * v);
        assert_eq!((imr(0), imr(5), imr(24)), (0, 0, 1), "interrupt masks");
        assert!(dst.backend.take_sent().is_empty(), "not before resume");
        let resumed = Instant::now();
        dst.bus.resume().unwrap();
        // Each frame, with when it was sent, until the schedule's last is due and a bit more.
        let rarp = (VnetHdr::default(), rarp_announcement(mac).to_vec());
        thread::sleep(ANNOUNCE_AT[ANNOUNCE_AT.len() - 1] + Duration::from_millis(500));
        let seen: Vec<Duration> = dst
            .backend
            .take_sent_timed()
            .into_iter()
            .map(|(at, frame)| {
                assert_eq!(frame, rarp);
                at - resumed
            })
            .collect();
        assert_eq!(seen.len(), ANNOUNCE_AT.len(), "{seen:?}");
        // Never early: the worker waits out each gap (it may be late on a busy host).
        for (pair, due) in seen.windows(2).zip(ANNOUNCE_AT.windows(2)) {
            assert!(pair[1] - pair[0] >= due[1] - due[0], "{seen:?}");
        }
        dst.bus.pause().unwrap();
        dst.bus.resume().unwrap();
        thread::sleep(Duration::from_millis(100));
        assert!(dst.backend.take_sent().is_empty(), "once per restore");
    }

    /// What the fuzz target relies on to keep its function across inputs: a
    /// harness that ran traffic and hostile register, MSI-X and config
    /// writes and migrated away, then `reset`, saves the state of a new one (registers,
    /// interrupts, MSI-X, queues, statistics, reported link) and has the
    /// same configuration space, guest memory, backend and port.
    #[test]
    fn a_reset_function_is_a_new_one() {
        type Seen = (Value, Vec<u32>, Vec<u8>, net_port::PortState, (usize, bool));
        fn saved(h: &mut Harness) -> Seen {
            h.bus.pause().unwrap();
            let snapshot = h.nic.lock().unwrap().snapshot().unwrap();
            h.bus.resume().unwrap();
            let state = vm_migration::test_utils::state_json::<Saved>(&snapshot);
            let config = (0..64).map(|reg| h.cfg_read(reg)).collect();
            let mut mem = vec![0u8; MEM_SIZE];
            h.mem.read_slice(&mut mem, GuestAddress(0)).unwrap();
            let fail = h
                .backend
                .fail_send
                .load(std::sync::atomic::Ordering::SeqCst);
            let backend = (h.backend.queued(), fail);
            (state, config, mem, h.port.state(), backend)
        }
        let mut fresh = Harness::new();
        let mut h = Harness::new();
        h.activate(2, 2, 1500);
        post(&mut h, 1, 0..1, true);
        h.wait_tx_completions(1, 1);
        h.post_rx(0, 0, 4, 1536, |_| false);
        receive_all(&mut h, 0..1);
        h.cmd(GET_STATS);
        // A frame for the function while it does not receive stays queued.
        h.cmd(QUIESCE);
        h.backend.inject(frame(100, 1));
        h.write(VD_BAR, MACL, 0x1234_5678);
        h.write(VD_BAR, UVRS, 1);
        h.write(PT_BAR, 8, 1);
        h.write(crate::regs::MSIX_BAR, 16, 0xdead_0000);
        h.cfg_write(15, 0, &[0xff; 4]);
        h.port.set_carrier(false);
        h.backend
            .fail_send
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Migrated away (the fuzz target keeps a migration's source).
        h.bus.pause().unwrap();
        drop(Harness::migrate(&h));
        h.bus.resume().unwrap();
        h.reset();
        assert!(
            saved(&mut fresh) == saved(&mut h),
            "differs from a new function"
        );
        // And works as one.
        h.activate(1, 1, 1500);
        h.send_one(0, &frame(100, 2), Sop::default());
        h.wait_tx_completions(0, 1);
        assert_eq!(h.backend.take_sent().len(), 1);
    }

    /// A snapshot of an activated device with traffic behind it, and its
    /// state as JSON (to edit by field).
    fn busy_snapshot() -> (Snapshot, Value) {
        let mut h = Harness::new();
        h.activate(2, 1, 1500);
        h.post_rx(0, 0, 10, 1536, |_| false);
        post(&mut h, 0, 0..3, true);
        h.wait_tx_completions(0, 3);
        receive_all(&mut h, 0..3);
        h.bus.pause().unwrap();
        let snapshot = h.nic.lock().unwrap().snapshot().unwrap();
        let value = vm_migration::test_utils::state_json::<Saved>(&snapshot);
        (snapshot, value)
    }

    /// The snapshot of the edited state `value`; `None` when its types
    /// cannot hold it (nor, then, can its binary encoding).
    fn with_data(value: &Value) -> Option<Snapshot> {
        let good = Snapshot::new(ID, VERSION, &()).unwrap();
        vm_migration::test_utils::with_state::<Saved>(&good, value.clone())
    }

    #[test]
    fn hostile_snapshots_are_refused() {
        let (good, value) = busy_snapshot();
        // Room for none of DriverShared, a queue descriptor or a ring.
        let beyond_ram = json!(MEM_SIZE as u64 - 0x80);
        type Change = Box<dyn Fn(&mut Value)>;
        let set = |path: &'static str, v: Value| -> Change {
            Box::new(move |state: &mut Value| *state.pointer_mut(path).unwrap() = v.clone())
        };
        let cases: Vec<(&str, Change)> = vec![
            (
                "ring size not a multiple of 32",
                set("/active/tx/0/ring/size", json!(100)),
            ),
            (
                "TX ring above 4096",
                set("/active/tx/0/ring/size", json!(8192)),
            ),
            ("empty ring", set("/active/rx/0/rings/1/size", json!(0))),
            (
                "RX completions above 8192",
                set("/active/rx/0/comp/size", json!(8224)),
            ),
            (
                "ring beyond RAM",
                set("/active/tx/1/comp/base", beyond_ram.clone()),
            ),
            (
                "ring wrapping the address space",
                set("/active/rx/0/rings/0/base", json!(u64::MAX - 15)),
            ),
            (
                "DriverShared beyond RAM",
                set("/active/shared", beyond_ram.clone()),
            ),
            (
                "queue descriptor beyond RAM",
                set("/active/rx/0/desc", beyond_ram),
            ),
            ("no TX queue", set("/active/tx", json!([]))),
            ("MTU", set("/active/mtu", json!(9001))),
            ("event interrupt", set("/active/event_intr", json!(25))),
            ("queue interrupt", set("/active/tx/1/intr", json!(200))),
            (
                "TX position",
                set("/active/tx/0/positions/0/next", json!(64)),
            ),
            (
                "completion position",
                set("/active/rx/0/positions/2/next", json!(u32::MAX)),
            ),
            (
                "MSI-X vectors",
                Box::new(|v| {
                    v["msix"]["vectors"].as_array_mut().unwrap().pop();
                }),
            ),
            (
                "9 RX queues",
                Box::new(|v| {
                    let q = v["active"]["rx"][0].clone();
                    v["active"]["rx"] = json!(vec![q; 9]);
                }),
            ),
            (
                "statistics of 7 queues",
                Box::new(|v| {
                    v["tx_stats"].as_array_mut().unwrap().pop();
                }),
            ),
            ("MTU beyond u16", set("/active/mtu", json!(70000))),
            ("MAC", set("/regs/mac", json!("02:00:00:00:00:01"))),
        ];
        let mut h = Harness::new();
        let mut unrepresentable = Vec::new();
        for (what, change) in &cases {
            let mut bad = value.clone();
            change(&mut bad);
            let Some(bad) = with_data(&bad) else {
                unrepresentable.push(*what);
                continue;
            };
            let err = h.nic.lock().unwrap().restore(&bad);
            assert!(
                matches!(&err, Err(MigratableError::Restore(id, _)) if id == ID),
                "{what}: {err:?}"
            );
        }
        // Refused by the state's types: fixed-size arrays, a u16, a MAC of
        // six bytes.
        assert_eq!(
            unrepresentable,
            ["statistics of 7 queues", "MTU beyond u16", "MAC"]
        );
        let mut other = good.clone();
        other.version = VERSION + 1;
        assert!(h.nic.lock().unwrap().restore(&other).is_err());
        other = good.clone();
        other.id = "pvrdma".into();
        assert!(h.nic.lock().unwrap().restore(&other).is_err());

        // Untouched and running: a driver can use it.
        assert!(!h.port.state().active);
        h.activate(1, 1, 1500);
        post(&mut h, 0, 0..1, true);
        h.wait_tx_completions(0, 1);
        assert_eq!(sent(&h), vec![0]);
        // And it still takes a good snapshot.
        h.nic.lock().unwrap().restore(&good).unwrap();
        assert_eq!(h.ioevents.count(), 8);
    }

    /// Every number in `v`, by JSON pointer.
    fn number_paths(v: &Value, at: String, out: &mut Vec<String>) {
        match v {
            Value::Number(_) | Value::Bool(_) => out.push(at),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    number_paths(item, format!("{at}/{i}"), out);
                }
            }
            Value::Object(fields) => {
                for (k, item) in fields {
                    number_paths(item, format!("{at}/{k}"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn mutated_snapshots_never_panic() {
        let (good, value) = busy_snapshot();
        let h = Harness::new();
        let mut rng = Seeded(0x9e37_79b9_7f4a_7c15);
        let mut paths = Vec::new();
        number_paths(&value, String::new(), &mut paths);
        let extremes = [
            0,
            1,
            31,
            32,
            4096,
            8192,
            u64::from(u32::MAX),
            u64::MAX,
            MEM_SIZE as u64,
        ];
        let mut refused = 0;
        for round in 0..3000 {
            let snapshot = match round % 3 {
                // Some fields set to edge or random values.
                0 => {
                    let mut v = value.clone();
                    for _ in 0..1 + rng.below(3) {
                        let path = &paths[rng.below(paths.len())];
                        let n = match rng.below(3) {
                            0 => extremes[rng.below(extremes.len())],
                            1 => rng.u64(),
                            _ => rng.u64() % 0x1_0000,
                        };
                        *v.pointer_mut(path).unwrap() = json!(n);
                    }
                    match with_data(&v) {
                        Some(snapshot) => snapshot,
                        None => {
                            refused += 1;
                            continue;
                        }
                    }
                }
                // Bytes flipped, inserted or cut.
                1 => {
                    let mut data = good.data.clone();
                    for _ in 0..1 + rng.below(4) {
                        let at = rng.below(data.len().max(1));
                        match rng.below(3) {
                            0 if at < data.len() => data[at] ^= 1 << rng.below(8),
                            1 => data.insert(at, rng.u64() as u8),
                            _ => data.truncate(at),
                        }
                    }
                    Snapshot {
                        data,
                        ..good.clone()
                    }
                }
                // Noise.
                _ => {
                    let len = rng.below(512);
                    let data = (0..len).map(|_| rng.u64() as u8).collect();
                    Snapshot {
                        data,
                        ..good.clone()
                    }
                }
            };
            if h.nic.lock().unwrap().restore(&snapshot).is_err() {
                refused += 1;
            }
        }
        assert!(refused > 2000, "only {refused} refused");
        // Still a working device once a good snapshot is back.
        let mut nic = h.nic.lock().unwrap();
        nic.restore(&good).unwrap();
        nic.resume().unwrap();
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The device states a migration destination restores from the stream: a PCI bus snapshot
//! (`PciBus::restore`: each function's configuration space, then the device's own state,
//! MSI-X table included) of a vmxnet3 NIC, a virtio-blk disk or a PVRDMA function. Each
//! comes from a real device that a simulated driver set to work (queues active, frames and
//! requests done, for PVRDMA an RC QP pair mid-transfer), taken once per process. The fuzzer
//! mutates the device's own state inside the bus snapshot (`vm_migration::test_utils::mutate`,
//! and the enclosing lengths are encoded again so that mutations reach the fields and not the
//! framing): up to 16 changes, each a number at some position (any, small, a boundary, or
//! near the old value), a bit flipped, a range of bytes removed, duplicated or copied from
//! elsewhere; sometimes the bytes are cut short. The result goes through `Snapshot::from_bytes` and is restored onto a fresh device
//! of the same kind over a copy of the source's guest memory. PVRDMA's state is a migration's:
//! its QPs' rings went ahead in the restore hint taken before it, and their short parts in a
//! later hint (one QP is the same at the save, saved as its `gen` alone), which the
//! destination gets first (`prepare_restore`); the fuzzer mutates the state or one hint.
//! The devices' workers run on the fuzzer's thread (`pvrdma_vmm_fuzz::settle`).
//! Invariants: no panic, no hang (`-timeout` catches a worker that never finishes its turn),
//! no allocation over `-malloc_limit_mb`; a state that restores saves again,
//! and that snapshot restores onto another fresh device.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pci::test_utils::MemoryImage;
use pci::PciBus;
use pvrdma::sim_driver::endpoint::{connect, Endpoint, GID_A, GID_B, MAC_A};
use pvrdma::sim_driver::ib::wr;
use pvrdma::sim_driver::{QpSpec, SimDriver};
use pvrdma::{Limits, PvrdmaConfig};
use pvrdma_vmm_fuzz::virtio_blk::{self as blk, VirtioBlk};
use pvrdma_vmm_fuzz::{inline_workers, settle, Input};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vm_migration::test_utils::{mutate, read_varint, varint};
use vm_migration::{Snapshot, Snapshottable};
use vmxnet3::harness::{Harness, Sop};
use vmxnet3::test_utils::{frame, tcp4_frame};

const MAX_MUTATIONS: u8 = 16;

/// A destination device of one kind on its own bus.
enum Dest {
    Nic(Harness),
    Blk(VirtioBlk),
    Rdma(SimDriver),
}

impl Dest {
    fn new(kind: usize, memory: &MemoryImage) -> Self {
        let dest = match kind {
            0 => Dest::Nic(Harness::new()),
            1 => Dest::Blk(VirtioBlk::new(false)),
            _ => Dest::Rdma(SimDriver::with_config(&rdma_config())),
        };
        memory.copy_to(match &dest {
            Dest::Nic(h) => &h.mem,
            Dest::Blk(v) => &v.mem,
            Dest::Rdma(s) => &s.mem,
        });
        dest
    }

    fn bus(&mut self) -> &mut PciBus {
        match self {
            Dest::Nic(h) => &mut h.bus,
            Dest::Blk(v) => &mut v.bus,
            Dest::Rdma(s) => &mut s.bus,
        }
    }
}

/// A source's bus snapshot, the device's own state in it, and its guest memory.
struct Reference {
    bus: Snapshot,
    /// The bus state before the device state's length, and after the device state.
    before: Vec<u8>,
    state: Vec<u8>,
    after: Vec<u8>,
    /// The pages the source wrote, which a destination copies.
    memory: MemoryImage,
    /// The device's restore hints, taken before the state (what goes ahead of it).
    hints: Vec<Snapshot>,
}

impl Reference {
    fn new(
        bus: &PciBus,
        id: &str,
        mem: &GuestMemoryMmap<AtomicBitmap>,
        hints: Vec<Snapshot>,
    ) -> Self {
        let memory = MemoryImage::take(mem);
        bus.pause().expect("pause");
        let bus = bus.snapshot().expect("snapshot");
        let (before, state, after) = split(&bus.data, id);
        Reference {
            bus,
            before,
            state,
            after,
            memory,
            hints,
        }
    }

    /// The bus snapshot's bytes with `state` as the device's.
    fn with_state(&self, state: &[u8]) -> Vec<u8> {
        let mut data = self.before.clone();
        data.extend(varint(state.len() as u64));
        data.extend_from_slice(state);
        data.extend_from_slice(&self.after);
        Snapshot {
            data,
            ..self.bus.clone()
        }
        .to_bytes()
    }
}

/// Splits the bus state `data` around the state of its nested snapshot of `id` (encoded as
/// the id's length and bytes, the version, the state's length, the state): the bytes before
/// the state's length, the state, the bytes after it.
fn split(data: &[u8], id: &str) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let mut needle = vec![id.len() as u8];
    needle.extend_from_slice(id.as_bytes());
    let at = data
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the device's snapshot in the bus's")
        + needle.len();
    let (_version, n) = read_varint(&data[at..]);
    let len_at = at + n;
    let (len, m) = read_varint(&data[len_at..]);
    let start = len_at + m;
    let end = start + len as usize;
    (
        data[..len_at].to_vec(),
        data[start..end].to_vec(),
        data[end..].to_vec(),
    )
}

/// A vmxnet3 with two queue pairs, a frame sent and one received.
fn nic() -> Reference {
    let mut h = Harness::new();
    h.activate(2, 2, 1500);
    h.post_rx(0, 0, 8, 1536, |_| false);
    h.send_one(0, &tcp4_frame(100, 0), Sop::default());
    h.wait_tx_completions(0, 1);
    h.backend.inject(frame(200, 1));
    h.wait_rx_completions(0, 1);
    Reference::new(&h.bus, "vmxnet3", &h.mem, Vec::new())
}

/// A virtio-blk with its queue active and a read and a write done.
fn disk() -> Reference {
    let mut v = VirtioBlk::new(false);
    v.start(
        blk::VERSION_1 | blk::EVENT_IDX | blk::FLUSH | blk::SEG_MAX,
        16,
    );
    for (i, request_type) in [blk::T_IN, blk::T_OUT].into_iter().enumerate() {
        let i = i as u16;
        let hdr = blk::HEADERS + 16 * u64::from(i);
        let data = blk::DATA + blk::SECTOR * u64::from(i);
        let status = blk::STATUS + u64::from(i);
        v.mem
            .write_slice(&blk::header(request_type, i.into()), GuestAddress(hdr))
            .expect("header");
        let data_flags = if request_type == blk::T_IN {
            blk::WRITE
        } else {
            0
        };
        let head = 3 * i;
        v.write_descriptor(head, blk::descriptor(hdr, 16, blk::NEXT, head + 1));
        let d = blk::descriptor(data, blk::SECTOR as u32, data_flags | blk::NEXT, head + 2);
        v.write_descriptor(head + 1, d);
        v.write_descriptor(head + 2, blk::descriptor(status, 1, blk::WRITE, 0));
        v.publish(head);
    }
    v.notify(0);
    v.settle();
    assert_eq!(v.used_idx(), 2, "both requests served");
    Reference::new(&v.bus, "virtio-blk", &v.mem, Vec::new())
}

/// PVRDMA's configuration on both sides. A hint makes ahead as many eventfds as it names
/// within the device's limits: with the defaults' some 40 000, a mutated count would use up
/// the fuzzer's open files.
fn rdma_config() -> PvrdmaConfig {
    PvrdmaConfig {
        limits: Limits {
            max_qp: 16,
            max_cq: 16,
            max_srq: 4,
            ..Limits::default()
        },
        ..PvrdmaConfig::default()
    }
}

/// A PVRDMA function with an RC QP mid-transfer: a receive posted on the peer, a send and
/// an RDMA READ posted, and a second QP idle; its hints taken first (the first before the
/// READ, the later one after it), so that its QPs' rings and short parts went ahead.
fn rdma() -> Reference {
    let a = SimDriver::with_config_and_mac(&rdma_config(), MAC_A);
    let a = Endpoint::on(a, GID_A, QpSpec::rc);
    let b = Endpoint::new(GID_B, QpSpec::rc);
    SimDriver::connect(&a.sim, &b.sim);
    let (a, b) = connect(a, b);
    let mut a = a;
    a.sim
        .create_qp(QpSpec::rc(a.pd, a.cq.handle))
        .expect("an idle QP");
    b.sim.post_recv_sges(&b.qp, 1, &[b.sge(0, 64)]);
    a.send(1, wr::SEND, &[a.sge(0, 5000)], (0, 0), 0);
    let first = a.sim.device().restore_hint();
    let remote = (b.sge(0, 0).addr, b.key);
    a.send(2, wr::RDMA_READ, &[a.sge(0, 100)], remote, 0);
    let late = a.sim.device().restore_hint();
    let hints = first.into_iter().chain(late).collect();
    Reference::new(&a.sim.bus, "pvrdma", &a.sim.mem, hints)
}

fn references() -> &'static [Reference; 3] {
    static REFS: OnceLock<[Reference; 3]> = OnceLock::new();
    REFS.get_or_init(|| [nic(), disk(), rdma()])
}

fuzz_target!(|data: &[u8]| {
    inline_workers();
    let mut input = Input(data);
    let kind = usize::from(input.u8() % 3);
    let reference = &references()[kind];
    let mut state = reference.state.clone();
    let mut hints = reference.hints.clone();
    let which = usize::from(input.u8()) % (1 + hints.len());
    let target = match hints.get_mut(which) {
        Some(hint) => &mut hint.data,
        None => &mut state,
    };
    for _ in 0..1 + input.u8() % MAX_MUTATIONS {
        if input.is_empty() {
            break;
        }
        let at = usize::from(input.u16());
        mutate(target, at, &mut input);
    }
    let mut bytes = reference.with_state(&state);
    if input.u8() == 0xff {
        bytes.truncate(usize::from(input.u16()) % bytes.len());
    }
    let Ok(snapshot) = Snapshot::from_bytes(&bytes) else {
        return;
    };
    let mut dest = Dest::new(kind, &reference.memory);
    if let Dest::Rdma(sim) = &dest {
        for hint in &hints {
            if sim.device().prepare_restore(hint).is_err() {
                return;
            }
        }
    }
    if dest.bus().restore(&snapshot).is_ok() {
        // What a destination accepted, it can migrate again.
        dest.bus().pause().expect("pause the restored devices");
        let again = dest.bus().snapshot().expect("save the restored state");
        let mut next = Dest::new(kind, &reference.memory);
        if let Err(e) = next.bus().restore(&again) {
            panic!("a restored state does not restore again: {e:?}");
        }
        // The workers run on what they took in.
        dest.bus().resume().expect("resume");
        next.bus().resume().expect("resume");
        settle();
    }
});

// SPDX-License-Identifier: Apache-2.0
//! The device states a migration destination restores from the stream: a PCI bus snapshot
//! (`PciBus::restore`: each function's configuration space, then the device's own state,
//! MSI-X table included) of a vmxnet3 NIC, a virtio-blk disk or a PVRDMA function. Each
//! comes from a real device that a simulated driver set to work (queues active, frames and
//! requests done, for PVRDMA an RC QP pair mid-transfer), taken once per process. The fuzzer
//! mutates the decoded tree of the snapshot (nested device snapshots decoded too, so that
//! mutations reach the fields and not the JSON text): up to 16 changes, each a number (any,
//! small, a boundary, or near the old value), a flag, a null, an element or key removed or
//! duplicated, or another node's value copied in; sometimes the bytes are cut short. The
//! result goes through `Snapshot::from_bytes` and is restored onto a fresh device of the same
//! kind over a copy of the source's guest memory.
//! Invariants: no panic on any thread, no hang (devices are dropped, workers joined, after
//! each input), no allocation over `-malloc_limit_mb`; a state that restores saves again,
//! and that snapshot restores onto another fresh device.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use pci::PciBus;
use pvrdma::sim_driver::endpoint::rc_pair;
use pvrdma::sim_driver::ib::wr;
use pvrdma::sim_driver::SimDriver;
use pvrdma_vmm_fuzz::virtio_blk::{self as blk, VirtioBlk};
use pvrdma_vmm_fuzz::Input;
use serde_json::{json, Map, Value};
use vm_memory::{Bytes, GuestAddress, GuestMemory};
use vm_migration::Snapshot;
use vmxnet3::harness::{Harness, Sop};
use vmxnet3::test_utils::{frame, tcp4_frame};

const MAX_MUTATIONS: u8 = 16;
/// The key under which a nested snapshot's decoded state replaces its bytes.
const OPENED: &str = "$state";
const PAGE: u64 = 4096;

/// A destination device of one kind on its own bus.
enum Dest {
    Nic(Harness),
    Blk(VirtioBlk),
    Rdma(SimDriver),
}

impl Dest {
    fn new(kind: usize, pages: &[(u64, Vec<u8>)]) -> Self {
        let dest = match kind {
            0 => Dest::Nic(Harness::new()),
            1 => Dest::Blk(VirtioBlk::new(false)),
            _ => Dest::Rdma(SimDriver::new()),
        };
        for (gpa, page) in pages {
            let done = match &dest {
                Dest::Nic(h) => h.mem.write_slice(page, GuestAddress(*gpa)),
                Dest::Blk(v) => v.mem.write_slice(page, GuestAddress(*gpa)),
                Dest::Rdma(s) => s.mem.write_slice(page, GuestAddress(*gpa)),
            };
            done.expect("a page of the source's memory");
        }
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

/// The non-zero pages of `mem`, which a destination copies.
fn pages<M: GuestMemory>(mem: &M, size: u64) -> Vec<(u64, Vec<u8>)> {
    (0..size / PAGE)
        .map(|i| i * PAGE)
        .filter_map(|gpa| {
            let mut page = vec![0u8; PAGE as usize];
            mem.read_slice(&mut page, GuestAddress(gpa)).ok()?;
            page.iter().any(|&b| b != 0).then_some((gpa, page))
        })
        .collect()
}

/// A source's bus snapshot (its tree opened) and its guest memory.
struct Reference {
    tree: Value,
    pages: Vec<(u64, Vec<u8>)>,
}

impl Reference {
    fn new(bus: &PciBus, pages: Vec<(u64, Vec<u8>)>) -> Self {
        bus.pause().expect("pause");
        let bytes = bus.snapshot().expect("snapshot").to_bytes();
        let mut tree: Value = serde_json::from_slice(&bytes).expect("a snapshot is JSON");
        open(&mut tree);
        Reference { tree, pages }
    }
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
    Reference::new(&h.bus, pages(&*h.mem, vmxnet3::harness::MEM_SIZE as u64))
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
    while v.used_idx() != 2 {
        std::thread::yield_now();
    }
    Reference::new(&v.bus, pages(&*v.mem, blk::MEM_SIZE))
}

/// A PVRDMA function with an RC QP mid-transfer: a receive posted on the peer, a send and
/// an RDMA READ posted.
fn rdma() -> Reference {
    let (a, b) = rc_pair();
    b.sim.post_recv_sges(&b.qp, 1, &[b.sge(0, 64)]);
    a.send(1, wr::SEND, &[a.sge(0, 5000)], (0, 0), 0);
    let remote = (b.sge(0, 0).addr, b.key);
    a.send(2, wr::RDMA_READ, &[a.sge(0, 100)], remote, 0);
    Reference::new(&a.sim.bus, pages(&*a.sim.mem, pvrdma::sim_driver::MEM_SIZE))
}

fn references() -> &'static [Reference; 3] {
    static REFS: OnceLock<[Reference; 3]> = OnceLock::new();
    REFS.get_or_init(|| [nic(), disk(), rdma()])
}

/// Whether `map` is a `Snapshot`: id, version and data bytes.
fn is_snapshot(map: &Map<String, Value>) -> bool {
    map.len() == 3
        && map.get("id").is_some_and(Value::is_string)
        && map.get("version").is_some_and(Value::is_u64)
        && map.get("data").is_some_and(Value::is_array)
}

/// Decodes the state of every snapshot in `v` in place.
fn open(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if is_snapshot(map) {
                if let Some(data) = map.get_mut("data") {
                    let bytes: Option<Vec<u8>> = data
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                        .collect();
                    if let Some(state) =
                        bytes.and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                    {
                        *data = json!({ OPENED: state });
                    }
                }
            }
            map.values_mut().for_each(open);
        }
        Value::Array(items) => items.iter_mut().for_each(open),
        _ => {}
    }
}

/// Encodes every opened state back into its snapshot's bytes, innermost first.
fn close(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.values_mut().for_each(close);
            if let Some(data) = map.get_mut("data") {
                if let Some(state) = data.as_object_mut().and_then(|m| m.remove(OPENED)) {
                    let bytes = serde_json::to_vec(&state).unwrap_or_default();
                    *data = json!(bytes);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close),
        _ => {}
    }
}

/// Nodes in `v`, itself included.
fn count(v: &Value) -> usize {
    match v {
        Value::Object(map) => 1 + map.values().map(count).sum::<usize>(),
        Value::Array(items) => 1 + items.iter().map(count).sum::<usize>(),
        _ => 1,
    }
}

/// The `n`-th node of `v` in pre-order.
fn nth(v: &mut Value, n: usize) -> Option<&mut Value> {
    let Some(mut n) = n.checked_sub(1) else {
        return Some(v);
    };
    let children: Box<dyn Iterator<Item = &mut Value>> = match v {
        Value::Object(map) => Box::new(map.values_mut()),
        Value::Array(items) => Box::new(items.iter_mut()),
        _ => return None,
    };
    for child in children {
        let size = count(child);
        if n < size {
            return nth(child, n);
        }
        n -= size;
    }
    None
}

/// One change to the `n`-th node of `tree`; `other` is another node's value.
fn mutate(tree: &mut Value, n: usize, other: Value, input: &mut Input<'_>) {
    let Some(v) = nth(tree, n) else { return };
    *v = match input.u8() % 9 {
        0 => json!(input.u64()),
        1 => json!(input.u8()),
        2 => {
            const BOUNDARIES: [i128; 14] = [
                0,
                1,
                -1,
                0xff,
                0x100,
                0xffff,
                0x1_0000,
                0xffff_ffff,
                0x1_0000_0000,
                4095,
                4096,
                i64::MAX as i128,
                u64::MAX as i128,
                i64::MIN as i128,
            ];
            match BOUNDARIES[usize::from(input.u8()) % BOUNDARIES.len()] {
                b if b < 0 => json!(b as i64),
                b => json!(b as u64),
            }
        }
        3 => {
            // Near the old value: off by a little either way.
            let delta = i64::from(input.u8() as i8);
            match v.as_u64() {
                Some(n) => json!(n.wrapping_add_signed(delta)),
                None => json!(delta),
            }
        }
        4 => json!(!v.as_bool().unwrap_or(false)),
        5 => Value::Null,
        6 => {
            let mut changed = v.take();
            match &mut changed {
                Value::Array(items) if !items.is_empty() => {
                    let i = usize::from(input.u8()) % items.len();
                    if input.bool() {
                        items.remove(i);
                    } else {
                        let copy = items[i].clone();
                        items.insert(i, copy);
                    }
                }
                Value::Object(map) if !map.is_empty() => {
                    let i = usize::from(input.u8()) % map.len();
                    if let Some(k) = map.keys().nth(i).cloned() {
                        map.remove(&k);
                    }
                }
                _ => {}
            }
            changed
        }
        7 => other,
        _ => json!(String::from_utf8_lossy(input.chunk(32))),
    };
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let kind = usize::from(input.u8() % 3);
    let reference = &references()[kind];
    let mut tree = reference.tree.clone();
    for _ in 0..1 + input.u8() % MAX_MUTATIONS {
        if input.is_empty() {
            break;
        }
        let nodes = count(&tree);
        let n = usize::from(input.u16()) % nodes;
        let other = usize::from(input.u16()) % nodes;
        let other = nth(&mut tree, other).map(|v| v.clone()).unwrap_or_default();
        mutate(&mut tree, n, other, &mut input);
    }
    close(&mut tree);
    let mut bytes = serde_json::to_vec(&tree).expect("JSON encodes");
    if input.u8() == 0xff {
        bytes.truncate(usize::from(input.u16()) % bytes.len());
    }
    let Ok(snapshot) = Snapshot::from_bytes(&bytes) else {
        return;
    };
    let mut dest = Dest::new(kind, &reference.pages);
    if dest.bus().restore(&snapshot).is_ok() {
        // What a destination accepted, it can migrate again.
        dest.bus().pause().expect("pause the restored devices");
        let again = dest.bus().snapshot().expect("save the restored state");
        let mut next = Dest::new(kind, &reference.pages);
        if let Err(e) = next.bus().restore(&again) {
            panic!("a restored state does not restore again: {e:?}");
        }
        // Let the workers run on what they took in before they are joined.
        dest.bus().resume().expect("resume");
        next.bus().resume().expect("resume");
        std::thread::sleep(Duration::from_millis(1));
    }
});

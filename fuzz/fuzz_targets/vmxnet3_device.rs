// SPDX-License-Identifier: Apache-2.0
//! vmxnet3 as a hostile guest driver sees it, through the device's own simulated driver
//! (`vmxnet3::harness`: the real function and its worker on a PCI bus over real guest
//! memory, a mock backend). The input first chooses the DriverShared area and queue
//! descriptors of an activation (queue counts, ring sizes, MTU, interrupt plan, magic, where
//! the queue table and TX rings are), then up to 48 operations: TX chains of up to four
//! descriptors with any addresses, lengths and offload fields (checksum, TSO, VLAN), with or
//! without an end; RX buffers of any length and type in either ring; frames from the backend
//! (templates or raw bytes, any virtio-net header); writes into DriverShared, the queue
//! descriptors, the rings and the buffers; commands and register accesses of any width;
//! MSI-X and config-space writes; carrier changes; backend send failures; and a live
//! migration of the device onto a fresh one.
//! The device's worker runs on the fuzzer's thread whenever the driver has signalled it
//! (`pvrdma_vmm_fuzz::settle`), as it would on its own thread, only without waiting for one.
//! The function and its guest memory are built once and kept: after each input the harness
//! resets them (`Harness::reset`: configuration space and MSI-X restored, RESET_DEV, the MAC
//! and DriverShared registers, backend, port and guest memory as new), which leaves them as a
//! new function would be (the device test `persist::a_reset_function_is_a_new_one`). An input
//! that migrated goes on with the destination and keeps the source, reset as soon as it
//! migrated, for the next input: the destination announces the MAC for 450 ms after its
//! resume, on a timer that would fire in later inputs, so it goes with its input.
//! Invariants: no panic, no hang (a worker that never finishes its turn hangs the input),
//! no allocation over `-malloc_limit_mb`; ioeventfds registered and unregistered in
//! pairs (the strict mock asserts it); a snapshot of the device restores onto a fresh one;
//! and afterwards a driver that resets and activates the device gets a frame sent and one
//! received.
#![no_main]

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use libfuzzer_sys::fuzz_target;
use net_port::{VnetHdr, MAX_FRAME_LEN};
use pvrdma_vmm_fuzz::{inline_workers, settle, Input};
use vm_memory::{Bytes, GuestAddress};
use vmxnet3::harness::*;
use vmxnet3::test_utils::{frame, tcp4_frame, tcp6_frame, DriverLayout, SHARED};

const MAX_OPS: usize = 48;
/// At most this many migrations per input: each builds another device and copies the guest
/// memory written so far, which takes about half of an input's time.
const MAX_MIGRATIONS: usize = 1;
// The BARs (devices/vmxnet3/src/regs.rs).
const PT_BAR: usize = 0;
const VD_BAR: usize = 1;
const MSIX_BAR: usize = 2;
const BAR_SIZES: [u64; 3] = [0x1000, 0x1000, 0x2000];
const TXPROD: u64 = 0x600;
const RXPROD: u64 = 0x800;

/// A TX doorbell as KVM delivers it: to the registered ioeventfd, else as MMIO.
fn doorbell(h: &Harness, queue: u64, value: u32) {
    let addr = h.bar(PT_BAR) + TXPROD + 8 * queue;
    match h.ioevents.lookup(addr, value) {
        Some(fd) => {
            let _ = fd.write(1);
        }
        None => {
            h.bus.mmio_write(addr, &value.to_le_bytes());
        }
    }
}

fn ring_size(input: &mut Input<'_>) -> u32 {
    match input.u8() % 8 {
        0 | 1 => 32,
        2 | 3 => 64,
        4 => 256,
        5 => 512 << (input.u8() % 4),
        _ => u32::from(input.u16()),
    }
}

/// The layout of an activation: what Linux writes, then hostile changes.
fn layout(input: &mut Input<'_>) -> DriverLayout {
    let setup = input.u8();
    let num_tx = 1 + input.u8() % 8;
    let num_rx = 1 + input.u8() % 8;
    let mtu = match setup & 3 {
        0 => 1500,
        1 => 9000,
        2 => 60 + u32::from(input.u16()) % 8941,
        _ => input.u32(),
    };
    let mut l = DriverLayout::new(num_tx, num_rx, ring_size(input), mtu);
    if setup & 4 != 0 {
        l.rx_comp_size = ring_size(input);
    }
    if setup & 8 != 0 {
        // Any counts, interrupt plan and magic.
        l.num_tx = input.u8();
        l.num_rx = input.u8();
        l.num_intrs = input.u8();
        l.event_intr = input.u8();
        l.auto_mask = input.bool();
        l.tx_intr = (0..8).map(|_| input.u8() % 32).collect();
        l.rx_intr = (0..8).map(|_| input.u8() % 32).collect();
        if input.u8() == 0 {
            l.magic = input.u32();
        }
    }
    if setup & 16 != 0 {
        // The queue table and a TX ring anywhere.
        l.queue_table = address(input);
        if let Some(base) = l.tx_ring_base.first_mut() {
            *base = address(input);
        }
    }
    l
}

/// A guest address: near the driver's structures or buffers, the end of RAM, or anything.
fn address(input: &mut Input<'_>) -> u64 {
    let k = u64::from(input.u16());
    match input.u8() % 6 {
        0 => SHARED + k % 0x2000,
        1 => RX_BUFS + k * 0x100,
        2 => TX_BUFS + k * 0x100,
        3 => MEM_SIZE as u64 - k % 0x100,
        4 => 0x10_0000 + k * 0x10,
        _ => input.u64(),
    }
}

/// A frame: one of the templates (TCP over IPv4 or IPv6, plain) or raw bytes.
fn frame_bytes(input: &mut Input<'_>) -> Vec<u8> {
    match input.u8() % 4 {
        0 => tcp4_frame(usize::from(input.u16()) % 66_000, input.u8()),
        1 => tcp6_frame(usize::from(input.u16()) % 66_000),
        2 => frame(usize::from(input.u16()) % 10_000, input.u8()),
        _ => input.chunk(2048).to_vec(),
    }
}

/// A packet on TX queue `q`: up to four descriptors, then the doorbell.
fn transmit(h: &mut Harness, input: &mut Input<'_>, q: usize) {
    let f = frame_bytes(input);
    let slot = u64::from(input.u8() % 64);
    let addr = h.put_frame(slot, &f[..f.len().min(0x1_0000)]);
    let n = 1 + input.u8() % 4;
    let bufs: Vec<(u64, u32)> = (0..n)
        .map(|i| {
            let at = if input.u8() & 3 == 0 {
                address(input)
            } else {
                addr + u64::from(i) * 0x3000
            };
            let len = match input.u8() % 3 {
                0 => f.len() as u32,
                1 => u32::from(input.u16()),
                _ => 0,
            };
            (at, len)
        })
        .collect();
    let sop = Sop {
        om: u32::from(input.u8() % 4),
        hlen: match input.u8() % 3 {
            0 => 34,
            1 => 54,
            _ => u32::from(input.u16()) % 1024,
        },
        msscof: match input.u8() % 3 {
            0 => 50,
            1 => 1448,
            _ => u32::from(input.u16()) % 16384,
        },
        tci: input.bool().then(|| input.u16()),
    };
    let eop = input.u8() & 7 != 0;
    h.post_tx(q, &bufs, sop, eop);
    doorbell(h, q as u64, h.tx[q].fill);
    settle();
}

/// Up to 16 RX buffers in ring `ring` of RX queue `q`.
fn post_buffers(h: &mut Harness, input: &mut Input<'_>, q: usize) {
    let ring = usize::from(input.u8() % 2);
    let count = 1 + u32::from(input.u8() % 16);
    let len = match input.u8() % 4 {
        0 => 1536,
        1 => 4096,
        2 => 3072,
        _ => u32::from(input.u16()) & 0x3fff,
    };
    let body = input.u16();
    h.post_rx(q, ring, count, len, |i| body >> (i % 16) & 1 == 1);
    if input.bool() {
        let reg = RXPROD + 0x200 * ring as u64 + 8 * q as u64;
        h.bus
            .mmio_write(h.bar(PT_BAR) + reg, &h.rx[q].fill[ring].to_le_bytes());
    }
}

fn receive(h: &Harness, input: &mut Input<'_>) {
    let hdr = if input.u8() & 3 == 0 {
        VnetHdr {
            flags: input.u8(),
            gso_type: input.u8(),
            hdr_len: input.u16(),
            gso_size: input.u16(),
            csum_start: input.u16(),
            csum_offset: input.u16(),
        }
    } else {
        VnetHdr::default()
    };
    let mut f = frame_bytes(input);
    f.truncate(MAX_FRAME_LEN);
    h.backend.inject_with(hdr, f);
    settle();
}

/// A command (mostly one of revision 1's) written to CMD, then CMD read back.
fn command(h: &Harness, input: &mut Input<'_>) {
    let cmd = match input.u8() % 4 {
        0 => 0xcafe_0000 + u32::from(input.u8() % 16),
        1 => 0xf00d_0000 + u32::from(input.u8() % 16),
        2 => [0xcafe_0000, 0xcafe_0001, 0xcafe_0002][usize::from(input.u8() % 3)],
        _ => input.u32(),
    };
    h.cmd(cmd);
    settle();
}

/// A driver that resets and activates the device gets a frame sent and one received.
fn assert_healthy(h: &mut Harness) {
    h.backend.fail_send.store(false, Ordering::SeqCst);
    h.backend.set_link(true);
    h.port.set_carrier(true);
    h.cmd(0xcafe_0001);
    h.cmd(0xcafe_0002);
    assert_eq!(
        h.activate_with(DriverLayout::new(1, 1, 64, 1500)),
        0,
        "activation after the input"
    );
    settle();
    h.backend.take_sent();
    let f = frame(100, 7);
    h.send_one(0, &f, Sop::default());
    h.wait_tx_completions(0, 1);
    assert!(
        h.backend.take_sent().iter().any(|(_, sent)| *sent == f),
        "frame sent"
    );
    h.post_rx(0, 0, 1, 1536, |_| false);
    h.backend.inject(f.clone());
    let c = h.wait_rx_completions(0, 1);
    assert_eq!(h.read_rx(0, c[0].idx, c[0].len), f, "frame received");
}

thread_local! {
    /// The function the next input runs on, as a new one.
    static HARNESS: RefCell<Option<Harness>> = const { RefCell::new(None) };
}

fuzz_target!(|data: &[u8]| {
    inline_workers();
    let mut input = Input(data);
    let mut h = HARNESS.take().unwrap_or_else(Harness::new);
    // The worker serves what the set-up signalled, as a new function's would.
    settle();
    let l = layout(&mut input);
    // The harness posts into the layout's rings only once the device has accepted them.
    let mut posting = h.activate_with(l) == 0;
    let mut migrations = 0;
    // The function the next input runs on, once a migration left this one's destination.
    let mut next = None;
    for _ in 0..MAX_OPS {
        if input.is_empty() {
            break;
        }
        match input.u8() % 12 {
            0 | 1 if posting => {
                let q = usize::from(input.u8()) % h.tx.len();
                transmit(&mut h, &mut input, q);
            }
            2 if posting => {
                let q = usize::from(input.u8()) % h.rx.len();
                post_buffers(&mut h, &mut input, q);
            }
            3 => receive(&h, &mut input),
            4 => {
                // Guest memory: DriverShared, the queue descriptors, the rings, the buffers.
                let at = match input.u8() % 4 {
                    0 => SHARED + u64::from(input.u16()) % 720,
                    1 => {
                        let offset = 256 * u64::from(input.u8() % 16) + u64::from(input.u8());
                        h.layout.queue_table.wrapping_add(offset)
                    }
                    2 => {
                        let q = usize::from(input.u8() % 8);
                        let ring = match input.u8() % 3 {
                            0 => h.layout.tx_ring(q),
                            r => h.layout.rx_ring(q, usize::from(r - 1)),
                        };
                        let offset =
                            16 * u64::from(input.u16() % 4096) + u64::from(input.u8() % 16);
                        ring.wrapping_add(offset)
                    }
                    _ => address(&mut input),
                };
                let bytes = input.chunk(64);
                let _ = h.mem.write_slice(bytes, GuestAddress(at));
            }
            5 => command(&h, &mut input),
            6 => {
                // A doorbell of any TX queue, any value.
                doorbell(&h, u64::from(input.u8() % 8), input.u32());
                settle();
            }
            7 => {
                // Any register access, any width (BAR 2: the MSI-X table and PBA).
                let bar = usize::from(input.u8() % 3);
                let offset = u64::from(input.u16()) % BAR_SIZES[bar];
                let len = [4, 4, 1, 2, 8][usize::from(input.u8() % 5)];
                let addr = h.bar(bar) + offset;
                if input.bool() {
                    let value = input.u64().to_le_bytes();
                    h.bus.mmio_write(addr, &value[..len]);
                    settle();
                } else {
                    h.bus.mmio_read(addr, &mut [0u8; 8][..len]);
                }
            }
            8 => {
                // Config space, except the command register and the BARs: moving or
                // unmapping those only makes the rest of the input miss the device.
                let reg = match input.u8() % 64 {
                    1 | 4..=9 => 15,
                    r => r,
                };
                let offset = u16::from(input.u8() % 4);
                let value = input.u32().to_le_bytes();
                let len = 1 + usize::from(input.u8() % 4);
                h.cfg_write(
                    reg.into(),
                    offset,
                    &value[..len.min(4 - usize::from(offset))],
                );
            }
            9 => {
                // Carrier changes (link events), the backend refusing frames, or VD registers
                // Linux writes: MAC, ECR acknowledgements, IMR masks.
                match input.u8() % 4 {
                    0 => h.port.set_carrier(input.bool()),
                    1 => h.backend.fail_send.store(input.bool(), Ordering::SeqCst),
                    2 => h.write(
                        VD_BAR,
                        [MACL, MACH, ECR][usize::from(input.u8() % 3)],
                        input.u32(),
                    ),
                    _ => h.write(PT_BAR, 8 * u64::from(input.u8() % 25), input.u32()),
                }
                settle();
            }
            10 if migrations < MAX_MIGRATIONS => {
                // A live migration: the source pauses, its snapshot restores onto a fresh
                // device over a copy of guest memory, which resumes.
                migrations += 1;
                h.bus.pause().expect("pause");
                let dest = Harness::migrate(&h);
                // The source starts over at once, as a new function (it resumes first:
                // the worker of a paused one would wait), and is what the next input
                // runs on; it sits idle meanwhile.
                let mut source = std::mem::replace(&mut h, dest);
                source.bus.resume().expect("resume");
                source.reset();
                next = Some(source);
                h.bus.resume().expect("resume");
                settle();
            }
            11 => {
                // MSI-X table entries as the driver programs them, or not.
                let entry = u64::from(input.u8() % 32) * 16 + u64::from(input.u8() % 4) * 4;
                let addr = h.bar(MSIX_BAR) + entry;
                h.bus.mmio_write(addr, &input.u32().to_le_bytes());
            }
            _ => {
                // The driver starts over with a new layout.
                h.cmd(0xcafe_0002);
                let l = layout(&mut input);
                posting = h.activate_with(l) == 0;
                settle();
            }
        }
    }
    settle();
    assert_healthy(&mut h);
    // Reset now rather than at the next input's start: what this input allocated is freed
    // within it, so libFuzzer's leak check (run when an input allocates more than it frees)
    // does not run after every input. A destination is not kept (its MAC announcements run
    // on a timer for 450 ms after its resume, into later inputs): its source, reset when
    // it migrated, is.
    let kept = match next {
        Some(source) => source,
        None => {
            h.reset();
            h
        }
    };
    HARNESS.set(Some(kept));
});

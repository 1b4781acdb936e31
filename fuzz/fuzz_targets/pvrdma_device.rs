// SPDX-License-Identifier: Apache-2.0
//! The PVRDMA device as a hostile guest sees it, through the simulated driver
//! (`pvrdma::sim_driver`, the real device on a mock PCI bus over real guest memory): two
//! probed devices with a connected RC QP pair and an MR each, then a fuzzer-chosen sequence
//! of writes into the DSR, command and response slots, page directories, rings, ring
//! indices, WQEs and MR pages; raw commands; send and receive WQEs with doorbells; raw
//! doorbells, register and config-space accesses; crafted RoCE frames from the peer.
//! The devices' workers run on the fuzzer's thread after every step
//! (`pvrdma_vmm_fuzz::settle`), as they would on their own threads, only without waiting.
//! The two devices and their guest memory are built and set up once, then saved as a VMM
//! saves them (`SimDriver::checkpoint`: device state and the guest memory written); after
//! each input both are put back (`SimDriver::rewind`: configuration space restored, the
//! device's RESET, guest memory as saved, the device's own restore), which leaves them as a
//! new pair would be (the device test `lifetime::a_rewound_pair_is_a_new_pair`), at a
//! fraction of the cost of building them or of probing and making the objects again.
//! Invariants: no panic (libFuzzer aborts on one), no hang (`-timeout` catches a worker that
//! never finishes its turn), no large allocation (`-malloc_limit_mb`).
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use pvrdma::sim_driver::endpoint::{rc_pair, Endpoint, GID_A, GID_B, MAC_A, MAC_B};
use pvrdma::sim_driver::{Checkpoint, SimDriver, MEM_SIZE};
use pvrdma_abi::dsr::Dsr;
use pvrdma_abi::regs::{uar, BAR_REG, BAR_UAR};
use pvrdma_abi::wqe::{Sge, SqWqeHdr};
use pvrdma_abi::PAGE_SIZE;
use pvrdma_vmm_fuzz::{frame, inline_workers, settle, Input};
use rdma_transport::net::{ip_from_gid, Encap, IpInfo};
use vm_memory::{ByteValued, Bytes, GuestAddress};

/// Ops per input; each is bounded, so an input is.
const MAX_OPS: usize = 48;
/// Guest addresses worth corrupting: the DSR, the slots, every ring's index page, data
/// pages and directory, the QP ring header, the MR pages.
fn targets(e: &Endpoint) -> Vec<u64> {
    let sim = &e.sim;
    let mut t = vec![sim.dsr, sim.cmd_slot, sim.resp_slot, e.qp.header];
    let dsr: Dsr = sim.read(sim.dsr);
    for pdir in [dsr.async_ring_pages.pdir_dma, dsr.cq_ring_pages.pdir_dma] {
        t.push(pdir);
        if let Ok(table) = sim.mem.read_obj::<u64>(GuestAddress(pdir)) {
            t.push(table);
        }
    }
    for ring in [&sim.async_ring, &sim.cq_notify_ring].into_iter().flatten() {
        t.push(ring.indices & !(PAGE_SIZE - 1));
        t.extend(&ring.data);
    }
    t.push(e.cq.ring.indices & !(PAGE_SIZE - 1));
    t.extend(&e.cq.ring.data);
    t.push(e.qp.sq.indices & !(PAGE_SIZE - 1));
    t.extend(&e.qp.sq.data);
    if let Some(rq) = &e.qp.rq {
        t.push(rq.indices & !(PAGE_SIZE - 1));
        t.extend(&rq.data);
    }
    t.extend(e.pages.iter().take(2));
    t
}

fn sge(input: &mut Input<'_>, e: &Endpoint) -> Sge {
    match input.u8() % 4 {
        0 => {
            let mut s = Sge::default();
            let raw = input.bytes(16);
            s.as_mut_slice()[..raw.len()].copy_from_slice(raw);
            s
        }
        _ => e.sge(u64::from(input.u16()), u32::from(input.u16()) % 5000),
    }
}

/// A 32-bit MMIO write as the vCPU would make it: nothing asserts that it decodes.
fn mmio_write(sim: &SimDriver, addr: u64, value: u32) {
    let _ = sim.bus.mmio_write(addr, &value.to_le_bytes());
}

fn mmio_read(sim: &SimDriver, addr: u64) {
    let _ = sim.bus.mmio_read(addr, &mut [0u8; 4]);
}

/// A doorbell write delivered as KVM would: to a matching ioeventfd, else as MMIO.
fn doorbell(sim: &SimDriver, page: u32, offset: u64, value: u32) {
    let addr = sim.bars[BAR_UAR] + u64::from(page) * PAGE_SIZE + offset;
    match sim.ioevents.lookup(addr, value) {
        Some(fd) => {
            let _ = fd.write(1);
        }
        None => mmio_write(sim, addr, value),
    }
}

fn peer_frame(transport: &[u8]) -> Option<Vec<u8>> {
    let ip = IpInfo {
        src: ip_from_gid(GID_A),
        dst: ip_from_gid(GID_B),
        tclass: 0,
        hop_limit: 64,
        flow_label: 0,
    };
    frame(&ip, (MAC_A, MAC_B), 0xc000, Encap::V2, transport)
}

/// The pair the next input runs on, as a new one, and what it goes back to afterwards.
struct Kept {
    ends: [Endpoint; 2],
    saved: [Checkpoint; 2],
}

/// A new pair, its workers done with what setting it up signalled, saved.
fn set_up() -> Kept {
    let (mut a, mut b) = rc_pair();
    settle();
    let saved = [a.sim.checkpoint(), b.sim.checkpoint()];
    Kept {
        ends: [a, b],
        saved,
    }
}

thread_local! {
    static PAIR: RefCell<Option<Kept>> = const { RefCell::new(None) };
}

fuzz_target!(|data: &[u8]| {
    inline_workers();
    let Kept { mut ends, saved } = PAIR.take().unwrap_or_else(set_up);
    // The workers serve what the restore signalled (every QP is run once).
    settle();
    let mut input = Input(data);
    let targets = [targets(&ends[0]), targets(&ends[1])];
    for _ in 0..MAX_OPS {
        if input.is_empty() {
            break;
        }
        let op = input.u8();
        let i = usize::from(op >> 7);
        let e = &mut ends[i];
        match op % 10 {
            0 => {
                // Guest memory: near a structure the device reads, or anywhere in RAM.
                let at = if input.bool() {
                    let t = &targets[i];
                    t[usize::from(input.u8()) % t.len()] + u64::from(input.u16()) % PAGE_SIZE
                } else {
                    input.u64() % MEM_SIZE
                };
                let bytes = input.chunk(64);
                let _ = e.sim.mem.write_slice(bytes, GuestAddress(at));
            }
            1 => {
                // A raw command: 184 bytes, the code usually one of the ABI's.
                let mut req = [0u8; 184];
                let body = input.chunk(184);
                req[..body.len()].copy_from_slice(body);
                if input.bool() {
                    req[8..12].copy_from_slice(&u32::from(input.u8() % 24).to_le_bytes());
                }
                let _ = e.sim.post_raw(&req);
            }
            2 => {
                // A send WQE at the producer index, then the doorbell.
                let mut hdr = SqWqeHdr::default();
                let raw = input.bytes(80);
                hdr.as_mut_slice()[..raw.len()].copy_from_slice(raw);
                hdr.opcode %= if input.bool() { 16 } else { u32::MAX };
                let sges: Vec<Sge> = (0..input.u8() % 3).map(|_| sge(&mut input, e)).collect();
                // post_send_wqe sets num_sge from the list; a lying count comes from op 0.
                e.sim.post_send_wqe(&e.qp, hdr, &sges);
            }
            3 => {
                let sges: Vec<Sge> = (0..input.u8() % 3).map(|_| sge(&mut input, e)).collect();
                e.sim.post_recv_sges(&e.qp, input.u64(), &sges);
            }
            4 => {
                // A raw doorbell on a UAR page.
                let page = if input.bool() {
                    e.qp.page
                } else {
                    input.u32() % 1024
                };
                let offset = match input.u8() % 4 {
                    0 => uar::QP_OFFSET,
                    1 => uar::CQ_OFFSET,
                    2 => uar::SRQ_OFFSET,
                    _ => u64::from(input.u16()) % PAGE_SIZE,
                };
                let value = if input.bool() {
                    let handle = [e.qp.handle, e.cq.handle, input.u32() & 0xff_ffff];
                    handle[usize::from(input.u8()) % 3] | u32::from(input.u8() >> 5) << 29
                } else {
                    input.u32()
                };
                doorbell(&e.sim, page, offset, value);
            }
            5 => {
                // A register write (CTL, REQUEST, DSR halves, IMR, ...) or read.
                let off = u64::from(input.u8() % 0x30) & !3;
                let value = input.u32();
                let addr = e.sim.bars[BAR_REG] + off;
                if input.bool() {
                    mmio_write(&e.sim, addr, value);
                } else {
                    mmio_read(&e.sim, addr);
                }
            }
            6 => {
                // UAR reads and odd writes anywhere in BAR2's first pages.
                let addr = e.sim.bars[BAR_UAR] + u64::from(input.u16()) % (4 * PAGE_SIZE);
                if input.bool() {
                    mmio_read(&e.sim, addr);
                } else {
                    mmio_write(&e.sim, addr, input.u32());
                }
            }
            7 => {
                // A crafted RoCE frame from A's address to B's.
                let transport = input.chunk(1100);
                if let Some(f) = peer_frame(transport) {
                    let b = &ends[1];
                    b.sim.port.steer_to_rdma(&f);
                }
            }
            8 => {
                // Config space, except the command register and the BARs: moving or
                // unmapping those only makes the rest of the input miss the device.
                let reg = match input.u8() % 64 {
                    1 | 4..=9 => 15,
                    r => r,
                };
                let value = input.u32();
                e.sim.cfg_write(reg, value);
            }
            _ => {
                // The driver consumes its CQ: consumer index := producer index.
                let idx = e.cq.ring.indices;
                if let Ok(prod) = e.sim.mem.read_obj::<u32>(GuestAddress(idx)) {
                    let _ = e.sim.mem.write_obj(prod, GuestAddress(idx + 4));
                }
                e.sim.arm_cq(&e.cq, input.bool());
            }
        }
        // Both devices' workers serve whatever this step signalled.
        settle();
    }
    // Reset now rather than at the next input's start: what this input allocated is freed
    // within it, so libFuzzer's leak check (run when an input allocates more than it frees)
    // does not run after every input.
    for (e, saved) in ends.iter_mut().zip(&saved) {
        e.sim.rewind(saved);
    }
    PAIR.set(Some(Kept { ends, saved }));
});

// SPDX-License-Identifier: Apache-2.0
//! The RoCE v2 engine (`rdma_transport::qp::Qp`): two QPs over in-memory MRs, driven by a
//! fuzzer-chosen sequence of posts, exchanges (with loss and duplication), crafted or
//! mutated frames (framed with a valid ICRC so they reach the engine), timer ticks, errors
//! and save/restore. Invariants: no panic; every MR access the engine makes lies inside a
//! valid MR (the table asserts it); bounded frames per packet and per flush.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pvrdma_vmm_fuzz::{fix_icrc, frame, ip_info, Input};
use rdma_transport::net::Encap;
use rdma_transport::packet::{parse, Addr};
use rdma_transport::psn::Psn;
use rdma_transport::qp::{Io, Qp, QpAttrs, SendEntry};
use rdma_transport::req::{Remote, SendWqe};
use rdma_transport::resp::RecvWqe;
use rdma_transport::verbs::*;

/// Frames one `on_packet` may emit: an ACK or NAK, or an atomic or READ response.
const MAX_FRAMES_PER_PACKET: usize = 64;
/// Flush budget per call, as the device uses a bounded one.
const BUDGET: usize = 64;
/// Ops per input: each is bounded, so an input is.
const MAX_OPS: usize = 256;
/// Largest MR a fast registration may create here (the device bounds it by its page list).
const MAX_FRMR: u64 = 1 << 16;

struct Mr {
    key: u32,
    pd: u32,
    access: Access,
    iova: u64,
    buf: Vec<u8>,
    valid: bool,
}

/// MRs of both PDs with various rights, one near the top of the IOVA space, one FRMR.
struct Mem(Vec<Mr>);

impl Mem {
    fn new() -> Self {
        let mr = |key, pd, access, iova, len, valid| Mr {
            key,
            pd,
            access,
            iova,
            buf: vec![0; len],
            valid,
        };
        Mem(vec![
            mr(0x100, 1, Access::all(), 0, 8192, true),
            mr(
                0x201,
                1,
                Access::LOCAL_WRITE | Access::REMOTE_READ,
                u64::MAX - 8191,
                4096,
                true,
            ),
            mr(0x300, 2, Access::all(), 0x1000, 4096, true),
            mr(0x400, 1, Access::empty(), 0, 0, false),
        ])
    }

    /// The valid MR `key` and the offset of `[iova, iova+len)` in it, which the engine must
    /// have checked before reading or writing.
    fn checked(&self, key: u32, iova: u64, len: usize) -> (usize, usize) {
        let mr = self
            .0
            .iter()
            .position(|m| m.key == key && m.valid)
            .unwrap_or_else(|| panic!("access to invalid key {key:#x}"));
        let m = &self.0[mr];
        let off = iova
            .checked_sub(m.iova)
            .filter(|&o| {
                o.checked_add(len as u64)
                    .is_some_and(|e| e <= m.buf.len() as u64)
            })
            .unwrap_or_else(|| panic!("access outside key {key:#x}: {iova:#x}+{len}"));
        (mr, off as usize)
    }
}

impl MrTable for Mem {
    fn lookup(&self, key: u32) -> Option<MrInfo> {
        self.0
            .iter()
            .find(|m| m.key == key && m.valid)
            .map(|m| MrInfo {
                pd: m.pd,
                access: m.access,
                iova: m.iova,
                len: m.buf.len() as u64,
            })
    }
    fn read(&self, key: u32, iova: u64, b: &mut [u8]) -> Result<(), MemError> {
        let (mr, off) = self.checked(key, iova, b.len());
        b.copy_from_slice(&self.0[mr].buf[off..off + b.len()]);
        Ok(())
    }
    fn write(&mut self, key: u32, iova: u64, d: &[u8]) -> Result<(), MemError> {
        let (mr, off) = self.checked(key, iova, d.len());
        self.0[mr].buf[off..off + d.len()].copy_from_slice(d);
        Ok(())
    }
    fn invalidate(&mut self, key: u32, pd: u32) -> bool {
        match self
            .0
            .iter_mut()
            .find(|m| m.key == key && m.valid && m.pd == pd)
        {
            Some(m) => {
                m.valid = false;
                true
            }
            None => false,
        }
    }
    fn fast_reg(&mut self, fr: &FastReg, pd: u32) -> bool {
        let Some(m) = self
            .0
            .iter_mut()
            .find(|m| m.key >> 8 == fr.key >> 8 && m.pd == pd && !m.valid)
        else {
            return false;
        };
        if fr.len > MAX_FRMR {
            return false;
        }
        m.key = fr.key;
        m.iova = fr.iova;
        m.buf = vec![0; fr.len as usize];
        m.access = Access::from_bits_truncate(fr.access);
        m.valid = true;
        true
    }
}

#[derive(Default)]
struct Cq(usize);
impl CompletionSink for Cq {
    fn complete(&mut self, _: WorkCompletion, _: bool) {
        self.0 += 1;
    }
}

#[derive(Default)]
struct Net(Vec<Vec<u8>>);
impl PacketSink for Net {
    fn send(&mut self, f: Vec<u8>) {
        self.0.push(f);
    }
}

struct Node {
    qp: Qp,
    mem: Mem,
    cq: Cq,
    out: Net,
}

impl Node {
    fn io(&mut self) -> (&mut Qp, Io<'_>) {
        (
            &mut self.qp,
            Io {
                mr: &mut self.mem,
                cq: &mut self.cq,
                net: &mut self.out,
                srq: None,
            },
        )
    }

    /// Hands a frame to the QP if it parses; checks the work it caused is bounded.
    fn receive(&mut self, f: &[u8], now: u64) {
        let Ok(p) = parse(f) else { return };
        let before = self.out.0.len();
        let (qp, mut io) = self.io();
        qp.on_packet(&p, now, &mut io);
        let emitted = self.out.0.len() - before;
        assert!(
            emitted <= MAX_FRAMES_PER_PACKET,
            "{emitted} frames for one packet"
        );
    }
}

const KEYS: [u32; 5] = [0x100, 0x201, 0x300, 0x400, 0x401];
const OPCODES: [WrOpcode; 10] = [
    WrOpcode::RdmaWrite,
    WrOpcode::RdmaWriteWithImm,
    WrOpcode::Send,
    WrOpcode::SendWithImm,
    WrOpcode::RdmaRead,
    WrOpcode::AtomicCmpAndSwp,
    WrOpcode::AtomicFetchAndAdd,
    WrOpcode::LocalInv,
    WrOpcode::SendWithInv,
    WrOpcode::RegMr,
];

fn key(input: &mut Input<'_>) -> u32 {
    let k = input.u8();
    match KEYS.get(usize::from(k % 8)) {
        Some(&k) => k,
        None => input.u32(),
    }
}

fn addr(input: &mut Input<'_>) -> u64 {
    match input.u8() % 4 {
        0 => input.u64(),
        1 => u64::MAX - u64::from(input.u16()),
        _ => u64::from(input.u16()),
    }
}

fn sges(input: &mut Input<'_>) -> Vec<Sge> {
    (0..input.u8() % 4)
        .map(|_| Sge {
            addr: addr(input),
            len: if input.bool() {
                input.u32()
            } else {
                u32::from(input.u16()) % 9000
            },
            lkey: key(input),
        })
        .collect()
}

fn attrs(me: u8, peer: u8, mode: u8) -> QpAttrs {
    QpAttrs {
        qpn: u32::from(me),
        dest_qpn: u32::from(peer),
        pd: 1,
        access: Access::all(),
        mtu: 256 << (mode % 5),
        ud: mode & 0x80 != 0,
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: (mode >> 3) & 7,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        qkey: 0x1234,
        sq_psn: Psn::new(0xff_fff0),
        rq_psn: Psn::new(0xff_fff0),
        addr: Addr {
            src_mac: [2, 0, 0, 0, 0, me],
            dst_mac: [2, 0, 0, 0, 0, peer],
            ip: ip_info(false, me, peer),
            udp_sport: 0xc000,
            encap: Encap::V2,
        },
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let mode = input.u8();
    let node = |me, peer| Node {
        qp: Qp::new(attrs(me, peer, mode)),
        mem: Mem::new(),
        cq: Cq::default(),
        out: Net::default(),
    };
    let mut n = [node(1, 2), node(2, 1)];
    let mut now = 0u64;
    for _ in 0..MAX_OPS {
        if input.is_empty() {
            break;
        }
        let op = input.u8();
        let i = usize::from(op >> 7);
        match op % 8 {
            0 => {
                let opcode = OPCODES[usize::from(input.u8()) % OPCODES.len()];
                let sges = sges(&mut input);
                let total = sges.iter().try_fold(0u32, |a, s| a.checked_add(s.len));
                let len = if input.bool() {
                    input.u32()
                } else {
                    total.unwrap_or(0)
                };
                let wqe = SendWqe {
                    wr_id: input.u64(),
                    opcode,
                    len,
                    solicited: input.bool(),
                    imm_or_inv: if input.bool() {
                        key(&mut input)
                    } else {
                        input.u32()
                    },
                    remote: Remote {
                        addr: addr(&mut input),
                        rkey: key(&mut input),
                        compare_add: input.u64(),
                        swap: input.u64(),
                        ud_qpn: u32::from(input.u8() % 4),
                        ud_qkey: if input.bool() { 0x1234 } else { input.u32() },
                    },
                };
                let fast_reg = input.bool().then(|| FastReg {
                    key: key(&mut input),
                    iova: addr(&mut input),
                    len: u64::from(input.u32()),
                    access: input.u32(),
                    page_list: input.u64(),
                    pages: input.u32(),
                });
                let ah = (mode & 0x80 != 0).then(|| n[i].qp.attrs().addr);
                let _ = n[i].qp.post_send(SendEntry {
                    wqe,
                    sges,
                    signaled: input.bool(),
                    ah,
                    fast_reg,
                });
            }
            1 => {
                let w = RecvWqe {
                    wr_id: input.u64(),
                    sges: sges(&mut input),
                };
                let _ = n[i].qp.post_recv(w);
            }
            2 => {
                // Both flush, then frames cross, each kept, dropped or doubled by two bits.
                let mut fate = input.u64();
                for j in 0..2 {
                    let (qp, mut io) = n[j].io();
                    let sent = qp.flush(now, &mut io, BUDGET);
                    assert!(sent <= BUDGET);
                    qp.on_timer(now, &mut io);
                }
                for j in 0..2 {
                    let frames = std::mem::take(&mut n[j].out.0);
                    for f in frames {
                        let copies = match fate & 3 {
                            0 => 0,
                            3 => 2,
                            _ => 1,
                        };
                        fate = fate.rotate_right(2);
                        for _ in 0..copies {
                            n[1 - j].receive(&f, now);
                        }
                    }
                }
            }
            3 => {
                // A crafted packet from the peer's address.
                let transport = input.chunk(600);
                let ip = ip_info(false, 2 - i as u8, 1 + i as u8);
                let macs = ([2, 0, 0, 0, 0, 2 - i as u8], [2, 0, 0, 0, 0, 1 + i as u8]);
                if let Some(f) = frame(&ip, macs, 0xc000, Encap::V2, transport) {
                    n[i].receive(&f, now);
                }
            }
            4 => {
                // A frame the peer sent, mutated on the way (ICRC fixed up).
                let out = &n[1 - i].out.0;
                if out.is_empty() {
                    continue;
                }
                let mut f = out[usize::from(input.u8()) % out.len()].clone();
                for _ in 0..input.u8() % 4 {
                    let at = usize::from(input.u16()) % f.len();
                    f[at] = input.u8();
                }
                if input.bool() {
                    fix_icrc(&mut f);
                }
                n[i].receive(&f, now);
            }
            5 => {
                now = now.saturating_add(u64::from(input.u32()) * 1000);
                let (qp, mut io) = n[i].io();
                qp.on_timer(now, &mut io);
            }
            6 => n[i].qp.set_error(),
            _ => {
                let state = n[i].qp.save();
                n[i].qp = Qp::restore(state).expect("a saved QP restores");
            }
        }
        for nd in &mut n {
            // Frames nobody delivered are lost, as on a wire.
            if nd.out.0.len() > 1024 {
                nd.out.0.clear();
            }
        }
    }
});

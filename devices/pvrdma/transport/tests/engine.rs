// SPDX-License-Identifier: Apache-2.0
//! Two in-memory engines over a seeded lossy channel: end-to-end verbs,
//! error statuses and loss recovery.
#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use rdma_transport::net::{Encap, IpInfo, RoceVersion};
use rdma_transport::packet::{parse, parse_unsealed, seal, Addr, Packet};
use rdma_transport::psn::Psn;
use rdma_transport::qp::{Io, Qp, QpAttrs, QpState, RestoreError, SendEntry};
use rdma_transport::req::{Remote, SendWqe, MAX_SEGMENT};
use rdma_transport::resp::RecvWqe;
use rdma_transport::verbs::*;

struct Mem {
    buf: Vec<u8>,
    valid: bool,
}
impl MrTable for Mem {
    fn lookup(&self, key: u32) -> Option<MrInfo> {
        (key == 1 && self.valid).then_some(MrInfo {
            pd: 1,
            access: Access::all(),
            iova: 0,
            len: self.buf.len() as u64,
        })
    }
    fn read(&self, _: u32, iova: u64, b: &mut [u8]) -> Result<(), MemError> {
        let i = iova as usize;
        b.copy_from_slice(&self.buf[i..i + b.len()]);
        Ok(())
    }
    fn write(&mut self, _: u32, iova: u64, d: &[u8]) -> Result<(), MemError> {
        let i = iova as usize;
        self.buf[i..i + d.len()].copy_from_slice(d);
        Ok(())
    }
    fn invalidate(&mut self, key: u32, _: u32) -> bool {
        let ok = key == 1 && self.valid;
        self.valid = false;
        ok
    }
    fn fast_reg(&mut self, fr: &rdma_transport::verbs::FastReg, _: u32) -> bool {
        let ok = fr.key == 1 && !self.valid;
        self.valid |= ok;
        ok
    }
}

#[derive(Default)]
struct Cq(Vec<(WorkCompletion, bool)>);
impl CompletionSink for Cq {
    fn complete(&mut self, wc: WorkCompletion, send: bool) {
        self.0.push((wc, send));
    }
}
#[derive(Default)]
struct Net(Vec<Vec<u8>>);
impl PacketSink for Net {
    fn send(&mut self, mut f: Vec<u8>) {
        seal(&mut f).expect("the engine's frames seal");
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
    /// Its QP's `flush` over its memory, CQ and outgoing frames.
    fn flush(&mut self, now: u64) -> usize {
        let mut io = Io {
            mr: &mut self.mem,
            cq: &mut self.cq,
            net: &mut self.out,
            srq: None,
        };
        self.qp.flush(now, &mut io, 64)
    }

    /// Its QP's `on_packet`, likewise.
    fn on_packet(&mut self, pkt: &Packet<'_>, now: u64) {
        let mut io = Io {
            mr: &mut self.mem,
            cq: &mut self.cq,
            net: &mut self.out,
            srq: None,
        };
        self.qp.on_packet(pkt, now, &mut io);
    }
}

fn attrs(me: u8, peer: u8, psn: u32, peer_psn: u32) -> QpAttrs {
    QpAttrs {
        qpn: u32::from(me),
        dest_qpn: u32::from(peer),
        pd: 1,
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        mtu: 256,
        ud: false,
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 2,
        min_rnr_timer: 1,
        max_rd_atomic: 16,
        qkey: 0x1234,
        sq_psn: Psn::new(psn),
        rq_psn: Psn::new(peer_psn),
        addr: Addr {
            src_mac: [2, 0, 0, 0, 0, me],
            dst_mac: [2, 0, 0, 0, 0, peer],
            ip: IpInfo {
                src: Ipv4Addr::new(10, 0, 0, me).into(),
                dst: Ipv4Addr::new(10, 0, 0, peer).into(),
                tclass: 0,
                hop_limit: 64,
                flow_label: 0,
            },
            udp_sport: 0xc000,
            encap: Encap::V2,
        },
    }
}

struct World {
    n: [Node; 2],
    rng: u64,
    drop_pct: u64,
    now: u64,
    /// How the frames that crossed were framed.
    seen: Vec<Encap>,
    /// A link of bounded capacity instead of instant delivery: each
    /// direction queues at most `cap` frames (the rest are dropped at the
    /// tail, as a TAP's queue drops) and delivers `rate` per round.
    link: Option<Link>,
    /// Frames cross as on the same-host channel (segments allowed).
    same_host: bool,
    /// The largest payload that crossed.
    largest: usize,
}

/// A bridge and TAP between the two engines, per direction.
struct Link {
    cap: usize,
    rate: usize,
    queues: [VecDeque<Vec<u8>>; 2],
    /// Frames dropped at the tail of a full queue.
    dropped: u64,
}

impl Link {
    fn new(cap: usize, rate: usize) -> Self {
        Link {
            cap,
            rate,
            queues: [VecDeque::new(), VecDeque::new()],
            dropped: 0,
        }
    }
}

impl World {
    fn new(psn: u32, ud: bool) -> Self {
        let node = |me, peer| {
            let mut a = attrs(me, peer, psn, psn);
            a.ud = ud;
            Node {
                qp: Qp::new(a),
                mem: Mem {
                    buf: vec![0; 8192],
                    valid: true,
                },
                cq: Cq::default(),
                out: Net::default(),
            }
        };
        World {
            n: [node(1, 2), node(2, 1)],
            rng: 0x9e37_79b9,
            drop_pct: 0,
            now: 0,
            seen: Vec::new(),
            link: None,
            same_host: false,
            largest: 0,
        }
    }
    /// [`World::new`] with both QPs framing their packets with `encap`.
    fn with_encap(psn: u32, ud: bool, encap: Encap) -> Self {
        let mut w = World::new(psn, ud);
        for n in &mut w.n {
            let mut a = *n.qp.attrs();
            a.addr.encap = encap;
            n.qp = Qp::new(a);
        }
        w
    }
    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % 100
    }
    /// Runs both engines until idle (or `steps` rounds), with loss,
    /// duplication and reordering from the seed.
    fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            let mut moved = 0;
            for i in 0..2 {
                let nd = &mut self.n[i];
                let mut io = Io {
                    mr: &mut nd.mem,
                    cq: &mut nd.cq,
                    net: &mut nd.out,
                    srq: None,
                };
                moved += nd.qp.flush(self.now, &mut io, 64);
                nd.qp.on_timer(self.now, &mut io);
            }
            for i in 0..2 {
                let mut frames = std::mem::take(&mut self.n[i].out.0);
                if let Some(l) = self.link.as_mut() {
                    for f in frames {
                        if l.queues[i].len() < l.cap {
                            l.queues[i].push_back(f);
                        } else {
                            l.dropped += 1;
                        }
                    }
                    let n = l.rate.min(l.queues[i].len());
                    frames = l.queues[i].drain(..n).collect();
                }
                if frames.len() > 1 && self.rand() < self.drop_pct {
                    frames.swap(0, 1);
                }
                for f in frames {
                    moved += 1;
                    let r = self.rand();
                    if r < self.drop_pct {
                        continue;
                    }
                    let copies = if r > 100 - self.drop_pct { 2 } else { 1 };
                    let pkt = if self.same_host {
                        parse_unsealed(&f).unwrap()
                    } else {
                        parse(&f).unwrap()
                    };
                    self.largest = self.largest.max(pkt.payload.len());
                    if !self.seen.contains(&pkt.layers.encap) {
                        self.seen.push(pkt.layers.encap);
                    }
                    let nd = &mut self.n[1 - i];
                    let mut io = Io {
                        mr: &mut nd.mem,
                        cq: &mut nd.cq,
                        net: &mut nd.out,
                        srq: None,
                    };
                    for _ in 0..copies {
                        nd.qp.on_packet(&pkt, self.now, &mut io);
                    }
                }
            }
            self.now += 1_000_000;
            let queued = self
                .link
                .as_ref()
                .map_or(0, |l| l.queues[0].len() + l.queues[1].len());
            if moved == 0
                && queued == 0
                && self.n.iter().all(|n| n.out.0.is_empty())
                && self.now > 50_000_000_000
            {
                break;
            }
        }
    }
    fn post(&mut self, i: usize, opcode: WrOpcode, len: u32, addr: u64, remote: Remote) {
        let wqe = SendWqe {
            wr_id: 100 + u64::from(len),
            opcode,
            len,
            solicited: false,
            imm_or_inv: 0x77,
            remote,
        };
        let sges = vec![Sge { addr, len, lkey: 1 }];
        self.n[i]
            .qp
            .post_send(SendEntry {
                fast_reg: None,
                wqe,
                sges,
                signaled: true,
                ah: None,
            })
            .unwrap();
    }
    fn recv(&mut self, i: usize, addr: u64, len: u32) {
        let sges = vec![Sge { addr, len, lkey: 1 }];
        self.n[i].qp.post_recv(RecvWqe { wr_id: 7, sges }).unwrap();
    }
    fn fill(&mut self, i: usize) {
        for (k, b) in self.n[i].mem.buf.iter_mut().enumerate() {
            *b = (k * 7 + i) as u8;
        }
    }
    fn wcs(&self, i: usize, send: bool) -> Vec<(WcStatus, WcOpcode, u32)> {
        self.n[i]
            .cq
            .0
            .iter()
            .filter(|(_, s)| *s == send)
            .map(|(w, _)| (w.status, w.opcode, w.byte_len))
            .collect()
    }
}

fn remote(addr: u64) -> Remote {
    Remote {
        addr,
        rkey: 1,
        ..Remote::default()
    }
}

#[test]
fn send_write_read_end_to_end_with_psn_wrap_and_loss() {
    for drop_pct in [0, 10, 20] {
        let mut w = World::new(0xff_fffd, false);
        w.drop_pct = drop_pct;
        w.fill(0);
        w.recv(1, 0, 2000);
        w.recv(1, 2000, 100);
        w.post(0, WrOpcode::SendWithImm, 1000, 0, Remote::default());
        w.post(0, WrOpcode::RdmaWrite, 700, 1000, remote(4000));
        w.post(0, WrOpcode::RdmaWriteWithImm, 10, 1700, remote(5000));
        w.post(0, WrOpcode::RdmaRead, 900, 6000, remote(0));
        w.run(2000);
        let s = Success;
        use WcStatus::Success;
        assert_eq!(
            w.wcs(0, true),
            [
                (s, WcOpcode::Send, 1000),
                (s, WcOpcode::RdmaWrite, 700),
                (s, WcOpcode::RdmaWrite, 10),
                (s, WcOpcode::RdmaRead, 900)
            ],
            "drop {drop_pct}"
        );
        assert_eq!(
            w.wcs(1, false),
            [
                (s, WcOpcode::Recv, 1000),
                (s, WcOpcode::RecvRdmaWithImm, 10)
            ]
        );
        let (a, b) = (&w.n[0].mem.buf, &w.n[1].mem.buf);
        assert_eq!(a[..1000], b[..1000]);
        assert_eq!(a[1000..1700], b[4000..4700]);
        assert_eq!(a[1700..1710], b[5000..5010]);
        assert_eq!(a[6000..6900], b[..900]);
        if drop_pct > 0 {
            assert!(w.n[0].qp.metrics.completer_retry > 0);
        }
    }
}

/// A message much longer than the ACK coalescing distance and the MTU
/// the guests use, on a link that loses, duplicates and reorders frames:
/// every gap is NAKed or timed out and resent until the whole message
/// lands.
#[test]
fn long_message_with_loss() {
    for drop_pct in [5, 15] {
        let mut w = World::new(10, false);
        for n in &mut w.n {
            n.mem.buf = vec![0; 1 << 17];
            let mut a = *n.qp.attrs();
            a.mtu = 1024;
            n.qp = Qp::new(a);
        }
        w.drop_pct = drop_pct;
        w.fill(0);
        w.recv(1, 65536, 60_000);
        w.post(0, WrOpcode::Send, 60_000, 0, Remote::default());
        w.run(5000);
        use WcStatus::Success;
        assert_eq!(
            w.wcs(0, true),
            [(Success, WcOpcode::Send, 60_000)],
            "{drop_pct}%"
        );
        assert_eq!(w.wcs(1, false), [(Success, WcOpcode::Recv, 60_000)]);
        assert_eq!(
            w.n[1].mem.buf[65536..65536 + 60_000],
            w.n[0].mem.buf[..60_000]
        );
    }
}

/// Two engines on the same-host channel send segments (several MTUs per
/// packet, the PSNs of MTU packets): SEND, WRITE, WRITE_WITH_IMM and READ
/// of many MTUs land intact, with loss too; then the peer moves to a wire
/// in the middle of the transfer (MTU packets from there on, and
/// segments still queued lost), and it completes all the same.
#[test]
fn segments_on_the_same_host_channel_and_a_switch_to_the_wire() {
    for (drop_pct, switch) in [(0, false), (10, false), (0, true), (10, true)] {
        let mut w = World::new(0xff_ff00, false);
        for n in &mut w.n {
            n.mem.buf = vec![0; 1 << 19];
            let mut a = *n.qp.attrs();
            a.mtu = 1024;
            n.qp = Qp::new(a);
            n.qp.set_segment(MAX_SEGMENT);
        }
        w.same_host = true;
        w.drop_pct = drop_pct;
        w.fill(0);
        w.fill(1);
        w.recv(1, 1 << 18, 100_000);
        w.post(0, WrOpcode::SendWithImm, 100_000, 0, Remote::default());
        w.post(0, WrOpcode::RdmaWrite, 70_000, 100_000, remote(380_000));
        w.post(0, WrOpcode::RdmaRead, 50_001, 170_000, remote(0));
        w.recv(1, 450_000, 10);
        w.post(
            0,
            WrOpcode::RdmaWriteWithImm,
            3000,
            260_001,
            remote(460_000),
        );
        let want_b = w.n[1].mem.buf[..50_001].to_vec();
        if switch {
            w.run(3);
            w.same_host = false;
            // A READ restarts whole on a lost response, and one of more
            // MTUs than the responder's budget per turn (64) can livelock
            // with its stale responses (a wire-path limit, not tested here).
            w.drop_pct = 0;
            for n in &mut w.n {
                n.qp.set_segment(0);
                n.out.0.retain(|f| parse(f).unwrap().payload.len() <= 1024);
            }
        }
        w.run(5000);
        use WcStatus::Success;
        assert_eq!(
            w.wcs(0, true),
            [
                (Success, WcOpcode::Send, 100_000),
                (Success, WcOpcode::RdmaWrite, 70_000),
                (Success, WcOpcode::RdmaRead, 50_001),
                (Success, WcOpcode::RdmaWrite, 3000),
            ],
            "{drop_pct}% {switch}"
        );
        assert_eq!(
            w.wcs(1, false),
            [
                (Success, WcOpcode::Recv, 100_000),
                (Success, WcOpcode::RecvRdmaWithImm, 3000)
            ]
        );
        let (a, b) = (&w.n[0].mem.buf, &w.n[1].mem.buf);
        assert_eq!(b[1 << 18..(1 << 18) + 100_000], a[..100_000]);
        assert_eq!(b[380_000..450_000], a[100_000..170_000]);
        assert_eq!(a[170_000..220_001], want_b[..]);
        assert_eq!(b[460_000..463_000], a[260_001..263_001]);
        assert!(w.largest > 1024, "segments crossed");
        assert!(w.largest <= MAX_SEGMENT as usize);
    }
}

/// A stream of same-host WRITEs is answered with one ACK, of the last
/// PSN, however the receiver takes it: in one batch from the ring (a run
/// whose ACKs are held until its end, `flush`), or one request per run,
/// as a receiver that keeps up with its ring does (only the last request
/// of the sender's run asks for an ACK). From a wire every request asks
/// and gets its own, as rxe's do. The requester completes all of them
/// either way.
#[test]
fn same_host_streams_get_one_ack_however_the_receiver_takes_them() {
    for (same_host, one_run) in [(true, true), (true, false), (false, true), (false, false)] {
        let case = format!("same host: {same_host}, one run: {one_run}");
        let mut w = World::new(0xff_fffe, false);
        w.same_host = same_host;
        for n in &mut w.n {
            n.mem.buf = vec![0; 1 << 16];
            n.qp.set_segment(if same_host { MAX_SEGMENT } else { 0 });
        }
        w.fill(0);
        for i in 0..4u64 {
            w.post(0, WrOpcode::RdmaWrite, 200, i * 200, remote(8192 + i * 200));
        }
        w.n[0].flush(0);
        let requests = std::mem::take(&mut w.n[0].out.0);
        assert_eq!(requests.len(), 4);
        let b = &mut w.n[1];
        let mut asked = Vec::new();
        for f in &requests {
            let pkt = if same_host {
                parse_unsealed(f).unwrap()
            } else {
                parse(f).unwrap()
            };
            asked.push(pkt.hdrs.bth.ack_req);
            b.on_packet(&pkt, 0);
            if !one_run {
                b.flush(0);
            }
        }
        b.flush(0);
        let acks: Vec<u32> = b
            .out
            .0
            .iter()
            .map(|f| parse(f).unwrap().hdrs.bth.psn.get())
            .collect();
        if same_host {
            assert_eq!(asked, [false, false, false, true], "{case}");
            assert_eq!(acks, [0x01], "one ACK, of the last PSN; {case}");
        } else {
            assert_eq!(asked, [true; 4], "{case}");
            assert_eq!(acks, [0xff_fffe, 0xff_ffff, 0, 1], "{case}");
        }
        w.run(100);
        assert_eq!(w.wcs(0, true).len(), 4, "{case}");
        assert_eq!(w.n[1].mem.buf[8192..8992], w.n[0].mem.buf[..800]);
    }
}

/// A same-host WRITE with a READ queued behind it still asks for its ACK:
/// the READ may wait for earlier READs' responses, and the WRITE must
/// not wait for a retransmission timeout meanwhile.
#[test]
fn a_same_host_write_before_a_read_asks_for_its_ack() {
    let mut w = World::new(100, false);
    w.same_host = true;
    for n in &mut w.n {
        n.qp.set_segment(MAX_SEGMENT);
    }
    w.fill(0);
    w.post(0, WrOpcode::RdmaWrite, 200, 0, remote(4096));
    w.post(0, WrOpcode::RdmaWrite, 200, 200, remote(4296));
    w.post(0, WrOpcode::RdmaRead, 16, 400, remote(0));
    w.n[0].flush(0);
    let asked: Vec<bool> = w.n[0]
        .out
        .0
        .iter()
        .map(|f| parse_unsealed(f).unwrap().hdrs.bth.ack_req)
        .collect();
    assert_eq!(asked, [false, true, true]);
    w.run(100);
    assert_eq!(w.wcs(0, true).len(), 3);
}

/// Many small READs outstanding on a lossy link: lost requests and
/// responses are re-read, every READ completes with the right bytes.
#[test]
fn many_reads_with_loss() {
    for drop_pct in [0, 10] {
        let mut w = World::new(100, false);
        w.drop_pct = drop_pct;
        w.fill(1);
        for i in 0..100u64 {
            w.post(0, WrOpcode::RdmaRead, 16, i * 16, remote(i * 16));
        }
        w.run(5000);
        let wcs = w.wcs(0, true);
        assert_eq!(wcs.len(), 100, "{drop_pct}%");
        assert!(
            wcs.iter().all(|w| w.0 == WcStatus::Success),
            "{drop_pct}%: {wcs:?}"
        );
        assert_eq!(w.n[0].mem.buf[..1600], w.n[1].mem.buf[..1600]);
    }
}

/// Two engines with a SEND of 3000 bytes (into a receive of 3000), an
/// RDMA WRITE of 2000 and an RDMA READ of 500 posted, not yet run.
fn three_transfers() -> World {
    let mut w = World::new(0xff_fff0, false);
    w.fill(0);
    w.recv(1, 0, 3000);
    w.post(0, WrOpcode::Send, 3000, 0, Remote::default());
    w.post(0, WrOpcode::RdmaWrite, 2000, 3000, remote(4000));
    w.post(0, WrOpcode::RdmaRead, 500, 6000, remote(100));
    w
}

/// Both engines saved in the middle of a transfer, the frames in flight
/// lost (the blackout), restored from their serialized state in fresh
/// engines: the transfer completes intact, as if nothing happened.
#[test]
fn save_and_restore_mid_transfer() {
    let mut w = three_transfers();
    w.run(3);
    for n in &mut w.n {
        let saved = serde_json::to_string(&n.qp.save()).unwrap();
        let state: QpState = serde_json::from_str(&saved).unwrap();
        n.qp = Qp::restore(state).unwrap();
        n.out.0.clear();
    }
    w.run(3000);
    use WcStatus::Success;
    assert_eq!(
        w.wcs(0, true),
        [
            (Success, WcOpcode::Send, 3000),
            (Success, WcOpcode::RdmaWrite, 2000),
            (Success, WcOpcode::RdmaRead, 500)
        ]
    );
    assert_eq!(w.wcs(1, false), [(Success, WcOpcode::Recv, 3000)]);
    assert_eq!(w.n[1].mem.buf[..3000], w.n[0].mem.buf[..3000]);
    assert_eq!(w.n[1].mem.buf[4000..6000], w.n[0].mem.buf[3000..5000]);
    assert_eq!(w.n[0].mem.buf[6000..6500], w.n[1].mem.buf[100..600]);
}

/// A busy engine's state, every optional field set, through postcard (the
/// snapshot's format): what the engine serializes in place
/// ([`Qp::saved`]) is what its copy ([`Qp::save`]) serializes, and it
/// decodes to the same state. Every truncation of it and every byte of
/// it changed decodes to an error or to some state, never a panic.
#[test]
fn saved_state_round_trips_through_postcard() {
    let mut w = three_transfers();
    w.run(1);
    for n in &w.n {
        let bytes = postcard::to_stdvec(&n.qp.saved()).unwrap();
        assert_eq!(bytes, postcard::to_stdvec(&n.qp.save()).unwrap());
        let back: QpState = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, n.qp.save());
    }
    let mut s = w.n[0].qp.save();
    assert!(!s.sq.is_empty());
    s.attrs.addr.ip.src = std::net::Ipv6Addr::LOCALHOST.into();
    s.attrs.addr.encap = Encap {
        version: RoceVersion::V1,
        vlan: Some(4094),
    };
    s.attrs.access = Access::REMOTE_READ | Access::REMOTE_WRITE;
    s.req.prev = Some(rdma_transport::opcode::Opcode::RcSendFirst);
    s.comp.deadline = Some(u64::MAX);
    s.comp.rnr_until = Some(1);
    s.resp.write = Some((u64::MAX, 7, 300));
    s.resp.held = Some((
        Psn::new(0xff_ffff),
        rdma_transport::hdr::Aeth {
            syndrome: rdma_transport::hdr::Syndrome::RnrNak { timer: 31 },
            msn: 5,
        },
    ));
    s.resp.wqe = Some(RecvWqe {
        wr_id: 9,
        sges: vec![Sge {
            addr: 1,
            len: 2,
            lkey: 3,
        }],
    });
    s.metrics.rx_dup_req = u64::MAX;
    s.error = true;
    let bytes = postcard::to_stdvec(&s).unwrap();
    assert_eq!(postcard::from_bytes::<QpState>(&bytes).unwrap(), s);
    for end in 0..bytes.len() {
        assert!(postcard::from_bytes::<QpState>(&bytes[..end]).is_err());
    }
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0xff;
        let _ = postcard::from_bytes::<QpState>(&bad);
    }
}

/// A saved state is untrusted: inconsistent queues are refused.
#[test]
fn restore_refuses_inconsistent_state() {
    let mut w = World::new(1, false);
    w.post(0, WrOpcode::Send, 10, 0, Remote::default());
    let good = w.n[0].qp.save();
    let mut bad = good.clone();
    bad.next = 5;
    assert_eq!(Qp::restore(bad).err(), Some(RestoreError::Queue));
    let mut bad = good.clone();
    bad.sq[0].e.wqe.len = 11;
    assert_eq!(Qp::restore(bad).err(), Some(RestoreError::Wqe));
    assert!(Qp::restore(good).is_ok());
}

#[test]
fn atomics_execute_once() {
    let mut w = World::new(5, false);
    w.drop_pct = 20;
    w.n[1].mem.buf[64..72].copy_from_slice(&10u64.to_le_bytes());
    let mut r = remote(64);
    r.compare_add = 5;
    w.post(0, WrOpcode::AtomicFetchAndAdd, 8, 0, r);
    r.compare_add = 15;
    r.swap = 99;
    w.post(0, WrOpcode::AtomicCmpAndSwp, 8, 8, r);
    w.run(2000);
    assert!(w.wcs(0, true).iter().all(|c| c.0 == WcStatus::Success));
    assert_eq!(w.wcs(0, true).len(), 2);
    assert_eq!(w.n[0].mem.buf[0..8], 10u64.to_le_bytes());
    assert_eq!(w.n[0].mem.buf[8..16], 15u64.to_le_bytes());
    assert_eq!(w.n[1].mem.buf[64..72], 99u64.to_le_bytes());
}

#[test]
fn remote_errors_and_flush() {
    let mut w = World::new(0, false);
    let mut bad = remote(8190);
    w.post(0, WrOpcode::RdmaWrite, 10, 0, bad);
    w.post(0, WrOpcode::Send, 10, 0, Remote::default());
    w.run(200);
    assert_eq!(
        w.wcs(0, true),
        [
            (WcStatus::RemAccessErr, WcOpcode::RdmaWrite, 10),
            (WcStatus::WrFlushErr, WcOpcode::Send, 10)
        ]
    );
    assert!(w.n[0].qp.is_error() && w.n[1].qp.is_error());
    // Misaligned atomic: remote invalid request.
    let mut w = World::new(0, false);
    bad.addr = 4;
    w.post(0, WrOpcode::AtomicFetchAndAdd, 8, 0, bad);
    w.run(200);
    assert_eq!(w.wcs(0, true)[0].0, WcStatus::RemInvReqErr);
    // Local protection: bad lkey on the gather list.
    let mut w = World::new(0, false);
    w.n[0].mem.valid = false;
    w.post(0, WrOpcode::Send, 10, 0, Remote::default());
    w.run(50);
    assert_eq!(w.wcs(0, true)[0].0, WcStatus::LocProtErr);
}

/// The responder's QP must allow each remote operation itself, whatever
/// the MR allows (the test MR allows everything): a QP without the right
/// answers a remote access NAK and its memory stays as it was; a modify
/// that grants the right lets the same request through.
#[test]
fn qp_access_flags_are_enforced_by_the_responder() {
    let ops = [
        (
            WrOpcode::RdmaWrite,
            Access::REMOTE_WRITE,
            WcOpcode::RdmaWrite,
        ),
        (
            WrOpcode::RdmaWriteWithImm,
            Access::REMOTE_WRITE,
            WcOpcode::RdmaWrite,
        ),
        (WrOpcode::RdmaRead, Access::REMOTE_READ, WcOpcode::RdmaRead),
        (
            WrOpcode::AtomicFetchAndAdd,
            Access::REMOTE_ATOMIC,
            WcOpcode::FetchAdd,
        ),
        (
            WrOpcode::AtomicCmpAndSwp,
            Access::REMOTE_ATOMIC,
            WcOpcode::CompSwap,
        ),
    ];
    let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    for (op, right, wc) in ops {
        let mut w = World::new(0, false);
        w.fill(1);
        w.recv(1, 0, 64);
        let before = w.n[1].mem.buf.clone();
        let mut peer = attrs(2, 1, 0, 0);
        peer.access = all - right;
        w.n[1].qp.modify(peer);
        let len = if op.needs_response() && op != WrOpcode::RdmaRead {
            8
        } else {
            16
        };
        w.post(0, op, len, 0, remote(64));
        w.run(200);
        assert_eq!(
            w.wcs(0, true),
            [(WcStatus::RemAccessErr, wc, len)],
            "{op:?} without {right:?}"
        );
        assert_eq!(w.n[1].mem.buf, before, "{op:?} changed the target");
        assert!(w.wcs(1, false).iter().all(|c| c.0 != WcStatus::Success));

        let mut w = World::new(0, false);
        w.recv(1, 0, 64);
        let mut peer = attrs(2, 1, 0, 0);
        peer.access = right;
        w.n[1].qp.modify(peer);
        w.post(0, op, len, 0, remote(64));
        w.run(200);
        assert_eq!(
            w.wcs(0, true),
            [(WcStatus::Success, wc, len)],
            "{op:?} with {right:?}"
        );
    }
}

#[test]
fn rnr_and_transport_retry_exceeded() {
    let mut w = World::new(0, false);
    w.post(0, WrOpcode::Send, 10, 0, Remote::default());
    w.run(3000);
    assert_eq!(w.wcs(0, true)[0].0, WcStatus::RnrRetryExcErr);
    assert_eq!(w.n[1].qp.metrics.rnr_nak_sent, 3);
    let mut w = World::new(0, false);
    w.drop_pct = 100;
    w.post(0, WrOpcode::RdmaWrite, 10, 0, remote(0));
    w.run(3000);
    assert_eq!(w.wcs(0, true)[0].0, WcStatus::RetryExcErr);
    assert_eq!(w.n[0].qp.metrics.retry_exceeded, 1);
}

#[test]
fn ud_send_places_grh() {
    let mut w = World::new(0, true);
    w.fill(0);
    w.recv(1, 100, 40 + 64);
    let r = Remote {
        ud_qpn: 2,
        ud_qkey: 0x1234,
        ..Remote::default()
    };
    w.post(0, WrOpcode::Send, 64, 0, r);
    w.run(20);
    assert_eq!(w.wcs(0, true), [(WcStatus::Success, WcOpcode::Send, 64)]);
    assert_eq!(w.wcs(1, false), [(WcStatus::Success, WcOpcode::Recv, 104)]);
    let b = &w.n[1].mem.buf;
    assert_eq!(b[120], 0x45, "IPv4 header in the last 20 GRH bytes");
    assert_eq!(b[140..204], w.n[0].mem.buf[..64]);
}

/// The same verbs over RoCE v1 and with VLAN tags, on a lossy link: the
/// QP's framing is all the frames carry, and it changes nothing else.
#[test]
fn roce_v1_and_vlan_frames_carry_every_verb() {
    let v1 = |vlan| Encap {
        version: RoceVersion::V1,
        vlan,
    };
    let v2 = |vlan| Encap {
        version: RoceVersion::V2,
        vlan,
    };
    for encap in [v1(None), v1(Some(100)), v2(Some(100)), v2(Some(4094))] {
        let mut w = World::with_encap(0xff_fff0, false, encap);
        w.drop_pct = 10;
        w.fill(0);
        w.recv(1, 0, 2000);
        w.post(0, WrOpcode::Send, 1500, 0, Remote::default());
        w.post(0, WrOpcode::RdmaWrite, 700, 1500, remote(4000));
        w.post(0, WrOpcode::RdmaRead, 900, 6000, remote(0));
        w.post(0, WrOpcode::AtomicFetchAndAdd, 8, 7000, remote(7168));
        w.run(3000);
        use WcStatus::Success;
        assert_eq!(
            w.wcs(0, true),
            [
                (Success, WcOpcode::Send, 1500),
                (Success, WcOpcode::RdmaWrite, 700),
                (Success, WcOpcode::RdmaRead, 900),
                (Success, WcOpcode::FetchAdd, 8)
            ],
            "{encap:?}"
        );
        assert_eq!(w.wcs(1, false), [(Success, WcOpcode::Recv, 1500)]);
        let (a, b) = (&w.n[0].mem.buf, &w.n[1].mem.buf);
        assert_eq!(a[..1500], b[..1500]);
        assert_eq!(a[1500..2200], b[4000..4700]);
        assert_eq!(a[6000..6900], b[..900]);
        assert_eq!(w.seen, [encap], "every frame, both ways");
    }
}

/// A UD receive of a RoCE v1 frame finds the frame's GRH in its first 40
/// bytes (what `ib_init_ah_attr_from_wc` reads for RoCE v1), and the
/// completion says RoCE v1.
#[test]
fn ud_over_roce_v1_places_its_grh() {
    let encap = Encap {
        version: RoceVersion::V1,
        vlan: Some(100),
    };
    let mut w = World::with_encap(0, true, encap);
    w.fill(0);
    w.recv(1, 100, 40 + 64);
    let r = Remote {
        ud_qpn: 2,
        ud_qkey: 0x1234,
        ..Remote::default()
    };
    w.post(0, WrOpcode::Send, 64, 0, r);
    w.run(20);
    assert_eq!(w.wcs(1, false), [(WcStatus::Success, WcOpcode::Recv, 104)]);
    let src = w.n[1].cq.0[0].0.ud_src.unwrap();
    assert!(src.roce_v1 && !src.ipv6);
    let b = &w.n[1].mem.buf;
    assert_eq!(b[100] >> 4, 6, "GRH version");
    assert_eq!(b[106], 0x1b, "next header: BTH");
    let sgid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];
    assert_eq!(b[108..124], sgid);
    assert_eq!(b[124..140], [&sgid[..15], &[2]].concat()[..]);
    assert_eq!(b[140..204], w.n[0].mem.buf[..64]);
}

/// Forged frames for both roles: mutations of real requests (SEND, WRITE,
/// READ, atomic) go to the responder, mutations of its answers (ACKs,
/// READ responses, atomic ACKs) to the requester's completer. Most are
/// resealed with a valid ICRC so that the forged headers really reach
/// the engine; nothing may panic, and the two QPs still finish a transfer
/// afterwards when their state allows it.
#[test]
fn hostile_frames_do_not_panic() {
    let mut w = World::new(0, false);
    w.fill(0);
    w.recv(1, 0, 512);
    w.post(0, WrOpcode::Send, 300, 0, Remote::default());
    w.post(0, WrOpcode::RdmaWrite, 300, 0, remote(1000));
    w.post(0, WrOpcode::RdmaRead, 300, 2000, remote(1000));
    w.post(0, WrOpcode::AtomicFetchAndAdd, 8, 4000, remote(3000));
    // Capture every frame of a clean run, both ways.
    let mut requests = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..50 {
        for i in 0..2 {
            let nd = &mut w.n[i];
            let mut io = Io {
                mr: &mut nd.mem,
                cq: &mut nd.cq,
                net: &mut nd.out,
                srq: None,
            };
            nd.qp.flush(0, &mut io, 64);
            let frames = std::mem::take(&mut nd.out.0);
            for f in frames {
                let pkt = parse(&f).unwrap();
                let nd = &mut w.n[1 - i];
                let mut io = Io {
                    mr: &mut nd.mem,
                    cq: &mut nd.cq,
                    net: &mut nd.out,
                    srq: None,
                };
                nd.qp.on_packet(&pkt, 0, &mut io);
                if i == 0 { &mut requests } else { &mut answers }.push(f);
            }
        }
    }
    assert!(
        requests.len() >= 4 && answers.len() >= 4,
        "a clean run first"
    );
    let mut rng = 1u64;
    let mut reached = [0usize; 2];
    for n in 0..20_000 {
        // Alternate: forged requests to B, forged answers to A.
        let (templates, to) = if n % 2 == 0 {
            (&requests, 1)
        } else {
            (&answers, 0)
        };
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let mut f = templates[(rng as usize) % templates.len()].clone();
        for _ in 0..1 + (rng >> 20) % 4 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let i = (rng as usize) % f.len();
            f[i] = (rng >> 32) as u8;
        }
        if (rng >> 40).is_multiple_of(8) {
            f.truncate(((rng >> 44) as usize) % (f.len() + 1));
        }
        // A quarter keep the broken ICRC the mutation left.
        if rng >> 62 != 0 {
            let _ = seal(&mut f);
        }
        if let Ok(p) = parse(&f) {
            reached[to] += 1;
            let nd = &mut w.n[to];
            let mut io = Io {
                mr: &mut nd.mem,
                cq: &mut nd.cq,
                net: &mut nd.out,
                srq: None,
            };
            nd.qp.on_packet(&p, 0, &mut io);
            nd.qp.flush(0, &mut io, 64);
            nd.out.0.clear();
        }
    }
    // Most mutations hit the headers and payload, not the Ethernet/IP/UDP
    // layers: thousands of forged frames must have reached each role.
    assert!(reached.iter().all(|&r| r > 2000), "{reached:?}");
}

/// What nvme-rdma and nvmet-rdma run over one QP, on links of bounded
/// capacity as a bridge and TAP give: the target (A) RDMA READs (a host
/// write) or RDMA WRITEs (a host read) 4-128 KiB per command and answers
/// with a SEND, while the initiator (B) sends its command capsules. The
/// READ responses and WRITE data come in bursts a short queue cannot
/// hold, so frames are lost at its tail (and, on the last link, also at
/// random, some reordered); every operation must complete with the right
/// bytes, none exceeding its retries.
///
/// Before the fixes this test came with, the deep queue failed the QP with
/// RETRY_EXC_ERR (ACKs that overtook READ responses, then one retry per
/// response behind the gap), and the short one made 4 of 96 commands in
/// a minute (each retry re-read a 128 KiB READ from its start, and a link
/// that drops part of every burst never let one through whole).
#[test]
fn nvme_mix_over_bounded_links() {
    for (cap, rate, drop_pct) in [(128, 20, 0), (32, 16, 0), (64, 32, 2)] {
        nvme_mix(cap, rate, drop_pct);
    }
}

fn nvme_mix(cap: usize, rate: usize, drop_pct: u64) {
    const HALF: usize = 512 << 10;
    const RECV: u64 = 1 << 20;
    const CMDS: u64 = 96;
    let link = format!("queue {cap}, {rate} frames a round, {drop_pct}% lost");
    let mut w = World::new(0xff_ff00, false);
    for (i, n) in w.n.iter_mut().enumerate() {
        n.mem.buf = vec![0; (1 << 20) + (64 << 10)];
        let mut a = *n.qp.attrs();
        a.mtu = 1024;
        a.timeout = 14;
        n.qp = Qp::new(a);
        for (k, b) in n.mem.buf[..HALF].iter_mut().enumerate() {
            *b = (k * 7 + 3 * i + k / 4096) as u8;
        }
    }
    w.link = Some(Link::new(cap, rate));
    w.drop_pct = drop_pct;
    let mut ios = Vec::new();
    for k in 0..CMDS {
        let len = 4096u32 << (k % 6);
        let off = (k * 7 * 4096) % (HALF as u64 - (128 << 10));
        w.recv(0, RECV + k * 64, 64);
        w.recv(1, RECV + k * 64, 64);
        w.post(1, WrOpcode::Send, 64, off, Remote::default());
        if k % 2 == 0 {
            w.post(0, WrOpcode::RdmaRead, len, HALF as u64 + off, remote(off));
        } else {
            w.post(0, WrOpcode::RdmaWrite, len, off, remote(HALF as u64 + off));
        }
        w.post(0, WrOpcode::Send, 16, off, Remote::default());
        ios.push((off as usize, len as usize));
    }
    w.run(60_000);
    let counters = format!(
        "{link}: {} frames dropped at the tail; A {:?}; B {:?}",
        w.link.as_ref().unwrap().dropped,
        w.n[0].qp.metrics.moved(),
        w.n[1].qp.metrics.moved()
    );
    if cap < 64 {
        assert!(w.link.as_ref().unwrap().dropped > 0, "{counters}");
    }
    for (i, want) in [(0, 2 * CMDS as usize), (1, CMDS as usize)] {
        let wcs = w.wcs(i, true);
        let ok = wcs.iter().filter(|c| c.0 == WcStatus::Success).count();
        assert_eq!((ok, wcs.len()), (want, want), "node {i}; {counters}");
    }
    let (a, b) = (&w.n[0].mem.buf, &w.n[1].mem.buf);
    for (k, &(off, len)) in ios.iter().enumerate() {
        let (dst, src) = if k % 2 == 0 { (a, b) } else { (b, a) };
        assert!(
            dst[HALF + off..HALF + off + len] == src[off..off + len],
            "{link}: command {k}'s data"
        );
    }
}

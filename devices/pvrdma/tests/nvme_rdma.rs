// SPDX-License-Identifier: Apache-2.0
//! The memory-registration cycle of Linux's NVMe over Fabrics initiator (nvme-rdma) against a
//! target (nvmet-rdma), in process: what the e2e suite `nvmeof` runs thousands of times through
//! the real drivers, here per step with its data and CQEs checked, so that a change to the data
//! path that breaks it fails without a test host.
//!
//! Per I/O the initiator (B, kernel QP) fast-registers its buffer pages under the MR's next key
//! (ib_update_fast_reg_key: same MR, key byte + 1), the target (A) RDMA READs them (a write to
//! the namespace) or RDMA WRITEs them (a read), then answers with SEND_WITH_INV of that key; the
//! initiator sees the remote invalidation and the key in its receive CQE (so it posts no
//! LOCAL_INV) and registers the same MR again for the next I/O.

use pvrdma::sim_driver::endpoint::rc_pair;
use pvrdma::sim_driver::ib::{wc, wr};
use pvrdma_abi::wqe::{wc_flags, wc_status};

/// Where B maps its fast-registered buffer (nvme-rdma uses the pages' own addresses; any IOVA
/// works).
const IOVA: u64 = 0x5_0000;
/// Two pages, so that every transfer crosses a page boundary of the MR's page list.
const LEN: u32 = 8192;

#[test]
fn one_mr_cycles_through_new_keys_with_remote_invalidation() {
    let (mut a, mut b) = rc_pair();
    let (key, pages, list) = b.alloc_frmr(4);
    for round in 1..=6u32 {
        let k = (key & !0xff) | round;
        let id = u64::from(round) * 10;
        b.reg_mr(id, k, IOVA, (list, 2), LEN);
        let reg = b.cqes(1);
        assert_eq!(
            (reg[0].wr_id, reg[0].opcode, reg[0].status),
            (id, wc::REG_MR, wc_status::SUCCESS),
            "round {round}: REG_MR"
        );
        let data: Vec<u8> = (0..LEN)
            .map(|i| (i.wrapping_mul(7) + round) as u8)
            .collect();
        if round % 2 == 1 {
            // A write to the namespace: the target reads the initiator's buffer.
            b.sim.write_buf(&pages, 0, &data);
            a.send(id + 1, wr::RDMA_READ, &[a.sge(0, LEN)], (IOVA, k), 0);
            assert_eq!(
                a.cqes(1)[0].status,
                wc_status::SUCCESS,
                "round {round}: READ"
            );
            assert_eq!(a.read(0, LEN as usize), data, "round {round}: READ data");
        } else {
            // A read from the namespace: the target writes into the initiator's buffer.
            a.write(0, &data);
            a.send(id + 1, wr::RDMA_WRITE, &[a.sge(0, LEN)], (IOVA, k), 0);
            assert_eq!(
                a.cqes(1)[0].status,
                wc_status::SUCCESS,
                "round {round}: WRITE"
            );
            assert_eq!(
                b.sim.read_buf(&pages, 0, LEN as usize),
                data,
                "round {round}: WRITE data"
            );
        }
        // The response capsule, sent with invalidation of the key.
        b.sim.post_recv_sges(&b.qp, id + 2, &[b.sge(0, 64)]);
        a.send(id + 3, wr::SEND_WITH_INV, &[a.sge(0, 16)], (0, 0), k);
        let got = b.cqes(1);
        assert_eq!(
            (got[0].wr_id, got[0].opcode, got[0].status, got[0].byte_len),
            (id + 2, wc::RECV, wc_status::SUCCESS, 16),
            "round {round}: the response's receive"
        );
        assert_ne!(
            got[0].wc_flags & wc_flags::WITH_INVALIDATE,
            0,
            "round {round}: remote invalidation reported"
        );
        assert_eq!(got[0].imm_data, k, "round {round}: the invalidated key");
        assert_eq!(
            a.cqes(1)[0].status,
            wc_status::SUCCESS,
            "round {round}: SEND_WITH_INV"
        );
    }
    // The last key was invalidated with its response: the target can no longer reach the buffer.
    let last = (key & !0xff) | 6;
    a.send(99, wr::RDMA_WRITE, &[a.sge(0, 8)], (IOVA, last), 0);
    // 10: IB_WC_REM_ACCESS_ERR.
    assert_eq!(a.cqes(1)[0].status, 10, "an invalidated key is refused");
    let _ = (&mut a.pd, &mut b.pd);
}

mod load {
    //! NVMe load on the wire, as nvmet-rdma puts it on a target's QPs: several QPs, each with
    //! many commands in flight, each command an RDMA READ (a host write) or an RDMA WRITE (a
    //! host read) of 4-128 KiB and then the response SEND, while the initiator sends its command
    //! capsules the other way.

    use std::time::{Duration, Instant};

    use pvrdma::sim_driver::endpoint::{GID_A, GID_B, MAC_A, MAC_B, RIGHTS};
    use pvrdma::sim_driver::ib::wr;
    use pvrdma::sim_driver::{QpSpec, RcPath, SimCq, SimDriver, SimQp};
    use pvrdma::PvrdmaConfig;
    use pvrdma_abi::wqe::{send_flags, wc_status, Cqe, Sge, SqWqeHdr};

    const QPS: usize = 4;
    /// Commands each QP carries, and how many of them are in flight at once.
    const CMDS: u64 = 96;
    const DEPTH: u64 = 32;
    const IOVA: u64 = 0x6000_0000_0000;
    /// Each side's MR: the first half is what the other side reads or what it writes, the
    /// second half where it lands.
    const HALF: u64 = 1 << 20;
    const MAX_IO: u64 = 128 << 10;
    /// Where the command capsules and responses land, per QP.
    const RECV: u64 = 2 * HALF;
    const MR_LEN: u64 = RECV + QPS as u64 * DEPTH * 2 * 64;

    struct Node {
        sim: SimDriver,
        key: u32,
        pages: Vec<u64>,
        qps: Vec<(SimQp, SimCq)>,
    }

    fn node(gid: [u8; 16], mac: [u8; 6]) -> Node {
        let mut sim = SimDriver::with_config_and_mac(&PvrdmaConfig::default(), mac);
        sim.probe().expect("probe");
        let gid_type = PvrdmaConfig::default().gid_type.abi();
        sim.bind_gid(0, gid, gid_type).expect("bind");
        let pd = sim.create_pd(0).expect("pd");
        let mut qps = Vec::new();
        for _ in 0..QPS {
            let cq = sim.create_cq(0, 1024).expect("cq");
            let spec = QpSpec {
                max_send_wr: 256,
                max_recv_wr: 256,
                ..QpSpec::rc(pd, cq.handle)
            };
            qps.push((sim.create_qp(spec).expect("qp"), cq));
        }
        let (mr, pages) = sim.reg_user_mr_pages(pd, IOVA, MR_LEN, RIGHTS).expect("mr");
        Node {
            sim,
            key: mr.lkey,
            pages,
            qps,
        }
    }

    impl Node {
        fn sge(&self, off: u64, len: u64) -> Sge {
            Sge {
                addr: IOVA + off,
                length: len as u32,
                lkey: self.key,
            }
        }

        fn post(&self, q: usize, wr_id: u64, opcode: u32, sge: Sge, remote: u64, rkey: u32) {
            let mut hdr = SqWqeHdr {
                wr_id,
                opcode,
                send_flags: send_flags::SIGNALED,
                ..SqWqeHdr::default()
            };
            hdr.wr[0] = IOVA + remote;
            hdr.wr[1] = rkey.into();
            self.sim.post_send_wqe(&self.qps[q].0, hdr, &[sge]);
        }

        fn recv(&self, q: usize, wr_id: u64) {
            let slot = (q as u64 * DEPTH * 2 + wr_id % (DEPTH * 2)) * 64;
            let sge = self.sge(RECV + slot, 64);
            self.sim.post_recv_sges(&self.qps[q].0, wr_id, &[sge]);
        }

        fn poll(&self, q: usize) -> Vec<Cqe> {
            self.sim.poll_cq(&self.qps[q].1)
        }
    }

    /// The I/O of command `k`: (is a READ, length, offset in the halves).
    fn io(q: usize, k: u64) -> (bool, u64, u64) {
        let len = 4096 << ((k + q as u64) % 6);
        let off = ((k * 7 + q as u64 * 13) * 4096) % (HALF - MAX_IO);
        ((k + q as u64).is_multiple_of(2), len, off)
    }

    /// Every command completes with its data, and no QP exceeds its retries: before the
    /// completer retried once per loss, each READ response that arrived behind a gap started a
    /// retry of its own, so every QP here failed with RETRY_EXC_ERR within a second, with hundreds
    /// of `comp_dropped` (what the e2e `nvmeof` target's QPs did every 13 s on the wire).
    #[test]
    fn nvme_load_on_the_wire_completes_every_command() {
        let mut a = node(GID_A, MAC_A);
        let mut b = node(GID_B, MAC_B);
        SimDriver::connect(&a.sim, &b.sim);
        for q in 0..QPS {
            let (qa, qb) = (a.qps[q].0.clone(), b.qps[q].0.clone());
            let psn = (q as u32 + 1) * 0x10_0000 - 64;
            // nvmet-rdma's initiator depth: the device's maximum.
            let depth = RcPath {
                rd_atomic: 16,
                ..RcPath::default()
            };
            a.sim
                .connect_rc_with(qa.handle, 0, (GID_B, MAC_B), qb.qpn, (psn, psn + 7), depth)
                .expect("A to RTS");
            b.sim
                .connect_rc_with(qb.handle, 0, (GID_A, MAC_A), qa.qpn, (psn + 7, psn), depth)
                .expect("B to RTS");
        }
        let pattern = |seed: u64| -> Vec<u8> {
            (0..HALF)
                .map(|i| (i.wrapping_mul(seed) >> 3) as u8 ^ (i >> 12) as u8)
                .collect()
        };
        a.sim.write_buf(&a.pages, 0, &pattern(7));
        b.sim.write_buf(&b.pages, 0, &pattern(13));
        // Per QP: commands posted by A, completions seen by A (two per command) and by B.
        let mut posted = [0u64; QPS];
        let mut done_a = [0u64; QPS];
        let mut done_b = [0u64; QPS];
        for q in 0..QPS {
            for k in 0..DEPTH * 2 {
                a.recv(q, k);
                b.recv(q, k);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut failed = Vec::new();
        while done_a.iter().sum::<u64>() < 2 * CMDS * QPS as u64 && failed.is_empty() {
            assert!(
                Instant::now() < deadline,
                "stuck: A {done_a:?} B {done_b:?}"
            );
            for q in 0..QPS {
                while posted[q] < CMDS && posted[q] < done_a[q] / 2 + DEPTH {
                    let k = posted[q];
                    let (read, len, off) = io(q, k);
                    // The command capsule, B to A.
                    b.post(q, 2 * k, wr::SEND, b.sge(0, 64), 0, 0);
                    if read {
                        a.post(q, 2 * k, wr::RDMA_READ, a.sge(HALF + off, len), off, b.key);
                    } else {
                        a.post(q, 2 * k, wr::RDMA_WRITE, a.sge(off, len), HALF + off, b.key);
                    }
                    a.post(q, 2 * k + 1, wr::SEND, a.sge(0, 16), 0, 0);
                    posted[q] += 1;
                }
                for c in a.poll(q) {
                    if c.status != wc_status::SUCCESS {
                        failed.push(("A", q, c));
                    } else if c.opcode >= 128 {
                        a.recv(q, c.wr_id);
                    } else {
                        done_a[q] += 1;
                    }
                }
                for c in b.poll(q) {
                    if c.status != wc_status::SUCCESS {
                        failed.push(("B", q, c));
                    } else if c.opcode >= 128 {
                        b.recv(q, c.wr_id);
                    } else {
                        done_b[q] += 1;
                    }
                }
            }
            std::thread::yield_now();
        }
        let qps = a.sim.device().counters().queue_pairs().unwrap_or_default();
        assert!(failed.is_empty(), "{failed:?}\nA's QPs: {qps:?}");
        // This wire loses nothing unless an inbox overflowed: then the READ responses and ACKs
        // came in PSN order and nothing needed resending (a worker stalled past the 268 ms timer
        // on a loaded host may cost a retry or two). Before the responder held its ACKs behind
        // the READ responses it owed, every QP here retried 15-20 times on this lossless wire.
        let retries: u64 = qps
            .iter()
            .flat_map(|q| q.values.iter())
            .filter(|(n, _)| *n == "completer_retry")
            .map(|(_, v)| v)
            .sum();
        let dropped = a.sim.metric("roce_rx_dropped") + b.sim.metric("roce_rx_dropped");
        assert!(
            dropped > 0 || retries < 8,
            "{retries} retries on a lossless wire: {qps:?}"
        );
        for q in 0..QPS {
            for k in 0..CMDS {
                let (read, len, off) = io(q, k);
                let (dst, src) = if read { (&a, &b) } else { (&b, &a) };
                let got = dst.sim.read_buf(&dst.pages, HALF + off, len as usize);
                let want = src.sim.read_buf(&src.pages, off, len as usize);
                assert!(got == want, "QP {q} command {k}: data");
            }
        }
    }
}

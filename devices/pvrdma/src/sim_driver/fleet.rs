// SPDX-License-Identifier: Apache-2.0
//! Many connected RC QPs between two simulated drivers, as a busy guest
//! (`ib_write_bw -q N`) has them: side A's QP `i` talks to side B's QP
//! `i`; every [`GROUP`] QPs share a CQ and a 64 KiB MR, each QP using one
//! page of it. For the snapshot bench and the scale tests.

use pvrdma_abi::wqe::{send_flags, wc_status, Sge, SqWqeHdr};

use super::endpoint::{GID_A, GID_B, IOVA, MAC_A, MAC_B, MR_LEN, RIGHTS};
use super::ib::wr;
use super::{QpSpec, SimCq, SimDriver, SimQp};
use crate::{Limits, PvrdmaConfig};

/// QPs per CQ and MR.
pub const GROUP: usize = 16;
/// Guest pages the simulated driver takes (each followed by an unused
/// page): for a QP of [`QpSpec::rc`] (header, SQ and RQ pages, its page
/// directory and table), for a group's CQ and MR (32 KiB of CQEs, 64 KiB,
/// each with header or directory and table), and for the device itself.
const PAGES_PER_QP: u64 = 5 * 2;
const PAGES_PER_GROUP: u64 = (11 + 18) * 2;
const PAGES_FIXED: u64 = 1024;

/// One side: a probed device with GID 0 bound and one PD.
pub struct Side {
    pub sim: SimDriver,
    pub qps: Vec<SimQp>,
    pub cqs: Vec<SimCq>,
    /// lkey = rkey and guest pages of each group's MR.
    pub mrs: Vec<(u32, Vec<u64>)>,
}

impl Side {
    /// Without `ioeventfds`, the doorbells reach the device as MMIO (as
    /// when KVM refuses their registration), which saves two file
    /// descriptors per QP.
    fn new(n: usize, mac: [u8; 6], gid: [u8; 16], ioeventfds: bool) -> Self {
        let config = Fleet::config(n);
        let groups = n.div_ceil(GROUP) as u64;
        let pages = n as u64 * PAGES_PER_QP + groups * PAGES_PER_GROUP + PAGES_FIXED;
        let mut sim = SimDriver::with_memory(&config, mac, (pages * 4096).max(super::MEM_SIZE));
        sim.ioevents.set_fail(!ioeventfds);
        sim.probe().expect("probe");
        sim.bind_gid(0, gid, 2).expect("bind");
        let pd = sim.create_pd(0).expect("pd");
        let mut side = Side {
            sim,
            qps: Vec::with_capacity(n),
            cqs: Vec::new(),
            mrs: Vec::new(),
        };
        for g in 0..groups {
            let cq = side.sim.create_cq(0, 2 * GROUP as u32 * 16).expect("cq");
            let iova = IOVA + g * MR_LEN;
            let (mr, pages) = side
                .sim
                .reg_user_mr_pages(pd, iova, MR_LEN, RIGHTS)
                .expect("mr");
            side.cqs.push(cq);
            side.mrs.push((mr.lkey, pages));
        }
        for i in 0..n {
            let cq = side.cqs[i / GROUP].handle;
            side.qps
                .push(side.sim.create_qp(QpSpec::rc(pd, cq)).expect("qp"));
        }
        side
    }

    /// The SGE of QP `i`'s page of its group's MR.
    fn sge(&self, i: usize, len: u32) -> Sge {
        let g = i / GROUP;
        Sge {
            addr: IOVA + g as u64 * MR_LEN + (i % GROUP) as u64 * 4096,
            length: len,
            lkey: self.mrs[g].0,
        }
    }

    /// The guest page behind [`Self::sge`].
    fn page(&self, i: usize) -> u64 {
        self.mrs[i / GROUP].1[i % GROUP]
    }

    /// Waits for one successful completion of each QP of `sample` (its
    /// index as `wr_id`).
    fn completions(&self, sample: &[usize]) {
        let mut want: Vec<u64> = sample.iter().map(|&i| i as u64).collect();
        want.sort_unstable();
        let mut got = Vec::new();
        let done = self.sim.wait_until(|s| {
            for cq in &self.cqs {
                for cqe in s.poll_cq(cq) {
                    assert_eq!(cqe.status, wc_status::SUCCESS, "{cqe:?}");
                    got.push(cqe.wr_id);
                }
            }
            got.len() >= want.len()
        });
        got.sort_unstable();
        assert!(done && got == want, "completions {got:?}, want {want:?}");
    }
}

/// Bytes of each message.
const LEN: u32 = 256;

/// The bytes QP `i` sends in `round`.
fn pattern(i: usize, round: u8) -> Vec<u8> {
    (0..LEN as usize)
        .map(|k| (k as u8) ^ round ^ (i as u8) ^ ((i >> 8) as u8))
        .collect()
}

/// `n` RC QPs on each side, connected pairwise, all in RTS.
pub struct Fleet {
    pub a: Side,
    pub b: Side,
}

impl Fleet {
    /// The default device configuration, with room for `n` QPs besides
    /// the GSI QP.
    pub fn config(n: usize) -> PvrdmaConfig {
        let limits = Limits::default();
        // Handles 2..max_qp (0 is unused, 1 the GSI QP's).
        let max_qp = u32::try_from(n + 2).expect("QP count").max(limits.max_qp);
        PvrdmaConfig {
            limits: Limits { max_qp, ..limits },
            ..PvrdmaConfig::default()
        }
    }

    pub fn new(n: usize) -> Self {
        // Per QP an eventfd and the mock KVM's copies of its two
        // ioeventfds on A, an eventfd on B.
        raise_fd_limit(4 * n as u64 + 4096);
        let mut a = Side::new(n, MAC_A, GID_A, true);
        // B only carries A's peers: its doorbells are MMIO, to stay within
        // the open-file limits of test machines.
        let mut b = Side::new(n, MAC_B, GID_B, false);
        SimDriver::connect(&a.sim, &b.sim);
        for i in 0..n {
            let (qa, qb) = (a.qps[i].clone(), b.qps[i].clone());
            a.sim
                .connect_rc(qa.handle, 0, (GID_B, MAC_B), qb.qpn, (0x10, 0x20))
                .expect("A to RTS");
            b.sim
                .connect_rc(qb.handle, 0, (GID_A, MAC_A), qa.qpn, (0x20, 0x10))
                .expect("B to RTS");
        }
        Fleet { a, b }
    }

    /// Live-migrates side A ([`SimDriver::migrate`]).
    pub fn migrate_a(self) -> Self {
        self.migrate_a_timed().0
    }

    /// [`Self::migrate_a`], timed by stage.
    pub fn migrate_a_timed(self) -> (Self, super::MigrateTimes) {
        let Fleet { a, b } = self;
        let (sim, times) = a.sim.migrate_timed();
        let a = Side { sim, ..a };
        (Fleet { a, b }, times)
    }

    /// [`Self::migrate_a_timed`], every one of A's QPs changed after the
    /// later restore hint, just before the pause, as QPs that all carry
    /// traffic then would be: its RNR timer modified (RTS to RTS, a value
    /// of `round`), so that none restores from that hint.
    pub fn migrate_a_timed_busy(self, round: u8) -> (Self, super::MigrateTimes) {
        use pvrdma_abi::verbs::{qp_attr_mask, qp_state, QpAttr};
        use vm_migration::Pausable;
        let Fleet { a, b } = self;
        let handles: Vec<u32> = a.qps.iter().map(|q| q.handle).collect();
        let attrs = QpAttr {
            qp_state: qp_state::RTS,
            min_rnr_timer: 20 + round % 8,
            ..QpAttr::default()
        };
        let (sim, times) = a.sim.migrate_paused_around(
            |_| (),
            |sim| {
                for &h in &handles {
                    sim.modify_qp(h, qp_attr_mask::STATE | qp_attr_mask::MIN_RNR_TIMER, attrs)
                        .expect("modify");
                }
            },
        );
        sim.device().resume().expect("resume");
        let a = Side { sim, ..a };
        (Fleet { a, b }, times)
    }

    /// A SEND of 256 bytes from each of A's QPs `sample` to its peer on B,
    /// then an RDMA WRITE of them back from B into A's MR under the rkey A
    /// gave at the start, each a pattern of `round` and the QP's index;
    /// checks every completion and the bytes received. Panics on anything
    /// else.
    pub fn exchange(&self, sample: &[usize], round: u8) {
        self.send_a_to_b(sample, round);
        self.write_b_to_a(sample, round);
    }

    fn send_a_to_b(&self, sample: &[usize], round: u8) {
        for &i in sample {
            self.b
                .sim
                .write_buf(&[self.b.page(i)], 0, &[0; LEN as usize]);
            self.b
                .sim
                .post_recv_sges(&self.b.qps[i], i as u64, &[self.b.sge(i, LEN)]);
            self.a
                .sim
                .write_buf(&[self.a.page(i)], 0, &pattern(i, round));
            let hdr = SqWqeHdr {
                wr_id: i as u64,
                opcode: wr::SEND,
                send_flags: send_flags::SIGNALED,
                ..SqWqeHdr::default()
            };
            self.a
                .sim
                .post_send_wqe(&self.a.qps[i], hdr, &[self.a.sge(i, LEN)]);
        }
        self.a.completions(sample);
        self.b.completions(sample);
        for &i in sample {
            let data = self.b.sim.read_buf(&[self.b.page(i)], 0, LEN as usize);
            assert_eq!(data, pattern(i, round), "QP {i}'s message");
        }
    }

    fn write_b_to_a(&self, sample: &[usize], round: u8) {
        // Into the second half of each QP's page of A's MR.
        const AT: u32 = 2048;
        let round = !round;
        for &i in sample {
            self.a
                .sim
                .write_buf(&[self.a.page(i)], AT.into(), &[0; LEN as usize]);
            self.b
                .sim
                .write_buf(&[self.b.page(i)], 0, &pattern(i, round));
            let remote = self.a.sge(i, 0);
            let mut hdr = SqWqeHdr {
                wr_id: i as u64,
                opcode: wr::RDMA_WRITE,
                send_flags: send_flags::SIGNALED,
                ..SqWqeHdr::default()
            };
            hdr.wr[0] = remote.addr + u64::from(AT);
            hdr.wr[1] = remote.lkey.into();
            self.b
                .sim
                .post_send_wqe(&self.b.qps[i], hdr, &[self.b.sge(i, LEN)]);
        }
        self.b.completions(sample);
        for &i in sample {
            let data = self
                .a
                .sim
                .read_buf(&[self.a.page(i)], AT.into(), LEN as usize);
            assert_eq!(data, pattern(i, round), "QP {i}'s RDMA WRITE");
        }
    }
}

/// Raises RLIMIT_NOFILE's soft limit towards `want` open files (at most
/// to the hard limit, as the VMM does).
fn raise_fd_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_cur >= want {
        return;
    }
    lim.rlim_cur = want.min(lim.rlim_max);
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}

// SPDX-License-Identifier: Apache-2.0
//! Two connected endpoints for data path tests and benchmarks: each a
//! simulated driver with a PD, CQ, RC QP and MR, as two guests running
//! one verbs program against each other.

use pvrdma_abi::cmd::{CmdCode, CreateMrReq, CreateMrResp};
use pvrdma_abi::verbs::{access, mr_flags};
use pvrdma_abi::wqe::{send_flags, Cqe, Sge, SqWqeHdr};

use super::ib::wr;
use super::{QpSpec, SimCq, SimDriver, SimQp};
use crate::PvrdmaConfig;

/// IPv4-mapped GIDs of the two sides (10.0.0.1 and 10.0.0.2).
pub const GID_A: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];
pub const GID_B: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];
/// The two ports' MACs.
pub const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
pub const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
/// Every MR of these tests: 64 KiB at this IOVA.
pub const IOVA: u64 = 0x7f00_0000_0000;
pub const MR_LEN: u64 = 64 << 10;
pub const RIGHTS: u32 =
    access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;

/// A probed device with GID 0 bound, a PD, CQ and QP (the kernel's, or a
/// user context's), and a 64 KiB MR at [`IOVA`] over guest pages.
pub struct Endpoint {
    pub sim: SimDriver,
    pub pd: u32,
    pub cq: SimCq,
    pub qp: SimQp,
    /// lkey = rkey of the MR.
    pub key: u32,
    pub pages: Vec<u64>,
}

impl Endpoint {
    /// Side A or B (by `gid`) on an unconnected wire.
    pub fn new(gid: [u8; 16], spec: impl FnOnce(u32, u32) -> QpSpec) -> Self {
        let mac = if gid == GID_A { MAC_A } else { MAC_B };
        Self::on(
            SimDriver::with_config_and_mac(&PvrdmaConfig::default(), mac),
            gid,
            spec,
        )
    }

    /// The endpoint on a fresh `sim`, its objects the kernel's.
    pub fn on(sim: SimDriver, gid: [u8; 16], spec: impl FnOnce(u32, u32) -> QpSpec) -> Self {
        Self::in_context(sim, gid, spec, None)
    }

    /// Side A or B (by `gid`) on an unconnected wire, its objects those of
    /// a user context on UAR page 1: rdma-core's, not the kernel's.
    pub fn user(gid: [u8; 16], spec: impl FnOnce(u32, u32) -> QpSpec) -> Self {
        let mac = if gid == GID_A { MAC_A } else { MAC_B };
        let sim = SimDriver::with_config_and_mac(&PvrdmaConfig::default(), mac);
        Self::in_context(sim, gid, spec, Some(1))
    }

    /// The endpoint on a fresh `sim`, in the kernel's context or in a user
    /// context on UAR page `uar`.
    fn in_context(
        mut sim: SimDriver,
        gid: [u8; 16],
        spec: impl FnOnce(u32, u32) -> QpSpec,
        uar: Option<u32>,
    ) -> Self {
        sim.probe().expect("probe");
        let gid_type = sim.config.gid_type.abi();
        sim.bind_gid(0, gid, gid_type).expect("bind");
        let ctx = uar.map_or(0, |page| sim.create_uc(page).expect("context"));
        let pd = sim.create_pd(ctx).expect("pd");
        let cq = sim.create_cq(ctx, 256).expect("cq");
        let qp = sim.create_qp(spec(pd, cq.handle)).expect("qp");
        let (mr, pages) = sim.reg_user_mr_pages(pd, IOVA, MR_LEN, RIGHTS).expect("mr");
        Endpoint {
            sim,
            pd,
            cq,
            qp,
            key: mr.lkey,
            pages,
        }
    }

    /// An SGE of the MR.
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: IOVA + off,
            length: len,
            lkey: self.key,
        }
    }

    /// Writes into the MR at offset `off`.
    pub fn write(&self, off: u64, data: &[u8]) {
        self.sim.write_buf(&self.pages, off, data);
    }

    /// Reads from the MR at offset `off`.
    pub fn read(&self, off: u64, len: usize) -> Vec<u8> {
        self.sim.read_buf(&self.pages, off, len)
    }

    /// Waits for `n` CQEs.
    pub fn cqes(&self, n: usize) -> Vec<Cqe> {
        let mut got = Vec::new();
        self.sim.wait_until(|s| {
            got.extend(s.poll_cq(&self.cq));
            got.len() >= n
        });
        got
    }

    /// A fast-register MR for up to `pages` pages (invalid until a REG_MR),
    /// fresh guest pages for it and their page list: what the kernel's
    /// `ib_alloc_mr` and `ib_map_mr_sg` prepare. Returns (key, pages, list).
    pub fn alloc_frmr(&mut self, pages: u32) -> (u32, Vec<u64>, u64) {
        let mr: CreateMrResp = self
            .sim
            .cmd(
                CmdCode::CreateMr,
                CreateMrReq {
                    pd_handle: self.pd,
                    flags: mr_flags::FRMR,
                    nchunks: pages,
                    ..Default::default()
                },
            )
            .expect("FRMR");
        let backing = self.sim.alloc_pages(pages);
        let list = self.sim.make_pdir(&backing);
        (mr.rkey, backing, list)
    }

    /// Posts the REG_MR WQE mapping `len` bytes at `iova` over the page
    /// list `list` of `pages` pages, under the (new) `key`.
    pub fn reg_mr(&self, wr_id: u64, key: u32, iova: u64, (list, pages): (u64, u32), len: u32) {
        let mut hdr = SqWqeHdr {
            wr_id,
            opcode: wr::REG_MR,
            send_flags: send_flags::SIGNALED,
            ..SqWqeHdr::default()
        };
        hdr.wr = [
            iova,
            list,
            12 | u64::from(pages) << 32,
            u64::from(len) | u64::from(RIGHTS) << 32,
            key.into(),
            0,
        ];
        self.sim.post_send_wqe(&self.qp, hdr, &[]);
    }

    /// Posts a signaled send WR of verbs opcode `opcode` ([`wr`]) with
    /// `remote` = (address, rkey).
    pub fn send(&self, wr_id: u64, opcode: u32, sges: &[Sge], remote: (u64, u32), ex: u32) {
        let mut hdr = SqWqeHdr {
            wr_id,
            opcode,
            send_flags: send_flags::SIGNALED,
            ex,
            ..SqWqeHdr::default()
        };
        hdr.wr[0] = remote.0;
        hdr.wr[1] = remote.1.into();
        self.sim.post_send_wqe(&self.qp, hdr, sges);
    }
}

/// Two RC QPs connected to each other over a joined wire.
pub fn rc_pair() -> (Endpoint, Endpoint) {
    let a = Endpoint::new(GID_A, QpSpec::rc);
    let b = Endpoint::new(GID_B, QpSpec::rc);
    SimDriver::connect(&a.sim, &b.sim);
    connect(a, b)
}

/// [`rc_pair`] again on the same two devices: both reset
/// ([`SimDriver::reset`]), whatever state they were left in, then probed
/// and given the same objects, which a fresh pair would have.
pub fn rc_pair_again(a: Endpoint, b: Endpoint) -> (Endpoint, Endpoint) {
    let (mut sa, mut sb) = (a.sim, b.sim);
    sa.reset();
    sb.reset();
    connect(
        Endpoint::on(sa, GID_A, QpSpec::rc),
        Endpoint::on(sb, GID_B, QpSpec::rc),
    )
}

/// Connects the RC QPs of `a` and `b`.
pub fn connect(mut a: Endpoint, mut b: Endpoint) -> (Endpoint, Endpoint) {
    let (qa, qb) = (a.qp.qpn, b.qp.qpn);
    a.sim
        .connect_rc(a.qp.handle, 0, (GID_B, MAC_B), qb, (0x10, 0x20))
        .expect("A to RTS");
    b.sim
        .connect_rc(b.qp.handle, 0, (GID_A, MAC_A), qa, (0x20, 0x10))
        .expect("B to RTS");
    (a, b)
}

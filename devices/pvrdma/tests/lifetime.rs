// SPDX-License-Identifier: Apache-2.0
//! Object lifetime: handle allocation and reuse, references, doorbell
//! registrations following objects, exhaustion, RESET.

mod common;

use common::*;
use pvrdma::sim_driver::{QpSpec, SimDriver};
use pvrdma::{Limits, PvrdmaConfig};
use pvrdma_abi::cmd::{CmdCode, CreateMrReq, CreateMrResp};
use pvrdma_abi::regs::{uar, Ctl};
use pvrdma_abi::verbs::{mr_flags, qp_type};

fn small() -> PvrdmaConfig {
    PvrdmaConfig {
        limits: Limits {
            max_qp: 4,
            max_cq: 3,
            max_pd: 3,
            max_mr: 3,
            max_srq: 2,
            max_uar: 4,
            ..Limits::default()
        },
        ..PvrdmaConfig::default()
    }
}

#[test]
fn qp_handles_lowest_free_qpns_move_on() {
    let (mut sim, pd, cq) = with_pd_cq();
    let a = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("a");
    let b = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("b");
    assert_eq!((a.handle, b.handle), (2, 3));
    sim.destroy(CmdCode::DestroyQp, a.handle).expect("destroy");
    let c = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("c");
    assert_eq!(c.handle, 2, "the handle is reused");
    assert!(c.qpn > b.qpn, "the QPN is not");
}

#[test]
fn mr_keys_differ_after_reuse() {
    let config = small();
    let mut sim = ready_with(&config);
    let pd = sim.create_pd(0).expect("pd");
    let frmr = CreateMrReq {
        pd_handle: pd,
        flags: mr_flags::FRMR,
        nchunks: 1,
        ..Default::default()
    };
    let mut keys = Vec::new();
    for _ in 0..6 {
        let mr: CreateMrResp = sim.cmd(CmdCode::CreateMr, frmr).expect("mr");
        assert!(mr.mr_handle >= 1 && mr.mr_handle < 3);
        keys.push(mr.lkey);
        sim.destroy(CmdCode::DestroyMr, mr.mr_handle)
            .expect("destroy");
    }
    let mut unique = keys.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), keys.len(), "no key repeats: {keys:x?}");
}

#[test]
fn exhaustion_is_an_error_and_costs_nothing() {
    let config = small();
    let mut sim = ready_with(&config);
    assert_eq!(sim.create_pd(0), Ok(1));
    assert_eq!(sim.create_pd(0), Ok(2));
    assert_eq!(sim.create_pd(0), Err(ENOMEM), "handles stay below max_pd");
    let cq1 = sim.create_cq(0, 16).expect("cq");
    sim.create_cq(0, 16).expect("cq");
    let registered = sim.ioevents.count();
    assert_eq!(sim.create_cq(0, 16).err(), Some(ENOMEM));
    assert_eq!(sim.ioevents.count(), registered, "nothing left behind");
    let gsi = QpSpec {
        qp_type: qp_type::GSI,
        ..QpSpec::rc(1, cq1.handle)
    };
    sim.create_qp(gsi).expect("gsi");
    for handle in [2, 3] {
        assert_eq!(
            sim.create_qp(QpSpec::rc(1, cq1.handle)).map(|q| q.handle),
            Ok(handle)
        );
    }
    assert_eq!(sim.create_qp(QpSpec::rc(1, cq1.handle)).err(), Some(ENOMEM));
    // User contexts: pages 1..3 of 4.
    for index in 1..4 {
        sim.create_uc(index).expect("uc");
    }
    assert_eq!(sim.create_uc(4), Err(EINVAL), "beyond BAR2");
}

#[test]
fn page_budget_bounds_mappings() {
    let config = PvrdmaConfig {
        limits: Limits {
            max_mapped_pages: 40,
            ..Limits::default()
        },
        ..PvrdmaConfig::default()
    };
    let mut sim = ready_with(&config);
    let pd = sim.create_pd(0).expect("pd");
    let cq = sim.create_cq(0, 1024).expect("17-page CQ");
    assert_eq!(sim.reg_user_mr(pd, 0, 30 * 4096, 1).err(), Some(ENOMEM));
    let mr = sim.reg_user_mr(pd, 0, 20 * 4096, 1).expect("fits");
    sim.destroy(CmdCode::DestroyCq, cq.handle).expect("destroy");
    sim.destroy(CmdCode::DestroyMr, mr.mr_handle)
        .expect("destroy");
    sim.reg_user_mr(pd, 0, 40 * 4096, 1)
        .expect("budget returned");
}

#[test]
fn doorbells_follow_objects() {
    let (mut sim, pd, cq) = with_pd_cq();
    let uar = sim.bars[2];
    // A CQ: ARM, ARM_SOL and POLL at page 0 + 4.
    assert_eq!(
        sim.ioevents.registrations(),
        vec![
            (uar + 4, Some(cq.handle | uar::CQ_ARM_SOL)),
            (uar + 4, Some(cq.handle | uar::CQ_ARM)),
            (uar + 4, Some(cq.handle | uar::CQ_POLL)),
        ]
    );
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    let ctx = sim.create_uc(3).expect("uc");
    let upd = sim.create_pd(ctx).expect("pd");
    let srq = sim.create_srq(upd, 16, 1).expect("srq");
    let regs = sim.ioevents.registrations();
    assert!(regs.contains(&(uar, Some(qp.handle | uar::QP_SEND))));
    assert!(regs.contains(&(uar, Some(qp.handle | uar::QP_RECV))));
    assert!(regs.contains(&(uar + 3 * 4096 + 8, Some(srq.handle | uar::SRQ_RECV))));
    assert_eq!(regs.len(), 6);
    assert!(regs.iter().all(|(_, d)| d.is_some()), "never a wildcard");
    sim.destroy(CmdCode::DestroyQp, qp.handle).expect("destroy");
    sim.destroy(CmdCode::DestroySrq, srq.handle)
        .expect("destroy");
    assert_eq!(sim.ioevents.count(), 3);
    sim.ctl(Ctl::Reset).expect("reset");
    assert_eq!(sim.ioevents.count(), 0, "RESET drops every registration");
}

#[test]
fn doorbells_follow_bar2_and_decoding() {
    let (mut sim, _pd, cq) = with_pd_cq();
    // Memory decoding off: nothing registered.
    sim.cfg_write(1, 0x4);
    assert_eq!(sim.ioevents.count(), 0);
    sim.cfg_write(1, 0x6);
    assert_eq!(sim.ioevents.count(), 3);
    // Move BAR2 (64-bit: low dword, then high dword).
    let new = sim.bars[2] + 0x1000_0000;
    sim.cfg_write(1, 0x4);
    sim.cfg_write(6, (new as u32) | 0x4);
    sim.cfg_write(7, (new >> 32) as u32);
    sim.cfg_write(1, 0x6);
    sim.bars[2] = new;
    assert!(sim
        .ioevents
        .registrations()
        .iter()
        .all(|(addr, _)| *addr == new + 4));
    assert_eq!(sim.ioevents.count(), 3);
    // Doorbells work at the new place.
    sim.arm_cq(&cq, false);
    assert!(sim.wait_until(|s| s.metric("doorbell_cq_arm") == 1));
}

#[test]
fn reset_drops_everything_and_stops_dma() {
    let (mut sim, pd, cq) = with_pd_cq();
    sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    sim.ctl(Ctl::Reset).expect("reset");
    // Old slots are never touched again: commands are refused.
    let before: [u64; 8] = sim.read(sim.resp_slot);
    assert_eq!(sim.create_pd(0), Err(EINVAL));
    assert_eq!(sim.read::<[u64; 8]>(sim.resp_slot), before);
    // A new probe starts from scratch, same handles as the first time.
    sim.probe().expect("probe");
    sim.bind_gid(0, pvrdma::sim_driver::GID, 2).expect("bind");
    assert_eq!(sim.create_pd(0), Ok(1));
    assert_eq!(sim.create_cq(0, 64).map(|c| c.handle), Ok(1));
    assert_eq!(sim.create_qp(QpSpec::rc(1, 1)).map(|q| q.handle), Ok(2));
}

#[test]
fn device_drop_unregisters() {
    let (sim, _pd, _cq) = with_pd_cq();
    let ioevents = sim.ioevents.clone();
    assert_eq!(ioevents.count(), 3);
    let SimDriver { dev, bus, .. } = sim;
    drop(bus);
    drop(dev);
    assert_eq!(ioevents.count(), 0);
}

/// What the fuzz targets rely on to keep their devices across inputs.
mod kept_pair {
    use pvrdma::sim_driver::endpoint::{rc_pair, rc_pair_again, Endpoint, IOVA};
    use pvrdma::sim_driver::ib::wr;
    use pvrdma::sim_driver::{QpSpec, MEM_SIZE};
    use pvrdma_abi::regs::Reg;
    use vm_memory::{Bytes, GuestAddress};
    use vm_migration::{Pausable, Snapshottable};

    /// Side `e` as a test can compare it: the device's saved state
    /// (registers, MSI-X, every object with its handles, QPNs, keys and
    /// engine), configuration space and guest memory.
    fn saved(e: &mut Endpoint) -> (Vec<u8>, Vec<u32>, Vec<u8>) {
        let mut dev = e.sim.device();
        dev.pause().expect("pause");
        let state = dev.snapshot().expect("snapshot").to_bytes();
        dev.resume().expect("resume");
        drop(dev);
        let config = (0..64).map(|reg| e.sim.cfg_read(reg)).collect();
        let mut mem = vec![0u8; MEM_SIZE as usize];
        e.sim
            .mem
            .read_slice(&mut mem, GuestAddress(0))
            .expect("memory");
        (state, config, mem)
    }

    /// Traffic both ways, an extra CQ and QP, a refused command, masked
    /// interrupts and a changed config register.
    fn use_pair(a: &mut Endpoint, b: &mut Endpoint) {
        b.sim.post_recv_sges(&b.qp, 1, &[b.sge(0, 4096)]);
        a.send(2, wr::SEND, &[a.sge(0, 3000)], (0, 0), 0);
        a.send(
            3,
            wr::RDMA_WRITE,
            &[a.sge(0, 5000)],
            (IOVA + 8192, b.key),
            0,
        );
        assert_eq!(a.cqes(2).len(), 2);
        assert_eq!(b.cqes(1).len(), 1);
        let cq = a.sim.create_cq(0, 64).expect("cq");
        a.sim.create_qp(QpSpec::rc(a.pd, cq.handle)).expect("qp");
        assert!(a.sim.create_pd(99).is_err());
        a.sim.reg_write(Reg::Imr, !0);
        b.sim.cfg_write(15, 0xffff_ffff);
    }

    fn assert_new(fresh: &mut (Endpoint, Endpoint), a: &mut Endpoint, b: &mut Endpoint) {
        assert!(
            saved(&mut fresh.0) == saved(a),
            "side A differs from a new one"
        );
        assert!(
            saved(&mut fresh.1) == saved(b),
            "side B differs from a new one"
        );
    }

    /// A pair that was used, then reset and set up again (`rc_pair_again`),
    /// is a new pair.
    #[test]
    fn a_reset_pair_is_a_new_pair() {
        let mut fresh = rc_pair();
        let (mut a, mut b) = rc_pair();
        use_pair(&mut a, &mut b);
        let (mut a, mut b) = rc_pair_again(a, b);
        assert_new(&mut fresh, &mut a, &mut b);
    }

    /// A pair saved once set up (`SimDriver::checkpoint`), then used, then
    /// put back (`SimDriver::rewind`: RESET and the device's own restore),
    /// is a new pair, and works as one; twice over.
    #[test]
    fn a_rewound_pair_is_a_new_pair() {
        let mut fresh = rc_pair();
        let (mut a, mut b) = rc_pair();
        let saved = [a.sim.checkpoint(), b.sim.checkpoint()];
        for _ in 0..2 {
            use_pair(&mut a, &mut b);
            a.sim.rewind(&saved[0]);
            b.sim.rewind(&saved[1]);
            assert_new(&mut fresh, &mut a, &mut b);
        }
    }
}

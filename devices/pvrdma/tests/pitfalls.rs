// SPDX-License-Identifier: Apache-2.0
//! One test per item of the ABI doc's "Pitfalls" list (section 10): each
//! feeds the hostile values and checks that the device answers with an
//! error and stays healthy. Item 14 is the vmxnet3's.

mod common;

use common::*;
use pvrdma::sim_driver::{QpSpec, SimDriver, MEM_SIZE, RC_INIT_MASK, RC_RTR_MASK};
use pvrdma::{Limits, PvrdmaConfig};
use pvrdma_abi::cmd::*;
use pvrdma_abi::dsr::{DeviceCaps, Dsr, RingPageInfo, DSR_CAPS_OFFSET};
use pvrdma_abi::regs::{uar, Ctl, Reg};
use pvrdma_abi::verbs::{qp_attr_mask as m, qp_state, qp_type, QpAttr};
use pvrdma_abi::wqe::{event, wc_status, Eqe, SqWqeHdr};
use pvrdma_abi::PDIR_MAX_PAGES;

const OUTSIDE: u64 = MEM_SIZE + 0x10_0000;

fn to_err(sim: &mut SimDriver, qp: u32) {
    let attrs = QpAttr {
        qp_state: qp_state::ERR,
        ..QpAttr::default()
    };
    sim.modify_qp(qp, m::STATE, attrs).expect("to ERR");
}

/// Pitfall 1: Nothing executes before a DSR and ACTIVATE; after RESET no old GPA
/// is touched.
#[test]
fn p01_order_of_operations() {
    let mut sim = SimDriver::new();
    sim.cmd_slot = sim.alloc_page();
    sim.resp_slot = sim.alloc_page();
    assert_eq!(sim.ctl(Ctl::Activate), Err(EINVAL), "ACTIVATE without DSR");
    assert_eq!(sim.ctl(Ctl::Unquiesce), Err(EINVAL));
    assert_eq!(sim.create_pd(0), Err(EINVAL), "REQUEST without DSR");
    sim.doorbell(0, uar::CQ_OFFSET, 1 | uar::CQ_ARM);
    assert_eq!(sim.metric("doorbell_unmatched"), 1);
    // DSR loaded, not activated: still refused.
    sim.probe().expect("probe");
    sim.ctl(Ctl::Reset).expect("reset");
    sim.load_dsr(sim.dsr);
    assert_eq!(sim.create_pd(0), Err(EINVAL), "REQUEST before ACTIVATE");
    sim.ctl(Ctl::Activate).expect("activate");
    sim.create_pd(0).expect("now it works");
    assert_eq!(sim.metric("cmd_inactive"), 2);
    // After RESET: no command, no event into the old rings.
    sim.ctl(Ctl::Reset).expect("reset");
    let resp: [u64; 22] = sim.read(sim.resp_slot);
    assert_eq!(sim.create_pd(0), Err(EINVAL));
    assert_eq!(sim.read::<[u64; 22]>(sim.resp_slot), resp);
    let old_ring = sim.async_ring.clone().expect("probed");
    sim.port.set_carrier(false);
    sim.port.set_carrier(true);
    sim.probe().expect("probe again");
    assert!(sim.async_events().is_empty());
    assert_eq!(sim.read::<u32>(old_ring.indices), 0, "old ring untouched");
    assert_healthy(&mut sim);
}

/// A valid DSR for `sim`, to be broken by the caller.
fn dsr(sim: &mut SimDriver) -> (u64, Dsr, Vec<u64>) {
    let at = sim.alloc_page();
    let ring_pages = sim.alloc_pages(4);
    let pdir = sim.make_pdir(&ring_pages);
    let cq_pages = sim.alloc_pages(4);
    let cq_pdir = sim.make_pdir(&cq_pages);
    let info = |pdir_dma| RingPageInfo {
        num_pages: 4,
        reserved: 0,
        pdir_dma,
    };
    let good = Dsr {
        driver_version: 20,
        cmd_slot_dma: sim.alloc_page(),
        resp_slot_dma: sim.alloc_page(),
        async_ring_pages: info(pdir),
        cq_ring_pages: info(cq_pdir),
        ..Dsr::default()
    };
    (at, good, ring_pages)
}

/// Pitfall 2: DSR ring descriptors: page counts, directory, table and data pages;
/// slots; the DSR itself.
#[test]
fn p02_dsr_ring_descriptors() {
    let mut sim = SimDriver::new();
    let (at, good, ring_pages) = dsr(&mut sim);
    let pdir = good.async_ring_pages.pdir_dma;
    let table: u64 = sim.read(pdir);
    let with_pages = |n| Dsr {
        async_ring_pages: RingPageInfo {
            num_pages: n,
            ..good.async_ring_pages
        },
        ..good
    };
    let with_pdir = |p| Dsr {
        cq_ring_pages: RingPageInfo {
            pdir_dma: p,
            ..good.cq_ring_pages
        },
        ..good
    };
    let bad = [
        ("no pages", with_pages(0)),
        ("header only", with_pages(1)),
        ("more than one table", with_pages(513)),
        ("huge", with_pages(u32::MAX)),
        ("unaligned directory", with_pdir(pdir + 8)),
        ("directory outside RAM", with_pdir(OUTSIDE)),
        (
            "command slot outside RAM",
            Dsr {
                cmd_slot_dma: OUTSIDE,
                ..good
            },
        ),
        (
            "unaligned response slot",
            Dsr {
                resp_slot_dma: good.resp_slot_dma + 4,
                ..good
            },
        ),
    ];
    for (what, dsr) in bad {
        sim.write(at, dsr);
        sim.load_dsr(at);
        assert_eq!(sim.reg_read(Reg::Err), 22, "{what}");
        assert_eq!(
            sim.read::<DeviceCaps>(at + DSR_CAPS_OFFSET),
            DeviceCaps::default(),
            "{what}: no caps"
        );
        assert_eq!(sim.ctl(Ctl::Activate), Err(EINVAL), "{what}");
    }
    // Broken table and data page entries.
    sim.write(at, good);
    for (entry_at, value) in [
        (pdir, OUTSIDE),
        (table + 8, ring_pages[1] + 1),
        (table + 24, OUTSIDE),
    ] {
        let saved: u64 = sim.read(entry_at);
        sim.write(entry_at, value);
        sim.load_dsr(at);
        assert_eq!(sim.reg_read(Reg::Err), 22, "entry at {entry_at:#x}");
        sim.write(entry_at, saved);
    }
    // The DSR itself: unaligned, outside RAM.
    for gpa in [at + 8, OUTSIDE] {
        sim.load_dsr(gpa);
        assert_eq!(sim.reg_read(Reg::Err), 22);
    }
    assert_eq!(sim.metric("dsr_invalid"), 13);
    sim.probe().expect("a good DSR still works");
    assert_healthy(&mut sim);
}

/// Pitfall 3: Page counts versus sizes for every CREATE.
#[test]
fn p03_page_counts() {
    let (mut sim, pd, cq) = with_pd_cq();
    let pages = sim.alloc_pages(3);
    let pdir = sim.make_pdir(&pages);
    let cq_req = |cqe, nchunks| CreateCqReq {
        pdir_dma: pdir,
        cqe,
        nchunks,
        ..Default::default()
    };
    for (cqe, nchunks, want) in [
        (64, 0, EINVAL),
        (64, 1, EINVAL),
        (128, 2, EINVAL),
        (64, PDIR_MAX_PAGES + 1, EFAULT),
        (64, u32::MAX, EFAULT),
    ] {
        let got = sim.cmd::<_, CreateCqResp>(CmdCode::CreateCq, cq_req(cqe, nchunks));
        assert_eq!(got.err(), Some(want), "cqe {cqe} nchunks {nchunks}");
    }
    // A guest may claim more pages than needed: only the needed ones count.
    let claimed = sim.cmd::<_, CreateCqResp>(CmdCode::CreateCq, cq_req(64, PDIR_MAX_PAGES));
    assert!(claimed.is_ok());
    let qp_req = |total_chunks, send_chunks| CreateQpReq {
        pdir_dma: pdir,
        pd_handle: pd,
        send_cq_handle: cq.handle,
        recv_cq_handle: cq.handle,
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 1,
        max_recv_sge: 1,
        total_chunks,
        send_chunks,
        qp_type: qp_type::RC,
        ..Default::default()
    };
    // 32 x 128-byte SQ WQEs: 1 page; 32 x 32-byte RQ WQEs: 1 page.
    for (total, send) in [(0, 0), (3, 3), (2, 1), (3, 0), (2, 2), (1, 0)] {
        let got = sim.cmd::<_, CreateQpRespV2>(CmdCode::CreateQp, qp_req(total, send));
        assert_eq!(got.err(), Some(EINVAL), "total {total} send {send}");
    }
    assert!(sim
        .cmd::<_, CreateQpRespV2>(CmdCode::CreateQp, qp_req(3, 1))
        .is_ok());
    let srq_req = |max_wr, nchunks| CreateSrqReq {
        pdir_dma: pdir,
        pd_handle: pd,
        nchunks,
        attrs: pvrdma_abi::verbs::SrqAttr {
            max_wr,
            max_sge: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    for (max_wr, nchunks) in [(16, 0), (16, 1), (256, 2)] {
        let got = sim.cmd::<_, CreateSrqResp>(CmdCode::CreateSrq, srq_req(max_wr, nchunks));
        assert_eq!(got.err(), Some(EINVAL), "srq {max_wr} in {nchunks}");
    }
    let mr_req = |start, length, nchunks| CreateMrReq {
        start,
        length,
        pdir_dma: pdir,
        pd_handle: pd,
        nchunks,
        ..Default::default()
    };
    for (start, length, nchunks) in [
        (0x1000, 0x1000, 2),
        (0x1800, 0x1000, 1),
        (0x1000, 0, 0),
        (u64::MAX - 0xfff, 0x2000, 2),
        (0, (1 << 30) + 1, PDIR_MAX_PAGES),
    ] {
        let got = sim.cmd::<_, CreateMrResp>(CmdCode::CreateMr, mr_req(start, length, nchunks));
        assert_eq!(
            got.err(),
            Some(EINVAL),
            "mr {start:#x}+{length:#x} in {nchunks}"
        );
    }
    assert!(sim
        .cmd::<_, CreateMrResp>(CmdCode::CreateMr, mr_req(0x1800, 0x1000, 2))
        .is_ok());
    assert_healthy(&mut sim);
}

/// Pitfall 4: Ring geometry: powers of two within the caps; SGE counts.
#[test]
fn p04_ring_geometry() {
    let (mut sim, pd, cq) = with_pd_cq();
    for cqe in [0, 3, 48, 65536] {
        assert_eq!(sim.create_cq(0, cqe).err(), Some(EINVAL), "cqe {cqe}");
    }
    let huge = CreateCqReq {
        cqe: 1 << 31,
        nchunks: u32::MAX,
        ..Default::default()
    };
    assert_eq!(
        sim.cmd::<_, CreateCqResp>(CmdCode::CreateCq, huge).err(),
        Some(EINVAL)
    );
    let rc = QpSpec::rc(pd, cq.handle);
    for spec in [
        QpSpec {
            max_send_wr: 0,
            ..rc
        },
        QpSpec {
            max_send_wr: 24,
            ..rc
        },
        QpSpec {
            max_recv_wr: 8192,
            ..rc
        },
        QpSpec {
            max_send_sge: 17,
            ..rc
        },
        QpSpec {
            max_recv_sge: 0,
            ..rc
        },
    ] {
        assert_eq!(sim.create_qp(spec).err(), Some(EINVAL), "{spec:?}");
    }
    for (wr, sge) in [(0, 1), (6, 1), (8192, 1), (16, 17)] {
        assert_eq!(sim.create_srq(pd, wr, sge).err(), Some(EINVAL));
    }
    assert_healthy(&mut sim);
}

/// Pitfall 5: Ring indices read from guest memory are validated before use; work
/// per doorbell is bounded.
#[test]
fn p05_ring_indices() {
    let (mut sim, pd, cq) = with_pd_cq();
    // A consumer index of the async ring that is not on the cycle: the
    // event is dropped, not written somewhere.
    let ring = sim.async_ring.clone().expect("probed");
    sim.write(ring.indices + 4, 0x800u32);
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    sim.to_rts(qp.handle, qp_type::RC).expect("RTS");
    sim.write(qp.sq.indices, u32::MAX);
    sim.doorbell(0, uar::QP_OFFSET, qp.handle | uar::QP_SEND);
    assert!(sim.wait_until(|s| s.metric("event_dropped") == 1));
    assert_eq!(sim.read::<u32>(ring.indices), 0, "producer index untouched");
    assert_eq!(
        sim.query_qp(qp.handle).expect("query").qp_state,
        qp_state::ERR
    );
    // The guest repairs its index: events flow again.
    sim.write(ring.indices + 4, 0u32);
    sim.port.set_carrier(false);
    assert!(sim.wait_until(|s| s.metric("event_posted") == 1));
    // A CQ consumer index out of range breaks the CQ when armed.
    sim.write(cq.ring.indices + 4, 0x1_0000u32);
    sim.arm_cq(&cq, false);
    assert!(sim.wait_until(|s| s.metric("event_posted") == 2));
    let events = sim.async_events();
    assert_eq!(
        events.last(),
        Some(&Eqe {
            event_type: event::CQ_ERR,
            info: cq.handle
        })
    );
    // A full send queue is flushed in one bounded pass.
    let cq2 = sim.create_cq(0, 64).expect("cq");
    let qp2 = sim.create_qp(QpSpec::rc(pd, cq2.handle)).expect("qp");
    sim.to_rts(qp2.handle, qp_type::RC).expect("RTS");
    for i in 0..16 {
        sim.post_send(&qp2, i, 2);
    }
    to_err(&mut sim, qp2.handle);
    assert_eq!(sim.poll_cq(&cq2).len(), 16);
    assert_healthy(&mut sim);
}

/// Pitfall 6: WQE contents: only what the device uses today is read (wr_id,
/// opcode); AV GID indices and remote QPNs are checked at MODIFY_QP.
#[test]
fn p06_wqe_contents() {
    let (mut sim, pd, cq) = with_pd_cq();
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    let mut rtr = QpAttr {
        qp_state: qp_state::RTR,
        path_mtu: 3,
        dest_qp_num: 1,
        ..QpAttr::default()
    };
    rtr.ah_attr.port_num = 1;
    rtr.ah_attr.ah_flags = 1;
    sim.modify_qp(
        qp.handle,
        RC_INIT_MASK,
        QpAttr {
            qp_state: qp_state::INIT,
            port_num: 1,
            ..QpAttr::default()
        },
    )
    .expect("INIT");
    for (what, attrs) in [
        ("unbound source GID", {
            let mut a = rtr;
            a.ah_attr.grh.sgid_index = 200;
            a
        }),
        ("AV without GRH", {
            let mut a = rtr;
            a.ah_attr.ah_flags = 0;
            a
        }),
        ("AV on port 2", {
            let mut a = rtr;
            a.ah_attr.port_num = 2;
            a
        }),
        (
            "25-bit destination QPN",
            QpAttr {
                dest_qp_num: 1 << 24,
                ..rtr
            },
        ),
        ("path MTU 0", QpAttr { path_mtu: 0, ..rtr }),
    ] {
        assert_eq!(
            sim.modify_qp(qp.handle, RC_RTR_MASK, attrs),
            Err(EINVAL),
            "{what}"
        );
    }
    // A WQE with absurd fields is flushed by wr_id alone.
    sim.modify_qp(
        qp.handle,
        m::STATE,
        QpAttr {
            qp_state: qp_state::ERR,
            ..QpAttr::default()
        },
    )
    .expect("ERR");
    let slot = qp.sq.data[0];
    sim.write(
        slot,
        SqWqeHdr {
            wr_id: 77,
            num_sge: u32::MAX,
            opcode: 0xdead,
            ..SqWqeHdr::default()
        },
    );
    sim.write(qp.sq.indices, 1u32);
    sim.doorbell(0, uar::QP_OFFSET, qp.handle | uar::QP_SEND);
    assert!(sim.wait_until(|s| s.metric("wqe_flushed") == 1));
    let cqes = sim.poll_cq(&cq);
    assert_eq!(
        (cqes[0].wr_id, cqes[0].status),
        (77, wc_status::WR_FLUSH_ERR)
    );
    assert_healthy(&mut sim);
}

/// Pitfall 7: Handles: bounds, type, owner, staleness, references.
#[test]
fn p07_handles() {
    let (mut sim, pd, cq) = with_pd_cq();
    let ctx = sim.create_uc(2).expect("uc");
    let user_pd = sim.create_pd(ctx).expect("pd");
    let user_cq = sim.create_cq(ctx, 16).expect("cq");
    let srq = sim.create_srq(pd, 16, 1).expect("srq");
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    // Huge, zero and wrong-type handles.
    for handle in [0, 0xff_ffff, u32::MAX, 1000] {
        for code in [
            CmdCode::DestroyPd,
            CmdCode::DestroyMr,
            CmdCode::DestroyCq,
            CmdCode::DestroyQp,
            CmdCode::DestroyUc,
            CmdCode::DestroySrq,
        ] {
            assert_eq!(
                sim.destroy(code, handle),
                Err(EINVAL),
                "{code:?} {handle:#x}"
            );
        }
        assert_eq!(sim.query_qp(handle).err(), Some(EINVAL));
    }
    // Objects of another context.
    let mixed = QpSpec {
        pd: user_pd,
        ..QpSpec::rc(user_pd, cq.handle)
    };
    assert_eq!(
        sim.create_qp(mixed).err(),
        Some(EPERM),
        "kernel CQ, user PD"
    );
    let foreign_srq = QpSpec {
        srq: Some(srq.handle),
        ..QpSpec::rc(user_pd, user_cq.handle)
    };
    assert_eq!(sim.create_qp(foreign_srq).err(), Some(EPERM), "kernel SRQ");
    // In use: refused.
    assert_eq!(sim.destroy(CmdCode::DestroyPd, pd), Err(EBUSY));
    assert_eq!(sim.destroy(CmdCode::DestroyCq, cq.handle), Err(EBUSY));
    assert_eq!(sim.destroy(CmdCode::DestroyUc, ctx), Err(EBUSY));
    // Stale after destroy.
    sim.destroy(CmdCode::DestroyQp, qp.handle).expect("destroy");
    assert_eq!(sim.destroy(CmdCode::DestroyQp, qp.handle), Err(EINVAL));
    assert_eq!(sim.query_qp(qp.handle).err(), Some(EINVAL));
    sim.doorbell(0, uar::QP_OFFSET, qp.handle | uar::QP_SEND);
    assert_eq!(sim.metric("doorbell_unmatched"), 1, "stale doorbell");
    assert_healthy(&mut sim);
}

/// Pitfall 8: Every handle the device returns is below its `max_*`, below 2^24,
/// and non-zero where the guest needs it.
#[test]
fn p08_returned_handles() {
    let config = PvrdmaConfig {
        limits: Limits {
            max_qp: 8,
            max_cq: 8,
            max_pd: 8,
            max_mr: 8,
            max_srq: 8,
            max_uar: 8,
            ..Limits::default()
        },
        ..PvrdmaConfig::default()
    };
    let mut sim = ready_with(&config);
    let mut ctxs = Vec::new();
    while let Ok(ctx) = sim.create_uc(ctxs.len() as u32 + 1) {
        ctxs.push(ctx);
    }
    let mut pds = Vec::new();
    while let Ok(pd) = sim.create_pd(0) {
        pds.push(pd);
    }
    let mut cqs = Vec::new();
    while let Ok(cq) = sim.create_cq(0, 4) {
        cqs.push(cq.handle);
    }
    let mut qps = Vec::new();
    while let Ok(qp) = sim.create_qp(QpSpec::rc(pds[0], cqs[0])) {
        qps.push((qp.handle, qp.qpn));
    }
    let mut srqs = Vec::new();
    while let Ok(srq) = sim.create_srq(pds[0], 4, 1) {
        srqs.push(srq.handle);
    }
    let mut mrs = Vec::new();
    while let Ok(mr) = sim.reg_user_mr(pds[0], 0, 4096, 1) {
        mrs.push(mr.mr_handle);
        assert_eq!(mr.lkey >> 8, mr.mr_handle);
    }
    for (what, handles) in [
        ("contexts", &ctxs),
        ("PDs", &pds),
        ("CQs", &cqs),
        ("SRQs", &srqs),
        ("MRs", &mrs),
    ] {
        assert_eq!(handles.len(), 7, "{what}: all of 1..8");
        assert!(
            handles.iter().all(|&h| h != 0 && h < 8),
            "{what}: {handles:?}"
        );
    }
    assert_eq!(qps.len(), 6, "2..8 (1 is the GSI QP's)");
    for (handle, qpn) in qps {
        assert!(handle != 0 && handle < 8);
        assert!((2..1 << 24).contains(&qpn));
    }
}

/// Pitfall 9: Caps consistency, and limits that would break it are refused.
#[test]
fn p09_caps_consistency() {
    for limits in [
        Limits::default(),
        Limits {
            max_uar: 4,
            gid_tbl_len: 1,
            max_qp: pvrdma::MAX_QP,
            ..Limits::default()
        },
    ] {
        let mut sim = SimDriver::with_config(&PvrdmaConfig {
            limits: limits.clone(),
            ..PvrdmaConfig::default()
        });
        sim.cfg_write(6, 0xffff_ffff);
        sim.cfg_write(7, 0xffff_ffff);
        let bar2 = !(u64::from(sim.cfg_read(7)) << 32 | u64::from(sim.cfg_read(6) & !0xf)) + 1;
        sim.cfg_write(6, sim.bars[2] as u32);
        sim.cfg_write(7, (sim.bars[2] >> 32) as u32);
        let caps = sim.probe().expect("probe");
        assert!(caps.max_uar.is_power_of_two());
        assert_eq!(u64::from(caps.max_uar) * 4096, bar2);
        assert!(caps.max_qp <= pvrdma::MAX_QP);
        assert!(matches!(caps.gid_types, 1 | 2));
        let port: QueryPortResp = sim
            .cmd(
                CmdCode::QueryPort,
                QueryPortReq {
                    port_num: 1,
                    ..Default::default()
                },
            )
            .expect("port");
        assert!(port.attrs.gid_tbl_len <= caps.gid_tbl_len);
    }
    let hooks = || pci::DeviceHooks {
        msi: std::sync::Arc::new(pci::test_utils::MockMsi::default()),
        ioevents: std::sync::Arc::new(pci::test_utils::MockIoEvents::default()),
    };
    for bad in [
        Limits {
            max_uar: 6,
            ..Limits::default()
        },
        Limits {
            max_qp: pvrdma::MAX_QP + 1,
            ..Limits::default()
        },
        Limits {
            gid_tbl_len: 0,
            ..Limits::default()
        },
    ] {
        let mem = std::sync::Arc::new(
            vm_memory::GuestMemoryMmap::<vm_memory::bitmap::AtomicBitmap>::from_ranges(&[(
                vm_memory::GuestAddress(0),
                0x10_0000,
            )])
            .expect("memory"),
        );
        let config = PvrdmaConfig {
            limits: bad,
            ..PvrdmaConfig::default()
        };
        let port = std::sync::Arc::new(net_port::Port::new([2; 6], true));
        let wire = std::sync::Arc::new(pvrdma::sim_driver::SimWire::unconnected());
        assert!(pvrdma::Pvrdma::new(&config, port, wire, mem, hooks()).is_err());
    }
}

/// Pitfall 10: UAR: reads answered, only 32-bit doorbell writes at 0/4/8 count,
/// CREATE_UC PFNs must lie in BAR2 (relative to its current base).
#[test]
fn p10_uar() {
    let (mut sim, _pd, cq) = with_pd_cq();
    assert_eq!(sim.read32(sim.bars[2] + 8), u32::MAX);
    let mut data = [0u8; 8];
    assert!(sim.bus.mmio_read(sim.bars[2], &mut data));
    assert_eq!(data, [0xff; 8]);
    for (offset, bytes) in [
        (4, vec![1]),
        (4, vec![1, 0]),
        (4, vec![0; 8]),
        (12, vec![0; 4]),
    ] {
        assert!(sim.bus.mmio_write(sim.bars[2] + offset, &bytes));
    }
    assert_eq!(sim.metric("doorbell_unmatched"), 4);
    assert_eq!(sim.metric("doorbell_cq_arm"), 0);
    let pfn = |sim: &SimDriver, delta: i64| ((sim.bars[2] >> 12) as i64 + delta) as u64;
    for delta in [-1, 0, 512, 1 << 40] {
        let req = CreateUcReq {
            pfn64: pfn(&sim, delta),
            ..Default::default()
        };
        assert_eq!(
            sim.cmd::<_, CreateUcResp>(CmdCode::CreateUc, req).err(),
            Some(EINVAL),
            "{delta}"
        );
    }
    sim.create_uc(511).expect("last page");
    assert_eq!(sim.create_uc(511), Err(EBUSY));
    sim.arm_cq(&cq, false);
    assert!(sim.wait_until(|s| s.metric("doorbell_cq_arm") == 1));
    assert_healthy(&mut sim);
}

/// Pitfall 11: A failed CREATE leaves nothing behind: no handle, QPN, page budget
/// or doorbell is consumed.
#[test]
fn p11_error_paths() {
    let (mut sim, pd, cq) = with_pd_cq();
    let baseline = sim.ioevents.count();
    let first = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    sim.destroy(CmdCode::DestroyQp, first.handle)
        .expect("destroy");
    // A QP whose last receive page is outside RAM, after everything else
    // was validated and mapped.
    let pages = sim.alloc_pages(2);
    let mut all = pages.clone();
    all.push(OUTSIDE);
    let pdir = sim.make_pdir(&all);
    let req = CreateQpReq {
        pdir_dma: pdir,
        pd_handle: pd,
        send_cq_handle: cq.handle,
        recv_cq_handle: cq.handle,
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        total_chunks: 3,
        send_chunks: 1,
        qp_type: qp_type::RC,
        ..Default::default()
    };
    for _ in 0..3 {
        assert_eq!(
            sim.cmd::<_, CreateQpRespV2>(CmdCode::CreateQp, req).err(),
            Some(EFAULT)
        );
    }
    assert_eq!(sim.ioevents.count(), baseline);
    let next = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    assert_eq!(next.handle, first.handle, "no handle leaked");
    assert_eq!(next.qpn, first.qpn + 1, "no QPN consumed by the failures");
    // Same for a CQ, an SRQ and an MR.
    let bad_pdir = sim.make_pdir(&[pages[0], OUTSIDE]);
    let cq_req = CreateCqReq {
        pdir_dma: bad_pdir,
        cqe: 64,
        nchunks: 2,
        ..Default::default()
    };
    assert_eq!(
        sim.cmd::<_, CreateCqResp>(CmdCode::CreateCq, cq_req).err(),
        Some(EFAULT)
    );
    assert_eq!(sim.create_cq(0, 64).map(|c| c.handle), Ok(2));
    assert_eq!(sim.create_srq(pd, 16, 1).map(|s| s.handle), Ok(1));
    assert_eq!(sim.reg_user_mr(pd, 0, 4096, 1).map(|m| m.mr_handle), Ok(1));
    assert_healthy(&mut sim);
}

/// Pitfall 12: Device-produced rings: the device checks space itself; a CQ that
/// overflows gets CQ_ERR and no more CQEs; nothing is overwritten.
#[test]
fn p12_device_rings() {
    let (mut sim, pd, _cq) = with_pd_cq();
    let small = sim.create_cq(0, 4).expect("cq");
    let qp = sim.create_qp(QpSpec::rc(pd, small.handle)).expect("qp");
    sim.to_rts(qp.handle, qp_type::RC).expect("RTS");
    for i in 0..6 {
        sim.post_send(&qp, 100 + i, 2);
    }
    to_err(&mut sim, qp.handle);
    assert_eq!(sim.metric("cq_overflow"), 1);
    assert_eq!(
        sim.async_events(),
        vec![Eqe {
            event_type: event::CQ_ERR,
            info: small.handle
        }]
    );
    let cqes = sim.poll_cq(&small);
    let ids: Vec<u64> = cqes.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![100, 101, 102, 103], "first four intact");
    // Stopped: later completions are not written even with room.
    sim.post_send(&qp, 200, 2);
    assert!(sim.wait_until(|s| s.metric("wqe_flushed") == 7));
    assert!(sim.poll_cq(&small).is_empty());
    assert_eq!(sim.metric("cq_overflow"), 1, "CQ_ERR once");

    // The async ring holds 512 unconsumed events; more are dropped.
    for i in 0..520u64 {
        sim.port.set_carrier(i % 2 == 1);
        assert!(sim.wait_until(|s| s.metric("link_change") == i + 1));
    }
    assert_eq!(sim.metric("event_dropped"), 520 - 512);
    let events = sim.async_events();
    assert_eq!(events.len(), 512);
    assert_eq!(events[0].event_type, event::PORT_ERR, "oldest kept");
    assert_eq!(events[511].event_type, event::PORT_ACTIVE);
    assert_healthy(&mut sim);
}

/// Pitfall 13: The command slot: unknown codes fail, stale bytes after a request
/// are ignored, and at most 176 response bytes are written.
#[test]
fn p13_command_slot() {
    let (mut sim, pd, cq) = with_pd_cq();
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    let mut req = [0xa5u8; 184];
    req[..16].copy_from_slice(&[0; 16]);
    req[8] = 21;
    assert_eq!(sim.post_raw(&req), Err(EINVAL));
    // CREATE_PD followed by stale stack bytes.
    req[8] = CmdCode::CreatePd as u8;
    req[16..24].copy_from_slice(&[0; 8]);
    sim.post_raw(&req).expect("stale tail ignored");
    // The largest response stays within 176 bytes.
    sim.write(sim.resp_slot + 176, [0x5a5a_5a5a_5a5a_5a5au64; 32]);
    sim.query_qp(qp.handle).expect("query");
    let tail: [u64; 32] = sim.read(sim.resp_slot + 176);
    assert!(tail.iter().all(|&w| w == 0x5a5a_5a5a_5a5a_5a5a));
    // An all-zero slot is QUERY_PORT of port 0.
    assert_eq!(sim.post_raw(&[0u8; 184]), Err(EINVAL));
    assert_healthy(&mut sim);
}

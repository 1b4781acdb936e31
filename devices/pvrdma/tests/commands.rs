// SPDX-License-Identifier: Apache-2.0
//! Every command's success and failure paths, through the simulated
//! driver.

mod common;

use common::*;
use pvrdma::sim_driver::{Failure, QpSpec, SimDriver, GID, GSI_QKEY, RC_INIT_MASK, RC_RTR_MASK};
use pvrdma_abi::cmd::*;
use pvrdma_abi::regs::version;
use pvrdma_abi::verbs::{access, mr_flags, qp_attr_mask as m, qp_state, qp_type, QpAttr, SrqAttr};

#[test]
fn user_contexts() {
    let mut sim = ready();
    let ctx = sim.create_uc(1).expect("uc");
    assert_eq!(ctx, 1, "user contexts never get handle 0");
    assert_eq!(sim.create_uc(1), Err(EBUSY), "page already owned");
    assert_eq!(sim.create_uc(0), Err(EINVAL), "page 0 is the kernel's");
    assert_eq!(sim.create_uc(512), Err(EINVAL), "outside BAR2");
    let pd = sim.create_pd(ctx).expect("user pd");
    assert_eq!(sim.destroy(CmdCode::DestroyUc, ctx), Err(EBUSY));
    sim.destroy(CmdCode::DestroyPd, pd).expect("destroy pd");
    sim.destroy(CmdCode::DestroyUc, ctx).expect("destroy uc");
    assert_eq!(sim.destroy(CmdCode::DestroyUc, ctx), Err(EINVAL), "stale");
    assert_eq!(sim.create_uc(7), Ok(1), "lowest free handle");
}

#[test]
fn old_driver_32_bit_uar_pfn() {
    let mut sim = SimDriver::new();
    sim.driver_version = version::ROCEV2;
    sim.probe().expect("probe");
    let pfn = (sim.bars[2] >> 12) + 3;
    // Garbage above the 32-bit PFN is ignored for drivers before 19.
    let resp: Result<CreateUcResp, _> = sim.cmd(
        CmdCode::CreateUc,
        CreateUcReq {
            pfn64: 0xdead_0000_0000_0000 | pfn,
            ..Default::default()
        },
    );
    assert!(resp.is_ok());
}

#[test]
fn protection_domains() {
    let mut sim = ready();
    assert_eq!(sim.create_pd(0), Ok(1));
    assert_eq!(sim.create_pd(0), Ok(2));
    assert_eq!(sim.create_pd(9), Err(EINVAL), "no such context");
    sim.destroy(CmdCode::DestroyPd, 1).expect("destroy");
    assert_eq!(sim.destroy(CmdCode::DestroyPd, 1), Err(EINVAL));
    assert_eq!(sim.create_pd(0), Ok(1));
}

#[test]
fn memory_regions() {
    let (mut sim, pd, _cq) = with_pd_cq();
    let mr = sim
        .reg_user_mr(
            pd,
            0x7f00_1234,
            3 * 4096,
            access::LOCAL_WRITE | access::REMOTE_WRITE,
        )
        .expect("user mr");
    assert_eq!(mr.lkey, mr.rkey);
    assert_eq!(mr.lkey >> 8, mr.mr_handle);
    assert_ne!(mr.mr_handle, 0);
    assert_eq!(
        sim.destroy(CmdCode::DestroyPd, pd),
        Err(EBUSY),
        "MR uses it"
    );

    let dma: CreateMrResp = sim
        .cmd(
            CmdCode::CreateMr,
            CreateMrReq {
                pd_handle: pd,
                access_flags: access::LOCAL_WRITE,
                flags: mr_flags::DMA,
                ..Default::default()
            },
        )
        .expect("dma mr");
    let frmr: CreateMrResp = sim
        .cmd(
            CmdCode::CreateMr,
            CreateMrReq {
                pd_handle: pd,
                flags: mr_flags::FRMR,
                nchunks: 128,
                ..Default::default()
            },
        )
        .expect("frmr");
    for handle in [mr.mr_handle, dma.mr_handle, frmr.mr_handle] {
        sim.destroy(CmdCode::DestroyMr, handle).expect("destroy mr");
    }
    assert_eq!(sim.destroy(CmdCode::DestroyMr, mr.mr_handle), Err(EINVAL));
    sim.destroy(CmdCode::DestroyPd, pd).expect("pd free now");
}

#[test]
fn memory_region_failures() {
    let (mut sim, pd, _cq) = with_pd_cq();
    let user_ctx = sim.create_uc(1).expect("uc");
    let user_pd = sim.create_pd(user_ctx).expect("pd");
    let mr = |flags, access_flags, nchunks, length| CreateMrReq {
        pd_handle: pd,
        flags,
        access_flags,
        nchunks,
        length,
        start: 0x1000,
        pdir_dma: 0,
        ..Default::default()
    };
    for (what, req, want) in [
        (
            "DMA MR with remote access",
            mr(1, access::LOCAL_WRITE | access::REMOTE_READ, 0, 0),
            EINVAL,
        ),
        ("DMA and FRMR", mr(3, 0, 1, 0), EINVAL),
        ("unknown flag", mr(4, 0, 1, 0), EINVAL),
        ("FRMR of 0 pages", mr(2, 0, 0, 0), EINVAL),
        ("FRMR of 129 pages", mr(2, 0, 129, 0), EINVAL),
        ("zero length", mr(0, 0, 1, 0), EINVAL),
        (
            "longer than max_mr_size",
            mr(0, 0, 262_145, (1 << 30) + 4096),
            EINVAL,
        ),
        ("pages do not match", mr(0, 1, 2, 4096), EINVAL),
        (
            "remote write without local",
            mr(0, access::REMOTE_WRITE, 1, 4096),
            EINVAL,
        ),
        (
            "on-demand paging",
            mr(0, access::ON_DEMAND, 1, 4096),
            EINVAL,
        ),
        (
            "page directory outside RAM",
            CreateMrReq {
                pdir_dma: 1 << 40,
                ..mr(0, 1, 1, 4096)
            },
            EFAULT,
        ),
        (
            "unaligned page directory",
            CreateMrReq {
                pdir_dma: 0x10_0008,
                ..mr(0, 1, 1, 4096)
            },
            EFAULT,
        ),
    ] {
        assert_eq!(
            sim.cmd::<_, CreateMrResp>(CmdCode::CreateMr, req).err(),
            Some(want),
            "{what}"
        );
    }
    let dma_on_user_pd = CreateMrReq {
        pd_handle: user_pd,
        ..mr(1, access::LOCAL_WRITE, 0, 0)
    };
    assert_eq!(
        sim.cmd::<_, CreateMrResp>(CmdCode::CreateMr, dma_on_user_pd)
            .err(),
        Some(EINVAL),
        "DMA MR on a user PD"
    );
    let no_pd = CreateMrReq {
        pd_handle: 99,
        ..mr(2, 0, 4, 0)
    };
    assert_eq!(
        sim.cmd::<_, CreateMrResp>(CmdCode::CreateMr, no_pd).err(),
        Some(EINVAL)
    );
    assert_healthy(&mut sim);
}

#[test]
fn completion_queues() {
    let mut sim = ready();
    let cq = sim.create_cq(0, 256).expect("cq");
    assert_eq!((cq.handle, cq.cqe), (1, 256));
    let ctx = sim.create_uc(5).expect("uc");
    let user_cq = sim.create_cq(ctx, 1).expect("one-entry CQ");
    assert_eq!(user_cq.page, 5);
    assert_eq!(sim.create_cq(42, 16).err(), Some(EINVAL), "no such context");
    for cqe in [0, 3, 100, 65536] {
        assert_eq!(sim.create_cq(0, cqe).err(), Some(EINVAL), "cqe {cqe}");
    }
    let resize = |cqe| ResizeCqReq {
        cq_handle: cq.handle,
        cqe,
        ..Default::default()
    };
    let same: ResizeCqResp = sim.cmd(CmdCode::ResizeCq, resize(256)).expect("same size");
    assert_eq!(same.cqe, 256);
    assert_eq!(
        sim.cmd::<_, ResizeCqResp>(CmdCode::ResizeCq, resize(512))
            .err(),
        Some(EOPNOTSUPP)
    );
    assert_eq!(
        sim.destroy(CmdCode::DestroyUc, ctx),
        Err(EBUSY),
        "CQ uses it"
    );
    sim.destroy(CmdCode::DestroyCq, user_cq.handle)
        .expect("destroy");
    sim.destroy(CmdCode::DestroyCq, cq.handle).expect("destroy");
    assert_eq!(sim.destroy(CmdCode::DestroyCq, cq.handle), Err(EINVAL));
    sim.destroy(CmdCode::DestroyUc, ctx)
        .expect("context free now");
}

#[test]
fn queue_pairs() {
    let (mut sim, pd, cq) = with_pd_cq();
    let gsi = sim
        .create_qp(QpSpec {
            qp_type: qp_type::GSI,
            ..QpSpec::rc(pd, cq.handle)
        })
        .expect("gsi");
    assert_eq!((gsi.qpn, gsi.handle), (1, 1), "QP1");
    assert_eq!(
        sim.create_qp(QpSpec {
            qp_type: qp_type::GSI,
            ..QpSpec::rc(pd, cq.handle)
        })
        .err(),
        Some(EBUSY),
        "one GSI QP"
    );
    let rc = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("rc");
    assert!(rc.handle >= 2 && rc.handle < 1024);
    assert!(rc.qpn >= 2 && rc.qpn < 1 << 24);
    let ud = sim
        .create_qp(QpSpec {
            qp_type: qp_type::UD,
            ..QpSpec::rc(pd, cq.handle)
        })
        .expect("ud");
    assert_ne!(ud.qpn, rc.qpn);
    for t in [qp_type::SMI, qp_type::UC, 9] {
        assert_eq!(
            sim.create_qp(QpSpec {
                qp_type: t,
                ..QpSpec::rc(pd, cq.handle)
            })
            .err(),
            Some(EOPNOTSUPP),
            "type {t}"
        );
    }
    assert_eq!(sim.destroy(CmdCode::DestroyCq, cq.handle), Err(EBUSY));
    assert_eq!(sim.destroy(CmdCode::DestroyPd, pd), Err(EBUSY));
    let attrs = sim.query_qp(rc.handle).expect("query");
    assert_eq!(attrs.qp_state, qp_state::RESET);
    assert_eq!((attrs.cap.max_send_wr, attrs.cap.max_recv_sge), (16, 1));
    let resp: DestroyQpResp = sim
        .cmd(
            CmdCode::DestroyQp,
            DestroyQpReq {
                qp_handle: rc.handle,
                ..Default::default()
            },
        )
        .expect("destroy");
    assert_eq!(resp.events_reported, 0);
    assert_eq!(sim.query_qp(rc.handle).err(), Some(EINVAL), "stale handle");
    for qp in [gsi.handle, ud.handle] {
        sim.destroy(CmdCode::DestroyQp, qp).expect("destroy");
    }
    sim.destroy(CmdCode::DestroyCq, cq.handle)
        .expect("CQ free now");
}

#[test]
fn queue_pair_failures() {
    let (mut sim, pd, cq) = with_pd_cq();
    let ctx = sim.create_uc(1).expect("uc");
    let user_pd = sim.create_pd(ctx).expect("pd");
    let user_cq = sim.create_cq(ctx, 16).expect("cq");
    let rc = QpSpec::rc(pd, cq.handle);
    for (what, spec, want) in [
        (
            "GSI QP on a user PD",
            QpSpec {
                qp_type: qp_type::GSI,
                pd: user_pd,
                send_cq: user_cq.handle,
                recv_cq: user_cq.handle,
                ..rc
            },
            EINVAL,
        ),
        (
            "CQ of another context",
            QpSpec {
                send_cq: user_cq.handle,
                ..rc
            },
            EPERM,
        ),
        ("no such CQ", QpSpec { recv_cq: 77, ..rc }, EINVAL),
        ("no such PD", QpSpec { pd: 77, ..rc }, EINVAL),
        ("no such SRQ", QpSpec { srq: Some(5), ..rc }, EINVAL),
        (
            "send queue not a power of two",
            QpSpec {
                max_send_wr: 12,
                ..rc
            },
            EINVAL,
        ),
        (
            "receive queue too long",
            QpSpec {
                max_recv_wr: 8192,
                ..rc
            },
            EINVAL,
        ),
        (
            "empty send queue",
            QpSpec {
                max_send_wr: 0,
                ..rc
            },
            EINVAL,
        ),
        (
            "too many SGEs",
            QpSpec {
                max_send_sge: 17,
                ..rc
            },
            EINVAL,
        ),
        (
            "no SGE",
            QpSpec {
                max_recv_sge: 0,
                ..rc
            },
            EINVAL,
        ),
    ] {
        assert_eq!(sim.create_qp(spec).err(), Some(want), "{what}");
    }
    assert_healthy(&mut sim);
}

#[test]
fn shared_receive_queues() {
    let (mut sim, pd, cq) = with_pd_cq();
    let srq = sim.create_srq(pd, 64, 2).expect("srq");
    assert_eq!(srq.handle, 1);
    let query = |sim: &mut SimDriver| -> SrqAttr {
        let resp: QuerySrqResp = sim
            .cmd(
                CmdCode::QuerySrq,
                QuerySrqReq {
                    srq_handle: srq.handle,
                    ..Default::default()
                },
            )
            .expect("query");
        resp.attrs
    };
    assert_eq!((query(&mut sim).max_wr, query(&mut sim).max_sge), (64, 2));
    let modify = |mask, limit| ModifySrqReq {
        srq_handle: srq.handle,
        attr_mask: mask,
        attrs: SrqAttr {
            srq_limit: limit,
            ..Default::default()
        },
        ..Default::default()
    };
    sim.post(CmdCode::ModifySrq, modify(2, 10)).expect("limit");
    assert_eq!(query(&mut sim).srq_limit, 10);
    assert_eq!(sim.post(CmdCode::ModifySrq, modify(2, 65)), Err(EINVAL));
    assert_eq!(sim.post(CmdCode::ModifySrq, modify(1, 0)), Err(EOPNOTSUPP));
    assert_eq!(sim.post(CmdCode::ModifySrq, modify(4, 0)), Err(EINVAL));
    let qp = sim
        .create_qp(QpSpec {
            srq: Some(srq.handle),
            ..QpSpec::rc(pd, cq.handle)
        })
        .expect("qp on srq");
    assert!(qp.rq.is_none());
    assert_eq!(sim.destroy(CmdCode::DestroySrq, srq.handle), Err(EBUSY));
    sim.destroy(CmdCode::DestroyQp, qp.handle)
        .expect("destroy qp");
    sim.destroy(CmdCode::DestroySrq, srq.handle)
        .expect("destroy srq");
    assert_eq!(sim.destroy(CmdCode::DestroySrq, srq.handle), Err(EINVAL));

    for (max_wr, max_sge) in [(0, 1), (48, 1), (8192, 1), (16, 0), (16, 17)] {
        assert_eq!(sim.create_srq(pd, max_wr, max_sge).err(), Some(EINVAL));
    }
    let basic_only = CreateSrqReq {
        pd_handle: pd,
        nchunks: 2,
        srq_type: 1,
        attrs: SrqAttr {
            max_wr: 16,
            max_sge: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        sim.cmd::<_, CreateSrqResp>(CmdCode::CreateSrq, basic_only)
            .err(),
        Some(EOPNOTSUPP)
    );
}

fn rc_rtr(sgid_index: u8) -> QpAttr {
    let mut attrs = QpAttr {
        qp_state: qp_state::RTR,
        path_mtu: 3,
        dest_qp_num: 0x42,
        rq_psn: 7,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    attrs.ah_attr.port_num = 1;
    attrs.ah_attr.ah_flags = 1;
    attrs.ah_attr.grh.sgid_index = sgid_index;
    attrs
}

#[test]
fn modify_qp_state_machine() {
    let (mut sim, pd, cq) = with_pd_cq();
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    let h = qp.handle;
    let init = QpAttr {
        qp_state: qp_state::INIT,
        port_num: 1,
        qp_access_flags: access::REMOTE_WRITE,
        ..QpAttr::default()
    };
    assert_eq!(
        sim.modify_qp(h, m::STATE | m::PKEY_INDEX | m::PORT, init),
        Err(EINVAL),
        "missing access"
    );
    assert_eq!(
        sim.modify_qp(h, RC_INIT_MASK | m::QKEY, init),
        Err(EINVAL),
        "QKEY not for RC"
    );
    assert_eq!(
        sim.modify_qp(h, RC_RTR_MASK, rc_rtr(0)),
        Err(EINVAL),
        "RESET->RTR"
    );
    sim.modify_qp(h, RC_INIT_MASK, init).expect("INIT");
    assert_eq!(
        sim.modify_qp(h, RC_RTR_MASK, rc_rtr(3)),
        Err(EINVAL),
        "unbound GID 3"
    );
    assert_eq!(
        sim.modify_qp(h, RC_RTR_MASK & !m::DEST_QPN, rc_rtr(0)),
        Err(EINVAL)
    );
    let mut far = rc_rtr(0);
    far.dest_qp_num = 1 << 24;
    assert_eq!(
        sim.modify_qp(h, RC_RTR_MASK, far),
        Err(EINVAL),
        "25-bit QPN"
    );
    assert_eq!(
        sim.modify_qp(h, RC_RTR_MASK | m::ALT_PATH, rc_rtr(0)),
        Err(EOPNOTSUPP)
    );
    sim.modify_qp(h, RC_RTR_MASK, rc_rtr(0)).expect("RTR");
    let rts = QpAttr {
        qp_state: qp_state::RTS,
        sq_psn: 0x1ff_ffff,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..QpAttr::default()
    };
    let rts_mask =
        m::STATE | m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::SQ_PSN | m::MAX_QP_RD_ATOMIC;
    assert_eq!(
        sim.modify_qp(
            h,
            rts_mask,
            QpAttr {
                retry_cnt: 8,
                ..rts
            }
        ),
        Err(EINVAL)
    );
    assert_eq!(
        sim.modify_qp(
            h,
            rts_mask,
            QpAttr {
                max_rd_atomic: 17,
                ..rts
            }
        ),
        Err(EINVAL)
    );
    sim.modify_qp(h, rts_mask, rts).expect("RTS");
    let attrs = sim.query_qp(h).expect("query");
    assert_eq!(attrs.qp_state, qp_state::RTS);
    assert_eq!(attrs.dest_qp_num, 0x42);
    assert_eq!(attrs.sq_psn, 0xff_ffff, "PSNs are 24-bit");
    assert_eq!(attrs.qp_access_flags, access::REMOTE_WRITE);
    assert_eq!(attrs.ah_attr.ah_flags, 1);
    // CUR_STATE must match the device's view.
    let cur = |state| QpAttr {
        qp_state: qp_state::RTS,
        cur_qp_state: state,
        ..QpAttr::default()
    };
    assert_eq!(
        sim.modify_qp(h, m::STATE | m::CUR_STATE, cur(qp_state::SQE)),
        Err(EINVAL)
    );
    sim.modify_qp(h, m::STATE | m::CUR_STATE, cur(qp_state::RTS))
        .expect("RTS->RTS");
    assert_eq!(
        sim.modify_qp(
            h,
            m::STATE,
            QpAttr {
                qp_state: qp_state::RTR,
                ..QpAttr::default()
            }
        ),
        Err(EINVAL),
        "RTS->RTR"
    );
    assert_eq!(
        sim.modify_qp(h, 1 << 21, QpAttr::default()),
        Err(EINVAL),
        "unknown mask bit"
    );
    sim.modify_qp(
        h,
        m::STATE,
        QpAttr {
            qp_state: qp_state::SQD,
            ..QpAttr::default()
        },
    )
    .expect("SQD");
    sim.modify_qp(
        h,
        m::STATE,
        QpAttr {
            qp_state: qp_state::ERR,
            ..QpAttr::default()
        },
    )
    .expect("ERR");
    assert_eq!(sim.query_qp(h).expect("query").qp_state, qp_state::ERR);
    sim.modify_qp(h, m::STATE, QpAttr::default())
        .expect("RESET");
    sim.modify_qp(h, RC_INIT_MASK, init).expect("INIT again");
}

#[test]
fn unreliable_and_gsi_transitions() {
    let (mut sim, pd, cq) = with_pd_cq();
    for t in [qp_type::UD, qp_type::GSI] {
        let qp = sim
            .create_qp(QpSpec {
                qp_type: t,
                ..QpSpec::rc(pd, cq.handle)
            })
            .expect("qp");
        sim.to_rts(qp.handle, t).expect("to RTS");
        assert_eq!(sim.query_qp(qp.handle).expect("query").qkey, GSI_QKEY);
    }
}

#[test]
fn old_driver_gets_qpn_as_handle() {
    let mut sim = SimDriver::new();
    sim.driver_version = version::PPN64;
    sim.probe().expect("probe");
    let pd = sim.create_pd(0).expect("pd");
    let cq = sim.create_cq(0, 16).expect("cq");
    let gsi = sim
        .create_qp(QpSpec {
            qp_type: qp_type::GSI,
            ..QpSpec::rc(pd, cq.handle)
        })
        .expect("gsi");
    assert_eq!(gsi.qpn, 1);
    let rc = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("rc");
    assert_eq!(rc.qpn, 2, "v1 response: QPN = handle");
    sim.modify_qp(
        rc.qpn,
        RC_INIT_MASK,
        QpAttr {
            qp_state: qp_state::INIT,
            port_num: 1,
            ..QpAttr::default()
        },
    )
    .expect("the QPN works as handle");
}

#[test]
fn gid_bindings() {
    let (mut sim, pd, cq) = with_pd_cq();
    let bind = |index, gid, gid_type| CreateBindReq {
        index,
        new_gid: gid,
        gid_type,
        vlan: 0xfff,
        mtu: 1024,
        ..Default::default()
    };
    assert_eq!(
        sim.post(CmdCode::CreateBind, bind(32, GID, 2)),
        Err(EINVAL),
        "index"
    );
    assert_eq!(
        sim.post(CmdCode::CreateBind, bind(1, GID, 1)),
        Err(EOPNOTSUPP),
        "v1 GID on a v2 port"
    );
    assert_eq!(
        sim.post(CmdCode::CreateBind, bind(1, [0; 16], 2)),
        Err(EINVAL),
        "zero GID"
    );
    sim.post(CmdCode::CreateBind, bind(31, GID, 2))
        .expect("last slot");
    let unbind = |index, gid| DestroyBindReq {
        index,
        dest_gid: gid,
        ..Default::default()
    };
    assert_eq!(
        sim.post(CmdCode::DestroyBind, unbind(31, [1; 16])),
        Err(EINVAL),
        "other GID"
    );
    assert_eq!(
        sim.post(CmdCode::DestroyBind, unbind(5, GID)),
        Err(EINVAL),
        "unbound"
    );
    sim.post(CmdCode::DestroyBind, unbind(31, GID))
        .expect("unbind");
    // With GID 0 unbound an RC QP cannot reach RTR.
    sim.post(CmdCode::DestroyBind, unbind(0, GID))
        .expect("unbind 0");
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    assert_eq!(sim.to_rts(qp.handle, qp_type::RC), Err(EINVAL));
}

#[test]
fn unknown_command() {
    let mut sim = ready();
    let mut req = [0u8; 184];
    req[8] = 21;
    assert_eq!(sim.post_raw(&req), Err(EINVAL));
    req[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(sim.post_raw(&req), Err(EINVAL));
    assert_eq!(sim.metric("cmd_unknown"), 2);
    assert_healthy(&mut sim);
}

#[test]
fn failed_commands_still_answer() {
    let mut sim = ready();
    let _ = sim.create_pd(99);
    // ERR carries the errno; the response header too, with the right ack.
    let hdr: RespHdr = sim.read(sim.resp_slot);
    assert_eq!((hdr.ack, hdr.err), (CmdCode::CreatePd.ack(), 22));
    assert_eq!(sim.metric("cmd_failed"), 1);
    let _: Failure = sim.create_pd(99).unwrap_err();
}

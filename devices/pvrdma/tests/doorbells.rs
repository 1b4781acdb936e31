// SPDX-License-Identifier: Apache-2.0
//! Doorbells (ioeventfd and MMIO paths), the worker, the event rings,
//! interrupts and the link.

mod common;

use common::*;
use pvrdma::sim_driver::ib::{wc, wr};
use pvrdma::sim_driver::{QpSpec, SimDriver};
use pvrdma_abi::cmd::{CmdCode, QueryPortReq, QueryPortResp};
use pvrdma_abi::regs::{icr, uar, Reg};
use pvrdma_abi::verbs::{qp_attr_mask as m, qp_state, qp_type, QpAttr};
use pvrdma_abi::wqe::{event, wc_status, Eqe};

fn to_err(sim: &mut SimDriver, qp: u32) {
    let err = QpAttr {
        qp_state: qp_state::ERR,
        ..QpAttr::default()
    };
    sim.modify_qp(qp, m::STATE, err).expect("to ERR");
}

#[test]
fn error_state_flushes_every_work_request() {
    let (mut sim, pd, cq) = with_pd_cq();
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    sim.to_rts(qp.handle, qp_type::RC).expect("RTS");
    sim.post_send(&qp, 10, wr::RDMA_WRITE);
    sim.post_send(&qp, 11, wr::SEND);
    sim.post_recv(&qp, 20);
    // Send and receive share an eventfd: the worker may see one wakeup.
    assert!(sim.wait_until(|s| s.metric("doorbell_qp") >= 1));
    // Nothing completes without a transport: the work waits.
    assert!(sim.poll_cq(&cq).is_empty());
    sim.arm_cq(&cq, false);
    assert!(sim.wait_until(|s| s.metric("doorbell_cq_arm") == 1));
    sim.msi.fired(2);

    to_err(&mut sim, qp.handle);
    let cqes = sim.poll_cq(&cq);
    let got: Vec<_> = cqes
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.status, c.qp))
        .collect();
    let flush = wc_status::WR_FLUSH_ERR;
    let h = u64::from(qp.handle);
    assert_eq!(
        got,
        vec![
            (10, wc::RDMA_WRITE, flush, h),
            (11, wc::SEND, flush, h),
            (20, wc::RECV, flush, h),
        ]
    );
    // The guest sees its queues empty again.
    let sq_cons: u32 = sim.read(qp.sq.indices + 4);
    assert_eq!(sq_cons, 2);
    assert_eq!(sim.cq_notifications(), vec![cq.handle]);
    assert_eq!(sim.msi.fired(2), 1, "vector 2");
    assert_eq!(sim.metric("wqe_flushed"), 3);

    // Work posted in the error state is flushed too (ib_drain_qp).
    sim.post_send(&qp, 12, wr::SEND);
    assert!(sim.wait_until(|s| s.metric("wqe_flushed") == 4));
    assert_eq!(sim.poll_cq(&cq).first().map(|c| c.wr_id), Some(12));
    assert!(sim.cq_notifications().is_empty(), "not re-armed");
}

#[test]
fn armed_solicited_hears_about_errors_once() {
    let (mut sim, pd, cq) = with_pd_cq();
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    sim.to_rts(qp.handle, qp_type::RC).expect("RTS");
    sim.post_recv(&qp, 1);
    sim.post_recv(&qp, 2);
    sim.arm_cq(&cq, true);
    assert!(sim.wait_until(|s| s.metric("doorbell_cq_arm") == 1));
    to_err(&mut sim, qp.handle);
    assert_eq!(sim.cq_notifications(), vec![cq.handle], "one notification");
    assert_eq!(sim.poll_cq(&cq).len(), 2);
}

#[test]
fn bad_producer_index_is_fatal_for_the_qp() {
    let (mut sim, pd, cq) = with_pd_cq();
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    sim.to_rts(qp.handle, qp_type::RC).expect("RTS");
    sim.msi.fired(1);
    sim.write(qp.sq.indices, 0xdead_beefu32);
    sim.doorbell(qp.page, uar::QP_OFFSET, qp.handle | uar::QP_SEND);
    assert!(sim.wait_until(|s| s.metric("ring_invalid") >= 1));
    let events = sim.async_events();
    assert_eq!(
        events.first(),
        Some(&Eqe {
            event_type: event::QP_FATAL,
            info: qp.handle
        })
    );
    assert_eq!(sim.msi.fired(1), 1, "vector 1");
    assert_eq!(
        sim.query_qp(qp.handle).expect("query").qp_state,
        qp_state::ERR
    );
    let destroyed: pvrdma_abi::cmd::DestroyQpResp = sim
        .cmd(
            CmdCode::DestroyQp,
            pvrdma_abi::cmd::DestroyQpReq {
                qp_handle: qp.handle,
                ..Default::default()
            },
        )
        .expect("destroy");
    assert_eq!(destroyed.events_reported, 1);
    assert_healthy(&mut sim);
}

#[test]
fn doorbell_on_a_foreign_page_is_ignored() {
    let mut sim = ready();
    sim.bind_gid(0, pvrdma::sim_driver::GID, 2).expect("bind");
    let ctx = sim.create_uc(3).expect("uc");
    let pd = sim.create_pd(ctx).expect("pd");
    let cq = sim.create_cq(ctx, 16).expect("cq");
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    assert_eq!(qp.page, 3);
    sim.write(qp.sq.indices, 0xdead_beefu32);
    // Another process's page (and the kernel's): no ioeventfd there, and
    // the MMIO path refuses it.
    for page in [0, 1] {
        sim.doorbell(page, uar::QP_OFFSET, qp.handle | uar::QP_SEND);
    }
    assert_eq!(sim.metric("doorbell_unmatched"), 2);
    // Give the worker a chance to (wrongly) act, then check it did not.
    sim.arm_cq(&cq, false);
    assert!(sim.wait_until(|s| s.metric("doorbell_cq_arm") == 1));
    assert_eq!(sim.metric("doorbell_qp"), 0);
    assert!(sim.async_events().is_empty());
    // The owner's page works.
    sim.doorbell(3, uar::QP_OFFSET, qp.handle | uar::QP_SEND);
    assert!(sim.wait_until(|s| s.metric("doorbell_qp") == 1));
}

#[test]
fn cq_poll_never_exits_to_the_vmm() {
    let (sim, _pd, cq) = with_pd_cq();
    let addr = sim.bars[2] + uar::CQ_OFFSET;
    assert!(sim
        .ioevents
        .lookup(addr, cq.handle | uar::CQ_POLL)
        .is_some());
    for _ in 0..100 {
        sim.doorbell(0, uar::CQ_OFFSET, cq.handle | uar::CQ_POLL);
    }
    assert_eq!(sim.metric("doorbell_unmatched"), 0);
    // Counted in bulk the next time the worker runs.
    sim.arm_cq(&cq, false);
    assert!(sim.wait_until(|s| s.metric("doorbell_cq_poll") == 100));
}

#[test]
fn doorbells_work_without_ioeventfds() {
    let mut sim = ready();
    sim.ioevents.set_fail(true);
    let cq = sim.create_cq(0, 16).expect("CQ even if KVM refuses");
    assert_eq!(sim.metric("ioevent_failed"), 3);
    assert_eq!(sim.ioevents.count(), 0);
    sim.arm_cq(&cq, false);
    sim.doorbell(0, uar::CQ_OFFSET, cq.handle | uar::CQ_POLL);
    assert!(sim.wait_until(|s| s.metric("doorbell_cq_arm") == 1));
    assert_eq!(sim.metric("doorbell_unmatched"), 0);
}

#[test]
fn unknown_doorbell_writes_are_ignored() {
    let (mut sim, pd, cq) = with_pd_cq();
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    let base = sim.bars[2];
    for (offset, value) in [
        (uar::QP_OFFSET, qp.handle),               // no flag
        (uar::QP_OFFSET, qp.handle | 1 << 29),     // not a QP flag
        (uar::CQ_OFFSET, cq.handle | 1 << 24),     // reserved bit
        (uar::SRQ_OFFSET, 1 | uar::SRQ_RECV),      // no such SRQ
        (uar::QP_OFFSET, 77 | uar::QP_SEND),       // no such QP
        (0xc, cq.handle | uar::CQ_ARM),            // not a doorbell
        (4096 * 511 + 4, cq.handle | uar::CQ_ARM), // unused page
    ] {
        sim.write32(base + offset, value);
    }
    // Wrong sizes.
    assert!(sim.bus.mmio_write(base + 4, &[1, 2]));
    assert!(sim.bus.mmio_write(base, &[0; 8]));
    assert_eq!(sim.metric("doorbell_unmatched"), 9);
    assert_healthy(&mut sim);
}

#[test]
fn uar_reads_are_answered() {
    let (sim, _pd, _cq) = with_pd_cq();
    assert_eq!(sim.read32(sim.bars[2] + 4), u32::MAX);
    assert_eq!(sim.read32(sim.bars[2] + 511 * 4096), u32::MAX);
    assert_eq!(sim.metric("uar_read"), 2);
}

/// The async events a link change of port 1 posts.
fn port_event(event_type: u32) -> Vec<Eqe> {
    vec![Eqe {
        event_type,
        info: 1,
    }]
}

#[test]
fn link_follows_the_vmxnet3_port() {
    let mut sim = ready();
    let query = |sim: &mut SimDriver| -> u32 {
        let resp: QueryPortResp = sim
            .cmd(
                CmdCode::QueryPort,
                QueryPortReq {
                    port_num: 1,
                    ..Default::default()
                },
            )
            .expect("query");
        resp.attrs.state
    };
    sim.port.set_carrier(false);
    assert!(sim.wait_until(|s| s.metric("link_change") == 1));
    assert_eq!(sim.async_events(), port_event(event::PORT_ERR));
    assert_eq!(query(&mut sim), 1, "DOWN");
    sim.port.set_mtu(9000);
    sim.port.set_carrier(true);
    assert!(sim.wait_until(|s| s.metric("link_change") == 2));
    assert_eq!(sim.async_events(), port_event(event::PORT_ACTIVE));
    assert_eq!(query(&mut sim), 4, "ACTIVE");
}

/// A paused device (a migration's switch-over) writes no guest memory: a
/// link change meanwhile is reported once it resumes.
#[test]
fn a_link_change_while_paused_waits_for_resume() {
    use vm_migration::Pausable;
    let sim = ready();
    sim.device().pause().unwrap();
    sim.port.set_carrier(false);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(sim.metric("link_change"), 0);
    assert_eq!(sim.async_events(), vec![]);
    sim.device().resume().unwrap();
    assert!(sim.wait_until(|s| s.metric("link_change") == 1));
    assert_eq!(sim.async_events(), port_event(event::PORT_ERR));
}

#[test]
fn link_changes_before_activation_are_not_reported() {
    let mut sim = SimDriver::new();
    sim.port.set_carrier(false);
    sim.port.set_carrier(true);
    // Whenever the worker gets to those, the state it compares with is the
    // one at ACTIVATE.
    sim.probe().expect("probe");
    sim.port.set_active(false);
    assert!(sim.wait_until(|s| s.metric("link_change") == 1));
    assert_eq!(sim.async_events(), port_event(event::PORT_ERR));
}

#[test]
fn srq_with_a_bad_index_reports_srq_err() {
    let (mut sim, pd, _cq) = with_pd_cq();
    let srq = sim.create_srq(pd, 16, 1).expect("srq");
    sim.post_srq_recv(&srq, 1);
    assert!(sim.wait_until(|s| s.metric("doorbell_srq") == 1));
    assert!(sim.async_events().is_empty());
    sim.write(srq.wq.indices, 0x1000u32);
    sim.doorbell(srq.page, uar::SRQ_OFFSET, srq.handle | uar::SRQ_RECV);
    assert!(sim.wait_until(|s| s.metric("doorbell_srq") == 2));
    assert!(sim.wait_until(|s| s.metric("event_posted") == 1));
    assert_eq!(
        sim.async_events(),
        vec![Eqe {
            event_type: event::SRQ_ERR,
            info: srq.handle
        }]
    );
}

#[test]
fn srq_user_hears_last_wqe_reached() {
    let (mut sim, pd, cq) = with_pd_cq();
    let srq = sim.create_srq(pd, 16, 1).expect("srq");
    let qp = sim
        .create_qp(QpSpec {
            srq: Some(srq.handle),
            ..QpSpec::rc(pd, cq.handle)
        })
        .expect("qp");
    sim.to_rts(qp.handle, qp_type::RC).expect("RTS");
    to_err(&mut sim, qp.handle);
    assert_eq!(
        sim.async_events(),
        vec![Eqe {
            event_type: event::QP_LAST_WQE_REACHED,
            info: qp.handle
        }]
    );
}

#[test]
fn interrupt_mask_and_cause() {
    let mut sim = ready();
    sim.reg_write(Reg::Imr, !0);
    assert_eq!(
        sim.create_pd(0),
        Err(pvrdma::sim_driver::Failure::NoInterrupt)
    );
    assert_eq!(sim.reg_read(Reg::Icr), icr::RESPONSE, "cause recorded");
    assert_eq!(sim.reg_read(Reg::Icr), 0, "read-to-clear");
    sim.reg_write(Reg::Imr, 0);
    assert_eq!(sim.reg_read(Reg::Imr), 0);
    assert_eq!(sim.create_pd(0), Ok(2));
}

/// Every device write to guest memory marks its page dirty (migration
/// copies only dirty pages).
#[test]
fn device_writes_mark_pages_dirty() {
    use vm_memory::bitmap::Bitmap;
    use vm_memory::{GuestAddress, GuestMemoryBackend};

    let (mut sim, pd, cq) = with_pd_cq();
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    sim.to_rts(qp.handle, qp_type::RC).expect("RTS");
    sim.post_send(&qp, 1, wr::SEND);
    sim.port.set_carrier(false);
    assert!(sim.wait_until(|s| s.metric("link_change") == 1));
    let mem = sim.mem.clone();
    let region = mem.find_region(GuestAddress(0)).expect("region");
    region.bitmap().reset();
    let dirty = |addr: u64| region.bitmap().dirty_at(addr as usize);
    assert!(!dirty(sim.resp_slot));
    // A response, a flushed CQE, its CQ index, the SQ consumer index.
    to_err(&mut sim, qp.handle);
    assert!(dirty(sim.resp_slot));
    assert!(dirty(cq.ring.data[0]));
    assert!(dirty(cq.ring.indices));
    assert!(dirty(qp.sq.indices));
    // An async event.
    let ring = sim.async_ring.clone().expect("probed");
    region.bitmap().reset();
    sim.port.set_carrier(true);
    assert!(sim.wait_until(|s| s.metric("link_change") == 2));
    assert!(dirty(ring.data[0]));
    assert!(dirty(ring.indices));
}

#[test]
fn doorbells_of_a_qp_in_reset_do_nothing() {
    let (mut sim, pd, cq) = with_pd_cq();
    let qp = sim.create_qp(QpSpec::rc(pd, cq.handle)).expect("qp");
    sim.write(qp.sq.indices, 0xdead_beefu32);
    sim.doorbell(0, uar::QP_OFFSET, qp.handle | uar::QP_SEND);
    assert!(sim.wait_until(|s| s.metric("doorbell_qp") == 1));
    assert_eq!(sim.metric("ring_invalid"), 0);
    assert!(sim.async_events().is_empty());
    assert_eq!(
        sim.query_qp(qp.handle).expect("query").qp_state,
        qp_state::RESET
    );
}

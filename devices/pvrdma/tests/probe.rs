// SPDX-License-Identifier: Apache-2.0
//! The Linux driver's probe with the simulated driver: identity, BARs,
//! DSR handshake, caps, ACTIVATE, the first commands, RESET.

use pvrdma::sim_driver::{Failure, SimDriver, MAC};
use pvrdma::{GidType, Limits, PvrdmaConfig};
use pvrdma_abi::cmd::*;
use pvrdma_abi::regs::{Ctl, Reg};

#[test]
fn pci_identity_and_bars() {
    let mut sim = SimDriver::new();
    assert_eq!(sim.cfg_read(0), 0x0820_15ad);
    // Class 02/07 (InfiniBand controller), revision 1.
    assert_eq!(sim.cfg_read(2), 0x0207_0001);
    assert_eq!(sim.cfg_read(11), 0x0820_15ad);
    // BAR0 and BAR1 are 32-bit memory, BAR2 64-bit memory, none prefetchable.
    assert_eq!(sim.cfg_read(4) & 0xf, 0);
    assert_eq!(sim.cfg_read(5) & 0xf, 0);
    assert_eq!(sim.cfg_read(6) & 0xf, 0x4);
    // No INTx.
    assert_eq!(sim.cfg_read(15) >> 8 & 0xff, 0);
    // BAR2 is max_uar pages.
    sim.cfg_write(6, 0xffff_ffff);
    sim.cfg_write(7, 0xffff_ffff);
    let size = !(u64::from(sim.cfg_read(7)) << 32 | u64::from(sim.cfg_read(6) & !0xf)) + 1;
    assert_eq!(size, 512 * 4096);
}

#[test]
fn probe_like_linux() {
    let mut sim = SimDriver::new();
    assert_eq!(sim.reg_read(Reg::Err), 0xffff, "not ready before ACTIVATE");
    let caps = sim.probe().expect("probe");
    assert_eq!(sim.version, 20);
    assert_eq!(caps.gid_types, 2);
    assert_eq!(caps.max_uar, 512);
    assert_eq!(caps.phys_port_cnt, 1);
    assert_eq!(
        caps.node_guid.to_le_bytes(),
        [
            MAC[0] ^ 2,
            MAC[1],
            MAC[2],
            0xff,
            0xfe,
            MAC[3],
            MAC[4],
            MAC[5]
        ]
    );
    assert_eq!(caps.max_qp, 8192);
    assert_eq!(caps.max_fast_reg_page_list_len, 128);
    assert_eq!(sim.reg_read(Reg::Err), 0);
    assert_eq!(sim.metric("dsr_invalid"), 0);
}

#[test]
fn roce_v1_is_selectable() {
    let config = PvrdmaConfig {
        gid_type: GidType::RoceV1,
        ..PvrdmaConfig::default()
    };
    let mut sim = SimDriver::with_config(&config);
    assert_eq!(sim.probe().expect("probe").gid_types, 1);
}

#[test]
fn registration_commands() {
    let mut sim = SimDriver::new();
    sim.probe().expect("probe");
    let port: QueryPortResp = sim
        .cmd(
            CmdCode::QueryPort,
            QueryPortReq {
                port_num: 1,
                ..Default::default()
            },
        )
        .expect("query port");
    assert_eq!(port.attrs.state, 4, "link up: ACTIVE");
    assert_eq!(port.attrs.phys_state, 5);
    assert_eq!(port.attrs.active_mtu, 3, "1500-byte MTU: IB 1024");
    assert_eq!(port.attrs.gid_tbl_len, Limits::default().gid_tbl_len);
    assert_eq!(port.attrs.pkey_tbl_len, 1);
    let pkey: QueryPkeyResp = sim
        .cmd(
            CmdCode::QueryPkey,
            QueryPkeyReq {
                port_num: 1,
                index: 0,
                ..Default::default()
            },
        )
        .expect("query pkey");
    assert_eq!(pkey.pkey, 0xffff);
    assert_eq!(
        sim.cmd::<_, QueryPortResp>(
            CmdCode::QueryPort,
            QueryPortReq {
                port_num: 2,
                ..Default::default()
            }
        )
        .err(),
        Some(Failure::Err(22))
    );
    assert_eq!(
        sim.cmd::<_, QueryPkeyResp>(
            CmdCode::QueryPkey,
            QueryPkeyReq {
                port_num: 1,
                index: 1,
                ..Default::default()
            }
        )
        .err(),
        Some(Failure::Err(22))
    );
}

#[test]
fn reset_then_probe_again() {
    let mut sim = SimDriver::new();
    sim.probe().expect("probe");
    let pd = sim.create_pd(0).expect("pd");
    sim.ctl(Ctl::Reset).expect("reset");
    // Everything is gone: the same handle comes back after a new probe.
    sim.probe().expect("probe again");
    assert_eq!(sim.create_pd(0), Ok(pd));
}

/// What `ib_register_device` and the MAD layer send after ACTIVATE, then
/// the driver's removal.
#[test]
fn linux_registration_and_removal() {
    use pvrdma::sim_driver::{QpSpec, GID};
    use pvrdma_abi::verbs::{access, mr_flags, qp_type};

    let mut sim = SimDriver::new();
    sim.probe().expect("probe");
    for _ in 0..2 {
        let _: QueryPortResp = sim
            .cmd(
                CmdCode::QueryPort,
                QueryPortReq {
                    port_num: 1,
                    ..Default::default()
                },
            )
            .expect("query port");
    }
    let _: QueryPkeyResp = sim
        .cmd(
            CmdCode::QueryPkey,
            QueryPkeyReq {
                port_num: 1,
                ..Default::default()
            },
        )
        .expect("query pkey");
    sim.bind_gid(0, GID, 2).expect("link-local GID");
    let mut v4 = [0u8; 16];
    v4[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 2]);
    sim.bind_gid(1, v4, 2).expect("IPv4 GID");
    // ib_mad: PD, DMA MR (no local_dma_lkey), CQ, GSI QP up to RTS.
    let pd = sim.create_pd(0).expect("pd");
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
        .expect("DMA MR");
    let cq = sim.create_cq(0, 512).expect("cq");
    let gsi = sim
        .create_qp(QpSpec {
            qp_type: qp_type::GSI,
            max_send_wr: 128,
            max_recv_wr: 512,
            max_send_sge: 2,
            max_recv_sge: 1,
            ..QpSpec::rc(pd, cq.handle)
        })
        .expect("QP1");
    assert_eq!(gsi.qpn, 1);
    sim.to_rts(gsi.handle, qp_type::GSI).expect("QP1 to RTS");
    for wr_id in 0..8 {
        sim.post_recv(&gsi, wr_id);
    }
    sim.arm_cq(&cq, false);
    assert!(sim.wait_until(|s| s.metric("doorbell_cq_arm") == 1));
    assert!(sim.async_events().is_empty(), "nothing went wrong");
    assert_eq!(sim.metric("doorbell_unmatched"), 0);
    assert_eq!(sim.metric("cmd_failed"), 0);

    // Removal: ib_unregister_device destroys everything, then IMR, RESET.
    sim.destroy(CmdCode::DestroyQp, gsi.handle)
        .expect("destroy qp");
    sim.destroy(CmdCode::DestroyCq, cq.handle)
        .expect("destroy cq");
    sim.destroy(CmdCode::DestroyMr, dma.mr_handle)
        .expect("destroy mr");
    sim.destroy(CmdCode::DestroyPd, pd).expect("destroy pd");
    sim.reg_write(Reg::Imr, !0);
    sim.ctl(Ctl::Reset).expect("reset");
    assert_eq!(sim.ioevents.count(), 0);
}

/// A user process: its context, objects on its UAR page, and cleanup.
#[test]
fn user_process_lifecycle() {
    use pvrdma::sim_driver::{QpSpec, GID};
    use pvrdma_abi::verbs::{access, qp_type};

    let mut sim = SimDriver::new();
    sim.probe().expect("probe");
    sim.bind_gid(0, GID, 2).expect("bind");
    let ctx = sim.create_uc(1).expect("ibv_open_device");
    let pd = sim.create_pd(ctx).expect("ibv_alloc_pd");
    let mr = sim
        .reg_user_mr(
            pd,
            0x7f12_3456_7000,
            1 << 20,
            access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE,
        )
        .expect("ibv_reg_mr");
    let cq = sim.create_cq(ctx, 128).expect("ibv_create_cq");
    let srq = sim.create_srq(pd, 64, 1).expect("ibv_create_srq");
    let qp = sim
        .create_qp(QpSpec {
            srq: Some(srq.handle),
            ..QpSpec::rc(pd, cq.handle)
        })
        .expect("ibv_create_qp");
    assert_eq!((cq.page, qp.page, srq.page), (1, 1, 1));
    sim.to_rts(qp.handle, qp_type::RC).expect("connect");
    sim.post_srq_recv(&srq, 1);
    sim.arm_cq(&cq, true);
    assert!(sim.wait_until(|s| s.metric("doorbell_cq_arm") == 1 && s.metric("doorbell_srq") == 1));
    assert_eq!(sim.metric("doorbell_unmatched"), 0);
    sim.destroy(CmdCode::DestroyQp, qp.handle)
        .expect("destroy qp");
    sim.destroy(CmdCode::DestroySrq, srq.handle)
        .expect("destroy srq");
    sim.destroy(CmdCode::DestroyCq, cq.handle)
        .expect("destroy cq");
    sim.destroy(CmdCode::DestroyMr, mr.mr_handle)
        .expect("destroy mr");
    sim.destroy(CmdCode::DestroyPd, pd).expect("destroy pd");
    sim.destroy(CmdCode::DestroyUc, ctx).expect("close");
    assert_eq!(sim.ioevents.count(), 0);
}

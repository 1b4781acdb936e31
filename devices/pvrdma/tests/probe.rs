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
    assert_eq!(caps.max_qp, 1024);
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

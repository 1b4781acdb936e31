// SPDX-License-Identifier: Apache-2.0
//! RoCE v1 and VLANs between two devices, each driven by a simulated guest
//! driver: a port configured `roce-v1` frames its traffic as RoCE v1
//! (EtherType 0x8915, GRH, its ICRC), and the frames of a GID whose
//! address the guest uses on a VLAN carry that VLAN's 802.1Q tag; a
//! device takes a frame only for a GID of the frame's RoCE version on the
//! frame's VLAN, on the wire and over the same-host channel alike.

use std::sync::atomic::Ordering;

use pvrdma::sim_driver::endpoint::{connect, Endpoint as Side, GID_A, GID_B, IOVA, MAC_A, MAC_B};
use pvrdma::sim_driver::ib::{wc, wr};
use pvrdma::sim_driver::{ud_send, QpSpec, SimDriver};
use pvrdma::{GidType, PvrdmaConfig};
use pvrdma_abi::verbs::qp_type;
use pvrdma_abi::wqe::{wc_flags, wc_status};
use rdma_transport::net::{Encap, RoceVersion};
use rdma_transport::packet::parse;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

fn v1() -> PvrdmaConfig {
    PvrdmaConfig {
        gid_type: GidType::RoceV1,
        ..PvrdmaConfig::default()
    }
}

/// Side A or B of `config` (by `gid`), its wire not joined yet.
fn side(config: &PvrdmaConfig, gid: [u8; 16]) -> Side {
    let mac = if gid == GID_A { MAC_A } else { MAC_B };
    Side::on(SimDriver::with_config_and_mac(config, mac), gid, QpSpec::rc)
}

/// The guest of `side` sends an ARP from its GID's IPv4 address on `vlan`
/// through its NIC (which the vmxnet3 function shows the port).
fn guest_uses_vlan(side: &Side, gid: [u8; 16], vlan: Option<u16>) {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&side.sim.port.state().mac);
    if let Some(v) = vlan {
        f.extend_from_slice(&[0x81, 0]);
        f.extend_from_slice(&v.to_be_bytes());
    }
    f.extend_from_slice(&[8, 6, 0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&side.sim.port.state().mac);
    f.extend_from_slice(&gid[12..]);
    f.extend_from_slice(&[0; 10]);
    side.sim.port.note_guest_frame(&f);
}

/// `side` with a new RC QP (in RESET) in place of its QP.
fn fresh_qp(mut side: Side) -> Side {
    side.qp = side
        .sim
        .create_qp(QpSpec::rc(side.pd, side.cq.handle))
        .expect("qp");
    side
}

/// A writes 6000 bytes into B, sends 100 and reads 3000 back; all of it
/// must land.
fn exchange(a: &Side, b: &Side) {
    let data = pattern(6000, 1);
    a.write(0, &data);
    a.send(
        1,
        wr::RDMA_WRITE,
        &[a.sge(0, 6000)],
        (IOVA + 8192, b.key),
        0,
    );
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(b.read(8192, 6000), data);
    b.sim.post_recv_sges(&b.qp, 7, &[b.sge(30_000, 200)]);
    a.send(2, wr::SEND, &[a.sge(100, 100)], (0, 0), 0);
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    let got = b.cqes(1);
    assert_eq!(
        (got[0].opcode, got[0].status),
        (wc::RECV, wc_status::SUCCESS)
    );
    assert_eq!(b.read(30_000, 100), data[100..200]);
    let theirs = pattern(3000, 9);
    b.write(40_000, &theirs);
    a.send(
        3,
        wr::RDMA_READ,
        &[a.sge(50_000, 3000)],
        (IOVA + 40_000, b.key),
        0,
    );
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(a.read(50_000, 3000), theirs);
}

/// The framing of the first frame A sends to B's GID when A's wire has no
/// peer (the frame stays on A's wire): it must parse, ICRC included.
fn first_frame_encap(config: &PvrdmaConfig, a_vlan: Option<u16>, bound: Option<u32>) -> Encap {
    let mut a = side(config, GID_A);
    if let Some(vlan) = bound {
        let t = config.gid_type.abi();
        a.sim.bind_gid_vlan(1, GID_A, t, vlan).expect("bind");
    }
    guest_uses_vlan(&a, GID_A, a_vlan);
    let index = u8::from(bound.is_some());
    a.sim
        .connect_rc(a.qp.handle, index, (GID_B, MAC_B), 0x11, (1, 2))
        .expect("A to RTS");
    a.send(1, wr::SEND, &[a.sge(0, 64)], (0, 0), 0);
    assert!(a
        .sim
        .wait_until(|s| !s.wire.sent.lock().unwrap().is_empty()));
    let frame = a.sim.wire.sent.lock().unwrap()[0].clone();
    let pkt = parse(&frame).expect("a frame on the wire parses, ICRC included");
    assert_eq!(pkt.payload.len(), 64);
    let _ = &mut a.pd;
    pkt.layers.encap
}

#[test]
fn a_roce_v1_port_sends_roce_v1_frames() {
    let frame = first_frame_encap(&v1(), None, None);
    assert_eq!(
        frame,
        Encap {
            version: RoceVersion::V1,
            vlan: None
        }
    );
    let frame = first_frame_encap(&PvrdmaConfig::default(), None, None);
    assert_eq!(frame, Encap::V2);
}

#[test]
fn roce_v1_between_two_devices() {
    let a = side(&v1(), GID_A);
    let b = side(&v1(), GID_B);
    SimDriver::connect(&a.sim, &b.sim);
    let (a, b) = connect(a, b);
    exchange(&a, &b);
    for s in [&a, &b] {
        let rx = s.sim.metric("roce_rx");
        assert!(rx > 0);
        assert_eq!(s.sim.metric("roce_rx_v1"), rx, "every frame RoCE v1");
        assert_eq!(s.sim.metric("roce_rx_bad"), 0, "ICRC and headers check");
    }
}

/// A RoCE v2 port takes no RoCE v1 frame for its GIDs, nor the reverse:
/// the GID type is part of the address.
#[test]
fn roce_versions_do_not_mix() {
    let a = side(&v1(), GID_A);
    let b = side(&PvrdmaConfig::default(), GID_B);
    SimDriver::connect(&a.sim, &b.sim);
    let (a, b) = connect(a, b);
    a.send(1, wr::RDMA_WRITE, &[a.sge(0, 16)], (IOVA, b.key), 0);
    // Counted as received before they are found to have no QP.
    b.sim
        .wait_until(|s| s.metric("roce_rx_v1") >= 2 && s.metric("roce_rx_no_qp") >= 2);
    assert_eq!(b.sim.metric("roce_rx_no_qp"), b.sim.metric("roce_rx"));
    assert_eq!(b.read(0, 16), vec![0; 16], "nothing written");
}

/// UD over RoCE v1: the receive buffer's GRH area holds the frame's GRH,
/// and a kernel CQE says RoCE v1 (`network_hdr_type` 0), so that the
/// guest's CM builds its reply from it as an IB GRH.
#[test]
fn ud_over_roce_v1_carries_the_grh() {
    let ud = |pd, cq| QpSpec {
        qp_type: qp_type::UD,
        ..QpSpec::rc(pd, cq)
    };
    let mut a = Side::on(SimDriver::with_config_and_mac(&v1(), MAC_A), GID_A, ud);
    let mut b = Side::on(SimDriver::with_config_and_mac(&v1(), MAC_B), GID_B, ud);
    SimDriver::connect(&a.sim, &b.sim);
    a.sim.to_rts(a.qp.handle, qp_type::UD).expect("A RTS");
    b.sim.to_rts(b.qp.handle, qp_type::UD).expect("B RTS");
    b.sim.post_recv_sges(&b.qp, 4, &[b.sge(0, 40 + 256)]);
    a.write(0, b"datagram over v1");
    let hdr = ud_send(8, b.qp.qpn, GID_B, MAC_B);
    a.sim.post_send_wqe(&a.qp, hdr, &[a.sge(0, 16)]);
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    let got = b.cqes(1);
    assert_eq!((got[0].status, got[0].byte_len), (wc_status::SUCCESS, 56));
    assert_ne!(got[0].wc_flags & wc_flags::WITH_NETWORK_HDR_TYPE, 0);
    assert_eq!(got[0].network_hdr_type, 0, "PVRDMA_NETWORK_ROCE_V1");
    let grh = b.read(0, 40);
    assert_eq!(grh[0] >> 4, 6, "GRH version");
    assert_eq!(grh[6], 0x1b, "next header: BTH");
    assert_eq!(grh[8..24], GID_A, "source GID");
    assert_eq!(grh[24..40], GID_B, "destination GID");
    assert_eq!(b.read(40, 16), b"datagram over v1");
    let _ = (&mut a.pd, &mut b.pd);
}

#[test]
fn the_vlan_of_the_guest_address_tags_the_frames() {
    let tagged = |version, vlan| Encap {
        version,
        vlan: Some(vlan),
    };
    let default = PvrdmaConfig::default();
    let frame = first_frame_encap(&default, Some(100), None);
    assert_eq!(frame, tagged(RoceVersion::V2, 100));
    assert_eq!(
        first_frame_encap(&v1(), Some(100), None),
        tagged(RoceVersion::V1, 100)
    );
    // A VLAN in CREATE_BIND (no upstream driver gives one) wins.
    assert_eq!(
        first_frame_encap(&default, Some(100), Some(7)),
        tagged(RoceVersion::V2, 7)
    );
    assert_eq!(first_frame_encap(&default, None, Some(0xfff)), Encap::V2);
}

#[test]
fn two_devices_on_a_vlan() {
    for config in [PvrdmaConfig::default(), v1()] {
        let a = side(&config, GID_A);
        let b = side(&config, GID_B);
        guest_uses_vlan(&a, GID_A, Some(100));
        guest_uses_vlan(&b, GID_B, Some(100));
        SimDriver::connect(&a.sim, &b.sim);
        let (a, b) = connect(a, b);
        exchange(&a, &b);
        for s in [&a, &b] {
            let rx = s.sim.metric("roce_rx");
            assert_eq!(s.sim.metric("roce_rx_vlan"), rx, "every frame tagged");
            assert_eq!(s.sim.metric("roce_rx_vlan_mismatch"), 0);
        }
    }
}

/// B's GID is on VLAN 100, A's frames are not (A's address was seen
/// untagged): B takes none of them, and A's WRITE fails once its retries
/// are spent.
#[test]
fn a_frame_from_another_vlan_is_not_for_the_gid() {
    let a = side(&PvrdmaConfig::default(), GID_A);
    let b = side(&PvrdmaConfig::default(), GID_B);
    guest_uses_vlan(&a, GID_A, None);
    guest_uses_vlan(&b, GID_B, Some(100));
    SimDriver::connect(&a.sim, &b.sim);
    let (a, b) = connect(a, b);
    a.write(0, &pattern(64, 3));
    a.send(1, wr::RDMA_WRITE, &[a.sge(0, 64)], (IOVA, b.key), 0);
    assert!(b.sim.wait_until(|s| s.metric("roce_rx_vlan_mismatch") >= 2));
    assert_eq!(b.sim.metric("roce_rx_vlan"), 0);
    assert_eq!(b.read(0, 64), vec![0; 64]);
    // Tagged with a VLAN B's GID is not on: the same.
    let c = side(&PvrdmaConfig::default(), GID_A);
    guest_uses_vlan(&c, GID_A, Some(200));
    SimDriver::connect(&c.sim, &b.sim);
    let (c, b) = connect(c, fresh_qp(b));
    let before = b.sim.metric("roce_rx_vlan_mismatch");
    c.send(1, wr::RDMA_WRITE, &[c.sge(0, 64)], (IOVA, b.key), 0);
    assert!(b
        .sim
        .wait_until(|s| s.metric("roce_rx_vlan_mismatch") > before));
    assert!(b.sim.metric("roce_rx_vlan") > 0);
    assert_eq!(b.read(0, 64), vec![0; 64]);
}

/// The same-host channel carries the tags and the receiver applies the
/// same rule: traffic on the VLAN flows, a frame from another VLAN is
/// refused.
#[test]
fn the_same_host_channel_honours_vlans() {
    let dir = std::env::temp_dir().join(format!("pvrdma-encap-{}", std::process::id()));
    let config = PvrdmaConfig {
        local_dir: Some(dir.clone()),
        ..PvrdmaConfig::default()
    };
    for (a_vlan, flows) in [(Some(100), true), (None, false)] {
        let a = side(&config, GID_A);
        let b = side(&config, GID_B);
        guest_uses_vlan(&a, GID_A, a_vlan);
        guest_uses_vlan(&b, GID_B, Some(100));
        let (a, b) = connect(a, b);
        if flows {
            exchange(&a, &b);
            assert!(b.sim.metric("roce_local_rx") > 0);
            assert_eq!(b.sim.metric("roce_rx_vlan"), b.sim.metric("roce_local_rx"));
        } else {
            a.send(1, wr::RDMA_WRITE, &[a.sge(0, 64)], (IOVA, b.key), 0);
            assert!(b.sim.wait_until(|s| s.metric("roce_rx_vlan_mismatch") >= 1));
            assert_eq!(b.read(0, 64), vec![0; 64]);
        }
        assert_eq!(a.sim.metric("roce_tx"), 0, "nothing on the wire");
        assert!(a.sim.metric("roce_local_tx") > 0);
        assert_eq!(a.sim.wire.frames.load(Ordering::Relaxed), 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a device learned about its GIDs' VLANs moves with it: after a
/// migration to a new port, which saw nothing of the guest yet, the
/// frames stay tagged and tagged frames are still taken.
#[test]
fn vlans_survive_migration() {
    let a = side(&PvrdmaConfig::default(), GID_A);
    let b = side(&PvrdmaConfig::default(), GID_B);
    guest_uses_vlan(&a, GID_A, Some(100));
    guest_uses_vlan(&b, GID_B, Some(100));
    SimDriver::connect(&a.sim, &b.sim);
    let (a, mut b) = connect(a, b);
    exchange(&a, &b);
    b.sim = b.sim.migrate_to_new_port();
    SimDriver::connect(&a.sim, &b.sim);
    assert_eq!(b.sim.port.guest_vlans([10, 0, 0, 2].into()), None);
    // The connected QPs go on, and a new pair connects.
    exchange(&a, &b);
    let (a, b) = connect(fresh_qp(a), fresh_qp(b));
    exchange(&a, &b);
    assert_eq!(b.sim.metric("roce_rx_vlan_mismatch"), 0);
    assert_eq!(b.sim.metric("roce_rx_vlan"), b.sim.metric("roce_rx"));
}

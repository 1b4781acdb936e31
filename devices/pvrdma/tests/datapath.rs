// SPDX-License-Identifier: Apache-2.0
//! The data path between two devices, each driven by a simulated guest
//! driver, their ports joined by a simulated wire: RC SEND, RDMA WRITE
//! (with immediate), RDMA READ and atomics with their data and CQEs, RNR
//! waits, UD with the GRH area, SRQ receives, remote access errors, fast
//! registration and local invalidation, and recovery from a lossy wire.

use std::sync::atomic::Ordering;

use pvrdma::sim_driver::endpoint::{
    connect, rc_pair, Endpoint as Side, GID_A, GID_B, IOVA, MAC_A, MAC_B, MR_LEN,
};
use pvrdma::sim_driver::ib::{wc, wr};
use pvrdma::sim_driver::{ud_send, QpSpec, SimDriver, SimQp, SimSrq};
use pvrdma::PvrdmaConfig;
use pvrdma_abi::verbs::{qp_state, qp_type};
use pvrdma_abi::wqe::{send_flags, wc_flags, wc_status, Cqe, SqWqeHdr};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn summary(c: &Cqe) -> (u64, u32, u32, u32) {
    (c.wr_id, c.opcode, c.status, c.byte_len)
}

#[test]
fn rc_send_spans_packets_and_lands_in_the_receive_buffer() {
    let (a, b) = rc_pair();
    let data = pattern(3000, 7);
    a.write(0, &data);
    b.sim.post_recv_sges(&b.qp, 77, &[b.sge(100, 4000)]);
    a.send(5, wr::SEND, &[a.sge(0, 3000)], (0, 0), 0);
    let sent = a.cqes(1);
    let got = b.cqes(1);
    assert_eq!(
        sent.iter().map(summary).collect::<Vec<_>>(),
        vec![(5, wc::SEND, wc_status::SUCCESS, 3000)]
    );
    assert_eq!(
        got.iter().map(summary).collect::<Vec<_>>(),
        vec![(77, wc::RECV, wc_status::SUCCESS, 3000)]
    );
    assert_eq!(got[0].qp, u64::from(b.qp.handle), "CQE names the QP handle");
    assert_eq!(b.read(100, 3000), data);
    // Three packets at MTU 1024, acknowledged.
    assert!(a.sim.metric("roce_tx") >= 3);
    assert!(b.sim.metric("roce_rx") >= 3);
}

#[test]
fn rdma_write_with_immediate_read_and_atomics() {
    let (a, b) = rc_pair();
    let data = pattern(5000, 3);
    a.write(0, &data);
    b.sim.post_recv_sges(&b.qp, 1, &[]);
    // RDMA WRITE with immediate: placed at the rkey's address, and the
    // immediate consumes a receive.
    a.send(
        10,
        wr::RDMA_WRITE_WITH_IMM,
        &[a.sge(0, 5000)],
        (IOVA + 8192, b.key),
        0x1234_5678u32.swap_bytes(),
    );
    let got = b.cqes(1);
    assert_eq!(
        got.iter().map(summary).collect::<Vec<_>>(),
        vec![(1, wc::RECV_RDMA_WITH_IMM, wc_status::SUCCESS, 5000)]
    );
    assert_ne!(got[0].wc_flags & wc_flags::WITH_IMM, 0);
    assert_eq!(
        got[0].imm_data,
        0x1234_5678u32.swap_bytes(),
        "big-endian as posted"
    );
    assert_eq!(b.read(8192, 5000), data);
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);

    // RDMA READ of what B holds into A at another offset.
    let theirs = pattern(2500, 99);
    b.write(20_000, &theirs);
    a.send(
        11,
        wr::RDMA_READ,
        &[a.sge(30_000, 2500)],
        (IOVA + 20_000, b.key),
        0,
    );
    assert_eq!(
        a.cqes(1).iter().map(summary).collect::<Vec<_>>(),
        vec![(11, wc::RDMA_READ, wc_status::SUCCESS, 2500)]
    );
    assert_eq!(a.read(30_000, 2500), theirs);

    // Fetch-and-add then compare-and-swap on an 8-byte word of B.
    b.write(40_000, &100u64.to_le_bytes());
    let mut hdr = SqWqeHdr {
        wr_id: 12,
        opcode: wr::ATOMIC_FETCH_AND_ADD,
        send_flags: send_flags::SIGNALED,
        ..SqWqeHdr::default()
    };
    hdr.wr = [IOVA + 40_000, 5, 0, b.key.into(), 0, 0];
    a.sim.post_send_wqe(&a.qp, hdr, &[a.sge(50_000, 8)]);
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(
        a.read(50_000, 8),
        100u64.to_le_bytes(),
        "original value returned"
    );
    assert_eq!(b.read(40_000, 8), 105u64.to_le_bytes());
    hdr.wr_id = 13;
    hdr.opcode = wr::ATOMIC_CMP_AND_SWP;
    hdr.wr = [IOVA + 40_000, 105, 7, b.key.into(), 0, 0];
    a.sim.post_send_wqe(&a.qp, hdr, &[a.sge(50_008, 8)]);
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(b.read(40_000, 8), 7u64.to_le_bytes());
}

/// B's QP gives up remote atomics and writes (modify_qp RTS -> RTS with
/// only REMOTE_READ) while its MR still allows everything: A's
/// FETCH_AND_ADD completes with REM_ACCESS_ERR and B's word is unchanged.
/// The rights move with the device: after B is migrated, a WRITE is
/// refused as well, and READ, still allowed, works on a fresh pair.
#[test]
fn qp_access_flags_are_enforced_and_survive_migration() {
    use pvrdma_abi::verbs::{access, qp_attr_mask as m, QpAttr};
    let read_only = |side: &mut Side| {
        let attr = QpAttr {
            qp_state: qp_state::RTS,
            qp_access_flags: access::LOCAL_WRITE | access::REMOTE_READ,
            ..QpAttr::default()
        };
        let handle = side.qp.handle;
        side.sim
            .modify_qp(handle, m::STATE | m::ACCESS_FLAGS, attr)
            .expect("RTS -> RTS");
    };
    let (a, mut b) = rc_pair();
    read_only(&mut b);
    b.write(40_000, &100u64.to_le_bytes());
    let mut hdr = SqWqeHdr {
        wr_id: 1,
        opcode: wr::ATOMIC_FETCH_AND_ADD,
        send_flags: send_flags::SIGNALED,
        ..SqWqeHdr::default()
    };
    hdr.wr = [IOVA + 40_000, 5, 0, b.key.into(), 0, 0];
    a.sim.post_send_wqe(&a.qp, hdr, &[a.sge(0, 8)]);
    assert_eq!(
        summary(&a.cqes(1)[0]),
        (1, wc::FETCH_ADD, wc_status::REM_ACCESS_ERR, 8)
    );
    assert_eq!(
        b.read(40_000, 8),
        100u64.to_le_bytes(),
        "B's word unchanged"
    );

    let (a, mut b) = rc_pair();
    read_only(&mut b);
    let b = Side {
        sim: b.sim.migrate(),
        ..b
    };
    b.write(0, b"remote data");
    a.send(1, wr::RDMA_READ, &[a.sge(0, 11)], (IOVA, b.key), 0);
    assert_eq!(
        summary(&a.cqes(1)[0]),
        (1, wc::RDMA_READ, wc_status::SUCCESS, 11)
    );
    assert_eq!(a.read(0, 11), b"remote data");
    a.write(100, b"not allowed");
    a.send(2, wr::RDMA_WRITE, &[a.sge(100, 11)], (IOVA + 200, b.key), 0);
    assert_eq!(a.cqes(1)[0].status, wc_status::REM_ACCESS_ERR);
    assert_eq!(b.read(200, 11), vec![0; 11], "B's memory unchanged");
}

#[test]
fn bad_rkey_is_a_remote_access_error_and_the_qp_fails() {
    let (a, b) = rc_pair();
    a.send(1, wr::RDMA_WRITE, &[a.sge(0, 64)], (IOVA, b.key ^ 0x100), 0);
    a.send(2, wr::SEND, &[a.sge(0, 64)], (0, 0), 0);
    let got = a.cqes(2);
    assert_eq!(
        got.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, 10 /* REM_ACCESS_ERR */), (2, wc_status::WR_FLUSH_ERR)]
    );
    let mut a = a;
    assert_eq!(
        a.sim.query_qp(a.qp.handle).expect("query").qp_state,
        qp_state::ERR
    );
    // Out of bounds of a valid key is refused the same way.
    let (c, d) = rc_pair();
    c.send(
        3,
        wr::RDMA_READ,
        &[c.sge(0, 64)],
        (IOVA + MR_LEN - 8, d.key),
        0,
    );
    assert_eq!(c.cqes(1)[0].status, wc_status::REM_ACCESS_ERR);
}

#[test]
fn receiver_not_ready_waits_for_a_receive() {
    let (a, b) = rc_pair();
    a.write(0, b"late receive");
    a.send(1, wr::SEND, &[a.sge(0, 12)], (0, 0), 0);
    assert!(
        b.sim.wait_until(|s| s.metric("roce_rx") >= 2),
        "request and its retry arrive"
    );
    assert!(
        a.sim.poll_cq(&a.cq).is_empty(),
        "no completion before a receive"
    );
    b.sim.post_recv_sges(&b.qp, 9, &[b.sge(0, 100)]);
    assert_eq!(b.cqes(1)[0].byte_len, 12);
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(b.read(0, 12), b"late receive");
}

#[test]
fn lossy_wire_is_recovered_by_retransmission() {
    let (a, b) = rc_pair();
    a.sim.wire.drop_one_in.store(10, Ordering::Relaxed);
    b.sim.wire.drop_one_in.store(5, Ordering::Relaxed);
    let data = pattern(60_000, 1);
    a.write(0, &data);
    b.sim.post_recv_sges(&b.qp, 1, &[b.sge(0, 60_000)]);
    a.send(1, wr::SEND, &[a.sge(0, 60_000)], (0, 0), 0);
    a.send(
        2,
        wr::RDMA_WRITE,
        &[a.sge(0, 4096)],
        (IOVA + 61_000, b.key),
        0,
    );
    let got = b.cqes(1);
    assert_eq!(got[0].status, wc_status::SUCCESS);
    assert_eq!(b.read(0, 60_000), data);
    let done = a.cqes(2);
    assert_eq!(
        done.iter().map(|c| c.status).collect::<Vec<_>>(),
        vec![0, 0]
    );
    assert_eq!(b.read(61_000, 4096), data[..4096]);
    assert!(
        a.sim.wire.frames.load(Ordering::Relaxed) > 63,
        "frames were dropped and resent"
    );
}

#[test]
fn more_sges_than_the_qp_allows_is_a_local_error() {
    let (a, _b) = rc_pair();
    a.send(1, wr::SEND, &[a.sge(0, 8), a.sge(8, 8)], (0, 0), 0);
    let got = a.cqes(1);
    assert_eq!(got[0].status, wc_status::LOC_QP_OP_ERR);
    assert_eq!(a.sim.metric("wqe_invalid"), 1);
}

#[test]
fn ud_send_carries_the_grh_area_and_source_qpn() {
    let ud = |pd, cq| QpSpec {
        qp_type: qp_type::UD,
        ..QpSpec::rc(pd, cq)
    };
    let mut a = Side::new(GID_A, ud);
    let mut b = Side::new(GID_B, ud);
    SimDriver::connect(&a.sim, &b.sim);
    a.sim.to_rts(a.qp.handle, qp_type::UD).expect("A RTS");
    b.sim.to_rts(b.qp.handle, qp_type::UD).expect("B RTS");
    b.sim.post_recv_sges(&b.qp, 4, &[b.sge(0, 40 + 256)]);
    a.write(0, b"datagram payload");
    let hdr = ud_send(8, b.qp.qpn, GID_B, [2, 0, 0, 0, 0, 2]);
    a.sim.post_send_wqe(&a.qp, hdr, &[a.sge(0, 16)]);
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    let got = b.cqes(1);
    assert_eq!(summary(&got[0]), (4, wc::RECV, wc_status::SUCCESS, 56));
    assert_eq!(got[0].src_qp, a.qp.qpn);
    assert_ne!(got[0].wc_flags & wc_flags::GRH, 0);
    // The RoCE packet type where mlx5 reports it and UCX's UD reads it
    // (0x8: UDP, RoCE v2; 0x2: IPv4).
    assert_eq!(got[0].sl, 0xa, "sl = RoCE v2 over IPv4");
    // IPv4: the IP header in the last 20 bytes of the GRH area.
    let grh = b.read(0, 40);
    assert_eq!(grh[20] >> 4, 4, "IPv4 header");
    assert_eq!(&grh[32..36], &[10, 0, 0, 1], "source address");
    assert_eq!(b.read(40, 16), b"datagram payload");
    let _ = (&mut a.pd, &mut b.pd);
}

/// A connected to a QP of B that receives from an SRQ (16 WQEs, 1 SGE).
fn srq_pair() -> (Side, Side, SimSrq, SimQp) {
    let mut b = Side::new(GID_B, QpSpec::rc);
    let srq = b.sim.create_srq(b.pd, 16, 1).expect("srq");
    let spec = QpSpec {
        srq: Some(srq.handle),
        ..QpSpec::rc(b.pd, b.cq.handle)
    };
    let qp = b.sim.create_qp(spec).expect("srq qp");
    let mut a = Side::new(GID_A, QpSpec::rc);
    SimDriver::connect(&a.sim, &b.sim);
    a.sim
        .connect_rc(a.qp.handle, 0, (GID_B, MAC_B), qp.qpn, (1, 2))
        .expect("A");
    b.sim
        .connect_rc(qp.handle, 0, (GID_A, MAC_A), a.qp.qpn, (2, 1))
        .expect("B");
    (a, b, srq, qp)
}

#[test]
fn srq_receives_complete_with_the_qp_handle() {
    let (a, b, srq, qp) = srq_pair();
    b.sim.post_srq_recv_sges(&srq, 41, &[b.sge(0, 64)]);
    b.sim.post_srq_recv_sges(&srq, 42, &[b.sge(64, 64)]);
    a.write(0, b"first second");
    a.send(1, wr::SEND, &[a.sge(0, 5)], (0, 0), 0);
    a.send(2, wr::SEND, &[a.sge(6, 6)], (0, 0), 0);
    let got = b.cqes(2);
    assert_eq!(
        got.iter()
            .map(|c| (c.wr_id, c.qp, c.byte_len))
            .collect::<Vec<_>>(),
        vec![(41, u64::from(qp.handle), 5), (42, u64::from(qp.handle), 6)]
    );
    assert_eq!(b.read(0, 5), b"first");
    assert_eq!(b.read(64, 6), b"second");
}

#[test]
fn send_with_invalidate_and_fast_registration() {
    let (mut a, mut b) = rc_pair();
    // B: a fast-register MR for 4 pages, mapped by REG_MR over 2.
    let (key, pages, list) = b.alloc_frmr(4);
    let new_key = (key & !0xff) | 0x5a;
    b.reg_mr(70, new_key, 0x9000, (list, 2), 8192);
    assert_eq!(
        summary(&b.cqes(1)[0]),
        (70, wc::REG_MR, wc_status::SUCCESS, 0)
    );
    // A writes through the new key; the bytes land in B's second page.
    a.write(0, b"through the fast-registered key");
    a.send(
        1,
        wr::RDMA_WRITE,
        &[a.sge(0, 31)],
        (0x9000 + 4096, new_key),
        0,
    );
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(
        b.sim.read_buf(&pages, 4096, 31),
        b"through the fast-registered key"
    );
    // SEND_WITH_INV invalidates it at B: the next write is refused.
    b.sim.post_recv_sges(&b.qp, 80, &[b.sge(0, 64)]);
    a.send(2, wr::SEND_WITH_INV, &[a.sge(0, 4)], (0, 0), new_key);
    let got = b.cqes(1);
    assert_eq!(got[0].status, wc_status::SUCCESS);
    assert_ne!(got[0].wc_flags & wc_flags::WITH_INVALIDATE, 0);
    assert_eq!(got[0].imm_data, new_key);
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    a.send(3, wr::RDMA_WRITE, &[a.sge(0, 8)], (0x9000, new_key), 0);
    assert_eq!(
        a.cqes(1)[0].status,
        wc_status::REM_ACCESS_ERR,
        "remote access error after invalidation"
    );
    let _ = (&mut a.pd, &mut b.pd);
}

/// A user context's QP speaks ibverbs numbers (rdma-core casts them
/// through): its SEND_WITH_INV is 9, which from the kernel would be
/// RDMA_READ_WITH_INV, and REG_MR is the kernel's alone. Against a kernel
/// peer that fast-registers, as a storage target does.
#[test]
fn user_qps_post_in_ibverbs_numbering() {
    let a = Side::user(GID_A, QpSpec::rc);
    let b = Side::new(GID_B, QpSpec::rc);
    SimDriver::connect(&a.sim, &b.sim);
    let (a, mut b) = connect(a, b);
    let (key, _, list) = b.alloc_frmr(1);
    b.reg_mr(1, key, 0x4000, (list, 1), 4096);
    assert_eq!(
        summary(&b.cqes(1)[0]),
        (1, wc::REG_MR, wc_status::SUCCESS, 0)
    );
    b.sim.post_recv_sges(&b.qp, 2, &[b.sge(0, 64)]);
    a.send(1, wr::SEND_WITH_INV, &[a.sge(0, 4)], (0, 0), key);
    assert_eq!(summary(&a.cqes(1)[0]), (1, wc::SEND, wc_status::SUCCESS, 4));
    let got = b.cqes(1);
    assert_eq!(summary(&got[0]), (2, wc::RECV, wc_status::SUCCESS, 4));
    assert_ne!(got[0].wc_flags & wc_flags::WITH_INVALIDATE, 0);
    a.send(2, wr::RDMA_WRITE, &[a.sge(0, 8)], (0x4000, key), 0);
    assert_eq!(
        a.cqes(1)[0].status,
        wc_status::REM_ACCESS_ERR,
        "the key was invalidated"
    );
}

/// A WR the device does not do (LSO from the kernel, REG_MR from a user
/// context) completes with a local QP operation error and fails the QP.
#[test]
fn unsupported_send_opcodes_fail_the_qp() {
    for (user, op) in [(false, wr::LSO), (false, wr::BIND_MW), (true, wr::REG_MR)] {
        let a = if user {
            Side::user(GID_A, QpSpec::rc)
        } else {
            Side::new(GID_A, QpSpec::rc)
        };
        let b = Side::new(GID_B, QpSpec::rc);
        SimDriver::connect(&a.sim, &b.sim);
        let (a, _b) = connect(a, b);
        a.send(1, op, &[a.sge(0, 4)], (0, 0), 0);
        assert_eq!(
            summary(&a.cqes(1)[0]),
            (1, wc::SEND, wc_status::LOC_QP_OP_ERR, 0),
            "opcode {op:#x}, user {user}"
        );
    }
}

/// Devices A and B with `config` (its `local_dir` shared), their RC QPs
/// connected.
fn same_host_pair(config: &PvrdmaConfig) -> (Side, Side) {
    let side = |mac, gid| Side::on(SimDriver::with_config_and_mac(config, mac), gid, QpSpec::rc);
    connect(side(MAC_A, GID_A), side(MAC_B, GID_B))
}

/// Two devices of one host, their wires not joined: frames reach the peer
/// over the same-host channel only, found by the destination MAC.
#[test]
fn same_host_channel_carries_the_traffic_without_the_wire() {
    let dir = std::env::temp_dir().join(format!("pvrdma-datapath-{}", std::process::id()));
    let config = PvrdmaConfig {
        local_dir: Some(dir.clone()),
        ..PvrdmaConfig::default()
    };
    let (a, b) = same_host_pair(&config);
    let data = pattern(20_000, 5);
    a.write(0, &data);
    a.send(
        1,
        wr::RDMA_WRITE,
        &[a.sge(0, 20_000)],
        (IOVA + 1000, b.key),
        0,
    );
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(b.read(1000, 20_000), data);
    assert!(a.sim.metric("roce_local_tx") >= 20);
    assert!(b.sim.metric("roce_local_rx") >= 20);
    assert_eq!(a.sim.metric("roce_tx"), 0, "nothing on the wire");
    assert!(a.sim.wire.sent.lock().unwrap().is_empty());
    same_host_segments(&a, &b);
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// QPs whose send windows (1 MiB each while they send segments) add up
/// to more than the peer's ring and backlog hold (4 + 8 MiB): 16 QPs with
/// 15 WRITEs of 64 KiB each in flight. A QP builds no more segments than
/// its peer's ring has room for, and waits while it has none, so no
/// frame misses the ring (such a one would be built in a buffer and
/// copied into the backlog), none is dropped, and every WRITE lands.
#[test]
fn same_host_windows_beyond_the_ring_wait_for_room() {
    const QPS: usize = 16;
    const WRITES: usize = 15;
    let dir = std::env::temp_dir().join(format!("pvrdma-windows-{}", std::process::id()));
    let config = PvrdmaConfig {
        local_dir: Some(dir.clone()),
        ..PvrdmaConfig::default()
    };
    let (mut a, mut b) = same_host_pair(&config);
    // The rings are set up and accepted: segments from now on.
    same_host_segments(&a, &b);
    let data = pattern(MR_LEN as usize, 9);
    a.write(0, &data);
    let mut qps = vec![a.qp.clone()];
    for _ in 1..QPS {
        let qa = a.sim.create_qp(QpSpec::rc(a.pd, a.cq.handle)).unwrap();
        let qb = b.sim.create_qp(QpSpec::rc(b.pd, b.cq.handle)).unwrap();
        a.sim
            .connect_rc(qa.handle, 0, (GID_B, MAC_B), qb.qpn, (0x10, 0x20))
            .unwrap();
        b.sim
            .connect_rc(qb.handle, 0, (GID_A, MAC_A), qa.qpn, (0x20, 0x10))
            .unwrap();
        qps.push(qa);
    }
    let copied = a.sim.metric("roce_local_copied");
    for qp in &qps {
        for id in 0..WRITES {
            let mut hdr = SqWqeHdr {
                wr_id: id as u64,
                opcode: wr::RDMA_WRITE,
                send_flags: send_flags::SIGNALED,
                ..SqWqeHdr::default()
            };
            hdr.wr[0] = IOVA;
            hdr.wr[1] = b.key.into();
            a.sim.post_send_wqe(qp, hdr, &[a.sge(0, MR_LEN as u32)]);
        }
    }
    let cqes = a.cqes(QPS * WRITES);
    assert_eq!(cqes.len(), QPS * WRITES);
    assert!(cqes.iter().all(|c| c.status == wc_status::SUCCESS));
    assert_eq!(b.read(0, MR_LEN as usize), data);
    assert_eq!(a.sim.metric("roce_local_dropped"), 0, "frames dropped");
    // 480 segments of 32 KiB; QPs that ran on while the ring was full
    // built 113-270 of them in buffers for the backlog, a copy more each;
    // QPs that waited only while frames were in the backlog, 5-6.
    let copied = a.sim.metric("roce_local_copied") - copied;
    assert_eq!(copied, 0, "segments copied into the backlog");
    assert_eq!(a.sim.metric("roce_tx"), 0, "nothing on the wire");
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Workers that busy-poll after work (`PvrdmaConfig::busy_poll`) take a
/// ping-pong's frames from their same-host rings without a kick (they
/// never announce a sleep between messages); workers that do not poll
/// sleep between messages and are kicked for each frame (the request
/// and its ACK).
#[test]
fn busy_polling_workers_are_not_kicked() {
    const PINGS: u64 = 40;
    // The tests's own poll of its CQ sleeps 1 ms between looks: a spin
    // far longer than that keeps both workers polling all along.
    for (poll, polling) in [(0, false), (300, true)] {
        let dir =
            std::env::temp_dir().join(format!("pvrdma-datapath-poll{poll}-{}", std::process::id()));
        let config = PvrdmaConfig {
            local_dir: Some(dir.clone()),
            busy_poll: std::time::Duration::from_millis(poll),
            // Polling goes on however long a yield takes on a loaded host.
            busy_yield: std::time::Duration::from_secs(1),
            ..PvrdmaConfig::default()
        };
        let (a, b) = same_host_pair(&config);
        let kicks = || a.sim.metric("roce_local_kicks") + b.sim.metric("roce_local_kicks");
        let ping = |id| {
            a.send(id, wr::RDMA_WRITE, &[a.sge(0, 8)], (IOVA, b.key), 0);
            assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
        };
        // The rings are set up and accepted.
        ping(0);
        let before = kicks();
        for id in 1..=PINGS {
            ping(id);
        }
        let kicked = kicks() - before;
        if polling {
            assert!(kicked < PINGS / 4, "poll {poll} ms: {kicked} kicks");
        } else {
            assert!(kicked >= PINGS, "poll {poll} ms: {kicked} kicks");
        }
        assert_eq!(a.sim.metric("roce_tx"), 0, "nothing on the wire");
        drop((a, b));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Once B accepted A's ring, messages of many MTUs cross it as segments
/// (a few frames each instead of one per MTU): WRITE, READ and SEND land
/// intact, and every page they write is marked dirty.
fn same_host_segments(a: &Side, b: &Side) {
    use vm_memory::bitmap::Bitmap;
    use vm_memory::{GuestAddress, GuestMemoryBackend};

    let data = pattern(60_000, 6);
    a.write(0, &data);
    // B's ACCEPT reaches A's worker shortly after the first frames.
    let mut frames = u64::MAX;
    for id in 10..60 {
        let before = a.sim.metric("roce_local_tx");
        a.send(id, wr::RDMA_WRITE, &[a.sge(0, 60_000)], (IOVA, b.key), 0);
        assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
        frames = a.sim.metric("roce_local_tx") - before;
        if frames <= 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(frames <= 2, "60 000 bytes in {frames} frames, not 59");
    assert_eq!(b.read(0, 60_000), data);
    let bmem = b.sim.mem.clone();
    let bregion = bmem.find_region(GuestAddress(0)).expect("region");
    bregion.bitmap().reset();
    a.send(2, wr::RDMA_WRITE, &[a.sge(0, 60_000)], (IOVA, b.key), 0);
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    let dirty = b.pages[..15]
        .iter()
        .all(|&p| bregion.bitmap().dirty_at(p as usize));
    assert!(dirty, "every page a segment wrote is dirty");
    // READ: the responses come as segments too.
    a.write(0, &[0; 60_000]);
    a.send(
        3,
        wr::RDMA_READ,
        &[a.sge(0, 50_000)],
        (IOVA + 1000, b.key),
        0,
    );
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(a.read(0, 50_000), data[1000..51_000]);
    // SEND into a receive buffer.
    b.sim.post_recv_sges(&b.qp, 77, &[b.sge(1000, 50_000)]);
    a.send(4, wr::SEND, &[a.sge(5000, 45_000)], (0, 0), 0);
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(
        b.cqes(1).iter().map(summary).collect::<Vec<_>>(),
        vec![(77, wc::RECV, wc_status::SUCCESS, 45_000)]
    );
    assert_eq!(b.read(1000, 45_000), data[6000..51_000]);
    assert_eq!(a.sim.metric("roce_tx"), 0, "nothing on the wire");
}

/// Many RDMA READs and atomics outstanding at once, as perftest posts
/// them (tx depth 100): the requester keeps at most max_rd_atomic of them
/// in flight, and every one completes.
#[test]
fn many_outstanding_reads_and_atomics_complete() {
    outstanding_reads_and_atomics(0);
}

/// The same on a wire losing one frame in eight each way: lost READ
/// responses and atomic ACKs are recovered from the responder's replay
/// cache, never executed twice.
#[test]
fn outstanding_reads_and_atomics_survive_loss() {
    outstanding_reads_and_atomics(8);
}

fn outstanding_reads_and_atomics(loss: u64) {
    let spec = |pd, cq| QpSpec {
        max_send_wr: 128,
        max_recv_wr: 16,
        ..QpSpec::rc(pd, cq)
    };
    let a = Side::new(GID_A, spec);
    let b = Side::new(GID_B, spec);
    SimDriver::connect(&a.sim, &b.sim);
    let (a, b) = connect(a, b);
    a.sim.wire.drop_one_in.store(loss, Ordering::Relaxed);
    b.sim.wire.drop_one_in.store(loss, Ordering::Relaxed);
    b.write(0, &pattern(4096, 9));
    b.write(8192, &0u64.to_le_bytes());
    for i in 0..100u64 {
        a.send(
            i,
            wr::RDMA_READ,
            &[a.sge(i * 16, 16)],
            (IOVA + i * 16, b.key),
            0,
        );
    }
    let got = a.cqes(100);
    assert_eq!(got.len(), 100);
    assert!(
        got.iter().all(|c| c.status == wc_status::SUCCESS),
        "{got:?}"
    );
    assert_eq!(a.read(0, 1600), b.read(0, 1600));
    for i in 0..100u64 {
        let mut hdr = SqWqeHdr {
            wr_id: 1000 + i,
            opcode: wr::ATOMIC_FETCH_AND_ADD,
            send_flags: send_flags::SIGNALED,
            ..SqWqeHdr::default()
        };
        hdr.wr = [IOVA + 8192, 1, 0, b.key.into(), 0, 0];
        a.sim.post_send_wqe(&a.qp, hdr, &[a.sge(20_000 + i * 8, 8)]);
    }
    let got = a.cqes(100);
    assert!(
        got.iter().all(|c| c.status == wc_status::SUCCESS),
        "{got:?}"
    );
    assert_eq!(b.read(8192, 8), 100u64.to_le_bytes());
}

/// A CQ armed while it still holds completions the guest has not polled
/// (they landed between its last poll and the arm doorbell reaching the
/// worker) is notified at once, or the guest would sleep on them.
#[test]
fn arming_a_cq_with_unpolled_completions_notifies_at_once() {
    let (a, b) = rc_pair();
    b.sim.post_recv_sges(&b.qp, 1, &[b.sge(0, 64)]);
    a.send(1, wr::SEND, &[a.sge(0, 8)], (0, 0), 0);
    assert!(b.sim.wait_until(|s| s.metric("cqe_posted") >= 1));
    assert!(b.sim.cq_notifications().is_empty(), "not armed yet");
    b.sim.arm_cq(&b.cq, false);
    assert!(b.sim.wait_until(|s| s.metric("cq_notify_posted") == 1));
    assert_eq!(b.sim.cq_notifications(), vec![b.cq.handle]);
    assert_eq!(b.cqes(1)[0].wr_id, 1);
}

/// A CQ armed for solicited completions (ARM_SOL) sleeps through a
/// receive whose SEND was not solicited, and wakes for one that was (the
/// requester's SOLICITED flag travels as the BTH SE bit).
#[test]
fn arm_solicited_wakes_only_for_solicited_receives() {
    let (a, b) = rc_pair();
    b.sim.arm_cq(&b.cq, true);
    // Armed before anything lands (an arm that finds unpolled CQEs
    // notifies at once, solicited or not).
    assert!(b.sim.wait_until(|s| s.metric("doorbell_cq_arm") == 1));
    b.sim.post_recv_sges(&b.qp, 1, &[b.sge(0, 64)]);
    b.sim.post_recv_sges(&b.qp, 2, &[b.sge(64, 64)]);
    a.send(1, wr::SEND, &[a.sge(0, 8)], (0, 0), 0);
    assert_eq!(summary(&b.cqes(1)[0]), (1, wc::RECV, wc_status::SUCCESS, 8));
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(
        b.sim.metric("cq_notify_posted"),
        0,
        "an unsolicited SEND woke ARM_SOL"
    );
    let solicited = SqWqeHdr {
        wr_id: 2,
        opcode: wr::SEND,
        send_flags: send_flags::SIGNALED | send_flags::SOLICITED,
        ..SqWqeHdr::default()
    };
    a.sim.post_send_wqe(&a.qp, solicited, &[a.sge(0, 8)]);
    assert_eq!(b.cqes(1)[0].wr_id, 2);
    assert!(b.sim.wait_until(|s| s.metric("cq_notify_posted") == 1));
    assert_eq!(b.sim.cq_notifications(), vec![b.cq.handle]);
}

/// An MR over guest-physically contiguous pages (a buffer in a huge
/// page) is copied a run of pages at a time, not a page at a time: a
/// WRITE across 15 of its pages lands where it should and marks each of
/// them dirty, and nothing beside them; a READ of it comes back intact.
#[test]
fn writes_into_contiguous_pages_land_and_mark_each_page_dirty() {
    use pvrdma::sim_driver::endpoint::RIGHTS;
    use pvrdma::sim_driver::PageLayout;
    use vm_memory::bitmap::Bitmap;
    use vm_memory::{GuestAddress, GuestMemoryBackend};

    let (a, mut b) = rc_pair();
    let at = IOVA + (1 << 30);
    let (mr, pages) = b
        .sim
        .reg_user_mr_laid_out(b.pd, (at, 16 * 4096), RIGHTS, PageLayout::Contiguous)
        .expect("mr");
    assert!(pages.windows(2).all(|w| w[1] == w[0] + 4096));
    let bmem = b.sim.mem.clone();
    let bregion = bmem.find_region(GuestAddress(0)).expect("region");
    let data = pattern(60_000, 9);
    a.write(0, &data);
    bregion.bitmap().reset();
    a.send(
        1,
        wr::RDMA_WRITE,
        &[a.sge(0, 60_000)],
        (at + 1000, mr.rkey),
        0,
    );
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(b.sim.read_buf(&pages, 1000, 60_000), data);
    assert_eq!(b.sim.read_buf(&pages, 0, 1000), vec![0; 1000]);
    assert_eq!(b.sim.read_buf(&pages, 61_000, 4536), vec![0; 4536]);
    let dirty = |addr: u64| bregion.bitmap().dirty_at(addr as usize);
    assert!(pages[..15].iter().all(|&p| dirty(p)), "every page written");
    assert!(!dirty(pages[15]) && !dirty(pages[15] + 4096), "none beyond");
    a.write(0, &[0; 60_000]);
    a.send(
        2,
        wr::RDMA_READ,
        &[a.sge(0, 50_000)],
        (at + 3000, mr.rkey),
        0,
    );
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(a.read(0, 50_000), data[2000..52_000]);
}

/// Every byte the data path places in guest memory marks its page dirty
/// (live migration copies dirty pages again): RDMA WRITE payload, READ
/// response data, the CQE and the ring indices, and nothing else.
#[test]
fn data_path_writes_mark_guest_pages_dirty() {
    use vm_memory::bitmap::Bitmap;
    use vm_memory::{GuestAddress, GuestMemoryBackend};

    let (a, b) = rc_pair();
    let bmem = b.sim.mem.clone();
    let bregion = bmem.find_region(GuestAddress(0)).expect("region");
    let amem = a.sim.mem.clone();
    let aregion = amem.find_region(GuestAddress(0)).expect("region");
    a.write(0, &pattern(8192, 4));
    bregion.bitmap().reset();
    aregion.bitmap().reset();
    // A WRITE into B's third and fourth MR pages.
    a.send(
        1,
        wr::RDMA_WRITE,
        &[a.sge(0, 8192)],
        (IOVA + 8192, b.key),
        0,
    );
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    let bdirty = |addr: u64| bregion.bitmap().dirty_at(addr as usize);
    assert!(bdirty(b.pages[2]) && bdirty(b.pages[3]), "written pages");
    assert!(
        !bdirty(b.pages[0]) && !bdirty(b.pages[4]),
        "untouched pages"
    );
    // A READ of B's page 5 into A's page 6: A's page, A's CQE, A's CQ index.
    aregion.bitmap().reset();
    a.send(
        2,
        wr::RDMA_READ,
        &[a.sge(6 * 4096, 100)],
        (IOVA + 5 * 4096, b.key),
        0,
    );
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    let adirty = |addr: u64| aregion.bitmap().dirty_at(addr as usize);
    assert!(adirty(a.pages[6]));
    assert!(!adirty(a.pages[5]));
    assert!(adirty(a.cq.ring.data[0]) && adirty(a.cq.ring.indices));
    assert!(adirty(a.qp.sq.indices), "the SQ consumer index");
}

/// LOCAL_INV makes a fast-registered key unusable for the peer; the
/// responder's access violation is fatal for its QP too.
#[test]
fn local_invalidate() {
    let (mut a, mut b) = rc_pair();
    let (key, _, list) = b.alloc_frmr(1);
    b.reg_mr(1, key, 0x4000, (list, 1), 4096);
    assert_eq!(b.cqes(1)[0].status, wc_status::SUCCESS);
    a.send(1, wr::RDMA_WRITE, &[a.sge(0, 8)], (0x4000, key), 0);
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    let inv = SqWqeHdr {
        wr_id: 2,
        opcode: wr::LOCAL_INV,
        send_flags: send_flags::SIGNALED,
        ex: key,
        ..SqWqeHdr::default()
    };
    b.sim.post_send_wqe(&b.qp, inv, &[]);
    assert_eq!(
        summary(&b.cqes(1)[0]),
        (2, wc::LOCAL_INV, wc_status::SUCCESS, 0)
    );
    a.send(2, wr::RDMA_WRITE, &[a.sge(0, 8)], (0x4000, key), 0);
    assert_eq!(
        a.cqes(1)[0].status,
        wc_status::REM_ACCESS_ERR,
        "remote access error after LOCAL_INV"
    );
    // The NAK'd access error put B's QP in the error state as well.
    b.sim
        .post_send_wqe(&b.qp, SqWqeHdr { wr_id: 3, ..inv }, &[]);
    assert_eq!(b.cqes(1)[0].status, wc_status::WR_FLUSH_ERR);
    let _ = (&mut a.pd, &mut b.pd);
}

/// An armed SRQ limit fires SRQ_LIMIT_REACHED once consumption leaves
/// fewer WQEs than the limit, and then disarms.
#[test]
fn srq_limit_event_when_receives_run_low() {
    use pvrdma_abi::cmd::{CmdCode, ModifySrqReq};
    use pvrdma_abi::verbs::SrqAttr;
    use pvrdma_abi::wqe::event;

    let (a, mut b, srq, _) = srq_pair();
    for i in 0..3 {
        b.sim.post_srq_recv_sges(&srq, i, &[b.sge(i * 64, 64)]);
    }
    let arm = ModifySrqReq {
        srq_handle: srq.handle,
        attr_mask: 2,
        attrs: SrqAttr {
            srq_limit: 2,
            ..SrqAttr::default()
        },
        ..Default::default()
    };
    b.sim.post(CmdCode::ModifySrq, arm).expect("arm the limit");
    a.send(1, wr::SEND, &[a.sge(0, 4)], (0, 0), 0);
    assert_eq!(b.cqes(1).len(), 1);
    assert!(
        b.sim
            .async_events()
            .iter()
            .all(|e| e.event_type != event::SRQ_LIMIT_REACHED),
        "2 left: not yet"
    );
    a.send(2, wr::SEND, &[a.sge(0, 4)], (0, 0), 0);
    assert_eq!(b.cqes(1).len(), 1);
    let limit: Vec<_> = b
        .sim
        .async_events()
        .into_iter()
        .filter(|e| e.event_type == event::SRQ_LIMIT_REACHED)
        .collect();
    assert_eq!(limit.len(), 1);
    assert_eq!(limit[0].info, srq.handle);
    // Disarmed: the last receive does not fire it again.
    a.send(3, wr::SEND, &[a.sge(0, 4)], (0, 0), 0);
    assert_eq!(b.cqes(1).len(), 1);
    assert!(b
        .sim
        .async_events()
        .iter()
        .all(|e| e.event_type != event::SRQ_LIMIT_REACHED));
}

/// B's device is live-migrated (snapshot through bytes, a new device on
/// the same guest memory) while A streams SENDs and RDMA WRITEs into it
/// over a lossy wire: every message lands intact, B's QPN and rkey are
/// unchanged, and the QP keeps working both ways afterwards.
#[test]
fn device_migration_keeps_queue_pairs_and_traffic() {
    let (a, b) = rc_pair();
    a.sim.wire.drop_one_in.store(20, Ordering::Relaxed);
    let (qpn, key) = (b.qp.qpn, b.key);
    let data = pattern(30_000, 11);
    a.write(0, &data);
    for i in 0..8 {
        b.sim.post_recv_sges(&b.qp, i, &[b.sge(0, 30_000)]);
    }
    for i in 0..4u64 {
        a.send(i, wr::SEND, &[a.sge(0, 30_000)], (0, 0), 0);
        a.send(
            10 + i,
            wr::RDMA_WRITE,
            &[a.sge(0, 16_000)],
            (IOVA + 32_768, key),
            0,
        );
    }
    // Mid-stream: the migration blackout.
    let Side {
        sim,
        pd,
        cq,
        qp,
        key: k,
        pages,
    } = b;
    let b = Side {
        sim: sim.migrate(),
        pd,
        cq,
        qp,
        key: k,
        pages,
    };
    let done = a.cqes(8);
    assert_eq!(done.len(), 8);
    assert!(
        done.iter().all(|c| c.status == wc_status::SUCCESS),
        "{done:?}"
    );
    let got = b.cqes(4);
    assert_eq!(got.len(), 4, "every SEND received once");
    assert!(got
        .iter()
        .all(|c| c.status == wc_status::SUCCESS && c.byte_len == 30_000));
    assert_eq!(b.read(0, 30_000), data);
    assert_eq!(b.read(32_768, 16_000), data[..16_000]);
    // The same QPN and key, and the QP works the other way too.
    assert_eq!((b.qp.qpn, b.key), (qpn, key));
    let mut b = b;
    assert_eq!(
        b.sim.query_qp(b.qp.handle).expect("query").qp_state,
        pvrdma_abi::verbs::qp_state::RTS
    );
    b.write(60_000, b"back");
    a.sim.post_recv_sges(&a.qp, 99, &[a.sge(40_000, 16)]);
    b.send(7, wr::SEND, &[b.sge(60_000, 4)], (0, 0), 0);
    assert_eq!(b.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(a.cqes(1)[0].wr_id, 99);
    assert_eq!(a.read(40_000, 4), b"back");
}

/// B posts a receive and A SENDs it 8 bytes: B's completion.
fn one_send(a: &Side, b: &Side, wr_id: u64) -> Cqe {
    b.sim.post_recv_sges(&b.qp, wr_id, &[b.sge(0, 64)]);
    a.send(wr_id, wr::SEND, &[a.sge(0, 8)], (0, 0), 0);
    b.cqes(1)[0]
}

/// A destination VMM starts its vCPUs a moment before it resumes its
/// devices: an ARM doorbell the guest rings then reaches a paused device.
/// It takes effect once the device resumes, or the guest would sleep on its
/// next completion for good (nvme-rdma's I/O, then its `ib_drain_qp`, hung
/// after a live migration).
#[test]
fn an_arm_rung_while_paused_takes_effect_on_resume() {
    use vm_migration::Pausable;
    let (a, b) = rc_pair();
    b.sim.device().pause().expect("pause");
    b.sim.arm_cq(&b.cq, false);
    assert!(b.sim.wait_until(|s| s.metric("doorbell_held") == 1));
    b.sim.device().resume().expect("resume");
    assert_eq!(one_send(&a, &b, 1).wr_id, 1);
    assert!(b.sim.wait_until(|s| s.metric("cq_notify_posted") == 1));
    assert_eq!(b.sim.cq_notifications(), vec![b.cq.handle]);
}

/// The source of a migration pauses its device once the vCPUs stopped; an
/// ARM doorbell rung just before may not have reached the worker yet, and
/// the saved CQ then looks unarmed. The destination arms every CQ the guest
/// ever armed and finds unarmed, so the guest hears of its next completion
/// (at worst once more than it asked).
#[test]
fn a_migration_keeps_an_arm_the_source_had_not_taken() {
    use vm_migration::Pausable;
    let (a, b) = rc_pair();
    // Armed and notified once before: a CQ the guest waits on with arms.
    b.sim.arm_cq(&b.cq, false);
    assert!(b.sim.wait_until(|s| s.metric("doorbell_cq_arm") == 1));
    assert_eq!(one_send(&a, &b, 1).wr_id, 1);
    // Posted after the CQE the send waited for.
    assert!(b.sim.wait_until(|s| s.metric("cq_notify_posted") == 1));
    assert_eq!(b.sim.cq_notifications(), vec![b.cq.handle]);
    // The arm the source's worker takes only once paused.
    b.sim.device().pause().expect("pause");
    b.sim.arm_cq(&b.cq, false);
    assert!(b.sim.wait_until(|s| s.metric("doorbell_held") == 1));
    let b = Side {
        sim: b.sim.migrate(),
        ..b
    };
    assert!(b.sim.wait_until(|s| s.metric("cq_rearmed") == 1));
    assert!(b.sim.cq_notifications().is_empty(), "nothing to poll yet");
    assert_eq!(one_send(&a, &b, 2).wr_id, 2);
    assert!(b.sim.wait_until(|s| s.metric("cq_notify_posted") == 1));
    assert_eq!(b.sim.cq_notifications(), vec![b.cq.handle]);
}

/// A CQ the guest only polls (never armed) gets no notification from a
/// migration: Linux warns of one on an `IB_POLL_DIRECT` CQ.
#[test]
fn a_migration_arms_no_cq_the_guest_only_polls() {
    let (a, b) = rc_pair();
    let b = Side {
        sim: b.sim.migrate(),
        ..b
    };
    assert_eq!(one_send(&a, &b, 1).wr_id, 1);
    assert_eq!(b.sim.metric("cq_rearmed"), 0);
    assert_eq!(b.sim.metric("cq_notify_posted"), 0);
}

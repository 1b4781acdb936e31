// SPDX-License-Identifier: Apache-2.0
//! The same-host channel's one-copy path (`share_memory=on`): two devices
//! of one host that both turned it on exchange described records instead
//! of payloads, and each receiver copies straight from the sender's
//! guest memory into its own (WRITE and SEND: B from A's; READ: A from
//! B's). The data, the completions and the dirty bitmap are as on the
//! payload path; with the option off on either side, nothing changes.

use pvrdma::sim_driver::endpoint::{connect, Endpoint as Side, GID_A, GID_B, IOVA, MAC_A, MAC_B};
use pvrdma::sim_driver::ib::{wc, wr};
use pvrdma::sim_driver::{QpSpec, SimDriver};
use pvrdma::PvrdmaConfig;
use pvrdma_abi::wqe::wc_status;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// A same-host pair in `dir`, each side sharing its memory or not.
fn pair(dir: &std::path::Path, share_a: bool, share_b: bool) -> (Side, Side) {
    pair_of_sges(dir, (share_a, share_b), 1)
}

/// [`pair`] whose send queues take WQEs of up to `sges` SGEs.
fn pair_of_sges(
    dir: &std::path::Path,
    (share_a, share_b): (bool, bool),
    sges: u32,
) -> (Side, Side) {
    let side = |mac, gid, share| {
        let mut config = PvrdmaConfig {
            local_dir: Some(dir.to_path_buf()),
            share_memory: share,
            ..PvrdmaConfig::default()
        };
        config.limits.max_sge = config.limits.max_sge.max(sges);
        let spec = |pd, cq| QpSpec {
            max_send_sge: sges,
            ..QpSpec::rc(pd, cq)
        };
        Side::on(SimDriver::with_config_and_mac(&config, mac), gid, spec)
    };
    connect(side(MAC_A, GID_A, share_a), side(MAC_B, GID_B, share_b))
}

fn dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("pvrdma-share-{name}-{}", std::process::id()))
}

/// WRITEs until the channel is set up both ways (rings accepted, views
/// taken where both share): the first frames of a QP go before the
/// peer's ACCEPT arrives, with their payload.
fn warm_up(a: &Side, b: &Side) {
    for id in 0..20 {
        a.send(
            900 + id,
            wr::RDMA_WRITE,
            &[a.sge(0, 4096)],
            (IOVA, b.key),
            0,
        );
        assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
        b.send(
            900 + id,
            wr::RDMA_WRITE,
            &[b.sge(0, 4096)],
            (IOVA, a.key),
            0,
        );
        assert_eq!(b.cqes(1)[0].status, wc_status::SUCCESS);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// WRITE, READ and SEND of 60 000 bytes (over the MRs' scattered pages:
/// several runs per segment) land intact; returns the described records
/// A and B sent.
fn write_read_send(a: &Side, b: &Side) -> (u64, u64) {
    use vm_memory::bitmap::Bitmap;
    use vm_memory::{GuestAddress, GuestMemoryBackend};

    warm_up(a, b);
    let described = |s: &Side| s.sim.metric("roce_local_described");
    let (da, db) = (described(a), described(b));
    let bmem = b.sim.mem.clone();
    let bregion = bmem.find_region(GuestAddress(0)).expect("region");
    let amem = a.sim.mem.clone();
    let aregion = amem.find_region(GuestAddress(0)).expect("region");

    let data = pattern(60_000, 3);
    a.write(0, &data);
    b.write(0, &[0; 65536]);
    bregion.bitmap().reset();
    a.send(
        1,
        wr::RDMA_WRITE,
        &[a.sge(0, 60_000)],
        (IOVA + 1000, b.key),
        0,
    );
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(b.read(1000, 60_000), data, "WRITE");
    assert_eq!(b.read(0, 1000), vec![0; 1000], "nothing before");
    let bdirty = |addr: u64| bregion.bitmap().dirty_at(addr as usize);
    assert!(
        b.pages[..15].iter().all(|&p| bdirty(p)),
        "WRITE marks B dirty"
    );

    let back = pattern(50_000, 8);
    b.write(2000, &back);
    a.write(0, &[0; 65536]);
    aregion.bitmap().reset();
    a.send(
        2,
        wr::RDMA_READ,
        &[a.sge(100, 50_000)],
        (IOVA + 2000, b.key),
        0,
    );
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(a.read(100, 50_000), back, "READ");
    let adirty = |addr: u64| aregion.bitmap().dirty_at(addr as usize);
    assert!(
        a.pages[..13].iter().all(|&p| adirty(p)),
        "READ marks A dirty"
    );

    let msg = pattern(40_000, 13);
    a.write(5000, &msg);
    b.sim.post_recv_sges(&b.qp, 77, &[b.sge(300, 50_000)]);
    a.send(3, wr::SEND, &[a.sge(5000, 40_000)], (0, 0), 0);
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);
    let got = b.cqes(1);
    assert_eq!(
        (got[0].opcode, got[0].status),
        (wc::RECV, wc_status::SUCCESS)
    );
    assert_eq!(got[0].byte_len, 40_000);
    assert_eq!(b.read(300, 40_000), msg, "SEND");
    assert_eq!(a.sim.metric("roce_tx"), 0, "nothing on the wire");
    (described(a) - da, described(b) - db)
}

#[test]
fn writes_reads_and_sends_are_copied_from_the_senders_memory() {
    let dir = dir("on");
    let (a, b) = pair(&dir, true, true);
    let (from_a, from_b) = write_read_send(&a, &b);
    // A's WRITE and SEND (one segment each), B's READ response.
    assert!(from_a >= 2, "A described {from_a}");
    assert!(from_b >= 1, "B described {from_b}");
    // Each (the warm-up's too) was placed from its sender's view.
    let sent = |s: &Side| s.sim.metric("roce_local_described");
    let got = |s: &Side| s.sim.metric("roce_local_rx_described");
    assert_eq!((got(&b), got(&a)), (sent(&a), sent(&b)));
    assert_eq!(a.sim.metric("roce_rx_bad") + b.sim.metric("roce_rx_bad"), 0);
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sharing is used only where both ends turned it on: either side off,
/// every payload goes through the ring as before.
#[test]
fn one_side_without_the_option_gets_payloads() {
    for (share_a, share_b) in [(true, false), (false, true), (false, false)] {
        let dir = dir(&format!("{share_a}-{share_b}"));
        let (a, b) = pair(&dir, share_a, share_b);
        let (from_a, from_b) = write_read_send(&a, &b);
        assert_eq!((from_a, from_b), (0, 0), "A {share_a}, B {share_b}");
        let got = a.sim.metric("roce_local_rx_described") + b.sim.metric("roce_local_rx_described");
        assert_eq!(got, 0, "A {share_a}, B {share_b}");
        assert!(a.sim.metric("roce_local_tx") > 0, "the same-host path");
        drop((a, b));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// DESTROY_MR of an MR whose pages a peer may still be copying from
/// waits for the peer to have read its ring: a WRITE whose segments went
/// out as described records just before lands whole, with the MR's bytes
/// as they were, although the guest overwrites them the moment DESTROY_MR
/// returns. (That the wait happens is `local`'s `settle` test: here the
/// peer is usually done long before.)
#[test]
fn an_mr_destroyed_with_writes_in_flight_is_read_before_it_goes() {
    use pvrdma::sim_driver::endpoint::RIGHTS;
    use pvrdma_abi::cmd::CmdCode;

    let dir = dir("dereg");
    let (mut a, b) = pair(&dir, true, true);
    warm_up(&a, &b);
    let at = IOVA + (1 << 30);
    for round in 0..20u8 {
        let (mr, pages) = a
            .sim
            .reg_user_mr_pages(a.pd, at, 16 * 4096, RIGHTS)
            .expect("mr");
        let data = pattern(60_000, round);
        a.sim.write_buf(&pages, 0, &data);
        let before = a.sim.metric("roce_local_described");
        let mut sge = a.sge(0, 60_000);
        (sge.addr, sge.lkey) = (at, mr.lkey);
        a.send(1, wr::RDMA_WRITE, &[sge], (IOVA, b.key), 0);
        assert!(a
            .sim
            .wait_until(|s| s.metric("roce_local_described") > before));
        a.sim
            .destroy(CmdCode::DestroyMr, mr.mr_handle)
            .expect("destroy mr");
        a.sim.write_buf(&pages, 0, &vec![0xee; 60_000]);
        assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS, "round {round}");
        assert_eq!(b.read(0, 60_000), data, "round {round}");
    }
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A described segment can be longer than a copied one
/// (`MAX_DESCRIBED_SEGMENT` against `MAX_SEGMENT`'s 32 KiB, which a ring
/// record bounds): a WRITE of 60 000 bytes from one SGE is one described
/// record; from 17 SGEs (more than `DESCRIBED_SGES`, whose runs might not
/// fit a record) two segments of at most 32 KiB; either lands whole.
/// From an MR its key does not open, a segment too long to copy completes
/// with LOC_PROT_ERR, as copying it would.
#[test]
fn a_segment_is_described_whole_up_to_its_own_limit() {
    let dir = dir("long");
    let (a, b) = pair_of_sges(&dir, (true, true), 17);
    warm_up(&a, &b);
    let described = || a.sim.metric("roce_local_described");
    let data = pattern(60_000, 21);
    a.write(0, &data);
    let pieces: Vec<_> = (0..17u32)
        .map(|i| {
            let (at, end) = (i * 60_000 / 17, (i + 1) * 60_000 / 17);
            a.sge(u64::from(at), end - at)
        })
        .collect();
    for (id, sges, records) in [(1, vec![a.sge(0, 60_000)], 1), (2, pieces, 2)] {
        b.write(0, &[0; 65536]);
        let before = described();
        a.send(id, wr::RDMA_WRITE, &sges, (IOVA, b.key), 0);
        assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS, "WRITE {id}");
        assert_eq!(b.read(0, 60_000), data, "WRITE {id}");
        assert_eq!(described() - before, records, "WRITE {id}'s records");
    }
    // One segment longer than any frame: not built and lost, it would be
    // retried until the QP gives up.
    let mut bad = a.sge(0, 65_536);
    bad.lkey ^= 0x100;
    a.send(3, wr::RDMA_WRITE, &[bad], (IOVA, b.key), 0);
    assert_eq!(a.cqes(1)[0].status, wc_status::LOC_PROT_ERR);
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

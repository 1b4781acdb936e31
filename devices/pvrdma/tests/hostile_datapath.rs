// SPDX-License-Identifier: Apache-2.0
//! The data path against a hostile guest and a hostile peer: random send
//! and receive WQEs (opcodes, SGE counts, lengths, keys, address vectors)
//! and mutated RoCE frames (most resealed with a valid ICRC, so that the
//! forged headers reach the engine) must never panic or wedge the worker;
//! afterwards a fresh QP pair still carries traffic.

use pvrdma::sim_driver::endpoint::{connect, rc_pair, Endpoint as Side, GID_A, GID_B};
use pvrdma::sim_driver::ib::wr;
use pvrdma::sim_driver::{QpSpec, SimDriver};
use pvrdma_abi::wqe::{send_flags, wc_status, Sge, SqWqeHdr};
use vm_migration::test_utils::{mutate, Choices, Seeded};

/// Seeded noise, with the shapes this file's hostile values take.
struct Rng(Seeded);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0.u64()
    }
    /// A coin flip.
    fn coin(&mut self) -> bool {
        self.next() & 1 == 0
    }
    /// Mostly small values, sometimes huge ones.
    fn value(&mut self) -> u64 {
        match self.next() % 4 {
            0 => self.next(),
            1 => self.next() % 16,
            2 => u64::MAX - self.next() % 16,
            _ => self.next() % 0x1_0000,
        }
    }
}

/// The choices of a hostile snapshot edit.
impl Choices for Rng {
    fn u8(&mut self) -> u8 {
        self.next() as u8
    }

    fn u16(&mut self) -> u16 {
        self.next() as u16
    }

    fn u64(&mut self) -> u64 {
        self.value()
    }
}

/// After the abuse, both devices still serve a fresh connected QP pair.
fn still_works(a: Side, b: Side) {
    let a = Side::on(a.sim, GID_A, QpSpec::rc);
    let b = Side::on(b.sim, GID_B, QpSpec::rc);
    let (a, b) = connect(a, b);
    b.sim.post_recv_sges(&b.qp, 1, &[b.sge(0, 64)]);
    a.write(0, b"alive");
    a.send(1, wr::SEND, &[a.sge(0, 5)], (0, 0), 0);
    assert_eq!(
        a.cqes(1).first().map(|c| c.status),
        Some(wc_status::SUCCESS)
    );
    assert_eq!(b.read(0, 5), b"alive");
}

/// A random send WQE: header fields, the `wr` union and SGEs.
fn random_send(rng: &mut Rng, a: &Side, rkey: u32) -> (SqWqeHdr, Vec<Sge>) {
    let mut hdr = SqWqeHdr {
        wr_id: rng.next(),
        total_len: rng.value() as u32,
        // Verbs opcodes (the simulated driver translates them as the
        // kernel does), REG_MR among them, or noise.
        opcode: match rng.next() % 4 {
            0 => rng.value() as u32,
            1 => wr::REG_MR,
            _ => (rng.next() % 14) as u32,
        },
        // Signaled, so that each one is seen to end.
        send_flags: rng.value() as u32 | send_flags::SIGNALED,
        ex: rng.value() as u32,
        ..SqWqeHdr::default()
    };
    for w in &mut hdr.wr {
        *w = rng.value();
    }
    if rng.coin() {
        hdr.wr[0] = a.sge(rng.next() % 70_000, 0).addr;
        hdr.wr[1] = u64::from(rkey);
    }
    let sges = (0..rng.next() % 3)
        .map(|_| Sge {
            addr: if rng.coin() {
                a.sge(rng.next() % 70_000, 0).addr
            } else {
                rng.value()
            },
            length: if rng.coin() {
                (rng.next() % 5000) as u32
            } else {
                rng.value() as u32
            },
            lkey: if rng.coin() {
                a.key
            } else {
                rng.value() as u32
            },
        })
        .collect();
    (hdr, sges)
}

/// Rounds of random WQEs on fresh QP pairs (a bad WQE fails its QP, so
/// each round starts clean): every one completes, in error or not, and
/// the workers keep serving.
#[test]
fn random_work_requests_never_panic_or_wedge_the_worker() {
    let mut rng = Rng(Seeded(0x1234_5678_9abc_def1));
    for _ in 0..30 {
        let (a, b) = rc_pair();
        for i in 0..12u64 {
            let (hdr, sges) = random_send(&mut rng, &a, b.key);
            a.sim.post_send_wqe(&a.qp, hdr, &sges);
            let (_, rsges) = random_send(&mut rng, &b, 0);
            b.sim.post_recv_sges(&b.qp, i, &rsges);
        }
        // Every send WQE ends in exactly one CQE (the sim QPs have 16
        // slots), whatever its fate.
        let done = a.cqes(12);
        assert_eq!(done.len(), 12, "{done:?}");
        still_works(a, b);
    }
}

/// Real frames for B's QP: what an identical, unjoined pair emits (QPNs,
/// GIDs and PSNs are deterministic, so they address B's QP exactly).
fn frames_for_b() -> Vec<Vec<u8>> {
    let x = Side::on(SimDriver::new(), GID_A, QpSpec::rc);
    let y = Side::on(SimDriver::new(), GID_B, QpSpec::rc);
    let (x, y) = connect(x, y);
    x.write(0, &[7; 3000]);
    x.send(1, wr::SEND, &[x.sge(0, 3000)], (0, 0), 0);
    x.send(
        2,
        wr::RDMA_WRITE,
        &[x.sge(0, 2000)],
        (y.sge(0, 0).addr, y.key),
        0,
    );
    x.send(
        3,
        wr::RDMA_READ,
        &[x.sge(0, 100)],
        (y.sge(0, 0).addr, y.key),
        0,
    );
    assert!(x.sim.wait_until(|s| s.wire.sent.lock().unwrap().len() >= 6));
    let frames = x.sim.wire.sent.lock().unwrap().clone();
    frames
}

/// Mutations of real frames (1-4 bytes changed, some cut short), most
/// resealed with a valid ICRC, are steered to B's RC QP. A forged request
/// that the responder refuses fails the QP, after which frames find no
/// QP: so each round of 100 frames starts on a fresh pair, and across the
/// rounds hundreds of forged headers must reach a live QP.
#[test]
fn mutated_frames_from_a_peer_never_panic() {
    let template = frames_for_b();
    let mut rng = Rng(Seeded(0xfeed_beef_0bad_cafe));
    let (mut refused, mut reached) = (0, 0);
    for _ in 0..30 {
        let (a, b) = rc_pair();
        b.sim.post_recv_sges(&b.qp, 1, &[b.sge(0, 4096)]);
        let mut steered = 0;
        for _ in 0..100 {
            let mut f = template[(rng.next() % template.len() as u64) as usize].clone();
            for _ in 0..1 + rng.next() % 4 {
                let at = (rng.next() % f.len() as u64) as usize;
                f[at] = rng.next() as u8;
            }
            if rng.next() & 7 == 0 {
                f.truncate((rng.next() % f.len() as u64) as usize);
            }
            // A quarter keep the broken ICRC the mutation left.
            if rng.next() & 3 != 0 {
                let _ = rdma_transport::packet::seal(&mut f);
            }
            // A frame the port does not take is one the NIC would get.
            steered += u64::from(b.sim.port.steer_to_rdma(&f));
        }
        let m = |name| b.sim.metric(name);
        assert!(b.sim.wait_until(|s| s.metric("roce_rx") >= steered));
        refused += m("roce_rx_bad");
        reached += m("roce_rx") - m("roce_rx_bad") - m("roce_rx_no_qp");
        still_works(a, b);
    }
    assert!(refused > 0, "corrupted frames were refused");
    assert!(
        reached > 800,
        "only {reached} forged frames reached a live QP"
    );
}

/// A device snapshot is input from another host: mutated snapshots of a
/// device with live QPs (`vm_migration::test_utils::mutate`: numbers
/// anywhere in the state, so handles, indices, lengths, page addresses and
/// engine state, replaced; bits flipped; ranges removed, duplicated or
/// copied; the state cut short) are refused or restored without a panic,
/// and the device then still works.
#[test]
fn hostile_snapshots_are_refused_or_harmless() {
    use vm_migration::{Pausable, Snapshot, Snapshottable};

    let (a, b) = rc_pair();
    b.sim.post_recv_sges(&b.qp, 1, &[b.sge(0, 64)]);
    a.send(1, wr::SEND, &[a.sge(0, 5000)], (0, 0), 0);
    a.send(
        2,
        wr::RDMA_READ,
        &[a.sge(0, 100)],
        (b.sge(0, 0).addr, b.key),
        0,
    );
    a.sim.device().pause().expect("pause");
    let snap = a.sim.device().snapshot().expect("snapshot");
    assert!(
        snap.data.len() > 1000,
        "a rich state: {} bytes",
        snap.data.len()
    );
    // A panic in a device worker thread would not fail the test by itself.
    let panics = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = panics.clone();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        default_hook(info);
    }));
    let mut rng = Rng(Seeded(0x005e_ed0f_5a5e_0001));
    let (mut restored, mut refused) = (0, 0);
    for i in 0..150u64 {
        let mut data = snap.data.clone();
        for _ in 0..1 + rng.next() % 3 {
            let at = rng.next() as usize;
            mutate(&mut data, at, &mut rng);
        }
        if rng.next() & 7 == 0 {
            data.truncate((rng.next() % data.len() as u64) as usize);
        }
        let hostile = Snapshot {
            data,
            ..snap.clone()
        };
        let mut t = SimDriver::new();
        match t.device().restore(&hostile) {
            Ok(()) => restored += 1,
            Err(_) => refused += 1,
        }
        // Restore runs every QP once: give the worker that turn.
        std::thread::sleep(std::time::Duration::from_millis(2));
        // Whatever it took in, the device is usable by a driver that
        // starts over (probe resets it).
        if i % 30 == 0 {
            let peer = SimDriver::new();
            SimDriver::connect(&t, &peer);
            t.probe().expect("probe after a hostile restore");
            still_works(
                Side::on(t, GID_A, QpSpec::rc),
                Side::on(peer, GID_B, QpSpec::rc),
            );
        }
    }
    assert_eq!(
        panics.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no thread panicked"
    );
    assert!(refused > 0, "some mutations must be refused");
    assert!(restored > 0, "some mutations stay valid and are restored");
}

/// A device snapshot whose length prefix claims more elements than the
/// snapshot holds (here its MSI-X vectors; the decoder treats every list of
/// the state alike) is refused for that claim, before room is reserved for
/// it, and the device still works.
#[test]
fn a_snapshot_claiming_more_than_it_holds_is_refused() {
    use vm_migration::bounded::DecodeError;
    use vm_migration::test_utils::{read_varint, varint};
    use vm_migration::{MigratableError, Pausable, Snapshot, Snapshottable};

    let (a, _b) = rc_pair();
    a.sim.device().pause().expect("pause");
    let snap = a.sim.device().snapshot().expect("snapshot");
    // The state's layout (snapshot.rs `Saved`): err, dsr_low (varints),
    // active (a byte), imr, icr (varints), then the MSI-X state: enabled
    // and function_masked (bytes), and the vectors' count.
    let d = &snap.data;
    let mut at = 0;
    for width in [None, None, Some(1), None, None, Some(2)] {
        at += width.unwrap_or_else(|| read_varint(&d[at..]).1);
    }
    let (count, len) = read_varint(&d[at..]);
    assert!((1..=2048).contains(&count), "found the vectors: {count}");
    for claim in [d.len() as u64, 1 << 40, u64::MAX >> 1] {
        let mut data = d.clone();
        data.splice(at..at + len, varint(claim));
        let hostile = Snapshot {
            data,
            ..snap.clone()
        };
        let mut t = SimDriver::new();
        match t.device().restore(&hostile) {
            Err(MigratableError::Restore(_, e)) => assert!(
                matches!(
                    e.downcast_ref::<DecodeError>(),
                    Some(DecodeError::BeyondInput)
                ),
                "claim {claim}: {e}"
            ),
            other => panic!("claim {claim}: {other:?}"),
        }
        t.probe().expect("probe after the refusal");
    }
}

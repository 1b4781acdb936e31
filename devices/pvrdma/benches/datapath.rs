// SPDX-License-Identifier: Apache-2.0
//! In-process data path figures (docs/benchmarks.md), each against a
//! baseline measured in the same run:
//!
//! - RDMA WRITE bandwidth, 64 KiB messages, 16 in flight, between two
//!   devices over the same-host channel (two workers, real AF_UNIX
//!   sockets), against a single-core memcpy of the same bytes;
//! - 8-byte RDMA WRITE with immediate, post to the peer's receive
//!   completion, against a one-way eventfd hand-off between two threads.
//!
//! Both devices are driven by simulated guest drivers; completions are
//! polled the way a guest polls its CQ. Run: `cargo bench -p pvrdma`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use pvrdma::sim_driver::endpoint::{connect, Endpoint, GID_A, GID_B, IOVA, MAC_A, MAC_B};
use pvrdma::sim_driver::ib::wr;
use pvrdma::sim_driver::{QpSpec, SimDriver};
use pvrdma::PvrdmaConfig;
use pvrdma_abi::wqe::{wc_status, Cqe};
use vmm_sys_util::eventfd::EventFd;

const MSG: u32 = 64 << 10;
const DEPTH: usize = 16;
const WRITES: usize = 3000;
const PINGS: usize = 3000;

/// Polls `ep`'s CQ until `n` completions arrived, yielding the core
/// between empty polls (the two device workers need the machine's cores).
fn poll(ep: &Endpoint, n: usize) -> Vec<Cqe> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    let mut spins = 0u32;
    while got.len() < n {
        got.extend(ep.sim.poll_cq(&ep.cq));
        std::thread::yield_now();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) {
            assert!(Instant::now() < deadline, "no completion in 30 s");
        }
    }
    for c in &got {
        assert_eq!(c.status, wc_status::SUCCESS, "completion {c:?}");
    }
    got
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn write_bandwidth(a: &Endpoint, b: &Endpoint) -> f64 {
    let t0 = Instant::now();
    let mut posted = 0;
    let mut done = 0;
    while done < WRITES {
        while posted < WRITES && posted - done < DEPTH {
            a.send(
                posted as u64,
                wr::RDMA_WRITE,
                &[a.sge(0, MSG)],
                (IOVA, b.key),
                0,
            );
            posted += 1;
        }
        done += poll(a, 1).len();
    }
    (WRITES as f64 * f64::from(MSG)) / t0.elapsed().as_secs_f64()
}

fn memcpy_bandwidth() -> f64 {
    let src = vec![0x5au8; MSG as usize];
    let mut dst = vec![0u8; MSG as usize];
    let t0 = Instant::now();
    for _ in 0..WRITES {
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
    }
    (WRITES as f64 * f64::from(MSG)) / t0.elapsed().as_secs_f64()
}

fn write_latency(a: &Endpoint, b: &Endpoint) -> Duration {
    let mut samples = Vec::with_capacity(PINGS);
    for i in 0..PINGS {
        b.sim.post_recv_sges(&b.qp, i as u64, &[]);
        let t0 = Instant::now();
        a.send(
            i as u64,
            wr::RDMA_WRITE_WITH_IMM,
            &[a.sge(0, 8)],
            (IOVA, b.key),
            1,
        );
        poll(b, 1);
        samples.push(t0.elapsed());
        poll(a, 1);
    }
    median(samples)
}

fn eventfd_latency() -> Duration {
    let (ping, pong) = (EventFd::new(0).unwrap(), EventFd::new(0).unwrap());
    let (ping2, pong2) = (ping.try_clone().unwrap(), pong.try_clone().unwrap());
    let echo = std::thread::spawn(move || {
        for _ in 0..PINGS {
            ping2.read().unwrap();
            pong2.write(1).unwrap();
        }
    });
    let mut samples = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let t0 = Instant::now();
        ping.write(1).unwrap();
        pong.read().unwrap();
        samples.push(t0.elapsed() / 2);
    }
    echo.join().unwrap();
    median(samples)
}

fn main() {
    let dir = std::env::temp_dir().join(format!("pvrdma-bench-{}", std::process::id()));
    let config = PvrdmaConfig {
        local_dir: Some(dir.clone()),
        ..PvrdmaConfig::default()
    };
    let spec = |pd, cq| QpSpec {
        max_send_wr: 64,
        max_recv_wr: 64,
        ..QpSpec::rc(pd, cq)
    };
    let a = Endpoint::on(SimDriver::with_config_and_mac(&config, MAC_A), GID_A, spec);
    let b = Endpoint::on(SimDriver::with_config_and_mac(&config, MAC_B), GID_B, spec);
    let (a, b) = connect(a, b);

    let rdma = write_bandwidth(&a, &b);
    assert!(a.sim.metric("roce_local_tx") > 0 && a.sim.metric("roce_tx") == 0);
    let copy = memcpy_bandwidth();
    let lat = write_latency(&a, &b);
    let efd = eventfd_latency();
    let mib = |bps: f64| bps / f64::from(1u32 << 20);
    println!(
        "RDMA WRITE 64 KiB x{WRITES}, depth {DEPTH}, same-host channel: {:.0} MiB/s",
        mib(rdma)
    );
    println!(
        "memcpy 64 KiB x{WRITES}, one core:                        {:.0} MiB/s",
        mib(copy)
    );
    println!(
        "bandwidth ratio (RDMA WRITE / memcpy):                    {:.3}",
        rdma / copy
    );
    println!(
        "8-byte WRITE_WITH_IMM post -> remote CQE, median of {PINGS}:  {:.1} us",
        lat.as_secs_f64() * 1e6
    );
    println!(
        "eventfd one-way hand-off between threads, median of {PINGS}: {:.1} us",
        efd.as_secs_f64() * 1e6
    );
    println!(
        "latency ratio (RDMA / eventfd):                           {:.1}",
        lat.as_secs_f64() / efd.as_secs_f64()
    );
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

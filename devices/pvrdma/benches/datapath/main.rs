// SPDX-License-Identifier: Apache-2.0
//! In-process data path figures (docs/benchmarks.md, issue 15), each
//! against a baseline measured in the same run:
//!
//! - RDMA WRITE, RDMA READ and SEND bandwidth, 4 KiB, 64 KiB and 1 MiB
//!   messages, 1 and 16 QPs (16 signaled WRs in flight in all), between
//!   two devices over the same-host channel, against a single-core memcpy
//!   of the same bytes; the driver polls its CQs, and beside that figure
//!   sleeps on their interrupt instead ([`Reap`]);
//! - the message rate of 64-byte SENDs, 1 and 16 QPs;
//! - 8-byte RDMA WRITE with immediate, post to the peer's receive
//!   completion, against one-way eventfd hand-offs between two threads
//!   ([`Handoff`]; goal 2's baseline is the one pinned to one CPU, the
//!   only one that is not bimodal on this VM).
//!
//! Both devices are driven by simulated guest drivers; completions are
//! polled the way a guest polls its CQ. Every figure is the median of
//! [`RUNS`] runs. Run: `cargo bench -p pvrdma --bench datapath`, and add
//! `-- bandwidth`, `-- rate` or `-- latency` for one part; `-- profile`
//! moves 512 RDMA WRITEs of 64 KiB on one QP once (`op=read|send`, `len=KIB`,
//! `count=N` and `cq=sleep` for another stream), no baseline (for
//! `valgrind --tool=callgrind --separate-threads=yes`), and prints the
//! data path's events per WRITE (frames, kicks, doorbells) and each
//! thread's time per WRITE on a CPU and waiting for one ([`Sched`]).
//! `poll=US` sets how long the device workers busy-poll after work (0 for
//! callgrind, which would count the polling). `pin=CPU,CPU[,CPU]` keeps A's
//! and B's workers on those CPUs as `worker_cpus=` does (and the driver on
//! the third), for every part;
//! `pages=contiguous` registers MRs over contiguous guest pages (as in a
//! guest's huge page) instead of pages with a gap after each.
//! `share=on` turns `share_memory` on for both devices (the one-copy
//! path: each receiver copies from the sender's guest memory), and
//! `share=both` measures a pair with it and a pair without in one run,
//! their runs interleaved (rows `copy` and `share`; the other parts use
//! the first pair). `rewrite` has the driver rewrite the source buffer
//! (A's for WRITE and SEND, B's for READ) before each post, as an
//! application that produces its data does: its cache lines are then the
//! driver's CPU's, not left shared from the previous message.
//!
//! `-- wire` (root) measures the wire path instead: two devices over
//! TAPs on a bridge against a UDP stream over that bridge ([`wire`]);
//! `-- wire profile` moves 512 WRITEs of 64 KiB over it once.

use std::hint::black_box;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use pvrdma::sim_driver::endpoint::{GID_A, GID_B, IOVA, MAC_A, MAC_B, RIGHTS};
use pvrdma::sim_driver::ib::wr;
use pvrdma::sim_driver::{PageLayout, QpSpec, RcPath, SimCq, SimDriver, SimQp};
use pvrdma::PvrdmaConfig;
use pvrdma_abi::wqe::{send_flags, wc_status, Cqe, Sge, SqWqeHdr};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

mod wire;

/// Runs of each measurement; the median is reported.
const RUNS: usize = 5;
/// Work requests in flight, spread over the QPs of a run, unless
/// `depth=N` says otherwise.
const DEPTH: usize = 16;
/// Most send work requests in flight on a QP (`depth=` up to this with
/// one QP; perftest's default `--tx-depth`).
const SQ_DEPTH: usize = 128;
/// Most QPs of a run.
const QPS: usize = 16;
/// The MR of each side, large enough for the largest message.
const MR_LEN: u64 = 1 << 20;
/// Bytes moved per bandwidth run (at least 64 messages).
const RUN_BYTES: u64 = 32 << 20;
/// Pings per latency run.
const PINGS: usize = 1000;
/// The MSI-X vector the device signals CQ notifications on (vector 0 is
/// the command channel's, 1 the async events').
const CQ_VECTOR: usize = 2;

/// How the simulated driver learns of completions in a bandwidth run.
#[derive(Clone, Copy, PartialEq)]
enum Reap {
    /// Polls its CQs, yielding the CPU between polls: a spinning
    /// `ibv_poll_cq` loop, a thread that competes with the device's
    /// workers for the CPUs.
    Poll,
    /// Polls its CQs until they are empty, arms them and polls once more
    /// (`ibv_req_notify_cq`), then sleeps on the CQ's MSI-X vector
    /// (`ibv_get_cq_event`): the driver of a guest that streams and
    /// leaves the CPUs to the device while it waits.
    Sleep,
}

impl Reap {
    fn name(self) -> &'static str {
        match self {
            Reap::Poll => "poll",
            Reap::Sleep => "sleep",
        }
    }
}

/// One device: a PD, a CQ, [`QPS`] RC QPs and a 1 MiB MR at [`IOVA`].
struct Side {
    sim: SimDriver,
    cq: SimCq,
    qps: Vec<SimQp>,
    key: u32,
    /// The MSI-X vector of CQ notifications, which a sleeping driver
    /// waits on ([`Reap::Sleep`]).
    cq_irq: EventFd,
    /// The guest pages of the MR.
    pages: Vec<u64>,
}

impl Side {
    /// Sets up `sim` (not yet probed) with GID `gid`, its MR's pages laid
    /// out as `layout` says.
    fn new(mut sim: SimDriver, gid: [u8; 16], layout: PageLayout) -> Self {
        sim.probe().expect("probe");
        sim.bind_gid(0, gid, 2).expect("bind");
        let pd = sim.create_pd(0).expect("pd");
        let cq = sim.create_cq(0, 2048).expect("cq");
        let spec = QpSpec {
            max_send_wr: SQ_DEPTH as u32,
            max_recv_wr: 2 * SQ_DEPTH as u32,
            ..QpSpec::rc(pd, cq.handle)
        };
        let qps = (0..QPS).map(|_| sim.create_qp(spec).expect("qp")).collect();
        let (mr, pages) = sim
            .reg_user_mr_laid_out(pd, (IOVA, MR_LEN), RIGHTS, layout)
            .expect("mr");
        let cq_irq = sim.msi.irqfd(CQ_VECTOR).expect("CQ vector");
        Side {
            sim,
            cq,
            qps,
            key: mr.lkey,
            cq_irq,
            pages,
        }
    }

    /// Writes the first `len` bytes of the MR, a page at a time, as the
    /// application would before posting them (`rewrite`).
    fn rewrite(&self, len: u32, seed: u8) {
        use vm_memory::{Bytes, GuestAddress};
        let page = [seed; 4096];
        let mut left = len as usize;
        for &gpa in &self.pages {
            if left == 0 {
                break;
            }
            let n = left.min(page.len());
            self.sim
                .mem
                .write_slice(&page[..n], GuestAddress(gpa))
                .expect("MR page");
            left -= n;
        }
    }

    fn sge(&self, len: u32) -> Sge {
        Sge {
            addr: IOVA,
            length: len,
            lkey: self.key,
        }
    }

    /// Posts a signaled `opcode` of `len` bytes on QP `i`, towards the
    /// peer's MR (`rkey`) for RDMA.
    fn post(&self, i: usize, wr_id: u64, opcode: u32, len: u32, rkey: u32, imm: u32) {
        self.post_flagged(i, wr_id, opcode, len, rkey, imm, send_flags::SIGNALED);
    }

    /// [`Side::post`] with `flags` (0: unsignaled).
    #[allow(clippy::too_many_arguments)]
    fn post_flagged(
        &self,
        i: usize,
        wr_id: u64,
        opcode: u32,
        len: u32,
        rkey: u32,
        imm: u32,
        flags: u32,
    ) {
        let mut hdr = SqWqeHdr {
            wr_id,
            opcode,
            send_flags: flags,
            ex: imm,
            ..SqWqeHdr::default()
        };
        hdr.wr[0] = IOVA;
        hdr.wr[1] = rkey.into();
        self.sim.post_send_wqe(&self.qps[i], hdr, &[self.sge(len)]);
    }

    /// Polls the CQ once, checking every completion succeeded.
    fn poll(&self) -> Vec<Cqe> {
        let got = self.sim.poll_cq(&self.cq);
        for c in &got {
            assert_eq!(c.status, wc_status::SUCCESS, "completion {c:?}");
        }
        got
    }

    /// Which of our QPs a CQE is of.
    fn qp_index(&self, c: &Cqe) -> usize {
        self.qps
            .iter()
            .position(|q| u64::from(q.handle) == c.qp)
            .expect("CQE of one of our QPs")
    }
}

/// Both devices, their QPs connected pairwise.
struct Pair {
    a: Side,
    b: Side,
    /// Receives B has posted and A has not yet consumed, per QP; each
    /// covers the whole MR, so any SEND fits.
    recvs: std::cell::RefCell<Vec<usize>>,
    /// The driver rewrites the source buffer before each post.
    rewrite: bool,
    /// Work requests in flight in all ([`DEPTH`]).
    depth: usize,
    /// Every how many work requests of a QP one is signaled (perftest's
    /// `--cq-mod`); 1 signals them all. The last one posted before the
    /// driver stops posting on a QP is always signaled.
    cq_mod: usize,
}

impl Pair {
    /// Two devices of `a` and `b`'s configurations over the same-host
    /// channel, their MRs' pages laid out as `layout` says.
    fn new(a: &PvrdmaConfig, b: &PvrdmaConfig, layout: PageLayout) -> Self {
        let a = SimDriver::with_config_and_mac(a, MAC_A);
        let b = SimDriver::with_config_and_mac(b, MAC_B);
        Self::connected(a, b, RcPath::default(), layout)
    }

    /// Drivers `a` (of MAC_A) and `b` (of MAC_B), their QPs connected
    /// with `path`.
    fn connected(a: SimDriver, b: SimDriver, path: RcPath, layout: PageLayout) -> Self {
        let mut a = Side::new(a, GID_A, layout);
        let mut b = Side::new(b, GID_B, layout);
        for i in 0..QPS {
            let (qa, qb) = (a.qps[i].qpn, b.qps[i].qpn);
            let (ha, hb) = (a.qps[i].handle, b.qps[i].handle);
            a.sim
                .connect_rc_with(ha, 0, (GID_B, MAC_B), qb, (0x10, 0x20), path)
                .expect("A to RTS");
            b.sim
                .connect_rc_with(hb, 0, (GID_A, MAC_A), qa, (0x20, 0x10), path)
                .expect("B to RTS");
        }
        Pair {
            a,
            b,
            recvs: std::cell::RefCell::new(vec![0; QPS]),
            rewrite: false,
            depth: DEPTH,
            cq_mod: 1,
        }
    }

    /// The device counters of the data path's events, on A and B: frames
    /// each way, the same-host peers woken, frames that missed the ring,
    /// described records (`share=on`), doorbells.
    fn counters(&self) -> Vec<(&'static str, u64, u64)> {
        [
            "roce_local_tx",
            "roce_local_rx",
            "roce_local_kicks",
            "roce_local_copied",
            "roce_local_described",
            "doorbell_qp",
            "doorbell_cq_arm",
        ]
        .into_iter()
        .map(|n| (n, self.a.sim.metric(n), self.b.sim.metric(n)))
        .collect()
    }

    /// Device counter `name` of A and B together.
    fn both(&self, name: &str) -> u64 {
        self.a.sim.metric(name) + self.b.sim.metric(name)
    }

    /// Moves `count` messages of `len` bytes with `opcode` (posted by A)
    /// over the first `qps` QPs, `depth` in flight in all, one in `cq_mod`
    /// signaled; SENDs land in receives B keeps posted. Returns the
    /// elapsed time.
    fn transfer(&self, opcode: u32, len: u32, qps: usize, count: usize, reap: Reap) -> Duration {
        let (a, b) = (&self.a, &self.b);
        let send = opcode == wr::SEND;
        let mut recvs = self.recvs.borrow_mut();
        let mut inflight = vec![0usize; qps];
        let depth = (self.depth / qps).clamp(1, SQ_DEPTH);
        // Per QP: how many work requests each signaled one in flight
        // completes (itself and the unsignaled ones before it), and how
        // many have been posted since the last signaled one.
        let mut batches = vec![std::collections::VecDeque::new(); qps];
        let mut unsignaled = vec![0usize; qps];
        if send {
            for (i, r) in recvs.iter_mut().enumerate().take(qps) {
                while *r < 2 * depth {
                    b.sim.post_recv_sges(&b.qps[i], 0, &[b.sge(MR_LEN as u32)]);
                    *r += 1;
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let t0 = Instant::now();
        let (mut posted, mut done, mut received) = (0, 0, 0);
        let mut spins = 0u32;
        let mut armed = false;
        while done < count || (send && received < count) {
            let reaped = done + received;
            for i in 0..qps {
                while posted < count && inflight[i] < depth && (!send || recvs[i] > 0) {
                    if self.rewrite {
                        let source = if opcode == wr::RDMA_READ { b } else { a };
                        source.rewrite(len, posted as u8);
                    }
                    // Signaled: every `cq_mod`-th, and the last before
                    // this loop stops posting on the QP.
                    let signaled = unsignaled[i] + 1 >= self.cq_mod
                        || posted + 1 == count
                        || inflight[i] + 1 == depth
                        || (send && recvs[i] == 1);
                    let flags = if signaled { send_flags::SIGNALED } else { 0 };
                    a.post_flagged(i, posted as u64, opcode, len, b.key, 0, flags);
                    inflight[i] += 1;
                    posted += 1;
                    unsignaled[i] += 1;
                    if signaled {
                        batches[i].push_back(unsignaled[i]);
                        unsignaled[i] = 0;
                    }
                    if send {
                        recvs[i] -= 1;
                    }
                }
            }
            for c in a.poll() {
                let i = a.qp_index(&c);
                let n = batches[i].pop_front().expect("a signaled WR in flight");
                inflight[i] -= n;
                done += n;
            }
            if send {
                for c in b.poll() {
                    let i = b.qp_index(&c);
                    b.sim.post_recv_sges(&b.qps[i], 0, &[b.sge(MR_LEN as u32)]);
                    recvs[i] += 1;
                    received += 1;
                }
            }
            match reap {
                Reap::Poll => std::thread::yield_now(),
                // Nothing new: arm, and look once more before sleeping (a
                // CQE written before the arm raises no notification).
                Reap::Sleep if done + received == reaped && !armed => {
                    a.sim.arm_cq(&a.cq, false);
                    if send {
                        b.sim.arm_cq(&b.cq, false);
                    }
                    armed = true;
                }
                Reap::Sleep if done + received == reaped => {
                    self.sleep_on_cqs(send);
                    armed = false;
                }
                // An arm left pending fires later; the vector remembers it.
                Reap::Sleep => {}
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                assert!(Instant::now() < deadline, "no progress in 60 s");
            }
        }
        t0.elapsed()
    }

    /// Sleeps until A's CQ (and B's, for `send`) notifies, at most a
    /// second, then takes the notifications.
    fn sleep_on_cqs(&self, send: bool) {
        let sides: &[&Side] = if send {
            &[&self.a, &self.b]
        } else {
            &[&self.a]
        };
        let mut fds: Vec<libc::pollfd> = sides
            .iter()
            .map(|s| libc::pollfd {
                fd: s.cq_irq.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a live array of `fds.len()` pollfds, which poll
        // only writes the `revents` of.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) };
        assert!(rc >= 0, "poll: {}", std::io::Error::last_os_error());
        for s in sides {
            let _ = s.cq_irq.read();
            s.sim.cq_notifications();
        }
    }

    /// 8-byte WRITE_WITH_IMM from A's QP 0: post to B's CQE. The
    /// receives the immediates consume are posted ahead, in batches (as
    /// `ib_write_lat` does), so that B's worker is not handling a receive
    /// doorbell when a ping starts.
    fn write_latency(&self) -> Duration {
        let (a, b) = (&self.a, &self.b);
        let mut recvs = self.recvs.borrow_mut();
        let mut samples = Vec::with_capacity(PINGS);
        for i in 0..PINGS {
            if recvs[0] < DEPTH / 2 {
                while recvs[0] < 2 * DEPTH {
                    b.sim.post_recv_sges(&b.qps[0], 0, &[b.sge(MR_LEN as u32)]);
                    recvs[0] += 1;
                }
                // Let B's worker take them before the next ping starts.
                std::thread::sleep(Duration::from_millis(1));
            }
            recvs[0] -= 1;
            let t0 = Instant::now();
            a.post(0, i as u64, wr::RDMA_WRITE_WITH_IMM, 8, b.key, 1);
            while b.poll().is_empty() {
                std::thread::yield_now();
            }
            samples.push(t0.elapsed());
            while a.poll().is_empty() {
                std::thread::yield_now();
            }
        }
        median(samples)
    }
}

fn median<T: PartialOrd + Copy>(mut v: Vec<T>) -> T {
    v.sort_by(|x, y| x.partial_cmp(y).expect("comparable"));
    v[v.len() / 2]
}

/// Bytes per second of a single-core memcpy of `len`-byte buffers.
fn memcpy_bandwidth(len: usize, count: usize) -> f64 {
    let src = vec![0x5au8; len];
    let mut dst = vec![0u8; len];
    // Not timed: the first copy faults the destination's pages in.
    dst.copy_from_slice(&src);
    let t0 = Instant::now();
    for _ in 0..count {
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
    }
    (count * len) as f64 / t0.elapsed().as_secs_f64()
}

/// Bytes per second of a single-core copy of the first `len` bytes of A's
/// MR into B's, page by page as the two MRs lay their guest pages out:
/// the one copy a device that places straight from the sender's memory
/// makes, over the same buffers, with vm-memory's volatile copy (which
/// also marks B's pages dirty). Over pages with a gap after each
/// (`PageLayout::Scattered`) the CPU's prefetch stops at every page, so
/// this runs at about 0.7x the contiguous memcpy on this VM.
fn pages_bandwidth(pair: &Pair, len: usize, count: usize) -> f64 {
    use vm_memory::{GuestAddress, GuestMemoryBackend};
    let n = len.div_ceil(4096);
    assert!(
        pair.a.pages.len() >= n && pair.b.pages.len() >= n,
        "the MRs hold it"
    );
    let (a, b) = (&pair.a.sim.mem, &pair.b.sim.mem);
    let copy = || {
        let mut left = len;
        for (&from, &to) in pair.a.pages.iter().zip(&pair.b.pages).take(n) {
            let n = left.min(4096);
            let src = a.get_slice(GuestAddress(from), n).expect("A's page");
            src.copy_to_volatile_slice(b.get_slice(GuestAddress(to), n).expect("B's page"));
            left -= n;
        }
    };
    copy();
    let t0 = Instant::now();
    for _ in 0..count {
        copy();
        black_box(b);
    }
    (count * len) as f64 / t0.elapsed().as_secs_f64()
}

/// How the two threads of the eventfd baseline wait for each other's
/// signal, for [`eventfd_latency`].
#[derive(Clone, Copy)]
enum Handoff {
    /// Blocked in `read`, wherever the scheduler puts them: on this VM
    /// either about 2 us (the woken thread runs on the writer's CPU, or on
    /// a busy one) or 20-30 us (an idle vCPU has to be woken), from run to
    /// run.
    Blocked,
    /// Blocked in `read`, both pinned to one CPU: every wake-up is the
    /// same-CPU switch, never an idle vCPU's wake-up.
    SameCpu,
    /// Never blocked: each polls its non-blocking eventfd, yielding the
    /// CPU between looks, as the device's workers busy-poll.
    Polled,
}

/// Pins the calling thread to `cpu`; returns the CPU set it had.
fn pin_to(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data, all zero is an empty set; the
    // calls get its size and write only the set passed.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        assert_eq!(libc::sched_getaffinity(0, size, &mut old), 0);
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size, &set),
            0,
            "pin to CPU {cpu}"
        );
        old
    }
}

/// One way of an eventfd ping-pong between two threads that wait as
/// `how` says.
fn eventfd_latency(how: Handoff) -> Duration {
    let flags = match how {
        Handoff::Polled => EFD_NONBLOCK,
        Handoff::Blocked | Handoff::SameCpu => 0,
    };
    let (ping, pong) = (EventFd::new(flags).unwrap(), EventFd::new(flags).unwrap());
    let (ping2, pong2) = (ping.try_clone().unwrap(), pong.try_clone().unwrap());
    let wait = move |e: &EventFd| {
        while e.read().is_err() {
            std::thread::yield_now();
        }
    };
    // SAFETY: sched_getcpu takes no argument.
    let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).expect("a CPU");
    let pinned = matches!(how, Handoff::SameCpu).then(|| pin_to(cpu));
    let echo = std::thread::spawn(move || {
        if pinned.is_some() {
            pin_to(cpu);
        }
        for _ in 0..PINGS {
            wait(&ping2);
            pong2.write(1).unwrap();
        }
    });
    let mut samples = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let t0 = Instant::now();
        ping.write(1).unwrap();
        wait(&pong);
        samples.push(t0.elapsed() / 2);
    }
    echo.join().unwrap();
    if let Some(old) = pinned {
        // SAFETY: `old` is the set this thread had, of the size passed.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&old), &old) };
        assert_eq!(rc, 0, "unpin");
    }
    median(samples)
}

/// One thread's scheduler account (`/proc/self/task/TID/schedstat`):
/// nanoseconds on a CPU and runnable but waiting for one.
#[derive(Clone, Copy, Default)]
struct Sched {
    run: u64,
    wait: u64,
}

impl Sched {
    fn of(tid: libc::pid_t) -> Self {
        let s =
            std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).expect("schedstat");
        let mut f = s.split_whitespace().map(|x| x.parse::<u64>().expect("ns"));
        Sched {
            run: f.next().expect("run"),
            wait: f.next().expect("wait"),
        }
    }
}

/// The calling thread's id.
fn gettid() -> libc::pid_t {
    // SAFETY: gettid takes no argument and cannot fail.
    unsafe { libc::gettid() }
}

/// The bench's driver (this thread), A's worker and B's worker: the
/// device workers are the threads named `pvrdma`, A's spawned first.
/// A new thread names itself once it runs, so this waits for both.
fn threads() -> [(&'static str, libc::pid_t); 3] {
    let named = || -> Vec<libc::pid_t> {
        let mut tids: Vec<libc::pid_t> = std::fs::read_dir("/proc/self/task")
            .expect("tasks")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|tid| {
                std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
                    .is_ok_and(|c| c.trim() == "pvrdma")
            })
            .collect();
        tids.sort_unstable();
        tids
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut workers = named();
    while workers.len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
        workers = named();
    }
    assert_eq!(workers.len(), 2, "two device workers");
    [
        ("driver", gettid()),
        ("A's worker", workers[0]),
        ("B's worker", workers[1]),
    ]
}

/// `pin=A,B[,D]`: A's and B's workers on host CPUs A and B, as
/// `--pvrdma ...,worker_cpus=` places them (`PvrdmaConfig::worker_cpus`),
/// and the driver (this thread) on D if given.
fn pinned(args: &[String]) -> Option<[Vec<usize>; 2]> {
    let cpus: Vec<usize> = args
        .iter()
        .find_map(|a| a.strip_prefix("pin="))?
        .split(',')
        .map(|c| c.parse().expect("a CPU"))
        .collect();
    assert!(cpus.len() >= 2, "pin=A,B[,D]");
    if let Some(&driver) = cpus.get(2) {
        pin_to(driver);
        println!("driver pinned to CPU {driver}");
    }
    println!("A's worker on CPU {}, B's on CPU {}", cpus[0], cpus[1]);
    Some([vec![cpus[0]], vec![cpus[1]]])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "wire") {
        wire::run(args.iter().any(|a| a == "profile"));
        return;
    }
    let dir = std::env::temp_dir().join(format!("pvrdma-bench-{}", std::process::id()));
    // `poll=US` sets the workers' busy-poll (`PvrdmaConfig::busy_poll`).
    let busy_poll = args
        .iter()
        .find_map(|a| a.strip_prefix("poll=")?.parse().ok())
        .map_or(pvrdma::DEFAULT_BUSY_POLL, Duration::from_micros);
    println!("workers busy-poll for {} us", busy_poll.as_micros());
    // `share=on|both`: pairs with `share_memory` (see the module doc).
    let shares: &[bool] = match args.iter().find_map(|a| a.strip_prefix("share=")) {
        Some("on") => &[true],
        Some("both") => &[false, true],
        _ => &[false],
    };
    let rewrite = args.iter().any(|a| a == "rewrite");
    println!("share_memory {shares:?}, source rewritten before each post: {rewrite}");
    // `depth=N` and `cq_mod=N`: perftest's `--tx-depth` and `--cq-mod`.
    let arg = |name: &str| args.iter().find_map(|a| a.strip_prefix(name)?.parse().ok());
    let depth: usize = arg("depth=").filter(|&d| d > 0).unwrap_or(DEPTH);
    let cq_mod: usize = arg("cq_mod=").filter(|&m| m > 0).unwrap_or(1);
    println!("{depth} work requests in flight in all, one in {cq_mod} of a QP's signaled");
    // `pages=contiguous`: the MRs' pages follow each other (a guest's
    // huge page) instead of each having a gap after it.
    let layout = if args.iter().any(|a| a == "pages=contiguous") {
        PageLayout::Contiguous
    } else {
        PageLayout::Scattered
    };
    println!("MR pages {layout:?}");
    let workers = pinned(&args).unwrap_or_default();
    let pairs: Vec<(&str, Pair)> = shares
        .iter()
        .map(|&share| {
            let name = if share { "share" } else { "copy" };
            let config = PvrdmaConfig {
                local_dir: Some(dir.join(name)),
                busy_poll,
                share_memory: share,
                ..PvrdmaConfig::default()
            };
            let [on_a, on_b] = workers.clone();
            let config_of = |worker_cpus| PvrdmaConfig {
                worker_cpus,
                ..config.clone()
            };
            let mut pair = Pair::new(&config_of(on_a), &config_of(on_b), layout);
            pair.rewrite = rewrite;
            pair.depth = depth;
            pair.cq_mod = cq_mod;
            // The first frames go before the peer took the ring (and the
            // view): not what is measured.
            pair.transfer(wr::RDMA_WRITE, 4096, QPS, 256, Reap::Poll);
            pair.transfer(wr::RDMA_READ, 4096, QPS, 256, Reap::Poll);
            (name, pair)
        })
        .collect();
    let pair = &pairs[0].1;
    let parts = ["bandwidth", "rate", "latency", "profile"];
    let chosen: Vec<String> = std::env::args()
        .filter(|a| parts.contains(&a.as_str()))
        .collect();
    let run = |part: &str| chosen.is_empty() || chosen.iter().any(|c| c == part);
    if chosen.iter().any(|c| c == "profile") {
        // `op=read|send`, `len=KIB` and `count=N` pick another stream to
        // profile.
        let (name, op) = match args.iter().find_map(|a| a.strip_prefix("op=")) {
            Some("read") => ("READ", wr::RDMA_READ),
            Some("send") => ("SEND", wr::SEND),
            _ => ("WRITE", wr::RDMA_WRITE),
        };
        let count: u32 = args
            .iter()
            .find_map(|a| a.strip_prefix("count=")?.parse().ok())
            .unwrap_or(512);
        let kib: u32 = args
            .iter()
            .find_map(|a| a.strip_prefix("len=")?.parse().ok())
            .filter(|&k| (1..=1024).contains(&k))
            .unwrap_or(64);
        // `cq=sleep`: the driver sleeps on its CQ's interrupt.
        let reap = match args.iter().find_map(|a| a.strip_prefix("cq=")) {
            Some("sleep") => Reap::Sleep,
            _ => Reap::Poll,
        };
        let before = pair.counters();
        let threads = threads();
        let sched0 = threads.map(|(_, tid)| Sched::of(tid));
        let t = pair.transfer(op, kib << 10, 1, count as usize, reap);
        let sched1 = threads.map(|(_, tid)| Sched::of(tid));
        let rate = f64::from(count) * f64::from(kib << 10) / t.as_secs_f64();
        println!(
            "{name} {kib} KiB, 1 QP, {count} once, CQ {}: {:.0} MiB/s",
            reap.name(),
            mib(rate)
        );
        println!("per {name}, A / B:");
        for ((name, a0, b0), (_, a1, b1)) in before.iter().zip(pair.counters()) {
            let per = |x: u64, x0: &u64| (x - x0) as f64 / f64::from(count);
            println!("  {name:<18} {:.2} / {:.2}", per(a1, a0), per(b1, b0));
        }
        let us = |ns: u64| ns as f64 / 1e3 / f64::from(count);
        println!(
            "per {name}, us: {:.2} wall; on a CPU / runnable, waiting for one:",
            t.as_secs_f64() * 1e6 / f64::from(count)
        );
        for (((thread, _), s0), s1) in threads.iter().zip(sched0).zip(sched1) {
            println!(
                "  {thread:<18} {:.2} / {:.2}",
                us(s1.run - s0.run),
                us(s1.wait - s0.wait)
            );
        }
        drop(pairs);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }

    if run("bandwidth") {
        bandwidth(&pairs);
    }
    if run("rate") {
        message_rate(pair);
    }
    if run("latency") {
        latency(pair);
    }
    drop(pairs);
    let _ = std::fs::remove_dir_all(&dir);
}

fn mib(bps: f64) -> f64 {
    bps / f64::from(1u32 << 20)
}

fn bandwidth(pairs: &[(&str, Pair)]) {
    println!(
        "bandwidth, median of {RUNS} runs, {} in flight in all, one in {} signaled; the driver \
         polls its CQs (yielding between polls), and beside it sleeps on their interrupt (runs \
         alternate, and so do the pairs' runs)",
        pairs[0].1.depth, pairs[0].1.cq_mod
    );
    for len in [4u32 << 10, 64 << 10, 1 << 20] {
        let count = (RUN_BYTES / u64::from(len)).max(64) as usize;
        let copy = median(
            (0..RUNS)
                .map(|_| memcpy_bandwidth(len as usize, count))
                .collect(),
        );
        // The same buffers: A's MR pages into B's, as laid out.
        let pages = median(
            (0..RUNS)
                .map(|_| pages_bandwidth(&pairs[0].1, len as usize, count))
                .collect(),
        );
        println!(
            "  memcpy {:>4} KiB, one core: {:>8.0} MiB/s  | over the MRs' pages: {:>8.0} MiB/s",
            len >> 10,
            mib(copy),
            mib(pages)
        );
        for (name, op) in [
            ("WRITE", wr::RDMA_WRITE),
            ("READ", wr::RDMA_READ),
            ("SEND", wr::SEND),
        ] {
            for qps in [1, QPS] {
                let events = |p: &Pair| {
                    let names = [
                        "roce_local_copied",
                        "roce_local_kicks",
                        "roce_local_described",
                    ];
                    names.map(|n| p.both(n))
                };
                let before: Vec<_> = pairs.iter().map(|(_, p)| events(p)).collect();
                // The two modes' runs (and the pairs') alternate, so that
                // all see the same minutes of the machine.
                let mut rates = vec![[Vec::new(), Vec::new()]; pairs.len()];
                for _ in 0..RUNS {
                    for ((_, pair), rates) in pairs.iter().zip(rates.iter_mut()) {
                        for (r, reap) in rates.iter_mut().zip([Reap::Poll, Reap::Sleep]) {
                            let t = pair.transfer(op, len, qps, count, reap);
                            r.push((count as f64 * f64::from(len)) / t.as_secs_f64());
                        }
                    }
                }
                for (((label, pair), rates), before) in pairs.iter().zip(rates).zip(before) {
                    let [poll, sleep] = rates.map(median);
                    let [copied, kicked, described] = events(pair);
                    let per = |x: u64, x0: u64| (x - x0) as f64 / (2 * RUNS * count) as f64;
                    println!(
                        "  {name:<5} {:>4} KiB, {qps:>2} QP, {label:<5}: {:>8.0} MiB/s  ratio to \
                         memcpy {:.3}, to the pages' copy {:.3}  | CQ sleep: {:>8.0} MiB/s  {:.3}  \
                         | frames not built in the ring {}  | kicks per message {:.2}  | described \
                         per message {:.2}",
                        len >> 10,
                        mib(poll),
                        poll / copy,
                        poll / pages,
                        mib(sleep),
                        sleep / copy,
                        copied - before[0],
                        per(kicked, before[1]),
                        per(described, before[2]),
                    );
                }
            }
        }
    }
    for (_, pair) in pairs {
        let a = &pair.a.sim;
        assert!(a.metric("roce_local_tx") > 0 && a.metric("roce_tx") == 0);
    }
}

fn message_rate(pair: &Pair) {
    println!("64-byte SEND message rate, median of {RUNS} runs");
    for qps in [1, QPS] {
        let count = 20_000;
        let rate = median(
            (0..RUNS)
                .map(|_| {
                    let t = pair.transfer(wr::SEND, 64, qps, count, Reap::Poll);
                    count as f64 / t.as_secs_f64()
                })
                .collect(),
        );
        println!("  {qps:>2} QP: {rate:>9.0} messages/s");
    }
}

/// Runs of the eventfd baselines and of the RDMA ping alternate, so that
/// each ratio compares measurements taken a moment apart. Three
/// baselines ([`Handoff`]): the blocked hand-off swings between its two
/// modes from run to run on this VM; the pinned one is the blocked
/// hand-off without an idle vCPU's wake-up; the polled one is the
/// hand-off between two threads that poll as the busy-polling workers do.
fn latency(pair: &Pair) {
    let kicks = || pair.both("roce_local_kicks");
    let kicked = kicks();
    let baselines = [
        ("eventfd, blocked", Handoff::Blocked),
        ("eventfd, blocked, one CPU", Handoff::SameCpu),
        ("eventfd, polled", Handoff::Polled),
    ];
    let mut lat = Vec::new();
    let mut base = vec![Vec::new(); baselines.len()];
    let mut ratio = vec![Vec::new(); baselines.len()];
    for _ in 0..RUNS {
        let e: Vec<f64> = baselines
            .iter()
            .map(|&(_, how)| eventfd_latency(how).as_secs_f64() * 1e6)
            .collect();
        let l = pair.write_latency().as_secs_f64() * 1e6;
        lat.push(l);
        for (k, e) in e.into_iter().enumerate() {
            base[k].push(e);
            ratio[k].push(l / e);
        }
    }
    let each = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("latency, median of {RUNS} runs of {PINGS}, the baselines' runs interleaved");
    println!(
        "  8-byte WRITE_WITH_IMM post -> peer's CQE: {:>5.1} us  ({})",
        median(lat.clone()),
        each(&lat)
    );
    for (k, (name, _)) in baselines.iter().enumerate() {
        println!(
            "  one-way {name:<26} {:>5.1} us  ({}); ratio {:.1} ({})",
            median(base[k].clone()),
            each(&base[k]),
            median(ratio[k].clone()),
            each(&ratio[k])
        );
    }
    // A kick wakes a worker that slept: busy-polling workers need few.
    let pings = (RUNS * PINGS) as f64;
    println!(
        "  same-host kicks per ping, both devices:   {:.2}",
        (kicks() - kicked) as f64 / pings
    );
}

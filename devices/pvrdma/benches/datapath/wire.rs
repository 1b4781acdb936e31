// SPDX-License-Identifier: Apache-2.0
//! The wire path (`local=off`) over a real kernel link, against a plain
//! UDP stream over the same link in the same run (issue 15, goal 3).
//!
//! The bench first moves into a network namespace of its own
//! (`unshare(CLONE_NEWNET)`, before any thread starts), so what it
//! creates there goes away with the process however it ends (a panic,
//! a kill): the bridge `br0`, the devices' TAPs and the baseline's veth
//! pairs. In it:
//!
//! - two devices with a TAP each as their port's backend (`pvra`,
//!   `pvrb`, both on `br0`), and one thread per TAP that reads it and
//!   offers each frame to the device's port, as the NIC's worker does in
//!   the VMM (vmxnet3 `handle_backend`);
//! - the baseline: a UDP sender and a UDP receiver thread, each in a
//!   network namespace of its own joined to `br0` by a veth pair,
//!   `send`ing and `recv`ing datagrams of the path MTU, flat out; its
//!   figure is what the receiver got per second.
//!
//! RDMA WRITEs of 64 KiB (16 in flight on one QP) and the same bytes in
//! UDP datagrams of the path MTU's payload, at Ethernet MTU 1500 (path
//! MTU 1024) and 9000 (4096), the runs of the two interleaved; medians
//! of [`RUNS`]. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and `ip`.

use std::io;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use net_port::{FrameBackend, Port, Tap, VnetHdr, MAX_FRAME_LEN};
use pvrdma::sim_driver::endpoint::{MAC_A, MAC_B};
use pvrdma::sim_driver::ib::wr;
use pvrdma::sim_driver::{PageLayout, RcPath, SimDriver};
use pvrdma::PvrdmaConfig;

use crate::{median, mib, Pair, Reap, RUNS, RUN_BYTES};

/// The RDMA message of the comparison.
const MSG: u32 = 64 << 10;
/// The baseline's receiver port.
const UDP_PORT: u16 = 7000;

/// Runs `ip` with `args`, which must succeed.
fn ip(args: &str) {
    let status = Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .expect("run ip (iproute2)");
    assert!(status.success(), "ip {args}: {status}");
}

/// Moves the calling thread (and the threads and processes it starts
/// afterwards) into a new network namespace.
fn unshare_net() {
    // SAFETY: unshare takes no pointers.
    let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(
        r,
        0,
        "unshare(CLONE_NEWNET): {} (the wire bench needs root)",
        io::Error::last_os_error()
    );
}

/// Reads a TAP and offers its frames to a port, as the NIC's worker does.
struct Pump {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Pump {
    fn start(tap: Arc<Tap>, port: Arc<Port>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; MAX_FRAME_LEN];
            let mut pfd = libc::pollfd {
                fd: tap.rx_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            while !stopped.load(Ordering::Relaxed) {
                // SAFETY: one pollfd, which outlives the call.
                unsafe { libc::poll(&mut pfd, 1, 50) };
                while let Some((hdr, len)) = tap.recv(&mut buf).expect("TAP read") {
                    if hdr.is_plain() {
                        port.steer_to_rdma(&buf[..len]);
                    }
                }
            }
        });
        Pump {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("pump thread");
        }
    }
}

/// Two devices whose ports are TAPs on `br0`, their QPs connected.
struct WirePair {
    pair: Pair,
    _pumps: [Pump; 2],
}

impl WirePair {
    fn new(mtu: u16, path_mtu: u8) -> Self {
        // No same-host channel: every frame takes the TAP.
        let config = PvrdmaConfig::default();
        let side = |name: &str, mac| {
            let tap = Arc::new(Tap::open(name).expect("TAP"));
            ip(&format!("link set {name} mtu {mtu} master br0 up"));
            let sim = SimDriver::with_backend(&config, mac, tap.clone());
            sim.port.set_mtu(mtu);
            let pump = Pump::start(tap, sim.port.clone());
            (sim, pump)
        };
        let (a, pa) = side("pvra", MAC_A);
        let (b, pb) = side("pvrb", MAC_B);
        let path = RcPath {
            path_mtu,
            ..RcPath::default()
        };
        WirePair {
            pair: Pair::connected(a, b, path, PageLayout::Scattered),
            _pumps: [pa, pb],
        }
    }
}

/// A thread in a network namespace of its own, joined to `br0` by the
/// veth pair `veth` (its end, with `addr`/24) and `{veth}0` (on `br0`).
fn spawn_in_netns(veth: &'static str, addr: &'static str, mtu: u16, body: Body) -> JoinHandle<()> {
    let (ready, wait) = mpsc::channel();
    let (go, start) = mpsc::channel::<()>();
    let pid = std::process::id();
    let thread = std::thread::spawn(move || {
        unshare_net();
        // The peer end lands in the namespace of the bench's main thread.
        ip(&format!(
            "link add {veth} mtu {mtu} type veth peer name {veth}0 netns {pid}"
        ));
        ip(&format!("addr add {addr}/24 dev {veth}"));
        ip(&format!("link set {veth} up"));
        ready.send(()).expect("main thread");
        start.recv().expect("main thread");
        body()
    });
    wait.recv().expect("veth set up");
    ip(&format!("link set {veth}0 mtu {mtu} master br0 up"));
    go.send(()).expect("thread");
    thread
}

/// What a baseline's receiver got in one run.
struct Received {
    datagrams: usize,
    /// From the first datagram to the last.
    elapsed: Duration,
}

/// A baseline stream: a sender and a receiver thread, told what to do
/// over channels. The receiver's closure gives the length of the next
/// datagram for it, or `None` after 300 ms without one; the sender's
/// sends one (a full queue on the way drops it: the receiver counts).
/// Before the first run, the sender sends 1-byte warm-up datagrams
/// until the receiver got one (the path is up and resolved).
struct Stream {
    size: usize,
    send: mpsc::Sender<usize>,
    expect: mpsc::Sender<usize>,
    got: mpsc::Receiver<Received>,
    threads: Vec<JoinHandle<()>>,
}

type Body = Box<dyn FnOnce() + Send>;

impl Stream {
    /// `spawn` starts each end's thread; `receiver` and `sender` run in
    /// them and return the end's closure.
    fn new<R, S>(
        size: usize,
        spawn: impl Fn(&'static str, Body) -> JoinHandle<()>,
        receiver: impl FnOnce() -> R + Send + 'static,
        sender: impl FnOnce() -> S + Send + 'static,
    ) -> Self
    where
        R: FnMut(&mut [u8]) -> Option<usize>,
        S: FnMut(&[u8]),
    {
        let (expect, expected) = mpsc::channel::<usize>();
        let (report, got) = mpsc::channel();
        let heard = Arc::new(AtomicBool::new(false));
        let heard_rx = heard.clone();
        let rx = spawn(
            "rx",
            Box::new(move || {
                let mut recv = receiver();
                let mut buf = vec![0u8; MAX_FRAME_LEN];
                while !heard_rx.load(Ordering::Relaxed) {
                    if recv(&mut buf) == Some(1) {
                        heard_rx.store(true, Ordering::Relaxed);
                    }
                }
                for count in expected {
                    let (mut n, mut first, mut last) = (0, None, Instant::now());
                    while n < count {
                        match recv(&mut buf) {
                            Some(len) if len == size => {
                                last = Instant::now();
                                first.get_or_insert(last);
                                n += 1;
                            }
                            Some(_) => {}
                            None => break, // the rest was dropped
                        }
                    }
                    let elapsed = first.map_or(Duration::ZERO, |f| last - f);
                    report
                        .send(Received {
                            datagrams: n,
                            elapsed,
                        })
                        .expect("main thread");
                }
            }),
        );
        let (send, to_send) = mpsc::channel::<usize>();
        let tx = spawn(
            "tx",
            Box::new(move || {
                let mut send = sender();
                let deadline = Instant::now() + Duration::from_secs(10);
                while !heard.load(Ordering::Relaxed) {
                    send(&[0]);
                    std::thread::sleep(Duration::from_millis(20));
                    assert!(Instant::now() < deadline, "nothing through br0 in 10 s");
                }
                let data = vec![0x5au8; size];
                for count in to_send {
                    for _ in 0..count {
                        send(&data);
                    }
                }
            }),
        );
        Stream {
            size,
            send,
            expect,
            got,
            threads: vec![rx, tx],
        }
    }

    /// Streams `count` datagrams; bytes per second received, and the
    /// datagrams lost.
    fn run(&self, count: usize) -> (f64, usize) {
        self.expect.send(count).expect("receiver");
        // Let the receiver block before the stream starts.
        std::thread::sleep(Duration::from_millis(20));
        self.send.send(count).expect("sender");
        let r = self.got.recv().expect("receiver's report");
        let bytes = r.datagrams.saturating_sub(1) * self.size;
        (
            bytes as f64 / r.elapsed.as_secs_f64().max(1e-9),
            count - r.datagrams,
        )
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Closing the channels ends both threads' loops.
        let (send, _) = mpsc::channel();
        let (expect, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.send, send));
        drop(std::mem::replace(&mut self.expect, expect));
        for t in self.threads.drain(..) {
            t.join().expect("stream thread");
        }
    }
}

/// The UDP baseline: `size`-byte datagrams from 10.9.0.1 to 10.9.0.2,
/// each end in a namespace of its own joined to `br0` by a veth pair.
fn udp_stream(mtu: u16, size: usize) -> Stream {
    Stream::new(
        size,
        |end, body| match end {
            "rx" => spawn_in_netns("udpr", "10.9.0.2", mtu, body),
            _ => spawn_in_netns("udps", "10.9.0.1", mtu, body),
        },
        || {
            let sock = UdpSocket::bind(("10.9.0.2", UDP_PORT)).expect("bind");
            big_rcvbuf(&sock);
            sock.set_read_timeout(Some(Duration::from_millis(300)))
                .expect("timeout");
            move |buf: &mut [u8]| sock.recv(buf).ok()
        },
        || {
            let sock = UdpSocket::bind(("10.9.0.1", 0)).expect("bind");
            sock.connect(("10.9.0.2", UDP_PORT)).expect("connect");
            move |data: &[u8]| {
                // Fails until the neighbour is resolved.
                let _ = sock.send(data);
            }
        },
    )
}

/// The floor of the devices' own path: UDP datagrams of `size` bytes in
/// Ethernet frames written into TAP `rawa` and read from TAP `rawb`,
/// both on `br0`, by two threads (the kernel's work per frame of the
/// RDMA runs, without the engine).
fn tap_stream(mtu: u16, size: usize) -> Stream {
    const DST: [u8; 6] = [2, 0, 0, 0, 0, 0x2b];
    const SRC: [u8; 6] = [2, 0, 0, 0, 0, 0x2a];
    /// Ethernet, IPv4 and UDP headers.
    const HDRS: usize = 14 + 20 + 8;
    let open = |name: &str| {
        let tap = Tap::open(name).expect("TAP");
        ip(&format!("link set {name} mtu {mtu} master br0 up"));
        tap
    };
    let (rawa, rawb) = (open("rawa"), open("rawb"));
    // A frame from DST through rawb: the bridge learns where DST is, and
    // forwards the stream to rawb only.
    rawb.send(&VnetHdr::default(), &udp_frame(SRC, DST, 1)[..HDRS + 1])
        .expect("TAP write");
    Stream::new(
        size,
        |_, body| std::thread::spawn(body),
        move || {
            let mut pfd = libc::pollfd {
                fd: rawb.rx_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            move |buf: &mut [u8]| loop {
                match rawb.recv(buf).expect("TAP read") {
                    Some((_, len)) if len > HDRS && buf[..6] == DST => return Some(len - HDRS),
                    Some(_) => {}
                    // SAFETY: one pollfd, which outlives the call.
                    None if unsafe { libc::poll(&mut pfd, 1, 300) } <= 0 => return None,
                    None => {}
                }
            }
        },
        move || {
            let mut frame = Vec::new();
            move |data: &[u8]| {
                if frame.len() != HDRS + data.len() {
                    frame = udp_frame(DST, SRC, data.len());
                }
                // A full queue at rawb drops; the receiver counts.
                let _ = rawa.send(&VnetHdr::default(), &frame);
            }
        },
    )
}

/// An Ethernet frame from `src` to `dst` with an IPv4 UDP datagram of
/// `len` payload bytes (no UDP checksum; br_netfilter, where loaded,
/// drops IPv4 headers with a wrong one).
fn udp_frame(dst: [u8; 6], src: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(42 + len);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x00]);
    let total = u16::try_from(28 + len).expect("fits an IP datagram");
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 10, 9, 1, 1, 10, 9, 1, 2]);
    let sum = f[14..34]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let sum = !((sum & 0xffff) + (sum >> 16)) as u16;
    f[24..26].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&[0x1b, 0x58, 0x1b, 0x58]);
    f.extend_from_slice(&(total - 20).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.resize(42 + len, 0x5a);
    f
}

/// A receive buffer that holds a whole run (root may exceed rmem_max).
fn big_rcvbuf(sock: &UdpSocket) {
    let size: libc::c_int = 32 << 20;
    // SAFETY: the option value is one int that outlives the call.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            std::ptr::from_ref(&size).cast(),
            std::mem::size_of_val(&size) as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_RCVBUFFORCE: {}", io::Error::last_os_error());
}

/// `cargo bench -p pvrdma --bench datapath -- wire`; with `profile`, one
/// run of 512 WRITEs at MTU 9000 and no baseline (for callgrind).
pub fn run(profile: bool) {
    unshare_net();
    ip("link set lo up");
    ip("link add br0 type bridge");
    ip("link set br0 up");
    let count = (RUN_BYTES / u64::from(MSG)) as usize;
    println!("wire path (TAPs on a bridge) against a UDP stream over the same bridge, median of {RUNS} runs");
    for (mtu, path_mtu) in [(1500u16, 3u8), (9000, 5)] {
        if profile && mtu != 9000 {
            continue;
        }
        let size = 128usize << path_mtu;
        let wire = WirePair::new(mtu, path_mtu);
        let transfer = |count| {
            let t = wire
                .pair
                .transfer(wr::RDMA_WRITE, MSG, 1, count, Reap::Poll);
            (count as f64 * f64::from(MSG)) / t.as_secs_f64()
        };
        if profile {
            let rate = transfer(512);
            println!("  WRITE 64 KiB, MTU {mtu}, once: {:.0} MiB/s", mib(rate));
            return;
        }
        let (udp, tap) = (udp_stream(mtu, size), tap_stream(mtu, size));
        let datagrams = count * MSG as usize / size;
        let (mut rdma, mut plain, mut lost) = (Vec::new(), Vec::new(), 0);
        let (mut raw, mut raw_lost) = (Vec::new(), 0);
        for _ in 0..RUNS {
            rdma.push(transfer(count));
            let (rate, l) = udp.run(datagrams);
            plain.push(rate);
            lost += l;
            let (rate, l) = tap.run(datagrams);
            raw.push(rate);
            raw_lost += l;
        }
        let (a, b) = (&wire.pair.a.sim, &wire.pair.b.sim);
        assert_eq!(a.metric("roce_local_tx"), 0, "all on the wire");
        let per_write = |n: u64| n as f64 / (RUNS * count) as f64;
        let frames = per_write(a.metric("roce_tx"));
        let acks = per_write(b.metric("roce_tx"));
        let dropped = a.metric("roce_rx_dropped") + b.metric("roce_rx_dropped");
        let (rdma, plain, raw) = (median(rdma), median(plain), median(raw));
        println!("  MTU {mtu} (path MTU {size}):");
        println!(
            "    RDMA WRITE 64 KiB, 1 QP: {:>7.0} MiB/s  ({frames:.1} frames per WRITE, {} ideal; \
             {acks:.1} ACKs; {dropped} frames dropped at an inbox)",
            mib(rdma),
            MSG as usize / size
        );
        println!(
            "    UDP {size}-byte datagrams:  {:>7.0} MiB/s  ({lost} of {} lost)",
            mib(plain),
            RUNS * datagrams
        );
        println!(
            "    UDP frames, TAP to TAP:  {:>7.0} MiB/s  ({raw_lost} of {} lost)",
            mib(raw),
            RUNS * datagrams
        );
        println!("    ratio RDMA / UDP stream:        {:.2}", rdma / plain);
        println!("    ratio RDMA / TAP-to-TAP frames: {:.2}", rdma / raw);
    }
}

// SPDX-License-Identifier: Apache-2.0
//! What TLS costs a migration stream (issue 17): 512 MiB through the
//! migration transport over loopback TCP, plain and TLS 1.3 (mutual
//! authentication, handshake included), from the connecting end (the
//! source) to the accepting one and back; medians of several runs, in the
//! same process. Run: `cargo bench -p vm-migration --features test-pki --bench transport`.

use std::time::{Duration, Instant};

use vm_migration::stream::Stream;
use vm_migration::test_pki;
use vm_migration::tls::{TlsClient, TlsServer};
use vm_migration::transport::{Listener, MigrationUrl};

const BYTES: usize = 512 << 20;
const CHUNK: usize = 1 << 20;
const RUNS: usize = 5;

fn send(s: &mut dyn Stream) {
    let buf = vec![0x5au8; CHUNK];
    for _ in 0..BYTES / CHUNK {
        s.write_all(&buf).expect("write");
    }
    s.flush().expect("flush");
    // The receiver's one-byte answer: the time covers delivery.
    s.read_exact(&mut [0u8; 1]).expect("answer");
}

fn receive(s: &mut dyn Stream) {
    let mut buf = vec![0u8; CHUNK];
    for _ in 0..BYTES / CHUNK {
        s.read_exact(&mut buf).expect("read");
    }
    s.write_all(&[1]).expect("answer");
    s.flush().expect("flush");
}

/// One transfer: connect, then `BYTES` from the source to the destination
/// (`forward`) or back.
fn run(tls: Option<(&TlsClient, &TlsServer)>, forward: bool) -> Duration {
    let listener = MigrationUrl::Tcp("127.0.0.1:0".into())
        .listen(tls.map(|(_, server)| server.clone()))
        .expect("listen");
    let Listener::Tcp(tcp, _) = &listener else {
        unreachable!()
    };
    let url = MigrationUrl::Tcp(tcp.local_addr().expect("addr").to_string());
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        let source = scope.spawn(|| {
            let mut s = url.connect(tls.map(|(client, _)| client)).expect("connect");
            if forward {
                send(&mut *s)
            } else {
                receive(&mut *s)
            }
        });
        let mut s = listener.accept().expect("accept");
        if forward {
            receive(&mut *s)
        } else {
            send(&mut *s)
        }
        source.join().expect("source");
    });
    t0.elapsed()
}

fn median(mut runs: Vec<Duration>) -> Duration {
    runs.sort();
    runs[runs.len() / 2]
}

fn main() {
    let dir = std::env::temp_dir().join(format!("transport-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let pki = test_pki::make(&dir, "bench");
    let client = pki.source.client().expect("client");
    let server = pki.destination.server().expect("server");
    println!("{} MiB over loopback, median of {RUNS} runs", BYTES >> 20);
    println!("transport   direction               time      throughput");
    for (name, tls) in [("plain TCP", None), ("TLS 1.3", Some((&client, &server)))] {
        for (direction, forward) in [
            ("source -> destination", true),
            ("destination -> source", false),
        ] {
            let t = median((0..RUNS).map(|_| run(tls, forward)).collect());
            println!(
                "{name:<11} {direction:<23} {:>6} ms  {:>7.0} MiB/s",
                t.as_millis(),
                (BYTES >> 20) as f64 / t.as_secs_f64()
            );
        }
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

// SPDX-License-Identifier: Apache-2.0
//! End to end: the peers of a live-migrated guest (issue 6). Guest B migrates twice, each time
//! busy with a different peer:
//! 1. Linux Soft-RoCE on the test host, an unmodified RoCE v2 endpoint, runs the servers of
//!    `ibv_rc_pingpong -c` and `rping -V`; both must finish with their data checked.
//! 2. Guest A streams RDMA WRITEs into B's memory (`pvrdma-write-check`) while B's CPU rewrites
//!    memory of its own; every round is verified on B by checksum and pattern, before, during
//!    and after the migration. A page that dirty tracking missed (device or CPU) fails a round.
//!    A and B have `share_memory=on` (issue 15): the WRITEs' payloads are placed from A's memory
//!    (a view of it that B2, then B3, must map from the ring A hands over to each).
//!
//! All tests share ONE run of `tests/scenarios/migration-peers.sh` in the test host.

use std::sync::OnceLock;
use std::time::Duration;

use e2e::steps::device_counters;
use e2e::suite::{self, Checks, RemoteSuite, SetupError};
use e2e::testhost::Hosts;

fn suite() -> &'static RemoteSuite {
    static SUITE: OnceLock<Result<RemoteSuite, SetupError>> = OnceLock::new();
    suite::shared(&SUITE, || {
        // Typically ~6 min: two boots, two 512 MiB migrations at TCG speed, the traffic.
        RemoteSuite::run(
            "migration-peers",
            Duration::from_secs(1200),
            Hosts::One { l1_cpus: 1 },
            LOGS,
        )
    })
}

const LOGS: &[&str] = &[
    "peers-a-serial.log",
    "peers-b-serial.log",
    "peers-b2-serial.log",
    "peers-b3-serial.log",
    "peers-rxe-pp.log",
    "peers-rxe-rping.log",
    "peers-a-vmm.log",
    "peers-b-vmm.log",
    "peers-b2-vmm.log",
    "peers-b3-vmm.log",
    "peers-b-to-b2-remote.log",
    "peers-b2-to-b3-remote.log",
];

#[test]
fn a_soft_roce_peer_does_not_notice_the_migration() {
    let s = suite();
    s.expect_value("rxe_setup", "1");
    if s.get("rxe_gid_index").is_none_or(|v| v == "none") {
        s.fail("Soft-RoCE's port never became active with the bridge's RoCE v2 GID");
    }
    s.expect_value("b2_receive_rc", "0");
    s.expect_value("b2_send_rc", "0");
    s.expect_value("b_exit", "0");
    // The servers on Soft-RoCE's side, then the clients in B (finished on B2).
    s.expect_value("rxe_pp_rc", "0");
    s.expect_value("rxe_rping_rc", "0");
    if !s
        .text("peers-b2-serial.log")
        .contains("MIGPEER-RXE-DONE pp_rc=0 rping_rc=0")
    {
        s.fail("B's ibv_rc_pingpong or rping against Soft-RoCE did not finish on B2");
    }
    if !s.text("peers-b-serial.log").contains("MIGPEER-TRAFFIC") {
        s.fail("B's traffic towards Soft-RoCE never started before the migration");
    }
    let done = s.text("peers-b-to-b2-remote.log");
    if let Some(l) = done.lines().find(|l| l.starts_with("migration completed:")) {
        e2e::announce(&format!("migration with a Soft-RoCE peer: {l}"));
    }
}

#[test]
fn memory_written_by_the_device_and_the_cpu_arrives_intact() {
    let s = suite();
    s.expect_value("b3_receive_rc", "0");
    s.expect_value("b3_send_rc", "0");
    s.expect_value("b2_exit", "0");
    // The stream ran before the migration (on B2) and ended after it (on B3).
    if !s
        .text("peers-b2-serial.log")
        .contains("WRITE-CHECK-CONNECTED")
    {
        s.fail("the RDMA WRITE stream never started on B2");
    }
    for g in ["b2", "b3"] {
        let log = s.text(&format!("peers-{g}-serial.log"));
        if let Some(l) = log.lines().find(|l| l.contains("WRITE-CHECK-FAIL")) {
            s.fail(&format!("a round did not verify on {g}: {l}"));
        }
    }
    let b3 = s.text("peers-b3-serial.log");
    let ok = b3
        .lines()
        .find(|l| l.contains("WRITE-CHECK-OK"))
        .unwrap_or_else(|| s.fail("B3 did not finish the verified stream (no WRITE-CHECK-OK)"));
    let field = |line: &str, key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .map(str::to_string)
    };
    let a = s.text("peers-a-serial.log");
    let sent = a
        .lines()
        .find(|l| l.contains("WRITE-CHECK-SENT"))
        .unwrap_or_else(|| s.fail("A's writer did not finish (no WRITE-CHECK-SENT)"));
    // Both ends agree on the rounds and on the last round's checksum.
    if field(ok, "device_rounds=") != field(sent, "rounds=")
        || field(ok, "checksum=") != field(sent, "checksum=")
    {
        s.fail(&format!("B3 verified '{ok}' but A sent '{sent}'"));
    }
    let rounds: u32 = field(ok, "device_rounds=")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    if rounds < 2 {
        s.fail(&format!(
            "only {rounds} rounds: the stream cannot have spanned the migration"
        ));
    }
    e2e::announce(&format!("migration under an RDMA WRITE stream: {ok}"));
}

/// The stream took the one-copy path on both sides of the second migration: B2 placed WRITEs from
/// A's view, and so did B3 once A handed it a new ring with its view (B2's went with B2).
#[test]
fn the_write_stream_is_placed_from_the_senders_memory_before_and_after_the_migration() {
    let s = suite();
    for g in ["b2", "b3"] {
        let log = s.text(&format!("peers-{g}-vmm.log"));
        let counters = device_counters(&log).unwrap_or_else(|| {
            s.fail(&format!(
                "the VMM of {g} logged no 'pvrdma: counters:' line"
            ))
        });
        let placed = counters
            .get("roce_local_rx_described")
            .copied()
            .unwrap_or(0);
        if placed == 0 {
            s.fail(&format!(
                "{g} placed no described record (share_memory=on on A and B): A's WRITEs \
                 reached it through the ring's copy"
            ));
        }
        e2e::announce(&format!(
            "migration-peers: {g} placed {placed} described records"
        ));
    }
}

/// B's `worker_cpus=[0]` travels with the VM: B2 and B3, which build the device inside their
/// migration thread's seccomp filter, place the worker on CPU 0 too (a filter without
/// `sched_setaffinity` ends them at once) and say so; A, without the option, does not.
#[test]
fn the_workers_host_cpus_travel_with_the_vm() {
    let s = suite();
    const PINNED: &str = "its worker runs on host CPUs [0]";
    for g in ["b", "b2", "b3"] {
        if !s.text(&format!("peers-{g}-vmm.log")).contains(PINNED) {
            s.fail(&format!("the VMM of {g} did not log '{PINNED}'"));
        }
    }
    if s.text("peers-a-vmm.log")
        .contains("its worker runs on host CPUs")
    {
        s.fail("A's VMM placed its worker without worker_cpus=");
    }
}

#[test]
fn both_guests_finish_and_every_vmm_ends_cleanly() {
    let s = suite();
    s.expect_value("a_exit", "0");
    s.expect_value("b3_exit", "0");
    if !s.text("peers-a-serial.log").contains("MIGPEER-OK a") {
        s.fail("guest A did not finish");
    }
    if !s.text("peers-b3-serial.log").contains("MIGPEER-OK b") {
        s.fail("guest B did not finish on B3");
    }
    for g in ["a", "b", "b2", "b3"] {
        s.expect_value(&format!("{g}_panics"), "0");
    }
}

/// The guest kernels that reached power-off logged no WARNING, BUG or Call Trace.
#[test]
fn guest_kernels_log_no_warning_bug_or_trace() {
    suite().expect_clean_guest_kernels();
}

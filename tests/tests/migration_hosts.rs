// SPDX-License-Identifier: Apache-2.0
//! End to end: live migration between two machines (issue 6). Two test hosts joined by a cable
//! (each an L1 with a NIC on one UDP link, bridged to its guests' TAPs): guests A and B run
//! `ibv_rc_pingpong -c` and `rping -V` against each other on host a, and B is migrated over TCP
//! to a VMM on host b mid-run. Both programs must finish with their data checked, now with RoCE v2
//! frames crossing the cable, and B's QPNs and keys must be the same on host b.
//!
//! All tests share ONE run of `tests/scenarios/migration-hosts.sh` on a pair of test hosts.

use std::sync::OnceLock;
use std::time::Duration;

use e2e::results::field;
use e2e::suite::{self, Checks, RemoteSuite, SetupError};
use e2e::testhost::Hosts;

fn suite() -> &'static RemoteSuite {
    static SUITE: OnceLock<Result<RemoteSuite, SetupError>> = OnceLock::new();
    suite::shared(&SUITE, || {
        // Typically ~5 min: two L1 boots side by side, three guest boots, a 256 MiB migration
        // over TLS on the emulated cable, the traffic.
        RemoteSuite::run(
            "migration-hosts",
            Duration::from_secs(1200),
            Hosts::Pair,
            LOGS,
        )
    })
}

const LOGS: &[&str] = &[
    "hosts-a-serial.log",
    "hosts-b-serial.log",
    "hosts-b2-serial.log",
    "hosts-a-vmm.log",
    "hosts-b-vmm.log",
    "hosts-b2-vmm.log",
    "hosts-send-remote.log",
    "hosts-b2-remote.log",
];

#[test]
fn traffic_runs_to_completion_across_the_migration_between_hosts() {
    let s = suite();
    s.expect_value("link_ping", "ok");
    s.expect_value("receive_rc", "0");
    s.expect_value("send_rc", "0");
    s.expect_value("source_exit", "0");
    s.expect_value("a_exit", "0");
    s.expect_value("b2_exit", "0");
    s.expect_demo_across_migration("hosts-a", "hosts-b", "hosts-b2");
}

#[test]
fn queue_pair_numbers_and_keys_survive_the_move() {
    let s = suite();
    let restored = s.expect_same_ids("hosts-b-vmm.log", "hosts-b2-vmm.log");
    s.expect_pingpong_peer_among(&restored, "hosts-a-serial.log");
    e2e::announce(&format!(
        "migration-hosts: B's device on host a and on host b: {restored}"
    ));
}

/// Before the migration A and B share host a (and its same-host channel); after it, every frame
/// between them crosses the cable: B2 sent and received RoCE v2 frames on its TAP and none over
/// a same-host channel, and the cable carried RoCE v2 frames both ways (counted by UDP port 4791
/// on each host's end, so that the migration stream does not count).
#[test]
fn after_the_move_roce_crosses_the_cable() {
    let s = suite();
    let log = s.text("hosts-b2-vmm.log");
    let counters = log
        .lines()
        .find_map(|l| l.split_once("pvrdma: counters:").map(|(_, c)| c))
        .unwrap_or_else(|| s.fail("B2's device logged no counters at exit"));
    // The device logs the counters that moved: a missing one is 0.
    let counter = |name: &str| -> u64 {
        field(counters, name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    for name in ["roce_tx", "roce_rx"] {
        if counter(name) == 0 {
            s.fail(&format!("B2 counted no {name}: {counters}"));
        }
    }
    if counter("roce_local_tx") != 0 || counter("roce_local_rx") != 0 {
        s.fail(&format!(
            "B2 used a same-host channel on a host of its own: {counters}"
        ));
    }
    // Each host counted the RoCE v2 frames (UDP 4791) it sent over the cable: host a A's to B2,
    // host b B2's to A. ibv_rc_pingpong's rounds after the move alone are thousands each way;
    // the migration stream (TCP) is not among them.
    for host in ["a", "b"] {
        s.expect_value(&format!("cable_counter_{host}"), "ok");
    }
    let roce = |key: &str| -> u64 {
        s.get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| s.fail(&format!("no {key} recorded")))
    };
    for (key, what) in [
        ("a_after_roce_tx", "host a sent (A to B2)"),
        ("b_roce_tx", "host b sent (B2 to A)"),
    ] {
        let n = roce(key);
        if n < 1000 {
            s.fail(&format!(
                "{key}={n}: the cable carried almost no RoCE v2 frames {what}"
            ));
        }
    }
    e2e::announce(&format!(
        "migration-hosts: B2's device: roce_tx={} roce_rx={}; RoCE v2 frames on the cable: \
         host a sent {} before the move and {} in all, host b {}",
        counter("roce_tx"),
        counter("roce_rx"),
        roce("a_before_roce_tx"),
        roce("a_after_roce_tx"),
        roce("b_roce_tx")
    ));
}

#[test]
fn remote_reports_the_blackout() {
    let s = suite();
    let done = s
        .text("hosts-send-remote.log")
        .lines()
        .find(|l| l.starts_with("migration completed:"))
        .map(str::to_string)
        .unwrap_or_else(|| s.fail("pvrdma-remote did not report the completion"));
    e2e::announce(&format!("migration-hosts: {done}"));
}

/// Neither a panic nor a syscall outside the thread's seccomp allow-list (issue 7).
#[test]
fn no_vmm_panicked() {
    let s = suite();
    for g in ["a", "b", "b2"] {
        s.expect_value(&format!("{g}_panics"), "0");
    }
}

/// The guest kernels that reached power-off logged no WARNING, BUG or Call Trace.
#[test]
fn guest_kernels_log_no_warning_bug_or_trace() {
    suite().expect_clean_guest_kernels();
}

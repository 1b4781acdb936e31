// SPDX-License-Identifier: Apache-2.0
//! End to end: live migration of a guest whose PVRDMA device carries 4096 busy RC QPs (issue 16
//! goal 3). Guests A and B run `pvrdma-qps-check` (`resources/guest/qps-check.c`) against each
//! other: 4096 RC QPs a side, every QP of B writing rounds of checked data into its peer on A and
//! waiting for the peer's ack. Once every QP has finished a round, B is migrated over TCP to a new
//! VMM process; both programs must finish with every round of every QP verified, and B's QPNs and
//! keys must be the same before and after.
//!
//! Not in `scripts/test.sh`: the set-up of 2 x 4096 QPs at nested TCG speed takes minutes of the
//! test host. Run it alone: `cargo test --release -p e2e --test migration_scale -- --ignored`.
//! All tests share ONE run of `tests/scenarios/migration-scale.sh` in the test host.

use std::sync::OnceLock;
use std::time::Duration;

use e2e::suite::{self, Checks, RemoteSuite, SetupError};
use e2e::testhost::Hosts;

/// The QPs each guest's program runs (the scenario's default).
const QPS: usize = 4096;

fn suite() -> &'static RemoteSuite {
    static SUITE: OnceLock<Result<RemoteSuite, SetupError>> = OnceLock::new();
    suite::shared(&SUITE, || {
        RemoteSuite::run(
            "migration-scale",
            Duration::from_secs(2400),
            Hosts::One { l1_cpus: 1 },
            LOGS,
        )
    })
}

const LOGS: &[&str] = &[
    "migration-scale-a-serial.log",
    "migration-scale-b-serial.log",
    "migration-scale-b2-serial.log",
    "migration-scale-a-vmm.log",
    "migration-scale-b-vmm.log",
    "migration-scale-b2-vmm.log",
    "migration-scale-send-remote.log",
    "migration-scale-b2-remote.log",
];

/// The `QPS-CHECK-OK` line of `log`, or the test fails.
fn ok_line(s: &RemoteSuite, log: &str, side: &str) -> String {
    let text = s.text(log);
    let prefix = format!("QPS-CHECK-OK {side} qps={QPS} ");
    text.lines()
        .find_map(|l| l.find(&prefix).map(|at| l[at..].trim().to_string()))
        .unwrap_or_else(|| s.fail(&format!("{log}: no '{prefix}...' line")))
}

#[test]
#[ignore = "minutes of test host; run with --ignored"]
fn every_qp_carries_checked_data_across_the_migration() {
    let s = suite();
    s.expect_value("running", "yes");
    s.expect_value("receive_rc", "0");
    s.expect_value("send_rc", "0");
    s.expect_value("source_exit", "0");
    s.expect_value("a_exit", "0");
    s.expect_value("b2_exit", "0");
    for g in ["a", "b", "b2"] {
        s.expect_value(&format!("{g}_panics"), "0");
    }
    // B's traffic ran on all its QPs before the migration, and its program finished after it,
    // on the destination, as did A's: every round of every QP verified by A, every ack by B.
    if !s
        .text("migration-scale-b-serial.log")
        .contains(&format!("QPS-CHECK-RUNNING qps={QPS}"))
    {
        s.fail("B's QPs did not all carry a round before the migration");
    }
    let server = ok_line(s, "migration-scale-a-serial.log", "server");
    let client = ok_line(s, "migration-scale-b2-serial.log", "client");
    let log = s.text("migration-scale-send-remote.log");
    let done = log
        .lines()
        .find(|l| l.starts_with("migration completed:"))
        .unwrap_or_else(|| s.fail("pvrdma-remote did not report the completion"));
    e2e::announce(&format!(
        "migration_scale: {QPS} QPs, set-up {} s, migrated {} s after they all ran; {done}; \
         A: {server}; B: {client}",
        s.get("setup_seconds").unwrap_or("?"),
        s.get("migrated_after").unwrap_or("?"),
    ));
    s.expect_clean_guest_kernels();
}

#[test]
#[ignore = "minutes of test host; run with --ignored"]
fn queue_pair_numbers_and_keys_survive() {
    let s = suite();
    let restored = s.expect_same_ids("migration-scale-b-vmm.log", "migration-scale-b2-vmm.log");
    let qpns = suite::qp_count(&restored).unwrap_or(0);
    // The program's QPs, and the GSI QP the kernel keeps.
    if qpns < QPS {
        s.fail(&format!(
            "B's device restored {qpns} QPNs, fewer than {QPS}"
        ));
    }
    e2e::announce(&format!(
        "migration_scale: B's device restored {qpns} QPNs with their keys"
    ));
}

// SPDX-License-Identifier: Apache-2.0
//! End to end: snapshot and restore of two RDMA peers with live queue pairs (issue 6). Guests A
//! and B run `ibv_rc_pingpong -c` and `rping -V` against each other; mid-run both are paused and
//! written out with `vm.snapshot`, their VMMs shut down, and two new VMMs restore them
//! (`--restore`, paused) and resume them. Both programs must finish with their data checked, and
//! each device must restore the QPNs and keys it saved.
//!
//! All tests share ONE run of `tests/scenarios/snapshot.sh` in the test host.

use std::sync::OnceLock;
use std::time::Duration;

use e2e::suite::{self, Checks, RemoteSuite, SetupError};
use e2e::testhost::Hosts;

fn suite() -> &'static RemoteSuite {
    static SUITE: OnceLock<Result<RemoteSuite, SetupError>> = OnceLock::new();
    suite::shared(&SUITE, || {
        // Typically ~4 min: two boots, two 512 MiB snapshots and restores at TCG speed.
        RemoteSuite::run(
            "snapshot",
            Duration::from_secs(1200),
            Hosts::One { l1_cpus: 1 },
            LOGS,
        )
    })
}

const LOGS: &[&str] = &[
    "snapshot-a-serial.log",
    "snapshot-b-serial.log",
    "snapshot-a2-serial.log",
    "snapshot-b2-serial.log",
    "snapshot-a-vmm.log",
    "snapshot-b-vmm.log",
    "snapshot-a2-vmm.log",
    "snapshot-b2-vmm.log",
    "snapshot-remote.log",
];

#[test]
fn traffic_resumes_after_both_peers_are_restored() {
    let s = suite();
    for key in [
        "pause_a_rc",
        "pause_b_rc",
        "snapshot_a_rc",
        "snapshot_b_rc",
        "shutdown_a_rc",
        "shutdown_b_rc",
        "a_exit",
        "b_exit",
        "resume_a_rc",
        "resume_b_rc",
        "a2_exit",
        "b2_exit",
    ] {
        s.expect_value(key, "0");
    }
    if !s.text("snapshot-b-serial.log").contains("DEMO-TRAFFIC") {
        s.fail("B's traffic never started before the snapshot");
    }
    for (log, role) in [
        ("snapshot-a2-serial.log", "server"),
        ("snapshot-b2-serial.log", "client"),
    ] {
        if !s.text(log).contains(&format!("DEMO-OK {role}")) {
            s.fail(&format!(
                "the restored {role}'s ibv_rc_pingpong or rping failed"
            ));
        }
    }
    e2e::announce(&format!(
        "snapshot: two 512 MiB guests written in {} s, restored in {} s",
        s.get("snapshot_seconds").unwrap_or("?"),
        s.get("restore_seconds").unwrap_or("?")
    ));
}

#[test]
fn a_restored_vm_waits_paused_for_resume() {
    let s = suite();
    s.expect_value("restored_state_a", "Paused");
}

/// Each device restores the QPNs and keys it saved, and among them the live QP of the pingpong:
/// the QPN each side's `ibv_rc_pingpong` printed for its peer (when it connected, before the
/// snapshot) is one the peer's restored device serves. The lists alone always hold the GSI QP,
/// so they would match with no user QP at all.
#[test]
fn queue_pair_numbers_and_keys_survive() {
    let s = suite();
    let restored_a = s.expect_same_ids("snapshot-a-vmm.log", "snapshot-a2-vmm.log");
    let restored_b = s.expect_same_ids("snapshot-b-vmm.log", "snapshot-b2-vmm.log");
    // A's pingpong (its output reaches the console when it ends, after the restore) names B's
    // QP, and B's names A's.
    s.expect_pingpong_peer_among(&restored_b, "snapshot-a2-serial.log");
    s.expect_pingpong_peer_among(&restored_a, "snapshot-b2-serial.log");
    e2e::announce(&format!(
        "snapshot: A's device restored {restored_a}, B's {restored_b}"
    ));
}

/// Neither a panic nor a syscall outside the thread's seccomp allow-list (issue 7).
#[test]
fn no_vmm_panicked() {
    let s = suite();
    for g in ["a", "b", "a2", "b2"] {
        s.expect_value(&format!("{g}_panics"), "0");
    }
}

/// The guest kernels that reached power-off logged no WARNING, BUG or Call Trace.
#[test]
fn guest_kernels_log_no_warning_bug_or_trace() {
    suite().expect_clean_guest_kernels();
}

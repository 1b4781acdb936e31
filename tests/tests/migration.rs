// SPDX-License-Identifier: Apache-2.0
//! End to end: live migration over the HTTP API with queue pairs carrying traffic (issue 6).
//! Guests A and B run `ibv_rc_pingpong -c` and `rping -V` against each other (both at once, many
//! rounds). Mid-run, four migrations of B fail before their switch-over (the destination refuses,
//! dies, times out, is cancelled) and each must leave B running; then B is migrated over TCP to a
//! new VMM process with a TAP of its own. Both programs must finish with their data checked, and
//! B's QPNs and keys must be the same before and after. `pvrdma-remote counters` on B's VMM
//! before the migration and on B2's after it must show the traffic and the migrations.
//!
//! All tests share ONE run of `tests/scenarios/migration.sh` in the test host.

use std::sync::OnceLock;
use std::time::Duration;

use api::{DeviceCountersInfo, MigrationDirection, MigrationStatus, VmCounters};
use e2e::suite::{self, Checks, RemoteSuite, SetupError};
use e2e::testhost::Hosts;

fn suite() -> &'static RemoteSuite {
    static SUITE: OnceLock<Result<RemoteSuite, SetupError>> = OnceLock::new();
    suite::shared(&SUITE, || {
        // Typically ~5 min: two boots, four migration attempts and a 512 MiB migration at TCG
        // speed, the traffic.
        RemoteSuite::run(
            "migration",
            Duration::from_secs(1200),
            Hosts::One { l1_cpus: 1 },
            LOGS,
        )
    })
}

const LOGS: &[&str] = &[
    "migration-a-serial.log",
    "migration-b-serial.log",
    "migration-b2-serial.log",
    "migration-a-vmm.log",
    "migration-b-vmm.log",
    "migration-b2-vmm.log",
    "migration-send-remote.log",
    "migration-b2-remote.log",
    "migration-refused-remote.log",
    "migration-bx-vmm.log",
    "migration-by-vmm.log",
    "migration-bz-vmm.log",
    "migration-died-remote.log",
    "migration-timeout-remote.log",
    "migration-cancelled-remote.log",
    "migration-cancel-remote.log",
    "migration-b-counters.json",
    "migration-b2-counters.json",
];

#[test]
fn traffic_runs_to_completion_across_the_migration() {
    let s = suite();
    s.expect_value("receive_rc", "0");
    s.expect_value("send_rc", "0");
    // The source hands over and exits 0; the guest powers off on the destination at the end.
    s.expect_value("source_exit", "0");
    s.expect_value("a_exit", "0");
    s.expect_value("b2_exit", "0");
    s.expect_demo_across_migration("migration-a", "migration-b", "migration-b2");
}

#[test]
fn queue_pair_numbers_and_keys_survive() {
    let s = suite();
    let restored = s.expect_same_ids("migration-b-vmm.log", "migration-b2-vmm.log");
    // A's pingpong printed B's QPN when it connected, before the migration: it must be one of
    // the QPNs the destination serves.
    s.expect_pingpong_peer_among(&restored, "migration-a-serial.log");
    e2e::announce(&format!(
        "migration: B's device before and after: {restored}"
    ));
}

#[test]
fn remote_reports_progress_and_the_blackout() {
    let s = suite();
    let log = s.text("migration-send-remote.log");
    // The remote prints the passes it sees (polling, it may miss one that
    // ended quickly, such as the pass after the later hints).
    if !log
        .lines()
        .any(|l| l.starts_with("pass ") && l.contains(" sent, ") && l.contains("expected downtime"))
    {
        s.fail("pvrdma-remote printed no pre-copy pass");
    }
    let done = log
        .lines()
        .find(|l| l.starts_with("migration completed:"))
        .unwrap_or_else(|| s.fail("pvrdma-remote did not report the completion"));
    e2e::announce(&format!("migration: {done}"));
}

#[test]
fn a_refused_migration_leaves_the_source_running() {
    let s = suite();
    // The destination accepted the request (it listens), then refused the VM at its configuration.
    s.expect_value("refused_receive_rc", "0");
    s.expect_value("refused_send_rc", "1");
    s.expect_value("refused_source_alive", "yes");
    s.expect_value("refused_source_state", "Running");
    s.expect_value("refused_receiver_exit", "0");
    let log = s.text("migration-refused-remote.log");
    if !log.contains("52:54:00:99:99:99") {
        s.fail("the source's error does not say why the destination refused");
    }
}

#[test]
fn a_destination_dying_mid_transfer_leaves_the_source_running() {
    let s = suite();
    s.expect_value("died_send_rc", "1");
    s.expect_value("died_source_state", "Running");
    // It died mid-transfer: memory had reached it, not all of it (its vm.info just before the
    // kill).
    let bytes = |key: &str| -> u64 {
        s.get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| s.fail(&format!("no {key} recorded")))
    };
    let (received, memory) = (bytes("died_received_bytes"), bytes("died_memory_bytes"));
    if received == 0 || received >= memory {
        s.fail(&format!(
            "the destination was killed after receiving {received} of {memory} bytes, not \
             mid-transfer"
        ));
    }
    let log = s.text("migration-died-remote.log");
    if !log.contains("migration failed") {
        s.fail("pvrdma-remote did not report the failed migration");
    }
}

#[test]
fn a_timeout_leaves_the_source_running() {
    let s = suite();
    s.expect_value("timeout_send_rc", "1");
    s.expect_value("timeout_source_state", "Running");
    if !s
        .text("migration-timeout-remote.log")
        .contains("Timed out after 3 s")
    {
        s.fail("the source's error does not name the timeout");
    }
}

/// Also: the receiver that saw the timed-out migration abandoned takes the next request.
#[test]
fn a_cancelled_migration_leaves_the_source_running() {
    let s = suite();
    s.expect_value("rereceive_rc", "0");
    s.expect_value("cancel_rc", "0");
    s.expect_value("cancelled_send_rc", "1");
    s.expect_value("cancelled_source_state", "Running");
    s.expect_value("failures_receiver_exit", "0");
    if !s
        .text("migration-cancelled-remote.log")
        .contains("Cancelled")
    {
        s.fail("the source's error does not say the migration was cancelled");
    }
}

/// Neither a panic nor a syscall outside the thread's seccomp allow-list (issue 7).
/// The restored vmxnet3 announces its MAC (RARP, spaced: devices/vmxnet3/src/announce.rs), the
/// bridge floods those frames to A's TAP, and learns that B's MAC is now behind B2's TAP.
#[test]
fn the_destination_announces_the_mac_and_the_bridge_learns_the_new_port() {
    let s = suite();
    s.expect_value("rarp_before", "0");
    s.expect_value("rarp_after", "4");
    s.expect_value("fdb_b", "tapb2");
}

#[test]
fn no_vmm_panicked() {
    let s = suite();
    for g in ["a", "b", "b2", "bx", "by", "bz"] {
        s.expect_value(&format!("{g}_panics"), "0");
    }
}

/// `pvrdma-remote counters` as saved in `$OUT/migration-NAME-counters.json`.
/// The one device of `kind`, with its PCI address.
fn device<'a>(s: &RemoteSuite, c: &'a VmCounters, kind: &str, pci: &str) -> &'a DeviceCountersInfo {
    let found: Vec<_> = c.devices.iter().filter(|d| d.kind == kind).collect();
    match found.as_slice() {
        [d] if d.pci.ends_with(pci) => d,
        _ => s.fail(&format!("expected one {kind} at {pci}, got {found:?}")),
    }
}

/// B ran pingpong and rping for a while before the counters were read: its PVRDMA function sent
/// and received RoCE frames (over the same-host channel or the wire; A is on this host) and
/// completed work, its NIC carried the programs' TCP set-up, its script disk was read and never
/// written, and the last migration is the cancelled one.
#[test]
fn counters_show_the_traffic_before_the_migration() {
    let s = suite();
    let c = s.counters("b", "migration-b-counters.json");
    let disk = device(s, &c, "virtio-blk", ".0");
    let nic = device(s, &c, "vmxnet3", ".0");
    let rdma = device(s, &c, "pvrdma", ".1");
    if nic.pci.split('.').next() != rdma.pci.split('.').next() {
        s.fail(&format!(
            "NIC {} and PVRDMA {} share no slot",
            nic.pci, rdma.pci
        ));
    }
    // roce_tx counts the wire only, roce_rx both paths (roce_local_rx is its same-host part).
    let sent = s.counter(rdma, "roce_tx") + s.counter(rdma, "roce_local_tx");
    let received = s.counter(rdma, "roce_rx");
    let cqes = s.counter(rdma, "cqe_posted");
    // Every pingpong round trip is a SEND each way and its completions.
    if sent < 100 || received < 100 || cqes < 100 || s.counter(rdma, "doorbell_qp") == 0 {
        s.fail(&format!(
            "PVRDMA counters do not show the traffic: {rdma:?}"
        ));
    }
    let qps = rdma.qps.as_deref().unwrap_or_default();
    if !qps
        .iter()
        .any(|q| !q.error && q.counters.contains_key("completer_retry"))
    {
        s.fail(&format!("no live QP with transport counters: {qps:?}"));
    }
    if s.counter(nic, "tx_frames") == 0 || s.counter(nic, "rx_frames") == 0 {
        s.fail(&format!(
            "vmxnet3 counters do not show the TCP set-up: {nic:?}"
        ));
    }
    if s.counter(disk, "read_requests") == 0 || s.counter(disk, "write_requests") != 0 {
        s.fail(&format!("the read-only script disk: {disk:?}"));
    }
    match &c.migration {
        Some(m)
            if m.direction == MigrationDirection::Send
                && m.status == MigrationStatus::Failed
                && m.error.as_deref().is_some_and(|e| e.contains("Cancelled")) => {}
        other => s.fail(&format!(
            "last migration should be the cancelled one: {other:?}"
        )),
    }
    e2e::announce(&format!(
        "migration: B before its migration: {sent} RoCE frames sent, {received} received, \
         {cqes} CQEs, {} QPs",
        qps.len()
    ));
}

/// B2 right after taking B over: the received migration with its passes and bytes, and the
/// PVRDMA function serving B's restored QPs.
#[test]
fn counters_show_the_received_migration() {
    let s = suite();
    let c = s.counters("b2", "migration-b2-counters.json");
    let rdma = device(s, &c, "pvrdma", ".1");
    if rdma.qps.as_deref().unwrap_or_default().is_empty() {
        s.fail(&format!("B2 serves no restored QP: {rdma:?}"));
    }
    match &c.migration {
        Some(m)
            if m.direction == MigrationDirection::Receive
                && m.status == MigrationStatus::Completed
                && m.pass >= 1
                && m.bytes_transferred > 0 => {}
        other => s.fail(&format!("B2's migration: {other:?}")),
    }
}

/// The guest kernels that reached power-off logged no WARNING, BUG or Call Trace.
#[test]
fn guest_kernels_log_no_warning_bug_or_trace() {
    suite().expect_clean_guest_kernels();
}

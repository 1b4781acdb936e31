// SPDX-License-Identifier: Apache-2.0
//! End to end: two PVRDMA devices per VM (issue 16 goal 4). Two guests with `--pvrdma` twice
//! each (vmw_pvrdma0 on eth0, vmw_pvrdma1 on eth1, each slot on its own TAP, MAC and bridge)
//! run `ibv_rc_pingpong -c` on both devices at once; guest B is live-migrated mid-run. Both
//! programs finish with their data checked, each device's QPNs and keys are unchanged, and
//! `vm.counters` shows both devices, told apart by id and MAC, with traffic.
//!
//! All tests share ONE run of `tests/scenarios/multi-pvrdma.sh` in the test host.

use std::sync::OnceLock;
use std::time::Duration;

use api::DeviceCountersInfo;
use e2e::suite::{self, Checks, RemoteSuite, SetupError};
use e2e::testhost::Hosts;

fn suite() -> &'static RemoteSuite {
    static SUITE: OnceLock<Result<RemoteSuite, SetupError>> = OnceLock::new();
    suite::shared(&SUITE, || {
        // Typically ~4 min: two boots, a 512 MiB migration at TCG speed, 3000 rounds per device.
        RemoteSuite::run(
            "multi-pvrdma",
            Duration::from_secs(1200),
            Hosts::One { l1_cpus: 1 },
            LOGS,
        )
    })
}

const LOGS: &[&str] = &[
    "multi-a-serial.log",
    "multi-b-serial.log",
    "multi-b2-serial.log",
    "multi-a-vmm.log",
    "multi-b-vmm.log",
    "multi-b2-vmm.log",
    "multi-b-to-b2-remote.log",
    "multi-b2-remote.log",
];

/// B's MACs, device 0 then 1 (tests/scenarios/multi-pvrdma.sh).
const MACS_B: [&str; 2] = ["52:54:00:17:00:02", "52:54:00:17:01:02"];
/// The rounds of each pingpong (the scenario's PP_ITERS).
const ITERS: &str = "3000 iters in";

/// Every line of `prefix` in `log` (the device logs one per device, in PCI order).
fn lines_after(s: &RemoteSuite, log: &str, prefix: &str) -> Vec<String> {
    s.text(log)
        .lines()
        .filter_map(|l| l.split_once(prefix).map(|(_, rest)| rest.trim().to_owned()))
        .collect()
}

/// The QPN in guest `serial`'s last line of pingpong `pp` (`pp0`, `pp1`) that starts with `what`
/// (`local address:` or `remote address:`). The last: a client whose server was not listening
/// yet tried again (lib.sh's `again`) with a new QP, and only the last attempt connected.
fn qpn_of(s: &RemoteSuite, serial: &str, pp: &str, what: &str) -> u32 {
    let text = s.text(serial);
    text.lines()
        .filter_map(|l| l.split_once(&format!("{pp}: ")).map(|(_, rest)| rest))
        .rfind(|l| l.trim_start().starts_with(what))
        .and_then(suite::pingpong_qpn)
        .unwrap_or_else(|| s.fail(&format!("no '{pp}: {what} ... QPN' line in {serial}")))
}

#[test]
fn each_guest_sees_two_active_devices_with_their_own_gids() {
    let s = suite();
    for (g, ips) in [
        ("a", ["10.17.0.1", "10.17.1.1"]),
        ("b", ["10.17.0.2", "10.17.1.2"]),
    ] {
        let log = s.text(&format!("multi-{g}-serial.log"));
        if let Some(l) = log.lines().find(|l| l.contains("MULTI-FAIL")) {
            s.fail(&format!("guest {g}: {l}"));
        }
        for (i, ip) in ips.iter().enumerate() {
            // ::ffff:a.b.c.d as sysfs prints it.
            let octets: Vec<u8> = ip.split('.').map(|o| o.parse().unwrap()).collect();
            let gid = format!(
                "ffff:{:02x}{:02x}:{:02x}{:02x}",
                octets[0], octets[1], octets[2], octets[3]
            );
            let want = format!("MULTI-GID dev=vmw_pvrdma{i} ");
            let line = log
                .lines()
                .find(|l| l.contains(&want))
                .unwrap_or_else(|| s.fail(&format!("guest {g}: no '{want}' line")));
            if !line.contains(&gid) || !line.contains(&format!("netdev eth{i}")) {
                s.fail(&format!(
                    "guest {g}: vmw_pvrdma{i} should pair with eth{i} and have the GID of {ip}: {line}"
                ));
            }
        }
    }
}

#[test]
fn both_devices_carry_checked_traffic_across_the_migration() {
    let s = suite();
    s.expect_value("receive_rc", "0");
    s.expect_value("send_rc", "0");
    s.expect_value("b_exit", "0");
    if !s.text("multi-b-serial.log").contains("MULTI-TRAFFIC") {
        s.fail("B's traffic never ran on both devices before the migration");
    }
    for (g, serial) in [("a", "multi-a-serial.log"), ("b", "multi-b2-serial.log")] {
        let text = s.text(serial);
        if !text.contains("MULTI-DONE pp0_rc=0 pp1_rc=0")
            || !text.contains(&format!("MULTI-OK {g}"))
        {
            s.fail(&format!(
                "guest {g}'s pingpongs did not both finish verified ({serial})"
            ));
        }
        for pp in ["pp0", "pp1"] {
            if !text
                .lines()
                .any(|l| l.starts_with(&format!("{pp}: ")) && l.contains(ITERS))
            {
                s.fail(&format!("{serial}: {pp} did not run its {ITERS}"));
            }
        }
    }
    if let Some(l) = s
        .text("multi-b-to-b2-remote.log")
        .lines()
        .find(|l| l.starts_with("migration completed:"))
    {
        e2e::announce(&format!("two PVRDMA devices migrated: {l}"));
    }
}

/// Each device saved and restored its own QPNs and keys, in PCI order; each pingpong's QP on B
/// (A's `remote address`) is among its own device's, and the peer QPN B knew is A's.
#[test]
fn each_devices_qpns_and_keys_are_unchanged() {
    let s = suite();
    let saved = lines_after(s, "multi-b-vmm.log", "pvrdma: saved ");
    let restored = lines_after(s, "multi-b2-vmm.log", "pvrdma: restored ");
    if saved.len() != 2 || saved != restored {
        s.fail(&format!(
            "B saved {saved:?} but B2 restored {restored:?} (one line per device expected)"
        ));
    }
    for (i, ids) in restored.iter().enumerate() {
        let pp = format!("pp{i}");
        let b_qpn = qpn_of(s, "multi-a-serial.log", &pp, "remote address:");
        if !suite::lists_qpn(ids, b_qpn) {
            s.fail(&format!(
                "B's {pp} QP {b_qpn:#x} is not among device {i}'s restored {ids}"
            ));
        }
        // B's client printed the same QP as its local one (its log, shown on B2 at the end).
        let local = qpn_of(s, "multi-b2-serial.log", &pp, "local address:");
        if local != b_qpn {
            s.fail(&format!(
                "B's {pp}: local QPN {local:#x}, A's peer QPN {b_qpn:#x}"
            ));
        }
    }
}

/// `pvrdma-remote counters` as saved in `$OUT/multi-NAME-counters.json`.
/// On B before the migration and on B2 after the programs: both PVRDMA devices, labelled
/// pvrdma0 and pvrdma1 with their MACs, each in its own slot beside its vmxnet3, each with
/// RoCE frames each way and completions of its own.
#[test]
fn counters_show_both_devices_with_traffic() {
    let s = suite();
    for name in ["b", "b2"] {
        let c = s.counters(name, &format!("multi-{name}-counters.json"));
        let mut slots = Vec::new();
        for (i, mac) in MACS_B.iter().enumerate() {
            let id = format!("pvrdma{i}");
            let of = |kind: &str| -> Vec<&DeviceCountersInfo> {
                c.devices
                    .iter()
                    .filter(|d| d.kind == kind && d.id == id)
                    .collect()
            };
            let (rdma, nic) = match (of("pvrdma").as_slice(), of("vmxnet3").as_slice()) {
                ([rdma], [nic]) => (*rdma, *nic),
                _ => s.fail(&format!(
                    "{name}: expected one pvrdma and one vmxnet3 {id}: {c:?}"
                )),
            };
            let slot = |d: &DeviceCountersInfo| d.pci.split('.').next().map(str::to_owned);
            if rdma.mac.as_deref() != Some(mac) || nic.mac.as_deref() != Some(mac) {
                s.fail(&format!(
                    "{name}: {id} should have MAC {mac}: {rdma:?} {nic:?}"
                ));
            }
            if slot(rdma) != slot(nic) || !rdma.pci.ends_with(".1") {
                s.fail(&format!(
                    "{name}: {id} at {} and its NIC at {}",
                    rdma.pci, nic.pci
                ));
            }
            slots.push(slot(rdma));
            // roce_tx counts the wire only, roce_rx both paths.
            let sent = s.counter(rdma, "roce_tx") + s.counter(rdma, "roce_local_tx");
            let received = s.counter(rdma, "roce_rx");
            let cqes = s.counter(rdma, "cqe_posted");
            if sent < 100 || received < 100 || cqes < 100 {
                s.fail(&format!("{name}: {id} shows no traffic: {rdma:?}"));
            }
            e2e::announce(&format!(
                "{name} {id} ({mac}, {}): {sent} RoCE frames sent, {received} received, {cqes} CQEs",
                rdma.pci
            ));
        }
        if slots[0] == slots[1] {
            s.fail(&format!("{name}: both devices in slot {:?}", slots[0]));
        }
    }
}

#[test]
fn both_guests_finish_and_no_vmm_panicked() {
    let s = suite();
    s.expect_value("a_exit", "0");
    s.expect_value("b2_exit", "0");
    for g in ["a", "b", "b2"] {
        s.expect_value(&format!("{g}_panics"), "0");
    }
}

/// The guest kernels that reached power-off logged no WARNING, BUG or Call Trace.
#[test]
fn guest_kernels_log_no_warning_bug_or_trace() {
    suite().expect_clean_guest_kernels();
}

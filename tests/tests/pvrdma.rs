// SPDX-License-Identifier: Apache-2.0
//! End to end: the PVRDMA control path with an unmodified guest (issue 4). vmw_pvrdma probes the
//! device and pairs it with eth0 (the vmxnet3 function of the same slot); `ibv_devinfo -v` shows
//! the advertised caps, the port follows eth0 down and up, the GID table holds the RoCE v2 GIDs
//! of eth0's IPv4 and IPv6 addresses; `rdma link` shows the link; a libibverbs program creates
//! and destroys PD, CQ with completion channel, MR, SRQ and RC/UD QPs through INIT, RTR and RTS;
//! a second program checks that a responder QP's access flags are enforced (RDMA WRITE, READ and
//! atomics refused without the right, allowed once modify_qp grants it); `rmmod vmw_pvrdma` and
//! `insmod` bring the device back.
//!
//! All tests here share ONE run of `tests/scenarios/pvrdma.sh` (one test-host boot, one guest
//! running `tests/guest/pvrdma.sh`, whose output is framed in sections this file parses). The
//! verbs programs are `resources/guest/verbs-check.c` and `resources/guest/access-check.c`.

use std::sync::OnceLock;
use std::time::Duration;

use e2e::results::{vmm_log_problems, KeyValues, Section, SerialLog};
use e2e::suite::{self, Checks, SetupError};
use e2e::testhost::{Hosts, Outcome};

const IPV4: &str = "10.11.0.1";
const IPV6: &str = "fd00:11::1";
/// The EUI-64 link-local GID of the slot's MAC 52:54:00:11:00:01.
const LINK_LOCAL_GID: &str = "fe80::5054:ff:fe11:1";

/// What the device advertises with the VMM's default limits (devices/pvrdma/src/config.rs and
/// caps.rs), as `ibv_devinfo -v` prints it.
const CAPS: &[(&str, &str)] = &[
    ("vendor_id", "0x15ad"),
    ("vendor_part_id", "2080"),
    ("hw_ver", "0x1"),
    ("fw_ver", "1.0.000"),
    ("phys_port_cnt", "1"),
    ("max_mr_size", "0x40000000"),
    ("page_size_cap", "0x1000"),
    ("max_qp", "8192"),
    ("max_qp_wr", "4096"),
    ("max_sge", "16"),
    ("max_cq", "16384"),
    ("max_cqe", "32768"),
    ("max_mr", "16384"),
    ("max_pd", "1024"),
    ("max_qp_rd_atom", "16"),
    ("max_qp_init_rd_atom", "16"),
    ("atomic_cap", "ATOMIC_HCA (1)"),
    ("max_ah", "1024"),
    ("max_srq", "512"),
    ("max_srq_wr", "4096"),
    ("max_srq_sge", "16"),
    ("max_pkeys", "1"),
    ("local_ca_ack_delay", "15"),
    ("link_layer", "Ethernet"),
    ("gid_tbl_len", "32"),
];

/// Every step pvrdma-verbs-check prints on success, in order.
const VERBS_STEPS: &[&str] = &[
    "open_device",
    "query_device",
    "query_port",
    "query_gid_table",
    "alloc_pd",
    "create_comp_channel",
    "create_cq",
    "req_notify_cq",
    "poll_cq_empty",
    "reg_mr",
    "create_srq",
    "modify_srq",
    "query_srq",
    "create_qp_rc_srq",
    "create_qp_rc",
    "create_qp_ud",
    "modify_qp_rc_srq_init",
    "modify_qp_rc_init",
    "modify_qp_ud_init",
    "query_qp_rc_init",
    "modify_qp_rc_srq_rtr",
    "modify_qp_rc_rtr",
    "modify_qp_ud_rtr",
    "modify_qp_rc_srq_rts",
    "modify_qp_rc_rts",
    "modify_qp_ud_rts",
    "query_qp_rc_srq",
    "query_qp_rc",
    "query_qp_ud",
    "modify_qp_rc_err",
    "query_qp_rc_err",
    "modify_qp_rc_reset",
    "query_qp_rc_reset",
    "modify_qp_rc_reinit",
    "destroy_qp_ud",
    "destroy_qp_rc",
    "destroy_qp_rc_srq",
    "destroy_srq",
    "dereg_mr",
    "destroy_cq",
    "destroy_comp_channel",
    "dealloc_pd",
    "close_device",
];

struct Suite {
    outcome: Outcome,
    env: KeyValues,
    serial: SerialLog,
}

fn suite() -> &'static Suite {
    static SUITE: OnceLock<Result<Suite, SetupError>> = OnceLock::new();
    suite::shared(&SUITE, || {
        let outcome = suite::run_vmm_scenario(
            "pvrdma",
            &[],
            // Typically ~40 s; the guest has 300 s (scenarios/pvrdma.sh).
            Duration::from_secs(420),
            // Single-threaded TCG even for one L2 guest: with -smp 2, a 2-vCPU guest once wedged
            // both L1 CPUs before printing anything (soft lockups in its vCPU threads).
            Hosts::One { l1_cpus: 1 },
        )?;
        Ok(Suite {
            env: suite::key_values(&outcome, "pvrdma.env")?,
            serial: suite::serial_log(&outcome, "pvrdma-serial.log")?,
            outcome,
        })
    })
}

impl Checks for Suite {
    fn fail(&self, what: &str) -> ! {
        let mut msg = what.to_string();
        if let Some(why) = self.serial.marker("RDMA-FAIL ") {
            msg += &format!("\nthe guest script failed: {why}");
        }
        let logs = [
            "pvrdma-serial.log".to_string(),
            "pvrdma-vmm.log".to_string(),
        ];
        panic!("{}", self.outcome.failure(&msg, &logs, 40))
    }

    fn record(&self) -> &KeyValues {
        &self.env
    }
}

impl Suite {
    /// Section `name` of the guest's output; it must have ended with status 0.
    fn section(&self, name: &str) -> Section {
        let section = self
            .serial
            .section(name)
            .unwrap_or_else(|| self.fail(&format!("the guest never printed section {name}")));
        self.expect(section.rc == Some(0), || {
            format!(
                "section {name} should end with status 0, got {:?}:\n{}",
                section.rc, section.text
            )
        });
        section
    }

    fn value<'a>(&self, section: &'a Section, name: &str, key: &str) -> &'a str {
        section.colon_value(key).unwrap_or_else(|| {
            self.fail(&format!(
                "section {name} has no '{key}:' line:\n{}",
                section.text
            ))
        })
    }

    fn port_state(&self, name: &str) -> String {
        let s = self.section(name);
        self.value(&s, name, "state").to_string()
    }
}

/// The GID lines of an `ibv_devinfo -v` section: ("fe80::...", "RoCE v2").
fn gids(section: &Section) -> Vec<(String, String)> {
    section
        .text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            k.starts_with("GID[").then_some(())?;
            let (gid, kind) = v.trim().split_once(',')?;
            Some((gid.trim().to_string(), kind.trim().to_string()))
        })
        .collect()
}

fn check_gids(s: &Suite, name: &str) {
    let section = s.section(name);
    let table = gids(&section);
    for want in [
        LINK_LOCAL_GID.to_string(),
        format!("::ffff:{IPV4}"),
        IPV6.to_string(),
    ] {
        s.expect(
            table
                .iter()
                .any(|(g, kind)| *g == want && kind == "RoCE v2"),
            || format!("{name}: no RoCE v2 GID {want} in {table:?}"),
        );
    }
}

#[test]
fn guest_script_completes_and_vmm_exits_cleanly() {
    let s = suite();
    s.expect(s.serial.marker("GUEST-RUN-RC=") == Some("0"), || {
        format!(
            "the guest script must exit 0, got {:?}",
            s.serial.marker("GUEST-RUN-RC=")
        )
    });
    s.expect(s.serial.marker("RDMA-DONE").is_some(), || {
        "no RDMA-DONE".to_string()
    });
    let warns = s.serial.markers("RDMA-WARN ");
    s.expect(warns.is_empty(), || format!("guest warnings: {warns:?}"));
    s.expect(s.env.get("exit") == Some("0"), || {
        format!(
            "pvrdma-vmm should exit 0 after the guest's poweroff, got {:?}",
            s.env.get("exit")
        )
    });
    let problems = vmm_log_problems(&s.outcome.file("pvrdma-vmm.log"))
        .unwrap_or_else(|e| s.fail(&e.to_string()));
    s.expect(problems.is_empty(), || {
        format!(
            "the VMM logged warnings or errors (an unmodified Linux guest should cause none):\n{}",
            problems.join("\n")
        )
    });
}

#[test]
fn vmw_pvrdma_probes_and_pairs_with_eth0() {
    let s = suite();
    let dmesg = s.section("dmesg-probe");
    for want in [
        "device version 20, driver version 20",
        "paired device to eth0",
        "attached to device",
    ] {
        s.expect(
            dmesg
                .text
                .lines()
                .any(|l| l.contains("vmw_pvrdma") && l.contains(want)),
            || format!("no vmw_pvrdma '{want}' in dmesg:\n{}", dmesg.text),
        );
    }
    // The device's own lines (not the module loader's taint notices) report no failure.
    for line in dmesg
        .text
        .lines()
        .filter(|l| l.contains("vmw_pvrdma 0000:"))
    {
        let lower = line.to_lowercase();
        s.expect(!lower.contains("fail") && !lower.contains("error"), || {
            format!("vmw_pvrdma reported a failure: {line}\n{}", dmesg.text)
        });
    }
    s.expect(s.serial.marker("RDMA-NET-OK ").is_some(), || {
        "eth0 of the slot should reach the host".to_string()
    });
}

#[test]
fn ibv_devinfo_shows_the_advertised_caps() {
    let s = suite();
    let name = "devinfo-up";
    let info = s.section(name);
    s.expect(s.value(&info, name, "hca_id") == "vmw_pvrdma0", || {
        format!("hca_id should be vmw_pvrdma0:\n{}", info.text)
    });
    for (key, want) in CAPS {
        let got = s.value(&info, name, key);
        s.expect(got == *want, || {
            format!("ibv_devinfo -v: {key} is {got}, the device advertises {want}")
        });
    }
    // The node GUID is the EUI-64 of the slot's MAC.
    let guid = s.value(&info, name, "node_guid");
    s.expect(guid == "5054:00ff:fe11:0001", || {
        format!("node_guid {guid} is not the EUI-64 of 52:54:00:11:00:01")
    });
}

#[test]
fn port_is_active_while_the_nic_is_up_and_down_while_it_is_down() {
    let s = suite();
    for (section, want) in [
        ("devinfo-up", "PORT_ACTIVE (4)"),
        ("devinfo-down", "PORT_DOWN (1)"),
        ("devinfo-up-again", "PORT_ACTIVE (4)"),
    ] {
        let got = s.port_state(section);
        s.expect(got == want, || {
            format!("{section}: port state {got}, expected {want}")
        });
    }
    let up = s.section("devinfo-up");
    s.expect(
        s.value(&up, "devinfo-up", "phys_state") == "LINK_UP (5)",
        || {
            format!(
                "phys_state should be LINK_UP while eth0 is up:\n{}",
                up.text
            )
        },
    ); // Back up, with the addresses configured again, the GIDs are back too.
    check_gids(s, "devinfo-up-again");
}

#[test]
fn gid_table_has_roce_v2_gids_of_the_ipv4_and_ipv6_addresses() {
    let s = suite();
    check_gids(s, "devinfo-up");
    let sysfs = s.section("sysfs-gids");
    // ::ffff:10.11.0.1 as sysfs prints it, with its type.
    s.expect(
        sysfs
            .text
            .lines()
            .any(|l| l.contains("0000:0000:0000:0000:0000:ffff:0a0b:0001 RoCE v2")),
        || format!("sysfs has no RoCE v2 GID for {IPV4}:\n{}", sysfs.text),
    );
}

#[test]
fn rdma_link_shows_the_link() {
    let s = suite();
    for (name, state, phys) in [
        ("rdma-link", "ACTIVE", "LINK_UP"),
        ("rdma-link-down", "DOWN", "DISABLED"),
    ] {
        let link = s.section(name);
        let line = link
            .text
            .lines()
            .find(|l| l.starts_with("link vmw_pvrdma0/1 "))
            .unwrap_or_else(|| {
                s.fail(&format!(
                    "{name}: no 'link vmw_pvrdma0/1' line:\n{}",
                    link.text
                ))
            });
        s.expect(
            line.contains(&format!(" state {state} "))
                && line.contains(&format!("physical_state {phys}"))
                && line.trim_end().ends_with("netdev eth0"),
            || {
                format!(
                    "{name}: expected state {state}, physical_state {phys}, netdev eth0: {line}"
                )
            },
        );
    }
    let dev = s.section("rdma-dev");
    s.expect(dev.text.contains("vmw_pvrdma0"), || {
        format!("rdma dev show lists no vmw_pvrdma0:\n{}", dev.text)
    });
}

fn check_verbs(s: &Suite, name: &str) {
    let out = s.section(name);
    let steps: Vec<&str> = out
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("VERBS-STEP "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    s.expect(steps == VERBS_STEPS, || {
        format!(
            "{name}: pvrdma-verbs-check steps differ from the expected ones:\n{}",
            out.text
        )
    });
    s.expect(
        out.text
            .lines()
            .any(|l| l == format!("VERBS-CHECK-OK steps={}", VERBS_STEPS.len())),
        || format!("{name}: no VERBS-CHECK-OK:\n{}", out.text),
    );
    s.expect(
        out.text.lines().any(|l| {
            l.starts_with("VERBS-GID ")
                && l.contains("type=RoCEv2")
                && l.ends_with(&format!("gid=::ffff:{IPV4}"))
        }),
        || {
            format!(
                "{name}: the program did not list the IPv4 GID:\n{}",
                out.text
            )
        },
    );
}

#[test]
fn verbs_program_creates_and_destroys_every_object() {
    let s = suite();
    check_verbs(s, "verbs");
    // After the program exited, nothing it created is left: the counts are those from before
    // (the kernel's own GSI QP with its PD and CQ).
    let (before, after) = (s.section("rdma-res-before"), s.section("rdma-res"));
    s.expect(after.text.contains("vmw_pvrdma0:"), || {
        format!("rdma resource show lists no vmw_pvrdma0:\n{}", after.text)
    });
    s.expect(before.text == after.text, || {
        format!(
            "rdma resource show differs after the program:\nbefore:\n{}\nafter:\n{}",
            before.text, after.text
        )
    });
}

/// Every case pvrdma-access-check prints on success, in order (resources/guest/access-check.c).
const ACCESS_STEPS: &[&str] = &[
    "open_device",
    "deny_write",
    "grant_write",
    "deny_read",
    "grant_read",
    "deny_fetch_add",
    "grant_fetch_add",
    "deny_cmp_swap",
    "grant_cmp_swap",
    "revoke_write",
];

/// A responder QP's own access flags are enforced: each remote operation it does not allow fails
/// with REM_ACCESS_ERR and changes no memory, granting the right by modify_qp lets it through
/// (its effect checked by the program), and revoking REMOTE_WRITE stops the next WRITE.
#[test]
fn qp_access_flags_are_enforced() {
    let s = suite();
    let out = s.section("access");
    let steps: Vec<&str> = out
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("ACCESS-STEP "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    s.expect(steps == ACCESS_STEPS, || {
        format!(
            "pvrdma-access-check cases differ from the expected ones:\n{}",
            out.text
        )
    });
    s.expect(
        out.text
            .lines()
            .any(|l| l == format!("ACCESS-CHECK-OK steps={}", ACCESS_STEPS.len())),
        || format!("no ACCESS-CHECK-OK:\n{}", out.text),
    );
}

#[test]
fn driver_reload_works() {
    let s = suite();
    s.section("rmmod");
    let after = s.section("after-rmmod");
    s.expect(!after.text.contains("vmw_pvrdma0"), || {
        format!("vmw_pvrdma0 still registered after rmmod:\n{}", after.text)
    });
    s.section("insmod");
    let state = s.port_state("devinfo-reloaded");
    s.expect(state == "PORT_ACTIVE (4)", || {
        format!("after insmod the port should be active, got {state}")
    });
    check_gids(s, "devinfo-reloaded");
    check_verbs(s, "verbs-reloaded");
    let dmesg = s.section("dmesg-end");
    let probes = dmesg
        .text
        .lines()
        .filter(|l| l.contains("vmw_pvrdma") && l.contains("paired device to eth0"))
        .count();
    s.expect(probes == 2, || {
        format!(
            "expected two probes (boot and insmod) in dmesg, got {probes}:\n{}",
            dmesg.text
        )
    });
}

/// The guest kernels logged no WARNING, BUG or Call Trace.
#[test]
fn guest_kernels_log_no_warning_bug_or_trace() {
    suite::expect_clean_guest_kernels(&suite().outcome, &[]);
}

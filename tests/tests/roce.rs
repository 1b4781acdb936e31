// SPDX-License-Identifier: Apache-2.0
//! End to end: RoCE v1 and guest VLANs (issue 14, items 5 and 6), with unmodified guests and
//! tools, in one test-host boot (`tests/scenarios/roce.sh`, five guests at once running
//! `tests/guest/roce.sh`).
//!
//! RoCE v1: guests A and B run `--pvrdma ...,gid=roce-v1,local=off`: their devices advertise RoCE
//! v1 only, the guests' GIDs are RoCE v1 ("IB/RoCE v1" in sysfs), and `ibv_rc_pingpong -c` and
//! `rping -v -V` between them must pass while tcpdump on the test host's bridge sees their RDMA
//! traffic as EtherType 0x8915 frames, and not one UDP 4791 frame.
//!
//! VLANs: guests C, D and E each have `eth0.100` (VLAN 100) with an address on it, whose RoCE v2
//! GID the programs use (`-g`), connecting to the server's address on the VLAN. The device learns
//! the VLAN from the guest's own tagged frames (vmw_pvrdma never tells it: CREATE_BIND always says
//! 0xFFF), tags the frames of that GID and takes only frames on its VLAN. C has `local=off`, so C
//! <-> D crosses the bridge, where every RoCE frame between them must be 802.1Q-tagged with VID
//! 100 (`ibv_rc_pingpong -c`, `ibv_ud_pingpong -c`); D <-> E is the same-host channel (nothing on
//! the bridge), where the devices' own counters show the tags and that no frame was refused for
//! its VLAN. Both pairs also run `rping -v -V` over the VLAN, which the guests' kernels cannot
//! complete through vmw_pvrdma (see [`rping_over_a_vlan_is_dropped_by_the_guest_kernels_cm`]).
//!
//! Broken on purpose (docs of the tests say how each was shown to fail): a device that sends
//! RoCE v2 under `gid=roce-v1`, or drops the VLAN tag, fails these tests.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use e2e::results::{field, vmm_log_problems, KeyValues, SerialLog};
use e2e::steps::{self, device_counters, Party as _, StepChecks, StepRun};
use e2e::suite::{self, Checks, SetupError};
use e2e::testhost::{Hosts, Outcome};

const PP_ITERS: u64 = 50;
const PING_COUNT: u64 = 10;
const RC_SIZE: u64 = 4096;
const UD_SIZE: u64 = 512;
/// rping's default message size (-S).
const RPING_SIZE: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guest {
    A,
    B,
    C,
    D,
    E,
}

const GUESTS: [Guest; 5] = [Guest::A, Guest::B, Guest::C, Guest::D, Guest::E];

impl steps::Party for Guest {
    /// The address its programs use: eth0's for the RoCE v1 pair, eth0.100's for the others.
    fn ip(self) -> &'static str {
        match self {
            Self::A => "10.17.0.1",
            Self::B => "10.17.0.2",
            Self::C => "10.117.0.3",
            Self::D => "10.117.0.4",
            Self::E => "10.117.0.5",
        }
    }
}

impl Guest {
    fn name(self) -> &'static str {
        match self {
            Self::A => "a",
            Self::B => "b",
            Self::C => "c",
            Self::D => "d",
            Self::E => "e",
        }
    }

    /// The GID type (as sysfs names it, spaces as underscores) of the GID its programs use.
    fn gid_type(self) -> &'static str {
        match self {
            Self::A | Self::B => "IB/RoCE_v1",
            _ => "RoCE_v2",
        }
    }
}

impl fmt::Display for Guest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "guest {}", self.name().to_uppercase())
    }
}

struct Suite {
    outcome: Outcome,
    env: KeyValues,
    logs: Vec<SerialLog>,
}

fn suite() -> &'static Suite {
    static SUITE: OnceLock<Result<Suite, SetupError>> = OnceLock::new();
    suite::shared(&SUITE, || {
        let outcome = suite::run_vmm_scenario(
            "roce",
            &[
                ("PP_ITERS", PP_ITERS.to_string()),
                ("PING_COUNT", PING_COUNT.to_string()),
            ],
            // Typically 4-5 min; the guests have 1200 s (scenarios/roce.sh).
            Duration::from_secs(1320),
            // Five L2 guests in this L1: single-threaded TCG (see Hosts::One).
            Hosts::One { l1_cpus: 1 },
        )?;
        let mut logs = Vec::new();
        for g in GUESTS {
            logs.push(suite::serial_log(
                &outcome,
                &format!("roce-{}-serial.log", g.name()),
            )?);
        }
        Ok(Suite {
            env: suite::key_values(&outcome, "roce.env")?,
            logs,
            outcome,
        })
    })
}

impl Checks for Suite {
    /// Fails the test with `what`, the guests' set-up failures and the end of the VMM logs.
    fn fail(&self, what: &str) -> ! {
        let mut msg = what.to_string();
        for g in GUESTS {
            if let Some(why) = self.guest(g).marker("RDMA-FAIL ") {
                msg += &format!("\n{g}'s script failed: {why}");
            }
        }
        let logs: Vec<String> = GUESTS
            .iter()
            .map(|g| format!("roce-{}-vmm.log", g.name()))
            .collect();
        panic!("{}", self.outcome.failure(&msg, &logs, 12))
    }

    fn record(&self) -> &KeyValues {
        &self.env
    }
}

impl StepChecks for Suite {
    type Party = Guest;

    fn run(&self, step: &str, party: Guest, side: &str) -> StepRun {
        self.run_in(
            self.guest(party),
            format!("{party} as {side} of {step}"),
            step,
            side,
        )
    }
}

impl Suite {
    fn guest(&self, g: Guest) -> &SerialLog {
        &self.logs[GUESTS.iter().position(|&x| x == g).unwrap_or(0)]
    }

    /// Capture count `key` (roce.env's `cap.KEY`).
    fn captured(&self, key: &str) -> u64 {
        let k = format!("cap.{key}");
        let v = self.env(&k);
        v.parse().unwrap_or_else(|_| {
            self.fail(&format!(
                "{k}={v}: the capture could not be counted (tcpdump={:?}, see tcpdump.log)",
                self.env.get("tcpdump")
            ))
        })
    }

    fn vmm_log_text(&self, g: Guest) -> String {
        let path = self.outcome.file(&format!("roce-{}-vmm.log", g.name()));
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| self.fail(&format!("cannot read {}: {e}", path.display())))
    }

    /// The counters `g`'s PVRDMA device logged when its VMM exited (those that moved).
    fn counters(&self, g: Guest) -> BTreeMap<String, u64> {
        device_counters(&self.vmm_log_text(g)).unwrap_or_else(|| {
            self.fail(&format!(
                "the VMM of {g} logged no 'pvrdma: counters:' line (did it exit?)"
            ))
        })
    }

    /// The IB CM message counters `g` printed after `step` (its `RDMA-CM` line), less those of
    /// its previous `RDMA-CM` line: what its kernel's CM sent and received during `step`.
    fn cm(&self, g: Guest, step: &str) -> BTreeMap<String, u64> {
        let lines = self.guest(g).markers("RDMA-CM ");
        let at = lines
            .iter()
            .position(|l| field(l, "step") == Some(step))
            .unwrap_or_else(|| self.fail(&format!("{g}: no RDMA-CM line for {step}")));
        let counts = |line: &str| -> BTreeMap<String, u64> {
            line.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
                .collect()
        };
        let mut now = counts(lines[at]);
        if let Some(before) = at.checked_sub(1).map(|i| counts(lines[i])) {
            for (k, v) in now.iter_mut() {
                *v -= before.get(k).copied().unwrap_or(0);
            }
        }
        for k in ["tx_req", "rx_req", "tx_rep", "rx_rep", "tx_rej", "rx_rej"] {
            self.expect(now.contains_key(k), || {
                format!(
                    "{g}: RDMA-CM for {step} has no {k} (no CM counters in sysfs?): {}",
                    lines[at]
                )
            });
        }
        now
    }
}

#[test]
fn every_guest_completes_and_its_vmm_exits_cleanly() {
    let s = suite();
    for g in GUESTS {
        let log = s.guest(g);
        s.expect(log.marker("GUEST-RUN-RC=") == Some("0"), || {
            format!(
                "{g}: the test script must exit 0, got {:?}",
                log.marker("GUEST-RUN-RC=")
            )
        });
        s.expect(log.marker("RDMA-DONE ").is_some(), || {
            format!("{g}: no RDMA-DONE")
        });
        let exit = s.env(&format!("{}_exit", g.name()));
        s.expect(exit == "0", || {
            format!("the VMM of {g} should exit 0 after the guest's poweroff, got {exit}")
        });
    }
}

/// The programs use the GIDs they should: RoCE v1 ones on A and B, which have no other kind
/// (the device advertises RoCE v1 only), and on C, D and E the RoCE v2 GID of their eth0.100
/// address, which the guest's RDMA core attached to eth0.100.
#[test]
fn the_programs_use_roce_v1_gids_and_the_vlan_interfaces_gids() {
    let s = suite();
    for g in GUESTS {
        let gid = s
            .guest(g)
            .marker("RDMA-GID ")
            .unwrap_or_else(|| s.fail(&format!("{g}: no RDMA-GID")));
        let want_gid = format!("0000:0000:0000:0000:0000:ffff:{}", {
            let o: Vec<u8> = g.ip().split('.').filter_map(|x| x.parse().ok()).collect();
            format!("{:02x}{:02x}:{:02x}{:02x}", o[0], o[1], o[2], o[3])
        });
        s.expect(field(gid, "gid") == Some(want_gid.as_str()), || {
            format!("{g}: the programs' GID should be ::ffff:{}: {gid}", g.ip())
        });
        s.expect(field(gid, "type") == Some(g.gid_type()), || {
            format!("{g}: the programs' GID should be {}: {gid}", g.gid_type())
        });
        let ndev = if g.gid_type() == "RoCE_v2" {
            "eth0.100"
        } else {
            "eth0"
        };
        s.expect(field(gid, "ndev") == Some(ndev), || {
            format!("{g}: the programs' GID should belong to {ndev}: {gid}")
        });
    }
    for g in [Guest::A, Guest::B] {
        let table = s
            .guest(g)
            .section("gids")
            .map(|t| t.text)
            .unwrap_or_default();
        s.expect(!table.is_empty() && !table.contains("RoCE v2"), || {
            format!("{g}: a roce-v1 port should have RoCE v1 GIDs only:\n{table}")
        });
    }
}

/// Neither a panic nor a syscall outside the seccomp allow-list, nor a warning or an error.
#[test]
fn vmm_logs_have_no_panics_warnings_or_errors() {
    let s = suite();
    for g in GUESTS {
        let path = s.outcome.file(&format!("roce-{}-vmm.log", g.name()));
        let problems = vmm_log_problems(&path).unwrap_or_else(|e| s.fail(&e.to_string()));
        s.expect(problems.is_empty(), || {
            format!(
                "the VMM of {g} logged warnings or errors:\n{}",
                problems.join("\n")
            )
        });
        let text = s.vmm_log_text(g);
        for marker in ["panicked at", "forbidden syscall"] {
            s.expect(!text.contains(marker), || {
                format!("the VMM of {g}: {marker}")
            });
        }
    }
}

#[test]
fn ibv_rc_pingpong_over_roce_v1() {
    suite().pingpong("v1-rc", Guest::A, Guest::B, PP_ITERS, RC_SIZE, 1);
}

/// rping over rdma_cm on RoCE v1 GIDs: the CM MADs go over RoCE v1 too (the server's kernel
/// answered the REQ it received, which takes the RoCE v1 GRH the device placed before it).
#[test]
fn rping_over_roce_v1_verifies_its_data() {
    let s = suite();
    s.rping("v1-rping", Guest::A, Guest::B, PING_COUNT, RPING_SIZE);
    let cm = s.cm(Guest::A, "v1-rping");
    s.expect(cm["rx_req"] > 0 && cm["tx_rep"] > 0, || {
        format!("A's CM should have answered B's REQ with a REP: {cm:?}")
    });
}

/// What crossed the bridge between A and B was RoCE v1: EtherType 0x8915 frames each way, and
/// not one UDP 4791 frame, tagged or not; their devices received nothing but RoCE v1.
/// Shown to fail with a device that builds RoCE v2 whatever the GID type (the GID type ignored in
/// `objects/gid.rs`): no 0x8915 frame, only UDP 4791 ones.
#[test]
fn the_roce_v1_pair_sends_ethertype_0x8915_and_no_udp_4791() {
    let s = suite();
    s.expect(s.env.get("tcpdump") == Some("ok"), || {
        format!(
            "tcpdump did not capture on br0: {:?} (see tcpdump.log)",
            s.env.get("tcpdump")
        )
    });
    let (v1, v2) = (s.captured("ab.v1"), s.captured("ab.v2"));
    let tagged = s.captured("ab.vlan.any_roce");
    s.expect(v1 > 0 && v2 == 0 && tagged == 0, || {
        format!(
            "A <-> B on the bridge: {v1} RoCE v1 frames (EtherType 0x8915), {v2} RoCE v2 (UDP \
             4791), {tagged} tagged RoCE frames; want RoCE v1 only (see roce-capture-v1.txt)"
        )
    });
    for (g, key) in [(Guest::A, "ab.from_a.roce"), (Guest::B, "ab.from_b.roce")] {
        let n = s.captured(key);
        s.expect(n > 0, || {
            format!("{g} sent no RoCE frame to its peer over the bridge")
        });
    }
    for g in [Guest::A, Guest::B] {
        let c = s.counters(g);
        let (rx, rx_v1) = (c.get("roce_rx"), c.get("roce_rx_v1"));
        s.expect(rx.is_some() && rx == rx_v1, || {
            format!("{g}'s device received roce_rx={rx:?} frames, of which roce_rx_v1={rx_v1:?} RoCE v1: all should be")
        });
        s.expect(!c.contains_key("roce_rx_bad"), || {
            format!("{g}'s device dropped frames that did not parse or check: {c:?}")
        });
    }
    e2e::announce(&format!(
        "roce: A <-> B: {v1} RoCE v1 frames on the bridge, {v2} UDP 4791"
    ));
}

#[test]
fn ibv_rc_pingpong_over_a_vlan_on_the_wire() {
    suite().pingpong("vlan-wire-rc", Guest::C, Guest::D, PP_ITERS, RC_SIZE, 1);
}

#[test]
fn ibv_ud_pingpong_over_a_vlan_on_the_wire() {
    suite().pingpong("vlan-wire-ud", Guest::C, Guest::D, PP_ITERS, UD_SIZE, 1);
}

#[test]
fn ibv_rc_pingpong_over_a_vlan_on_the_same_host_channel() {
    suite().pingpong("vlan-local-rc", Guest::D, Guest::E, PP_ITERS, RC_SIZE, 1);
}

#[test]
fn ibv_ud_pingpong_over_a_vlan_on_the_same_host_channel() {
    suite().pingpong("vlan-local-ud", Guest::D, Guest::E, PP_ITERS, UD_SIZE, 1);
}

/// Every RoCE frame between C and D on the bridge carried the 802.1Q tag of VLAN 100 (RoCE v2
/// inside), each way; C's device received only tagged frames and refused none for its VLAN.
/// Shown to fail with a device that never tags (the learned VLAN dropped in `objects/gid.rs`):
/// the pingpongs fail, since the receiving device refuses untagged frames for a GID on VLAN 100,
/// and the bridge carries only untagged UDP 4791.
#[test]
fn the_vlan_pair_on_the_wire_sends_802_1q_tagged_roce_v2() {
    let s = suite();
    let tagged = s.captured("cd.vlan100.v2");
    let (untagged, v1) = (s.captured("cd.v2"), s.captured("cd.v1"));
    let other = s.captured("cd.vlan.any_roce") - tagged;
    s.expect(tagged > 0 && untagged == 0 && v1 == 0 && other == 0, || {
        format!(
            "C <-> D on the bridge: {tagged} RoCE v2 frames tagged with VLAN 100, {untagged} \
             untagged, {other} tagged otherwise, {v1} RoCE v1; want tagged VLAN 100 only (see \
             roce-capture-vlan.txt)"
        )
    });
    for (g, key) in [(Guest::C, "cd.from_c.roce"), (Guest::D, "cd.from_d.roce")] {
        let n = s.captured(key);
        s.expect(n > 0, || {
            format!("{g} sent no RoCE frame to its peer over the bridge")
        });
    }
    let c = s.counters(Guest::C);
    let (rx, rx_vlan) = (c.get("roce_rx"), c.get("roce_rx_vlan"));
    s.expect(rx.is_some() && rx == rx_vlan, || {
        format!("C's device received roce_rx={rx:?} frames, roce_rx_vlan={rx_vlan:?} tagged: all should be")
    });
    s.expect(!c.contains_key("roce_rx_vlan_mismatch"), || {
        format!("C's device refused frames for their VLAN: {c:?}")
    });
    e2e::announce(&format!(
        "roce: C <-> D over VLAN 100: {tagged} tagged RoCE v2 frames on the bridge, {untagged} untagged"
    ));
}

/// D <-> E took the same-host channel (no RoCE frame between them on the bridge while both VMMs
/// ran: once one is gone, a frame for it rightly takes the wire) and the tags went along: every frame E's device received carried VLAN 100's tag
/// (all of them over the channel, but those the bridge flooded to E's TAP before it learned where
/// C's and D's MACs are, which were not for E), and none was refused for its VLAN. Shown to fail
/// with a device that never tags: E's device counts no roce_rx_vlan.
#[test]
fn the_vlan_pair_on_the_same_host_channel_keeps_its_tags() {
    let s = suite();
    let on_bridge = s.captured("de.from_d.roce") + s.captured("de.from_e.roce");
    s.expect(on_bridge == 0, || {
        format!(
            "{on_bridge} RoCE frames between D and E crossed the bridge while both VMMs ran (up to \
             {}): the same-host channel should carry them",
            s.env("cap.de.end")
        )
    });
    let after = s.captured("de.all_roce").saturating_sub(on_bridge);
    let e = s.counters(Guest::E);
    let (rx, local, tagged) = (
        e.get("roce_rx"),
        e.get("roce_local_rx"),
        e.get("roce_rx_vlan"),
    );
    s.expect(local.is_some_and(|&n| n > 0) && tagged == rx, || {
        format!(
            "E's device: roce_rx={rx:?}, roce_local_rx={local:?}, roce_rx_vlan={tagged:?}: \
                 its frames should have come over the same-host channel, all tagged"
        )
    });
    let wire = e.get("roce_tx").copied().unwrap_or(0);
    s.expect(wire <= after, || {
        format!(
            "E's device sent {wire} frames on the wire, but only {after} went between D and E \
             after one of their VMMs ended: {e:?}"
        )
    });
    for g in [Guest::D, Guest::E] {
        let c = s.counters(g);
        s.expect(!c.contains_key("roce_rx_vlan_mismatch"), || {
            format!("{g}'s device refused frames for their VLAN: {c:?}")
        });
    }
}

/// rping over the VLAN cannot work with vmw_pvrdma, whatever the device does: the passive side's
/// kernel CM looks up the GID a REQ arrived on by GID and VLAN (`ib_init_ah_attr_from_wc`:
/// `get_sgid_attr_from_eth` with `wc->vlan_id`, 0xffff without `IB_WC_WITH_VLAN`), and the
/// PVRDMA CQE has no VLAN field for the driver to fill (`pvrdma_poll_one` never sets
/// `vlan_id`): no GID of eth0.100 matches "no VLAN", so `cm_req_handler` drops every REQ without
/// an answer and the client waits until it is killed. This test records that it fails exactly
/// that way, on the wire and on the same-host channel: the server's CM received the client's
/// REQs (so the device delivered them on the VLAN, to the right GID and QP 1) and sent neither a
/// REP nor a REJ. Should a guest kernel ever manage it, the rping must then pass with its data.
#[test]
fn rping_over_a_vlan_is_dropped_by_the_guest_kernels_cm() {
    let s = suite();
    for (step, server, client) in [
        ("vlan-wire-rping", Guest::C, Guest::D),
        ("vlan-local-rping", Guest::D, Guest::E),
    ] {
        let client_run = s.run(step, client, "client");
        let server_run = s.run(step, server, "server");
        if client_run.rc == Some(0) && server_run.rc == Some(0) {
            s.rping(step, server, client, PING_COUNT, RPING_SIZE);
            continue;
        }
        s.expect_in(
            &client_run,
            !client_run.text.contains("ping data: "),
            || "no ping may have gone through".to_string(),
        );
        let (srv, cli) = (s.cm(server, step), s.cm(client, step));
        s.expect(
            cli["tx_req"] > 0 && srv["rx_req"] > 0 && srv["tx_rep"] == 0 && srv["tx_rej"] == 0,
            || {
                format!(
                    "{step}: the client's CM should have sent REQs that the server's received and                      left unanswered; client {cli:?}, server {srv:?}"
                )
            },
        );
    }
}

/// The guest kernels logged no WARNING, BUG or Call Trace.
#[test]
fn guest_kernels_log_no_warning_bug_or_trace() {
    suite::expect_clean_guest_kernels(&suite().outcome, &[]);
}

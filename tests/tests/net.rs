// SPDX-License-Identifier: Apache-2.0
//! End to end: vmxnet3 on a TAP backend (issue 3). Two guests, each with `--net`, on one Linux
//! bridge: they ping each other both ways, 64 MiB cross over TCP intact at MTU 1500 and at 9000, a link taken down and up in a guest is seen, MTU 9000 works and a MAC change in a guest
//! takes effect.
//!
//! All tests here share ONE run of `tests/scenarios/net.sh` (one test-host boot with one vCPU,
//! both guests at once, each running `tests/guest/net.sh`); see those files for the protocol.

use std::sync::OnceLock;
use std::time::Duration;

use e2e::results::{field, vmm_log_problems, KeyValues, SerialLog};
use e2e::suite::{self, Checks, SetupError};
use e2e::testhost::{Hosts, Outcome};

const NEW_MAC_B: &str = "52:54:00:0b:00:99";
const OLD_MAC_B: &str = "52:54:00:0b:00:02";

struct Suite {
    outcome: Outcome,
    env: KeyValues,
    a: SerialLog,
    b: SerialLog,
}

fn suite() -> &'static Suite {
    static SUITE: OnceLock<Result<Suite, SetupError>> = OnceLock::new();
    suite::shared(&SUITE, || {
        let outcome = suite::run_vmm_scenario(
            "net",
            &[],
            // Typically ~3 min; the guests have 480 s (scenarios/net.sh).
            Duration::from_secs(660),
            // Two L2 guests in this L1: single-threaded TCG (see Hosts::One).
            Hosts::One { l1_cpus: 1 },
        )?;
        Ok(Suite {
            env: suite::key_values(&outcome, "net.env")?,
            a: suite::serial_log(&outcome, "net-a-serial.log")?,
            b: suite::serial_log(&outcome, "net-b-serial.log")?,
            outcome,
        })
    })
}

impl Checks for Suite {
    /// Fails the test with `what`, the guests' first failure and both guests' logs.
    fn fail(&self, what: &str) -> ! {
        let mut msg = what.to_string();
        for g in ["a", "b"] {
            if let Some(why) = self.guest(g).marker("NET-FAIL ") {
                msg += &format!("\nguest {g} failed: {why}");
            }
        }
        let logs: Vec<String> = ["a", "b"]
            .iter()
            .flat_map(|g| [format!("net-{g}-serial.log"), format!("net-{g}-vmm.log")])
            .collect();
        panic!("{}", self.outcome.failure(&msg, &logs, 30))
    }

    fn record(&self) -> &KeyValues {
        &self.env
    }
}

impl Suite {
    fn guest(&self, name: &str) -> &SerialLog {
        match name {
            "a" => &self.a,
            _ => &self.b,
        }
    }

    /// The rest of guest `g`'s first `marker` line, or the test fails.
    fn marker(&self, g: &str, marker: &str) -> &str {
        self.guest(g)
            .marker(marker)
            .unwrap_or_else(|| self.fail(&format!("guest {g}: no {marker:?} line")))
    }

    fn field<'a>(&self, g: &str, marker: &str, line: &'a str, key: &str) -> &'a str {
        field(line, key).unwrap_or_else(|| {
            self.fail(&format!(
                "guest {g}: {marker:?} line without {key}=: {line:?}"
            ))
        })
    }
}

#[test]
fn both_guests_complete_and_vmms_exit_cleanly() {
    let s = suite();
    for g in ["a", "b"] {
        s.expect(s.guest(g).marker("GUEST-RUN-RC=") == Some("0"), || {
            format!(
                "guest {g}: the test script must exit 0, got {:?}",
                s.guest(g).marker("GUEST-RUN-RC=")
            )
        });
        s.marker(g, "NET-DONE ");
        let exit = s.env(&format!("{g}_exit"));
        s.expect(exit == "0", || {
            format!("VMM of guest {g} should exit 0 after the guest's poweroff, got {exit}")
        });
        let log = s.outcome.file(&format!("net-{g}-vmm.log"));
        let problems = vmm_log_problems(&log).unwrap_or_else(|e| s.fail(&e.to_string()));
        s.expect(problems.is_empty(), || {
            format!(
                "VMM of guest {g} logged warnings or errors (a Linux guest should cause none):\n{}",
                problems.join("\n")
            )
        });
    }
}

#[test]
fn guests_ping_each_other_both_ways() {
    let s = suite();
    for (g, from, to) in [
        ("a", "10.10.0.1", "10.10.0.2"),
        ("b", "10.10.0.2", "10.10.0.1"),
    ] {
        let up = s.marker(g, "NET-UP ");
        s.expect(
            field(up, "carrier") == Some("1") && field(up, "operstate") == Some("up"),
            || format!("guest {g}: eth0 should come up with carrier: {up}"),
        );
        let ping = s.marker(g, "NET-PING ");
        s.expect(ping == format!("from={from} to={to} ok"), || {
            format!("guest {g}: unexpected ping result {ping:?}")
        });
    }
}

/// The transfers of tests/guest/net.sh: (MTU, bytes).
const TRANSFERS: [(&str, &str); 2] = [("1500", "67108864"), ("9000", "67108864")];

impl Suite {
    /// Guest `g`'s `marker` line whose `mtu` is `mtu`.
    fn transfer(&self, g: &str, marker: &str, mtu: &str) -> &str {
        self.guest(g)
            .markers(marker)
            .into_iter()
            .find(|l| field(l, "mtu") == Some(mtu))
            .unwrap_or_else(|| self.fail(&format!("guest {g}: no {marker:?} line with mtu={mtu}")))
    }
}

#[test]
fn tcp_64_mib_at_mtu_1500_and_at_mtu_9000_arrive_intact() {
    let s = suite();
    for (mtu, bytes) in TRANSFERS {
        let sent = s.transfer("b", "NET-TCP-SENT ", mtu);
        let recv = s.transfer("a", "NET-TCP-RECV ", mtu);
        let sent_md5 = s.field("b", "NET-TCP-SENT", sent, "md5");
        let recv_md5 = s.field("a", "NET-TCP-RECV", recv, "md5");
        let (sent_bytes, recv_bytes) = (
            s.field("b", "NET-TCP-SENT", sent, "bytes"),
            s.field("a", "NET-TCP-RECV", recv, "bytes"),
        );
        s.expect(sent_bytes == bytes, || {
            format!("MTU {mtu}: B should send {bytes} bytes: {sent}")
        });
        s.expect(recv_bytes == bytes && recv_md5 == sent_md5, || {
            format!(
                "MTU {mtu}: received data differs from what was sent: sent {sent}, received {recv}"
            )
        });
        s.expect(field(recv, "rc") == Some("0"), || {
            format!("MTU {mtu}: A's receiver should exit 0: {recv}")
        });
        e2e::announce(&format!(
            "net: {bytes} bytes B->A at MTU {mtu} in {} s (guest clock, nested; {})",
            field(sent, "secs").unwrap_or("?"),
            field(recv, "csum_errors").map_or(String::new(), |n| format!(
                "{n} bad TCP checksums at A so far"
            ))
        ));
    }
}

/// TCP segments that reach a guest with a bad checksum are dropped and sent again: the data still
/// arrives intact (previous test), so only the receiver's InCsumErrors counter shows them.
#[test]
fn tcp_segments_arrive_with_valid_checksums() {
    let s = suite();
    for (g, marker) in [("a", "NET-TCP-RECV "), ("b", "NET-TCP-SENT ")] {
        for (mtu, _) in TRANSFERS {
            let line = s.transfer(g, marker, mtu);
            let errors = s.field(g, marker, line, "csum_errors");
            s.expect(errors == "0", || {
                format!(
                    "guest {g} received {errors} TCP segments with a bad checksum by the end of the \
                     MTU {mtu} transfer (Tcp InCsumErrors; {line})"
                )
            });
        }
    }
}

#[test]
fn link_down_and_up_in_the_guest_is_seen() {
    let s = suite();
    let down = s.marker("b", "NET-LINK-DOWN ");
    s.expect(
        field(down, "operstate") == Some("down") && field(down, "ping") == Some("fail"),
        || format!("B: after ip link set down, operstate down and no ping answer: {down}"),
    );
    s.marker("a", "NET-PEER-DOWN-SEEN ");
    let up = s.marker("b", "NET-LINK-UP-AGAIN ");
    s.expect(
        field(up, "carrier") == Some("1") && field(up, "operstate") == Some("up"),
        || format!("B: after ip link set up, carrier and operstate up: {up}"),
    );
    s.marker("b", "NET-PING-AFTER-UP ");
    s.marker("a", "NET-PEER-UP-SEEN ");
    // The device saw it too: the driver quiesced it on down and activated it again on up.
    let log = SerialLog::read(&s.outcome.file("net-b-vmm.log"))
        .unwrap_or_else(|e| s.fail(&e.to_string()));
    let activations = log.markers("vmxnet3: activated").len();
    let quiesces = log.markers("vmxnet3: quiesced").len();
    s.expect(activations >= 2 && quiesces >= 1, || {
        format!("B's VMM should log a quiesce and a second activation, got {quiesces} and {activations}")
    });
}

#[test]
fn mtu_9000_works_across_the_bridge() {
    let s = suite();
    s.expect(s.env("tapa_created_mtu") == "9000", || {
        format!(
            "the TAP the VMM created with mtu=9000 has MTU {}",
            s.env("tapa_created_mtu")
        )
    });
    let flags = u32::from_str_radix(s.env("tapa_created_flags").trim_start_matches("0x"), 16)
        .unwrap_or_else(|e| s.fail(&format!("tapa_created_flags: {e}")));
    s.expect(flags & 1 == 0, || {
        format!(
            "a TAP the VMM created must stay down until the host brings it up: flags {flags:#x}"
        )
    });
    for g in ["a", "b"] {
        let set = s.marker(g, "NET-MTU-SET ");
        s.expect(
            field(set, "mtu") == Some("9000") && field(set, "carrier") == Some("1"),
            || format!("guest {g}: eth0 should run at MTU 9000 with carrier: {set}"),
        );
        let ping = s.marker(g, "NET-JUMBO-PING ");
        s.expect(field(ping, "size") == Some("8000"), || {
            format!("guest {g}: {ping}")
        });
        // No fragment was made or reassembled on either side: the 8000-byte echoes crossed whole.
        let frag = s.marker(g, "NET-IP-FRAG ");
        s.expect(
            field(frag, "FragCreates") == Some("0") && field(frag, "ReasmReqds") == Some("0"),
            || format!("guest {g}: IP fragmentation happened: {frag}"),
        );
    }
    let log = SerialLog::read(&s.outcome.file("net-a-vmm.log"))
        .unwrap_or_else(|e| s.fail(&e.to_string()));
    s.expect(!log.markers("MTU 9000").is_empty(), || {
        "A's VMM should log an activation with MTU 9000".to_string()
    });
}

#[test]
fn mac_change_in_the_guest_takes_effect() {
    let s = suite();
    let set = s.marker("b", "NET-MAC-SET ");
    s.expect(
        field(set, "old") == Some(OLD_MAC_B) && field(set, "new") == Some(NEW_MAC_B),
        || format!("B: eth0 should go from {OLD_MAC_B} to {NEW_MAC_B}: {set}"),
    );
    s.marker("b", "NET-PING-AFTER-MAC ");
    let seen = s.marker("a", "NET-PEER-MAC-SEEN ");
    s.expect(seen.contains(NEW_MAC_B), || {
        format!("A's neighbour entry for B should carry {NEW_MAC_B}: {seen}")
    });
    let port = s.env("fdb_new_mac_port");
    s.expect(port == "tapb", || {
        format!(
            "the bridge should learn {NEW_MAC_B} on B's port tapb, got {port} (see net-fdb.txt)"
        )
    });
    s.expect(
        s.b.marker("NET-HOST-SIGNAL ") == Some("fdb-checked"),
        || {
            format!(
                "B should see the host's signal: {:?}",
                s.b.marker("NET-HOST-SIGNAL ")
            )
        },
    );
}

/// The guest kernels logged no WARNING, BUG or Call Trace.
#[test]
fn guest_kernels_log_no_warning_bug_or_trace() {
    suite::expect_clean_guest_kernels(&suite().outcome, &[]);
}

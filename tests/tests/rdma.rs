// SPDX-License-Identifier: Apache-2.0
//! End to end: the RDMA data path with unmodified guests and tools (issue 5). Guests A and B, each
//! with a PVRDMA slot on one bridge of the test host, run rdma-core's and perftest's programs
//! against each other: `ibv_rc_pingpong` with data check and with completion events,
//! `ibv_ud_pingpong`, `ibv_srq_pingpong`, `ib_{write,read,send,atomic}_bw`,
//! `ib_{write,read,send}_lat`, `rping` over rdma_cm with its data verified, and librdmacm's
//! `rdma_server`/`rdma_client` (the endpoint API), `ucmatose` and `udaddy` each way; their VMMs share
//! the host, so the traffic should take the same-host channel (no RoCE frame on their TAPs). Guest
//! A also talks to a native endpoint, Linux Soft-RoCE (rxe0) in the test host, with
//! `ibv_rc_pingpong -c` and `ib_write_bw`, each side once as server and once as client. Last, A
//! and guest C, whose VMM has no same-host channel (`local=off`), run `ibv_rc_pingpong -c` and
//! `ib_write_bw` while netem drops some of the RoCE v2 requests sent to C (not its ACKs: see
//! tests/scenarios/rdma.sh's `netem_on`): they must still complete
//! and verify (RC retransmission), and the netem counters must show that frames were dropped.
//! A and guest D turn `share_memory=on` (issue 15; B has it off, so A and B keep the two-copy
//! path): between them `ibv_rc_pingpong -c` and `ib_{write,read,send}_bw` take the one-copy path,
//! which their VMMs' counters of described records must show.
//!
//! Every program must exit 0 on both sides and print what proves its data arrived. One test per
//! program or property, so that a failure names what broke. All tests share ONE run of
//! `tests/scenarios/rdma.sh` (one test-host boot with one vCPU, the guests at once, each running
//! `tests/guest/rdma.sh`; see those files for the protocol); each program is bounded there by
//! `timeout`, so a data path that hangs fails these tests instead of hanging them.

use std::fmt;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use e2e::results::{field, vmm_log_problems, KeyValues, SerialLog};
use e2e::steps::{self, Party as _, StepChecks, StepRun as Run};
use e2e::suite::{self, Checks, SetupError};
use e2e::testhost::{Hosts, Outcome};

const IP_A: &str = "10.12.0.1";
const IP_B: &str = "10.12.0.2";
const IP_C: &str = "10.12.0.3";
const IP_D: &str = "10.12.0.4";
const HOST_IP: &str = "10.12.0.254";

/// Iterations of the pingpongs, of perftest's programs and of rping (passed to the scenario).
const PP_ITERS: u64 = 50;
/// Iterations of the loss pingpong: enough RoCE frames (about 1000) that
/// 3% loss drops some in practically every run (0.97^1000 ~ 6e-14), where
/// PP_ITERS' ~260 frames left a zero-drop run at about 1 in 2500.
const LOSS_PP_ITERS: u64 = 200;
const PERF_ITERS: u64 = 100;
const PING_COUNT: u64 = 10;

/// Message sizes the guest script (tests/guest/rdma.sh) and the scenario use.
const RC_SIZE: u64 = 4096;
const UD_SIZE: u64 = 512;
const BW_SIZE: u64 = 16384;
const LAT_SIZE: u64 = 64;
/// ib_atomic_bw's message: one 8-byte atomic.
const ATOMIC_SIZE: u64 = 8;
/// QPs of the ibv_srq_pingpong run (its -q).
const SRQ_QPS: usize = 4;
/// Message sizes of the `share_memory=on` steps (A and D): more than one segment each (a
/// described record per segment).
const SHARE_RC_SIZE: u64 = 16384;
const SHARE_BW_SIZE: u64 = 65536;
/// rping's default message size (-S): the buffer holds size - 1 characters and a NUL.
const RPING_SIZE: usize = 64;

const GUESTS: [Party; 4] = [Party::A, Party::B, Party::C, Party::D];
/// The VMM log names of [`GUESTS`].
const NAMES: [&str; 4] = ["a", "b", "c", "d"];

/// Who ran one side of a step: a guest (results on its console) or the test host (Soft-RoCE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Party {
    A,
    B,
    C,
    D,
    Host,
}

impl steps::Party for Party {
    fn ip(self) -> &'static str {
        match self {
            Self::A => IP_A,
            Self::B => IP_B,
            Self::C => IP_C,
            Self::D => IP_D,
            Self::Host => HOST_IP,
        }
    }
}

impl fmt::Display for Party {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::A => "guest A",
            Self::B => "guest B",
            Self::C => "guest C",
            Self::D => "guest D",
            Self::Host => "the test host's Soft-RoCE",
        })
    }
}

struct Suite {
    outcome: Outcome,
    env: KeyValues,
    a: SerialLog,
    b: SerialLog,
    c: SerialLog,
    d: SerialLog,
}

fn suite() -> &'static Suite {
    static SUITE: OnceLock<Result<Suite, SetupError>> = OnceLock::new();
    suite::shared(&SUITE, || {
        let outcome = suite::run_vmm_scenario(
            "rdma",
            &[
                ("PP_ITERS", PP_ITERS.to_string()),
                ("LOSS_PP_ITERS", LOSS_PP_ITERS.to_string()),
                ("PERF_ITERS", PERF_ITERS.to_string()),
                ("PING_COUNT", PING_COUNT.to_string()),
            ],
            // Typically ~4 min; the guests have 1500 s (scenarios/rdma.sh), which only a data
            // path that hangs in every program needs.
            Duration::from_secs(1620),
            // Four L2 guests in this L1: single-threaded TCG (see Hosts::One).
            Hosts::One { l1_cpus: 1 },
        )?;
        Ok(Suite {
            env: suite::key_values(&outcome, "rdma.env")?,
            a: suite::serial_log(&outcome, "rdma-a-serial.log")?,
            b: suite::serial_log(&outcome, "rdma-b-serial.log")?,
            c: suite::serial_log(&outcome, "rdma-c-serial.log")?,
            d: suite::serial_log(&outcome, "rdma-d-serial.log")?,
            outcome,
        })
    })
}

impl Checks for Suite {
    /// Fails the test with `what`, the guests' set-up failures and the end of both VMM logs.
    fn fail(&self, what: &str) -> ! {
        let mut msg = what.to_string();
        for g in GUESTS {
            if let Some(why) = self.guest(g).marker("RDMA-FAIL ") {
                msg += &format!("\n{g}'s script failed: {why}");
            }
        }
        let logs: Vec<String> = NAMES.iter().map(|g| format!("rdma-{g}-vmm.log")).collect();
        panic!("{}", self.outcome.failure(&msg, &logs, 20))
    }

    fn record(&self) -> &KeyValues {
        &self.env
    }
}

impl StepChecks for Suite {
    type Party = Party;

    fn run(&self, step: &str, party: Party, side: &str) -> Run {
        let what = format!("{party} as {side} of {step}");
        if party == Party::Host {
            let key = |k: &str| self.env.get(&format!("{step}.{side}.{k}"));
            let raw_rc = key("rc").unwrap_or_else(|| {
                self.fail(&format!(
                    "{what}: never recorded (no {step}.{side}.rc in rdma.env)"
                ))
            });
            let log = format!("rdma-host-{step}-{side}.log");
            let text = std::fs::read_to_string(self.outcome.file(&log)).unwrap_or_default();
            return Run {
                rc: raw_rc.parse().ok(),
                raw_rc: raw_rc.to_string(),
                why: key("why").unwrap_or("").to_string(),
                secs: key("secs").unwrap_or("?").to_string(),
                attempts: key("attempts").unwrap_or("?").to_string(),
                text,
                what,
            };
        }
        self.run_in(self.guest(party), what, step, side)
    }
}

impl Suite {
    fn guest(&self, g: Party) -> &SerialLog {
        match g {
            Party::B => &self.b,
            Party::C => &self.c,
            Party::D => &self.d,
            _ => &self.a,
        }
    }

    fn vmm_log(&self, g: &str) -> PathBuf {
        self.outcome.file(&format!("rdma-{g}-vmm.log"))
    }

    /// The described records (`share_memory=on`'s one-copy path) the PVRDMA device of guest `g`
    /// sent, from the counters its VMM logged at exit (0 when the counter never moved).
    fn described(&self, g: &str) -> u64 {
        steps::described_records(&self.vmm_log(g)).unwrap_or_else(|| {
            self.fail(&format!(
                "the VMM of guest {g} logged no 'pvrdma: counters:' line (did it exit?)"
            ))
        })
    }

    /// A perftest program between `server` and `client`: both exit 0 and exchanged the peer's
    /// GID; the client reports `iters` iterations of `size` bytes.
    fn perftest(&self, step: &str, server: Party, client: Party, size: u64, iters: u64) {
        let runs = self.both_succeed(step, server, client);
        for (run, peer) in runs.iter().zip([client, server]) {
            let gid = format!("GID: {}", perftest_gid(peer.ip()));
            let remote = perftest_remote_gids(&run.text);
            self.expect_in(run, remote.iter().any(|g| g.contains(&gid)), || {
                format!("the peer's {gid} should be its remote address, got {remote:?}")
            });
        }
        let client_run = &runs[1];
        let results = perftest_results(&client_run.text);
        self.expect_in(
            client_run,
            results
                .iter()
                .any(|r| r.first() == Some(&size) && r.get(1) == Some(&iters)),
            || format!("no result line for {size} bytes x {iters} iterations (got {results:?})"),
        );
    }

    /// netem's counter `key` (sent or dropped) at the end of loss step `step`.
    fn netem(&self, step: &str, key: &str) -> u64 {
        let k = format!("netem.{step}.{key}");
        let v = self.env(&k);
        v.parse().unwrap_or_else(|_| {
            self.fail(&format!(
                "{k}={v}: no netem counters (netem={:?}; see netem-{step}.txt)",
                self.env.get("netem")
            ))
        })
    }
}

/// How perftest prints a GID: 16 bytes in decimal, `%02d` each (`00:...:255:255:10:12:00:01`).
fn perftest_gid(ipv4: &str) -> String {
    let mut bytes = vec!["00".to_string(); 10];
    bytes.extend(["255".to_string(), "255".to_string()]);
    bytes.extend(
        ipv4.split('.')
            .map(|o| format!("{:02}", o.parse::<u8>().unwrap_or(0))),
    );
    bytes.join(":")
}

/// The GID lines of perftest's `remote address:` blocks (the GID follows on the next line,
/// unless the guest script's heartbeat landed on the console in between).
fn perftest_remote_gids(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("RDMA-ALIVE "))
        .collect();
    lines
        .windows(2)
        .filter(|w| w[0].starts_with("remote address:") && w[1].starts_with("GID:"))
        .map(|w| w[1])
        .collect()
}

/// perftest's result rows: the numeric lines after a ` #bytes ...` header, as numbers (the
/// fields that are not whole numbers, the rates, are left out, so a row starts with bytes and
/// iterations).
fn perftest_results(text: &str) -> Vec<Vec<u64>> {
    let mut rows = Vec::new();
    let mut after_header = false;
    for line in text.lines() {
        if line.trim_start().starts_with("#bytes") {
            after_header = true;
            continue;
        }
        if after_header {
            let row: Vec<u64> = line
                .split_whitespace()
                .map_while(|w| w.parse().ok())
                .collect();
            if row.len() >= 2 {
                rows.push(row);
            }
        }
    }
    rows
}

#[test]
fn both_guests_complete_and_vmms_exit_cleanly() {
    let s = suite();
    for (g, name) in GUESTS.into_iter().zip(NAMES) {
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
        let gid = log
            .marker("RDMA-GID ")
            .unwrap_or_else(|| s.fail(&format!("{g}: no RDMA-GID")));
        s.expect(field(gid, "type") == Some("RoCE_v2"), || {
            format!("{g}: the programs should use a RoCE v2 GID: {gid}")
        });
        let exit = s.env(&format!("{name}_exit"));
        s.expect(exit == "0", || {
            let ended = SerialLog::read(&s.vmm_log(name))
                .ok()
                .and_then(|l| l.marker("VM ended").map(str::to_string));
            format!(
                "the VMM of {g} should exit 0 after the guest's poweroff, got {exit}{}",
                ended.map_or(String::new(), |e| format!(
                    " (it had logged 'VM ended{e}' and was still running 60 s later)"
                ))
            )
        });
    }
}

/// Neither a panic nor a syscall outside the thread's seccomp allow-list (issue 7).
#[test]
fn vmm_logs_have_no_panics() {
    let s = suite();
    for g in NAMES {
        let log = SerialLog::read(&s.vmm_log(g)).unwrap_or_else(|e| s.fail(&e.to_string()));
        for marker in ["panicked at", "forbidden syscall"] {
            let found = log.markers(marker);
            s.expect(found.is_empty(), || {
                format!("the VMM of guest {g}: {found:?}")
            });
        }
    }
}

#[test]
fn vmm_logs_have_no_warnings_or_errors() {
    let s = suite();
    for g in NAMES {
        let problems = vmm_log_problems(&s.vmm_log(g)).unwrap_or_else(|e| s.fail(&e.to_string()));
        s.expect(problems.is_empty(), || {
            format!(
                "the VMM of guest {g} logged warnings or errors (unmodified guests and tools, and \
                 a lossy link RC recovers from, should cause none):\n{}",
                problems.join("\n")
            )
        });
    }
}

#[test]
fn ibv_rc_pingpong_with_data_check_between_guests() {
    suite().pingpong("rc-data", Party::A, Party::B, PP_ITERS, RC_SIZE, 1);
}

#[test]
fn ibv_rc_pingpong_with_completion_events_between_guests() {
    suite().pingpong("rc-events", Party::A, Party::B, PP_ITERS, RC_SIZE, 1);
}

#[test]
fn ibv_ud_pingpong_between_guests() {
    suite().pingpong("ud", Party::A, Party::B, PP_ITERS, UD_SIZE, 1);
}

#[test]
fn ibv_srq_pingpong_between_guests() {
    suite().pingpong("srq", Party::A, Party::B, PP_ITERS, RC_SIZE, SRQ_QPS);
}

#[test]
fn ib_write_bw_between_guests() {
    suite().perftest("write-bw", Party::A, Party::B, BW_SIZE, PERF_ITERS);
}

#[test]
fn ib_read_bw_between_guests() {
    suite().perftest("read-bw", Party::A, Party::B, BW_SIZE, PERF_ITERS);
}

#[test]
fn ib_send_bw_between_guests() {
    suite().perftest("send-bw", Party::A, Party::B, BW_SIZE, PERF_ITERS);
}

#[test]
fn ib_atomic_bw_between_guests() {
    suite().perftest("atomic-bw", Party::A, Party::B, ATOMIC_SIZE, PERF_ITERS);
}

#[test]
fn ib_write_lat_between_guests() {
    suite().perftest("write-lat", Party::A, Party::B, LAT_SIZE, PERF_ITERS);
}

#[test]
fn ib_read_lat_between_guests() {
    suite().perftest("read-lat", Party::A, Party::B, LAT_SIZE, PERF_ITERS);
}

#[test]
fn ib_send_lat_between_guests() {
    suite().perftest("send-lat", Party::A, Party::B, LAT_SIZE, PERF_ITERS);
}

/// librdmacm's own tests of its API, between the guests and each way: both sides exit 0 and say
/// that they got to the end (`want` in the server's and in the client's output).
fn rdma_cm_program(step: &str, server: Party, client: Party, want: [&str; 2]) {
    let s = suite();
    let runs = s.both_succeed(step, server, client);
    for (run, want) in runs.iter().zip(want) {
        s.expect_in(run, run.text.contains(want), || format!("no '{want}'"));
    }
}

/// rdma_server and rdma_client: the endpoint API (rdma_getaddrinfo, rdma_create_ep,
/// rdma_post_recv/rdma_post_send, rdma_get_recv_comp), which the ESXi device does not support.
#[test]
fn rdma_create_ep_server_and_client_between_guests() {
    let want = ["rdma_server: end 0", "rdma_client: end 0"];
    rdma_cm_program("ep-ab", Party::A, Party::B, want);
    rdma_cm_program("ep-ba", Party::B, Party::A, want);
}

/// ucmatose: two RC connections over rdma_cm, ten 1 KiB messages each way on each.
#[test]
fn ucmatose_between_guests() {
    let want = ["test complete", "test complete"];
    rdma_cm_program("ucmatose-ab", Party::A, Party::B, want);
    rdma_cm_program("ucmatose-ba", Party::B, Party::A, want);
}

/// udaddy: two UD endpoints over rdma_cm (address handles from its events), ten messages each.
#[test]
fn udaddy_between_guests() {
    let want = ["test complete", "test complete"];
    rdma_cm_program("udaddy-ab", Party::A, Party::B, want);
    rdma_cm_program("udaddy-ba", Party::B, Party::A, want);
}

/// rping over rdma_cm (address and route resolution, CM MADs on QP1, then SEND, RDMA READ and
/// RDMA WRITE per ping): the client verifies every echo (-V) and prints it (-v), the server prints
/// what it read; both must be exactly what rping's client generates.
#[test]
fn rping_over_rdma_cm_verifies_its_data_between_guests() {
    suite().rping("rping", Party::A, Party::B, PING_COUNT, RPING_SIZE);
}

#[test]
fn soft_roce_comes_up_in_the_test_host() {
    let s = suite();
    s.expect(s.env.get("rxe_setup") == Some("ok"), || {
        format!(
            "Soft-RoCE (rxe0 on br0) did not come up in the test host: {:?} (see rxe-devinfo.txt)",
            s.env.get("rxe_why")
        )
    });
    let gid = s.env("rxe_gid");
    s.expect(gid == "0000:0000:0000:0000:0000:ffff:0a0c:00fe", || {
        format!(
            "rxe0's GID index {} is {gid}, not ::ffff:{HOST_IP}",
            s.env("rxe_gid_index")
        )
    });
}

#[test]
fn ibv_rc_pingpong_soft_roce_server_guest_client() {
    suite().pingpong(
        "rxe-rc-host-server",
        Party::Host,
        Party::A,
        PP_ITERS,
        RC_SIZE,
        1,
    );
}

#[test]
fn ibv_rc_pingpong_guest_server_soft_roce_client() {
    suite().pingpong(
        "rxe-rc-guest-server",
        Party::A,
        Party::Host,
        PP_ITERS,
        RC_SIZE,
        1,
    );
}

#[test]
fn ib_write_bw_soft_roce_server_guest_client() {
    suite().perftest(
        "rxe-write-bw-host-server",
        Party::Host,
        Party::A,
        BW_SIZE,
        PERF_ITERS,
    );
}

#[test]
fn ib_write_bw_guest_server_soft_roce_client() {
    suite().perftest(
        "rxe-write-bw-guest-server",
        Party::A,
        Party::Host,
        BW_SIZE,
        PERF_ITERS,
    );
}

/// Between two VMMs of one host (A, B and D, default `local=on`) RDMA goes through the same-host
/// channel: no RoCE v2 frame went to A's, B's or D's TAP while they ran their programs.
#[test]
fn guest_to_guest_traffic_takes_the_same_host_channel() {
    let s = suite();
    for tap in ["tapa", "tapb", "tapd"] {
        let key = format!("samehost.{tap}.frames");
        let frames = s.env(&key);
        s.expect(frames == "0", || {
            format!(
                "{frames} RoCE v2 frames went to {tap} while A and B ran their programs: the \
                 same-host channel should carry all of it (see tapa-classes.txt)"
            )
        });
    }
}

/// `share_memory=on` on both ends (A and D): the pingpong with its data checked.
#[test]
fn ibv_rc_pingpong_with_data_check_on_the_one_copy_path() {
    suite().pingpong("share-rc", Party::A, Party::D, PP_ITERS, SHARE_RC_SIZE, 1);
}

#[test]
fn ib_write_bw_on_the_one_copy_path() {
    suite().perftest(
        "share-write-bw",
        Party::A,
        Party::D,
        SHARE_BW_SIZE,
        PERF_ITERS,
    );
}

#[test]
fn ib_read_bw_on_the_one_copy_path() {
    suite().perftest(
        "share-read-bw",
        Party::A,
        Party::D,
        SHARE_BW_SIZE,
        PERF_ITERS,
    );
}

#[test]
fn ib_send_bw_on_the_one_copy_path() {
    suite().perftest(
        "share-send-bw",
        Party::A,
        Party::D,
        SHARE_BW_SIZE,
        PERF_ITERS,
    );
}

/// A's and D's payloads went as described records (WRITE and SEND from D, READ responses from
/// A, the pingpong both ways), and only theirs: B, whose VMM has the option off, sent none,
/// although A offered its view to B too.
#[test]
fn share_memory_pair_sends_described_records_and_the_others_none() {
    let s = suite();
    for g in ["a", "d"] {
        let n = s.described(g);
        s.expect(n > 0, || {
            format!(
                "the VMM of guest {g} (share_memory=on, peer with it on) sent no described \
                 record: its payloads took the two-copy path"
            )
        });
    }
    for g in ["b", "c"] {
        let n = s.described(g);
        s.expect(n == 0, || {
            format!("the VMM of guest {g} (share_memory off) sent {n} described records")
        });
    }
    e2e::announce(&format!(
        "rdma: described records sent: A {}, D {}",
        s.described("a"),
        s.described("d")
    ));
}

/// netem dropped RoCE v2 frames on their way to C during the run, and the pingpong still
/// completed with its data verified.
#[test]
fn ibv_rc_pingpong_recovers_from_frame_loss() {
    let s = suite();
    s.expect(s.env.get("netem") == Some("on"), || {
        format!(
            "netem could not be set up on C's TAP: netem={:?}",
            s.env.get("netem")
        )
    });
    let (sent, dropped) = (s.netem("loss-rc", "sent"), s.netem("loss-rc", "dropped"));
    s.expect(dropped > 0, || {
        format!(
            "netem dropped no RoCE frame during loss-rc ({sent} passed): the loss test tested \
             nothing (see netem-loss-rc.txt)"
        )
    });
    s.pingpong("loss-rc", Party::A, Party::C, LOSS_PP_ITERS, RC_SIZE, 1);
    e2e::announce(&format!(
        "rdma: ibv_rc_pingpong A<->C with {dropped} of {} RoCE frames to C dropped",
        sent + dropped
    ));
}

/// The same for RDMA WRITEs into C: their frames went through netem.
#[test]
fn ib_write_bw_recovers_from_frame_loss() {
    let s = suite();
    let sent = s.netem("loss-write-bw", "sent") - s.netem("loss-rc", "sent");
    let dropped = s.netem("loss-write-bw", "dropped") - s.netem("loss-rc", "dropped");
    s.expect(dropped > 0, || {
        format!(
            "netem dropped no RoCE frame during loss-write-bw ({sent} passed): the loss test \
             tested nothing (see netem-loss-write-bw.txt)"
        )
    });
    s.perftest("loss-write-bw", Party::C, Party::A, BW_SIZE, PERF_ITERS);
    e2e::announce(&format!(
        "rdma: ib_write_bw A->C with {dropped} of {} RoCE frames to C dropped",
        sent + dropped
    ));
}

#[cfg(test)]
mod helpers {
    use super::*;

    #[test]
    fn perftest_gids_and_results_parse() {
        assert_eq!(
            perftest_gid("10.12.0.254"),
            "00:00:00:00:00:00:00:00:00:00:255:255:10:12:00:254"
        );
        let out = " remote address: LID 0000 QPN 0x0011\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:12:00:02\n---\n #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 16384      100              0.00               0.00   \t\t   0.000000\n---\n";
        assert_eq!(perftest_results(out), vec![vec![16384, 100]]);
        assert_eq!(
            perftest_remote_gids(out),
            ["GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:12:00:02"]
        );
        let interleaved = " remote address: LID 0000 QPN 0x000f PSN 0x3d0b81\nRDMA-ALIVE role=a uptime=86\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:12:00:02\n";
        assert_eq!(
            perftest_remote_gids(interleaved),
            ["GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:12:00:02"]
        );
        let lat = " #bytes #iterations    t_min[usec]\n 64       100          5.10\n";
        assert_eq!(perftest_results(lat), vec![vec![64, 100]]);
    }
}

/// The guest kernels logged no WARNING, BUG or Call Trace.
#[test]
fn guest_kernels_log_no_warning_bug_or_trace() {
    suite::expect_clean_guest_kernels(&suite().outcome, &[]);
}

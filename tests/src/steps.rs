// SPDX-License-Identifier: Apache-2.0
//! Results of the guests' step protocol (`tests/guest/lib.sh`, used by `tests/guest/rdma.sh` and
//! `tests/guest/roce.sh`): one side of a program run between two parties, from its
//! `RDMA-RESULT` line and its output section; the checks of such runs ([`StepChecks`]); what
//! rping's client sends; and the counters a PVRDMA device logs when its VMM exits.

use std::collections::BTreeMap;
use std::fmt::Display;

use crate::results::{field, SerialLog};
use crate::suite::Checks;

/// One side of one program run, as recorded by whoever ran it.
pub struct StepRun {
    pub what: String,
    /// The exit status; None if the program never ran (`why` says why).
    pub rc: Option<i32>,
    pub raw_rc: String,
    pub why: String,
    pub secs: String,
    pub attempts: String,
    /// Its whole output (stdout and stderr).
    pub text: String,
}

impl StepRun {
    /// `side` ("server" or "client") of `step` as the guest whose console is `log` recorded it
    /// (`what` names it in messages); `None` without its `RDMA-RESULT` line.
    pub fn from_guest(log: &SerialLog, what: String, step: &str, side: &str) -> Option<Self> {
        let result = log
            .markers("RDMA-RESULT ")
            .into_iter()
            .find(|l| field(l, "step") == Some(step) && field(l, "side") == Some(side))?;
        let raw_rc = field(result, "rc").unwrap_or("?");
        Some(Self {
            rc: raw_rc.parse().ok(),
            raw_rc: raw_rc.to_string(),
            why: field(result, "why").unwrap_or("").to_string(),
            secs: field(result, "secs").unwrap_or("?").to_string(),
            attempts: field(result, "attempts").unwrap_or("?").to_string(),
            text: log
                .section(&format!("{step}-{side}"))
                .map(|s| s.text)
                .unwrap_or_default(),
            what,
        })
    }

    pub fn summary(&self) -> String {
        format!(
            "{}: exit status {} after {} s, {} attempt(s){}",
            self.what,
            self.raw_rc,
            self.secs,
            self.attempts,
            if self.why.is_empty() {
                String::new()
            } else {
                format!(" ({})", self.why)
            }
        )
    }
}

/// One party of the step protocol: a guest, or the test host.
pub trait Party: Copy + Display {
    /// The IPv4 address its programs use (their GID is its IPv4-mapped form).
    fn ip(self) -> &'static str;
}

/// The checks of step runs, for the suites whose guests run the step protocol.
pub trait StepChecks: Checks {
    type Party: Party;

    /// `party`'s `side` ("server" or "client") of `step`; fails the test if it never ran.
    fn run(&self, step: &str, party: Self::Party, side: &str) -> StepRun;

    /// `side` of `step` from the console `log`; fails the test, with the console's end, without
    /// its `RDMA-RESULT` line.
    fn run_in(&self, log: &SerialLog, what: String, step: &str, side: &str) -> StepRun {
        StepRun::from_guest(log, what.clone(), step, side).unwrap_or_else(|| {
            self.fail(&format!(
                "{what}: never recorded (no RDMA-RESULT line); the end of its console:\n{}",
                log.tail(15)
            ))
        })
    }

    /// Both sides of `step`, each of which must have exited 0.
    fn both_succeed(&self, step: &str, server: Self::Party, client: Self::Party) -> [StepRun; 2] {
        let runs = [
            self.run(step, server, "server"),
            self.run(step, client, "client"),
        ];
        if runs.iter().any(|r| r.rc != Some(0)) {
            let mut msg = format!("{step}: both sides must exit 0");
            for run in &runs {
                msg += &format!("\n---- {} ----\n{}", run.summary(), run.text.trim_end());
            }
            self.fail(&msg);
        }
        runs
    }

    /// Fails the test with `what` and `run`'s output unless `cond`.
    fn expect_in(&self, run: &StepRun, cond: bool, what: impl FnOnce() -> String) {
        if !cond {
            self.fail(&format!(
                "{}: {}\n---- its output ----\n{}",
                run.what,
                what(),
                run.text.trim_end()
            ));
        }
    }

    /// An rdma-core pingpong (`-c`) between `server` and `client`: both exit 0, count `iters`
    /// exchanges of `size` bytes each way, report no invalid data and talked to the peer's
    /// IPv4-mapped GID on each of their `qps` QPs.
    fn pingpong(
        &self,
        step: &str,
        server: Self::Party,
        client: Self::Party,
        iters: u64,
        size: u64,
        qps: usize,
    ) {
        let runs = self.both_succeed(step, server, client);
        for (run, peer) in runs.iter().zip([client, server]) {
            let bytes = size * iters * 2;
            for want in [format!("{bytes} bytes in "), format!("{iters} iters in ")] {
                self.expect_in(run, run.text.lines().any(|l| l.starts_with(&want)), || {
                    format!("no '{want}...' line")
                });
            }
            self.expect_in(run, !run.text.contains("invalid data"), || {
                "the received data did not verify".to_string()
            });
            let gid = format!("GID ::ffff:{}", peer.ip());
            let remote = run
                .text
                .lines()
                .filter(|l| l.trim_start().starts_with("remote address:"))
                .filter(|l| l.trim_end().ends_with(&gid))
                .count();
            self.expect_in(run, remote == qps, || {
                format!("expected {qps} 'remote address: ... {gid}' line(s), found {remote}")
            });
        }
    }

    /// `rping -v -V -C count -S size` between `server` and `client` ([`rping_problem`]).
    fn rping(&self, step: &str, server: Self::Party, client: Self::Party, count: u64, size: usize) {
        let [server, client] = self.both_succeed(step, server, client);
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        if let Some((run, why)) = rping_problem(&server, &client, count, size) {
            self.expect_in(run, false, || why);
        }
    }
}

/// What rping's client puts in its buffer for ping `n` (rping.c, rping_test_client): "rdma-ping-
/// n: " then printable characters from 'A' + n (mod 58) on, wrapping after 'z', up to size - 1.
pub fn rping_data(n: usize, size: usize) -> String {
    let mut s = format!("rdma-ping-{n}: ");
    let mut c = b'A' + u8::try_from(n % 58).unwrap_or(0);
    while s.len() < size - 1 {
        s.push(char::from(c));
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    s
}

/// What is wrong with an `rping -v -V -C count -S size` run, if anything, and on which side: the
/// client verifies every echo (-V) and prints it (-v), the server prints what it read; both must
/// be exactly the pings rping's client generates.
pub fn rping_problem<'a>(
    server: &'a StepRun,
    client: &'a StepRun,
    count: usize,
    size: usize,
) -> Option<(&'a StepRun, String)> {
    let want: Vec<String> = (0..count).map(|n| rping_data(n, size)).collect();
    for (run, prefix) in [(client, "ping data: "), (server, "server ping data: ")] {
        let got: Vec<&str> = run
            .text
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .collect();
        if got != want {
            return Some((
                run,
                format!("its '{prefix}' lines should be the {count} pings rping sent: {want:#?}"),
            ));
        }
    }
    client
        .text
        .contains("data mismatch")
        .then(|| (client, "the client's verification (-V) failed".to_string()))
}

/// The counters of the last `pvrdma: counters: name=value ...` line of a VMM's log (a PVRDMA
/// device logs those that moved when it goes away); `None` without one.
pub fn device_counters(vmm_log: &str) -> Option<BTreeMap<String, u64>> {
    let line = vmm_log
        .lines()
        .filter_map(|l| l.split_once("pvrdma: counters:").map(|(_, c)| c))
        .next_back()?;
    Some(
        line.split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            .collect(),
    )
}

/// The described records (the one-copy path, `share_memory=on`) the PVRDMA device of the VMM
/// whose log is `vmm_log` sent, from its exit's counters line (0 if that counter never moved);
/// `None` without the line (the VMM did not exit, or logged nothing).
pub fn described_records(vmm_log: &std::path::Path) -> Option<u64> {
    let log = std::fs::read_to_string(vmm_log).ok()?;
    Some(
        device_counters(&log)?
            .get("roce_local_described")
            .copied()
            .unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rping's default message size (-S).
    const RPING_SIZE: usize = 64;

    #[test]
    fn rping_data_is_what_rping_generates() {
        let first = rping_data(0, RPING_SIZE);
        assert_eq!(first.len(), RPING_SIZE - 1);
        assert_eq!(
            first,
            "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
        );
        // Ping 57 starts at 'z' and wraps to 'A'.
        assert!(rping_data(57, RPING_SIZE).starts_with("rdma-ping-57: zABC"));
        assert!(rping_data(58, RPING_SIZE).starts_with("rdma-ping-58: ABC"));
    }

    fn run(text: String) -> StepRun {
        StepRun {
            what: "test".into(),
            rc: Some(0),
            raw_rc: "0".into(),
            why: String::new(),
            secs: "1".into(),
            attempts: "1".into(),
            text,
        }
    }

    #[test]
    fn rping_problem_needs_every_ping_on_both_sides() {
        let pings = |prefix: &str, n: usize| -> String {
            (0..n)
                .map(|i| format!("{prefix}{}\n", rping_data(i, RPING_SIZE)))
                .collect()
        };
        let server = run(pings("server ping data: ", 3));
        let client = run(pings("ping data: ", 3));
        assert!(rping_problem(&server, &client, 3, RPING_SIZE).is_none());
        // A ping short on the server's side, one more than asked, a failed -V check.
        let short = run(pings("server ping data: ", 2));
        let (side, _) = rping_problem(&short, &client, 3, RPING_SIZE).unwrap();
        assert!(std::ptr::eq(side, &short));
        assert!(rping_problem(&server, &client, 2, RPING_SIZE).is_some());
        let bad = run(pings("ping data: ", 3) + "data mismatch!\n");
        let (side, why) = rping_problem(&server, &bad, 3, RPING_SIZE).unwrap();
        assert!(std::ptr::eq(side, &bad) && why.contains("-V"));
    }

    #[test]
    fn device_counters_parse_the_last_line() {
        let log = "[2026-11-27T10:00:00Z INFO  pvrdma] pvrdma: counters: roce_rx=5\n\
                   [2026-11-27T10:00:09Z INFO  pvrdma] pvrdma: counters: cmd_executed=42 roce_rx=120 roce_rx_vlan=118\n\
                   [2026-11-27T10:00:09Z INFO  pvrdma] pvrdma: QP at exit: qpn=17";
        let c = device_counters(log).unwrap();
        assert_eq!(c.get("roce_rx"), Some(&120));
        assert_eq!(c.get("roce_rx_vlan"), Some(&118));
        assert_eq!(c.get("roce_rx_v1"), None);
        assert_eq!(device_counters("nothing here"), None);
    }
}

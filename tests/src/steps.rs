// SPDX-License-Identifier: Apache-2.0
//! Results of the guests' step protocol (`tests/guest/lib.sh`, used by `tests/guest/rdma.sh` and
//! `tests/guest/roce.sh`): one side of a program run between two parties, from its
//! `RDMA-RESULT` line and its output section; what rping's client sends; and the counters a
//! PVRDMA device logs when its VMM exits.

use std::collections::BTreeMap;

use crate::results::{field, SerialLog};

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

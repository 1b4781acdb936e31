// SPDX-License-Identifier: Apache-2.0
//! The set-up the suites with guests share (`tests/net.rs`, `tests/pvrdma.rs`, `tests/rdma.rs`):
//! ONE run of a scenario with the VMM under test serves every test of a file, because an L1 boot
//! costs ~10 s and each nested guest ~15-30 s. The first test to ask runs it; the others wait for
//! it and get the same result, or the same set-up failure.

use std::sync::OnceLock;
use std::time::Duration;

use api::{DeviceCountersInfo, VmCounters};

use crate::results::{KeyValues, SerialLog};
use crate::testhost::{self, Hosts, Outcome, Scenario};
use crate::{assets, binaries};

/// Why a suite could not be set up: a message for every test of the file.
pub type SetupError = String;

/// The suite in `cell`, made by `init` on first use; a set-up failure fails every test with it.
/// Use with a `static` of the test file: `static SUITE: OnceLock<Result<Suite, SetupError>>`.
pub fn shared<T>(
    cell: &'static OnceLock<Result<T, SetupError>>,
    init: impl FnOnce() -> Result<T, SetupError>,
) -> &'static T
where
    T: Send + Sync,
{
    cell.get_or_init(init)
        .as_ref()
        .unwrap_or_else(|e| panic!("e2e setup failed: {e}"))
}

/// Runs `tests/scenarios/<name>.sh` with the VMM under test (`PVRDMA_VMM_BIN`) plus `env`, on
/// `hosts` and for at most `timeout`; the scenario must exit 0.
pub fn run_vmm_scenario(
    name: &str,
    env: &[(&str, String)],
    timeout: Duration,
    hosts: Hosts,
) -> Result<Outcome, SetupError> {
    let assets = assets::get().map_err(|e| e.to_string())?;
    let vmm = binaries::vmm().map_err(|e| e.to_string())?;
    let mut vars = vec![(binaries::VMM_ENV.to_string(), vmm.display().to_string())];
    vars.extend(env.iter().map(|(k, v)| ((*k).to_string(), v.clone())));
    let scenario = Scenario {
        name: name.to_string(),
        env: vars,
        timeout,
        hosts,
    };
    let outcome = testhost::run(&scenario, &assets).map_err(|e| e.to_string())?;
    if outcome.exit_code != Some(0) {
        return Err(format!("scenario {name} failed\n{}", outcome.context()));
    }
    Ok(outcome)
}

/// Kernel log lines that match the problem patterns but are expected: each with why.
const EXPECTED_KERNEL_LINES: &[&str] = &[
    // An advisory, not a WARN(): the test host's emulated EPYC has no SRSO microcode.
    "Speculative Return Stack Overflow: WARNING: See",
];

/// The lines of a guest kernel's log (see [`SerialLog::kernel_log`]) that show a problem: a
/// WARNING, BUG or Call Trace that is not in [`EXPECTED_KERNEL_LINES`].
pub fn kernel_problems<'a>(log: &[&'a str]) -> Vec<&'a str> {
    log.iter()
        .copied()
        .filter(|l| {
            ["WARNING:", "BUG:", "Call Trace:"]
                .iter()
                .any(|p| l.contains(p))
        })
        .filter(|l| !EXPECTED_KERNEL_LINES.iter().any(|e| l.contains(e)))
        .collect()
}

/// Fails unless every guest console of `outcome` (but the files named in `except`, guests that
/// are not ours) that reached guest/init's kernel check shows no unexpected kernel WARNING, BUG
/// or Call Trace, at least one did (a suite whose guests never got there proves nothing), and
/// no console that did not shows a kernel crash (quoted from its first line).
/// Every suite calls it from a test of its own.
pub fn expect_clean_guest_kernels(outcome: &Outcome, except: &[&str]) {
    let mut checked = 0;
    let mut problems = String::new();
    let ours = |p: &std::path::Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| !except.contains(&n))
    };
    for path in outcome.serial_logs().into_iter().filter(|p| ours(p)) {
        let log = SerialLog::read(&path).unwrap_or_else(|e| panic!("{e}\n{}", outcome.context()));
        let Some(lines) = log.kernel_log() else {
            if let Some(crash) = log.first_crash(40) {
                problems += &format!(
                    "---- {}: the guest kernel crashed before its check ----\n{crash}\n",
                    path.display()
                );
            }
            continue;
        };
        checked += 1;
        if !kernel_problems(&lines).is_empty() {
            problems += &format!("---- {} ----\n{}\n", path.display(), lines.join("\n"));
        }
    }
    assert!(
        checked > 0,
        "no guest console reached the kernel check (GUEST-KERNEL-CHECK)\n{problems}{}",
        outcome.context()
    );
    assert!(
        problems.is_empty(),
        "guest kernels logged a WARNING, BUG or Call Trace:\n{problems}{}",
        outcome.context()
    );
}

/// The `key=value` file `name` the scenario wrote to `$OUT`.
/// The checks every suite's tests are written with. A suite says how it fails (its scripts'
/// own failure lines, the tails of its logs) and where its scenario's `key=value` record is;
/// asserting and looking a value up are then the same everywhere.
pub trait Checks {
    /// Fails the test with `what` and the suite's context.
    fn fail(&self, what: &str) -> !;

    /// The scenario's `key=value` record (`<suite>.env`).
    fn record(&self) -> &KeyValues;

    fn expect(&self, cond: bool, what: impl FnOnce() -> String) {
        if !cond {
            self.fail(&what());
        }
    }

    /// The value of `key` in the record; fails the test if the scenario never wrote it.
    fn env(&self, key: &str) -> &str {
        let record = self.record();
        record
            .get(key)
            .unwrap_or_else(|| self.fail(&format!("{} has no {key}", record.name())))
    }
}

pub fn key_values(outcome: &Outcome, name: &str) -> Result<KeyValues, SetupError> {
    KeyValues::read(&outcome.file(name)).map_err(|e| format!("{e}\n{}", outcome.context()))
}

/// The QPN of an `ibv_rc_pingpong` address line ("local address: LID 0x0000, QPN 0x000002, ...").
pub fn pingpong_qpn(line: &str) -> Option<u32> {
    let q = line.split("QPN ").nth(1)?.split(',').next()?;
    u32::from_str_radix(q.trim().trim_start_matches("0x"), 16).ok()
}

/// Whether the `qpns=[..]` of a device's `pvrdma: saved`/`restored` line `ids` lists `qpn`: one
/// of them exactly ("0x1" is in "0x12" but is not it). The line lists a device's first 8 QPNs and
/// its last, enough for the few QPs of a test's guest.
pub fn lists_qpn(ids: &str, qpn: u32) -> bool {
    ids.split_once("qpns=[")
        .and_then(|(_, rest)| rest.split_once(']'))
        .is_some_and(|(list, _)| list.split(',').any(|q| q.trim() == format!("{qpn:#x}")))
}

/// The number of QPs ("N QPs qpns=[..]") of a device's `pvrdma: saved`/`restored` line `ids`.
pub fn qp_count(ids: &str) -> Option<usize> {
    ids.split_once(" QPs qpns=[")?
        .0
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// The serial log `name` in `$OUT`.
pub fn serial_log(outcome: &Outcome, name: &str) -> Result<SerialLog, SetupError> {
    SerialLog::read(&outcome.file(name)).map_err(|e| format!("{e}\n{}", outcome.context()))
}

/// One run of a scenario that drives VMMs through `pvrdma-remote` (the migration and snapshot
/// suites): its `<name>.env` results, the files it left in `$OUT`, and the logs whose ends a
/// failure shows.
pub struct RemoteSuite {
    outcome: Outcome,
    env: KeyValues,
    logs: &'static [&'static str],
}

impl Checks for RemoteSuite {
    /// Fails the test with `what` and the end of every log of the suite.
    fn fail(&self, what: &str) -> ! {
        let logs: Vec<String> = self.logs.iter().map(|s| (*s).to_string()).collect();
        panic!("{}", self.outcome.failure(what, &logs, 30));
    }

    fn record(&self) -> &KeyValues {
        &self.env
    }
}

impl RemoteSuite {
    /// Runs `tests/scenarios/<name>.sh` with `PVRDMA_REMOTE_BIN` set, on `hosts` (several L2
    /// guests per L1: one vCPU, see [`Hosts::One`]), and reads `<name>.env` (a pair's hosts:
    /// `<name>-a.env` and `<name>-b.env`).
    pub fn run(
        name: &str,
        timeout: Duration,
        hosts: Hosts,
        logs: &'static [&'static str],
    ) -> Result<Self, SetupError> {
        let bins = binaries::locate().map_err(|e| e.to_string())?;
        let outcome = run_vmm_scenario(
            name,
            &[("PVRDMA_REMOTE_BIN", bins.remote.display().to_string())],
            timeout,
            hosts,
        )?;
        // A pair of hosts records a file each: `<name>-a.env` and `<name>-b.env`.
        let env = match hosts {
            Hosts::One { .. } => key_values(&outcome, &format!("{name}.env"))?,
            Hosts::Pair => {
                let mut env = key_values(&outcome, &format!("{name}-a.env"))?;
                env.extend(key_values(&outcome, &format!("{name}-b.env"))?);
                env
            }
        };
        Ok(Self { outcome, env, logs })
    }

    /// See [`expect_clean_guest_kernels`].
    pub fn expect_clean_guest_kernels(&self) {
        expect_clean_guest_kernels(&self.outcome, &[]);
    }

    /// A recorded result.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.env.get(key)
    }

    /// Fails unless result `key` is `want`.
    pub fn expect_value(&self, key: &str, want: &str) {
        let got = self.env.get(key);
        if got != Some(want) {
            self.fail(&format!("{key}: expected {want}, got {got:?}"));
        }
    }

    /// File `name` of `$OUT`.
    pub fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.outcome.file(name))
            .unwrap_or_else(|e| self.fail(&format!("cannot read {name}: {e}")))
    }

    /// `vm.counters` as the scenario saved it (`pvrdma-remote counters`, exit status in
    /// `<key>_counters_rc`) in file `file` of `$OUT`.
    pub fn counters(&self, key: &str, file: &str) -> VmCounters {
        self.expect_value(&format!("{key}_counters_rc"), "0");
        serde_json::from_str(&self.text(file))
            .unwrap_or_else(|e| self.fail(&format!("{file} is not vm.counters: {e}")))
    }

    /// Counter `name` of device `d`, which must have it.
    pub fn counter(&self, d: &DeviceCountersInfo, name: &str) -> u64 {
        d.counters
            .get(name)
            .copied()
            .unwrap_or_else(|| self.fail(&format!("{} {} has no counter {name}", d.kind, d.id)))
    }

    /// The `N QPs qpns=[..] M MRs keys=[..] crc=..` part of the PVRDMA device's line starting with
    /// `prefix` (it logs one when it saves and when it restores) in `log`.
    pub fn peer_ids(&self, log: &str, prefix: &str) -> String {
        let text = self.text(log);
        let line = text
            .lines()
            .find_map(|l| l.split_once(prefix).map(|(_, ids)| ids.trim().to_string()));
        line.unwrap_or_else(|| self.fail(&format!("no '{prefix}' line in {log}")))
    }

    /// Fails unless `scripts/demo-guest.sh`'s programs (ibv_rc_pingpong and rping) ran across
    /// B's migration: started on B's source (console `<b>-serial.log`), finished on the
    /// destination (`<b2>-serial.log`) and on A (`<a>-serial.log`) with their data checked.
    pub fn expect_demo_across_migration(&self, a: &str, b: &str, b2: &str) {
        if !self
            .text(&format!("{b}-serial.log"))
            .contains("DEMO-TRAFFIC")
        {
            self.fail("B's traffic never started before the migration");
        }
        if !self
            .text(&format!("{a}-serial.log"))
            .contains("DEMO-OK server")
        {
            self.fail("guest A's ibv_rc_pingpong or rping failed");
        }
        if !self
            .text(&format!("{b2}-serial.log"))
            .contains("DEMO-OK client")
        {
            self.fail("guest B's programs did not finish on the destination");
        }
    }

    /// The QPNs and keys a guest's device saved (its log `saved_log`) and restored
    /// (`restored_log`); fails unless they are the same.
    pub fn expect_same_ids(&self, saved_log: &str, restored_log: &str) -> String {
        let saved = self.peer_ids(saved_log, "pvrdma: saved ");
        let restored = self.peer_ids(restored_log, "pvrdma: restored ");
        if saved != restored {
            self.fail(&format!(
                "{saved_log}: saved {saved} but {restored_log}: restored {restored}"
            ));
        }
        restored
    }

    /// Fails unless the QPN of its peer that `ibv_rc_pingpong` printed when it connected
    /// ("remote address: ..., QPN 0x..") on the console `serial` is among the `restored` ones
    /// ([`RemoteSuite::expect_same_ids`]): the peer's QP still talks to the QP it knew.
    pub fn expect_pingpong_peer_among(&self, restored: &str, serial: &str) {
        let qpn = self
            .text(serial)
            .lines()
            .find(|l| l.contains("remote address:"))
            .and_then(pingpong_qpn)
            .unwrap_or_else(|| {
                self.fail(&format!(
                    "no 'remote address: ... QPN' line of ibv_rc_pingpong in {serial}"
                ))
            });
        if !lists_qpn(restored, qpn) {
            self.fail(&format!(
                "the pingpong peer's QPN {qpn:#x} ({serial}) is not among the restored {restored}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pingpong_qpns_and_restored_lists() {
        let line = "  local address:  LID 0x0000, QPN 0x000012, PSN 0x33e177, GID ::ffff:10.17.0.1";
        assert_eq!(pingpong_qpn(line), Some(0x12));
        assert_eq!(pingpong_qpn("  local address:  LID 0x0000"), None);
        let ids = "pvrdma: restored 3 QPs qpns=[0x1, 0x12] keys=[0x100]";
        assert!(lists_qpn(ids, 0x12));
        assert_eq!(qp_count(ids), Some(3));
        assert_eq!(
            qp_count("4097 QPs qpns=[0x1,...,0x1001] 1 MRs keys=[]"),
            Some(4097)
        );
        assert_eq!(qp_count("qpns=[0x1]"), None);
        assert!(
            !lists_qpn("qpns=[0x12]", 0x1),
            "0x1 is in 0x12 but is not it"
        );
        assert!(!lists_qpn("qpns=", 0x1));
    }

    #[test]
    fn kernel_problems_skip_the_expected_lines() {
        let log = [
            "[ 0.63] Speculative Return Stack Overflow: WARNING: See https://kernel.org/doc/x",
            "[ 0.65] XSAVE consistency problem: size 832 != kernel_size 576",
            "[ 0.65] WARNING: CPU: 0 PID: 0 at arch/x86/kernel/fpu/xstate.c:606 x",
            "[ 0.66] Call Trace:",
            "[ 9.00] BUG: soft lockup - CPU#0 stuck for 22s!",
        ];
        assert_eq!(
            kernel_problems(&log),
            [log[2], log[3], log[4]],
            "the SRSO advisory is expected, the rest are problems"
        );
        assert!(kernel_problems(&log[..2]).is_empty());
    }
}

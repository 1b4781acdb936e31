// SPDX-License-Identifier: Apache-2.0
//! Runs a scenario script where stock guests can boot: inside the test host (L1) or directly.
//!
//! A scenario is `tests/scenarios/<name>.sh`, sourced after `tests/scenarios/lib.sh` by a
//! generated wrapper that exports the scenario's variables and `OUT`, the directory for results
//! (`/out` inside L1, the host directory it maps to otherwise). In TEST-HOST mode the wrapper also
//! loads kvm_amd through `resources/test-host/l1-common.sh`, and `run-l1.sh` boots L1 to run it.
//! Each run gets `target/e2e-runs/<name>/` (replaced by the next run of the same scenario):
//! `scenario.sh`, `run.log` (TEST-HOST: run-l1.sh's messages) and `out/` (results, `console.log`).
//!
//! A scenario on two hosts ([`Hosts::Pair`]) always runs in two test hosts joined by a cable
//! (`resources/test-host/run-l1-pair.sh`), in either mode: the wrapper of host `a` and of host `b`
//! (`scenario-a.sh`, `scenario-b.sh`) export `PVRDMA_HOST`, and `OUT` is `/share`, the directory
//! both see (`out/share/`; each L1's console is in `out/l1-a/` and `out/l1-b/`).

use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::assets::{resources_dir, Assets};
use crate::host::{self, Mode};
use crate::results::tail_of;
use crate::wait::wait_until;
use crate::{announce, workspace_root, Error, Result};

/// Time the runner gets beyond the scenario's own limit: L1's boot and power-off, and run-l1.sh's
/// grace period before it kills QEMU.
const RUNNER_GRACE: Duration = Duration::from_secs(90);
/// How long a runner may wait for the machine's L1 lock (resources/test-host/l1-lock.sh), plus
/// a minute for its own start.
const L1_LOCK_WAIT: Duration = Duration::from_secs(3660);

/// run-l1.sh's exit status when L1 stopped making progress (see `resources/test-host/run-l1.sh`).
const L1_STALLED: i32 = 126;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// `tests/scenarios/<name>.sh`.
    pub name: String,
    /// Variables exported to the script.
    pub env: Vec<(String, String)>,
    /// Hard limit for the script (L1 is killed when it is reached).
    pub timeout: Duration,
    pub hosts: Hosts,
}

/// The machines a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hosts {
    /// This host (DIRECT) or one test host with `l1_cpus` vCPUs. Use 1 when the scenario runs
    /// more than one L2 guest: nested guests under multi-threaded TCG hung or reset in 3 of 5
    /// runs (resources/test-host/run-l1.sh).
    One { l1_cpus: u32 },
    /// Two test hosts (one vCPU each) joined by a cable, host `a` and host `b`.
    Pair,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub mode: Mode,
    /// The run directory.
    pub dir: PathBuf,
    /// What the scenario wrote as `$OUT`.
    pub out: PathBuf,
    /// The script's exit status (None if it was killed by a signal).
    pub exit_code: Option<i32>,
    pub elapsed: Duration,
    /// Where each machine's `console.log` is (TEST-HOST: also run-l1.sh's `l1-stalled`).
    pub machines: Vec<PathBuf>,
}

impl Outcome {
    /// A file the scenario wrote to `$OUT`.
    pub fn file(&self, name: &str) -> PathBuf {
        self.out.join(name)
    }

    /// The text of a file the scenario wrote to `$OUT`; the error names the file.
    pub fn read(&self, name: &str) -> std::result::Result<String, String> {
        let path = self.file(name);
        fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// A failure message: `what`, the last `lines` lines of each of `logs` (files in `$OUT`; the
    /// missing ones are skipped) and [`Outcome::context`].
    pub fn failure(&self, what: &str, logs: &[String], lines: usize) -> String {
        let mut msg = format!("{what}\n");
        for log in logs {
            let path = self.file(log);
            if path.exists() {
                msg += &tail_of(&path, lines);
                msg.push('\n');
            }
        }
        msg + &self.context()
    }

    /// Where to look, for failure messages: mode, run directory, the end of each console and of
    /// the runner's messages (TEST-HOST mode: why L1 ended).
    pub fn context(&self) -> String {
        let mut s = format!(
            "[mode {}, run dir {}, scenario exit {:?} after {:.0} s]",
            self.mode,
            self.dir.display(),
            self.exit_code,
            self.elapsed.as_secs_f64(),
        );
        for machine in &self.machines {
            s.push('\n');
            s += &tail_of(&machine.join("console.log"), 40);
        }
        let runner_log = self.dir.join("run.log");
        if runner_log.exists() {
            s.push('\n');
            s += &tail_of(&runner_log, 4);
        }
        s
    }

    /// Every guest console the scenario wrote (`*serial*.log` under `$OUT`, those of a pair's
    /// hosts included).
    pub fn serial_logs(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            let Ok(entries) = fs::read_dir(dir) else {
                return;
            };
            for path in entries.flatten().map(|e| e.path()) {
                if path.is_dir() {
                    walk(&path, out);
                } else if path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.contains("serial") && n.ends_with(".log"))
                {
                    out.push(path);
                }
            }
        }
        let mut logs = Vec::new();
        walk(&self.out, &mut logs);
        logs.sort();
        logs
    }

    /// Whether a test host stopped making progress (run-l1.sh's `l1-stalled`).
    fn stalled(&self) -> bool {
        self.machines.iter().any(|m| m.join("l1-stalled").exists())
    }
}

/// Runs `scenario` in this host's mode (see [`host::mode`]) and waits for it, at most
/// `scenario.timeout` plus the runner's grace time.
///
/// In TEST-HOST mode a run whose L1 stalled (run-l1.sh's exit status 126: the test host itself
/// stopped making progress, a known hazard of nested guests under TCG, and no verdict on the code
/// under test) is run once more; its logs stay in `target/e2e-runs/<name>.stalled/`.
pub fn run(scenario: &Scenario, assets: &Assets) -> Result<Outcome> {
    let mode = match (host::mode()?, scenario.hosts) {
        (Mode::Direct, Hosts::Pair) => {
            announce(&format!(
                "scenario {}: two machines, so two test hosts (TEST-HOST mode) even here",
                scenario.name
            ));
            Mode::TestHost
        }
        (mode, _) => mode,
    };
    let outcome = run_once(scenario, assets, mode)?;
    if outcome.exit_code != Some(L1_STALLED) || !outcome.stalled() {
        return Ok(outcome);
    }
    let kept = runs_dir().join(format!("{}.stalled", scenario.name));
    if kept.exists() {
        fs::remove_dir_all(&kept).map_err(|e| io_error("remove", &kept, &e))?;
    }
    fs::rename(&outcome.dir, &kept).map_err(|e| io_error("keep the stalled run in", &kept, &e))?;
    announce(&format!(
        "scenario {}: THE TEST HOST STALLED (not a test verdict); logs kept in {}; running it once more",
        scenario.name,
        kept.display()
    ));
    run_once(scenario, assets, mode)
}

fn run_once(scenario: &Scenario, assets: &Assets, mode: Mode) -> Result<Outcome> {
    let dir = runs_dir().join(&scenario.name);
    let out = out_dir(&scenario.name);
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| io_error("remove old run dir", &dir, &e))?;
    }
    fs::create_dir_all(&out).map_err(|e| io_error("create", &out, &e))?;
    let runner = resources_dir().join("test-host");
    // The runner's command, where its output goes (TEST-HOST: run-l1.sh's own messages, as it
    // copies each L1 console itself; DIRECT: the script's output is the console), where the
    // scenario's results land and where each machine's console is.
    let (mut cmd, log_path, results, machines) = match (mode, scenario.hosts) {
        (Mode::TestHost, Hosts::One { l1_cpus }) => {
            let script = write_wrapper(scenario, mode, assets, &dir, "", Path::new("/out"))?;
            let mut c = Command::new("bash");
            c.arg(runner.join("run-l1.sh"))
                .arg("--script")
                .arg(&script)
                .arg("--out")
                .arg(&out)
                .arg("--smp")
                .arg(l1_cpus.to_string());
            (c, dir.join("run.log"), out.clone(), vec![out.clone()])
        }
        (Mode::TestHost, Hosts::Pair) => {
            let share = Path::new("/share");
            let a = write_wrapper(scenario, mode, assets, &dir, "a", share)?;
            let b = write_wrapper(scenario, mode, assets, &dir, "b", share)?;
            let mut c = Command::new("bash");
            c.arg(runner.join("run-l1-pair.sh"))
                .arg("--script-a")
                .arg(&a)
                .arg("--script-b")
                .arg(&b)
                .arg("--out")
                .arg(&out);
            let machines = vec![out.join("l1-a"), out.join("l1-b")];
            (c, dir.join("run.log"), out.join("share"), machines)
        }
        (Mode::Direct, _) => {
            let script = write_wrapper(scenario, mode, assets, &dir, "", &out)?;
            let mut c = Command::new("timeout");
            c.arg("-k")
                .arg("15")
                .arg(scenario.timeout.as_secs().to_string())
                .arg("bash")
                .arg(&script);
            (c, out.join("console.log"), out.clone(), vec![out.clone()])
        }
    };
    if mode == Mode::TestHost {
        cmd.arg("--timeout")
            .arg(scenario.timeout.as_secs().to_string())
            .arg("--assets")
            .arg(&assets.dir);
    }
    let log = File::create(&log_path).map_err(|e| io_error("create", &log_path, &e))?;
    let log2 = log
        .try_clone()
        .map_err(|e| io_error("reopen", &log_path, &e))?;
    // Own process group: on a timeout, killing it stops the runner and every VMM it started.
    cmd.stdout(log)
        .stderr(log2)
        .stdin(Stdio::null())
        .process_group(0);

    announce(&format!(
        "scenario {}: running in {mode} mode (limit {} s), logs in {}",
        scenario.name,
        scenario.timeout.as_secs(),
        dir.display()
    ));
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::new(format!("cannot start scenario {}: {e}", scenario.name)))?;
    // In TEST-HOST mode the runner first waits (up to an hour) for the machine's L1 lock, which
    // another suite may hold; the scenario's limit starts once it has the lock.
    let locked = (mode == Mode::TestHost).then(|| out.join("l1-locked"));
    let status = wait_for_exit(
        &mut child,
        locked.as_deref(),
        scenario.timeout + RUNNER_GRACE,
        &scenario.name,
        &log_path,
    )?;
    let outcome = Outcome {
        mode,
        dir,
        out: results,
        exit_code: status.code(),
        elapsed: start.elapsed(),
        machines,
    };
    announce(&format!(
        "scenario {}: exit {:?} after {:.0} s",
        scenario.name,
        outcome.exit_code,
        outcome.elapsed.as_secs_f64()
    ));
    Ok(outcome)
}

/// Waits for the runner: first, if `locked` is given, until that file appears (the runner holds
/// the L1 lock) or the runner ends, then at most `limit` for it to end.
fn wait_for_exit(
    child: &mut Child,
    locked: Option<&Path>,
    limit: Duration,
    name: &str,
    log: &Path,
) -> Result<ExitStatus> {
    let poll = Duration::from_millis(250);
    let lock_wait = locked.map_or(Ok(()), |marker| {
        wait_until(
            &format!("scenario {name} to get the L1 lock"),
            L1_LOCK_WAIT,
            poll,
            || (marker.exists() || child.try_wait().ok().flatten().is_some()).then_some(()),
        )
    });
    let waited = lock_wait.and_then(|()| {
        wait_until(&format!("scenario {name} to finish"), limit, poll, || {
            child.try_wait().unwrap_or(None)
        })
    });
    waited.map_err(|e| {
        // The runner and everything it started (QEMU, VMMs) share its process group.
        let _ = Command::new("kill")
            .arg("-KILL")
            .arg("--")
            .arg(format!("-{}", child.id()))
            .status();
        let _ = child.wait();
        Error::new(format!("{e}; killed it\n{}", tail_of(log, 30)))
    })
}

/// Where a run of scenario `name` will have its `$OUT` ([`Outcome::out`]), for a benchmark that
/// watches the run's files while it runs.
pub fn out_dir(name: &str) -> PathBuf {
    runs_dir().join(name).join("out")
}

/// `target/e2e-runs` of this workspace (or of `$CARGO_TARGET_DIR`).
fn runs_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("e2e-runs")
}

/// Writes `<dir>/scenario[-<host>].sh`, the script a machine runs: `host` (empty for a scenario
/// on one machine) is exported as `PVRDMA_HOST`, `out` (as the machine sees it) as `OUT`.
fn write_wrapper(
    scenario: &Scenario,
    mode: Mode,
    assets: &Assets,
    dir: &Path,
    host: &str,
    out: &Path,
) -> Result<PathBuf> {
    let scenarios = workspace_root().join("tests/scenarios");
    let body = scenarios.join(format!("{}.sh", scenario.name));
    if !body.is_file() {
        return Err(Error::new(format!("no scenario script {}", body.display())));
    }
    let mut s = format!(
        "#!/bin/bash\n# Generated by e2e::testhost for scenario {name} ({mode} mode).\nset -euo pipefail\n",
        name = scenario.name
    );
    let mode_name = match mode {
        Mode::TestHost => "test-host",
        Mode::Direct => "direct",
    };
    let mut vars = vec![
        ("PVRDMA_E2E_MODE".to_string(), mode_name.to_string()),
        ("OUT".to_string(), out.display().to_string()),
        (
            "PVRDMA_ASSETS_ENV".to_string(),
            assets.env_file().display().to_string(),
        ),
    ];
    if !host.is_empty() {
        vars.push(("PVRDMA_HOST".to_string(), host.to_string()));
    }
    for (key, value) in vars.iter().chain(&scenario.env) {
        s += &format!("export {key}={}\n", shell_quote(value));
    }
    if mode == Mode::TestHost {
        let common = resources_dir().join("test-host/l1-common.sh");
        s += &format!(
            ". {}\nl1_setup_kvm\n",
            shell_quote(&common.display().to_string())
        );
    }
    for file in [scenarios.join("lib.sh"), body] {
        s += &format!(". {}\n", shell_quote(&file.display().to_string()));
    }
    let name = if host.is_empty() {
        "scenario.sh".to_string()
    } else {
        format!("scenario-{host}.sh")
    };
    let path = dir.join(name);
    fs::write(&path, s).map_err(|e| io_error("write", &path, &e))?;
    Ok(path)
}

/// Single-quotes `s` for bash.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn io_error(what: &str, path: &Path, e: &std::io::Error) -> Error {
    Error::new(format!("cannot {what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quote_survives_quotes_and_spaces() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("printf %s {}", shell_quote("x'$HOME\" `y`")))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "x'$HOME\" `y`");
    }
}

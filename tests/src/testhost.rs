// SPDX-License-Identifier: Apache-2.0
//! Runs a scenario script where stock guests can boot: inside the test host (L1) or directly.
//!
//! A scenario is `tests/scenarios/<name>.sh`, sourced after `tests/scenarios/lib.sh` by a
//! generated wrapper that exports the scenario's variables and `OUT`, the directory for results
//! (`/out` inside L1, the host directory it maps to otherwise). In TEST-HOST mode the wrapper also
//! loads kvm_amd through `resources/test-host/l1-common.sh`, and `run-l1.sh` boots L1 to run it.
//! Each run gets `target/e2e-runs/<name>/` (replaced by the next run of the same scenario):
//! `scenario.sh`, `run.log` (TEST-HOST: run-l1.sh's messages) and `out/` (results, `console.log`).

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
    /// vCPUs of L1. Use 1 when the scenario runs more than one L2 guest: nested guests under
    /// multi-threaded TCG hung or reset in 3 of 5 runs (resources/test-host/run-l1.sh).
    pub l1_cpus: u32,
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
}

impl Outcome {
    /// A file the scenario wrote to `$OUT`.
    pub fn file(&self, name: &str) -> PathBuf {
        self.out.join(name)
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

    /// Where to look, for failure messages: mode, run directory, the end of the console and of
    /// the runner's messages (TEST-HOST mode: why L1 ended).
    pub fn context(&self) -> String {
        let mut s = format!(
            "[mode {}, run dir {}, scenario exit {:?} after {:.0} s]\n{}",
            self.mode,
            self.dir.display(),
            self.exit_code,
            self.elapsed.as_secs_f64(),
            tail_of(&self.file("console.log"), 40)
        );
        let runner_log = self.dir.join("run.log");
        if runner_log.exists() {
            s.push('\n');
            s += &tail_of(&runner_log, 4);
        }
        s
    }
}

/// Runs `scenario` in this host's mode (see [`host::mode`]) and waits for it, at most
/// `scenario.timeout` plus the runner's grace time.
///
/// In TEST-HOST mode a run whose L1 stalled (run-l1.sh's exit status 126: the test host itself
/// stopped making progress, a known hazard of nested guests under TCG, and no verdict on the code
/// under test) is run once more; its logs stay in `target/e2e-runs/<name>.stalled/`.
pub fn run(scenario: &Scenario, assets: &Assets) -> Result<Outcome> {
    let mode = host::mode()?;
    let outcome = run_once(scenario, assets, mode)?;
    if mode != Mode::TestHost
        || outcome.exit_code != Some(L1_STALLED)
        || outcome.file("l1-rc").exists()
    {
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
    let out = dir.join("out");
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| io_error("remove old run dir", &dir, &e))?;
    }
    fs::create_dir_all(&out).map_err(|e| io_error("create", &out, &e))?;
    let script = dir.join("scenario.sh");
    fs::write(&script, wrapper(scenario, mode, assets, &out)?)
        .map_err(|e| io_error("write", &script, &e))?;
    // Where the runner's output goes: in TEST-HOST mode run-l1.sh's own messages (it copies the L1
    // console to out/console.log itself); in DIRECT mode the script's output is the console.
    let (mut cmd, log_path) = match mode {
        Mode::TestHost => {
            let mut c = Command::new("bash");
            c.arg(resources_dir().join("test-host/run-l1.sh"))
                .arg("--script")
                .arg(&script)
                .arg("--out")
                .arg(&out)
                .arg("--timeout")
                .arg(scenario.timeout.as_secs().to_string())
                .arg("--smp")
                .arg(scenario.l1_cpus.to_string())
                .arg("--assets")
                .arg(&assets.dir);
            (c, dir.join("run.log"))
        }
        Mode::Direct => {
            let mut c = Command::new("timeout");
            c.arg("-k")
                .arg("15")
                .arg(scenario.timeout.as_secs().to_string())
                .arg("bash")
                .arg(&script);
            (c, out.join("console.log"))
        }
    };
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
    let status = wait_for_exit(
        &mut child,
        scenario.timeout + RUNNER_GRACE,
        &scenario.name,
        &log_path,
    )?;
    let outcome = Outcome {
        mode,
        dir,
        out,
        exit_code: status.code(),
        elapsed: start.elapsed(),
    };
    announce(&format!(
        "scenario {}: exit {:?} after {:.0} s",
        scenario.name,
        outcome.exit_code,
        outcome.elapsed.as_secs_f64()
    ));
    Ok(outcome)
}

fn wait_for_exit(child: &mut Child, limit: Duration, name: &str, log: &Path) -> Result<ExitStatus> {
    let waited = wait_until(
        &format!("scenario {name} to finish"),
        limit,
        Duration::from_millis(250),
        || child.try_wait().unwrap_or(None),
    );
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

/// `target/e2e-runs` of this workspace (or of `$CARGO_TARGET_DIR`).
fn runs_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("e2e-runs")
}

fn wrapper(scenario: &Scenario, mode: Mode, assets: &Assets, out: &Path) -> Result<String> {
    let scenarios = workspace_root().join("tests/scenarios");
    let body = scenarios.join(format!("{}.sh", scenario.name));
    if !body.is_file() {
        return Err(Error::new(format!("no scenario script {}", body.display())));
    }
    let out_in_runner = match mode {
        Mode::TestHost => Path::new("/out"),
        Mode::Direct => out,
    };
    let mut s = format!(
        "#!/bin/bash\n# Generated by e2e::testhost for scenario {name} ({mode} mode).\nset -euo pipefail\n",
        name = scenario.name
    );
    let mode_name = match mode {
        Mode::TestHost => "test-host",
        Mode::Direct => "direct",
    };
    let vars = [
        ("PVRDMA_E2E_MODE".to_string(), mode_name.to_string()),
        ("OUT".to_string(), out_in_runner.display().to_string()),
        (
            "PVRDMA_ASSETS_ENV".to_string(),
            assets.env_file().display().to_string(),
        ),
    ];
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
    Ok(s)
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

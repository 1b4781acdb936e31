// SPDX-License-Identifier: Apache-2.0
//! The set-up the suites with guests share (`tests/net.rs`, `tests/pvrdma.rs`, `tests/rdma.rs`):
//! ONE run of a scenario with the VMM under test serves every test of a file, because an L1 boot
//! costs ~10 s and each nested guest ~15-30 s. The first test to ask runs it; the others wait for
//! it and get the same result, or the same set-up failure.

use std::sync::OnceLock;
use std::time::Duration;

use crate::results::{KeyValues, SerialLog};
use crate::testhost::{self, Outcome, Scenario};
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

/// Runs `tests/scenarios/<name>.sh` with the VMM under test (`PVRDMA_VMM_BIN`) plus `env`, in an
/// L1 of `l1_cpus` vCPUs (TEST-HOST mode) and at most `timeout`; the scenario must exit 0.
pub fn run_vmm_scenario(
    name: &str,
    env: &[(&str, String)],
    timeout: Duration,
    l1_cpus: u32,
) -> Result<Outcome, SetupError> {
    let assets = assets::get().map_err(|e| e.to_string())?;
    let vmm = binaries::vmm().map_err(|e| e.to_string())?;
    let mut vars = vec![(binaries::VMM_ENV.to_string(), vmm.display().to_string())];
    vars.extend(env.iter().map(|(k, v)| ((*k).to_string(), v.clone())));
    let scenario = Scenario {
        name: name.to_string(),
        env: vars,
        timeout,
        l1_cpus,
    };
    let outcome = testhost::run(&scenario, &assets).map_err(|e| e.to_string())?;
    if outcome.exit_code != Some(0) {
        return Err(format!("scenario {name} failed\n{}", outcome.context()));
    }
    Ok(outcome)
}

/// The `key=value` file `name` the scenario wrote to `$OUT`.
pub fn key_values(outcome: &Outcome, name: &str) -> Result<KeyValues, SetupError> {
    KeyValues::read(&outcome.file(name)).map_err(|e| format!("{e}\n{}", outcome.context()))
}

/// The serial log `name` in `$OUT`.
pub fn serial_log(outcome: &Outcome, name: &str) -> Result<SerialLog, SetupError> {
    SerialLog::read(&outcome.file(name)).map_err(|e| format!("{e}\n{}", outcome.context()))
}

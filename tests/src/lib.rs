// SPDX-License-Identifier: Apache-2.0
//! Infrastructure for pvrdma-vmm's end-to-end tests: real Linux guests booted by the real VMM.
//!
//! A test describes a [`testhost::Scenario`]: a shell script (under `tests/scenarios/`) that starts
//! VMMs and writes what it observed to `$OUT`. [`testhost::run`] runs it where a stock kernel can
//! boot: directly on this host when its `/dev/kvm` can do that, otherwise inside the nested test
//! host (L1, see `resources/test-host/`). The test then checks the files in `$OUT` from Rust.
//!
//! - [`host`]: which of the two modes applies (printed loudly, once per process).
//! - [`assets`]: the guest kernel, initramfs, root disk and L1 image (`resources/build-assets.sh`).
//! - [`binaries`]: where the VMM binaries under test are.
//! - [`results`]: reading the scenario's `key=value` files and the guests' serial logs.
//! - [`steps`]: the results of the guests' step protocol (`tests/guest/lib.sh`), rping's data
//!   and the PVRDMA counters a VMM logs at exit.
//! - [`suite`]: one scenario run shared by all tests of a file.
//! - [`wait`]: bounded waiting.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

pub mod assets;
pub mod bench;
pub mod binaries;
pub mod blackout;
pub mod host;
pub mod results;
pub mod steps;
pub mod suite;
pub mod testhost;
pub mod wait;

/// What went wrong in the test infrastructure, as a message a person can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(String);

impl Error {
    pub fn new(msg: impl Into<String>) -> Self {
        Self(msg.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir.parent().unwrap_or(crate_dir).to_path_buf()
}

/// Prints a line on the real stderr, past the test harness's output capture: what mode ran, which
/// binary was tested and where the logs are must show even when every test passes.
pub fn announce(line: &str) {
    // Nothing useful can be done if stderr is gone; the test goes on.
    let _ = writeln!(std::io::stderr().lock(), "e2e: {line}");
}

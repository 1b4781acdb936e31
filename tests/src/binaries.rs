// SPDX-License-Identifier: Apache-2.0
//! The binaries under test: `pvrdma-vmm` and its API client `pvrdma-remote`; and this crate's
//! `rdmacm-mux-stub`, which bench-rdma's QEMU pvrdma guests need.
//!
//! They are built before the tests run (`cargo build --release --bins`; `.ci/run` does it) and
//! found through `PVRDMA_VMM_BIN` / `PVRDMA_REMOTE_BIN` / `PVRDMA_MUX_BIN`, else in `$CARGO_TARGET_DIR/release` or
//! the workspace's `target/release`. A missing binary is an error that says how to build it.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::{announce, workspace_root, Error, Result};

pub const VMM_ENV: &str = "PVRDMA_VMM_BIN";
pub const REMOTE_ENV: &str = "PVRDMA_REMOTE_BIN";
pub const MUX_ENV: &str = "PVRDMA_MUX_BIN";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmmBinaries {
    pub vmm: PathBuf,
    pub remote: PathBuf,
}

/// Finds both binaries and announces which VMM (and how old) the tests will run.
pub fn locate() -> Result<VmmBinaries> {
    Ok(VmmBinaries {
        vmm: vmm()?,
        remote: find(REMOTE_ENV, "pvrdma-remote")?,
    })
}

/// Finds `pvrdma-vmm` alone (for users that drive no API) and announces it.
pub fn vmm() -> Result<PathBuf> {
    let path = find(VMM_ENV, "pvrdma-vmm")?;
    announce(&format!(
        "VMM under test: {} (built {})",
        path.display(),
        age(&path)
    ));
    Ok(path)
}

/// Finds `rdmacm-mux-stub` (`src/bin/rdmacm-mux-stub.rs`): `cargo run --bin bench-rdma` does not
/// build it.
pub fn mux_stub() -> Result<PathBuf> {
    find(MUX_ENV, "rdmacm-mux-stub")
}

fn release_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("release")
}

fn find(env: &str, name: &str) -> Result<PathBuf> {
    let (path, origin) = match std::env::var_os(env) {
        Some(p) if !p.is_empty() => (PathBuf::from(p), format!("${env}")),
        _ => (
            release_dir().join(name),
            format!("in the release target dir; or set {env}"),
        ),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::new(format!(
            "{name} not found at {} ({origin}): build it first with `cargo build --release --bins`",
            path.display()
        )))
    }
}

/// "N min ago" from the file's mtime: a stale binary is the classic way to test the wrong code.
fn age(path: &Path) -> String {
    let elapsed = path
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok());
    match elapsed {
        Some(d) => format!("{} min ago", d.as_secs() / 60),
        None => "at an unknown time".to_string(),
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The guest and test-host images, built (or found in the cache) by `resources/build-assets.sh`.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::{announce, workspace_root, Error, Result};

/// Paths of the assets, as listed in `assets.env`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assets {
    /// The directory holding `assets.env`.
    pub dir: PathBuf,
    /// Kernel release of the guest (and L1) kernel, e.g. `6.1.0-56-amd64`.
    pub kver: String,
    pub kernel: PathBuf,
    pub modules: PathBuf,
    pub guest_initramfs: PathBuf,
    pub rootfs: PathBuf,
    /// What the guest prints after `ROOTDISK-OK` when it read the root disk.
    pub rootdisk_id: String,
    pub l1_initramfs: PathBuf,
}

impl Assets {
    /// `assets.env` in this directory: what scenario scripts source.
    pub fn env_file(&self) -> PathBuf {
        self.dir.join("assets.env")
    }

    fn from_env_file(dir: &Path, text: &str) -> Result<Self> {
        let vars: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        let get = |key: &str| {
            vars.get(key)
                .map(|v| v.to_string())
                .ok_or_else(|| Error::new(format!("{}/assets.env has no {key}", dir.display())))
        };
        let path = |key: &str| -> Result<PathBuf> {
            let p = PathBuf::from(get(key)?);
            if p.exists() {
                Ok(p)
            } else {
                Err(Error::new(format!(
                    "{key}={} (from {}/assets.env) does not exist: remove the cache directory and rerun resources/build-assets.sh",
                    p.display(),
                    dir.display()
                )))
            }
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            kver: get("PVRDMA_KVER")?,
            kernel: path("PVRDMA_KERNEL")?,
            modules: path("PVRDMA_MODULES")?,
            guest_initramfs: path("PVRDMA_GUEST_INITRAMFS")?,
            rootfs: path("PVRDMA_ROOTFS")?,
            rootdisk_id: get("PVRDMA_ROOTDISK_ID")?,
            l1_initramfs: path("PVRDMA_L1_INITRAMFS")?,
        })
    }
}

/// `resources/` of this workspace.
pub fn resources_dir() -> PathBuf {
    workspace_root().join("resources")
}

/// Builds the assets or finds them in the cache: once per process, whatever the number of
/// callers. The script's progress goes straight to stderr (the first build takes a minute).
pub fn get() -> Result<Assets> {
    static ASSETS: OnceLock<Result<Assets>> = OnceLock::new();
    ASSETS.get_or_init(build).clone()
}

fn build() -> Result<Assets> {
    let script = resources_dir().join("build-assets.sh");
    let output = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Error::new(format!("cannot run {}: {e}", script.display())))?;
    if !output.status.success() {
        return Err(Error::new(format!(
            "{} failed ({}); its messages are above",
            script.display(),
            output.status
        )));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = stdout
        .lines()
        .last()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .ok_or_else(|| Error::new(format!("{} printed no assets directory", script.display())))?;
    let dir = PathBuf::from(dir);
    let env_file = dir.join("assets.env");
    let text = fs::read_to_string(&env_file)
        .map_err(|e| Error::new(format!("cannot read {}: {e}", env_file.display())))?;
    let assets = Assets::from_env_file(&dir, &text)?;
    announce(&format!(
        "assets: {} (guest kernel {})",
        dir.display(),
        assets.kver
    ));
    Ok(assets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_assets_env_and_reports_missing_keys() {
        let dir = std::env::temp_dir();
        let existing = dir.display().to_string();
        let text = format!(
            "PVRDMA_KVER=6.1.0-56-amd64\nPVRDMA_KERNEL={existing}\nPVRDMA_MODULES={existing}\n\
             PVRDMA_GUEST_INITRAMFS={existing}\nPVRDMA_ROOTFS={existing}\n\
             PVRDMA_ROOTDISK_ID=pvrdma-rootdisk-1234\nPVRDMA_L1_INITRAMFS={existing}\n"
        );
        let assets = Assets::from_env_file(&dir, &text).unwrap();
        assert_eq!(assets.kver, "6.1.0-56-amd64");
        assert_eq!(assets.rootdisk_id, "pvrdma-rootdisk-1234");

        let err = Assets::from_env_file(&dir, "PVRDMA_KVER=x\n").unwrap_err();
        assert!(err.to_string().contains("no PVRDMA_KERNEL"), "{err}");
        let err =
            Assets::from_env_file(&dir, &text.replace(&existing, "/nonexistent/x")).unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
    }
}

// SPDX-License-Identifier: Apache-2.0
//! What a destination accepts from a migration source. The configuration
//! in the stream is the source's word: the destination opens only the
//! TAPs it was told to use, the disks it maps or whose directory it
//! allows, and builds no more memory than its own limit; anything else
//! refuses the VM (and the source keeps running it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::{MacAddr, SerialConfig, VmConfig};

/// Host-side settings of the destination that replace or bound the
/// source's.
#[derive(Clone, Debug)]
pub struct HostSettings {
    /// MAC (as in the config) → TAP on this host; every NIC needs one.
    pub taps: BTreeMap<String, String>,
    /// Source's disk path → path on this host.
    pub disks: BTreeMap<PathBuf, PathBuf>,
    /// Directories (canonical) whose files the source may name as disks.
    pub disk_dirs: Vec<PathBuf>,
    /// Largest guest memory accepted, in bytes.
    pub max_memory: u64,
    pub serial: SerialConfig,
}

/// This host's RAM: the default memory limit of an incoming VM.
pub fn host_memory() -> u64 {
    // SAFETY: sysconf only reads system constants.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    u64::try_from(pages)
        .unwrap_or(0)
        .saturating_mul(u64::try_from(page).unwrap_or(0))
}

impl HostSettings {
    /// Puts this host's settings into an incoming configuration, or says
    /// why the VM may not run here.
    pub fn apply(&self, config: &mut VmConfig) -> Result<(), String> {
        config.serial = self.serial.clone();
        if config.memory > self.max_memory {
            return Err(format!(
                "the incoming VM has {} MiB of memory, over this host's limit of {} MiB \
                 (max_memory_mib, --max-memory-mib)",
                config.memory >> 20,
                self.max_memory >> 20
            ));
        }
        self.apply_taps(config)?;
        self.apply_disks(config)?;
        config.validate().map_err(|e| e.to_string())
    }

    fn apply_taps(&self, config: &mut VmConfig) -> Result<(), String> {
        let mut unused: Vec<&String> = self.taps.keys().collect();
        let nets = config
            .nets
            .iter_mut()
            .chain(config.pvrdma.iter_mut().map(|p| &mut p.net));
        for net in nets {
            // The keys were checked to be MACs; compare them parsed, so
            // that case does not matter.
            let ours = Some(net.mac);
            let (mac, tap) = self
                .taps
                .iter()
                .find(|(mac, _)| mac.parse::<MacAddr>().ok() == ours)
                .ok_or_else(|| {
                    format!(
                        "the incoming NIC {} has no TAP on this host: give it one with \
                         --tap {}=TAP (taps)",
                        net.mac, net.mac
                    )
                })?;
            net.tap = tap.clone();
            unused.retain(|m| *m != mac);
        }
        match unused.first() {
            Some(mac) => Err(format!("no NIC of the incoming VM has MAC {mac}")),
            None => Ok(()),
        }
    }

    fn apply_disks(&self, config: &mut VmConfig) -> Result<(), String> {
        let mut unused: Vec<&PathBuf> = self.disks.keys().collect();
        for disk in &mut config.disks {
            if let Some(new) = self.disks.get(&disk.path) {
                unused.retain(|old| **old != disk.path);
                disk.path = new.clone();
                continue;
            }
            disk.path = self.allowed(&disk.path).ok_or_else(|| {
                format!(
                    "the incoming disk {} is not allowed on this host: map it with --disk {}=PATH \
                     (disks) or allow its directory with --disk-dir (disk_dirs)",
                    disk.path.display(),
                    disk.path.display()
                )
            })?;
        }
        match unused.first() {
            Some(old) => Err(format!("no disk of the incoming VM is {}", old.display())),
            None => Ok(()),
        }
    }

    /// `path` resolved (symbolic links, `..`) if it lies in an allowed
    /// directory.
    fn allowed(&self, path: &Path) -> Option<PathBuf> {
        let real = path.canonicalize().ok()?;
        self.disk_dirs
            .iter()
            .any(|dir| real.starts_with(dir))
            .then_some(real)
    }
}

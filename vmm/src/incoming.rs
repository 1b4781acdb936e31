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
fn host_memory() -> u64 {
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
    /// The settings a `vm.receive-migration` request gives; its allowed
    /// directories must exist (they are kept resolved).
    pub fn new(
        params: &api::ReceiveMigrationParams,
        serial: &SerialConfig,
    ) -> Result<Self, String> {
        let disk_dirs = params
            .disk_dirs
            .iter()
            .map(|dir| {
                dir.canonicalize()
                    .map_err(|e| format!("disk_dirs: {}: {e}", dir.display()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            taps: params.taps.clone(),
            disks: params.disks.clone(),
            disk_dirs,
            max_memory: match params.max_memory_mib {
                Some(mib) => mib.saturating_mul(1 << 20),
                None => host_memory(),
            },
            serial: serial.clone(),
        })
    }

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
        let nets: Vec<_> = config
            .nets
            .iter_mut()
            .chain(config.pvrdma.iter_mut().map(|p| &mut p.net))
            .collect();
        // The keys were checked to be MACs; compare them parsed, so that
        // case does not matter.
        let tap_of = |mac: MacAddr| {
            self.taps
                .iter()
                .find(|(key, _)| key.parse::<MacAddr>().ok() == Some(mac))
                .map(|(_, tap)| tap)
        };
        if let Some(mac) = self.taps.keys().find(|key| {
            let key = key.parse::<MacAddr>().ok();
            !nets.iter().any(|n| Some(n.mac) == key)
        }) {
            return Err(format!("no NIC of the incoming VM has MAC {mac}"));
        }
        for net in nets {
            net.tap = tap_of(net.mac)
                .ok_or_else(|| {
                    format!(
                        "the incoming NIC {} has no TAP on this host: give it one with \
                         --tap {}=TAP (taps)",
                        net.mac, net.mac
                    )
                })?
                .clone();
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;
    use crate::config::{DiskConfig, NetConfig};

    const MAC: &str = "52:54:00:00:00:01";

    struct Dirs {
        root: PathBuf,
        allowed: PathBuf,
        other: PathBuf,
    }

    fn dirs(name: &str) -> Dirs {
        let root = std::env::temp_dir().join(format!("incoming-{name}-{}", std::process::id()));
        let d = Dirs {
            allowed: root.join("allowed"),
            other: root.join("other"),
            root,
        };
        for dir in [&d.allowed, &d.other] {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join("a.img"), b"").unwrap();
        }
        d
    }

    /// What a source sends: one NIC on its TAP, one disk.
    fn incoming(disk: &Path) -> VmConfig {
        VmConfig {
            kernel: "/boot/vmlinux".into(),
            initramfs: None,
            cmdline: String::new(),
            cpus: 1,
            memory: 512 << 20,
            disks: vec![DiskConfig {
                path: disk.into(),
                readonly: false,
            }],
            nets: vec![NetConfig::from_str(&format!("tap=tap-src,mac={MAC}")).unwrap()],
            pvrdma: Vec::new(),
            serial: SerialConfig::Tty,
        }
    }

    fn host(d: &Dirs) -> HostSettings {
        HostSettings {
            taps: [(MAC.to_uppercase(), "tap-dst".to_owned())].into(),
            disks: BTreeMap::new(),
            disk_dirs: vec![d.allowed.canonicalize().unwrap()],
            max_memory: 1 << 30,
            serial: SerialConfig::Off,
        }
    }

    fn refusal(host: &HostSettings, mut config: VmConfig) -> String {
        host.apply(&mut config).unwrap_err()
    }

    #[test]
    fn accepted_config_takes_this_hosts_settings() {
        let d = dirs("accepted");
        let mut config = incoming(&d.allowed.join("a.img"));
        host(&d).apply(&mut config).unwrap();
        assert_eq!(config.nets[0].tap, "tap-dst");
        assert_eq!(config.serial, SerialConfig::Off);
        assert_eq!(
            config.disks[0].path,
            d.allowed.join("a.img").canonicalize().unwrap()
        );

        // A mapped disk is opened where the destination says.
        let mapped = d.other.join("a.img");
        let mut h = host(&d);
        h.disks.insert("/src/disk.img".into(), mapped.clone());
        let mut config = incoming(Path::new("/src/disk.img"));
        h.apply(&mut config).unwrap();
        assert_eq!(config.disks[0].path, mapped);
        std::fs::remove_dir_all(d.root).unwrap();
    }

    #[test]
    fn settings_from_a_request() {
        let d = dirs("request");
        let mut params = api::ReceiveMigrationParams::new("tcp:127.0.0.1:6000");
        params.disk_dirs = vec![d.allowed.join("../allowed")];
        let h = HostSettings::new(&params, &SerialConfig::Off).unwrap();
        assert_eq!(h.disk_dirs, [d.allowed.canonicalize().unwrap()]);
        assert_eq!(h.max_memory, host_memory());
        assert!(h.max_memory > 0);
        params.max_memory_mib = Some(300);
        let h = HostSettings::new(&params, &SerialConfig::Off).unwrap();
        assert_eq!(h.max_memory, 300 << 20);
        params.disk_dirs = vec![d.root.join("missing")];
        let e = HostSettings::new(&params, &SerialConfig::Off).unwrap_err();
        assert!(e.starts_with("disk_dirs: "), "{e}");
        std::fs::remove_dir_all(d.root).unwrap();
    }

    #[test]
    fn what_the_destination_does_not_allow_refuses_the_vm() {
        let d = dirs("refused");
        let h = host(&d);
        let ok = d.allowed.join("a.img");

        let e = refusal(&h, incoming(&d.other.join("a.img")));
        assert!(e.contains("is not allowed on this host"), "{e}");
        // `..` and symbolic links are resolved before the check.
        let e = refusal(&h, incoming(&d.allowed.join("../other/a.img")));
        assert!(e.contains("is not allowed"), "{e}");
        std::os::unix::fs::symlink(d.other.join("a.img"), d.allowed.join("link.img")).unwrap();
        let e = refusal(&h, incoming(&d.allowed.join("link.img")));
        assert!(e.contains("is not allowed"), "{e}");
        // A disk that does not exist is in no directory.
        let e = refusal(&h, incoming(&d.allowed.join("missing.img")));
        assert!(e.contains("is not allowed"), "{e}");

        let big = VmConfig {
            memory: 2 << 30,
            ..incoming(&ok)
        };
        let e = refusal(&h, big);
        assert!(e.contains("over this host's limit of 1024 MiB"), "{e}");

        let no_tap = HostSettings {
            taps: BTreeMap::new(),
            ..host(&d)
        };
        let e = refusal(&no_tap, incoming(&ok));
        assert!(e.contains(&format!("--tap {MAC}=TAP")), "{e}");

        let stray_tap = HostSettings {
            taps: [("52:54:00:99:99:99".to_owned(), "tap-x".to_owned())].into(),
            ..host(&d)
        };
        let e = refusal(&stray_tap, incoming(&ok));
        assert!(
            e.contains("no NIC of the incoming VM has MAC 52:54:00:99:99:99"),
            "{e}"
        );

        let mut stray_disk = host(&d);
        stray_disk.disks.insert("/src/other.img".into(), ok.clone());
        let e = refusal(&stray_disk, incoming(&ok));
        assert!(
            e.contains("no disk of the incoming VM is /src/other.img"),
            "{e}"
        );
        std::fs::remove_dir_all(d.root).unwrap();
    }
}

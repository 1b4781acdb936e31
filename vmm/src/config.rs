// SPDX-License-Identifier: Apache-2.0
//! VM configuration: what the command line (and later the API) asks for,
//! parsed into typed values with one-line errors.

use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use pvrdma::GidType;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("invalid size '{0}': expected a number with an optional K, M or G suffix")]
    Size(String),
    #[error("memory must be between {min} MiB and {max} MiB, got {got} MiB")]
    MemoryRange { min: u64, max: u64, got: u64 },
    #[error("memory must be a multiple of 2 MiB")]
    MemoryAlignment,
    #[error("--cpus must be between 1 and {max}, got {got}")]
    Cpus { max: u16, got: String },
    #[error("unknown option '{key}' in {what} (expected {expected})")]
    UnknownKey {
        what: &'static str,
        key: String,
        expected: &'static str,
    },
    #[error("{what} needs {key}=")]
    MissingKey {
        what: &'static str,
        key: &'static str,
    },
    #[error("invalid value '{value}' for {key} (expected {expected})")]
    BadValue {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("--serial must be tty, off or file=PATH, got '{0}'")]
    Serial(String),
    #[error("invalid MAC address '{0}' (expected six hex bytes like 52:54:00:12:34:56, unicast)")]
    Mac(String),
    #[error("invalid TAP name '{0}' (1-15 characters, no '/', whitespace or ',')")]
    TapName(String),
    #[error("MTU must be between {min} and {max}, got '{got}'")]
    Mtu { min: u16, max: u16, got: String },
    #[error("TAP '{0}' is used by more than one NIC")]
    DuplicateTap(String),
    #[error("at most {max} --pvrdma devices per VM, got {got}")]
    TooManyPvrdma { max: usize, got: usize },
    #[error("MAC {0} is used by more than one NIC")]
    DuplicateMac(MacAddr),
    #[error(
        "the configuration is of version {got} (another pvrdma-vmm release), this one reads \
         version {CONFIG_VERSION}"
    )]
    ConfigVersion { got: u32 },
    #[error("unreadable configuration: {0}")]
    ConfigJson(String),
    #[error("--pvrdma budget: {0}")]
    PvrdmaLimits(String),
    #[error("--kernel is required to boot (or --restore a snapshot, or give only --api-socket to receive a migration)")]
    MissingKernel,
}

/// `K`/`M`/`G`-suffixed byte counts (powers of 1024); bare numbers are MiB,
/// as in `--memory 512`.
pub fn parse_size(s: &str) -> Result<u64, ConfigError> {
    let err = || ConfigError::Size(s.to_string());
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        _ => (t, 20),
    };
    let n: u64 = num.parse().map_err(|_| err())?;
    n.checked_mul(1 << shift).ok_or_else(err)
}

/// Guest memory limits: enough for a kernel to boot, and what the memory
/// map (RAM split around the 32-bit PCI hole) supports.
pub const MIN_MEMORY_MIB: u64 = 64;
pub const MAX_MEMORY_MIB: u64 = 1 << 20;

pub fn parse_memory(s: &str) -> Result<u64, ConfigError> {
    let bytes = parse_size(s)?;
    let mib = bytes >> 20;
    if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&mib) {
        return Err(ConfigError::MemoryRange {
            min: MIN_MEMORY_MIB,
            max: MAX_MEMORY_MIB,
            got: mib,
        });
    }
    if bytes % (2 << 20) != 0 {
        return Err(ConfigError::MemoryAlignment);
    }
    Ok(bytes)
}

/// KVM's hard limit on x86 is larger, but APIC IDs in the MADT are 8-bit.
pub const MAX_CPUS: u16 = 254;

pub fn parse_cpus(s: &str) -> Result<u8, ConfigError> {
    let err = || ConfigError::Cpus {
        max: MAX_CPUS,
        got: s.to_string(),
    };
    let n: u16 = s.trim().parse().map_err(|_| err())?;
    if n == 0 || n > MAX_CPUS {
        return Err(err());
    }
    u8::try_from(n).map_err(|_| err())
}

/// The `key=value` parts of an option: split at commas, except inside
/// brackets, which hold a list (`worker_cpus=[0,2-3]`).
fn split_options(s: &str) -> impl Iterator<Item = &str> {
    let mut depth = 0u32;
    s.split(move |c| {
        match c {
            '[' => depth = depth.saturating_add(1),
            ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        c == ',' && depth == 0
    })
}

/// Splits `a=1,b=2` into pairs, rejecting keys outside `allowed`.
fn parse_kv<'a>(
    s: &'a str,
    what: &'static str,
    allowed: &[&str],
    expected: &'static str,
) -> Result<Vec<(&'a str, &'a str)>, ConfigError> {
    split_options(s)
        .filter(|p| !p.is_empty())
        .map(|part| {
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            if allowed.contains(&k) {
                Ok((k, v))
            } else {
                Err(ConfigError::UnknownKey {
                    what,
                    key: k.to_string(),
                    expected,
                })
            }
        })
        .collect()
}

fn parse_on_off(key: &'static str, v: &str) -> Result<bool, ConfigError> {
    match v {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(ConfigError::BadValue {
            key,
            value: v.to_string(),
            expected: "on or off",
        }),
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskConfig {
    pub path: PathBuf,
    pub readonly: bool,
}

impl FromStr for DiskConfig {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (mut path, mut readonly) = (None, false);
        for (k, v) in parse_kv(s, "--disk", &["path", "readonly"], "path=, readonly=")? {
            match k {
                "path" if !v.is_empty() => path = Some(PathBuf::from(v)),
                "path" => {
                    return Err(ConfigError::MissingKey {
                        what: "--disk",
                        key: "path",
                    })
                }
                _ => readonly = parse_on_off("readonly", v)?,
            }
        }
        let path = path.ok_or(ConfigError::MissingKey {
            what: "--disk",
            key: "path",
        })?;
        Ok(Self { path, readonly })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SerialConfig {
    Tty,
    File(PathBuf),
    Off,
}

impl FromStr for SerialConfig {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tty" => Ok(Self::Tty),
            "off" => Ok(Self::Off),
            _ => match s.strip_prefix("file=") {
                Some(p) if !p.is_empty() => Ok(Self::File(PathBuf::from(p))),
                _ => Err(ConfigError::Serial(s.to_string())),
            },
        }
    }
}

/// A unicast MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MacAddr(pub [u8; 6]);

impl FromStr for MacAddr {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ConfigError::Mac(s.to_string());
        let mut mac = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut mac {
            let part = parts.next().filter(|p| p.len() == 2).ok_or_else(err)?;
            *byte = u8::from_str_radix(part, 16).map_err(|_| err())?;
        }
        // A multicast source MAC (bit 0 of the first byte) is never valid.
        if parts.next().is_some() || mac[0] & 1 != 0 {
            return Err(err());
        }
        Ok(Self(mac))
    }
}

/// IFNAMSIZ - 1: the longest interface name Linux accepts.
impl std::fmt::Display for MacAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

const MAX_TAP_NAME: usize = 15;

fn parse_tap_name(v: &str) -> Result<String, ConfigError> {
    let ok = !v.is_empty()
        && v.len() <= MAX_TAP_NAME
        && !v.contains(['/', ','])
        && !v.contains(char::is_whitespace);
    if ok {
        Ok(v.to_string())
    } else {
        Err(ConfigError::TapName(v.to_string()))
    }
}

/// MTU range the vmxnet3 model supports (rev 1: up to 9000).
pub const MIN_MTU: u16 = 68;
pub const MAX_MTU: u16 = 9000;

/// A vmxnet3 NIC on a TAP device: `--net tap=NAME,mac=MAC[,mtu=N]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetConfig {
    pub tap: String,
    pub mac: MacAddr,
    /// MTU given to a TAP the VMM creates; `None` keeps the kernel's default.
    pub mtu: Option<u16>,
}

/// Where VMMs of one host meet for the same-host RDMA path by default.
pub const DEFAULT_LOCAL_DIR: &str = "/run/pvrdma-vmm";

/// The PVRDMA slot: vmxnet3 at function 0 on `net`'s TAP, PVRDMA at
/// function 1. `--pvrdma tap=NAME,mac=MAC[,mtu=N][,gid=roce-v2|roce-v1]
/// [,local=on|off|DIR]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvrdmaConfig {
    pub net: NetConfig,
    pub gid: GidType,
    /// The directory of the same-host channel (`None`: always the wire).
    pub local: Option<PathBuf>,
    /// The VM's RDMA budgets where the operator set them (the device's
    /// defaults otherwise). They travel with a migration: the destination
    /// restores the same ID ranges.
    #[serde(default)]
    pub budget: PvrdmaBudget,
    /// `poll=US`: how long the device's worker busy-polls after work
    /// (`pvrdma::PvrdmaConfig::busy_poll`; `None`: its default).
    #[serde(default)]
    pub poll_us: Option<u32>,
    /// `share_memory=on`: same-host peers that turned it on too may map
    /// all of this guest's memory read-only and copy payloads from it
    /// themselves (`pvrdma::PvrdmaConfig::share_memory`). Off by default.
    #[serde(default)]
    pub share_memory: bool,
    /// `worker_cpus=`: the host CPUs the device's worker may run on
    /// (`pvrdma::PvrdmaConfig::worker_cpus`; empty: any). They travel with
    /// a migration, as cloud-hypervisor's affinities do: a destination
    /// without them refuses the VM and the source keeps it.
    #[serde(default)]
    pub worker_cpus: Vec<usize>,
}

/// The longest busy-poll `poll=` takes: beyond a millisecond a worker
/// would not poll for the next message but burn a core between bursts.
const MAX_POLL_US: u32 = 1000;

/// CPUs a `cpu_set_t` holds: host CPUs are numbered below it.
const CPU_SETSIZE: usize = 1024;

/// A host CPU list, as taskset and cpusets write it: `3`, `2-3`, or
/// several in brackets, `[0,2-3]`. Sorted, each CPU once.
fn parse_cpu_list(v: &str) -> Result<Vec<usize>, ConfigError> {
    let bad = || ConfigError::BadValue {
        key: "worker_cpus",
        value: v.to_string(),
        expected: "host CPUs below 1024: N, N-M or [N,N-M,...]",
    };
    let inner = match v.strip_prefix('[') {
        Some(rest) => rest.strip_suffix(']').ok_or_else(bad)?,
        None => v,
    };
    let mut cpus = Vec::new();
    for part in inner.split(',') {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (first, last): (usize, usize) = (
            first.parse().map_err(|_| bad())?,
            last.parse().map_err(|_| bad())?,
        );
        if first > last || last >= CPU_SETSIZE {
            return Err(bad());
        }
        cpus.extend(first..=last);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The page size of the guest's RDMA mappings.
const GUEST_PAGE: u64 = 4096;

/// `--pvrdma` budgets: objects and the guest memory RDMA may map (rings
/// and registered MRs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvrdmaBudget {
    pub max_qp: Option<u32>,
    pub max_cq: Option<u32>,
    pub max_mr: Option<u32>,
    /// Bytes.
    pub mapped: Option<u64>,
}

impl PvrdmaBudget {
    /// The device limits: its defaults with these budgets applied, checked.
    pub fn limits(&self) -> Result<pvrdma::Limits, ConfigError> {
        let mut limits = pvrdma::Limits::default();
        if let Some(n) = self.max_qp {
            limits.max_qp = n;
        }
        if let Some(n) = self.max_cq {
            limits.max_cq = n;
        }
        if let Some(n) = self.max_mr {
            limits.max_mr = n;
        }
        if let Some(bytes) = self.mapped {
            limits.max_mapped_pages = bytes / GUEST_PAGE;
        }
        limits
            .check()
            .map_err(|e| ConfigError::PvrdmaLimits(e.to_string()))?;
        Ok(limits)
    }
}

/// One `key=value` of an option.
type KeyValue<'a> = (&'a str, &'a str);

/// Parses the NIC keys of `s` (tap, mac, mtu); the other keys of
/// `allowed` are returned for the caller.
fn parse_nic<'a>(
    s: &'a str,
    what: &'static str,
    allowed: &[&str],
    expected: &'static str,
) -> Result<(NetConfig, Vec<KeyValue<'a>>), ConfigError> {
    let (mut tap, mut mac, mut mtu, mut rest) = (None, None, None, Vec::new());
    for (k, v) in parse_kv(s, what, allowed, expected)? {
        match k {
            "tap" => tap = Some(parse_tap_name(v)?),
            "mac" => mac = Some(v.parse()?),
            "mtu" => {
                let err = || ConfigError::Mtu {
                    min: MIN_MTU,
                    max: MAX_MTU,
                    got: v.to_string(),
                };
                let n: u16 = v.parse().map_err(|_| err())?;
                mtu = Some(
                    Some(n)
                        .filter(|n| (MIN_MTU..=MAX_MTU).contains(n))
                        .ok_or_else(err)?,
                );
            }
            _ => rest.push((k, v)),
        }
    }
    let tap = tap.ok_or(ConfigError::MissingKey { what, key: "tap" })?;
    let mac = mac.ok_or(ConfigError::MissingKey { what, key: "mac" })?;
    Ok((NetConfig { tap, mac, mtu }, rest))
}

impl FromStr for NetConfig {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(parse_nic(s, "--net", &["tap", "mac", "mtu"], "tap=, mac=, mtu=")?.0)
    }
}

impl FromStr for PvrdmaConfig {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (net, rest) = parse_nic(
            s,
            "--pvrdma",
            &[
                "tap",
                "mac",
                "mtu",
                "gid",
                "local",
                "max_qp",
                "max_cq",
                "max_mr",
                "mapped",
                "poll",
                "share_memory",
                "worker_cpus",
            ],
            "tap=, mac=, mtu=, gid=, local=, max_qp=, max_cq=, max_mr=, mapped=, poll=, share_memory=, \
             worker_cpus=",
        )?;
        let mut cfg = Self {
            net,
            gid: GidType::default(),
            local: Some(PathBuf::from(DEFAULT_LOCAL_DIR)),
            budget: PvrdmaBudget::default(),
            poll_us: None,
            share_memory: false,
            worker_cpus: Vec::new(),
        };
        let count = |key: &'static str, v: &str| {
            v.parse::<u32>().map_err(|_| ConfigError::BadValue {
                key,
                value: v.to_string(),
                expected: "a whole number",
            })
        };
        for (k, v) in rest {
            match k {
                "max_qp" => cfg.budget.max_qp = Some(count("max_qp", v)?),
                "max_cq" => cfg.budget.max_cq = Some(count("max_cq", v)?),
                "max_mr" => cfg.budget.max_mr = Some(count("max_mr", v)?),
                "mapped" => cfg.budget.mapped = Some(parse_size(v)?),
                "poll" => {
                    let us = count("poll", v)?;
                    if us > MAX_POLL_US {
                        return Err(ConfigError::BadValue {
                            key: "poll",
                            value: v.to_string(),
                            expected: "microseconds, at most 1000",
                        });
                    }
                    cfg.poll_us = Some(us);
                }
                "worker_cpus" => cfg.worker_cpus = parse_cpu_list(v)?,
                "share_memory" => {
                    cfg.share_memory = match v {
                        "on" => true,
                        "off" => false,
                        _ => {
                            return Err(ConfigError::BadValue {
                                key: "share_memory",
                                value: v.to_string(),
                                expected: "on or off",
                            })
                        }
                    };
                }
                "gid" => {
                    cfg.gid = v.parse().map_err(|_| ConfigError::BadValue {
                        key: "gid",
                        value: v.to_string(),
                        expected: "roce-v2 or roce-v1",
                    })?;
                }
                // parse_nic returns only the keys allowed above: this is `local`.
                _ => {
                    cfg.local = match v {
                        "off" => None,
                        "on" => Some(PathBuf::from(DEFAULT_LOCAL_DIR)),
                        dir if dir.starts_with('/') => Some(PathBuf::from(dir)),
                        _ => {
                            return Err(ConfigError::BadValue {
                                key: "local",
                                value: v.to_string(),
                                expected: "on, off or an absolute directory",
                            })
                        }
                    };
                }
            }
        }
        cfg.budget.limits()?;
        Ok(cfg)
    }
}

/// Everything needed to build and boot a VM.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmConfig {
    pub kernel: PathBuf,
    pub initramfs: Option<PathBuf>,
    pub cmdline: String,
    pub cpus: u8,
    pub memory: u64,
    pub disks: Vec<DiskConfig>,
    pub nets: Vec<NetConfig>,
    /// The PVRDMA slots in PCI order: the guest names their devices
    /// vmw_pvrdma0, vmw_pvrdma1, ... Each is its own HCA, with its own QPN
    /// and key spaces and its own same-host socket (by its MAC).
    pub pvrdma: Vec<PvrdmaConfig>,
    pub serial: SerialConfig,
}

/// PVRDMA devices per VM (ESXi allows one). Each takes a PCI slot of the
/// 32 with its vmxnet3, and worker threads and budgets of its own.
pub const MAX_PVRDMA: usize = 4;

/// The version of [`VmConfig`]'s JSON in a migration stream and a
/// snapshot's config.json. 2: `pvrdma` became a list (it was one device
/// or `null`, and such a configuration carried no version).
pub const CONFIG_VERSION: u32 = 2;

/// [`VmConfig`] as it is written: with its version in front.
#[derive(Serialize)]
struct VersionedConfig<'a> {
    version: u32,
    #[serde(flatten)]
    config: &'a VmConfig,
}

/// The version of a written [`VmConfig`], read before the rest (0: none).
#[derive(Deserialize)]
struct ConfigVersionOnly {
    #[serde(default)]
    version: u32,
}

impl VmConfig {
    /// Checks what single options cannot (every NIC has its own TAP), and
    /// again what they do, for a configuration that arrived in a migration
    /// stream or a snapshot rather than on the command line.
    pub fn validate(&self) -> Result<(), ConfigError> {
        parse_cpus(&self.cpus.to_string())?;
        let mib = self.memory >> 20;
        if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&mib) {
            return Err(ConfigError::MemoryRange {
                min: MIN_MEMORY_MIB,
                max: MAX_MEMORY_MIB,
                got: mib,
            });
        }
        if !self.memory.is_multiple_of(2 << 20) {
            return Err(ConfigError::MemoryAlignment);
        }
        if self.pvrdma.len() > MAX_PVRDMA {
            return Err(ConfigError::TooManyPvrdma {
                max: MAX_PVRDMA,
                got: self.pvrdma.len(),
            });
        }
        let nics: Vec<&NetConfig> = self
            .nets
            .iter()
            .chain(self.pvrdma.iter().map(|p| &p.net))
            .collect();
        for net in &nics {
            parse_tap_name(&net.tap)?;
        }
        for p in &self.pvrdma {
            p.budget.limits()?;
        }
        if let Some(tap) = first_duplicate(nics.iter().map(|n| n.tap.as_str())) {
            return Err(ConfigError::DuplicateTap(tap.to_string()));
        }
        // A MAC names a port: its same-host socket, the bridge's forwarding
        // and a migration's --tap MAC=TAP mapping.
        match first_duplicate(nics.iter().map(|n| n.mac)) {
            Some(mac) => Err(ConfigError::DuplicateMac(mac)),
            None => Ok(()),
        }
    }

    /// The JSON a migration stream and a snapshot carry, versioned.
    pub fn to_json(&self) -> Result<Vec<u8>, ConfigError> {
        let versioned = VersionedConfig {
            version: CONFIG_VERSION,
            config: self,
        };
        serde_json::to_vec_pretty(&versioned).map_err(|e| ConfigError::ConfigJson(e.to_string()))
    }

    /// A configuration from [`Self::to_json`], checked: one of another
    /// version is refused by its version before its fields are read.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        let json = |e: serde_json::Error| ConfigError::ConfigJson(e.to_string());
        let ConfigVersionOnly { version } = serde_json::from_slice(bytes).map_err(json)?;
        if version != CONFIG_VERSION {
            return Err(ConfigError::ConfigVersion { got: version });
        }
        let config: Self = serde_json::from_slice(bytes).map_err(json)?;
        config.validate()?;
        Ok(config)
    }
}

/// The first value that occurs twice.
fn first_duplicate<T: Ord + Copy>(values: impl Iterator<Item = T>) -> Option<T> {
    let mut sorted: Vec<T> = values.collect();
    sorted.sort_unstable();
    sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1024"), Ok(1024 << 20));
        assert_eq!(parse_size("65536K"), Ok(64 << 20));
        for bad in ["", "M", "-1M", "12X", "1.5G", "99999999999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert!(matches!(
            parse_memory("16M"),
            Err(ConfigError::MemoryRange { .. })
        ));
        assert_eq!(parse_memory("65537K"), Err(ConfigError::MemoryAlignment));
        assert_eq!(parse_memory("512M"), Ok(512 << 20));
    }

    #[test]
    fn cpus() {
        assert_eq!(parse_cpus("2"), Ok(2));
        for bad in ["0", "255", "-1", "two", ""] {
            assert!(parse_cpus(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn disks() {
        let d: DiskConfig = "path=/a.img,readonly=on".parse().unwrap();
        assert_eq!(
            d,
            DiskConfig {
                path: "/a.img".into(),
                readonly: true
            }
        );
        let d: DiskConfig = "path=/b.img".parse().unwrap();
        assert!(!d.readonly);
        assert!(matches!(
            "readonly=on".parse::<DiskConfig>(),
            Err(ConfigError::MissingKey { .. })
        ));
        assert!(matches!(
            "path=".parse::<DiskConfig>(),
            Err(ConfigError::MissingKey { .. })
        ));
        assert!(matches!(
            "path=/a,ro=1".parse::<DiskConfig>(),
            Err(ConfigError::UnknownKey { .. })
        ));
        assert!(matches!(
            "path=/a,readonly=yes".parse::<DiskConfig>(),
            Err(ConfigError::BadValue { .. })
        ));
    }

    #[test]
    fn nics() {
        let n: NetConfig = "tap=tap0,mac=52:54:00:12:34:56,mtu=9000".parse().unwrap();
        assert_eq!(
            n,
            NetConfig {
                tap: "tap0".into(),
                mac: MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]),
                mtu: Some(9000)
            }
        );
        let p: PvrdmaConfig = "tap=t1,mac=02:00:00:00:00:01".parse().unwrap();
        assert_eq!((p.gid, p.net.mtu), (GidType::RoceV2, None));
        let p: PvrdmaConfig = "tap=t1,mac=02:00:00:00:00:01,gid=roce-v1".parse().unwrap();
        assert_eq!(p.gid, GidType::RoceV1);
        assert_eq!(
            p.local.as_deref(),
            Some(std::path::Path::new(DEFAULT_LOCAL_DIR))
        );
        let local = |s: &str| {
            format!("tap=t1,mac=02:00:00:00:00:01,local={s}")
                .parse::<PvrdmaConfig>()
                .map(|p| p.local)
        };
        assert_eq!(local("off"), Ok(None));
        assert_eq!(local("/tmp/r"), Ok(Some(PathBuf::from("/tmp/r"))));
        assert!(local("relative").is_err());
        let share = |s: &str| {
            format!("tap=t1,mac=02:00:00:00:00:01{s}")
                .parse::<PvrdmaConfig>()
                .map(|p| p.share_memory)
        };
        assert_eq!(share(""), Ok(false), "off by default");
        assert_eq!(share(",share_memory=on"), Ok(true));
        assert_eq!(share(",share_memory=off"), Ok(false));
        assert!(share(",share_memory=yes").is_err());
        let cpus = |s: &str| {
            format!("tap=t1,mac=02:00:00:00:00:01,worker_cpus={s},poll=10")
                .parse::<PvrdmaConfig>()
                .map(|p| (p.worker_cpus, p.poll_us))
        };
        assert_eq!(cpus("3"), Ok((vec![3], Some(10))));
        assert_eq!(cpus("2-4"), Ok((vec![2, 3, 4], Some(10))));
        assert_eq!(cpus("[5,0-1,1]"), Ok((vec![0, 1, 5], Some(10))));
        assert_eq!(cpus("1023"), Ok((vec![1023], Some(10))));
        for bad in [
            "", "[]", "[1,2", "1,2", "3-2", "1024", "0-1024", "x", "-1", "[1,,2]",
        ] {
            assert!(cpus(bad).is_err(), "{bad}");
        }
        for bad in [
            "mac=52:54:00:12:34:56",
            "tap=t0",
            "tap=t0,mac=01:00:00:00:00:01",
            "tap=t0,mac=52:54:00:12:34",
            "tap=t0,mac=52:54:00:12:34:56:78",
            "tap=t0,mac=52:54:00:12:34:5g",
            "tap=t0,mac=52:54:00:12:34:56,mtu=10000",
            "tap=t0,mac=52:54:00:12:34:56,mtu=0",
            "tap=,mac=52:54:00:12:34:56",
            "tap=a/b,mac=52:54:00:12:34:56",
            "tap=0123456789abcdef,mac=52:54:00:12:34:56",
            "tap=t0,mac=52:54:00:12:34:56,gid=roce-v2",
        ] {
            assert!(bad.parse::<NetConfig>().is_err(), "{bad}");
        }
        assert!("tap=t0,mac=52:54:00:12:34:56,gid=ib"
            .parse::<PvrdmaConfig>()
            .is_err());
    }

    fn net(tap: &str, last: u8) -> NetConfig {
        NetConfig {
            tap: tap.into(),
            mac: MacAddr([2, 0, 0, 0, 0, last]),
            mtu: None,
        }
    }

    fn rdma(tap: &str, last: u8) -> PvrdmaConfig {
        PvrdmaConfig {
            net: net(tap, last),
            gid: GidType::RoceV2,
            local: None,
            budget: PvrdmaBudget::default(),
            poll_us: None,
            share_memory: false,
            worker_cpus: Vec::new(),
        }
    }

    fn vm(nets: Vec<NetConfig>, pvrdma: Vec<PvrdmaConfig>) -> VmConfig {
        VmConfig {
            kernel: "/k".into(),
            initramfs: None,
            cmdline: String::new(),
            cpus: 1,
            memory: 512 << 20,
            disks: vec![],
            nets,
            pvrdma,
            serial: SerialConfig::Off,
        }
    }

    #[test]
    fn taps_and_macs_must_be_distinct() {
        let mut cfg = vm(vec![net("a", 1), net("b", 2)], vec![rdma("c", 3)]);
        assert_eq!(cfg.validate(), Ok(()));
        cfg.pvrdma = vec![rdma("a", 3)];
        assert_eq!(cfg.validate(), Err(ConfigError::DuplicateTap("a".into())));
        cfg.pvrdma = vec![rdma("c", 3), rdma("d", 2)];
        assert_eq!(
            cfg.validate(),
            Err(ConfigError::DuplicateMac(MacAddr([2, 0, 0, 0, 0, 2])))
        );
        // A budget from a migration stream or snapshot is checked as well,
        // on every device.
        let mut small = rdma("d", 4);
        small.budget.max_qp = Some(1);
        cfg.pvrdma = vec![rdma("c", 3), small];
        assert!(matches!(cfg.validate(), Err(ConfigError::PvrdmaLimits(_))));
    }

    #[test]
    fn several_pvrdma_devices_up_to_the_maximum() {
        let devices = |n: u8| (0..n).map(|i| rdma(&format!("r{i}"), 0x10 + i)).collect();
        let max = u8::try_from(MAX_PVRDMA).unwrap();
        assert_eq!(vm(vec![], devices(2)).validate(), Ok(()));
        assert_eq!(vm(vec![], devices(max)).validate(), Ok(()));
        assert_eq!(
            vm(vec![], devices(max + 1)).validate(),
            Err(ConfigError::TooManyPvrdma {
                max: MAX_PVRDMA,
                got: MAX_PVRDMA + 1
            })
        );
    }

    #[test]
    fn config_json_is_versioned() {
        let cfg = vm(vec![net("a", 1)], vec![rdma("b", 2), rdma("c", 3)]);
        let json = cfg.to_json().unwrap();
        let back = VmConfig::from_json(&json).unwrap();
        assert_eq!(back.to_json().unwrap(), json);
        assert_eq!(back.pvrdma.len(), 2);
        // What the release before wrote: no version, one device or null.
        let mut old: serde_json::Value = serde_json::from_slice(&json).unwrap();
        old.as_object_mut().unwrap().remove("version");
        old["pvrdma"] = serde_json::to_value(rdma("b", 2)).unwrap();
        let old = serde_json::to_vec(&old).unwrap();
        assert_eq!(
            VmConfig::from_json(&old).unwrap_err(),
            ConfigError::ConfigVersion { got: 0 }
        );
        let mut future: serde_json::Value = serde_json::from_slice(&json).unwrap();
        future["version"] = 3.into();
        let future = serde_json::to_vec(&future).unwrap();
        assert_eq!(
            VmConfig::from_json(&future).unwrap_err(),
            ConfigError::ConfigVersion { got: 3 }
        );
        // And a current one is checked like a command line.
        let dup = vm(vec![net("a", 1)], vec![rdma("b", 1)]);
        let dup = serde_json::to_vec(&VersionedConfig {
            version: CONFIG_VERSION,
            config: &dup,
        })
        .unwrap();
        assert!(matches!(
            VmConfig::from_json(&dup),
            Err(ConfigError::DuplicateMac(_))
        ));
    }

    #[test]
    fn pvrdma_budgets_parse_and_are_checked() {
        let p: PvrdmaConfig =
            "tap=t0,mac=52:54:00:00:00:01,max_qp=64,max_cq=128,max_mr=256,mapped=512M"
                .parse()
                .unwrap();
        // Issue 16: up to 16384 QPs.
        let most: PvrdmaConfig = "tap=t0,mac=52:54:00:00:00:01,max_qp=16384".parse().unwrap();
        assert_eq!(most.budget.limits().unwrap().max_qp, 16384);
        let limits = p.budget.limits().unwrap();
        assert_eq!(
            (limits.max_qp, limits.max_cq, limits.max_mr),
            (64, 128, 256)
        );
        assert_eq!(limits.max_mapped_pages, (512 << 20) / 4096);
        let default: PvrdmaConfig = "tap=t0,mac=52:54:00:00:00:01".parse().unwrap();
        assert_eq!(default.budget.limits().unwrap(), pvrdma::Limits::default());
        assert_eq!(default.poll_us, None);
        let p: PvrdmaConfig = "tap=t0,mac=52:54:00:00:00:01,poll=0".parse().unwrap();
        assert_eq!(p.poll_us, Some(0));
        for bad in [
            "max_qp=2",
            "max_qp=16385",
            "max_cq=x",
            "max_mr=-1",
            "mapped=0",
            "mapped=lots",
            "poll=1001",
            "poll=-1",
        ] {
            let s = format!("tap=t0,mac=52:54:00:00:00:01,{bad}");
            assert!(s.parse::<PvrdmaConfig>().is_err(), "{bad}");
        }
    }

    #[test]
    fn serial() {
        assert_eq!("tty".parse(), Ok(SerialConfig::Tty));
        assert_eq!("off".parse(), Ok(SerialConfig::Off));
        assert_eq!(
            "file=/tmp/x".parse(),
            Ok(SerialConfig::File("/tmp/x".into()))
        );
        assert!("file=".parse::<SerialConfig>().is_err());
        assert!("pty".parse::<SerialConfig>().is_err());
    }
}

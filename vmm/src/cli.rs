// SPDX-License-Identifier: Apache-2.0
//! The `pvrdma-vmm` command line.

use std::path::PathBuf;

use clap::Parser;

use crate::config::{
    self, ConfigError, DiskConfig, NetConfig, PvrdmaConfig, SerialConfig, VmConfig,
};

const EXIT_CODES: &str = "\
Exit codes:
  0  the guest powered off or rebooted, or the VM was shut down through the API
  1  the VMM failed while running the guest (KVM error, unrecoverable device error)
  2  invalid command line or configuration, or the VM could not be created
  3  the guest crashed (triple fault)

Live migration: start the destination with only --api-socket (plus --serial, --log-level),
then `pvrdma-remote --api-socket DST receive-migration unix:/path` there and
`pvrdma-remote --api-socket SRC send-migration unix:/path` on the source. The source exits 0
once the VM runs on the destination.";

/// A KVM virtual machine monitor with a paravirtual RDMA device.
#[derive(Debug, Parser)]
#[command(name = "pvrdma-vmm", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// Guest kernel: a bzImage or an ELF vmlinux (64-bit boot protocol). Without it (and
    /// without --restore) the VMM serves --api-socket and waits for vm.receive-migration.
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,

    /// Start from a snapshot taken with vm.snapshot instead of booting:
    /// source_url=file:///DIR. The VM's configuration comes from the snapshot. It starts
    /// paused, so that peers can be restored before any of them runs: resume it with
    /// vm.resume (hence --api-socket is required).
    #[arg(long, value_name = "source_url=file:///DIR", conflicts_with_all = ["kernel", "initramfs", "disk", "net", "pvrdma"], requires = "api_socket")]
    pub restore: Option<String>,

    /// Initramfs (cpio archive, optionally compressed) loaded for the kernel.
    #[arg(long, value_name = "PATH")]
    pub initramfs: Option<PathBuf>,

    /// Kernel command line.
    #[arg(long, value_name = "STRING", default_value = "console=ttyS0")]
    pub cmdline: String,

    /// Number of vCPUs (1-254).
    #[arg(long, value_name = "N", default_value = "1", value_parser = config::parse_cpus)]
    pub cpus: u8,

    /// Guest memory, e.g. 512M or 2G (a bare number is MiB; multiple of 2 MiB).
    #[arg(long, value_name = "SIZE", default_value = "512M", value_parser = config::parse_memory)]
    pub memory: u64,

    /// A virtio-blk disk backed by a raw image: path=FILE[,readonly=on]. Repeatable.
    #[arg(long, value_name = "path=FILE[,readonly=on]")]
    pub disk: Vec<DiskConfig>,

    /// A vmxnet3 NIC on a TAP device (created if absent): tap=NAME,mac=MAC[,mtu=N]. Repeatable.
    #[arg(long, value_name = "tap=NAME,mac=MAC[,mtu=N]")]
    pub net: Vec<NetConfig>,

    /// The PVRDMA slot: vmxnet3 (function 0) on TAP NAME plus PVRDMA (function 1) sharing its
    /// port: tap=NAME,mac=MAC[,mtu=N][,gid=roce-v2|roce-v1][,local=on|off|DIR][,max_qp=N]
    /// [,max_cq=N][,max_mr=N][,mapped=SIZE][,poll=US][,share_memory=on|off][,worker_cpus=CPUS].
    /// RDMA traffic is RoCE v2 on the TAP, except to
    /// VMMs of this host, reached by memory copy through shared-memory rings set up over
    /// sockets in DIR (local=on: /run/pvrdma-vmm; local=off: always the TAP). The VM's budgets
    /// (defaults: 8192 QPs, at most 16384; 16384 CQs, 16384 MRs, 8G of guest memory mapped by
    /// rings and MRs) are advertised to the guest; a command beyond them fails with ENOMEM and
    /// a log line. Each QP holds an open file: the VMM raises its soft limit to the hard one.
    /// The device's worker busy-polls for US microseconds (default 50, at most 1000, 0: never)
    /// after each piece of work before it sleeps: small messages then need no wake-up.
    /// share_memory=on (default off) lets same-host VMMs that turned it on too map ALL of this
    /// guest's memory read-only and copy RDMA payloads straight from it (one copy instead of
    /// two): only for VMs that trust each other as one process (docs/security.md).
    /// worker_cpus=N, N-M or [N,N-M,...] keeps the device's worker on those host CPUs (off
    /// the vCPUs' and the same-host peers' workers': latency-sensitive setups).
    /// Repeatable, up to 4: each device has a slot, MAC, TAP, budgets and QPN and key spaces
    /// of its own; the guest names them vmw_pvrdma0, vmw_pvrdma1, ... in this order.
    #[arg(
        long,
        value_name = "tap=NAME,mac=MAC[,mtu=N][,gid=..][,local=..][,max_qp=N][,max_cq=N][,max_mr=N][,mapped=SIZE][,poll=US][,share_memory=on|off][,worker_cpus=CPUS]"
    )]
    pub pvrdma: Vec<PvrdmaConfig>,

    /// Serial console (COM1): tty (stdout, input from stdin), file=PATH, or off.
    #[arg(long, value_name = "tty|file=PATH|off", default_value = "tty")]
    pub serial: SerialConfig,

    /// Unix socket for the HTTP API (created with mode 0600).
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,

    /// Seccomp filters per thread kind: true (a forbidden syscall ends the VMM with a message
    /// naming it), log (allowed, logged by the kernel's audit) or false.
    #[arg(long, value_name = "true|log|false", default_value = "true")]
    pub seccomp: crate::sandbox::SeccompMode,

    /// Log level on stderr: error, warn, info, debug or trace.
    #[arg(long, value_name = "LEVEL", default_value = "info")]
    pub log_level: log::LevelFilter,
}

/// What the command line asks the VMM to do.
#[derive(Debug)]
pub enum Mode {
    /// Boot a kernel.
    Boot(Box<VmConfig>),
    /// Serve the API and wait for an incoming migration.
    Receive,
    /// Start from the snapshot in this directory.
    Restore(PathBuf),
}

impl Cli {
    /// Boot, restore or receive, from which options are present.
    pub fn mode(&self) -> Result<Mode, ConfigError> {
        if let Some(restore) = &self.restore {
            let dir = restore
                .strip_prefix("source_url=")
                .and_then(|url| vm_migration::transport::parse_file_url(url).ok())
                .ok_or_else(|| ConfigError::BadValue {
                    key: "--restore",
                    value: restore.clone(),
                    expected: "source_url=file:///absolute/dir",
                })?;
            return Ok(Mode::Restore(dir));
        }
        if self.kernel.is_none() {
            let vm_options = self.initramfs.is_some()
                || !self.disk.is_empty()
                || !self.net.is_empty()
                || !self.pvrdma.is_empty();
            if self.api_socket.is_none() || vm_options {
                return Err(ConfigError::MissingKernel);
            }
            return Ok(Mode::Receive);
        }
        self.vm_config().map(|c| Mode::Boot(Box::new(c)))
    }

    /// The VM configuration, with the checks that span several options.
    pub fn vm_config(&self) -> Result<VmConfig, ConfigError> {
        let cfg = VmConfig {
            kernel: self.kernel.clone().ok_or(ConfigError::MissingKernel)?,
            initramfs: self.initramfs.clone(),
            cmdline: self.cmdline.clone(),
            cpus: self.cpus,
            memory: self.memory,
            disks: self.disk.clone(),
            nets: self.net.clone(),
            pvrdma: self.pvrdma.clone(),
            serial: self.serial.clone(),
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_a_full_command_line() {
        let cli = Cli::try_parse_from([
            "pvrdma-vmm",
            "--kernel",
            "/k",
            "--initramfs",
            "/i",
            "--cmdline",
            "console=ttyS0 quiet",
            "--cpus",
            "2",
            "--memory",
            "1G",
            "--disk",
            "path=/d.img,readonly=on",
            "--disk",
            "path=/e.img",
            "--serial",
            "file=/tmp/s",
            "--api-socket",
            "/tmp/api",
            "--log-level",
            "debug",
        ])
        .unwrap();
        let cfg = cli.vm_config().unwrap();
        assert_eq!((cfg.cpus, cfg.memory, cfg.disks.len()), (2, 1 << 30, 2));
        assert!(cfg.disks[0].readonly && !cfg.disks[1].readonly);
        assert_eq!(cfg.serial, SerialConfig::File("/tmp/s".into()));
        assert_eq!(cli.log_level, log::LevelFilter::Debug);
    }

    #[test]
    fn bad_values_are_errors() {
        for args in [
            &["--kernel", "/k", "--cpus", "0"][..],
            &["--kernel", "/k", "--memory", "12X"],
            &["--kernel", "/k", "--disk", "readonly=on"],
            &["--kernel", "/k", "--serial", "pty"],
            &["--kernel", "/k", "--log-level", "loud"],
            &["--restore", "source_url=file:///s", "--kernel", "/k"],
            &["--restore", "source_url=file:///s"],
        ] {
            let argv = std::iter::once("pvrdma-vmm").chain(args.iter().copied());
            assert!(Cli::try_parse_from(argv).is_err(), "{args:?}");
        }
    }

    #[test]
    fn pvrdma_is_repeatable_with_distinct_nics() {
        let cfg = |devices: &[&str]| {
            let mut argv = vec!["pvrdma-vmm", "--kernel", "/k"];
            for d in devices {
                argv.extend(["--pvrdma", d]);
            }
            Cli::try_parse_from(argv).unwrap().vm_config()
        };
        let two = cfg(&[
            "tap=r0,mac=52:54:00:00:00:10",
            "tap=r1,mac=52:54:00:00:00:11,local=off",
        ])
        .unwrap();
        let taps: Vec<&str> = two.pvrdma.iter().map(|p| p.net.tap.as_str()).collect();
        assert_eq!(taps, ["r0", "r1"]);
        assert!(two.pvrdma[1].local.is_none());
        assert!(matches!(
            cfg(&["tap=r0,mac=52:54:00:00:00:10", "tap=r0,mac=52:54:00:00:00:11"]),
            Err(ConfigError::DuplicateTap(t)) if t == "r0"
        ));
        assert!(matches!(
            cfg(&[
                "tap=r0,mac=52:54:00:00:00:10",
                "tap=r1,mac=52:54:00:00:00:10"
            ]),
            Err(ConfigError::DuplicateMac(_))
        ));
        let five: Vec<String> = (0..5)
            .map(|i| format!("tap=r{i},mac=52:54:00:00:00:1{i}"))
            .collect();
        let five: Vec<&str> = five.iter().map(String::as_str).collect();
        let err = cfg(&five).unwrap_err();
        assert_eq!(err, ConfigError::TooManyPvrdma { max: 4, got: 5 });
        assert_eq!(err.to_string(), "at most 4 --pvrdma devices per VM, got 5");
        assert_eq!(cfg(&five[..4]).unwrap().pvrdma.len(), 4);
    }

    #[test]
    fn mode_follows_the_options() {
        let mode = |args: &[&str]| {
            let argv = std::iter::once("pvrdma-vmm").chain(args.iter().copied());
            Cli::try_parse_from(argv).unwrap().mode()
        };
        assert!(matches!(mode(&["--kernel", "/k"]), Ok(Mode::Boot(_))));
        assert!(matches!(mode(&["--api-socket", "/a"]), Ok(Mode::Receive)));
        assert!(matches!(
            mode(&["--restore", "source_url=file:///snap", "--api-socket", "/a"]),
            Ok(Mode::Restore(d)) if d == std::path::Path::new("/snap")
        ));
        // Without a kernel, VM options mean a forgotten --kernel, not a receiver.
        for args in [
            &["--cpus", "1"][..],
            &["--api-socket", "/a", "--disk", "path=/d"],
        ] {
            assert_eq!(
                mode(args).unwrap_err(),
                ConfigError::MissingKernel,
                "{args:?}"
            );
        }
        assert!(mode(&["--restore", "file:///snap", "--api-socket", "/a"]).is_err());
        assert!(mode(&["--restore", "source_url=file://rel", "--api-socket", "/a"]).is_err());
    }
}

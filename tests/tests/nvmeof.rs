// SPDX-License-Identifier: Apache-2.0
//! End to end: the kernel's storage over RDMA from guests on the PVRDMA device to native Linux
//! servers in the test host, as a user would run them: NVMe over Fabrics (issue 14, item 1) and
//! NFS over RDMA (item 2), in one test-host boot.
//!
//! NVMe over Fabrics: The test host runs the kernel's NVMe target
//! (nvmet + nvmet-rdma, configured through configfs) on Soft-RoCE, port 4420, with a brd RAM disk
//! as its namespace. An unmodified guest with `--pvrdma` loads nvme-rdma, runs nvme-cli's
//! `nvme discover` and `nvme connect -t rdma`, writes a known pattern over the whole 256 MiB
//! namespace through the block device (dd, O_DIRECT), reads it back with O_DIRECT and compares
//! every chunk's MD5 with the pattern's, then runs `nvme disconnect`. The test host checks on its
//! RAM disk what arrived (every chunk's MD5, the headers of some blocks).
//!
//! nvme-rdma is a kernel RDMA user: it fast-registers its buffers (IB_WR_REG_MR), lets the target
//! invalidate them (SEND_WITH_INV) or invalidates them itself (LOCAL_INV), and polls its CQs from
//! the kernel. So this suite proves the device's kernel-QP path, which rdma-core's programs never
//! take; a wrong opcode there leaves `nvme connect` to time out ("pvrdma: qp=2: Unknown send
//! opcode 0xb" before e8c9324).
//!
//! NFS over RDMA (the `nfs_*` tests): the same test host then runs the kernel NFS server (nfsd,
//! NFSv4.x only, svcrdma on RDMA port 20049 over the same Soft-RoCE) exporting a tmpfs; another
//! guest with `--pvrdma` loads rpcrdma and nfsv4, mounts the export with `proto=rdma` (busybox's
//! mount, options handed to the kernel as text), copies a tree of 200 files of 1-64 KiB and 3 of
//! 32 MiB of random content onto it (the time of `cp -r` + `sync`), unmounts, drops its caches,
//! mounts again and copies the tree back (the time of `cp -r`), checks every file against the
//! MD5s it took before writing, and unmounts. The test host checks the same MD5s on its side of
//! the export. rpcrdma, like nvme-rdma, registers its buffers with REG_MR and lets the server
//! RDMA-READ and RDMA-WRITE them.
//!
//! All tests share ONE run of `tests/scenarios/nvmeof.sh` (one test-host boot; one guest running
//! `tests/guest/nvmeof.sh`, then one running `tests/guest/nfsrdma.sh`); every command there is
//! bounded by `timeout`, a lost controller fails its I/O after `CTRL_LOSS_TMO` seconds and the NFS
//! mount is `soft`, so a broken data path fails these tests instead of hanging them.
//!
//! With `NFSRDMA_MOUNT_PORT=N` the NFS guest mounts port N instead of 20049: the `nfs_*` tests
//! must then fail (the mounts are refused), which shows they test the NFS/RDMA path.
//!
//! Then the same guest runs a migration pass (issue 14 item 7): rounds of 8 MiB, each a distinct
//! pattern written with O_DIRECT and read back verified, while the test host live-migrates it to
//! a new VMM in the same host (`pvrdma-remote send-migration unix:...`); the guest finishes its
//! rounds on the destination. No round may fail, no I/O error, and no controller reset, reconnect
//! or timeout may show in the guest's kernel log; the blackout is what `send-migration` printed.
//!
//! Guest to guest (issue 14 item 1, the `guest_to_guest_*` tests): a guest is the NVMe-oF target
//! (nvmet-rdma on its own PVRDMA device, a brd RAM disk; `tests/guest/nvmet.sh`), and two other
//! guests in turn are its initiators: I1 over the same-host channel (no RoCE frame crosses its
//! TAP), I2 with `local=off` (RoCE v2 over the bridge). Each writes 32 MiB of the pattern, the
//! target guest reports every chunk's MD5 as it arrived, and the initiator reads back and verifies.
//!
//! With `NVMEOF_BASELINE_MIB=N` in the environment (and `-- --include-ignored`: their tests are
//! opt-in, and fail if asked to run without the variable) the same run then measures the Soft-RoCE
//! baselines, each in a guest with a plain vmxnet3 NIC and Soft-RoCE (rxe0) in its own kernel,
//! checked as the PVRDMA guests are: one writes and verifies the first N MiB of the namespace the
//! same way (`soft_roce_baseline_when_asked`), another mounts the same NFS export over RDMA and
//! copies the same tree both ways (`nfs_soft_roce_baseline_when_asked`); the figures are printed
//! beside the PVRDMA guests' (minutes more at nested speed: not by default).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use e2e::results::{field, vmm_log_problems, KeyValues, SerialLog};
use e2e::steps::described_records;
use e2e::suite::{self, Checks, SetupError};
use e2e::testhost::{Hosts, Outcome};

const HOST_IP: &str = "10.20.0.254";
const PORT: u32 = 4420;
const NQN: &str = "nqn.2026-11.dev.pvrdma-vmm:nvmeof-e2e";
/// The namespace (a brd RAM disk) and what the guest writes: all of it.
const SIZE_MIB: u64 = 256;
/// The guest writes and reads in chunks of this many MiB, each one `dd` of 1 MiB blocks.
const CHUNK_MIB: u64 = 32;
const CHUNKS: u64 = SIZE_MIB / CHUNK_MIB;
/// 4 KiB blocks per chunk (each block of the pattern starts with its number).
const CHUNK_BLOCKS: u64 = CHUNK_MIB * 256;
/// The Soft-RoCE baseline's chunks (it writes `NVMEOF_BASELINE_MIB`, a multiple of them).
const BASELINE_CHUNK_MIB: u64 = 8;
const BASELINE_ENV: &str = "NVMEOF_BASELINE_MIB";
/// Guest to guest: what each initiator writes (the target guest's whole RAM disk), per chunk.
const G2G_MIB: u64 = 32;
const G2G_CHUNK_MIB: u64 = 16;
/// RoCE v2 frames on the wire initiator's TAP, at least: 32 MiB in at most 4 KiB frames is
/// 8192 of them one way.
const G2G_WIRE_FRAMES: u64 = 8192;
/// The migration pass: MiB per round, and rounds after the test host said "migrated".
const MIG_MIB: u64 = 8;
const MIG_AFTER: u64 = 4;

/// The NFS/RDMA server's port (svcrdma) and the guest's tree: small files of 1-64 KiB (sizes from
/// [`nfs_small_size`]) and large files of `NFS_LARGE_MIB`.
const NFS_PORT: u32 = 20049;
const NFS_SMALL_FILES: u64 = 200;
const NFS_LARGE_FILES: u64 = 3;
const NFS_LARGE_MIB: u64 = 32;
const NFS_FILES: u64 = NFS_SMALL_FILES + NFS_LARGE_FILES;
/// Set, the port the NFS guest's mount asks for instead of `NFS_PORT` (a broken run).
const NFS_MOUNT_PORT_ENV: &str = "NFSRDMA_MOUNT_PORT";

/// Kernel lines that match [`NFS_KERNEL_ERRORS`] but are expected, each with why.
const NFS_EXPECTED_KERNEL_LINES: &[&str] = &[
    // vmw_pvrdma.ko is built out of tree (resources/build-assets.sh), so it is unsigned.
    "module verification failed: signature and/or required key missing",
];

/// Lines of the NFS guest's kernel log (about NFS or RPC) that mean NFS/RDMA broke.
const NFS_KERNEL_ERRORS: &[&str] = &[
    "not responding",
    "timed out",
    "I/O error",
    "failed",
    "giving up",
    "connect error",
    "BUG:",
    "Oops",
];

/// Lines of the guest's kernel log (console and its dmesg section) that mean NVMe-oF broke.
const KERNEL_ERRORS: &[&str] = &[
    "timeout",
    "failed to connect",
    "reconnect",
    "I/O error",
    "BUG:",
    "Oops",
    "blk_update_request",
    "resetting controller",
];

struct Suite {
    outcome: Outcome,
    env: KeyValues,
    /// Guest A's console across its VMMs (A, then A2 after the migration).
    guest: SerialLog,
    /// A's console on its first VMM and on A2.
    source: SerialLog,
    destination: SerialLog,
    /// The NFS/RDMA phase: the test host's results, the NFS guest, and its Soft-RoCE baseline
    /// if it ran.
    nfs_env: KeyValues,
    nfs: NfsGuest,
    nfs_baseline: Option<NfsGuest>,
    /// The Soft-RoCE baseline guest's console and MiB, if it ran.
    baseline: Option<(SerialLog, u64)>,
    /// Guest to guest: the target guest's console, and the initiators' by name.
    target: SerialLog,
    initiators: [(&'static str, SerialLog); 2],
}

/// A guest of the NFS/RDMA phase (`tests/guest/nfsrdma.sh`).
struct NfsGuest {
    /// Its logs' name: `<name>-serial.log`, `<name>-vmm.log`.
    name: &'static str,
    /// The prefix of its keys in nfsrdma.env.
    prefix: &'static str,
    log: SerialLog,
}

/// The MiB `NVMEOF_BASELINE_MIB` asks the Soft-RoCE baselines for (unset: 0, no baselines).
fn baseline_mib() -> Result<u64, SetupError> {
    match std::env::var(BASELINE_ENV) {
        Ok(v) => v
            .parse::<u64>()
            .ok()
            .filter(|m| m % BASELINE_CHUNK_MIB == 0 && *m <= SIZE_MIB)
            .ok_or_else(|| {
                format!(
                    "{BASELINE_ENV}={v}: want a multiple of {BASELINE_CHUNK_MIB} up to {SIZE_MIB}"
                )
            }),
        Err(_) => Ok(0),
    }
}

/// Fails the calling baseline test unless `NVMEOF_BASELINE_MIB` asks for the baselines: without
/// it the scenario runs none, and an opt-in test run on purpose must not pass having measured
/// nothing.
fn expect_baseline_asked() {
    match baseline_mib() {
        Ok(0) => panic!(
            "the Soft-RoCE baselines run only with {BASELINE_ENV}=N (N MiB, a multiple of \
             {BASELINE_CHUNK_MIB}; 64 for the figures of docs/benchmarks.md) in the environment"
        ),
        Ok(_) => {}
        Err(e) => panic!("{e}"),
    }
}

fn suite() -> &'static Suite {
    static SUITE: OnceLock<Result<Suite, SetupError>> = OnceLock::new();
    suite::shared(&SUITE, || {
        let baseline_mib = baseline_mib()?;
        let bins = e2e::binaries::locate().map_err(|e| e.to_string())?;
        // NFSRDMA_MOUNT_PORT=N: the NFS guest mounts port N instead of the server's, to see the
        // nfs_* tests fail.
        let mut extra = Vec::new();
        if let Ok(port) = std::env::var(NFS_MOUNT_PORT_ENV) {
            extra.push(("NFS_MOUNT_PORT", port));
        }
        let outcome = suite::run_vmm_scenario(
            "nvmeof",
            &[
                ("PVRDMA_REMOTE_BIN", bins.remote.display().to_string()),
                ("MIG_MIB", MIG_MIB.to_string()),
                ("MIG_AFTER", MIG_AFTER.to_string()),
                ("SIZE_MIB", SIZE_MIB.to_string()),
                ("CHUNK_MIB", CHUNK_MIB.to_string()),
                ("BASELINE_MIB", baseline_mib.to_string()),
                ("BASELINE_CHUNK_MIB", BASELINE_CHUNK_MIB.to_string()),
                ("SMALL_FILES", NFS_SMALL_FILES.to_string()),
                ("LARGE_FILES", NFS_LARGE_FILES.to_string()),
                ("LARGE_MIB", NFS_LARGE_MIB.to_string()),
                ("G2G_MIB", G2G_MIB.to_string()),
                ("G2G_CHUNK_MIB", G2G_CHUNK_MIB.to_string()),
            ]
            .into_iter()
            .chain(extra)
            .collect::<Vec<_>>(),
            // Typically 6-12 min in the test host (the NVMe-oF pass with its migration phase took
            // 176 s on 2026-11-26, NFS adds ~2.5 min); the scenario's own limit is 2700 s, which
            // only a data path that hangs at every bounded step needs.
            Duration::from_secs(2820),
            Hosts::One { l1_cpus: 1 },
        )?;
        // Empty if the run ended before the baseline: then its test fails, not every test.
        let baseline = (baseline_mib > 0).then(|| {
            let log = SerialLog::read(&outcome.file("nvmeof-b-serial.log"))
                .unwrap_or_else(|_| SerialLog::concat(&[]));
            (log, baseline_mib)
        });
        Ok(Suite {
            env: suite::key_values(&outcome, "nvmeof.env")?,
            // A's console: on its first VMM, then on A2 (after the migration).
            guest: SerialLog::concat(&[
                suite::serial_log(&outcome, "nvmeof-a-serial.log")?,
                suite::serial_log(&outcome, "nvmeof-a2-serial.log")?,
            ]),
            source: suite::serial_log(&outcome, "nvmeof-a-serial.log")?,
            destination: suite::serial_log(&outcome, "nvmeof-a2-serial.log")?,
            nfs_env: suite::key_values(&outcome, "nfsrdma.env")?,
            nfs: NfsGuest {
                name: "nfsrdma",
                prefix: "",
                log: suite::serial_log(&outcome, "nfsrdma-serial.log")?,
            },
            // Empty if the run ended before the baseline: then its test fails, not every test.
            nfs_baseline: (baseline_mib > 0).then(|| NfsGuest {
                name: "nfsrdma-b",
                prefix: "b.",
                log: SerialLog::read(&outcome.file("nfsrdma-b-serial.log"))
                    .unwrap_or_else(|_| SerialLog::concat(&[])),
            }),
            baseline,
            target: suite::serial_log(&outcome, "nvmeof-t-serial.log")?,
            initiators: [
                ("i1", suite::serial_log(&outcome, "nvmeof-i1-serial.log")?),
                ("i2", suite::serial_log(&outcome, "nvmeof-i2-serial.log")?),
            ],
            outcome,
        })
    })
}

impl Checks for Suite {
    /// Fails the test with `what`, the guest's set-up failure if any, the end of its console and
    /// of its VMM's log.
    fn fail(&self, what: &str) -> ! {
        let mut msg = what.to_string();
        if let Some(why) = self.guest.marker("NVMEOF-FAIL ") {
            msg += &format!("\nthe guest's script failed: {why}");
        }
        if let Some(why) = self
            .baseline
            .as_ref()
            .and_then(|(b, _)| b.marker("NVMEOF-FAIL "))
        {
            msg += &format!("\nthe baseline guest's script failed: {why}");
        }
        for g in std::iter::once(&self.nfs).chain(&self.nfs_baseline) {
            if let Some(why) = g.log.marker("NFSRDMA-FAIL ") {
                msg += &format!("\nthe NFS guest {}'s script failed: {why}", g.name);
            }
        }
        let logs = [
            "nvmeof-a-serial.log".to_string(),
            "nvmeof-a-vmm.log".to_string(),
            "nvmeof-a2-serial.log".to_string(),
            "nvmeof-a2-vmm.log".to_string(),
            "nvmeof-a-to-nvmeof-a2-remote.log".to_string(),
            "nvmeof-b-serial.log".to_string(),
            "nvmeof-b-vmm.log".to_string(),
            "nvmeof-t-serial.log".to_string(),
            "nvmeof-i1-serial.log".to_string(),
            "nvmeof-i2-serial.log".to_string(),
            "nfsrdma-serial.log".to_string(),
            "nfsrdma-vmm.log".to_string(),
            "nfsrdma-b-serial.log".to_string(),
            "nfsrdma-b-vmm.log".to_string(),
            "nfsrdma-mountd.log".to_string(),
        ];
        panic!("{}", self.outcome.failure(&msg, &logs, 25))
    }

    fn record(&self) -> &KeyValues {
        &self.env
    }
}

impl Suite {
    fn vmm_log(&self, g: &str) -> PathBuf {
        self.outcome.file(&format!("nvmeof-{g}-vmm.log"))
    }

    /// Result `key` of NFS guest `g` in nfsrdma.env.
    fn nfs_env(&self, g: &NfsGuest, key: &str) -> &str {
        let key = format!("{}{key}", g.prefix);
        self.nfs_env
            .get(&key)
            .unwrap_or_else(|| self.fail(&format!("nfsrdma.env has no {key}")))
    }

    /// The rest of NFS guest `g`'s `NFSRDMA-<name> ` line.
    fn nfs_marker<'a>(&self, g: &'a NfsGuest, name: &str) -> &'a str {
        g.log
            .marker(&format!("NFSRDMA-{name} "))
            .unwrap_or_else(|| {
                self.fail(&format!(
                    "the NFS guest {} printed no NFSRDMA-{name} line",
                    g.name
                ))
            })
    }

    /// NFS guest `g`'s section `name`; fails unless it exited 0.
    fn nfs_section_ok(&self, g: &NfsGuest, name: &str) -> String {
        let section = g.log.section(name).unwrap_or_else(|| {
            self.fail(&format!("the NFS guest {} never ran its {name}", g.name))
        });
        self.expect(section.rc == Some(0), || {
            format!(
                "the NFS guest {}'s {name} exited {:?}; its output:\n{}",
                g.name, section.rc, section.text
            )
        });
        section.text
    }

    /// Both of NFS guest `g`'s mounts (before writing, and again before reading back) are
    /// NFSv4.1 over RDMA on the server's port 20049.
    fn expect_nfs_mounts(&self, g: &NfsGuest) {
        for n in ["1", "2"] {
            self.nfs_section_ok(g, &format!("mount-{n}"));
            let line = g
                .log
                .markers("NFSRDMA-MOUNTED ")
                .into_iter()
                .find(|l| field(l, "n") == Some(n))
                .unwrap_or_else(|| {
                    self.fail(&format!("the NFS guest {} never mounted ({n})", g.name))
                });
            let mount = field(line, "line").unwrap_or("").replace('|', " ");
            for want in [
                " nfs4 ".to_string(),
                "vers=4.1".to_string(),
                "proto=rdma".to_string(),
                format!("port={NFS_PORT}"),
                format!("addr={HOST_IP}"),
            ] {
                self.expect(mount.contains(&want), || {
                    format!("{}'s mount {n} has no '{}': '{mount}'", g.name, want.trim())
                });
            }
        }
    }

    /// The tree NFS guest `g` copied onto the export is, file by file, on the test host: its own
    /// MD5s of what it holds are the guest's manifest, `md5sum -c` of that manifest passes for
    /// every file, and the sizes add up. Returns the copy's time (centiseconds).
    fn expect_nfs_tree_on_the_server(&self, g: &NfsGuest) -> u64 {
        let tree = self.nfs_marker(g, "TREE");
        let bytes = nfs_tree_bytes();
        self.expect(
            self.num(tree, "files") == NFS_FILES && self.num(tree, "bytes") == bytes,
            || {
                format!(
                    "{}'s tree should be {NFS_FILES} files, {bytes} bytes: '{tree}'",
                    g.name
                )
            },
        );
        let written = self.nfs_marker(g, "WRITTEN");
        self.expect(self.num(written, "files") == NFS_FILES, || {
            format!("{}'s write: '{written}'", g.name)
        });
        self.expect(self.nfs_env(g, "host_check") == "done", || {
            format!(
                "the test host did not check what {} wrote to the export",
                g.name
            )
        });
        let manifest = field(tree, "manifest_md5").unwrap_or("?");
        for (key, what) in [
            (
                "host_guest_manifest_md5",
                "the guest's MANIFEST.md5 on the export",
            ),
            (
                "host_manifest_md5",
                "the test host's own MD5s of the export",
            ),
        ] {
            let got = self.nfs_env(g, key);
            self.expect(got == manifest, || {
                format!(
                    "{what} hash to {got}, {}'s manifest to {manifest} (see \
                     {0}-host-manifest.txt and {0}-guest-manifest.txt)",
                    g.name
                )
            });
        }
        for (key, want) in [
            ("host_files", NFS_FILES),
            ("host_bytes", bytes),
            ("host_check_ok", NFS_FILES),
            ("host_check_failed", 0),
        ] {
            let got = self.nfs_env(g, key);
            self.expect(got.parse::<u64>().ok() == Some(want), || {
                format!("the test host's {key} of {} is {got}, not {want}", g.name)
            });
        }
        self.num(written, "centis")
    }

    /// Copied back by NFS guest `g` from a fresh mount with its caches dropped, every file has the
    /// MD5 the guest took before writing, and the manifest on the export is the guest's. Returns
    /// the copy's time (centiseconds).
    fn expect_nfs_tree_read_back(&self, g: &NfsGuest) -> u64 {
        let read = self.nfs_marker(g, "READ");
        let bytes = nfs_tree_bytes();
        let bad = g.log.markers("NFSRDMA-BAD ").join("\n");
        self.expect(
            self.num(read, "files") == NFS_FILES
                && self.num(read, "bytes") == bytes
                && self.num(read, "ok") == NFS_FILES
                && self.num(read, "bad") == 0,
            || {
                format!(
                    "{}'s read-back: '{read}'; files that did not match:\n{bad}",
                    g.name
                )
            },
        );
        self.expect(field(read, "manifest_same") == Some("1"), || {
            format!(
                "the MANIFEST.md5 read back from the export is not {}'s: '{read}'",
                g.name
            )
        });
        self.num(read, "centis")
    }

    /// Both of NFS guest `g`'s unmounts succeed and no NFS mount is left; its script ends ok.
    fn expect_nfs_unmounted(&self, g: &NfsGuest) {
        self.nfs_section_ok(g, "umount-1");
        self.nfs_section_ok(g, "umount-2");
        let line = self.nfs_marker(g, "UNMOUNTED");
        self.expect(
            field(line, "rc") == Some("0") && field(line, "gone") == Some("1"),
            || format!("{}'s last unmount: '{line}'", g.name),
        );
        let done = self.nfs_marker(g, "DONE");
        self.expect(done == "ok=1", || {
            format!("the NFS guest {}'s script ended with '{done}'", g.name)
        });
    }

    /// NFS guest `g`'s kernel reports no server that stopped responding, RPC timeout, I/O error
    /// or failure about NFS or RPC, and no kernel BUG.
    fn expect_nfs_kernel_clean(&self, g: &NfsGuest) {
        let log = g.log.tail(usize::MAX);
        self.expect(log.contains("SECTION-END nfs-kernel-log rc=0"), || {
            format!(
                "the NFS guest {} never printed its kernel log section",
                g.name
            )
        });
        let bad = nfs_kernel_errors(&log);
        self.expect(bad.is_empty(), || {
            format!(
                "the NFS guest {}'s kernel logged errors:\n{}",
                g.name,
                bad.join("\n")
            )
        });
    }

    /// NFS guest `g`'s VMM exits 0 after the guest powers off, without a panic, warning or error
    /// in its log.
    fn expect_nfs_vmm_clean(&self, g: &NfsGuest) {
        for key in ["n_exit", "n_panics"] {
            let got = self.nfs_env(g, key);
            self.expect(got == "0", || {
                format!("the NFS guest {}'s {key} is {got}", g.name)
            });
        }
        let problems = vmm_log_problems(&self.outcome.file(&format!("{}-vmm.log", g.name)))
            .unwrap_or_else(|e| self.fail(&e.to_string()));
        self.expect(problems.is_empty(), || {
            format!(
                "the NFS guest {}'s VMM logged warnings or errors:\n{}",
                g.name,
                problems.join("\n")
            )
        });
    }

    /// The rest of the guest's `NVMEOF-<name> ` line.
    fn marker(&self, name: &str) -> &str {
        self.marker_of(&self.guest, name)
    }

    /// The rest of the `NVMEOF-<name> ` line on console `log`.
    fn marker_of<'a>(&self, log: &'a SerialLog, name: &str) -> &'a str {
        log.marker(&format!("NVMEOF-{name} "))
            .unwrap_or_else(|| self.fail(&format!("a guest printed no NVMEOF-{name} line")))
    }

    /// nvme-cli's output in section `name`; fails unless it exited 0.
    fn section_ok(&self, name: &str) -> String {
        let section = self
            .guest
            .section(name)
            .unwrap_or_else(|| self.fail(&format!("the guest never ran `nvme {name}`")));
        self.expect(section.rc == Some(0), || {
            format!(
                "`nvme {name}` exited {:?}; its output:\n{}",
                section.rc, section.text
            )
        });
        section.text
    }

    /// The guest's NVMEOF-CHUNK line of `phase` for chunk `c`.
    fn chunk(&self, phase: &str, c: u64) -> &str {
        self.chunk_of(&self.guest, phase, c)
    }

    /// The NVMEOF-CHUNK line of `phase` for chunk `c` on console `log`.
    fn chunk_of<'a>(&self, log: &'a SerialLog, phase: &str, c: u64) -> &'a str {
        log.markers("NVMEOF-CHUNK ")
            .into_iter()
            .find(|l| field(l, "phase") == Some(phase) && field(l, "chunk") == Some(&c.to_string()))
            .unwrap_or_else(|| {
                self.fail(&format!(
                    "the guest never reported its {phase} of chunk {c}"
                ))
            })
    }

    /// Guest to guest: initiator `name` wrote its pattern to the target guest, which holds it
    /// chunk by chunk, read it back verified and disconnected; its VMM ran clean; and
    /// `frames_ok` holds of the RoCE frames that crossed its TAP. Returns the write and read
    /// figures.
    fn expect_guest_to_guest(&self, name: &str, frames_ok: impl Fn(u64) -> bool) -> String {
        let log = self
            .initiators
            .iter()
            .find_map(|(n, log)| (*n == name).then_some(log))
            .unwrap_or_else(|| self.fail(&format!("no initiator {name}")));
        if let Some(why) = log.marker("NVMEOF-FAIL ") {
            self.fail(&format!("initiator {name} failed: {why}"));
        }
        if let Some(why) = self.target.marker("NVMET-FAIL ") {
            self.fail(&format!("the target guest failed: {why}"));
        }
        let held = self.target.markers("NVMET-CHUNK ");
        for c in 0..G2G_MIB / G2G_CHUNK_MIB {
            let want = field(self.chunk_of(log, "write", c), "md5").unwrap_or("?");
            let got = held
                .iter()
                .find(|l| {
                    field(l, "initiator") == Some(name) && field(l, "chunk") == Some(&c.to_string())
                })
                .and_then(|l| field(l, "md5"));
            self.expect(got == Some(want), || {
                format!("chunk {c} of {name} on the target guest: {got:?}, the pattern's: {want}")
            });
            let read = self.chunk_of(log, "read", c);
            self.expect(
                field(read, "ok") == Some("1") && field(read, "md5") == Some(want),
                || format!("{name}'s chunk {c} read back wrong: '{read}'"),
            );
        }
        let read = self.marker_of(log, "READ");
        self.expect(
            self.num(read, "bad_chunks") == 0 && self.num(read, "bytes") == G2G_MIB << 20,
            || format!("{name}'s read-back: '{read}'"),
        );
        let done = self.marker_of(log, "DONE");
        self.expect(done == "ok=1", || format!("{name} ended with '{done}'"));
        for key in [format!("{name}_exit"), format!("{name}_panics")] {
            self.expect(self.env(&key) == "0", || {
                format!("{key} is {}", self.env(&key))
            });
        }
        let frames: u64 = self
            .env(&format!("{name}.roce_frames"))
            .parse()
            .unwrap_or_else(|_| self.fail(&format!("{name}.roce_frames is not a number")));
        self.expect(frames_ok(frames), || {
            format!("{frames} RoCE v2 frames crossed {name}'s TAP")
        });
        let written = self.marker_of(log, "WRITTEN");
        format!(
            "write {:.2} MB/s, read {:.2} MB/s, {frames} RoCE frames on its TAP",
            mb_per_s(G2G_MIB << 20, self.num(written, "centis")),
            mb_per_s(G2G_MIB << 20, self.num(read, "centis"))
        )
    }

    /// Initiator `name`'s kernel logged no NVMe-oF error: no controller reset or reconnect.
    fn expect_initiator_kernel_clean(&self, name: &str) {
        let log = self
            .initiators
            .iter()
            .find_map(|(n, log)| (*n == name).then_some(log))
            .unwrap_or_else(|| self.fail(&format!("no initiator {name}")));
        let text = log.tail(usize::MAX);
        let bad = kernel_errors(&text);
        self.expect(bad.is_empty(), || {
            format!("{name}'s kernel logged NVMe-oF errors:\n{}", bad.join("\n"))
        });
    }

    /// `key` of a marker line, parsed.
    fn num(&self, line: &str, key: &str) -> u64 {
        field(line, key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| self.fail(&format!("no number {key}= in '{line}'")))
    }
}

/// MB/s (10^6 bytes) of `bytes` in `centis` hundredths of a second.
fn mb_per_s(bytes: u64, centis: u64) -> f64 {
    bytes as f64 / 1e6 / (centis.max(1) as f64 / 100.0)
}

/// The kernel's lines (`[ seconds]` first: the console's kernel messages and the dmesg section)
/// of the NFS guest's console `log` that mean NFS/RDMA broke: [`NFS_KERNEL_ERRORS`] on a line
/// about NFS, RPC or RDMA, or a kernel BUG or Oops anywhere. Not the scripts' own output (the
/// negative control's "mount: ... failed: Connection refused" is expected), and not
/// [`NFS_EXPECTED_KERNEL_LINES`].
fn nfs_kernel_errors(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            l.trim_start()
                .strip_prefix('[')
                .and_then(|r| r.split_once(']'))
                .is_some_and(|(t, _)| t.trim().parse::<f64>().is_ok())
        })
        .filter(|l| NFS_KERNEL_ERRORS.iter().any(|e| l.contains(e)))
        .filter(|l| {
            let lower = l.to_lowercase();
            lower.contains("nfs")
                || lower.contains("rpc")
                || lower.contains("rdma")
                || l.contains("BUG:")
                || l.contains("Oops")
        })
        .filter(|l| !NFS_EXPECTED_KERNEL_LINES.iter().any(|e| l.contains(e)))
        .collect()
}

/// The size of small file `i` of the NFS tree (tests/guest/nfsrdma.sh): 1 KiB to 64 KiB.
fn nfs_small_size(i: u64) -> u64 {
    1024 + (i * 40961) % 64513
}

/// The bytes of the whole NFS tree.
fn nfs_tree_bytes() -> u64 {
    (0..NFS_SMALL_FILES).map(nfs_small_size).sum::<u64>() + NFS_LARGE_FILES * (NFS_LARGE_MIB << 20)
}

/// The first 28 bytes of block `b` of the pattern (tests/guest/nvmeof.sh's `pattern`): what the
/// test host reads back as the block's header.
fn block_header(b: u64) -> String {
    format!("pvrdma-nvmeof block {b:08}")
}

#[test]
fn soft_roce_and_the_nvmet_target_come_up() {
    let s = suite();
    s.expect(s.env.get("rxe_setup") == Some("ok"), || {
        "Soft-RoCE (rxe0 on br0) did not come up in the test host (see rxe-devinfo.txt)".into()
    });
    s.expect(s.env.get("target_setup") == Some("ok"), || {
        format!(
            "the nvmet target could not be set up: {:?}",
            s.env.get("target_why")
        )
    });
    s.expect(s.env("port_ready") == "1", || {
        format!(
            "nvmet-rdma's port {HOST_IP}:{PORT} did not come up: {:?}",
            s.env.get("port_why")
        )
    });
}

/// `nvme discover -t rdma`: the discovery controller answers over the PVRDMA device and lists
/// the subsystem on the RDMA port.
#[test]
fn nvme_discover_over_pvrdma_lists_the_subsystem() {
    let s = suite();
    let out = s.section_ok("discover");
    let has = |key: &str, value: &str| {
        out.lines().any(|l| {
            l.split_once(':')
                .is_some_and(|(k, v)| k.trim() == key && v.trim() == value)
        })
    };
    for (key, value) in [
        ("subnqn", NQN),
        ("trtype", "rdma"),
        ("traddr", HOST_IP),
        ("trsvcid", "4420"),
    ] {
        s.expect(has(key, value), || {
            format!("`nvme discover` lists no {key}: {value}; its output:\n{out}")
        });
    }
}

/// `nvme connect -t rdma`: a live controller of the subsystem over RDMA, whose namespace is the
/// test host's whole RAM disk; the target created an NVM controller for this guest's host NQN.
#[test]
fn nvme_connect_over_pvrdma_gives_the_namespace() {
    let s = suite();
    s.section_ok("connect");
    let line = s.marker("CONNECTED");
    for (key, want) in [("transport", "rdma"), ("subsysnqn", NQN), ("state", "live")] {
        s.expect(field(line, key) == Some(want), || {
            format!("the controller's {key} should be {want}: '{line}'")
        });
    }
    let address = field(line, "address").unwrap_or("");
    s.expect(
        address.contains(&format!("traddr={HOST_IP}"))
            && address.contains(&format!("trsvcid={PORT}")),
        || format!("the controller is not connected to {HOST_IP}:{PORT}: '{line}'"),
    );
    s.expect(s.num(line, "bytes") == SIZE_MIB << 20, || {
        format!("the namespace should be the target's {SIZE_MIB} MiB RAM disk: '{line}'")
    });
    s.expect(s.num(line, "queues") >= 2, || {
        format!("no I/O queue besides the admin queue: '{line}'")
    });
    let controllers: u64 = s.env("target_controllers").parse().unwrap_or(0);
    s.expect(controllers >= 1, || {
        "the target's kernel log shows no NVM controller created for the guest's host NQN (see \
         nvmeof-l1-dmesg.txt)"
            .into()
    });
}

/// The pattern written through the block device (O_DIRECT) is, chunk by chunk, what the test
/// host's RAM disk holds: the same MD5 as the guest's of the pattern, and blocks at their place.
#[test]
fn the_pattern_written_over_rdma_arrives_on_the_target() {
    let s = suite();
    let written = s.marker("WRITTEN");
    s.expect(s.num(written, "bytes") == SIZE_MIB << 20, || {
        format!("the guest should have written {SIZE_MIB} MiB: '{written}'")
    });
    s.expect(s.env("target_check") == "done", || {
        "the test host did not read its RAM disk back".into()
    });
    let mut sums = Vec::new();
    for c in 0..CHUNKS {
        let line = s.chunk("write", c);
        let want = field(line, "md5").unwrap_or("?");
        let got = s.env(&format!("target.chunk.{c}.md5"));
        s.expect(got == want, || {
            format!(
                "chunk {c} ({CHUNK_MIB} MiB at {} MiB): the target holds MD5 {got}, the guest \
                 wrote {want}",
                c * CHUNK_MIB
            )
        });
        sums.push(want.to_string());
        for b in [
            c * CHUNK_BLOCKS,
            c * CHUNK_BLOCKS + CHUNK_BLOCKS / 2 + 1,
            (c + 1) * CHUNK_BLOCKS - 1,
        ] {
            let got = s.env(&format!("target.block.{b}"));
            s.expect(got == block_header(b), || {
                format!(
                    "block {b} on the target starts with '{got}', not '{}'",
                    block_header(b)
                )
            });
        }
    }
    sums.sort();
    sums.dedup();
    s.expect(sums.len() as u64 == CHUNKS, || {
        "two chunks of the pattern have the same MD5: the pattern does not tell places apart".into()
    });
    let centis = s.num(written, "centis");
    e2e::announce(&format!(
        "nvmeof: wrote {SIZE_MIB} MiB over NVMe-oF/RDMA (pvrdma -> Soft-RoCE nvmet) at {:.2} MB/s \
         (dd bs=1M oflag=direct, {:.1} s)",
        mb_per_s(SIZE_MIB << 20, centis),
        centis as f64 / 100.0
    ));
}

/// Read back with O_DIRECT (caches dropped too), every chunk has the MD5 the guest computed of
/// the pattern when it wrote it.
#[test]
fn the_pattern_reads_back_verified() {
    let s = suite();
    let read = s.marker("READ");
    for c in 0..CHUNKS {
        let line = s.chunk("read", c);
        let want = field(s.chunk("write", c), "md5").unwrap_or("?");
        s.expect(
            field(line, "ok") == Some("1") && field(line, "md5") == Some(want),
            || format!("chunk {c} read back wrong (the pattern's MD5 is {want}): '{line}'"),
        );
    }
    s.expect(
        s.num(read, "bad_chunks") == 0 && s.num(read, "bytes") == SIZE_MIB << 20,
        || format!("the guest's read-back: '{read}'"),
    );
    let centis = s.num(read, "centis");
    e2e::announce(&format!(
        "nvmeof: read and verified {SIZE_MIB} MiB over NVMe-oF/RDMA at {:.2} MB/s (dd bs=1M \
         iflag=direct, {:.1} s)",
        mb_per_s(SIZE_MIB << 20, centis),
        centis as f64 / 100.0
    ));
}

/// `nvme disconnect` ends the controller cleanly: no controller or block device is left.
#[test]
fn nvme_disconnect_is_clean() {
    let s = suite();
    let out = s.section_ok("disconnect");
    s.expect(out.contains("disconnected 1 controller(s)"), || {
        format!("`nvme disconnect` did not disconnect exactly one controller:\n{out}")
    });
    let line = s.marker("DISCONNECTED");
    s.expect(field(line, "gone") == Some("1"), || {
        format!("a controller or block device is left after nvme disconnect: '{line}'")
    });
    s.expect(s.marker("DONE") == "ok=1", || {
        format!("the guest's script ended with '{}'", s.marker("DONE"))
    });
}

/// The guest's kernel (its console and its dmesg lines about nvme and RDMA) reports no NVMe
/// timeout, failed connect, reconnect or I/O error, and no kernel BUG. Kernel WARNINGs are
/// reported, not failed on: every boot under our VMM prints one (issue 14, `fpu__init_system_xstate`).
#[test]
fn the_guest_kernel_logs_no_nvme_error() {
    let s = suite();
    let log = s.guest.tail(usize::MAX);
    s.expect(log.contains("SECTION-END kernel-log rc=0"), || {
        "the guest never printed its kernel log section".into()
    });
    let bad = kernel_errors(&log);
    s.expect(bad.is_empty(), || {
        format!(
            "the guest's kernel logged NVMe-oF errors:\n{}",
            bad.join("\n")
        )
    });
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARNING:")).collect();
    if !warnings.is_empty() {
        e2e::announce(&format!(
            "nvmeof: the guest's kernel logged {} WARNING(s) (reported, not failed on):\n{}",
            warnings.len(),
            warnings.join("\n")
        ));
    }
}

/// The VMM exits 0 after the guest powers off, without a panic or a warning in its log (an
/// unknown work request opcode or a QP error is logged there).
#[test]
fn the_vmm_runs_clean() {
    let s = suite();
    // A's VMM once the VM left it, A2's once the guest powered off.
    for g in ["a", "a2"] {
        s.expect(s.env(&format!("{g}_exit")) == "0", || {
            format!("the VMM {g} exited {}", s.env(&format!("{g}_exit")))
        });
        s.expect(s.env(&format!("{g}_panics")) == "0", || {
            format!("the VMM {g} panicked")
        });
        let problems = vmm_log_problems(&s.vmm_log(g)).unwrap_or_else(|e| s.fail(&e.to_string()));
        s.expect(problems.is_empty(), || {
            format!(
                "the VMM {g} logged warnings or errors:\n{}",
                problems.join("\n")
            )
        });
    }
}

/// The Soft-RoCE baseline (opt-in: `NVMEOF_BASELINE_MIB=N` and `--include-ignored`): a guest whose own kernel runs
/// Soft-RoCE under nvme-rdma writes, the target holds, and the guest reads back and verifies the
/// same pattern; its figures beside the PVRDMA guest's.
#[test]
#[ignore = "opt-in Soft-RoCE baseline (minutes more of test host): NVMEOF_BASELINE_MIB=64 \
            cargo test --release -p e2e --test nvmeof -- --include-ignored"]
fn soft_roce_baseline_when_asked() {
    expect_baseline_asked();
    let s = suite();
    let Some((log, mib)) = &s.baseline else {
        s.fail("the scenario ran without the Soft-RoCE baseline");
    };
    let mib = *mib;
    let gid = s.marker_of(log, "GID");
    s.expect(field(gid, "dev") == Some("rxe0"), || {
        format!("the baseline guest did not run on Soft-RoCE: '{gid}'")
    });
    let connected = s.marker_of(log, "CONNECTED");
    s.expect(
        field(connected, "transport") == Some("rdma") && field(connected, "state") == Some("live"),
        || format!("the baseline guest's controller: '{connected}'"),
    );
    let written = s.marker_of(log, "WRITTEN");
    s.expect(s.num(written, "bytes") == mib << 20, || {
        format!("the baseline guest should have written {mib} MiB: '{written}'")
    });
    s.expect(s.env("b.target_check") == "done", || {
        "the test host did not read the baseline's data back".into()
    });
    for c in 0..mib / BASELINE_CHUNK_MIB {
        let want = field(s.chunk_of(log, "write", c), "md5").unwrap_or("?");
        let got = s.env(&format!("b.target.chunk.{c}.md5"));
        s.expect(got == want, || {
            format!("baseline chunk {c}: the target holds MD5 {got}, the guest wrote {want}")
        });
        let read = s.chunk_of(log, "read", c);
        s.expect(
            field(read, "ok") == Some("1") && field(read, "md5") == Some(want),
            || format!("baseline chunk {c} read back wrong: '{read}'"),
        );
    }
    let read = s.marker_of(log, "READ");
    s.expect(s.num(read, "bad_chunks") == 0, || {
        format!("the baseline's read-back: '{read}'")
    });
    s.expect(s.marker_of(log, "DONE") == "ok=1", || {
        "the baseline guest's script did not end ok=1".into()
    });
    let text = log.tail(usize::MAX);
    let bad = kernel_errors(&text);
    s.expect(bad.is_empty(), || {
        format!(
            "the baseline guest's kernel logged NVMe-oF errors:\n{}",
            bad.join("\n")
        )
    });
    for key in ["b_exit", "b_panics"] {
        s.expect(s.env(key) == "0", || {
            format!("the baseline guest's {key} is {}", s.env(key))
        });
    }
    let problems = vmm_log_problems(&s.vmm_log("b")).unwrap_or_else(|e| s.fail(&e.to_string()));
    s.expect(problems.is_empty(), || {
        format!(
            "the baseline guest's VMM logged warnings or errors:\n{}",
            problems.join("\n")
        )
    });
    let (bw, br) = (
        mb_per_s(mib << 20, s.num(written, "centis")),
        mb_per_s(mib << 20, s.num(read, "centis")),
    );
    let (pw, pr) = (
        mb_per_s(SIZE_MIB << 20, s.num(s.marker("WRITTEN"), "centis")),
        mb_per_s(SIZE_MIB << 20, s.num(s.marker("READ"), "centis")),
    );
    e2e::announce(&format!(
        "nvmeof: Soft-RoCE in the guest ({mib} MiB): write {bw:.2} MB/s, read {br:.2} MB/s; \
         pvrdma ({SIZE_MIB} MiB): write {pw:.2} MB/s, read {pr:.2} MB/s; pvrdma/Soft-RoCE: \
         write {:.1}x, read {:.1}x",
        pw / bw,
        pr / br
    ));
}

/// Issue 14 item 7: the guest's verified write+read stream over NVMe-oF runs while its VM is
/// live-migrated to another VMM, and goes on there. Every round (a distinct pattern, written and
/// read back with O_DIRECT) verifies, before the switch-over on A and after it on A2; no I/O
/// error, no controller reset or reconnect (the kernel log's part is in
/// [`the_guest_kernel_logs_no_nvme_error`]). Reports send-migration's blackout and the slowest
/// round, which spans the blackout.
///
/// Broken on purpose once (2026-11-26, not committed: the destination's restored responder PSN
/// off by one in `rdma_transport::qp::Qp::restore`): the migration itself reported success
/// (blackout 138 ms), 5 rounds verified on A and none ever completed on A2, whose kernel's
/// kworkers then blocked for over 360 s. Such a hang ended only at the scenario's limit; since,
/// the scenario stops A2 when no round verifies there within `MIG_STALL` (240 s) of the
/// switch-over (`mig_stalled=1`).
///
/// Failed in CI once (session 12, main ab17147, two lanes): the same hang, from a CQ's ARM
/// doorbell lost around the switch-over (docs/migration.md, "Doorbells keep ringing around a
/// pause"). A stalled pass now prints the guest kernel's own account (section `mig-stall`).
#[test]
fn the_verified_stream_survives_a_live_migration() {
    let s = suite();
    s.expect(s.env("mig_stalled") == "0", || {
        // What the guest's kernel said of the hang (tests/guest/nvmeof.sh's mig_watch).
        let dump = s
            .destination
            .section("mig-stall")
            .map_or_else(|| "(no mig-stall section)".into(), |d| d.text);
        format!(
            "no round verified on the destination within 240 s of the switch-over: stopped \
             (its devices' counters then: nvmeof-a2-counters.json). The guest's kernel:\n{dump}"
        )
    });
    s.expect(s.env("mig_loop") == "running", || {
        "the guest's migration pass never started".into()
    });
    s.expect(
        s.env("mig_receive_rc") == "0" && s.env("mig_send_rc") == "0",
        || {
            format!(
                "the migration failed: receive-migration rc {}, send-migration rc {} (see \
                 nvmeof-a-to-nvmeof-a2-remote.log)",
                s.env("mig_receive_rc"),
                s.env("mig_send_rc")
            )
        },
    );
    let completed = s.env("mig_completed");
    s.expect(
        completed.starts_with("migration completed: blackout "),
        || format!("send-migration printed no 'migration completed' line: '{completed}'"),
    );
    let rounds = |log: &SerialLog| -> Vec<String> {
        log.markers("NVMEOF-ROUND ")
            .into_iter()
            .map(str::to_string)
            .collect()
    };
    let (before, after) = (rounds(&s.source), rounds(&s.destination));
    s.expect(!before.is_empty(), || {
        "no round of the migration pass ran on the source VMM".into()
    });
    let after_signal = after
        .iter()
        .filter(|l| field(l, "migrated") == Some("1"))
        .count() as u64;
    s.expect(after_signal >= MIG_AFTER, || {
        format!(
            "only {after_signal} rounds ran on the destination after the migration (want \
             {MIG_AFTER}):\n{}",
            after.join("\n")
        )
    });
    let mut sums = Vec::new();
    for l in before.iter().chain(&after) {
        s.expect(
            field(l, "ok") == Some("1")
                && field(l, "md5").is_some()
                && field(l, "md5") == field(l, "want"),
            || format!("a round of the migration pass did not verify: '{l}'"),
        );
        sums.push(field(l, "md5").unwrap_or("?").to_string());
    }
    let n = sums.len();
    sums.sort();
    sums.dedup();
    s.expect(sums.len() == n, || {
        "two rounds wrote the same data: the rounds do not tell a stale slot apart".into()
    });
    let pass = s.marker("MIGRATION-PASS");
    s.expect(
        field(pass, "ok") == Some("1")
            && s.num(pass, "bad") == 0
            && s.num(pass, "errors") == 0
            && s.num(pass, "rounds") == n as u64,
        || format!("the guest's migration pass: '{pass}'"),
    );
    e2e::announce(&format!(
        "nvmeof across a live migration: {completed}; {n} rounds of {MIG_MIB} MiB written and \
         read back verified ({} on the source, {} on the destination), slowest write {:.2} s, \
         slowest read {:.2} s, pass {:.1} s",
        before.len(),
        after.len(),
        s.num(pass, "max_wcentis") as f64 / 100.0,
        s.num(pass, "max_rcentis") as f64 / 100.0,
        s.num(pass, "centis") as f64 / 100.0
    ));
}

/// Issue 14 item 1, guest to guest over the same-host channel: I1 (default `--pvrdma`) to the
/// target guest; no RoCE frame crosses I1's TAP.
#[test]
fn guest_to_guest_over_the_same_host_channel() {
    let s = suite();
    let figures = s.expect_guest_to_guest("i1", |frames| frames == 0);
    s.expect_initiator_kernel_clean("i1");
    e2e::announce(&format!(
        "nvmeof guest to guest, same-host channel: {G2G_MIB} MiB verified both sides, {figures}"
    ));
}

/// Issue 15, the one-copy path under the kernel's ULPs: T and I1 run with `share_memory=on`, so
/// nvmet-rdma's RDMA READs of I1's buffers and WRITEs into them go as described records (their
/// payload read from the sender's guest RAM), while nvme-rdma and nvmet-rdma fast-register and
/// invalidate MRs for every I/O (REG_MR, LOCAL_INV, SEND_WITH_INV each settle the described
/// records first). Both VMMs sent described records, I2 (`local=off`) none, and neither of the
/// two logged a warning: a settle that gave up on its peer logs one and drops the ring.
#[test]
fn guest_to_guest_shares_memory_over_the_same_host_channel() {
    let s = suite();
    let described = |g: &str| {
        described_records(&s.vmm_log(g)).unwrap_or_else(|| {
            s.fail(&format!(
                "the VMM of {g} logged no 'pvrdma: counters:' line (did it exit?)"
            ))
        })
    };
    let (t, i1, i2) = (described("t"), described("i1"), described("i2"));
    s.expect(t > 0 && i1 > 0, || {
        format!(
            "described records sent: T {t}, I1 {i1}: with share_memory=on on both, nvmet-rdma's \
             READs and WRITEs took the two-copy path"
        )
    });
    s.expect(i2 == 0, || {
        format!("I2 (local=off) sent {i2} described records")
    });
    let problems = vmm_log_problems(&s.vmm_log("i1")).unwrap_or_else(|e| s.fail(&e.to_string()));
    s.expect(problems.is_empty(), || {
        format!("I1's VMM logged:\n{}", problems.join("\n"))
    });
    e2e::announce(&format!(
        "nvmeof guest to guest, one copy: described records sent: T {t}, I1 {i1}"
    ));
}

/// Guest to guest on the wire: I2 (`local=off`) to the target guest; its RoCE v2 frames cross
/// the bridge, and the data arrives and reads back verified. (Its controller's resets are
/// [`guest_to_guest_on_the_wire_keeps_its_controller`]'s.)
#[test]
fn guest_to_guest_on_the_wire() {
    let figures = suite().expect_guest_to_guest("i2", |frames| frames >= G2G_WIRE_FRAMES);
    e2e::announce(&format!(
        "nvmeof guest to guest, local=off: {G2G_MIB} MiB verified both sides, {figures}"
    ));
}

/// Guest to guest on the wire, the controller: I2's kernel must log no reset or reconnect.
///
/// This found a bug (2026-11-26): between two of our devices on the wire the target guest's QPs
/// (nvmet-rdma as RDMA READ/WRITE requester) exceeded their retries about every 13 s under NVMe
/// load (`retry_exceeded=1` with hundreds of `comp_dropped`), and I2's nvme-rdma reset and
/// reconnected. The responder let ACKs overtake the READ responses it owed, the completer took
/// each response behind a gap for a new loss, and a retried READ restarted whole; the
/// in-process twins are `rdma-transport`'s `nvme_mix_over_bounded_links` and `pvrdma`'s
/// `nvme_load_on_the_wire_completes_every_command`.
#[test]
fn guest_to_guest_on_the_wire_keeps_its_controller() {
    suite().expect_initiator_kernel_clean("i2");
}

/// The target guest brought nvmet-rdma up on its PVRDMA device, served both initiators, tore the
/// target down, and its VMM ran clean; its kernel logged no NVMe-oF error.
#[test]
fn the_guest_target_runs_clean() {
    let s = suite();
    let done = s
        .target
        .marker("NVMET-DONE ")
        .unwrap_or_else(|| s.fail("the target guest printed no NVMET-DONE line"));
    s.expect(done == "ok=1", || {
        format!("the target guest ended with '{done}'")
    });
    for key in ["t_exit", "t_panics"] {
        s.expect(s.env(key) == "0", || format!("{key} is {}", s.env(key)));
    }
    let problems = vmm_log_problems(&s.vmm_log("t")).unwrap_or_else(|e| s.fail(&e.to_string()));
    s.expect(problems.is_empty(), || {
        format!("the target's VMM logged:\n{}", problems.join("\n"))
    });
    let log = s.target.tail(usize::MAX);
    let bad = kernel_errors(&log);
    s.expect(bad.is_empty(), || {
        format!("the target guest's kernel logged:\n{}", bad.join("\n"))
    });
}

/// The lines of a guest console's text that mean NVMe-oF broke ([`KERNEL_ERRORS`] on a line about
/// nvme or RDMA, or a kernel BUG or Oops anywhere).
fn kernel_errors(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| KERNEL_ERRORS.iter().any(|e| l.contains(e)))
        .filter(|l| {
            l.contains("nvme") || l.contains("rdma") || l.contains("BUG:") || l.contains("Oops")
        })
        .collect()
}

#[cfg(test)]
mod helpers {
    use super::*;

    /// The lines of the first passing run's console (af7181a + 75f7cd4's guest script) that the
    /// check must pass over, and the kernel's words for a server that stopped answering, which
    /// it must catch.
    #[test]
    fn nfs_kernel_errors_of_a_console() {
        let console = "mount: mounting 10.20.0.254:/ on /mnt/nfs failed: Connection refused
[   10.584272] vmw_pvrdma: module verification failed: signature and/or required key missing - tainting kernel
SECTION-BEGIN nfs-kernel-log
[   30.100000] RPC: Registered rdma transport module.
[   30.200000] NFS: Registering the id_resolver key type
SECTION-END nfs-kernel-log rc=0";
        assert!(nfs_kernel_errors(console).is_empty());
        let broken = "[  400.000000] nfs: server 10.20.0.254 not responding, timed out
NFSRDMA-FAIL cp -r onto NFS: cp: write error: I/O error
[  401.000000] BUG: kernel NULL pointer dereference, address: 0000000000000008";
        assert_eq!(
            nfs_kernel_errors(broken),
            vec![
                "[  400.000000] nfs: server 10.20.0.254 not responding, timed out",
                "[  401.000000] BUG: kernel NULL pointer dereference, address: 0000000000000008",
            ]
        );
    }

    #[test]
    fn nfs_tree_sizes() {
        let sizes: Vec<u64> = (0..NFS_SMALL_FILES).map(nfs_small_size).collect();
        assert!(sizes.iter().all(|s| (1024..=65536).contains(s)));
        assert!(sizes.iter().any(|s| s % 4096 != 0));
        assert_eq!(
            nfs_tree_bytes() - NFS_LARGE_FILES * (NFS_LARGE_MIB << 20),
            sizes.iter().sum::<u64>()
        );
    }

    #[test]
    fn figures_and_headers() {
        assert_eq!(block_header(7), "pvrdma-nvmeof block 00000007");
        assert_eq!(block_header(7).len(), 28);
        assert!((mb_per_s(256 << 20, 10_000) - 2.684).abs() < 0.001);
        assert_eq!(CHUNKS * CHUNK_BLOCKS * 4096, SIZE_MIB << 20);
    }
}

/// The guest kernels logged no WARNING, BUG or Call Trace.
#[test]
fn guest_kernels_log_no_warning_bug_or_trace() {
    suite::expect_clean_guest_kernels(&suite().outcome, &[]);
}

/// The test host's NFS server came up NFSv4.x only, listening on RDMA port 20049.
#[test]
fn nfs_server_exports_over_rdma() {
    let s = suite();
    s.expect(s.nfs_env.get("nfs_setup") == Some("ok"), || {
        format!(
            "the test host's NFS server could not be set up: {:?}",
            s.nfs_env.get("nfs_why")
        )
    });
    let server = s.nfs_env(&s.nfs, "nfs_server");
    s.expect(server.contains(&format!("rdma {NFS_PORT}")), || {
        format!("nfsd does not listen on RDMA port {NFS_PORT}: '{server}'")
    });
    s.expect(server.contains("-3") && server.contains("+4.1"), || {
        format!("nfsd should serve NFSv4.1 and not NFSv3: '{server}'")
    });
}

/// Both mounts (before writing, and again before reading back) are NFSv4.1 over RDMA on the
/// server's port 20049.
#[test]
fn nfs_mounts_with_proto_rdma() {
    let s = suite();
    s.expect_nfs_mounts(&s.nfs);
}

/// The tree the guest copied onto the export is, file by file, on the test host: its own MD5s
/// of what it holds are the guest's manifest, `md5sum -c` of that manifest passes for every
/// file, and the sizes add up.
#[test]
fn nfs_tree_written_over_rdma_arrives_on_the_server() {
    let s = suite();
    let centis = s.expect_nfs_tree_on_the_server(&s.nfs);
    e2e::announce(&format!(
        "nfsrdma: wrote {NFS_FILES} files ({:.1} MiB) over NFSv4.1/RDMA (pvrdma -> Soft-RoCE nfsd) \
         in {:.1} s, {:.2} MB/s (cp -r + sync)",
        nfs_tree_bytes() as f64 / 1048576.0,
        centis as f64 / 100.0,
        mb_per_s(nfs_tree_bytes(), centis)
    ));
}

/// Copied back from a fresh mount with the guest's caches dropped, every file has the MD5 the
/// guest took before writing, and the manifest on the export is the guest's.
#[test]
fn nfs_tree_reads_back_verified() {
    let s = suite();
    let centis = s.expect_nfs_tree_read_back(&s.nfs);
    e2e::announce(&format!(
        "nfsrdma: read and verified {NFS_FILES} files ({:.1} MiB) over NFSv4.1/RDMA in {:.1} s, \
         {:.2} MB/s (cp -r from a fresh mount, caches dropped)",
        nfs_tree_bytes() as f64 / 1048576.0,
        centis as f64 / 100.0,
        mb_per_s(nfs_tree_bytes(), centis)
    ));
}

/// Both unmounts succeed and no NFS mount is left; the guest's script ends ok.
#[test]
fn nfs_unmounts_cleanly() {
    let s = suite();
    s.expect_nfs_unmounted(&s.nfs);
}

/// The NFS guest's kernel reports no server that stopped responding, RPC timeout, I/O error or
/// failure about NFS or RPC, and no kernel BUG.
#[test]
fn nfs_guest_kernel_logs_no_nfs_error() {
    let s = suite();
    s.expect_nfs_kernel_clean(&s.nfs);
}

/// The NFS guest's VMM exits 0 after the guest powers off, without a panic, warning or error in
/// its log.
#[test]
fn nfs_vmm_runs_clean() {
    let s = suite();
    s.expect_nfs_vmm_clean(&s.nfs);
}

/// The NFS Soft-RoCE baseline (opt-in: `NVMEOF_BASELINE_MIB=N` and `--include-ignored`): a guest whose own kernel runs
/// Soft-RoCE under rpcrdma (a plain vmxnet3 NIC) mounts the same export with `proto=rdma` and
/// copies the same tree, checked as the PVRDMA guest's is; both copy times side by side.
#[test]
#[ignore = "opt-in Soft-RoCE baseline (minutes more of test host): NVMEOF_BASELINE_MIB=64 \
            cargo test --release -p e2e --test nvmeof -- --include-ignored"]
fn nfs_soft_roce_baseline_when_asked() {
    expect_baseline_asked();
    let s = suite();
    let Some(b) = &s.nfs_baseline else {
        s.fail("the scenario ran without the NFS Soft-RoCE baseline");
    };
    let gid = s.nfs_marker(b, "GID");
    s.expect(field(gid, "dev") == Some("rxe0"), || {
        format!("the NFS baseline guest did not run on Soft-RoCE: '{gid}'")
    });
    s.expect_nfs_mounts(b);
    let (bw, br) = (
        s.expect_nfs_tree_on_the_server(b),
        s.expect_nfs_tree_read_back(b),
    );
    s.expect_nfs_unmounted(b);
    s.expect_nfs_kernel_clean(b);
    s.expect_nfs_vmm_clean(b);
    let (pw, pr) = (
        s.num(s.nfs_marker(&s.nfs, "WRITTEN"), "centis"),
        s.num(s.nfs_marker(&s.nfs, "READ"), "centis"),
    );
    let secs = |c: u64| c as f64 / 100.0;
    e2e::announce(&format!(
        "nfsrdma, the same tree ({NFS_FILES} files, {:.1} MiB): pvrdma write {:.1} s, read {:.1} \
         s; Soft-RoCE in the guest write {:.1} s, read {:.1} s; time pvrdma/Soft-RoCE: write \
         {:.2}, read {:.2} (below 1: pvrdma faster)",
        nfs_tree_bytes() as f64 / 1048576.0,
        secs(pw),
        secs(pr),
        secs(bw),
        secs(br),
        pw as f64 / bw.max(1) as f64,
        pr as f64 / br.max(1) as f64
    ));
}

/// The negative control: the same mount of a port where nothing listens fails (so the mounts that
/// succeed reached the server's RDMA port), and leaves nothing mounted.
#[test]
fn nfs_mount_of_a_wrong_port_fails() {
    let s = suite();
    let line = s.nfs_marker(&s.nfs, "WRONG-PORT");
    s.expect(
        field(line, "rc") != Some("0") && field(line, "mounted") == Some("0"),
        || format!("a mount of a port where nothing listens did not fail: '{line}'"),
    );
}

// SPDX-License-Identifier: Apache-2.0
//! End to end: Debian's stock kernel boots in pvrdma-vmm, and the VM pauses, resumes and shuts
//! down over the API (issue 2).
//!
//! All tests here share ONE run of `tests/scenarios/boot.sh` (one test-host boot, the guests one
//! after the other): booting L1 costs ~10 s and every L2 boot ~30 s under TCG. The run also boots
//! the same images with QEMU first, so that a VMM failure is told apart from an image failure.

use std::sync::OnceLock;
use std::time::Duration;

use e2e::assets::{self, Assets};
use e2e::binaries::{self, VmmBinaries};
use e2e::results::{tail_of, KeyValues, SerialLog};
use e2e::testhost::{self, Hosts, Outcome, Scenario};

struct Suite {
    assets: Assets,
    outcome: Outcome,
    /// Why the VMM phases did not run, if they did not.
    vmm: Result<VmmBinaries, String>,
}

/// Runs the scenario once for all tests of this file; a setup failure fails every test with it.
fn suite() -> &'static Suite {
    static SUITE: OnceLock<Result<Suite, String>> = OnceLock::new();
    let suite = SUITE.get_or_init(|| {
        let assets = assets::get().map_err(|e| e.to_string())?;
        let vmm = binaries::locate().map_err(|e| e.to_string());
        let mut env = Vec::new();
        let phases = match &vmm {
            Ok(bins) => {
                env.push(("PVRDMA_VMM_BIN".to_string(), bins.vmm.display().to_string()));
                env.push((
                    "PVRDMA_REMOTE_BIN".to_string(),
                    bins.remote.display().to_string(),
                ));
                "reference vmm-boot vmm-boot-elf vmm-lifecycle"
            }
            Err(_) => "reference",
        };
        env.push(("PHASES".to_string(), phases.to_string()));
        let scenario = Scenario {
            name: "boot".to_string(),
            env,
            // Typically ~70 s; each guest has 240 s (scenarios/boot.sh), the whole run 10 min.
            timeout: Duration::from_secs(600),
            // More than one L2 guest in this L1: single-threaded TCG (see Hosts::One).
            hosts: Hosts::One { l1_cpus: 1 },
        };
        let outcome = testhost::run(&scenario, &assets).map_err(|e| e.to_string())?;
        if outcome.exit_code != Some(0) {
            return Err(format!("scenario boot failed\n{}", outcome.context()));
        }
        Ok(Suite {
            assets,
            outcome,
            vmm,
        })
    });
    suite
        .as_ref()
        .unwrap_or_else(|e| panic!("e2e setup failed: {e}"))
}

impl Suite {
    fn vmm(&self) -> &VmmBinaries {
        self.vmm
            .as_ref()
            .unwrap_or_else(|e| panic!("cannot test the VMM: {e}"))
    }

    fn results(&self, phase: &str) -> KeyValues {
        KeyValues::read(&self.outcome.file(&format!("{phase}.env")))
            .unwrap_or_else(|e| panic!("{e}\n{}", self.outcome.context()))
    }

    fn serial(&self, phase: &str) -> SerialLog {
        SerialLog::read(&self.outcome.file(&format!("{phase}-serial.log")))
            .unwrap_or_else(|e| panic!("{e}\n{}", self.outcome.context()))
    }

    /// A failure message with everything needed to debug `phase`.
    fn failure(&self, phase: &str, what: &str) -> String {
        let mut msg = format!("{phase}: {what}\n");
        for log in [
            format!("{phase}-serial.log"),
            format!("{phase}-vmm.log"),
            format!("{phase}-qemu.log"),
        ] {
            let path = self.outcome.file(&log);
            if path.exists() {
                msg += &tail_of(&path, 25);
                msg.push('\n');
            }
        }
        msg + &self.outcome.context()
    }
}

/// The markers of a `pvtest=boot` guest with its root disk: what issue 2 asks the boot to show.
fn check_boot_markers(suite: &Suite, phase: &str) {
    let serial = suite.serial(phase);
    let fail = |what: &str| -> ! { panic!("{}", suite.failure(phase, what)) };
    match serial.marker_field("PVRDMA-VMM-GUEST ", "cpus") {
        Some("2") => {}
        other => fail(&format!(
            "guest should see 2 CPUs, PVRDMA-VMM-GUEST says cpus={other:?}"
        )),
    }
    if serial.marker("MODULES-OK").is_none() {
        fail(&format!(
            "guest modules did not all load: {:?}",
            serial.marker("MODULES-FAIL")
        ));
    }
    if serial.marker("USERSPACE-OK").is_none() {
        fail(&format!(
            "rdma-core userspace did not run: {:?}",
            serial.marker("USERSPACE-FAIL")
        ));
    }
    let expected = format!("{} mode=ro", suite.assets.rootdisk_id);
    match serial.marker("ROOTDISK-OK") {
        Some(got) if got == expected => {}
        got => fail(&format!(
            "root disk: expected ROOTDISK-OK {expected}, got {got:?} (ROOTDISK-FAIL: {:?})",
            serial.marker("ROOTDISK-FAIL")
        )),
    }
    for marker in ["GUEST-MARKER-DONE", "GUEST-POWEROFF"] {
        if serial.marker(marker).is_none() {
            fail(&format!("no {marker} on the serial console"));
        }
    }
}

fn int(suite: &Suite, results: &KeyValues, phase: &str, key: &str) -> i64 {
    results
        .int(key)
        .unwrap_or_else(|e| panic!("{}", suite.failure(phase, &e.to_string())))
}

#[test]
fn reference_qemu_boots_the_guest_images() {
    let suite = suite();
    let results = suite.results("reference");
    assert_eq!(
        int(suite, &results, "reference", "exit"),
        0,
        "{}",
        suite.failure(
            "reference",
            "QEMU did not exit 0 (the images or the test host are broken, not the VMM)"
        )
    );
    check_boot_markers(suite, "reference");
}

#[test]
fn vmm_boots_stock_kernel_with_two_cpus_and_root_disk() {
    let suite = suite();
    suite.vmm();
    let results = suite.results("vmm-boot");
    let exit = results.get("exit").unwrap_or("missing");
    assert_eq!(
        exit,
        "0",
        "{}",
        suite.failure(
            "vmm-boot",
            "pvrdma-vmm should exit 0 after the guest's poweroff"
        )
    );
    check_boot_markers(suite, "vmm-boot");
}

#[test]
fn vmm_boots_the_kernel_as_elf_vmlinux() {
    let suite = suite();
    suite.vmm();
    let results = suite.results("vmm-boot-elf");
    let exit = results.get("exit").unwrap_or("missing");
    assert_eq!(
        exit,
        "0",
        "{}",
        suite.failure(
            "vmm-boot-elf",
            "pvrdma-vmm should boot the ELF vmlinux and exit 0 after the guest's poweroff"
        )
    );
    check_boot_markers(suite, "vmm-boot-elf");
}

/// Issue 7: every thread of a running VMM (main, API, vCPUs, and the worker of each device: the
/// VM has a disk, a vmxnet3 NIC and a PVRDMA device) has its seccomp filter (mode 2) and no
/// effective capability, and none is left to the process (the scenario runs it as root).
#[test]
fn the_running_vmm_is_sandboxed() {
    let suite = suite();
    suite.vmm();
    let phase = "vmm-lifecycle";
    let r = suite.results(phase);
    let fail = |what: String| -> ! { panic!("{}", suite.failure(phase, &what)) };
    let threads = r
        .get("thread_seccomp")
        .unwrap_or_else(|| fail("no thread_seccomp recorded".to_string()));
    // name:seccomp:capeff (a thread's name may hold a colon, its fields do not).
    let threads: Vec<(&str, &str, &str)> = threads
        .split(',')
        .filter_map(|t| {
            let (rest, cap) = t.rsplit_once(':')?;
            let (name, mode) = rest.rsplit_once(':')?;
            Some((name, mode, cap))
        })
        .collect();
    let names: Vec<&str> = threads.iter().map(|(name, ..)| *name).collect();
    for kind in [
        "pvrdma-vmm",
        "pvrdma-api",
        "vcpu0",
        "vcpu1",
        "virtio-blk",
        "vmxnet3",
        "pvrdma",
    ] {
        if !names.contains(&kind) {
            fail(format!("no {kind} thread among {names:?}"));
        }
    }
    let unfiltered: Vec<_> = threads.iter().filter(|(_, mode, _)| *mode != "2").collect();
    if !unfiltered.is_empty() {
        fail(format!("threads without a seccomp filter: {unfiltered:?}"));
    }
    let capable: Vec<_> = threads
        .iter()
        .filter(|(.., cap)| *cap != "0000000000000000")
        .collect();
    if !capable.is_empty() {
        fail(format!("threads with capabilities: {capable:?}"));
    }
    for key in ["cap_eff", "cap_bnd"] {
        if r.get(key) != Some("0000000000000000") {
            fail(format!("capabilities left: {key}={:?}", r.get(key)));
        }
    }
}

#[test]
fn vmm_pauses_resumes_and_shuts_down_over_the_api() {
    let suite = suite();
    suite.vmm();
    let phase = "vmm-lifecycle";
    let r = suite.results(phase);
    let fail = |what: String| -> ! { panic!("{}", suite.failure(phase, &what)) };
    if let Some(why) = r.get("failed") {
        fail(format!("scenario step failed: {why}"));
    }
    if int(suite, &r, phase, "pause_exit") != 0 {
        fail("pvrdma-remote pause did not exit 0".to_string());
    }
    let (at_pause, after_window) = (
        int(suite, &r, phase, "tick_at_pause"),
        int(suite, &r, phase, "tick_after_window"),
    );
    if at_pause < 3 || after_window != at_pause {
        fail(format!(
            "while paused for {} s the tick counter must stay put: {at_pause} at pause, {after_window} after",
            r.get("pause_window_s").unwrap_or("?")
        ));
    }
    if int(suite, &r, phase, "resume_exit") != 0 {
        fail("pvrdma-remote resume did not exit 0".to_string());
    }
    let after_resume = int(suite, &r, phase, "tick_after_resume");
    if after_resume < after_window + 2 {
        fail(format!(
            "after resume the counter must go on: {after_window} before, {after_resume} after"
        ));
    }
    for (key, status) in [
        ("http_unknown_path", 404),
        ("http_wrong_method", 405),
        ("http_bad_json", 400),
        ("http_unknown_field", 400),
    ] {
        let got = int(suite, &r, phase, key);
        if got != status {
            fail(format!(
                "malformed request {key}: expected HTTP {status}, got {got}"
            ));
        }
    }
    if int(suite, &r, phase, "ping_after_bad_requests") != 0 {
        fail("the API stopped answering after malformed requests".to_string());
    }
    if int(suite, &r, phase, "shutdown_exit") != 0 {
        fail("pvrdma-remote shutdown did not exit 0".to_string());
    }
    if r.get("vmm_exit") != Some("0") {
        fail(format!(
            "pvrdma-vmm should exit 0 after an API shutdown, got {:?}",
            r.get("vmm_exit")
        ));
    }
}

/// The kernels of the guests our VMM booted logged no WARNING, BUG or Call Trace. The reference
/// guest is QEMU's: in the test host it logs "XSAVE consistency problem" (its nested KVM never
/// updates CPUID 0xD's size after the guest's XSETBV), which ours avoids by setting XCR0 first.
#[test]
fn guest_kernels_log_no_warning_bug_or_trace() {
    e2e::suite::expect_clean_guest_kernels(&suite().outcome, &["reference-serial.log"]);
}

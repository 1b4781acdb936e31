// SPDX-License-Identifier: Apache-2.0
//! The `pvrdma-vmm` binary as a user runs it: bad values give a one-line
//! error and a non-zero exit (never a panic), `--help` documents every flag
//! and the exit codes. Only the garbage-kernel case creates a VM (the
//! kernel is parsed after guest memory exists), and it needs /dev/kvm.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pvrdma-vmm"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn help_documents_every_flag_and_exit_codes() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--kernel",
        "--initramfs",
        "--cmdline",
        "--cpus",
        "--memory",
        "--disk",
        "--serial",
        "--api-socket",
        "--log-level",
        "--net",
        "--pvrdma",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
    assert!(help.contains("Exit codes:") && help.contains("triple fault"));
}

#[test]
fn bad_values_are_one_line_errors_with_usage_exit_code() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--kernel", "/k", "--cpus", "0"],
            "--cpus must be between 1 and 254",
        ),
        (
            &["--kernel", "/k", "--cpus", "many"],
            "--cpus must be between",
        ),
        (&["--kernel", "/k", "--memory", "12X"], "invalid size '12X'"),
        (
            &["--kernel", "/k", "--memory", "8M"],
            "memory must be between",
        ),
        (
            &["--kernel", "/k", "--disk", "readonly=on"],
            "--disk needs path=",
        ),
        (
            &["--kernel", "/k", "--disk", "path=/d,ro=1"],
            "unknown option 'ro'",
        ),
        (
            &["--kernel", "/k", "--serial", "pty"],
            "--serial must be tty, off or file=PATH",
        ),
        (&["--kernel", "/k", "--log-level", "loud"], "--log-level"),
        (&["--cpus", "1"], "--kernel"),
        (&["--kernel", "/k", "--bogus"], "--bogus"),
        (&["--kernel", "/k", "--net", "tap=t0"], "--net needs mac="),
        (
            &["--kernel", "/k", "--net", "tap=t0,mac=01:02:03:04:05:06"],
            "invalid MAC address",
        ),
        (
            &[
                "--kernel",
                "/k",
                "--net",
                "tap=t0,mac=02:00:00:00:00:01,mtu=9001",
            ],
            "MTU must be between",
        ),
        (
            &[
                "--kernel",
                "/k",
                "--pvrdma",
                "tap=t0,mac=02:00:00:00:00:01,gid=ib",
            ],
            "invalid value 'ib' for gid",
        ),
        (
            &[
                "--kernel",
                "/k",
                "--net",
                "tap=t0,mac=02:00:00:00:00:01",
                "--pvrdma",
                "tap=t0,mac=02:00:00:00:00:02",
            ],
            "TAP 't0' is used by more than one NIC",
        ),
        (
            &[
                "--kernel",
                "/k",
                "--pvrdma",
                "tap=t0,mac=02:00:00:00:00:01",
                "--pvrdma",
                "tap=t1,mac=02:00:00:00:00:01",
            ],
            "MAC 02:00:00:00:00:01 is used by more than one NIC",
        ),
        (
            &[
                "--kernel",
                "/k",
                "--pvrdma",
                "tap=t0,mac=02:00:00:00:00:01",
                "--pvrdma",
                "tap=t1,mac=02:00:00:00:00:02",
                "--pvrdma",
                "tap=t2,mac=02:00:00:00:00:03",
                "--pvrdma",
                "tap=t3,mac=02:00:00:00:00:04",
                "--pvrdma",
                "tap=t4,mac=02:00:00:00:00:05",
            ],
            "at most 4 --pvrdma devices per VM, got 5",
        ),
    ];
    for (args, needle) in cases {
        let out = run(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        let first = err.lines().next().unwrap_or_default();
        assert!(first.starts_with("error: "), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected '{needle}' in: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn unusable_files_are_reported_before_anything_starts() {
    let out = run(&["--kernel", "/nonexistent/bzImage", "--serial", "off"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("Failed to open /nonexistent/bzImage"), "{err}");

    let dir = std::env::temp_dir().join(format!("pvrdma-vmm-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("not-a-kernel");
    std::fs::write(&garbage, vec![0x5a; 8192]).unwrap();
    let out = run(&[
        "--kernel",
        garbage.to_str().unwrap(),
        "--serial",
        "off",
        "--log-level",
        "off",
    ]);
    let err = stderr(&out);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("Failed to load the kernel"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

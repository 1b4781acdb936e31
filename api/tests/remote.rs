// SPDX-License-Identifier: Apache-2.0

//! The `pvrdma-remote` binary end to end, against a test server.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use api::{ApiRequest, MigrationDirection, MigrationStatus};
use common::{report, Harness, MigrationScript};

/// Longest any run may take; a followed migration that never ends fails the test instead of
/// hanging it.
const RUN_LIMIT: Duration = Duration::from_secs(20);

fn remote(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvrdma-remote"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pvrdma-remote");
    let deadline = Instant::now() + RUN_LIMIT;
    while child.try_wait().expect("wait for pvrdma-remote").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("reap pvrdma-remote");
            panic!(
                "pvrdma-remote {args:?} still running after {RUN_LIMIT:?}; stdout:\n{}",
                text(&out.stdout)
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    child
        .wait_with_output()
        .expect("collect pvrdma-remote output")
}

fn remote_on(socket: &Path, command: &str) -> Output {
    remote(&["--api-socket", socket.to_str().unwrap(), command])
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_lists_commands_flags_and_exit_status() {
    for flag in ["--help", "-h"] {
        let out = remote(&[flag]);
        assert_eq!(out.status.code(), Some(0));
        let help = text(&out.stdout);
        for word in [
            "ping",
            "info",
            "counters",
            "pause",
            "resume",
            "shutdown",
            "send-migration",
            "cancel-migration",
            "receive-migration",
            "snapshot",
            "--api-socket <PATH>",
            "--help",
            "--version",
            "Exit status:",
            "2  usage error, VMM unreachable",
        ] {
            assert!(help.contains(word), "{word} missing from:\n{help}");
        }
    }
    // Each command documents its own options, and every one has a help line.
    for (command, words) in [
        (
            "send-migration",
            &[
                "<URL>",
                "--downtime-ms <N>",
                "[default: 300]",
                "--timeout-s <N>",
                "--no-wait",
            ][..],
        ),
        (
            "receive-migration",
            &["<URL>", "--tap <MAC=TAP>", "--no-wait"],
        ),
        ("snapshot", &["<URL>", "file:///DIR"]),
        ("counters", &["same-host channel", "--api-socket <PATH>"]),
    ] {
        let out = remote(&[command, "--help"]);
        assert_eq!(out.status.code(), Some(0), "{command}");
        let help = text(&out.stdout);
        for word in words {
            assert!(
                help.contains(word),
                "{command}: {word} missing from:\n{help}"
            );
        }
    }
    let out = remote(&["--version"]);
    assert_eq!(
        text(&out.stdout),
        format!("pvrdma-remote {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn success_prints_pretty_json_and_exits_0() {
    let h = Harness::start();
    let out = remote_on(&h.path, "ping");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("\n  \"pid\": "), "not pretty: {stdout}");
    let body: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(body["pid"], std::process::id());

    let out = remote_on(&h.path, "info");
    assert_eq!(out.status.code(), Some(0));
    let body: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["state"], "Running");

    let out = remote_on(&h.path, "counters");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("\n  \"devices\": ["),
        "not pretty: {stdout}"
    );
    let body: api::VmCounters = serde_json::from_str(&stdout).unwrap();
    assert_eq!(body, common::test_counters(None));

    for command in ["pause", "resume", "shutdown"] {
        let out = remote_on(&h.path, command);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{command}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{command}");
    }
    let out = remote_on(&h.path, "info");
    let body: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["state"], "Shutdown");
}

#[test]
fn refused_request_exits_1_with_the_message() {
    let h = Harness::start();
    let out = remote_on(&h.path, "resume");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "error: VM is not paused\n");
    assert!(out.stdout.is_empty());
}

#[test]
fn no_socket_exits_2_with_one_line() {
    let out = remote_on(Path::new("/nonexistent/pvrdma-api.sock"), "ping");
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("error: Failed to connect to API socket /nonexistent/"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn usage_errors_exit_2() {
    // Nothing at all: the help on stderr, as a usage error.
    let out = remote(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("Usage: pvrdma-remote"));
    for args in [
        &["ping"][..],
        &["--api-socket", "/x", "reboot"],
        &["--frobnicate"],
        &["--api-socket", "/x", "send-migration"],
        &[
            "--api-socket",
            "/x",
            "send-migration",
            "unix:/m",
            "--timeout-s",
            "soon",
        ],
        &[
            "--api-socket",
            "/x",
            "receive-migration",
            "unix:/m",
            "--tap",
            "tap-b1",
        ],
    ] {
        let out = remote(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(text(&out.stderr).starts_with("error: "), "{args:?}");
    }
}

/// `send-migration` against a VMM whose migration reports `script`: the exit status, stdout
/// lines, stderr, and what the VMM was asked.
fn send_migration(script: MigrationScript) -> (Option<i32>, Vec<String>, String, Vec<ApiRequest>) {
    let h = Harness::start_migrating(script);
    let socket = h.path.to_str().unwrap().to_owned();
    let out = remote(&[
        "--api-socket",
        &socket,
        "send-migration",
        "unix:/tmp/migrate.sock",
    ]);
    let lines = text(&out.stdout).lines().map(str::to_owned).collect();
    (out.status.code(), lines, text(&out.stderr), h.stop())
}

#[test]
fn followed_send_migration_completes_with_exit_0() {
    use MigrationStatus::{Active, Completed};
    let send = |status, pass| report(MigrationDirection::Send, status, pass);
    // The source answers until it has reported Completed once, then goes away.
    let (code, lines, stderr, seen) = send_migration(MigrationScript {
        reports: vec![
            send(Active, 0),
            send(Active, 1),
            send(Active, 1),
            send(Active, 2),
            send(Completed, 2),
        ],
        then_vanish: true,
    });
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        lines,
        [
            "migrating 512.0 MiB of guest memory to unix:/tmp/migrate.sock",
            "pass 1: 512.0 MiB sent, 16.0 MiB dirty (8.0 MiB/s), 800.0 MiB/s, \
             expected downtime 20 ms",
            "pass 2: 576.0 MiB sent, 16.0 MiB dirty (8.0 MiB/s), 800.0 MiB/s, \
             expected downtime 20 ms",
            "migration completed: blackout 45 ms, total 2.0 s, 576.0 MiB sent",
        ],
        "one line per pass or status"
    );
    assert!(stderr.is_empty(), "{stderr}");
    assert!(matches!(
        seen.first(),
        Some(ApiRequest::SendMigration(p)) if p.destination_url == "unix:/tmp/migrate.sock"
    ));
    assert_eq!(seen.len(), 6, "one PUT and five polls: {seen:?}");
}

#[test]
fn followed_send_migration_failure_exits_1() {
    let (code, lines, stderr, _) = send_migration(MigrationScript {
        reports: vec![
            report(MigrationDirection::Send, MigrationStatus::Active, 1),
            report(MigrationDirection::Send, MigrationStatus::Failed, 1),
        ],
        then_vanish: false,
    });
    assert_eq!(code, Some(1));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("pass 1: "), "{lines:?}");
    assert_eq!(
        stderr,
        "error: migration failed: Destination closed the connection\n"
    );
}

#[test]
fn vmm_gone_mid_migration_exits_2_outcome_unknown() {
    let (code, lines, stderr, _) = send_migration(MigrationScript {
        reports: vec![report(MigrationDirection::Send, MigrationStatus::Active, 1)],
        then_vanish: true,
    });
    assert_eq!(code, Some(2));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        stderr.starts_with(
            "error: lost the VMM before the migration ended; its outcome is unknown: \
             Failed to connect to API socket"
        ),
        "{stderr}"
    );
}

#[test]
fn followed_receive_migration_reports_listening_once() {
    use MigrationStatus::{Active, Completed, Listening};
    let receive = |status, pass| report(MigrationDirection::Receive, status, pass);
    // A send reported before this receive started is an older migration, not this one.
    let h = Harness::start_migrating(MigrationScript {
        reports: vec![
            report(MigrationDirection::Send, Completed, 3),
            receive(Listening, 0),
            receive(Listening, 0),
            receive(Active, 1),
            receive(Completed, 1),
        ],
        then_vanish: false,
    });
    let socket = h.path.to_str().unwrap().to_owned();
    let out = remote(&[
        "--api-socket",
        &socket,
        "receive-migration",
        "unix:/tmp/migrate.sock",
        "--tap",
        "52:54:00:00:00:02=tap-b1",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "listening on unix:/tmp/migrate.sock\n\
         pass 1: 512.0 MiB received, 800.0 MiB/s\n\
         migration received: blackout 45 ms, total 1.0 s, 512.0 MiB received\n"
    );
    match h.stop().first() {
        Some(ApiRequest::ReceiveMigration(p)) => {
            assert_eq!(p.taps["52:54:00:00:00:02"], "tap-b1");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_wait_returns_after_the_put() {
    let h = Harness::start_migrating(MigrationScript {
        reports: vec![report(MigrationDirection::Send, MigrationStatus::Active, 1)],
        then_vanish: false,
    });
    let socket = h.path.to_str().unwrap().to_owned();
    let out = remote(&[
        "--api-socket",
        &socket,
        "send-migration",
        "tcp:10.0.0.2:6000",
        "--downtime-ms=50",
        "--no-wait",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
    match h.stop().as_slice() {
        [ApiRequest::SendMigration(p)] => assert_eq!(p.downtime_ms, 50),
        other => panic!("expected only the PUT: {other:?}"),
    }
}

#[test]
fn refused_migration_and_snapshot_exit_1() {
    let h = Harness::start();
    let socket = h.path.to_str().unwrap().to_owned();
    let out = remote(&["--api-socket", &socket, "send-migration", "ftp://x"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "error: Invalid URL 'ftp://x'\n");
    let out = remote(&["--api-socket", &socket, "snapshot", "file:///snap"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "error: VM is not paused\n");
    assert_eq!(remote_on(&h.path, "pause").status.code(), Some(0));
    let out = remote(&["--api-socket", &socket, "snapshot", "file:///snap"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
}

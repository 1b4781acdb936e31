// SPDX-License-Identifier: Apache-2.0

//! The `pvrdma-remote` binary end to end, against a test server.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::Harness;

fn remote(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pvrdma-remote"))
        .args(args)
        .output()
        .expect("run pvrdma-remote")
}

fn remote_on(socket: &Path, command: &str) -> Output {
    remote(&["--api-socket", socket.to_str().unwrap(), command])
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_lists_commands_and_flags() {
    for flag in ["--help", "-h"] {
        let out = remote(&[flag]);
        assert_eq!(out.status.code(), Some(0));
        let help = text(&out.stdout);
        for word in [
            "ping",
            "info",
            "pause",
            "resume",
            "shutdown",
            "--api-socket",
            "--help",
        ] {
            assert!(help.contains(word), "{word} missing from:\n{help}");
        }
    }
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
    for args in [
        &[][..],
        &["ping"],
        &["--api-socket", "/x", "reboot"],
        &["--frobnicate"],
    ] {
        let out = remote(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(text(&out.stderr).starts_with("error: "), "{args:?}");
    }
}

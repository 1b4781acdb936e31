// SPDX-License-Identifier: Apache-2.0

//! `pvrdma-remote`: drives a running pvrdma-vmm through its API socket.
//!
//! Argument parsing is hand-written: five commands and one option do not justify clap's
//! build time, and the command table below doubles as the `--help` text.

use std::error::Error;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use api::client::{ApiClient, ClientError};
use api::ApiRequest;

/// Exit status when the VMM answered with an error.
const EXIT_REFUSED: u8 = 1;
/// Exit status for a usage error, or when the VMM could not be reached or made no sense.
const EXIT_UNREACHABLE: u8 = 2;

/// One subcommand: its name, its help line, and how its arguments make a request.
struct Command {
    name: &'static str,
    help: &'static str,
    build: fn(&[String]) -> Result<ApiRequest, String>,
}

const COMMANDS: &[Command] = &[
    Command {
        name: "ping",
        help: "Check that the VMM answers; print its version, pid and features",
        build: |args| no_args(args, ApiRequest::Ping),
    },
    Command {
        name: "info",
        help: "Print the VM's state and configuration",
        build: |args| no_args(args, ApiRequest::VmInfo),
    },
    Command {
        name: "pause",
        help: "Pause the VM",
        build: |args| no_args(args, ApiRequest::Pause),
    },
    Command {
        name: "resume",
        help: "Resume a paused VM",
        build: |args| no_args(args, ApiRequest::Resume),
    },
    Command {
        name: "shutdown",
        help: "Shut the VM down",
        build: |args| no_args(args, ApiRequest::Shutdown),
    },
];

/// For commands that take no arguments.
fn no_args(args: &[String], request: ApiRequest) -> Result<ApiRequest, String> {
    match args.first() {
        None => Ok(request),
        Some(extra) => Err(format!("unexpected argument '{extra}'")),
    }
}

fn help() -> String {
    let width = COMMANDS.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let commands: String = COMMANDS
        .iter()
        .map(|c| format!("  {:width$}  {}\n", c.name, c.help))
        .collect();
    format!(
        "Drive a running pvrdma-vmm through its HTTP API socket.\n\n\
         Usage: pvrdma-remote --api-socket PATH <COMMAND>\n\n\
         Commands:\n{commands}\n\
         Options:\n  \
         --api-socket PATH  Unix socket of the VMM's API (required)\n  \
         -h, --help         Print this help\n  \
         -V, --version      Print the version\n\n\
         On success the response body, if any, is printed as JSON.\n\
         Exit status: 0 success, {EXIT_REFUSED} the VMM refused the request, \
         {EXIT_UNREACHABLE} usage error or VMM unreachable.\n"
    )
}

/// What the command line asks for.
enum Invocation {
    Help,
    Version,
    Call {
        socket: PathBuf,
        request: ApiRequest,
    },
}

/// Parses the arguments after the program name. `--api-socket`, `--help` and `--version` are
/// accepted anywhere; everything after the command name belongs to the command.
fn parse_args(args: &[String]) -> Result<Invocation, String> {
    let mut socket = None;
    let mut command = None;
    let mut command_args = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(Invocation::Help),
            "-V" | "--version" => return Ok(Invocation::Version),
            "--api-socket" => {
                let path = iter.next().ok_or("--api-socket needs a path")?;
                socket = Some(PathBuf::from(path));
            }
            _ => {
                if let Some(path) = arg.strip_prefix("--api-socket=") {
                    socket = Some(PathBuf::from(path));
                } else if command.is_some() {
                    command_args.push(arg.clone());
                } else if arg.starts_with('-') {
                    return Err(format!("unknown option '{arg}'"));
                } else {
                    command = Some(arg.as_str());
                }
            }
        }
    }
    let name = command.ok_or("no command given")?;
    let command = COMMANDS
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| format!("unknown command '{name}'"))?;
    let request = (command.build)(&command_args).map_err(|e| format!("{name}: {e}"))?;
    let socket = socket.filter(|s| !s.as_os_str().is_empty());
    let socket = socket.ok_or("--api-socket PATH is required")?;
    Ok(Invocation::Call { socket, request })
}

/// An error and its causes on one line.
fn error_chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// Writes to stdout, ignoring a closed pipe (`pvrdma-remote info | head -1`).
fn print(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (socket, request) = match parse_args(&args) {
        Ok(Invocation::Help) => {
            print(&help());
            return ExitCode::SUCCESS;
        }
        Ok(Invocation::Version) => {
            print(&format!("pvrdma-remote {}\n", env!("CARGO_PKG_VERSION")));
            return ExitCode::SUCCESS;
        }
        Ok(Invocation::Call { socket, request }) => (socket, request),
        Err(e) => {
            eprintln!("error: {e}\nRun 'pvrdma-remote --help' for usage.");
            return ExitCode::from(EXIT_UNREACHABLE);
        }
    };
    match ApiClient::new(socket).call(&request) {
        Ok(Some(body)) => {
            let text = serde_json::to_string_pretty(&body).unwrap_or_else(|_| body.to_string());
            print(&format!("{text}\n"));
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(ClientError::Http { message, .. }) => {
            eprintln!("error: {message}");
            ExitCode::from(EXIT_REFUSED)
        }
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::from(EXIT_UNREACHABLE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn every_request_has_a_command() {
        for route in api::ROUTES {
            let found = COMMANDS
                .iter()
                .any(|c| (c.build)(&[]).is_ok_and(|r| r.route().path == route.path));
            assert!(found, "no command for {}", route.path);
        }
    }

    #[test]
    fn parses_socket_anywhere() {
        for list in [
            &["--api-socket", "/s", "pause"][..],
            &["pause", "--api-socket", "/s"],
            &["--api-socket=/s", "pause"],
        ] {
            match parse_args(&args(list)) {
                Ok(Invocation::Call { socket, request }) => {
                    assert_eq!(socket, PathBuf::from("/s"));
                    assert_eq!(request, ApiRequest::Pause);
                }
                _ => panic!("{list:?}"),
            }
        }
    }

    #[test]
    fn usage_errors() {
        for list in [
            &[][..],
            &["pause"],
            &["--api-socket"],
            &["--api-socket", "/s"],
            &["--api-socket", "/s", "reboot"],
            &["--api-socket", "/s", "pause", "now"],
            &["--bogus", "--api-socket", "/s", "pause"],
            &["--api-socket=", "pause"],
        ] {
            assert!(parse_args(&args(list)).is_err(), "{list:?}");
        }
        assert!(matches!(
            parse_args(&args(&["info", "--help"])),
            Ok(Invocation::Help)
        ));
    }
}

// SPDX-License-Identifier: Apache-2.0

//! `pvrdma-remote`: drives a running pvrdma-vmm through its API socket.
//!
//! Argument parsing is hand-written: eight commands and a handful of options do not justify
//! clap's build time, and the command table below doubles as the `--help` text.
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::error::Error;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::thread;
use std::time::Duration;

use api::client::{ApiClient, ClientError};
use api::{
    ApiRequest, MigrationDirection, MigrationInfo, MigrationStatus, ReceiveMigrationParams,
    SendMigrationParams, SnapshotParams, TlsParams, VmInfo, DEFAULT_DOWNTIME_MS,
    DEFAULT_MIGRATION_TIMEOUT_S,
};

/// Exit status when the VMM answered with an error, or a followed migration failed.
const EXIT_REFUSED: u8 = 1;
/// Exit status for a usage error, or when the VMM could not be reached or made no sense
/// (for a followed migration: its outcome is unknown).
const EXIT_UNREACHABLE: u8 = 2;

/// How often a followed migration's progress is read from `vm.info`.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Linux interface names are shorter than IFNAMSIZ (16).
const MAX_TAP_NAME: usize = 15;

/// One subcommand: its name, its arguments and help line, and how its arguments make an
/// action.
struct Command {
    name: &'static str,
    /// Synopsis of the arguments; empty for commands without any.
    args: &'static str,
    help: &'static str,
    build: fn(&[String]) -> Result<Action, String>,
}

/// What a command asks of the VMM.
#[derive(Debug)]
struct Action {
    request: ApiRequest,
    /// Once the request succeeded, follow the migration in this direction through `vm.info`
    /// until it ends (the migration commands without `--no-wait`).
    watch: Option<MigrationDirection>,
}

const COMMANDS: &[Command] = &[
    Command {
        name: "ping",
        args: "",
        help: "Check that the VMM answers; print its version, pid and features",
        build: |args| no_args(args, ApiRequest::Ping),
    },
    Command {
        name: "info",
        args: "",
        help: "Print the VM's state, configuration and last migration",
        build: |args| no_args(args, ApiRequest::VmInfo),
    },
    Command {
        name: "pause",
        args: "",
        help: "Pause the VM",
        build: |args| no_args(args, ApiRequest::Pause),
    },
    Command {
        name: "resume",
        args: "",
        help: "Resume a paused VM",
        build: |args| no_args(args, ApiRequest::Resume),
    },
    Command {
        name: "shutdown",
        args: "",
        help: "Shut the VM down",
        build: |args| no_args(args, ApiRequest::Shutdown),
    },
    Command {
        name: "send-migration",
        args: "URL [--downtime-ms N] [--timeout-s N] [TLS] [--no-wait]",
        help: "Live-migrate the VM to the VMM receiving on URL (unix:PATH or tcp:HOST:PORT)",
        build: send_migration,
    },
    Command {
        name: "cancel-migration",
        args: "",
        help: "Stop an outgoing migration before its switch-over; the VM keeps running here",
        build: |args| no_args(args, ApiRequest::CancelMigration),
    },
    Command {
        name: "receive-migration",
        args: "URL [--tap MAC=TAP]... [--disk OLD=NEW]... [--disk-dir DIR]... \
               [--max-memory-mib N] [TLS] [--no-wait]",
        help: "Listen on URL for a migrating VM and run it (VMM started without a kernel)",
        build: receive_migration,
    },
    Command {
        name: "snapshot",
        args: "URL",
        help: "Write the paused VM's state and memory to URL (file:///DIR)",
        build: snapshot,
    },
];

/// For commands that take no arguments.
fn no_args(args: &[String], request: ApiRequest) -> Result<Action, String> {
    match args.first() {
        None => Ok(Action {
            request,
            watch: None,
        }),
        Some(extra) => Err(format!("unexpected argument '{extra}'")),
    }
}

/// Flags and options both migration commands take.
const TLS_FLAGS: [&str; 2] = ["--no-wait", "--allow-plaintext"];
const TLS_OPTIONS: [&str; 3] = ["--tls-cert", "--tls-key", "--tls-ca"];

fn send_migration(args: &[String]) -> Result<Action, String> {
    let valued = [&TLS_OPTIONS[..], &["--downtime-ms", "--timeout-s"]].concat();
    let args = CommandArgs::parse(args, &TLS_FLAGS, &valued)?;
    let params = SendMigrationParams {
        destination_url: args.url.to_owned(),
        downtime_ms: args.number("--downtime-ms")?.unwrap_or(DEFAULT_DOWNTIME_MS),
        timeout_s: args
            .number("--timeout-s")?
            .unwrap_or(DEFAULT_MIGRATION_TIMEOUT_S),
        tls: args.tls()?,
        allow_plaintext: args.flags.contains(&"--allow-plaintext"),
    };
    Ok(Action {
        request: ApiRequest::SendMigration(params),
        watch: args.watch(MigrationDirection::Send),
    })
}

fn receive_migration(args: &[String]) -> Result<Action, String> {
    let valued = [
        &TLS_OPTIONS[..],
        &["--tap", "--disk", "--disk-dir", "--max-memory-mib"],
    ]
    .concat();
    let args = CommandArgs::parse(args, &TLS_FLAGS, &valued)?;
    let mut taps = BTreeMap::new();
    for tap in args.values("--tap") {
        let (mac, tap) = parse_tap(tap)?;
        if let Some(earlier) = taps.insert(mac.clone(), tap) {
            return Err(format!("--tap: {mac} is already given TAP '{earlier}'"));
        }
    }
    let mut disks = BTreeMap::new();
    for disk in args.values("--disk") {
        let (old, new) = disk
            .split_once('=')
            .filter(|(old, new)| !old.is_empty() && !new.is_empty())
            .ok_or_else(|| format!("--disk takes OLD=NEW (paths), not '{disk}'"))?;
        if disks.insert(old.into(), new.into()).is_some() {
            return Err(format!("--disk: {old} is mapped twice"));
        }
    }
    let params = ReceiveMigrationParams {
        taps,
        disks,
        disk_dirs: args.values("--disk-dir").map(Into::into).collect(),
        max_memory_mib: args.number("--max-memory-mib")?,
        tls: args.tls()?,
        allow_plaintext: args.flags.contains(&"--allow-plaintext"),
        ..ReceiveMigrationParams::new(args.url)
    };
    Ok(Action {
        request: ApiRequest::ReceiveMigration(params),
        watch: args.watch(MigrationDirection::Receive),
    })
}

fn snapshot(args: &[String]) -> Result<Action, String> {
    let args = CommandArgs::parse(args, &[], &[])?;
    let params = SnapshotParams {
        destination_url: args.url.to_owned(),
    };
    Ok(Action {
        request: ApiRequest::Snapshot(params),
        watch: None,
    })
}

/// `MAC=TAP` of `--tap`. The MAC is put in lower case, the form the VMM prints and matches.
/// TAP names are only checked for what Linux refuses, so that the mistake shows up here.
fn parse_tap(text: &str) -> Result<(String, String), String> {
    let (mac, tap) = text.split_once('=').ok_or_else(|| {
        format!("--tap takes MAC=TAP, e.g. 52:54:00:00:00:02=tap-b1, not '{text}'")
    })?;
    let is_mac = mac.split(':').count() == 6
        && mac
            .split(':')
            .all(|octet| octet.len() == 2 && octet.bytes().all(|b| b.is_ascii_hexdigit()));
    if !is_mac {
        return Err(format!(
            "--tap: '{mac}' is not a MAC address like 52:54:00:00:00:02"
        ));
    }
    let is_ifname = (1..=MAX_TAP_NAME).contains(&tap.len())
        && tap != "."
        && tap != ".."
        && !tap.contains(|c: char| c == '/' || c == ':' || c.is_whitespace());
    if !is_ifname {
        return Err(format!(
            "--tap: '{tap}' is not a TAP name (1 to {MAX_TAP_NAME} bytes, no '/', ':' or spaces)"
        ));
    }
    Ok((mac.to_ascii_lowercase(), tap.to_owned()))
}

/// The words after a command's name: exactly one positional (the URL), flags, and options
/// with a value (`--name VALUE` or `--name=VALUE`).
struct CommandArgs<'a> {
    url: &'a str,
    flags: Vec<&'a str>,
    values: Vec<(&'a str, &'a str)>,
}

impl<'a> CommandArgs<'a> {
    /// Splits `args`, accepting only the flags in `flags` and the options in `valued`.
    fn parse(args: &'a [String], flags: &[&str], valued: &[&str]) -> Result<Self, String> {
        let mut url = None;
        let mut found = Self {
            url: "",
            flags: Vec::new(),
            values: Vec::new(),
        };
        let mut iter = args.iter();
        while let Some(arg) = iter.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) if name.starts_with("--") => (name, Some(value)),
                _ => (arg.as_str(), None),
            };
            if flags.contains(&name) {
                if inline.is_some() {
                    return Err(format!("{name} takes no value"));
                }
                found.flags.push(name);
            } else if valued.contains(&name) {
                let value = match inline {
                    Some(value) => value,
                    None => iter.next().ok_or_else(|| format!("{name} needs a value"))?,
                };
                found.values.push((name, value));
            } else if arg.starts_with('-') {
                return Err(format!("unknown option '{arg}'"));
            } else if url.is_some() {
                return Err(format!("unexpected argument '{arg}'"));
            } else {
                url = Some(arg.as_str());
            }
        }
        found.url = url.ok_or("URL is missing")?;
        Ok(found)
    }

    /// Every value given to a repeatable option, in order.
    fn values<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'a str> + 's {
        self.values
            .iter()
            .filter(move |(n, _)| *n == name)
            .map(|(_, value)| *value)
    }

    /// The value of an option that may be given once.
    fn value(&self, name: &str) -> Result<Option<&'a str>, String> {
        let mut given = self.values(name);
        match (given.next(), given.next()) {
            (value, None) => Ok(value),
            (_, Some(_)) => Err(format!("{name} is given twice")),
        }
    }

    /// The value of an option that takes a whole number.
    fn number(&self, name: &str) -> Result<Option<u64>, String> {
        self.value(name)?
            .map(|value| {
                value
                    .parse()
                    .map_err(|_| format!("{name} takes a whole number, not '{value}'"))
            })
            .transpose()
    }

    /// `--tls-cert/--tls-key/--tls-ca`: all three or none.
    fn tls(&self) -> Result<Option<TlsParams>, String> {
        let [cert, key, ca] = TLS_OPTIONS.map(|name| self.value(name));
        match (cert?, key?, ca?) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsParams {
                cert: cert.into(),
                key: key.into(),
                ca: ca.into(),
            })),
            _ => Err("TLS needs all of --tls-cert, --tls-key and --tls-ca".into()),
        }
    }

    /// Whether to follow the migration: yes, unless `--no-wait` was given.
    fn watch(&self, direction: MigrationDirection) -> Option<MigrationDirection> {
        (!self.flags.contains(&"--no-wait")).then_some(direction)
    }
}

/// Column where the help text of a command starts.
const HELP_COLUMN: usize = 20;

fn help() -> String {
    let commands: String = COMMANDS
        .iter()
        .map(|c| {
            let synopsis = format!("{} {}", c.name, c.args);
            let synopsis = synopsis.trim_end();
            if synopsis.len() < HELP_COLUMN {
                format!("  {synopsis:HELP_COLUMN$}{}\n", c.help)
            } else {
                format!("  {synopsis}\n  {:HELP_COLUMN$}{}\n", "", c.help)
            }
        })
        .collect();
    format!(
        "Drive a running pvrdma-vmm through its HTTP API socket.\n\n\
         Usage: pvrdma-remote --api-socket PATH <COMMAND>\n\n\
         Commands:\n{commands}\n\
         Options:\n  \
         --api-socket PATH  Unix socket of the VMM's API (required)\n  \
         -h, --help         Print this help\n  \
         -V, --version      Print the version\n\n\
         Migration options:\n  \
         --downtime-ms N    End pre-copy once the expected blackout fits N ms \
         (default {DEFAULT_DOWNTIME_MS})\n  \
         --timeout-s N      Give up after N s; the source keeps running \
         (default {DEFAULT_MIGRATION_TIMEOUT_S})\n  \
         --tap MAC=TAP      Attach the incoming NIC with MAC to TAP on this host \
         (repeatable; every NIC)\n  \
         --disk OLD=NEW     Open NEW here for the source's disk OLD (repeatable)\n  \
         --disk-dir DIR     Accept the source's disks that lie in DIR as they are \
         (repeatable)\n  \
         --max-memory-mib N Refuse a VM with more memory (default: this host's RAM)\n  \
         --tls-cert PEM     TLS 1.3 (tcp: only): this end's certificate,\n  \
         --tls-key PEM      its private key,\n  \
         --tls-ca PEM       and the CA the other end's certificate must be signed by\n  \
         --allow-plaintext  Allow plain TCP to or on an address that is not loopback\n  \
         --no-wait          Return once the migration started; follow it with 'info'\n\n\
         On success the response body, if any, is printed as JSON. A migration is followed\n\
         until it ends, with a line on stdout per pre-copy pass.\n\
         Exit status: 0 success, {EXIT_REFUSED} the VMM refused the request or the migration \
         failed,\n\
         {EXIT_UNREACHABLE} usage error, VMM unreachable, or the migration's outcome unknown.\n"
    )
}

/// What the command line asks for.
enum Invocation {
    Help,
    Version,
    /// Boxed: an action's parameters dwarf the other variants.
    Call {
        socket: PathBuf,
        action: Box<Action>,
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
    let action = (command.build)(&command_args).map_err(|e| format!("{name}: {e}"))?;
    let socket = socket.filter(|s| !s.as_os_str().is_empty());
    let socket = socket.ok_or("--api-socket PATH is required")?;
    Ok(Invocation::Call {
        socket,
        action: Box::new(action),
    })
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

/// A byte count in binary units with one decimal, e.g. `512.0 MiB`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    format!("{value:.1} {unit}")
}

/// What is printed about a migration, on each change of its pass or status. For `Failed`
/// it is the error (the caller adds `error: `).
fn describe(m: &MigrationInfo) -> String {
    let send = m.direction == MigrationDirection::Send;
    let moved = if send { "sent" } else { "received" };
    match m.status {
        MigrationStatus::Listening => format!("listening on {}", m.url),
        MigrationStatus::Active if m.pass == 0 && send => format!(
            "migrating {} of guest memory to {}",
            bytes(m.memory_bytes),
            m.url
        ),
        MigrationStatus::Active if m.pass == 0 => format!("source connected on {}", m.url),
        MigrationStatus::Active if send => format!(
            "pass {}: {} sent, {} dirty ({}/s), {}/s, expected downtime {} ms",
            m.pass,
            bytes(m.bytes_transferred),
            bytes(m.dirty_bytes),
            bytes(m.dirty_rate_bytes_per_s),
            bytes(m.bandwidth_bytes_per_s),
            m.expected_downtime_ms
        ),
        MigrationStatus::Active => format!(
            "pass {}: {} received, {}/s",
            m.pass,
            bytes(m.bytes_transferred),
            bytes(m.bandwidth_bytes_per_s)
        ),
        MigrationStatus::Completed => {
            let blackout = m
                .downtime_ms
                .map_or_else(|| "not measured".to_owned(), |ms| format!("{ms} ms"));
            format!(
                "migration {}: blackout {blackout}, total {:.1} s, {} {moved}",
                if send { "completed" } else { "received" },
                m.total_ms as f64 / 1000.0,
                bytes(m.bytes_transferred)
            )
        }
        MigrationStatus::Failed => format!(
            "migration failed: {}",
            m.error.as_deref().unwrap_or("no reason given")
        ),
    }
}

/// The migration `vm.info` reports, or why the VMM could not tell.
fn read_migration(client: &ApiClient) -> Result<Option<MigrationInfo>, String> {
    let body = client
        .call(&ApiRequest::VmInfo)
        .map_err(|e| error_chain(&e))?
        .ok_or("vm.info came back empty")?;
    let info: VmInfo =
        serde_json::from_value(body).map_err(|e| format!("vm.info is not understood: {e}"))?;
    Ok(info.migration)
}

/// Follows a migration just started until it ends, printing [`describe`] on each change of
/// pass or status. A report of the other direction is a migration before this one: a VMM
/// that received its VM keeps reporting that until it sends it on.
fn watch(client: &ApiClient, direction: MigrationDirection) -> ExitCode {
    let mut shown = None;
    loop {
        let migration = match read_migration(client) {
            Ok(migration) => migration.filter(|m| m.direction == direction),
            Err(e) => {
                eprintln!(
                    "error: lost the VMM before the migration ended; its outcome is unknown: {e}"
                );
                return ExitCode::from(EXIT_UNREACHABLE);
            }
        };
        if let Some(m) = migration {
            match m.status {
                MigrationStatus::Completed => {
                    print(&format!("{}\n", describe(&m)));
                    return ExitCode::SUCCESS;
                }
                MigrationStatus::Failed => {
                    eprintln!("error: {}", describe(&m));
                    return ExitCode::from(EXIT_REFUSED);
                }
                MigrationStatus::Listening | MigrationStatus::Active => {
                    if shown != Some((m.status, m.pass)) {
                        shown = Some((m.status, m.pass));
                        print(&format!("{}\n", describe(&m)));
                    }
                }
            }
        }
        thread::sleep(POLL_INTERVAL);
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (socket, action) = match parse_args(&args) {
        Ok(Invocation::Help) => {
            print(&help());
            return ExitCode::SUCCESS;
        }
        Ok(Invocation::Version) => {
            print(&format!("pvrdma-remote {}\n", env!("CARGO_PKG_VERSION")));
            return ExitCode::SUCCESS;
        }
        Ok(Invocation::Call { socket, action }) => (socket, *action),
        Err(e) => {
            eprintln!("error: {e}\nRun 'pvrdma-remote --help' for usage.");
            return ExitCode::from(EXIT_UNREACHABLE);
        }
    };
    let client = ApiClient::new(socket);
    match client.call(&action.request) {
        Ok(Some(body)) => {
            let text = serde_json::to_string_pretty(&body).unwrap_or_else(|_| body.to_string());
            print(&format!("{text}\n"));
        }
        Ok(None) => {}
        Err(ClientError::Http { message, .. }) => {
            eprintln!("error: {message}");
            return ExitCode::from(EXIT_REFUSED);
        }
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            return ExitCode::from(EXIT_UNREACHABLE);
        }
    }
    match action.watch {
        Some(direction) => watch(&client, direction),
        None => ExitCode::SUCCESS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    /// The action `list` asks for, which must parse.
    fn action(list: &[&str]) -> Action {
        match parse_args(&args(list)) {
            Ok(Invocation::Call { action, .. }) => *action,
            Err(e) => panic!("{list:?}: {e}"),
            Ok(_) => panic!("{list:?}: not a call"),
        }
    }

    /// The smallest valid arguments of each command.
    fn minimal_args(command: &str) -> Vec<String> {
        match command {
            "send-migration" | "receive-migration" => args(&["unix:/m.sock"]),
            "snapshot" => args(&["file:///snap"]),
            _ => Vec::new(),
        }
    }

    #[test]
    fn every_request_has_a_command() {
        for route in api::ROUTES {
            let found = COMMANDS.iter().any(|c| {
                (c.build)(&minimal_args(c.name)).is_ok_and(|a| a.request.route().path == route.path)
            });
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
                Ok(Invocation::Call { socket, action }) => {
                    assert_eq!(socket, PathBuf::from("/s"));
                    assert_eq!(action.request, ApiRequest::Pause);
                    assert_eq!(action.watch, None);
                }
                _ => panic!("{list:?}"),
            }
        }
    }

    #[test]
    fn send_migration_arguments() {
        let a = action(&["--api-socket", "/s", "send-migration", "tcp:10.0.0.2:6000"]);
        assert_eq!(
            a.request,
            ApiRequest::SendMigration(SendMigrationParams::new("tcp:10.0.0.2:6000"))
        );
        assert_eq!(a.watch, Some(MigrationDirection::Send));

        let a = action(&[
            "send-migration",
            "--downtime-ms",
            "50",
            "unix:/m.sock",
            "--timeout-s=60",
            "--no-wait",
            "--api-socket",
            "/s",
            "--allow-plaintext",
        ]);
        assert_eq!(
            a.request,
            ApiRequest::SendMigration(SendMigrationParams {
                destination_url: "unix:/m.sock".into(),
                downtime_ms: 50,
                timeout_s: 60,
                tls: None,
                allow_plaintext: true,
            })
        );
        assert_eq!(a.watch, None, "--no-wait");
    }

    #[test]
    fn receive_migration_arguments() {
        let a = action(&[
            "--api-socket=/s",
            "receive-migration",
            "unix:/m.sock",
            "--tap",
            "52:54:00:00:00:02=tap-b1",
            "--tap=52:54:00:AB:CD:0E=tap-b2",
            "--disk=/src/a.img=/dst/a.img",
            "--disk-dir",
            "/var/disks",
            "--max-memory-mib=2048",
            "--tls-cert=c.pem",
            "--tls-key=k.pem",
            "--tls-ca=ca.pem",
        ]);
        let taps = [
            ("52:54:00:00:00:02".to_owned(), "tap-b1".to_owned()),
            ("52:54:00:ab:cd:0e".to_owned(), "tap-b2".to_owned()),
        ];
        assert_eq!(
            a.request,
            ApiRequest::ReceiveMigration(ReceiveMigrationParams {
                taps: taps.into(),
                disks: [("/src/a.img".into(), "/dst/a.img".into())].into(),
                disk_dirs: vec!["/var/disks".into()],
                max_memory_mib: Some(2048),
                tls: Some(TlsParams {
                    cert: "c.pem".into(),
                    key: "k.pem".into(),
                    ca: "ca.pem".into(),
                }),
                ..ReceiveMigrationParams::new("unix:/m.sock")
            })
        );
        assert_eq!(a.watch, Some(MigrationDirection::Receive));
        let a = action(&[
            "--api-socket=/s",
            "receive-migration",
            "--no-wait",
            "tcp:[::]:6000",
        ]);
        assert_eq!(a.watch, None);
    }

    #[test]
    fn snapshot_arguments() {
        let a = action(&["--api-socket=/s", "snapshot", "file:///var/snap"]);
        assert_eq!(
            a.request,
            ApiRequest::Snapshot(SnapshotParams {
                destination_url: "file:///var/snap".into()
            })
        );
        assert_eq!(a.watch, None);
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

    #[test]
    fn migration_usage_errors() {
        let cases: &[(&[&str], &str)] = &[
            (&["send-migration"], "URL is missing"),
            (
                &["send-migration", "unix:/a", "unix:/b"],
                "unexpected argument 'unix:/b'",
            ),
            (
                &["send-migration", "unix:/a", "--downtime-ms"],
                "--downtime-ms needs a value",
            ),
            (
                &["send-migration", "unix:/a", "--downtime-ms", "5ms"],
                "whole number, not '5ms'",
            ),
            (
                &["send-migration", "tcp:h:1", "--tls-cert=c", "--tls-key=k"],
                "TLS needs all of --tls-cert, --tls-key and --tls-ca",
            ),
            (
                &["receive-migration", "tcp:h:1", "--disk", "/a"],
                "--disk takes OLD=NEW",
            ),
            (
                &[
                    "receive-migration",
                    "tcp:h:1",
                    "--disk=/a=/b",
                    "--disk=/a=/c",
                ],
                "--disk: /a is mapped twice",
            ),
            (
                &["send-migration", "unix:/a", "--timeout-s=-1"],
                "whole number, not '-1'",
            ),
            (
                &[
                    "send-migration",
                    "unix:/a",
                    "--timeout-s",
                    "1",
                    "--timeout-s",
                    "2",
                ],
                "--timeout-s is given twice",
            ),
            (
                &["send-migration", "unix:/a", "--no-wait=yes"],
                "--no-wait takes no value",
            ),
            (
                &["send-migration", "unix:/a", "--tap", "x"],
                "unknown option '--tap'",
            ),
            (
                &["receive-migration", "unix:/a", "--tap", "tap-b1"],
                "takes MAC=TAP",
            ),
            (
                &["receive-migration", "unix:/a", "--tap", "52:54:00:00:02=t"],
                "'52:54:00:00:02' is not a MAC address",
            ),
            (
                &[
                    "receive-migration",
                    "unix:/a",
                    "--tap",
                    "52:54:00:00:00:g2=t",
                ],
                "is not a MAC address",
            ),
            (
                &[
                    "receive-migration",
                    "unix:/a",
                    "--tap",
                    "52:54:00:00:00:02=",
                ],
                "is not a TAP name",
            ),
            (
                &[
                    "receive-migration",
                    "unix:/a",
                    "--tap",
                    "52:54:00:00:00:02=sixteen-chars-xx",
                ],
                "is not a TAP name",
            ),
            (
                &[
                    "receive-migration",
                    "unix:/a",
                    "--tap",
                    "52:54:00:00:00:02=a/b",
                ],
                "is not a TAP name",
            ),
            (
                &[
                    "receive-migration",
                    "unix:/a",
                    "--tap",
                    "52:54:00:00:00:02=t1",
                    "--tap",
                    "52:54:00:00:00:02=t2",
                ],
                "52:54:00:00:00:02 is already given TAP 't1'",
            ),
            (&["snapshot"], "URL is missing"),
            (
                &["snapshot", "file:///s", "--no-wait"],
                "unknown option '--no-wait'",
            ),
        ];
        for (list, expected) in cases {
            let mut list = list.to_vec();
            list.extend(["--api-socket", "/s"]);
            match parse_args(&args(&list)) {
                Err(e) => {
                    assert!(e.starts_with(&format!("{}: ", list[0])), "{e}");
                    assert!(e.contains(expected), "{list:?}: {e}");
                }
                Ok(_) => panic!("{list:?} parsed"),
            }
        }
    }

    /// A send in its second pass, 512 MiB of memory.
    fn progress() -> MigrationInfo {
        MigrationInfo {
            direction: MigrationDirection::Send,
            status: MigrationStatus::Active,
            url: "tcp:10.0.0.2:6000".into(),
            pass: 2,
            memory_bytes: 512 << 20,
            bytes_transferred: 512 << 20,
            dirty_bytes: 3_250_586,
            dirty_rate_bytes_per_s: 1_258_291,
            bandwidth_bytes_per_s: 891_599_667,
            expected_downtime_ms: 4,
            downtime_ms: None,
            total_ms: 3_240,
            error: None,
        }
    }

    #[test]
    fn byte_counts() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(512 << 20), "512.0 MiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
        assert_eq!(bytes(u64::MAX), "16384.0 PiB");
    }

    #[test]
    fn progress_lines() {
        let mut m = progress();
        assert_eq!(
            describe(&m),
            "pass 2: 512.0 MiB sent, 3.1 MiB dirty (1.2 MiB/s), 850.3 MiB/s, expected downtime 4 ms"
        );
        m.pass = 0;
        assert_eq!(
            describe(&m),
            "migrating 512.0 MiB of guest memory to tcp:10.0.0.2:6000"
        );
        m.status = MigrationStatus::Completed;
        m.bytes_transferred = 545_364_377;
        m.downtime_ms = Some(45);
        assert_eq!(
            describe(&m),
            "migration completed: blackout 45 ms, total 3.2 s, 520.1 MiB sent"
        );
        m.status = MigrationStatus::Failed;
        m.error = Some("Destination closed the connection".into());
        assert_eq!(
            describe(&m),
            "migration failed: Destination closed the connection"
        );
        m.error = None;
        assert_eq!(describe(&m), "migration failed: no reason given");
    }

    #[test]
    fn receiver_progress_lines() {
        let mut m = MigrationInfo {
            direction: MigrationDirection::Receive,
            status: MigrationStatus::Listening,
            url: "unix:/m.sock".into(),
            pass: 0,
            ..progress()
        };
        assert_eq!(describe(&m), "listening on unix:/m.sock");
        m.status = MigrationStatus::Active;
        assert_eq!(describe(&m), "source connected on unix:/m.sock");
        m.pass = 2;
        assert_eq!(describe(&m), "pass 2: 512.0 MiB received, 850.3 MiB/s");
        m.status = MigrationStatus::Completed;
        assert_eq!(
            describe(&m),
            "migration received: blackout not measured, total 3.2 s, 512.0 MiB received"
        );
    }
}

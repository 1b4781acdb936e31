// SPDX-License-Identifier: Apache-2.0

//! `pvrdma-remote`: drives a running pvrdma-vmm through its API socket.
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
use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand};

/// Exit status when the VMM answered with an error, or a followed migration failed.
const EXIT_REFUSED: u8 = 1;
/// Exit status for a usage error, or when the VMM could not be reached or made no sense
/// (for a followed migration: its outcome is unknown). Clap's own usage errors exit 2 too.
const EXIT_UNREACHABLE: u8 = 2;

/// How often a followed migration's progress is read from `vm.info`.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Linux interface names are shorter than IFNAMSIZ (16).
const MAX_TAP_NAME: usize = 15;

const AFTER_HELP: &str = "\
On success the response body, if any, is printed as pretty JSON. A migration is followed
until it ends, with a line on stdout per pre-copy pass; 'COMMAND --help' shows a command's
options.

Exit status:
  0  success
  1  the VMM refused the request, or the followed migration failed
  2  usage error, VMM unreachable, or the followed migration's outcome unknown";

/// Drive a running pvrdma-vmm through its HTTP API socket.
#[derive(Debug, Parser)]
#[command(name = "pvrdma-remote", version, after_help = AFTER_HELP, subcommand_required = true)]
struct Cli {
    /// Unix socket of the VMM's API (pvrdma-vmm --api-socket). Required; accepted before or
    /// after the command.
    #[arg(long, value_name = "PATH", global = true)]
    api_socket: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

/// One subcommand per API endpoint.
#[derive(Debug, Subcommand)]
enum Command {
    /// Check that the VMM answers; print its version, pid and features.
    Ping,
    /// Print the VM's state, configuration and last migration.
    Info,
    /// Print every device's counters and the last migration's figures.
    ///
    /// Per PVRDMA function its data path (RoCE frames on the wire and over the same-host
    /// channel, commands, doorbells, completions, errors) and each connected QP's transport
    /// counters; per vmxnet3 NIC and virtio-blk disk its counters. Each device is labelled by
    /// its id (`pvrdma0`, `pvrdma1`, `net0`, `disk0`) and PCI address. Read while the VM runs.
    Counters,
    /// Pause the VM.
    Pause,
    /// Resume a paused VM.
    Resume,
    /// Shut the VM down.
    Shutdown,
    /// Live-migrate the VM to the VMM receiving on URL.
    ///
    /// Followed until it ends (unless --no-wait): a line per pre-copy pass, then the
    /// blackout. On failure the VM keeps running on this VMM.
    SendMigration {
        /// Where the destination listens: unix:PATH or tcp:HOST:PORT.
        #[arg(value_name = "URL")]
        url: String,
        /// End pre-copy once the expected blackout fits this many milliseconds.
        #[arg(long, value_name = "N", default_value_t = DEFAULT_DOWNTIME_MS)]
        downtime_ms: u64,
        /// Give up after this many seconds; the source keeps running.
        #[arg(long, value_name = "N", default_value_t = DEFAULT_MIGRATION_TIMEOUT_S)]
        timeout_s: u64,
        /// Return once the migration started; follow it with 'info'.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        security: Security,
    },
    /// Stop an outgoing migration before its switch-over; the VM keeps running here.
    CancelMigration,
    /// Listen on URL for a migrating VM and run it (VMM started without a kernel).
    ///
    /// Followed until the VM runs here (unless --no-wait).
    ReceiveMigration {
        /// Where to listen for the source: unix:PATH or tcp:HOST:PORT.
        #[arg(value_name = "URL")]
        url: String,
        /// Attach the incoming NIC with MAC to TAP on this host (TAP names are per host;
        /// NICs not listed keep the source's). Repeatable.
        #[arg(long = "tap", value_name = "MAC=TAP", value_parser = parse_tap)]
        taps: Vec<Tap>,
        /// Open NEW on this host for the source's disk OLD. Repeatable.
        #[arg(long = "disk", value_name = "OLD=NEW", value_parser = parse_disk)]
        disks: Vec<(PathBuf, PathBuf)>,
        /// Accept the source's disks that lie in DIR as they are. Repeatable. A disk neither
        /// mapped nor in one of these refuses the VM (the source keeps running).
        #[arg(long = "disk-dir", value_name = "DIR")]
        disk_dirs: Vec<PathBuf>,
        /// Largest guest memory accepted, in MiB (default: this host's RAM).
        #[arg(long, value_name = "N")]
        max_memory_mib: Option<u64>,
        /// Return once listening; follow the migration with 'info'.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        security: Security,
    },
    /// Write the paused VM's state and memory to URL (file:///DIR).
    Snapshot {
        /// The directory to write: file:///DIR.
        #[arg(value_name = "URL")]
        url: String,
    },
}

/// How a `tcp:` migration is protected: TLS 1.3 with both ends authenticated, or plain TCP
/// where the user allows it.
#[derive(Debug, Args)]
struct Security {
    /// TLS 1.3 (tcp: only): this end's certificate (PEM).
    #[arg(long, value_name = "PEM", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// TLS: this end's private key (PEM).
    #[arg(long, value_name = "PEM", requires_all = ["tls_cert", "tls_ca"])]
    tls_key: Option<PathBuf>,
    /// TLS: the CA that must have signed the other end's certificate (PEM).
    #[arg(long, value_name = "PEM", requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// Allow plain TCP to or on an address that is not loopback (guest memory in the clear,
    /// the other end unauthenticated).
    #[arg(long, conflicts_with = "tls_cert")]
    allow_plaintext: bool,
}

impl Security {
    /// The TLS files, given all three (clap requires that).
    fn tls(&self) -> Option<TlsParams> {
        match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(TlsParams {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            }),
            _ => None,
        }
    }
}

/// What a command asks of the VMM.
#[derive(Debug)]
struct Action {
    request: ApiRequest,
    /// Once the request succeeded, follow the migration in this direction through `vm.info`
    /// until it ends (the migration commands without `--no-wait`).
    watch: Option<MigrationDirection>,
}

impl Command {
    /// The request and whether to follow it; fails on what clap cannot check alone (a MAC
    /// given two TAPs).
    fn action(self) -> Result<Action, String> {
        let watch = |no_wait: bool, direction| (!no_wait).then_some(direction);
        let (request, watch) = match self {
            Self::Ping => (ApiRequest::Ping, None),
            Self::Info => (ApiRequest::VmInfo, None),
            Self::Counters => (ApiRequest::Counters, None),
            Self::Pause => (ApiRequest::Pause, None),
            Self::Resume => (ApiRequest::Resume, None),
            Self::Shutdown => (ApiRequest::Shutdown, None),
            Self::CancelMigration => (ApiRequest::CancelMigration, None),
            Self::SendMigration {
                url,
                downtime_ms,
                timeout_s,
                no_wait,
                security,
            } => (
                ApiRequest::SendMigration(SendMigrationParams {
                    destination_url: url,
                    downtime_ms,
                    timeout_s,
                    tls: security.tls(),
                    allow_plaintext: security.allow_plaintext,
                }),
                watch(no_wait, MigrationDirection::Send),
            ),
            Self::ReceiveMigration {
                url,
                taps,
                disks,
                disk_dirs,
                max_memory_mib,
                no_wait,
                security,
            } => {
                let mut by_mac = BTreeMap::new();
                for Tap { mac, name } in taps {
                    if let Some(earlier) = by_mac.insert(mac.clone(), name) {
                        return Err(format!("--tap: {mac} is already given TAP '{earlier}'"));
                    }
                }
                let mut by_old = BTreeMap::new();
                for (old, new) in disks {
                    if by_old.insert(old.clone(), new).is_some() {
                        return Err(format!("--disk: {} is mapped twice", old.display()));
                    }
                }
                (
                    ApiRequest::ReceiveMigration(ReceiveMigrationParams {
                        receiver_url: url,
                        taps: by_mac,
                        disks: by_old,
                        disk_dirs,
                        max_memory_mib,
                        tls: security.tls(),
                        allow_plaintext: security.allow_plaintext,
                    }),
                    watch(no_wait, MigrationDirection::Receive),
                )
            }
            Self::Snapshot { url } => (
                ApiRequest::Snapshot(SnapshotParams {
                    destination_url: url,
                }),
                None,
            ),
        };
        Ok(Action { request, watch })
    }
}

/// `MAC=TAP` of `--tap`.
#[derive(Clone, Debug)]
struct Tap {
    /// Lower case, the form the VMM prints and matches.
    mac: String,
    name: String,
}

/// Parses `--tap MAC=TAP`. TAP names are only checked for what Linux refuses, so that the
/// mistake shows up here.
fn parse_tap(text: &str) -> Result<Tap, String> {
    let (mac, tap) = text.split_once('=').ok_or_else(|| {
        format!("--tap takes MAC=TAP, e.g. 52:54:00:00:00:02=tap-b1, not '{text}'")
    })?;
    let is_mac = mac.split(':').count() == 6
        && mac
            .split(':')
            .all(|octet| octet.len() == 2 && octet.bytes().all(|b| b.is_ascii_hexdigit()));
    if !is_mac {
        return Err(format!(
            "'{mac}' is not a MAC address like 52:54:00:00:00:02"
        ));
    }
    let is_ifname = (1..=MAX_TAP_NAME).contains(&tap.len())
        && tap != "."
        && tap != ".."
        && !tap.contains(|c: char| c == '/' || c == ':' || c.is_whitespace());
    if !is_ifname {
        return Err(format!(
            "'{tap}' is not a TAP name (1 to {MAX_TAP_NAME} bytes, no '/', ':' or spaces)"
        ));
    }
    Ok(Tap {
        mac: mac.to_ascii_lowercase(),
        name: tap.to_owned(),
    })
}

/// Parses `--disk OLD=NEW` (two paths; the first `=` splits them).
fn parse_disk(text: &str) -> Result<(PathBuf, PathBuf), String> {
    match text.split_once('=') {
        Some((old, new)) if !old.is_empty() && !new.is_empty() => Ok((old.into(), new.into())),
        _ => Err(format!(
            "--disk takes OLD=NEW (paths), e.g. /src/b.img=/dst/b.img, not '{text}'"
        )),
    }
}

/// The socket and the action of a parsed command line, or a usage error in clap's form.
fn invocation(cli: Cli) -> Result<(PathBuf, Action), clap::Error> {
    let usage = |kind, message: String| Cli::command().error(kind, message);
    // Clap refuses an empty path; a missing one is ours to refuse, since a global option
    // cannot be required.
    let socket = cli.api_socket.ok_or_else(|| {
        usage(
            ErrorKind::MissingRequiredArgument,
            "--api-socket PATH is required".into(),
        )
    })?;
    let action = cli
        .command
        .action()
        .map_err(|e| usage(ErrorKind::ValueValidation, e))?;
    Ok((socket, action))
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
    // Help, version and usage errors exit here (0, 0 and 2).
    let (socket, action) = invocation(Cli::parse()).unwrap_or_else(|e| e.exit());
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

    /// What `args` (after the program name) make, or the usage error's text.
    fn parse(args: &[&str]) -> Result<(PathBuf, Action), String> {
        let argv = std::iter::once("pvrdma-remote").chain(args.iter().copied());
        Cli::try_parse_from(argv)
            .and_then(invocation)
            .map_err(|e| e.to_string())
    }

    /// The action `args` ask for, which must parse.
    fn action(args: &[&str]) -> Action {
        parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}")).1
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_request_has_a_command() {
        let covered: Vec<&str> = Cli::command()
            .get_subcommands()
            .map(|c| {
                let url = match c.get_name() {
                    "snapshot" => Some("file:///snap"),
                    "send-migration" | "receive-migration" => Some("unix:/m.sock"),
                    _ => None,
                };
                let mut args = vec!["--api-socket", "/s", c.get_name()];
                args.extend(url);
                action(&args).request.route().path
            })
            .collect();
        for route in api::ROUTES {
            assert!(
                covered.contains(&route.path),
                "no command for {}",
                route.path
            );
        }
    }

    #[test]
    fn parses_socket_anywhere() {
        for list in [
            &["--api-socket", "/s", "pause"][..],
            &["pause", "--api-socket", "/s"],
            &["--api-socket=/s", "pause"],
        ] {
            let (socket, action) = parse(list).unwrap();
            assert_eq!(socket, PathBuf::from("/s"));
            assert_eq!(action.request, ApiRequest::Pause);
            assert_eq!(action.watch, None);
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
    fn snapshot_and_counters_arguments() {
        let a = action(&["--api-socket=/s", "snapshot", "file:///var/snap"]);
        assert_eq!(
            a.request,
            ApiRequest::Snapshot(SnapshotParams {
                destination_url: "file:///var/snap".into()
            })
        );
        assert_eq!(a.watch, None);
        assert_eq!(
            action(&["counters", "--api-socket", "/s"]).request,
            ApiRequest::Counters
        );
    }

    #[test]
    fn usage_errors() {
        let cases: &[(&[&str], &str)] = &[
            (&["pause"], "--api-socket PATH is required"),
            (
                &["--api-socket"],
                "a value is required for '--api-socket <PATH>'",
            ),
            (&["--api-socket", "/s"], "requires a subcommand"),
            (
                &["--api-socket", "/s", "reboot"],
                "unrecognized subcommand 'reboot'",
            ),
            (
                &["--api-socket", "/s", "pause", "now"],
                "unexpected argument 'now'",
            ),
            (
                &["--bogus", "--api-socket", "/s", "pause"],
                "unexpected argument '--bogus'",
            ),
            (
                &["--api-socket=", "pause"],
                "a value is required for '--api-socket <PATH>'",
            ),
            (
                &["--api-socket", "", "pause"],
                "a value is required for '--api-socket <PATH>'",
            ),
        ];
        for (list, expected) in cases {
            match parse(list) {
                Err(e) => assert!(e.contains(expected), "{list:?}: {e}"),
                Ok(_) => panic!("{list:?} parsed"),
            }
        }
        let help = Cli::try_parse_from(["pvrdma-remote", "info", "--help"]).unwrap_err();
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
        // Nothing at all: the help, as a usage error (exit status 2).
        let bare = Cli::try_parse_from(["pvrdma-remote"]).unwrap_err();
        assert_eq!(
            bare.kind(),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
        assert_eq!(bare.exit_code(), i32::from(EXIT_UNREACHABLE));
    }

    #[test]
    fn migration_usage_errors() {
        let cases: &[(&[&str], &str)] = &[
            (&["send-migration"], "required arguments were not provided"),
            (
                &["send-migration", "unix:/a", "unix:/b"],
                "unexpected argument 'unix:/b'",
            ),
            (
                &["send-migration", "unix:/a", "--downtime-ms"],
                "a value is required for '--downtime-ms <N>'",
            ),
            (
                &["send-migration", "unix:/a", "--downtime-ms", "5ms"],
                "invalid value '5ms' for '--downtime-ms <N>'",
            ),
            (
                &["send-migration", "unix:/a", "--timeout-s=-1"],
                "invalid value '-1' for '--timeout-s <N>'",
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
                "'--timeout-s <N>' cannot be used multiple times",
            ),
            (
                &["send-migration", "unix:/a", "--no-wait=yes"],
                "unexpected value 'yes' for '--no-wait'",
            ),
            (
                &["send-migration", "unix:/a", "--tap", "x"],
                "unexpected argument '--tap'",
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
            (
                &["send-migration", "tcp:h:1", "--tls-cert=c", "--tls-key=k"],
                "required arguments were not provided",
            ),
            (
                &[
                    "send-migration",
                    "tcp:h:1",
                    "--tls-cert=c",
                    "--tls-key=k",
                    "--tls-ca=a",
                    "--allow-plaintext",
                ],
                "cannot be used with",
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
                &["receive-migration", "tcp:h:1", "--max-memory-mib=lots"],
                "invalid value 'lots'",
            ),
            (&["snapshot"], "required arguments were not provided"),
            (
                &["snapshot", "file:///s", "--no-wait"],
                "unexpected argument '--no-wait'",
            ),
        ];
        for (list, expected) in cases {
            let mut list = list.to_vec();
            list.extend(["--api-socket", "/s"]);
            match parse(&list) {
                Err(e) => {
                    assert!(e.starts_with("error: "), "{e}");
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
            blackout: None,
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

// SPDX-License-Identifier: Apache-2.0
//! Live-migration benchmark (issue 6): the blackout and the total time of migrating guest B,
//! against B's memory size and the number of queue pairs carrying RDMA traffic while it moves.
//! For each memory size, guests A and B boot once in one test host; then, for each QP count, B
//! runs `ib_write_bw -q N` against A (none for 0 QPs: the baseline, B idle), is live-migrated
//! over TCP to a new VMM process in the same test host, and the migrated VM is the next cell's
//! source (B -> B2 -> B3 ...). The figures are what `pvrdma-remote send-migration` prints; the
//! ratios are against the 0-QP migration of the same memory size in the same run. Figures, not a
//! test; but a migration that failed, traffic that did not survive it (its exit status) or
//! traffic that ended before the switch-over makes the bench exit non-zero. Each migration's
//! blackout is also split into its stages from the two VMMs' logs (`e2e::blackout`), and the
//! blackout the guest saw (the destination's start after the hand-over added) is printed beside
//! the source's.
//!
//! Usage: `cargo run --release -p e2e --bin bench-migration -- [--rounds N] [--memory MIB,...]
//! [--qps N,...] [--size BYTES] [--tx-depth N] [--qp-timeout N] [--downtime-ms N]` (defaults: 1
//! round, 256 and 1024 MiB, 0,1,16,256 QPs, ib_write_bw -s 4096 -t 8 -u 20, --downtime-ms 300).
//! Each round migrates B once per QP count, in the order given. The traffic is sized so that the
//! nested test host carries it: 256 QPs x 8 WQEs x 4 KiB in flight drain in a second or two at
//! the 5-10 MB/s ib_write_bw gets there, and `-u 20` (an ACK timeout of 4.3 s instead of
//! perftest's 67 ms) scales RC's timer to a guest that runs ~50x slower than native. Inside the
//! test host the copy runs at TCG speed: the absolute times say nothing about a real host, the
//! ratios a little. docs/benchmarks.md has the figures and their reading.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use e2e::bench::{loadavg, median, pair_failures};
use e2e::blackout::{vmm_logs, Stages};
use e2e::results::KeyValues;
use e2e::testhost::{Hosts, Scenario};
use e2e::{assets, bench, binaries};

/// The QP count of the baseline cell.
const BASELINE_QPS: u32 = 0;
/// What the scenario is given per cell (see tests/scenarios/bench-migration.sh).
const MIGRATION_TIMEOUT: u64 = 300;

fn main() -> ExitCode {
    bench::exit("bench-migration", run(&Args::parse()))
}

/// The device's CQEs per CQ (`max_cqe`): ib_write_bw puts its QPs' `-t` send entries each on
/// one CQ.
const MAX_CQE: u32 = 32768;
/// QP handles the device gives a guest by default (`max_qp` 8192, less handle 0 and the GSI
/// QP's).
const MAX_QPS: u32 = 8190;

/// Live migration of guest B, against its memory size and the QPs carrying traffic.
#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(name = "bench-migration")]
struct Args {
    /// Rounds; each migrates B once per QP count, in the order given.
    #[arg(long, default_value_t = 1, value_parser = bench::positive)]
    rounds: u32,
    /// B's memory sizes in MiB (64 to 1536, even: a test host of 4 GiB holds A, B and B's
    /// destination), comma-separated; one pair of guests each.
    #[arg(long, value_delimiter = ',', default_values_t = [256, 1024], value_parser = memory)]
    memory: Vec<u32>,
    /// QP counts of the cells, comma-separated: 0 is B idle (the baseline), N is
    /// `ib_write_bw -q N`.
    #[arg(long, value_delimiter = ',', default_values_t = [0, 1, 16, 256], value_parser = qps)]
    qps: Vec<u32>,
    /// ib_write_bw -s (bytes).
    #[arg(long, default_value_t = 4096, value_parser = bench::positive)]
    size: u32,
    /// ib_write_bw -t (send entries per QP).
    #[arg(long, default_value_t = 8, value_parser = bench::positive)]
    tx_depth: u32,
    /// ib_write_bw -u: the RC ACK timeout, 4.096 us * 2^N.
    #[arg(long, default_value_t = 20, value_parser = qp_timeout)]
    qp_timeout: u32,
    /// send-migration --downtime-ms.
    #[arg(long, default_value_t = 300, value_parser = bench::positive)]
    downtime_ms: u32,
}

fn memory(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(m) if (64..=1536).contains(&m) && m % 2 == 0 => Ok(m),
        _ => Err(format!(
            "{s}: expected an even number of MiB from 64 to 1536"
        )),
    }
}

fn qps(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n <= MAX_QPS => Ok(n),
        _ => Err(format!("{s}: expected 0 to {MAX_QPS} QPs")),
    }
}

fn qp_timeout(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if (1..=31).contains(&n) => Ok(n),
        _ => Err(format!("{s}: expected 1 to 31")),
    }
}

impl Args {
    /// What one option cannot check alone: ib_write_bw's CQ takes `-t` entries per QP.
    fn check(&self) -> Result<(), String> {
        let most = self.qps.iter().max().copied().unwrap_or(0);
        if u64::from(most) * u64::from(self.tx_depth) > u64::from(MAX_CQE) {
            return Err(format!(
                "--qps {most} with --tx-depth {} needs a CQ of more than the device's {MAX_CQE} \
                 entries",
                self.tx_depth
            ));
        }
        Ok(())
    }

    /// Seconds a cell's traffic may take to start, and B's client to get its QPs to RTS: at
    /// nested TCG speed a guest creates and connects about 8 QPs a second (4096 took ~520 s).
    fn traffic_wait(&self) -> u64 {
        180 + u64::from(self.qps.iter().max().copied().unwrap_or(0)) / 6
    }
}

/// What `pvrdma-remote send-migration` printed at the end: `migration completed: blackout N ms,
/// total T s, X MiB sent`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Completed {
    blackout_ms: u64,
    total_s: f64,
    sent_mib: f64,
}

/// A byte count as pvrdma-remote prints it (`520.1 MiB`, `1.0 GiB`, `512 B`), in MiB.
fn mib(value: &str, unit: &str) -> Option<f64> {
    let v: f64 = value.parse().ok()?;
    let shift = match unit {
        "B" => -20,
        "KiB" => -10,
        "MiB" => 0,
        "GiB" => 10,
        "TiB" => 20,
        _ => return None,
    };
    Some(v * 2f64.powi(shift))
}

fn parse_completed(line: &str) -> Option<Completed> {
    let rest = line.trim().strip_prefix("migration completed: blackout ")?;
    let (blackout, rest) = rest.split_once(" ms, total ")?;
    let (total, rest) = rest.split_once(" s, ")?;
    let sent = rest.strip_suffix(" sent")?;
    let (value, unit) = sent.split_once(' ')?;
    Some(Completed {
        blackout_ms: blackout.parse().ok()?,
        total_s: total.parse().ok()?,
        sent_mib: mib(value, unit)?,
    })
}

/// One cell's migration as the scenario recorded it.
#[derive(Debug, Clone, PartialEq)]
struct Migration {
    memory: u32,
    round: u32,
    qps: u32,
    cell: u32,
    send_rc: String,
    completed: Option<Completed>,
    /// Guest memory the destination received (its vm.info), exact; the source's printed figure
    /// also counts the device and vCPU state, and has one decimal of GiB above 1 GiB.
    received_bytes: Option<u64>,
    passes: u32,
    /// yes: the traffic still ran at the switch-over; no: it ended before; idle: a 0-QP cell;
    /// nostart: the traffic never started (the cell was not migrated).
    covered: String,
    client_rc: String,
    server_rc: String,
    /// ib_write_bw's BW average (MB/s), NOCLOCK, NA, or - for an idle cell.
    bw: String,
    /// The source VMM's exit status after the switch-over, or "kept" (the migration failed).
    source_exit: String,
    /// Where the blackout went, from the VMMs' logs (filled in after parsing the TSV).
    stages: Option<Stages>,
}

impl Migration {
    /// Why this migration has no figure or its traffic failed; empty if it is good.
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.covered == "nostart" {
            p.push(format!(
                "the traffic never started (client rc={}, server rc={}); not migrated",
                self.client_rc, self.server_rc
            ));
            return p;
        }
        if self.send_rc != "0" {
            p.push(format!("send-migration rc={}", self.send_rc));
        } else if self.completed.is_none() {
            p.push("send-migration printed no 'migration completed' line".to_string());
        }
        if self.source_exit != "0" {
            p.push(format!("source VMM exit {}", self.source_exit));
        }
        if self.qps != BASELINE_QPS {
            if self.covered != "yes" {
                p.push("the traffic ended before the switch-over".to_string());
            }
            if self.client_rc != "0" || self.server_rc != "0" {
                p.push(format!(
                    "traffic failed: client rc={} server rc={}",
                    self.client_rc, self.server_rc
                ));
            }
        }
        p
    }

    /// The migration's figures, if it completed (whatever its traffic did).
    fn figures(&self) -> Option<Completed> {
        self.completed.filter(|_| self.send_rc == "0")
    }
}

/// bench.tsv lines: memory, round, QPs, cell, send rc, completed line, received bytes, passes,
/// covered, client rc, server rc, BW, source exit.
fn parse_tsv(tsv: &str) -> Vec<Migration> {
    tsv.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            let [memory, round, qps, cell, send_rc, completed, received, passes, covered, client_rc, server_rc, bw, source_exit] =
                f.as_slice()
            else {
                return None;
            };
            Some(Migration {
                memory: memory.parse().ok()?,
                round: round.parse().ok()?,
                qps: qps.parse().ok()?,
                cell: cell.parse().ok()?,
                send_rc: (*send_rc).to_string(),
                completed: parse_completed(completed),
                received_bytes: received.parse().ok(),
                passes: passes.parse().unwrap_or(0),
                covered: (*covered).to_string(),
                client_rc: (*client_rc).to_string(),
                server_rc: (*server_rc).to_string(),
                bw: (*bw).to_string(),
                source_exit: (*source_exit).to_string(),
                stages: None,
            })
        })
        .collect()
}

/// One table row: the medians of a (memory, QPs) cell over its rounds with figures.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    memory: u32,
    qps: u32,
    /// Rounds with figures, of those that ran.
    with_figures: usize,
    ran: usize,
    blackout_ms: Option<f64>,
    /// The blackout the guest saw (the destination's start added), and the stages' medians.
    guest_ms: Option<f64>,
    stages: [Option<f64>; STAGES],
    total_s: Option<f64>,
    sent_mib: Option<f64>,
    received_mib: Option<f64>,
    /// The client's exit status per round ("-" for the baseline).
    traffic_rc: Vec<String>,
}

/// The stages printed, in order (see `e2e::blackout::Stages`).
const STAGES: usize = 8;
const STAGE_NAMES: [&str; STAGES] = [
    "pause+save",
    "last memory",
    "state",
    "(devices)",
    "handover",
    "dest start",
    "(resume)",
    "(pvrdma ch)",
];

fn stage_values(s: &Stages) -> [Option<f64>; STAGES] {
    let ms = |v: u64| Some(v as f64);
    [
        ms(s.pause_save_ms),
        ms(s.last_memory_ms),
        ms(s.state_ms),
        s.devices_ms.map(|v| v as f64),
        ms(s.handover_ms),
        s.start_ms.map(|v| v as f64),
        s.resume_ms.map(|v| v as f64),
        s.pvrdma_channel_ms.map(|v| v as f64),
    ]
}

/// The median of the values present, if any.
fn median_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let mut v: Vec<f64> = values.flatten().collect();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| median(&v))
}

fn summarize(migrations: &[Migration], memory: u32, qps: u32) -> Row {
    let cell: Vec<&Migration> = migrations
        .iter()
        .filter(|m| m.memory == memory && m.qps == qps)
        .collect();
    let figures: Vec<Completed> = cell.iter().filter_map(|m| m.figures()).collect();
    let med = |f: &dyn Fn(&Completed) -> f64| {
        let mut v: Vec<f64> = figures.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| median(&v))
    };
    let mut received: Vec<f64> = cell
        .iter()
        .filter(|m| m.figures().is_some())
        .filter_map(|m| m.received_bytes)
        .map(|b| b as f64 / f64::from(1u32 << 20))
        .collect();
    received.sort_by(f64::total_cmp);
    Row {
        memory,
        qps,
        with_figures: figures.len(),
        ran: cell.len(),
        blackout_ms: med(&|c| c.blackout_ms as f64),
        guest_ms: median_of(
            cell.iter()
                .filter(|m| m.figures().is_some())
                .map(|m| m.stages.as_ref().map(|s| s.guest_ms() as f64)),
        ),
        stages: std::array::from_fn(|i| {
            median_of(
                cell.iter()
                    .filter(|m| m.figures().is_some())
                    .map(|m| m.stages.as_ref().and_then(|s| stage_values(s)[i])),
            )
        }),
        total_s: med(&|c| c.total_s),
        sent_mib: med(&|c| c.sent_mib),
        received_mib: (!received.is_empty()).then(|| median(&received)),
        traffic_rc: cell.iter().map(|m| m.client_rc.clone()).collect(),
    }
}

/// `ours / base` with two decimals, or n/a.
fn ratio(ours: Option<f64>, base: Option<f64>) -> String {
    match (ours, base) {
        (Some(o), Some(b)) if b > 0.0 => format!("{:.2}", o / b),
        _ => "n/a".to_string(),
    }
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.decimals$}"))
}

fn run(args: &Args) -> Result<(), String> {
    args.check()?;
    let traffic_wait = args.traffic_wait();
    let assets = assets::get().map_err(|e| e.to_string())?;
    let bins = binaries::locate().map_err(|e| e.to_string())?;
    let cells: Vec<String> = (0..args.rounds)
        .flat_map(|_| args.qps.iter().map(u32::to_string))
        .collect();
    let join = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    // Per pair: ~2-4 min for the two guests to boot and set up, then per cell the time to start
    // the traffic (`traffic_wait` at most), the migration (MIGRATION_TIMEOUT at most; ~15 s for
    // 256 MiB, ~1 min for 1 GiB at TCG speed) and the end of the traffic (twice `traffic_wait`
    // at most: each side's program destroys its QPs).
    let per_pair = 600 + cells.len() as u64 * (3 * traffic_wait + MIGRATION_TIMEOUT + 240);
    let env = vec![
        (
            binaries::VMM_ENV.to_string(),
            bins.vmm.display().to_string(),
        ),
        (
            binaries::REMOTE_ENV.to_string(),
            bins.remote.display().to_string(),
        ),
        ("MEMORY_SIZES".to_string(), join(&args.memory)),
        ("QPS".to_string(), join(&args.qps)),
        ("CELLS".to_string(), cells.join(" ")),
        ("SIZE".to_string(), args.size.to_string()),
        ("TX_DEPTH".to_string(), args.tx_depth.to_string()),
        ("QP_TIMEOUT".to_string(), args.qp_timeout.to_string()),
        ("DOWNTIME_MS".to_string(), args.downtime_ms.to_string()),
        ("TRAFFIC_WAIT".to_string(), traffic_wait.to_string()),
        ("READY_WAIT".to_string(), traffic_wait.to_string()),
        (
            "MIGRATION_TIMEOUT".to_string(),
            MIGRATION_TIMEOUT.to_string(),
        ),
    ];
    let scenario = Scenario {
        name: "bench-migration".to_string(),
        env,
        timeout: Duration::from_secs(60 + args.memory.len() as u64 * per_pair),
        // Two L2 guests at a time (three during a migration): single-threaded TCG (see
        // Hosts::One).
        hosts: Hosts::One { l1_cpus: 1 },
    };
    let load_before = loadavg();
    let outcome = bench::run_scenario(&scenario, &assets)?;
    let load_after = loadavg();
    let read = |name: &str| outcome.read(name);
    let mut migrations = parse_tsv(&read("bench.tsv").unwrap_or_default());
    for memory in &args.memory {
        let prefix = format!("bench-mig-{memory}-");
        let logs = vmm_logs(&outcome.out, &prefix);
        for m in migrations.iter_mut().filter(|m| m.memory == *memory) {
            // The receiver's URL, as the send-migration command named it.
            let url = read(&format!("{prefix}cell{}-send-remote.log", m.cell))
                .ok()
                .and_then(|log| {
                    let rest = log.split("send-migration ").nth(1)?;
                    rest.split_whitespace().next().map(str::to_string)
                });
            m.stages = url.and_then(|url| Stages::read(&logs, &url));
        }
    }
    let env = KeyValues::read(&outcome.file("bench.env")).map_err(|e| e.to_string())?;

    println!(
        "Live migration of guest B over TCP to a new VMM in the same test host, {} round(s) per cell, \
         ib_write_bw -s {} -t {} -u {} from B to A, --downtime-ms {}, mode {}, {:.0} s; figures as \
         pvrdma-remote send-migration prints them:",
        args.rounds,
        args.size,
        args.tx_depth,
        args.qp_timeout,
        args.downtime_ms,
        outcome.mode,
        outcome.elapsed.as_secs_f64()
    );
    // The cells run one after the other: other work on this host meanwhile skews the ratios.
    println!("  this host's load average (1/5/15 min) before: {load_before}; after: {load_after}");
    let mut failures = Vec::new();
    for memory in &args.memory {
        let get = |k: &str| env.get(&format!("{memory}.{k}")).unwrap_or("?");
        println!(
            "  {memory} MiB: boot and set-up {} s; VMM exits at the end a={} b={} (B ended on {}); {} s",
            get("boot_seconds"),
            get("a_exit"),
            get("b_exit"),
            get("b_last"),
            get("seconds")
        );
        failures.extend(pair_failures(&format!("{memory} MiB"), get));
    }
    println!("Each migration:");
    for m in &migrations {
        let figures = m.completed.map_or("no figures".to_string(), |c| {
            format!(
                "blackout {} ms, total {:.1} s, {:.1} MiB sent",
                c.blackout_ms, c.total_s, c.sent_mib
            )
        });
        let received = m.received_bytes.map_or("?".to_string(), |b| {
            format!("{:.1}", b as f64 / f64::from(1u32 << 20))
        });
        let traffic = if m.qps == BASELINE_QPS {
            "no traffic".to_string()
        } else {
            format!(
                "client rc {}, server rc {}, BW average {}, running at the switch-over: {}",
                m.client_rc, m.server_rc, m.bw, m.covered
            )
        };
        println!(
            "  {:>5} MiB  round {}  cell {:>2}  {:>3} QPs: {figures} ({received} MiB of memory received, \
             {} passes, send rc {}, source exit {}); {traffic}",
            m.memory, m.round, m.cell, m.qps, m.passes, m.send_rc, m.source_exit
        );
        if let Some(s) = &m.stages {
            let or_dash = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            println!(
                "      stages: pause+save {} ms, last memory {} ms ({:.1} MiB), state {} ms \
                 (devices restored in {} ms), handover {} ms; destination start {} ms (devices \
                 resumed in {} ms: {}; PVRDMA's same-host channel {} ms): the guest saw {} ms",
                s.pause_save_ms,
                s.last_memory_ms,
                s.last_memory_bytes as f64 / f64::from(1u32 << 20),
                s.state_ms,
                or_dash(s.devices_ms),
                s.handover_ms,
                or_dash(s.start_ms),
                or_dash(s.resume_ms),
                s.resumed
                    .iter()
                    .map(|(f, ms)| format!("{f} {ms}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                or_dash(s.pvrdma_channel_ms),
                s.guest_ms()
            );
        }
        for p in m.problems() {
            failures.push(format!(
                "{} MiB, cell {} ({} QPs): {p}",
                m.memory, m.cell, m.qps
            ));
        }
    }
    println!(
        "Medians over the rounds with figures; ratios against the {BASELINE_QPS}-QP migration of the same memory size:"
    );
    println!(
        "  {:>6}  {:>4}  {:>11}  {:>8}  {:>7}  {:>8}  {:>12}  {:>10}  {:>13}  {:>10}  {:>11}",
        "memory",
        "QPs",
        "blackout ms",
        "guest ms",
        "total s",
        "MiB sent",
        "MiB received",
        "traffic rc",
        "blackout / 0",
        "guest / 0",
        "total / 0"
    );
    for &memory in &args.memory {
        let base = summarize(&migrations, memory, BASELINE_QPS);
        for &qps in &args.qps {
            let row = summarize(&migrations, memory, qps);
            let rcs = if qps == BASELINE_QPS {
                "-".to_string()
            } else {
                row.traffic_rc.join(",")
            };
            let expected = args.rounds as usize;
            if row.ran < expected {
                failures.push(format!(
                    "{memory} MiB, {qps} QPs: {} of {expected} rounds ran",
                    row.ran
                ));
            }
            println!(
                "  {:>6}  {:>4}  {:>11}  {:>8}  {:>7}  {:>8}  {:>12}  {:>10}  {:>13}  {:>10}  {:>11}{}",
                format!("{memory} MiB"),
                qps,
                opt(row.blackout_ms, 0),
                opt(row.guest_ms, 0),
                opt(row.total_s, 1),
                opt(row.sent_mib, 1),
                opt(row.received_mib, 1),
                if rcs.is_empty() { "none" } else { &rcs },
                ratio(row.blackout_ms, base.blackout_ms),
                ratio(row.guest_ms, base.guest_ms),
                ratio(row.total_s, base.total_s),
                if row.with_figures < row.ran {
                    format!("  ({} of {} with figures)", row.with_figures, row.ran)
                } else {
                    String::new()
                }
            );
        }
    }
    println!(
        "  (blackout: the source's, until the destination answered Complete; guest: that plus the \
         destination starting the VM after it, from the VMMs' logs. MiB sent: the source's count, \
         vCPU and device state included, printed with one decimal of GiB above 1 GiB; MiB \
         received: guest memory the destination received, exact)"
    );
    println!("The blackout's stages (VMM logs), medians in ms:");
    println!(
        "  {:>6}  {:>4}{}",
        "memory",
        "QPs",
        STAGE_NAMES.map(|n| format!("  {n:>11}")).concat()
    );
    for &memory in &args.memory {
        for &qps in &args.qps {
            let row = summarize(&migrations, memory, qps);
            println!(
                "  {:>6}  {:>4}{}",
                format!("{memory} MiB"),
                qps,
                row.stages.map(|v| format!("  {:>11}", opt(v, 0))).concat()
            );
        }
    }
    println!(
        "  (state: sent, restored by the destination and acknowledged; devices: the destination's \
         share of it restoring devices; dest start: after the hand-over, devices resumed, then vCPUs \
         let go; resume: the devices' share of it; pvrdma ch: of that, PVRDMA's same-host \
         channel taking the MAC's socket over (VMMs before blackout4: and offering rings to its \
         peers, which the worker now does after the start))"
    );
    bench::report_failures(
        &failures,
        "migration(s), traffic run(s) or guest(s)",
        &outcome.out,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_args(s: &str) -> Result<Args, String> {
        let args =
            Args::try_parse_from(std::iter::once("bench-migration").chain(s.split_whitespace()))
                .map_err(|e| e.to_string())?;
        args.check().map(|()| args)
    }

    #[test]
    fn arguments_have_defaults_and_are_checked() {
        let d = parse_args("").unwrap();
        assert_eq!(d.rounds, 1);
        assert_eq!(d.memory, vec![256, 1024]);
        assert_eq!(d.qps, vec![0, 1, 16, 256]);
        assert_eq!(
            (d.size, d.tx_depth, d.qp_timeout, d.downtime_ms),
            (4096, 8, 20, 300)
        );
        let a = parse_args("--rounds 3 --memory 512 --qps 0,4").unwrap();
        assert_eq!((a.rounds, a.memory, a.qps), (3, vec![512], vec![0, 4]));
        // Issue 16's cells: 4096 busy QPs, -t 8 filling the device's largest CQ exactly.
        let big = parse_args("--qps 0,256,4096").unwrap();
        assert_eq!(big.qps, vec![0, 256, 4096]);
        assert_eq!(big.traffic_wait(), 180 + 4096 / 6);
        assert!(parse_args("--qps 4096 --tx-depth 16").is_err());
        assert!(parse_args("--qps 8191 --tx-depth 1").is_err());
        assert!(parse_args("--rounds 0").is_err());
        assert!(parse_args("--rounds").is_err());
        assert!(parse_args("--memory 255").is_err());
        assert!(parse_args("--memory 4096").is_err());
        assert!(parse_args("--qps 1,x").is_err());
        assert!(parse_args("--qp-timeout 32").is_err());
        assert_eq!(parse_args("--qp-timeout 14").unwrap().qp_timeout, 14);
        assert!(parse_args("--what 3").is_err());
    }

    #[test]
    fn completed_lines_in_every_unit() {
        let c = parse_completed("migration completed: blackout 45 ms, total 3.2 s, 520.1 MiB sent")
            .unwrap();
        assert_eq!((c.blackout_ms, c.total_s, c.sent_mib), (45, 3.2, 520.1));
        let g = parse_completed("migration completed: blackout 612 ms, total 61.0 s, 1.0 GiB sent")
            .unwrap();
        assert_eq!(g.sent_mib, 1024.0);
        let k = parse_completed("migration completed: blackout 1 ms, total 0.1 s, 512.0 KiB sent")
            .unwrap();
        assert_eq!(k.sent_mib, 0.5);
        assert!(parse_completed("NA").is_none());
        assert!(parse_completed(
            "migration completed: blackout not measured, total 3.2 s, 1.0 MiB sent"
        )
        .is_none());
        assert!(
            parse_completed("migration completed: blackout 4 ms, total 3.2 s, 1.0 XB sent")
                .is_none()
        );
    }

    const TSV: &str = "256\t1\t0\t1\t0\tmigration completed: blackout 400 ms, total 15.0 s, 258.0 MiB sent\t268435456\t2\tidle\t-\t-\t-\t0\n\
        256\t1\t16\t2\t0\tmigration completed: blackout 600 ms, total 30.0 s, 260.0 MiB sent\t268435456\t3\tyes\t0\t0\t3.20\t0\n\
        256\t1\t256\t3\t1\tNA\tNA\t1\tyes\t0\t0\tNOCLOCK\tkept\n\
        256\t1\t1\t4\t0\tmigration completed: blackout 500 ms, total 20.0 s, 259.0 MiB sent\t268435456\t2\tno\t1\t0\tNA\t0\n\
        bad line\n";

    #[test]
    fn tsv_lines_and_their_problems() {
        let m = parse_tsv(TSV);
        assert_eq!(m.len(), 4);
        assert!(m[0].problems().is_empty(), "{:?}", m[0].problems());
        assert_eq!(m[0].received_bytes, Some(256 << 20));
        assert!(m[1].problems().is_empty(), "{:?}", m[1].problems());
        // A failed migration: no figures, the VM stayed on its source.
        assert!(m[2].figures().is_none());
        assert_eq!(m[2].problems().len(), 2, "{:?}", m[2].problems());
        // Figures, but the traffic ended before the switch-over and failed.
        assert!(m[3].figures().is_some());
        assert_eq!(m[3].problems().len(), 2, "{:?}", m[3].problems());
        let nostart = parse_tsv("1024\t1\t256\t3\tnone\tNA\tNA\t0\tnostart\t1\tnone\tNA\tkept\n");
        assert_eq!(nostart[0].problems().len(), 1);
    }

    #[test]
    fn rows_are_medians_and_ratios_against_the_baseline() {
        let m = parse_tsv(TSV);
        let base = summarize(&m, 256, 0);
        let row = summarize(&m, 256, 16);
        assert_eq!((row.with_figures, row.ran), (1, 1));
        assert_eq!(row.blackout_ms, Some(600.0));
        assert_eq!(row.received_mib, Some(256.0));
        assert_eq!(ratio(row.blackout_ms, base.blackout_ms), "1.50");
        assert_eq!(ratio(row.total_s, base.total_s), "2.00");
        let failed = summarize(&m, 256, 256);
        assert_eq!((failed.with_figures, failed.ran), (0, 1));
        assert_eq!(ratio(failed.blackout_ms, base.blackout_ms), "n/a");
        assert_eq!(summarize(&m, 1024, 0).ran, 0);
    }
}

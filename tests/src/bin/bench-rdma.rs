// SPDX-License-Identifier: Apache-2.0
//! RDMA benchmark between two guests (issues 5 and 15): `ibv_rc_pingpong` time per iteration (its
//! guests spinning on their CQs, and again with `-e`: sleeping until the device's interrupt) and
//! `ib_write_bw`, `ib_read_bw` and `ib_send_bw` average bandwidth between two guests on one bridge
//! of the same test host, through our PVRDMA device (over the VMMs' same-host channel, and again
//! with `local=off` so that the RoCE v2 frames cross the TAPs and the bridge) against two
//! baselines: two guests running Linux Soft-RoCE (rdma_rxe on their vmxnet3, our VMM's plain
//! `--net`), and two guests of QEMU 7.2 with its own `-device pvrdma` (backed by Soft-RoCE in the
//! test host; it posts every work request as a SEND, so its RDMA WRITE and READ run once and are
//! reported as unsupported when they fail, as is its `ibv_rc_pingpong -e`, which hangs). Medians and the ratios of the same run. Figures, not a
//! test; but a run in which a program or a configuration failed says so and exits non-zero.
//!
//! Usage: `cargo build --release --bins && cargo run --release -p e2e --bin bench-rdma --
//! [--rounds N] [--configs C,..] [--pvrdma-opts K=V,..] [--pp-iters N] [--pp-size BYTES]
//! [--bw-iters N] [--bw-size BYTES]` (defaults: 5 rounds, all four configurations,
//! ibv_rc_pingpong -n 200 -s 4096, ib_*_bw -n 200 -s 65536; `--bins` builds the rdmacm-mux
//! stand-in the QEMU guests need). Each
//! round runs each program once; the figures are the ones the client (guest B) prints, timed by
//! its own clock. Inside the nested test host every figure is tiny (~50x slower than native and
//! worse): only the ratios mean something.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use e2e::bench::{loadavg, median, pair_failures};
use e2e::results::KeyValues;
use e2e::testhost::{Hosts, Scenario};
use e2e::{assets, bench, binaries};

/// The configurations, in the order the scenario runs them: (name in the scenario, label).
const CONFIGS: [(&str, &str); 4] = [
    ("pvrdma-local", "pvrdma-vmm, same-host channel"),
    ("pvrdma-wire", "pvrdma-vmm, local=off (TAPs)"),
    ("rxe", "Soft-RoCE (rxe in the guests)"),
    (QEMU, "QEMU 7.2 pvrdma (rxe in L1)"),
];
/// Ours: the first two of [`CONFIGS`]; the others are the baselines.
const OURS: usize = 2;
const QEMU: &str = "qemu-pvrdma";

/// Whether `config` is one of ours (not a baseline).
fn is_ours(config: &str) -> bool {
    CONFIGS[..OURS].iter().any(|o| o.0 == config)
}
/// Issue 15 goal 4: ours at least this many times QEMU pvrdma's bandwidth, at most its inverse
/// times its pingpong time.
const QEMU_GOAL: f64 = 3.0;

fn main() -> ExitCode {
    bench::exit("bench-rdma", run(&Args::parse()))
}

/// RDMA between two guests: our device (same-host channel and `local=off`) against Soft-RoCE and
/// QEMU's pvrdma.
#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(name = "bench-rdma")]
struct Args {
    /// Rounds; each runs each program once per configuration.
    #[arg(long, default_value_t = 5, value_parser = bench::positive)]
    rounds: u32,
    /// The configurations to run (comma-separated; a ratio needs both of its own): pvrdma-local,
    /// pvrdma-wire, rxe, qemu-pvrdma.
    #[arg(long, value_delimiter = ',', default_value = "pvrdma-local,pvrdma-wire,rxe,qemu-pvrdma",
          value_parser = config_name)]
    configs: Vec<String>,
    /// More options for our configurations' `--pvrdma` (e.g. `poll=0`), appended after theirs.
    #[arg(long, default_value = "", value_parser = pvrdma_opts)]
    pvrdma_opts: String,
    /// ibv_rc_pingpong iterations (-n).
    #[arg(long, default_value_t = 200, value_parser = bench::positive)]
    pp_iters: u32,
    /// ibv_rc_pingpong message size in bytes (-s).
    #[arg(long, default_value_t = 4096, value_parser = bench::positive)]
    pp_size: u32,
    /// ib_{write,read,send}_bw iterations (-n).
    #[arg(long, default_value_t = 200, value_parser = bench::positive)]
    bw_iters: u32,
    /// ib_{write,read,send}_bw message size in bytes (-s).
    #[arg(long, default_value_t = 65536, value_parser = bench::positive)]
    bw_size: u32,
}

fn config_name(s: &str) -> Result<String, String> {
    if CONFIGS.iter().any(|c| c.0 == s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s}: not one of {}",
            CONFIGS.map(|c| c.0).join(", ")
        ))
    }
}

/// `--pvrdma` options as the VMM parses them: `key=value` pairs, comma-separated, of characters
/// that need no quoting in the scenario.
fn pvrdma_opts(s: &str) -> Result<String, String> {
    let pairs_ok = s.split(',').all(|kv| {
        kv.split_once('=')
            .is_some_and(|(k, v)| !k.is_empty() && !v.is_empty())
            && kv
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '=' | '_' | '-' | ':' | '.'))
    });
    if s.is_empty() || pairs_ok {
        Ok(s.to_string())
    } else {
        Err(format!("{s}: expected key=value[,key=value...]"))
    }
}

/// The programs, in the order a round runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prog {
    PingPong,
    /// `ibv_rc_pingpong -e`: both sides sleep on their completion channel, woken by the device's
    /// interrupt, instead of polling the CQ. In the one-vCPU test host two polling guests take
    /// turns by the scheduler's time slices; this measures the devices' round trip with guests
    /// that give the CPU away.
    PingPongEvents,
    WriteBw,
    ReadBw,
    SendBw,
}

impl Prog {
    const ALL: [Self; 5] = [
        Self::PingPong,
        Self::PingPongEvents,
        Self::WriteBw,
        Self::ReadBw,
        Self::SendBw,
    ];

    /// Its name in bench.tsv (and in the guest's BENCH-RDMA-BEGIN lines).
    fn key(self) -> &'static str {
        match self {
            Self::PingPong => "pp",
            Self::PingPongEvents => "ppe",
            Self::WriteBw => "write",
            Self::ReadBw => "read",
            Self::SendBw => "send",
        }
    }

    /// QEMU 7.2's pvrdma posts every work request to its backend as a SEND: RDMA WRITE and READ
    /// cannot work there; and `ibv_rc_pingpong -e` waits for its first completion event until
    /// killed. The guest runs them in the first round only; their failure is a result, not a
    /// failed run.
    fn is_pingpong(self) -> bool {
        matches!(self, Self::PingPong | Self::PingPongEvents)
    }

    fn unsupported_by(self, config: &str) -> bool {
        config == QEMU && matches!(self, Self::PingPongEvents | Self::WriteBw | Self::ReadBw)
    }
}

/// One program run as the scenario recorded it.
#[derive(Debug, Clone, PartialEq)]
struct Round {
    round: u32,
    client_rc: String,
    server_rc: String,
    /// usec/iter (pp, ppe) or MB/s (bw); None if the client printed no figure.
    figure: Option<f64>,
    /// perftest said its cycle-clock calibration failed ("Correlation coefficient r^2 ... < 0.9"),
    /// so it printed 0.00: the program ran, but this round has no figure.
    no_clock: bool,
}

impl Round {
    fn ran(&self) -> bool {
        self.client_rc == "0" && self.server_rc == "0"
    }

    fn ok(&self) -> bool {
        self.ran() && self.figure.is_some_and(|f| f > 0.0)
    }
}

/// bench.tsv lines: config, program, round, client rc, server rc, figure (or NA).
fn parse_tsv(tsv: &str) -> BTreeMap<(String, String), Vec<Round>> {
    let mut rounds: BTreeMap<(String, String), Vec<Round>> = BTreeMap::new();
    for line in tsv.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        if let [config, prog, round, client_rc, server_rc, figure] = fields.as_slice() {
            let Ok(round) = round.parse() else { continue };
            rounds
                .entry(((*config).to_string(), (*prog).to_string()))
                .or_default()
                .push(Round {
                    round,
                    client_rc: (*client_rc).to_string(),
                    server_rc: (*server_rc).to_string(),
                    figure: figure.parse().ok(),
                    no_clock: *figure == "NOCLOCK",
                });
        }
    }
    rounds
}

/// What one configuration's program gave: its sorted figures, the rounds that ran but have no
/// figure because perftest's clock calibration failed, and failures (a program that failed, a
/// round that did not run).
#[derive(Debug, Clone, PartialEq)]
struct Summary {
    figures: Vec<f64>,
    no_clock: Vec<u32>,
    problems: Vec<String>,
}

fn summarize(rounds: &[Round], wanted: u32) -> Summary {
    let mut figures = Vec::new();
    let mut no_clock = Vec::new();
    let mut problems = Vec::new();
    for r in rounds {
        if r.ok() {
            figures.extend(r.figure);
        } else if r.ran() && r.no_clock {
            no_clock.push(r.round);
        } else {
            problems.push(format!(
                "round {}: client rc={} server rc={} figure={}",
                r.round,
                r.client_rc,
                r.server_rc,
                r.figure.map_or("none".to_string(), |f| f.to_string())
            ));
        }
    }
    if rounds.len() < wanted as usize {
        problems.push(format!("{} of {wanted} rounds ran", rounds.len()));
    }
    figures.sort_by(f64::total_cmp);
    Summary {
        figures,
        no_clock,
        problems,
    }
}

fn run(args: &Args) -> Result<(), String> {
    let assets = assets::get().map_err(|e| e.to_string())?;
    let vmm = binaries::vmm().map_err(|e| e.to_string())?;
    // The selected configurations, in the scenario's order.
    let configs: Vec<(&str, &str)> = CONFIGS
        .into_iter()
        .filter(|c| args.configs.iter().any(|s| s == c.0))
        .collect();
    // Per pair: ~90 s for two guests to boot and set up, then per round five programs of at most
    // PROG_LIMIT each (typically a few seconds with pvrdma-vmm, ~70 s each with Soft-RoCE).
    let prog_limit = 120u64;
    let per_pair = 360 + u64::from(args.rounds) * Prog::ALL.len() as u64 * prog_limit;
    let mut env = vec![
        ("PVRDMA_VMM_BIN".to_string(), vmm.display().to_string()),
        (
            "CONFIGS".to_string(),
            configs.iter().map(|c| c.0).collect::<Vec<_>>().join(" "),
        ),
        ("ROUNDS".to_string(), args.rounds.to_string()),
        ("PP_ITERS".to_string(), args.pp_iters.to_string()),
        ("PP_SIZE".to_string(), args.pp_size.to_string()),
        ("BW_ITERS".to_string(), args.bw_iters.to_string()),
        ("BW_SIZE".to_string(), args.bw_size.to_string()),
        ("PROG_LIMIT".to_string(), prog_limit.to_string()),
        ("BENCH_LIMIT".to_string(), per_pair.to_string()),
        ("PVRDMA_OPTS".to_string(), args.pvrdma_opts.clone()),
    ];
    if configs.iter().any(|c| c.0 == QEMU) {
        let mux = binaries::mux_stub().map_err(|e| e.to_string())?;
        env.push((binaries::MUX_ENV.to_string(), mux.display().to_string()));
    }
    let scenario = Scenario {
        name: "bench-rdma".to_string(),
        env,
        timeout: Duration::from_secs(60 + configs.len() as u64 * (per_pair + 120)),
        // Two L2 guests at a time: single-threaded TCG (see Hosts::One).
        hosts: Hosts::One { l1_cpus: 1 },
    };
    let load_before = loadavg();
    let outcome = bench::run_scenario(&scenario, &assets)?;
    let load_after = loadavg();
    let read = |name: &str| outcome.read(name);
    let rounds = parse_tsv(&read("bench.tsv").unwrap_or_default());
    let env = KeyValues::read(&outcome.file("bench.env")).map_err(|e| e.to_string())?;

    println!(
        "RDMA between two guests (A serves, B connects), {} rounds per configuration, mode {}, {:.0} s; \
         figures as guest B's programs print them (its own clock):",
        args.rounds,
        outcome.mode,
        outcome.elapsed.as_secs_f64()
    );
    // The configurations run one after the other: other work on this host while one of them runs
    // skews the ratios (the test host alone keeps about one core busy).
    println!("  this host's load average (1/5/15 min) before: {load_before}; after: {load_after}");
    if !args.pvrdma_opts.is_empty() {
        println!(
            "  our configurations with --pvrdma ...,{}",
            args.pvrdma_opts
        );
    }
    let mut failures = Vec::new();
    for &(config, label) in &configs {
        let get = |k: &str| env.get(&format!("{config}.{k}")).unwrap_or("?");
        println!(
            "  {label}: VMM exits a={} b={}; RoCE v2 frames sent to tapa/tapb: {}/{}; {} s",
            get("a_exit"),
            get("b_exit"),
            get("tapa_roce_frames"),
            get("tapb_roce_frames"),
            get("seconds")
        );
        failures.extend(pair_failures(label, get));
    }
    let cpu = parse_cpu(&read("cpu.tsv").unwrap_or_default());
    for prog in Prog::ALL {
        let medians = prog_figures(prog, args, &configs, &rounds, &mut failures);
        print_ratios(prog, &configs, &medians);
        if prog.is_pingpong() {
            print_cpu(prog, &configs, &medians, &cpu);
        }
    }
    bench::report_failures(&failures, "program run(s) or guest(s)", &outcome.out)
}

/// Prints one program's figures for each configuration and returns the medians of those all of
/// whose rounds succeeded; what failed goes to `failures` (QEMU's unsupported programs excepted,
/// when their round ran and failed).
fn prog_figures<'a>(
    prog: Prog,
    args: &Args,
    configs: &[(&'a str, &str)],
    rounds: &BTreeMap<(String, String), Vec<Round>>,
    failures: &mut Vec<String>,
) -> BTreeMap<&'a str, f64> {
    let (n, s) = if prog.is_pingpong() {
        (args.pp_iters, args.pp_size)
    } else {
        (args.bw_iters, args.bw_size)
    };
    match prog {
        Prog::PingPong => {
            println!("ibv_rc_pingpong -n {n} -s {s}: usec/iter (lower is better)");
        }
        Prog::PingPongEvents => {
            println!(
                "ibv_rc_pingpong -e -n {n} -s {s} (completion events): usec/iter (lower is better)"
            );
        }
        _ => println!(
            "ib_{}_bw -n {n} -s {s}: BW average MB/s (higher is better)",
            prog.key()
        ),
    }
    let mut medians = BTreeMap::new();
    for &(config, label) in configs {
        let all = rounds
            .get(&(config.to_string(), prog.key().to_string()))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let unsupported = prog.unsupported_by(config);
        let s = summarize(all, if unsupported { 1 } else { args.rounds });
        if unsupported && s.figures.is_empty() && !all.is_empty() {
            println!(
                "    {label:<32} unsupported by QEMU's device: {}",
                s.problems.join("; ")
            );
            continue;
        }
        for p in &s.problems {
            failures.push(format!("{label}, {}: {p}", prog.key()));
        }
        if s.figures.is_empty() {
            println!("    {label:<32} FAILED: no round with a figure");
            if s.problems.is_empty() {
                failures.push(format!(
                    "{label}, {}: no round with a figure (perftest clock calibration failed in rounds {:?})",
                    prog.key(),
                    s.no_clock
                ));
            }
            continue;
        }
        let m = median(&s.figures);
        let no_clock = if s.no_clock.is_empty() {
            String::new()
        } else {
            format!(
                "; no figure in round(s) {:?}: perftest's clock calibration failed",
                s.no_clock
            )
        };
        println!(
            "    {label:<32} median {m:10.2}  min {:10.2}  max {:10.2}  ({} rounds with a figure{no_clock}){}",
            s.figures[0],
            s.figures[s.figures.len() - 1],
            s.figures.len(),
            if s.problems.is_empty() { "" } else { "  FAILED ROUNDS" }
        );
        // A ratio only from configurations all of whose rounds succeeded.
        if s.problems.is_empty() {
            medians.insert(config, m);
        }
    }
    medians
}

/// Prints each of our configurations' ratio to each baseline of the same run, with issue 15's goal
/// against QEMU; "n/a" where either has no median (its failure is listed at the end).
fn print_ratios(prog: Prog, configs: &[(&str, &str)], medians: &BTreeMap<&str, f64>) {
    let ours = configs.iter().filter(|c| is_ours(c.0));
    for &(config, label) in ours {
        for &(base, base_label) in configs {
            if is_ours(base) || prog.unsupported_by(base) {
                continue;
            }
            let (Some(o), Some(b)) = (medians.get(config), medians.get(base)) else {
                println!("    ratio {label} / {base_label}: n/a (a run failed, see below)");
                continue;
            };
            let r = o / b;
            let (what, better) = if prog.is_pingpong() {
                ("time per iteration", "below 1: pvrdma-vmm faster")
            } else {
                ("bandwidth", "above 1: pvrdma-vmm faster")
            };
            let goal = if base == QEMU {
                let (met, bound) = qemu_goal(prog, r);
                format!("; goal {bound}: {}", if met { "met" } else { "NOT met" })
            } else {
                String::new()
            };
            println!("    ratio {label} / {base_label}, {what}: {r:.2} ({better}{goal})");
        }
    }
}

/// One line of cpu.tsv (tests/scenarios/bench-rdma.sh's sampler): the program B was running
/// (its key, or "-" between programs), when (microseconds, the test host's clock), and CPU ticks
/// so far: the test host's busy and idle, then per VMM (A, B) its vCPU threads' and its other
/// threads'.
#[derive(Debug, Clone, PartialEq)]
struct CpuSample {
    config: String,
    prog: String,
    us: u64,
    ticks: [u64; 6],
}

fn parse_cpu(tsv: &str) -> Vec<CpuSample> {
    let mut samples = Vec::new();
    for line in tsv.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        let [config, us, prog, ticks @ ..] = fields.as_slice() else {
            continue;
        };
        let (Ok(us), Some(ticks)) = (us.parse(), bench::u64_fields(ticks)) else {
            continue;
        };
        samples.push(CpuSample {
            config: (*config).to_string(),
            prog: (*prog).to_string(),
            us,
            ticks,
        });
    }
    samples
}

/// Where the test host's CPU went while `config`'s guest B ran `prog`.
#[derive(Debug, PartialEq)]
struct CpuShares {
    /// Shares of the total: A's vCPU, A's other threads, B's vCPU, B's other threads, the rest of
    /// the host (its kernel, the bridge, rxe, the sampler) and idle.
    parts: [f64; 6],
    /// The mean time between the samples counted, in seconds (the sampler sleeps 0.5 s, then
    /// reads every thread's stat: on a busy test host that takes as long again).
    every: f64,
}

/// The sum of the tick differences between consecutive samples that both fall inside one of
/// `config`'s runs of `prog`; None without such samples.
fn cpu_shares(samples: &[CpuSample], config: &str, prog: &str) -> Option<CpuShares> {
    let mut sum = [0u64; 6];
    let (mut intervals, mut us) = (0u32, 0u64);
    for pair in samples.windows(2) {
        let [a, b] = pair else { continue };
        if [a, b].iter().all(|s| s.config == config && s.prog == prog) {
            for (s, (x, y)) in sum.iter_mut().zip(a.ticks.iter().zip(&b.ticks)) {
                *s += y.saturating_sub(*x);
            }
            intervals += 1;
            us += b.us.saturating_sub(a.us);
        }
    }
    let [busy, idle, vmms @ ..] = sum;
    let total = busy + idle;
    if total == 0 {
        return None;
    }
    let rest = busy.saturating_sub(vmms.iter().sum());
    let [av, ao, bv, bo] = vmms;
    Some(CpuShares {
        parts: [av, ao, bv, bo, rest, idle].map(|t| t as f64 / total as f64),
        every: us as f64 / 1e6 / f64::from(intervals),
    })
}

/// Prints, for a pingpong program, where the test host's one CPU went during it per configuration,
/// as shares and as microseconds of the median iteration.
fn print_cpu(
    prog: Prog,
    configs: &[(&str, &str)],
    medians: &BTreeMap<&str, f64>,
    cpu: &[CpuSample],
) {
    println!(
        "    the test host's CPU while B ran it (share; times the median: usec/iter; sampling interval):"
    );
    const PARTS: [&str; 6] = [
        "A vCPU",
        "A VMM threads",
        "B vCPU",
        "B VMM threads",
        "rest of host",
        "idle",
    ];
    for &(config, label) in configs {
        if prog.unsupported_by(config) {
            continue;
        }
        let Some(shares) = cpu_shares(cpu, config, prog.key()) else {
            println!("      {label:<32} no samples");
            continue;
        };
        let m = medians.get(config).copied();
        let parts: Vec<String> = PARTS
            .iter()
            .zip(shares.parts)
            .map(|(name, share)| match m {
                Some(m) => format!("{name} {:.0}% ({:.0})", share * 100.0, share * m),
                None => format!("{name} {:.0}%", share * 100.0),
            })
            .chain([format!("every {:.1} s", shares.every)])
            .collect();
        println!("      {label:<32} {}", parts.join(", "));
    }
}

/// Issue 15 goal 4 for `prog`: whether `ratio` (ours / QEMU pvrdma's median) meets it, and the
/// bound it was held to.
fn qemu_goal(prog: Prog, ratio: f64) -> (bool, String) {
    if prog.is_pingpong() {
        (ratio <= 1.0 / QEMU_GOAL, format!("<= 1/{QEMU_GOAL}"))
    } else {
        (ratio >= QEMU_GOAL, format!(">= {QEMU_GOAL}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_args(s: &str) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("bench-rdma").chain(s.split_whitespace()))
    }

    #[test]
    fn arguments_have_defaults_and_are_checked() {
        let d = parse_args("").unwrap();
        assert_eq!((d.rounds, d.pp_iters, d.bw_size), (5, 200, 65536));
        assert_eq!(d.configs.len(), CONFIGS.len());
        let a = parse_args("--rounds 5 --bw-iters 50 --configs qemu-pvrdma,rxe").unwrap();
        assert_eq!((a.rounds, a.bw_iters), (5, 50));
        assert_eq!(a.configs, vec![QEMU.to_string(), "rxe".to_string()]);
        assert!(parse_args("--configs rxe,qemu").is_err());
        assert_eq!(
            parse_args("--pvrdma-opts poll=0,max_qp=8")
                .unwrap()
                .pvrdma_opts,
            "poll=0,max_qp=8"
        );
        for bad in ["poll", "poll=0,", "poll=0;reboot", "=1", "poll=$(x)"] {
            assert!(
                parse_args(&format!("--pvrdma-opts {bad}")).is_err(),
                "{bad}"
            );
        }
        assert!(parse_args("--rounds 0").is_err());
        assert!(parse_args("--rounds").is_err());
        assert!(parse_args("--what 3").is_err());
    }

    #[test]
    fn failed_and_missing_rounds_are_problems() {
        let tsv = "rxe\tpp\t1\t0\t0\t812.5\nrxe\tpp\t2\t1\t0\tNA\nrxe\twrite\t1\t0\t0\t3.20\nbad\n\
                   pvrdma-local\twrite\t1\t0\tnone\t4.1\n";
        let r = parse_tsv(tsv);
        let pp = summarize(&r[&("rxe".to_string(), "pp".to_string())], 2);
        assert_eq!(pp.figures, vec![812.5]);
        assert_eq!(pp.problems.len(), 1);
        let bw = summarize(&r[&("rxe".to_string(), "write".to_string())], 2);
        assert_eq!(bw.figures, vec![3.2]);
        assert_eq!(bw.problems, vec!["1 of 2 rounds ran".to_string()]);
        // A server that never ran makes the round a failure even with a figure.
        let ours = summarize(&r[&("pvrdma-local".to_string(), "write".to_string())], 1);
        assert!(ours.figures.is_empty());
        assert_eq!(ours.problems.len(), 1);
    }

    #[test]
    fn zero_figures_are_not_results() {
        // perftest prints 0.00 when its clock calibration fails: the scenario says NOCLOCK then,
        // a round without a figure but not a failure; a bare 0.00 is a failure.
        let r = parse_tsv(
            "rxe\twrite\t1\t0\t0\t0.00\nrxe\twrite\t2\t0\t0\tNOCLOCK\nrxe\twrite\t3\t0\t0\t2.5\n",
        );
        let rounds = &r[&("rxe".to_string(), "write".to_string())];
        assert!(!rounds[0].ok());
        let s = summarize(rounds, 3);
        assert_eq!(s.figures, vec![2.5]);
        assert_eq!(s.no_clock, vec![2]);
        assert_eq!(s.problems.len(), 1);
        // A failed program with the calibration message is still a failure.
        let r = parse_tsv("rxe\twrite\t1\t1\t0\tNOCLOCK\n");
        let s = summarize(&r[&("rxe".to_string(), "write".to_string())], 1);
        assert_eq!((s.no_clock.len(), s.problems.len()), (0, 1));
    }

    #[test]
    fn qemu_goal_is_three_times_the_bandwidth_and_a_third_of_the_time() {
        assert!(qemu_goal(Prog::SendBw, 3.0).0);
        assert!(!qemu_goal(Prog::SendBw, 2.9).0);
        assert!(qemu_goal(Prog::PingPong, 0.33).0);
        assert!(!qemu_goal(Prog::PingPong, 0.34).0);
        assert!(qemu_goal(Prog::PingPongEvents, 0.33).0);
        assert!(!qemu_goal(Prog::PingPongEvents, 0.5).0);
        // Only QEMU's RDMA WRITE and READ and its pingpong with events may fail without failing
        // the run.
        assert!(Prog::WriteBw.unsupported_by(QEMU) && Prog::ReadBw.unsupported_by(QEMU));
        assert!(!Prog::SendBw.unsupported_by(QEMU) && !Prog::PingPong.unsupported_by(QEMU));
        assert!(Prog::PingPongEvents.unsupported_by(QEMU));
        assert!(!Prog::WriteBw.unsupported_by("rxe"));
    }

    #[test]
    fn cpu_shares_count_only_intervals_inside_the_program() {
        let tsv = "qemu-pvrdma\t0\t-\t100\t0\t0\t0\t0\t0\n\
                   qemu-pvrdma\t600000\tppe\t110\t0\t1\t1\t1\t1\n\
                   qemu-pvrdma\t1600000\tppe\t150\t20\t21\t6\t11\t2\n\
                   qemu-pvrdma\t2800000\tppe\t170\t40\t31\t6\t11\t2\n\
                   qemu-pvrdma\t3400000\t-\t900\t40\t31\t6\t11\t2\n\
                   qemu-pvrdma\t4000000\tppe\tx\t40\t31\t6\t11\t2\n\
                   qemu-pvrdma\t4600000\tppe\t1\t2\t3\t4\t5\n";
        let cpu = parse_cpu(tsv);
        assert_eq!(cpu.len(), 5);
        // Two intervals (1.0 and 1.2 s): busy 60, idle 40; A's vCPU 30, A's others 5, B's 10
        // and 1. The line with a tick that is not a number and the one cut short are skipped.
        let s = cpu_shares(&cpu, "qemu-pvrdma", "ppe").unwrap();
        assert_eq!(s.parts, [0.3, 0.05, 0.1, 0.01, 0.14, 0.4]);
        assert!((s.every - 1.1).abs() < 1e-9, "{}", s.every);
        assert!(cpu_shares(&cpu, "qemu-pvrdma", "pp").is_none());
        assert!(cpu_shares(&cpu, "rxe", "ppe").is_none());
    }
}

// SPDX-License-Identifier: Apache-2.0
//! RDMA benchmark between two guests (issue 5): `ibv_rc_pingpong` time per iteration and
//! `ib_write_bw` average bandwidth between two guests on one bridge of the same test host, through
//! our PVRDMA device (over the VMMs' same-host channel, and again with `local=off` so that the
//! RoCE v2 frames cross the TAPs and the bridge) against two guests running Linux Soft-RoCE
//! (rdma_rxe on their vmxnet3, our VMM's plain `--net`); medians and the ratios. Figures, not a
//! test; but a run in which a program failed says so and exits non-zero.
//!
//! Usage: `cargo run --release -p e2e --bin bench-rdma -- [--rounds N] [--pp-iters N]
//! [--pp-size BYTES] [--bw-iters N] [--bw-size BYTES]` (defaults: 5 rounds, ibv_rc_pingpong
//! -n 200 -s 4096, ib_write_bw -n 200 -s 65536). Each round runs each program once; the figures
//! are the ones the client (guest B) prints, timed by its own clock. Inside the nested test host
//! every figure is tiny (~50x slower than native and worse): only the ratios mean something.

use std::collections::BTreeMap;
use std::fs;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use e2e::bench::{loadavg, median, pair_failures};
use e2e::results::KeyValues;
use e2e::testhost::{self, Hosts, Scenario};
use e2e::{assets, bench, binaries};

/// The configurations, in the order the scenario runs them: (name in the scenario, label).
const CONFIGS: [(&str, &str); 3] = [
    ("pvrdma-local", "pvrdma-vmm, same-host channel"),
    ("pvrdma-wire", "pvrdma-vmm, local=off (TAPs)"),
    ("rxe", "Soft-RoCE (rxe in the guests)"),
];
const BASELINE: &str = "rxe";

fn main() -> ExitCode {
    bench::exit("bench-rdma", run(Args::parse()))
}

/// RDMA between two guests: our device (same-host channel and `local=off`) against Soft-RoCE.
#[derive(Parser, Debug, Clone, Copy, PartialEq, Eq)]
#[command(name = "bench-rdma")]
struct Args {
    /// Rounds; each runs each program once per configuration.
    #[arg(long, default_value_t = 5, value_parser = bench::positive)]
    rounds: u32,
    /// ibv_rc_pingpong iterations (-n).
    #[arg(long, default_value_t = 200, value_parser = bench::positive)]
    pp_iters: u32,
    /// ibv_rc_pingpong message size in bytes (-s).
    #[arg(long, default_value_t = 4096, value_parser = bench::positive)]
    pp_size: u32,
    /// ib_write_bw iterations (-n).
    #[arg(long, default_value_t = 200, value_parser = bench::positive)]
    bw_iters: u32,
    /// ib_write_bw message size in bytes (-s).
    #[arg(long, default_value_t = 65536, value_parser = bench::positive)]
    bw_size: u32,
}

/// The two programs: (name in bench.tsv, what is reported, whether higher is better).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prog {
    PingPong,
    WriteBw,
}

impl Prog {
    fn key(self) -> &'static str {
        match self {
            Self::PingPong => "pp",
            Self::WriteBw => "bw",
        }
    }
}

/// One program run as the scenario recorded it.
#[derive(Debug, Clone, PartialEq)]
struct Round {
    round: u32,
    client_rc: String,
    server_rc: String,
    /// usec/iter (pp) or MB/s (bw); None if the client printed no figure.
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

fn run(args: Args) -> Result<(), String> {
    let assets = assets::get().map_err(|e| e.to_string())?;
    let vmm = binaries::vmm().map_err(|e| e.to_string())?;
    let configs: Vec<&str> = CONFIGS.iter().map(|c| c.0).collect();
    // Per pair: ~90 s for two guests to boot and set up, then per round two programs of at most
    // PROG_LIMIT each (typically a few seconds with pvrdma-vmm, ~70 s with Soft-RoCE, whose pair
    // takes ~4.5 min with 3 rounds, ~7 min with 5).
    let prog_limit = 120u64;
    let per_pair = 360 + u64::from(args.rounds) * 2 * prog_limit;
    let env = vec![
        ("PVRDMA_VMM_BIN".to_string(), vmm.display().to_string()),
        ("CONFIGS".to_string(), configs.join(" ")),
        ("ROUNDS".to_string(), args.rounds.to_string()),
        ("PP_ITERS".to_string(), args.pp_iters.to_string()),
        ("PP_SIZE".to_string(), args.pp_size.to_string()),
        ("BW_ITERS".to_string(), args.bw_iters.to_string()),
        ("BW_SIZE".to_string(), args.bw_size.to_string()),
        ("PROG_LIMIT".to_string(), prog_limit.to_string()),
        ("BENCH_LIMIT".to_string(), per_pair.to_string()),
    ];
    let scenario = Scenario {
        name: "bench-rdma".to_string(),
        env,
        timeout: Duration::from_secs(60 + configs.len() as u64 * (per_pair + 120)),
        // Two L2 guests at a time: single-threaded TCG (see Hosts::One).
        hosts: Hosts::One { l1_cpus: 1 },
    };
    let load_before = loadavg();
    let outcome = testhost::run(&scenario, &assets).map_err(|e| e.to_string())?;
    let load_after = loadavg();
    if outcome.exit_code != Some(0) {
        return Err(format!("scenario failed\n{}", outcome.context()));
    }
    let read = |name: &str| {
        let path = outcome.file(name);
        fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))
    };
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
    let mut failures = Vec::new();
    for (config, label) in CONFIGS {
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
    let progs = [
        (
            Prog::PingPong,
            format!(
                "ibv_rc_pingpong -n {} -s {}: usec/iter (lower is better)",
                args.pp_iters, args.pp_size
            ),
        ),
        (
            Prog::WriteBw,
            format!(
                "ib_write_bw -n {} -s {}: BW average MB/s (higher is better)",
                args.bw_iters, args.bw_size
            ),
        ),
    ];
    for (prog, title) in progs {
        println!("{title}");
        let mut medians = BTreeMap::new();
        for (config, label) in CONFIGS {
            let all = rounds
                .get(&(config.to_string(), prog.key().to_string()))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let s = summarize(all, args.rounds);
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
                "    {label:<32} median {m:10.2}  min {:10.2}  max {:10.2}  ({} rounds with a figure of {}{no_clock}){}",
                s.figures[0],
                s.figures[s.figures.len() - 1],
                s.figures.len(),
                args.rounds,
                if s.problems.is_empty() { "" } else { "  FAILED ROUNDS" }
            );
            // A ratio only from configurations all of whose rounds succeeded.
            if s.problems.is_empty() {
                medians.insert(config, m);
            }
        }
        for (config, label) in &CONFIGS[..2] {
            match (medians.get(config), medians.get(BASELINE)) {
                (Some(ours), Some(rxe)) => match prog {
                    Prog::PingPong => println!(
                        "    ratio {label} / Soft-RoCE, time per iteration: {:.2} (below 1: pvrdma-vmm faster)",
                        ours / rxe
                    ),
                    Prog::WriteBw => println!(
                        "    ratio {label} / Soft-RoCE, bandwidth: {:.2} (above 1: pvrdma-vmm faster)",
                        ours / rxe
                    ),
                },
                _ => println!("    ratio {label} / Soft-RoCE: n/a (a run failed, see below)"),
            }
        }
    }
    bench::report_failures(&failures, "program run(s) or guest(s)", &outcome.out)
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
        let a = parse_args("--rounds 5 --bw-iters 50").unwrap();
        assert_eq!((a.rounds, a.bw_iters), (5, 50));
        assert!(parse_args("--rounds 0").is_err());
        assert!(parse_args("--rounds").is_err());
        assert!(parse_args("--what 3").is_err());
    }

    #[test]
    fn failed_and_missing_rounds_are_problems() {
        let tsv = "rxe\tpp\t1\t0\t0\t812.5\nrxe\tpp\t2\t1\t0\tNA\nrxe\tbw\t1\t0\t0\t3.20\nbad\n\
                   pvrdma-local\tbw\t1\t0\tnone\t4.1\n";
        let r = parse_tsv(tsv);
        let pp = summarize(&r[&("rxe".to_string(), "pp".to_string())], 2);
        assert_eq!(pp.figures, vec![812.5]);
        assert_eq!(pp.problems.len(), 1);
        let bw = summarize(&r[&("rxe".to_string(), "bw".to_string())], 2);
        assert_eq!(bw.figures, vec![3.2]);
        assert_eq!(bw.problems, vec!["1 of 2 rounds ran".to_string()]);
        // A server that never ran makes the round a failure even with a figure.
        let ours = summarize(&r[&("pvrdma-local".to_string(), "bw".to_string())], 1);
        assert!(ours.figures.is_empty());
        assert_eq!(ours.problems.len(), 1);
    }

    #[test]
    fn zero_figures_are_not_results() {
        // perftest prints 0.00 when its clock calibration fails: the scenario says NOCLOCK then,
        // a round without a figure but not a failure; a bare 0.00 is a failure.
        let r =
            parse_tsv("rxe\tbw\t1\t0\t0\t0.00\nrxe\tbw\t2\t0\t0\tNOCLOCK\nrxe\tbw\t3\t0\t0\t2.5\n");
        let rounds = &r[&("rxe".to_string(), "bw".to_string())];
        assert!(!rounds[0].ok());
        let s = summarize(rounds, 3);
        assert_eq!(s.figures, vec![2.5]);
        assert_eq!(s.no_clock, vec![2]);
        assert_eq!(s.problems.len(), 1);
        // A failed program with the calibration message is still a failure.
        let r = parse_tsv("rxe\tbw\t1\t1\t0\tNOCLOCK\n");
        let s = summarize(&r[&("rxe".to_string(), "bw".to_string())], 1);
        assert_eq!((s.no_clock.len(), s.problems.len()), (0, 1));
    }
}

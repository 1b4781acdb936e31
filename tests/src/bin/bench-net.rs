// SPDX-License-Identifier: Apache-2.0
//! Network benchmark (issue 3): TCP throughput between two guests on one bridge of the same test
//! host, our VMM's vmxnet3 (`--net`) against QEMU's own `-device vmxnet3`, same kernel, initramfs
//! and guest script; medians and their ratio. Figures, not a test.
//!
//! Usage: `cargo run --release -p e2e --bin bench-net -- [--mb N] [--rounds N] [--mtu 1500|9000]`
//! (defaults: 16 MiB, 3 rounds per VMM, MTU 1500). Each round sends N MiB of random data from
//! guest B to guest A with busybox nc, timed by B's clock; A checks the md5 of every transfer.
//! Inside the nested test host every figure is tiny (~50x slower than native and worse): only the
//! ratio means something.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use e2e::bench::{self, median};
use e2e::testhost::{Hosts, Scenario};
use e2e::{assets, binaries};

const QEMU: &str = "qemu";
const OURS: &str = "pvrdma-vmm";

fn main() -> ExitCode {
    bench::exit("bench-net", run(Args::parse()))
}

/// TCP throughput between two guests: our vmxnet3 against QEMU's, medians and their ratio.
#[derive(Parser, Debug, Clone, Copy, PartialEq, Eq)]
#[command(name = "bench-net")]
struct Args {
    /// MiB of random data per transfer.
    #[arg(long, default_value_t = 16, value_parser = bench::positive)]
    mb: u32,
    /// Transfers per VMM.
    #[arg(long, default_value_t = 3, value_parser = bench::positive)]
    rounds: u32,
    /// The guests' MTU.
    #[arg(long, default_value_t = 1500, value_parser = mtu)]
    mtu: u32,
}

fn mtu(s: &str) -> Result<u32, String> {
    match s {
        "1500" => Ok(1500),
        "9000" => Ok(9000),
        _ => Err(format!("{s}: 1500 or 9000")),
    }
}

/// One round as the scenario recorded it.
#[derive(Debug, Clone, PartialEq)]
struct Round {
    secs: f64,
    bytes: u64,
    intact: bool,
    /// TCP segments A received with a bad checksum since it booted (cumulative).
    csum_errors: Option<u64>,
}

fn run(args: Args) -> Result<(), String> {
    let assets = assets::get().map_err(|e| e.to_string())?;
    let vmm = binaries::vmm().map_err(|e| e.to_string())?;
    let vmms = [OURS, QEMU];
    let env = vec![
        ("PVRDMA_VMM_BIN".to_string(), vmm.display().to_string()),
        ("VMMS".to_string(), vmms.join(" ")),
        ("DATA_MB".to_string(), args.mb.to_string()),
        ("BENCH_ROUNDS".to_string(), args.rounds.to_string()),
        ("MTU".to_string(), args.mtu.to_string()),
    ];
    // Per pair: ~60 s to boot and generate data, then the rounds (~5 s/MiB at MTU 1500 nested).
    let per_pair = 120 + u64::from(args.rounds) * u64::from(args.mb) * 8;
    let scenario = Scenario {
        name: "bench-net".to_string(),
        env: env
            .into_iter()
            .chain([("BENCH_LIMIT".to_string(), per_pair.to_string())])
            .collect(),
        timeout: Duration::from_secs(60 + 2 * (per_pair + 60)),
        // Two L2 guests at a time: single-threaded TCG (see Hosts::One).
        hosts: Hosts::One { l1_cpus: 1 },
    };
    let outcome = bench::run_scenario(&scenario, &assets)?;
    let tsv = outcome.read("bench.tsv")?;
    let rounds = parse_tsv(&tsv);

    println!(
        "TCP B->A, {} MiB x {} rounds per VMM, MTU {}, mode {} (guest-clock seconds):",
        args.mb, args.rounds, args.mtu, outcome.mode
    );
    let mut medians = BTreeMap::new();
    for vmm in vmms {
        let all = rounds.get(vmm).map(Vec::as_slice).unwrap_or_default();
        let good: Vec<&Round> = all.iter().filter(|r| r.intact).collect();
        let mut rates: Vec<f64> = good
            .iter()
            .map(|r| r.bytes as f64 / (1024.0 * 1024.0) / r.secs)
            .collect();
        rates.sort_by(f64::total_cmp);
        let errors = all
            .iter()
            .filter_map(|r| r.csum_errors)
            .max()
            .map_or("n/a".to_string(), |n| n.to_string());
        if rates.is_empty() {
            println!(
                "  {vmm:<10} no intact round of {} (see {})",
                args.rounds,
                outcome.dir.display()
            );
            continue;
        }
        let m = median(&rates);
        println!(
            "  {vmm:<10} median {m:7.3} MiB/s  min {:7.3}  max {:7.3}  ({} intact rounds of {}; TCP segments with a bad checksum at the receiver: {errors})",
            rates[0],
            rates[rates.len() - 1],
            rates.len(),
            args.rounds
        );
        medians.insert(vmm, m);
    }
    bench::ratio_to_baseline(
        &medians,
        (OURS, QEMU),
        (
            "throughput ratio ",
            &format!(" (higher is better for {OURS})"),
            "intact round",
        ),
        &outcome.context(),
    )
}

/// bench.tsv lines: vmm, round, bytes, seconds, md5 match (1/0), bad checksums so far (or NA).
fn parse_tsv(tsv: &str) -> BTreeMap<String, Vec<Round>> {
    let mut rounds: BTreeMap<String, Vec<Round>> = BTreeMap::new();
    for line in tsv.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        if let [vmm, _round, bytes, secs, intact, errors] = fields.as_slice() {
            if let (Ok(bytes), Ok(secs)) = (bytes.parse::<u64>(), secs.parse::<f64>()) {
                if secs > 0.0 {
                    rounds.entry((*vmm).to_string()).or_default().push(Round {
                        secs,
                        bytes,
                        intact: *intact == "1",
                        csum_errors: errors.parse().ok(),
                    });
                }
            }
        }
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_args(s: &str) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("bench-net").chain(s.split_whitespace()))
    }

    #[test]
    fn arguments_have_defaults_and_are_checked() {
        assert_eq!(
            parse_args("").ok(),
            Some(Args {
                mb: 16,
                rounds: 3,
                mtu: 1500
            })
        );
        assert_eq!(
            parse_args("--mtu 9000 --mb 64").ok(),
            Some(Args {
                mb: 64,
                rounds: 3,
                mtu: 9000
            })
        );
        assert!(parse_args("--mtu 4000").is_err());
        assert!(parse_args("--rounds 0").is_err());
        assert!(parse_args("--rounds").is_err());
        assert!(parse_args("--what 3").is_err());
    }

    #[test]
    fn tsv_rounds_keep_integrity_and_errors() {
        let tsv = "pvrdma-vmm\t1\t1048576\t2.00\t1\t5\nqemu\t1\t1048576\t4.00\t0\tNA\nbad line\n\
                   qemu\t2\t1048576\t0\t1\t0\n";
        let r = parse_tsv(tsv);
        assert_eq!(
            r["pvrdma-vmm"],
            vec![Round {
                secs: 2.0,
                bytes: 1048576,
                intact: true,
                csum_errors: Some(5)
            }]
        );
        assert_eq!(r["qemu"].len(), 1);
        assert!(!r["qemu"][0].intact);
        assert_eq!(r["qemu"][0].csum_errors, None);
    }
}

// SPDX-License-Identifier: Apache-2.0
//! Boot benchmark (issue 2 baseline): time from VMM start to the guest's first `/init` line, our
//! VMM against QEMU's microvm, same kernel + initramfs, same test host; medians and their ratio.
//!
//! Usage: `cargo run --release -p e2e --bin bench-boot -- [--runs N]` (default 5 measured runs
//! per VMM after one warm-up). Without a built pvrdma-vmm it measures QEMU alone and says why.
//! Inside the nested test host every figure is ~50x native: only the ratio means something.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use e2e::bench::{self, median};
use e2e::testhost::{Hosts, Scenario};
use e2e::{assets, binaries};

const QEMU: &str = "qemu-microvm";
const OURS: &str = "pvrdma-vmm";

fn main() -> ExitCode {
    bench::exit("bench-boot", run(Args::parse()))
}

/// Time to the guest's first `/init` line: our VMM against QEMU's microvm.
#[derive(Parser, Debug)]
#[command(name = "bench-boot")]
struct Args {
    /// Measured boots per VMM, after one warm-up.
    #[arg(long, default_value_t = 5, value_parser = bench::positive)]
    runs: u32,
}

fn run(Args { runs }: Args) -> Result<(), String> {
    let assets = assets::get().map_err(|e| e.to_string())?;
    let mut vmms = vec![QEMU];
    let mut env = Vec::new();
    match binaries::vmm() {
        Ok(vmm) => {
            vmms.push(OURS);
            env.push(("PVRDMA_VMM_BIN".to_string(), vmm.display().to_string()));
        }
        Err(e) => eprintln!("bench-boot: {OURS} not measured: {e}"),
    }
    env.push(("RUNS".to_string(), runs.to_string()));
    env.push(("VMMS".to_string(), vmms.join(" ")));
    let boots = u64::from(runs + 1) * vmms.len() as u64;
    let scenario = Scenario {
        name: "bench-boot".to_string(),
        env,
        timeout: Duration::from_secs(60 + boots * 300),
        // Several L2 guests in one L1: single-threaded TCG (see Hosts::One).
        hosts: Hosts::One { l1_cpus: 1 },
    };
    let outcome = bench::run_scenario(&scenario, &assets)?;
    let tsv = outcome.read("bench.tsv")?;
    let samples = measured_samples(&tsv);

    println!(
        "boot to first /init line, {runs} runs after a warm-up, mode {}:",
        outcome.mode
    );
    let mut medians = BTreeMap::new();
    for vmm in &vmms {
        match samples.get(*vmm).filter(|s| !s.is_empty()) {
            Some(s) => {
                let m = median(s);
                println!(
                    "  {vmm:<13} median {m:7.3} s  min {:7.3}  max {:7.3}  ({} good runs of {runs})",
                    s[0],
                    s[s.len() - 1],
                    s.len()
                );
                medians.insert(*vmm, m);
            }
            None => println!("  {vmm:<13} no good run (see {})", outcome.dir.display()),
        }
    }
    bench::ratio_to_baseline(
        &medians,
        (OURS, QEMU),
        ("ratio ", "", "good run"),
        &outcome.context(),
    )
}

/// Seconds to the init marker per VMM, sorted, for the measured runs (run >= 1) that reached the
/// marker and exited 0.
fn measured_samples(tsv: &str) -> BTreeMap<String, Vec<f64>> {
    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for line in tsv.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        if let [vmm, run, init, _exit_s, "0"] = fields.as_slice() {
            if let (Ok(run), Ok(init)) = (run.parse::<u32>(), init.parse::<f64>()) {
                if run >= 1 {
                    samples.entry((*vmm).to_string()).or_default().push(init);
                }
            }
        }
    }
    for s in samples.values_mut() {
        s.sort_by(f64::total_cmp);
    }
    samples
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_skip_warm_up_failures_and_missing_markers() {
        let tsv = "qemu-microvm\t0\t9.0\t10\t0\nqemu-microvm\t1\t3.0\t4\t0\nqemu-microvm\t2\t2.0\t3\t0\n\
                   pvrdma-vmm\t1\tNA\t300\ttimeout\npvrdma-vmm\t2\t5.0\t6\t1\npvrdma-vmm\t3\t4.0\t5\t0\n";
        let s = measured_samples(tsv);
        assert_eq!(s["qemu-microvm"], vec![2.0, 3.0]);
        assert_eq!(s["pvrdma-vmm"], vec![4.0]);
    }
}

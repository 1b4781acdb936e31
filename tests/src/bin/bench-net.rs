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
//!
//! Issue 15 goal 5 (no round below half the median): the scenario samples both TAPs' packet
//! counters and our VMMs' vmxnet3 counters (`vm.counters`) about every second, and a round below
//! half its VMM's median is printed with its per-second trace (`--trace` prints every round's),
//! so that a stall shows which side stopped: the sender's frames, the receiver's interrupts, its
//! receive buffers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use api::VmCounters;
use clap::Parser;
use e2e::bench::{self, median};
use e2e::testhost::{self, Hosts, Scenario};
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
    /// Print every round's per-second trace, not only those of rounds below half the median.
    #[arg(long)]
    trace: bool,
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
    round: u32,
    secs: f64,
    bytes: u64,
    intact: bool,
    /// TCP segments A received with a bad checksum since it booted (cumulative).
    csum_errors: Option<u64>,
}

fn run(args: Args) -> Result<(), String> {
    let assets = assets::get().map_err(|e| e.to_string())?;
    let bins = binaries::locate().map_err(|e| e.to_string())?;
    let vmms = [OURS, QEMU];
    let env = vec![
        (
            binaries::VMM_ENV.to_string(),
            bins.vmm.display().to_string(),
        ),
        (
            binaries::REMOTE_ENV.to_string(),
            bins.remote.display().to_string(),
        ),
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
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (out, stop) = (testhost::out_dir(&scenario.name), stop.clone());
        thread::spawn(move || sample_host(&out, &vmms, &stop))
    };
    let outcome = bench::run_scenario(&scenario, &assets);
    stop.store(true, Ordering::Relaxed);
    let host = sampler.join().unwrap_or_default();
    let outcome = outcome?;
    let tsv = outcome.read("bench.tsv")?;
    let rounds = parse_tsv(&tsv);
    let trace_tsv = outcome.read("bench-trace.tsv").unwrap_or_default();
    let trace = parse_trace(&trace_tsv);
    if trace.len() < trace_tsv.lines().count() {
        println!(
            "  WARNING: {} of the {} lines of bench-trace.tsv are not in the expected format",
            trace_tsv.lines().count() - trace.len(),
            trace_tsv.lines().count()
        );
    }

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
        println!(
            "    rounds (s): {}",
            all.iter()
                .map(|r| format!("{:.2}", r.secs))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let samples: Vec<&Sample> = trace.iter().filter(|t| t.vmm == vmm).collect();
        let vmm_index = usize::from(vmm == QEMU);
        for r in good {
            let rate = r.bytes as f64 / (1024.0 * 1024.0) / r.secs;
            let slow = rate < m / 2.0;
            let cpu = host_cpu(&host, vmm_index, r.round).map_or(String::new(), |(l1, busy)| {
                format!(
                    "; the test host had {l1:.2} of a CPU, this host's CPUs were {:.0}% busy",
                    busy * 100.0
                )
            });
            println!(
                "    round {}: {rate:.3} MiB/s, {:.2} of the median{cpu}{}",
                r.round,
                rate / m,
                if slow { ": BELOW HALF THE MEDIAN" } else { "" }
            );
            if slow || args.trace {
                print_trace(&samples, r.round);
            }
        }
        medians.insert(vmm, m);
    }
    println!(
        "  (per-second traces: {}; `--trace` prints every round's)",
        outcome.file("bench-trace.tsv").display()
    );
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
        if let [vmm, round, bytes, secs, intact, errors] = fields.as_slice() {
            if let (Ok(round), Ok(bytes), Ok(secs)) =
                (round.parse(), bytes.parse::<u64>(), secs.parse::<f64>())
            {
                if secs > 0.0 {
                    rounds.entry((*vmm).to_string()).or_default().push(Round {
                        round,
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

/// A sample of this host while the scenario runs: when, this host's CPU ticks (busy, idle; all
/// CPUs), the test host's (its QEMU's user + system ticks; 0 before it started) and the rounds
/// each pair's guest B has sent (None before that pair started).
#[derive(Debug, Clone, PartialEq)]
struct HostSample {
    at: Duration,
    busy: u64,
    idle: u64,
    l1: u64,
    sent: [Option<u32>; 2],
}

/// This host's busy and idle ticks, from /proc/stat.
fn host_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let idle = ticks.get(3)? + ticks.get(4)?;
    let busy = ticks.iter().take(8).sum::<u64>() - idle;
    Some((busy, idle))
}

/// The user + system ticks of the process whose pid is in `pidfile` (fields 14 and 15 of its
/// stat, after the parenthesised name).
fn process_ticks(pidfile: &Path) -> Option<u64> {
    let pid = std::fs::read_to_string(pidfile).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Samples this host every second until `stop`: its CPU, the test host's (`out`/qemu-l1.pid) and
/// how many rounds each pair's B has printed to its console (`out`/bench-VMM-b-serial.log, which
/// the test host writes here as it goes). The test host's share of a CPU tells a round that was
/// slow because this host starved it from one slow inside it.
fn sample_host(out: &Path, vmms: &[&str; 2], stop: &AtomicBool) -> Vec<HostSample> {
    let start = Instant::now();
    let mut samples = Vec::new();
    let logs: Vec<PathBuf> = vmms
        .iter()
        .map(|v| out.join(format!("bench-{v}-b-serial.log")))
        .collect();
    while !stop.load(Ordering::Relaxed) {
        if let Some((busy, idle)) = host_ticks() {
            let sent = [0, 1].map(|i| {
                let log = std::fs::read(logs.get(i)?).ok()?;
                let text = String::from_utf8_lossy(&log);
                u32::try_from(text.matches("NET-TCP-SENT round=").count()).ok()
            });
            samples.push(HostSample {
                at: start.elapsed(),
                busy,
                idle,
                l1: process_ticks(&out.join("qemu-l1.pid")).unwrap_or(0),
                sent,
            });
        }
        thread::sleep(Duration::from_secs(1));
    }
    samples
}

/// Round `round` of the pair `vmm` (0: ours, 1: QEMU's) as this host saw it: the test host's
/// share of one CPU and this host's busy share, over the intervals between samples taken while
/// that B had sent `round - 1` rounds (the first includes the pair's boot). Ticks are USER_HZ, 100
/// on Linux.
fn host_cpu(samples: &[HostSample], vmm: usize, round: u32) -> Option<(f64, f64)> {
    let (mut secs, mut l1, mut busy, mut total) = (0.0, 0u64, 0u64, 0u64);
    for pair in samples.windows(2) {
        let [a, b] = pair else { continue };
        let want = Some(round.checked_sub(1)?);
        if a.sent.get(vmm).copied().flatten() != want || b.sent.get(vmm).copied().flatten() != want
        {
            continue;
        }
        secs += (b.at.saturating_sub(a.at)).as_secs_f64();
        l1 += b.l1.saturating_sub(a.l1);
        busy += b.busy.saturating_sub(a.busy);
        total += (b.busy + b.idle).saturating_sub(a.busy + a.idle);
    }
    (secs > 0.0 && total > 0).then(|| (l1 as f64 / 100.0 / secs, busy as f64 / total as f64))
}

/// The vmxnet3 counters a trace shows, per guest: the frames each way, the frames dropped for
/// want of a receive buffer, and the interrupts sent and held back by the vector's mask.
const TRACED: [&str; 5] = [
    "tx_frames",
    "rx_frames",
    "rx_no_buffer",
    "intr_fired",
    "intr_held",
];

/// One line of bench-trace.tsv (see tests/scenarios/bench-net.sh).
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    vmm: String,
    /// Microseconds since the pair started (the test host's clock).
    us: u64,
    /// Rounds B had sent and A had received (and checked) by then.
    sent: u32,
    received: u32,
    /// tapa rx, tapa tx, tapb rx, tapb tx packets (a TAP's tx is what its guest receives).
    taps: [u64; 4],
    /// The test host's busy and idle ticks (its /proc/stat).
    l1: [u64; 2],
    /// [`TRACED`] of A's and B's vmxnet3 (our VMM only; zeros where a counter is missing).
    nics: Option<[[u64; TRACED.len()]; 2]>,
}

/// [`TRACED`] of the first vmxnet3 in a `vm.counters` answer.
fn nic_counters(json: &str) -> Option<[u64; TRACED.len()]> {
    let c: VmCounters = serde_json::from_str(json).ok()?;
    let nic = c.devices.iter().find(|d| d.kind == "vmxnet3")?;
    Some(TRACED.map(|name| nic.counters.get(name).copied().unwrap_or(0)))
}

fn parse_trace(tsv: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in tsv.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        let [vmm, numbers @ .., a, b] = fields.as_slice() else {
            continue;
        };
        let Some([us, sent, received, t0, t1, t2, t3, busy, idle]) = bench::u64_fields(numbers)
        else {
            continue;
        };
        let (Ok(sent), Ok(received)) = (u32::try_from(sent), u32::try_from(received)) else {
            continue;
        };
        let nics = nic_counters(a).zip(nic_counters(b)).map(|(a, b)| [a, b]);
        samples.push(Sample {
            vmm: (*vmm).to_string(),
            us,
            sent,
            received,
            taps: [t0, t1, t2, t3],
            l1: [busy, idle],
            nics,
        });
    }
    samples
}

/// One interval of a round's trace.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    /// Its end, in seconds since the pair started.
    end: f64,
    /// A was still checking the previous round when it began (B waits for its signal).
    checking: bool,
    /// The test host's busy share of its CPU.
    busy: f64,
    /// Each counter's rate per second: the taps, then A's and B's [`TRACED`].
    rates: Vec<f64>,
}

/// The rows of round `round`'s trace: one per interval between two samples taken while B had
/// sent `round - 1` rounds (the interval in which it finished the round included).
fn round_rates(samples: &[&Sample], round: u32) -> Vec<Row> {
    let mut rows = Vec::new();
    for pair in samples.windows(2) {
        let [prev, next] = pair else { continue };
        if prev.sent + 1 != round || next.us <= prev.us {
            continue;
        }
        let dt = (next.us - prev.us) as f64 / 1e6;
        let per_sec = |a: u64, b: u64| b.saturating_sub(a) as f64 / dt;
        let mut rates: Vec<f64> = prev
            .taps
            .iter()
            .zip(&next.taps)
            .map(|(a, b)| per_sec(*a, *b))
            .collect();
        if let (Some(p), Some(n)) = (prev.nics, next.nics) {
            for (pn, nn) in p.iter().zip(&n) {
                rates.extend(pn.iter().zip(nn).map(|(a, b)| per_sec(*a, *b)));
            }
        }
        let busy = next.l1[0].saturating_sub(prev.l1[0]);
        let idle = next.l1[1].saturating_sub(prev.l1[1]);
        rows.push(Row {
            end: next.us as f64 / 1e6,
            checking: prev.received < prev.sent,
            busy: busy as f64 / (busy + idle).max(1) as f64,
            rates,
        });
    }
    rows
}

fn print_trace(samples: &[&Sample], round: u32) {
    let rows = round_rates(samples, round);
    if rows.is_empty() {
        println!("      (no trace samples for this round)");
        return;
    }
    let mut header = vec![
        "tapa rx".to_string(),
        "tapa tx".to_string(),
        "tapb rx".to_string(),
        "tapb tx".to_string(),
    ];
    if rows.iter().any(|r| r.rates.len() > header.len()) {
        for guest in ["A", "B"] {
            header.extend(TRACED.map(|c| format!("{guest} {c}")));
        }
    }
    println!(
        "      per second, t = end of the interval in s since the pair started (tapX rx: from guest X; tx: to it; \
         * = A still checking the previous round; busy: the test host's CPU)"
    );
    println!(
        "      {:>7} {:>5} {}",
        "t",
        "busy",
        header
            .iter()
            .map(|h| format!("{h:>15}"))
            .collect::<String>()
    );
    for row in rows {
        println!(
            "      {:6.1}{} {:4.0}% {}",
            row.end,
            if row.checking { "*" } else { " " },
            row.busy * 100.0,
            row.rates
                .iter()
                .map(|r| format!("{r:15.0}"))
                .collect::<String>()
        );
    }
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
                mtu: 1500,
                trace: false
            })
        );
        assert_eq!(
            parse_args("--mtu 9000 --mb 64").ok(),
            Some(Args {
                mb: 64,
                rounds: 3,
                mtu: 9000,
                trace: false
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
                round: 1,
                secs: 2.0,
                bytes: 1048576,
                intact: true,
                csum_errors: Some(5)
            }]
        );
        assert_eq!(r["qemu"].len(), 1);
        assert_eq!(r["qemu"][0].round, 1);
        assert!(!r["qemu"][0].intact);
        assert_eq!(r["qemu"][0].csum_errors, None);
    }

    fn counters_json(rx: u64, fired: u64) -> String {
        format!(
            r#"{{"devices":[{{"kind":"virtio-blk","id":"disk0","pci":"00:01.0","counters":{{"rx_frames":7}}}},
            {{"kind":"vmxnet3","id":"net0","mac":"52:54:00:0a:00:01","pci":"00:02.0",
            "counters":{{"tx_frames":5,"rx_frames":{rx},"rx_no_buffer":0,"intr_fired":{fired},"intr_held":1}}}}],
            "migration":null}}"#
        )
        .replace(['\n', ' '], "")
    }

    #[test]
    fn trace_rows_are_per_second_rates_of_the_round_in_progress() {
        let line = |us: u64, sent: u32, received: u32, tap: u64, rx: u64| {
            format!(
                "pvrdma-vmm\t{us}\t{sent}\t{received}\t{tap}\t0\t0\t0\t{us}\t{us}\t{}\t{}\n",
                counters_json(rx, rx / 2),
                counters_json(0, 0)
            )
        };
        let tsv = [
            line(0, 0, 0, 0, 0),
            line(1_000_000, 0, 0, 100, 400),
            line(3_000_000, 0, 0, 500, 800),
            line(4_000_000, 1, 0, 600, 900),
            line(5_000_000, 1, 1, 700, 1000),
            "qemu\t0\t0\t0\t1\t2\t3\t4\t5\t6\t-\t-\nqemu\tx\t0\t0\t1\t2\t3\t4\t5\t6\t-\t-\n"
                .to_string(),
        ]
        .concat();
        let all = parse_trace(&tsv);
        assert_eq!(all.len(), 6, "the line with a bad time is skipped");
        let ours: Vec<&Sample> = all.iter().filter(|s| s.vmm == OURS).collect();
        let rows = round_rates(&ours, 1);
        assert_eq!(
            rows.len(),
            3,
            "round 1: the intervals from the samples with 0 rounds sent"
        );
        assert_eq!(rows[1].end, 3.0);
        // tapa rx: 400 packets in 2 s; A's rx_frames (4 + 0) and intr_fired (5 + 1).
        assert_eq!(rows[1].rates[0], 200.0);
        assert_eq!(rows[1].rates[4 + 1], 200.0);
        assert_eq!(rows[1].rates[4 + 3], 100.0);
        assert_eq!(rows[1].rates.len(), 4 + 2 * TRACED.len());
        assert_eq!(rows[1].busy, 0.5);
        let round2 = round_rates(&ours, 2);
        assert_eq!(round2.len(), 1);
        assert!(round2[0].checking, "A had not checked round 1 yet");
        let qemu: Vec<&Sample> = all.iter().filter(|s| s.vmm == QEMU).collect();
        assert_eq!(qemu[0].nics, None, "QEMU's samples have the taps only");
        assert!(round_rates(&qemu, 1).is_empty());
    }

    #[test]
    fn host_cpu_is_the_test_hosts_share_during_the_round() {
        let sample =
            |secs: u64, busy: u64, idle: u64, l1: u64, sent: [Option<u32>; 2]| HostSample {
                at: Duration::from_secs(secs),
                busy,
                idle,
                l1,
                sent,
            };
        let samples = [
            sample(0, 0, 0, 0, [None, None]),
            sample(1, 100, 100, 50, [Some(0), None]),
            sample(3, 300, 100, 150, [Some(0), None]),
            sample(4, 350, 150, 180, [Some(1), None]),
            sample(6, 550, 150, 200, [Some(8), Some(0)]),
            sample(8, 750, 150, 220, [Some(8), Some(0)]),
        ];
        // Ours, round 1: 2 s in which the test host used 100 ticks (half a CPU) and this host's
        // CPUs were all busy.
        assert_eq!(host_cpu(&samples, 0, 1), Some((0.5, 1.0)));
        assert_eq!(host_cpu(&samples, 0, 2), None, "one sample only");
        assert_eq!(host_cpu(&samples, 1, 1), Some((0.1, 1.0)));
        assert_eq!(host_cpu(&samples, 0, 0), None);
    }
}

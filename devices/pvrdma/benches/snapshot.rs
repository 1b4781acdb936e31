// SPDX-License-Identifier: Apache-2.0
//! Device migration time against the number of QPs (issue 16, goal 2): a
//! simulated driver brings N RC QPs to RTS, connected to N QPs of a peer
//! device, every 16 of them sharing a CQ and an MR, and sends a message
//! on a sample of them; then the device is paused, snapshotted, encoded,
//! decoded and restored into a new device (`SimDriver::migrate_timed`),
//! several times over, and the sample's traffic checked again. Baseline
//! in the same run: encoding and decoding the same snapshot alone (what
//! any state transfer costs); figures are medians. Wall times, and this
//! thread's CPU time for the same stages (on a loaded machine the wall
//! times swing several-fold with the other work; the CPU times do not).
//! Under each row, every round's restore step line (the device's log:
//! each step's minor page faults, the bytes the decode allocated).
//! A's QPs stay the same from the later restore hint (taken just before
//! the pause, as a VMM takes it) to the save, so the restore takes them as
//! decoded ahead; with `busy`, every one of them changes in between
//! (`Fleet::migrate_a_timed_busy`), and all come in the state.
//! Run: `cargo bench -p pvrdma --bench snapshot [-- [busy] QPS...]`.

use std::sync::Mutex;
use std::time::Duration;

use pvrdma::sim_driver::fleet::Fleet;

/// Migrations per QP count (the median is printed).
const ROUNDS: usize = 7;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Keeps the device's restore step lines, to print under the row.
struct StepLines(Mutex<Vec<String>>);

impl log::Log for StepLines {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }

    fn log(&self, r: &log::Record) {
        let line = r.args().to_string();
        if let Some(steps) = line.strip_prefix("pvrdma: restore steps: ") {
            self.0.lock().unwrap().push(steps.to_owned());
        }
    }

    fn flush(&self) {}
}

static STEPS: StepLines = StepLines(Mutex::new(Vec::new()));

fn main() {
    log::set_logger(&STEPS).unwrap();
    log::set_max_level(log::LevelFilter::Info);
    let busy = std::env::args().any(|a| a == "busy");
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let counts = if counts.is_empty() {
        vec![1024, 4096]
    } else {
        counts
    };
    let qps = if busy {
        "A's QPs changed after the later hint"
    } else {
        "A's QPs the same since the later hint"
    };
    println!("{qps}");
    println!(
        "QPs    state bytes  pause+save   encode   decode     plug  restore  | migrate  encode+decode alone  ratio  | CPU: migrate  encode+decode  ratio"
    );
    for n in counts {
        let mut fleet = Fleet::new(n);
        let sample: Vec<usize> = (0..n).step_by(n.div_ceil(64).max(1)).collect();
        fleet.exchange(&sample, 0);
        STEPS.0.lock().unwrap().clear();
        let mut rounds = Vec::new();
        for round in 0..ROUNDS {
            let (f, times) = if busy {
                fleet.migrate_a_timed_busy(round as u8)
            } else {
                fleet.migrate_a_timed()
            };
            fleet = f;
            fleet.exchange(&sample, round as u8 + 1);
            rounds.push(times);
        }
        let med = |f: fn(&pvrdma::sim_driver::MigrateTimes) -> Duration| {
            median(rounds.iter().map(f).collect())
        };
        let total = med(|t| t.save + t.encode + t.decode + t.restore);
        let codec = med(|t| t.encode + t.decode);
        let (cpu, cpu_codec) = (med(|t| t.cpu_migrate), med(|t| t.cpu_codec));
        println!(
            "{n:<5} {:>12} {:>8.2} ms {:>5.2} ms {:>5.2} ms {:>5.2} ms {:>5.2} ms  | {:>5.2} ms  {:>16.2} ms  {:>5.2}  | {:>9.2} ms  {:>10.2} ms  {:>5.2}",
            rounds.first().map_or(0, |t| t.bytes),
            ms(med(|t| t.save)),
            ms(med(|t| t.encode)),
            ms(med(|t| t.decode)),
            ms(med(|t| t.plug)),
            ms(med(|t| t.restore)),
            ms(total),
            ms(codec),
            total.as_secs_f64() / codec.as_secs_f64().max(1e-9),
            ms(cpu),
            ms(cpu_codec),
            cpu.as_secs_f64() / cpu_codec.as_secs_f64().max(1e-9),
        );
        for (round, steps) in STEPS.0.lock().unwrap().drain(..).enumerate() {
            println!("  restore {}: {steps}", round + 1);
        }
    }
}

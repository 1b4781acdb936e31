// SPDX-License-Identifier: Apache-2.0
//! What the benchmark binaries (`src/bin/bench-*.rs`) share: the median of their samples, the
//! host's load around a run, the failures a pair of guests recorded in the scenario's `bench.env`
//! (read with [`crate::results::KeyValues`]), and the closing list of failures that makes a bench
//! exit non-zero.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use crate::assets::Assets;
use crate::testhost::{self, Outcome, Scenario};

/// A benchmark's exit: 0 when `result` is Ok, else its error on stderr under the bench's `name`.
pub fn exit(name: &str, result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a bench's scenario in a test host: its outcome, or an error if it could not run or
/// did not exit 0.
pub fn run_scenario(scenario: &Scenario, assets: &Assets) -> Result<Outcome, String> {
    let outcome = testhost::run(scenario, assets).map_err(|e| e.to_string())?;
    if outcome.exit_code != Some(0) {
        return Err(format!("scenario failed\n{}", outcome.context()));
    }
    Ok(outcome)
}

/// A count of one or more, for the benchmarks' numeric arguments.
pub fn positive(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{s}: expected a positive number")),
    }
}

/// Median of a sorted, non-empty slice.
pub fn median(sorted: &[f64]) -> f64 {
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

/// `fields` as `N` integers: None unless there are exactly `N` and each parses (a sampler's line
/// cut short when it was killed mid-write is skipped, not misread).
pub fn u64_fields<const N: usize>(fields: &[&str]) -> Option<[u64; N]> {
    let values: Vec<u64> = fields
        .iter()
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    values.try_into().ok()
}

/// This host's /proc/loadavg (its three load averages).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or("?".to_string(), |s| {
        s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    })
}

/// What went wrong with one pair of guests (`label`), from its `bench.env` results as `get`
/// gives them ("?" when missing): either VMM's exit status (`a_exit`, `b_exit`), VMM panics
/// (`panics`) and a guest set-up failure (`fail`).
pub fn pair_failures<'a>(label: &str, get: impl Fn(&str) -> &'a str) -> Vec<String> {
    let mut failures = Vec::new();
    for key in ["a_exit", "b_exit"] {
        if get(key) != "0" {
            failures.push(format!("{label}: VMM {key} = {}", get(key)));
        }
    }
    if get("panics") != "0" {
        failures.push(format!("{label}: {} VMM panics", get("panics")));
    }
    if !get("fail").is_empty() {
        failures.push(format!("{label}: guest set-up failed: {}", get("fail")));
    }
    failures
}

/// Prints `failures` below the figures and turns them into the bench's error: "N `what` failed
/// (logs: `out`)"; `Ok` when there are none.
pub fn report_failures(failures: &[String], what: &str, out: &Path) -> Result<(), String> {
    if failures.is_empty() {
        return Ok(());
    }
    println!(
        "!!! FAILED: {} problem(s), the figures above are incomplete:",
        failures.len()
    );
    for f in failures {
        println!("!!!   {f}");
    }
    Err(format!(
        "{} {what} failed (logs: {})",
        failures.len(),
        out.display()
    ))
}

/// Prints the ratio `ours` / `baseline` of `medians` as "  `what` ours / baseline: R`note`" (n/a
/// without both), and fails when the baseline has no figure: without it the run measured nothing
/// ("`baseline` produced no `sample`: the baseline is missing", then `context`).
pub fn ratio_to_baseline(
    medians: &BTreeMap<&str, f64>,
    (ours, baseline): (&str, &str),
    (what, note, sample): (&str, &str, &str),
    context: &str,
) -> Result<(), String> {
    match (medians.get(ours), medians.get(baseline)) {
        (Some(o), Some(b)) => println!("  {what}{ours} / {baseline}: {:.2}{note}", o / b),
        _ => println!("  {what}{ours} / {baseline}: n/a"),
    }
    if medians.contains_key(baseline) {
        Ok(())
    } else {
        Err(format!(
            "{baseline} produced no {sample}: the baseline is missing\n{context}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_without_its_baseline_fails_the_bench() {
        let names = ("ours", "base");
        let labels = ("ratio ", "", "good run");
        let both = BTreeMap::from([("ours", 2.0), ("base", 1.0)]);
        assert_eq!(ratio_to_baseline(&both, names, labels, "ctx"), Ok(()));
        let ours_only = BTreeMap::from([("ours", 2.0)]);
        let err = ratio_to_baseline(&ours_only, names, labels, "ctx").unwrap_err();
        assert!(err.starts_with("base produced no good run"), "{err}");
        let base_only = BTreeMap::from([("base", 1.0)]);
        assert_eq!(ratio_to_baseline(&base_only, names, labels, "ctx"), Ok(()));
    }

    #[test]
    fn fields_are_integers_exactly_as_many_as_asked() {
        assert_eq!(u64_fields(&["1", "20", "300"]), Some([1, 20, 300]));
        assert_eq!(u64_fields::<3>(&["1", "20"]), None);
        assert_eq!(u64_fields::<2>(&["1", "20", "300"]), None);
        assert_eq!(u64_fields::<2>(&["1", "-2"]), None);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[1.0, 2.0, 9.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), 3.0);
    }

    #[test]
    fn a_pair_fails_on_exits_panics_and_set_up() {
        let ok = |k: &str| if k == "fail" { "" } else { "0" };
        assert!(pair_failures("p", ok).is_empty());
        let bad = |k: &str| match k {
            "b_exit" => "?",
            "panics" => "2",
            "fail" => "no GID",
            _ => "0",
        };
        assert_eq!(
            pair_failures("p", bad),
            [
                "p: VMM b_exit = ?",
                "p: 2 VMM panics",
                "p: guest set-up failed: no GID"
            ]
        );
    }

    #[test]
    fn failures_fail_the_bench() {
        assert_eq!(report_failures(&[], "runs", Path::new("/o")), Ok(()));
        let e = report_failures(&["x".into(), "y".into()], "runs", Path::new("/o")).unwrap_err();
        assert_eq!(e, "2 runs failed (logs: /o)");
    }
}

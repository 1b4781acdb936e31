// SPDX-License-Identifier: Apache-2.0
//! What the benchmark binaries (`src/bin/bench-*.rs`) share: the median of their samples, the
//! host's load around a run, the scenario's `bench.env`, and the closing list of failures that
//! makes a bench exit non-zero.

use std::collections::BTreeMap;
use std::path::Path;

/// Median of a sorted, non-empty slice.
pub fn median(sorted: &[f64]) -> f64 {
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

/// This host's /proc/loadavg (its three load averages).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or("?".to_string(), |s| {
        s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    })
}

/// bench.env: key=value lines.
pub fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[1.0, 2.0, 9.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), 3.0);
    }

    #[test]
    fn env_lines_without_an_equals_sign_are_skipped() {
        let e = parse_env("a=1\nb=\nx\nc=d=e\n");
        assert_eq!(e.get("a").map(String::as_str), Some("1"));
        assert_eq!(e.get("b").map(String::as_str), Some(""));
        assert_eq!(e.get("c").map(String::as_str), Some("d=e"));
        assert_eq!(e.len(), 3);
    }

    #[test]
    fn failures_fail_the_bench() {
        assert_eq!(report_failures(&[], "runs", Path::new("/o")), Ok(()));
        let e = report_failures(&["x".into(), "y".into()], "runs", Path::new("/o")).unwrap_err();
        assert_eq!(e, "2 runs failed (logs: /o)");
    }
}

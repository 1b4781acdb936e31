// SPDX-License-Identifier: Apache-2.0
//! Bounded waiting: every wait in the e2e tests has a deadline and says what it waited for.

use std::thread;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// Calls `probe` every `poll` until it returns `Some`, for at most `timeout`.
///
/// The error names `what` and the time waited, so that a timeout reads as a test failure, not a
/// hang.
pub fn wait_until<T>(
    what: &str,
    timeout: Duration,
    poll: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(value) = probe() {
            return Ok(value);
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(Error::new(format!(
                "timed out after {:.1} s waiting for {what}",
                waited.as_secs_f64()
            )));
        }
        thread::sleep(poll.min(timeout - waited));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_first_value_the_probe_yields() {
        let mut calls = 0;
        let got = wait_until("third call", Duration::from_secs(5), Duration::ZERO, || {
            calls += 1;
            (calls == 3).then_some(calls)
        });
        assert_eq!(got, Ok(3));
    }

    #[test]
    fn times_out_with_a_message_naming_the_wait() {
        let err = wait_until(
            "nothing",
            Duration::from_millis(30),
            Duration::from_millis(5),
            || None::<()>,
        )
        .unwrap_err();
        assert!(err.to_string().contains("waiting for nothing"), "{err}");
    }
}

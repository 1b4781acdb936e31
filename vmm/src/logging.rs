// SPDX-License-Identifier: Apache-2.0
//! The VMM's log: env_logger's records on stderr, except while a
//! migration's blackout holds them back.
//!
//! A record is one `write` to stderr, and stderr may be slow: in the test
//! host it is a file on a 9p share without cache, where each write waits
//! for the host (2-4 ms there, more on a loaded host), and the switch-over
//! logs several lines on each side. While a [`Hold`] lives, records are
//! kept in memory, in order, and written when the last hold ends; a
//! migration holds them from the pause until the hand-over is answered,
//! so its own figures are logged after the blackout they measure. The
//! held bytes are bounded ([`MAX_HELD`]): past it they are written out
//! (the buffer first, so the order stays).

use std::io::{self, Write};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Bytes kept back at most; a blackout logs a few KiB.
const MAX_HELD: usize = 1 << 20;

/// Records on their way to `out`.
pub struct Gate<W> {
    state: Mutex<GateState<W>>,
}

struct GateState<W> {
    out: W,
    /// Live [`Hold`]s.
    holds: usize,
    held: Vec<u8>,
}

impl<W: Write> GateState<W> {
    fn write_held(&mut self) -> io::Result<()> {
        let held = std::mem::take(&mut self.held);
        self.out.write_all(&held)
    }
}

impl<W: Write> Gate<W> {
    pub const fn new(out: W) -> Self {
        Self {
            state: Mutex::new(GateState {
                out,
                holds: 0,
                held: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, GateState<W>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps records back until the returned hold (and every other one)
    /// is dropped.
    pub fn hold(&'static self) -> Hold<W> {
        self.lock().holds += 1;
        Hold(self)
    }

    fn release(&self) {
        let mut state = self.lock();
        state.holds = state.holds.saturating_sub(1);
        if state.holds == 0 {
            // Nowhere to report a failed log write.
            let _ = state.write_held();
        }
    }

    /// Writes what is held now, whatever the holds (a panic is about to
    /// end the process).
    pub fn flush_held(&self) {
        let _ = self.lock().write_held();
    }

    fn write_record(&self, bytes: &[u8]) -> io::Result<()> {
        let mut state = self.lock();
        if state.holds > 0 && state.held.len() + bytes.len() <= MAX_HELD {
            state.held.extend_from_slice(bytes);
            return Ok(());
        }
        state.write_held()?;
        state.out.write_all(bytes)
    }
}

/// Ends a hold when dropped; see [`Gate::hold`].
#[must_use = "records are held only while the Hold lives"]
pub struct Hold<W: Write + 'static>(&'static Gate<W>);

impl<W: Write> Drop for Hold<W> {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl<W: Write> std::fmt::Debug for Hold<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hold")
    }
}

/// Standard error, written unbuffered (a `const` stand-in for
/// `io::stderr()`).
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        io::stderr().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

/// The VMM's stderr, behind its gate.
static STDERR: Gate<Stderr> = Gate::new(Stderr);

/// What env_logger writes records to: [`STDERR`]'s gate.
struct GateWriter(&'static Gate<Stderr>);

impl Write for GateWriter {
    /// env_logger hands over a whole record with `write_all`.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_record(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Sets up env_logger at `level` on the gated stderr, and a panic hook
/// that writes held records before the panic message.
pub fn init(level: log::LevelFilter) {
    env_logger::Builder::new()
        .filter_level(level)
        .format_target(false)
        .target(env_logger::Target::Pipe(Box::new(GateWriter(&STDERR))))
        .init();
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        STDERR.flush_held();
        report(info);
    }));
}

/// Holds the VMM's log records back (see the module doc).
pub fn hold() -> Hold<Stderr> {
    STDERR.hold()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> &'static Gate<Vec<u8>> {
        Box::leak(Box::new(Gate::new(Vec::new())))
    }

    fn written(gate: &Gate<Vec<u8>>) -> String {
        String::from_utf8(gate.lock().out.clone()).unwrap()
    }

    /// Held records are written, in order, once the last hold ends.
    #[test]
    fn held_records_come_out_after_the_last_hold() {
        let gate = gate();
        gate.write_record(b"a ").unwrap();
        let first = gate.hold();
        gate.write_record(b"b ").unwrap();
        let second = gate.hold();
        gate.write_record(b"c ").unwrap();
        drop(first);
        assert_eq!(written(gate), "a ");
        drop(second);
        assert_eq!(written(gate), "a b c ");
        gate.write_record(b"d").unwrap();
        assert_eq!(written(gate), "a b c d");
    }

    /// Past the bound, what was held goes out first, then the record.
    #[test]
    fn a_full_hold_writes_through_in_order() {
        let gate = gate();
        let _hold = gate.hold();
        gate.write_record(b"first ").unwrap();
        let big = vec![b'x'; MAX_HELD];
        gate.write_record(&big).unwrap();
        let out = written(gate);
        assert!(out.starts_with("first x"), "{:?}", out.get(..10));
        assert_eq!(out.len(), "first ".len() + MAX_HELD);
        // A panic's flush empties the buffer whatever the holds.
        gate.write_record(b"late").unwrap();
        gate.flush_held();
        assert!(written(gate).ends_with("xlate"));
    }
}

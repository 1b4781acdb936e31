// SPDX-License-Identifier: Apache-2.0
//! Workers without their thread, for tests and fuzz targets (feature
//! `test-utils`).
//!
//! After [`enable`], every worker this thread spawns gets no thread of its
//! own: its loop (the same [`crate::step`] the thread runs) waits until
//! this thread calls [`run_pending`], which hands each such worker the
//! events that are ready, until none is. A harness then drives the device
//! synchronously: ring a doorbell, run the workers, check the result; no
//! waking a thread and waiting for it. The device does what it does on its
//! thread, in the same order per worker; only who runs the loop changes.
//!
//! A worker that waits for something only its spawner can do would wait
//! for ever here (a vmxnet3 worker waits while its device is paused): call
//! [`run_pending`] only while the devices run.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use event_manager::{EventManager, SubscriberId};

use crate::{step, Step, Stoppable};

/// Rounds of [`run_pending`] over all workers before it gives up on a
/// worker that keeps signalling itself (a thread would spin on it; here it
/// would hang the caller).
const MAX_ROUNDS: usize = 1000;

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(false) };
    /// This thread's inline workers, in spawn order.
    static LOOPS: RefCell<Vec<Weak<Mutex<dyn Turn>>>> = const { RefCell::new(Vec::new()) };
}

/// Workers this thread spawns from now on run on it, in [`run_pending`].
pub fn enable() {
    ENABLED.with(|e| e.set(true));
}

/// Whether workers this thread spawns run on it ([`enable`]).
pub fn enabled() -> bool {
    ENABLED.with(Cell::get)
}

/// One turn of a worker's loop, whatever its type.
trait Turn: Send {
    /// Handles the events ready now; `None` once the worker has ended.
    fn turn(&mut self) -> Option<usize>;
}

struct Manager<W: Stoppable> {
    name: &'static str,
    manager: EventManager<W>,
    id: SubscriberId,
    ended: bool,
}

impl<W: Stoppable + Send> Turn for Manager<W> {
    fn turn(&mut self) -> Option<usize> {
        if self.ended {
            return None;
        }
        match step(self.name, &mut self.manager, self.id, 0) {
            Step::Ran(n) => Some(n),
            Step::Ended => {
                self.ended = true;
                None
            }
        }
    }
}

/// An inline worker's loop, owned by its [`crate::WorkerHandle`]; the
/// thread's list holds it weakly, so dropping the handle drops the worker.
pub(crate) struct Loop {
    _turn: Arc<Mutex<dyn Turn>>,
}

impl Drop for Loop {
    /// Takes the loop off its thread's list at once, so that nothing of
    /// the worker outlives its handle (a fuzzer's leak check counts that).
    fn drop(&mut self) {
        // Dropped on another thread, or while this one's list is gone:
        // the list then never held it, or is gone too.
        let _ = LOOPS.try_with(|l| {
            if let Ok(mut l) = l.try_borrow_mut() {
                l.retain(|w| {
                    w.strong_count() > 0 && !std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(&self._turn))
                });
            }
        });
    }
}

impl std::fmt::Debug for Loop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("inline worker loop")
    }
}

impl Loop {
    pub(crate) fn register<W: Stoppable + Send + 'static>(
        name: &'static str,
        manager: EventManager<W>,
        id: SubscriberId,
    ) -> Self {
        let turn: Arc<Mutex<dyn Turn>> = Arc::new(Mutex::new(Manager {
            name,
            manager,
            id,
            ended: false,
        }));
        LOOPS.with(|l| l.borrow_mut().push(Arc::downgrade(&turn)));
        Loop { _turn: turn }
    }
}

/// How many inline workers this thread keeps.
#[cfg(test)]
pub(crate) fn count() -> usize {
    LOOPS.with(|l| l.borrow().len())
}

/// Runs this thread's inline workers until none has an event ready (or
/// [`MAX_ROUNDS`] rounds passed); returns how many events they handled.
pub fn run_pending() -> usize {
    let mut handled = 0usize;
    for _ in 0..MAX_ROUNDS {
        // Workers a turn spawns or drops change the list: take it first.
        let loops: Vec<_> = LOOPS.with(|l| {
            let mut l = l.borrow_mut();
            l.retain(|w| w.strong_count() > 0);
            l.iter().filter_map(Weak::upgrade).collect()
        });
        let round: usize = loops
            .iter()
            .filter_map(|t| t.lock().unwrap_or_else(PoisonError::into_inner).turn())
            .sum();
        if round == 0 {
            break;
        }
        handled = handled.saturating_add(round);
    }
    handled
}

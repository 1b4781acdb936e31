// SPDX-License-Identifier: Apache-2.0
//! The worker thread of a device: one thread per device running an
//! event-manager loop with a single subscriber, the device's worker.
//!
//! The worker watches a kill eventfd of its own and reports, through
//! [`Stoppable::stopped`], that it fired; [`WorkerHandle`] keeps a
//! duplicate of that eventfd and, when dropped, signals it and joins the
//! thread. What the worker watches besides, and what it does, is the
//! device's business.
//!
//! Tests and fuzz targets may instead run the workers a thread spawns on
//! that thread itself (feature `test-utils`, [`inline`]): the same loop,
//! stepped when the caller asks, so that a harness need not wake a thread
//! and wait for it.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

#[cfg(feature = "test-utils")]
pub mod inline;

use std::os::unix::thread::JoinHandleExt;
use std::sync::OnceLock;
use std::thread::{self, JoinHandle};

use event_manager::{EventManager, MutEventSubscriber, SubscriberId, SubscriberOps};
use log::error;
use vmm_sys_util::eventfd::EventFd;

/// A device worker the loop can stop.
pub trait Stoppable: MutEventSubscriber {
    /// The kill eventfd the worker watches (registered in its `init`).
    fn kill_evt(&self) -> &EventFd;
    /// True once the worker saw its kill eventfd fire: the loop ends after
    /// the current round of events.
    fn stopped(&self) -> bool;
    /// Called before each wait for events: the worker may do work that
    /// no descriptor signals (look at shared memory) and says whether the
    /// loop may sleep. The default always sleeps.
    fn before_wait(&mut self) -> Poll {
        Poll::Sleep
    }
}

/// What a worker's [`Stoppable::before_wait`] lets the loop do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll {
    /// Nothing to do: sleep until an event.
    Sleep,
    /// The worker busy-polls: look for events, but do not sleep.
    Spin,
    /// The worker did work: look for events, but do not sleep.
    Worked,
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("Failed to duplicate the kill eventfd")]
    EventFd(#[source] std::io::Error),
    #[error("Failed to create the worker event loop")]
    EventManager(#[source] event_manager::Error),
    #[error("Failed to start the worker thread")]
    Thread(#[source] std::io::Error),
    #[error("Failed to place the worker thread on host CPUs {0:?}")]
    Affinity(Vec<usize>, #[source] std::io::Error),
}

/// What every worker thread runs first, set once by the VMM: its
/// sandbox (a seccomp filter). Devices start workers from several places
/// (at build, on driver activation) and need not know the VMM's policy.
static THREAD_START: OnceLock<fn()> = OnceLock::new();

/// Sets the function each worker thread runs before its loop; the first
/// call wins.
pub fn set_thread_start(start: fn()) {
    let _ = THREAD_START.set(start);
}

/// Owns the worker thread; dropping it stops and joins the thread.
#[derive(Debug)]
pub struct WorkerHandle {
    /// The thread's name, which also prefixes the log messages.
    name: &'static str,
    kill: EventFd,
    thread: Option<JoinHandle<()>>,
    /// The loop when it runs on its spawner's thread (see [`inline`]);
    /// dropping it drops the worker.
    #[cfg(feature = "test-utils")]
    _inline: Option<inline::Loop>,
}

impl WorkerHandle {
    /// Starts `worker` on a new thread called `name`; the handle keeps a
    /// duplicate of the worker's kill eventfd.
    pub fn spawn<W>(name: &'static str, worker: W) -> Result<Self, SpawnError>
    where
        W: Stoppable + Send + 'static,
    {
        Self::spawn_on(name, worker, &[])
    }

    /// [`Self::spawn`], the thread allowed only on host CPUs `cpus` (all
    /// of the process's where empty): an operator keeps a busy-polling
    /// worker off the CPUs of the vCPUs and of other devices' workers. A
    /// set the thread cannot have (no such CPU, none of them in the
    /// process's cpuset) is an error, and the thread is stopped.
    pub fn spawn_on<W>(name: &'static str, worker: W, cpus: &[usize]) -> Result<Self, SpawnError>
    where
        W: Stoppable + Send + 'static,
    {
        let kill = worker.kill_evt().try_clone().map_err(SpawnError::EventFd)?;
        let mut manager = EventManager::new().map_err(SpawnError::EventManager)?;
        let id = manager.add_subscriber(worker);
        #[cfg(feature = "test-utils")]
        if inline::enabled() {
            return Ok(Self {
                name,
                kill,
                thread: None,
                _inline: Some(inline::Loop::register(name, manager, id)),
            });
        }
        let thread = thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || run(name, manager, id))
            .map_err(SpawnError::Thread)?;
        let handle = Self {
            name,
            kill,
            thread: Some(thread),
            #[cfg(feature = "test-utils")]
            _inline: None,
        };
        if let Some(thread) = handle.thread.as_ref().filter(|_| !cpus.is_empty()) {
            // Dropping the handle on error stops and joins the thread.
            pin(thread, cpus).map_err(|e| SpawnError::Affinity(cpus.to_vec(), e))?;
        }
        Ok(handle)
    }
}

/// Allows `thread` only on host CPUs `cpus`.
fn pin(thread: &JoinHandle<()>, cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: `cpu` is below CPU_SETSIZE, the set's size in bits.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: the thread is alive (joined only when the handle drops); the
    // call reads the set passed, of the size passed.
    let rc = unsafe {
        libc::pthread_setaffinity_np(thread.as_pthread_t(), std::mem::size_of_val(&set), &set)
    };
    match rc {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        let name = self.name;
        if let Err(e) = self.kill.write(1) {
            // Joining would hang forever; leave the thread to process exit.
            error!("{name}: failed to stop the worker: {e}");
            return;
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                error!("{name}: worker thread panicked");
            }
        }
    }
}

fn run<W: Stoppable>(name: &str, mut manager: EventManager<W>, id: SubscriberId) {
    if let Some(start) = THREAD_START.get() {
        start();
    }
    while let Step::Ran(_) = step(name, &mut manager, id, -1) {}
}

/// What one turn of a worker's loop did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// It handled this many events and goes on.
    Ran(usize),
    /// The worker stopped, or its loop failed: no more turns.
    Ended,
}

/// One turn of the loop: asks the worker whether it may sleep
/// ([`Stoppable::before_wait`]), then waits up to `timeout_ms` (-1: for
/// ever), or not at all, for events and hands them to the worker.
fn step<W: Stoppable>(
    name: &str,
    manager: &mut EventManager<W>,
    id: SubscriberId,
    timeout_ms: i32,
) -> Step {
    let poll = manager
        .subscriber_mut(id)
        .map_or(Poll::Sleep, |w| w.before_wait());
    let timeout_ms = if poll == Poll::Sleep { timeout_ms } else { 0 };
    let handled = match manager.run_with_timeout(timeout_ms) {
        Ok(n) => n.saturating_add(usize::from(poll == Poll::Worked)),
        Err(e) => {
            error!("{name}: worker event loop failed: {e}");
            return Step::Ended;
        }
    };
    if manager.subscriber_mut(id).map_or(true, |w| w.stopped()) {
        return Step::Ended;
    }
    Step::Ran(handled)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use event_manager::{EventOps, EventSet, Events};
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    use super::*;

    const KILL: u32 = 0;
    const WORK: u32 = 1;

    struct Counter {
        kill: EventFd,
        work: EventFd,
        done: Arc<AtomicUsize>,
        /// The CPU the last work ran on.
        cpu: Arc<AtomicUsize>,
        stopped: bool,
    }

    impl MutEventSubscriber for Counter {
        fn init(&mut self, ops: &mut EventOps) {
            ops.add(Events::with_data(&self.kill, KILL, EventSet::IN))
                .unwrap();
            ops.add(Events::with_data(&self.work, WORK, EventSet::IN))
                .unwrap();
        }

        fn process(&mut self, events: Events, _ops: &mut EventOps) {
            match events.data() {
                KILL => self.stopped = true,
                _ => {
                    let _ = self.work.read();
                    // SAFETY: sched_getcpu takes nothing and only reads.
                    let cpu = unsafe { libc::sched_getcpu() };
                    self.cpu.store(cpu as usize, Ordering::SeqCst);
                    self.done.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }

    impl Stoppable for Counter {
        fn kill_evt(&self) -> &EventFd {
            &self.kill
        }

        fn stopped(&self) -> bool {
            self.stopped
        }
    }

    #[test]
    fn runs_on_a_named_thread_until_dropped() {
        let kill = EventFd::new(EFD_NONBLOCK).unwrap();
        let work = EventFd::new(EFD_NONBLOCK).unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let worker = Counter {
            kill: kill.try_clone().unwrap(),
            work: work.try_clone().unwrap(),
            done: done.clone(),
            cpu: Arc::default(),
            stopped: false,
        };
        let handle = WorkerHandle::spawn("test-worker", worker).unwrap();
        assert_eq!(
            handle.thread.as_ref().unwrap().thread().name(),
            Some("test-worker")
        );
        work.write(1).unwrap();
        while done.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        // Dropping signals the kill eventfd and joins: the worker (and with
        // it the last clone of `done` but ours) is gone afterwards.
        drop(handle);
        assert_eq!(Arc::strong_count(&done), 1);
    }

    /// The CPUs this process may run on.
    fn allowed() -> Vec<usize> {
        // SAFETY: an all-zero cpu_set_t is valid; the calls read and
        // write only the set passed, of the size passed.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set),
                0
            );
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    #[test]
    fn a_worker_runs_only_on_the_cpus_it_is_given_and_a_cpu_it_cannot_have_fails() {
        let work = EventFd::new(EFD_NONBLOCK).unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let cpu = Arc::new(AtomicUsize::new(usize::MAX));
        let counter = || Counter {
            kill: EventFd::new(EFD_NONBLOCK).unwrap(),
            work: work.try_clone().unwrap(),
            done: done.clone(),
            cpu: cpu.clone(),
            stopped: false,
        };
        let last = *allowed().last().unwrap();
        let handle = WorkerHandle::spawn_on("test-worker", counter(), &[last]).unwrap();
        for round in 1..=20 {
            work.write(1).unwrap();
            while done.load(Ordering::SeqCst) < round {
                std::thread::yield_now();
            }
            assert_eq!(cpu.load(Ordering::SeqCst), last, "round {round}");
        }
        drop(handle);

        // A CPU the process cannot have: an error, and the thread is gone.
        let none = libc::CPU_SETSIZE as usize - 1;
        assert!(!allowed().contains(&none));
        let got = WorkerHandle::spawn_on("test-worker", counter(), &[none]);
        assert!(matches!(got, Err(SpawnError::Affinity(ref c, _)) if c == &[none]));
        let got = WorkerHandle::spawn_on("test-worker", counter(), &[usize::MAX]);
        assert!(matches!(got, Err(SpawnError::Affinity(..))));
        assert_eq!(Arc::strong_count(&done), 1, "no worker left running");
    }

    #[cfg(feature = "test-utils")]
    #[test]
    fn inline_workers_run_when_their_spawner_asks() {
        let work = EventFd::new(EFD_NONBLOCK).unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let worker = Counter {
            kill: EventFd::new(EFD_NONBLOCK).unwrap(),
            work: work.try_clone().unwrap(),
            done: done.clone(),
            cpu: Arc::default(),
            stopped: false,
        };
        inline::enable();
        let handle = WorkerHandle::spawn("test-worker", worker).unwrap();
        assert!(handle.thread.is_none(), "no thread of its own");
        assert_eq!(inline::run_pending(), 0, "nothing to do yet");
        work.write(1).unwrap();
        assert_eq!(done.load(Ordering::SeqCst), 0, "nobody ran it yet");
        assert_eq!(inline::run_pending(), 1);
        assert_eq!(done.load(Ordering::SeqCst), 1, "served by run_pending");
        // Dropping the handle drops the worker; nothing is left to run.
        drop(handle);
        assert_eq!(Arc::strong_count(&done), 1);
        assert_eq!(inline::count(), 0, "its thread forgot it at once");
        work.write(1).unwrap();
        assert_eq!(inline::run_pending(), 0);
    }
}

// SPDX-License-Identifier: Apache-2.0
//! vCPU threads: each runs KVM_RUN, dispatches port and MMIO exits to the
//! device buses, and parks on request (pause) until resumed.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_ioctls::{VcpuExit, VcpuFd};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use crate::arch::{self, state::VcpuState};
use crate::device_manager::IoBus;

/// Why a vCPU thread stopped the VM, for the event loop to turn into the
/// VMM's exit code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VcpuExitReason {
    /// KVM_EXIT_SHUTDOWN: a triple fault, i.e. the guest crashed.
    TripleFault,
    /// KVM could not run or emulate the guest.
    Error(String),
}

#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    #[error("Failed to register the vCPU kick signal handler")]
    Signal(#[source] vmm_sys_util::errno::Error),
    #[error("Failed to spawn a vCPU thread")]
    Spawn(#[source] std::io::Error),
    #[error("vCPU {0} did not stop within {1:?}")]
    PauseTimeout(u8, Duration),
    #[error("vCPU {0} must be paused to save its state")]
    NotPaused(u8),
    #[error("Failed to save the state of vCPU {0}: {1}")]
    Save(u8, String),
}

#[derive(Debug, Default)]
struct RunState {
    pause_requested: bool,
    paused: bool,
    exit_requested: bool,
    /// The paused thread is asked to save its KVM state into `saved`
    /// (only the thread that owns the vCPU fd can).
    save_requested: bool,
    saved: Option<Result<VcpuState, String>>,
}

/// What the VMM and one vCPU thread share.
#[derive(Debug, Default)]
struct Control {
    state: Mutex<RunState>,
    changed: Condvar,
}

impl Control {
    fn lock(&self) -> MutexGuard<'_, RunState> {
        crate::lock(&self.state)
    }

    /// Waits for the vCPU thread to change `state`, or a kick interval.
    fn wait_a_while<'a>(&self, state: MutexGuard<'a, RunState>) -> MutexGuard<'a, RunState> {
        self.changed
            .wait_timeout(state, KICK_INTERVAL)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }
}

/// Reports vCPU-side VM exits to the event loop.
#[derive(Debug)]
pub struct ExitReporter {
    pub evt: EventFd,
    pub reason: Mutex<Option<VcpuExitReason>>,
}

impl ExitReporter {
    fn report(&self, reason: VcpuExitReason) {
        crate::lock(&self.reason).get_or_insert(reason);
        if let Err(e) = self.evt.write(1) {
            log::error!("Failed to signal a vCPU exit: {e}");
        }
    }
}

pub struct VcpuHandle {
    id: u8,
    control: Arc<Control>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for VcpuHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VcpuHandle")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

extern "C" fn handle_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Nothing to do: delivery alone makes KVM_RUN return EINTR.
}

/// Installs the no-op handler for the kick signal (once per process).
pub fn register_kick_signal() -> Result<(), VcpuError> {
    register_signal_handler(SIGRTMIN(), handle_kick).map_err(VcpuError::Signal)
}

/// How often a pause re-sends the kick: a signal that lands just before
/// KVM_RUN is entered is not seen, the next one is.
const KICK_INTERVAL: Duration = Duration::from_millis(10);
const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);

impl VcpuHandle {
    /// Starts vCPU `id` (its state already set up or restored), paused
    /// until [`VcpuHandle::resume`] if `paused`; `msrs` are the MSRs a saved
    /// state includes.
    pub fn spawn(
        id: u8,
        fd: VcpuFd,
        bus: Arc<IoBus>,
        exits: Arc<ExitReporter>,
        msrs: Arc<[u32]>,
        paused: bool,
    ) -> Result<Self, VcpuError> {
        let control = Arc::new(Control::default());
        control.lock().pause_requested = paused;
        let thread_control = control.clone();
        let thread = std::thread::Builder::new()
            .name(format!("vcpu{id}"))
            .spawn(move || run(id, fd, &bus, &exits, &thread_control, &msrs))
            .map_err(VcpuError::Spawn)?;
        Ok(Self {
            id,
            control,
            thread: Some(thread),
        })
    }

    fn kick(&self) {
        if let Some(t) = &self.thread {
            if let Err(e) = t.kill(SIGRTMIN()) {
                log::debug!("Kick of vcpu{} failed: {e}", self.id);
            }
        }
    }

    /// Asks the vCPU to stop after its current exit; returns once it has.
    pub fn pause(&self) -> Result<(), VcpuError> {
        self.control.lock().pause_requested = true;
        let deadline = Instant::now() + PAUSE_TIMEOUT;
        let mut state = self.control.lock();
        while !state.paused && !self.finished() {
            drop(state);
            self.kick();
            state = self.control.lock();
            if Instant::now() > deadline {
                return Err(VcpuError::PauseTimeout(self.id, PAUSE_TIMEOUT));
            }
            state = self.control.wait_a_while(state);
        }
        Ok(())
    }

    /// The KVM state of a paused vCPU (for migration and snapshots).
    pub fn save(&self) -> Result<VcpuState, VcpuError> {
        let mut state = self.control.lock();
        if !state.paused {
            return Err(VcpuError::NotPaused(self.id));
        }
        state.saved = None;
        state.save_requested = true;
        self.control.changed.notify_all();
        let deadline = Instant::now() + PAUSE_TIMEOUT;
        loop {
            if let Some(result) = state.saved.take() {
                return result.map_err(|e| VcpuError::Save(self.id, e));
            }
            if Instant::now() > deadline || self.finished() {
                state.save_requested = false;
                return Err(VcpuError::Save(
                    self.id,
                    "the vCPU thread did not answer".into(),
                ));
            }
            state = self.control.wait_a_while(state);
        }
    }

    pub fn resume(&self) {
        let mut state = self.control.lock();
        state.pause_requested = false;
        self.control.changed.notify_all();
        drop(state);
    }

    fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for VcpuHandle {
    fn drop(&mut self) {
        let mut state = self.control.lock();
        state.exit_requested = true;
        state.pause_requested = false;
        self.control.changed.notify_all();
        drop(state);
        // Kick at the pause pace: each real-time signal is queued, and a
        // flood keeps the thread in its handler instead of letting it exit.
        while !self.finished() {
            self.kick();
            std::thread::sleep(KICK_INTERVAL);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Parks while a pause is requested, saving the vCPU's state when asked.
/// Returns false when the thread must end.
fn wait_while_paused(control: &Control, fd: &mut VcpuFd, bus: &IoBus, msrs: &[u32]) -> bool {
    let mut state = control.lock();
    while state.pause_requested && !state.exit_requested {
        if !state.paused {
            state.paused = true;
            control.changed.notify_all();
        }
        if state.save_requested {
            state.save_requested = false;
            arch::state::complete_io(fd, |exit| serve_io(bus, exit).is_ok());
            state.saved = Some(arch::state::save(fd, msrs).map_err(|e| crate::error_chain(&e)));
            control.changed.notify_all();
            continue;
        }
        state = control
            .changed
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner);
    }
    state.paused = false;
    !state.exit_requested
}

/// Serves a port or MMIO exit on the device buses; any other exit comes
/// back.
fn serve_io<'a>(bus: &IoBus, exit: VcpuExit<'a>) -> Result<(), VcpuExit<'a>> {
    match exit {
        VcpuExit::IoIn(port, data) => bus.pio_read(port, data),
        VcpuExit::IoOut(port, data) => bus.pio_write(port, data),
        VcpuExit::MmioRead(addr, data) => bus.mmio_read(addr, data),
        VcpuExit::MmioWrite(addr, data) => bus.mmio_write(addr, data),
        other => return Err(other),
    }
    Ok(())
}

fn run(id: u8, mut fd: VcpuFd, bus: &IoBus, exits: &ExitReporter, control: &Control, msrs: &[u32]) {
    crate::sandbox::enter(crate::sandbox::Kind::Vcpu);
    while wait_while_paused(control, &mut fd, bus, msrs) {
        match fd.run().map(|exit| serve_io(bus, exit)) {
            Ok(Ok(())) => {}
            Ok(Err(VcpuExit::Shutdown)) => {
                log::error!("vcpu{id}: guest triple fault");
                exits.report(VcpuExitReason::TripleFault);
                return;
            }
            Ok(Err(VcpuExit::Hlt)) => {
                // With the in-kernel LAPIC this only follows an INIT; nothing to do.
            }
            Ok(Err(exit @ (VcpuExit::FailEntry(..) | VcpuExit::InternalError))) => {
                let msg = format!("vcpu{id}: KVM could not run the guest: {exit:?}");
                log::error!("{msg}");
                exits.report(VcpuExitReason::Error(msg));
                return;
            }
            Ok(Err(other)) => log::warn!("vcpu{id}: unexpected exit {other:?}"),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {}
            Err(e) => {
                let msg = format!("vcpu{id}: KVM_RUN failed: {e}");
                log::error!("{msg}");
                exits.report(VcpuExitReason::Error(msg));
                return;
            }
        }
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The VMM's life cycle: a VM booted, received by migration or restored
//! from a snapshot, then the control loop that waits for the guest (power
//! off, reset, crash), the console, the API and an outgoing migration.
//! The migration roles live in [`crate::migration`], the API dispatch in
//! [`crate::requests`], the VM itself in [`crate::machine`].

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use api::{ActionError, ApiResponse, ResponseBody, VmState};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

pub use crate::machine::VmmError;
pub use crate::outcome::{Outcome, EXIT_ERROR, EXIT_GUEST_CRASH, EXIT_OK, EXIT_USAGE};

use crate::config::{SerialConfig, VmConfig};
use crate::console::ConsoleInput;
use crate::lock;
use crate::machine::{Guest, Machine, StartAs};
use crate::migration::source::Outgoing;
use crate::migration::{destination, snapshot, Progress};
use crate::requests::{self, start_api, Actions, Api};
use crate::sandbox;
use crate::vcpu::VcpuExitReason;

pub struct Vmm {
    guest: Guest,
    api: Option<Api>,
    /// The last or current migration, for `vm.info`.
    migration: Progress,
    outgoing: Option<Outgoing>,
    /// When the VM was handed over; the VMM exits once `vm.info` has
    /// reported it (or after [`HANDOVER_LINGER`]).
    handed_over: Option<Instant>,
    handover_reported: bool,
}

/// How long a source lingers after the handover so that the operator's
/// `vm.info` poll sees the migration completed.
const HANDOVER_LINGER: std::time::Duration = std::time::Duration::from_secs(3);

impl std::fmt::Debug for Vmm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vmm")
            .field("config", &self.guest.config)
            .finish_non_exhaustive()
    }
}

impl Vmm {
    /// Builds the VM and starts its vCPUs; with `api_socket`, serves the
    /// HTTP API there from the start.
    pub fn boot(config: VmConfig, api_socket: Option<&std::path::Path>) -> Result<Self, VmmError> {
        let api = api_socket.map(start_api).transpose()?;
        let machine = Machine::build(config, false)?;
        machine.load_boot()?;
        let vmm = Self::start(machine, api, Arc::new(Mutex::new(None)), StartAs::Running)?;
        let config = &vmm.guest.config;
        log::info!(
            "Booted {} with {} vCPUs and {} MiB",
            config.kernel.display(),
            config.cpus,
            config.memory >> 20
        );
        Ok(vmm)
    }

    /// A VMM started with only `--api-socket`: serves the API until
    /// `vm.receive-migration` brings a VM, then runs it. `None` when
    /// `vm.shutdown` came first. `serial` is this host's console setting.
    pub fn receive(
        api_socket: &std::path::Path,
        serial: &SerialConfig,
    ) -> Result<Option<Self>, VmmError> {
        let api = start_api(api_socket)?;
        log::info!(
            "Waiting for vm.receive-migration on {}",
            api_socket.display()
        );
        // The receiving thread starts the VM as soon as it is handed over.
        let Some((guest, api, progress)) = destination::wait_for_vm(api, serial)? else {
            return Ok(None);
        };
        Self::control(guest, Some(api), progress).map(Some)
    }

    /// Builds the VM saved in snapshot directory `dir` and runs it.
    pub fn restore(
        dir: &std::path::Path,
        serial: SerialConfig,
        api_socket: Option<&std::path::Path>,
    ) -> Result<Self, VmmError> {
        let api = api_socket.map(start_api).transpose()?;
        let machine = snapshot::load(dir, serial)?;
        let vmm = Self::start(machine, api, Arc::new(Mutex::new(None)), StartAs::Paused)?;
        log::info!(
            "Restored the VM of {}; it is paused until vm.resume",
            dir.display()
        );
        Ok(vmm)
    }

    /// Starts the vCPU threads of a built (booted or restored) machine.
    fn start(
        machine: Machine,
        api: Option<Api>,
        migration: Progress,
        how: StartAs,
    ) -> Result<Self, VmmError> {
        Self::control(machine.start(how)?, api, migration)
    }

    /// Takes a started guest over for the control loop.
    fn control(guest: Guest, api: Option<Api>, migration: Progress) -> Result<Self, VmmError> {
        // The TAPs are open: no capability is needed from here on.
        sandbox::drop_capabilities().map_err(|e| VmmError::Sandbox(e.to_string()))?;
        Ok(Self {
            guest,
            api,
            migration,
            outgoing: None,
            handed_over: None,
            handover_reported: false,
        })
    }

    fn migration_busy(&self) -> bool {
        self.outgoing.is_some() || self.handed_over.is_some()
    }

    /// Answers the sending thread of an outgoing migration.
    fn handle_migration(&mut self) {
        let Some(out) = self.outgoing.as_mut() else {
            return;
        };
        if let Some(result) = out.handle(&mut self.guest) {
            self.outgoing = None;
            if result.is_ok() {
                self.handed_over = Some(Instant::now());
            }
        }
    }

    /// Answers every queued API request. Returns true after `vm.shutdown`.
    fn handle_api(&mut self) -> bool {
        // Taken out while the dispatch borrows the VMM as its actions.
        let Some(api) = self.api.take() else {
            return false;
        };
        let shutdown = requests::dispatch(&api, self);
        self.api = Some(api);
        shutdown
    }

    /// Runs until the guest ends; returns how it ended.
    pub fn run(mut self) -> Result<Outcome, VmmError> {
        const POWEROFF: u64 = 0;
        const RESET: u64 = 1;
        const VCPU_EXIT: u64 = 2;
        const STDIN: u64 = 3;
        const API: u64 = 4;
        const SERIAL_ROOM: u64 = 5;
        const MIGRATION: u64 = 6;
        sandbox::apply(sandbox::Kind::Vmm).map_err(|e| VmmError::Sandbox(e.to_string()))?;
        let epoll = Epoll::new().map_err(VmmError::EventLoop)?;
        let add = |fd: i32, token: u64| {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, token),
                )
                .map_err(VmmError::EventLoop)
        };
        add(self.guest.poweroff.as_raw_fd(), POWEROFF)?;
        add(self.guest.reset.as_raw_fd(), RESET)?;
        add(self.guest.vcpu_exits.evt.as_raw_fd(), VCPU_EXIT)?;
        if let Some(api) = &self.api {
            add(api.evt.as_raw_fd(), API)?;
        }
        add(self.guest.devices.serial_room().as_raw_fd(), SERIAL_ROOM)?;
        let mut console = ConsoleInput::new(self.guest.config.serial == SerialConfig::Tty);
        console.watch(&epoll, STDIN)?;
        if console.always_ready {
            console.read_stdin(&self.guest.devices, &epoll, STDIN)?;
        }

        let mut events = vec![EpollEvent::default(); 8];
        let mut migration_watched = false;
        loop {
            if let (false, Some(out)) = (migration_watched, &self.outgoing) {
                add(out.evt.as_raw_fd(), MIGRATION)?;
                migration_watched = true;
            }
            if self.outgoing.is_none() {
                // Its eventfd closed with it, which removed it from the set.
                migration_watched = false;
            }
            if let Some(at) = self.handed_over {
                if self.handover_reported || at.elapsed() > HANDOVER_LINGER {
                    return Ok(self.finish(Outcome::Migrated));
                }
            }
            // While lingering after a handover, wake up to check the clock.
            let timeout = if self.handed_over.is_some() { 100 } else { -1 };
            let n = match epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(VmmError::EventLoop(e)),
            };
            for event in events.iter().take(n) {
                match event.data() {
                    POWEROFF => return Ok(self.finish(Outcome::PowerOff)),
                    RESET => return Ok(self.finish(Outcome::Reset)),
                    VCPU_EXIT => {
                        let reason = self
                            .guest
                            .vcpu_exits
                            .reason
                            .lock()
                            .ok()
                            .and_then(|mut r| r.take());
                        let outcome = match reason {
                            Some(VcpuExitReason::TripleFault) => Outcome::GuestCrash,
                            Some(VcpuExitReason::Error(e)) => Outcome::Error(e),
                            None => continue,
                        };
                        return Ok(self.finish(outcome));
                    }
                    API if self.handle_api() => return Ok(self.finish(Outcome::ApiShutdown)),
                    MIGRATION => self.handle_migration(),
                    STDIN => console.read_stdin(&self.guest.devices, &epoll, STDIN)?,
                    SERIAL_ROOM => {
                        let _ = self.guest.devices.serial_room().read();
                        console.feed(&self.guest.devices, &epoll, STDIN)?;
                    }
                    _ => {}
                }
            }
        }
    }

    fn finish(self, outcome: Outcome) -> Outcome {
        log::info!(
            "VM ended after {:.1} s: {outcome:?}",
            self.guest.booted_at.elapsed().as_secs_f64()
        );
        // Dropping the handles stops and joins every vCPU thread.
        drop(self.guest.vcpus);
        // The devices go next, and KVM's ioeventfds with the VM.
        self.guest.vm.close_ioevents();
        outcome
    }
}

impl Actions for Vmm {
    fn info(&mut self) -> api::VmInfo {
        if self.handed_over.is_some() {
            self.handover_reported = true;
        }
        let g = &self.guest;
        api::VmInfo {
            state: if g.paused {
                VmState::Paused
            } else {
                VmState::Running
            },
            config: Some(requests::summary(&g.config)),
            uptime_ms: u64::try_from(g.booted_at.elapsed().as_millis()).unwrap_or(u64::MAX),
            migration: lock(&self.migration).clone(),
        }
    }

    fn counters(&self) -> api::VmCounters {
        api::VmCounters {
            devices: self.guest.devices.counters(),
            migration: lock(&self.migration).clone(),
        }
    }

    fn handed_over(&self) -> bool {
        self.handed_over.is_some()
    }

    fn pause(&mut self) -> ApiResponse {
        if self.guest.paused {
            return Err(ActionError::InvalidState("VM is already paused".into()));
        }
        self.guest.pause_vm().map_err(ActionError::Failed)?;
        log::info!("VM paused");
        Ok(ResponseBody::Empty)
    }

    fn resume(&mut self) -> ApiResponse {
        if !self.guest.paused {
            return Err(ActionError::InvalidState("VM is not paused".into()));
        }
        if self.outgoing.as_ref().is_some_and(|o| o.paused_vm) {
            return Err(ActionError::InvalidState(
                "VM is paused for a migration's switch-over".into(),
            ));
        }
        self.guest.resume_vm().map_err(ActionError::Failed)?;
        log::info!("VM resumed");
        Ok(ResponseBody::Empty)
    }

    fn send_migration(&mut self, params: &api::SendMigrationParams) -> ApiResponse {
        if self.migration_busy() {
            return Err(ActionError::InvalidState(
                "a migration is already running".into(),
            ));
        }
        self.outgoing = Some(Outgoing::start(params, &self.guest, &self.migration)?);
        Ok(ResponseBody::Empty)
    }

    fn cancel_migration(&mut self) -> ApiResponse {
        match &self.outgoing {
            Some(out) => out.cancel(),
            None => Err(ActionError::InvalidState(
                "no outgoing migration is running".into(),
            )),
        }
    }

    fn snapshot(&mut self, params: &api::SnapshotParams) -> ApiResponse {
        snapshot::take(&self.guest, params)
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The VMM's life cycle: build the VM from a `VmConfig`, boot it, then run
//! the control loop that waits for the guest (power off, reset, crash),
//! the console and, later, the API.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use api::{
    ActionError, ApiMessage, ApiRequest, ApiResponse, ApiServerHandle, MigrationDirection,
    MigrationStatus, ResponseBody, VmState,
};
use kvm_ioctls::VcpuFd;
use vm_migration::transport::MigrationUrl;

use legacy_devices::ExitSignal;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::arch::{self, acpi, boot, cpu, layout};
use crate::config::{SerialConfig, VmConfig};
use crate::device_manager::{DeviceError, DeviceManager};
use crate::incoming::HostSettings;
use crate::kvm::{KvmError, Vm};
use crate::lock;
use crate::memory::{self, GuestMemory, MemoryError};
use crate::migration::{self, ControlLink, Progress, Source, SourceRequest, VmSnapshot};
use crate::sandbox;
use crate::vcpu::{self, ExitReporter, VcpuError, VcpuExitReason, VcpuHandle};

#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error("Failed to create guest memory")]
    Memory(#[source] MemoryError),
    #[error(transparent)]
    Kvm(#[from] KvmError),
    #[error("Failed to open {0}")]
    Open(String, #[source] std::io::Error),
    #[error("Failed to load the kernel")]
    Boot(#[source] boot::BootError),
    #[error("Failed to write ACPI tables")]
    Acpi(#[source] acpi::AcpiError),
    #[error("Failed to set up vCPU {0}")]
    Cpu(u8, #[source] cpu::CpuError),
    #[error("Failed to create vCPU {0}")]
    CreateVcpu(u8, #[source] kvm_ioctls::Error),
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error("Failed to create devices")]
    Devices(#[source] DeviceError),
    #[error("Failed to set up the control loop")]
    EventLoop(#[source] std::io::Error),
    #[error("Failed to start the API server")]
    Api(#[source] api::ApiError),
    #[error("Failed to restore the VM: {0}")]
    Restore(String),
    #[error("Sandbox: {0}")]
    Sandbox(String),
}

/// How a VM ended. Each maps to a documented process exit code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The guest powered off (ACPI S5).
    PowerOff,
    /// The guest asked for a reset (reboot); the VMM ends, as Firecracker does.
    Reset,
    /// `vm.shutdown` through the API.
    ApiShutdown,
    /// The guest triple-faulted.
    GuestCrash,
    /// KVM failed to run the guest.
    Error(String),
    /// The VM was handed over to another VMM (live migration).
    Migrated,
}

/// Process exit codes, documented in `--help`.
pub const EXIT_OK: i32 = 0;
pub const EXIT_ERROR: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_GUEST_CRASH: i32 = 3;

impl Outcome {
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::PowerOff | Self::Reset | Self::ApiShutdown | Self::Migrated => EXIT_OK,
            Self::GuestCrash => EXIT_GUEST_CRASH,
            Self::Error(_) => EXIT_ERROR,
        }
    }
}

/// A VM built but not running: what booting and an incoming migration or
/// snapshot restore share. Its vCPUs exist; their threads start with
/// [`Vmm::start`].
pub struct Machine {
    config: VmConfig,
    // KVM memory slots point into it: it lives as long as the VM.
    mem: Arc<GuestMemory>,
    vm: Arc<Vm>,
    devices: DeviceManager,
    vcpu_fds: Vec<VcpuFd>,
    poweroff: EventFd,
    reset: EventFd,
}

pub struct Vmm {
    config: VmConfig,
    mem: Arc<GuestMemory>,
    vm: Arc<Vm>,
    devices: DeviceManager,
    vcpus: Vec<VcpuHandle>,
    poweroff: EventFd,
    reset: EventFd,
    vcpu_exits: Arc<ExitReporter>,
    booted_at: Instant,
    paused: bool,
    api: Option<Api>,
    /// The last or current migration, for `vm.info`.
    migration: Progress,
    outgoing: Option<Outgoing>,
    /// When the VM was handed over; the VMM exits once `vm.info` has
    /// reported it (or after [`HANDOVER_LINGER`]).
    handed_over: Option<Instant>,
    handover_reported: bool,
}

/// A migration being sent: the thread and its requests to the loop.
struct Outgoing {
    requests: Receiver<SourceRequest>,
    evt: EventFd,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The switch-over paused the VM (undone if the migration fails).
    paused_vm: bool,
    /// Shared with the sending thread: `vm.cancel-migration` sets it.
    cancel: Arc<AtomicBool>,
    /// The switch-over began: too late to cancel.
    switching: bool,
}

/// How [`Vmm::start`] starts a built machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StartAs {
    /// Booted: devices run, vCPUs start.
    Running,
    /// Received by migration: the devices, restored paused, go on now.
    Resumed,
    /// Restored from a snapshot: vCPUs and devices stay paused until
    /// vm.resume, so that several VMs (say, two RDMA peers) can be
    /// restored first and resumed together.
    Paused,
}

/// How long a source lingers after the handover so that the operator's
/// `vm.info` poll sees the migration completed.
const HANDOVER_LINGER: std::time::Duration = std::time::Duration::from_secs(3);

/// The HTTP API's end in the control loop.
struct Api {
    evt: EventFd,
    requests: Receiver<ApiMessage>,
    // Dropping the handle stops the server thread and removes the socket.
    _server: ApiServerHandle,
}

impl std::fmt::Debug for Vmm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vmm")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Moves console input from the VMM's stdin into the guest's UART with
/// backpressure: while the receive FIFO is full, stdin is not read (the
/// bytes wait in the terminal or pipe), and the guest draining the FIFO
/// resumes the flow. Nothing typed or pasted is dropped.
struct ConsoleInput {
    /// stdin is a console source (tty mode) and has not reached EOF.
    open: bool,
    /// stdin is in the epoll set (only while nothing is pending).
    watched: bool,
    /// stdin cannot be polled (a regular file): it is always readable, so
    /// it is read whenever the FIFO has room.
    always_ready: bool,
    pending: Vec<u8>,
}

impl ConsoleInput {
    fn new(enabled: bool) -> Self {
        Self {
            open: enabled,
            watched: false,
            always_ready: false,
            pending: Vec::new(),
        }
    }

    fn set_watch(&mut self, epoll: &Epoll, token: u64, on: bool) -> Result<(), VmmError> {
        if self.watched == on {
            return Ok(());
        }
        let fd = std::io::stdin().as_raw_fd();
        let result = if on {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )
        } else {
            epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default())
        };
        match result {
            Ok(()) => self.watched = on,
            // Regular files (and /dev/null) cannot be polled: always readable.
            Err(e) if on && e.raw_os_error() == Some(libc::EPERM) => self.always_ready = true,
            Err(e) => return Err(VmmError::EventLoop(e)),
        }
        Ok(())
    }

    fn watch(&mut self, epoll: &Epoll, token: u64) -> Result<(), VmmError> {
        let on = self.open && self.pending.is_empty() && !self.always_ready;
        self.set_watch(epoll, token, on)
    }

    fn read_stdin(
        &mut self,
        devices: &DeviceManager,
        epoll: &Epoll,
        token: u64,
    ) -> Result<(), VmmError> {
        let mut buf = [0u8; 256];
        match std::io::stdin().lock().read(&mut buf) {
            Ok(0) | Err(_) => self.open = false,
            Ok(n) => self
                .pending
                .extend_from_slice(buf.get(..n).unwrap_or_default()),
        }
        self.feed(devices, epoll, token)
    }

    /// Offers pending input to the guest, then decides whether to read
    /// more: only once everything pending has been taken.
    fn feed(&mut self, devices: &DeviceManager, epoll: &Epoll, token: u64) -> Result<(), VmmError> {
        let taken = devices.serial_input(&self.pending);
        self.pending.drain(..taken.min(self.pending.len()));
        self.watch(epoll, token)?;
        if self.always_ready && self.open && self.pending.is_empty() && taken > 0 {
            return self.read_stdin(devices, epoll, token);
        }
        Ok(())
    }
}

fn start_api(path: &std::path::Path) -> Result<Api, VmmError> {
    let evt = eventfd()?;
    let (sender, requests) = mpsc::channel();
    let options = api::ServerOptions {
        thread_start: || sandbox::enter(sandbox::Kind::Api),
        ..Default::default()
    };
    let server = api::start_server_with(
        path,
        sender,
        evt.try_clone().map_err(VmmError::EventLoop)?,
        options,
    )
    .map_err(VmmError::Api)?;
    log::info!("API listening on {}", path.display());
    Ok(Api {
        evt,
        requests,
        _server: server,
    })
}

fn open(path: &std::path::Path) -> Result<File, VmmError> {
    File::open(path).map_err(|e| VmmError::Open(path.display().to_string(), e))
}

fn eventfd() -> Result<EventFd, VmmError> {
    EventFd::new(EFD_NONBLOCK).map_err(VmmError::EventLoop)
}

impl Machine {
    /// Creates guest memory, the KVM VM, its devices and vCPUs (CPUID and
    /// LAPIC set up, nothing loaded). `incoming`: the devices take over
    /// host resources a migration source may still hold.
    fn build(config: VmConfig, incoming: bool) -> Result<Self, VmmError> {
        let mem = Arc::new(memory::create_guest_memory(config.memory).map_err(VmmError::Memory)?);
        let vm = Vm::new(&mem)?;
        vm.check_vcpu_count(config.cpus)?;
        let poweroff = eventfd()?;
        let reset = eventfd()?;
        let exit = Arc::new(ExitSignal::new(
            poweroff.try_clone().map_err(VmmError::EventLoop)?,
            reset.try_clone().map_err(VmmError::EventLoop)?,
        ));
        let devices =
            DeviceManager::new(&config, &mem, &vm, exit, incoming).map_err(VmmError::Devices)?;
        let mut vcpu_fds = Vec::with_capacity(usize::from(config.cpus));
        for id in 0..config.cpus {
            let fd = vm
                .fd()
                .create_vcpu(u64::from(id))
                .map_err(|e| VmmError::CreateVcpu(id, e))?;
            cpu::set_cpuid(&fd, vm.supported_cpuid(), id, config.cpus)
                .and_then(|()| cpu::set_lint(&fd))
                .map_err(|e| VmmError::Cpu(id, e))?;
            vcpu_fds.push(fd);
        }
        Ok(Self {
            config,
            mem,
            vm: Arc::new(vm),
            devices,
            vcpu_fds,
            poweroff,
            reset,
        })
    }

    /// Loads the kernel, ACPI and boot tables, and sets the boot vCPU up.
    fn load_boot(&self) -> Result<(), VmmError> {
        let config = &self.config;
        let mut kernel = open(&config.kernel)?;
        let mut initramfs = config.initramfs.as_deref().map(open).transpose()?;
        let entry = boot::load_kernel(&self.mem, &mut kernel, initramfs.as_mut(), &config.cmdline)
            .map_err(VmmError::Boot)?;
        acpi::create_acpi_tables(&self.mem, config.cpus, layout::mmio64_window(config.memory))
            .map_err(VmmError::Acpi)?;
        cpu::write_boot_tables(&self.mem).map_err(|e| VmmError::Cpu(0, e))?;
        for (id, fd) in (0u8..).zip(&self.vcpu_fds) {
            let setup = || -> Result<(), cpu::CpuError> {
                cpu::set_boot_msrs(fd)?;
                // Every vCPU alike (INIT keeps XCR0): state saved on one must restore on another.
                cpu::set_boot_xcr0(fd, self.vm.supported_cpuid())?;
                if id == 0 {
                    // Application processors start from INIT/SIPI sent by the guest.
                    cpu::set_boot_regs(fd, entry.entry)?;
                    cpu::set_boot_sregs(fd)?;
                    cpu::set_boot_fpu(fd)?;
                }
                Ok(())
            };
            setup().map_err(|e| VmmError::Cpu(id, e))?;
        }
        Ok(())
    }
}

impl migration::Target for Machine {
    fn build(config: VmConfig) -> Result<Self, String> {
        Machine::build(config, true).map_err(|e| crate::error_chain(&e))
    }

    fn memory(&self) -> &GuestMemory {
        &self.mem
    }

    /// Puts KVM's and the devices' state back. Devices are paused first and
    /// stay so until [`Vmm::start`]: nothing may reach the network or guest
    /// memory before the source has handed the VM over.
    fn restore(&mut self, state: &VmSnapshot) -> Result<(), String> {
        if state.vcpus.len() != self.vcpu_fds.len() {
            return Err(format!(
                "{} vCPU states for {} vCPUs",
                state.vcpus.len(),
                self.vcpu_fds.len()
            ));
        }
        let err = |e: &dyn std::error::Error| crate::error_chain(e);
        let t0 = Instant::now();
        for (fd, s) in self.vcpu_fds.iter().zip(&state.vcpus) {
            arch::state::restore(fd, s).map_err(|e| err(&e))?;
        }
        let t1 = Instant::now();
        arch::state::restore_vm(self.vm.fd(), &state.vm).map_err(|e| err(&e))?;
        let t2 = Instant::now();
        self.devices.pause().map_err(|e| err(&e))?;
        self.devices.restore(&state.devices).map_err(|e| err(&e))?;
        // A restore sits inside a migration's blackout: say what it cost.
        log::info!(
            "Restored vCPUs in {} ms, the VM's irqchip and clocks in {} ms, devices in {} ms",
            t1.duration_since(t0).as_millis(),
            t2.duration_since(t1).as_millis(),
            t2.elapsed().as_millis()
        );
        Ok(())
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
        log::info!(
            "Booted {} with {} vCPUs and {} MiB",
            vmm.config.kernel.display(),
            vmm.config.cpus,
            vmm.config.memory >> 20
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
        let Machine {
            config,
            mem,
            vm,
            devices,
            vcpu_fds,
            poweroff,
            reset,
        } = machine;
        // The TAPs are open: no capability is needed from here on.
        sandbox::drop_capabilities().map_err(|e| VmmError::Sandbox(e.to_string()))?;
        vcpu::register_kick_signal()?;
        let vcpu_exits = Arc::new(ExitReporter {
            evt: eventfd()?,
            reason: Mutex::new(None),
        });
        let msrs: Arc<[u32]> = vm.msr_list().into();
        let mut vcpus = Vec::with_capacity(vcpu_fds.len());
        for (id, fd) in (0u8..).zip(vcpu_fds) {
            vcpus.push(VcpuHandle::spawn(
                id,
                fd,
                devices.bus(),
                vcpu_exits.clone(),
                msrs.clone(),
                how == StartAs::Paused,
            )?);
        }
        if how == StartAs::Resumed {
            devices
                .resume()
                .map_err(|e| VmmError::Restore(crate::error_chain(&e)))?;
        }
        Ok(Self {
            config,
            mem,
            vm,
            devices,
            vcpus,
            poweroff,
            reset,
            vcpu_exits,
            booted_at: Instant::now(),
            paused: how == StartAs::Paused,
            api,
            migration,
            outgoing: None,
            handed_over: None,
            handover_reported: false,
        })
    }

    /// Pauses vCPUs, then devices (they stop writing guest memory and the
    /// network); leaves everything running if either fails.
    fn pause_vm(&mut self) -> Result<(), String> {
        if let Err(e) = self.vcpus.iter().try_for_each(VcpuHandle::pause) {
            self.vcpus.iter().for_each(VcpuHandle::resume);
            return Err(crate::error_chain(&e));
        }
        if let Err(e) = self.devices.pause() {
            self.vcpus.iter().for_each(VcpuHandle::resume);
            return Err(crate::error_chain(&e));
        }
        self.paused = true;
        Ok(())
    }

    fn resume_vm(&mut self) -> Result<(), String> {
        self.devices.resume().map_err(|e| crate::error_chain(&e))?;
        self.vcpus.iter().for_each(VcpuHandle::resume);
        self.paused = false;
        Ok(())
    }

    fn pause(&mut self) -> ApiResponse {
        if self.paused {
            return Err(ActionError::InvalidState("VM is already paused".into()));
        }
        self.pause_vm().map_err(ActionError::Failed)?;
        log::info!("VM paused");
        Ok(ResponseBody::Empty)
    }

    fn resume(&mut self) -> ApiResponse {
        if !self.paused {
            return Err(ActionError::InvalidState("VM is not paused".into()));
        }
        if self.outgoing.as_ref().is_some_and(|o| o.paused_vm) {
            return Err(ActionError::InvalidState(
                "VM is paused for a migration's switch-over".into(),
            ));
        }
        self.resume_vm().map_err(ActionError::Failed)?;
        log::info!("VM resumed");
        Ok(ResponseBody::Empty)
    }

    /// The state of every vCPU, KVM's VM-wide devices and every device
    /// (all paused), as the bytes of a [`VmSnapshot`].
    fn save_state(&self) -> Result<Vec<u8>, String> {
        let vcpus = self
            .vcpus
            .iter()
            .map(VcpuHandle::save)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| crate::error_chain(&e))?;
        let state = VmSnapshot {
            vcpus,
            vm: arch::state::save_vm(self.vm.fd()).map_err(|e| crate::error_chain(&e))?,
            devices: self
                .devices
                .snapshot()
                .map_err(|e| crate::error_chain(&e))?,
        };
        state.to_bytes().map_err(|e| crate::error_chain(&e))
    }

    fn migration_busy(&self) -> bool {
        self.outgoing.is_some() || self.handed_over.is_some()
    }

    fn send_migration(&mut self, params: &api::SendMigrationParams) -> ApiResponse {
        if self.migration_busy() {
            return Err(ActionError::InvalidState(
                "a migration is already running".into(),
            ));
        }
        let url: MigrationUrl =
            params
                .destination_url
                .parse()
                .map_err(|e: vm_migration::transport::UrlError| {
                    ActionError::BadRequest(e.to_string())
                })?;
        let tls = params
            .tls
            .as_ref()
            .map(|t| migration::tls_files(t).client())
            .transpose()
            .map_err(|e| ActionError::BadRequest(crate::error_chain(&e)))?;
        url.check_plaintext(tls.is_some(), params.allow_plaintext)
            .map_err(|e| ActionError::BadRequest(crate::error_chain(&e)))?;
        let config = serde_json::to_vec(&self.config)
            .map_err(|e| ActionError::Failed(format!("cannot encode the configuration: {e}")))?;
        let (requests_tx, requests) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let evt = eventfd().map_err(|e| ActionError::Failed(crate::error_chain(&e)))?;
        let wake = evt
            .try_clone()
            .map_err(|e| ActionError::Failed(e.to_string()))?;
        let mut info = migration::start_info(
            MigrationDirection::Send,
            &url.to_string(),
            MigrationStatus::Active,
        );
        info.memory_bytes = self.config.memory;
        *lock(&self.migration) = Some(info);
        let source = Source {
            url,
            tls,
            downtime: std::time::Duration::from_millis(params.downtime_ms),
            timeout: std::time::Duration::from_secs(params.timeout_s),
            config,
            mem: self.mem.clone(),
            vm: self.vm.clone(),
            progress: self.migration.clone(),
            control: ControlLink {
                requests: requests_tx,
                wake,
            },
            cancel: cancel.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("migration".into())
            .spawn(move || source.run())
            .map_err(|e| ActionError::Failed(format!("cannot start the migration thread: {e}")))?;
        self.outgoing = Some(Outgoing {
            requests,
            evt,
            thread: Some(thread),
            paused_vm: false,
            cancel,
            switching: false,
        });
        log::info!("Migration to {} started", params.destination_url);
        Ok(ResponseBody::Empty)
    }

    /// Answers the sending thread: pauses and saves the VM for the
    /// switch-over, or ends the migration (hand over, or resume).
    fn handle_migration(&mut self) {
        let Some(out) = &self.outgoing else { return };
        let _ = out.evt.read();
        let requests: Vec<SourceRequest> = out.requests.try_iter().collect();
        for request in requests {
            match request {
                SourceRequest::Switchover(reply) => {
                    if let Some(out) = self.outgoing.as_mut() {
                        out.switching = true;
                        // A cancel the sender had not seen yet.
                        if out.cancel.load(Ordering::Acquire) {
                            let _ = reply.send(Err("cancelled through the API".into()));
                            continue;
                        }
                    }
                    let was_paused = self.paused;
                    let t0 = Instant::now();
                    let result = if was_paused { Ok(()) } else { self.pause_vm() };
                    let t1 = Instant::now();
                    let result = result.and_then(|()| self.save_state());
                    log::info!(
                        "Switch-over: VM paused in {} ms, state saved in {} ms",
                        t1.duration_since(t0).as_millis(),
                        t1.elapsed().as_millis()
                    );
                    if let Some(out) = self.outgoing.as_mut() {
                        out.paused_vm = !was_paused && self.paused;
                    }
                    let _ = reply.send(result);
                }
                SourceRequest::Finished(result) => {
                    let Some(mut out) = self.outgoing.take() else {
                        continue;
                    };
                    if let Some(t) = out.thread.take() {
                        let _ = t.join();
                    }
                    match result {
                        Ok(()) => self.handed_over = Some(Instant::now()),
                        Err(_) if out.paused_vm => {
                            if let Err(e) = self.resume_vm() {
                                log::error!(
                                    "Failed to resume the VM after the failed migration: {e}"
                                );
                            } else {
                                log::info!("VM resumed after the failed migration");
                            }
                        }
                        Err(_) => {}
                    }
                }
            }
        }
    }

    /// Stops an outgoing migration before its switch-over; the VM goes on
    /// here. After the switch-over began it completes or fails on its own.
    fn cancel_migration(&mut self) -> ApiResponse {
        let Some(out) = &self.outgoing else {
            return Err(ActionError::InvalidState(
                "no outgoing migration is running".into(),
            ));
        };
        if out.switching {
            return Err(ActionError::InvalidState(
                "too late to cancel: the switch-over has begun".into(),
            ));
        }
        out.cancel.store(true, Ordering::Release);
        log::info!("Migration cancel requested");
        Ok(ResponseBody::Empty)
    }

    fn snapshot(&self, params: &api::SnapshotParams) -> ApiResponse {
        if !self.paused {
            return Err(ActionError::InvalidState(
                "pause the VM before taking a snapshot".into(),
            ));
        }
        let dir = vm_migration::transport::parse_file_url(&params.destination_url)
            .map_err(|e| ActionError::BadRequest(e.to_string()))?;
        let state = self.save_state().map_err(ActionError::Failed)?;
        migration::write_snapshot(&dir, &self.config, &self.mem, &state)
            .map_err(|e| ActionError::Failed(crate::error_chain(&e)))?;
        log::info!("Snapshot written to {}", dir.display());
        Ok(ResponseBody::Empty)
    }

    fn info(&self) -> api::VmInfo {
        let c = &self.config;
        api::VmInfo {
            state: if self.paused {
                VmState::Paused
            } else {
                VmState::Running
            },
            config: Some(summary(c)),
            uptime_ms: u64::try_from(self.booted_at.elapsed().as_millis()).unwrap_or(u64::MAX),
            migration: lock(&self.migration).clone(),
        }
    }

    /// Answers every queued API request. Returns true after `vm.shutdown`.
    fn handle_api(&mut self) -> bool {
        let Some(api) = &self.api else { return false };
        // Read first, then drain: a request queued after the drain fires the eventfd again.
        let _ = api.evt.read();
        let messages: Vec<ApiMessage> = api.requests.try_iter().collect();
        let mut shutdown = false;
        for message in messages {
            let response = match &message.request {
                ApiRequest::Ping => Ok(ResponseBody::Ping(api::VmmPing::current(features()))),
                ApiRequest::VmInfo => {
                    let info = self.info();
                    if self.handed_over.is_some() {
                        self.handover_reported = true;
                    }
                    Ok(ResponseBody::VmInfo(info))
                }
                // Still served after a hand-over: the final counts of this VMM.
                ApiRequest::Counters => Ok(ResponseBody::Counters(api::VmCounters {
                    devices: self.devices.counters(),
                    migration: lock(&self.migration).clone(),
                })),
                _ if self.handed_over.is_some() => Err(ActionError::InvalidState(
                    "the VM has migrated to another VMM; this one is exiting".into(),
                )),
                ApiRequest::Pause => self.pause(),
                ApiRequest::Resume => self.resume(),
                ApiRequest::SendMigration(p) => self.send_migration(p),
                ApiRequest::CancelMigration => self.cancel_migration(),
                ApiRequest::Snapshot(p) => self.snapshot(p),
                ApiRequest::ReceiveMigration(_) => Err(ActionError::InvalidState(
                    "this VMM already runs a VM; start a new one with only --api-socket to receive"
                        .into(),
                )),
                ApiRequest::Shutdown => {
                    shutdown = true;
                    Ok(ResponseBody::Empty)
                }
            };
            message.respond(response);
        }
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
        add(self.poweroff.as_raw_fd(), POWEROFF)?;
        add(self.reset.as_raw_fd(), RESET)?;
        add(self.vcpu_exits.evt.as_raw_fd(), VCPU_EXIT)?;
        if let Some(api) = &self.api {
            add(api.evt.as_raw_fd(), API)?;
        }
        add(self.devices.serial_room().as_raw_fd(), SERIAL_ROOM)?;
        let mut console = ConsoleInput::new(self.config.serial == SerialConfig::Tty);
        console.watch(&epoll, STDIN)?;
        if console.always_ready {
            console.read_stdin(&self.devices, &epoll, STDIN)?;
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
                    STDIN => console.read_stdin(&self.devices, &epoll, STDIN)?,
                    SERIAL_ROOM => {
                        let _ = self.devices.serial_room().read();
                        console.feed(&self.devices, &epoll, STDIN)?;
                    }
                    _ => {}
                }
            }
        }
    }

    /// A VMM started with only `--api-socket`: serves the API until
    /// `vm.receive-migration` brings a VM, then runs it. `None` when
    /// `vm.shutdown` came first. `serial` is this host's console setting.
    pub fn receive(
        api_socket: &std::path::Path,
        serial: &SerialConfig,
    ) -> Result<Option<Self>, VmmError> {
        let api = start_api(api_socket)?;
        let progress: Progress = Arc::new(Mutex::new(None));
        let handover_evt = eventfd()?;
        let (handover_tx, handover) = mpsc::channel();
        let mut receiving = false;
        const API: u64 = 0;
        const HANDOVER: u64 = 1;
        let epoll = Epoll::new().map_err(VmmError::EventLoop)?;
        for (fd, token) in [
            (api.evt.as_raw_fd(), API),
            (handover_evt.as_raw_fd(), HANDOVER),
        ] {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, token),
                )
                .map_err(VmmError::EventLoop)?;
        }
        log::info!(
            "Waiting for vm.receive-migration on {}",
            api_socket.display()
        );
        let mut events = vec![EpollEvent::default(); 4];
        loop {
            let n = match epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(VmmError::EventLoop(e)),
            };
            for event in events.iter().take(n) {
                if event.data() == HANDOVER {
                    let _ = handover_evt.read();
                    for result in handover.try_iter() {
                        receiving = false;
                        match result {
                            Ok(machine) => {
                                let t0 = Instant::now();
                                let vmm =
                                    Self::start(machine, Some(api), progress, StartAs::Resumed)?;
                                log::info!(
                                    "Migration received; the VM runs here now (started in {} ms)",
                                    t0.elapsed().as_millis()
                                );
                                return Ok(Some(vmm));
                            }
                            Err(e) => log::error!("Incoming migration failed: {e}"),
                        }
                    }
                    continue;
                }
                let _ = api.evt.read();
                let messages: Vec<ApiMessage> = api.requests.try_iter().collect();
                for message in messages {
                    let response = match &message.request {
                        ApiRequest::Ping => {
                            Ok(ResponseBody::Ping(api::VmmPing::current(features())))
                        }
                        ApiRequest::VmInfo => Ok(ResponseBody::VmInfo(api::VmInfo {
                            state: VmState::Created,
                            config: None,
                            uptime_ms: 0,
                            migration: lock(&progress).clone(),
                        })),
                        ApiRequest::ReceiveMigration(_) if receiving => Err(
                            ActionError::InvalidState("already receiving a migration".into()),
                        ),
                        ApiRequest::ReceiveMigration(p) => {
                            start_receiver(p, serial, &progress, handover_tx.clone(), &handover_evt)
                                .inspect(|_| receiving = true)
                        }
                        ApiRequest::Shutdown => {
                            message.respond(Ok(ResponseBody::Empty));
                            return Ok(None);
                        }
                        _ => Err(ActionError::InvalidState(
                            "no VM here yet: this VMM waits for vm.receive-migration".into(),
                        )),
                    };
                    message.respond(response);
                }
            }
        }
    }

    /// Builds the VM saved in snapshot directory `dir` and runs it.
    pub fn restore(
        dir: &std::path::Path,
        serial: SerialConfig,
        api_socket: Option<&std::path::Path>,
    ) -> Result<Self, VmmError> {
        let api = api_socket.map(start_api).transpose()?;
        let mut config = migration::read_snapshot_config(dir)
            .map_err(|e| VmmError::Restore(crate::error_chain(&e)))?;
        config.serial = serial;
        let mut machine = Machine::build(config, true)?;
        migration::restore_snapshot(dir, &mut machine)
            .map_err(|e| VmmError::Restore(crate::error_chain(&e)))?;
        let vmm = Self::start(machine, api, Arc::new(Mutex::new(None)), StartAs::Paused)?;
        log::info!(
            "Restored the VM of {}; it is paused until vm.resume",
            dir.display()
        );
        Ok(vmm)
    }

    fn finish(self, outcome: Outcome) -> Outcome {
        log::info!(
            "VM ended after {:.1} s: {outcome:?}",
            self.booted_at.elapsed().as_secs_f64()
        );
        // Dropping the handles stops and joins every vCPU thread.
        drop(self.vcpus);
        outcome
    }
}

/// Starts a receiver thread for `params`: the listening socket is bound
/// here, so a bad URL or a taken address is the API call's error.
fn start_receiver(
    params: &api::ReceiveMigrationParams,
    serial: &SerialConfig,
    progress: &Progress,
    handover: Sender<Result<Machine, String>>,
    wake: &EventFd,
) -> ApiResponse {
    let url: MigrationUrl = params
        .receiver_url
        .parse()
        .map_err(|e: vm_migration::transport::UrlError| ActionError::BadRequest(e.to_string()))?;
    for (mac, tap) in &params.taps {
        let ok = mac.parse::<crate::config::MacAddr>().is_ok()
            && crate::config::NetConfig::from_str(&format!("tap={tap},mac={mac}")).is_ok();
        if !ok {
            return Err(ActionError::BadRequest(format!(
                "taps: '{mac}' -> '{tap}' is not a MAC address and a TAP name"
            )));
        }
    }
    let tls = params
        .tls
        .as_ref()
        .map(|t| migration::tls_files(t).server())
        .transpose()
        .map_err(|e| ActionError::BadRequest(crate::error_chain(&e)))?;
    url.check_plaintext(tls.is_some(), params.allow_plaintext)
        .map_err(|e| ActionError::BadRequest(crate::error_chain(&e)))?;
    let host = HostSettings::new(params, serial).map_err(ActionError::BadRequest)?;
    let listener = url
        .listen(tls)
        .map_err(|e| ActionError::Failed(format!("cannot listen on {url}: {e}")))?;
    *lock(progress) = Some(migration::start_info(
        MigrationDirection::Receive,
        &url.to_string(),
        MigrationStatus::Listening,
    ));
    let progress = progress.clone();
    let wake = wake
        .try_clone()
        .map_err(|e| ActionError::Failed(e.to_string()))?;
    std::thread::Builder::new()
        .name("migration".into())
        .spawn(move || {
            sandbox::enter(sandbox::Kind::Vmm);
            let result = migration::receive::<Machine>(&listener, &host, &progress)
                .map(|(machine, _)| machine)
                .map_err(|e| crate::error_chain(&e));
            if let Err(e) = &result {
                if let Some(info) = lock(&progress).as_mut() {
                    info.status = MigrationStatus::Failed;
                    info.error = Some(e.clone());
                }
            }
            let _ = handover.send(result);
            let _ = wake.write(1);
        })
        .map_err(|e| ActionError::Failed(format!("cannot start the receiver thread: {e}")))?;
    log::info!("Listening for a migration on {url}");
    Ok(ResponseBody::Empty)
}

/// What `vmm.ping` lists.
fn features() -> Vec<String> {
    vec!["pvrdma".into(), "migration".into(), "snapshot".into()]
}

fn summary(c: &VmConfig) -> api::VmConfigSummary {
    api::VmConfigSummary {
        cpus: u32::from(c.cpus),
        memory_mib: c.memory >> 20,
        kernel: c.kernel.to_string_lossy().into_owned(),
        cmdline: c.cmdline.clone(),
        disks: c
            .disks
            .iter()
            .map(|d| api::DiskSummary {
                path: d.path.to_string_lossy().into_owned(),
                readonly: d.readonly,
            })
            .collect(),
    }
}

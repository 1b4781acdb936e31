// SPDX-License-Identifier: Apache-2.0
//! The VMM's life cycle: build the VM from a `VmConfig`, boot it, then run
//! the control loop that waits for the guest (power off, reset, crash),
//! the console and, later, the API.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use api::{
    ActionError, ApiMessage, ApiRequest, ApiResponse, ApiServerHandle, ResponseBody, VmState,
};

use legacy_devices::ExitSignal;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::arch::{acpi, boot, cpu, layout};
use crate::config::{SerialConfig, VmConfig};
use crate::device_manager::{DeviceError, DeviceManager};
use crate::kvm::{KvmError, Vm};
use crate::memory::{self, GuestMemory, MemoryError};
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
}

/// Process exit codes, documented in `--help`.
pub const EXIT_OK: i32 = 0;
pub const EXIT_ERROR: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_GUEST_CRASH: i32 = 3;

impl Outcome {
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::PowerOff | Self::Reset | Self::ApiShutdown => EXIT_OK,
            Self::GuestCrash => EXIT_GUEST_CRASH,
            Self::Error(_) => EXIT_ERROR,
        }
    }
}

pub struct Vmm {
    config: VmConfig,
    // Kept alive for the VM: KVM memory slots point into it.
    _mem: Arc<GuestMemory>,
    _vm: Vm,
    devices: DeviceManager,
    vcpus: Vec<VcpuHandle>,
    poweroff: EventFd,
    reset: EventFd,
    vcpu_exits: Arc<ExitReporter>,
    booted_at: Instant,
    paused: bool,
    api: Option<Api>,
}

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
    let server = api::start_server(path, sender, evt.try_clone().map_err(VmmError::EventLoop)?)
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

impl Vmm {
    /// Builds the VM and starts its vCPUs; with `api_socket`, serves the
    /// HTTP API there from the start.
    pub fn boot(config: VmConfig, api_socket: Option<&std::path::Path>) -> Result<Self, VmmError> {
        let api = api_socket.map(start_api).transpose()?;
        let mut kernel = open(&config.kernel)?;
        let mut initramfs = config.initramfs.as_deref().map(open).transpose()?;
        let mem = Arc::new(memory::create_guest_memory(config.memory).map_err(VmmError::Memory)?);
        let vm = Vm::new(&mem)?;
        vm.check_vcpu_count(config.cpus)?;

        let poweroff = eventfd()?;
        let reset = eventfd()?;
        let exit = Arc::new(ExitSignal::new(
            poweroff.try_clone().map_err(VmmError::EventLoop)?,
            reset.try_clone().map_err(VmmError::EventLoop)?,
        ));
        let devices = DeviceManager::new(&config, &mem, &vm, exit).map_err(VmmError::Devices)?;

        let entry = boot::load_kernel(&mem, &mut kernel, initramfs.as_mut(), &config.cmdline)
            .map_err(VmmError::Boot)?;
        acpi::create_acpi_tables(&mem, config.cpus, layout::mmio64_window(config.memory))
            .map_err(VmmError::Acpi)?;
        cpu::write_boot_tables(&mem).map_err(|e| VmmError::Cpu(0, e))?;

        vcpu::register_kick_signal()?;
        let vcpu_exits = Arc::new(ExitReporter {
            evt: eventfd()?,
            reason: Mutex::new(None),
        });
        let mut vcpus = Vec::with_capacity(usize::from(config.cpus));
        for id in 0..config.cpus {
            let fd = vm
                .fd()
                .create_vcpu(u64::from(id))
                .map_err(|e| VmmError::CreateVcpu(id, e))?;
            let setup = || -> Result<(), cpu::CpuError> {
                cpu::set_cpuid(&fd, vm.supported_cpuid(), id, config.cpus)?;
                cpu::set_boot_msrs(&fd)?;
                cpu::set_lint(&fd)?;
                if id == 0 {
                    // Application processors start from INIT/SIPI sent by the guest.
                    cpu::set_boot_regs(&fd, entry.entry)?;
                    cpu::set_boot_sregs(&fd)?;
                    cpu::set_boot_fpu(&fd)?;
                }
                Ok(())
            };
            setup().map_err(|e| VmmError::Cpu(id, e))?;
            vcpus.push(VcpuHandle::spawn(
                id,
                fd,
                devices.bus(),
                vcpu_exits.clone(),
            )?);
        }
        log::info!(
            "Booted {} with {} vCPUs and {} MiB",
            config.kernel.display(),
            config.cpus,
            config.memory >> 20
        );
        Ok(Self {
            config,
            _mem: mem,
            _vm: vm,
            devices,
            vcpus,
            poweroff,
            reset,
            vcpu_exits,
            booted_at: Instant::now(),
            paused: false,
            api,
        })
    }

    fn pause(&mut self) -> ApiResponse {
        if self.paused {
            return Err(ActionError::InvalidState("VM is already paused".into()));
        }
        if let Err(e) = self.vcpus.iter().try_for_each(VcpuHandle::pause) {
            // Leave no vCPU half-stopped: the VM keeps running as before.
            self.vcpus.iter().for_each(VcpuHandle::resume);
            return Err(ActionError::Failed(crate::error_chain(&e)));
        }
        self.paused = true;
        log::info!("VM paused");
        Ok(ResponseBody::Empty)
    }

    fn resume(&mut self) -> ApiResponse {
        if !self.paused {
            return Err(ActionError::InvalidState("VM is not paused".into()));
        }
        self.vcpus.iter().for_each(VcpuHandle::resume);
        self.paused = false;
        log::info!("VM resumed");
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
            config: api::VmConfigSummary {
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
            },
            uptime_ms: u64::try_from(self.booted_at.elapsed().as_millis()).unwrap_or(u64::MAX),
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
            let response = match message.request {
                ApiRequest::Ping => Ok(ResponseBody::Ping(api::VmmPing::current(Vec::new()))),
                ApiRequest::VmInfo => Ok(ResponseBody::VmInfo(self.info())),
                ApiRequest::Pause => self.pause(),
                ApiRequest::Resume => self.resume(),
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
        loop {
            let n = match epoll.wait(-1, &mut events) {
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

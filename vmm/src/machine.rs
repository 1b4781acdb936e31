// SPDX-License-Identifier: Apache-2.0
//! The VM itself: a [`Machine`] is built (guest memory, KVM, devices,
//! vCPUs) by booting, by an incoming migration or from a snapshot; once
//! its vCPU threads start it is a [`Guest`], which the control loop and
//! the migration source pause, resume and save.

use std::fs::File;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_bindings::kvm_cpuid_entry2;
use kvm_ioctls::VcpuFd;
use legacy_devices::ExitSignal;
use vm_migration::Snapshot;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::arch::{self, acpi, boot, cpu, layout};
use crate::config::VmConfig;
use crate::device_manager::{DeviceError, DeviceManager};
use crate::kvm::{KvmError, Vm};
use crate::memory::{self, GuestMemory, MemoryError};
use crate::migration::{self, VcpuCpuids, VmSnapshot};
use crate::vcpu::{self, ExitReporter, VcpuError, VcpuHandle};

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

/// A VM built but not running: what booting and an incoming migration or
/// snapshot restore share. Its vCPUs exist; their threads are spawned
/// parked by [`Machine::prepare`] (a migration's destination does it
/// before the hand-over) and let go by [`Machine::start`].
pub struct Machine {
    pub(crate) config: VmConfig,
    // KVM memory slots point into it: it lives as long as the VM.
    pub(crate) mem: Arc<GuestMemory>,
    vm: Arc<Vm>,
    devices: DeviceManager,
    /// The vCPUs until [`Machine::prepare`] moves them into their threads.
    vcpu_fds: Vec<VcpuFd>,
    /// Their threads, parked, once prepared.
    parked: Option<Parked>,
    /// Each vCPU's CPUID as KVM holds it: set for a booting guest, or the
    /// restored guest's.
    cpuids: Vec<Vec<kvm_cpuid_entry2>>,
    poweroff: EventFd,
    reset: EventFd,
}

/// vCPU threads spawned paused, and where they report the VM's end.
struct Parked {
    vcpus: Vec<VcpuHandle>,
    exits: Arc<ExitReporter>,
}

/// A VM whose vCPU threads run (or are parked: paused).
pub struct Guest {
    pub(crate) config: VmConfig,
    pub(crate) mem: Arc<GuestMemory>,
    pub(crate) vm: Arc<Vm>,
    pub(crate) devices: DeviceManager,
    pub(crate) vcpus: Vec<VcpuHandle>,
    /// What a migration sends ahead of the memory (see [`Machine`]).
    pub(crate) cpuids: Vec<Vec<kvm_cpuid_entry2>>,
    pub(crate) poweroff: EventFd,
    pub(crate) reset: EventFd,
    pub(crate) vcpu_exits: Arc<ExitReporter>,
    pub(crate) booted_at: Instant,
    pub(crate) paused: bool,
}

/// How [`Machine::start`] starts a built machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAs {
    /// Booted: devices run, vCPUs start.
    Running,
    /// Received by migration: the devices, restored paused, go on now.
    Resumed,
    /// Restored from a snapshot: vCPUs and devices stay paused until
    /// vm.resume, so that several VMs (say, two RDMA peers) can be
    /// restored first and resumed together.
    Paused,
}

pub(crate) fn open(path: &std::path::Path) -> Result<File, VmmError> {
    File::open(path).map_err(|e| VmmError::Open(path.display().to_string(), e))
}

pub(crate) fn eventfd() -> Result<EventFd, VmmError> {
    EventFd::new(EFD_NONBLOCK).map_err(VmmError::EventLoop)
}

impl Machine {
    /// Creates guest memory, the KVM VM, its devices and vCPUs (CPUID and
    /// LAPIC set up, nothing loaded). `incoming` (a migration or snapshot
    /// restores the VM): the devices take over host resources a migration
    /// source may still hold, and are paused from the start, so that
    /// pausing them is no part of a migration's blackout.
    pub(crate) fn build(config: VmConfig, incoming: bool) -> Result<Self, VmmError> {
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
        if incoming {
            devices
                .pause()
                .map_err(|e| VmmError::Restore(crate::error_chain(&e)))?;
        }
        let mut vcpu_fds = Vec::with_capacity(usize::from(config.cpus));
        let mut cpuids = Vec::with_capacity(usize::from(config.cpus));
        for id in 0..config.cpus {
            let fd = vm
                .fd()
                .create_vcpu(u64::from(id))
                .map_err(|e| VmmError::CreateVcpu(id, e))?;
            let cpuid = cpu::set_cpuid(&fd, vm.supported_cpuid(), id, config.cpus)
                .and_then(|cpuid| cpu::set_lint(&fd).map(|()| cpuid))
                .map_err(|e| VmmError::Cpu(id, e))?;
            cpuids.push(cpuid);
            vcpu_fds.push(fd);
        }
        Ok(Self {
            config,
            mem,
            vm: Arc::new(vm),
            devices,
            vcpu_fds,
            parked: None,
            cpuids,
            poweroff,
            reset,
        })
    }

    /// Loads the kernel, ACPI and boot tables, and sets the boot vCPU up.
    pub(crate) fn load_boot(&self) -> Result<(), VmmError> {
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

    /// Spawns the vCPU threads, parked until [`Machine::start`]: a
    /// migration's destination does it once the state is restored, so
    /// that the guest does not wait for it after the hand-over. The vCPU
    /// state must be set by then (the fds move into the threads).
    pub(crate) fn prepare(&mut self) -> Result<(), VmmError> {
        if self.parked.is_some() {
            return Ok(());
        }
        let t0 = Instant::now();
        vcpu::register_kick_signal()?;
        let exits = Arc::new(ExitReporter {
            evt: eventfd()?,
            reason: Mutex::new(None),
        });
        let msrs: Arc<[u32]> = self.vm.msr_list().into();
        let mut vcpus = Vec::with_capacity(self.vcpu_fds.len());
        for (id, fd) in (0u8..).zip(self.vcpu_fds.drain(..)) {
            vcpus.push(VcpuHandle::spawn(
                id,
                fd,
                self.devices.bus(),
                exits.clone(),
                msrs.clone(),
                true,
            )?);
        }
        log::info!(
            "Prepared {} vCPU threads (parked) in {} ms",
            vcpus.len(),
            t0.elapsed().as_millis()
        );
        self.parked = Some(Parked { vcpus, exits });
        Ok(())
    }

    /// Lets a built (booted or restored) machine run as `how` says; its
    /// vCPU threads are spawned now unless [`Machine::prepare`] did it.
    pub(crate) fn start(mut self, how: StartAs) -> Result<Guest, VmmError> {
        let t0 = Instant::now();
        self.prepare()?;
        let Machine {
            config,
            mem,
            vm,
            devices,
            parked,
            cpuids,
            poweroff,
            reset,
            ..
        } = self;
        let Parked { vcpus, exits } =
            parked.ok_or_else(|| VmmError::Restore("the vCPU threads were not prepared".into()))?;
        let t1 = Instant::now();
        let resumed = match how {
            StartAs::Running => {
                vcpus.iter().for_each(VcpuHandle::resume);
                None
            }
            StartAs::Resumed => {
                let took = release(&devices, &vcpus)
                    .map_err(|e| VmmError::Restore(crate::error_chain(&e)))?;
                Some(took)
            }
            StartAs::Paused => None,
        };
        // The guest runs from here (or would, paused): the doorbells are
        // registered while it does.
        let t2 = Instant::now();
        vm.flush_ioevents().map_err(VmmError::EventLoop)?;
        // After a migration's hand-over the guest waits for this.
        log::info!(
            "{}",
            started_line(
                how,
                t1.duration_since(t0),
                resumed.unwrap_or_default(),
                t2.duration_since(t1)
            )
        );
        Ok(Guest {
            config,
            mem,
            vm,
            devices,
            vcpus,
            cpuids,
            poweroff,
            reset,
            vcpu_exits: exits,
            booted_at: t2,
            paused: how == StartAs::Paused,
        })
    }
}

#[cfg(test)]
impl Machine {
    /// Adds `dev` to the PCI bus, for tests of what a device does to a start.
    pub(crate) fn add_pci_function(
        &self,
        dev: Arc<Mutex<dyn pci::PciDevice>>,
    ) -> Result<(), DeviceError> {
        self.devices.add_pci_function(dev)
    }
}

/// The log line of a start `how`, which took `threads` to spawn the vCPU
/// threads, `devices` to resume the devices (a migration's destination
/// only) and `after` from then to the vCPUs let go (devices included).
/// Only the steps that `how` has are named: a booted VM's devices never
/// paused, and a snapshot's VM stays paused until vm.resume.
fn started_line(how: StartAs, threads: Duration, devices: Duration, after: Duration) -> String {
    let threads = threads.as_millis();
    match how {
        StartAs::Running => format!(
            "Started: vCPU threads in {threads} ms, vCPUs let go in {} ms",
            after.as_millis()
        ),
        StartAs::Resumed => format!(
            "Started: vCPU threads in {threads} ms, devices resumed in {} ms, then vCPUs let go \
             in {} ms",
            devices.as_millis(),
            after.saturating_sub(devices).as_millis()
        ),
        StartAs::Paused => format!(
            "Started paused: vCPU threads in {threads} ms; devices and vCPUs wait for vm.resume"
        ),
    }
}

/// What [`release`] resumes: the devices, in two steps around letting the
/// vCPUs go.
trait Resume {
    type Error;
    /// Resumes them while the vCPUs are parked.
    fn resume_parked(&self) -> Result<(), Self::Error>;
    /// The vCPUs run: the work they left for then (see
    /// [`vm_migration::Pausable::resume_parked`]).
    fn released(&self);
}

impl Resume for DeviceManager {
    type Error = vm_migration::MigratableError;

    fn resume_parked(&self) -> Result<(), Self::Error> {
        DeviceManager::resume_parked(self)
    }

    fn released(&self) {
        DeviceManager::released(self)
    }
}

/// Resumes the `devices`, then lets the parked `vcpus` run, then tells
/// the devices: a guest never runs on a paused device (its doorbells
/// would wait for the resume), and what a device's threads do for the
/// resume (PVRDMA's worker running every QP) does not hold the vCPUs
/// back on a host short of CPUs. Returns how long the devices took to
/// resume; if they fail to, the vCPUs stay parked.
fn release<R: Resume>(devices: &R, vcpus: &[VcpuHandle]) -> Result<Duration, R::Error> {
    let t0 = Instant::now();
    devices.resume_parked()?;
    let took = t0.elapsed();
    vcpus.iter().for_each(VcpuHandle::resume);
    devices.released();
    Ok(took)
}

impl migration::Target for Machine {
    fn build(config: VmConfig) -> Result<Self, String> {
        Machine::build(config, true).map_err(|e| crate::error_chain(&e))
    }

    fn memory(&self) -> &GuestMemory {
        &self.mem
    }

    fn prepare(&mut self) -> Result<(), String> {
        Machine::prepare(self).map_err(|e| crate::error_chain(&e))
    }

    fn check_cpuid(&self, cpuids: &[u8]) -> Result<(), String> {
        let cpuids = VcpuCpuids::from_bytes(cpuids).map_err(|e| crate::error_chain(&e))?;
        check_cpuids(&self.vcpu_fds, &cpuids.0)
    }

    /// The devices make ahead what their hints name (see
    /// [`vm_migration::Snapshottable::restore_hint`]).
    fn prepare_restore(&mut self, hints: &[u8]) -> Result<(), String> {
        let t0 = Instant::now();
        let hints = Snapshot::from_bytes(hints).map_err(|e| crate::error_chain(&e))?;
        // Doorbells made ahead (PVRDMA's QPs sent ahead) are recorded and
        // registered once the VM runs, as the restore's are: thousands of
        // KVM_IOEVENTFDs here would hold the migration up for seconds.
        self.vm.defer_ioevents();
        self.devices
            .prepare_restore(&hints)
            .map_err(|e| crate::error_chain(&e))?;
        log::info!(
            "Prepared the devices' restore in {} ms",
            t0.elapsed().as_millis()
        );
        Ok(())
    }

    /// Puts KVM's and the devices' state back. Devices are paused (since
    /// the build) and stay so until [`Machine::start`]: nothing may reach
    /// the network or guest memory before the source has handed the VM
    /// over.
    fn restore(&mut self, state: &[u8]) -> Result<(), String> {
        let state = VmSnapshot::from_bytes(state).map_err(|e| crate::error_chain(&e))?;
        if state.vcpus.len() != self.vcpu_fds.len() {
            return Err(format!(
                "{} vCPU states for {} vCPUs",
                state.vcpus.len(),
                self.vcpu_fds.len()
            ));
        }
        let err = |e: &dyn std::error::Error| crate::error_chain(e);
        let t0 = Instant::now();
        for ((id, fd), s) in (0u8..).zip(&self.vcpu_fds).zip(&state.vcpus) {
            arch::state::restore(fd, s).map_err(|e| format!("vCPU {id}: {}", err(&e)))?;
        }
        self.cpuids = state.vcpus.iter().map(|s| s.cpuid().to_vec()).collect();
        let t1 = Instant::now();
        arch::state::restore_vm(self.vm.fd(), &state.vm).map_err(|e| err(&e))?;
        let t2 = Instant::now();
        // Doorbells are registered once the VM runs (see `DeferredIoEvents`),
        // the MSI routes of all functions at once.
        self.vm.defer_ioevents();
        self.vm.hold_routes();
        let updates = self.vm.route_updates();
        let restored = self.devices.restore(&state.devices);
        let routed = self.vm.commit_routes();
        restored.map_err(|e| err(&e))?;
        routed.map_err(|e| format!("cannot install the MSI routes: {e}"))?;
        // A restore sits inside a migration's blackout: say what it cost.
        log::info!(
            "Restored vCPUs in {} ms, the VM's irqchip and clocks in {} ms, devices in {} ms \
             ({} routing updates)",
            t1.duration_since(t0).as_millis(),
            t2.duration_since(t1).as_millis(),
            t2.elapsed().as_millis(),
            self.vm.route_updates() - updates
        );
        Ok(())
    }
}

/// Checks the CPUIDs a source sent, one per vCPU, against vCPUs `fds` of
/// a booting guest here.
fn check_cpuids(fds: &[VcpuFd], cpuids: &[Vec<kvm_cpuid_entry2>]) -> Result<(), String> {
    if cpuids.len() != fds.len() {
        return Err(format!("{} CPUIDs for {} vCPUs", cpuids.len(), fds.len()));
    }
    for ((id, fd), cpuid) in (0u8..).zip(fds).zip(cpuids) {
        arch::state::check_cpuid(fd, cpuid)
            .map_err(|e| format!("vCPU {id}: {}", crate::error_chain(&e)))?;
    }
    Ok(())
}

impl Guest {
    /// Pauses vCPUs, then devices (they stop writing guest memory and the
    /// network); leaves everything running if either fails.
    pub(crate) fn pause_vm(&mut self) -> Result<(), String> {
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

    pub(crate) fn resume_vm(&mut self) -> Result<(), String> {
        release(&self.devices, &self.vcpus).map_err(|e| crate::error_chain(&e))?;
        self.paused = false;
        Ok(())
    }

    /// The state of every vCPU, KVM's VM-wide devices and every device
    /// (all paused), as the bytes of a [`VmSnapshot`].
    pub(crate) fn save_state(&self) -> Result<Vec<u8>, String> {
        let t0 = Instant::now();
        let vcpus = self
            .vcpus
            .iter()
            .map(VcpuHandle::save)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| crate::error_chain(&e))?;
        let t1 = Instant::now();
        let vm = arch::state::save_vm(self.vm.fd()).map_err(|e| crate::error_chain(&e))?;
        let t2 = Instant::now();
        let devices = self
            .devices
            .snapshot()
            .map_err(|e| crate::error_chain(&e))?;
        let t3 = Instant::now();
        let bytes = VmSnapshot { vcpus, vm, devices }
            .to_bytes()
            .map_err(|e| crate::error_chain(&e))?;
        // A save sits inside a migration's blackout: say what it cost.
        log::info!(
            "Saved vCPUs in {} ms, the VM's irqchip and clocks in {} ms, devices in {} ms, \
             encoded {} bytes in {} ms",
            t1.duration_since(t0).as_millis(),
            t2.duration_since(t1).as_millis(),
            t3.duration_since(t2).as_millis(),
            bytes.len(),
            t3.elapsed().as_millis()
        );
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use kvm_ioctls::Kvm;

    use super::*;

    /// A source's CPUIDs are checked vCPU by vCPU, in number and each with
    /// its own APIC ID.
    #[test]
    fn a_source_cpuid_is_checked_for_each_vcpu() {
        let kvm = Kvm::new().unwrap();
        let vm = kvm.create_vm().unwrap();
        let supported = kvm
            .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .unwrap();
        let (fds, own): (Vec<VcpuFd>, Vec<_>) = (0..2u8)
            .map(|id| {
                let fd = vm.create_vcpu(u64::from(id)).unwrap();
                let cpuid = cpu::set_cpuid(&fd, &supported, id, 2).unwrap();
                (fd, cpuid)
            })
            .unzip();
        assert_eq!(check_cpuids(&fds, &own), Ok(()));
        assert_eq!(
            check_cpuids(&fds, &own[..1]),
            Err("1 CPUIDs for 2 vCPUs".into())
        );
        let swapped = [own[1].clone(), own[0].clone()];
        let e = check_cpuids(&fds, &swapped).unwrap_err();
        assert!(e.starts_with("vCPU 0: The guest's CPUID does not fit this host: CPUID leaf 0x1 EBX gives APIC ID 1"), "{e}");
    }

    /// The start's log line names only the steps the start has: a booted
    /// VM's devices were never paused, and a snapshot's VM is not let go.
    #[test]
    fn the_started_line_names_only_the_steps_taken() {
        let ms = Duration::from_millis;
        assert_eq!(
            started_line(StartAs::Resumed, ms(2), ms(43), ms(45)),
            "Started: vCPU threads in 2 ms, devices resumed in 43 ms, then vCPUs let go in 2 ms"
        );
        assert_eq!(
            started_line(StartAs::Running, ms(2), Duration::ZERO, ms(1)),
            "Started: vCPU threads in 2 ms, vCPUs let go in 1 ms"
        );
        assert_eq!(
            started_line(StartAs::Paused, ms(2), Duration::ZERO, ms(1)),
            "Started paused: vCPU threads in 2 ms; devices and vCPUs wait for vm.resume"
        );
    }

    /// Whether a parked vCPU has run: a vCPU with no memory and no state
    /// ends its thread on its first KVM_RUN and reports it.
    fn has_run(exits: &ExitReporter) -> bool {
        exits.reason.lock().unwrap().is_some()
    }

    /// Devices for [`release`] that record, when resumed and when told the
    /// vCPUs run, whether the vCPU has run by then (waiting up to
    /// `settle` for it when told).
    struct Recorder<'a> {
        exits: &'a ExitReporter,
        fail: bool,
        settle: Duration,
        ran_at_resume: std::cell::Cell<Option<bool>>,
        ran_at_released: std::cell::Cell<Option<bool>>,
    }

    impl Resume for Recorder<'_> {
        type Error = &'static str;

        fn resume_parked(&self) -> Result<(), Self::Error> {
            std::thread::sleep(self.settle);
            self.ran_at_resume.set(Some(has_run(self.exits)));
            if self.fail {
                return Err("no");
            }
            Ok(())
        }

        fn released(&self) {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !has_run(self.exits) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            self.ran_at_released.set(Some(has_run(self.exits)));
        }
    }

    /// The devices resume before a parked vCPU runs, and if they cannot,
    /// the vCPU stays parked (a guest must not run on paused devices);
    /// they are told the vCPUs run only once they do (PVRDMA's worker
    /// then runs every QP, which must not hold the vCPUs back).
    #[test]
    fn devices_resume_before_the_vcpus_run_and_hear_after() {
        let kvm = Kvm::new().unwrap();
        let vm = kvm.create_vm().unwrap();
        vcpu::register_kick_signal().unwrap();
        let exits = Arc::new(ExitReporter {
            evt: eventfd().unwrap(),
            reason: Mutex::new(None),
        });
        let bus = Arc::new(crate::device_manager::IoBus::empty());
        let msrs: Arc<[u32]> = Arc::new([]);
        let vcpus = vec![VcpuHandle::spawn(
            0,
            vm.create_vcpu(0).unwrap(),
            bus,
            exits.clone(),
            msrs,
            true,
        )
        .unwrap()];
        let recorder = |fail| Recorder {
            exits: &exits,
            fail,
            settle: Duration::from_millis(50),
            ran_at_resume: Default::default(),
            ran_at_released: Default::default(),
        };

        // Devices that fail to resume: the vCPU is not let go, nor are
        // they told it was.
        let failed = recorder(true);
        assert_eq!(release(&failed, &vcpus), Err("no"));
        std::thread::sleep(failed.settle);
        assert!(
            !has_run(&exits),
            "a vCPU ran although its devices did not resume"
        );
        assert_eq!(failed.ran_at_released.get(), None);

        // While the devices resume, the vCPU is still parked; then it
        // runs, and then the devices hear of it.
        let devices = recorder(false);
        release(&devices, &vcpus).unwrap();
        assert_eq!(
            devices.ran_at_resume.get(),
            Some(false),
            "a vCPU ran before its devices resumed"
        );
        assert_eq!(
            devices.ran_at_released.get(),
            Some(true),
            "the devices were told before the vCPU was let go"
        );
    }
}

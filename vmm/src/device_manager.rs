// SPDX-License-Identifier: Apache-2.0
//! Creates the VM's devices and routes vCPU port/MMIO exits to them: the
//! legacy PIO devices on a vm-device `IoManager`, PCI functions behind the
//! 0xCF8/0xCFC configuration ports and their BARs.

use std::fs::File;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use legacy_devices::{
    AcpiPm, ExitSignal, InputRoom, Serial, SerialIrq, ACPI_PM_PORT, ACPI_PM_PORT_LEN, I8042,
    I8042_PORT, I8042_PORT_LEN, SERIAL_IRQ, SERIAL_PORT, SERIAL_PORT_LEN,
};
use net_port::{Port, Tap};
use pci::{DeviceCounters, DeviceHooks, PciBus};
use pvrdma::Pvrdma;
use serde::{Deserialize, Serialize};
use virtio_devices::{Block, BlockConfig};
use vm_device::bus::{PioAddress, PioAddressOffset, PioRange};
use vm_device::device_manager::{IoManager, PioManager};
use vm_device::DevicePio;
use vm_migration::{MigratableError, Snapshot, Snapshottable};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmxnet3::{Vmxnet3, Vmxnet3Config};

use crate::arch::layout;
use crate::config::{MacAddr, NetConfig, SerialConfig, VmConfig};
use crate::kvm::Vm;
use crate::memory::GuestMemory;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("Failed to open the serial output file {0}")]
    SerialFile(String, #[source] io::Error),
    #[error("Failed to create an eventfd")]
    EventFd(#[source] io::Error),
    #[error("Failed to connect the serial interrupt")]
    SerialIrq(#[source] kvm_ioctls::Error),
    #[error("Failed to register {0} on the I/O port bus")]
    Pio(&'static str, #[source] vm_device::bus::Error),
    #[error("Failed to add a PCI device")]
    Pci(#[source] pci::PciBusError),
    #[error("No free PCI slot left for {0}")]
    NoSlot(&'static str),
    #[error("Failed to create the PVRDMA device")]
    Pvrdma(#[source] pvrdma::PvrdmaError),
    #[error("Failed to open TAP {0}")]
    Tap(String, #[source] net_port::TapError),
    #[error("Failed to create the vmxnet3 NIC on {0}")]
    Vmxnet3(String, #[source] vmxnet3::Vmxnet3Error),
    #[error("Failed to create the disk for {0}")]
    Disk(String, #[source] virtio_devices::BlockError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// Port 0xCF8..0xCFF: PCI configuration mechanism #1.
const PCI_CONFIG_PORT: u16 = 0xcf8;
const PCI_CONFIG_PORT_LEN: u16 = 8;

/// Where vCPU exits go. Reads nobody claims return all-ones, as on a real
/// bus; writes nobody claims are dropped.
pub struct IoBus {
    pio: IoManager,
    pci: Arc<Mutex<PciBus>>,
}

impl IoBus {
    /// A bus with nothing on it, for tests of the vCPU threads.
    #[cfg(test)]
    pub(crate) fn empty() -> Self {
        Self {
            pio: IoManager::new(),
            pci: Arc::new(Mutex::new(PciBus::new((0, 0), (0, 0)))),
        }
    }

    pub fn pio_read(&self, port: u16, data: &mut [u8]) {
        if self.pio.pio_read(PioAddress(port), data).is_err() {
            data.fill(0xff);
        }
    }

    pub fn pio_write(&self, port: u16, data: &[u8]) {
        let _ = self.pio.pio_write(PioAddress(port), data);
    }

    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) {
        if !self.pci().mmio_read(addr, data) {
            log::debug!("Unclaimed MMIO read at {addr:#x}");
            data.fill(0xff);
        }
    }

    pub fn mmio_write(&self, addr: u64, data: &[u8]) {
        if !self.pci().mmio_write(addr, data) {
            log::debug!("Unclaimed MMIO write at {addr:#x}");
        }
    }

    fn pci(&self) -> std::sync::MutexGuard<'_, PciBus> {
        crate::lock(&self.pci)
    }
}

/// Adapts the PCI bus's configuration ports to the PIO bus.
struct PciConfigIo(Arc<Mutex<PciBus>>);

impl DevicePio for PciConfigIo {
    fn pio_read(&self, base: PioAddress, offset: PioAddressOffset, data: &mut [u8]) {
        let bus = crate::lock(&self.0);
        bus.pio_read(base.0 + offset, data);
    }

    fn pio_write(&self, base: PioAddress, offset: PioAddressOffset, data: &[u8]) {
        let mut bus = crate::lock(&self.0);
        bus.pio_write(base.0 + offset, data);
    }
}

/// The devices' part of a VM snapshot.
#[derive(Debug, Serialize, Deserialize)]
pub struct DevicesSnapshot {
    pci: Snapshot,
    serial: Snapshot,
}

pub struct DeviceManager {
    bus: Arc<IoBus>,
    serial: Arc<Mutex<Serial>>,
    serial_room: EventFd,
    counters: Vec<CounterSource>,
}

/// One device's counters for `vm.counters`, kept apart from the device on
/// the bus so that reading them never waits for a vCPU's MMIO exit.
struct CounterSource {
    /// `"pvrdma"`, `"vmxnet3"` or `"virtio-blk"`.
    kind: &'static str,
    /// The option that made it and its index among them: `disk0`, `net0`,
    /// `pvrdma1` (both functions of a PVRDMA slot).
    id: String,
    /// The port's MAC, for a NIC or PVRDMA.
    mac: Option<MacAddr>,
    slot: u8,
    function: u8,
    handle: Arc<dyn DeviceCounters>,
}

impl CounterSource {
    /// The API's form: names as strings, the PCI address as `lspci` shows
    /// it, and the QP list only for devices that have QPs.
    fn read(&self) -> api::DeviceCountersInfo {
        let named = |values: Vec<(&str, u64)>| {
            values
                .into_iter()
                .map(|(name, value)| (name.to_owned(), value))
                .collect()
        };
        api::DeviceCountersInfo {
            kind: self.kind.to_owned(),
            id: self.id.clone(),
            mac: self.mac.map(|m| m.to_string()),
            pci: format!("00:{:02x}.{}", self.slot, self.function),
            counters: named(self.handle.values()),
            qps: self.handle.queue_pairs().map(|qps| {
                qps.into_iter()
                    .map(|qp| api::QpCountersInfo {
                        qpn: qp.qpn,
                        error: qp.error,
                        counters: named(qp.values),
                    })
                    .collect()
            }),
        }
    }
}

/// The GET_ID serial of disk `index`: what the guest sees in
/// /sys/block/vdX/serial (20 bytes at most).
fn disk_id(index: usize) -> String {
    format!("pvrdma-vmm-disk{index}")
}

impl std::fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceManager")
    }
}

fn serial_output(cfg: &SerialConfig) -> Result<Box<dyn Write + Send>, DeviceError> {
    Ok(match cfg {
        SerialConfig::Tty => Box::new(io::stdout()),
        SerialConfig::Off => Box::new(io::sink()),
        SerialConfig::File(p) => Box::new(
            File::create(p).map_err(|e| DeviceError::SerialFile(p.display().to_string(), e))?,
        ),
    })
}

fn register_pio<D: DevicePio + Send + Sync + 'static>(
    io: &mut IoManager,
    name: &'static str,
    base: u16,
    len: u16,
    dev: D,
) -> Result<(), DeviceError> {
    let range = PioRange::new(PioAddress(base), len).map_err(|e| DeviceError::Pio(name, e))?;
    io.register_pio(range, Arc::new(dev))
        .map_err(|e| DeviceError::Pio(name, e))
}

impl DeviceManager {
    pub fn new(
        config: &VmConfig,
        mem: &Arc<GuestMemory>,
        vm: &Vm,
        exit: Arc<ExitSignal>,
        incoming: bool,
    ) -> Result<Self, DeviceError> {
        let mut pio = IoManager::new();
        let serial_irq = EventFd::new(EFD_NONBLOCK).map_err(DeviceError::EventFd)?;
        register_irqfd(vm.fd(), &serial_irq, SERIAL_IRQ)?;
        let serial_room = EventFd::new(EFD_NONBLOCK).map_err(DeviceError::EventFd)?;
        let room = InputRoom(serial_room.try_clone().map_err(DeviceError::EventFd)?);
        let serial = Arc::new(Mutex::new(Serial::new(
            SerialIrq(serial_irq),
            room,
            serial_output(&config.serial)?,
        )));
        register_pio(
            &mut pio,
            "serial",
            SERIAL_PORT,
            SERIAL_PORT_LEN,
            serial.clone(),
        )?;
        register_pio(
            &mut pio,
            "i8042",
            I8042_PORT,
            I8042_PORT_LEN,
            Mutex::new(I8042::new(exit.clone())),
        )?;
        register_pio(
            &mut pio,
            "ACPI PM",
            ACPI_PM_PORT,
            ACPI_PM_PORT_LEN,
            Mutex::new(AcpiPm::new(exit)),
        )?;

        let mmio32 = (
            layout::MMIO_HOLE_START,
            layout::MMIO32_END - layout::MMIO_HOLE_START,
        );
        let pci = Arc::new(Mutex::new(PciBus::new(
            mmio32,
            layout::mmio64_window(config.memory),
        )));
        register_pio(
            &mut pio,
            "PCI config",
            PCI_CONFIG_PORT,
            PCI_CONFIG_PORT_LEN,
            PciConfigIo(pci.clone()),
        )?;

        let hooks = DeviceHooks {
            msi: vm.msi_router(),
            ioevents: vm.ioevent_registrar(),
        };
        let mut counters = Vec::new();
        for (index, disk) in config.disks.iter().enumerate() {
            let cfg = BlockConfig {
                path: disk.path.clone(),
                readonly: disk.readonly,
                id: disk_id(index),
            };
            let block = Block::new(&cfg, mem.clone(), hooks.clone())
                .map_err(|e| DeviceError::Disk(disk.path.display().to_string(), e))?;
            let mut bus = crate::lock(&pci);
            let slot = bus
                .next_free_slot()
                .ok_or(DeviceError::NoSlot("virtio-blk"))?;
            counters.push(CounterSource {
                kind: "virtio-blk",
                id: format!("disk{index}"),
                mac: None,
                slot,
                function: 0,
                handle: block.counters(),
            });
            bus.add_device(slot, 0, Arc::new(Mutex::new(block)))
                .map_err(DeviceError::Pci)?;
            log::info!(
                "virtio-blk {} at 00:{slot:02x}.0{}",
                disk.path.display(),
                if disk.readonly { " (read-only)" } else { "" }
            );
        }
        for (index, net) in config.nets.iter().enumerate() {
            let mut bus = crate::lock(&pci);
            let id = format!("net{index}");
            add_vmxnet3(&mut bus, net, id, false, mem, &hooks, &mut counters)?;
        }
        for (index, rdma) in config.pvrdma.iter().enumerate() {
            let mut bus = crate::lock(&pci);
            // One converged slot per device: the NIC at function 0 owns the
            // port, PVRDMA at function 1 follows it (the guest driver pairs
            // them by slot). Each device is its own HCA: QPNs, keys and the
            // same-host socket (named by the MAC) are its own.
            let id = format!("pvrdma{index}");
            let (slot, port, tap) = add_vmxnet3(
                &mut bus,
                &rdma.net,
                id.clone(),
                true,
                mem,
                &hooks,
                &mut counters,
            )?;
            let cfg = pvrdma::PvrdmaConfig {
                gid_type: rdma.gid,
                limits: rdma.budget.limits()?,
                local_dir: rdma.local.clone(),
                // The source VMM still holds the same-host socket of the
                // MAC while it migrates the VM here.
                local_takeover: incoming,
                share_memory: rdma.share_memory,
                busy_poll: rdma.poll_us.map_or(pvrdma::DEFAULT_BUSY_POLL, |us| {
                    std::time::Duration::from_micros(us.into())
                }),
                worker_cpus: rdma.worker_cpus.clone(),
                ..pvrdma::PvrdmaConfig::default()
            };
            let dev = Pvrdma::new(&cfg, port, tap, mem.clone(), hooks.clone())
                .map_err(DeviceError::Pvrdma)?;
            log::info!("PVRDMA {id} ({:?}) at 00:{slot:02x}.1", rdma.gid);
            if !rdma.worker_cpus.is_empty() {
                log::info!(
                    "PVRDMA {id}: its worker runs on host CPUs {:?}",
                    rdma.worker_cpus
                );
            }
            counters.push(CounterSource {
                kind: "pvrdma",
                id,
                mac: Some(rdma.net.mac),
                slot,
                function: 1,
                handle: dev.counters(),
            });
            bus.add_device(slot, 1, Arc::new(Mutex::new(dev)))
                .map_err(DeviceError::Pci)?;
        }

        Ok(Self {
            bus: Arc::new(IoBus { pio, pci }),
            serial,
            serial_room,
            counters,
        })
    }

    /// Every device's counters, in PCI order, read while the devices run.
    pub fn counters(&self) -> Vec<api::DeviceCountersInfo> {
        self.counters.iter().map(CounterSource::read).collect()
    }

    pub fn bus(&self) -> Arc<IoBus> {
        self.bus.clone()
    }

    /// Console input for the guest (from the VMM's stdin in tty mode);
    /// returns how many bytes the receive FIFO took.
    pub fn serial_input(&self, bytes: &[u8]) -> usize {
        self.serial().enqueue_input(bytes)
    }

    /// Stops every device's own threads from touching guest memory or the
    /// network (vCPUs must be paused first: they are the other writers).
    pub fn pause(&self) -> Result<(), MigratableError> {
        self.bus.pci().pause()
    }

    /// Resumes the devices while the vCPUs are parked; [`Self::released`]
    /// follows once they run (see [`vm_migration::Pausable::resume_parked`]).
    pub fn resume_parked(&self) -> Result<(), MigratableError> {
        self.bus.pci().resume_parked()
    }

    pub fn released(&self) {
        self.bus.pci().released()
    }

    /// Adds `dev` in the next free slot, for tests of what a device does to
    /// the VM.
    #[cfg(test)]
    pub(crate) fn add_pci_function(
        &self,
        dev: Arc<Mutex<dyn pci::PciDevice>>,
    ) -> Result<(), DeviceError> {
        let mut pci = self.bus.pci();
        let slot = pci
            .next_free_slot()
            .ok_or(DeviceError::NoSlot("a test device"))?;
        pci.add_device(slot, 0, dev)
            .map(drop)
            .map_err(DeviceError::Pci)
    }

    /// Every device's state: the PCI bus (configuration spaces and each
    /// function) and the serial port. The legacy i8042 and ACPI PM ports
    /// keep no state between accesses.
    pub fn snapshot(&self) -> Result<DevicesSnapshot, MigratableError> {
        Ok(DevicesSnapshot {
            pci: self.bus.pci().snapshot()?,
            serial: self.serial().snapshot()?,
        })
    }

    /// The PCI functions' restore hints, taken while the VM runs (see
    /// [`vm_migration::Snapshottable::restore_hint`]).
    pub fn restore_hints(&self) -> Result<Snapshot, MigratableError> {
        self.bus.pci().restore_hints()
    }

    /// The migration that took [`Self::restore_hints`] ended.
    pub fn forget_hints(&self) {
        self.bus.pci().forget_hints();
    }

    /// Gives the PCI functions a source's [`Self::restore_hints`].
    pub fn prepare_restore(&self, hints: &Snapshot) -> Result<(), MigratableError> {
        self.bus.pci().prepare_restore(hints)
    }

    /// Puts a [`Self::snapshot`] back onto devices built from the same
    /// configuration.
    pub fn restore(&self, s: &DevicesSnapshot) -> Result<(), MigratableError> {
        self.serial().restore(&s.serial)?;
        self.bus.pci().restore(&s.pci)
    }

    fn serial(&self) -> std::sync::MutexGuard<'_, Serial> {
        crate::lock(&self.serial)
    }

    /// Readable when the guest has emptied the serial receive FIFO.
    pub fn serial_room(&self) -> &EventFd {
        &self.serial_room
    }
}

/// Adds a vmxnet3 NIC on `net`'s TAP as function 0 of a new slot, with its
/// counters under `id`; returns the slot and the port it publishes (for a
/// PVRDMA function beside it).
fn add_vmxnet3(
    bus: &mut PciBus,
    net: &NetConfig,
    id: String,
    multifunction: bool,
    mem: &Arc<GuestMemory>,
    hooks: &DeviceHooks,
    counters: &mut Vec<CounterSource>,
) -> Result<(u8, Arc<Port>, Arc<Tap>), DeviceError> {
    let tap = Arc::new(Tap::open(&net.tap).map_err(|e| DeviceError::Tap(net.tap.clone(), e))?);
    if let (true, Some(mtu)) = (tap.created(), net.mtu) {
        tap.set_mtu(mtu)
            .map_err(|e| DeviceError::Tap(net.tap.clone(), e))?;
    }
    let port = Arc::new(Port::new(net.mac.0, false));
    let cfg = Vmxnet3Config {
        mac: net.mac.0,
        multifunction,
    };
    let nic = Vmxnet3::new(&cfg, port.clone(), tap.clone(), mem.clone(), hooks.clone())
        .map_err(|e| DeviceError::Vmxnet3(net.tap.clone(), e))?;
    let slot = bus.next_free_slot().ok_or(DeviceError::NoSlot("vmxnet3"))?;
    counters.push(CounterSource {
        kind: "vmxnet3",
        id,
        mac: Some(net.mac),
        slot,
        function: 0,
        handle: nic.metrics(),
    });
    bus.add_device(slot, 0, Arc::new(Mutex::new(nic)))
        .map_err(DeviceError::Pci)?;
    log::info!(
        "vmxnet3 on TAP {} ({}) at 00:{slot:02x}.0",
        net.tap,
        if tap.created() { "created" } else { "existing" }
    );
    Ok((slot, port, tap))
}

fn register_irqfd(vm: &VmFd, fd: &EventFd, gsi: u32) -> Result<(), DeviceError> {
    vm.register_irqfd(fd, gsi).map_err(DeviceError::SerialIrq)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device with one counter and, if `qps`, one QP in error.
    struct Fake {
        qps: bool,
    }

    impl DeviceCounters for Fake {
        fn values(&self) -> Vec<(&'static str, u64)> {
            vec![("frames", 3)]
        }

        fn queue_pairs(&self) -> Option<Vec<pci::QueuePairCounters>> {
            self.qps.then(|| {
                vec![pci::QueuePairCounters {
                    qpn: 0x12,
                    error: true,
                    values: vec![("retry_exceeded", 1)],
                }]
            })
        }
    }

    #[test]
    fn counter_sources_read_as_the_api_shows_them() {
        let source = |kind, id: &str, slot, function, qps| CounterSource {
            kind,
            id: id.to_owned(),
            mac: (kind == "pvrdma").then_some(MacAddr([2, 0, 0, 0, 0, 0x10])),
            slot,
            function,
            handle: Arc::new(Fake { qps }),
        };
        let json = serde_json::to_value([
            source("virtio-blk", "disk0", 1, 0, false).read(),
            source("pvrdma", "pvrdma1", 0x1f, 1, true).read(),
        ])
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!([
                {"kind": "virtio-blk", "id": "disk0", "pci": "00:01.0", "counters": {"frames": 3}},
                {"kind": "pvrdma", "id": "pvrdma1", "mac": "02:00:00:00:00:10", "pci": "00:1f.1",
                 "counters": {"frames": 3},
                 "qps": [{"qpn": 18, "error": true, "counters": {"retry_exceeded": 1}}]}
            ])
        );
    }
}

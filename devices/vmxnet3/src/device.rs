// SPDX-License-Identifier: Apache-2.0
//! The PCI function: identity, BARs, registers, commands, activation, the
//! TX doorbells' ioeventfds, and pausing and migrating it all. Runs on vCPU
//! and VMM threads (under the bus's lock of this device); the data path is
//! the worker's.

use std::io;
use std::sync::Arc;

use device_worker::WorkerHandle;
use log::{error, info, warn};
use net_port::{FrameBackend, Port, PortEvent};
use pci::{
    BarKind, BarSpec, DeviceHooks, IoEventDoorbells, Msix, MsixError, PciBusError,
    PciConfiguration, PciDevice, PciHeader,
};
use vm_memory::{GuestAddress, GuestAddressSpace};
use vm_migration::{MigratableError, Pausable, Snapshot, Snapshottable};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::interrupt::Interrupts;
use crate::metrics::{Vmxnet3Counters, Vmxnet3Metrics};
use crate::persist::{self, Restored};
use crate::regs::{
    txprod_address, Command, PtReg, Regs, VdReg, ACTIVATE_FAILED, CONF_INTR_AUTO, LINK_DOWN,
    LINK_UP, MAX_TX_QUEUES, MSIX_BAR, MSIX_BAR_SIZE, MSIX_PBA_OFFSET, MSIX_TABLE_OFFSET,
    NUM_VECTORS, PT_BAR, REG_BAR_SIZE, UVRS_V1, VD_BAR, VRRS_REV1,
};
use crate::shared::{check_device_conf, write_queue_stats, write_queue_status, write_tx_threshold};
use crate::worker::{lock, spawn_worker, Active, RunState, SharedState, SpawnError, WorkerParts};

const VMWARE_VENDOR_ID: u16 = 0x15ad;
const VMXNET3_DEVICE_ID: u16 = 0x07b0;
const VMXNET3_REVISION: u8 = 1;
/// PCI class "network controller, Ethernet".
const PCI_CLASS_NETWORK: u8 = 0x02;
const PCI_SUBCLASS_ETHERNET: u8 = 0x00;

/// How the VMM configures the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vmxnet3Config {
    /// The permanent MAC address (`--net ...,mac=`); the guest may change
    /// the one in use through MACL/MACH.
    pub mac: [u8; 6],
    /// Set the multi-function bit: required when another function (PVRDMA
    /// at function 1) shares the slot, or the guest never scans it.
    pub multifunction: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum Vmxnet3Error {
    #[error("Failed to declare BAR {0}")]
    Bar(usize, #[source] PciBusError),
    #[error("Failed to set up MSI-X")]
    Msix(#[source] MsixError),
    #[error("Failed to create an eventfd")]
    EventFd(#[source] io::Error),
    #[error("Failed to start the device worker")]
    Worker(#[from] SpawnError),
}

/// A vmxnet3 NIC (15ad:07b0, revision 1) on a frame backend.
pub struct Vmxnet3<M: GuestAddressSpace + Send + 'static> {
    config: PciConfiguration,
    mem: M,
    port: Arc<Port>,
    state: SharedState,
    intr: Arc<Interrupts>,
    metrics: Arc<Vmxnet3Metrics>,
    /// TX doorbells, one per possible queue; the worker has clones.
    tx_evts: Vec<EventFd>,
    /// The TX doorbell ioeventfds, registered at BAR 0's base.
    doorbells: IoEventDoorbells,
    /// Makes the worker compare the carrier with what the guest last read.
    link_evt: EventFd,
    regs: Regs,
    /// Restored and not resumed since: the next resume announces the MAC.
    announce: bool,
    /// Stops and joins the worker when the device is dropped.
    _worker: WorkerHandle,
}

impl<M: GuestAddressSpace + Send + 'static> std::fmt::Debug for Vmxnet3<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vmxnet3")
            .field("mac", &self.regs.mac)
            .field("ioevent_base", &self.doorbells.base())
            .finish_non_exhaustive()
    }
}

impl<M: GuestAddressSpace + Send + 'static> Vmxnet3<M> {
    /// Builds the function (BARs, MSI-X vectors from `hooks.msi`), sets the
    /// port's MAC and carrier (the backend's link state), subscribes to the
    /// port's link changes and starts the worker thread. The TX doorbells
    /// are registered with `hooks.ioevents` once the guest enables BAR 0.
    pub fn new(
        config: &Vmxnet3Config,
        port: Arc<Port>,
        backend: Arc<dyn FrameBackend>,
        mem: M,
        hooks: DeviceHooks,
    ) -> Result<Self, Vmxnet3Error> {
        let mut pci = PciConfiguration::new(PciHeader {
            vendor_id: VMWARE_VENDOR_ID,
            device_id: VMXNET3_DEVICE_ID,
            revision: VMXNET3_REVISION,
            class: PCI_CLASS_NETWORK,
            subclass: PCI_SUBCLASS_ETHERNET,
            prog_if: 0,
            subsystem_vendor_id: VMWARE_VENDOR_ID,
            subsystem_id: VMXNET3_DEVICE_ID,
            multifunction: config.multifunction,
            // No INTx: Linux uses MSI-X when offered (INTx would need ICR).
            interrupt_pin: 0,
        });
        for (index, size) in [
            (PT_BAR, REG_BAR_SIZE),
            (VD_BAR, REG_BAR_SIZE),
            (MSIX_BAR, MSIX_BAR_SIZE),
        ] {
            pci.add_bar(BarSpec {
                index,
                size,
                kind: BarKind::Mmio32,
                // Register reads have side effects (CMD).
                prefetchable: false,
            })
            .map_err(|e| Vmxnet3Error::Bar(index, e))?;
        }
        let msix = Msix::new(
            &mut pci,
            hooks.msi,
            NUM_VECTORS,
            MSIX_BAR,
            MSIX_TABLE_OFFSET,
            MSIX_PBA_OFFSET,
        )
        .map_err(Vmxnet3Error::Msix)?;
        let metrics = Arc::new(Vmxnet3Metrics::default());
        let intr = Arc::new(Interrupts::new(msix, metrics.clone()));

        let eventfd = || EventFd::new(EFD_NONBLOCK).map_err(Vmxnet3Error::EventFd);
        let tx_evts = (0..MAX_TX_QUEUES)
            .map(|_| eventfd())
            .collect::<Result<Vec<_>, _>>()?;
        let worker_tx_evts = tx_evts
            .iter()
            .map(|e| e.try_clone().map_err(Vmxnet3Error::EventFd))
            .collect::<Result<Vec<_>, _>>()?;
        let link_evt = eventfd()?;
        let listener_evt = link_evt.try_clone().map_err(Vmxnet3Error::EventFd)?;
        let device_link_evt = link_evt.try_clone().map_err(Vmxnet3Error::EventFd)?;
        // Only an eventfd write: listeners must not call back into the port
        // and may run on any thread, this one included.
        port.subscribe(move |event| {
            if matches!(event, PortEvent::Link(_)) {
                if let Err(e) = listener_evt.write(1) {
                    warn!("vmxnet3: cannot signal a link change: {e}");
                }
            }
        });
        port.set_mac(config.mac);
        port.set_carrier(backend.link_up());

        let state = SharedState::default();
        let worker = spawn_worker(WorkerParts {
            mem: mem.clone(),
            backend,
            port: port.clone(),
            state: state.clone(),
            intr: intr.clone(),
            metrics: metrics.clone(),
            tx_evts: worker_tx_evts,
            link_evt,
            kill_evt: eventfd()?,
        })?;
        info!("vmxnet3: MAC {}", format_mac(&config.mac));
        Ok(Vmxnet3 {
            config: pci,
            mem,
            port,
            state,
            intr,
            metrics,
            tx_evts,
            doorbells: IoEventDoorbells::new(hooks.ioevents, txprod_address, "vmxnet3", "TX queue"),
            link_evt: device_link_evt,
            regs: Regs {
                dsa: [0; 2],
                cmd_result: 0,
                mac: config.mac,
            },
            announce: false,
            _worker: worker,
        })
    }

    /// A snapshot of the device's counters.
    pub fn counters(&self) -> Vmxnet3Counters {
        self.metrics.counters()
    }

    /// The live counters, for a VMM that reads them without locking the
    /// device.
    pub fn metrics(&self) -> Arc<Vmxnet3Metrics> {
        self.metrics.clone()
    }

    fn read_pt(&self, offset: u64) -> u32 {
        match PtReg::decode(offset) {
            Some(PtReg::Imr(i)) => u32::from(self.intr.masked(i)),
            Some(PtReg::TxProd(_) | PtReg::RxProd) => 0,
            None => self.bad_access(PT_BAR, offset),
        }
    }

    fn write_pt(&mut self, offset: u64, value: u32) {
        match PtReg::decode(offset) {
            Some(PtReg::Imr(i)) => self.intr.set_masked(i, value & 1 != 0),
            Some(PtReg::TxProd(q)) => self.kick_tx(q),
            Some(PtReg::RxProd) => {}
            None => {
                self.bad_access(PT_BAR, offset);
            }
        }
    }

    fn read_vd(&self, offset: u64) -> u32 {
        let [m0, m1, m2, m3, m4, m5] = self.regs.mac;
        let [dsal, dsah] = self.regs.dsa;
        match VdReg::decode(offset) {
            Some(VdReg::Vrrs) => VRRS_REV1,
            Some(VdReg::Uvrs) => UVRS_V1,
            Some(VdReg::Dsal) => dsal,
            Some(VdReg::Dsah) => dsah,
            Some(VdReg::Cmd) => self.regs.cmd_result,
            Some(VdReg::Macl) => u32::from_le_bytes([m0, m1, m2, m3]),
            Some(VdReg::Mach) => u32::from_le_bytes([m4, m5, 0, 0]),
            // The driver reads events from DriverShared, never from here.
            Some(VdReg::Icr | VdReg::Ecr) => 0,
            None => self.bad_access(VD_BAR, offset),
        }
    }

    fn write_vd(&mut self, offset: u64, value: u32) {
        let bytes = value.to_le_bytes();
        match VdReg::decode(offset) {
            // Selecting revision 1 / UPT 1, the only ones offered.
            Some(VdReg::Vrrs | VdReg::Uvrs | VdReg::Icr) => {}
            Some(VdReg::Dsal) => self.regs.dsa[0] = value,
            Some(VdReg::Dsah) => self.regs.dsa[1] = value,
            Some(VdReg::Cmd) => self.handle_command(value),
            Some(VdReg::Macl) => {
                let [b0, b1, b2, b3] = bytes;
                let [_, _, _, _, m4, m5] = self.regs.mac;
                self.regs.mac = [b0, b1, b2, b3, m4, m5];
            }
            // Linux writes MACL then MACH: the new MAC is whole after MACH,
            // so that is when the port (and PVRDMA) hears about it.
            Some(VdReg::Mach) => {
                let [m0, m1, m2, m3, _, _] = self.regs.mac;
                let [b0, b1, _, _] = bytes;
                self.regs.mac = [m0, m1, m2, m3, b0, b1];
                self.port.set_mac(self.regs.mac);
            }
            Some(VdReg::Ecr) => {
                let st = lock(&self.state);
                if let Some(active) = &st.active {
                    active.ack_events(&*self.mem.memory(), value);
                }
            }
            None => {
                self.bad_access(VD_BAR, offset);
            }
        }
    }

    /// Counts (and reads as 0) an access that hits no register.
    fn bad_access(&self, bar: usize, offset: u64) -> u32 {
        count_warn!(
            self.metrics.reg_bad_access,
            "access to BAR {bar} at {offset:#x} hits no register"
        );
        0
    }

    fn kick_tx(&self, queue: usize) {
        if let Some(evt) = self.tx_evts.get(queue) {
            if let Err(e) = evt.write(1) {
                error!("vmxnet3: cannot signal TX queue {queue}: {e}");
            }
        }
    }

    fn handle_command(&mut self, value: u32) {
        let Some(cmd) = Command::from_u32(value) else {
            count_warn!(self.metrics.cmd_unknown, "unknown command {value:#x}");
            self.regs.cmd_result = 0;
            return;
        };
        self.regs.cmd_result = match cmd {
            Command::ActivateDev => self.handle_activate(),
            Command::QuiesceDev => self.handle_quiesce(),
            Command::ResetDev => self.handle_reset(),
            Command::GetLink => self.handle_get_link(),
            Command::GetStats => self.handle_get_stats(),
            Command::GetConfIntr => CONF_INTR_AUTO,
            // Receive filters: the device is promiscuous and the guest's
            // stack drops what is not for it. RSS: every frame goes to RX
            // queue 0. Moderation, wake-up filters, features, coalescing,
            // memory regions: nothing to configure. Queue status is written
            // when a queue stops. The remaining GETs have no meaning at
            // revision 1 or no reader in Linux, and read 0.
            Command::UpdateRxMode
            | Command::UpdateMacFilters
            | Command::UpdateVlanFilters
            | Command::UpdateRssidt
            | Command::UpdateIml
            | Command::UpdatePmcfg
            | Command::UpdateFeature
            | Command::LoadPlugin
            | Command::SetCoalesce
            | Command::RegisterMemregs
            | Command::SetRssFields
            | Command::GetQueueStatus
            | Command::GetPermMacLo
            | Command::GetPermMacHi
            | Command::GetDidLo
            | Command::GetDidHi
            | Command::GetDevExtraInfo
            | Command::GetTxdataDescSize
            | Command::GetCoalesce
            | Command::GetRssFields
            | Command::GetMaxQueuesConf => 0,
        };
    }

    /// Validates DriverShared and starts serving its queues: 0, or
    /// non-zero with the device left inactive.
    fn handle_activate(&mut self) -> u32 {
        let [dsal, dsah] = self.regs.dsa;
        let shared = GuestAddress(u64::from(dsah) << 32 | u64::from(dsal));
        let mem = self.mem.memory();
        let conf = match check_device_conf(&*mem, shared) {
            Ok(conf) => conf,
            Err(e) => {
                count_warn!(self.metrics.activate_rejected, "ACTIVATE_DEV refused: {e}");
                return ACTIVATE_FAILED;
            }
        };
        let descs = conf.tx.iter().map(|q| (q.desc, true));
        for (desc, tx) in descs.chain(conf.rx.iter().map(|q| (q.desc, false))) {
            // Both inside the queue descriptors just read.
            let result = write_queue_status(&*mem, desc, false, 0).and_then(|()| {
                if tx {
                    write_tx_threshold(&*mem, desc)
                } else {
                    Ok(())
                }
            });
            if let Err(e) = result {
                error!(
                    "vmxnet3: cannot initialise queue descriptor {:#x}: {e}",
                    desc.0
                );
            }
        }
        let (mtu, tx_queues, rx_queues) = (conf.mtu, conf.tx.len(), conf.rx.len());
        self.intr.set_auto_mask(conf.auto_mask);
        lock(&self.state).active = Some(Active::new(conf));
        self.port.set_mtu(mtu);
        self.port.set_active(true);
        count_log!(
            Info,
            self.metrics.activate_ok,
            "activated with {tx_queues} TX and {rx_queues} RX queues, MTU {mtu}"
        );
        // Packets the driver posted before activating.
        for queue in 0..tx_queues {
            self.kick_tx(queue);
        }
        0
    }

    /// Stops the data path; once this returns the worker no longer touches
    /// the rings (it takes the state lock for each batch).
    fn handle_quiesce(&mut self) -> u32 {
        if lock(&self.state).active.take().is_some() {
            count_log!(Info, self.metrics.quiesce_ok, "quiesced");
        }
        self.port.set_active(false);
        0
    }

    /// QUIESCE plus interrupt state and statistics back to their reset
    /// values: what the device did before a reset shows in nothing after
    /// it. The MAC stays: Linux writes it again before the next activation,
    /// and a flip to the permanent one and back would churn PVRDMA's GIDs.
    fn handle_reset(&mut self) -> u32 {
        self.handle_quiesce();
        self.intr.reset();
        let mut st = lock(&self.state);
        st.tx_stats = Default::default();
        st.rx_stats = Default::default();
        0
    }

    /// The carrier, whether or not the device is active: Linux asks at
    /// probe time (to set the netdev's carrier) and after activation.
    fn handle_get_link(&mut self) -> u32 {
        let carrier = self.port.state().carrier;
        lock(&self.state).reported_link = carrier;
        if carrier {
            LINK_UP
        } else {
            LINK_DOWN
        }
    }

    fn handle_get_stats(&mut self) -> u32 {
        let st = lock(&self.state);
        let Some(active) = &st.active else {
            return 0;
        };
        let mem = self.mem.memory();
        let tx = active
            .tx
            .iter()
            .map(|q| q.conf.desc)
            .zip(st.tx_stats.iter().map(|s| s.upt()));
        let rx = active
            .rx
            .iter()
            .map(|q| q.conf.desc)
            .zip(st.rx_stats.iter().map(|s| s.upt()));
        for (desc, stats) in tx.chain(rx) {
            if let Err(e) = write_queue_stats(&*mem, desc, &stats) {
                error!("vmxnet3: cannot write statistics at {:#x}: {e}", desc.0);
            }
        }
        0
    }

    /// Moves the TX doorbell ioeventfds to where BAR 0 is now: nowhere
    /// while memory decoding is off.
    fn sync_ioevents(&mut self) {
        let want = self
            .config
            .memory_enabled()
            .then(|| self.config.bar_address(PT_BAR))
            .flatten();
        self.doorbells.sync(want, &self.tx_evts);
    }
}

impl<M: GuestAddressSpace + Send + 'static> PciDevice for Vmxnet3<M> {
    fn config(&self) -> &PciConfiguration {
        &self.config
    }

    fn config_mut(&mut self) -> &mut PciConfiguration {
        &mut self.config
    }

    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if bar == MSIX_BAR {
            let msix = self.intr.msix();
            match offset.checked_sub(u64::from(MSIX_PBA_OFFSET)) {
                Some(pba) => msix.read_pba(pba, data),
                None => msix.read_table(offset, data),
            }
            return;
        }
        let Ok(out) = <&mut [u8; 4]>::try_from(data) else {
            self.bad_access(bar, offset);
            return;
        };
        let value = match bar {
            PT_BAR => self.read_pt(offset),
            VD_BAR => self.read_vd(offset),
            _ => self.bad_access(bar, offset),
        };
        *out = value.to_le_bytes();
    }

    fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]) {
        if bar == MSIX_BAR {
            // The PBA is read-only.
            if offset < u64::from(MSIX_PBA_OFFSET) {
                self.intr.msix().write_table(offset, data);
            }
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            self.bad_access(bar, offset);
            return;
        };
        let value = u32::from_le_bytes(bytes);
        match bar {
            PT_BAR => self.write_pt(offset, value),
            VD_BAR => self.write_vd(offset, value),
            _ => {
                self.bad_access(bar, offset);
            }
        }
    }

    fn config_written(&mut self, _reg: usize) {
        self.intr.msix().config_written(&self.config);
        // The command register's memory enable or a BAR may have changed.
        self.sync_ioevents();
    }

    fn bar_moved(&mut self, bar: usize, _old: u64, _new: u64) {
        if bar == PT_BAR {
            self.sync_ioevents();
        }
    }
}

/// Pausing holds the worker off the guest, the backend and the interrupts
/// (see the `worker` module); the register side keeps working, as vCPUs
/// may still be finishing an MMIO access: it never touches the rings, and
/// the doorbells it rings wait in their eventfds like the guest's.
impl<M: GuestAddressSpace + Send + 'static> Pausable for Vmxnet3<M> {
    /// Returns once the worker is between two batches; it starts no other
    /// until [`Self::resume`]. Frames arriving meanwhile stay queued in
    /// the backend.
    fn pause(&mut self) -> Result<(), MigratableError> {
        self.state.set_run(RunState::Paused);
        Ok(())
    }

    /// Lets the worker serve what waited; if the device was restored since
    /// its last resume, the worker starts by announcing the MAC.
    fn resume(&mut self) -> Result<(), MigratableError> {
        if std::mem::take(&mut self.announce) {
            lock(&self.state).announce = Some(self.regs.mac);
            if let Err(e) = self.link_evt.write(1) {
                warn!("vmxnet3: cannot wake the worker to announce the MAC: {e}");
            }
        }
        self.state.set_run(RunState::Running);
        Ok(())
    }
}

impl<M: GuestAddressSpace + Send + 'static> Snapshottable for Vmxnet3<M> {
    fn id(&self) -> String {
        persist::ID.into()
    }

    /// Registers, interrupts and MSI-X table, and the queues with the
    /// device's place in every ring (see the `persist` module); the
    /// configuration space is the bus's to save.
    fn snapshot(&mut self) -> Result<Snapshot, MigratableError> {
        persist::save(&self.regs, &lock(&self.state), &self.intr)
    }

    /// Runs after the bus put the configuration space back, on a device
    /// built with the same [`Vmxnet3Config`]. Everything is checked before
    /// anything changes, so a refused snapshot leaves the device as it
    /// was. A restored device is paused: it serves its queues (first the
    /// doorbells the source left, then the backend) from the next
    /// [`Pausable::resume`], which announces its MAC too.
    fn restore(&mut self, snapshot: &Snapshot) -> Result<(), MigratableError> {
        let Restored {
            regs,
            intr,
            msix,
            state,
        } = persist::load(snapshot, &*self.mem.memory())?;
        {
            let mut table = self.intr.msix();
            table.set_state(&msix).map_err(persist::msix_error)?;
            table.config_written(&self.config);
        }
        self.intr.restore(&intr);
        let mtu = state.active.as_ref().map(|active| active.mtu);
        *lock(&self.state) = state;
        self.regs = regs;
        self.port.set_mac(regs.mac);
        if let Some(mtu) = mtu {
            self.port.set_mtu(mtu);
        }
        self.port.set_active(mtu.is_some());
        self.sync_ioevents();
        // Doorbells rung on the source after its last pass, and the carrier
        // here against what the guest last read, for when the worker runs.
        for queue in 0..MAX_TX_QUEUES {
            self.kick_tx(queue);
        }
        if let Err(e) = self.link_evt.write(1) {
            warn!("vmxnet3: cannot signal a link check: {e}");
        }
        self.announce = true;
        info!("vmxnet3: restored, MAC {}", format_mac(&regs.mac));
        Ok(())
    }
}

impl<M: GuestAddressSpace + Send + 'static> Drop for Vmxnet3<M> {
    fn drop(&mut self) {
        // The worker serves nothing more: after a migration the guest runs
        // elsewhere, and what waited here must not go out twice.
        self.state.set_run(RunState::Stopping);
        self.doorbells.sync(None, &self.tx_evts);
        self.port.set_active(false);
    }
}

fn format_mac(mac: &[u8; 6]) -> String {
    let [a, b, c, d, e, f] = mac;
    format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
}

#[cfg(test)]
mod tests {
    //! The whole function through a real `PciBus`: config space over
    //! 0xCF8/0xCFC, registers over MMIO, a fake driver's rings in guest
    //! memory, mocks for KVM's irqfds and ioeventfds and for the backend.
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use std::sync::Mutex;
    use std::time::Duration;

    use net_port::{VnetHdr, VNET_HDR_F_NEEDS_CSUM, VNET_HDR_GSO_TCPV4};
    use vm_memory::bitmap::{AtomicBitmap, Bitmap};
    use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryRegion};

    use super::*;
    use crate::harness::*;
    use crate::test_utils::*;

    #[test]
    fn probe_sequence() {
        let mut h = Harness::new();
        assert_eq!(h.cfg_read(0), 0x07b0_15ad);
        assert_eq!(
            h.cfg_read(2),
            0x0200_0001,
            "Ethernet controller, revision 1"
        );
        assert_eq!(h.cfg_read(11), 0x07b0_15ad);
        assert_ne!(h.cfg_read(3) & 1 << 23, 0, "multi-function");
        // Three 32-bit memory BARs.
        assert_eq!(h.bars.len(), 3);
        for reg in 4..7 {
            assert_eq!(h.cfg_read(reg) & 0xf, 0);
        }
        let cap = h.cfg_read(0x34 / 4) & 0xff;
        assert_eq!(h.cfg_read(cap / 4) >> 16 & 0x7ff, 24, "25 MSI-X vectors");
        assert_eq!(h.cfg_read(cap / 4 + 1), 2, "table at BAR 2 + 0");

        // vmxnet3_probe_device.
        assert_eq!(h.read(VD_BAR, VRRS), 1);
        h.write(VD_BAR, VRRS, 1);
        assert_eq!(h.read(VD_BAR, UVRS), 1);
        h.write(VD_BAR, UVRS, 1);
        assert_eq!(h.cmd(GET_CONF_INTR), 0, "AUTO type, AUTO mask");
        assert_eq!(h.read(VD_BAR, MACL), u32::from_le_bytes([2, 0x50, 0x56, 0]));
        assert_eq!(h.read(VD_BAR, MACH), 0x0100);
        assert_eq!(h.port.state().mac, MAC);
        // The carrier, before any activation.
        assert_eq!(h.cmd(GET_LINK), 10_000 << 16 | 1);
        h.port.set_carrier(false);
        assert_eq!(h.cmd(GET_LINK), 0);
        assert_eq!(h.cmd(0xdead_beef), 0, "unknown commands read 0");
        assert_eq!(h.counters().cmd_unknown, 1);
        // Odd-sized accesses and holes hit nothing.
        let mut byte = [0u8; 1];
        assert!(h.bus.mmio_read(h.bar(VD_BAR) + VRRS, &mut byte));
        assert_eq!(byte, [0]);
        assert_eq!(h.read(VD_BAR, 0x48), 0);
        h.write(PT_BAR, 0x604, 1);
        assert_eq!(h.counters().reg_bad_access, 3);
        assert!(!h.port.state().active);
    }

    #[test]
    fn activation_sets_up_queues_port_and_doorbells() {
        let mut h = Harness::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        h.port.subscribe(move |e| s.lock().unwrap().push(e));
        h.activate(4, 2, 9000);
        assert!(h.port.state().active);
        assert_eq!(h.port.state().mtu, 9000);
        assert!(seen.lock().unwrap().contains(&PortEvent::Link(true)));
        for q in 0..4 {
            let threshold: u32 = h
                .mem
                .read_obj(GuestAddress(h.layout.queue_desc(q) + 4))
                .unwrap();
            assert_eq!(threshold, 1, "TX queue {q} rings the doorbell per packet");
        }
        let bar0 = h.bar(PT_BAR);
        let registered: Vec<u64> = h.ioevents.doorbells().iter().map(|(a, _)| *a).collect();
        assert_eq!(
            registered,
            (0..8).map(|q| bar0 + 0x600 + 8 * q).collect::<Vec<_>>()
        );
        // Re-activation (reset work: quiesce, reset, activate) works.
        assert_eq!(h.cmd(QUIESCE), 0);
        assert!(!h.port.state().active);
        assert_eq!(h.cmd(RESET), 0);
        h.activate(1, 1, 1500);
        assert!(h.port.state().active);
        assert_eq!(h.cmd(UPDATE_RX_MODE), 0);
        let c = h.counters();
        assert_eq!(
            (c.activate_ok, c.quiesce_ok),
            (2, 1),
            "RESET after QUIESCE stops nothing"
        );
    }

    /// Activating again gives the driver zeroed rings, as its fresh
    /// allocations would be (the fuzz target relies on it), and leaves what
    /// lies between them alone.
    #[test]
    fn activation_clears_the_rings() {
        let mut h = Harness::new();
        h.activate(2, 2, 1500);
        h.send_one(1, &frame(100, 1), Sop::default());
        h.wait_tx_completions(1, 1);
        h.post_rx(1, 0, 4, 1536, |_| false);
        let l = h.layout.clone();
        let rings = [l.tx_ring(1), l.tx_comp(1), l.rx_ring(1, 0), l.rx_comp(1)];
        for ring in rings {
            h.mem
                .write_slice(&[0xaa; 8], GuestAddress(ring + 0xfffc))
                .unwrap();
        }
        // RX queue 1's fourth slot holds no ring.
        let between = l.rx_comp(1) + 0x1_0000;
        h.mem
            .write_slice(&[0xbb; 4], GuestAddress(between))
            .unwrap();
        h.cmd(RESET);
        assert_eq!(h.activate_with(l), 0);
        for ring in rings {
            let mut bytes = vec![0xffu8; 0x1_0000];
            h.mem.read_slice(&mut bytes, GuestAddress(ring)).unwrap();
            assert!(bytes.iter().all(|&b| b == 0), "ring {ring:#x}");
        }
        let mut bytes = [0u8; 4];
        h.mem.read_slice(&mut bytes, GuestAddress(between)).unwrap();
        assert_eq!(bytes, [0xbb; 4]);
    }

    #[test]
    fn activation_refused_for_hostile_driver_shared() {
        let mut h = Harness::new();
        let base = DriverLayout::new(1, 1, 64, 1500);
        let mut cases = Vec::new();
        let mut l = base.clone();
        l.magic = 0;
        cases.push(("bad magic", l));
        let mut l = base.clone();
        l.ring_size = 100;
        cases.push(("ring size", l));
        let mut l = base.clone();
        l.num_tx = 9;
        cases.push(("too many queues", l));
        let mut l = base.clone();
        l.rx_intr[0] = 2;
        cases.push(("intrIdx", l));
        let mut l = base.clone();
        l.tx_ring_base[0] = MEM_SIZE as u64 - 0x100;
        cases.push(("ring outside RAM", l));
        // The fake driver's descriptors run past the end of the address
        // space (found by the fuzz target: an overflow in the harness).
        let mut l = base.clone();
        (l.num_tx, l.num_rx) = (255, 255);
        l.queue_table = u64::MAX - 0x1_0000;
        cases.push(("queue table at the end of the address space", l));
        for (n, (what, layout)) in cases.into_iter().enumerate() {
            assert_ne!(h.activate_with(layout), 0, "{what} accepted");
            assert!(!h.port.state().active, "{what}");
            assert_eq!(h.counters().activate_rejected, n as u64 + 1);
        }
        // DriverShared itself outside RAM.
        h.write(VD_BAR, DSAL, 0xffff_f000);
        h.write(VD_BAR, DSAH, 0x10);
        assert_ne!(h.cmd(ACTIVATE), 0);
        // Nothing is served: a doorbell finds no queue.
        h.write(PT_BAR, 0x600, 1);
        h.backend.inject(frame(60, 0));
        wait_until("inactive drop", || h.counters().rx_inactive == 1);
        assert!(h.backend.take_sent().is_empty());
    }

    #[test]
    fn tx_single_and_multi_descriptor_frames() {
        let mut h = Harness::new();
        h.activate(2, 1, 1500);
        let one = frame(60, 1);
        let eop = h.send_one(0, &one, Sop::default());
        assert_eq!(h.wait_tx_completions(0, 1), vec![eop]);
        wait_until("TX interrupt", || h.router.fired(0) == 1);
        assert_eq!(h.backend.take_sent(), vec![(VnetHdr::default(), one)]);

        // Three buffers on queue 1, doorbell through the ioeventfd.
        let big = frame(1514, 7);
        let a = h.put_frame(1, &big[..100]);
        let b = h.put_frame(2, &big[100..1000]);
        let c = h.put_frame(3, &big[1000..]);
        let eop = h.post_tx(1, &[(a, 100), (b, 900), (c, 514)], Sop::default(), true);
        assert_eq!(eop, 2);
        let doorbell = h.ioevents.doorbells().swap_remove(1).1;
        doorbell.write(1).unwrap();
        assert_eq!(h.wait_tx_completions(1, 1), vec![2]);
        assert_eq!(h.backend.take_sent()[0].1, big);
        let c = h.counters();
        assert_eq!((c.tx_frames, c.tx_bytes), (2, 60 + 1514));

        // Many packets wrap the ring and flip both generations.
        for i in 0..100u32 {
            let f = frame(60 + i as usize, i as u8);
            h.send_one(0, &f, Sop::default());
            let done = h.wait_tx_completions(0, 1);
            assert_eq!(done, vec![(1 + i) % 64]);
            assert_eq!(h.backend.take_sent()[0].1, f);
        }
        // The device's write into guest RAM is in the dirty log.
        let comp = h.layout.tx_comp(0);
        let region = h.mem.find_region(GuestAddress(comp)).unwrap();
        assert!(region.bitmap().dirty_at(comp as usize));

        // GET_STATS: 101 unicast frames on queue 0.
        assert_eq!(h.cmd(GET_STATS), 0);
        let stats = |off| {
            h.mem
                .read_obj::<u64>(GuestAddress(h.layout.queue_desc(0) + 88 + off))
                .unwrap()
        };
        assert_eq!(stats(16), 101, "ucastPktsTxOK");
    }

    #[test]
    fn tx_offloads_become_vnet_headers() {
        let mut h = Harness::new();
        h.activate(1, 1, 1500);
        let frame4 = tcp4_frame(1000, 0);
        let csum = Sop {
            om: 2,
            hlen: 34,
            msscof: 34 + 16,
            tci: None,
        };
        h.send_one(0, &frame4, csum);
        h.wait_tx_completions(0, 1);
        let (hdr, sent) = h.backend.take_sent().pop().unwrap();
        assert_eq!(sent, frame4);
        assert_eq!(
            (hdr.flags, hdr.csum_start, hdr.csum_offset),
            (VNET_HDR_F_NEEDS_CSUM, 34, 16)
        );

        // A 60 KiB TSO frame in four 16 KiB descriptors (length field 0).
        let tso = tcp4_frame(60_000, 0);
        let mut bufs = Vec::new();
        for (i, chunk) in tso.chunks(16384).enumerate() {
            let addr = h.put_frame(i as u64, chunk);
            bufs.push((addr, chunk.len() as u32 & 0x3fff));
        }
        let sop = Sop {
            om: 3,
            hlen: 54,
            msscof: 1448,
            tci: Some(5),
        };
        let eop = h.post_tx(0, &bufs, sop, true);
        h.write(PT_BAR, 0x600, h.tx[0].fill);
        assert_eq!(h.wait_tx_completions(0, 1), vec![eop]);
        let (hdr, sent) = h.backend.take_sent().pop().unwrap();
        assert_eq!(sent.len(), tso.len() + 4, "VLAN tag inserted");
        assert_eq!(&sent[12..16], &[0x81, 0, 0, 5]);
        // The port learned the VLANs the guest's address was sent on.
        let seen = h.port.guest_vlans([10, 0, 0, 1].into()).unwrap();
        assert!(seen.contains(None) && seen.contains(Some(5)));
        assert_eq!(h.port.guest_vlans([10, 0, 0, 2].into()), None);
        assert_eq!(
            hdr,
            VnetHdr {
                flags: VNET_HDR_F_NEEDS_CSUM,
                gso_type: VNET_HDR_GSO_TCPV4,
                hdr_len: 58,
                gso_size: 1448,
                csum_start: 38,
                csum_offset: 16
            }
        );
        let c = h.counters();
        assert_eq!((c.tx_csum_frames, c.tx_tso_frames), (1, 1));
    }

    #[test]
    fn hostile_tx_descriptors_are_dropped_and_counted() {
        let mut h = Harness::new();
        h.activate(1, 1, 1500);
        let f = tcp4_frame(200, 0);
        let addr = h.put_frame(0, &f);
        let len = f.len() as u32;
        // Length field 0 means 16 KiB: beyond a non-TSO frame.
        h.post_tx(0, &[(addr, 0)], Sop::default(), true);
        // hlen beyond the frame; checksum field beyond the frame.
        let bad_hlen = Sop {
            om: 2,
            hlen: len + 1,
            msscof: len + 10,
            tci: None,
        };
        h.post_tx(0, &[(addr, len)], bad_hlen, true);
        let bad_cof = Sop {
            om: 2,
            hlen: 34,
            msscof: len - 1,
            tci: None,
        };
        h.post_tx(0, &[(addr, len)], bad_cof, true);
        // TSO with an MSS that does not fit 14 bits' sanity, hlen short.
        let bad_tso = Sop {
            om: 3,
            hlen: 40,
            msscof: 1448,
            tci: None,
        };
        h.post_tx(0, &[(addr, len)], bad_tso, true);
        // A buffer outside guest RAM.
        h.post_tx(0, &[(MEM_SIZE as u64 - 10, 100)], Sop::default(), true);
        // Backend refusal.
        h.post_tx(0, &[(addr, len)], Sop::default(), true);
        h.backend
            .fail_send
            .store(true, std::sync::atomic::Ordering::SeqCst);
        h.write(PT_BAR, 0x600, 0);
        assert_eq!(
            h.wait_tx_completions(0, 6),
            vec![0, 1, 2, 3, 4, 5],
            "all completed"
        );
        h.backend
            .fail_send
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let c = h.counters();
        assert_eq!(
            (
                c.tx_too_large,
                c.tx_bad_offload,
                c.tx_bad_desc,
                c.tx_backend_error
            ),
            (1, 3, 1, 1)
        );
        assert!(h.backend.take_sent().is_empty());
        // The queue still works.
        h.send_one(0, &f, Sop::default());
        h.wait_tx_completions(0, 1);
        assert_eq!(h.backend.take_sent().len(), 1);

        // A chain without EOP: TQERR, the queue stops.
        h.post_tx(0, &[(addr, 10), (addr, 10)], Sop::default(), false);
        h.write(PT_BAR, 0x600, 0);
        wait_until("TQERR", || h.ecr() & 2 != 0);
        let event = usize::from(h.layout.event_intr);
        wait_until("event interrupt", || h.router.fired(event) == 1);
        assert_eq!(
            h.queue_status(0),
            (1, 0x8000_0000),
            "stopped, VMXNET3_ERR_NOEOP"
        );
        assert_eq!(h.counters().tx_queue_error, 1);
        h.write(VD_BAR, ECR, 2);
        assert_eq!(h.ecr(), 0, "acknowledged");
        h.send_one(0, &f, Sop::default());
        std::thread::sleep(Duration::from_millis(50));
        assert!(h.tx_completions(0).is_empty(), "stopped until reset");
        // Reset and re-activation clear the status.
        h.cmd(QUIESCE);
        h.cmd(RESET);
        h.activate(1, 1, 1500);
        assert_eq!(h.queue_status(0), (0, 0));
        h.send_one(0, &f, Sop::default());
        h.wait_tx_completions(0, 1);
    }

    #[test]
    fn rx_1500_byte_frames_and_auto_masking() {
        let mut h = Harness::new();
        h.activate(1, 1, 1500);
        h.post_rx(0, 0, 63, 1536, |_| false);
        let f = frame(1514, 3);
        h.backend.inject(f.clone());
        let comps = h.wait_rx_completions(0, 1);
        assert_eq!(
            comps,
            vec![RxComp {
                idx: 0,
                rqid: 0,
                len: 1514,
                sop: true,
                eop: true
            }]
        );
        assert_eq!(h.read_rx(0, 0, 1514), f);
        wait_until("RX interrupt", || h.router.fired(0) == 1);
        assert_eq!(h.read(PT_BAR, 0), 1, "auto-masked when it fired");
        // Frames while masked: delivered, one interrupt on unmask.
        h.backend.inject(frame(100, 4));
        h.backend.inject(frame(200, 5));
        assert_eq!(h.wait_rx_completions(0, 2).len(), 2);
        assert_eq!(h.router.fired(0), 0);
        h.write(PT_BAR, 0, 0);
        assert_eq!(h.router.fired(0), 1);
        let c = h.counters();
        assert_eq!((c.rx_frames, c.rx_bytes), (3, 1514 + 300));
    }

    #[test]
    fn rx_9000_byte_frames_use_head_and_body_buffers() {
        let mut h = Harness::new();
        h.activate(1, 1, 9000);
        // Linux at MTU 9000: ring 0 is HEAD (3072), BODY, BODY, ...; ring 1 pages.
        h.post_rx(0, 0, 63, 0, |_| false);
        h.rx[0].fill[0] = 0;
        h.rx[0].gen[0] = true;
        for i in 0..63 {
            let body = i % 3 != 0;
            h.post_rx(0, 0, 1, if body { 4096 } else { 3072 }, |_| body);
        }
        h.post_rx(0, 1, 63, 4096, |_| true);
        let jumbo = frame(9014, 9);
        h.backend.inject(jumbo.clone());
        let comps = h.wait_rx_completions(0, 3);
        let summary: Vec<_> = comps
            .iter()
            .map(|c| (c.idx, c.rqid, c.len, c.sop, c.eop))
            .collect();
        assert_eq!(
            summary,
            vec![
                (0, 0, 3072, true, false),
                (1, 0, 4096, false, false),
                (2, 0, 1846, false, true)
            ]
        );
        let mut got = h.read_rx(0, 0, 3072);
        got.extend(h.read_rx(0, 1, 4096));
        got.extend(h.read_rx(0, 2, 1846));
        assert_eq!(got, jumbo);

        // A small frame takes the next HEAD; the next big one skips the two
        // BODY buffers after it and takes its BODY buffers from ring 0.
        h.backend.inject(frame(100, 1));
        let small = h.wait_rx_completions(0, 1);
        assert_eq!((small[0].idx, small[0].sop && small[0].eop), (3, true));
        h.backend.inject(frame(5000, 2));
        let comps = h.wait_rx_completions(0, 2);
        let idx: Vec<_> = comps.iter().map(|c| (c.idx, c.rqid)).collect();
        assert_eq!(idx, vec![(6, 0), (7, 0)]);

        // A HEAD followed by a HEAD: the BODY comes from ring 1 (rqID 0 + 1 queue).
        let l = h.layout.clone();
        let at = GuestAddress(l.rx_ring(0, 0) + 16 * 10 + 8);
        let dw2: u32 = h.mem.read_obj(at).unwrap();
        h.mem
            .write_obj(dw2 & !RXD_BODY & !0x3fff | 3072, at)
            .unwrap();
        h.backend.inject(frame(5000, 3));
        let comps = h.wait_rx_completions(0, 2);
        let idx: Vec<_> = comps.iter().map(|c| (c.idx, c.rqid, c.len)).collect();
        assert_eq!(idx, vec![(9, 0, 3072), (0, 1, 1928)]);

        // Longer than MTU + 22: dropped.
        h.backend.inject(frame(9023, 0));
        wait_until("too large", || h.counters().rx_too_large == 1);
    }

    #[test]
    fn rx_completion_ring_wraps_and_missing_buffers_are_counted() {
        let mut h = Harness::new();
        let mut layout = DriverLayout::new(1, 1, 32, 1500);
        layout.rx_comp_size = 32;
        assert_eq!(h.activate_with(layout), 0);
        // Nothing posted: the frame is dropped and counted.
        h.backend.inject(frame(60, 0));
        wait_until("no buffer", || h.counters().rx_no_buffer == 1);
        // 100 frames through a 32-entry ring, refilled as Linux does.
        h.post_rx(0, 0, 31, 1536, |_| false);
        for i in 0..100u32 {
            let f = frame(60 + i as usize, i as u8);
            h.backend.inject(f.clone());
            let c = h.wait_rx_completions(0, 1);
            assert_eq!(c[0].idx, i % 32);
            assert_eq!(h.read_rx(0, c[0].idx, f.len() as u32), f);
            h.post_rx(0, 0, 1, 1536, |_| false);
        }
        assert_eq!(h.counters().rx_frames, 100);
        assert_eq!(h.cmd(GET_STATS), 0);
        let d = h.layout.queue_desc(1);
        let stat = |off: u64| h.mem.read_obj::<u64>(GuestAddress(d + 88 + off)).unwrap();
        assert_eq!(
            (stat(16), stat(64)),
            (100, 1),
            "ucastPktsRxOK, pktsRxOutOfBuf"
        );
    }

    #[test]
    fn hostile_rx_buffers_stop_the_queue() {
        let mut h = Harness::new();
        h.activate(1, 1, 1500);
        // A HEAD in ring 1 is never posted by a driver.
        h.post_rx(0, 0, 1, 64, |_| false);
        h.post_rx(0, 1, 1, 4096, |_| false);
        h.backend.inject(frame(1000, 0));
        wait_until("RQERR", || h.ecr() & 1 != 0);
        assert_eq!(h.queue_status(1), (1, 0x8000_0003));
        assert_eq!(h.counters().rx_queue_error, 1);
        h.backend.inject(frame(60, 0));
        wait_until("stopped queue drops", || h.counters().rx_inactive == 1);

        // A zero-length HEAD, and a buffer outside RAM, after a reset.
        for bad in [0u32, 1] {
            h.cmd(QUIESCE);
            h.cmd(RESET);
            h.activate(1, 1, 1500);
            if bad == 0 {
                h.post_rx(0, 0, 1, 0, |_| false);
            } else {
                h.post_rx(0, 0, 1, 1536, |_| false);
                let at = GuestAddress(h.layout.rx_ring(0, 0));
                h.mem.write_obj(MEM_SIZE as u64 - 100, at).unwrap();
            }
            h.write(VD_BAR, ECR, 0xff);
            h.backend.inject(frame(500, 0));
            wait_until("RQERR again", || h.ecr() & 1 != 0);
        }
        // Headers that leave work undone are refused.
        h.backend.inject_with(
            VnetHdr {
                flags: VNET_HDR_F_NEEDS_CSUM,
                ..VnetHdr::default()
            },
            frame(60, 0),
        );
        wait_until("bad vnet header", || h.counters().rx_bad_vnet_hdr == 1);
    }

    #[test]
    fn backend_failure_stops_reception_without_spinning() {
        let mut h = Harness::new();
        h.activate(1, 1, 1500);
        h.post_rx(0, 0, 10, 1536, |_| false);
        h.backend
            .fail_recv
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Readable for good: a worker that kept polling would count on.
        h.backend.inject(frame(60, 0));
        wait_until("receive error", || h.counters().rx_backend_error == 1);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(h.counters().rx_backend_error, 1);
        // TX is unaffected.
        h.send_one(0, &frame(60, 1), Sop::default());
        h.wait_tx_completions(0, 1);
    }

    /// R12: every counter is reachable (a counter never incremented is
    /// either dead or untested).
    #[test]
    fn every_counter_is_exercised() {
        let mut h = Harness::new();
        h.cmd(0x1234);
        h.read(VD_BAR, 0x48);
        h.backend.inject(frame(60, 0));
        wait_until("rx_inactive", || h.counters().rx_inactive == 1);
        let mut bad = DriverLayout::new(1, 1, 64, 1500);
        bad.magic = 0;
        assert_ne!(h.activate_with(bad), 0);
        h.activate(1, 1, 9000);
        // TX: good, CSUM, TSO, then every drop reason, then a broken chain.
        let f = tcp4_frame(3000, 0);
        let addr = h.put_frame(0, &f);
        let len = f.len() as u32;
        let csum = Sop {
            om: 2,
            hlen: 34,
            msscof: 50,
            tci: None,
        };
        let tso = Sop {
            om: 3,
            hlen: 54,
            msscof: 1448,
            tci: None,
        };
        let bad_offload = Sop {
            om: 3,
            hlen: 50,
            msscof: 1448,
            tci: None,
        };
        h.post_tx(0, &[(addr, len)], csum, true);
        h.post_tx(0, &[(addr, len)], tso, true);
        h.post_tx(0, &[(addr, len)], bad_offload, true);
        h.post_tx(0, &[(addr, len), (addr, 0)], Sop::default(), true);
        h.post_tx(0, &[(MEM_SIZE as u64, 64)], Sop::default(), true);
        h.write(PT_BAR, 0x600, 0);
        h.wait_tx_completions(0, 5);
        h.backend
            .fail_send
            .store(true, std::sync::atomic::Ordering::SeqCst);
        h.send_one(0, &f, Sop::default());
        h.wait_tx_completions(0, 1);
        h.post_tx(0, &[(addr, 10)], Sop::default(), false);
        h.write(PT_BAR, 0x600, 0);
        wait_until("tx_queue_error", || h.counters().tx_queue_error == 1);
        // RX: no buffer, delivered, too large, bad header, broken buffer.
        h.backend.inject(frame(60, 0));
        wait_until("rx_no_buffer", || h.counters().rx_no_buffer == 1);
        h.post_rx(0, 0, 1, 1536, |_| false);
        h.backend.inject(frame(60, 0));
        h.backend.inject(frame(9100, 0));
        h.backend.inject_with(
            VnetHdr {
                gso_type: VNET_HDR_GSO_TCPV4,
                ..VnetHdr::default()
            },
            frame(60, 0),
        );
        wait_until("rx_bad_vnet_hdr", || h.counters().rx_bad_vnet_hdr == 1);
        h.post_rx(0, 0, 1, 0, |_| false);
        h.backend.inject(frame(60, 0));
        wait_until("rx_queue_error", || h.counters().rx_queue_error == 1);
        h.port.set_carrier(false);
        wait_until("link_events", || h.counters().link_events == 1);
        h.cmd(QUIESCE);
        h.backend
            .fail_recv
            .store(true, std::sync::atomic::Ordering::SeqCst);
        h.backend.inject(frame(60, 0));
        wait_until("rx_backend_error", || h.counters().rx_backend_error == 1);

        let json = serde_json::to_value(h.counters()).unwrap();
        let unused: Vec<_> = json
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, v)| v.as_u64() == Some(0))
            .map(|(k, _)| k.clone())
            .collect();
        assert!(unused.is_empty(), "never incremented: {unused:?}");
    }

    #[test]
    fn mac_change_updates_the_port() {
        let h = Harness::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        h.port.subscribe(move |e| s.lock().unwrap().push(e));
        let new = [0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee];
        h.write(VD_BAR, MACL, u32::from_le_bytes([0x02, 0xaa, 0xbb, 0xcc]));
        assert_eq!(h.port.state().mac, MAC, "whole after MACH");
        h.write(VD_BAR, MACH, 0xeedd);
        assert_eq!(h.port.state().mac, new);
        assert_eq!(*seen.lock().unwrap(), vec![PortEvent::Mac(new)]);
        assert_eq!(h.read(VD_BAR, MACL), 0xccbb_aa02);
        assert_eq!(h.read(VD_BAR, MACH), 0xeedd);
        // RESET keeps the MAC the driver set.
        h.cmd(RESET);
        assert_eq!(h.port.state().mac, new);
    }

    #[test]
    fn quiesce_and_reset_deactivate() {
        let mut h = Harness::new();
        h.activate(1, 1, 1500);
        h.post_rx(0, 0, 10, 1536, |_| false);
        assert_eq!(h.read(PT_BAR, 0), 0, "unmasked by the driver");
        assert_eq!(h.cmd(QUIESCE), 0);
        assert!(!h.port.state().active);
        h.backend.inject(frame(60, 0));
        wait_until("inactive drop", || h.counters().rx_inactive == 1);
        assert!(h.rx_completions(0).is_empty());
        let f = frame(60, 0);
        h.send_one(0, &f, Sop::default());
        std::thread::sleep(Duration::from_millis(50));
        assert!(h.tx_completions(0).is_empty());
        assert!(h.backend.take_sent().is_empty());
        assert_eq!(h.cmd(RESET), 0);
        assert_eq!(h.read(PT_BAR, 0), 1, "reset masks every vector");
    }

    #[test]
    fn carrier_changes_become_link_events() {
        let mut h = Harness::new();
        h.activate(1, 1, 1500);
        assert_eq!(h.cmd(GET_LINK) & 1, 1);
        let event = usize::from(h.layout.event_intr);
        h.port.set_carrier(false);
        wait_until("ECR LINK", || h.ecr() & 4 != 0);
        wait_until("event interrupt", || h.router.fired(event) == 1);
        assert_eq!(h.cmd(GET_LINK), 0);
        h.write(VD_BAR, ECR, 4);
        assert_eq!(h.ecr(), 0);
        assert!(!h.port.state().link_up());
        // The event vector was auto-masked; the driver unmasks it.
        h.write(PT_BAR, 8 * event as u64, 0);
        // The backend's own link state is polled.
        h.backend.set_link(false);
        h.port.set_carrier(true);
        wait_until("ECR LINK up", || h.ecr() & 4 != 0);
        wait_until("poll sees the backend down", || !h.port.state().carrier);
        assert!(h.counters().link_events >= 2);
    }

    #[test]
    fn paused_device_leaves_frames_and_doorbells_waiting() {
        let mut h = Harness::new();
        h.activate(1, 1, 1500);
        h.post_rx(0, 0, 10, 1536, |_| false);
        h.bus.pause().unwrap();
        let before = h.counters();
        // The dirty log, as migration reads it (one region from 0).
        let mem = h.mem.clone();
        let bitmap: &AtomicBitmap = (**mem.find_region(GuestAddress(0)).unwrap()).bitmap();
        bitmap.reset();
        // A doorbell through the register path and one through KVM's.
        let f = frame(60, 1);
        let addr = h.put_frame(0, &f);
        h.post_tx(0, &[(addr, 60)], Sop::default(), true);
        h.write(PT_BAR, 0x600, h.tx[0].fill);
        h.ioevents.doorbells()[0].1.write(1).unwrap();
        let rx = frame(100, 2);
        h.backend.inject(rx.clone());
        // Registers work meanwhile.
        assert_eq!(h.cmd(GET_LINK), 10_000 << 16 | 1);
        h.write(PT_BAR, 0, 0);
        assert_eq!(h.read(PT_BAR, 0), 0);
        std::thread::sleep(Duration::from_millis(100));
        assert!(h.tx_completions(0).is_empty());
        assert!(h.backend.take_sent().is_empty());
        assert!(h.rx_completions(0).is_empty());
        assert_eq!(h.backend.queued(), 1, "left in the backend");
        let device_writes = [
            h.layout.tx_comp(0),
            h.layout.rx_comp(0),
            Harness::rx_buf(0, 0),
            SHARED,
        ];
        for addr in device_writes {
            assert!(!bitmap.dirty_at(addr as usize), "{addr:#x} written");
        }
        assert_eq!(h.counters(), before, "nothing received or dropped");

        h.bus.resume().unwrap();
        h.wait_tx_completions(0, 1);
        assert_eq!(h.backend.take_sent(), vec![(VnetHdr::default(), f)]);
        let comps = h.wait_rx_completions(0, 1);
        assert_eq!(h.read_rx(0, comps[0].idx, comps[0].len), rx);
        assert_eq!(h.backend.queued(), 0);
        assert!(bitmap.dirty_at(h.layout.rx_comp(0) as usize));
        // Never restored: no announcement.
        assert!(h.backend.take_sent().is_empty());
    }

    #[test]
    fn dropping_a_paused_device_serves_nothing_more() {
        let mut h = Harness::new();
        h.activate(1, 1, 1500);
        h.bus.pause().unwrap();
        let f = frame(60, 1);
        let addr = h.put_frame(0, &f);
        h.post_tx(0, &[(addr, 60)], Sop::default(), true);
        h.write(PT_BAR, 0x600, h.tx[0].fill);
        std::thread::sleep(Duration::from_millis(20));
        let backend = h.backend.clone();
        drop(h);
        assert!(backend.take_sent().is_empty());
    }

    #[test]
    fn drop_unregisters_doorbells_and_stops_the_worker() {
        let mut h = Harness::new();
        h.activate(1, 1, 1500);
        assert_eq!(h.ioevents.count(), 8);
        // Decoding off: the doorbells go.
        h.cfg_write(1, 0, &[0x04, 0x00]);
        assert_eq!(h.ioevents.count(), 0);
        h.cfg_write(1, 0, &[0x06, 0x00]);
        assert_eq!(h.ioevents.count(), 8);
        let (ioevents, port) = (h.ioevents.clone(), h.port.clone());
        // The bus holds the only reference: dropping it joins the worker.
        drop(h);
        assert_eq!(ioevents.count(), 0);
        assert!(!port.state().active);
    }
}

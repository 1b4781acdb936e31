// SPDX-License-Identifier: Apache-2.0
//! The virtio-pci function: identity, capabilities, BAR layout, MMIO
//! dispatch, activation and doorbells (VIRTIO 1.2 §4.1).
//!
//! Everything lives in one 64-bit memory BAR, [`VIRTIO_BAR`], one 4 KiB page
//! per structure so that each can be mapped alone:
//!
//! | offset | contents                                   |
//! |--------|--------------------------------------------|
//! | 0x0000 | common configuration (`virtio_pci_common_cfg`) |
//! | 0x1000 | ISR status (1 byte, read-to-clear)          |
//! | 0x2000 | device-specific configuration               |
//! | 0x3000 | notify: queue n's doorbell at 0x3000 + 4n   |
//! | 0x4000 | MSI-X table (vector 0: config, n + 1: queue n) |
//! | 0x6000 | MSI-X pending-bit array                     |
//!
//! Doorbells become ioeventfds, registered at the BAR's current address
//! whenever the guest enables memory decoding or moves the BAR, so a
//! notification never exits to the VMM. A notify that does arrive as an
//! MMIO write (no ioeventfd, or registration failed) signals the same
//! eventfd, so the device sees no difference.
//!
//! For live migration the function saves the common configuration, the
//! MSI-X table and where each live queue stands; the bus saves the
//! configuration space and puts it back first, so a restore finds the BAR
//! where the guest left it and re-registers the doorbells there.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use log::{info, warn};
use pci::{
    BarKind, BarSpec, DeviceHooks, IoEventDoorbells, Msix, MsixError, MsixState, PciBusError,
    PciConfiguration, PciDevice, PciHeader,
};
use serde::{Deserialize, Serialize};
use virtio_queue::Queue;
use vm_migration::{MigratableError, Pausable, Snapshot, Snapshottable};

use super::common_cfg::{CommonConfig, SavedCommon, StatusAction, COMMON_CFG_LEN};
use super::interrupt::{Interrupt, InterruptState};
use super::{ActivateError, QueuePosition, StateError, VirtioDevice};

/// Red Hat, Inc., the vendor id of all virtio functions.
const VIRTIO_PCI_VENDOR_ID: u16 = 0x1af4;
/// §4.1.2.1: a modern-only device's id is 0x1040 + its virtio device type.
const VIRTIO_PCI_DEVICE_ID_BASE: u16 = 0x1040;
/// §4.1.2.1: non-transitional devices have revision 1 or higher.
const VIRTIO_PCI_REVISION: u8 = 1;
/// §4.1.2.1: non-transitional devices SHOULD have a subsystem id >= 0x40.
const VIRTIO_PCI_SUBSYSTEM_ID: u16 = 0x40;

/// Capability id of vendor-specific capabilities, which virtio uses.
const PCI_CAP_ID_VNDR: u8 = 0x09;
/// `cfg_type` of each virtio capability (§4.1.4).
const VIRTIO_PCI_CAP_COMMON_CFG: u8 = 1;
const VIRTIO_PCI_CAP_NOTIFY_CFG: u8 = 2;
const VIRTIO_PCI_CAP_ISR_CFG: u8 = 3;
const VIRTIO_PCI_CAP_DEVICE_CFG: u8 = 4;
/// Length of `struct virtio_pci_cap`.
const VIRTIO_PCI_CAP_LEN: usize = 16;

/// The BAR holding every virtio structure and the MSI-X table and PBA.
pub(crate) const VIRTIO_BAR: usize = 0;
const BAR_SIZE: u64 = 0x8000;
const COMMON_OFFSET: u64 = 0x0000;
const ISR_OFFSET: u64 = 0x1000;
const ISR_LEN: u64 = 1;
const DEVICE_OFFSET: u64 = 0x2000;
const NOTIFY_OFFSET: u64 = 0x3000;
/// Distance between two queues' doorbells (`notify_off_multiplier`).
const NOTIFY_MULTIPLIER: u64 = 4;
const MSIX_TABLE_OFFSET: u64 = 0x4000;
const MSIX_PBA_OFFSET: u64 = 0x6000;
/// Space for the device config and for the doorbells: one page each.
const PAGE: u64 = 0x1000;
/// Bytes per MSI-X table entry; the table has a two-page slot.
const MSIX_ENTRY_LEN: u64 = 16;
/// Queues the layout has room for: doorbells and MSI-X entries (one for
/// config plus one per queue) must fit their slots.
const MAX_QUEUES: usize = 511;

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("Failed to declare the virtio BAR")]
    Bar(#[source] PciBusError),
    #[error("Failed to add a virtio capability")]
    Capability(#[source] PciBusError),
    #[error("Failed to set up MSI-X")]
    Msix(#[source] MsixError),
    #[error("Device has {0} queues, more than the BAR layout holds")]
    TooManyQueues(usize),
    #[error("Device configuration of {0} bytes does not fit its BAR page")]
    ConfigTooLarge(usize),
}

/// Layout of [`SavedVirtioPci`]; bump on any change.
const SNAPSHOT_VERSION: u32 = 1;

/// The function's state in a snapshot, beside the configuration space the
/// bus saves. Untrusted on restore.
#[derive(Serialize, Deserialize)]
pub(crate) struct SavedVirtioPci {
    common: SavedCommon,
    /// The device configuration (for a disk: its capacity), which must be
    /// this device's: the guest would not expect it to change.
    device_config: Vec<u8>,
    msix: MsixState,
    /// Present exactly when the device is active.
    queues: Option<Vec<QueuePosition>>,
}

/// A structure inside [`VIRTIO_BAR`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Region {
    Common,
    Isr,
    Device,
    Notify,
    MsixTable,
    MsixPba,
}

/// A virtio device behind the modern virtio-pci transport.
pub(crate) struct VirtioPciDevice<D: VirtioDevice> {
    config: PciConfiguration,
    common: CommonConfig,
    irq: Arc<InterruptState>,
    msix: Arc<Mutex<Msix>>,
    msix_vectors: u16,
    device: D,
    /// The doorbell ioeventfds, registered at the notify region's base.
    doorbells: IoEventDoorbells,
}

impl<D: VirtioDevice> VirtioPciDevice<D> {
    /// Builds the function's config space around `device`; PCI class
    /// `class`/`subclass` describe it to the guest's PCI core.
    pub(crate) fn new(
        device: D,
        class: u8,
        subclass: u8,
        hooks: DeviceHooks,
    ) -> Result<Self, TransportError> {
        let queues = device.queue_max_sizes().len();
        let msix_vectors = queues
            .checked_add(1)
            .filter(|_| queues <= MAX_QUEUES)
            .and_then(|v| u16::try_from(v).ok())
            .ok_or(TransportError::TooManyQueues(queues))?;
        let config_len = device.config().len();
        if u64::try_from(config_len).map_or(true, |len| len > PAGE) {
            return Err(TransportError::ConfigTooLarge(config_len));
        }

        let mut config = PciConfiguration::new(PciHeader {
            vendor_id: VIRTIO_PCI_VENDOR_ID,
            device_id: VIRTIO_PCI_DEVICE_ID_BASE.saturating_add(device.device_type()),
            revision: VIRTIO_PCI_REVISION,
            class,
            subclass,
            prog_if: 0,
            subsystem_vendor_id: VIRTIO_PCI_VENDOR_ID,
            subsystem_id: VIRTIO_PCI_SUBSYSTEM_ID,
            multifunction: false,
            // No INTx: the driver must use MSI-X (Linux does when offered).
            interrupt_pin: 0,
        });
        config
            .add_bar(BarSpec {
                index: VIRTIO_BAR,
                size: BAR_SIZE,
                kind: BarKind::Mmio64,
                // Not prefetchable: reading the ISR has a side effect.
                prefetchable: false,
            })
            .map_err(TransportError::Bar)?;

        let notify_len = notify_len(queues);
        let mut caps = vec![
            virtio_cap(
                VIRTIO_PCI_CAP_COMMON_CFG,
                COMMON_OFFSET,
                COMMON_CFG_LEN,
                &[],
            ),
            virtio_cap(VIRTIO_PCI_CAP_ISR_CFG, ISR_OFFSET, ISR_LEN, &[]),
            virtio_cap(
                VIRTIO_PCI_CAP_NOTIFY_CFG,
                NOTIFY_OFFSET,
                notify_len,
                &u32::try_from(NOTIFY_MULTIPLIER).unwrap_or(0).to_le_bytes(),
            ),
        ];
        if config_len > 0 {
            let len = u64::try_from(config_len).unwrap_or(0);
            caps.push(virtio_cap(
                VIRTIO_PCI_CAP_DEVICE_CFG,
                DEVICE_OFFSET,
                len,
                &[],
            ));
        }
        for cap in &caps {
            config
                .add_capability(cap)
                .map_err(TransportError::Capability)?;
        }
        let msix = Msix::new(
            &mut config,
            hooks.msi,
            msix_vectors,
            VIRTIO_BAR,
            u32::try_from(MSIX_TABLE_OFFSET).unwrap_or(0),
            u32::try_from(MSIX_PBA_OFFSET).unwrap_or(0),
        )
        .map_err(TransportError::Msix)?;

        let irq = Arc::new(InterruptState::new(queues));
        let common = CommonConfig::new(
            device.features(),
            device.queue_max_sizes(),
            msix_vectors,
            irq.clone(),
        );
        Ok(Self {
            config,
            common,
            irq,
            msix: Arc::new(Mutex::new(msix)),
            msix_vectors,
            device,
            doorbells: IoEventDoorbells::new(hooks.ioevents, doorbell, "virtio-pci", "queue"),
        })
    }

    fn msix(&self) -> MutexGuard<'_, Msix> {
        self.msix.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The region a `len`-byte access at `offset` of `bar` falls in, and the
    /// offset inside it. Accesses straddling a region edge match nothing.
    fn locate(&self, bar: usize, offset: u64, len: usize) -> Option<(Region, u64)> {
        if bar != VIRTIO_BAR {
            return None;
        }
        let end = offset.checked_add(u64::try_from(len).ok()?)?;
        let queues = self.device.queue_max_sizes().len();
        let vectors = u64::from(self.msix_vectors);
        let regions = [
            (Region::Common, COMMON_OFFSET, COMMON_CFG_LEN),
            (Region::Isr, ISR_OFFSET, ISR_LEN),
            (
                Region::Device,
                DEVICE_OFFSET,
                u64::try_from(self.device.config().len()).ok()?,
            ),
            (Region::Notify, NOTIFY_OFFSET, notify_len(queues)),
            (
                Region::MsixTable,
                MSIX_TABLE_OFFSET,
                vectors.checked_mul(MSIX_ENTRY_LEN)?,
            ),
            // One 64-bit word per 64 vectors.
            (
                Region::MsixPba,
                MSIX_PBA_OFFSET,
                vectors.div_ceil(64).checked_mul(8)?,
            ),
        ];
        regions.into_iter().find_map(|(region, start, size)| {
            let inside = offset >= start && start.checked_add(size).is_some_and(|e| end <= e);
            inside.then(|| (region, offset.saturating_sub(start)))
        })
    }

    fn interrupt(&self) -> Interrupt {
        Interrupt::new(self.irq.clone(), self.msix.clone())
    }

    /// DRIVER_OK: hand the queues to the device, or report NEEDS_RESET.
    fn activate(&mut self) {
        let result = self
            .common
            .build_queues()
            .and_then(|queues| self.start(queues));
        if let Err(e) = result {
            guest_warn!("virtio-pci: activation failed, device needs reset: {e}");
            self.interrupt().report_failure();
        }
    }

    /// Hands `queues` to the device, as built at DRIVER_OK or restored.
    fn start(&mut self, queues: Vec<Queue>) -> Result<(), ActivateError> {
        self.device.activate(queues, self.interrupt())?;
        info!(
            "virtio-pci: device type {} activated, features {:#x}",
            self.device.device_type(),
            self.common.driver_features()
        );
        self.sync_ioevents();
        Ok(())
    }

    /// Restore after the bus put the configuration space back: the common
    /// configuration, the MSI-X table (routes re-installed), the doorbells
    /// at the restored BAR, and, if the device was active, the device
    /// itself, started as at DRIVER_OK from the saved queue positions.
    fn set_state(&mut self, saved: &SavedVirtioPci) -> Result<(), StateError> {
        if saved.device_config != self.device.config() {
            return Err(StateError::DeviceConfig);
        }
        // Whatever the device served before, the saved state replaces it.
        self.device.reset();
        self.common.set_state(&saved.common)?;
        self.msix()
            .set_state(&saved.msix)
            .map_err(StateError::Msix)?;
        self.sync_ioevents();
        match (self.common.active(), &saved.queues) {
            (true, Some(positions)) => {
                let mut queues = self.common.build_queues().map_err(StateError::Activate)?;
                if positions.len() != queues.len() {
                    return Err(StateError::Positions);
                }
                for (queue, position) in queues.iter_mut().zip(positions) {
                    position.apply(queue);
                }
                self.start(queues).map_err(StateError::Activate)
            }
            (false, None) => Ok(()),
            _ => Err(StateError::Positions),
        }
    }

    /// Status 0: stop the device first (it may still be finishing a batch
    /// and raising its interrupt), then forget the driver's settings.
    fn reset(&mut self) {
        self.device.reset();
        self.common.reset();
        info!(
            "virtio-pci: device type {} reset",
            self.device.device_type()
        );
    }

    /// A doorbell write that reached the VMM instead of an ioeventfd.
    fn notify(&self, offset: u64) {
        let queue = offset
            .checked_div(NOTIFY_MULTIPLIER)
            .and_then(|q| usize::try_from(q).ok());
        match queue.and_then(|q| self.device.queue_events().get(q)) {
            Some(evt) => {
                if let Err(e) = evt.write(1) {
                    warn!("virtio-pci: failed to signal queue: {e}");
                }
            }
            None => guest_warn!("virtio-pci: notify at bad offset {offset:#x}"),
        }
    }

    /// Moves the doorbell ioeventfds to where the notify region is now:
    /// nowhere while memory decoding is off, else inside the BAR.
    fn sync_ioevents(&mut self) {
        let want = if self.config.memory_enabled() {
            self.config
                .bar_address(VIRTIO_BAR)
                .and_then(|base| base.checked_add(NOTIFY_OFFSET))
        } else {
            None
        };
        self.doorbells.sync(want, self.device.queue_events());
    }
}

impl<D: VirtioDevice> PciDevice for VirtioPciDevice<D> {
    fn config(&self) -> &PciConfiguration {
        &self.config
    }

    fn config_mut(&mut self) -> &mut PciConfiguration {
        &mut self.config
    }

    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some((region, off)) = self.locate(bar, offset, data.len()) else {
            guest_warn!("virtio-pci: ignored read of BAR {bar} at {offset:#x}");
            return;
        };
        match region {
            Region::Common => self.common.read(off, data),
            Region::Isr => {
                if let Some(byte) = data.first_mut() {
                    *byte = self.irq.take_isr();
                }
            }
            Region::Device => {
                let src = usize::try_from(off).ok().and_then(|start| {
                    let end = start.checked_add(data.len())?;
                    self.device.config().get(start..end)
                });
                if let Some(src) = src {
                    data.copy_from_slice(src);
                }
            }
            // Doorbells are write-only.
            Region::Notify => {}
            Region::MsixTable => self.msix().read_table(off, data),
            Region::MsixPba => self.msix().read_pba(off, data),
        }
    }

    fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]) {
        match self.locate(bar, offset, data.len()) {
            Some((Region::Common, off)) => match self.common.write(off, data) {
                StatusAction::None => {}
                StatusAction::Reset => self.reset(),
                StatusAction::Activate => self.activate(),
            },
            Some((Region::Notify, off)) => self.notify(off),
            Some((Region::MsixTable, off)) => self.msix().write_table(off, data),
            // The ISR, the PBA and the block configuration are read-only.
            _ => guest_warn!("virtio-pci: ignored write of BAR {bar} at {offset:#x}"),
        }
    }

    fn config_written(&mut self, _reg: usize) {
        self.msix().config_written(&self.config);
        // The command register's memory enable or a BAR may have changed.
        self.sync_ioevents();
    }

    fn bar_moved(&mut self, bar: usize, _old: u64, _new: u64) {
        if bar == VIRTIO_BAR {
            self.sync_ioevents();
        }
    }
}

impl<D: VirtioDevice> Pausable for VirtioPciDevice<D> {
    /// The transport has no thread of its own: MMIO stops with the vCPUs.
    fn pause(&mut self) -> Result<(), MigratableError> {
        self.device.pause()
    }

    fn resume(&mut self) -> Result<(), MigratableError> {
        self.device.resume()
    }
}

impl<D: VirtioDevice> Snapshottable for VirtioPciDevice<D> {
    fn id(&self) -> String {
        self.device.id().into()
    }

    /// Taken while paused, so the queue positions fall between two batches.
    fn snapshot(&mut self) -> Result<Snapshot, MigratableError> {
        // One lock at a time: the worker takes the queue lock and then the
        // MSI-X one to interrupt, so holding MSI-X while waiting for the
        // queues could deadlock (a statement's temporaries live to its end).
        let queues = self.device.queue_positions();
        let msix = self.msix().state();
        let saved = SavedVirtioPci {
            common: self.common.state(),
            device_config: self.device.config().to_vec(),
            msix,
            queues,
        };
        Snapshot::new(self.device.id(), SNAPSHOT_VERSION, &saved)
    }

    /// On a device created with the same configuration, after the bus
    /// restored the configuration space. On error the function is left
    /// reset (power-on state), never half restored.
    fn restore(&mut self, snapshot: &Snapshot) -> Result<(), MigratableError> {
        let id = self.device.id();
        let saved: SavedVirtioPci = snapshot.state(id, SNAPSHOT_VERSION)?;
        self.set_state(&saved).map_err(|e| {
            self.reset();
            MigratableError::Restore(id.into(), Box::new(e))
        })
    }
}

impl<D: VirtioDevice> Drop for VirtioPciDevice<D> {
    fn drop(&mut self) {
        self.doorbells.sync(None, self.device.queue_events());
    }
}

/// Bytes of doorbells for `queues` queues.
fn notify_len(queues: usize) -> u64 {
    u64::try_from(queues)
        .ok()
        .and_then(|q| q.checked_mul(NOTIFY_MULTIPLIER))
        .unwrap_or(0)
}

/// Guest-physical address of queue `index`'s doorbell.
fn doorbell(base: u64, index: usize) -> Option<u64> {
    u64::try_from(index)
        .ok()?
        .checked_mul(NOTIFY_MULTIPLIER)
        .and_then(|off| base.checked_add(off))
}

/// `struct virtio_pci_cap` (§4.1.4) for a structure in [`VIRTIO_BAR`],
/// followed by `extra` (the notify capability's multiplier).
fn virtio_cap(cfg_type: u8, offset: u64, length: u64, extra: &[u8]) -> Vec<u8> {
    let cap_len = VIRTIO_PCI_CAP_LEN.saturating_add(extra.len());
    let mut cap = vec![
        PCI_CAP_ID_VNDR,
        0, // cap_next, filled in by add_capability
        u8::try_from(cap_len).unwrap_or(0),
        cfg_type,
        u8::try_from(VIRTIO_BAR).unwrap_or(0),
        0, // id: only one structure of each type
        0, // padding
        0,
    ];
    cap.extend_from_slice(&u32::try_from(offset).unwrap_or(0).to_le_bytes());
    cap.extend_from_slice(&u32::try_from(length).unwrap_or(0).to_le_bytes());
    cap.extend_from_slice(extra);
    cap
}

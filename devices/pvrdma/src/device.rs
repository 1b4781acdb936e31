// SPDX-License-Identifier: Apache-2.0
//! [`Pvrdma`]: the PCI function, its BARs and capabilities, and the glue
//! between the bus (vCPU threads), the shared state and the worker.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use device_worker::WorkerHandle;
use net_port::{FrameBackend, Port, PortEvent};
use pci::{
    BarKind, BarSpec, DeviceCounters, DeviceHooks, Msix, MsixError, PciBusError, PciConfiguration,
    PciDevice, PciHeader, QueuePairCounters,
};
use pvrdma_abi::regs::{
    BAR_MSIX, BAR_REG, BAR_UAR, NUM_VECTORS, PCI_DEVICE_ID_PVRDMA, PCI_VENDOR_ID_VMWARE,
};
use pvrdma_abi::PAGE_SIZE;
use vm_memory::GuestAddressSpace;
use vm_migration::{MigratableError, Pausable, Snapshot, Snapshottable};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::config::{LimitsError, PvrdmaConfig};
use crate::datapath::local::LocalChannel;
use crate::datapath::wire::{Inbox, Wire};
use crate::env::{Clock, Env};
use crate::events::Interrupts;
use crate::metrics::Metrics;
use crate::regs;
use crate::snapshot;
use crate::state::{Shared, State};
use crate::uar::{self, Hub};
use crate::worker::{SpawnError, Worker};

/// PCI class "network controller, InfiniBand" (lspci: "Infiniband
/// controller", as VMware's PVRDMA shows up).
const PCI_CLASS_NETWORK: u8 = 0x02;
const PCI_SUBCLASS_INFINIBAND: u8 = 0x07;
/// VMware's hardware reports revision 1.
const PCI_REVISION: u8 = 1;
/// BAR0: MSI-X table at 0, PBA at 4 KiB.
const MSIX_BAR_SIZE: u64 = 0x2000;
const MSIX_TABLE_OFFSET: u64 = 0;
const MSIX_PBA_OFFSET: u64 = 0x1000;
/// BAR1: the registers, in one page.
const REG_BAR_SIZE: u64 = 0x1000;

#[derive(Debug, thiserror::Error)]
pub enum PvrdmaError {
    #[error("Invalid PVRDMA limits")]
    Limits(#[from] LimitsError),
    #[error("Failed to declare a BAR")]
    Bar(#[source] PciBusError),
    #[error("Failed to set up MSI-X")]
    Msix(#[source] MsixError),
    #[error("Failed to create an eventfd")]
    EventFd(#[source] io::Error),
    #[error("Failed to start the doorbell worker")]
    Worker(#[from] SpawnError),
}

/// The PVRDMA function (15ad:0820). Put it at function 1 of the slot whose
/// function 0 is the vmxnet3 sharing `port`.
pub struct Pvrdma<M: GuestAddressSpace> {
    config: PciConfiguration,
    mem: M,
    shared: Arc<Shared>,
    /// Signalled by the port listener; the listener holds it weakly.
    _link_notifier: Arc<EventFd>,
    /// Stops and joins the worker on drop.
    _worker: WorkerHandle,
}

impl<M: GuestAddressSpace> std::fmt::Debug for Pvrdma<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pvrdma")
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

fn pci_config(
    config: &PvrdmaConfig,
    hooks: &DeviceHooks,
) -> Result<(PciConfiguration, Msix), PvrdmaError> {
    let mut pci = PciConfiguration::new(PciHeader {
        vendor_id: PCI_VENDOR_ID_VMWARE,
        device_id: PCI_DEVICE_ID_PVRDMA,
        revision: PCI_REVISION,
        class: PCI_CLASS_NETWORK,
        subclass: PCI_SUBCLASS_INFINIBAND,
        prog_if: 0,
        subsystem_vendor_id: PCI_VENDOR_ID_VMWARE,
        subsystem_id: PCI_DEVICE_ID_PVRDMA,
        multifunction: false,
        // No INTx: without MSI-X the driver has no async or CQ interrupts,
        // so probing fails cleanly instead.
        interrupt_pin: 0,
    });
    let uar_size = u64::from(config.limits.max_uar).saturating_mul(PAGE_SIZE);
    for (index, size, kind) in [
        (BAR_MSIX, MSIX_BAR_SIZE, BarKind::Mmio32),
        (BAR_REG, REG_BAR_SIZE, BarKind::Mmio32),
        // 64-bit, not prefetchable: doorbell writes must not be merged.
        (BAR_UAR, uar_size, BarKind::Mmio64),
    ] {
        pci.add_bar(BarSpec {
            index,
            size,
            kind,
            prefetchable: false,
        })
        .map_err(PvrdmaError::Bar)?;
    }
    let msix = Msix::new(
        &mut pci,
        Arc::clone(&hooks.msi),
        NUM_VECTORS,
        BAR_MSIX,
        MSIX_TABLE_OFFSET as u32,
        MSIX_PBA_OFFSET as u32,
    )
    .map_err(PvrdmaError::Msix)?;
    Ok((pci, msix))
}

/// A read-only descriptor of the memfd that holds all of guest memory,
/// for same-host peers (`share_memory=on`); `None`, logged, where guest
/// memory is not one such file sealed against resizing (a peer would
/// refuse it).
fn memory_view<M: GuestAddressSpace>(mem: &M) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    use vm_memory::{GuestMemory, GuestMemoryBackend, GuestMemoryRegion};
    let guard = mem.memory();
    let files: Option<Vec<&std::fs::File>> = guard.physical_memory().and_then(|p| {
        p.iter()
            .map(|r| r.file_offset().map(vm_memory::FileOffset::file))
            .collect()
    });
    let file = match files.as_deref() {
        Some([first, rest @ ..]) if rest.iter().all(|f| f.as_raw_fd() == first.as_raw_fd()) => {
            *first
        }
        _ => {
            log::warn!("pvrdma: share_memory: guest memory is not one file; not shared");
            return None;
        }
    };
    let view = crate::datapath::view::read_only(file)
        .inspect_err(|e| log::warn!("pvrdma: share_memory: cannot reopen guest memory ({e})"))
        .ok()?;
    if let Err(e) = crate::datapath::view::View::map(&view) {
        log::warn!("pvrdma: share_memory: guest memory cannot be shared ({e}); not shared");
        return None;
    }
    log::info!("pvrdma: share_memory: same-host peers that share theirs may read guest memory");
    Some(view)
}

impl<M: GuestAddressSpace + Send + 'static> Pvrdma<M> {
    /// Creates the function and starts its worker thread. `mem` is guest
    /// memory (every device write goes through it, so dirty tracking sees
    /// it); `hooks` give it MSI-X vectors and doorbell ioeventfds; RoCE v2
    /// frames leave through `backend` (the port's wire, shared with the
    /// NIC) and arrive steered off `port`.
    pub fn new(
        config: &PvrdmaConfig,
        port: Arc<Port>,
        backend: Arc<dyn FrameBackend>,
        mem: M,
        hooks: DeviceHooks,
    ) -> Result<Self, PvrdmaError> {
        config.limits.check()?;
        let (pci, msix) = pci_config(config, &hooks)?;
        let metrics = Arc::new(Metrics::default());
        let hub = Hub::new(hooks.ioevents, Arc::clone(&metrics)).map_err(PvrdmaError::EventFd)?;
        let link = EventFd::new(EFD_NONBLOCK).map_err(PvrdmaError::EventFd)?;
        let notifier = Arc::new(link.try_clone().map_err(PvrdmaError::EventFd)?);
        let weak = Arc::downgrade(&notifier);
        // Once the device is gone the listener finds nothing to signal.
        port.subscribe(move |event| {
            if let (PortEvent::Link(_), Some(fd)) = (event, weak.upgrade()) {
                if let Err(e) = fd.write(1) {
                    log::warn!("pvrdma: failed to signal a link change: {e}");
                }
            }
        });
        let inbox = Arc::new(Inbox::new(Arc::clone(&metrics)).map_err(PvrdmaError::EventFd)?);
        let local = config.local_dir.as_ref().and_then(|dir| {
            let mac = port.state().mac;
            LocalChannel::bind(dir, mac, config.local_takeover)
                .map(|mut local| {
                    if config.share_memory {
                        if let Some(view) = memory_view(&mem) {
                            local.share(view);
                        }
                    }
                    local
                })
                .inspect(|_| log::info!("pvrdma: same-host channel in {}", dir.display()))
                .inspect_err(|e| {
                    log::warn!(
                        "pvrdma: no same-host channel in {} ({e}); all RoCE traffic takes the wire",
                        dir.display()
                    )
                })
                .ok()
        });
        let weak = Arc::downgrade(&inbox);
        port.set_rdma_steering(move |frame| weak.upgrade().is_some_and(|i| i.offer(frame)));
        let shared = Arc::new(Shared {
            env: Env {
                config: config.clone(),
                port,
                irq: Interrupts::new(msix),
                metrics,
                hub: Arc::new(hub),
                clock: Clock::new(),
            },
            wire: Wire {
                backend,
                inbox,
                local,
            },
            state: Mutex::new(State::new()),
            paused: AtomicBool::new(false),
            kick_all: AtomicBool::new(false),
            announce: AtomicBool::new(false),
            rearm_cqs: AtomicBool::new(false),
        });
        let worker = Worker::new(mem.clone(), Arc::clone(&shared), link)?;
        let worker = WorkerHandle::spawn_on("pvrdma", worker, &config.worker_cpus)
            .map_err(SpawnError::Start)?;
        Ok(Self {
            config: pci,
            mem,
            shared,
            _link_notifier: notifier,
            _worker: worker,
        })
    }
}

impl<M: GuestAddressSpace> Pausable for Pvrdma<M> {
    /// Quiesces the device: once this returns (the worker finished its
    /// current run, taking the state lock), it takes no new work requests,
    /// sends nothing and discards received frames; timers are frozen.
    fn pause(&mut self) -> Result<(), MigratableError> {
        let _state = self.shared.lock();
        self.shared.paused.store(true, Ordering::Release);
        self.shared.wire.inbox.set_discard(true);
        Ok(())
    }

    /// Lets the device work again, starting with everything posted while
    /// it was paused; lost frames come back by retransmission.
    fn resume(&mut self) -> Result<(), MigratableError> {
        self.resume_parked()?;
        self.released();
        Ok(())
    }

    /// Lets the device take work again; the worker runs what waited (see
    /// [`Self::released`]) once the vCPUs run.
    /// A device restored for an incoming migration also becomes its MAC's
    /// owner on the same-host channel now, when the VM runs here; its
    /// worker then offers rings to the QPs' peers (see [`Shared::announce`]).
    fn resume_parked(&mut self) -> Result<(), MigratableError> {
        let t0 = std::time::Instant::now();
        if let Some(local) = &self.shared.wire.local {
            if let Err(e) = local.claim() {
                log::warn!("pvrdma: cannot take over the MAC's same-host socket ({e}); peers on this host reach the VM over the wire");
            }
            // A migrated guest waits for this after the hand-over.
            log::info!(
                "pvrdma: same-host socket claimed in {} ms",
                t0.elapsed().as_millis()
            );
            self.shared.announce.store(true, Ordering::Release);
        }
        self.shared.paused.store(false, Ordering::Release);
        self.shared.wire.inbox.set_discard(false);
        Ok(())
    }

    /// Wakes the worker for what waited for the resume: the doorbells'
    /// watches a restore queued, the doorbells held while paused, every
    /// QP run once and the same-host rings offered. With 256 QPs that is
    /// tens of milliseconds on a one-CPU test host, which the vCPUs no
    /// longer wait for; their doorbells meanwhile wait in their eventfds.
    fn released(&mut self) {
        self.shared.kick_all();
        self.shared.env.hub.drop_ahead();
    }
}

impl<M: GuestAddressSpace> Snapshottable for Pvrdma<M> {
    fn id(&self) -> String {
        snapshot::ID.into()
    }

    /// Every object with its IDs and transport state (see the `snapshot`
    /// module); the PCI configuration and MSI-X table are the bus's to save.
    fn snapshot(&mut self) -> Result<Snapshot, MigratableError> {
        snapshot::save(&self.shared)
    }

    /// Runs after the bus put the configuration space back, so the
    /// doorbells go where the guest's BAR 2 is now.
    fn restore(&mut self, s: &Snapshot) -> Result<(), MigratableError> {
        self.sync_uar();
        snapshot::restore(&self.shared, s)
    }

    /// How many doorbell eventfds the objects hold now, and the QPs' parts
    /// that do not change (see [`snapshot::hint`]).
    fn restore_hint(&mut self) -> Option<Snapshot> {
        snapshot::hint(&self.shared)
    }

    /// Makes the eventfds a source's hint names (see
    /// [`snapshot::prepare`]); the restore takes them.
    fn prepare_restore(&mut self, hint: &Snapshot) -> Result<(), MigratableError> {
        snapshot::prepare(&self.shared, hint)
    }

    /// Its saves hold every QP whole again.
    fn forget_hint(&mut self) {
        snapshot::forget_hint(&self.shared);
    }
}

impl<M: GuestAddressSpace> Drop for Pvrdma<M> {
    /// The counters that moved, for the VMM's log: what the device did and
    /// what the guest or peers got wrong; then where each live QP and
    /// same-host ring stands.
    fn drop(&mut self) {
        let moved: Vec<String> = self
            .metrics()
            .into_iter()
            .filter(|(_, v)| *v != 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        log::info!("pvrdma: counters: {}", moved.join(" "));
        let state = self.shared.lock();
        for qp in state.session.iter().flat_map(|s| s.objects.qps.values()) {
            if let Some(engine) = qp.engine.as_ref() {
                log::info!("pvrdma: QP at exit: {engine}");
            }
        }
        let mem = self.mem.memory();
        let cqs: Vec<String> = state
            .session
            .iter()
            .flat_map(|s| s.objects.cqs.iter())
            .map(|(handle, cq)| format!("cq={handle} {}", cq.describe(&*mem)))
            .collect();
        if !cqs.is_empty() {
            let irq = &self.shared.env.irq;
            log::info!(
                "pvrdma: CQs at exit (imr={:#x} icr={:#x}): {}",
                irq.imr(),
                irq.icr(),
                cqs.join(", ")
            );
        }
        drop(state);
        if let Some(local) = self.shared.wire.local.as_ref() {
            local.log_rings();
        }
    }
}

impl<M: GuestAddressSpace> Pvrdma<M> {
    /// The state, for the crate's tests to look into.
    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The device's counters, by name (see the `metrics` module).
    pub fn metrics(&self) -> Vec<(&'static str, u64)> {
        self.shared.env.metrics.snapshot()
    }

    /// A handle on the device's counters and its QPs' transport counters,
    /// for the VMM to read while the device runs (without locking it).
    pub fn counters(&self) -> Arc<dyn DeviceCounters> {
        Arc::new(CountersHandle {
            metrics: Arc::clone(&self.shared.env.metrics),
            shared: Arc::downgrade(&self.shared),
        })
    }

    /// Registers doorbells where BAR2 is decoded now, or nowhere.
    fn sync_uar(&mut self) {
        let base = if self.config.memory_enabled() {
            self.config.bar_address(BAR_UAR)
        } else {
            None
        };
        let mut state = self.shared.lock();
        if state.uar_base == base {
            return;
        }
        state.uar_base = base;
        if let Some(session) = state.session.as_mut() {
            session.objects.rebase_doorbells(base);
        }
    }
}

impl<M: GuestAddressSpace + Send> PciDevice for Pvrdma<M> {
    fn config(&self) -> &PciConfiguration {
        &self.config
    }

    fn config_mut(&mut self) -> &mut PciConfiguration {
        &mut self.config
    }

    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        match bar {
            BAR_MSIX if offset < MSIX_PBA_OFFSET => {
                self.shared.env.irq.msix().read_table(offset, data)
            }
            BAR_MSIX => self
                .shared
                .env
                .irq
                .msix()
                .read_pba(offset.saturating_sub(MSIX_PBA_OFFSET), data),
            BAR_REG => regs::read(&self.shared, offset, data),
            _ => {
                // UAR pages are write-only (CVE-2018-20191: reads must work).
                guest_warn!(
                    self.shared.env.metrics.uar_read,
                    "read of BAR {bar} at {offset:#x}"
                );
                data.fill(0xff);
            }
        }
    }

    fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]) {
        match bar {
            BAR_MSIX if offset < MSIX_PBA_OFFSET => {
                self.shared.env.irq.msix().write_table(offset, data)
            }
            BAR_REG => {
                let mem = self.mem.memory();
                let bar2 = self.config.bar_address(BAR_UAR);
                regs::write(&self.shared, &*mem, bar2, offset, data);
            }
            BAR_UAR => {
                let state = self.shared.lock();
                let objects = state.session.as_ref().map(|s| &s.objects);
                let doorbells_of = |owner, handle| objects?.doorbells(owner, handle);
                uar::handle_write(doorbells_of, &self.shared.env.metrics, offset, data);
            }
            // The PBA is read-only.
            _ => guest_warn!(
                self.shared.env.metrics.reg_invalid,
                "write of BAR {bar} at {offset:#x}"
            ),
        }
    }

    fn config_written(&mut self, _reg: usize) {
        self.shared.env.irq.msix().config_written(&self.config);
        // Memory decoding may have changed.
        self.sync_uar();
    }

    fn bar_moved(&mut self, bar: usize, _old: u64, _new: u64) {
        if bar == BAR_UAR {
            self.sync_uar();
        }
    }
}

/// The VMM's handle on one device's counters (see [`crate::Pvrdma::counters`]).
/// The device counters are atomics; the per-QP ones are read under the
/// device's state lock, which is only ever held for one command or one
/// batch of frames. The state is held weakly: the handle must not keep a
/// dropped device's QPs, doorbells and same-host rings alive.
struct CountersHandle {
    metrics: Arc<Metrics>,
    shared: Weak<Shared>,
}

impl DeviceCounters for CountersHandle {
    fn values(&self) -> Vec<(&'static str, u64)> {
        self.metrics.snapshot()
    }

    /// The QPs with a transport engine (RTR and later), in handle order;
    /// none once the device is gone.
    fn queue_pairs(&self) -> Option<Vec<QueuePairCounters>> {
        let Some(shared) = self.shared.upgrade() else {
            return Some(Vec::new());
        };
        let state = shared.lock();
        let qps = state
            .session
            .iter()
            .flat_map(|s| s.objects.qps.values())
            .filter_map(|qp| {
                qp.engine.as_ref().map(|engine| QueuePairCounters {
                    qpn: qp.qpn,
                    error: engine.is_error(),
                    values: engine.metrics.named(),
                })
            })
            .collect();
        Some(qps)
    }
}

#[cfg(all(test, feature = "test-utils"))]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::os::unix::net::UnixDatagram;
    use std::time::Duration;

    use vm_migration::{Pausable, Snapshot, Snapshottable};

    use crate::datapath::local::sock_name;
    use crate::sim_driver::endpoint::{Endpoint, GID_A, GID_B, MAC_A, MAC_B};
    use crate::sim_driver::{QpSpec, SimDriver};
    use crate::PvrdmaConfig;

    /// Device B with a connected RC QP whose peer A is on this host, in a
    /// same-host channel directory named after `test`; A's VMM is a bare
    /// socket that records what it is handed.
    fn b_with_a_peer_here(test: &str) -> (Endpoint, UnixDatagram, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("pvrdma-{test}-{}", std::process::id()));
        let config = PvrdmaConfig {
            local_dir: Some(dir.clone()),
            ..PvrdmaConfig::default()
        };
        let mut b = Endpoint::on(
            SimDriver::with_config_and_mac(&config, MAC_B),
            GID_B,
            QpSpec::rc,
        );
        let peer = UnixDatagram::bind(dir.join(sock_name(MAC_A))).unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        b.sim
            .connect_rc(b.qp.handle, 0, (GID_A, MAC_A), 0x99, (0x20, 0x10))
            .unwrap();
        (b, peer, dir)
    }

    /// Waits for the ring B's worker offers to A's VMM.
    fn ring_offered(peer: &UnixDatagram) {
        let mut msg = [0; 64];
        let n = peer.recv(&mut msg).expect("the worker offers a ring");
        let msg = msg.get(..n).unwrap_or_default();
        assert!(msg.starts_with(b"PVRDMA-SHM-RING"), "{msg:?}");
    }

    /// A resumed device (a migrated VM starting here) leaves offering its
    /// same-host rings to its worker: `resume` neither reads the QPs nor
    /// waits for a peer's VMM, and the worker hands the connected QP's
    /// peer a ring once the device runs, before any frame needs it.
    #[test]
    fn the_worker_offers_the_rings_after_resume() {
        let (b, peer, dir) = b_with_a_peer_here("announce");
        b.sim.device().pause().unwrap();
        let shared = std::sync::Arc::clone(&b.sim.device().shared);
        let state = shared.lock();
        std::thread::scope(|s| {
            let resume = s.spawn(|| b.sim.device().resume());
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !resume.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let returned = resume.is_finished();
            // Nothing offered while the QPs are out of the worker's reach.
            peer.set_nonblocking(true).unwrap();
            let early = peer.recv(&mut [0; 64]);
            drop(state);
            assert!(returned, "resume waited for the device's state");
            assert!(early.is_err(), "a ring offered with the state locked");
            resume.join().unwrap().unwrap();
        });
        peer.set_nonblocking(false).unwrap();
        ring_offered(&peer);
        assert_eq!(b.sim.metric("roce_local_tx"), 0, "no frame needed it");
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Resumed while the vCPUs are parked (a migrated VM's start), the
    /// device leaves its worker asleep until told they run: the worker's
    /// run over every QP and its ring offers would take the CPU they wait
    /// for.
    #[test]
    fn the_worker_waits_for_the_vcpus_to_run() {
        let (b, peer, dir) = b_with_a_peer_here("release");
        b.sim.device().pause().unwrap();
        b.sim.device().resume_parked().unwrap();
        peer.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(
            peer.recv(&mut [0; 64]).is_err(),
            "the worker ran before the vCPUs did"
        );
        b.sim.device().released();
        peer.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        ring_offered(&peer);
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A destination makes the eventfds its source's hint names before the
    /// state comes: as many as the restore attaches, which then takes
    /// them all (none made inside the blackout) and leaves the rest to
    /// the resume.
    #[test]
    fn the_restore_takes_the_eventfds_made_ahead() {
        let b = Endpoint::on(SimDriver::new(), GID_B, QpSpec::rc);
        let (sim, _) = b.sim.migrate_paused_timed();
        let hub = std::sync::Arc::clone(&sim.device().shared.env.hub);
        assert_eq!(hub.ahead(), 0, "the migration's restore left some");
        // Again on the restored device: the hint counts what a restore
        // makes, which takes exactly that many.
        let hint = sim.device().restore_hint().unwrap();
        sim.device().prepare_restore(&hint).unwrap();
        let shared = std::sync::Arc::clone(&sim.device().shared);
        let eventfds = shared.lock().session.as_ref().unwrap().objects.eventfds();
        assert!(eventfds >= 3, "a QP's and two CQs': {eventfds}");
        // Less the QP's one, made with its doorbells as its part was kept.
        assert_eq!(hub.ahead(), eventfds - 1);
        let snapshot = sim.device().snapshot().unwrap();
        sim.device().restore(&snapshot).unwrap();
        assert_eq!(hub.ahead(), 0, "the restore made eventfds of its own");
        // One more than needed: closed once the vCPUs run.
        hub.make_ahead(1);
        sim.device().resume().unwrap();
        assert_eq!(hub.ahead(), 0);
    }

    /// A source's hint is not trusted: a count beyond what the device's
    /// limits allow its objects makes only that many, another version or
    /// another layout is refused, and nothing panics.
    #[test]
    fn a_hostile_hint_is_bounded_or_refused() {
        let config = PvrdmaConfig {
            limits: crate::config::Limits {
                max_qp: 16,
                max_cq: 8,
                max_srq: 2,
                ..crate::config::Limits::default()
            },
            ..PvrdmaConfig::default()
        };
        let sim = SimDriver::with_config(&config);
        let hub = std::sync::Arc::clone(&sim.device().shared.env.hub);
        let hint = |version, eventfds: u64| {
            let layout = (
                eventfds,
                Some(0xfe00_0000u64),
                Vec::<()>::new(),
                Vec::<()>::new(),
            );
            Snapshot::new("pvrdma-hint", version, &layout).unwrap()
        };
        sim.device().prepare_restore(&hint(5, u64::MAX)).unwrap();
        assert_eq!(hub.ahead(), 16 + 2 * 8 + 2);
        for bad in [
            Snapshot::new("pvrdma-hint", 1, &(1u64,)).unwrap(),
            Snapshot::new("pvrdma-hint", 2, &(1u64, Vec::<()>::new())).unwrap(),
            hint(3, 1),
            hint(4, 1),
            hint(6, 1),
            Snapshot::new("pvrdma", 5, &(1u64, None::<u64>, Vec::<()>::new())).unwrap(),
            Snapshot::new("pvrdma-hint", 5, &(1u64,)).unwrap(),
        ] {
            assert!(sim.device().prepare_restore(&bad).is_err(), "{bad:?}");
        }
        assert_eq!(hub.ahead(), 34);
    }

    /// A paused device's restore (a migration's destination) leaves its
    /// worker asleep: watching the restored doorbells, an `epoll_ctl`
    /// each, waits for the resume instead of taking the CPU inside the
    /// blackout.
    #[test]
    fn a_paused_restore_leaves_the_doorbells_to_the_resume() {
        let b = Endpoint::on(SimDriver::new(), GID_B, QpSpec::rc);
        let (sim, _) = b.sim.migrate_paused_timed();
        std::thread::sleep(Duration::from_millis(200));
        let hub = std::sync::Arc::clone(&sim.device().shared.env.hub);
        assert!(
            !hub.take_watch_ops().is_empty(),
            "the worker watched the doorbells while paused"
        );
    }
}

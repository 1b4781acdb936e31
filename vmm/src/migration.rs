// SPDX-License-Identifier: Apache-2.0
//! Live migration and snapshots of a VM: the source's pre-copy loop, the
//! destination's receiver and the files of a snapshot. The wire format is
//! `vm_migration::protocol`; what travels is guest RAM, the VM
//! configuration and a [`VmSnapshot`].
//!
//! Source: connect, send the configuration (the destination builds the VM
//! and opens its devices, or refuses), turn on KVM dirty logging, send all
//! RAM, then pass after pass what was written meanwhile — by vCPUs (KVM's
//! log) or by devices (the VMM's own bitmap: the RDMA engine, NIC receive
//! and disk reads all write guest memory behind KVM's back) — until the
//! expected blackout fits the asked downtime. Then the control loop pauses
//! the VM and saves its state, the last dirty pages and the state go
//! across, and `Complete` hands the VM over. Any failure before that
//! answer resumes the VM on the source.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use api::{BlackoutStages, MigrationDirection, MigrationInfo, MigrationStatus};
use serde::{Deserialize, Serialize};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend as _, GuestMemoryRegion};
use vm_migration::protocol::{self, Command, MemoryRangeTable, ProtocolError};
use vm_migration::tls::{TlsClient, TlsFiles};
use vm_migration::transport::{AcceptError, Listener, MigrationUrl, Stream};
use vm_migration::{MigratableError, Snapshot};
use vmm_sys_util::eventfd::EventFd;

use crate::arch::state::{VcpuState, VmState};
use crate::config::VmConfig;
use crate::device_manager::DevicesSnapshot;
use crate::incoming::HostSettings;
use crate::kvm::Vm;
use crate::memory::GuestMemory;

/// The VM in a snapshot or migration: KVM's part and every device.
#[derive(Debug, Serialize, Deserialize)]
pub struct VmSnapshot {
    pub vcpus: Vec<VcpuState>,
    pub vm: VmState,
    pub devices: DevicesSnapshot,
}

const VM_ID: &str = "vm";
const VM_VERSION: u32 = 2;

impl VmSnapshot {
    pub fn to_bytes(&self) -> Result<Vec<u8>, MigratableError> {
        Ok(Snapshot::new(VM_ID, VM_VERSION, self)?.to_bytes())
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, MigratableError> {
        Snapshot::from_bytes(bytes)?.state(VM_ID, VM_VERSION)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error("Cannot connect to {0}")]
    Connect(String, #[source] std::io::Error),
    #[error("Cannot listen on {0}")]
    Listen(String, #[source] std::io::Error),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error("Failed to track dirty pages")]
    DirtyLog(#[source] crate::kvm::KvmError),
    #[error("Guest memory range {0:#x}+{1:#x} is outside guest RAM")]
    Range(u64, u64),
    #[error("Guest memory access failed")]
    Memory(#[source] vm_memory::GuestMemoryError),
    #[error("Timed out after {0} s; the VM keeps running here")]
    Timeout(u64),
    #[error("Cancelled through the API; the VM keeps running here")]
    Cancelled,
    #[error("The VM could not be paused for the switch-over: {0}")]
    Switchover(String),
    #[error("Invalid configuration from the source: {0}")]
    Config(String),
    #[error("Failed to build the VM: {0}")]
    Build(String),
    #[error("Failed to restore the VM's state: {0}")]
    Restore(String),
    #[error("The source abandoned the migration")]
    Abandoned,
    #[error("Snapshot I/O on {0} failed")]
    File(String, #[source] std::io::Error),
}

/// Progress shared with the control loop, which reports it in `vm.info`.
pub type Progress = Arc<Mutex<Option<MigrationInfo>>>;

fn update(progress: &Progress, f: impl FnOnce(&mut MigrationInfo)) {
    if let Some(info) = crate::lock(progress).as_mut() {
        f(info);
    }
}

/// A fresh report for a migration starting now.
pub fn start_info(
    direction: MigrationDirection,
    url: &str,
    status: MigrationStatus,
) -> MigrationInfo {
    MigrationInfo {
        direction,
        status,
        url: url.to_string(),
        pass: 0,
        memory_bytes: 0,
        bytes_transferred: 0,
        dirty_bytes: 0,
        dirty_rate_bytes_per_s: 0,
        bandwidth_bytes_per_s: 0,
        expected_downtime_ms: 0,
        downtime_ms: None,
        blackout: None,
        total_ms: 0,
        error: None,
    }
}

/// Bytes of one `Memory` batch: a batch is answered before the next, so
/// a destination error stops the source within one batch.
const BATCH_BYTES: u64 = 64 << 20;
/// Copy granularity between guest RAM and the stream.
const CHUNK_BYTES: usize = 1 << 20;
/// Pre-copy passes after which the VM is stopped whatever the estimate.
const MAX_PASSES: u32 = 30;
/// How long the source waits for any one answer of the destination.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
const PAGE_SIZE: u64 = 4096;

/// Every byte of guest RAM, region by region.
fn all_ranges(mem: &GuestMemory) -> MemoryRangeTable {
    let mut table = MemoryRangeTable::default();
    for region in mem.iter() {
        table.push(region.start_addr().0, region.len());
    }
    table
}

/// Pages written since the last call: KVM's log for vCPU writes OR-ed with
/// the bitmap every device write marks. Reading clears both.
pub fn dirty_ranges(vm: &Vm, mem: &GuestMemory) -> Result<MemoryRangeTable, MigrationError> {
    let kvm = vm.dirty_log(mem).map_err(MigrationError::DirtyLog)?;
    let mut table = MemoryRangeTable::default();
    for (region, mut bitmap) in mem.iter().zip(kvm) {
        let devices = device_bitmap(region).get_and_reset();
        for (word, dev) in bitmap.iter_mut().zip(devices) {
            *word |= dev;
        }
        table.extend(MemoryRangeTable::from_bitmap(
            &bitmap,
            region.start_addr().0,
            PAGE_SIZE,
        ));
    }
    Ok(table)
}

/// Clears every device bitmap: pages written before this are sent anyway.
fn reset_device_bitmaps(mem: &GuestMemory) {
    for region in mem.iter() {
        device_bitmap(region).reset();
    }
}

/// The bitmap vm-memory marks on every VMM-side write into `region`.
fn device_bitmap(region: &vm_memory::GuestRegionMmap<AtomicBitmap>) -> &AtomicBitmap {
    // The region derefs to its mapping, which owns the whole bitmap.
    vm_memory::MmapRegion::bitmap(region)
}

/// Streams `table`'s pages in batches, each answered by the destination;
/// returns the bytes sent. `go_on` is asked before each batch whether to
/// stop (cancel, timeout): a first pass takes long.
fn send_memory(
    stream: &mut dyn Stream,
    mem: &GuestMemory,
    table: &MemoryRangeTable,
    progress: &Progress,
    go_on: &dyn Fn() -> Result<(), MigrationError>,
) -> Result<u64, MigrationError> {
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut sent = 0u64;
    for batch in table.split(BATCH_BYTES) {
        go_on()?;
        protocol::send_request_header(stream, Command::Memory, batch.encoded_len() + batch.bytes())
            .map_err(ProtocolError::from)?;
        stream
            .write_all(&batch.encode())
            .map_err(ProtocolError::from)?;
        for &(gpa, len) in batch.ranges() {
            copy_range(gpa, len, &mut buf, |chunk, addr| {
                mem.read_slice(chunk, addr)
                    .map_err(MigrationError::Memory)?;
                stream
                    .write_all(chunk)
                    .map_err(|e| ProtocolError::from(e).into())
            })?;
        }
        stream.flush().map_err(ProtocolError::from)?;
        protocol::read_response(stream)?;
        sent += batch.bytes();
        update(progress, |i| i.bytes_transferred += batch.bytes());
    }
    Ok(sent)
}

/// Runs `f` over `gpa..gpa+len` in chunks of `buf`'s size.
fn copy_range(
    gpa: u64,
    len: u64,
    buf: &mut [u8],
    mut f: impl FnMut(&mut [u8], GuestAddress) -> Result<(), MigrationError>,
) -> Result<(), MigrationError> {
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        let chunk = buf.get_mut(..n).ok_or(MigrationError::Range(gpa, len))?;
        f(chunk, GuestAddress(gpa + done))?;
        done += n as u64;
    }
    Ok(())
}

/// Reads one `Memory` payload into guest RAM; every range must lie inside it.
fn receive_memory(
    stream: &mut dyn Stream,
    mem: &GuestMemory,
    length: u64,
) -> Result<u64, MigrationError> {
    let table = MemoryRangeTable::read(stream, length)?;
    let mut buf = vec![0u8; CHUNK_BYTES];
    for &(gpa, len) in table.ranges() {
        let fits = usize::try_from(len).is_ok_and(|n| mem.check_range(GuestAddress(gpa), n));
        if !fits {
            return Err(MigrationError::Range(gpa, len));
        }
        copy_range(gpa, len, &mut buf, |chunk, addr| {
            stream.read_exact(chunk).map_err(ProtocolError::from)?;
            mem.write_slice(chunk, addr).map_err(MigrationError::Memory)
        })?;
    }
    Ok(table.bytes())
}

/// The PEM files of an API request's `tls`.
pub fn tls_files(params: &api::TlsParams) -> TlsFiles {
    TlsFiles {
        cert: params.cert.clone(),
        key: params.key.clone(),
        ca: params.ca.clone(),
    }
}

/// What the sending thread asks of the control loop, which owns the vCPUs.
#[derive(Debug)]
pub enum SourceRequest {
    /// Pause the VM (vCPUs, then devices) and answer with its state.
    Switchover(Sender<Result<Vec<u8>, String>>),
    /// The migration ended: `Ok` = the destination runs the VM now.
    Finished(Result<(), String>),
}

/// The sending thread's end of the control loop.
pub struct ControlLink {
    pub requests: Sender<SourceRequest>,
    pub wake: EventFd,
}

impl ControlLink {
    fn send(&self, request: SourceRequest) {
        if self.requests.send(request).is_ok() {
            let _ = self.wake.write(1);
        }
    }
}

/// Everything the sending thread needs, none of it the control loop's to
/// give up.
pub struct Source {
    pub url: MigrationUrl,
    pub tls: Option<TlsClient>,
    pub downtime: Duration,
    pub timeout: Duration,
    pub config: Vec<u8>,
    pub mem: Arc<GuestMemory>,
    pub vm: Arc<Vm>,
    pub progress: Progress,
    pub control: ControlLink,
    /// Set by `vm.cancel-migration`; honoured until the switch-over.
    pub cancel: Arc<AtomicBool>,
}

impl Source {
    /// Whether pre-copy may go on: not cancelled, not past the timeout.
    fn go_on(&self, started: Instant) -> Result<(), MigrationError> {
        if self.cancel.load(Ordering::Acquire) {
            return Err(MigrationError::Cancelled);
        }
        if started.elapsed() > self.timeout {
            return Err(MigrationError::Timeout(self.timeout.as_secs()));
        }
        Ok(())
    }

    /// Runs the whole migration; the result goes to the control loop.
    pub fn run(self) {
        let started = Instant::now();
        let result = self.migrate(started);
        if let Err(e) = self.vm.set_dirty_logging(&self.mem, false) {
            log::warn!("Failed to turn dirty logging off: {e}");
        }
        let total_ms = started.elapsed().as_millis() as u64;
        update(&self.progress, |i| {
            i.total_ms = total_ms;
            match &result {
                Ok(()) => i.status = MigrationStatus::Completed,
                Err(e) => {
                    i.status = MigrationStatus::Failed;
                    i.error = Some(e.clone());
                }
            }
        });
        match &result {
            Ok(()) => log::info!("Migration to {} completed in {total_ms} ms", self.url),
            Err(e) => log::error!("Migration to {} failed: {e}", self.url),
        }
        self.control.send(SourceRequest::Finished(result));
    }

    fn migrate(&self, started: Instant) -> Result<(), String> {
        let mut stream = self
            .url
            .connect(self.tls.as_ref())
            .map_err(|e| MigrationError::Connect(self.url.to_string(), e))
            .map_err(|e| crate::error_chain(&e))?;
        let _ = stream.set_read_timeout(Some(ANSWER_TIMEOUT));
        let _ = stream.set_write_timeout(Some(ANSWER_TIMEOUT));
        let result = self.precopy_and_switch(&mut *stream, started);
        if let Err(e) = &result {
            // Best effort: the destination drops what it built.
            let _ = protocol::send_request(&mut *stream, Command::Abandon, &[]);
            let _ = stream.shutdown();
            return Err(crate::error_chain(e));
        }
        Ok(())
    }

    fn precopy_and_switch(
        &self,
        stream: &mut dyn Stream,
        started: Instant,
    ) -> Result<(), MigrationError> {
        protocol::send_request(stream, Command::Start, &protocol::start_payload())
            .map_err(ProtocolError::from)?;
        protocol::read_response(stream)?;
        protocol::send_request(stream, Command::Config, &self.config)
            .map_err(ProtocolError::from)?;
        protocol::read_response(stream)?;

        let mem = &*self.mem;
        self.vm
            .set_dirty_logging(mem, true)
            .map_err(MigrationError::DirtyLog)?;
        reset_device_bitmaps(mem);
        let mut table = all_ranges(mem);
        update(&self.progress, |i| i.memory_bytes = table.bytes());
        let mut pass = 0u32;
        loop {
            pass += 1;
            let pass_start = Instant::now();
            let sent = send_memory(stream, mem, &table, &self.progress, &|| self.go_on(started))?;
            let elapsed = pass_start.elapsed().as_secs_f64().max(1e-3);
            let bandwidth = (sent as f64 / elapsed).max(1.0);
            table = dirty_ranges(&self.vm, mem)?;
            let dirty = table.bytes();
            let expected = Duration::from_secs_f64(dirty as f64 / bandwidth);
            update(&self.progress, |i| {
                i.pass = pass;
                i.dirty_bytes = dirty;
                i.dirty_rate_bytes_per_s = (dirty as f64 / elapsed) as u64;
                i.bandwidth_bytes_per_s = bandwidth as u64;
                i.expected_downtime_ms = expected.as_millis() as u64;
                i.total_ms = started.elapsed().as_millis() as u64;
            });
            log::info!(
                "Migration pass {pass}: {sent} bytes in {elapsed:.2} s, {dirty} bytes dirty, expected downtime {} ms",
                expected.as_millis()
            );
            self.go_on(started)?;
            if expected <= self.downtime || pass >= MAX_PASSES {
                break;
            }
        }

        // Stop-and-copy: the control loop pauses the VM and saves it (and
        // refuses cancels from now on).
        let blackout = Instant::now();
        let (reply, answer) = mpsc::channel();
        self.control.send(SourceRequest::Switchover(reply));
        let state = answer
            .recv()
            .map_err(|_| MigrationError::Switchover("control loop gone".into()))?
            .map_err(MigrationError::Switchover)?;
        let saved = blackout.elapsed();
        // What the last pass left dirty, and what was written since.
        table.extend(dirty_ranges(&self.vm, mem)?);
        let last = send_memory(stream, mem, &table, &self.progress, &|| Ok(()))?;
        let copied = blackout.elapsed();
        protocol::send_request(stream, Command::State, &state).map_err(ProtocolError::from)?;
        protocol::read_response(stream)?;
        let restored = blackout.elapsed();
        protocol::send_request(stream, Command::Complete, &[]).map_err(ProtocolError::from)?;
        protocol::read_response(stream)?;
        let done = blackout.elapsed();
        let downtime = done.as_millis() as u64;
        // Where the blackout went, to tell what to make faster: logged,
        // and kept for vm.info and vm.counters.
        let stages = BlackoutStages {
            pause_save_ms: saved.as_millis() as u64,
            last_memory_ms: copied.saturating_sub(saved).as_millis() as u64,
            last_memory_bytes: last,
            state_ms: restored.saturating_sub(copied).as_millis() as u64,
            state_bytes: state.len() as u64,
            handover_ms: done.saturating_sub(restored).as_millis() as u64,
        };
        log::info!(
            "Migration switch-over: paused and saved in {} ms, last {last} bytes of memory in {} ms, \
             {} bytes of state restored in {} ms, handed over in {} ms, blackout {downtime} ms",
            stages.pause_save_ms,
            stages.last_memory_ms,
            stages.state_bytes,
            stages.state_ms,
            stages.handover_ms,
        );
        update(&self.progress, |i| {
            i.downtime_ms = Some(downtime);
            i.blackout = Some(stages);
            i.bytes_transferred += state.len() as u64;
        });
        Ok(())
    }
}

/// What an incoming migration needs from the VMM: building a VM from a
/// configuration and restoring a state into it.
pub trait Target: Sized {
    /// Builds the VM (memory, KVM, devices) without running it.
    fn build(config: VmConfig) -> Result<Self, String>;
    fn memory(&self) -> &GuestMemory;
    /// Restores a [`VmSnapshot`]; the VM stays stopped.
    fn restore(&mut self, state: &VmSnapshot) -> Result<(), String>;
}

/// How long a peer has, once connected, to send a valid `Start`: a
/// connection that does not is no source and must not hold the listener.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the destination waits for the source's next request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Receives one migration on `listener`: returns the built and restored VM
/// once the source handed it over. Peers that fail the TLS handshake or
/// do not start with a valid `Start` are dropped and the listener goes on,
/// so a stray or hostile connection cannot spoil a legitimate migration;
/// a source that started and then fails ends the receive.
pub fn receive<T: Target>(
    listener: &Listener,
    host: &HostSettings,
    progress: &Progress,
) -> Result<(T, VmConfig), MigrationError> {
    loop {
        let mut stream = match listener.accept() {
            Ok(stream) => stream,
            Err(e @ AcceptError::Peer(..)) => {
                log::warn!("{}", crate::error_chain(&e));
                continue;
            }
            Err(AcceptError::Socket(e)) => {
                return Err(MigrationError::Listen("the receiver socket".into(), e))
            }
        };
        match read_start(&mut *stream) {
            Ok(()) => return receive_from(&mut *stream, host, progress),
            Err(e) => log::warn!(
                "Dropped a connection that is no migration source: {}",
                crate::error_chain(&e)
            ),
        }
    }
}

/// The first request of a source, answered.
fn read_start(stream: &mut dyn Stream) -> Result<(), ProtocolError> {
    stream
        .set_read_timeout(Some(START_TIMEOUT))
        .map_err(ProtocolError::Io)?;
    stream
        .set_write_timeout(Some(START_TIMEOUT))
        .map_err(ProtocolError::Io)?;
    let header = protocol::read_request_header(stream, 0)?;
    header.expect(Command::Start)?;
    let result = header
        .payload(stream)
        .and_then(|p| protocol::check_start(&p));
    if let Err(e) = &result {
        let _ = protocol::send_response(stream, Err(&e.to_string()));
    }
    result?;
    protocol::send_response(stream, Ok(())).map_err(ProtocolError::Io)?;
    stream
        .set_read_timeout(Some(REQUEST_TIMEOUT))
        .map_err(ProtocolError::Io)?;
    stream
        .set_write_timeout(Some(REQUEST_TIMEOUT))
        .map_err(ProtocolError::Io)
}

/// The rest of a migration, after its `Start`.
fn receive_from<T: Target>(
    stream: &mut dyn Stream,
    host: &HostSettings,
    progress: &Progress,
) -> Result<(T, VmConfig), MigrationError> {
    update(progress, |i| i.status = MigrationStatus::Active);
    let started = Instant::now();
    let mut target: Option<(T, VmConfig)> = None;
    loop {
        let guest_bytes = target.as_ref().map_or(0, |(_, c)| c.memory);
        let header = protocol::read_request_header(&mut *stream, guest_bytes)?;
        let result = match header.command {
            Command::Start => header
                .payload(&mut *stream)
                .and_then(|p| protocol::check_start(&p))
                .map_err(MigrationError::from),
            Command::Config if target.is_none() => {
                let payload = header.payload(&mut *stream)?;
                build_target(&payload, host).map(|t| {
                    update(progress, |i| i.memory_bytes = t.1.memory);
                    target = Some(t);
                })
            }
            Command::Memory => match &target {
                Some((t, _)) => receive_memory(&mut *stream, t.memory(), header.length).map(|n| {
                    update(progress, |i| {
                        i.bytes_transferred += n;
                        i.pass += 1;
                    })
                }),
                None => Err(MigrationError::Config(
                    "memory before the configuration".into(),
                )),
            },
            Command::State => {
                let payload = header.payload(&mut *stream)?;
                let t0 = Instant::now();
                match target.as_mut() {
                    Some((t, _)) => VmSnapshot::from_bytes(&payload)
                        .map_err(|e| MigrationError::Restore(crate::error_chain(&e)))
                        .and_then(|s| t.restore(&s).map_err(MigrationError::Restore))
                        .map(|()| {
                            log::info!(
                                "Restored {} bytes of VM state in {} ms",
                                payload.len(),
                                t0.elapsed().as_millis()
                            )
                        }),
                    None => Err(MigrationError::Config(
                        "state before the configuration".into(),
                    )),
                }
            }
            Command::Complete => {
                if let Some(t) = target.take() {
                    protocol::send_response(&mut *stream, Ok(())).map_err(ProtocolError::from)?;
                    update(progress, |i| {
                        i.status = MigrationStatus::Completed;
                        i.total_ms = started.elapsed().as_millis() as u64;
                    });
                    return Ok(t);
                }
                Err(MigrationError::Config(
                    "complete before the configuration".into(),
                ))
            }
            Command::Abandon => return Err(MigrationError::Abandoned),
            Command::Config => Err(MigrationError::Config("configuration sent twice".into())),
        };
        if let Err(e) = result {
            let msg = crate::error_chain(&e);
            let _ = protocol::send_response(&mut *stream, Err(&msg));
            return Err(e);
        }
        protocol::send_response(&mut *stream, Ok(())).map_err(ProtocolError::from)?;
    }
}

fn build_target<T: Target>(
    payload: &[u8],
    host: &HostSettings,
) -> Result<(T, VmConfig), MigrationError> {
    let mut config: VmConfig =
        serde_json::from_slice(payload).map_err(|e| MigrationError::Config(e.to_string()))?;
    host.apply(&mut config).map_err(MigrationError::Config)?;
    let target = T::build(config.clone()).map_err(MigrationError::Build)?;
    Ok((target, config))
}

/// Names of a snapshot's files in its directory.
const SNAPSHOT_CONFIG: &str = "config.json";
const SNAPSHOT_MEMORY: &str = "memory.ram";
/// Binary (`vm_migration::Snapshot::to_bytes`: its header names the encoding and version).
const SNAPSHOT_STATE: &str = "state.bin";
/// Where VMMs before the binary state encoding wrote it, as JSON: recognised only to refuse it
/// by name.
const OLD_SNAPSHOT_STATE: &str = "state.json";

fn file_error(path: &Path) -> impl FnOnce(std::io::Error) -> MigrationError + '_ {
    move |e| MigrationError::File(path.display().to_string(), e)
}

/// Writes a paused VM's configuration, RAM (regions back to back) and
/// state into `dir` (created if needed).
pub fn write_snapshot(
    dir: &Path,
    config: &VmConfig,
    mem: &GuestMemory,
    state: &[u8],
) -> Result<(), MigrationError> {
    std::fs::create_dir_all(dir).map_err(file_error(dir))?;
    let path = dir.join(SNAPSHOT_CONFIG);
    let json =
        serde_json::to_vec_pretty(config).map_err(|e| MigrationError::Config(e.to_string()))?;
    std::fs::write(&path, json).map_err(file_error(&path))?;
    let path = dir.join(SNAPSHOT_MEMORY);
    let mut file = std::fs::File::create(&path).map_err(file_error(&path))?;
    let mut buf = vec![0u8; CHUNK_BYTES];
    for &(gpa, len) in all_ranges(mem).ranges() {
        copy_range(gpa, len, &mut buf, |chunk, addr| {
            mem.read_slice(chunk, addr)
                .map_err(MigrationError::Memory)?;
            file.write_all(chunk).map_err(file_error(&path))
        })?;
    }
    file.sync_all().map_err(file_error(&path))?;
    let path = dir.join(SNAPSHOT_STATE);
    std::fs::write(&path, state).map_err(file_error(&path))?;
    Ok(())
}

/// The configuration of the snapshot in `dir`.
pub fn read_snapshot_config(dir: &Path) -> Result<VmConfig, MigrationError> {
    let path = dir.join(SNAPSHOT_CONFIG);
    let bytes = std::fs::read(&path).map_err(file_error(&path))?;
    let config: VmConfig =
        serde_json::from_slice(&bytes).map_err(|e| MigrationError::Config(e.to_string()))?;
    config
        .validate()
        .map_err(|e| MigrationError::Config(e.to_string()))?;
    Ok(config)
}

/// Loads the snapshot in `dir` into a VM built from its configuration.
pub fn restore_snapshot<T: Target>(dir: &Path, target: &mut T) -> Result<(), MigrationError> {
    if !dir.join(SNAPSHOT_STATE).exists() && dir.join(OLD_SNAPSHOT_STATE).exists() {
        return Err(MigrationError::Restore(format!(
            "{} holds a snapshot of an older pvrdma-vmm ({OLD_SNAPSHOT_STATE}, JSON state), which \
             this version cannot restore",
            dir.display()
        )));
    }
    let path = dir.join(SNAPSHOT_MEMORY);
    let mut file = std::fs::File::open(&path).map_err(file_error(&path))?;
    let mem = target.memory();
    let ranges = all_ranges(mem);
    let expected = ranges.bytes();
    let actual = file.metadata().map_err(file_error(&path))?.len();
    if actual != expected {
        return Err(MigrationError::Config(format!(
            "{} holds {actual} bytes, the VM has {expected} bytes of RAM",
            path.display()
        )));
    }
    let mut buf = vec![0u8; CHUNK_BYTES];
    for &(gpa, len) in ranges.ranges() {
        copy_range(gpa, len, &mut buf, |chunk, addr| {
            file.read_exact(chunk).map_err(file_error(&path))?;
            mem.write_slice(chunk, addr).map_err(MigrationError::Memory)
        })?;
    }
    let path = dir.join(SNAPSHOT_STATE);
    let bytes = std::fs::read(&path).map_err(file_error(&path))?;
    let state = VmSnapshot::from_bytes(&bytes)
        .map_err(|e| MigrationError::Restore(crate::error_chain(&e)))?;
    target.restore(&state).map_err(MigrationError::Restore)
}

/// The receiving side of the channel a receiver thread hands its VM over.
pub type Handover<T> = Receiver<Result<(T, VmConfig), String>>;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Write as _;
    use std::net::TcpStream;
    use std::str::FromStr;

    use vm_migration::test_pki;

    use super::*;
    use crate::config::{NetConfig, SerialConfig};

    /// A VM that is only its memory.
    struct Memory(GuestMemory);

    impl Target for Memory {
        fn build(config: VmConfig) -> Result<Self, String> {
            crate::memory::create_guest_memory(config.memory)
                .map(Memory)
                .map_err(|e| e.to_string())
        }
        fn memory(&self) -> &GuestMemory {
            &self.0
        }
        fn restore(&mut self, _: &VmSnapshot) -> Result<(), String> {
            Ok(())
        }
    }

    const MAC: &str = "52:54:00:00:00:01";

    fn config(memory: u64) -> VmConfig {
        VmConfig {
            kernel: "/boot/vmlinux".into(),
            initramfs: None,
            cmdline: String::new(),
            cpus: 1,
            memory,
            disks: Vec::new(),
            nets: vec![NetConfig::from_str(&format!("tap=tap-src,mac={MAC}")).unwrap()],
            pvrdma: None,
            serial: SerialConfig::Tty,
        }
    }

    /// A source's whole conversation: its configuration, one page of
    /// `0xab` at 1 MiB, the hand-over. The destination's refusal, if
    /// any, is the error.
    fn migrate(stream: &mut dyn Stream, config: &VmConfig) -> Result<(), ProtocolError> {
        protocol::send_request(stream, Command::Start, &protocol::start_payload())?;
        protocol::read_response(stream)?;
        protocol::send_request(
            stream,
            Command::Config,
            &serde_json::to_vec(config).unwrap(),
        )?;
        protocol::read_response(stream)?;
        let mut table = MemoryRangeTable::default();
        table.push(1 << 20, PAGE_SIZE);
        protocol::send_request_header(stream, Command::Memory, table.encoded_len() + PAGE_SIZE)?;
        stream.write_all(&table.encode())?;
        stream.write_all(&[0xab; PAGE_SIZE as usize])?;
        stream.flush()?;
        protocol::read_response(stream)?;
        protocol::send_request(stream, Command::Complete, &[])?;
        protocol::read_response(stream)
    }

    fn host() -> HostSettings {
        HostSettings {
            taps: [(MAC.to_owned(), "tap-dst".to_owned())].into(),
            disks: BTreeMap::new(),
            disk_dirs: Vec::new(),
            max_memory: 256 << 20,
            serial: SerialConfig::Off,
        }
    }

    fn progress() -> Progress {
        Arc::new(Mutex::new(Some(start_info(
            MigrationDirection::Receive,
            "tcp:",
            MigrationStatus::Listening,
        ))))
    }

    /// A snapshot directory an older VMM wrote (JSON state in state.json) is refused by name,
    /// before its memory is read.
    #[test]
    fn an_older_snapshot_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("old-snap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(OLD_SNAPSHOT_STATE), b"{}").unwrap();
        let mut target = Memory::build(config(16 << 20)).unwrap();
        let err = restore_snapshot(&dir, &mut target).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.contains("snapshot of an older pvrdma-vmm"), "{err}");
    }

    /// Peers without the right certificate, with the wrong CA, in plain
    /// TCP or sending garbage are each dropped; the legitimate source
    /// that comes after them migrates its VM.
    #[test]
    fn refused_peers_leave_a_later_migration_unaffected() {
        let dir = std::env::temp_dir().join(format!("mig-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = test_pki::make(&dir, "good");
        let other = test_pki::make(&dir, "other");
        let listener = MigrationUrl::Tcp("127.0.0.1:0".into())
            .listen(Some(good.destination.server().unwrap()))
            .unwrap();
        let Listener::Tcp(tcp, _) = &listener else {
            unreachable!()
        };
        let addr = tcp.local_addr().unwrap();
        let url = MigrationUrl::Tcp(addr.to_string());
        let progress = progress();
        std::thread::scope(|scope| {
            let receiver = scope.spawn(|| receive::<Memory>(&listener, &host(), &progress));
            // A certificate of another CA: the handshake fails.
            let stranger = vm_migration::tls::TlsFiles {
                ca: good.source.ca.clone(),
                ..other.source.clone()
            };
            if let Ok(mut s) = url.connect(Some(&stranger.client().unwrap())) {
                assert!(migrate(&mut *s, &config(128 << 20)).is_err());
            }
            // A source that trusts another CA refuses the destination.
            let wrong_ca = vm_migration::tls::TlsFiles {
                ca: other.source.ca.clone(),
                ..good.source.clone()
            };
            assert!(url.connect(Some(&wrong_ca.client().unwrap())).is_err());
            // Plain TCP against the TLS listener.
            let mut plain = url.connect(None).unwrap();
            assert!(migrate(&mut *plain, &config(128 << 20)).is_err());
            // Garbage.
            let mut garbage = TcpStream::connect(addr).unwrap();
            let _ = garbage.write_all(&[0xff; 1 << 16]);
            drop(garbage);

            let source = good.source.client().unwrap();
            let mut s = url.connect(Some(&source)).unwrap();
            migrate(&mut *s, &config(128 << 20)).unwrap();
            let (vm, config) = receiver.join().unwrap().unwrap();
            assert_eq!(config.nets[0].tap, "tap-dst");
            let mut page = [0u8; PAGE_SIZE as usize];
            vm.memory()
                .read_slice(&mut page, GuestAddress(1 << 20))
                .unwrap();
            assert_eq!(page, [0xab; PAGE_SIZE as usize]);
        });
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A VM over the destination's memory limit is refused at its
    /// configuration: the source is told why (and keeps its VM).
    #[test]
    fn policy_refusal_reaches_the_source() {
        let path = std::env::temp_dir().join(format!("mig-policy-{}.sock", std::process::id()));
        let url = MigrationUrl::Unix(path);
        let listener = url.listen(None).unwrap();
        let progress = progress();
        std::thread::scope(|scope| {
            let receiver = scope.spawn(|| receive::<Memory>(&listener, &host(), &progress));
            let mut s = url.connect(None).unwrap();
            let e = migrate(&mut *s, &config(512 << 20))
                .unwrap_err()
                .to_string();
            assert!(e.contains("over this host's limit of 256 MiB"), "{e}");
            let e = receiver.join().unwrap().err().unwrap().to_string();
            assert!(e.contains("Invalid configuration from the source"), "{e}");
        });
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The source of a live migration: the sending thread's pre-copy loop and
//! switch-over.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::{
    ActionError, ApiResponse, BlackoutStages, MigrationDirection, MigrationStatus, ResponseBody,
};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Bytes, GuestMemoryBackend as _, GuestMemoryRegion};
use vm_migration::protocol::{self, Command, MemoryRangeTable, ProtocolError};
use vm_migration::stream::Stream;
use vm_migration::tls::TlsClient;
use vm_migration::transport::MigrationUrl;
use vmm_sys_util::eventfd::EventFd;

use super::{
    all_ranges, copy_range, start_info, tls_files, update, MigrationError, Progress, VcpuCpuids,
    CHUNK_BYTES, PAGE_SIZE,
};
use crate::kvm::Vm;
use crate::machine::{eventfd, Guest};
use crate::memory::GuestMemory;

/// Bytes of one `Memory` batch: a batch is answered before the next, so
/// a destination error stops the source within one batch.
const BATCH_BYTES: u64 = 64 << 20;
/// Pre-copy passes after which the VM is stopped whatever the estimate.
const MAX_PASSES: u32 = 30;
/// How long the source waits for any one answer of the destination.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

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

/// What the sending thread asks of the control loop, which owns the vCPUs.
#[derive(Debug)]
pub enum SourceRequest {
    /// Take the devices' restore hints again, the VM running, and answer
    /// with them (just before the switch-over).
    Hints(Sender<Result<Vec<u8>, String>>),
    /// Pause the VM (vCPUs, then devices) and answer with its state.
    Switchover(Sender<Result<Vec<u8>, String>>),
    /// The migration ended.
    Finished(Ended),
}

/// How an outgoing migration ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The destination runs the VM.
    HandedOver,
    /// The destination cannot run the VM: it goes on here.
    Failed(String),
    /// The destination may run the VM ([`MigrationError::InDoubt`]): it
    /// stays paused here.
    InDoubt(String),
}

/// Hands the paused, restored VM over: `Complete`, then its answer. From
/// the first byte of `Complete` on the destination may run the VM, so only
/// its refusal lets the source resume it; a lost answer is in doubt.
fn hand_over(stream: &mut dyn Stream) -> Result<(), MigrationError> {
    protocol::send_request(stream, Command::Complete, &[])
        .map_err(|e| MigrationError::InDoubt(e.into()))?;
    match protocol::read_response(stream) {
        Ok(()) => Ok(()),
        Err(e @ ProtocolError::Refused(_)) => Err(e.into()),
        Err(e) => Err(MigrationError::InDoubt(e)),
    }
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
    /// Each vCPU's CPUID ([`super::VcpuCpuids`]), for the destination to
    /// check before the memory.
    pub cpuid: Vec<u8>,
    /// The devices' restore hints, taken at the start, for the
    /// destination to make ahead what their restore would (see
    /// [`vm_migration::Snapshottable::restore_hint`]).
    pub hints: Vec<u8>,
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

    /// What the control loop answers to `request` (it holds the VM); its
    /// refusal as `failed` says.
    fn ask(
        &self,
        request: fn(Sender<Result<Vec<u8>, String>>) -> SourceRequest,
        failed: fn(String) -> MigrationError,
    ) -> Result<Vec<u8>, MigrationError> {
        let (reply, answer) = mpsc::channel();
        self.control.send(request(reply));
        answer
            .recv()
            .map_err(|_| failed("control loop gone".into()))?
            .map_err(failed)
    }

    /// Runs the whole migration; the result goes to the control loop.
    pub fn run(self) {
        let started = Instant::now();
        let ended = self.migrate(started);
        if let Err(e) = self.vm.set_dirty_logging(&self.mem, false) {
            log::warn!("Failed to turn dirty logging off: {e}");
        }
        let total_ms = started.elapsed().as_millis() as u64;
        update(&self.progress, |i| {
            i.total_ms = total_ms;
            match &ended {
                Ended::HandedOver => i.status = MigrationStatus::Completed,
                Ended::Failed(e) | Ended::InDoubt(e) => {
                    i.status = MigrationStatus::Failed;
                    i.error = Some(e.clone());
                }
            }
        });
        match &ended {
            Ended::HandedOver => log::info!("Migration to {} completed in {total_ms} ms", self.url),
            Ended::Failed(e) | Ended::InDoubt(e) => {
                log::error!("Migration to {} failed: {e}", self.url)
            }
        }
        self.control.send(SourceRequest::Finished(ended));
    }

    fn migrate(&self, started: Instant) -> Ended {
        let mut stream = match self.url.connect(self.tls.as_ref()) {
            Ok(stream) => stream,
            Err(e) => {
                let e = MigrationError::Connect(self.url.to_string(), e);
                return Ended::Failed(crate::error_chain(&e));
            }
        };
        let _ = stream.set_read_timeout(Some(ANSWER_TIMEOUT));
        let _ = stream.set_write_timeout(Some(ANSWER_TIMEOUT));
        match self.precopy_and_switch(&mut *stream, started) {
            Ok(()) => Ended::HandedOver,
            Err(e @ MigrationError::InDoubt(_)) => Ended::InDoubt(crate::error_chain(&e)),
            Err(e) => {
                // Best effort: the destination drops what it built.
                let _ = protocol::send_request(&mut *stream, Command::Abandon, &[]);
                let _ = stream.shutdown();
                Ended::Failed(crate::error_chain(&e))
            }
        }
    }

    /// Sends `table`'s pages as pass `pass` while the VM runs, takes what
    /// was dirtied meanwhile as the next `table`, and reports the pass;
    /// returns the downtime expected for the next table at this pass's
    /// bandwidth.
    fn pass(
        &self,
        stream: &mut dyn Stream,
        table: &mut MemoryRangeTable,
        pass: u32,
        what: &str,
        started: Instant,
    ) -> Result<Duration, MigrationError> {
        let mem = &*self.mem;
        let pass_start = Instant::now();
        let sent = send_memory(stream, mem, table, &self.progress, &|| self.go_on(started))?;
        let elapsed = pass_start.elapsed().as_secs_f64().max(1e-3);
        let bandwidth = (sent as f64 / elapsed).max(1.0);
        *table = dirty_ranges(&self.vm, mem)?;
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
            "Migration pass {pass}{what}: {sent} bytes in {elapsed:.2} s, {dirty} bytes dirty, \
             expected downtime {} ms",
            expected.as_millis()
        );
        Ok(expected)
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
        protocol::send_request(stream, Command::Cpuid, &self.cpuid).map_err(ProtocolError::from)?;
        protocol::read_response(stream)?;
        protocol::send_request(stream, Command::Hints, &self.hints).map_err(ProtocolError::from)?;
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
            let expected = self.pass(stream, &mut table, pass, "", started)?;
            self.go_on(started)?;
            if expected <= self.downtime || pass >= MAX_PASSES {
                break;
            }
        }

        // The devices' hints again, the VM still running: the destination
        // decodes ahead what of their state stays the same until the pause
        // (PVRDMA's QPs), which their save inside the blackout then leaves
        // out.
        let t0 = Instant::now();
        let hints = self.ask(SourceRequest::Hints, MigrationError::Hints)?;
        let taken = t0.elapsed();
        protocol::send_request(stream, Command::Hints, &hints).map_err(ProtocolError::from)?;
        protocol::read_response(stream)?;
        log::info!(
            "The devices' later restore hints: {} bytes taken in {} ms, prepared by the \
             destination {} ms later",
            hints.len(),
            taken.as_millis(),
            t0.elapsed().saturating_sub(taken).as_millis()
        );
        update(&self.progress, |i| {
            i.bytes_transferred += hints.len() as u64
        });
        self.go_on(started)?;

        // One more pass, the VM still running: what the last one left
        // dirty, and so not what the guest wrote during the hints' round
        // trip (300 ms with 4096 QPs in the test host), which the blackout
        // would otherwise copy.
        self.pass(stream, &mut table, pass + 1, " (after the hints)", started)?;

        // Stop-and-copy: the control loop pauses the VM and saves it (and
        // refuses cancels from now on). Until the hand-over is answered
        // nothing is logged (see `crate::logging`).
        let quiet = crate::logging::hold();
        let blackout = Instant::now();
        let state = self.ask(SourceRequest::Switchover, MigrationError::Switchover)?;
        let saved = blackout.elapsed();
        // What the last pass left dirty, and what was written since.
        table.extend(dirty_ranges(&self.vm, mem)?);
        let last = send_memory(stream, mem, &table, &self.progress, &|| Ok(()))?;
        let copied = blackout.elapsed();
        protocol::send_request(stream, Command::State, &state).map_err(ProtocolError::from)?;
        protocol::read_response(stream)?;
        let restored = blackout.elapsed();
        hand_over(stream)?;
        let done = blackout.elapsed();
        drop(quiet);
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

/// The devices' restore hints, taken now, as the destination reads them.
fn restore_hints(guest: &Guest) -> Result<Vec<u8>, String> {
    guest
        .devices
        .restore_hints()
        .map(|h| h.to_bytes())
        .map_err(|e| crate::error_chain(&e))
}

/// A migration being sent, as the control loop holds it: the sending
/// thread and its requests to the loop.
pub(crate) struct Outgoing {
    requests: Receiver<SourceRequest>,
    pub(crate) evt: EventFd,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The switch-over paused the VM (undone if the migration fails).
    pub(crate) paused_vm: bool,
    /// Shared with the sending thread: `vm.cancel-migration` sets it.
    cancel: Arc<AtomicBool>,
    /// The switch-over began: too late to cancel.
    switching: bool,
}

impl Outgoing {
    /// Starts sending `guest` as `params` ask, reporting to `progress`.
    pub(crate) fn start(
        params: &api::SendMigrationParams,
        guest: &Guest,
        progress: &Progress,
    ) -> Result<Self, ActionError> {
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
            .map(|t| tls_files(t).client())
            .transpose()
            .map_err(|e| ActionError::BadRequest(crate::error_chain(&e)))?;
        url.check_plaintext(tls.is_some(), params.allow_plaintext)
            .map_err(|e| ActionError::BadRequest(crate::error_chain(&e)))?;
        let config = guest
            .config
            .to_json()
            .map_err(|e| ActionError::Failed(format!("cannot encode the configuration: {e}")))?;
        let cpuid = VcpuCpuids(guest.cpuids.clone())
            .to_bytes()
            .map_err(|e| ActionError::Failed(crate::error_chain(&e)))?;
        let hints = restore_hints(guest).map_err(ActionError::Failed)?;
        let (requests_tx, requests) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let evt = eventfd().map_err(|e| ActionError::Failed(crate::error_chain(&e)))?;
        let wake = evt
            .try_clone()
            .map_err(|e| ActionError::Failed(e.to_string()))?;
        let mut info = start_info(
            MigrationDirection::Send,
            &url.to_string(),
            MigrationStatus::Active,
        );
        info.memory_bytes = guest.config.memory;
        *crate::lock(progress) = Some(info);
        let source = Source {
            url,
            tls,
            downtime: Duration::from_millis(params.downtime_ms),
            timeout: Duration::from_secs(params.timeout_s),
            config,
            cpuid,
            hints,
            mem: guest.mem.clone(),
            vm: guest.vm.clone(),
            progress: progress.clone(),
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
        log::info!("Migration to {} started", params.destination_url);
        Ok(Self {
            requests,
            evt,
            thread: Some(thread),
            paused_vm: false,
            cancel,
            switching: false,
        })
    }

    /// Answers the sending thread: pauses and saves `guest` for the
    /// switch-over, or ends the migration (the VM resumes here if it
    /// failed after the pause). Returns the migration's result once it
    /// ended: `Ok` = the destination runs the VM now.
    pub(crate) fn handle(&mut self, guest: &mut Guest) -> Option<Result<(), String>> {
        let _ = self.evt.read();
        let requests: Vec<SourceRequest> = self.requests.try_iter().collect();
        for request in requests {
            match request {
                SourceRequest::Hints(reply) => {
                    let _ = reply.send(restore_hints(guest));
                }
                SourceRequest::Switchover(reply) => {
                    self.switching = true;
                    // A cancel the sender had not seen yet.
                    if self.cancel.load(Ordering::Acquire) {
                        let _ = reply.send(Err("cancelled through the API".into()));
                        continue;
                    }
                    let was_paused = guest.paused;
                    let t0 = Instant::now();
                    let cpu0 = crate::thread_cpu_time();
                    let result = if was_paused { Ok(()) } else { guest.pause_vm() };
                    let t1 = Instant::now();
                    let result = result.and_then(|()| guest.save_state());
                    log::info!(
                        "Switch-over: VM paused in {} ms, state saved in {} ms ({} ms of CPU \
                         for both)",
                        t1.duration_since(t0).as_millis(),
                        t1.elapsed().as_millis(),
                        crate::thread_cpu_time().saturating_sub(cpu0).as_millis()
                    );
                    self.paused_vm = !was_paused && guest.paused;
                    let _ = reply.send(result);
                }
                SourceRequest::Finished(ended) => {
                    if let Some(t) = self.thread.take() {
                        let _ = t.join();
                    }
                    guest.devices.forget_hints();
                    if matches!(ended, Ended::Failed(_)) && self.paused_vm {
                        if let Err(e) = guest.resume_vm() {
                            log::error!("Failed to resume the VM after the failed migration: {e}");
                        } else {
                            log::info!("VM resumed after the failed migration");
                        }
                    }
                    if matches!(ended, Ended::InDoubt(_)) {
                        log::error!(
                            "The VM stays paused: resume it here (vm.resume) only if the destination does not run it"
                        );
                    }
                    return Some(match ended {
                        Ended::HandedOver => Ok(()),
                        Ended::Failed(e) | Ended::InDoubt(e) => Err(e),
                    });
                }
            }
        }
        None
    }

    /// Stops the migration before its switch-over; the VM goes on here.
    /// After the switch-over began it completes or fails on its own.
    pub(crate) fn cancel(&self) -> ApiResponse {
        if self.switching {
            return Err(ActionError::InvalidState(
                "too late to cancel: the switch-over has begun".into(),
            ));
        }
        self.cancel.store(true, Ordering::Release);
        log::info!("Migration cancel requested");
        Ok(ResponseBody::Empty)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{self, Read, Write};
    use std::net::Shutdown;
    use std::os::unix::net::{UnixListener, UnixStream};

    use vm_migration::transport::MigrationUrl;

    use super::super::destination::receive;
    use super::super::test_target::{config, host, progress, Memory};
    use super::*;

    const MEMORY: u64 = 64 << 20;

    /// Where the connection between source and destination is cut.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Cut {
        /// Nowhere.
        Never,
        /// Before the (first) request with this command reaches the
        /// destination.
        Request(Command),
        /// Before the destination's answer to it reaches the source.
        Answer(Command),
    }

    fn unix_path(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("mig-cut-{name}-{}.sock", std::process::id()))
    }

    /// Forwards requests from `source` to `destination` and answers back,
    /// closing both connections at `cut`.
    fn proxy(source: UnixStream, destination: UnixStream, cut: Cut) {
        let (sent, answered) = mpsc::channel();
        let ends = Arc::new((
            source.try_clone().unwrap(),
            destination.try_clone().unwrap(),
        ));
        let close = move || {
            let _ = ends.0.shutdown(Shutdown::Both);
            let _ = ends.1.shutdown(Shutdown::Both);
        };
        let (mut from_source, mut to_source) = (source.try_clone().unwrap(), source);
        let (mut from_dest, mut to_dest) = (destination.try_clone().unwrap(), destination);
        let close_requests = close.clone();
        let requests = std::thread::spawn(move || -> io::Result<()> {
            loop {
                let Ok(h) = protocol::read_request_header(&mut from_source, u64::MAX) else {
                    return Ok(());
                };
                if cut == Cut::Request(h.command) {
                    close_requests();
                    return Ok(());
                }
                let _ = sent.send(h.command);
                protocol::send_request_header(&mut to_dest, h.command, h.length)?;
                io::copy(&mut (&mut from_source).take(h.length), &mut to_dest)?;
            }
        });
        // Answers: a 24-byte header whose last 8 bytes are the length of
        // the message after it.
        for command in answered {
            let mut header = [0u8; 24];
            if from_dest.read_exact(&mut header).is_err() {
                break;
            }
            if cut == Cut::Answer(command) {
                close();
                break;
            }
            let length = u64::from_le_bytes(header[16..].try_into().unwrap());
            let forwarded = to_source
                .write_all(&header)
                .and_then(|()| io::copy(&mut (&mut from_dest).take(length), &mut to_source));
            if forwarded.is_err() {
                break;
            }
        }
        close();
        let _ = requests.join();
    }

    /// Migrates a VM of [`MEMORY`] bytes (no vCPU: the control loop is
    /// played here, its state a few bytes) from a real source to a real
    /// destination through a connection cut at `cut`. Returns how the
    /// source ended and whether the destination got a VM to run.
    fn migrate_through(cut: Cut, name: &str) -> (Ended, bool) {
        let mem = Arc::new(crate::memory::create_guest_memory(MEMORY).unwrap());
        let vm = Arc::new(Vm::new(&mem).unwrap());
        let (to_dest, at_dest) = (unix_path(&format!("{name}-dst")), unix_path(name));
        let dest_listener = MigrationUrl::Unix(to_dest.clone()).listen(None).unwrap();
        let _ = std::fs::remove_file(&at_dest);
        let proxy_listener = UnixListener::bind(&at_dest).unwrap();
        let (requests_tx, requests) = mpsc::channel();
        let source = Source {
            url: MigrationUrl::Unix(at_dest.clone()),
            tls: None,
            // One pass is enough.
            downtime: Duration::from_secs(3600),
            timeout: Duration::from_secs(60),
            config: config(MEMORY).to_json().unwrap(),
            cpuid: b"this host's".to_vec(),
            hints: b"the devices' hints".to_vec(),
            mem,
            vm,
            progress: progress(),
            control: ControlLink {
                requests: requests_tx,
                wake: EventFd::new(0).unwrap(),
            },
            cancel: Arc::new(AtomicBool::new(false)),
        };
        let ended = std::thread::scope(|scope| {
            let receiver = scope.spawn(|| receive::<Memory>(&dest_listener, &host(), &progress()));
            scope.spawn(|| {
                let (source_side, _) = proxy_listener.accept().unwrap();
                proxy(source_side, UnixStream::connect(&to_dest).unwrap(), cut);
            });
            scope.spawn(move || source.run());
            let ended = loop {
                match requests.recv().unwrap() {
                    SourceRequest::Hints(reply) => {
                        reply
                            .send(Ok(b"the devices' later hints".to_vec()))
                            .unwrap();
                    }
                    SourceRequest::Switchover(reply) => {
                        reply.send(Ok(b"the VM's state".to_vec())).unwrap();
                    }
                    SourceRequest::Finished(ended) => break ended,
                }
            };
            (ended, receiver.join().unwrap().is_ok())
        });
        let _ = std::fs::remove_file(&at_dest);
        let _ = std::fs::remove_file(&to_dest);
        ended
    }

    /// Wherever the connection is cut, never does the destination run the
    /// VM while the source resumes it: a cut before `Complete` leaves the
    /// destination without a VM and the source resumes; from `Complete`
    /// on, the source cannot tell and stays paused (in doubt), whether the
    /// destination got it (runs) or not.
    #[test]
    fn a_cut_connection_never_runs_the_vm_twice() {
        use Command::{Complete, Config, Cpuid, Hints, Memory as Mem, Start, State};
        let cases = [
            (Cut::Never, "HandedOver", true),
            (Cut::Answer(Start), "Failed", false),
            (Cut::Request(Config), "Failed", false),
            (Cut::Answer(Config), "Failed", false),
            (Cut::Request(Cpuid), "Failed", false),
            (Cut::Answer(Cpuid), "Failed", false),
            (Cut::Request(Hints), "Failed", false),
            (Cut::Answer(Hints), "Failed", false),
            (Cut::Request(Mem), "Failed", false),
            (Cut::Answer(Mem), "Failed", false),
            (Cut::Request(State), "Failed", false),
            (Cut::Answer(State), "Failed", false),
            (Cut::Request(Complete), "InDoubt", false),
            (Cut::Answer(Complete), "InDoubt", true),
        ];
        let mut wrong = Vec::new();
        for (i, (cut, source_ends, destination_runs)) in cases.into_iter().enumerate() {
            let (ended, runs) = migrate_through(cut, &i.to_string());
            let twice = runs && matches!(ended, Ended::Failed(_));
            if twice || !format!("{ended:?}").starts_with(source_ends) || runs != destination_runs {
                let twice = if twice { "RUNS TWICE: " } else { "" };
                wrong.push(format!(
                    "{twice}cut {cut:?}: source {ended:?}, destination runs: {runs}"
                ));
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The destination of a live migration: accept a source, build the VM
//! from its configuration (under this host's settings), take its memory
//! and state, and hand the VM to the control loop once the source hands
//! it over.

use std::os::fd::AsRawFd;
use std::str::FromStr;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use api::{ActionError, ApiResponse, MigrationDirection, MigrationStatus, ResponseBody};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend as _};
use vm_migration::protocol::{self, Command, MemoryRangeTable, ProtocolError};
use vm_migration::stream::Stream;
use vm_migration::transport::{AcceptError, Listener, MigrationUrl};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::{
    copy_range, start_info, tls_files, update, MigrationError, Progress, Target, CHUNK_BYTES,
};
use crate::config::{SerialConfig, VmConfig};
use crate::incoming::HostSettings;
use crate::logging::{Hold, Stderr};
use crate::machine::{eventfd, Guest, Machine, StartAs, VmmError};
use crate::memory::GuestMemory;
use crate::requests::{dispatch_waiting, Api};
use crate::sandbox;

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

/// How long a peer has, once connected, to send a valid `Start`: a
/// connection that does not is no source and must not hold the listener.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the destination waits for the source's next request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// A VM handed over by its source, built and restored, not running yet.
pub struct Received<T> {
    pub target: T,
    pub config: VmConfig,
    /// The log records held since the state came: the guest waits until
    /// the VM runs here, so they are written once it does (when this is
    /// dropped; see [`crate::logging`]).
    pub quiet: Hold<Stderr>,
}

/// Receives one migration on `listener`: returns the built and restored VM
/// once the source handed it over. Peers that fail the TLS handshake or
/// do not start with a valid `Start` are dropped and the listener goes on,
/// so a stray or hostile connection cannot spoil a legitimate migration;
/// a source that started and then fails ends the receive.
pub fn receive<T: Target>(
    listener: &Listener,
    host: &HostSettings,
    progress: &Progress,
) -> Result<Received<T>, MigrationError> {
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

/// The rest of a migration, after its `Start`. Returns the VM once the
/// source's `Complete` came after its state: the source has then stopped
/// the VM for good, so it runs here even if the answer does not reach the
/// source. A connection that ends before that, or an `Abandon`, drops it.
fn receive_from<T: Target>(
    stream: &mut dyn Stream,
    host: &HostSettings,
    progress: &Progress,
) -> Result<Received<T>, MigrationError> {
    update(progress, |i| i.status = MigrationStatus::Active);
    let started = Instant::now();
    let mut target: Option<(T, VmConfig)> = None;
    let mut restored = false;
    let mut quiet = None;
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
            Command::Cpuid => {
                let payload = header.payload(&mut *stream)?;
                match &target {
                    Some((t, _)) => t.check_cpuid(&payload).map_err(MigrationError::Cpuid),
                    None => Err(MigrationError::Config(
                        "CPUID before the configuration".into(),
                    )),
                }
            }
            Command::Hints => {
                let payload = header.payload(&mut *stream)?;
                match target.as_mut() {
                    Some((t, _)) => t.prepare_restore(&payload).map_err(MigrationError::Prepare),
                    None => Err(MigrationError::Config(
                        "restore hints before the configuration".into(),
                    )),
                }
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
                // The source paused the VM: nothing is logged until it
                // runs again, here or there.
                quiet.get_or_insert_with(crate::logging::hold);
                let payload = header.payload(&mut *stream)?;
                let t0 = Instant::now();
                let cpu0 = crate::thread_cpu_time();
                match target.as_mut() {
                    // Ready to run before the acknowledgement: the source
                    // hands over only a VM that can start here at once.
                    Some((t, _)) => t
                        .restore(&payload)
                        .and_then(|()| t.prepare())
                        .map_err(MigrationError::Restore)
                        .map(|()| {
                            restored = true;
                            log::info!(
                                "Restored {} bytes of VM state in {} ms ({} ms of CPU)",
                                payload.len(),
                                t0.elapsed().as_millis(),
                                crate::thread_cpu_time().saturating_sub(cpu0).as_millis()
                            )
                        }),
                    None => Err(MigrationError::Config(
                        "state before the configuration".into(),
                    )),
                }
            }
            Command::Complete => match target.take().filter(|_| restored) {
                Some((target, config)) => {
                    // The source stopped the VM for good before sending
                    // this: it runs here, answer or not.
                    if let Err(e) = protocol::send_response(&mut *stream, Ok(())) {
                        log::warn!("The source may not hear that the VM runs here: {e}");
                    }
                    update(progress, |i| {
                        i.status = MigrationStatus::Completed;
                        i.total_ms = started.elapsed().as_millis() as u64;
                    });
                    return Ok(Received {
                        target,
                        config,
                        quiet: quiet.take().unwrap_or_else(crate::logging::hold),
                    });
                }
                None => Err(MigrationError::Config(
                    "complete before the VM's state".into(),
                )),
            },
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
    let mut config =
        VmConfig::from_json(payload).map_err(|e| MigrationError::Config(e.to_string()))?;
    host.apply(&mut config).map_err(MigrationError::Config)?;
    let target = T::build(config.clone()).map_err(MigrationError::Build)?;
    Ok((target, config))
}

/// Serves the API of a VMM started with only `--api-socket` until
/// `vm.receive-migration` brings a VM: returns it, running, with the API
/// and the migration's report; `None` when `vm.shutdown` came first.
/// `serial` is this host's console setting.
pub(crate) fn wait_for_vm(
    api: Api,
    serial: &SerialConfig,
) -> Result<Option<(Guest, Api, Progress)>, VmmError> {
    let progress: Progress = Arc::new(Mutex::new(None));
    let handover_evt = eventfd()?;
    let (handover_tx, handover) = mpsc::channel::<Handover>();
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
                    if let Some(end) = result.ends_the_wait() {
                        return end.map(|guest| Some((guest, api, progress)));
                    }
                }
                continue;
            }
            let shutdown = dispatch_waiting(&api, &progress, &mut receiving, |p| {
                start_receiver(p, serial, &progress, handover_tx.clone(), &handover_evt)
            });
            if shutdown {
                return Ok(None);
            }
        }
    }
}

/// What the receiving thread hands the VMM waiting for a VM.
enum Handover {
    /// The VM runs here.
    Running(Box<Guest>),
    /// The migration failed before `Complete`: the source still runs the VM.
    Refused(String),
    /// The VM was handed over but cannot start here: it is lost, and the
    /// VMM ends with this error rather than wait on as if nothing happened.
    Lost(String),
}

impl Handover {
    /// What the VMM waiting for a VM does with this: `None` waits for
    /// another attempt, `Some` ends the wait with the VM or the error.
    fn ends_the_wait(self) -> Option<Result<Guest, VmmError>> {
        match self {
            Handover::Running(guest) => Some(Ok(*guest)),
            // The source kept the VM: another attempt may come.
            Handover::Refused(e) => {
                log::error!("Incoming migration failed: {e}");
                None
            }
            // The source let go of it: nothing is left to serve.
            Handover::Lost(e) => Some(Err(VmmError::Restore(e))),
        }
    }
}

/// Runs a VM handed over here at once, on the receiving thread: the guest
/// waits for this, not for the control loop to take the VM over.
fn run_here(received: Received<Machine>) -> Handover {
    let t0 = Instant::now();
    let guest = match received.target.start(StartAs::Resumed) {
        Ok(guest) => guest,
        Err(e) => {
            return Handover::Lost(format!(
                "the VM was handed over but did not start: {}",
                crate::error_chain(&e)
            ))
        }
    };
    // Up to the vCPUs let go: what the guest waited for.
    log::info!(
        "Migration received; the VM runs here now (started in {} ms)",
        guest.booted_at.saturating_duration_since(t0).as_millis()
    );
    // The guest runs: what was held since the state came goes out now.
    drop(received.quiet);
    Handover::Running(Box::new(guest))
}

/// Starts a receiver thread for `params`: the listening socket is bound
/// here, so a bad URL or a taken address is the API call's error.
fn start_receiver(
    params: &api::ReceiveMigrationParams,
    serial: &SerialConfig,
    progress: &Progress,
    handover: Sender<Handover>,
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
        .map(|t| tls_files(t).server())
        .transpose()
        .map_err(|e| ActionError::BadRequest(crate::error_chain(&e)))?;
    url.check_plaintext(tls.is_some(), params.allow_plaintext)
        .map_err(|e| ActionError::BadRequest(crate::error_chain(&e)))?;
    let host = HostSettings::new(params, serial).map_err(ActionError::BadRequest)?;
    let listener = url
        .listen(tls)
        .map_err(|e| ActionError::Failed(format!("cannot listen on {url}: {e}")))?;
    *crate::lock(progress) = Some(start_info(
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
            let result = match receive::<Machine>(&listener, &host, &progress) {
                Ok(received) => run_here(received),
                Err(e) => Handover::Refused(crate::error_chain(&e)),
            };
            if let Handover::Refused(e) | Handover::Lost(e) = &result {
                if let Some(info) = crate::lock(&progress).as_mut() {
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

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::net::TcpStream;

    use vm_memory::GuestAddress;
    use vm_migration::test_pki;
    use vm_migration::transport::MigrationUrl;

    use super::super::test_target::{config, host, progress, Memory, LACKING, UNPREPARABLE};
    use super::super::PAGE_SIZE;
    use super::*;

    /// A source's conversation up to its CPUID: its configuration, then
    /// `cpuid`. The destination's refusal, if any, is the error.
    fn send_cpuid(
        stream: &mut dyn Stream,
        config: &VmConfig,
        cpuid: &[u8],
    ) -> Result<(), ProtocolError> {
        protocol::send_request(stream, Command::Start, &protocol::start_payload())?;
        protocol::read_response(stream)?;
        protocol::send_request(stream, Command::Config, &config.to_json().unwrap())?;
        protocol::read_response(stream)?;
        protocol::send_request(stream, Command::Cpuid, cpuid)?;
        protocol::read_response(stream)
    }

    /// A source's conversation up to its state: [`send_cpuid`] with a
    /// CPUID the destination takes, one page of `0xab` at 1 MiB, then the
    /// state unless `state` is false. The destination's refusal, if any, is
    /// the error.
    fn send_vm(
        stream: &mut dyn Stream,
        config: &VmConfig,
        state: bool,
    ) -> Result<(), ProtocolError> {
        send_cpuid(stream, config, b"this host's")?;
        let mut table = MemoryRangeTable::default();
        table.push(1 << 20, PAGE_SIZE);
        protocol::send_request_header(stream, Command::Memory, table.encoded_len() + PAGE_SIZE)?;
        stream.write_all(&table.encode())?;
        stream.write_all(&[0xab; PAGE_SIZE as usize])?;
        stream.flush()?;
        protocol::read_response(stream)?;
        if state {
            protocol::send_request(stream, Command::State, b"the VM's state")?;
            protocol::read_response(stream)?;
        }
        Ok(())
    }

    /// A source's whole conversation: [`send_vm`] and the hand-over.
    fn migrate(stream: &mut dyn Stream, config: &VmConfig) -> Result<(), ProtocolError> {
        send_vm(stream, config, true)?;
        protocol::send_request(stream, Command::Complete, &[])?;
        protocol::read_response(stream)
    }

    type Receiver<'s> = std::thread::ScopedJoinHandle<'s, Result<Received<Memory>, MigrationError>>;

    /// A destination on a fresh Unix socket, receiving in a thread of
    /// `scope`, and a connection of a source to it.
    fn destination<'s>(
        scope: &'s std::thread::Scope<'s, '_>,
        name: &str,
    ) -> (Receiver<'s>, Box<dyn Stream>) {
        let path = std::env::temp_dir().join(format!("mig-{name}-{}.sock", std::process::id()));
        let url = MigrationUrl::Unix(path);
        let listener = url.listen(None).unwrap();
        let receiver = scope.spawn(move || receive::<Memory>(&listener, &host(), &progress()));
        (receiver, url.connect(None).unwrap())
    }

    /// A CPUID this host cannot give is refused before any memory comes:
    /// the source is told why (and keeps its VM running).
    #[test]
    fn a_cpuid_this_host_lacks_is_refused_before_the_memory() {
        std::thread::scope(|scope| {
            let (receiver, mut s) = destination(scope, "cpuid");
            let e = send_cpuid(&mut *s, &config(64 << 20), LACKING)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("Destination refused: this host lacks AVX-512"),
                "{e}"
            );
            let e = receiver.join().unwrap().err().unwrap().to_string();
            assert!(e.contains("this host lacks AVX-512"), "{e}");
        });
    }

    /// A source that goes away after the state, before `Complete`,
    /// leaves the destination nothing to run.
    #[test]
    fn no_complete_no_vm() {
        std::thread::scope(|scope| {
            let (receiver, mut s) = destination(scope, "no-complete");
            send_vm(&mut *s, &config(64 << 20), true).unwrap();
            drop(s);
            assert!(receiver.join().unwrap().is_err());
        });
    }

    /// The VM is readied to run (vCPU threads parked) with the restore,
    /// before the state is acknowledged: a VM that cannot start here is
    /// refused while the source still has it, not after the hand-over.
    #[test]
    fn the_vm_is_prepared_before_the_state_is_acknowledged() {
        std::thread::scope(|scope| {
            let (receiver, mut s) = destination(scope, "unpreparable");
            send_vm(&mut *s, &config(64 << 20), false).unwrap();
            protocol::send_request(&mut *s, Command::State, UNPREPARABLE).unwrap();
            let e = protocol::read_response(&mut *s).unwrap_err().to_string();
            assert!(e.contains("no thread for its vCPUs"), "{e}");
            let e = receiver.join().unwrap().err().unwrap().to_string();
            assert!(e.contains("Failed to restore the VM's state"), "{e}");
        });
    }

    /// `Complete` before the state is refused: the destination would run
    /// a VM that never ran there.
    #[test]
    fn complete_needs_the_state() {
        std::thread::scope(|scope| {
            let (receiver, mut s) = destination(scope, "no-state");
            send_vm(&mut *s, &config(64 << 20), false).unwrap();
            protocol::send_request(&mut *s, Command::Complete, &[]).unwrap();
            let e = protocol::read_response(&mut *s).unwrap_err().to_string();
            assert!(e.contains("complete before the VM's state"), "{e}");
            assert!(receiver.join().unwrap().is_err());
        });
    }

    /// Once it read `Complete` the destination runs the VM even if its
    /// answer cannot reach the source: the source stopped for good.
    #[test]
    fn complete_runs_the_vm_whatever_becomes_of_the_answer() {
        std::thread::scope(|scope| {
            let (receiver, mut s) = destination(scope, "lost-answer");
            send_vm(&mut *s, &config(64 << 20), true).unwrap();
            protocol::send_request(&mut *s, Command::Complete, &[]).unwrap();
            drop(s);
            assert!(receiver.join().unwrap().is_ok());
        });
    }

    /// A PCI function that cannot resume: what makes a received VM fail
    /// to start after `Complete`.
    struct Unresumable(pci::PciConfiguration);

    impl vm_migration::Pausable for Unresumable {
        fn resume(&mut self) -> Result<(), vm_migration::MigratableError> {
            Err(vm_migration::MigratableError::Resume(
                std::io::Error::other("the test device never resumes"),
            ))
        }
    }

    impl vm_migration::Snapshottable for Unresumable {
        fn id(&self) -> String {
            "unresumable".into()
        }
        fn snapshot(&mut self) -> Result<vm_migration::Snapshot, vm_migration::MigratableError> {
            vm_migration::Snapshot::new(&self.id(), 1, &())
        }
        fn restore(
            &mut self,
            s: &vm_migration::Snapshot,
        ) -> Result<(), vm_migration::MigratableError> {
            s.state::<()>(&self.id(), 1)
        }
    }

    impl pci::PciDevice for Unresumable {
        fn config(&self) -> &pci::PciConfiguration {
            &self.0
        }
        fn config_mut(&mut self) -> &mut pci::PciConfiguration {
            &mut self.0
        }
        fn read_bar(&mut self, _bar: usize, _offset: u64, data: &mut [u8]) {
            data.fill(0xff);
        }
        fn write_bar(&mut self, _bar: usize, _offset: u64, _data: &[u8]) {}
    }

    /// A VM handed over (after `Complete`) that cannot start here ends the
    /// VMM waiting for it with the error: its source has let go of it, so
    /// waiting on for another migration would lose the VM without a word.
    /// The VM is a real machine (KVM, memory, a parked vCPU) with one
    /// device that fails to resume.
    #[test]
    fn a_vm_handed_over_that_cannot_start_ends_the_wait() {
        let config = VmConfig {
            nets: Vec::new(),
            serial: SerialConfig::Off,
            ..config(64 << 20)
        };
        let mut machine = Machine::build(config.clone(), true).unwrap();
        let header = pci::PciHeader {
            vendor_id: 0x1b36,
            device_id: 0x0005,
            class: 0xff,
            ..pci::PciHeader::default()
        };
        let device = Arc::new(Mutex::new(Unresumable(pci::PciConfiguration::new(header))));
        machine.add_pci_function(device).unwrap();
        machine.prepare().unwrap();
        let handover = run_here(Received {
            target: machine,
            config,
            quiet: crate::logging::hold(),
        });
        match handover.ends_the_wait() {
            Some(Err(e)) => {
                let e = e.to_string();
                assert!(e.contains("handed over but did not start"), "{e}");
                assert!(e.contains("the test device never resumes"), "{e}");
            }
            Some(Ok(_)) => panic!("a VM whose device did not resume runs"),
            None => panic!("the VMM waits for another migration of a VM its source let go"),
        }
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
            let Received {
                target: vm, config, ..
            } = receiver.join().unwrap().unwrap();
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

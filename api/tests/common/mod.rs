// SPDX-License-Identifier: Apache-2.0

//! A real API server on a temporary socket, with a fake VMM thread that does what the real
//! one must: wait on the eventfd, drain the channel, answer each message.

#![allow(dead_code, reason = "each test binary uses a subset of the helpers")]

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use api::client::ApiClient;
use api::{
    ActionError, ApiMessage, ApiRequest, ApiResponse, ApiServerHandle, BlackoutStages,
    DeviceCountersInfo, DiskSummary, MigrationDirection, MigrationInfo, MigrationStatus,
    QpCountersInfo, ResponseBody, ServerOptions, VmConfigSummary, VmCounters, VmInfo, VmState,
    VmmPing,
};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::tempdir::TempDir;

/// How the fake VMM treats requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers like a VMM with a running VM.
    Normal,
    /// Keeps every message and never answers (the server times out).
    Silent,
    /// Drops every message without answering.
    DropRequests,
}

/// What `vm.info` reports once the fake VMM accepted a migration.
#[derive(Clone, Debug, Default)]
pub struct MigrationScript {
    /// One report per `vm.info` call, the last one repeated.
    pub reports: Vec<MigrationInfo>,
    /// Once the last report was given, the VMM goes away (socket removed), as a source VMM
    /// exits after completing.
    pub then_vanish: bool,
}

/// The configuration the fake VM reports.
pub fn test_config() -> VmConfigSummary {
    VmConfigSummary {
        cpus: 2,
        memory_mib: 1024,
        kernel: "/images/vmlinux".into(),
        cmdline: "console=ttyS0 root=/dev/vda".into(),
        disks: vec![DiskSummary {
            path: "/images/root.raw".into(),
            readonly: false,
        }],
    }
}

/// A migration report: `status` at `pass`, with made-up but consistent figures: 512 MiB of
/// memory, then 64 MiB more per pass.
pub fn report(direction: MigrationDirection, status: MigrationStatus, pass: u32) -> MigrationInfo {
    let mib = |n: u64| n << 20;
    let done = status == MigrationStatus::Completed;
    let passes = u64::from(pass);
    MigrationInfo {
        direction,
        status,
        url: "unix:/tmp/migrate.sock".into(),
        pass,
        memory_bytes: mib(512),
        bytes_transferred: if pass == 0 {
            0
        } else {
            mib(512 + 64 * (passes - 1))
        },
        dirty_bytes: mib(16),
        dirty_rate_bytes_per_s: mib(8),
        bandwidth_bytes_per_s: mib(800),
        expected_downtime_ms: 20,
        downtime_ms: done.then_some(45),
        blackout: done.then_some(BlackoutStages {
            pause_save_ms: 10,
            last_memory_ms: 5,
            last_memory_bytes: mib(1),
            state_ms: 25,
            state_bytes: 600_000,
            handover_ms: 5,
        }),
        total_ms: 1_000 * passes,
        error: (status == MigrationStatus::Failed)
            .then(|| "Destination closed the connection".into()),
    }
}

/// The counters the fake VM reports: a PVRDMA function with one QP and a disk.
pub fn test_counters(migration: Option<MigrationInfo>) -> VmCounters {
    let named = |list: &[(&str, u64)]| list.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect();
    VmCounters {
        devices: vec![
            DeviceCountersInfo {
                kind: "virtio-blk".into(),
                id: "disk0".into(),
                mac: None,
                pci: "00:01.0".into(),
                counters: named(&[("read_requests", 12), ("read_bytes", 6144)]),
                qps: None,
            },
            DeviceCountersInfo {
                kind: "pvrdma".into(),
                id: "pvrdma0".into(),
                mac: Some("52:54:00:00:00:10".into()),
                pci: "00:02.1".into(),
                counters: named(&[("roce_tx", 40), ("roce_local_tx", 0)]),
                qps: Some(vec![QpCountersInfo {
                    qpn: 0x12,
                    error: false,
                    counters: named(&[("completer_retry", 1)]),
                }]),
            },
        ],
        migration,
    }
}

/// The server handle, shared so that the fake VMM can go away like an exiting VMM.
type SharedServer = Arc<Mutex<Option<ApiServerHandle>>>;

fn take(server: &SharedServer) -> Option<ApiServerHandle> {
    server.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// A VMM's answers, moving its state like the real lifecycle.
struct FakeVmm {
    state: VmState,
    /// Reports still to come, once a migration was accepted.
    script: VecDeque<MigrationInfo>,
    then_vanish: bool,
    migrating: bool,
    /// The last report given.
    migration: Option<MigrationInfo>,
    server: SharedServer,
}

impl FakeVmm {
    fn answer(&mut self, request: &ApiRequest) -> ApiResponse {
        match (request, self.state) {
            (ApiRequest::Ping, _) => Ok(ResponseBody::Ping(VmmPing::current(vec!["test".into()]))),
            (ApiRequest::VmInfo, _) => Ok(ResponseBody::VmInfo(VmInfo {
                state: self.state,
                config: Some(test_config()),
                uptime_ms: 42,
                migration: self.next_report(),
            })),
            (ApiRequest::Counters, _) => Ok(ResponseBody::Counters(test_counters(
                self.migration.clone(),
            ))),
            (ApiRequest::Pause, VmState::Running) => {
                self.state = VmState::Paused;
                Ok(ResponseBody::Empty)
            }
            (ApiRequest::Pause, VmState::Paused) => invalid_state("VM is already paused"),
            (ApiRequest::Pause, _) => invalid_state("VM is not running"),
            (ApiRequest::Resume, VmState::Paused) => {
                self.state = VmState::Running;
                Ok(ResponseBody::Empty)
            }
            (ApiRequest::Resume, _) => invalid_state("VM is not paused"),
            (ApiRequest::Shutdown, VmState::Shutdown) => invalid_state("VM is already shut down"),
            (ApiRequest::Shutdown, _) => {
                self.state = VmState::Shutdown;
                Ok(ResponseBody::Empty)
            }
            (ApiRequest::SendMigration(p), _) => self.start_migration(&p.destination_url),
            (ApiRequest::CancelMigration, _) if self.migrating => {
                self.migrating = false;
                Ok(ResponseBody::Empty)
            }
            (ApiRequest::CancelMigration, _) => invalid_state("no outgoing migration is running"),
            (ApiRequest::ReceiveMigration(p), _) => self.start_migration(&p.receiver_url),
            (ApiRequest::Snapshot(p), VmState::Paused) => {
                check_url(&p.destination_url, &["file:///"]).map(|()| ResponseBody::Empty)
            }
            (ApiRequest::Snapshot(_), _) => invalid_state("VM is not paused"),
        }
    }

    fn start_migration(&mut self, url: &str) -> ApiResponse {
        check_url(url, &["unix:", "tcp:"])?;
        self.migrating = true;
        Ok(ResponseBody::Empty)
    }

    fn next_report(&mut self) -> Option<MigrationInfo> {
        if self.migrating {
            if let Some(next) = self.script.pop_front() {
                self.migration = Some(next);
            }
        }
        self.migration.clone()
    }

    /// After answering: goes away once the last scripted report was given.
    fn after_answer(&mut self) {
        if self.then_vanish && self.migrating && self.script.is_empty() {
            drop(take(&self.server));
        }
    }
}

fn invalid_state(message: &str) -> ApiResponse {
    Err(ActionError::InvalidState(message.to_owned()))
}

/// What a VMM answers to a URL it cannot parse.
fn check_url(url: &str, schemes: &[&str]) -> Result<(), ActionError> {
    if schemes.iter().any(|scheme| url.starts_with(scheme)) {
        Ok(())
    } else {
        Err(ActionError::BadRequest(format!("Invalid URL '{url}'")))
    }
}

/// The fake VMM's event loop; returns every request it saw, in order.
fn run_vmm(
    evt: &EventFd,
    rx: &mpsc::Receiver<ApiMessage>,
    behaviour: Behaviour,
    mut vmm: FakeVmm,
) -> Vec<ApiRequest> {
    let mut seen = Vec::new();
    let mut kept = Vec::new();
    loop {
        evt.read().expect("read api eventfd");
        loop {
            match rx.try_recv() {
                Ok(message) => {
                    seen.push(message.request.clone());
                    match behaviour {
                        Behaviour::Normal => {
                            let response = vmm.answer(&message.request);
                            message.respond(response);
                            vmm.after_answer();
                        }
                        Behaviour::Silent => kept.push(message),
                        Behaviour::DropRequests => drop(message),
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return seen,
            }
        }
    }
}

/// A server and its fake VMM. Dropping it stops both.
pub struct Harness {
    pub path: PathBuf,
    pub client: ApiClient,
    server: SharedServer,
    evt: EventFd,
    vmm: Option<JoinHandle<Vec<ApiRequest>>>,
    _dir: TempDir,
}

impl Harness {
    pub fn start() -> Self {
        Self::start_with(Behaviour::Normal, ServerOptions::default())
    }

    pub fn start_with(behaviour: Behaviour, options: ServerOptions) -> Self {
        Self::launch(behaviour, options, MigrationScript::default())
    }

    /// A normal fake VMM whose migrations report `script`.
    pub fn start_migrating(script: MigrationScript) -> Self {
        Self::launch(Behaviour::Normal, ServerOptions::default(), script)
    }

    fn launch(behaviour: Behaviour, options: ServerOptions, script: MigrationScript) -> Self {
        let dir = TempDir::new_with_prefix("/tmp/pvrdma-api-").expect("temp dir");
        let path = dir.as_path().join("api.sock");
        let evt = EventFd::new(0).expect("eventfd");
        let (tx, rx) = mpsc::channel();
        let server = api::start_server_with(&path, tx, evt.try_clone().unwrap(), options)
            .expect("start server");
        let server = Arc::new(Mutex::new(Some(server)));
        let fake = FakeVmm {
            state: VmState::Running,
            script: script.reports.into(),
            then_vanish: script.then_vanish,
            migrating: false,
            migration: None,
            server: server.clone(),
        };
        let vmm_evt = evt.try_clone().unwrap();
        let vmm = thread::spawn(move || run_vmm(&vmm_evt, &rx, behaviour, fake));
        Self {
            client: ApiClient::new(&path),
            path,
            server,
            evt,
            vmm: Some(vmm),
            _dir: dir,
        }
    }

    /// Stops the server and the fake VMM; returns the requests the VMM received.
    pub fn stop(mut self) -> Vec<ApiRequest> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Vec<ApiRequest> {
        drop(take(&self.server));
        // The channel is now closed; wake the VMM so it notices.
        let _ = self.evt.write(1);
        self.vmm
            .take()
            .map(|t| t.join().expect("fake VMM"))
            .unwrap_or_default()
    }

    /// The server handle, to drop it early.
    pub fn take_server(&mut self) -> ApiServerHandle {
        take(&self.server).expect("server already taken")
    }

    /// `vmm.ping` through the client succeeds.
    pub fn assert_alive(&self) {
        let body = self
            .client
            .call(&ApiRequest::Ping)
            .expect("ping")
            .expect("ping body");
        assert_eq!(body["pid"], std::process::id());
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Sends raw bytes on a new connection, then half-closes it if `close_write`, and returns
/// everything the server sends back until it closes.
pub fn raw_exchange(path: &Path, bytes: &[u8], close_write: bool) -> String {
    let mut stream = UnixStream::connect(path).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // The server may answer and close before taking everything: not an error here.
    let _ = stream.write_all(bytes);
    if close_write {
        let _ = stream.shutdown(Shutdown::Write);
    }
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Status code of a raw response text, 0 if there is none.
pub fn status_of(response: &str) -> u16 {
    response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

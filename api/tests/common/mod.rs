// SPDX-License-Identifier: Apache-2.0

//! A real API server on a temporary socket, with a fake VMM thread that does what the real
//! one must: wait on the eventfd, drain the channel, answer each message.

#![allow(dead_code, reason = "each test binary uses a subset of the helpers")]

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, TryRecvError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use api::client::ApiClient;
use api::{
    ActionError, ApiMessage, ApiRequest, ApiResponse, ApiServerHandle, DiskSummary, ResponseBody,
    ServerOptions, VmConfigSummary, VmInfo, VmState, VmmPing,
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

/// What a VMM answers in `state`; it moves `state` like the real lifecycle.
fn answer(request: &ApiRequest, state: &mut VmState) -> ApiResponse {
    let invalid = |m: &str| Err(ActionError::InvalidState(m.to_owned()));
    match (request, *state) {
        (ApiRequest::Ping, _) => Ok(ResponseBody::Ping(VmmPing::current(vec!["test".into()]))),
        (ApiRequest::VmInfo, _) => Ok(ResponseBody::VmInfo(VmInfo {
            state: *state,
            config: test_config(),
            uptime_ms: 42,
        })),
        (ApiRequest::Pause, VmState::Running) => {
            *state = VmState::Paused;
            Ok(ResponseBody::Empty)
        }
        (ApiRequest::Pause, VmState::Paused) => invalid("VM is already paused"),
        (ApiRequest::Pause, _) => invalid("VM is not running"),
        (ApiRequest::Resume, VmState::Paused) => {
            *state = VmState::Running;
            Ok(ResponseBody::Empty)
        }
        (ApiRequest::Resume, _) => invalid("VM is not paused"),
        (ApiRequest::Shutdown, VmState::Shutdown) => invalid("VM is already shut down"),
        (ApiRequest::Shutdown, _) => {
            *state = VmState::Shutdown;
            Ok(ResponseBody::Empty)
        }
    }
}

/// The fake VMM's event loop; returns every request it saw, in order.
fn fake_vmm(
    evt: &EventFd,
    rx: &mpsc::Receiver<ApiMessage>,
    behaviour: Behaviour,
) -> Vec<ApiRequest> {
    let mut state = VmState::Running;
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
                            let response = answer(&message.request, &mut state);
                            message.respond(response);
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
    server: Option<ApiServerHandle>,
    evt: EventFd,
    vmm: Option<JoinHandle<Vec<ApiRequest>>>,
    _dir: TempDir,
}

impl Harness {
    pub fn start() -> Self {
        Self::start_with(Behaviour::Normal, ServerOptions::default())
    }

    pub fn start_with(behaviour: Behaviour, options: ServerOptions) -> Self {
        let dir = TempDir::new_with_prefix("/tmp/pvrdma-api-").expect("temp dir");
        let path = dir.as_path().join("api.sock");
        let evt = EventFd::new(0).expect("eventfd");
        let (tx, rx) = mpsc::channel();
        let server = api::start_server_with(&path, tx, evt.try_clone().unwrap(), options)
            .expect("start server");
        let vmm_evt = evt.try_clone().unwrap();
        let vmm = thread::spawn(move || fake_vmm(&vmm_evt, &rx, behaviour));
        Self {
            client: ApiClient::new(&path),
            path,
            server: Some(server),
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
        drop(self.server.take());
        // The channel is now closed; wake the VMM so it notices.
        let _ = self.evt.write(1);
        self.vmm
            .take()
            .map(|t| t.join().expect("fake VMM"))
            .unwrap_or_default()
    }

    /// The server handle, to drop it early.
    pub fn take_server(&mut self) -> ApiServerHandle {
        self.server.take().expect("server already taken")
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

// SPDX-License-Identifier: Apache-2.0
//! The HTTP API's end in the control loop: the server's requests arrive
//! on a channel (its eventfd wakes the loop) and are dispatched here to
//! the VM's actions, or, in a VMM that waits for an incoming migration,
//! to the receiver.

use std::sync::mpsc::{self, Receiver};

use api::{
    ActionError, ApiMessage, ApiRequest, ApiResponse, ApiServerHandle, ReceiveMigrationParams,
    ResponseBody, VmState,
};
use vmm_sys_util::eventfd::EventFd;

use crate::config::VmConfig;
use crate::lock;
use crate::machine::{eventfd, VmmError};
use crate::migration::Progress;
use crate::sandbox;

/// The HTTP API's end in the control loop.
pub(crate) struct Api {
    pub(crate) evt: EventFd,
    requests: Receiver<ApiMessage>,
    // Dropping the handle stops the server thread and removes the socket.
    _server: ApiServerHandle,
}

/// Serves the API on `path` from a thread of its own.
pub(crate) fn start_api(path: &std::path::Path) -> Result<Api, VmmError> {
    let evt = eventfd()?;
    let (sender, requests) = mpsc::channel();
    let options = api::ServerOptions {
        thread_start: || sandbox::enter(sandbox::Kind::Api),
        ..Default::default()
    };
    let server = api::start_server_with(
        path,
        sender,
        evt.try_clone().map_err(VmmError::EventLoop)?,
        options,
    )
    .map_err(VmmError::Api)?;
    log::info!("API listening on {}", path.display());
    Ok(Api {
        evt,
        requests,
        _server: server,
    })
}

impl Api {
    /// The requests queued so far. The eventfd is read first, then the
    /// channel drained: a request queued after the drain fires it again.
    fn take(&self) -> Vec<ApiMessage> {
        let _ = self.evt.read();
        self.requests.try_iter().collect()
    }
}

/// What a VMM with a VM does for each request.
pub(crate) trait Actions {
    /// `vm.info`.
    fn info(&mut self) -> api::VmInfo;
    fn counters(&self) -> api::VmCounters;
    /// The VM has moved to another VMM: only info and counters are served.
    fn handed_over(&self) -> bool;
    fn pause(&mut self) -> ApiResponse;
    fn resume(&mut self) -> ApiResponse;
    fn send_migration(&mut self, params: &api::SendMigrationParams) -> ApiResponse;
    fn cancel_migration(&mut self) -> ApiResponse;
    fn snapshot(&mut self, params: &api::SnapshotParams) -> ApiResponse;
}

/// Answers every queued API request. Returns true after `vm.shutdown`.
pub(crate) fn dispatch(api: &Api, vm: &mut impl Actions) -> bool {
    let mut shutdown = false;
    for message in api.take() {
        let response = match &message.request {
            ApiRequest::Ping => Ok(ResponseBody::Ping(api::VmmPing::current(features()))),
            ApiRequest::VmInfo => Ok(ResponseBody::VmInfo(vm.info())),
            // Still served after a hand-over: the final counts of this VMM.
            ApiRequest::Counters => Ok(ResponseBody::Counters(vm.counters())),
            _ if vm.handed_over() => Err(ActionError::InvalidState(
                "the VM has migrated to another VMM; this one is exiting".into(),
            )),
            ApiRequest::Pause => vm.pause(),
            ApiRequest::Resume => vm.resume(),
            ApiRequest::SendMigration(p) => vm.send_migration(p),
            ApiRequest::CancelMigration => vm.cancel_migration(),
            ApiRequest::Snapshot(p) => vm.snapshot(p),
            ApiRequest::ReceiveMigration(_) => Err(ActionError::InvalidState(
                "this VMM already runs a VM; start a new one with only --api-socket to receive"
                    .into(),
            )),
            ApiRequest::Shutdown => {
                shutdown = true;
                Ok(ResponseBody::Empty)
            }
        };
        message.respond(response);
    }
    shutdown
}

/// Answers the queued requests of a VMM that has no VM yet: `receive`
/// starts a receiver (`receiving`: one runs already). Returns true after
/// `vm.shutdown`.
pub(crate) fn dispatch_waiting(
    api: &Api,
    progress: &Progress,
    receiving: &mut bool,
    mut receive: impl FnMut(&ReceiveMigrationParams) -> ApiResponse,
) -> bool {
    for message in api.take() {
        let response = match &message.request {
            ApiRequest::Ping => Ok(ResponseBody::Ping(api::VmmPing::current(features()))),
            ApiRequest::VmInfo => Ok(ResponseBody::VmInfo(api::VmInfo {
                state: VmState::Created,
                config: None,
                uptime_ms: 0,
                migration: lock(progress).clone(),
            })),
            ApiRequest::ReceiveMigration(_) if *receiving => Err(ActionError::InvalidState(
                "already receiving a migration".into(),
            )),
            ApiRequest::ReceiveMigration(p) => receive(p).inspect(|_| *receiving = true),
            ApiRequest::Shutdown => {
                message.respond(Ok(ResponseBody::Empty));
                return true;
            }
            _ => Err(ActionError::InvalidState(
                "no VM here yet: this VMM waits for vm.receive-migration".into(),
            )),
        };
        message.respond(response);
    }
    false
}

/// What `vmm.ping` lists.
fn features() -> Vec<String> {
    vec!["pvrdma".into(), "migration".into(), "snapshot".into()]
}

/// A VM's configuration as `vm.info` shows it.
pub(crate) fn summary(c: &VmConfig) -> api::VmConfigSummary {
    api::VmConfigSummary {
        cpus: u32::from(c.cpus),
        memory_mib: c.memory >> 20,
        kernel: c.kernel.to_string_lossy().into_owned(),
        cmdline: c.cmdline.clone(),
        disks: c
            .disks
            .iter()
            .map(|d| api::DiskSummary {
                path: d.path.to_string_lossy().into_owned(),
                readonly: d.readonly,
            })
            .collect(),
    }
}

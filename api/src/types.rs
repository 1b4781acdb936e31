// SPDX-License-Identifier: Apache-2.0

//! What the API server and the VMM exchange: requests, replies and the JSON bodies.
//!
//! These types are the whole contract between the HTTP side and the VMM side: the VMM never
//! sees HTTP, and the server never sees VMM internals. Response bodies derive `Deserialize`
//! too, so clients and tests can read them back into the same types; they accept unknown
//! fields, so that adding one later does not break older clients.

use std::sync::mpsc::Sender;

use serde::{Deserialize, Serialize};

/// An action the VMM is asked to perform, already parsed and validated by the server.
///
/// Adding an endpoint: a variant here; in `request.rs` its `Route` (method, path, body parser)
/// listed in [`ROUTES`](crate::ROUTES) and its arm in [`ApiRequest::route`]; a command in
/// `pvrdma-remote`; and a path in `openapi.yaml` (a test compares it with `ROUTES`). The
/// compiler then points at the VMM's dispatch `match`. Parameters go in a
/// `#[serde(deny_unknown_fields)]` struct carried by the variant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiRequest {
    /// `GET /api/v1/vmm.ping`: is the VMM's event loop alive, and what is it.
    Ping,
    /// `GET /api/v1/vm.info`: state and configuration of the VM.
    VmInfo,
    /// `PUT /api/v1/vm.pause`: stop the vCPUs; devices stop taking new work.
    Pause,
    /// `PUT /api/v1/vm.resume`: undo [`ApiRequest::Pause`].
    Resume,
    /// `PUT /api/v1/vm.shutdown`: stop the VM for good; the VMM process may exit afterwards.
    Shutdown,
}

/// One request handed to the VMM, with the channel its answer goes back on.
#[derive(Debug)]
pub struct ApiMessage {
    /// What the client asked for.
    pub request: ApiRequest,
    /// Where the VMM sends exactly one [`ApiResponse`].
    pub reply: Sender<ApiResponse>,
}

impl ApiMessage {
    /// Sends the VMM's answer to the waiting HTTP thread.
    ///
    /// Never fails: if the server gave up waiting (timeout, shutdown) the answer has nobody to
    /// go to, and the action has already happened either way.
    pub fn respond(self, response: ApiResponse) {
        if self.reply.send(response).is_err() {
            log::debug!("API client gone before the VMM answered {:?}", self.request);
        }
    }
}

/// The VMM's answer to one [`ApiMessage`].
pub type ApiResponse = Result<ResponseBody, ActionError>;

/// A successful answer. The variant must match the request: `Ping` for
/// [`ApiRequest::Ping`], `VmInfo` for [`ApiRequest::VmInfo`], `Empty` for the actions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseBody {
    /// The action was done; HTTP 204 with no body.
    Empty,
    /// Body of `vmm.ping`.
    Ping(VmmPing),
    /// Body of `vm.info`.
    VmInfo(VmInfo),
}

/// Why the VMM refused or failed an action. The server maps each variant to an HTTP status,
/// so the VMM never picks status codes itself.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    /// The action makes no sense in the VM's current state, e.g. pausing a paused VM (HTTP 409).
    /// The message says which state the VM is in.
    #[error("{0}")]
    InvalidState(String),
    /// The VMM tried and failed (HTTP 500). The VM's state is whatever the message says.
    #[error("{0}")]
    Failed(String),
}

/// Body of `GET /api/v1/vmm.ping`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmmPing {
    /// Version of the VMM build.
    pub version: String,
    /// Process id of the VMM, so tools can find it without a pid file.
    pub pid: u32,
    /// Optional capabilities compiled in or enabled, e.g. `"pvrdma"`, `"migration"`.
    pub features: Vec<String>,
}

impl VmmPing {
    /// The answer for this process: the workspace version and our pid.
    pub fn current(features: Vec<String>) -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            features,
        }
    }
}

/// Lifecycle state of the VM, as cloud-hypervisor spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VmState {
    /// Configured, vCPUs not started yet.
    Created,
    /// vCPUs running.
    Running,
    /// vCPUs stopped by `vm.pause`; memory and devices intact.
    Paused,
    /// Stopped by `vm.shutdown` or by the guest; cannot be resumed.
    Shutdown,
}

/// Body of `GET /api/v1/vm.info`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmInfo {
    /// Current lifecycle state.
    pub state: VmState,
    /// What the VM was started with.
    pub config: VmConfigSummary,
    /// Milliseconds since the vCPUs first started (0 while `Created`), paused time included.
    pub uptime_ms: u64,
}

/// The parts of the VM configuration an operator wants to see; not a full config dump.
///
/// Paths are strings because JSON has no other kind; the VMM converts with
/// `Path::to_string_lossy`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmConfigSummary {
    /// Number of vCPUs.
    pub cpus: u32,
    /// Guest RAM in MiB.
    pub memory_mib: u64,
    /// Kernel image booted directly.
    pub kernel: String,
    /// Kernel command line.
    pub cmdline: String,
    /// Block devices, in the order the guest sees them.
    pub disks: Vec<DiskSummary>,
}

/// One block device of [`VmConfigSummary`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskSummary {
    /// Backing file on the host.
    pub path: String,
    /// Whether the guest may write to it.
    pub readonly: bool,
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn vm_info_json_shape() {
        let info = VmInfo {
            state: VmState::Paused,
            config: VmConfigSummary {
                cpus: 2,
                memory_mib: 512,
                kernel: "/boot/vmlinux".into(),
                cmdline: "console=ttyS0".into(),
                disks: vec![DiskSummary {
                    path: "/img/root.raw".into(),
                    readonly: false,
                }],
            },
            uptime_ms: 1234,
        };
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(json["state"], "Paused");
        assert_eq!(json["config"]["memory_mib"], 512);
        assert_eq!(json["config"]["disks"][0]["readonly"], false);
        assert_eq!(serde_json::from_value::<VmInfo>(json).unwrap(), info);
    }

    #[test]
    fn ping_current_is_this_process() {
        let ping = VmmPing::current(vec!["pvrdma".into()]);
        assert_eq!(ping.pid, std::process::id());
        assert_eq!(ping.version, env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn respond_to_a_gone_client_is_harmless() {
        let (reply, rx) = mpsc::channel();
        drop(rx);
        let msg = ApiMessage {
            request: ApiRequest::Pause,
            reply,
        };
        msg.respond(Ok(ResponseBody::Empty));
    }
}

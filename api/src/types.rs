// SPDX-License-Identifier: Apache-2.0

//! What the API server and the VMM exchange: requests, replies and the JSON bodies.
//!
//! These types are the whole contract between the HTTP side and the VMM side: the VMM never
//! sees HTTP, and the server never sees VMM internals. Response bodies derive `Deserialize`
//! too, so clients and tests can read them back into the same types; they accept unknown
//! fields, so that adding one later does not break older clients.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc::Sender;

use serde::{Deserialize, Serialize};

/// An action the VMM is asked to perform, already parsed and validated by the server.
///
/// Adding an endpoint: a variant here; in `request.rs` its `Route` (method, path, body parser)
/// listed in [`ROUTES`](crate::ROUTES), its arm in [`ApiRequest::route`] and, for parameters,
/// in [`ApiRequest::body`] (a test samples every route to check that they agree); a command in
/// `pvrdma-remote`; and a path in `openapi.yaml` (a test compares it with `ROUTES`). The
/// compiler then points at the VMM's dispatch `match`. Parameters go in a
/// `#[serde(deny_unknown_fields)]` struct carried by the variant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiRequest {
    /// `GET /api/v1/vmm.ping`: is the VMM's event loop alive, and what is it.
    Ping,
    /// `GET /api/v1/vm.info`: state and configuration of the VM.
    VmInfo,
    /// `GET /api/v1/vm.counters`: every device's counters and the last migration's figures.
    Counters,
    /// `PUT /api/v1/vm.pause`: stop the vCPUs; devices stop taking new work.
    Pause,
    /// `PUT /api/v1/vm.resume`: undo [`ApiRequest::Pause`].
    Resume,
    /// `PUT /api/v1/vm.shutdown`: stop the VM for good; the VMM process may exit afterwards.
    Shutdown,
    /// `PUT /api/v1/vm.send-migration`: start a live migration of the VM to another VMM.
    /// Answered once the migration thread runs; progress is read through `vm.info`.
    SendMigration(SendMigrationParams),
    /// `PUT /api/v1/vm.cancel-migration`: stop an outgoing migration before its switch-over;
    /// the VM keeps running on this VMM and the migration ends `Failed`.
    CancelMigration,
    /// `PUT /api/v1/vm.receive-migration` (on a VMM started with `--api-socket` and no
    /// kernel): listen for a source and take its VM over. Answered once listening.
    ReceiveMigration(ReceiveMigrationParams),
    /// `PUT /api/v1/vm.snapshot`: write the VM's state and memory out (VM must be paused).
    Snapshot(SnapshotParams),
}

/// Default of [`SendMigrationParams::downtime_ms`].
pub const DEFAULT_DOWNTIME_MS: u64 = 300;
/// Default of [`SendMigrationParams::timeout_s`].
pub const DEFAULT_MIGRATION_TIMEOUT_S: u64 = 3600;

/// Parameters of [`ApiRequest::SendMigration`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendMigrationParams {
    /// Where the receiving VMM listens: `"unix:/path"` or `"tcp:host:port"`.
    pub destination_url: String,
    /// Pre-copy ends when the expected blackout fits this many milliseconds.
    #[serde(default = "default_downtime_ms")]
    pub downtime_ms: u64,
    /// The whole migration is abandoned after this many seconds; the source keeps running.
    #[serde(default = "default_migration_timeout_s")]
    pub timeout_s: u64,
    /// TLS for a `tcp:` destination: the destination must show a certificate of the CA
    /// naming the URL's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsParams>,
    /// Send over plain TCP to an address that is not loopback (guest memory in the clear,
    /// the destination unauthenticated); refused otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_plaintext: bool,
}

/// PEM files of one end of a TLS migration (TLS 1.3, both ends authenticated).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsParams {
    /// This end's certificate (chain).
    pub cert: PathBuf,
    /// This end's private key.
    pub key: PathBuf,
    /// The CA that must have signed the other end's certificate.
    pub ca: PathBuf,
}

impl SendMigrationParams {
    /// A migration to `destination_url` with the default downtime and timeout.
    pub fn new(destination_url: impl Into<String>) -> Self {
        Self {
            destination_url: destination_url.into(),
            downtime_ms: DEFAULT_DOWNTIME_MS,
            timeout_s: DEFAULT_MIGRATION_TIMEOUT_S,
            tls: None,
            allow_plaintext: false,
        }
    }
}

fn default_downtime_ms() -> u64 {
    DEFAULT_DOWNTIME_MS
}

fn default_migration_timeout_s() -> u64 {
    DEFAULT_MIGRATION_TIMEOUT_S
}

/// Parameters of [`ApiRequest::ReceiveMigration`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiveMigrationParams {
    /// Where to listen for the source: `"unix:/path"` or `"tcp:host:port"`.
    pub receiver_url: String,
    /// TAP to use on this host for the NIC with this MAC (`"52:54:00:00:00:02"` ->
    /// `"tap-b1"`). Every NIC of the incoming VM must be listed: the source does not choose
    /// which network of this host the VM joins.
    #[serde(default)]
    pub taps: BTreeMap<String, String>,
    /// Disk path to open on this host instead of the source's (`"/src/a.img"` ->
    /// `"/dst/a.img"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub disks: BTreeMap<PathBuf, PathBuf>,
    /// Directories whose files the source may name as disks as they are. A disk neither
    /// mapped nor in one of these refuses the VM.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disk_dirs: Vec<PathBuf>,
    /// Largest guest memory accepted, in MiB (default: this host's RAM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory_mib: Option<u64>,
    /// TLS: only a source with a certificate of the CA is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsParams>,
    /// Listen on plain TCP on an address that is not loopback (anyone who reaches it may
    /// send a VM); refused otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_plaintext: bool,
}

impl ReceiveMigrationParams {
    /// Listening on `receiver_url`, nothing mapped or allowed, no TLS.
    pub fn new(receiver_url: impl Into<String>) -> Self {
        Self {
            receiver_url: receiver_url.into(),
            taps: BTreeMap::new(),
            disks: BTreeMap::new(),
            disk_dirs: Vec::new(),
            max_memory_mib: None,
            tls: None,
            allow_plaintext: false,
        }
    }
}

/// Parameters of [`ApiRequest::Snapshot`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotParams {
    /// Directory to write to: `"file:///absolute/dir"`.
    pub destination_url: String,
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
/// [`ApiRequest::Ping`], `VmInfo` for [`ApiRequest::VmInfo`], `Empty` for the actions
/// (migrations included: they answer once started).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseBody {
    /// The action was done; HTTP 204 with no body.
    Empty,
    /// Body of `vmm.ping`.
    Ping(VmmPing),
    /// Body of `vm.info`.
    VmInfo(VmInfo),
    /// Body of `vm.counters`.
    Counters(VmCounters),
}

/// Why the VMM refused or failed an action. The server maps each variant to an HTTP status,
/// so the VMM never picks status codes itself.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    /// The action makes no sense in the VM's current state, e.g. pausing a paused VM (HTTP 409).
    /// The message says which state the VM is in.
    #[error("{0}")]
    InvalidState(String),
    /// A parameter the server could parse but the VMM cannot use, e.g. an unparsable
    /// migration URL (HTTP 400). The message names the parameter.
    #[error("{0}")]
    BadRequest(String),
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
    /// What the VM was started with; `None` while a receiving VMM has no VM yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<VmConfigSummary>,
    /// Milliseconds since the vCPUs first started (0 while `Created`), paused time included.
    pub uptime_ms: u64,
    /// The last or current migration, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationInfo>,
}

/// Which end of a migration a VMM is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigrationDirection {
    /// The source: started by `vm.send-migration`.
    Send,
    /// The destination: started by `vm.receive-migration`.
    Receive,
}

/// Where a migration stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigrationStatus {
    /// Receiver waiting for a source to connect.
    Listening,
    /// Memory and state are being transferred.
    Active,
    /// The destination runs the VM; a source VMM exits shortly after reporting this.
    Completed,
    /// Abandoned; [`MigrationInfo::error`] says why. A source keeps running the VM.
    Failed,
}

/// Progress of a migration, in `vm.info`. Rates and estimates are the VMM's latest
/// measurements, so they may be 0 until the first pass has been timed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationInfo {
    /// Which end this VMM is.
    pub direction: MigrationDirection,
    /// Where the migration stands.
    pub status: MigrationStatus,
    /// The URL given to `vm.send-migration` or `vm.receive-migration`.
    pub url: String,
    /// Pre-copy pass (1 = the full copy), 0 before the first.
    pub pass: u32,
    /// Guest memory to migrate.
    pub memory_bytes: u64,
    /// Bytes sent (source) or received (destination) so far, over all passes.
    pub bytes_transferred: u64,
    /// Dirty bytes found after the last pass (what the next pass sends).
    pub dirty_bytes: u64,
    /// How fast the guest dirties memory.
    pub dirty_rate_bytes_per_s: u64,
    /// Measured transfer rate.
    pub bandwidth_bytes_per_s: u64,
    /// Blackout expected if pre-copy stopped now: dirty bytes over bandwidth.
    pub expected_downtime_ms: u64,
    /// Measured blackout (VM paused on the source until the destination took over), once
    /// known.
    pub downtime_ms: Option<u64>,
    /// Where that blackout went, stage by stage; measured by the source once it completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blackout: Option<BlackoutStages>,
    /// Milliseconds since the migration started.
    pub total_ms: u64,
    /// Why it failed.
    pub error: Option<String>,
}

/// The stages of a migration's blackout, in order; their sum is about
/// [`MigrationInfo::downtime_ms`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlackoutStages {
    /// Pausing the vCPUs and devices and saving their state.
    pub pause_save_ms: u64,
    /// Sending the memory dirtied since the last pre-copy pass.
    pub last_memory_ms: u64,
    /// Bytes of that memory.
    pub last_memory_bytes: u64,
    /// Sending the saved state and the destination restoring it.
    pub state_ms: u64,
    /// Bytes of that state.
    pub state_bytes: u64,
    /// The destination taking the VM over (`Complete` answered).
    pub handover_ms: u64,
}

/// Body of `GET /api/v1/vm.counters`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmCounters {
    /// Every device that counts, in PCI order: each PVRDMA function, each vmxnet3 NIC, each
    /// virtio-blk disk.
    pub devices: Vec<DeviceCountersInfo>,
    /// The last or current migration, as in `vm.info`; `null` before any.
    pub migration: Option<MigrationInfo>,
}

/// The counters of one device, in [`VmCounters`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCountersInfo {
    /// `"pvrdma"`, `"vmxnet3"` or `"virtio-blk"`.
    pub kind: String,
    /// Which device of the VM: the option that made it and its index among them, `disk0`,
    /// `net0`, `pvrdma1` (both functions of a PVRDMA slot; the guest's `vmw_pvrdma1`).
    pub id: String,
    /// The port's MAC, for a vmxnet3 NIC or PVRDMA device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// PCI address as the guest's `lspci` shows it, e.g. `"00:03.1"`.
    pub pci: String,
    /// Every counter by name, zeros included; monotonic while the VMM runs (a destination's
    /// start at zero).
    pub counters: BTreeMap<String, u64>,
    /// Devices with queue pairs (PVRDMA): each connected QP's transport counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qps: Option<Vec<QpCountersInfo>>,
}

/// The transport counters of one queue pair, in [`DeviceCountersInfo`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpCountersInfo {
    /// The QP number the guest and its peers see.
    pub qpn: u32,
    /// The QP is in the error state.
    pub error: bool,
    /// Every counter by name (rxe's names: retransmissions, NAKs, drops).
    pub counters: BTreeMap<String, u64>,
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
        let mut info = VmInfo {
            state: VmState::Paused,
            config: Some(VmConfigSummary {
                cpus: 2,
                memory_mib: 512,
                kernel: "/boot/vmlinux".into(),
                cmdline: "console=ttyS0".into(),
                disks: vec![DiskSummary {
                    path: "/img/root.raw".into(),
                    readonly: false,
                }],
            }),
            uptime_ms: 1234,
            migration: None,
        };
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(json["state"], "Paused");
        assert_eq!(json["config"]["memory_mib"], 512);
        assert_eq!(json["config"]["disks"][0]["readonly"], false);
        assert!(json.get("migration").is_none(), "{json}");
        assert_eq!(serde_json::from_value::<VmInfo>(json).unwrap(), info);

        info.migration = Some(MigrationInfo {
            direction: MigrationDirection::Send,
            status: MigrationStatus::Failed,
            url: "tcp:10.0.0.2:6000".into(),
            pass: 3,
            memory_bytes: 512 << 20,
            bytes_transferred: 600 << 20,
            dirty_bytes: 4 << 20,
            dirty_rate_bytes_per_s: 1 << 20,
            bandwidth_bytes_per_s: 800 << 20,
            expected_downtime_ms: 5,
            downtime_ms: None,
            blackout: None,
            total_ms: 2500,
            error: Some("Destination closed the connection".into()),
        });
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(json["migration"]["direction"], "Send");
        assert_eq!(json["migration"]["status"], "Failed");
        assert_eq!(json["migration"]["downtime_ms"], serde_json::Value::Null);
        assert_eq!(serde_json::from_value::<VmInfo>(json).unwrap(), info);
    }

    #[test]
    fn counters_json_shape() {
        let counters = VmCounters {
            devices: vec![
                DeviceCountersInfo {
                    kind: "pvrdma".into(),
                    id: "pvrdma0".into(),
                    mac: Some("52:54:00:00:00:10".into()),
                    pci: "00:03.1".into(),
                    counters: [("roce_tx".to_owned(), 7)].into(),
                    qps: Some(vec![QpCountersInfo {
                        qpn: 0x11,
                        error: false,
                        counters: [("completer_retry".to_owned(), 2)].into(),
                    }]),
                },
                DeviceCountersInfo {
                    kind: "virtio-blk".into(),
                    id: "disk0".into(),
                    mac: None,
                    pci: "00:02.0".into(),
                    counters: [("read_requests".to_owned(), 3)].into(),
                    qps: None,
                },
            ],
            migration: None,
        };
        let json = serde_json::to_value(&counters).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "devices": [
                    {"kind": "pvrdma", "id": "pvrdma0", "mac": "52:54:00:00:00:10",
                     "pci": "00:03.1", "counters": {"roce_tx": 7},
                     "qps": [{"qpn": 17, "error": false, "counters": {"completer_retry": 2}}]},
                    {"kind": "virtio-blk", "id": "disk0", "pci": "00:02.0",
                     "counters": {"read_requests": 3}}
                ],
                "migration": null
            })
        );
        assert_eq!(
            serde_json::from_value::<VmCounters>(json).unwrap(),
            counters
        );
    }

    #[test]
    fn receiver_without_a_vm_has_no_config() {
        let info = VmInfo {
            state: VmState::Created,
            config: None,
            uptime_ms: 0,
            migration: None,
        };
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"state": "Created", "uptime_ms": 0})
        );
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

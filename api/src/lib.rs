// SPDX-License-Identifier: Apache-2.0

//! HTTP API of pvrdma-vmm: JSON over HTTP/1.1 on a Unix socket, cloud-hypervisor style
//! (`GET /api/v1/vmm.ping`, `PUT /api/v1/vm.pause`, ...). `openapi.yaml` next to this crate's
//! `Cargo.toml` documents every endpoint.
//!
//! The crate has three parts:
//! - the server ([`start_server`]): one thread that parses requests into [`ApiRequest`]s and
//!   hands them to the VMM;
//! - the contract with the VMM ([`ApiMessage`], [`ApiResponse`] and the body types): the VMM
//!   never sees HTTP;
//! - the client ([`client::ApiClient`]) used by the `pvrdma-remote` binary and the tests.
//!
//! # What the VMM does
//!
//! Create an eventfd and a channel, start the server, and in the event loop, whenever the
//! eventfd is readable, read it and then drain the channel, answering each message once:
//!
//! ```no_run
//! use std::path::Path;
//! use std::sync::mpsc;
//!
//! use api::{ActionError, ApiMessage, ApiRequest, ResponseBody, VmmPing};
//! use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let api_evt = EventFd::new(EFD_NONBLOCK)?;
//! let (api_sender, api_receiver) = mpsc::channel::<ApiMessage>();
//! let server = api::start_server(Path::new("/run/vm0.sock"), api_sender, api_evt.try_clone()?)?;
//! # let mut paused = false;
//!
//! // ... register `api_evt` in the event loop; when it fires:
//! // Read first, then drain: a request queued after the drain fires the eventfd again.
//! let _ = api_evt.read();
//! for message in api_receiver.try_iter() {
//!     let response = match message.request {
//!         ApiRequest::Ping => Ok(ResponseBody::Ping(VmmPing::current(vec!["pvrdma".into()]))),
//!         ApiRequest::Pause if paused => Err(ActionError::InvalidState("VM is already paused".into())),
//!         ApiRequest::Pause => { paused = true; Ok(ResponseBody::Empty) }
//!         // ... VmInfo, Counters, Resume, Shutdown
//! #       _ => Ok(ResponseBody::Empty),
//!     };
//!     message.respond(response);
//! }
//!
//! // On exit, after answering vm.shutdown: dropping the handle lets the pending response
//! // go out, stops the thread and removes the socket.
//! drop(server);
//! # Ok(())
//! # }
//! ```
//!
//! Threading: the server thread sends one request at a time and waits for its answer (30 s,
//! then 504), so the VMM may take its time but must answer every message, or drop it (503).
//! `ApiServerHandle` may be dropped from any thread, the event loop included: the server
//! thread notices within 100 ms, even while it is waiting for that same loop.
//!
//! # HTTP behaviour
//!
//! Unknown path: 404. Known path, wrong method: 405 with `Allow`. Bad JSON, unknown fields,
//! malformed HTTP: 400. Body over [`MAX_BODY_BYTES`]: 413, decided from `Content-Length`
//! before reading the body. The VMM rejecting a parameter (e.g. an unparsable migration URL):
//! 400. The VMM refusing in this state: 409. The VMM failing: 500. No VMM:
//! 503. No answer in time: 504. Errors carry `{"error": "message"}`. One request per
//! connection (`Connection: close`); `Transfer-Encoding` is refused (501).
//!
//! The HTTP layer is hand-rolled on std's `UnixListener` rather than tiny_http 0.12: that
//! crate buffers header lines without a limit, reads bodies on the consumer thread without a
//! timeout, and, when a body is left unread, allocates a buffer of the client-declared
//! `Content-Length`: a one-line request could abort the VMM.
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod client;
mod http;
mod request;
mod server;
mod types;

pub use http::MAX_BODY_BYTES;
pub use request::{Method, Route, ROUTES};
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use server::fuzz_request;
pub use server::{start_server, start_server_with, ApiError, ApiServerHandle, ServerOptions};
pub use types::{
    ActionError, ApiMessage, ApiRequest, ApiResponse, BlackoutStages, DeviceCountersInfo,
    DiskSummary, MigrationDirection, MigrationInfo, MigrationStatus, QpCountersInfo,
    ReceiveMigrationParams, ResponseBody, SendMigrationParams, SnapshotParams, TlsParams,
    VmConfigSummary, VmCounters, VmInfo, VmState, VmmPing, DEFAULT_DOWNTIME_MS,
    DEFAULT_MIGRATION_TIMEOUT_S,
};

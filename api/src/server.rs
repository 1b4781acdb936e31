// SPDX-License-Identifier: Apache-2.0

//! The API server thread: accepts connections on the Unix socket, turns each request into an
//! [`ApiMessage`] for the VMM, and writes the VMM's answer back as HTTP.
//!
//! One thread serves one connection at a time; that is plenty for an operator's socket and
//! means requests reach the VMM strictly in order. Every wait is bounded: reading a request
//! by [`ServerOptions::request_timeout`], the VMM's answer by [`ServerOptions::reply_timeout`].

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use log::{debug, error, warn};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::http::{self, Head, WireError, MAX_BODY_BYTES};
use crate::request::{parse_request, Method, RouteError};
use crate::types::{ActionError, ApiMessage, ApiResponse, ResponseBody};

/// Longest a blocking call waits before looking at the stop flag, so that dropping the
/// [`ApiServerHandle`] returns promptly even while a client or the VMM is slow.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Pause after a failed `accept` (e.g. out of file descriptors) so the loop does not spin on
/// a listener that stays readable.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Limit on writing a response: they are small, so only a client that stops reading hits it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Timeouts of the server, and its thread's set-up. [`Default`] is what the VMM should use.
#[derive(Clone, Copy, Debug)]
pub struct ServerOptions {
    /// Runs first on the server thread: the VMM installs its sandbox (seccomp filter) there.
    pub thread_start: fn(),
    /// How long the VMM has to answer before the client gets 504. The request stays queued,
    /// so the action may still happen: a 504 means "outcome unknown".
    pub reply_timeout: Duration,
    /// How long a client has to send its whole request; a slow client must not hold the
    /// single server thread.
    pub request_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            thread_start: || {},
            reply_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// Failure to start the API server.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Another process (or another server in this one) is listening on the path.
    #[error("API socket {} is already in use", .0.display())]
    InUse(PathBuf),
    /// The path is taken by something that is not a socket; we never delete that.
    #[error("API socket path {} exists and is not a socket", .0.display())]
    NotASocket(PathBuf),
    /// The path could not be examined, or the existing socket could not be probed.
    #[error("Failed to check existing API socket {}", path.display())]
    Inspect {
        /// The socket path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// A stale socket (nobody listening) could not be removed.
    #[error("Failed to remove stale API socket {}", path.display())]
    RemoveStale {
        /// The socket path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// `bind` failed.
    #[error("Failed to bind API socket {}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// The socket could not be restricted to its owner.
    #[error("Failed to set mode 0600 on API socket {}", path.display())]
    Permissions {
        /// The socket path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// The epoll instance or the stop eventfd could not be created.
    #[error("Failed to set up the API server event loop")]
    EventLoop(#[source] io::Error),
    /// The server thread could not be started.
    #[error("Failed to spawn the API server thread")]
    SpawnThread(#[source] io::Error),
}

/// The running server. Dropping it stops the thread (within 100 ms, plus up to 5 s if a
/// response is being written to a client that does not read) and removes the socket file.
#[derive(Debug)]
pub struct ApiServerHandle {
    path: PathBuf,
    /// Device and inode of our socket file, so that drop never removes someone else's.
    identity: (u64, u64),
    stop: Arc<AtomicBool>,
    stop_evt: EventFd,
    thread: Option<JoinHandle<()>>,
}

impl ApiServerHandle {
    /// Path of the socket being served.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ApiServerHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Err(e) = self.stop_evt.write(1) {
            error!("Failed to signal the API server thread to stop: {e}");
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                error!("API server thread panicked");
            }
        }
        let ours =
            fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.identity);
        if ours {
            if let Err(e) = fs::remove_file(&self.path) {
                warn!("Failed to remove API socket {}: {e}", self.path.display());
            }
        }
    }
}

/// Starts the API server on `path` with [`ServerOptions::default`].
///
/// Each request is sent on `api_sender` and announced by writing 1 to `api_evt`; the VMM waits
/// on that eventfd in its event loop, drains the channel and answers each [`ApiMessage`].
pub fn start_server(
    path: &Path,
    api_sender: Sender<ApiMessage>,
    api_evt: EventFd,
) -> Result<ApiServerHandle, ApiError> {
    start_server_with(path, api_sender, api_evt, ServerOptions::default())
}

/// [`start_server`] with explicit timeouts.
pub fn start_server_with(
    path: &Path,
    api_sender: Sender<ApiMessage>,
    api_evt: EventFd,
    options: ServerOptions,
) -> Result<ApiServerHandle, ApiError> {
    let listener = bind(path)?;
    let identity = fs::symlink_metadata(path)
        .map(|m| (m.dev(), m.ino()))
        .map_err(|source| ApiError::Inspect {
            path: path.to_owned(),
            source,
        })?;
    // From here on, dropping the handle cleans up the socket file.
    let stop = Arc::new(AtomicBool::new(false));
    let stop_evt = EventFd::new(EFD_NONBLOCK).map_err(ApiError::EventLoop)?;
    let mut handle = ApiServerHandle {
        path: path.to_owned(),
        identity,
        stop: stop.clone(),
        stop_evt: stop_evt.try_clone().map_err(ApiError::EventLoop)?,
        thread: None,
    };
    let epoll = Epoll::new().map_err(ApiError::EventLoop)?;
    for fd in [listener.as_raw_fd(), stop_evt.as_raw_fd()] {
        epoll
            .ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, 0))
            .map_err(ApiError::EventLoop)?;
    }
    let worker = Worker {
        listener,
        epoll,
        _stop_evt: stop_evt,
        stop,
        api_sender,
        api_evt,
        options,
    };
    let thread = thread::Builder::new()
        .name("pvrdma-api".into())
        .spawn(move || worker.run())
        .map_err(ApiError::SpawnThread)?;
    handle.thread = Some(thread);
    Ok(handle)
}

/// Binds the socket, replacing a stale one, refusing a live one, and restricts it to 0600.
///
/// Between `bind` and `chmod` the socket has the umask's mode; with the usual umask (022)
/// nobody else can connect, since connecting needs write permission.
fn bind(path: &Path) -> Result<UnixListener, ApiError> {
    let inspect = |source| ApiError::Inspect {
        path: path.to_owned(),
        source,
    };
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => return Err(ApiError::InUse(path.to_owned())),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                debug!("Removing stale API socket {}", path.display());
                fs::remove_file(path).map_err(|source| ApiError::RemoveStale {
                    path: path.to_owned(),
                    source,
                })?;
            }
            Err(e) => return Err(inspect(e)),
        },
        Ok(_) => return Err(ApiError::NotASocket(path.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(inspect(e)),
    }
    let listener = UnixListener::bind(path).map_err(|source| ApiError::Bind {
        path: path.to_owned(),
        source,
    })?;
    let restrict = fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .and_then(|()| listener.set_nonblocking(true));
    if let Err(source) = restrict {
        drop(listener);
        // Best effort: the socket is ours and useless now.
        let _ = fs::remove_file(path);
        return Err(ApiError::Permissions {
            path: path.to_owned(),
            source,
        });
    }
    Ok(listener)
}

/// An HTTP response before serialisation.
struct Reply {
    status: u16,
    allow: Option<Method>,
    body: Option<Vec<u8>>,
}

impl Reply {
    /// An error response with body `{"error": message}`.
    fn error(status: u16, message: &str) -> Self {
        let body = serde_json::json!({ "error": message })
            .to_string()
            .into_bytes();
        Self {
            status,
            allow: None,
            body: Some(body),
        }
    }
}

/// Why a request could not be read or is not acceptable HTTP; answered with `status()`.
#[derive(Debug, thiserror::Error)]
enum HttpError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("Malformed request: {0}")]
    Malformed(&'static str),
    #[error("HTTP version {0} is not supported")]
    Version(String),
    #[error("Request body exceeds {MAX_BODY_BYTES} bytes")]
    BodyTooLarge,
    #[error("Transfer-Encoding is not supported; send Content-Length")]
    TransferEncoding,
    #[error("Expectation {0} is not supported")]
    Expectation(String),
}

impl HttpError {
    fn status(&self) -> u16 {
        match self {
            Self::Wire(WireError::Timeout) => 408,
            Self::Wire(WireError::HeadTooLarge) => 431,
            Self::Wire(WireError::Closed | WireError::Io(_)) | Self::Malformed(_) => 400,
            Self::Version(_) => 505,
            Self::BodyTooLarge => 413,
            Self::TransferEncoding => 501,
            Self::Expectation(_) => 417,
        }
    }
}

/// A request as read off the wire, before routing.
struct HttpRequest {
    method: String,
    path: String,
    body: Vec<u8>,
}

/// A client connection whose reads give up at a deadline or when the server stops.
struct Conn<'a> {
    stream: UnixStream,
    deadline: Instant,
    stop: &'a AtomicBool,
}

impl Read for Conn<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let now = Instant::now();
            if self.stop.load(Ordering::Acquire) || now >= self.deadline {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.stream
                .set_read_timeout(Some((self.deadline - now).min(STOP_POLL)))?;
            match self.stream.read(buf) {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                result => return result,
            }
        }
    }
}

impl Conn<'_> {
    /// Reads one request: head, checks, then a body of at most [`MAX_BODY_BYTES`].
    fn read_request(&mut self) -> Result<HttpRequest, HttpError> {
        read_request(self, |conn| http::write_interim_continue(&mut conn.stream))
    }
}

/// Reads one request from `r`: head, checks, then a body of at most [`MAX_BODY_BYTES`].
/// `go_on` answers `Expect: 100-continue` before the body is read.
fn read_request<R: Read>(
    r: &mut R,
    go_on: impl FnOnce(&mut R) -> io::Result<()>,
) -> Result<HttpRequest, HttpError> {
    let (head, rest) = http::read_head(r)?;
    let head = Head::parse(&head).map_err(HttpError::Malformed)?;
    let mut parts = head.start.split(' ');
    let (Some(method), Some(path), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::Malformed("bad request line"));
    };
    if !version.starts_with("HTTP/") {
        return Err(HttpError::Malformed("bad request line"));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(HttpError::Version(version.to_owned()));
    }
    if method.is_empty() || !path.starts_with('/') {
        return Err(HttpError::Malformed("bad request line"));
    }
    if head.get("transfer-encoding").is_some() {
        return Err(HttpError::TransferEncoding);
    }
    let length = head
        .content_length()
        .map_err(HttpError::Malformed)?
        .unwrap_or(0);
    let length = usize::try_from(length)
        .ok()
        .filter(|&l| l <= MAX_BODY_BYTES)
        .ok_or(HttpError::BodyTooLarge)?;
    let expects_continue = match head.get("expect") {
        None => false,
        Some(e) if e.eq_ignore_ascii_case("100-continue") => true,
        Some(e) => return Err(HttpError::Expectation(e.to_owned())),
    };
    // curl waits for this before sending bodies over 1 KiB.
    if expects_continue && rest.len() < length {
        go_on(r).map_err(WireError::from)?;
    }
    let body = http::read_body(r, rest, length)?;
    Ok(HttpRequest {
        method: method.to_owned(),
        path: path.to_owned(),
        body,
    })
}

/// Fuzzing entry (feature `fuzzing`, not API): reads `bytes` as one request off a connection
/// and routes it exactly as the server does, formatting the error response it would send.
/// Returns what the VMM would be handed, or the status the client would get.
#[cfg(feature = "fuzzing")]
pub fn fuzz_request(bytes: &[u8]) -> Result<crate::ApiRequest, u16> {
    let mut r = io::Cursor::new(bytes);
    let outcome = read_request(&mut r, |_| Ok(()))
        .map(|request| parse_request(&request.method, &request.path, &request.body));
    let (status, message) = match outcome {
        Ok(Ok(request)) => return Ok(request),
        Ok(Err(e)) => (e.status(), e.to_string()),
        Err(e) => (e.status(), e.to_string()),
    };
    let reply = Reply::error(status, &message);
    let mut out = Vec::new();
    let _ = http::write_response(&mut out, reply.status, reply.allow, reply.body.as_deref());
    Err(status)
}

/// State of the server thread.
struct Worker {
    listener: UnixListener,
    epoll: Epoll,
    /// Kept open because it is registered in `epoll`; the handle writes its twin.
    _stop_evt: EventFd,
    stop: Arc<AtomicBool>,
    api_sender: Sender<ApiMessage>,
    api_evt: EventFd,
    options: ServerOptions,
}

impl Worker {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn run(self) {
        (self.options.thread_start)();
        let mut events = [EpollEvent::default(); 2];
        while !self.stopping() {
            match self.epoll.wait(-1, &mut events) {
                Ok(_) => self.accept_pending(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    error!("API server event loop failed, API is down: {e}");
                    return;
                }
            }
        }
        debug!("API server thread stopped");
    }

    /// Serves every connection waiting in the backlog.
    fn accept_pending(&self) {
        while !self.stopping() {
            match self.listener.accept() {
                Ok((stream, _)) => self.serve(stream),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    warn!("Failed to accept an API connection: {e}");
                    thread::sleep(ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    /// Reads one request, answers it and closes the connection. Nothing a client sends can
    /// make this fail: errors become responses, or a silent close when nobody is listening.
    fn serve(&self, stream: UnixStream) {
        if let Err(e) = stream.set_nonblocking(false) {
            warn!("Failed to set up an API connection: {e}");
            return;
        }
        let mut conn = Conn {
            stream,
            deadline: Instant::now() + self.options.request_timeout,
            stop: &self.stop,
        };
        let reply = match conn.read_request() {
            Ok(request) => {
                let reply = self.handle(&request);
                debug!(
                    "API {} {} -> {}",
                    request.method, request.path, reply.status
                );
                reply
            }
            Err(HttpError::Wire(WireError::Closed)) => {
                debug!("API client closed the connection mid-request");
                return;
            }
            Err(e) => {
                debug!("Bad API request: {e}");
                Reply::error(e.status(), &e.to_string())
            }
        };
        let written = conn
            .stream
            .set_write_timeout(Some(WRITE_TIMEOUT))
            .and_then(|()| {
                http::write_response(
                    &mut conn.stream,
                    reply.status,
                    reply.allow,
                    reply.body.as_deref(),
                )
            });
        if let Err(e) = written {
            debug!("Failed to write an API response: {e}");
        }
    }

    /// Routes a request, hands it to the VMM and turns the answer into a reply.
    fn handle(&self, request: &HttpRequest) -> Reply {
        let api_request = match parse_request(&request.method, &request.path, &request.body) {
            Ok(r) => r,
            Err(e) => {
                let allow = match &e {
                    RouteError::MethodNotAllowed { allowed, .. } => Some(*allowed),
                    _ => None,
                };
                return Reply {
                    allow,
                    ..Reply::error(e.status(), &e.to_string())
                };
            }
        };
        let (reply, reply_rx) = mpsc::channel();
        let message = ApiMessage {
            request: api_request,
            reply,
        };
        if self.api_sender.send(message).is_err() {
            return Reply::error(503, "VMM is not running");
        }
        // If the wake-up fails the request is still queued and is served on the VMM's next
        // wake-up, or times out below; either way the client learns what happened.
        if let Err(e) = self.api_evt.write(1) {
            error!("Failed to wake the VMM for an API request: {e}");
        }
        match self.wait_reply(&reply_rx) {
            Ok(response) => reply_from(response),
            Err(RecvTimeoutError::Disconnected) => {
                Reply::error(503, "VMM dropped the request without answering")
            }
            Err(RecvTimeoutError::Timeout) if self.stopping() => {
                Reply::error(503, "API server is shutting down")
            }
            Err(RecvTimeoutError::Timeout) => Reply::error(
                504,
                &format!(
                    "VMM did not answer within {} s; the action may still take place",
                    self.options.reply_timeout.as_secs()
                ),
            ),
        }
    }

    /// Waits for the VMM's answer, in [`STOP_POLL`] slices so that a stop is noticed. An answer
    /// already sent is taken even when stopping, so that the VMM can answer `vm.shutdown`,
    /// drop the handle and still have the client see the answer.
    fn wait_reply(&self, rx: &Receiver<ApiResponse>) -> Result<ApiResponse, RecvTimeoutError> {
        let deadline = Instant::now() + self.options.reply_timeout;
        loop {
            let slice = deadline
                .saturating_duration_since(Instant::now())
                .min(STOP_POLL);
            match rx.recv_timeout(slice) {
                Err(RecvTimeoutError::Timeout) => {}
                result => return result,
            }
            if self.stopping() || Instant::now() >= deadline {
                return Err(RecvTimeoutError::Timeout);
            }
        }
    }
}

/// HTTP form of the VMM's answer.
fn reply_from(response: ApiResponse) -> Reply {
    let json = match response {
        Ok(ResponseBody::Empty) => {
            return Reply {
                status: 204,
                allow: None,
                body: None,
            }
        }
        Ok(ResponseBody::Ping(ping)) => serde_json::to_vec(&ping),
        Ok(ResponseBody::VmInfo(info)) => serde_json::to_vec(&info),
        Ok(ResponseBody::Counters(counters)) => serde_json::to_vec(&counters),
        Err(e @ ActionError::BadRequest(_)) => return Reply::error(400, &e.to_string()),
        Err(e @ ActionError::InvalidState(_)) => return Reply::error(409, &e.to_string()),
        Err(e @ ActionError::Failed(_)) => return Reply::error(500, &e.to_string()),
    };
    match json {
        Ok(body) => Reply {
            status: 200,
            allow: None,
            body: Some(body),
        },
        Err(e) => {
            error!("Failed to serialise an API response: {e}");
            Reply::error(500, "Failed to serialise the response")
        }
    }
}

// SPDX-License-Identifier: Apache-2.0

//! Client side of the API: one HTTP/1.1 exchange per call over the Unix socket.
//!
//! Used by `pvrdma-remote`, by this crate's tests and by the end-to-end harness, so that they
//! all speak to the VMM exactly the same way.
//!
//! ```no_run
//! use api::client::ApiClient;
//! use api::{ApiRequest, VmInfo};
//!
//! let client = ApiClient::new("/run/pvrdma-vmm.sock");
//! client.call(&ApiRequest::Pause)?;
//! let info: VmInfo = serde_json::from_value(client.call(&ApiRequest::VmInfo)?.ok_or("no body")?)?;
//! println!("{:?}", info.state);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::http::{self, Head, WireError};
use crate::types::ApiRequest;

/// Per-read timeout of the client: longer than the server's 30 s wait for the VMM, so that a
/// slow VMM shows up as the server's 504 and not as a client-side timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest response body accepted; far above anything the API sends, it only stops a
/// misbehaving peer from exhausting memory.
const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// Failure of one API call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody is listening on the socket, or it cannot be opened.
    #[error("Failed to connect to API socket {}", path.display())]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// The request could not be written.
    #[error("Failed to send the request")]
    Send(#[source] io::Error),
    /// The response could not be read (closed early, timed out, socket error).
    #[error("Failed to read the response")]
    Receive(#[source] io::Error),
    /// What came back is not an HTTP response this client understands.
    #[error("Malformed response: {0}")]
    MalformedResponse(&'static str),
    /// The server answered with an error status; `message` is its `{"error": ...}` text.
    #[error("{message}")]
    Http {
        /// HTTP status code.
        status: u16,
        /// Error text from the server.
        message: String,
    },
}

/// A raw HTTP response.
#[derive(Debug)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// `Allow` header, sent with 405.
    pub allow: Option<String>,
    /// Body bytes; empty for 204.
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The JSON body of a success (`None` when there is none, as for 204), or
    /// [`ClientError::Http`] carrying the server's error message.
    pub fn into_json(self) -> Result<Option<Value>, ClientError> {
        if !(200..300).contains(&self.status) {
            return Err(ClientError::Http {
                status: self.status,
                message: error_message(self.status, &self.body),
            });
        }
        if self.body.is_empty() {
            return Ok(None);
        }
        serde_json::from_slice(&self.body)
            .map(Some)
            .map_err(|_| ClientError::MalformedResponse("body is not JSON"))
    }
}

/// The message of an error response: its `error` field, else its text, else the reason phrase.
fn error_message(status: u16, body: &[u8]) -> String {
    if let Ok(Value::Object(map)) = serde_json::from_slice(body) {
        if let Some(Value::String(message)) = map.get("error") {
            return message.clone();
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        format!("HTTP {status} {}", http::reason(status))
    } else {
        text.to_owned()
    }
}

/// Talks to one VMM's API socket. Cheap to create; every call opens its own connection.
#[derive(Clone, Debug)]
pub struct ApiClient {
    socket: PathBuf,
    timeout: Duration,
}

impl ApiClient {
    /// A client for the socket at `socket`, with [`DEFAULT_TIMEOUT`].
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Sends `request` to its endpoint, with its parameters as the body; see
    /// [`HttpResponse::into_json`] for the result.
    pub fn call(&self, request: &ApiRequest) -> Result<Option<Value>, ClientError> {
        let route = request.route();
        self.send_raw(route.method.as_str(), route.path, request.body().as_deref())?
            .into_json()
    }

    /// One raw exchange, for requests [`ApiRequest`] cannot express (tests, diagnostics).
    /// `body` is sent as JSON with a `Content-Length`.
    pub fn send_raw(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<HttpResponse, ClientError> {
        let mut stream =
            UnixStream::connect(&self.socket).map_err(|source| ClientError::Connect {
                path: self.socket.clone(),
                source,
            })?;
        stream
            .set_read_timeout(Some(self.timeout))
            .and_then(|()| stream.set_write_timeout(Some(self.timeout)))
            .map_err(ClientError::Send)?;

        let mut request =
            format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n");
        if let Some(body) = body {
            request.push_str("Content-Type: application/json\r\n");
            request.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        request.push_str("Connection: close\r\n\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body.unwrap_or_default());
        match stream.write_all(&bytes).and_then(|()| stream.flush()) {
            Ok(()) => {}
            // The server may have answered and closed before taking the whole request (413):
            // its response is still waiting to be read.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) => {}
            Err(e) => return Err(ClientError::Send(e)),
        }
        read_response(&mut stream)
    }
}

/// Maps a failed read to the error the caller sees.
fn receive_error(e: WireError) -> ClientError {
    match e {
        WireError::Closed => ClientError::Receive(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before the whole response arrived",
        )),
        WireError::Timeout => ClientError::Receive(io::ErrorKind::TimedOut.into()),
        WireError::HeadTooLarge => ClientError::MalformedResponse("response head too large"),
        WireError::Io(e) => ClientError::Receive(e),
    }
}

/// Reads the status line, headers and body of one response. The client never sends
/// `Expect`, so no interim (1xx) response precedes it.
fn read_response<R: Read>(stream: &mut R) -> Result<HttpResponse, ClientError> {
    let (head, rest) = http::read_head(stream).map_err(receive_error)?;
    let head = Head::parse(&head).map_err(ClientError::MalformedResponse)?;
    let mut parts = head.start.split(' ');
    let status = match (parts.next(), parts.next()) {
        (Some(version), Some(code)) if version.starts_with("HTTP/1.") && code.len() == 3 => code
            .parse::<u16>()
            .map_err(|_| ClientError::MalformedResponse("bad status code"))?,
        _ => return Err(ClientError::MalformedResponse("bad status line")),
    };
    if head.get("transfer-encoding").is_some() {
        return Err(ClientError::MalformedResponse(
            "chunked responses are not supported",
        ));
    }
    let body = if status == 204 || status == 304 {
        Vec::new()
    } else if let Some(length) = head
        .content_length()
        .map_err(ClientError::MalformedResponse)?
    {
        let length = usize::try_from(length)
            .ok()
            .filter(|&l| l <= MAX_RESPONSE_BYTES)
            .ok_or(ClientError::MalformedResponse("response body too large"))?;
        http::read_body(stream, rest, length).map_err(receive_error)?
    } else {
        // No length: the body runs to the end of the connection.
        let mut body = rest;
        let room = (MAX_RESPONSE_BYTES + 1).saturating_sub(body.len());
        stream
            .take(u64::try_from(room).unwrap_or(u64::MAX))
            .read_to_end(&mut body)
            .map_err(ClientError::Receive)?;
        if body.len() > MAX_RESPONSE_BYTES {
            return Err(ClientError::MalformedResponse("response body too large"));
        }
        body
    };
    Ok(HttpResponse {
        status,
        allow: head.get("allow").map(str::to_owned),
        body,
    })
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn parse(raw: &[u8]) -> Result<HttpResponse, ClientError> {
        read_response(&mut Cursor::new(raw.to_vec()))
    }

    #[test]
    fn success_with_json() {
        let r = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"a\": true}").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.into_json().unwrap(), Some(serde_json::json!({"a": true})));
    }

    #[test]
    fn no_content() {
        let r = parse(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n").unwrap();
        assert_eq!(r.into_json().unwrap(), None);
    }

    #[test]
    fn body_to_eof_without_length() {
        let r = parse(b"HTTP/1.0 200 OK\r\n\r\n[1, 2]").unwrap();
        assert_eq!(r.into_json().unwrap(), Some(serde_json::json!([1, 2])));
    }

    #[test]
    fn error_messages() {
        let r = parse(
            b"HTTP/1.1 409 Conflict\r\nContent-Length: 29\r\n\r\n{\"error\": \"VM is not paused\"}",
        )
        .unwrap();
        match r.into_json() {
            Err(ClientError::Http {
                status: 409,
                message,
            }) => assert_eq!(message, "VM is not paused"),
            other => panic!("{other:?}"),
        }
        assert_eq!(error_message(500, b" plain text \n"), "plain text");
        assert_eq!(error_message(503, b""), "HTTP 503 Service Unavailable");
        assert_eq!(error_message(400, b"{\"error\": 3}"), "{\"error\": 3}");
    }

    #[test]
    fn malformed_responses() {
        for raw in [
            &b"HTTP/1.1 2000 OK\r\n\r\n"[..],
            b"SSH-2.0-OpenSSH\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nnot",
        ] {
            let result = parse(raw).and_then(HttpResponse::into_json);
            assert!(
                matches!(result, Err(ClientError::MalformedResponse(_))),
                "{raw:?}"
            );
        }
        assert!(matches!(
            parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}"),
            Err(ClientError::Receive(_))
        ));
        assert!(matches!(parse(b""), Err(ClientError::Receive(_))));
    }

    #[test]
    fn connect_failure() {
        let client = ApiClient::new("/nonexistent/pvrdma-api.sock");
        assert!(matches!(
            client.call(&ApiRequest::Ping),
            Err(ClientError::Connect { .. })
        ));
    }
}

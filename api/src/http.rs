// SPDX-License-Identifier: Apache-2.0

//! HTTP/1.1 framing, only as much as a local JSON API needs, with hard limits.
//!
//! Hand-rolled rather than tiny_http 0.12, which buffers header lines without a limit and, when
//! a request body is left unread, allocates a buffer as large as the client-declared
//! `Content-Length`. Here every allocation is bounded by [`MAX_HEAD_BYTES`] or the caller's body
//! cap, and nothing is allocated before the bytes have arrived, except a body buffer no larger
//! than the cap. One request per connection: every response says `Connection: close`.

use std::io::{self, Read, Write};

use crate::request::Method;

/// Cap on the request line plus headers. Ours are a few hundred bytes; 8 KiB is the common
/// server default.
pub(crate) const MAX_HEAD_BYTES: usize = 8 * 1024;

/// Cap on a request body, checked against `Content-Length` before reading any of it. Bodies
/// are small JSON objects; this leaves room for every planned endpoint.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Failure to read a head or a body off the socket.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    /// The peer closed or reset the connection before the message was complete.
    #[error("Connection closed mid-message")]
    Closed,
    /// A read timed out.
    #[error("Timed out")]
    Timeout,
    /// The head did not end within [`MAX_HEAD_BYTES`].
    #[error("Message head exceeds {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
    /// Any other socket error.
    #[error("Socket error")]
    Io(#[source] io::Error),
}

impl From<io::Error> for WireError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => Self::Closed,
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Self::Timeout,
            _ => Self::Io(e),
        }
    }
}

/// Offset just past the blank line ending a head, accepting bare LF line ends (RFC 9112 §2.2).
/// The search starts at `from`, so repeated calls on a growing buffer stay linear.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(pos) = buf.get(i..)?.iter().position(|&b| b == b'\n') {
        let lf = i + pos;
        match buf.get(lf + 1..) {
            Some([b'\n', ..]) => return Some(lf + 2),
            Some([b'\r', b'\n', ..]) => return Some(lf + 3),
            _ => i = lf + 1,
        }
    }
    None
}

/// Reads until the blank line that ends a head. Returns the head and whatever was read past
/// it (the start of the body).
pub(crate) fn read_head<R: Read>(r: &mut R) -> Result<(Vec<u8>, Vec<u8>), WireError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // Where the terminator search resumes; 0 while only blank lines have arrived.
    let mut scanned = 0;
    loop {
        // Blank lines before a request line are allowed (RFC 9112 §2.2): drop them so that
        // they are not taken for the end of an empty head.
        if scanned == 0 {
            let blank = buf
                .iter()
                .take_while(|&&b| b == b'\r' || b == b'\n')
                .count();
            buf.drain(..blank);
        }
        if let Some(end) = head_end(&buf, scanned) {
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Err(WireError::HeadTooLarge);
        }
        // A terminator can straddle reads: its first LF may be one of the last two bytes.
        scanned = buf.len().saturating_sub(2);
        let n = r.read(&mut chunk)?;
        if n == 0 {
            return Err(WireError::Closed);
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
}

/// Reads a body of exactly `len` bytes, of which `prefix` already arrived with the head.
/// `len` must already be checked against a cap: this allocates it.
pub(crate) fn read_body<R: Read>(
    r: &mut R,
    mut prefix: Vec<u8>,
    len: usize,
) -> Result<Vec<u8>, WireError> {
    prefix.truncate(len);
    let have = prefix.len();
    prefix.resize(len, 0);
    if let Some(rest) = prefix.get_mut(have..) {
        r.read_exact(rest)?;
    }
    Ok(prefix)
}

/// A parsed head: start line and header fields, names lowercased.
#[derive(Debug)]
pub(crate) struct Head {
    /// Request line or status line.
    pub start: String,
    headers: Vec<(String, String)>,
}

impl Head {
    /// Splits a head into lines and fields. Only visible ASCII is accepted: nothing in this
    /// API needs more, and it keeps odd bytes out of logs and error messages.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, &'static str> {
        let text = std::str::from_utf8(bytes).map_err(|_| "head is not ASCII")?;
        let mut lines = text.lines().take_while(|l| !l.is_empty());
        if !lines
            .clone()
            .all(|l| l.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)))
        {
            return Err("head is not printable ASCII");
        }
        let start = lines.next().ok_or("empty head")?.to_owned();
        let mut headers = Vec::new();
        for line in lines {
            if line.starts_with([' ', '\t']) {
                return Err("obsolete header line folding");
            }
            let (name, value) = line.split_once(':').ok_or("header line without a colon")?;
            if name.is_empty() || name.contains([' ', '\t']) {
                return Err("invalid header name");
            }
            headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
        }
        Ok(Self { start, headers })
    }

    /// Values of every field called `name` (lowercase).
    fn all<'s, 'n>(&'s self, name: &'n str) -> impl Iterator<Item = &'s str> + use<'s, 'n> {
        self.headers
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Value of the first field called `name` (lowercase).
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.all(name).next()
    }

    /// The declared body length. Several `Content-Length` fields must agree (RFC 9112 §6.3):
    /// a disagreement is how request smuggling starts. A value too big for `u64` saturates,
    /// which every caller's cap then refuses.
    pub(crate) fn content_length(&self) -> Result<Option<u64>, &'static str> {
        let mut length = None;
        for value in self.all("content-length") {
            if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                return Err("invalid Content-Length");
            }
            let n = value.parse::<u64>().unwrap_or(u64::MAX);
            if length.is_some_and(|l| l != n) {
                return Err("conflicting Content-Length fields");
            }
            length = Some(n);
        }
        Ok(length)
    }
}

/// Reason phrase of the status codes this crate sends or expects.
pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        417 => "Expectation Failed",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// Tells a client that sent `Expect: 100-continue` to go on with its body (RFC 9110 §10.1.1).
pub(crate) fn write_interim_continue<W: Write>(w: &mut W) -> io::Result<()> {
    w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
    w.flush()
}

/// Writes a complete response and closes the exchange with `Connection: close`.
/// `body` is JSON; a 204 has none, per RFC 9110 §15.3.5 not even a `Content-Length`.
pub(crate) fn write_response<W: Write>(
    w: &mut W,
    status: u16,
    allow: Option<Method>,
    body: Option<&[u8]>,
) -> io::Result<()> {
    let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status)).into_bytes();
    out.extend_from_slice(b"Server: pvrdma-vmm\r\nConnection: close\r\n");
    if let Some(method) = allow {
        out.extend_from_slice(format!("Allow: {method}\r\n").as_bytes());
    }
    if let Some(body) = body {
        out.extend_from_slice(b"Content-Type: application/json\r\n");
        out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        out.extend_from_slice(body);
    } else if status == 204 {
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(b"Content-Length: 0\r\n\r\n");
    }
    w.write_all(&out)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    #[test]
    fn head_end_finds_crlf_and_lf() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody", 0), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\nbody", 0), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n", 0), None);
        assert_eq!(head_end(b"\r\n", 0), None);
        assert_eq!(head_end(b"", 0), None);
    }

    #[test]
    fn read_head_splits_off_body_bytes() {
        let mut r =
            Cursor::new(b"\r\nPUT /x HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcdEXTRA".to_vec());
        let (head, rest) = read_head(&mut r).unwrap();
        assert_eq!(head, b"PUT /x HTTP/1.1\r\nContent-Length: 4\r\n\r\n");
        assert_eq!(read_body(&mut r, rest, 4).unwrap(), b"abcd");
    }

    /// Hands out one byte per read, so every terminator straddles reads.
    struct Trickle(Cursor<Vec<u8>>);

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let one = buf.get_mut(..1).unwrap_or_default();
            self.0.read(one)
        }
    }

    #[test]
    fn read_head_byte_by_byte() {
        for raw in [
            &b"\r\n\nGET / HTTP/1.1\r\nA: b\r\n\r\nxy"[..],
            b"GET / HTTP/1.1\nA: b\n\nxy",
        ] {
            let mut r = Trickle(Cursor::new(raw.to_vec()));
            let (head, rest) = read_head(&mut r).unwrap();
            assert!(head.starts_with(b"GET / HTTP/1.1"), "{raw:?}");
            assert!(rest.is_empty());
            assert_eq!(read_body(&mut r, rest, 2).unwrap(), b"xy");
        }
    }

    #[test]
    fn read_head_limits() {
        let mut r = Cursor::new(vec![b'a'; MAX_HEAD_BYTES * 4]);
        assert!(matches!(read_head(&mut r), Err(WireError::HeadTooLarge)));
        let mut r = Cursor::new(b"GET / HTTP/1.1\r\nHost:".to_vec());
        assert!(matches!(read_head(&mut r), Err(WireError::Closed)));
        let mut r = Cursor::new(Vec::new());
        assert!(matches!(read_head(&mut r), Err(WireError::Closed)));
    }

    #[test]
    fn read_body_short_is_closed() {
        let mut r = Cursor::new(b"ab".to_vec());
        assert!(matches!(
            read_body(&mut r, b"x".to_vec(), 10),
            Err(WireError::Closed)
        ));
    }

    #[test]
    fn head_parse() {
        let head =
            Head::parse(b"PUT /a HTTP/1.1\r\nContent-LENGTH:  12 \r\nX: y:z\r\n\r\n").unwrap();
        assert_eq!(head.start, "PUT /a HTTP/1.1");
        assert_eq!(head.get("content-length"), Some("12"));
        assert_eq!(head.get("x"), Some("y:z"));
        assert_eq!(head.content_length(), Ok(Some(12)));
        assert!(Head::parse(b"GET / HTTP/1.1\r\nno colon\r\n\r\n").is_err());
        assert!(Head::parse(b"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n").is_err());
        assert!(Head::parse(b"GET / HTTP/1.1\r\nBad Name: b\r\n\r\n").is_err());
        assert!(Head::parse("GET /\u{e9} HTTP/1.1\r\n\r\n".as_bytes()).is_err());
        assert!(Head::parse(b"\xff\r\n\r\n").is_err());
        assert!(Head::parse(b"GET /\x01 HTTP/1.1\r\n\r\n").is_err());
        assert!(Head::parse(b"GET / HTTP/1.1\r\nA: b\rc\r\n\r\n").is_err());
    }

    #[test]
    fn content_length_rules() {
        let cl = |h: &[u8]| Head::parse(h).unwrap().content_length();
        assert_eq!(cl(b"GET / HTTP/1.1\r\n\r\n"), Ok(None));
        assert_eq!(
            cl(b"P / HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\n"),
            Ok(Some(3))
        );
        assert!(cl(b"P / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n").is_err());
        assert!(cl(b"P / HTTP/1.1\r\nContent-Length: -1\r\n\r\n").is_err());
        assert!(cl(b"P / HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n").is_err());
        assert!(cl(b"P / HTTP/1.1\r\nContent-Length:\r\n\r\n").is_err());
        assert_eq!(
            cl(b"P / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n"),
            Ok(Some(u64::MAX))
        );
    }

    #[test]
    fn responses() {
        let mut out = Vec::new();
        write_response(&mut out, 204, None, None).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 204 No Content\r\n"));
        assert!(!text.contains("Content-Length"));
        assert!(text.ends_with("\r\n\r\n"));

        let mut out = Vec::new();
        write_response(&mut out, 405, Some(Method::Put), Some(b"{}")).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("Allow: PUT\r\n"));
        assert!(text.ends_with("Content-Length: 2\r\n\r\n{}"));
    }
}

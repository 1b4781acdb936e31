// SPDX-License-Identifier: Apache-2.0
//! Where a migration goes: `unix:/path` or `tcp:host:port` streams, and
//! `file:///dir` for snapshots.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use crate::stream::Stream;
use crate::tls::{TlsClient, TlsServer};

#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("'{0}' is not a migration URL (expected unix:/path or tcp:host:port)")]
    Scheme(String),
    #[error("'{0}' is not a snapshot URL (expected file:///absolute/dir)")]
    File(String),
    #[error("Cannot resolve {0}")]
    Resolve(String, #[source] io::Error),
    #[error(
        "{0} is not a loopback address: plain TCP would let anyone on the network drive the \
         migration and read guest memory; give a TLS certificate, key and CA (--tls-cert, \
         --tls-key, --tls-ca), or allow plain TCP explicitly (--allow-plaintext)"
    )]
    Plaintext(String),
    #[error("TLS is for tcp: URLs, not {0} (a unix: socket stays on this host)")]
    TlsNeedsTcp(String),
}

/// A stream endpoint of a migration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigrationUrl {
    Unix(PathBuf),
    Tcp(String),
}

impl std::str::FromStr for MigrationUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<Self, UrlError> {
        let err = || UrlError::Scheme(s.to_string());
        if let Some(path) = s.strip_prefix("unix:") {
            return (!path.is_empty())
                .then(|| Self::Unix(PathBuf::from(path)))
                .ok_or_else(err);
        }
        if let Some(addr) = s.strip_prefix("tcp:") {
            let (host, port) = addr.rsplit_once(':').ok_or_else(err)?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(err());
            }
            return Ok(Self::Tcp(addr.to_string()));
        }
        Err(err())
    }
}

impl std::fmt::Display for MigrationUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
            Self::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// The directory of a `file:///dir` snapshot URL.
pub fn parse_file_url(s: &str) -> Result<PathBuf, UrlError> {
    match s.strip_prefix("file://") {
        Some(path) if path.starts_with('/') && path.len() > 1 => Ok(PathBuf::from(path)),
        _ => Err(UrlError::File(s.to_string())),
    }
}

impl MigrationUrl {
    /// Connects to a destination that is receiving, over TLS if `tls`
    /// (only a `tcp:` URL has a host to check a certificate against).
    pub fn connect(&self, tls: Option<&TlsClient>) -> io::Result<Box<dyn Stream>> {
        Ok(match (self, tls) {
            (Self::Unix(path), None) => Box::new(UnixStream::connect(path)?),
            (Self::Unix(_), Some(_)) => return Err(tls_needs_tcp()),
            (Self::Tcp(addr), tls) => {
                let s = TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                match tls {
                    Some(tls) => tls.connect(self.host(), s)?,
                    None => Box::new(s),
                }
            }
        })
    }

    /// Listens here and returns a listener that accepts one source, over
    /// TLS if `tls`.
    pub fn listen(&self, tls: Option<TlsServer>) -> io::Result<Listener> {
        Ok(match (self, tls) {
            (Self::Unix(path), None) => {
                // A socket file left by an earlier receiver is replaced.
                if std::fs::symlink_metadata(path)
                    .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
                    && UnixStream::connect(path).is_err()
                {
                    std::fs::remove_file(path)?;
                }
                Listener::Unix(UnixListener::bind(path)?, path.clone())
            }
            (Self::Unix(_), Some(_)) => return Err(tls_needs_tcp()),
            (Self::Tcp(addr), tls) => Listener::Tcp(TcpListener::bind(addr)?, tls),
        })
    }

    /// The host part of a `tcp:` URL (empty for `unix:`).
    fn host(&self) -> &str {
        match self {
            Self::Tcp(addr) => addr.rsplit_once(':').map_or("", |(host, _)| host),
            Self::Unix(_) => "",
        }
    }

    /// Refuses plain TCP beyond this host: without TLS anyone on the
    /// network may drive the migration and read guest memory, so that
    /// takes the user's explicit `allow_plaintext`. Unix sockets and
    /// addresses that resolve to loopback only stay on this host. TLS
    /// asked for a `unix:` URL is refused too, rather than ignored.
    pub fn check_plaintext(&self, tls: bool, allow_plaintext: bool) -> Result<(), UrlError> {
        let Self::Tcp(addr) = self else {
            return match tls {
                true => Err(UrlError::TlsNeedsTcp(self.to_string())),
                false => Ok(()),
            };
        };
        if tls || allow_plaintext {
            return Ok(());
        }
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| UrlError::Resolve(addr.clone(), e))?
            .collect();
        if !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()) {
            return Ok(());
        }
        Err(UrlError::Plaintext(self.to_string()))
    }
}

fn tls_needs_tcp() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "TLS is for tcp: URLs (a unix: socket stays on this host)",
    )
}

/// Why [`Listener::accept`] gave no stream.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The listening socket failed: nothing more will arrive.
    #[error("Cannot accept on the migration socket")]
    Socket(#[source] io::Error),
    /// One peer was refused (TLS handshake, certificate): the listener
    /// goes on.
    #[error("Refused a connection from {0}")]
    Peer(String, #[source] io::Error),
}

/// A receiver's listening socket; a Unix one removes its file when dropped.
#[derive(Debug)]
pub enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener, Option<TlsServer>),
}

impl Listener {
    pub fn accept(&self) -> Result<Box<dyn Stream>, AcceptError> {
        Ok(match self {
            Self::Unix(l, _) => Box::new(l.accept().map_err(AcceptError::Socket)?.0),
            Self::Tcp(l, tls) => {
                let (s, peer) = l.accept().map_err(AcceptError::Socket)?;
                let refused = |e| AcceptError::Peer(peer.to_string(), e);
                s.set_nodelay(true).map_err(refused)?;
                match tls {
                    Some(tls) => tls.accept(s).map_err(refused)?,
                    None => Box::new(s),
                }
            }
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Self::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            "unix:/tmp/m.sock".parse::<MigrationUrl>().unwrap(),
            MigrationUrl::Unix("/tmp/m.sock".into())
        );
        assert_eq!(
            "tcp:10.0.0.2:6000".parse::<MigrationUrl>().unwrap(),
            MigrationUrl::Tcp("10.0.0.2:6000".into())
        );
        for bad in ["", "unix:", "tcp:host", "tcp::1", "tcp:h:99999", "http://x"] {
            assert!(bad.parse::<MigrationUrl>().is_err(), "{bad}");
        }
        assert_eq!(
            parse_file_url("file:///var/snap").unwrap(),
            PathBuf::from("/var/snap")
        );
        assert!(parse_file_url("file://rel").is_err());
        assert!(parse_file_url("/var/snap").is_err());
    }

    #[test]
    fn plain_tcp_beyond_loopback_needs_consent() {
        let url = |s: &str| s.parse::<MigrationUrl>().unwrap();
        for local in ["tcp:127.0.0.1:6000", "tcp:[::1]:6000", "tcp:localhost:6000"] {
            url(local).check_plaintext(false, false).unwrap();
        }
        for remote in ["tcp:0.0.0.0:6000", "tcp:10.0.0.2:6000", "tcp:[::]:6000"] {
            let e = url(remote).check_plaintext(false, false).unwrap_err();
            assert!(matches!(e, UrlError::Plaintext(_)), "{remote}: {e}");
            assert!(e.to_string().contains("--allow-plaintext"));
            url(remote).check_plaintext(true, false).unwrap();
            url(remote).check_plaintext(false, true).unwrap();
        }
        url("unix:/m.sock").check_plaintext(false, false).unwrap();
        assert!(matches!(
            url("unix:/m.sock").check_plaintext(true, false),
            Err(UrlError::TlsNeedsTcp(_))
        ));
    }

    #[test]
    fn unix_listener_accepts_and_cleans_up() {
        let path = std::env::temp_dir().join(format!("mig-{}.sock", std::process::id()));
        let url = MigrationUrl::Unix(path.clone());
        let l = url.listen(None).unwrap();
        let mut c = url.connect(None).unwrap();
        let mut s = l.accept().unwrap();
        c.write_all(b"hi").unwrap();
        let mut buf = [0u8; 2];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        drop(l);
        assert!(!path.exists());
    }
}

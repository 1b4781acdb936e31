// SPDX-License-Identifier: Apache-2.0
//! Where a migration goes: `unix:/path` or `tcp:host:port` streams, and
//! `file:///dir` for snapshots.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("'{0}' is not a migration URL (expected unix:/path or tcp:host:port)")]
    Scheme(String),
    #[error("'{0}' is not a snapshot URL (expected file:///absolute/dir)")]
    File(String),
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

/// A connected migration stream.
pub trait Stream: Read + Write + Send {
    /// Bounds every read (`None`: wait forever).
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    /// Stops both directions, so a peer blocked on us sees EOF.
    fn shutdown(&self) -> io::Result<()>;
}

impl Stream for UnixStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, t)
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        UnixStream::set_write_timeout(self, t)
    }
    fn shutdown(&self) -> io::Result<()> {
        UnixStream::shutdown(self, std::net::Shutdown::Both)
    }
}

impl Stream for TcpStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, t)
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, t)
    }
    fn shutdown(&self) -> io::Result<()> {
        TcpStream::shutdown(self, std::net::Shutdown::Both)
    }
}

impl MigrationUrl {
    /// Connects to a destination that is receiving.
    pub fn connect(&self) -> io::Result<Box<dyn Stream>> {
        Ok(match self {
            Self::Unix(path) => Box::new(UnixStream::connect(path)?),
            Self::Tcp(addr) => {
                let s = TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                Box::new(s)
            }
        })
    }

    /// Listens here and returns a listener that accepts one source.
    pub fn listen(&self) -> io::Result<Listener> {
        Ok(match self {
            Self::Unix(path) => {
                // A socket file left by an earlier receiver is replaced.
                if std::fs::symlink_metadata(path)
                    .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
                    && UnixStream::connect(path).is_err()
                {
                    std::fs::remove_file(path)?;
                }
                Listener::Unix(UnixListener::bind(path)?, path.clone())
            }
            Self::Tcp(addr) => Listener::Tcp(TcpListener::bind(addr)?),
        })
    }
}

/// A receiver's listening socket; a Unix one removes its file when dropped.
#[derive(Debug)]
pub enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl Listener {
    pub fn accept(&self) -> io::Result<Box<dyn Stream>> {
        Ok(match self {
            Self::Unix(l, _) => Box::new(l.accept()?.0),
            Self::Tcp(l) => {
                let s = l.accept()?.0;
                s.set_nodelay(true)?;
                Box::new(s)
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
    fn unix_listener_accepts_and_cleans_up() {
        let path = std::env::temp_dir().join(format!("mig-{}.sock", std::process::id()));
        let url = MigrationUrl::Unix(path.clone());
        let l = url.listen().unwrap();
        let mut c = url.connect().unwrap();
        let mut s = l.accept().unwrap();
        c.write_all(b"hi").unwrap();
        let mut buf = [0u8; 2];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        drop(l);
        assert!(!path.exists());
    }
}

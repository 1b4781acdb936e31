// SPDX-License-Identifier: Apache-2.0
//! The same-host path: VMMs on one host exchange RoCE v2 frames by memory
//! copy through AF_UNIX datagram sockets instead of their TAPs, the host
//! bridge and its network stack, as VMware's PVRDMA does between VMs of
//! one ESXi host. It is chosen automatically per frame: a device binds
//! `<dir>/<mac>.sock` for its port's MAC, and a frame whose destination
//! MAC has a socket there goes to it; everything else takes the wire.
//! The frames are the same RoCE v2 frames, so the receiver treats both
//! paths alike (and a peer never trusts either).
//!
//! A socket whose owner died refuses the datagram; the frame then takes
//! the wire. A receiver's queue is short (`net.unix.max_dgram_qlen`, 10 by
//! default), so a sender waits for room, up to [`SEND_WAIT`] per frame:
//! that paces a sender to its receiver instead of losing most of a burst.
//! Only after that wait is a frame dropped (RC retransmits, as on a wire);
//! the wait is bounded so two workers sending to each other cannot block
//! each other for long. Sends happen outside the device's state lock.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use net_port::MAX_FRAME_LEN;

/// What became of a frame offered to the channel.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Delivered to a VMM of this host.
    Local,
    /// A local VMM owns the MAC but had no room: the frame is lost.
    Dropped,
    /// No VMM of this host owns the MAC: use the wire.
    NotLocal,
}

/// Longest a sender waits for room in a receiver's queue.
const SEND_WAIT: std::time::Duration = std::time::Duration::from_millis(5);

/// Peers whose sockets stay connected (a connected send skips the path
/// lookup); beyond this many, the cache starts over.
const MAX_PEERS: usize = 256;

/// One device's end of the same-host channel.
#[derive(Debug)]
pub(crate) struct LocalChannel {
    /// Bound to `own`, non-blocking: frames from other VMMs.
    sock: UnixDatagram,
    /// Sockets connected to peers by MAC, blocking up to [`SEND_WAIT`].
    peers: Mutex<HashMap<[u8; 6], UnixDatagram>>,
    /// Receive buffer (one frame).
    buf: Mutex<Vec<u8>>,
    dir: PathBuf,
    own: PathBuf,
}

fn sock_name(mac: [u8; 6]) -> String {
    let [a, b, c, d, e, f] = mac;
    format!("{a:02x}-{b:02x}-{c:02x}-{d:02x}-{e:02x}-{f:02x}.sock")
}

impl LocalChannel {
    /// Binds the socket of `mac` in `dir` (created 0700 if missing). A
    /// socket file left by a VMM that is gone is replaced; one that
    /// answers belongs to a running VMM with the same MAC, an error.
    pub(crate) fn bind(dir: &Path, mac: [u8; 6]) -> io::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let own = dir.join(sock_name(mac));
        if own.exists() {
            let probe = UnixDatagram::unbound()?;
            if probe.connect(&own).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} belongs to a running VMM (same MAC?)", own.display()),
                ));
            }
            std::fs::remove_file(&own)?;
        }
        let sock = UnixDatagram::bind(&own)?;
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o600))?;
        sock.set_nonblocking(true)?;
        Ok(Self {
            sock,
            peers: Mutex::new(HashMap::new()),
            buf: Mutex::new(vec![0; MAX_FRAME_LEN]),
            dir: dir.to_path_buf(),
            own,
        })
    }

    /// The socket the worker watches for frames from other VMMs.
    pub(crate) fn socket(&self) -> &UnixDatagram {
        &self.sock
    }

    /// A socket connected to the VMM owning `mac`, if one is running.
    fn connect(&self, mac: [u8; 6]) -> Option<UnixDatagram> {
        let path = self.dir.join(sock_name(mac));
        if path == self.own {
            return None;
        }
        let sock = UnixDatagram::unbound().ok()?;
        sock.connect(&path).ok()?;
        sock.set_write_timeout(Some(SEND_WAIT)).ok()?;
        Some(sock)
    }

    /// Offers `frame` to the VMM owning `dst_mac` on this host.
    pub(crate) fn send(&self, dst_mac: [u8; 6], frame: &[u8]) -> Sent {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if !peers.contains_key(&dst_mac) {
            let Some(sock) = self.connect(dst_mac) else {
                return Sent::NotLocal;
            };
            if peers.len() >= MAX_PEERS {
                peers.clear();
            }
            peers.insert(dst_mac, sock);
        }
        let Some(sock) = peers.get(&dst_mac) else {
            return Sent::NotLocal;
        };
        match sock.send(frame) {
            Ok(_) => Sent::Local,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Sent::Dropped
            }
            Err(_) => {
                // The peer is gone (or was replaced): look again next time.
                peers.remove(&dst_mac);
                Sent::NotLocal
            }
        }
    }

    /// Up to `max` frames received from other VMMs.
    pub(crate) fn recv(&self, max: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = self.buf.lock().unwrap_or_else(PoisonError::into_inner);
        while out.len() < max {
            match self.sock.recv(&mut buf) {
                Ok(n) => out.push(buf.get(..n).unwrap_or_default().to_vec()),
                Err(_) => break,
            }
        }
        out
    }
}

impl Drop for LocalChannel {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.own);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn frames_reach_the_owner_of_the_mac_and_nobody_else() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-{}", std::process::id()));
        let a = LocalChannel::bind(&dir, [2, 0, 0, 0, 0, 1]).unwrap();
        let b = LocalChannel::bind(&dir, [2, 0, 0, 0, 0, 2]).unwrap();
        assert_eq!(a.send([2, 0, 0, 0, 0, 2], b"hello"), Sent::Local);
        assert_eq!(b.recv(8), vec![b"hello".to_vec()]);
        assert_eq!(
            a.send([2, 0, 0, 0, 0, 3], b"x"),
            Sent::NotLocal,
            "no such VMM"
        );
        assert_eq!(
            a.send([2, 0, 0, 0, 0, 1], b"x"),
            Sent::NotLocal,
            "not to itself"
        );
        // A second VMM with the same MAC is refused while the first lives.
        assert!(LocalChannel::bind(&dir, [2, 0, 0, 0, 0, 2]).is_err());
        drop(b);
        assert_eq!(a.send([2, 0, 0, 0, 0, 2], b"x"), Sent::NotLocal, "gone");
        // A stale socket file (its VMM died without cleaning up) is replaced.
        drop(UnixDatagram::bind(dir.join(sock_name([2, 0, 0, 0, 0, 4]))).unwrap());
        let c = LocalChannel::bind(&dir, [2, 0, 0, 0, 0, 4]).unwrap();
        assert_eq!(a.send([2, 0, 0, 0, 0, 4], b"again"), Sent::Local);
        assert_eq!(c.recv(8), vec![b"again".to_vec()]);
        drop((a, c));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

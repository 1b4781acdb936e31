// SPDX-License-Identifier: Apache-2.0
//! A TAP device as the port's backend.
//!
//! [`Tap::open`] attaches to the TAP interface of that name through
//! `/dev/net/tun`, creating it when it does not exist (the kernel requires
//! CAP_NET_ADMIN for that, or for attaching to a TAP owned by another user).
//! A TAP the VMM created disappears when the VMM closes it; a persistent one
//! (`ip tuntap add mode tap ...`) stays. Attaching switches the interface to
//! this configuration whatever it had before:
//!
//! - `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`: Ethernet frames, each preceded by
//!   a 12-byte `virtio_net_hdr_v1` (`TUNSETVNETHDRSZ`). Frames written with
//!   a checksum or GSO request are finished by the host kernel
//!   (`virtio_net_hdr_to_skb` accepts them whatever the offload setting).
//! - `TUNSETOFFLOAD` 0: the kernel completes checksums and segments before
//!   handing frames to us, so every received frame is whole, checksummed and
//!   no larger than the TAP's MTU allows. A NIC model therefore never has to
//!   deliver partial-checksum or 64 KiB frames to its guest.
//! - Non-blocking, for an epoll-driven worker.
//!
//! Bringing the interface up and attaching it to a bridge are the host
//! administrator's business (as with QEMU's `-netdev tap`); the link the
//! guest sees follows the interface's operational state. The VMM may give a
//! TAP it created an MTU ([`Tap::created`], [`Tap::set_mtu`]).
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use crate::backend::{FrameBackend, VnetHdr, VNET_HDR_LEN};

const TUN_PATH: &str = "/dev/net/tun";

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("TAP name {0:?} must be 1 to 15 bytes without NUL or '/'")]
    InvalidName(String),
    #[error("Failed to open {TUN_PATH}")]
    OpenTun(#[source] io::Error),
    #[error("Failed to attach to or create TAP {name} (creating one needs CAP_NET_ADMIN)")]
    Attach {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("Failed to set the vnet header size of TAP {name}")]
    VnetHdrSize {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("Failed to turn off receive offloads of TAP {name}")]
    Offload {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("Failed to create a socket to query interface flags")]
    Socket(#[source] io::Error),
    #[error("Failed to set the MTU of TAP {name} to {mtu}")]
    Mtu {
        name: String,
        mtu: u16,
        #[source]
        source: io::Error,
    },
}

/// An attached TAP interface. Dropping it detaches (and deletes a TAP that
/// is not persistent).
#[derive(Debug)]
pub struct Tap {
    file: File,
    /// Socket for SIOCGIFFLAGS: the tun fd does not answer interface ioctls.
    ctl: OwnedFd,
    name: String,
    /// The interface did not exist before `open`.
    created: bool,
}

/// `struct ifreq` with the interface name filled in.
fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain C data (a name array and a union of integers,
    // arrays and pointers) for which all-zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    req
}

/// Maps a -1 return of a libc call to the errno.
fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

impl Tap {
    /// Attaches to TAP `name`, creating it when absent (module docs).
    pub fn open(name: &str) -> Result<Self, TapError> {
        // IFNAMSIZ includes the terminating NUL.
        if name.is_empty()
            || name.len() >= libc::IFNAMSIZ
            || name.bytes().any(|b| b == 0 || b == b'/')
        {
            return Err(TapError::InvalidName(name.to_owned()));
        }
        let cname =
            std::ffi::CString::new(name).map_err(|_| TapError::InvalidName(name.to_owned()))?;
        // SAFETY: `cname` is a NUL-terminated string that outlives the call.
        let created = unsafe { libc::if_nametoindex(cname.as_ptr()) } == 0;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(TUN_PATH)
            .map_err(TapError::OpenTun)?;
        let fd = file.as_raw_fd();
        let attach = |source| TapError::Attach {
            name: name.to_owned(),
            source,
        };

        let mut req = ifreq(name);
        // Fits c_short: 0x0002 | 0x1000 | 0x4000.
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as i16;
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `req`
        // is and which outlives the call.
        check(unsafe { libc::ioctl(fd, libc::TUNSETIFF, &mut req) }).map_err(attach)?;

        let hdr_len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer, which
        // points at `hdr_len` for the duration of the call.
        check(unsafe { libc::ioctl(fd, libc::TUNSETVNETHDRSZ, &hdr_len) }).map_err(|source| {
            TapError::VnetHdrSize {
                name: name.to_owned(),
                source,
            }
        })?;
        // SAFETY: TUNSETOFFLOAD takes its flags by value; no memory is passed.
        check(unsafe { libc::ioctl(fd, libc::TUNSETOFFLOAD, 0 as libc::c_ulong) }).map_err(
            |source| TapError::Offload {
                name: name.to_owned(),
                source,
            },
        )?;

        // SAFETY: socket() takes no pointers; the result is checked.
        let raw =
            check(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })
                .map_err(TapError::Socket)?;
        // SAFETY: `raw` is a freshly created socket that nothing else owns.
        let ctl = unsafe { OwnedFd::from_raw_fd(raw) };
        log::info!(
            "tap: {} {name}",
            if created { "created" } else { "attached to" }
        );
        Ok(Tap {
            file,
            ctl,
            name: name.to_owned(),
            created,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether `open` created the interface (it goes away with the VMM),
    /// rather than attaching to one that existed.
    pub fn created(&self) -> bool {
        self.created
    }

    /// Sets the interface's MTU (needs CAP_NET_ADMIN).
    pub fn set_mtu(&self, mtu: u16) -> Result<(), TapError> {
        let mut req = ifreq(&self.name);
        req.ifr_ifru.ifru_mtu = libc::c_int::from(mtu);
        // SAFETY: SIOCSIFMTU reads the name and MTU from `req`, a valid
        // `struct ifreq` that outlives the call.
        check(unsafe { libc::ioctl(self.ctl.as_raw_fd(), libc::SIOCSIFMTU as _, &req) })
            .map(drop)
            .map_err(|source| TapError::Mtu {
                name: self.name.clone(),
                mtu,
                source,
            })
    }

    /// The interface flags (IFF_UP, IFF_RUNNING, ...).
    fn flags(&self) -> io::Result<libc::c_int> {
        let mut req = ifreq(&self.name);
        // SAFETY: SIOCGIFFLAGS reads the name from and writes the flags
        // into `req`, a valid `struct ifreq` that outlives the call.
        check(unsafe { libc::ioctl(self.ctl.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) })?;
        // SAFETY: SIOCGIFFLAGS filled in the flags member of the union.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        // The kernel stores the low 16 bits; reinterpret them unsigned.
        Ok(libc::c_int::from(flags as u16))
    }
}

impl FrameBackend for Tap {
    fn send(&self, hdr: &VnetHdr, frame: &[u8]) -> io::Result<()> {
        let head = hdr.to_bytes();
        let iov = [
            libc::iovec {
                iov_base: head.as_ptr() as *mut libc::c_void,
                iov_len: head.len(),
            },
            libc::iovec {
                iov_base: frame.as_ptr() as *mut libc::c_void,
                iov_len: frame.len(),
            },
        ];
        // SAFETY: both iovecs describe live buffers of the given lengths,
        // which writev only reads.
        let written = unsafe { libc::writev(self.file.as_raw_fd(), iov.as_ptr(), 2) };
        let written = usize::try_from(written).map_err(|_| io::Error::last_os_error())?;
        // A TAP takes a whole frame or fails; anything else is a kernel bug.
        if written != head.len().saturating_add(frame.len()) {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!(
                    "TAP took {written} of {} bytes",
                    head.len().saturating_add(frame.len())
                ),
            ));
        }
        Ok(())
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<Option<(VnetHdr, usize)>> {
        let mut head = [0u8; VNET_HDR_LEN];
        let iov = [
            libc::iovec {
                iov_base: head.as_mut_ptr().cast(),
                iov_len: head.len(),
            },
            libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            },
        ];
        // SAFETY: both iovecs describe live, exclusively borrowed buffers
        // of the given lengths, which readv fills.
        let read = unsafe { libc::readv(self.file.as_raw_fd(), iov.as_ptr(), 2) };
        let Ok(read) = usize::try_from(read) else {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(err),
            };
        };
        let len = read.checked_sub(VNET_HDR_LEN).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "TAP read shorter than its vnet header",
            )
        })?;
        Ok(Some((VnetHdr::from_bytes(&head), len)))
    }

    fn rx_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    fn link_up(&self) -> bool {
        match self.flags() {
            Ok(flags) => flags & libc::IFF_UP != 0 && flags & libc::IFF_RUNNING != 0,
            Err(e) => {
                log::warn!("tap: cannot read the flags of {}: {e}", self.name);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! One real TAP, created by the test (root or CAP_NET_ADMIN required:
    //! the test fails rather than skips without them). Frames are checked
    //! on the host side through an AF_PACKET socket bound to the TAP.
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use std::time::{Duration, Instant};

    use super::*;
    use crate::backend::{VNET_HDR_F_NEEDS_CSUM, VNET_HDR_GSO_TCPV4};
    use crate::MAX_FRAME_LEN;

    /// IEEE 802 local experimental ethertype: nothing else on the host uses it.
    const ETH_P_TEST: u16 = 0x88b5;

    fn ioctl_flags(fd: RawFd, name: &str, set: Option<libc::c_short>) -> libc::c_short {
        let mut req = ifreq(name);
        // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write `req`, a valid
        // ifreq that outlives the calls; the flags member is the one the
        // kernel filled in.
        unsafe {
            check(libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut req)).unwrap();
            if let Some(bits) = set {
                req.ifr_ifru.ifru_flags |= bits;
                check(libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &req)).unwrap();
            }
            req.ifr_ifru.ifru_flags
        }
    }

    /// An AF_PACKET socket seeing every frame of interface `name`.
    fn packet_socket(name: &str) -> OwnedFd {
        // SAFETY: plain socket calls; every pointer is to a live local of
        // the size passed, and the new fd is owned by the OwnedFd.
        unsafe {
            let fd = check(libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                i32::from(ETH_P_TEST.to_be()),
            ))
            .unwrap();
            let fd = OwnedFd::from_raw_fd(fd);
            let cname = std::ffi::CString::new(name).unwrap();
            let index = libc::if_nametoindex(cname.as_ptr());
            assert_ne!(index, 0);
            let mut addr: libc::sockaddr_ll = std::mem::zeroed();
            addr.sll_family = libc::AF_PACKET as u16;
            addr.sll_protocol = ETH_P_TEST.to_be();
            addr.sll_ifindex = index as i32;
            check(libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            ))
            .unwrap();
            let tv = libc::timeval {
                tv_sec: 5,
                tv_usec: 0,
            };
            check(libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            ))
            .unwrap();
            fd
        }
    }

    fn test_frame(tag: u8, len: usize) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&[0x02, 0, 0, 0, 0, tag]);
        f.extend_from_slice(&ETH_P_TEST.to_be_bytes());
        f.resize(len, tag);
        f
    }

    /// A TCP/IPv4 frame of `payload` bytes, as a GSO sender leaves it.
    fn tso_frame(payload: usize) -> Vec<u8> {
        let mut f = test_frame(9, 14);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let total = (20 + 20 + payload) as u16;
        f.extend_from_slice(&[0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 6, 0, 0]);
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(&[0x30, 0x39, 0x00, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18]);
        f.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]);
        f.resize(14 + 20 + 20 + payload, 0xab);
        f
    }

    #[test]
    fn real_tap_creates_carries_frames_both_ways_and_reopens() {
        let tun = std::path::Path::new(TUN_PATH);
        assert!(
            tun.exists(),
            "{TUN_PATH} is missing: this test needs the tun driver (modprobe tun)"
        );
        let name = format!("pvt{}t", std::process::id());
        let tap = Tap::open(&name).unwrap_or_else(|e| {
            panic!(
                "creating TAP {name} failed ({e}; {:?}): run as root or with CAP_NET_ADMIN",
                std::error::Error::source(&e)
            )
        });
        assert_eq!(tap.name(), name);
        assert!(tap.created());
        assert!(std::path::Path::new(&format!("/sys/class/net/{name}")).exists());
        tap.set_mtu(9000).unwrap();
        let mtu = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).unwrap();
        assert_eq!(mtu.trim(), "9000");
        assert!(!tap.link_up(), "a new TAP is down");
        assert!(tap.recv(&mut vec![0; MAX_FRAME_LEN]).unwrap().is_none());

        let ctl = tap.ctl.as_raw_fd();
        ioctl_flags(ctl, &name, Some(libc::IFF_UP as libc::c_short));
        assert!(tap.link_up(), "up and running once the admin brings it up");

        // Guest to host: a plain frame, then a TSO frame the kernel must
        // accept although receive offloads are off.
        let sock = packet_socket(&name);
        let sent = test_frame(1, 100);
        tap.send(&VnetHdr::default(), &sent).unwrap();
        let mut got = vec![0u8; 2048];
        // SAFETY: `got` is a live buffer of the length passed.
        let n = unsafe { libc::recv(sock.as_raw_fd(), got.as_mut_ptr().cast(), got.len(), 0) };
        assert_eq!(n, 100, "host saw the frame: {}", io::Error::last_os_error());
        assert_eq!(&got[..100], &sent[..]);
        let gso = VnetHdr {
            flags: VNET_HDR_F_NEEDS_CSUM,
            gso_type: VNET_HDR_GSO_TCPV4,
            hdr_len: 54,
            gso_size: 1000,
            csum_start: 34,
            csum_offset: 16,
        };
        tap.send(&gso, &tso_frame(3000))
            .expect("the kernel takes GSO frames");
        let mut bad = gso;
        bad.csum_start = 3000;
        assert!(
            tap.send(&bad, &tso_frame(100)).is_err(),
            "the kernel checks the header"
        );

        // Host to guest: a frame sent out of the interface arrives whole.
        let out = test_frame(2, 1200);
        // SAFETY: `out` is a live buffer of the length passed.
        let n = unsafe { libc::send(sock.as_raw_fd(), out.as_ptr().cast(), out.len(), 0) };
        assert_eq!(n, 1200);
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        let deadline = Instant::now() + Duration::from_secs(5);
        let (hdr, len) = loop {
            // The host may also send its own traffic (IPv6 autoconf) out.
            if let Some((hdr, len)) = tap.recv(&mut buf).unwrap() {
                if buf[12..14] == ETH_P_TEST.to_be_bytes() {
                    break (hdr, len);
                }
            }
            assert!(
                Instant::now() < deadline,
                "frame did not come out of the TAP"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(&buf[..len], &out[..]);
        assert!(hdr.is_plain());

        // An existing (persistent) TAP is opened, not recreated.
        // SAFETY: TUNSETPERSIST takes its argument by value.
        unsafe {
            check(libc::ioctl(
                tap.file.as_raw_fd(),
                libc::TUNSETPERSIST,
                1 as libc::c_ulong,
            ))
            .unwrap();
        }
        drop(tap);
        assert!(std::path::Path::new(&format!("/sys/class/net/{name}")).exists());
        let again = Tap::open(&name).unwrap();
        assert!(!again.created());
        assert_ne!(
            ioctl_flags(again.ctl.as_raw_fd(), &name, None) & libc::IFF_UP as libc::c_short,
            0,
            "same interface, still up"
        );
        // SAFETY: TUNSETPERSIST takes its argument by value.
        unsafe {
            check(libc::ioctl(
                again.file.as_raw_fd(),
                libc::TUNSETPERSIST,
                0 as libc::c_ulong,
            ))
            .unwrap();
        }
        drop(again);
        assert!(!std::path::Path::new(&format!("/sys/class/net/{name}")).exists());

        assert!(matches!(
            Tap::open("a-name-far-too-long"),
            Err(TapError::InvalidName(_))
        ));
    }
}

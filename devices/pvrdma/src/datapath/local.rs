// SPDX-License-Identifier: Apache-2.0
//! The same-host path: VMMs on one host exchange RoCE v2 frames through
//! shared memory instead of their TAPs, the host bridge and its network
//! stack, as VMware's PVRDMA does between VMs of one ESXi host. It is
//! chosen automatically per frame: every device binds a control socket
//! `<dir>/<mac>.sock` for its port's MAC, and a frame whose destination
//! MAC has a socket there goes through shared memory; everything else
//! takes the wire. The frames are the same RoCE v2 frames, so both paths
//! are received alike (and a peer is never trusted on either).
//!
//! On its first frame for a peer, a sender creates a ring ([`ShmRing`],
//! one per direction and peer) in a sealed memfd and hands it over on the
//! peer's control socket (SCM_RIGHTS), with an eventfd the sender kicks
//! the consumer by when it said it was going to sleep. Frames are then
//! memory copies into the ring and, now and then, an eventfd write: the
//! control socket carries only ring hand-overs, BYEs and liveness probes.
//!
//! The kick eventfd is shared with a peer that is not trusted, and an
//! eventfd's blocking mode and counter belong to both holders: a peer
//! could make a write of 1 block us, or a read. So the sender creates it
//! with a count of 1 and kicks by writing 0, which never blocks yet wakes
//! the waiters; the consumer never reads it and watches it edge-triggered,
//! which reports every such write. Frames a full ring refuses wait in a
//! bounded backlog per peer, pushed in order as the consumer makes room
//! (the worker polls for that on a short timer, never blocking); only a
//! full backlog,
//! or a consumer that makes no room for [`ROOM_WAIT`], drops frames (RC
//! retransmits, as on a congested wire, but a lost READ response costs
//! the whole READ again). A peer that is gone (its socket refuses) makes
//! the sender forget the ring and use the wire; an eventfd cannot tell,
//! so a kick the consumer has not answered after [`ANSWER_WAIT`], or a
//! full ring, has the sender ask the socket.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdma_transport::packet::{build_in_buffer, parse_unsealed, Packet, ParseError, Payload, Run};
use rdma_transport::req::MAX_DESCRIBED_SEGMENT;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::shm_ring::{self, NotWritten, Record, ShmRing};
use super::view::{self, Described, View};

/// What became of a frame offered to the channel.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Delivered to a VMM of this host.
    Local,
    /// A local VMM owns the MAC but its ring is full: the frame is lost.
    Dropped,
    /// No VMM of this host owns the MAC: use the wire.
    NotLocal,
}

/// What became of a frame offered to be written in place in a ring
/// ([`LocalChannel::push_with`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum InPlace {
    /// Written and published.
    Pushed,
    /// Its writer failed: nothing was sent.
    NotWritten,
    /// Not now (no accepted ring, frames wait before it, or no room):
    /// build it elsewhere and [`LocalChannel::send`] it.
    Elsewhere,
}

/// Which of the channel's descriptors woke the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The control socket: rings handed over, kicks.
    Socket,
    /// The re-wake of a batch that left frames in the rings.
    Again,
    /// A peer's kick eventfd (edge-triggered, nothing to read).
    Ring,
}

/// A change to the kick eventfds the worker watches (edge-triggered),
/// in the order they happened.
#[derive(Debug)]
pub(crate) enum KickWatch {
    /// A ring's kick arrived; it stays open while the ring lives.
    Add(RawFd),
    /// A ring went: unwatch, then close. A descriptor the peer still
    /// holds stays in an epoll set after our close, so unwatching comes
    /// first.
    Remove(File),
}

/// Frames received in one batch: read in place in their rings (the
/// engine places their payloads straight from there: a frame's only copy
/// on our side), or, for a frame that wraps around a ring's end, copied
/// into a buffer the worker reuses. The records stay the batch's (the
/// producer leaves them alone) until [`Batch::release`].
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// Copies of frames that wrap; its length is the most a batch used,
    /// not this one's (no pass over the bytes to empty it).
    data: Vec<u8>,
    /// The frames, in order, and what each is.
    frames: Vec<(Held, Kind)>,
    /// The rings read, how far, and the view of their sender's memory.
    rings: Vec<(Arc<ShmRing>, u64, Option<Arc<View>>)>,
    /// The runs of the batch's described records.
    runs: Vec<Run>,
    /// Bytes of the frames.
    bytes: usize,
}

/// What a record of a [`Batch`] is.
#[derive(Debug)]
enum Kind {
    Frame,
    /// A described record (see `view`) of the ring `Batch::rings[ring]`.
    Described {
        ring: usize,
        d: Described,
    },
    /// A record that is neither: dropped as a bad frame.
    Bad,
}

/// Where a frame of a [`Batch`] is.
#[derive(Debug)]
enum Held {
    /// In the ring `Batch::rings[ring]`.
    InRing { ring: usize, record: Record },
    /// In `Batch::data[start..end]`.
    Copied { start: usize, end: usize },
}

impl Batch {
    /// The bytes of a record.
    fn record(&self, held: &Held) -> &[u8] {
        match held {
            Held::InRing { ring, record } => {
                self.rings.get(*ring).and_then(|(r, _, _)| r.frame(record))
            }
            Held::Copied { start, end } => self.data.get(*start..*end),
        }
        .unwrap_or_default()
    }

    /// What `record` of ring `ring` is: a frame, a described record (only
    /// from a peer whose view we took: `view`), or neither.
    fn kind_of(record: &[u8], ring: usize, view: bool, runs: &mut Vec<Run>) -> Kind {
        if !view::is_described(record) {
            return Kind::Frame;
        }
        match view.then(|| view::read_described(record, runs)).flatten() {
            Some(d) => Kind::Described { ring, d },
            None => Kind::Bad,
        }
    }

    /// The records, in order.
    #[cfg(test)]
    pub(crate) fn frames(&self) -> impl Iterator<Item = &[u8]> {
        self.frames.iter().map(|(h, _)| self.record(h))
    }

    /// The packets, in order: frames parsed, and described records with
    /// their payload in their sender's memory.
    pub(crate) fn packets(&self) -> impl Iterator<Item = Result<Packet<'_>, ParseError>> {
        self.frames.iter().map(|(h, kind)| {
            let record = self.record(h);
            match kind {
                Kind::Frame => parse_unsealed(record),
                Kind::Described { ring, d } => self.described(record, *ring, d),
                Kind::Bad => Err(ParseError::Length),
            }
        })
    }

    /// The packet of described record `record` of ring `ring`: its frame,
    /// which must carry no payload of its own but have an opcode with one,
    /// and the runs, which must lie in the view and add up to the length
    /// the record gives (at most a segment's); else the peer corrupted it.
    fn described<'b>(
        &'b self,
        record: &'b [u8],
        ring: usize,
        d: &Described,
    ) -> Result<Packet<'b>, ParseError> {
        let view = self.rings.get(ring).and_then(|(_, _, v)| v.as_ref());
        let runs = self.runs.get(d.runs.clone());
        let (Some(view), Some(runs)) = (view, runs) else {
            return Err(ParseError::Length);
        };
        let mut pkt = parse_unsealed(record.get(d.frame..).unwrap_or_default())?;
        let payload = Payload::runs(view.bytes(), runs, MAX_DESCRIBED_SEGMENT as usize)
            .filter(|p| p.len() == d.payload && pkt.payload.is_empty());
        let with_payload = pkt.opcode.is(rdma_transport::opcode::OpClass::PAYLOAD);
        match payload {
            Some(p) if with_payload => {
                pkt.payload = p;
                pkt.hdrs.bth.pad = (d.payload.wrapping_neg() & 3) as u8;
                Ok(pkt)
            }
            _ => Err(ParseError::Length),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.frames.len()
    }

    /// Of [`Self::len`]: the described records (payloads in their
    /// senders' views).
    pub(crate) fn described_count(&self) -> usize {
        self.frames
            .iter()
            .filter(|(_, k)| matches!(k, Kind::Described { .. }))
            .count()
    }

    /// Hands the records read back to their producers: the frames are
    /// done with.
    pub(crate) fn release(&mut self) {
        for (ring, pos, _) in self.rings.drain(..) {
            ring.release(pos);
        }
        self.frames.clear();
        self.runs.clear();
        self.bytes = 0;
    }

    /// Whether the batch holds all it may.
    fn full(&self, max: usize) -> bool {
        self.len() >= max || self.bytes >= BATCH_BYTES
    }
}

/// Bytes a [`Batch`] keeps between batches.
const BATCH_KEEP: usize = 1 << 20;
/// Bytes of frames after which a batch ends: its frames are placed while
/// their copy is still in the CPU's cache.
const BATCH_BYTES: usize = 256 << 10;

/// Bytes of each ring a sender creates: 4 MiB holds a few thousand frames
/// of 1 KiB, several RC windows.
const RING_BYTES: usize = 4 << 20;
/// Frames one peer's backlog holds (a few RC windows of 1 KiB frames),
/// and bytes (a few of segments).
const BACKLOG_FRAMES: usize = 2048;
const BACKLOG_BYTES: usize = 8 << 20;
/// Longest the oldest frame of a backlog waits for room before the
/// backlog is dropped: its consumer stalled (paused, migrating, gone).
const ROOM_WAIT: Duration = Duration::from_millis(100);
/// Longest DESTROY_MR waits for same-host peers to finish copying from
/// our memory ([`LocalChannel::settle`]); a peer reads its ring within
/// microseconds unless it is paused or gone.
pub(crate) const SETTLE_WAIT: Duration = Duration::from_millis(100);
/// Peers (either direction) beyond which new ones are refused.
const MAX_PEERS: usize = 256;
/// The MR of a described record whose MRs are not known (one pushed from
/// a backlog): it counts as reading from every MR.
const ANY_MR: u32 = u32::MAX;
/// Control messages read per wake-up.
const CONTROL_BATCH: usize = 64;
/// Longest a control message (ring hand-over, probe) may wait for room
/// in the peer's socket queue.
const SEND_WAIT: Duration = Duration::from_millis(5);
/// Longest a kicked consumer may leave its ring untouched before the
/// sender asks its socket whether it is still there.
const ANSWER_WAIT: Duration = Duration::from_millis(10);
/// Control messages: a tag, then for SETUP the ring size, the sender's
/// MAC and the sender's instance (the ring's memfd and the kick eventfd
/// ride along as SCM_RIGHTS); BYE (a VMM leaving, e.g. after migrating its
/// VM away) has the same layout without them. A PROBE only asks whether
/// the socket's owner is there.
///
/// SETUP's tag is the channel's version: what the rings carry. Version 4
/// carries segments (several MTUs of a message in one frame), which a
/// VMM of version 3 would refuse as malformed packets, failing the QP;
/// version 5 adds the ring's skip records (`shm_ring::SKIP`), which a
/// VMM of version 4 would take for a corrupt ring; version 6 described
/// segments of up to `rdma_transport::req::MAX_DESCRIBED_SEGMENT` bytes,
/// which a VMM of version 5 would drop as too long, failing the QP; so
/// the consumer answers ACCEPT (with the ring sender's instance) once it
/// maps a ring, or REFUSE for a SETUP of another version (logged on both
/// sides), and the sender sends segments only into an accepted ring and
/// takes the wire for a peer that refused its ring or never read it (an
/// older VMM ignores both the SETUP and the answer).
const SETUP: &[u8; 16] = b"PVRDMA-SHM-RING6";
/// What every version's SETUP tag starts with.
const SETUP_ANY: &[u8; 15] = b"PVRDMA-SHM-RING";
const ACCEPT: &[u8; 16] = b"PVRDMA-SHM-TAKEN";
const REFUSE: &[u8; 16] = b"PVRDMA-SHM-REFUS";
const PROBE: &[u8; 16] = b"PVRDMA-SHM-PROBE";
const BYE: &[u8; 16] = b"PVRDMA-SHM-BYE-2";
const MSG_LEN: usize = 16 + 4 + 6 + 8;
/// An ACCEPT's size field: the consumer mapped the view of the sender's
/// memory that came with the ring (both ends `share_memory=on`), so the
/// sender may send described records (see `view`).
const VIEW_TAKEN: u32 = 1;
/// Longest a ring may go neither accepted nor read before its sender
/// takes the peer for one that does not speak our version (generous: a
/// worker of a nested test host can be descheduled for a while).
const ACCEPT_WAIT: Duration = Duration::from_secs(2);

/// A SETUP or BYE message.
fn control(tag: &[u8; 16], size: u32, mac: [u8; 6], instance: u64) -> [u8; MSG_LEN] {
    let mut msg = [0u8; MSG_LEN];
    let (t, rest) = msg.split_at_mut(16);
    t.copy_from_slice(tag);
    let (s, rest) = rest.split_at_mut(4);
    s.copy_from_slice(&size.to_le_bytes());
    let (m, i) = rest.split_at_mut(6);
    m.copy_from_slice(&mac);
    i.copy_from_slice(&instance.to_le_bytes());
    msg
}

/// The fields of a well-formed SETUP or BYE: tag, ring size, MAC, instance.
fn parse_control(msg: &[u8]) -> Option<(&[u8; 16], u32, [u8; 6], u64)> {
    let (tag, rest) = msg.split_first_chunk::<16>()?;
    let (size, rest) = rest.split_first_chunk::<4>()?;
    let (mac, rest) = rest.split_first_chunk::<6>()?;
    let instance = <[u8; 8]>::try_from(rest).ok()?;
    Some((
        tag,
        u32::from_le_bytes(*size),
        *mac,
        u64::from_le_bytes(instance),
    ))
}

pub(crate) fn sock_name(mac: [u8; 6]) -> String {
    let [a, b, c, d, e, f] = mac;
    format!("{a:02x}-{b:02x}-{c:02x}-{d:02x}-{e:02x}-{f:02x}.sock")
}

/// A destination's socket file waits as `<mac>.sock.incoming-<pid>` until
/// its VM runs ([`LocalChannel::claim`]).
const INCOMING: &str = ".incoming-";

/// Removes the waiting socket files of `mac` that nobody answers on: left
/// by a destination VMM that was killed before its VM ran there (a VMM
/// that exits removes its own).
fn remove_stale_incoming(dir: &Path, mac: [u8; 6]) {
    let prefix = format!("{}{INCOMING}", sock_name(mac));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let path = entry.path();
        // Only a file that surely refuses: a failed probe proves nothing.
        if matches!(answers(&path), Ok(false)) {
            log::info!(
                "pvrdma: removing {}, left by a VMM that is gone",
                path.display()
            );
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Checks that `dir` is a directory of our effective user that nobody
/// else may enter: who can reach its sockets can join the channel (hand
/// us rings, say BYE for a MAC), so its mode is the access check.
fn private_dir(dir: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != euid || meta.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} must be a directory of uid {euid} with mode 0700 (is uid {}, mode {:o})",
                dir.display(),
                meta.uid(),
                meta.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Whether a VMM is bound to the socket file at `path` (a file left by one
/// that is gone refuses connections).
fn answers(path: &Path) -> io::Result<bool> {
    Ok(UnixDatagram::unbound()?.connect(path).is_ok())
}

/// Our ring towards one peer.
#[derive(Debug)]
struct Peer {
    sock: UnixDatagram,
    ring: ShmRing,
    /// Wakes the consumer (written 0, see the module's doc).
    kick: EventFd,
    /// The consumer said it was going to sleep and frames went in since:
    /// it is owed a kick, given by [`LocalChannel::notify`].
    owed: bool,
    /// When we kicked a consumer that has not read since, and where its
    /// tail was then.
    unanswered: Option<(Instant, u64)>,
    /// When we handed the ring over, until the consumer accepts it (an
    /// ACCEPT, or it reads from it): until then no segments go in.
    offered: Option<Instant>,
    /// The instance owning the MAC's socket when we connected.
    instance: u64,
    /// The consumer took the view of our memory: frames with payload go
    /// as described records.
    shares: bool,
    /// Where each described record in the ring ends, oldest first, once
    /// per MR (index) it reads from, [`ANY_MR`] for one whose MRs are not
    /// known: until the consumer's tail passes that position, it may still
    /// copy from the MR.
    described: VecDeque<(u64, u32)>,
    /// Frames the full ring refused, oldest first.
    backlog: VecDeque<Vec<u8>>,
    /// Their bytes.
    backlog_bytes: usize,
    /// When the oldest of them was refused.
    since: Option<Instant>,
}

impl Peer {
    /// Whether the consumer's VMM is still there (not gone or replaced).
    fn probe(&self) -> bool {
        match self.sock.send(PROBE) {
            Ok(_) => true,
            // Its queue is full: it is there, and busy.
            Err(e) => matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
        }
    }

    /// Wakes the consumer if it is owed a kick; whether it was.
    fn notify(&mut self) -> bool {
        if !std::mem::take(&mut self.owed) {
            return false;
        }
        // Adding 0 never blocks, whatever the peer did to the eventfd.
        let _ = self.kick.write(0);
        if self.unanswered.is_none() {
            self.unanswered = Some((Instant::now(), self.ring.tail()));
        }
        true
    }

    /// Notes that the record just pushed reads from the MRs (indexes)
    /// `mrs`, and forgets the records the consumer has read past.
    fn note_described(&mut self, mrs: impl IntoIterator<Item = u32>) {
        self.forget_read();
        let end = self.ring.head();
        self.described.extend(mrs.into_iter().map(|mr| (end, mr)));
    }

    /// Forgets the described records the consumer has read past.
    fn forget_read(&mut self) {
        let tail = self.ring.tail();
        while self
            .described
            .front()
            .is_some_and(|&(end, _)| read_past(tail, end))
        {
            self.described.pop_front();
        }
    }

    /// Whether the consumer may still copy from MR `mr` (an index) for a
    /// described record of ours.
    fn reads_from(&self, mr: u32) -> bool {
        let tail = self.ring.tail();
        self.described
            .iter()
            .any(|&(end, m)| (m == mr || m == ANY_MR) && !read_past(tail, end))
    }

    /// Whether the backlog holds all it may.
    fn backlog_full(&self) -> bool {
        self.backlog.len() >= BACKLOG_FRAMES || self.backlog_bytes >= BACKLOG_BYTES
    }

    /// Whether the consumer took the ring: it said so, or it reads it.
    fn accepted(&mut self) -> bool {
        if self.offered.is_some() && self.ring.tail() != 0 {
            self.offered = None;
        }
        self.offered.is_none()
    }

    /// False when a kick went unanswered for [`ANSWER_WAIT`] and the
    /// consumer's socket says it is gone.
    fn alive(&mut self) -> bool {
        let Some((kicked, tail)) = self.unanswered else {
            return true;
        };
        if self.ring.tail() != tail {
            self.unanswered = None;
            return true;
        }
        let now = Instant::now();
        if now.saturating_duration_since(kicked) <= ANSWER_WAIT {
            return true;
        }
        self.unanswered = Some((now, tail));
        self.probe()
    }

    /// Pushes backlogged frames while the ring has room; drops them all
    /// once the oldest waited [`ROOM_WAIT`]. Returns the frames dropped.
    fn flush(&mut self, now: Instant) -> usize {
        while let Some(waiting) = self.backlog.front().and_then(|f| self.ring.push(f)) {
            self.owed |= waiting;
            if self.backlog.front().is_some_and(|f| view::is_described(f)) {
                self.note_described([ANY_MR]);
            }
            let len = self.backlog.pop_front().map_or(0, |f| f.len());
            self.backlog_bytes = self.backlog_bytes.saturating_sub(len);
            self.since = Some(now);
        }
        if self.backlog.is_empty() {
            self.since = None;
        } else if self
            .since
            .is_some_and(|t| now.saturating_duration_since(t) > ROOM_WAIT)
        {
            self.since = None;
            self.backlog_bytes = 0;
            return std::mem::take(&mut self.backlog).len();
        }
        0
    }
}

/// Whether a consumer whose tail is at `tail` has read past ring position
/// `end`. Positions only grow; the tail is the peer's say, never ahead
/// of what we wrote unless it lies (then it only fools itself).
fn read_past(tail: u64, end: u64) -> bool {
    tail.wrapping_sub(end) as i64 >= 0
}

/// A ring a peer sends us frames in.
#[derive(Debug)]
struct Inbound {
    ring: Arc<ShmRing>,
    /// The instance that handed it over.
    instance: u64,
    /// The peer's kick, watched by the worker.
    kick: File,
    /// The peer's memory, if it shares it and we took it.
    view: Option<Arc<View>>,
}

/// Whether `file` is an eventfd: an anonymous inode like `ours` (one
/// eventfd of our own) that takes a write of 0 (timerfds, signalfds,
/// epoll and the other anonymous inodes refuse writes; pipes, sockets and
/// files are not anonymous inodes). The write wakes nobody of ours.
fn is_eventfd(file: &File, ours: &EventFd) -> bool {
    // SAFETY: `ours` is a valid eventfd for the duration of the call and
    // outlives the File, which does not close it (ManuallyDrop).
    let ours = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(ours.as_raw_fd()) });
    let same_inode = match (file.metadata(), ours.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    same_inode && (&*file).write(&0u64.to_ne_bytes()).is_ok_and(|n| n == 8)
}

/// A new ring towards a peer, its memfd and its kick (written to 1, see
/// the module doc), not handed over yet.
#[derive(Debug)]
struct Fresh {
    ring: ShmRing,
    file: File,
    kick: EventFd,
}

impl Fresh {
    fn new() -> io::Result<Self> {
        let (ring, file) = shm_ring::create(RING_BYTES)?;
        // A count of 1 that nobody reads: kicks write 0 (module doc).
        let kick = EventFd::new(EFD_NONBLOCK)?;
        kick.write(1)?;
        Ok(Self { ring, file, kick })
    }
}

/// One device's end of the same-host channel.
#[derive(Debug)]
pub(crate) struct LocalChannel {
    /// Bound to our socket file, non-blocking: rings and kicks from other
    /// VMMs.
    sock: UnixDatagram,
    /// Wakes the worker again when a batch left frames in the rings.
    again: EventFd,
    mac: [u8; 6],
    peers: Mutex<BTreeMap<[u8; 6], Peer>>,
    /// Rings other VMMs send us frames in, by their MAC.
    inbound: Mutex<BTreeMap<[u8; 6], Inbound>>,
    /// Peers that refused our ring, or never took it, by MAC: the
    /// instance that did (a new owner of the MAC is offered a ring again).
    refused: Mutex<BTreeMap<[u8; 6], u64>>,
    /// Kick eventfds for the worker to watch or unwatch.
    watch: Mutex<Vec<KickWatch>>,
    dir: PathBuf,
    /// The MAC's socket path, `<dir>/<mac>.sock`.
    home: PathBuf,
    /// Where our socket file is until [`LocalChannel::claim`] moves it to
    /// `home`; `None` once it is there.
    staged: Mutex<Option<PathBuf>>,
    /// A ring made ahead for the first peer: a channel bound for an
    /// incoming migration offers its peers rings when the VM starts here,
    /// after the hand-over, where making one (a sealed memfd, mapped) is
    /// time the guest waits.
    spare: Mutex<Option<Fresh>>,
    /// Which VMM owns a MAC: the inode of the socket file it bound. While
    /// a VM migrates, its MAC has two owners for a moment (the source
    /// lingers, the destination already sends), and a message must only
    /// touch the rings of the instance that sent it. It also tells whether
    /// our socket file is still ours to remove.
    inode: u64,
    /// A read-only descriptor of our guest RAM, handed to peers with our
    /// rings (`share_memory=on`); with it, views from peers are taken.
    view: Option<File>,
}

impl LocalChannel {
    /// Binds the control socket of `mac` in `dir` (created 0700 if
    /// missing; an existing one must be ours and closed to everyone else,
    /// see [`private_dir`]). A socket file left by a VMM that is gone is
    /// replaced; one that answers belongs to a running VMM with the same
    /// MAC, an error — unless `take_over`: the VM is migrating here from
    /// that VMM. Then our socket waits beside the MAC's until
    /// [`LocalChannel::claim`] (the VM runs here): a migration that fails
    /// leaves the source's in place.
    pub(crate) fn bind(dir: &Path, mac: [u8; 6], take_over: bool) -> io::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        private_dir(dir)?;
        let home = dir.join(sock_name(mac));
        let own = if take_over {
            remove_stale_incoming(dir, mac);
            dir.join(format!(
                "{}{INCOMING}{}",
                sock_name(mac),
                std::process::id()
            ))
        } else {
            home.clone()
        };
        if home.exists() && !take_over && answers(&home)? {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} belongs to a running VMM (same MAC?)", home.display()),
            ));
        }
        if own.exists() {
            std::fs::remove_file(&own)?;
        }
        let sock = UnixDatagram::bind(&own)?;
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o600))?;
        let inode = std::fs::metadata(&own)?.ino();
        sock.set_nonblocking(true)?;
        Ok(Self {
            sock,
            again: EventFd::new(EFD_NONBLOCK)?,
            mac,
            peers: Mutex::new(BTreeMap::new()),
            inbound: Mutex::new(BTreeMap::new()),
            refused: Mutex::new(BTreeMap::new()),
            watch: Mutex::new(Vec::new()),
            dir: dir.to_path_buf(),
            // Best effort: without it the first peer's ring is made later.
            spare: Mutex::new(take_over.then(Fresh::new).and_then(Result::ok)),
            staged: Mutex::new((own != home).then_some(own)),
            home,
            inode,
            view: None,
        })
    }

    /// Shares our memory with the peers that share theirs: `view` (a
    /// read-only descriptor of our guest RAM's memfd, see
    /// [`view::read_only`]) goes with each ring we hand over, and views
    /// that come with peers' rings are mapped.
    pub(crate) fn share(&mut self, view: File) {
        self.view = Some(view);
    }

    /// Makes our socket the MAC's (atomically replacing a migration
    /// source's): from now on peers that connect reach us. Nothing to do
    /// unless bound with `take_over`.
    pub(crate) fn claim(&self) -> io::Result<()> {
        let mut staged = self.staged.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(path) = staged.as_ref() {
            std::fs::rename(path, &self.home)?;
            *staged = None;
        }
        Ok(())
    }

    /// Where our socket file is now.
    fn own(&self) -> PathBuf {
        self.staged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| self.home.clone())
    }

    /// What the worker watches (level-triggered), and which [`Wake`]
    /// each is; the kicks of peers' rings come through
    /// [`LocalChannel::take_watch`].
    pub(crate) fn fds(&self) -> [(RawFd, Wake); 2] {
        [
            (self.sock.as_raw_fd(), Wake::Socket),
            (self.again.as_raw_fd(), Wake::Again),
        ]
    }

    /// The kick eventfds to watch and unwatch since the last call, in order.
    pub(crate) fn take_watch(&self) -> Vec<KickWatch> {
        std::mem::take(&mut *self.watch.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Drops an inbound ring; its kick is unwatched before it closes.
    fn retire(&self, ring: Option<Inbound>) {
        if let Some(r) = ring {
            let mut watch = self.watch.lock().unwrap_or_else(PoisonError::into_inner);
            watch.push(KickWatch::Remove(r.kick));
        }
    }

    /// A ring towards the VMM owning `mac`, handed over on its socket.
    fn connect(&self, mac: [u8; 6]) -> Option<Peer> {
        let path = self.dir.join(sock_name(mac));
        if path == self.home {
            return None;
        }
        let instance = std::fs::metadata(&path).ok()?.ino();
        let refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        if refused.get(&mac) == Some(&instance) {
            return None;
        }
        drop(refused);
        let sock = UnixDatagram::unbound().ok()?;
        sock.connect(&path).ok()?;
        sock.set_write_timeout(Some(SEND_WAIT)).ok()?;
        let spare = self
            .spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Fresh { ring, file, kick } = spare.map_or_else(Fresh::new, Ok).ok()?;
        let msg = control(SETUP, RING_BYTES as u32, self.mac, self.inode);
        let mut fds = vec![file.as_raw_fd(), kick.as_raw_fd()];
        fds.extend(self.view.as_ref().map(File::as_raw_fd));
        sock.send_with_fds(&[&msg[..]], &fds).ok()?;
        Some(Peer {
            sock,
            ring,
            kick,
            owed: false,
            unanswered: None,
            offered: Some(Instant::now()),
            instance,
            shares: false,
            described: VecDeque::new(),
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            since: None,
        })
    }

    /// Our ring towards `mac`, handed over now if there is none yet; `None`
    /// when no VMM of this host owns the MAC (or too many peers).
    fn peer<'p>(
        &self,
        peers: &'p mut BTreeMap<[u8; 6], Peer>,
        mac: [u8; 6],
    ) -> Option<&'p mut Peer> {
        if !peers.contains_key(&mac) {
            if peers.len() >= MAX_PEERS {
                return None;
            }
            peers.insert(mac, self.connect(mac)?);
        }
        peers.get_mut(&mac)
    }

    /// Hands a ring to the VMM owning each of `macs` before any frame needs
    /// one. After a migration our SETUP tells those peers at once that the
    /// VM runs here, so that their retransmissions stop going into the
    /// source's ring while the VM has nothing to send them.
    pub(crate) fn announce(&self, macs: impl IntoIterator<Item = [u8; 6]>) {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        for mac in macs {
            let _ = self.peer(&mut peers, mac);
        }
    }

    /// Offers `frame` to the VMM owning `dst_mac` on this host: into its
    /// ring, or behind the frames already waiting for room there.
    pub(crate) fn send(&self, dst_mac: [u8; 6], frame: &[u8]) -> Sent {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(peer) = self.peer(&mut peers, dst_mac) else {
            return Sent::NotLocal;
        };
        if !peer.alive() {
            // The peer is gone (or was replaced): forget its ring.
            peers.remove(&dst_mac);
            return Sent::NotLocal;
        }
        if !peer.accepted() && peer.offered.is_some_and(|t| t.elapsed() > ACCEPT_WAIT) {
            // An older VMM ignores our SETUP: it never reads the ring.
            self.give_up(dst_mac, peer, "never took our ring");
            peers.remove(&dst_mac);
            return Sent::NotLocal;
        }
        let pushed = if peer.backlog.is_empty() {
            peer.ring.push(frame)
        } else {
            None
        };
        match pushed {
            Some(waiting) => {
                peer.owed |= waiting;
                Sent::Local
            }
            // The first refusal, and a full backlog, ask whether the peer
            // is still there: a full ring may belong to one that is gone
            // (migrated away without ever sleeping); then the frame takes
            // the wire and the next one finds the MAC's new owner.
            None if (peer.backlog.is_empty() || peer.backlog_full()) && !peer.probe() => {
                peers.remove(&dst_mac);
                Sent::NotLocal
            }
            None if peer.backlog_full() => Sent::Dropped,
            None => {
                if peer.backlog.is_empty() {
                    peer.since = Some(Instant::now());
                }
                // The worker pushes it later (see `backlogged`).
                peer.backlog.push_back(frame.to_vec());
                peer.backlog_bytes = peer.backlog_bytes.saturating_add(frame.len());
                Sent::Local
            }
        }
    }

    /// Whether frames to `mac` go into a ring of ours: a VMM of this host
    /// owns the MAC, so a QP towards it may send segments (several MTUs
    /// of a message in one frame, see `rdma_transport::req::MAX_SEGMENT`).
    pub(crate) fn has_ring(&self, mac: [u8; 6]) -> bool {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        peers.get_mut(&mac).is_some_and(Peer::accepted)
    }

    /// Stops offering rings to the instance of `mac` that `peer` goes to
    /// (it refused ours, or never took it): its frames take the wire.
    fn give_up(&self, mac: [u8; 6], peer: &Peer, why: &str) {
        log::warn!(
            "pvrdma: same-host channel: {} (instance {}) {why} (our version: {}); \
             frames to it take the wire",
            sock_name(mac),
            peer.instance,
            String::from_utf8_lossy(SETUP)
        );
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        if refused.len() >= MAX_PEERS {
            refused.clear();
        }
        refused.insert(mac, peer.instance);
    }

    /// Offers a frame of `len` bytes for `dst_mac`, to be written by
    /// `write` straight into its ring: the payload's only copy on our side.
    /// Only into an accepted ring with room and nothing waiting before it.
    pub(crate) fn push_with(
        &self,
        dst_mac: [u8; 6],
        len: usize,
        write: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> InPlace {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(peer) = peers.get_mut(&dst_mac) else {
            return InPlace::Elsewhere;
        };
        if !peer.backlog.is_empty() || !peer.accepted() || !peer.alive() {
            return InPlace::Elsewhere;
        }
        match peer.ring.push_with(len, write) {
            Ok(Some(waiting)) => {
                peer.owed |= waiting;
                InPlace::Pushed
            }
            Ok(None) => InPlace::Elsewhere,
            Err(NotWritten) => InPlace::NotWritten,
        }
    }

    /// Whether the peer owning `mac` took the view of our memory with our
    /// ring: frames with payload to it may go as described records.
    pub(crate) fn shares_with(&self, mac: [u8; 6]) -> bool {
        // Without our view (the default) no peer has it: no lock per QP run.
        if self.view.is_none() {
            return false;
        }
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        peers
            .get_mut(&mac)
            .is_some_and(|p| p.shares && p.accepted())
    }

    /// Offers the described record of `len` bytes that `write` writes
    /// (see `view`) to the VMM owning `dst_mac`: in place in its ring, else
    /// as [`LocalChannel::send`] does a frame (the backlog; never the wire,
    /// where it means nothing: `NotLocal` is a lost frame).
    pub(crate) fn send_described(
        &self,
        dst_mac: [u8; 6],
        len: usize,
        mrs: impl IntoIterator<Item = u32>,
        write: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Sent {
        match self.push_with(dst_mac, len, write) {
            InPlace::Pushed => {
                let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(p) = peers.get_mut(&dst_mac) {
                    p.note_described(mrs);
                }
                Sent::Local
            }
            InPlace::NotWritten => Sent::Dropped,
            InPlace::Elsewhere => match build_in_buffer(len, write) {
                Some(record) => self.send(dst_mac, &record),
                None => Sent::Dropped,
            },
        }
    }

    /// Waits, up to `wait`, until no peer may still copy from MR `mr` (an
    /// index) for a described record: each has read past those of ours
    /// that read from it, and described records still in a backlog (whose
    /// MRs are not noted) are dropped (RC sends them again, from the MRs
    /// as they are then). Called before an MR goes or changes its pages
    /// (DESTROY_MR, LOCAL_INV, SEND_WITH_INV, REG_MR), so that pages the
    /// guest may reuse are not read for it afterwards; without
    /// `share_memory`, or with no record of that MR unread (the usual
    /// case: a ULP changes an MR once the transfers from it completed),
    /// there is nothing to wait for. A peer that does not get there in
    /// time is forgotten and told BYE: it drops the ring, with what is
    /// left in it, and its QPs' frames from us take the wire until a new
    /// ring is offered. Returns the peers forgotten.
    pub(crate) fn settle(&self, mr: u32, wait: Duration) -> usize {
        if self.view.is_none() {
            return 0;
        }
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        for p in peers.values_mut() {
            let before = p.backlog.len();
            p.backlog.retain(|f| !view::is_described(f));
            if p.backlog.len() != before {
                p.backlog_bytes = p.backlog.iter().map(Vec::len).sum();
            }
        }
        if !peers.values().any(|p| p.reads_from(mr)) {
            return 0;
        }
        // Called inside the worker's run, before its kicks: a peer that went
        // to sleep would sleep through the wait and be dropped.
        for p in peers.values_mut() {
            p.notify();
        }
        let start = Instant::now();
        while peers.values().any(|p| p.reads_from(mr)) && start.elapsed() < wait {
            std::thread::yield_now();
        }
        let stuck: Vec<[u8; 6]> = peers
            .iter()
            .filter(|(_, p)| p.reads_from(mr))
            .map(|(mac, _)| *mac)
            .collect();
        let bye = control(BYE, 0, self.mac, self.inode);
        for mac in &stuck {
            if let Some(p) = peers.remove(mac) {
                log::warn!(
                    "pvrdma: same-host channel: {} did not read its ring in {wait:?}; dropped",
                    sock_name(*mac)
                );
                let _ = p.sock.send(&bye);
            }
        }
        for p in peers.values_mut() {
            p.forget_read();
        }
        stuck.len()
    }

    /// Kicks the consumers that went to sleep before frames of ours
    /// reached them. Frames go in as the engine builds them, under the
    /// state lock; the kicks wait for this call, which the worker makes
    /// once it is done (the lock released, the CQEs written): a kick that
    /// wakes a thread costs about 2 us here, and the woken peer (often
    /// with the ACK of what we just received) would otherwise take the
    /// CPU before our own CQEs are written and seen.
    /// Returns how many were kicked.
    pub(crate) fn notify(&self) -> usize {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        peers
            .values_mut()
            .filter_map(|p| p.notify().then_some(()))
            .count()
    }

    /// Whether frames wait for room in a ring: then the worker comes back
    /// soon to [`LocalChannel::flush`] them (its timer; a consumer does not
    /// tell when it makes room).
    pub(crate) fn backlogged(&self) -> bool {
        let peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        peers.values().any(|p| !p.backlog.is_empty())
    }

    /// Bytes that fit in the accepted ring of `mac` (0 while frames to it
    /// wait for room); `None` without one. A ring with less room than
    /// `need` is a refusal, as in [`LocalChannel::send`]: if it stays so
    /// for [`ANSWER_WAIT`], the peer is asked whether it is still there
    /// (a full ring may belong to one that is gone), and if not, its ring
    /// is forgotten and its QPs take the wire.
    pub(crate) fn room_to(&self, mac: [u8; 6], need: usize) -> Option<usize> {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let peer = peers.get_mut(&mac)?;
        if !peer.accepted() {
            return None;
        }
        let room = if peer.backlog.is_empty() {
            peer.ring.room()
        } else {
            0
        };
        if room < need {
            if peer.unanswered.is_none() {
                peer.unanswered = Some((Instant::now(), peer.ring.tail()));
            }
            if !peer.alive() {
                peers.remove(&mac);
                return None;
            }
        }
        Some(room)
    }

    /// Whether frames wait for room in a ring, or a ring has less than
    /// `room` bytes of it.
    pub(crate) fn short_of(&self, room: usize) -> bool {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        peers
            .values_mut()
            .any(|p| !p.backlog.is_empty() || (p.accepted() && p.ring.room() < room))
    }

    /// Pushes the frames waiting for room in full rings. Returns the
    /// frames dropped.
    pub(crate) fn flush(&self) -> usize {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        peers
            .values_mut()
            .filter(|p| !p.backlog.is_empty())
            .fold(0usize, |dropped, p| dropped.saturating_add(p.flush(now)))
    }

    /// Takes rings handed over on the control socket (and drains kicks).
    ///
    /// A BYE means both rings with that instance are stale: its VMM ended,
    /// or the VM migrated to another VMM, which the next frame finds
    /// through the MAC's socket. A SETUP from an instance other than the
    /// one our ring goes to means the same: the MAC has a new owner.
    /// Rings of the MAC's other instance are left alone, so that a late
    /// BYE from a migration's source does not cut its destination off.
    ///
    /// At most [`CONTROL_BATCH`] messages per call: the socket is watched
    /// level-triggered, so a flood is read on later wake-ups, between
    /// other work.
    fn accept(&self) {
        let mut buf = [0u8; MSG_LEN];
        for _ in 0..CONTROL_BATCH {
            let Some((n, [memfd, kick, theirs])) = self.recv_control(&mut buf) else {
                break;
            };
            // Anything else (a PROBE) needs no answer.
            let Some((tag, size, from, instance)) = buf.get(..n).and_then(parse_control) else {
                continue;
            };
            if tag == ACCEPT || tag == REFUSE {
                let taken = tag == ACCEPT && size & VIEW_TAKEN != 0;
                self.answered(tag == ACCEPT, taken, from, instance);
                continue;
            }
            if tag != SETUP && tag.starts_with(SETUP_ANY) {
                log::warn!(
                    "pvrdma: same-host channel: {} offered a ring of version {} (ours: {}): \
                     refused, its frames are to take the wire",
                    sock_name(from),
                    String::from_utf8_lossy(tag),
                    String::from_utf8_lossy(SETUP)
                );
                self.answer(REFUSE, 0, from, instance);
                continue;
            }
            if tag != SETUP && tag != BYE {
                continue;
            }
            let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
            let mut inbound = self.inbound.lock().unwrap_or_else(PoisonError::into_inner);
            // Our ring goes to the instance that leaves, or to one that
            // a new owner of the MAC replaced.
            let ours_is_stale = |p: &Peer| {
                if tag == BYE {
                    p.instance == instance
                } else {
                    p.instance != instance
                }
            };
            if peers.get(&from).is_some_and(ours_is_stale) {
                peers.remove(&from);
            }
            let Some((file, kick)) = memfd.zip(kick).filter(|_| tag == SETUP) else {
                if inbound.get(&from).is_some_and(|r| r.instance == instance) {
                    self.retire(inbound.remove(&from));
                }
                continue;
            };
            if inbound.len() >= MAX_PEERS && !inbound.contains_key(&from) {
                log::warn!("pvrdma: same-host channel: too many peers, ring refused");
                continue;
            }
            if !is_eventfd(&kick, &self.again) {
                log::warn!("pvrdma: same-host channel: ring refused: its kick is no eventfd");
                continue;
            }
            match ShmRing::map(file, size as usize) {
                Ok(ring) => {
                    let fd = kick.as_raw_fd();
                    let view = self.take_view(from, theirs);
                    let flags = if view.is_some() { VIEW_TAKEN } else { 0 };
                    let old = inbound.insert(
                        from,
                        Inbound {
                            ring: Arc::new(ring),
                            instance,
                            kick,
                            view,
                        },
                    );
                    self.retire(old);
                    let mut watch = self.watch.lock().unwrap_or_else(PoisonError::into_inner);
                    watch.push(KickWatch::Add(fd));
                    self.answer(ACCEPT, flags, from, instance);
                }
                Err(e) => log::warn!("pvrdma: same-host channel: ring refused: {e}"),
            }
        }
    }

    /// The view of its memory that `mac` sent with its ring, mapped if we
    /// share ours (else dropped: the peer sends payloads, as without it).
    fn take_view(&self, mac: [u8; 6], theirs: Option<File>) -> Option<Arc<View>> {
        self.view.as_ref()?;
        match View::map(&theirs?) {
            Ok(v) => Some(Arc::new(v)),
            Err(e) => {
                log::warn!(
                    "pvrdma: same-host channel: {}: {e}; its frames carry their payload",
                    sock_name(mac)
                );
                None
            }
        }
    }

    /// Answers the SETUP of `instance` of `mac` (best effort: a sender
    /// that gets no answer finds out by whether we read its ring).
    fn answer(&self, tag: &[u8; 16], flags: u32, mac: [u8; 6], instance: u64) {
        let msg = control(tag, flags, self.mac, instance);
        let _ = self.sock.send_to(&msg, self.dir.join(sock_name(mac)));
    }

    /// The answer of `mac` to the ring we handed over (ACCEPT, and whether
    /// it took our view, or REFUSE), if it is for us (`instance`, the ring
    /// sender's, is ours).
    fn answered(&self, accept: bool, view_taken: bool, mac: [u8; 6], instance: u64) {
        if instance != self.inode {
            return;
        }
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if accept {
            if let Some(p) = peers.get_mut(&mac) {
                p.offered = None;
                p.shares = view_taken && self.view.is_some();
            }
        } else if let Some(p) = peers.remove(&mac) {
            self.give_up(mac, &p, "refused our ring");
        }
    }

    /// The next control message into `buf`: its length and the (up to
    /// three) descriptors that came with it; `None` when there is none.
    fn recv_control(&self, buf: &mut [u8]) -> Option<(usize, [Option<File>; 3])> {
        let mut iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        let mut fds: [RawFd; 3] = [-1; 3];
        // SAFETY: the iovec covers `buf`, which is borrowed mutably for the
        // call; any bytes may be written there.
        let (n, _) = unsafe { self.sock.recv_with_fds(&mut iov, &mut fds) }.ok()?;
        // The slots it did not fill are still -1.
        let files = fds.map(|fd| {
            // SAFETY: the descriptors recv_with_fds returned are ours to own.
            (fd >= 0).then(|| unsafe { File::from_raw_fd(fd) })
        });
        Some((n, files))
    }

    /// Up to `max` frames (and `BATCH_BYTES`) from other VMMs into
    /// `batch` (released first; the caller releases it once the frames are
    /// handled), after what woke the worker (only that descriptor is read:
    /// a system call less per wake-up); asks the worker to come back when
    /// more are waiting.
    pub(crate) fn recv(&self, max: usize, wake: Wake, batch: &mut Batch) {
        match wake {
            Wake::Socket => self.accept(),
            Wake::Again => {
                let _ = self.again.read();
            }
            Wake::Ring => {}
        }
        batch.release();
        if batch.data.len() > BATCH_KEEP {
            // What a burst of large frames grew it to is not kept.
            batch.data.truncate(BATCH_KEEP);
            batch.data.shrink_to(BATCH_KEEP);
        }
        let mut copied = 0usize;
        let mut inbound = self.inbound.lock().unwrap_or_else(PoisonError::into_inner);
        let mut corrupt = Vec::new();
        for (mac, Inbound { ring, view, .. }) in inbound.iter() {
            let (index, mut pos) = (batch.rings.len(), ring.tail());
            while !batch.full(max) {
                match ring.next(pos) {
                    Ok(Some(r)) => {
                        pos = r.end;
                        batch.bytes = batch.bytes.saturating_add(r.len);
                        if let Some(record) = ring.frame(&r) {
                            let kind =
                                Batch::kind_of(record, index, view.is_some(), &mut batch.runs);
                            let held = Held::InRing {
                                ring: index,
                                record: r,
                            };
                            batch.frames.push((held, kind));
                            continue;
                        }
                        let end = copied.saturating_add(r.len);
                        if batch.data.len() < end {
                            batch.data.resize(end, 0);
                        }
                        if let Some(out) = batch.data.get_mut(copied..end) {
                            ring.copy(&r, out);
                        }
                        let record = batch.data.get(copied..end).unwrap_or_default();
                        let kind = Batch::kind_of(record, index, view.is_some(), &mut batch.runs);
                        batch
                            .frames
                            .push((Held::Copied { start: copied, end }, kind));
                        copied = end;
                    }
                    // The worker announces its sleep once it is about to
                    // ([`LocalChannel::prepare_to_sleep`]), not here: it may
                    // poll a while first, and a producer kicks only a
                    // consumer that announced.
                    Ok(None) => break,
                    Err(e) => {
                        log::warn!("pvrdma: same-host channel: {e}; ring dropped");
                        corrupt.push(*mac);
                        break;
                    }
                }
            }
            if pos != ring.tail() {
                batch.rings.push((Arc::clone(ring), pos, view.clone()));
            }
        }
        for mac in corrupt {
            self.retire(inbound.remove(&mac));
        }
        if batch.full(max) {
            if let Err(e) = self.again.write(1) {
                log::warn!("pvrdma: same-host channel: cannot requeue: {e}");
            }
        }
    }

    /// Whether frames wait in a ring of a peer: a look at shared memory,
    /// no system call (the worker polls this while it busy-polls).
    pub(crate) fn pending(&self) -> bool {
        let inbound = self.inbound.lock().unwrap_or_else(PoisonError::into_inner);
        inbound.values().any(|r| r.ring.has_data())
    }

    /// The worker is about to sleep: announces it in every ring of a peer
    /// (their producers kick from now on, see `ShmRing`) and says whether
    /// frames came in meanwhile (then it must not sleep, but take them).
    pub(crate) fn prepare_to_sleep(&self) -> bool {
        let inbound = self.inbound.lock().unwrap_or_else(PoisonError::into_inner);
        // Every ring is told, not only those before the first with data.
        let mut data = false;
        for r in inbound.values() {
            data |= r.ring.prepare_to_wait();
        }
        data
    }

    /// Logs every ring's positions: a ring whose consumer sleeps with
    /// data in it (or whose producer stopped) shows here.
    pub(crate) fn log_rings(&self) {
        let peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        for (mac, p) in peers.iter() {
            log::info!(
                "pvrdma: same-host ring to {} (instance {}): {}",
                sock_name(*mac),
                p.instance,
                p.ring
            );
        }
        drop(peers);
        let inbound = self.inbound.lock().unwrap_or_else(PoisonError::into_inner);
        for (mac, r) in inbound.iter() {
            log::info!(
                "pvrdma: same-host ring from {} (instance {}): {}",
                sock_name(*mac),
                r.instance,
                r.ring
            );
        }
    }
}

impl Drop for LocalChannel {
    /// Says BYE to every VMM we exchange frames with, so that they stop
    /// filling rings nobody reads (our VM may live on in another VMM).
    fn drop(&mut self) {
        let mut macs: Vec<[u8; 6]> = self
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .collect();
        macs.extend(
            self.inbound
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .keys(),
        );
        macs.sort_unstable();
        macs.dedup();
        let msg = control(BYE, 0, self.mac, self.inode);
        if let Ok(sock) = UnixDatagram::unbound() {
            let _ = sock.set_write_timeout(Some(SEND_WAIT));
            for mac in macs {
                let _ = sock.send_to(&msg, self.dir.join(sock_name(mac)));
            }
        }
        let own = self.own();
        if std::fs::metadata(&own).is_ok_and(|m| m.ino() == self.inode) {
            let _ = std::fs::remove_file(&own);
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests {
    use super::*;
    use crate::sim_driver::sharing::{guest_ram, SEALED};

    /// The frames of one [`LocalChannel::recv`].
    fn recv(ch: &LocalChannel, max: usize, wake: Wake) -> Vec<Vec<u8>> {
        let mut batch = Batch::default();
        ch.recv(max, wake, &mut batch);
        let frames = batch.frames().map(<[u8]>::to_vec).collect();
        batch.release();
        frames
    }

    /// An epoll set watching a channel's ring kicks as its worker does.
    struct Kicks(std::os::fd::OwnedFd);

    impl Kicks {
        fn new() -> Self {
            // SAFETY: plain system call; the descriptor is owned below.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            assert!(fd >= 0);
            // SAFETY: a fresh descriptor nothing else owns.
            Self(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
        }

        /// Applies `ch`'s watch changes; returns how many kicks it watches.
        fn follow(&self, ch: &LocalChannel, watched: &mut usize) {
            for change in ch.take_watch() {
                let (op, fd) = match &change {
                    KickWatch::Add(fd) => (libc::EPOLL_CTL_ADD, *fd),
                    KickWatch::Remove(f) => (libc::EPOLL_CTL_DEL, f.as_raw_fd()),
                };
                let mut ev = libc::epoll_event {
                    events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                    u64: 0,
                };
                // SAFETY: a valid epoll set and descriptor, and an event
                // that lives for the call.
                let rc = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), op, fd, &mut ev) };
                assert_eq!(rc, 0, "{change:?}");
                if op == libc::EPOLL_CTL_ADD {
                    *watched += 1;
                } else {
                    *watched -= 1;
                }
            }
        }

        /// Kicks reported within `ms` milliseconds.
        fn wait(&self, ms: i32) -> usize {
            let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
            // SAFETY: a valid epoll set and a buffer of 8 events.
            let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), evs.as_mut_ptr(), 8, ms) };
            usize::try_from(n).unwrap()
        }
    }

    #[test]
    fn frames_reach_the_owner_of_the_mac_and_nobody_else() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-{}", std::process::id()));
        let a = LocalChannel::bind(&dir, [2, 0, 0, 0, 0, 1], false).unwrap();
        let b = LocalChannel::bind(&dir, [2, 0, 0, 0, 0, 2], false).unwrap();
        assert_eq!(a.send([2, 0, 0, 0, 0, 2], b"hello"), Sent::Local);
        assert_eq!(a.send([2, 0, 0, 0, 0, 2], b"again"), Sent::Local);
        assert_eq!(
            recv(&b, 8, Wake::Socket),
            vec![b"hello".to_vec(), b"again".to_vec()]
        );
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
        assert!(LocalChannel::bind(&dir, [2, 0, 0, 0, 0, 2], false).is_err());
        // B went to sleep after draining: the next frame kicks it, on the
        // ring's eventfd, edge-triggered as its worker watches it.
        assert!(!b.pending());
        assert!(!b.prepare_to_sleep());
        let (kicks, mut watched) = (Kicks::new(), 0);
        kicks.follow(&b, &mut watched);
        assert_eq!(watched, 1, "one ring, one kick");
        kicks.wait(0);
        assert_eq!(kicks.wait(0), 0);
        assert_eq!(a.send([2, 0, 0, 0, 0, 2], b"kick"), Sent::Local);
        assert_eq!(kicks.wait(0), 0, "the kick waits for notify");
        a.notify();
        assert_eq!(kicks.wait(1000), 1);
        // Not asleep any more: the next frame needs no kick.
        assert_eq!(a.send([2, 0, 0, 0, 0, 2], b"more"), Sent::Local);
        a.notify();
        assert_eq!(kicks.wait(0), 0);
        assert!(b.pending(), "seen without a kick");
        assert_eq!(
            recv(&b, 8, Wake::Ring),
            vec![b"kick".to_vec(), b"more".to_vec()]
        );
        // A consumer that busy-polls (announces no sleep) is not kicked.
        assert_eq!(a.send([2, 0, 0, 0, 0, 2], b"polled"), Sent::Local);
        a.notify();
        assert_eq!(kicks.wait(0), 0);
        assert!(b.pending());
        assert!(b.prepare_to_sleep(), "frames came in: no sleep");
        recv(&b, 8, Wake::Ring);
        assert!(!b.prepare_to_sleep());
        // Every kick wakes, though nobody reads the eventfd.
        assert_eq!(a.send([2, 0, 0, 0, 0, 2], b"again"), Sent::Local);
        a.notify();
        assert_eq!(kicks.wait(1000), 1);
        recv(&b, 8, Wake::Ring);
        assert!(!b.prepare_to_sleep());
        drop(b);
        // B's socket is gone: A forgets the ring once a kick went
        // unanswered for a while.
        assert_eq!(a.send([2, 0, 0, 0, 0, 2], b"x"), Sent::Local, "kicked");
        a.notify();
        std::thread::sleep(ANSWER_WAIT * 2);
        assert_eq!(a.send([2, 0, 0, 0, 0, 2], b"x"), Sent::NotLocal, "gone");
        // A stale socket file (its VMM died without cleaning up) is replaced.
        drop(UnixDatagram::bind(dir.join(sock_name([2, 0, 0, 0, 0, 4]))).unwrap());
        let c = LocalChannel::bind(&dir, [2, 0, 0, 0, 0, 4], false).unwrap();
        assert_eq!(a.send([2, 0, 0, 0, 0, 4], b"again"), Sent::Local);
        assert_eq!(recv(&c, 8, Wake::Socket), vec![b"again".to_vec()]);
        drop((a, c));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_destination_removes_the_waiting_sockets_of_killed_ones() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-s-{}", std::process::id()));
        let mac = [2, 0, 0, 0, 5, 2];
        std::fs::create_dir_all(&dir).unwrap();
        let waiting = |pid: u32| dir.join(format!("{}{INCOMING}{pid}", sock_name(mac)));
        // A killed receiver's file (nobody bound any more), a live one's,
        // and another MAC's killed one.
        drop(UnixDatagram::bind(waiting(1)).unwrap());
        let live = UnixDatagram::bind(waiting(2)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let other = dir.join(format!("{}{INCOMING}1", sock_name([2, 0, 0, 0, 5, 3])));
        drop(UnixDatagram::bind(&other).unwrap());

        let new = LocalChannel::bind(&dir, mac, true).unwrap();
        assert!(!waiting(1).exists(), "the stale file is gone");
        assert!(waiting(2).exists(), "a live receiver keeps its file");
        assert!(other.exists(), "other MACs are not ours to clean");
        assert!(waiting(std::process::id()).exists());
        drop((new, live));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A channel bound for an incoming migration has its first ring made
    /// at bind, and offers that one to its first peer when the VM starts.
    #[test]
    fn an_incoming_channel_offers_a_ring_made_ahead() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-r-{}", std::process::id()));
        let a = LocalChannel::bind(&dir, [2, 0, 0, 0, 6, 1], false).unwrap();
        assert!(
            a.spare.lock().unwrap().is_none(),
            "only a destination makes one"
        );
        let new = LocalChannel::bind(&dir, [2, 0, 0, 0, 6, 2], true).unwrap();
        assert!(new.spare.lock().unwrap().is_some());
        new.claim().unwrap();
        new.announce([[2, 0, 0, 0, 6, 1]]);
        assert!(new.spare.lock().unwrap().is_none(), "the ring went to A");
        // It is a working ring: A takes it and the frames come through.
        assert!(recv(&a, 8, Wake::Socket).is_empty());
        assert_eq!(new.send([2, 0, 0, 0, 6, 1], b"hello"), Sent::Local);
        assert_eq!(recv(&a, 8, Wake::Socket), vec![b"hello".to_vec()]);
        drop((a, new));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_migrated_vm_takes_over_its_mac() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-m-{}", std::process::id()));
        let a = LocalChannel::bind(&dir, [2, 0, 0, 0, 2, 1], false).unwrap();
        let old = LocalChannel::bind(&dir, [2, 0, 0, 0, 2, 2], false).unwrap();
        assert_eq!(a.send([2, 0, 0, 0, 2, 2], b"first"), Sent::Local);
        assert_eq!(recv(&old, 8, Wake::Socket).len(), 1);
        // Frames keep coming while the old VMM never sleeps, then the
        // destination takes the socket over and the source goes away.
        let new = LocalChannel::bind(&dir, [2, 0, 0, 0, 2, 2], true).unwrap();
        new.claim().unwrap();
        let frame = [7u8; 1000];
        while a.send([2, 0, 0, 0, 2, 2], &frame) == Sent::Local {}
        // (Without its BYE: a VMM that died.)
        std::mem::forget(std::mem::take(&mut *old.inbound.lock().unwrap()));
        drop(old);
        assert!(
            dir.join(sock_name([2, 0, 0, 0, 2, 2])).exists(),
            "the new owner's file stays"
        );
        // The full ring of the dead peer is noticed, and the MAC's new
        // owner gets the frames after that.
        assert_eq!(a.send([2, 0, 0, 0, 2, 2], &frame), Sent::NotLocal);
        assert_eq!(a.send([2, 0, 0, 0, 2, 2], b"after"), Sent::Local);
        assert_eq!(recv(&new, 8, Wake::Socket), vec![b"after".to_vec()]);
        drop((a, new));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A QP that waits for room in a full ring (flow control) sends
    /// nothing that could be refused: asking for the room must notice a
    /// dead peer as a refused frame does.
    #[test]
    fn a_full_ring_of_a_dead_peer_is_forgotten_when_room_is_asked_for() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-room-{}", std::process::id()));
        let mac = [2, 0, 0, 0, 8, 2];
        let a = LocalChannel::bind(&dir, [2, 0, 0, 0, 8, 1], false).unwrap();
        let old = LocalChannel::bind(&dir, mac, false).unwrap();
        assert_eq!(a.send(mac, b"first"), Sent::Local);
        assert_eq!(recv(&old, 8, Wake::Socket).len(), 1);
        let new = LocalChannel::bind(&dir, mac, true).unwrap();
        new.claim().unwrap();
        while a.send(mac, &[7u8; 1000]) == Sent::Local {}
        // (Without its BYE: a VMM that died.)
        std::mem::forget(std::mem::take(&mut *old.inbound.lock().unwrap()));
        drop(old);
        assert_eq!(a.room_to(mac, 4096), Some(0), "full: the clock starts");
        std::thread::sleep(ANSWER_WAIT * 2);
        assert_eq!(a.room_to(mac, 4096), None, "its ring is forgotten");
        assert_eq!(a.send(mac, b"after"), Sent::Local);
        assert_eq!(recv(&new, 8, Wake::Socket), vec![b"after".to_vec()]);
        drop((a, new));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_leaving_vmm_says_bye_and_its_peers_find_the_new_owner_at_once() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-bye-{}", std::process::id()));
        let a = LocalChannel::bind(&dir, [2, 0, 0, 0, 3, 1], false).unwrap();
        let old = LocalChannel::bind(&dir, [2, 0, 0, 0, 3, 2], false).unwrap();
        assert_eq!(a.send([2, 0, 0, 0, 3, 2], b"one"), Sent::Local);
        assert_eq!(recv(&old, 8, Wake::Socket).len(), 1);
        assert_eq!(old.send([2, 0, 0, 0, 3, 1], b"back"), Sent::Local);
        assert_eq!(recv(&a, 8, Wake::Socket), vec![b"back".to_vec()]);
        // The ring is not full and its reader was awake: only the BYE can
        // tell A that the VM moved.
        assert_eq!(a.send([2, 0, 0, 0, 3, 2], b"two"), Sent::Local);
        let new = LocalChannel::bind(&dir, [2, 0, 0, 0, 3, 2], true).unwrap();
        new.claim().unwrap();
        drop(old);
        assert!(recv(&a, 8, Wake::Socket).is_empty());
        assert!(
            a.inbound.lock().unwrap().is_empty(),
            "the old ring is dropped"
        );
        assert_eq!(a.send([2, 0, 0, 0, 3, 2], b"three"), Sent::Local);
        assert_eq!(recv(&new, 8, Wake::Socket), vec![b"three".to_vec()]);
        drop((a, new));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_late_bye_from_the_source_spares_the_destinations_rings() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-late-{}", std::process::id()));
        let a = LocalChannel::bind(&dir, [2, 0, 0, 0, 4, 1], false).unwrap();
        let old = LocalChannel::bind(&dir, [2, 0, 0, 0, 4, 2], false).unwrap();
        assert_eq!(a.send([2, 0, 0, 0, 4, 2], b"one"), Sent::Local);
        assert_eq!(old.send([2, 0, 0, 0, 4, 1], b"back"), Sent::Local);
        assert_eq!(recv(&a, 8, Wake::Socket), vec![b"back".to_vec()]);
        // The destination runs the VM and sends before the source, still
        // lingering, has said BYE.
        let new = LocalChannel::bind(&dir, [2, 0, 0, 0, 4, 2], true).unwrap();
        new.claim().unwrap();
        assert_eq!(new.send([2, 0, 0, 0, 4, 1], b"from new"), Sent::Local);
        assert_eq!(recv(&a, 8, Wake::Socket), vec![b"from new".to_vec()]);
        // A's ring to the source went stale with the destination's SETUP.
        assert_eq!(a.send([2, 0, 0, 0, 4, 2], b"two"), Sent::Local);
        assert_eq!(recv(&new, 8, Wake::Socket), vec![b"two".to_vec()]);
        drop(old);
        assert_eq!(new.send([2, 0, 0, 0, 4, 1], b"after bye"), Sent::Local);
        assert_eq!(
            recv(&a, 8, Wake::Socket),
            vec![b"after bye".to_vec()],
            "ring kept"
        );
        assert_eq!(a.send([2, 0, 0, 0, 4, 2], b"three"), Sent::Local);
        assert_eq!(
            recv(&new, 8, Wake::Socket),
            vec![b"three".to_vec()],
            "ring kept"
        );
        drop((a, new));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_destination_that_announces_itself_gets_the_next_frame() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-ann-{}", std::process::id()));
        let a = LocalChannel::bind(&dir, [2, 0, 0, 0, 6, 1], false).unwrap();
        let old = LocalChannel::bind(&dir, [2, 0, 0, 0, 6, 2], false).unwrap();
        assert_eq!(a.send([2, 0, 0, 0, 6, 2], b"one"), Sent::Local);
        assert_eq!(recv(&old, 8, Wake::Socket), vec![b"one".to_vec()]);
        // The source is paused for good (and still lingers); the destination
        // runs the VM but has nothing to send.
        let new = LocalChannel::bind(&dir, [2, 0, 0, 0, 6, 2], true).unwrap();
        new.claim().unwrap();
        new.announce([[2, 0, 0, 0, 6, 1], [2, 0, 0, 0, 6, 9]]);
        assert!(recv(&a, 8, Wake::Socket).is_empty());
        assert_eq!(a.send([2, 0, 0, 0, 6, 2], b"retransmitted"), Sent::Local);
        assert_eq!(recv(&new, 8, Wake::Socket), vec![b"retransmitted".to_vec()]);
        assert!(
            recv(&old, 8, Wake::Socket).is_empty(),
            "nothing more went to the source"
        );
        // A ring it already has is kept.
        new.announce([[2, 0, 0, 0, 6, 1]]);
        assert_eq!(new.send([2, 0, 0, 0, 6, 1], b"back"), Sent::Local);
        assert_eq!(recv(&a, 8, Wake::Socket), vec![b"back".to_vec()]);
        drop((a, old, new));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_abandoned_migration_leaves_the_source_its_mac() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-ab-{}", std::process::id()));
        let a = LocalChannel::bind(&dir, [2, 0, 0, 0, 5, 1], false).unwrap();
        let source = LocalChannel::bind(&dir, [2, 0, 0, 0, 5, 2], false).unwrap();
        // The destination is built (not yet running the VM), then dropped.
        let dest = LocalChannel::bind(&dir, [2, 0, 0, 0, 5, 2], true).unwrap();
        assert_eq!(a.send([2, 0, 0, 0, 5, 2], b"to source"), Sent::Local);
        assert_eq!(recv(&source, 8, Wake::Socket), vec![b"to source".to_vec()]);
        drop(dest);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            2,
            "no staged file left"
        );
        // A newcomer still finds the source.
        let c = LocalChannel::bind(&dir, [2, 0, 0, 0, 5, 3], false).unwrap();
        assert_eq!(c.send([2, 0, 0, 0, 5, 2], b"from c"), Sent::Local);
        assert_eq!(recv(&source, 8, Wake::Socket), vec![b"from c".to_vec()]);
        // A claim without a staged socket changes nothing.
        source.claim().unwrap();
        assert_eq!(c.send([2, 0, 0, 0, 5, 2], b"again"), Sent::Local);
        assert_eq!(recv(&source, 8, Wake::Socket), vec![b"again".to_vec()]);
        drop((a, source, c));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_full_ring_backlogs_frames_in_order_then_drops_them_if_stalled() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-bl-{}", std::process::id()));
        let a = LocalChannel::bind(&dir, [2, 0, 0, 0, 7, 1], false).unwrap();
        let b = LocalChannel::bind(&dir, [2, 0, 0, 0, 7, 2], false).unwrap();
        let to_b = [2, 0, 0, 0, 7, 2];
        // 4 MiB of 64 KiB frames fill the ring; 8 more wait.
        let n = RING_BYTES / (64 << 10) + 8;
        for i in 0..n {
            assert_eq!(a.send(to_b, &vec![i as u8; 64 << 10]), Sent::Local);
        }
        assert_eq!(a.flush(), 0);
        assert!(a.backlogged(), "the worker is to come back");
        // A batch ends at BATCH_BYTES and asks to come back.
        let mut got = recv(&b, 16, Wake::Socket);
        assert_eq!(got.len(), BATCH_BYTES / (64 << 10));
        assert_eq!(a.flush(), 0, "room made: pushed");
        while got.len() < n {
            let more = recv(&b, n, Wake::Again);
            assert!(!more.is_empty(), "the rest follows");
            got.extend(more);
            assert_eq!(a.flush(), 0);
        }
        assert_eq!(got.len(), n);
        assert!(
            got.iter().enumerate().all(|(i, f)| f[0] == i as u8),
            "in order"
        );
        // A consumer that makes no room: the backlog is given up.
        while a.send(to_b, &[9u8; 64 << 10]) == Sent::Local && a.flush() == 0 {
            if a.peers.lock().unwrap()[&to_b].backlog.len() >= 4 {
                std::thread::sleep(ROOM_WAIT * 2);
            }
        }
        assert!(a.peers.lock().unwrap()[&to_b].backlog.is_empty());
        // Large frames (segments) are held up to BACKLOG_BYTES, not
        // BACKLOG_FRAMES of them.
        let mut held = 0;
        while a.send(to_b, &[7u8; 64 << 10]) == Sent::Local {
            held += 1;
            assert!(held <= BACKLOG_FRAMES);
        }
        assert_eq!(held, BACKLOG_BYTES / (64 << 10));
        drop((a, b));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn batches_are_bounded_and_the_worker_comes_back() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-b-{}", std::process::id()));
        let a = LocalChannel::bind(&dir, [2, 0, 0, 0, 1, 1], false).unwrap();
        let b = LocalChannel::bind(&dir, [2, 0, 0, 0, 1, 2], false).unwrap();
        for i in 0..10u8 {
            assert_eq!(a.send([2, 0, 0, 0, 1, 2], &[i; 100]), Sent::Local);
        }
        assert_eq!(recv(&b, 4, Wake::Socket).len(), 4);
        assert_eq!(b.again.read().unwrap(), 1, "asked to come back");
        assert_eq!(recv(&b, 100, Wake::Socket).len(), 6);
        drop((a, b));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Hands `to` a SETUP as a peer would, with `memfd` and `kick`.
    fn setup(dir: &Path, from: [u8; 6], to: [u8; 6], memfd: &File, kick: RawFd) {
        setup_tagged(SETUP, dir, from, to, memfd, kick);
    }

    /// [`setup`] with the SETUP tag of some version.
    fn setup_tagged(
        tag: &[u8; 16],
        dir: &Path,
        from: [u8; 6],
        to: [u8; 6],
        memfd: &File,
        kick: RawFd,
    ) {
        let sock = UnixDatagram::unbound().unwrap();
        sock.connect(dir.join(sock_name(to))).unwrap();
        let msg = control(tag, 4096, from, 77);
        sock.send_with_fds(&[&msg[..]], &[memfd.as_raw_fd(), kick])
            .unwrap();
    }

    /// The version handshake: a ring is accepted (and only then takes
    /// segments); a VMM of another version gets a REFUSE instead of having
    /// its ring misread, and a sender whose ring is refused takes the wire.
    #[test]
    fn rings_of_another_version_are_refused_and_their_senders_take_the_wire() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-v-{}", std::process::id()));
        let (ma, mb, old) = (
            [2, 0, 0, 0, 12, 1],
            [2, 0, 0, 0, 12, 2],
            [2, 0, 0, 0, 12, 3],
        );
        let a = LocalChannel::bind(&dir, ma, false).unwrap();
        let b = LocalChannel::bind(&dir, mb, false).unwrap();
        assert_eq!(a.send(mb, b"one"), Sent::Local);
        assert!(!a.has_ring(mb), "not accepted yet: no segments");
        assert_eq!(recv(&b, 8, Wake::Socket), vec![b"one".to_vec()]);
        recv(&a, 8, Wake::Socket);
        assert!(a.has_ring(mb), "B's ACCEPT arrived");
        // A VMM of another version (a socket of our own here) offers B a
        // ring: refused, and told so.
        let other = UnixDatagram::bind(dir.join(sock_name(old))).unwrap();
        let efd = EventFd::new(EFD_NONBLOCK).unwrap();
        let memfd = shm_ring::create(4096).unwrap().1;
        setup_tagged(b"PVRDMA-SHM-RING9", &dir, old, mb, &memfd, efd.as_raw_fd());
        recv(&b, 8, Wake::Socket);
        assert!(!b.inbound.lock().unwrap().contains_key(&old), "not mapped");
        let mut reply = [0u8; MSG_LEN];
        other.set_nonblocking(true).unwrap();
        let n = other.recv(&mut reply).unwrap();
        assert_eq!(parse_control(&reply[..n]), Some((REFUSE, 0, mb, 77)));
        // Our sender refused by its peer: its frames take the wire, and a
        // new ring is offered only to a new owner of the MAC.
        let sock = UnixDatagram::unbound().unwrap();
        let refuse = control(REFUSE, 0, mb, a.inode);
        sock.send_to(&refuse, dir.join(sock_name(ma))).unwrap();
        recv(&a, 8, Wake::Socket);
        assert!(!a.has_ring(mb));
        assert_eq!(a.send(mb, b"two"), Sent::NotLocal);
        assert!(recv(&b, 8, Wake::Ring).is_empty());
        // A REFUSE for another instance of our MAC changes nothing.
        assert_eq!(b.send(ma, b"back"), Sent::Local);
        let stale = control(REFUSE, 0, ma, b.inode + 1);
        sock.send_to(&stale, dir.join(sock_name(mb))).unwrap();
        recv(&b, 8, Wake::Socket);
        assert_eq!(b.send(ma, b"back again"), Sent::Local);
        drop((a, b, other));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An older VMM ignores our SETUP and never reads the ring: after
    /// ACCEPT_WAIT its frames take the wire instead of filling it.
    #[test]
    fn a_ring_nobody_takes_is_given_up() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-o-{}", std::process::id()));
        let (ma, old) = ([2, 0, 0, 0, 13, 1], [2, 0, 0, 0, 13, 3]);
        let a = LocalChannel::bind(&dir, ma, false).unwrap();
        let _ignores = UnixDatagram::bind(dir.join(sock_name(old))).unwrap();
        assert_eq!(a.send(old, b"one"), Sent::Local);
        assert!(!a.has_ring(old));
        std::thread::sleep(ACCEPT_WAIT + Duration::from_millis(100));
        assert_eq!(a.send(old, b"two"), Sent::NotLocal);
        assert_eq!(a.send(old, b"three"), Sent::NotLocal, "not offered again");
        assert!(a.peers.lock().unwrap().is_empty());
        drop(a);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_ring_whose_kick_is_no_eventfd_is_refused() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-k-{}", std::process::id()));
        let me = [2, 0, 0, 0, 8, 1];
        let b = LocalChannel::bind(&dir, me, false).unwrap();
        let (kicks, mut watched) = (Kicks::new(), 0);
        let memfd = || shm_ring::create(4096).unwrap().1;
        // A pipe (a hostile peer could fill it and make it block), a
        // timerfd (another anonymous inode), and the memfd itself.
        let mut pipe = [0; 2];
        // SAFETY: an array of two descriptors for pipe to fill.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        let [rd, wr] = pipe;
        let timer = vmm_sys_util::timerfd::TimerFd::new().unwrap();
        let ring = memfd();
        for (i, kick) in [wr, timer.as_raw_fd(), ring.as_raw_fd()]
            .into_iter()
            .enumerate()
        {
            setup(&dir, [2, 0, 0, 0, 9, i as u8], me, &memfd(), kick);
        }
        recv(&b, 8, Wake::Socket);
        kicks.follow(&b, &mut watched);
        assert_eq!(watched, 0, "none taken");
        assert!(b.inbound.lock().unwrap().is_empty());
        // A real eventfd is taken, and unwatched when its peer says BYE.
        let efd = EventFd::new(EFD_NONBLOCK).unwrap();
        setup(&dir, [2, 0, 0, 0, 9, 9], me, &ring, efd.as_raw_fd());
        recv(&b, 8, Wake::Socket);
        kicks.follow(&b, &mut watched);
        assert_eq!(watched, 1);
        let sock = UnixDatagram::unbound().unwrap();
        sock.send_to(
            &control(BYE, 0, [2, 0, 0, 0, 9, 9], 77),
            dir.join(sock_name(me)),
        )
        .unwrap();
        recv(&b, 8, Wake::Socket);
        kicks.follow(&b, &mut watched);
        assert_eq!(watched, 0, "unwatched before it closed");
        // SAFETY: the pipe's two descriptors, closed once.
        unsafe {
            libc::close(rd);
            libc::close(wr);
        }
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_kick_never_blocks_whatever_the_consumer_did_to_its_eventfd() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-kb-{}", std::process::id()));
        let a = LocalChannel::bind(&dir, [2, 0, 0, 0, 10, 1], false).unwrap();
        let b = LocalChannel::bind(&dir, [2, 0, 0, 0, 10, 2], false).unwrap();
        let to_b = [2, 0, 0, 0, 10, 2];
        assert_eq!(a.send(to_b, b"one"), Sent::Local);
        recv(&b, 8, Wake::Socket);
        // B, hostile: its end of the kick made blocking, the counter full.
        let kick = b.inbound.lock().unwrap()[&[2, 0, 0, 0, 10, 1]]
            .kick
            .as_raw_fd();
        // SAFETY: F_SETFL with flags on a descriptor B owns.
        assert_eq!(unsafe { libc::fcntl(kick, libc::F_SETFL, 0) }, 0);
        let full = u64::MAX - 1 - 1;
        // SAFETY: an 8-byte write from a live buffer.
        let n = unsafe { libc::write(kick, full.to_ne_bytes().as_ptr().cast(), 8) };
        assert_eq!(n, 8);
        // B sleeps: A's next frame kicks, and must come back.
        assert!(recv(&b, 8, Wake::Ring).is_empty());
        assert!(!b.prepare_to_sleep());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let sent = a.send(to_b, b"two");
            a.notify();
            tx.send(sent).unwrap();
            drop(a);
        });
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)),
            Ok(Sent::Local),
            "kicked without blocking"
        );
        assert_eq!(recv(&b, 8, Wake::Ring), vec![b"two".to_vec()]);
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_others_can_enter_is_refused() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-p-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for mode in [0o755, 0o770, 0o701] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = LocalChannel::bind(&dir, [2, 0, 0, 0, 11, 1], false).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "mode {mode:o}");
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        drop(LocalChannel::bind(&dir, [2, 0, 0, 0, 11, 1], false).unwrap());
        // Nor a symlink to a private directory (its target could change).
        let link = dir.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(LocalChannel::bind(&link, [2, 0, 0, 0, 11, 2], false).is_err());
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A and B in `dir`, sharing `va` and `vb`, A's ring to B handed over
    /// and answered. Returns whether A may send B described records.
    fn sharing(
        dir: &Path,
        n: u8,
        va: Option<File>,
        vb: Option<File>,
    ) -> (LocalChannel, LocalChannel, bool) {
        let (ma, mb) = ([2, 0, 0, 1, n, 1], [2, 0, 0, 1, n, 2]);
        let mut a = LocalChannel::bind(dir, ma, false).unwrap();
        let mut b = LocalChannel::bind(dir, mb, false).unwrap();
        if let Some(v) = va {
            a.share(v);
        }
        if let Some(v) = vb {
            b.share(v);
        }
        assert_eq!(a.send(mb, b"hello"), Sent::Local);
        assert_eq!(recv(&b, 8, Wake::Socket), vec![b"hello".to_vec()]);
        recv(&a, 8, Wake::Socket);
        assert!(a.has_ring(mb));
        let shares = a.shares_with(mb);
        (a, b, shares)
    }

    /// A view is taken only where both ends share, and only a read-only
    /// descriptor of a memfd sealed against resizing; otherwise the ring
    /// is still taken and frames carry their payload.
    #[test]
    fn views_are_taken_only_sealed_read_only_and_where_both_share() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-sv-{}", std::process::id()));
        let ro = || Some(guest_ram(b"", SEALED).1);
        assert!(sharing(&dir, 1, ro(), ro()).2, "both share");
        assert!(!sharing(&dir, 2, ro(), None).2, "B does not");
        assert!(!sharing(&dir, 3, None, ro()).2, "A does not");
        let writable = Some(guest_ram(b"", SEALED).0);
        assert!(!sharing(&dir, 4, writable, ro()).2, "writable");
        let unsealed = Some(guest_ram(b"", libc::F_SEAL_SHRINK).1);
        assert!(!sharing(&dir, 5, unsealed, ro()).2, "unsealed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A frame from A to B of opcode `op` with `own` bytes of payload.
    fn header(op: rdma_transport::opcode::Opcode, own: &[u8]) -> Vec<u8> {
        use rdma_transport::hdr::{Bth, Reth};
        use rdma_transport::net::{Encap, IpInfo};
        use rdma_transport::packet::{build, Addr, Headers};
        let ip = |last| std::net::IpAddr::from([10, 0, 0, last]);
        let addr = Addr {
            src_mac: [2, 0, 0, 1, 0, 1],
            dst_mac: [2, 0, 0, 1, 0, 2],
            ip: IpInfo {
                src: ip(1),
                dst: ip(2),
                tclass: 0,
                hop_limit: 64,
                flow_label: 0,
            },
            udp_sport: 0xc000,
            encap: Encap::V2,
        };
        use rdma_transport::hdr::{Aeth, Syndrome};
        use rdma_transport::opcode::Hdrs;
        let reth = op.has(Hdrs::RETH).then_some(Reth {
            va: 0,
            rkey: 1,
            len: 0,
        });
        let aeth = op.has(Hdrs::AETH).then_some(Aeth {
            syndrome: Syndrome::Ack { credits: 0 },
            msn: 0,
        });
        let hdrs = Headers {
            bth: Bth {
                opcode: op as u8,
                dqpn: 17,
                ..Bth::default()
            },
            reth,
            aeth,
            ..Headers::default()
        };
        build(&addr, &hdrs, own).unwrap()
    }

    /// A described record of `runs` (claiming `len` bytes) around `frame`.
    fn described(runs: &[Run], len: usize, frame: &[u8]) -> Vec<u8> {
        let mut rec = vec![0u8; view::described_len(frame.len(), runs.len()).unwrap()];
        assert!(view::write_described(&mut rec, runs, len, &mut |out| {
            out.copy_from_slice(frame);
            true
        }));
        rec
    }

    /// Described records give packets whose payload is the sender's
    /// memory; records a hostile sender made (runs outside the view,
    /// overflowing, empty or huge, lengths that disagree, too many runs, an
    /// opcode without payload, a frame with its own) are dropped as bad
    /// frames, as is a described record from a peer whose view we lack.
    #[test]
    fn described_records_read_the_senders_memory_and_hostile_ones_are_dropped() {
        use rdma_transport::opcode::Opcode;
        let dir = std::env::temp_dir().join(format!("pvrdma-local-sd-{}", std::process::id()));
        let ram: Vec<u8> = (0..=255u8).cycle().take(64 << 10).collect();
        let (_, ro) = guest_ram(&ram, SEALED);
        let (a, b, shares) = sharing(&dir, 6, Some(ro), Some(guest_ram(b"", SEALED).1));
        assert!(shares);
        let mb = [2, 0, 0, 1, 6, 2];
        let write = header(Opcode::RcRdmaWriteOnly, &[]);
        let run = |at, len| Run { at, len };
        let good = [run(4096, 100), run(10, 20)];
        // A described segment's most: all of A's memory; one byte more is
        // too long.
        let most = MAX_DESCRIBED_SEGMENT;
        assert_eq!(ram.len(), most as usize);
        let records = [
            described(&good, 120, &write),
            described(&[run(0, most)], most as usize, &write),
            described(&[run(0, most), run(0, 1)], most as usize + 1, &write),
            described(&[run(65_000, 1000)], 1000, &write),
            described(&[run(u64::MAX - 10, 20)], 20, &write),
            described(&[run(0, 0)], 0, &write),
            described(&[run(0, u32::MAX)], u32::MAX as usize, &write),
            described(&good, 119, &write),
            described(&vec![run(0, 1); MAX_RUNS_PLUS], MAX_RUNS_PLUS, &write),
            described(&good, 120, &header(Opcode::RcAcknowledge, &[])),
            described(&good, 120, &header(Opcode::RcRdmaWriteOnly, b"own!")),
        ];
        for r in &records {
            assert_eq!(a.send(mb, r), Sent::Local);
        }
        let mut batch = Batch::default();
        b.recv(64, Wake::Ring, &mut batch);
        let got: Vec<_> = batch.packets().collect();
        assert_eq!(got.len(), records.len());
        let pkt = got[0].as_ref().unwrap();
        let pieces: Vec<u8> = pkt.payload.pieces().flatten().copied().collect();
        assert_eq!(pieces, [&ram[4096..4196], &ram[10..30]].concat());
        assert_eq!((pkt.payload.len(), pkt.hdrs.bth.dqpn), (120, 17));
        let whole = got[1].as_ref().unwrap();
        assert_eq!(whole.payload.pieces().flatten().count(), ram.len());
        for (i, p) in got.iter().enumerate().skip(2) {
            assert!(p.is_err(), "record {i} taken");
        }
        batch.release();
        // A described record to a peer that took no view of ours (it
        // does not share) is a bad frame there.
        let (c, d, shares) = sharing(&dir, 8, Some(guest_ram(&ram, SEALED).1), None);
        assert!(!shares);
        assert_eq!(c.send([2, 0, 0, 1, 8, 2], &records[0]), Sent::Local);
        let mut other = Batch::default();
        d.recv(8, Wake::Ring, &mut other);
        assert_eq!(other.len(), 1);
        assert!(other.packets().all(|p| p.is_err()));
        other.release();
        drop((c, d));
        drop((a, b));
        let _ = std::fs::remove_dir_all(&dir);
    }

    const MAX_RUNS_PLUS: usize = rdma_transport::packet::MAX_RUNS + 1;

    /// `settle` (before an MR goes or changes its pages) waits until the
    /// peer has read past the described records that read from that MR,
    /// not for those of other MRs; a peer that does not within the wait is
    /// dropped, and told BYE, so that it never copies from the record.
    #[test]
    fn settling_waits_for_the_peer_to_read_described_records_of_the_mr() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-st-{}", std::process::id()));
        let ro = || Some(guest_ram(b"", SEALED).1);
        let (a, b, shares) = sharing(&dir, 7, ro(), ro());
        assert!(shares);
        let mb = [2, 0, 0, 1, 7, 2];
        let rec = described(
            &[Run { at: 0, len: 8 }],
            8,
            &header(rdma_transport::opcode::Opcode::RcRdmaWriteOnly, &[]),
        );
        let mut write = |out: &mut [u8]| {
            out.copy_from_slice(&rec);
            true
        };
        const MR: u32 = 5;
        assert_eq!(a.settle(MR, Duration::ZERO), 0, "nothing described yet");
        assert_eq!(
            a.send_described(mb, rec.len(), [MR, 9], &mut write),
            Sent::Local
        );
        // An MR the record does not read from: no wait, nobody dropped.
        let t0 = Instant::now();
        assert_eq!(a.settle(6, Duration::from_secs(5)), 0);
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "waited for another MR's record"
        );
        assert!(a.has_ring(mb));
        // B reads it 30 ms later: A waits for that, for either of its MRs.
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(30));
                assert_eq!(recv(&b, 8, Wake::Ring).len(), 1);
            });
            assert_eq!(a.settle(9, Duration::from_secs(5)), 0);
            assert!(t0.elapsed() >= Duration::from_millis(30), "did not wait");
        });
        // B went to sleep: the settle kicks it (it runs inside the worker's
        // run, before the kicks that follow every run).
        assert!(!b.prepare_to_sleep());
        let (kicks, mut watched) = (Kicks::new(), 0);
        kicks.follow(&b, &mut watched);
        kicks.wait(0);
        assert_eq!(
            a.send_described(mb, rec.len(), [MR], &mut write),
            Sent::Local
        );
        std::thread::scope(|s| {
            s.spawn(|| {
                assert_eq!(kicks.wait(2000), 1, "B slept through the settle");
                assert_eq!(recv(&b, 8, Wake::Ring).len(), 1);
            });
            assert_eq!(a.settle(MR, Duration::from_secs(1)), 0);
        });
        // B does not read: A gives up on it after the wait, and B, told
        // BYE, drops the ring with the record unread.
        assert_eq!(
            a.send_described(mb, rec.len(), [MR], &mut write),
            Sent::Local
        );
        assert_eq!(a.settle(MR, Duration::from_millis(20)), 1);
        assert!(!a.has_ring(mb));
        assert!(recv(&b, 8, Wake::Socket).is_empty(), "read after the BYE");
        drop((a, b));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A view lives as long as its ring: a sender that leaves (BYE, as a
    /// migration's source does) takes it with it, and the MAC's next owner
    /// (the migration's destination) hands over a fresh one.
    #[test]
    fn a_view_goes_with_its_ring_and_the_next_owner_offers_its_own() {
        let dir = std::env::temp_dir().join(format!("pvrdma-local-sb-{}", std::process::id()));
        let ro = || Some(guest_ram(b"", SEALED).1);
        let (a, b, shares) = sharing(&dir, 9, ro(), ro());
        assert!(shares);
        let (ma, mb) = ([2, 0, 0, 1, 9, 1], [2, 0, 0, 1, 9, 2]);
        let has_view = |b: &LocalChannel| {
            let inbound = b.inbound.lock().unwrap();
            inbound.get(&ma).is_some_and(|r| r.view.is_some())
        };
        assert!(has_view(&b));
        drop(a);
        recv(&b, 8, Wake::Socket);
        assert!(!has_view(&b), "dropped with the ring");
        let mut a = LocalChannel::bind(&dir, ma, false).unwrap();
        a.share(ro().unwrap());
        assert_eq!(a.send(mb, b"again"), Sent::Local);
        assert_eq!(recv(&b, 8, Wake::Socket), vec![b"again".to_vec()]);
        recv(&a, 8, Wake::Socket);
        assert!(has_view(&b) && a.shares_with(mb), "a fresh view");
        drop((a, b));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

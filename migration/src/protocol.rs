// SPDX-License-Identifier: Apache-2.0
//! The migration stream between two VMMs: the source sends requests, the
//! destination answers each with a response (memory included, so an error
//! on the destination stops the source at the next batch, not the end).
//!
//! ```text
//! request:  magic "PVRDMAMG" | command u32 | reserved u32 | length u64 | payload
//! response: magic "PVRDMAMG" | status  u32 | reserved u32 | length u64 | message
//! ```
//!
//! All integers little-endian. `Start` carries [`PROTOCOL_VERSION`];
//! `Config` the VM configuration (JSON); `Cpuid` the CPUID of each vCPU
//! (a snapshot's bytes), sent before any memory so that a destination
//! whose CPU lacks a feature the guest uses refuses before the copy, with
//! the VM still running on the source; `Hints` the devices' restore hints
//! (a snapshot's bytes: what the destination can make before the state
//! comes, such as descriptors per object), right after, and again after
//! the last pre-copy pass (state that may stay the same until the pause,
//! decoded ahead); `Memory` a [`MemoryRangeTable`]
//! then the bytes of its ranges in order; `State` the VM's state (a
//! snapshot's bytes); `Complete` hands the VM over: the source stopped it
//! for good before sending it, and the destination runs it once it read
//! it, whether or not its answer reaches the source (so the source
//! resumes the VM only on an explicit refusal); `Abandon` tells the
//! destination to drop what it built. The destination never trusts a
//! length: each command has a ceiling and payloads are read incrementally,
//! so memory use follows the bytes that actually arrive.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::io::{self, Read, Write};

const MAGIC: [u8; 8] = *b"PVRDMAMG";
/// Bumped on any change to the framing, a command's payload or meaning
/// (2: `Complete` commits both sides, and needs `State` first; 3: `Cpuid`;
/// 4: `Hints`; 5: `Hints` up to [`MAX_HINTS_BYTES`], with PVRDMA's QPs'
/// fixed parts; 6: `Hints` again just before the switch-over, with
/// PVRDMA's QPs' short parts).
pub const PROTOCOL_VERSION: u32 = 6;
const HEADER_LEN: usize = 24;

/// Largest configuration a destination reads.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Largest CPUID of every vCPU a destination reads: 255 vCPUs of KVM's
/// 256 entries of 40 bytes take 2.5 MiB.
pub const MAX_CPUID_BYTES: u64 = 4 << 20;
/// Largest restore hints a destination reads: a few words per device, and
/// what PVRDMA sends ahead of its QPs (their rings' page lists, at most a
/// million pages).
pub const MAX_HINTS_BYTES: u64 = 16 << 20;
/// Largest VM state (every device, every vCPU) a destination reads.
pub const MAX_STATE_BYTES: u64 = 512 << 20;
/// Largest error message read back from a peer.
const MAX_MESSAGE_BYTES: u64 = 64 << 10;
/// Ranges in one `Memory` batch.
pub const MAX_RANGES: u32 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("Migration stream I/O failed")]
    Io(#[source] io::Error),
    #[error("The other VMM closed the connection (it failed or was stopped: see its log)")]
    Closed(#[source] io::Error),
    #[error("Not a migration stream (bad magic)")]
    Magic,
    #[error("Unknown migration command {0}")]
    UnknownCommand(u32),
    #[error("{command:?} payload of {length} bytes is over its limit of {max}")]
    TooLong {
        command: Command,
        length: u64,
        max: u64,
    },
    #[error("Expected {want:?}, got {got:?}")]
    Unexpected { want: Command, got: Command },
    #[error("The other VMM speaks migration protocol {0}, this one {PROTOCOL_VERSION}")]
    Version(u32),
    #[error("Malformed {0} payload")]
    Malformed(&'static str),
    #[error("Destination refused: {0}")]
    Refused(String),
}

impl From<io::Error> for ProtocolError {
    /// A peer that went away is told apart from other I/O errors: it is
    /// the usual way a migration ends early on the other side.
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof => Self::Closed(e),
            _ => Self::Io(e),
        }
    }
}

/// What the source asks of the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Command {
    Start = 1,
    Config = 2,
    Memory = 3,
    State = 4,
    Complete = 5,
    Abandon = 6,
    Cpuid = 7,
    Hints = 8,
}

impl Command {
    fn from_u32(v: u32) -> Result<Self, ProtocolError> {
        Ok(match v {
            1 => Self::Start,
            2 => Self::Config,
            3 => Self::Memory,
            4 => Self::State,
            5 => Self::Complete,
            6 => Self::Abandon,
            7 => Self::Cpuid,
            8 => Self::Hints,
            other => return Err(ProtocolError::UnknownCommand(other)),
        })
    }

    /// The most payload a destination accepts for this command; memory
    /// batches are bounded by the guest's size instead (checked range by
    /// range as they are written).
    fn max_payload(self, guest_bytes: u64) -> u64 {
        match self {
            Self::Start => 4,
            Self::Config => MAX_CONFIG_BYTES,
            Self::Cpuid => MAX_CPUID_BYTES,
            Self::Hints => MAX_HINTS_BYTES,
            Self::Memory => guest_bytes.saturating_add(16u64.saturating_mul(MAX_RANGES.into())),
            Self::State => MAX_STATE_BYTES,
            Self::Complete | Self::Abandon => 0,
        }
    }
}

fn header(word: u32, length: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    let (magic, rest) = h.split_at_mut(8);
    magic.copy_from_slice(&MAGIC);
    let (w, rest) = rest.split_at_mut(4);
    w.copy_from_slice(&word.to_le_bytes());
    let (_, len) = rest.split_at_mut(4);
    len.copy_from_slice(&length.to_le_bytes());
    h
}

fn read_header<R: Read + ?Sized>(r: &mut R) -> Result<(u32, u64), ProtocolError> {
    let mut h = [0u8; HEADER_LEN];
    r.read_exact(&mut h)?;
    let (magic, rest) = h.split_first_chunk::<8>().ok_or(ProtocolError::Magic)?;
    if *magic != MAGIC {
        return Err(ProtocolError::Magic);
    }
    let (word, rest) = rest.split_first_chunk::<4>().ok_or(ProtocolError::Magic)?;
    let (_, rest) = rest.split_first_chunk::<4>().ok_or(ProtocolError::Magic)?;
    let (len, _) = rest.split_first_chunk::<8>().ok_or(ProtocolError::Magic)?;
    Ok((u32::from_le_bytes(*word), u64::from_le_bytes(*len)))
}

/// Reads exactly `length` bytes, growing the buffer as they arrive.
fn read_payload<R: Read + ?Sized>(r: &mut R, length: u64) -> Result<Vec<u8>, ProtocolError> {
    let mut buf = Vec::new();
    r.take(length).read_to_end(&mut buf)?;
    if buf.len() as u64 != length {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    Ok(buf)
}

/// Sends a request with a payload held in memory.
pub fn send_request<W: Write + ?Sized>(
    w: &mut W,
    command: Command,
    payload: &[u8],
) -> io::Result<()> {
    w.write_all(&header(command as u32, payload.len() as u64))?;
    w.write_all(payload)?;
    w.flush()
}

/// Sends only the header of a request whose `length` payload bytes the
/// caller writes next (memory, streamed from guest RAM).
pub fn send_request_header<W: Write + ?Sized>(
    w: &mut W,
    command: Command,
    length: u64,
) -> io::Result<()> {
    w.write_all(&header(command as u32, length))
}

/// A request as the destination sees it: the command and its payload
/// length, checked against the command's ceiling. The payload is still in
/// the stream.
#[derive(Debug)]
pub struct RequestHeader {
    pub command: Command,
    pub length: u64,
}

pub fn read_request_header<R: Read + ?Sized>(
    r: &mut R,
    guest_bytes: u64,
) -> Result<RequestHeader, ProtocolError> {
    let (word, length) = read_header(r)?;
    let command = Command::from_u32(word)?;
    let max = command.max_payload(guest_bytes);
    if length > max {
        return Err(ProtocolError::TooLong {
            command,
            length,
            max,
        });
    }
    Ok(RequestHeader { command, length })
}

impl RequestHeader {
    /// The whole payload (commands other than `Memory`).
    pub fn payload<R: Read + ?Sized>(&self, r: &mut R) -> Result<Vec<u8>, ProtocolError> {
        read_payload(r, self.length)
    }

    pub fn expect(&self, want: Command) -> Result<(), ProtocolError> {
        if self.command == want {
            Ok(())
        } else {
            Err(ProtocolError::Unexpected {
                want,
                got: self.command,
            })
        }
    }
}

/// The `Start` payload.
pub fn start_payload() -> [u8; 4] {
    PROTOCOL_VERSION.to_le_bytes()
}

/// Checks a `Start` payload.
pub fn check_start(payload: &[u8]) -> Result<(), ProtocolError> {
    let version = <[u8; 4]>::try_from(payload).map_err(|_| ProtocolError::Malformed("Start"))?;
    match u32::from_le_bytes(version) {
        PROTOCOL_VERSION => Ok(()),
        other => Err(ProtocolError::Version(other)),
    }
}

const STATUS_OK: u32 = 0;
const STATUS_ERROR: u32 = 1;

/// The destination's answer: done, or why not.
pub fn send_response<W: Write + ?Sized>(w: &mut W, result: Result<(), &str>) -> io::Result<()> {
    match result {
        Ok(()) => w.write_all(&header(STATUS_OK, 0))?,
        Err(msg) => {
            w.write_all(&header(STATUS_ERROR, msg.len() as u64))?;
            w.write_all(msg.as_bytes())?;
        }
    }
    w.flush()
}

/// Waits for the destination's answer to the last request.
pub fn read_response<R: Read + ?Sized>(r: &mut R) -> Result<(), ProtocolError> {
    let (status, length) = read_header(r)?;
    let message = read_payload(r, length.min(MAX_MESSAGE_BYTES))?;
    match status {
        STATUS_OK => Ok(()),
        _ => Err(ProtocolError::Refused(
            String::from_utf8_lossy(&message).into_owned(),
        )),
    }
}

/// Guest-physical ranges of one `Memory` batch, sent before their bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryRangeTable {
    ranges: Vec<(u64, u64)>,
}

impl MemoryRangeTable {
    /// Ranges of set bits in `bitmap` (bit `i` = page `i`, from `base`),
    /// adjacent pages merged.
    pub fn from_bitmap(bitmap: &[u64], base: u64, page_size: u64) -> Self {
        let mut table = Self::default();
        for (word_index, &word) in bitmap.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let bit = u64::from(bits.trailing_zeros());
                bits &= bits.wrapping_sub(1);
                let page = (word_index as u64).wrapping_mul(64).wrapping_add(bit);
                table.push(base.wrapping_add(page.wrapping_mul(page_size)), page_size);
            }
        }
        table
    }

    /// Appends a range, merged with the last one when they touch.
    pub fn push(&mut self, gpa: u64, len: u64) {
        if let Some(last) = self.ranges.last_mut() {
            if last.0.checked_add(last.1) == Some(gpa) {
                last.1 = last.1.saturating_add(len);
                return;
            }
        }
        self.ranges.push((gpa, len));
    }

    pub fn extend(&mut self, other: Self) {
        for (gpa, len) in other.ranges {
            self.push(gpa, len);
        }
    }

    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Bytes the ranges cover.
    pub fn bytes(&self) -> u64 {
        self.ranges
            .iter()
            .fold(0u64, |acc, &(_, len)| acc.saturating_add(len))
    }

    /// Splits into tables of at most `max` bytes each (ranges cut where
    /// needed), so one batch never holds the stream for too long.
    pub fn split(&self, max: u64) -> Vec<Self> {
        let max = max.max(1);
        let mut out = vec![Self::default()];
        let mut room = max;
        for &(mut gpa, mut len) in &self.ranges {
            while len > 0 {
                if room == 0 {
                    out.push(Self::default());
                    room = max;
                }
                let take = len.min(room);
                if let Some(t) = out.last_mut() {
                    t.push(gpa, take);
                }
                gpa = gpa.saturating_add(take);
                len = len.saturating_sub(take);
                room = room.saturating_sub(take);
            }
        }
        out.retain(|t| !t.is_empty());
        out
    }

    /// Table bytes: count u32, then (gpa u64, len u64) per range.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.ranges.len().saturating_mul(16).saturating_add(4));
        out.extend_from_slice(&(self.ranges.len() as u32).to_le_bytes());
        for &(gpa, len) in &self.ranges {
            out.extend_from_slice(&gpa.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
        out
    }

    /// Bytes of the encoded table.
    pub fn encoded_len(&self) -> u64 {
        (self.ranges.len() as u64)
            .saturating_mul(16)
            .saturating_add(4)
    }

    /// Reads a table from the start of a `Memory` payload of `length`
    /// bytes; the ranges' bytes must fill the rest exactly.
    pub fn read<R: Read + ?Sized>(r: &mut R, length: u64) -> Result<Self, ProtocolError> {
        let mut count = [0u8; 4];
        r.read_exact(&mut count)?;
        let count = u32::from_le_bytes(count);
        let table_len = u64::from(count).saturating_mul(16).saturating_add(4);
        if count > MAX_RANGES || table_len > length {
            return Err(ProtocolError::Malformed("Memory range table"));
        }
        let raw = read_payload(r, table_len.saturating_sub(4))?;
        let mut table = Self::default();
        for entry in raw.chunks_exact(16) {
            let (gpa, len) = entry.split_at(8);
            let gpa = u64::from_le_bytes(
                gpa.try_into()
                    .map_err(|_| ProtocolError::Malformed("range"))?,
            );
            let len = u64::from_le_bytes(
                len.try_into()
                    .map_err(|_| ProtocolError::Malformed("range"))?,
            );
            table.ranges.push((gpa, len));
        }
        if table_len.checked_add(table.bytes()) != Some(length) {
            return Err(ProtocolError::Malformed("Memory length"));
        }
        Ok(table)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_ranges_merge_adjacent_pages() {
        let t = MemoryRangeTable::from_bitmap(&[0b1011, 1 << 63, 1], 0x10_0000, 4096);
        assert_eq!(
            t.ranges(),
            &[
                (0x10_0000, 2 * 4096),
                (0x10_0000 + 3 * 4096, 4096),
                (0x10_0000 + 127 * 4096, 2 * 4096)
            ]
        );
        assert_eq!(t.bytes(), 5 * 4096);
    }

    #[test]
    fn split_cuts_ranges_at_the_batch_size() {
        let mut t = MemoryRangeTable::default();
        t.push(0, 10);
        t.push(100, 5);
        let parts = t.split(4);
        let total: u64 = parts.iter().map(MemoryRangeTable::bytes).sum();
        assert_eq!(total, 15);
        assert!(parts.iter().all(|p| p.bytes() <= 4));
        assert_eq!(parts[0].ranges(), &[(0, 4)]);
        assert_eq!(parts[2].ranges(), &[(8, 2), (100, 2)]);
    }

    #[test]
    fn table_round_trip_and_length_checks() {
        let mut t = MemoryRangeTable::default();
        t.push(0x1000, 0x2000);
        t.push(0x8000, 0x1000);
        let enc = t.encode();
        let len = enc.len() as u64 + t.bytes();
        assert_eq!(MemoryRangeTable::read(&mut &enc[..], len).unwrap(), t);
        assert!(MemoryRangeTable::read(&mut &enc[..], len + 1).is_err());
        // A count larger than the payload is refused before any allocation.
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(&[0; 16]);
        assert!(MemoryRangeTable::read(&mut &huge[..], 20).is_err());
    }

    #[test]
    fn requests_and_responses_frame() {
        let mut wire = Vec::new();
        send_request(&mut wire, Command::Start, &start_payload()).unwrap();
        send_request(&mut wire, Command::Config, b"{}").unwrap();
        let mut r = &wire[..];
        let h = read_request_header(&mut r, 1 << 30).unwrap();
        h.expect(Command::Start).unwrap();
        check_start(&h.payload(&mut r).unwrap()).unwrap();
        let h = read_request_header(&mut r, 1 << 30).unwrap();
        assert!(h.expect(Command::Start).is_err());
        assert_eq!(h.payload(&mut r).unwrap(), b"{}");

        let mut wire = Vec::new();
        send_response(&mut wire, Ok(())).unwrap();
        send_response(&mut wire, Err("no room")).unwrap();
        let mut r = &wire[..];
        read_response(&mut r).unwrap();
        assert!(matches!(read_response(&mut r), Err(ProtocolError::Refused(m)) if m == "no room"));
    }

    #[test]
    fn hostile_headers_are_refused() {
        let mut r = &header(Command::Config as u32, MAX_CONFIG_BYTES + 1)[..];
        assert!(matches!(
            read_request_header(&mut r, 0),
            Err(ProtocolError::TooLong { .. })
        ));
        let mut r = &header(77, 0)[..];
        assert!(matches!(
            read_request_header(&mut r, 0),
            Err(ProtocolError::UnknownCommand(77))
        ));
        let mut bad = header(1, 4);
        bad[0] = b'X';
        assert!(matches!(
            read_request_header(&mut &bad[..], 0),
            Err(ProtocolError::Magic)
        ));
        assert!(matches!(
            check_start(&1u32.to_le_bytes()),
            Err(ProtocolError::Version(1))
        ));
        // A declared length with fewer bytes behind it is an EOF, not a hang.
        let mut short = header(Command::State as u32, 100).to_vec();
        short.extend_from_slice(b"abc");
        let mut r = &short[..];
        let h = read_request_header(&mut r, 0).unwrap();
        assert!(h.payload(&mut r).is_err());
    }

    #[test]
    fn a_peer_that_went_away_is_named_so() {
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        drop(b);
        let err = read_response(&mut a).unwrap_err();
        assert!(matches!(err, ProtocolError::Closed(_)), "{err:?}");
        assert!(err.to_string().contains("closed the connection"));
        let err = ProtocolError::from(io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(matches!(err, ProtocolError::Io(_)));
    }
}

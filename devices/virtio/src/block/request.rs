// SPDX-License-Identifier: Apache-2.0
//! One virtio-blk request: a descriptor chain holding a 16-byte header,
//! optional data and a trailing status byte (VIRTIO 1.2 §5.2.6).
//!
//! Everything in a chain is guest-controlled. Handling runs in two steps:
//!
//! 1. [`check_chain`] walks the chain once, bounded, to find where the status
//!    byte goes. A chain without a usable status byte (cut short by a loop or
//!    a bad index, ending in a read-only or empty descriptor, or pointing
//!    outside guest RAM) is returned to the driver unanswered.
//! 2. Everything else that is wrong becomes a status: IOERR, or UNSUPP for
//!    request types this device does not implement.
//!
//! The layout is not assumed (§2.7.4, any framing is legal with VERSION_1):
//! virtio-queue's `Reader`/`Writer` present the readable and writable parts
//! as byte streams, so a header split across descriptors works.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use std::io::{self, Read, Write};

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_queue::{DescriptorChain, Reader, Writer};
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

use super::disk::{Disk, OutOfRange, SECTOR_SIZE};

/// Size of `struct virtio_blk_outhdr`: type, reserved (ioprio), sector.
const HEADER_LEN: usize = 16;

/// Most descriptors accepted in one chain. A split ring chain cannot be
/// longer than the queue, but an indirect table (which virtio-queue follows)
/// can hold 4096+ entries; this bounds the per-request allocations that
/// `Reader`/`Writer` make. Linux uses at most `seg_max` + 2.
pub(crate) const MAX_DESCRIPTORS: usize = 256;

/// Why a chain cannot even be answered with a status byte.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ChainError {
    #[error("Chain has no descriptors")]
    Empty,
    #[error("Chain has more than {MAX_DESCRIPTORS} descriptors")]
    TooLong,
    #[error("Chain ends in a descriptor with NEXT set (loop or bad index)")]
    Truncated,
    #[error("Last descriptor is not a device-writable byte")]
    NoStatus,
    #[error("Status byte at {0:#x} is outside guest memory")]
    StatusOutsideMemory(u64),
}

/// Why a request failed; reported to the driver as its status byte.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    #[error("Descriptor outside guest memory")]
    Memory(#[source] virtio_queue::Error),
    /// §2.7.4.2: device-readable descriptors come first.
    #[error("Device-readable descriptor after a device-writable one")]
    Layout,
    #[error("Request header is shorter than {HEADER_LEN} bytes")]
    ShortHeader,
    #[error("{0} buffers have the wrong direction for this request type")]
    Direction(&'static str),
    #[error("Data length {0} is not a multiple of 512")]
    UnalignedLength(u64),
    #[error(transparent)]
    OutOfRange(#[from] OutOfRange),
    #[error("Write to a read-only disk")]
    ReadOnly,
    #[error("Failed to read the disk image")]
    Read(#[source] io::Error),
    #[error("Failed to write the disk image")]
    Write(#[source] io::Error),
    #[error("Failed to flush the disk image")]
    Flush(#[source] io::Error),
    #[error("Failed to copy the device id to the guest")]
    GetId(#[source] io::Error),
    #[error("Unsupported request type {0}")]
    Unsupported(u32),
}

impl RequestError {
    /// The status byte reporting this error (§5.2.6).
    fn status(&self) -> u8 {
        let status = match self {
            Self::Unsupported(_) => VIRTIO_BLK_S_UNSUPP,
            _ => VIRTIO_BLK_S_IOERR,
        };
        u8::try_from(status).unwrap_or(u8::MAX)
    }
}

/// Serves the request in `chain` and returns the used length: the bytes
/// the device wrote into the chain's buffers, status byte included, or 0
/// when the chain was malformed beyond answering.
pub(crate) fn handle_request<M: GuestMemory>(
    disk: &mut Disk,
    chain: DescriptorChain<&M>,
    mem: &M,
) -> u32 {
    let status_addr = match check_chain(&chain, mem) {
        Ok(addr) => addr,
        Err(e) => {
            disk.counters.chain_dropped.inc();
            guest_warn!("virtio-blk: dropped request {}: {e}", chain.head_index());
            return 0;
        }
    };
    let (result, data_written) = execute(disk, chain, mem);
    let status = match &result {
        Ok(()) => u8::try_from(VIRTIO_BLK_S_OK).unwrap_or(0),
        Err(e) => {
            match e {
                RequestError::Unsupported(_) => disk.counters.request_unsupported.inc(),
                _ => disk.counters.request_error.inc(),
            };
            guest_warn!("virtio-blk: request failed: {e}");
            e.status()
        }
    };
    if let Err(e) = mem.write_obj(status, status_addr) {
        // check_chain found this byte in RAM; only a memory unplug between
        // the two accesses could get here.
        guest_warn!("virtio-blk: failed to write status: {e}");
        return 0;
    }
    // §2.7.8.1: len may only count bytes actually written, and counts from
    // the first writable byte. The status is last, so it only counts when
    // all data before it was written, which is the success case.
    match result {
        Ok(()) => u32::try_from(data_written)
            .ok()
            .and_then(|n| n.checked_add(1))
            .unwrap_or(0),
        Err(_) => u32::try_from(data_written).unwrap_or(0),
    }
}

/// Walks the chain once to find the status byte: the last byte of the last
/// descriptor, which must be device-writable and in guest memory.
fn check_chain<M: GuestMemory>(
    chain: &DescriptorChain<&M>,
    mem: &M,
) -> Result<GuestAddress, ChainError> {
    let mut count = 0usize;
    let mut last = None;
    // The walk is bounded by virtio-queue (a ttl and a u32 byte total) and,
    // for indirect tables, by MAX_DESCRIPTORS here.
    for desc in chain.clone() {
        count = count.checked_add(1).ok_or(ChainError::TooLong)?;
        if count > MAX_DESCRIPTORS {
            return Err(ChainError::TooLong);
        }
        last = Some(desc);
    }
    let last = last.ok_or(ChainError::Empty)?;
    // virtio-queue ends a walk silently when the ttl runs out (a loop), the
    // next index is out of range or the next descriptor cannot be read:
    // then the last descriptor seen still has NEXT set.
    if last.has_next() {
        return Err(ChainError::Truncated);
    }
    if !last.is_write_only() {
        return Err(ChainError::NoStatus);
    }
    let addr = last
        .len()
        .checked_sub(1)
        .and_then(|off| last.addr().checked_add(u64::from(off)))
        .ok_or(ChainError::NoStatus)?;
    if !mem.check_range(addr, 1, Permissions::Write) {
        return Err(ChainError::StatusOutsideMemory(addr.raw_value()));
    }
    Ok(addr)
}

/// Runs the request; returns its result and the number of data bytes
/// written into guest buffers (which counts even when the request failed).
fn execute<M: GuestMemory>(
    disk: &mut Disk,
    chain: DescriptorChain<&M>,
    mem: &M,
) -> (Result<(), RequestError>, usize) {
    if chain
        .clone()
        .skip_while(|d| !d.is_write_only())
        .any(|d| !d.is_write_only())
    {
        return (Err(RequestError::Layout), 0);
    }
    let reader = match Reader::new(mem, chain.clone()) {
        Ok(r) => r,
        Err(e) => return (Err(RequestError::Memory(e)), 0),
    };
    let mut data = match Writer::new(mem, chain) {
        Ok(w) => w,
        Err(e) => return (Err(RequestError::Memory(e)), 0),
    };
    // Cut the status byte (checked to be the last writable byte) off the
    // data; it is written separately, whatever happens here.
    let status_at = data.available_bytes().saturating_sub(1);
    if let Err(e) = data.split_at(status_at) {
        return (Err(RequestError::Memory(e)), 0);
    }
    let result = run(disk, reader, &mut data);
    (result, data.bytes_written())
}

/// Dispatches on the request type. `reader` holds the header and any
/// driver-supplied data; `data` the device-writable buffers before status.
fn run<B: BitmapSlice>(
    disk: &mut Disk,
    mut reader: Reader<'_, B>,
    data: &mut Writer<'_, B>,
) -> Result<(), RequestError> {
    if reader.available_bytes() < HEADER_LEN {
        return Err(RequestError::ShortHeader);
    }
    let request_type = u32::from_le_bytes(read_array(&mut reader)?);
    let _ioprio: [u8; 4] = read_array(&mut reader)?;
    let sector = u64::from_le_bytes(read_array(&mut reader)?);

    match request_type {
        VIRTIO_BLK_T_IN => {
            expect_empty(reader.available_bytes(), "Device-readable")?;
            let len = data_len(data.available_bytes())?;
            let offset = disk.offset_of(sector, len)?;
            disk.read_to(offset, len, data)
                .map_err(RequestError::Read)?;
            disk.counters.read_requests.inc();
            disk.counters.read_bytes.add(len);
            Ok(())
        }
        VIRTIO_BLK_T_OUT => {
            expect_empty(data.available_bytes(), "Device-writable")?;
            if disk.readonly() {
                return Err(RequestError::ReadOnly);
            }
            let len = data_len(reader.available_bytes())?;
            let offset = disk.offset_of(sector, len)?;
            disk.write_from(offset, len, &mut reader)
                .map_err(RequestError::Write)?;
            disk.counters.write_requests.inc();
            disk.counters.write_bytes.add(len);
            Ok(())
        }
        // Nothing to flush on a read-only image, but fdatasync is harmless.
        VIRTIO_BLK_T_FLUSH => {
            disk.flush().map_err(RequestError::Flush)?;
            disk.counters.flush_requests.inc();
            Ok(())
        }
        VIRTIO_BLK_T_GET_ID => {
            expect_empty(reader.available_bytes(), "Device-readable")?;
            // A shorter buffer gets a truncated id, as in QEMU.
            let serial = disk.serial();
            let len = data.available_bytes().min(serial.len());
            let id = serial.get(..len).unwrap_or_default();
            data.write_all(id).map_err(RequestError::GetId)?;
            disk.counters.get_id_requests.inc();
            Ok(())
        }
        other => Err(RequestError::Unsupported(other)),
    }
}

fn read_array<const N: usize>(reader: &mut impl Read) -> Result<[u8; N], RequestError> {
    let mut bytes = [0u8; N];
    reader
        .read_exact(&mut bytes)
        .map_err(|_| RequestError::ShortHeader)?;
    Ok(bytes)
}

/// Data buffers in the direction a request does not use mean the driver
/// mixed up the flags; proceeding would silently move no data.
fn expect_empty(len: usize, which: &'static str) -> Result<(), RequestError> {
    if len == 0 {
        Ok(())
    } else {
        Err(RequestError::Direction(which))
    }
}

/// §5.2.6.1: IN and OUT data is a whole number of sectors.
fn data_len(len: usize) -> Result<u64, RequestError> {
    let len = u64::try_from(len).unwrap_or(u64::MAX);
    if len % SECTOR_SIZE == 0 {
        Ok(len)
    } else {
        Err(RequestError::UnalignedLength(len))
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )]

    use virtio_bindings::virtio_blk::VIRTIO_BLK_T_DISCARD;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT};
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use vmm_sys_util::tempfile::TempFile;

    use super::*;
    use crate::block::test_utils::*;

    const TABLE: u64 = 0x4_0000;
    /// Poison in the status byte, to see whether the device wrote it.
    const UNTOUCHED: u8 = 0xee;
    const OK: u8 = VIRTIO_BLK_S_OK as u8;
    const IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
    const UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;

    struct Fixture {
        mem: Mem,
        disk: Disk,
        file: TempFile,
    }

    impl Fixture {
        fn new(sectors: u64, readonly: bool) -> Self {
            let file = image(sectors);
            let disk = Disk::open(file.as_path(), readonly, "vd-serial").unwrap();
            Self {
                mem: guest_memory(),
                disk,
                file,
            }
        }

        /// Submits a chain of (addr, len, flags) descriptors (NEXT is added)
        /// and returns the used length and the status byte.
        fn submit(&mut self, descs: &[(u64, u32, u16)]) -> (u32, u8) {
            let raw: Vec<_> = descs.iter().map(|&(a, l, f)| desc(a, l, f, 0)).collect();
            self.submit_raw(&raw, false)
        }

        /// Submits descriptors exactly as given (flags and next untouched).
        fn submit_linked(&mut self, raw: &[RawDescriptor]) -> (u32, u8) {
            self.submit_raw(raw, true)
        }

        fn submit_raw(&mut self, raw: &[RawDescriptor], linked: bool) -> (u32, u8) {
            self.mem.write_obj(UNTOUCHED, GuestAddress(STATUS)).unwrap();
            let vq = MockSplitQueue::new(&self.mem, 16);
            let chain = if linked {
                vq.build_multiple_desc_chains(raw).unwrap()
            } else {
                vq.build_desc_chain(raw).unwrap()
            };
            let len = handle_request(&mut self.disk, chain, &self.mem);
            (len, self.mem.read_obj(GuestAddress(STATUS)).unwrap())
        }

        /// A standard request: header, data descriptors, status.
        fn request(
            &mut self,
            request_type: u32,
            sector: u64,
            data: &[(u64, u32, u16)],
        ) -> (u32, u8) {
            write_header(&self.mem, HDR, request_type, sector);
            let mut descs = vec![(HDR, 16, 0)];
            descs.extend_from_slice(data);
            descs.push((STATUS, 1, W));
            self.submit(&descs)
        }

        fn file_bytes(&self) -> Vec<u8> {
            std::fs::read(self.file.as_path()).unwrap()
        }

        fn guest_bytes(&self, at: u64, len: usize) -> Vec<u8> {
            let mut buf = vec![0; len];
            self.mem.read_slice(&mut buf, GuestAddress(at)).unwrap();
            buf
        }
    }

    #[test]
    fn read_scatters_into_data_buffers() {
        let mut f = Fixture::new(16, false);
        let (len, status) = f.request(
            VIRTIO_BLK_T_IN,
            3,
            &[(DATA, 512, W), (DATA + 0x1000, 1024, W)],
        );
        assert_eq!((len, status), (1536 + 1, OK));
        let want: Vec<u8> = (3 * 512..4 * 512).map(pattern).collect();
        assert_eq!(f.guest_bytes(DATA, 512), want);
        let want: Vec<u8> = (4 * 512..6 * 512).map(pattern).collect();
        assert_eq!(f.guest_bytes(DATA + 0x1000, 1024), want);
    }

    #[test]
    fn write_gathers_from_data_buffers() {
        let mut f = Fixture::new(16, false);
        f.mem.write_slice(&[0xa1; 512], GuestAddress(DATA)).unwrap();
        f.mem
            .write_slice(&[0xb2; 512], GuestAddress(DATA + 0x1000))
            .unwrap();
        let (len, status) = f.request(
            VIRTIO_BLK_T_OUT,
            2,
            &[(DATA, 512, 0), (DATA + 0x1000, 512, 0)],
        );
        assert_eq!((len, status), (1, OK));
        let file = f.file_bytes();
        assert!(file[1024..1536].iter().all(|b| *b == 0xa1));
        assert!(file[1536..2048].iter().all(|b| *b == 0xb2));
        assert_eq!(file[1023], pattern(1023));
        assert_eq!(file[2048], pattern(2048));
    }

    #[test]
    fn flush_and_get_id() {
        let mut f = Fixture::new(4, false);
        assert_eq!(f.request(VIRTIO_BLK_T_FLUSH, 0, &[]), (1, OK));

        let (len, status) = f.request(VIRTIO_BLK_T_GET_ID, 0, &[(DATA, 20, W)]);
        assert_eq!((len, status), (21, OK));
        let mut want = b"vd-serial".to_vec();
        want.resize(20, 0);
        assert_eq!(f.guest_bytes(DATA, 20), want);

        // A short buffer gets a truncated id.
        let (len, status) = f.request(VIRTIO_BLK_T_GET_ID, 0, &[(DATA + 0x100, 4, W)]);
        assert_eq!((len, status), (5, OK));
        assert_eq!(f.guest_bytes(DATA + 0x100, 4), b"vd-s");
    }

    #[test]
    fn header_split_across_descriptors() {
        let mut f = Fixture::new(4, false);
        write_header(&f.mem, HDR, VIRTIO_BLK_T_IN, 1);
        let (len, status) =
            f.submit(&[(HDR, 8, 0), (HDR + 8, 8, 0), (DATA, 512, W), (STATUS, 1, W)]);
        assert_eq!((len, status), (513, OK));
        assert_eq!(f.guest_bytes(DATA, 1)[0], pattern(512));
        // Data and status sharing the last descriptor is legal framing too.
        let (len, status) = f.submit(&[(HDR, 16, 0), (STATUS - 512, 513, W)]);
        assert_eq!((len, status), (513, OK));
        assert_eq!(f.guest_bytes(STATUS - 512, 1)[0], pattern(512));
    }

    #[test]
    fn readonly_disk_rejects_writes() {
        let mut f = Fixture::new(4, true);
        f.mem.write_slice(&[0xcc; 512], GuestAddress(DATA)).unwrap();
        assert_eq!(
            f.request(VIRTIO_BLK_T_OUT, 0, &[(DATA, 512, 0)]),
            (0, IOERR)
        );
        assert_eq!(f.file_bytes()[0], pattern(0));
        // Reads and flushes still work.
        assert_eq!(f.request(VIRTIO_BLK_T_IN, 0, &[(DATA, 512, W)]).1, OK);
        assert_eq!(f.request(VIRTIO_BLK_T_FLUSH, 0, &[]).1, OK);
    }

    #[test]
    fn out_of_range_and_overflowing_sectors() {
        let mut f = Fixture::new(8, false);
        // The last sector is fine, one past is not, nor a range crossing the end.
        assert_eq!(f.request(VIRTIO_BLK_T_IN, 7, &[(DATA, 512, W)]).1, OK);
        assert_eq!(f.request(VIRTIO_BLK_T_IN, 8, &[(DATA, 512, W)]), (0, IOERR));
        assert_eq!(
            f.request(VIRTIO_BLK_T_IN, 7, &[(DATA, 1024, W)]),
            (0, IOERR)
        );
        assert_eq!(
            f.request(VIRTIO_BLK_T_OUT, 8, &[(DATA, 512, 0)]),
            (0, IOERR)
        );
        // sector * 512 and sector * 512 + len overflow u64.
        assert_eq!(
            f.request(VIRTIO_BLK_T_IN, u64::MAX, &[(DATA, 512, W)]),
            (0, IOERR)
        );
        assert_eq!(
            f.request(VIRTIO_BLK_T_OUT, u64::MAX / 512, &[(DATA, 512, 0)]),
            (0, IOERR)
        );
        assert_eq!(
            f.file_bytes().len(),
            8 * 512,
            "nothing written past the end"
        );
    }

    #[test]
    fn unaligned_data_length() {
        let mut f = Fixture::new(8, false);
        assert_eq!(f.request(VIRTIO_BLK_T_IN, 0, &[(DATA, 100, W)]), (0, IOERR));
        assert_eq!(
            f.request(VIRTIO_BLK_T_OUT, 0, &[(DATA, 513, 0)]),
            (0, IOERR)
        );
    }

    #[test]
    fn short_header() {
        let mut f = Fixture::new(8, false);
        write_header(&f.mem, HDR, VIRTIO_BLK_T_IN, 0);
        assert_eq!(
            f.submit(&[(HDR, 8, 0), (DATA, 512, W), (STATUS, 1, W)]),
            (0, IOERR)
        );
        // No readable descriptor at all.
        assert_eq!(f.submit(&[(DATA, 512, W), (STATUS, 1, W)]), (0, IOERR));
    }

    #[test]
    fn unusable_status_drops_the_chain() {
        let mut f = Fixture::new(8, false);
        write_header(&f.mem, HDR, VIRTIO_BLK_T_IN, 0);
        // Read-only status descriptor.
        assert_eq!(
            f.submit(&[(HDR, 16, 0), (DATA, 512, W), (STATUS, 1, 0)]),
            (0, UNTOUCHED)
        );
        // Zero-length status descriptor.
        assert_eq!(
            f.submit(&[(HDR, 16, 0), (DATA, 512, W), (STATUS, 0, W)]),
            (0, UNTOUCHED)
        );
        // Status outside guest memory; the data must not be touched either.
        f.mem.write_slice(&[0; 512], GuestAddress(DATA)).unwrap();
        assert_eq!(
            f.submit(&[(HDR, 16, 0), (DATA, 512, W), (MEM_SIZE + 0x1000, 1, W)])
                .0,
            0
        );
        assert_eq!(f.guest_bytes(DATA, 512), vec![0; 512]);
        // Status address overflowing u64.
        assert_eq!(f.submit(&[(HDR, 16, 0), (u64::MAX, 2, W)]).0, 0);
    }

    #[test]
    fn data_outside_guest_memory() {
        let mut f = Fixture::new(8, false);
        assert_eq!(
            f.request(VIRTIO_BLK_T_IN, 0, &[(MEM_SIZE - 256, 512, W)]),
            (0, IOERR)
        );
        assert_eq!(
            f.request(VIRTIO_BLK_T_OUT, 0, &[(MEM_SIZE + 0x1000, 512, 0)]),
            (0, IOERR)
        );
        assert_eq!(
            f.request(VIRTIO_BLK_T_IN, 0, &[(u64::MAX - 100, 512, W)]),
            (0, IOERR)
        );
        assert_eq!(f.file_bytes()[0], pattern(0));
    }

    #[test]
    fn direction_mismatches() {
        let mut f = Fixture::new(8, false);
        // IN with a device-readable data buffer: nothing could be read into it.
        assert_eq!(f.request(VIRTIO_BLK_T_IN, 0, &[(DATA, 512, 0)]), (0, IOERR));
        // OUT with a device-writable data buffer.
        assert_eq!(
            f.request(VIRTIO_BLK_T_OUT, 0, &[(DATA, 512, W)]),
            (0, IOERR)
        );
        assert_eq!(
            f.file_bytes()[..512],
            (0..512).map(pattern).collect::<Vec<_>>()
        );
        // GET_ID into a read-only buffer.
        assert_eq!(
            f.request(VIRTIO_BLK_T_GET_ID, 0, &[(DATA, 20, 0)]),
            (0, IOERR)
        );
        // A readable descriptor after a writable one breaks §2.7.4.2.
        write_header(&f.mem, HDR, VIRTIO_BLK_T_IN, 0);
        assert_eq!(
            f.submit(&[
                (HDR, 16, 0),
                (DATA, 512, W),
                (DATA + 0x1000, 512, 0),
                (STATUS, 1, W)
            ]),
            (0, IOERR)
        );
    }

    #[test]
    fn unsupported_types() {
        let mut f = Fixture::new(8, false);
        for t in [VIRTIO_BLK_T_DISCARD, 2, 0x8000_0000, u32::MAX] {
            assert_eq!(f.request(t, 0, &[]), (0, UNSUPP), "type {t:#x}");
        }
    }

    /// Every outcome lands on its counter, successes with their bytes.
    #[test]
    fn counters_follow_the_requests() {
        use pci::DeviceCounters;

        let mut f = Fixture::new(16, true);
        assert_eq!(f.request(VIRTIO_BLK_T_IN, 0, &[(DATA, 1024, W)]).1, OK);
        assert_eq!(f.request(VIRTIO_BLK_T_IN, 4, &[(DATA, 512, W)]).1, OK);
        assert_eq!(f.request(VIRTIO_BLK_T_OUT, 0, &[(DATA, 512, 0)]).1, IOERR);
        assert_eq!(f.request(VIRTIO_BLK_T_FLUSH, 0, &[]).1, OK);
        assert_eq!(f.request(VIRTIO_BLK_T_GET_ID, 0, &[(DATA, 20, W)]).1, OK);
        assert_eq!(f.request(VIRTIO_BLK_T_DISCARD, 0, &[]).1, UNSUPP);
        assert_eq!(f.submit(&[(HDR, 16, 0), (STATUS, 1, 0)]).1, UNTOUCHED);
        let c = &f.disk.counters;
        assert_eq!(
            c.values(),
            [
                ("read_requests", 2),
                ("read_bytes", 1536),
                ("write_requests", 0),
                ("write_bytes", 0),
                ("flush_requests", 1),
                ("get_id_requests", 1),
                ("request_error", 1),
                ("request_unsupported", 1),
                ("chain_dropped", 1),
                ("queue_broken", 0),
            ]
        );

        let mut f = Fixture::new(16, false);
        assert_eq!(f.request(VIRTIO_BLK_T_OUT, 1, &[(DATA, 2048, 0)]).1, OK);
        let c = &f.disk.counters;
        assert_eq!((c.write_requests.get(), c.write_bytes.get()), (1, 2048));
    }

    #[test]
    fn descriptor_loop_is_dropped() {
        let mut f = Fixture::new(8, false);
        write_header(&f.mem, HDR, VIRTIO_BLK_T_FLUSH, 0);
        let next = VRING_DESC_F_NEXT as u16;
        let looped = [desc(HDR, 16, next, 1), desc(STATUS, 1, W | next, 0)];
        assert_eq!(f.submit_linked(&looped), (0, UNTOUCHED));
        // A next index outside the table.
        let dangling = [desc(HDR, 16, next, 1), desc(STATUS, 1, W | next, 99)];
        assert_eq!(f.submit_linked(&dangling), (0, UNTOUCHED));
    }

    #[test]
    fn oversized_indirect_table_is_dropped() {
        let mut f = Fixture::new(8, false);
        write_header(&f.mem, HDR, VIRTIO_BLK_T_FLUSH, 0);
        let n = MAX_DESCRIPTORS + 1;
        for i in 0..n {
            let d = if i == 0 {
                desc(HDR, 16, VRING_DESC_F_NEXT as u16, 1)
            } else if i == n - 1 {
                desc(STATUS, 1, W, 0)
            } else {
                desc(DATA, 0, W | VRING_DESC_F_NEXT as u16, (i + 1) as u16)
            };
            f.mem
                .write_obj(d, GuestAddress(TABLE + 16 * i as u64))
                .unwrap();
        }
        let indirect = (TABLE, (16 * n) as u32, VRING_DESC_F_INDIRECT as u16);
        assert_eq!(f.submit(&[indirect]), (0, UNTOUCHED));
        // The same table one entry shorter is served.
        f.mem
            .write_obj(
                desc(STATUS, 1, W, 0),
                GuestAddress(TABLE + 16 * (n as u64 - 2)),
            )
            .unwrap();
        let indirect = (TABLE, (16 * (n - 1)) as u32, VRING_DESC_F_INDIRECT as u16);
        assert_eq!(f.submit(&[indirect]), (1, OK));
    }
}

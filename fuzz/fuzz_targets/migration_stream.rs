// SPDX-License-Identifier: Apache-2.0
//! The migration stream (`vm_migration::protocol`) on the fuzzer's bytes, both ends:
//! - as a destination reads it: up to 64 framed requests, each header checked against its
//!   command's ceiling, payloads read incrementally; `Start` checked, `Config` parsed as JSON
//!   (which turns on a 1 MiB guest), `Memory` read as a `MemoryRangeTable` whose ranges must
//!   lie in that guest and whose bytes are copied there, `State` decoded as a `Snapshot` (its state as nested snapshots); the
//!   destination's answer to each goes into a reply stream, which then reads back;
//! - as a source reads the destination's answers (`read_response`);
//! - the range tables themselves: built from a fuzzer bitmap, split into batches.
//!
//! Invariants: no panic; no allocation over `-malloc_limit_mb` (a declared length is never
//! trusted); work bounded by the input's length; a range table that decodes re-encodes to
//! the bytes it came from and covers exactly the payload; a decoded snapshot re-encodes to
//! one that decodes equal; the destination's answers read back as sent; a table from a
//! bitmap covers the bitmap's pages, round-trips through its encoding, and splits into
//! batches within the limit that cover the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pvrdma_vmm_fuzz::Input;
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, Permissions};
use vm_migration::protocol::{
    check_start, read_request_header, read_response, send_response, Command, MemoryRangeTable,
    ProtocolError,
};
use vm_migration::Snapshot;

const MAX_REQUESTS: usize = 64;
/// The destination's guest once a configuration arrived.
const GUEST_BYTES: u64 = 1 << 20;
const PAGE: u64 = 4096;
/// Most batches a split may produce here (the source splits its own tables, never a peer's).
const MAX_BATCHES: u64 = 4096;

/// Reads a `Memory` payload of `length` bytes into `mem`: the table, then each range's bytes.
fn receive_memory(
    stream: &mut &[u8],
    mem: &GuestMemoryMmap<()>,
    length: u64,
) -> Result<(), String> {
    let before = *stream;
    let table = MemoryRangeTable::read(stream, length).map_err(|e| e.to_string())?;
    let consumed = before.len() - stream.len();
    assert_eq!(table.encode(), before[..consumed], "the table re-encodes");
    assert_eq!(table.encoded_len(), consumed as u64);
    assert_eq!(table.encoded_len().checked_add(table.bytes()), Some(length));
    let mut buf = vec![0u8; 4096];
    for &(gpa, len) in table.ranges() {
        let fits = usize::try_from(len)
            .is_ok_and(|n| mem.check_range(GuestAddress(gpa), n, Permissions::Write));
        if !fits {
            return Err(format!("range {gpa:#x}+{len:#x} is outside guest RAM"));
        }
        let mut done = 0;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            std::io::Read::read_exact(stream, &mut buf[..n]).map_err(|e| e.to_string())?;
            mem.write_slice(&buf[..n], GuestAddress(gpa + done))
                .map_err(|e| e.to_string())?;
            done += n as u64;
        }
    }
    Ok(())
}

fn state(payload: &[u8]) -> Result<(), String> {
    let snapshot = Snapshot::from_bytes(payload).map_err(|e| e.to_string())?;
    let again = Snapshot::from_bytes(&snapshot.to_bytes()).expect("a snapshot re-encodes");
    assert_eq!(again, snapshot);
    // The binary state names no types: decode it as what a bus holds, nested snapshots.
    snapshot
        .state::<Vec<Snapshot>>(&snapshot.id, snapshot.version)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The destination's loop; returns its answers as they went back on the wire, with what was
/// sent.
fn destination(mut stream: &[u8]) -> (Vec<u8>, Vec<Result<(), String>>) {
    let mut guest: Option<GuestMemoryMmap<()>> = None;
    let mut wire = Vec::new();
    let mut sent = Vec::new();
    for _ in 0..MAX_REQUESTS {
        let guest_bytes = if guest.is_some() { GUEST_BYTES } else { 0 };
        let Ok(header) = read_request_header(&mut stream, guest_bytes) else {
            break;
        };
        let payload = |s: &mut &[u8]| header.payload(s).map_err(|e: ProtocolError| e.to_string());
        let result = match header.command {
            Command::Start => {
                payload(&mut stream).and_then(|p| check_start(&p).map_err(|e| e.to_string()))
            }
            Command::Config if guest.is_some() => Err("configuration sent twice".into()),
            Command::Config => payload(&mut stream).and_then(|p| {
                serde_json::from_slice::<serde_json::Value>(&p).map_err(|e| e.to_string())?;
                guest = Some(
                    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), GUEST_BYTES as usize)])
                        .expect("guest memory"),
                );
                Ok(())
            }),
            Command::Memory => match &guest {
                Some(mem) => receive_memory(&mut stream, mem, header.length),
                None => Err("memory before the configuration".into()),
            },
            Command::State | Command::Cpuid | Command::Hints => {
                payload(&mut stream).and_then(|p| state(&p))
            }
            Command::Complete | Command::Abandon => break,
        };
        let failed = result.is_err();
        send_response(
            &mut wire,
            result.as_ref().map(|_| ()).map_err(String::as_str),
        )
        .expect("answer");
        sent.push(result);
        if failed {
            break;
        }
    }
    (wire, sent)
}

/// A table from a fuzzer bitmap: the bitmap's pages, round-trips, splits within limits.
fn bitmap_table(input: &mut Input<'_>) {
    let base = u64::from(input.u32()) * PAGE;
    let max = 1 + u64::from(input.u32());
    let words: Vec<u64> = (0..input.u8() % 64).map(|_| input.u64()).collect();
    let table = MemoryRangeTable::from_bitmap(&words, base, PAGE);
    let pages: u64 = words.iter().map(|w| u64::from(w.count_ones())).sum();
    assert_eq!(table.bytes(), pages * PAGE);
    let encoded = table.encode();
    let length = encoded.len() as u64 + table.bytes();
    let decoded = MemoryRangeTable::read(&mut &encoded[..], length).expect("decodes");
    assert_eq!(decoded, table);
    if table.bytes() / max > MAX_BATCHES {
        return;
    }
    let batches = table.split(max);
    assert!(batches.iter().all(|b| !b.is_empty() && b.bytes() <= max));
    let mut joined = MemoryRangeTable::default();
    for b in batches {
        joined.extend(b);
    }
    assert_eq!(joined, table, "the batches cover the table");
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    match input.u8() % 4 {
        0 | 1 => {
            let (wire, sent) = destination(input.0);
            let mut answers = &wire[..];
            for want in sent {
                match (read_response(&mut answers), want) {
                    (Ok(()), Ok(())) => {}
                    (Err(ProtocolError::Refused(got)), Err(want)) => assert_eq!(got, want),
                    (got, want) => panic!("answer {want:?} read back as {got:?}"),
                }
            }
            assert!(answers.is_empty());
        }
        2 => {
            // The source reading answers from a hostile destination.
            let mut stream = input.0;
            for _ in 0..MAX_REQUESTS {
                if read_response(&mut stream).is_err() && stream.is_empty() {
                    break;
                }
            }
        }
        _ => bitmap_table(&mut input),
    }
});

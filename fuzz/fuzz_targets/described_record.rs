// SPDX-License-Identifier: Apache-2.0
//! What a same-host peer that shares memory (`share_memory=on`) can make us read: a hostile
//! VMM writes fuzzer-chosen records into our ring (`pvrdma::sim_driver::sharing`, the real
//! channel and rings, A's memory a sealed memfd we map read-only). Records are raw bytes,
//! described records built with fuzzer-chosen runs, payload lengths and frames (valid lower
//! layers and ICRC, any transport bytes), or a described record's tag before raw bytes.
//! Invariants: no panic and no read outside the view (a fault); a described record we take
//! carries exactly its runs' bytes of A's memory, at most a segment, each run inside A's
//! memory; one we would not take is dropped, not misread.
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use pvrdma::sim_driver::sharing::{SharingPair, DESCRIBED_TAG, RAM};
use pvrdma_vmm_fuzz::{encap, frame, ip_info, Input};
use rdma_transport::req::MAX_DESCRIBED_SEGMENT;

/// Records per input: at most one ring batch, so an input is bounded.
const MAX_RECORDS: usize = 16;
/// More runs than a described record may have, so that the bound is crossed.
const RUNS: u8 = 70;

/// What a record should give if taken: the bytes of A's memory its runs name.
type Expect = Option<Vec<u8>>;

/// A described record built from the input, and what taking it must give.
fn described(input: &mut Input<'_>, ram: &[u8]) -> Option<(Vec<u8>, Expect)> {
    let n = input.u8() % RUNS;
    let runs: Vec<(u64, u32)> = (0..n)
        .map(|_| {
            let at = if input.bool() {
                input.u64()
            } else {
                u64::from(input.u32()) % (RAM as u64 + 4096)
            };
            let len = if input.bool() {
                input.u32()
            } else {
                u32::from(input.u16()) % 8192
            };
            (at, len)
        })
        .collect();
    let total: u64 = runs.iter().map(|&(_, l)| u64::from(l)).sum();
    let payload = if input.bool() {
        input.u32() as usize
    } else {
        total as usize
    };
    let mode = input.u8();
    let transport = input.chunk(64);
    let framed;
    let f = if mode & 1 == 0 {
        framed = frame(
            &ip_info(mode & 2 != 0, 1, 2),
            ([2; 6], [4; 6]),
            0xc000,
            encap(mode >> 2),
            transport,
        )?;
        &framed[..]
    } else {
        transport
    };
    let expect = runs
        .iter()
        .map(|&(at, len)| {
            let at = usize::try_from(at).ok()?;
            ram.get(at..at.checked_add(len as usize)?)
        })
        .collect::<Option<Vec<_>>>()
        .map(|pieces| pieces.concat());
    Some((SharingPair::described(&runs, payload, f)?, expect))
}

thread_local! {
    static PAIR: RefCell<Option<SharingPair>> = const { RefCell::new(None) };
}

fuzz_target!(|data: &[u8]| {
    let mut pair = PAIR.take().unwrap_or_default();
    let mut input = Input(data);
    let mut records: Vec<(Vec<u8>, Option<Expect>)> = Vec::new();
    while !input.is_empty() && records.len() < MAX_RECORDS {
        let mode = input.u8() % 4;
        if mode == 0 {
            let raw = input.chunk(2048);
            if !raw.is_empty() {
                records.push((raw.to_vec(), None));
            }
        } else if mode == 1 {
            // The tag, then anything.
            let raw = input.chunk(1024);
            let mut r = DESCRIBED_TAG.to_vec();
            r.extend_from_slice(raw);
            records.push((r, None));
        } else if let Some((r, expect)) = described(&mut input, pair.ram()) {
            records.push((r, Some(expect)));
        }
    }
    let refs: Vec<&[u8]> = records.iter().map(|(r, _)| &r[..]).collect();
    let mut got: Vec<Option<Vec<u8>>> = Vec::new();
    let all_sent = pair.deliver(&refs, &mut |pkt| {
        got.push(pkt.map(|p| {
            let bytes: Vec<u8> = p.payload.pieces().flatten().copied().collect();
            assert_eq!(bytes.len(), p.payload.len(), "pieces add up to the length");
            bytes
        }))
    });
    // Each record sent gives one packet or a drop, in order.
    if all_sent {
        assert_eq!(got.len(), records.len());
        for ((_, expect), taken) in records.iter().zip(&got) {
            let (Some(expect), Some(bytes)) = (expect, taken) else {
                continue;
            };
            let want = expect
                .as_ref()
                .expect("a record whose runs leave A's memory is dropped");
            assert_eq!(bytes, want, "a described record gives its runs' bytes");
            assert!(bytes.len() <= MAX_DESCRIBED_SEGMENT as usize);
        }
    }
    PAIR.set(Some(pair));
});

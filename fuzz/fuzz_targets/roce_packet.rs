// SPDX-License-Identifier: Apache-2.0
//! The RoCE frame parser (`rdma_transport::packet::parse`), on raw frames and on
//! fuzzer-chosen transport bytes framed with valid lower layers (RoCE v2 or v1, with a VLAN
//! tag or not) and ICRC. A frame that
//! parses must build back into a frame that parses to the same headers and payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pvrdma_vmm_fuzz::{encap, frame, ip_info, Input};
use rdma_transport::packet::{build, parse, Addr};

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let mode = input.u8();
    let owned;
    let f: &[u8] = if mode & 1 == 0 {
        input.0
    } else {
        let ip = ip_info(mode & 2 != 0, 1, 2);
        match frame(&ip, ([2; 6], [4; 6]), 0xc000, encap(mode >> 2), input.0) {
            Some(f) => {
                owned = f;
                &owned
            }
            None => return,
        }
    };
    let Ok(p) = parse(f) else { return };
    assert!(p.payload.len() <= f.len());
    let addr = Addr {
        src_mac: p.layers.src_mac,
        dst_mac: p.layers.dst_mac,
        ip: p.layers.ip,
        udp_sport: p.layers.udp_sport,
        encap: p.layers.encap,
    };
    let payload = p.payload.bytes().expect("a frame carries its payload");
    let rebuilt = build(&addr, &p.hdrs, payload).expect("a parsed packet builds");
    let q = parse(&rebuilt).expect("a rebuilt packet parses");
    let mut want = p.hdrs;
    want.bth.pad = q.hdrs.bth.pad;
    assert_eq!(q.hdrs, want);
    assert_eq!(q.payload, p.payload);
    assert_eq!(q.opcode, p.opcode);
    assert_eq!((q.layers.encap, q.layers.ip), (p.layers.encap, p.layers.ip));
});

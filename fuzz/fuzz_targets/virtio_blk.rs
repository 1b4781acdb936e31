// SPDX-License-Identifier: Apache-2.0
//! virtio-blk as a hostile guest driver sees it: the real function (`virtio_devices::Block`,
//! its transport and its worker) on a PCI bus over real guest memory and an image
//! file. After a bring-up with fuzzer-chosen features and queue size, up to 48 operations:
//! raw descriptors (any address, length, flags, next) in the ring and in indirect tables,
//! request headers of any type and sector, well-formed chains, available ring entries and
//! indices, notifications, common-configuration register writes (status and reset, queue
//! geometry and addresses), device-config, ISR and MSI-X accesses, config-space writes,
//! pause and resume.
//! The worker runs on the fuzzer's thread after each signal (`VirtioBlk::settle`), as it
//! would on its own thread, only without waiting for one.
//! Invariants: no panic, no hang (`-timeout` catches a worker that never finishes its
//! turn), no allocation over `-malloc_limit_mb`; ioeventfds registered and unregistered in
//! pairs (the strict mock asserts it); and a driver that starts over afterwards gets a read
//! served with the image's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pvrdma_vmm_fuzz::virtio_blk::*;
use pvrdma_vmm_fuzz::{inline_workers, Input};
use vm_memory::{Bytes, GuestAddress};

const MAX_OPS: usize = 48;
/// Room for indirect tables.
const INDIRECT_ENTRIES: u16 = 1024;

/// A buffer address: one of the driver's areas, the end of RAM, or anything.
fn address(input: &mut Input<'_>) -> u64 {
    let k = u64::from(input.u8());
    match input.u8() % 8 {
        0 => HEADERS + 16 * (k % 16),
        1 => STATUS + k,
        2 | 3 => DATA + SECTOR * k,
        4 => INDIRECT_TABLES + 16 * k,
        5 => MEM_SIZE - k,
        6 => DESC_TABLE + 16 * k,
        _ => input.u64(),
    }
}

fn length(input: &mut Input<'_>) -> u32 {
    match input.u8() % 6 {
        0 => 16,
        1 => 1,
        2 | 3 => SECTOR as u32 * (1 + u32::from(input.u8() % 16)),
        4 => u32::from(input.u16()),
        _ => input.u32(),
    }
}

fn request_type(input: &mut Input<'_>) -> u32 {
    // IN, OUT, FLUSH, GET_ID, then DISCARD and WRITE_ZEROES (not offered), then anything.
    match input.u8() % 8 {
        0 | 1 => T_IN,
        2 | 3 => T_OUT,
        4 => 4,
        5 => 8,
        6 => 11 + 2 * u32::from(input.bool()),
        _ => input.u32(),
    }
}

fn sector(input: &mut Input<'_>) -> u64 {
    match input.u8() % 4 {
        0 | 1 => u64::from(input.u8()) % SECTORS,
        2 => SECTORS - u64::from(input.u8() % 2),
        _ => input.u64(),
    }
}

/// A well-formed chain for one request at `head`: header, up to three data buffers, status.
fn request(v: &mut VirtioBlk, input: &mut Input<'_>) {
    let qsize = v.qsize.clamp(1, QUEUE_MAX);
    let head = input.u16() % qsize;
    let slot = u64::from(input.u8() % 16);
    let request_type = request_type(input);
    let _ = v.mem.write_slice(
        &header(request_type, sector(input)),
        GuestAddress(HEADERS + 16 * slot),
    );
    let data_flags = if request_type == T_OUT { 0 } else { WRITE };
    let mut chain = vec![(HEADERS + 16 * slot, 16, 0)];
    for _ in 0..input.u8() % 4 {
        let at = DATA + SECTOR * u64::from(input.u8());
        chain.push((at, length(input), data_flags));
    }
    chain.push((STATUS + slot, 1, WRITE));
    let n = chain.len();
    for (i, (addr, len, flags)) in chain.into_iter().enumerate() {
        let index = (head + i as u16) % qsize;
        let next = (index + 1) % qsize;
        let flags = if i + 1 < n { flags | NEXT } else { flags };
        v.write_descriptor(index, descriptor(addr, len, flags, next));
    }
    v.publish(head);
    v.notify(0);
    v.settle();
}

/// A driver that starts over gets a one-sector read served, with the image's bytes.
fn assert_healthy(v: &mut VirtioBlk) {
    let status = v.start(VERSION_1, 16);
    assert_eq!(
        status & (FEATURES_OK | DRIVER_OK | NEEDS_RESET),
        FEATURES_OK | DRIVER_OK,
        "bring-up after the input"
    );
    v.mem
        .write_slice(&header(T_IN, 1), GuestAddress(HEADERS))
        .expect("header");
    v.mem
        .write_obj(0xffu8, GuestAddress(STATUS))
        .expect("status");
    v.write_descriptor(0, descriptor(HEADERS, 16, NEXT, 1));
    v.write_descriptor(1, descriptor(DATA, SECTOR as u32, NEXT | WRITE, 2));
    v.write_descriptor(2, descriptor(STATUS, 1, WRITE, 0));
    v.publish(0);
    v.notify(0);
    v.settle();
    assert_eq!(v.used_idx(), 1, "the read was served");
    assert_eq!(v.used(0), (0, SECTOR as u32 + 1));
    assert_eq!(v.mem.read_obj::<u8>(GuestAddress(STATUS)).ok(), Some(S_OK));
    let mut data = vec![0u8; SECTOR as usize];
    v.mem
        .read_slice(&mut data, GuestAddress(DATA))
        .expect("data");
    assert_eq!(data, v.image_bytes(SECTOR, SECTOR as usize));
}

fuzz_target!(|data: &[u8]| {
    inline_workers();
    let mut input = Input(data);
    let setup = input.u8();
    let mut v = VirtioBlk::new(setup & 1 == 1);
    let features = match setup >> 1 & 3 {
        0 => VERSION_1 | EVENT_IDX | FLUSH | SEG_MAX,
        1 => VERSION_1,
        2 => VERSION_1 | EVENT_IDX | INDIRECT_DESC,
        _ => input.u64(),
    };
    let qsize = match setup >> 3 & 3 {
        0 => 16,
        1 => QUEUE_MAX,
        2 => 1 << (input.u8() % 10),
        _ => input.u16(),
    };
    v.start(features, qsize);
    for _ in 0..MAX_OPS {
        if input.is_empty() {
            break;
        }
        match input.u8() % 10 {
            0 => {
                // A raw descriptor in the ring's table.
                let index = input.u16() % QUEUE_MAX;
                let addr = address(&mut input);
                let len = length(&mut input);
                let flags = if input.u8() & 7 == 0 {
                    input.u16()
                } else {
                    input.u16() & (NEXT | WRITE | INDIRECT)
                };
                let next = if input.bool() {
                    input.u16()
                } else {
                    input.u16() % QUEUE_MAX
                };
                v.write_descriptor(index, descriptor(addr, len, flags, next));
            }
            1 => {
                // An entry of an indirect table, and maybe a descriptor pointing at it.
                let entry = input.u16() % INDIRECT_ENTRIES;
                let d = descriptor(
                    address(&mut input),
                    length(&mut input),
                    input.u16() & (NEXT | WRITE | INDIRECT),
                    input.u16() % 64,
                );
                let _ = v
                    .mem
                    .write_slice(&d, GuestAddress(INDIRECT_TABLES + 16 * u64::from(entry)));
                if input.bool() {
                    let index = input.u16() % QUEUE_MAX;
                    let len = 16 * u32::from(input.u8()) + u32::from(input.u8() % 4) * 5;
                    let at = INDIRECT_TABLES + 16 * u64::from(entry);
                    v.write_descriptor(index, descriptor(at, len, INDIRECT, 0));
                }
            }
            2 => {
                let slot = u64::from(input.u8() % 16);
                let h = header(request_type(&mut input), sector(&mut input));
                let _ = v.mem.write_slice(&h, GuestAddress(HEADERS + 16 * slot));
            }
            3 => request(&mut v, &mut input),
            4 => {
                // Heads made available (any value), then the notification.
                for _ in 0..1 + input.u8() % 4 {
                    let head = if input.bool() {
                        input.u16()
                    } else {
                        input.u16() % v.qsize.clamp(1, QUEUE_MAX)
                    };
                    v.publish(head);
                }
                v.notify(0);
                v.settle();
            }
            5 => {
                // The ring's own fields: the available index, flags or used_event.
                let value = input.u16();
                let at = match input.u8() % 3 {
                    0 => {
                        v.avail_idx = value;
                        AVAIL + 2
                    }
                    1 => AVAIL,
                    _ => AVAIL + 4 + 2 * u64::from(v.qsize.min(QUEUE_MAX)),
                };
                let _ = v.mem.write_obj(value, GuestAddress(at));
                v.notify(0);
                v.settle();
            }
            6 => {
                // Common configuration: any register, any width; or a read there.
                let offset = u64::from(input.u8()) % common::LEN;
                let len = [1, 2, 4, 8][usize::from(input.u8() % 4)];
                if input.bool() {
                    let value = match offset & !7 {
                        common::QUEUE_DESC | common::QUEUE_DRIVER | common::QUEUE_DEVICE
                            if input.bool() =>
                        {
                            address(&mut input) >> (8 * (offset & 7))
                        }
                        _ => input.u64(),
                    };
                    v.write(COMMON + offset, len, value);
                } else {
                    v.read(COMMON + offset, len);
                }
                v.settle();
            }
            7 => {
                // Guest memory near a structure the device reads, or anywhere.
                let at = if input.bool() {
                    address(&mut input).wrapping_add(u64::from(input.u8()))
                } else {
                    input.u64() % MEM_SIZE
                };
                let bytes = input.chunk(64);
                let _ = v.mem.write_slice(bytes, GuestAddress(at));
            }
            8 => match input.u8() % 4 {
                // Config space, except the command register and the BARs: moving or
                // unmapping those only makes the rest of the input miss the device.
                0 => {
                    let reg = match input.u8() % 64 {
                        1 | 4..=9 => 15,
                        r => r,
                    };
                    let value = input.u32();
                    v.cfg_write(reg.into(), value);
                }
                // MSI-X table and PBA.
                1 => {
                    let offset = MSIX_TABLE + u64::from(input.u16()) % 0x2100;
                    v.write(offset, 4, input.u32().into());
                }
                // Device configuration and ISR (read to clear).
                2 => {
                    v.read(
                        DEVICE + u64::from(input.u8() % 96),
                        1 + usize::from(input.u8() % 8),
                    );
                    v.read(ISR, 1);
                }
                // Anywhere in the BAR, any width.
                _ => {
                    let offset = u64::from(input.u16()) % BAR_SIZE;
                    let len = 1 + usize::from(input.u8() % 8);
                    if input.bool() {
                        v.write(offset, len, input.u64());
                    } else {
                        v.read(offset, len);
                    }
                    v.settle();
                }
            },
            _ => {
                if input.bool() {
                    // A notification with any value, as KVM or as MMIO at any doorbell offset.
                    if input.bool() {
                        v.notify(input.u16());
                    } else {
                        v.write(NOTIFY + u64::from(input.u8() % 8), 2, input.u16().into());
                    }
                } else {
                    // The VMM pauses and resumes the VM (migration, vm.pause).
                    let _ = v.bus.pause();
                    let _ = v.bus.resume();
                }
                v.settle();
            }
        }
    }
    v.settle();
    assert_healthy(&mut v);
    drop(v);
});

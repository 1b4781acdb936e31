// SPDX-License-Identifier: Apache-2.0
//! A stand-in for QEMU's `contrib/rdmacm-mux`, which Debian does not ship, so that QEMU's own
//! `-device pvrdma` can run in the test host (bench-rdma's `qemu-pvrdma` configuration).
//!
//! QEMU 7.2's pvrdma refuses to start without a mux on its `mad-chardev`, and each GID the guest
//! adds or deletes (`ADD_BIND`/`DEL_BIND`) waits for the mux's answer to a REG/UNREG message. This
//! stand-in answers every REG and UNREG with RESP/OK and drops MADs (so rdma_cm cannot work through
//! QEMU's device; the verbs programs the bench runs do not use it). Each message is logged on
//! stdout.
//!
//! Usage: `rdmacm-mux-stub SOCKET` (QEMU's default is `/run/rdmacm-mux-<ibdev>-<port>`).
//!
//! Whatever connects is untrusted: messages are read whole into a fixed-size buffer, a short or
//! garbled one ends that connection (logged), never the stand-in, and at most [`MAX_CLIENTS`]
//! connections are served at once.

use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

/// `sizeof(RdmaCmMuxMsg)` on x86_64 (contrib/rdmacm-mux/rdmacm-mux.h): a 32-byte header
/// (msg_type, op_code, sgid, err_code, padded to the GID's 8-byte alignment), umad_len, and a
/// 320-byte umad. QEMU writes and reads exactly this many bytes per message.
const MSG_LEN: usize = 360;
/// Header fields (little-endian `int`s and the GID), by offset.
const MSG_TYPE: usize = 0;
const OP_CODE: usize = 4;
const SGID: usize = 8;
const ERR_CODE: usize = 24;
/// `RdmaCmMuxMsgType`.
const TYPE_REQ: u32 = 0;
const TYPE_RESP: u32 = 1;
/// `RdmaCmMuxOpCode`.
const OP_REG: u32 = 0;
const OP_UNREG: u32 = 1;
const OP_MAD: u32 = 2;
/// `RDMACM_MUX_ERR_CODE_OK`.
const ERR_OK: u32 = 0;
/// Connections served at once: one per QEMU device; the bench runs two.
const MAX_CLIENTS: usize = 8;

fn main() -> ExitCode {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: rdmacm-mux-stub SOCKET");
        return ExitCode::FAILURE;
    };
    // A socket file left by an earlier run would make bind fail.
    let _ = std::fs::remove_file(&path);
    let listener = match UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rdmacm-mux-stub: bind {}: {e}", path.to_string_lossy());
            return ExitCode::FAILURE;
        }
    };
    println!("mux: listening on {}", path.to_string_lossy());
    serve(&listener);
    ExitCode::SUCCESS
}

/// Accepts connections for ever, each on a thread of its own, at most [`MAX_CLIENTS`] at once.
fn serve(listener: &UnixListener) {
    let clients = Arc::new(AtomicUsize::new(0));
    for (id, conn) in listener.incoming().enumerate() {
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                println!("mux: accept: {e}");
                continue;
            }
        };
        if clients.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
            clients.fetch_sub(1, Ordering::SeqCst);
            println!("mux: client {id} refused: {MAX_CLIENTS} already connected");
            continue;
        }
        println!("mux: client {id} connected");
        let clients = Arc::clone(&clients);
        thread::spawn(move || {
            let end = client(conn);
            println!("mux: client {id} gone: {end}");
            clients.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Serves one connection until it ends; returns why it ended.
fn client(mut conn: UnixStream) -> String {
    let mut msg = [0u8; MSG_LEN];
    loop {
        if let Err(e) = conn.read_exact(&mut msg) {
            return match e.kind() {
                io::ErrorKind::UnexpectedEof => "closed".to_string(),
                _ => format!("read: {e}"),
            };
        }
        let (line, reply) = answer(&msg);
        println!("mux: {line}");
        if let Some(reply) = reply {
            if let Err(e) = conn.write_all(&reply) {
                return format!("write: {e}");
            }
        }
    }
}

/// What to log about one message and the reply to send, if any: a REG or UNREG request gets its
/// own bytes back as a RESP with error code OK; a MAD or anything else gets none.
fn answer(msg: &[u8; MSG_LEN]) -> (String, Option<[u8; MSG_LEN]>) {
    let (msg_type, op) = (field(msg, MSG_TYPE), field(msg, OP_CODE));
    let gid: String = msg[SGID..SGID + 16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let op_name = match op {
        OP_REG => "REG",
        OP_UNREG => "UNREG",
        OP_MAD => "MAD",
        _ => "unknown",
    };
    let line = format!("type={msg_type} op={op} ({op_name}) gid={gid}");
    if msg_type != TYPE_REQ || !matches!(op, OP_REG | OP_UNREG) {
        return (format!("{line}: dropped"), None);
    }
    let mut reply = *msg;
    reply[MSG_TYPE..MSG_TYPE + 4].copy_from_slice(&TYPE_RESP.to_le_bytes());
    reply[ERR_CODE..ERR_CODE + 4].copy_from_slice(&ERR_OK.to_le_bytes());
    (format!("{line}: answered OK"), Some(reply))
}

/// The little-endian `int` at `offset` of a message (the offsets are the constants above, all
/// inside [`MSG_LEN`]).
fn field(msg: &[u8; MSG_LEN], offset: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&msg[offset..offset + 4]);
    u32::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(msg_type: u32, op: u32) -> [u8; MSG_LEN] {
        let mut m = [0u8; MSG_LEN];
        m[MSG_TYPE..MSG_TYPE + 4].copy_from_slice(&msg_type.to_le_bytes());
        m[OP_CODE..OP_CODE + 4].copy_from_slice(&op.to_le_bytes());
        m[SGID] = 0xfe;
        m[SGID + 1] = 0x80;
        m[ERR_CODE..ERR_CODE + 4].copy_from_slice(&7u32.to_le_bytes());
        m[100] = 0x5a;
        m
    }

    #[test]
    fn reg_and_unreg_are_answered_ok_and_the_rest_dropped() {
        for op in [OP_REG, OP_UNREG] {
            let (line, reply) = answer(&request(TYPE_REQ, op));
            let reply = reply.unwrap();
            assert_eq!(field(&reply, MSG_TYPE), TYPE_RESP);
            assert_eq!(field(&reply, OP_CODE), op);
            assert_eq!(field(&reply, ERR_CODE), ERR_OK);
            // The rest (the GID QEMU may check) comes back as it was.
            assert_eq!(reply[SGID..SGID + 2], [0xfe, 0x80]);
            assert_eq!(reply[100], 0x5a);
            assert!(line.contains("gid=fe80000000"), "{line}");
        }
        assert!(answer(&request(TYPE_REQ, OP_MAD)).1.is_none());
        assert!(answer(&request(TYPE_REQ, 99)).1.is_none());
        assert!(answer(&request(TYPE_RESP, OP_REG)).1.is_none());
    }

    #[test]
    fn garbage_gets_no_reply_and_a_short_message_ends_the_connection() {
        let (mut peer, ours) = UnixStream::pair().unwrap();
        peer.write_all(&[0xff; MSG_LEN]).unwrap();
        peer.write_all(&request(TYPE_REQ, OP_UNREG)).unwrap();
        peer.write_all(&[0xff; MSG_LEN / 2]).unwrap();
        peer.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(client(ours), "closed");
        // One reply: the UNREG's.
        let mut replies = Vec::new();
        peer.read_to_end(&mut replies).unwrap();
        assert_eq!(replies.len(), MSG_LEN);
        let reply: [u8; MSG_LEN] = replies.try_into().unwrap();
        assert_eq!(
            (field(&reply, MSG_TYPE), field(&reply, OP_CODE)),
            (TYPE_RESP, OP_UNREG)
        );
    }

    #[test]
    fn a_broken_connection_leaves_the_next_one_served() {
        let dir = std::env::temp_dir().join(format!("mux-stub-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mux.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        thread::spawn(move || serve(&listener));
        // Half a message, then the end: that connection ends, the stand-in does not.
        let mut short = UnixStream::connect(&path).unwrap();
        short.write_all(&[0xff; MSG_LEN / 2]).unwrap();
        drop(short);
        let mut conn = UnixStream::connect(&path).unwrap();
        conn.write_all(&request(TYPE_REQ, OP_REG)).unwrap();
        let mut reply = [0u8; MSG_LEN];
        conn.read_exact(&mut reply).unwrap();
        assert_eq!(field(&reply, MSG_TYPE), TYPE_RESP);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The PVRDMA PCI function (VMware 15ad:0820) of pvrdma-vmm: what the
//! unmodified Linux `vmw_pvrdma` driver and rdma-core's `libvmw_pvrdma`
//! talk to. The guest-visible ABI is `docs/pvrdma-abi.md`; its structures
//! are in the `pvrdma-abi` crate.
//!
//! # Wiring
//!
//! One PCI slot per `--pvrdma tap=NAME,mac=MAC[,gid=roce-v2|roce-v1]`:
//!
//! ```text
//! let port = Arc::new(Port::new(mac, false));                 // shared
//! let nic = Vmxnet3::new(&Vmxnet3Config { mac, multifunction: true },
//!                        port.clone(), tap, guest_mem.clone(), hooks.clone())?;
//! let rdma = Pvrdma::new(&PvrdmaConfig { gid_type, ..Default::default() },
//!                        port, guest_mem, hooks)?;            // gid: "roce-v2".parse()
//! let counters = rdma.counters();                             // for vm.counters
//! bus.add_device(slot, 0, Arc::new(Mutex::new(nic)))?;
//! bus.add_device(slot, 1, Arc::new(Mutex::new(rdma)))?;
//! ```
//!
//! The function has three BARs: BAR0 (8 KiB, 32-bit) holds the MSI-X table
//! (3 vectors: command response, async events, CQ notifications) and PBA,
//! BAR1 (4 KiB, 32-bit) the registers, BAR2 (64-bit, `max_uar` pages, 2 MiB
//! by default, not prefetchable) the UAR doorbell pages. There is no INTx
//! or MSI. `new` starts a worker thread (dropping the device stops it and
//! removes every ioeventfd). Doorbells are ioeventfds with datamatch,
//! registered through `hooks.ioevents` while memory decoding is on: one
//! eventfd per QP, two per CQ, one per SRQ, plus one device-wide; raise
//! RLIMIT_NOFILE accordingly (a registration KVM refuses is counted and
//! that doorbell exits to the VMM instead, which still works).

// Guest input is hostile: no unwrap/expect outside tests (clippy.toml
// allows them in #[cfg(test)] code).
#![deny(clippy::unwrap_used, clippy::expect_used)]

//! # Structure
//!
//! Modules depend one way, each only on those below it:
//!
//! 1. Leaves: `config`, `caps`, `metrics`, `error` (why a command fails,
//!    its errno), `pdir` page directories, `ring` rings, [`namespace`]
//!    every identifier the guest sees (deterministic, saveable), `events`
//!    interrupts and event rings, `uar` doorbells, `dsr` the DSR
//!    handshake, and `env`: what never changes after construction (no
//!    frames in or out).
//! 2. `objects`: the verbs objects of a session with their command
//!    handlers (`handle_*`), the session and the handlers' context;
//!    `port` the port's commands and link changes.
//! 3. `datapath`: the RoCE engine run over the objects, and the wire
//!    (TAP backend, inbox, same-host channel) that frames take.
//! 4. `cmd`: the command channel, one `match` over the handlers, and
//!    MODIFY_QP, which drives the data path; `state` the shared state
//!    (environment, wire, registers and session under one lock).
//! 5. `regs` the register BAR, `snapshot` saved state, `worker` the
//!    thread that runs doorbells, frames and timers; then `device`.
//!
//! An object never calls the data path: whoever changes one in a way that
//! needs a QP run (a doorbell, a frame, MODIFY_QP to ERR) runs it. An item
//! that modules of two layers use lives in the lower one; the test
//! `modules_depend_one_way` holds the code to this order.
//! `sim_driver` (feature `test-utils`) simulates the guest driver for
//! tests, on the hypervisor hooks of `pci::test_utils`.

#[macro_use]
mod metrics;

mod caps;
mod cmd;
mod config;
mod datapath;
mod device;
mod dsr;
mod env;
mod error;
mod events;
pub mod namespace;
mod objects;
mod pdir;
mod port;
mod regs;
mod ring;
mod snapshot;
mod state;
mod uar;
mod worker;

// Test support (a simulated guest driver), not device code: a step that
// fails is a failed test, so it may panic.
#[cfg(feature = "test-utils")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub mod sim_driver;

pub use config::{GidType, Limits, LimitsError, PvrdmaConfig, DEFAULT_BUSY_POLL, MAX_QP};
pub use device::{Pvrdma, PvrdmaError};
pub use namespace::{IdAllocatorState, Namespace, NamespaceError, NamespaceState};
pub use worker::SpawnError;

#[cfg(test)]
mod tests {
    /// The crate's top-level modules, each allowed to use only those
    /// before it (see "Structure" above).
    const ORDER: &[&str] = &[
        "config",
        "metrics",
        "pdir",
        "ring",
        "error",
        "caps",
        "namespace",
        "events",
        "uar",
        "dsr",
        "env",
        "objects",
        "port",
        "datapath",
        "cmd",
        "state",
        "regs",
        "snapshot",
        "worker",
        "device",
    ];

    /// The code of a source file before its unit tests, without comments.
    fn code(path: &std::path::Path) -> String {
        let text = std::fs::read_to_string(path).unwrap();
        let code = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default();
        code.lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The top-level modules named as `crate::NAME` or in
    /// `crate::{NAME, ...}` in `code`.
    fn uses(code: &str) -> Vec<&str> {
        fn ident(s: &str) -> &str {
            let s = s.trim_start();
            let end = s
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(s.len());
            &s[..end]
        }
        let mut names = vec![];
        for (i, m) in code.match_indices("crate::") {
            if code[..i].ends_with('$') {
                continue;
            }
            let rest = &code[i + m.len()..];
            let Some(group) = rest.strip_prefix('{') else {
                names.push(ident(rest));
                continue;
            };
            // The first name of each item at the group's own depth.
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        names.push(ident(&group[start..]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.push(ident(&group[start..]));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        }
        names
    }

    #[test]
    fn modules_depend_one_way() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let rank = |name: &str| ORDER.iter().position(|m| *m == name);
        let mut files = vec![];
        let mut dirs = vec![src.clone()];
        while let Some(dir) = dirs.pop() {
            for path in std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    files.push(path);
                }
            }
        }
        let mut upward = vec![];
        for path in files {
            let rel = path.strip_prefix(&src).unwrap();
            let top = rel.iter().next().unwrap().to_str().unwrap();
            let top = top.strip_suffix(".rs").unwrap_or(top);
            if matches!(top, "lib" | "sim_driver") {
                continue;
            }
            let own = rank(top).unwrap_or_else(|| panic!("module {top} is not in ORDER"));
            for used in uses(&code(&path)) {
                if rank(used).is_some_and(|r| r > own) {
                    upward.push(format!("{} -> {used}", rel.display()));
                }
            }
        }
        upward.sort();
        upward.dedup();
        assert!(upward.is_empty(), "imports that run upward: {upward:#?}");
    }
}

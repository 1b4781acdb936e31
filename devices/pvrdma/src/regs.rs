// SPDX-License-Identifier: Apache-2.0
//! The register BAR (BAR1, ABI doc 2.1): the DSR handshake, device
//! control, the command doorbell, ERR, ICR/IMR and the MAC registers.
//!
//! Only aligned 32-bit accesses to a register in the ABI table, in a
//! direction it allows, take effect; anything else is counted and reads
//! all-ones.
//!
//! Order of operations (pitfall 1): a DSR must be loaded and ACTIVATE done
//! before REQUEST executes anything; a new DSR or RESET drops the session,
//! so no old GPA is ever touched again.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use pvrdma_abi::cmd::REQ_SIZE;
use pvrdma_abi::regs::{version, Ctl, Reg, Vector};
use vm_memory::{Bytes, GuestAddress, GuestMemory};

use crate::caps::device_caps;
use crate::cmd;
use crate::dsr;
use crate::error::errno;
use crate::namespace::Namespace;
use crate::objects::session::{Ctx, Session};
use crate::objects::Objects;
use crate::state::{Shared, State};

/// The device API version: 64-bit PFNs and separate QP handles.
pub(crate) const DEVICE_VERSION: u32 = version::QP_HANDLE;

/// The register an access targets, if it is an aligned 32-bit access to
/// one that allows it.
fn decode(offset: u64, len: usize, write: bool) -> Option<Reg> {
    let (reg, access) = Reg::at(offset)?;
    let allowed = if write {
        access.writable()
    } else {
        access.readable()
    };
    (len == 4 && allowed).then_some(reg)
}

pub(crate) fn read(shared: &Shared, offset: u64, data: &mut [u8]) {
    let Some(reg) = decode(offset, data.len(), false) else {
        guest_warn!(
            shared.env.metrics.reg_invalid,
            "register read at {offset:#x}"
        );
        data.fill(0xff);
        return;
    };
    let env = &shared.env;
    let mac = env.port.state().mac;
    let value = match reg {
        Reg::Version => DEVICE_VERSION,
        Reg::Err => shared.lock().err,
        Reg::Icr => env.irq.take_icr(),
        Reg::Imr => env.irq.imr(),
        Reg::MacLow => {
            let [m0, m1, m2, m3, _, _] = mac;
            u32::from_le_bytes([m0, m1, m2, m3])
        }
        Reg::MacHigh => {
            let [_, _, _, _, m4, m5] = mac;
            u32::from_le_bytes([m4, m5, 0, 0])
        }
        // Write-only registers never decode as reads.
        Reg::DsrLow | Reg::DsrHigh | Reg::Ctl | Reg::Request => u32::MAX,
    };
    data.copy_from_slice(&value.to_le_bytes());
}

/// A register write; `bar2` is BAR2's current base (for CREATE_UC).
pub(crate) fn write<M: GuestMemory>(
    shared: &Shared,
    mem: &M,
    bar2: Option<u64>,
    offset: u64,
    data: &[u8],
) {
    let (Some(reg), Ok(bytes)) = (decode(offset, data.len(), true), <[u8; 4]>::try_from(data))
    else {
        guest_warn!(
            shared.env.metrics.reg_invalid,
            "register write at {offset:#x}"
        );
        return;
    };
    let value = u32::from_le_bytes(bytes);
    match reg {
        Reg::DsrLow => shared.lock().dsr_low = value,
        Reg::DsrHigh => handle_dsr_high(shared, mem, value),
        Reg::Ctl => handle_ctl(shared, value),
        Reg::Request => handle_request(shared, mem, bar2, value),
        Reg::Imr => shared.env.irq.set_imr(value),
        // The MAC belongs to the vmxnet3 function; the driver never writes
        // these, and writes are ignored.
        Reg::MacLow | Reg::MacHigh => {}
        Reg::Version | Reg::Err | Reg::Icr => {}
    }
}

/// Loads the DSR and fills the caps before the driver's next access; any
/// previous session is dropped first.
fn handle_dsr_high<M: GuestMemory>(shared: &Shared, mem: &M, high: u32) {
    let env = &shared.env;
    let mut state = shared.lock();
    let gpa = u64::from(high) << 32 | u64::from(state.dsr_low);
    state.session = None;
    state.active = false;
    shared.wire.inbox.set_open(false);
    let caps = device_caps(&env.config, env.port.state().mac);
    match dsr::load(mem, gpa, &caps) {
        Ok(dsr) => {
            let limits = &env.config.limits;
            state.session = Some(Session {
                dsr,
                ns: Namespace::new(limits),
                objects: Objects::new(limits),
                link_up: false,
            });
            state.err = 0;
        }
        Err(e) => {
            guest_warn!(env.metrics.dsr_invalid, "DSR at {gpa:#x} rejected: {e}");
            state.err = errno::EINVAL;
        }
    }
}

fn handle_ctl(shared: &Shared, value: u32) {
    let env = &shared.env;
    let mut state = shared.lock();
    let State {
        err,
        active,
        session,
        ..
    } = &mut *state;
    let ok = match Ctl::try_from(value) {
        Ok(Ctl::Activate) => match session.as_mut() {
            Some(session) => {
                *active = true;
                shared.wire.inbox.set_open(true);
                session.link_up = env.port.state().link_up();
                true
            }
            None => false,
        },
        Ok(Ctl::Unquiesce) => *active,
        Ok(Ctl::Reset) => {
            *session = None;
            *active = false;
            shared.wire.inbox.set_open(false);
            env.irq.clear();
            true
        }
        Err(_) => false,
    };
    if ok {
        *err = 0;
    } else {
        guest_warn!(env.metrics.ctl_invalid, "CTL {value} rejected");
        *err = errno::EINVAL;
    }
}

/// Executes the command in the command slot, synchronously: the response
/// is written, ERR set and vector 0 raised before the vCPU resumes.
fn handle_request<M: GuestMemory>(shared: &Shared, mem: &M, bar2: Option<u64>, value: u32) {
    let env = &shared.env;
    let mut state = shared.lock();
    let uar_base = state.uar_base;
    let State {
        err,
        active,
        session,
        ..
    } = &mut *state;
    let Some(session) = session.as_mut().filter(|_| *active && value == 0) else {
        guest_warn!(
            env.metrics.cmd_inactive,
            "REQUEST {value} while inactive or invalid"
        );
        *err = errno::EINVAL;
        return;
    };
    let (cmd_slot, resp_slot) = (session.dsr.cmd_slot, session.dsr.resp_slot);
    let mut req = [0u8; REQ_SIZE];
    if let Err(e) = mem.read_slice(&mut req, GuestAddress(cmd_slot)) {
        guest_warn!(env.metrics.cmd_failed, "command slot unreadable: {e}");
        *err = errno::EFAULT;
        return;
    }
    let mut cx = Ctx {
        mem,
        env,
        s: session,
        bar2,
        uar_base,
    };
    let (resp, mut status) = cmd::execute(&mut cx, &shared.wire, &req);
    if let Some(resp) = &resp {
        if let Err(e) = mem.write_slice(resp.as_slice(), GuestAddress(resp_slot)) {
            guest_warn!(env.metrics.cmd_failed, "response slot unwritable: {e}");
            status = errno::EFAULT;
        }
    }
    *err = status;
    if resp.is_some() {
        env.irq.raise(Vector::Response);
    }
}

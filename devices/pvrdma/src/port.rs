// SPDX-License-Identifier: Apache-2.0
//! The one RoCE port: QUERY_PORT / QUERY_PKEY, and link changes of the
//! vmxnet3 port it shares, reported as PORT_ACTIVE / PORT_ERR events.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use net_port::PortState;
use pvrdma_abi::cmd::{QueryPkeyReq, QueryPkeyResp, QueryPortReq, QueryPortResp};
use pvrdma_abi::verbs::{mtu, phys_state, port_state, PortAttr, PORT_CAP_CM_SUP};
use pvrdma_abi::wqe::event;
use vm_memory::GuestMemory;

use crate::caps::{DEFAULT_PKEY, MAX_PKEYS, PORT_NUM};
use crate::config::Limits;
use crate::env::Env;
use crate::error::{check, CmdError};
use crate::objects::session::{Ctx, Session};

/// RoCE v2 headers around an IB payload, as `iboe_get_mtu` counts them
/// (GRH/IP, UDP, BTH, XRC, AtomicETH, ICRC).
const ROCE_OVERHEAD: u16 = 40 + 8 + 12 + 4 + 28 + 4;
/// Largest message (2 GiB).
const MAX_MSG_SIZE: u32 = 1 << 31;
/// 4X width at SDR speed: 10 Gb/s, a vmxnet3's nominal speed.
const WIDTH_4X: u8 = 2;
const SPEED_SDR: u8 = 1;

/// The largest IB MTU (enum) whose packets fit an Ethernet MTU of `mtu`.
pub(crate) fn ib_mtu(mtu: u16) -> u32 {
    let payload = u32::from(mtu.saturating_sub(ROCE_OVERHEAD));
    (mtu::MTU_256..=mtu::MTU_4096)
        .rev()
        .find(|&m| mtu::bytes(m).is_some_and(|bytes| bytes <= payload))
        .unwrap_or(mtu::MTU_256)
}

fn port_attr(limits: &Limits, port: PortState) -> PortAttr {
    let (state, phys) = if port.link_up() {
        (port_state::ACTIVE, phys_state::LINK_UP)
    } else {
        (port_state::DOWN, phys_state::DISABLED)
    };
    PortAttr {
        state,
        max_mtu: mtu::MTU_4096,
        active_mtu: ib_mtu(port.mtu),
        gid_tbl_len: limits.gid_tbl_len,
        port_cap_flags: PORT_CAP_CM_SUP,
        max_msg_sz: MAX_MSG_SIZE,
        pkey_tbl_len: MAX_PKEYS,
        max_vl_num: 1,
        active_width: WIDTH_4X,
        active_speed: SPEED_SDR,
        phys_state: phys,
        ..PortAttr::default()
    }
}

pub(crate) fn handle_query_port<M>(
    cx: &mut Ctx<'_, M>,
    req: &QueryPortReq,
) -> Result<QueryPortResp, CmdError> {
    check(req.port_num == PORT_NUM, "port number")?;
    Ok(QueryPortResp {
        attrs: port_attr(&cx.env.config.limits, cx.env.port.state()),
        ..Default::default()
    })
}

pub(crate) fn handle_query_pkey<M>(
    _cx: &mut Ctx<'_, M>,
    req: &QueryPkeyReq,
) -> Result<QueryPkeyResp, CmdError> {
    check(req.port_num == PORT_NUM, "port number")?;
    check(u16::from(req.index) < MAX_PKEYS, "P_Key index")?;
    Ok(QueryPkeyResp {
        pkey: DEFAULT_PKEY,
        ..Default::default()
    })
}

/// Reports a change of the port's link to the guest, once per change.
pub(crate) fn handle_link_change<M: GuestMemory>(mem: &M, env: &Env, session: &mut Session) {
    let up = env.port.state().link_up();
    if up == session.link_up {
        return;
    }
    session.link_up = up;
    let event_type = if up {
        event::PORT_ACTIVE
    } else {
        event::PORT_ERR
    };
    session
        .dsr
        .events
        .post_async(mem, &env.irq, &env.metrics, event_type, PORT_NUM.into());
    // Counted once the event is in the ring: whoever sees the count finds
    // the event (the tests wait for the count, then read the ring).
    env.metrics.link_change.inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ib_mtu_follows_ethernet_mtu() {
        for (eth, ib) in [
            (1500, mtu::MTU_1024),
            (9000, mtu::MTU_4096),
            (4200, mtu::MTU_4096),
            (4191, 4),
            (1100, 2),
            (576, mtu::MTU_256),
            (60, mtu::MTU_256),
            (0, mtu::MTU_256),
        ] {
            assert_eq!(ib_mtu(eth), ib, "mtu {eth}");
        }
    }

    #[test]
    fn port_state_follows_link() {
        let limits = Limits::default();
        let mut port = PortState {
            mac: [2; 6],
            carrier: true,
            active: false,
            mtu: 1500,
        };
        let down = port_attr(&limits, port);
        assert_eq!((down.state, down.phys_state), (1, 3));
        port.active = true;
        let up = port_attr(&limits, port);
        assert_eq!((up.state, up.phys_state), (4, 5));
        assert_eq!(up.active_mtu, mtu::MTU_1024);
        assert!(up.gid_tbl_len <= limits.gid_tbl_len);
        assert_eq!(up.pkey_tbl_len, 1);
    }
}

// SPDX-License-Identifier: Apache-2.0
//! MODIFY_QP: the IB QP state machine (IBA 10.3.1; Linux's
//! `ib_modify_qp_is_ok` table for RC, UD and GSI) and the validation of
//! every attribute the guest may set.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use pvrdma_abi::cmd::ModifyQpReq;
use pvrdma_abi::verbs::{
    access, mtu, qp_attr_mask as m, qp_state as s, qp_type, AhAttr, QpAttr, AH_FLAG_GRH,
    MAX_PATH_MIG_STATE,
};
use pvrdma_abi::QPN_MASK;
use vm_memory::GuestMemory;

use crate::caps::{MAX_PKEYS, MAX_RD_ATOMIC, PORT_NUM};
use crate::datapath::wire::Wire;
use crate::datapath::{self, Input};
use crate::error::{check, CmdError};
use crate::objects::get_mut;
use crate::objects::gid::GidTable;
use crate::objects::session::Ctx;

/// QP access flags: local write, remote write/read/atomic, MW bind.
const QP_ACCESS: u32 = access::LOCAL_WRITE
    | access::REMOTE_WRITE
    | access::REMOTE_READ
    | access::REMOTE_ATOMIC
    | access::MW_BIND;
/// Largest values of the 5-bit timer and 3-bit retry fields.
const MAX_TIMER: u8 = 31;
const MAX_RETRY: u8 = 7;
/// PSNs are 24-bit; larger values are masked, as hardware does.
const PSN_MASK: u32 = 0x00ff_ffff;

/// The (required, optional) attributes of `cur` -> `next` for a QP of
/// type `t`, or `None` if the transition is invalid.
fn transition(cur: u32, next: u32, t: u8) -> Option<(u32, u32)> {
    let rc = t == qp_type::RC;
    let by_type = |rc_mask: u32, ud_mask: u32, gsi_mask: u32| match t {
        qp_type::RC => rc_mask,
        qp_type::UD => ud_mask,
        _ => gsi_mask,
    };
    let rts_opt = if rc {
        m::CUR_STATE | m::ACCESS_FLAGS | m::ALT_PATH | m::MIN_RNR_TIMER | m::PATH_MIG_STATE
    } else {
        m::CUR_STATE | m::QKEY
    };
    Some(match (cur, next) {
        (_, s::RESET) | (s::INIT..=s::ERR, s::ERR) => (0, 0),
        (s::RESET, s::INIT) => (
            by_type(
                m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS,
                m::PKEY_INDEX | m::PORT | m::QKEY,
                m::PKEY_INDEX | m::QKEY,
            ),
            0,
        ),
        (s::INIT, s::INIT) => (
            0,
            by_type(
                m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS,
                m::PKEY_INDEX | m::PORT | m::QKEY,
                m::PKEY_INDEX | m::QKEY,
            ),
        ),
        (s::INIT, s::RTR) if rc => (
            m::AV
                | m::PATH_MTU
                | m::DEST_QPN
                | m::RQ_PSN
                | m::MAX_DEST_RD_ATOMIC
                | m::MIN_RNR_TIMER,
            m::ALT_PATH | m::ACCESS_FLAGS | m::PKEY_INDEX,
        ),
        (s::INIT, s::RTR) => (0, m::PKEY_INDEX | m::QKEY),
        (s::RTR, s::RTS) if rc => (
            m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::SQ_PSN | m::MAX_QP_RD_ATOMIC,
            rts_opt,
        ),
        (s::RTR, s::RTS) => (m::SQ_PSN, rts_opt),
        (s::RTS, s::RTS) | (s::SQD, s::RTS) => (0, rts_opt),
        (s::RTS, s::SQD) => (0, m::EN_SQD_ASYNC_NOTIFY),
        (s::SQD, s::SQD) if rc => (
            0,
            m::PORT
                | m::AV
                | m::TIMEOUT
                | m::RETRY_CNT
                | m::RNR_RETRY
                | m::MAX_QP_RD_ATOMIC
                | m::MAX_DEST_RD_ATOMIC
                | m::ALT_PATH
                | m::ACCESS_FLAGS
                | m::PKEY_INDEX
                | m::MIN_RNR_TIMER
                | m::PATH_MIG_STATE,
        ),
        (s::SQD, s::SQD) => (0, m::PKEY_INDEX | m::QKEY),
        (s::SQE, s::RTS) if rc => (0, 0),
        (s::SQE, s::RTS) => (0, m::CUR_STATE | m::QKEY),
        _ => return None,
    })
}

/// An address vector: port 1, a GRH (RoCE), and a bound source GID.
fn check_av(av: &AhAttr, gids: &GidTable) -> Result<(), CmdError> {
    check(av.port_num == PORT_NUM, "AV port")?;
    check(av.ah_flags & AH_FLAG_GRH != 0, "AV without GRH")?;
    check(
        gids.get(av.grh.sgid_index.into()).is_some(),
        "AV source GID index (not bound)",
    )
}

/// The value checks for each attribute in `mask`.
fn check_attrs(mask: u32, a: &QpAttr, gids: &GidTable) -> Result<(), CmdError> {
    let has = |bit: u32| mask & bit != 0;
    let checks: [(u32, bool, &'static str); 12] = [
        (m::PORT, a.port_num == PORT_NUM, "port"),
        (m::PKEY_INDEX, a.pkey_index < MAX_PKEYS, "P_Key index"),
        (
            m::ACCESS_FLAGS,
            a.qp_access_flags & !QP_ACCESS == 0,
            "QP access flags",
        ),
        (m::PATH_MTU, mtu::bytes(a.path_mtu).is_some(), "path MTU"),
        (m::TIMEOUT, a.timeout <= MAX_TIMER, "timeout"),
        (m::RETRY_CNT, a.retry_cnt <= MAX_RETRY, "retry count"),
        (m::RNR_RETRY, a.rnr_retry <= MAX_RETRY, "RNR retry count"),
        (
            m::MIN_RNR_TIMER,
            a.min_rnr_timer <= MAX_TIMER,
            "minimum RNR timer",
        ),
        (
            m::MAX_QP_RD_ATOMIC,
            u32::from(a.max_rd_atomic) <= MAX_RD_ATOMIC,
            "outstanding RDMA READs",
        ),
        (
            m::MAX_DEST_RD_ATOMIC,
            u32::from(a.max_dest_rd_atomic) <= MAX_RD_ATOMIC,
            "responder RDMA READs",
        ),
        (
            m::PATH_MIG_STATE,
            a.path_mig_state <= MAX_PATH_MIG_STATE,
            "path migration state",
        ),
        (m::DEST_QPN, a.dest_qp_num <= QPN_MASK, "destination QPN"),
    ];
    for (bit, ok, what) in checks {
        check(!has(bit) || ok, what)?;
    }
    if has(m::ALT_PATH) {
        return Err(CmdError::Unsupported("alternate path"));
    }
    if has(m::AV) {
        check_av(&a.ah_attr, gids)?;
    }
    Ok(())
}

/// Copies one attribute from the request into the QP's attributes.
type Setter = fn(&mut QpAttr, &QpAttr);

/// Copies the attributes in `mask` from `new` into `attrs`.
fn apply(attrs: &mut QpAttr, mask: u32, new: &QpAttr) {
    let setters: [(u32, Setter); 17] = [
        (m::EN_SQD_ASYNC_NOTIFY, |a, n| {
            a.en_sqd_async_notify = n.en_sqd_async_notify
        }),
        (m::ACCESS_FLAGS, |a, n| {
            a.qp_access_flags = n.qp_access_flags
        }),
        (m::PKEY_INDEX, |a, n| a.pkey_index = n.pkey_index),
        (m::PORT, |a, n| a.port_num = n.port_num),
        (m::QKEY, |a, n| a.qkey = n.qkey),
        (m::AV, |a, n| a.ah_attr = n.ah_attr),
        (m::PATH_MTU, |a, n| a.path_mtu = n.path_mtu),
        (m::TIMEOUT, |a, n| a.timeout = n.timeout),
        (m::RETRY_CNT, |a, n| a.retry_cnt = n.retry_cnt),
        (m::RNR_RETRY, |a, n| a.rnr_retry = n.rnr_retry),
        (m::RQ_PSN, |a, n| a.rq_psn = n.rq_psn & PSN_MASK),
        (m::MAX_QP_RD_ATOMIC, |a, n| {
            a.max_rd_atomic = n.max_rd_atomic
        }),
        (m::MIN_RNR_TIMER, |a, n| a.min_rnr_timer = n.min_rnr_timer),
        (m::SQ_PSN, |a, n| a.sq_psn = n.sq_psn & PSN_MASK),
        (m::MAX_DEST_RD_ATOMIC, |a, n| {
            a.max_dest_rd_atomic = n.max_dest_rd_atomic
        }),
        (m::PATH_MIG_STATE, |a, n| {
            a.path_mig_state = n.path_mig_state
        }),
        (m::DEST_QPN, |a, n| a.dest_qp_num = n.dest_qp_num),
    ];
    for (bit, set) in setters {
        if mask & bit != 0 {
            set(attrs, new);
        }
    }
}

/// MODIFY_QP; `wire` takes the frames of a flush on the way to ERR.
pub(crate) fn handle_modify_qp<M: GuestMemory>(
    cx: &mut Ctx<'_, M>,
    wire: &Wire,
    req: &ModifyQpReq,
) -> Result<(), CmdError> {
    let handle = req.qp_handle;
    let objects = &mut cx.s.objects;
    let numbering = objects.qp_numbering(handle);
    objects.gids.sync(&cx.env.port);
    let gids = &objects.gids;
    let qp = get_mut(&mut objects.qps, "QP", handle)?;
    let (mask, a) = (req.attr_mask, &req.attrs);
    check(mask & !m::ALL == 0, "QP attribute mask")?;
    let cur = qp.state;
    check(
        mask & m::CUR_STATE == 0 || a.cur_qp_state == cur,
        "current QP state",
    )?;
    check(
        mask & m::CUR_STATE == 0 || matches!(cur, s::RTR | s::RTS | s::SQD | s::SQE),
        "current QP state attribute",
    )?;
    let next = if mask & m::STATE != 0 {
        a.qp_state
    } else {
        cur
    };
    let (req_attrs, opt_attrs) =
        transition(cur, next, qp.qp_type).ok_or(CmdError::Invalid("QP state transition"))?;
    check(
        mask & req_attrs == req_attrs,
        "QP attributes (required missing)",
    )?;
    check(
        mask & !(req_attrs | opt_attrs | m::STATE) == 0,
        "QP attributes (not allowed in this transition)",
    )?;
    check_attrs(mask, a, gids)?;

    let before = qp.attrs;
    apply(&mut qp.attrs, mask, a);
    let events = &mut cx.s.dsr.events;
    match next {
        s::RESET => {
            // The guest zeroes the ring indices itself.
            qp.state = s::RESET;
            qp.attrs = QpAttr::default();
            qp.engine = None;
            qp.sq.reset();
            if let Some(rq) = qp.rq.as_mut() {
                rq.reset();
            }
        }
        s::ERR if qp.engine.is_some() => {
            // The engine's WQEs are older than the rings': flush them first.
            qp.set_error_state(cx.mem, cx.env, events, handle);
            let now = cx.env.clock.now();
            let out = datapath::run_qp(
                cx.mem,
                cx.env,
                wire,
                events,
                objects,
                handle,
                now,
                Input::Kick,
            );
            // An engine in the error state only completes work: no frame
            // is sent from under the state lock in practice.
            let metrics = &cx.env.metrics;
            wire.send(metrics, wire.route(&objects.gids, metrics, out.frames));
        }
        s::ERR => {
            let qp_id = (handle, numbering);
            qp.enter_error(cx.mem, cx.env, events, qp_id, &mut objects.cqs);
        }
        s::RTR | s::RTS | s::SQD => {
            let port = cx.env.port.state();
            let Some(attrs) = datapath::engine_attrs(qp, gids, port.mac, port.mtu) else {
                qp.attrs = before;
                return Err(CmdError::Invalid("QP address vector"));
            };
            match qp.engine.as_mut() {
                Some(engine) => engine.modify(attrs),
                None => qp.engine = Some(Box::new(rdma_transport::qp::Qp::new(attrs))),
            }
            qp.state = next;
        }
        _ => qp.state = next,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPES: [u8; 3] = [qp_type::RC, qp_type::UD, qp_type::GSI];

    #[test]
    fn reset_init_rtr_rts_path() {
        assert_eq!(
            transition(s::RESET, s::INIT, qp_type::RC),
            Some((m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS, 0))
        );
        assert_eq!(
            transition(s::RESET, s::INIT, qp_type::UD),
            Some((m::PKEY_INDEX | m::PORT | m::QKEY, 0))
        );
        assert_eq!(
            transition(s::RESET, s::INIT, qp_type::GSI),
            Some((m::PKEY_INDEX | m::QKEY, 0))
        );
        let (rtr, _) = transition(s::INIT, s::RTR, qp_type::RC).unwrap_or_default();
        assert_ne!(rtr & m::DEST_QPN, 0);
        assert_eq!(
            transition(s::INIT, s::RTR, qp_type::UD).map(|t| t.0),
            Some(0)
        );
        assert_eq!(
            transition(s::RTR, s::RTS, qp_type::UD).map(|t| t.0),
            Some(m::SQ_PSN)
        );
    }

    #[test]
    fn invalid_transitions() {
        for t in TYPES {
            for (cur, next) in [
                (s::RESET, s::RTR),
                (s::RESET, s::RTS),
                (s::RESET, s::ERR),
                (s::INIT, s::RTS),
                (s::RTR, s::INIT),
                (s::RTS, s::RTR),
                (s::ERR, s::RTS),
                (s::SQE, s::SQD),
                (s::RESET, 7),
                (7, s::RESET + 100),
            ] {
                assert_eq!(transition(cur, next, t), None, "{cur}->{next} type {t}");
            }
            // Everything may go to RESET, and every state but RESET to ERR.
            for cur in s::RESET..=s::ERR {
                assert!(transition(cur, s::RESET, t).is_some());
                assert_eq!(transition(cur, s::ERR, t).is_some(), cur != s::RESET);
            }
        }
    }

    #[test]
    fn attribute_values() {
        let gids = GidTable::new(4);
        let ok = QpAttr {
            port_num: 1,
            path_mtu: 3,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            dest_qp_num: QPN_MASK,
            ..QpAttr::default()
        };
        let mask = m::PORT | m::PATH_MTU | m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::DEST_QPN;
        assert!(check_attrs(mask, &ok, &gids).is_ok());
        for bad in [
            QpAttr { port_num: 2, ..ok },
            QpAttr { path_mtu: 6, ..ok },
            QpAttr { timeout: 32, ..ok },
            QpAttr { retry_cnt: 8, ..ok },
            QpAttr {
                dest_qp_num: QPN_MASK + 1,
                ..ok
            },
        ] {
            assert!(check_attrs(mask, &bad, &gids).is_err());
        }
        // The AV's source GID must be bound.
        assert!(check_attrs(m::AV, &ok, &gids).is_err());
        assert!(matches!(
            check_attrs(m::ALT_PATH, &ok, &gids),
            Err(CmdError::Unsupported(_))
        ));
    }

    #[test]
    fn psns_are_masked() {
        let mut attrs = QpAttr::default();
        let new = QpAttr {
            sq_psn: 0xff12_3456,
            rq_psn: 0x0100_0001,
            qkey: 7,
            ..QpAttr::default()
        };
        apply(&mut attrs, m::SQ_PSN | m::RQ_PSN, &new);
        assert_eq!((attrs.sq_psn, attrs.rq_psn, attrs.qkey), (0x12_3456, 1, 0));
    }
}

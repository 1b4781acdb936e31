// SPDX-License-Identifier: Apache-2.0
//! The data path: the RoCE engine of `rdma-transport` run over the
//! device's objects. The worker thread calls [`run_qp`] for a QP when its
//! doorbell rings, a frame arrives for it or its timer expires; each call
//! takes the guest's new send WQEs into the engine, lets the engine act,
//! and turns its completions into CQEs, all under the state lock and
//! within a fixed work budget.
//!
//! `wqe` decodes work requests from the rings, `mem` is the engine's view
//! of MRs over guest memory, `wire` the frames in and out.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

pub(crate) mod local;
pub(crate) mod mem;
pub(crate) mod shm_ring;
pub(crate) mod view;
pub(crate) mod wire;
pub(crate) mod wqe;

use std::collections::BTreeMap;

use pvrdma_abi::verbs::{mtu, qp_state, qp_type};
use pvrdma_abi::wqe::{network_type, wc_flags, wc_status, Cqe};
use rdma_transport::net::Mac;
use rdma_transport::packet::Packet;
use rdma_transport::psn::Psn;
use rdma_transport::qp::{Io, Qp as Engine, QpAttrs};
use rdma_transport::req::MAX_SEGMENT;
use rdma_transport::verbs::{Access, CompletionSink, ImmOrInv, WcOpcode, WcStatus, WorkCompletion};
use vm_memory::GuestMemory;

use self::mem::GuestMrs;
use self::wire::{Frames, Wire};
use self::wqe::{peek_send, GuestRecvQueue};
use crate::env::Env;
use crate::events::EventRings;
use crate::objects::cq::Cq;
use crate::objects::ctx::Numbering;
use crate::objects::gid::GidTable;
use crate::objects::qp::Qp;
use crate::objects::srq::Srq;
use crate::objects::Objects;
use crate::port::ib_mtu;

/// Packets (or flushed WQEs) one QP may produce per call before the
/// worker gives other QPs and events a turn.
pub(crate) const BUDGET: usize = 64;
/// The same towards a same-host peer, whose packets are segments of up
/// to 32 KiB: 256 KiB per call, and no more than the peer's ring has
/// room for ([`SEGMENT_ROOM`] each). With less, or while frames to the
/// peer wait for room in its ring (the backlog), none: the QP waits (the
/// worker defers it, see `worker::waits_for_room`) instead of building
/// segments in buffers for the backlog, a copy more each (the QPs'
/// windows, `req::SEGMENT_WINDOW` each, can add up to more than the ring
/// holds).
const SEGMENT_BUDGET: usize = 8;
/// Ring room one segment takes at most: its payload, headers (at most
/// 100 bytes: Ethernet, VLAN, IPv6, UDP, BTH, RETH, immediate) and the
/// ring's length word and padding.
pub(crate) const SEGMENT_ROOM: usize = MAX_SEGMENT as usize + 256;

/// Why the worker runs a QP.
#[derive(Clone, Copy)]
pub(crate) enum Input<'p> {
    /// A doorbell (new WQEs), or left-over work.
    Kick,
    /// Frames addressed to the QP, in the order they arrived: one call
    /// for a run of them, not one per frame.
    Packets(&'p [Packet<'p>]),
    /// Time passed (`now` reached its deadline).
    Timer,
}

/// What a [`run_qp`] call leaves to the worker.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// Frames to transmit (a same-host QP's went into its ring already).
    pub(crate) frames: Vec<Vec<u8>>,
    /// The budget ran out: call again.
    pub(crate) more: bool,
}

/// Completions collected during one engine call, posted afterwards (the
/// CQs live beside the QP in [`Objects`]).
#[derive(Default)]
struct Completions(Vec<(WorkCompletion, bool)>);

impl CompletionSink for Completions {
    fn complete(&mut self, wc: WorkCompletion, send: bool) {
        self.0.push((wc, send));
    }
}

/// The CQE of a completion of QP `handle` in its guest's `numbering` (a
/// kernel QP's driver also reads `network_hdr_type`).
fn cqe(handle: u32, wc: &WorkCompletion, numbering: Numbering) -> Cqe {
    let mut cqe = Cqe {
        wr_id: wc.wr_id,
        qp: handle.into(),
        opcode: numbering.wc_opcode(wc.opcode),
        status: wc.status as u32,
        byte_len: wc.byte_len,
        src_qp: wc.src_qpn,
        port_num: crate::caps::PORT_NUM,
        ..Cqe::default()
    };
    match wc.imm_or_inv {
        Some(ImmOrInv::Imm(imm)) => {
            cqe.wc_flags |= wc_flags::WITH_IMM;
            // Big-endian in the CQE, as it was in the sender's WQE.
            cqe.imm_data = imm.swap_bytes();
        }
        Some(ImmOrInv::Inv(key)) => {
            cqe.wc_flags |= wc_flags::WITH_INVALIDATE;
            cqe.imm_data = key;
        }
        None => {}
    }
    if let Some(src) = wc.ud_src {
        cqe.wc_flags |= wc_flags::GRH;
        cqe.smac = src.smac;
        cqe.sl = roce_packet_type(src.ipv6);
        if numbering == Numbering::Kernel {
            cqe.wc_flags |= wc_flags::WITH_NETWORK_HDR_TYPE;
            cqe.network_hdr_type = if src.roce_v1 {
                network_type::ROCE_V1
            } else if src.ipv6 {
                network_type::IPV6
            } else {
                network_type::IPV4
            };
        }
    }
    cqe
}

/// A UD receive's `sl`: RoCE has no LRH to take a service level from, so the
/// CQE says what Annex A17.4.5.1 wants it to (was the frame IPv4 or IPv6?)
/// where mlx5 does: bit 3 set for a UDP (RoCE v2) frame, bits 2..0 its L3
/// header, 1 for IPv6, 2 for IPv4. UCX 1.11-1.17's UD transport (Debian
/// 12's 1.13 among them) reads the IP version of every datagram from `sl`
/// and, from 0, takes an IPv4 frame's GRH area for an IPv6 one: its
/// destination check then drops every datagram (UCX's wire-up and UD
/// never connect).
fn roce_packet_type(ipv6: bool) -> u8 {
    const UDP: u8 = 1 << 3;
    UDP | if ipv6 { 1 } else { 2 }
}

/// The engine attributes of `qp` as modify_qp left them; `None` when its
/// address vector cannot be resolved (source GID gone, IP versions mixed).
pub(crate) fn engine_attrs(qp: &Qp, gids: &GidTable, mac: Mac, port_mtu: u16) -> Option<QpAttrs> {
    let a = &qp.attrs;
    let ud = qp.qp_type != qp_type::RC;
    let port = mtu::bytes(ib_mtu(port_mtu)).unwrap_or(256);
    let path = if ud {
        port
    } else {
        mtu::bytes(a.path_mtu).unwrap_or(port).min(port)
    };
    let addr = if ud {
        wire::no_addr()
    } else {
        let ah = &a.ah_attr;
        let sgid = gids.get(ah.grh.sgid_index.into())?;
        let g = &ah.grh;
        wire::addr(
            mac,
            sgid,
            g.dgid,
            ah.dmac,
            g.traffic_class,
            g.hop_limit,
            g.flow_label,
            qp.qpn,
        )?
    };
    Some(QpAttrs {
        qpn: qp.qpn,
        dest_qpn: a.dest_qp_num,
        pd: qp.pd,
        // Same bits as `ib_access_flags`; the engine reads the remote ones.
        access: Access::from_bits_truncate(a.qp_access_flags),
        mtu: path,
        ud,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        min_rnr_timer: a.min_rnr_timer,
        max_rd_atomic: a.max_rd_atomic,
        qkey: a.qkey,
        sq_psn: Psn::new(a.sq_psn),
        rq_psn: Psn::new(a.rq_psn),
        addr,
    })
}

/// Takes the guest's new send WQEs into the engine, up to the queue's
/// size. A WQE that does not decode completes with an error and fails
/// the QP, as a HCA's local QP operation error does.
#[allow(clippy::too_many_arguments)]
fn fetch_sends<M: GuestMemory>(
    mem: &M,
    env: &Env,
    qp: &mut Qp,
    engine: &mut Engine,
    handle: u32,
    numbering: Numbering,
    gids: &GidTable,
    mac: Mac,
    cq: &mut Completions,
) {
    let ud = qp.qp_type != qp_type::RC;
    let cap = usize::try_from(qp.cap.max_send_wr).unwrap_or(usize::MAX);
    let mut taken = false;
    while engine.send_queue_len() < cap && !engine.is_error() {
        match qp.sq.pending(mem) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                guest_warn!(env.metrics.ring_invalid, "qp={handle}: send ring: {e}");
                engine.set_error();
                break;
            }
        }
        let decoded = peek_send(
            mem,
            &qp.sq,
            numbering,
            qp.cap.max_send_sge,
            ud,
            qp.sq_sig_all,
        );
        qp.sq.advance();
        taken = true;
        let mut entry = match decoded {
            Ok(d) => {
                let ah = d.av.and_then(|av| {
                    let sgid = gids.get(av.gid_index.into())?;
                    let (tc, hl, fl) = (av.tclass, av.hop_limit, av.flow_label);
                    wire::addr(mac, sgid, av.dgid, av.dmac, tc, hl, fl, qp.qpn)
                });
                if ud && ah.is_none() {
                    guest_warn!(env.metrics.wqe_invalid, "qp={handle}: bad address vector");
                    let wqe = &d.entry.wqe;
                    fail_send(engine, cq, wqe.wr_id, wqe.opcode.wc_opcode(), handle);
                    continue;
                }
                let mut e = d.entry;
                e.ah = ah;
                e
            }
            Err(bad) => {
                guest_warn!(env.metrics.wqe_invalid, "qp={handle}: {}", bad.error);
                fail_send(engine, cq, bad.wr_id, numbering.send_wc(bad.opcode), handle);
                continue;
            }
        };
        if ud {
            // The kernel substitutes the QP's Q_Key when bit 31 is set.
            if entry.wqe.remote.ud_qkey & 0x8000_0000 != 0 && qp.qp_type == qp_type::GSI {
                entry.wqe.remote.ud_qkey = qp.attrs.qkey;
            }
        }
        if engine.post_send(entry).is_err() {
            guest_warn!(env.metrics.wqe_invalid, "qp={handle}: send WQE refused");
            engine.set_error();
        }
    }
    if taken {
        if let Err(e) = qp.sq.publish(mem) {
            guest_warn!(env.metrics.ring_invalid, "qp={handle}: send ring: {e}");
            engine.set_error();
        }
    }
}

/// Completes a WQE that never reached the engine with a local QP
/// operation error and fails the QP.
fn fail_send(engine: &mut Engine, cq: &mut Completions, wr_id: u64, opcode: WcOpcode, handle: u32) {
    engine.set_error();
    cq.0.push((
        WorkCompletion {
            wr_id,
            status: WcStatus::LocQpOpErr,
            opcode,
            byte_len: 0,
            imm_or_inv: None,
            qpn: handle,
            src_qpn: 0,
            ud_src: None,
            solicited: false,
        },
        true,
    ));
}

/// Posts collected completions to the QP's CQs.
#[allow(clippy::too_many_arguments)]
fn post_completions<M: GuestMemory>(
    mem: &M,
    env: &Env,
    events: &mut EventRings,
    cqs: &mut BTreeMap<u32, Cq>,
    qp: &Qp,
    handle: u32,
    numbering: Numbering,
    done: Completions,
) {
    for (wc, send) in done.0 {
        let cq_handle = if send { qp.send_cq } else { qp.recv_cq };
        let Some(cq) = cqs.get_mut(&cq_handle) else {
            continue;
        };
        match wc.status as u32 {
            wc_status::SUCCESS => {}
            wc_status::WR_FLUSH_ERR => {
                env.metrics.wqe_flushed.inc();
            }
            _ => {
                env.metrics.wqe_error.inc();
            }
        }
        // ARM_SOL wakes for a solicited receive or any error.
        let solicited = wc.solicited || wc.status != WcStatus::Success;
        let cqe = cqe(handle, &wc, numbering);
        cq.post(mem, env, events, cq_handle, &cqe, solicited);
    }
}

/// SRQ_LIMIT_REACHED once fewer WQEs than the armed limit remain (the
/// limit then disarms, as modify_srq's `srq_limit` semantics say).
fn srq_limit<M: GuestMemory>(
    mem: &M,
    env: &Env,
    events: &mut EventRings,
    (handle, srq): (u32, &mut Srq),
) {
    if srq.limit == 0 {
        return;
    }
    if srq.ring.pending(mem).is_ok_and(|left| left < srq.limit) {
        srq.limit = 0;
        events.post_async(
            mem,
            &env.irq,
            &env.metrics,
            pvrdma_abi::wqe::event::SRQ_LIMIT_REACHED,
            handle,
        );
    }
}

/// Runs QP `handle` once for `input` at time `now` (nanoseconds); frames
/// towards a same-host peer go straight into its ring on `wire`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_qp<M: GuestMemory>(
    mem: &M,
    env: &Env,
    wire: &Wire,
    events: &mut EventRings,
    objects: &mut Objects,
    handle: u32,
    now: u64,
    input: Input<'_>,
) -> Outcome {
    let numbering = objects.qp_numbering(handle);
    let Objects {
        qps,
        cqs,
        srqs,
        mrs,
        gids,
        ..
    } = objects;
    let Some(qp) = qps.get_mut(&handle).map(|qp| &mut **qp) else {
        return Outcome::default();
    };
    let Some(mut engine) = qp.engine.take() else {
        return Outcome::default();
    };
    let port = env.port.state();
    gids.sync(&env.port);
    // Towards a VMM of this host, whole segments instead of MTU packets.
    let dst_mac = engine.attrs().addr.dst_mac;
    let local = wire.local.as_ref().filter(|_| qp.qp_type == qp_type::RC);
    let same_host = local.is_some_and(|l| l.has_ring(dst_mac));
    engine.set_segment(if same_host { MAX_SEGMENT } else { 0 });
    let budget = match local {
        Some(l) if same_host => {
            (l.room_to(dst_mac, SEGMENT_ROOM).unwrap_or(0) / SEGMENT_ROOM).min(SEGMENT_BUDGET)
        }
        _ => BUDGET,
    };
    let mut done = Completions::default();
    if matches!(input, Input::Kick) && !engine.is_error() {
        // What the guest claims to have posted must make sense: a bad
        // index is fatal for the QP (QP_FATAL, then the error state).
        if let Err(e) = qp.check_rings(mem) {
            guest_warn!(env.metrics.ring_invalid, "qp={handle}: {e}");
            qp.post_event(mem, env, events, handle, pvrdma_abi::wqe::event::QP_FATAL);
            engine.set_error();
        }
    }
    if qp.state == qp_state::RTS && !engine.is_error() {
        fetch_sends(
            mem,
            env,
            qp,
            &mut engine,
            handle,
            numbering,
            gids,
            port.mac,
            &mut done,
        );
    }
    let mut frames = match wire.local.as_ref() {
        Some(local) if same_host => Frames::same_host(local, dst_mac, &env.metrics),
        _ => Frames::default(),
    };
    let mut recv_error = None;
    let mut taken = 0;
    let work = {
        let srq = qp.srq.and_then(|h| srqs.get_mut(&h));
        let mut rq = match (srq, qp.rq.as_mut()) {
            (Some(srq), _) => Some(GuestRecvQueue::new(mem, &mut srq.ring, srq.max_sge)),
            (None, Some(rq)) => Some(GuestRecvQueue::new(mem, rq, qp.cap.max_recv_sge)),
            (None, None) => None,
        };
        let local = wire.local.as_ref();
        let mut mrs = GuestMrs { mem, mrs, local };
        let mut io = Io {
            mr: &mut mrs,
            cq: &mut done,
            net: &mut frames,
            srq: rq
                .as_mut()
                .map(|q| q as &mut dyn rdma_transport::resp::RecvQueue),
        };
        match input {
            Input::Packets(pkts) => {
                for pkt in pkts {
                    engine.on_packet(pkt, now, &mut io);
                }
            }
            Input::Timer => engine.on_timer(now, &mut io),
            Input::Kick => {}
        }
        let budget = if engine.is_error() {
            usize::MAX
        } else {
            budget
        };
        let work = engine.flush(now, &mut io, budget);
        if let Some(q) = rq {
            recv_error = q.error;
            taken = q.taken;
        }
        work
    };
    if let Some(srq) = qp.srq.and_then(|h| srqs.get_mut(&h).map(|s| (h, s))) {
        if taken > 0 {
            srq_limit(mem, env, events, srq);
        }
    }
    if let Some(e) = recv_error {
        guest_warn!(env.metrics.wqe_invalid, "qp={handle}: receive queue: {e}");
        engine.set_error();
        engine.flush(
            now,
            &mut Io {
                mr: &mut GuestMrs {
                    mem,
                    mrs,
                    local: wire.local.as_ref(),
                },
                cq: &mut done,
                net: &mut frames,
                srq: None,
            },
            usize::MAX,
        );
    }
    let failed = engine.is_error();
    let more = !failed && work >= budget;
    qp.engine = Some(engine);
    post_completions(mem, env, events, cqs, qp, handle, numbering, done);
    if failed && qp.state != qp_state::ERR {
        // A transport error (retry exceeded, fatal NAK, bad WQE): the QP
        // is in the error state; what the engine never took is flushed.
        qp.enter_error(mem, env, events, (handle, numbering), cqs);
    } else if failed {
        qp.flush_rings(mem, env, events, (handle, numbering), cqs);
    }
    Outcome {
        frames: frames.out,
        more,
    }
}

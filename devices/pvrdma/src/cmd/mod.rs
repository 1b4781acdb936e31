// SPDX-License-Identifier: Apache-2.0
//! The command channel (ABI doc 3): one `match` from command code to
//! `handle_<cmd>`, request decoding from a single copy of the slot, and
//! the response conventions (the error ones are in `error`). The handlers
//! live with the objects they create (`objects`, `port`); MODIFY_QP, which
//! also drives the data path, lives here (`qp_modify`).
//!
//! A command runs synchronously inside the REQUEST write: the 184-byte
//! request is copied out of the command slot once, decoded from that copy,
//! executed, and at most the 176-byte response is written back before ERR
//! is set and vector 0 raised. A failure sets ERR (and `hdr.err`) to a
//! positive errno; the guest sees -EFAULT and the device stays usable.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

mod qp_modify;

use std::mem::size_of;

use pvrdma_abi::cmd::{CmdCode, CmdHdr, DestroyMrReq, RespHdr, REQ_SIZE, RESP_SIZE};
use vm_memory::{ByteValued, GuestMemory};

use crate::datapath::wire::Wire;
use crate::error::CmdError;
use crate::objects::qp::CreateQpResponse;
use crate::objects::session::Ctx;
use crate::objects::{cq, ctx, gid, mr, qp, srq};
use crate::port;

/// Bytes of a response, header included.
pub(crate) struct Response {
    bytes: [u8; RESP_SIZE],
    len: usize,
}

impl Response {
    /// Just the header, for commands without a payload.
    fn header_only() -> Self {
        Self {
            bytes: [0; RESP_SIZE],
            len: size_of::<RespHdr>(),
        }
    }

    fn from_struct<T: ByteValued>(resp: &T) -> Self {
        let mut out = Self::header_only();
        let src = resp.as_slice();
        if let Some(dst) = out.bytes.get_mut(..src.len()) {
            dst.copy_from_slice(src);
            out.len = src.len();
        }
        out
    }

    fn set_header(&mut self, hdr: RespHdr) {
        if let Some(dst) = self.bytes.get_mut(..size_of::<RespHdr>()) {
            dst.copy_from_slice(hdr.as_slice());
        }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or_default()
    }
}

/// Copies a `T` out of the request bytes (never from guest memory again).
fn decode<T: ByteValued>(req: &[u8; REQ_SIZE]) -> Result<T, CmdError> {
    let mut value = T::zeroed();
    let src = req
        .get(..size_of::<T>())
        .ok_or(CmdError::Invalid("request size"))?;
    value.as_mut_slice().copy_from_slice(src);
    Ok(value)
}

/// Runs `handler` on the decoded request and encodes its response.
fn run<Req: ByteValued, Resp: ByteValued>(
    req: &[u8; REQ_SIZE],
    handler: impl FnOnce(&Req) -> Result<Resp, CmdError>,
) -> Result<Response, CmdError> {
    handler(&decode(req)?).map(|resp| Response::from_struct(&resp))
}

/// Like [`run`], for commands whose response is the header alone.
fn run_noop<Req: ByteValued>(
    req: &[u8; REQ_SIZE],
    handler: impl FnOnce(&Req) -> Result<(), CmdError>,
) -> Result<Response, CmdError> {
    handler(&decode(req)?).map(|()| Response::header_only())
}

/// The request's header.
pub(crate) fn header(req: &[u8; REQ_SIZE]) -> CmdHdr {
    decode(req).unwrap_or_default()
}

/// Executes the command in `req` and returns the complete response
/// (header filled in) and the status for ERR. `None` for a command code
/// outside the ABI, which gets no response at all. `wire` sends the frames
/// a command makes the data path emit.
pub(crate) fn execute<M: GuestMemory>(
    cx: &mut Ctx<'_, M>,
    wire: &Wire,
    req: &[u8; REQ_SIZE],
) -> (Option<Response>, u32) {
    let hdr = header(req);
    let code = match CmdCode::try_from(hdr.cmd) {
        Ok(code) => code,
        Err(other) => {
            guest_warn!(cx.metrics().cmd_unknown, "unknown command {other}");
            return (None, CmdError::Unknown(other).errno());
        }
    };
    let (mut resp, status) = match dispatch(cx, wire, code, req) {
        Ok(resp) => {
            cx.metrics().cmd_executed.inc();
            (resp, 0)
        }
        Err(e) => {
            guest_warn!(cx.metrics().cmd_failed, "cmd={code:?} failed: {e}");
            (Response::header_only(), e.errno())
        }
    };
    resp.set_header(RespHdr {
        response: hdr.response,
        ack: code.ack(),
        err: u8::try_from(status).unwrap_or(u8::MAX),
        reserved: [0; 3],
    });
    (Some(resp), status)
}

/// CREATE_QP, whose response has the layout of the driver's version.
fn run_create_qp<M: GuestMemory>(
    cx: &mut Ctx<'_, M>,
    req: &[u8; REQ_SIZE],
) -> Result<Response, CmdError> {
    Ok(match qp::handle_create_qp(cx, &decode(req)?)? {
        CreateQpResponse::V1(resp) => Response::from_struct(&resp),
        CreateQpResponse::V2(resp) => Response::from_struct(&resp),
    })
}

fn dispatch<M: GuestMemory>(
    cx: &mut Ctx<'_, M>,
    wire: &Wire,
    code: CmdCode,
    req: &[u8; REQ_SIZE],
) -> Result<Response, CmdError> {
    match code {
        CmdCode::QueryPort => run(req, |r| port::handle_query_port(cx, r)),
        CmdCode::QueryPkey => run(req, |r| port::handle_query_pkey(cx, r)),
        CmdCode::CreatePd => run(req, |r| ctx::handle_create_pd(cx, r)),
        CmdCode::DestroyPd => run_noop(req, |r| ctx::handle_destroy_pd(cx, r)),
        CmdCode::CreateMr => run(req, |r| mr::handle_create_mr(cx, r)),
        CmdCode::DestroyMr => run_noop(req, |r: &DestroyMrReq| {
            // Its pages are the guest's again once it is gone: peers that
            // copy from them must be done first.
            if let Some(local) = wire.local.as_ref() {
                local.settle(r.mr_handle, crate::datapath::local::SETTLE_WAIT);
            }
            mr::handle_destroy_mr(cx, r)
        }),
        CmdCode::CreateCq => run(req, |r| cq::handle_create_cq(cx, r)),
        CmdCode::ResizeCq => run(req, |r| cq::handle_resize_cq(cx, r)),
        CmdCode::DestroyCq => run_noop(req, |r| cq::handle_destroy_cq(cx, r)),
        CmdCode::CreateQp => run_create_qp(cx, req),
        CmdCode::ModifyQp => run_noop(req, |r| qp_modify::handle_modify_qp(cx, wire, r)),
        CmdCode::QueryQp => run(req, |r| qp::handle_query_qp(cx, r)),
        CmdCode::DestroyQp => run(req, |r| qp::handle_destroy_qp(cx, r)),
        CmdCode::CreateUc => run(req, |r| ctx::handle_create_uc(cx, r)),
        CmdCode::DestroyUc => run_noop(req, |r| ctx::handle_destroy_uc(cx, r)),
        CmdCode::CreateBind => run_noop(req, |r| gid::handle_create_bind(cx, r)),
        CmdCode::DestroyBind => run_noop(req, |r| gid::handle_destroy_bind(cx, r)),
        CmdCode::CreateSrq => run(req, |r| srq::handle_create_srq(cx, r)),
        CmdCode::ModifySrq => run_noop(req, |r| srq::handle_modify_srq(cx, r)),
        CmdCode::QuerySrq => run(req, |r| srq::handle_query_srq(cx, r)),
        CmdCode::DestroySrq => run_noop(req, |r| srq::handle_destroy_srq(cx, r)),
    }
}

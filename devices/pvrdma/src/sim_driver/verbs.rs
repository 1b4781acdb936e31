// SPDX-License-Identifier: Apache-2.0
//! The simulated driver's verbs: creating, modifying and querying objects
//! as the Linux driver and rdma-core's provider do.

use super::*;

/// What an RC QP's RESET -> INIT must set (IBA 11.2.4.2, Linux's
/// `ib_modify_qp_is_ok`).
pub const RC_INIT_MASK: u32 = m::STATE | m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS;
/// What an RC QP's INIT -> RTR must set.
pub const RC_RTR_MASK: u32 = m::STATE
    | m::AV
    | m::PATH_MTU
    | m::DEST_QPN
    | m::RQ_PSN
    | m::MAX_DEST_RD_ATOMIC
    | m::MIN_RNR_TIMER;

/// What [`SimDriver::connect_rc_with`] sets besides the addressing.
#[derive(Clone, Copy, Debug)]
pub struct RcPath {
    /// RDMA READs and atomics outstanding each way (`max_rd_atomic`,
    /// `max_dest_rd_atomic`).
    pub rd_atomic: u8,
    /// The IB MTU enum (3: 1024 bytes, 5: 4096; the port's MTU caps it).
    pub path_mtu: u8,
}

impl Default for RcPath {
    fn default() -> Self {
        Self {
            rd_atomic: 4,
            path_mtu: 3,
        }
    }
}

/// How the pages behind an MR lie in guest-physical memory
/// ([`SimDriver::reg_user_mr_laid_out`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageLayout {
    /// Each page with an unused page after it: no two contiguous.
    Scattered,
    /// Pages that follow each other, as a buffer in a guest's huge page.
    Contiguous,
}

impl SimDriver {
    pub fn create_uc(&mut self, uar_index: u32) -> Result<u32, Failure> {
        let pfn64 = (self.bars[BAR_UAR] >> 12) + u64::from(uar_index);
        let resp: CreateUcResp = self.cmd(
            CmdCode::CreateUc,
            CreateUcReq {
                pfn64,
                ..Default::default()
            },
        )?;
        self.contexts.insert(resp.ctx_handle, uar_index);
        Ok(resp.ctx_handle)
    }

    /// UAR page of context `ctx` (0 for the kernel).
    pub fn page_of(&self, ctx: u32) -> u32 {
        self.contexts.get(&ctx).copied().unwrap_or(0)
    }

    pub fn create_pd(&mut self, ctx: u32) -> Result<u32, Failure> {
        let resp: CreatePdResp = self.cmd(
            CmdCode::CreatePd,
            CreatePdReq {
                ctx_handle: ctx,
                ..Default::default()
            },
        )?;
        self.pds.insert(resp.pd_handle, ctx);
        Ok(resp.pd_handle)
    }

    /// UAR page of the context of PD `pd`.
    fn page_of_pd(&self, pd: u32) -> u32 {
        self.page_of(self.pds.get(&pd).copied().unwrap_or(0))
    }

    /// A CQ of `cqe` entries, pages as `pvrdma_create_cq` lays them out.
    pub fn create_cq(&mut self, ctx: u32, cqe: u32) -> Result<SimCq, Failure> {
        let data_pages = (u64::from(cqe) * 64).div_ceil(PAGE_SIZE) as u32;
        let pages = self.alloc_pages(1 + data_pages);
        let pdir = self.make_pdir(&pages);
        let resp: CreateCqResp = self.cmd(
            CmdCode::CreateCq,
            CreateCqReq {
                pdir_dma: pdir,
                ctx_handle: ctx,
                cqe,
                nchunks: 1 + data_pages,
                ..Default::default()
            },
        )?;
        Ok(SimCq {
            handle: resp.cq_handle,
            cqe: resp.cqe,
            writer: Self::writer(ctx),
            page: self.page_of(ctx),
            ring: DeviceRing {
                indices: pages[0] + RX_OFFSET,
                data: pages[1..].to_vec(),
                geometry: RingGeometry::new(cqe).expect("geometry"),
                elem: 64,
            },
        })
    }

    /// The kernel driver for context 0, rdma-core for the others.
    fn writer(ctx: u32) -> Writer {
        if ctx == 0 {
            Writer::Kernel
        } else {
            Writer::User
        }
    }

    fn wq(&self, header: u64, indices: u64, data: &[u64], n: u32, stride: u32) -> SimWq {
        SimWq {
            indices: header + indices,
            data: data.to_vec(),
            geometry: RingGeometry::new(n).expect("geometry"),
            stride: stride.into(),
        }
    }

    /// A QP laid out like a kernel QP: header page, SQ pages, RQ pages.
    pub fn create_qp(&mut self, spec: QpSpec) -> Result<SimQp, Failure> {
        let sq_stride = sq_stride(spec.max_send_sge).expect("stride");
        let sq_pages = (u64::from(spec.max_send_wr) * u64::from(sq_stride)).div_ceil(PAGE_SIZE);
        let rq_stride = rq_stride(spec.max_recv_sge).expect("stride");
        let rq_pages = match spec.srq {
            Some(_) => 0,
            None => (u64::from(spec.max_recv_wr) * u64::from(rq_stride)).div_ceil(PAGE_SIZE),
        };
        let pages = self.alloc_pages((1 + sq_pages + rq_pages) as u32);
        let pdir = self.make_pdir(&pages);
        let page = self.page_of_pd(spec.pd);
        let req = CreateQpReq {
            pdir_dma: pdir,
            pd_handle: spec.pd,
            send_cq_handle: spec.send_cq,
            recv_cq_handle: spec.recv_cq,
            srq_handle: spec.srq.unwrap_or(0),
            max_send_wr: spec.max_send_wr,
            max_recv_wr: spec.max_recv_wr,
            max_send_sge: spec.max_send_sge,
            max_recv_sge: spec.max_recv_sge,
            access_flags: 1,
            total_chunks: pages.len() as u16,
            send_chunks: sq_pages as u16,
            qp_type: spec.qp_type,
            is_srq: u8::from(spec.srq.is_some()),
            ..Default::default()
        };
        let (qpn, handle) = if self.driver_version >= version::QP_HANDLE {
            let resp: CreateQpRespV2 = self.cmd(CmdCode::CreateQp, req)?;
            (resp.qpn, resp.qp_handle)
        } else {
            let resp: CreateQpResp = self.cmd(CmdCode::CreateQp, req)?;
            (resp.qpn, resp.qpn)
        };
        let header = pages[0];
        let sq_end = 1 + sq_pages as usize;
        let sq = self.wq(
            header,
            TX_OFFSET,
            &pages[1..sq_end],
            spec.max_send_wr,
            sq_stride,
        );
        let rq = spec.srq.is_none().then(|| {
            self.wq(
                header,
                RX_OFFSET,
                &pages[sq_end..],
                spec.max_recv_wr,
                rq_stride,
            )
        });
        Ok(SimQp {
            handle,
            qpn,
            writer: Self::writer(self.pds.get(&spec.pd).copied().unwrap_or(0)),
            page,
            header,
            sq,
            rq,
        })
    }

    pub fn create_srq(&mut self, pd: u32, max_wr: u32, max_sge: u32) -> Result<SimSrq, Failure> {
        let stride = rq_stride(max_sge).expect("stride");
        let data_pages = (u64::from(max_wr) * u64::from(stride)).div_ceil(PAGE_SIZE) as u32;
        let pages = self.alloc_pages(1 + data_pages);
        let pdir = self.make_pdir(&pages);
        let resp: CreateSrqResp = self.cmd(
            CmdCode::CreateSrq,
            CreateSrqReq {
                pdir_dma: pdir,
                pd_handle: pd,
                nchunks: 1 + data_pages,
                attrs: pvrdma_abi::verbs::SrqAttr {
                    max_wr,
                    max_sge,
                    srq_limit: 0,
                    reserved: 0,
                },
                ..Default::default()
            },
        )?;
        let page = self.page_of_pd(pd);
        Ok(SimSrq {
            handle: resp.srqn,
            page,
            wq: self.wq(pages[0], RX_OFFSET, &pages[1..], max_wr, stride),
        })
    }

    /// A user MR over fresh guest pages, registered at IOVA `start`.
    pub fn reg_user_mr(
        &mut self,
        pd: u32,
        start: u64,
        length: u64,
        access_flags: u32,
    ) -> Result<CreateMrResp, Failure> {
        self.reg_user_mr_pages(pd, start, length, access_flags)
            .map(|(resp, _)| resp)
    }

    /// [`Self::reg_user_mr`], also returning the pages behind the MR (no
    /// two of them contiguous).
    pub fn reg_user_mr_pages(
        &mut self,
        pd: u32,
        start: u64,
        length: u64,
        access_flags: u32,
    ) -> Result<(CreateMrResp, Vec<u64>), Failure> {
        self.reg_user_mr_laid_out(pd, (start, length), access_flags, PageLayout::Scattered)
    }

    /// [`Self::reg_user_mr_pages`] over pages laid out as `layout` says.
    pub fn reg_user_mr_laid_out(
        &mut self,
        pd: u32,
        (start, length): (u64, u64),
        access_flags: u32,
        layout: PageLayout,
    ) -> Result<(CreateMrResp, Vec<u64>), Failure> {
        let n = ((start & (PAGE_SIZE - 1)) + length).div_ceil(PAGE_SIZE) as u32;
        let pages = match layout {
            PageLayout::Scattered => self.alloc_pages(n),
            PageLayout::Contiguous => self.alloc_run(n),
        };
        let pdir = self.make_pdir(&pages);
        let resp = self.cmd(
            CmdCode::CreateMr,
            CreateMrReq {
                start,
                length,
                pdir_dma: pdir,
                pd_handle: pd,
                access_flags,
                nchunks: n,
                ..Default::default()
            },
        )?;
        Ok((resp, pages))
    }

    /// RESET -> INIT -> RTR -> RTS of an RC QP towards `peer_qpn` at
    /// `dgid`/`dmac` (our GID at index `sgid_index`), sending from PSN
    /// `sq_psn` and expecting `rq_psn`.
    pub fn connect_rc(
        &mut self,
        qp: u32,
        sgid_index: u8,
        peer: ([u8; 16], [u8; 6]),
        peer_qpn: u32,
        psns: (u32, u32),
    ) -> Result<(), Failure> {
        self.connect_rc_with(qp, sgid_index, peer, peer_qpn, psns, RcPath::default())
    }

    /// [`Self::connect_rc`] with the READ depth and path MTU of `path`.
    pub fn connect_rc_with(
        &mut self,
        qp: u32,
        sgid_index: u8,
        (dgid, dmac): ([u8; 16], [u8; 6]),
        peer_qpn: u32,
        (sq_psn, rq_psn): (u32, u32),
        RcPath {
            rd_atomic,
            path_mtu,
        }: RcPath,
    ) -> Result<(), Failure> {
        let init = QpAttr {
            qp_state: qp_state::INIT,
            port_num: 1,
            qp_access_flags: 0xf,
            ..QpAttr::default()
        };
        self.modify_qp(qp, RC_INIT_MASK, init)?;
        let mut ah = AhAttr {
            port_num: 1,
            ah_flags: AH_FLAG_GRH,
            dmac,
            ..AhAttr::default()
        };
        ah.grh.dgid = dgid;
        ah.grh.sgid_index = sgid_index;
        let rtr = QpAttr {
            qp_state: qp_state::RTR,
            path_mtu: path_mtu.into(),
            dest_qp_num: peer_qpn,
            rq_psn,
            max_dest_rd_atomic: rd_atomic,
            min_rnr_timer: 1,
            ah_attr: ah,
            ..QpAttr::default()
        };
        self.modify_qp(qp, RC_RTR_MASK, rtr)?;
        let rts = QpAttr {
            qp_state: qp_state::RTS,
            sq_psn,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: rd_atomic,
            ..QpAttr::default()
        };
        let rts_mask =
            m::STATE | m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::SQ_PSN | m::MAX_QP_RD_ATOMIC;
        self.modify_qp(qp, rts_mask, rts)
    }

    /// CREATE_BIND as `vmw_pvrdma` sends it (no VLAN: 0xFFF).
    pub fn bind_gid(&mut self, index: u32, gid: [u8; 16], gid_type: u8) -> Result<(), Failure> {
        self.bind_gid_vlan(index, gid, gid_type, 0xfff)
    }

    /// CREATE_BIND with VLAN `vlan` (which the upstream driver never gives).
    pub fn bind_gid_vlan(
        &mut self,
        index: u32,
        gid: [u8; 16],
        gid_type: u8,
        vlan: u32,
    ) -> Result<(), Failure> {
        self.post(
            CmdCode::CreateBind,
            CreateBindReq {
                mtu: 1024,
                vlan,
                index,
                new_gid: gid,
                gid_type,
                ..Default::default()
            },
        )
    }

    pub fn modify_qp(&mut self, qp: u32, mask: u32, attrs: QpAttr) -> Result<(), Failure> {
        let _: RespHdr = self.cmd(
            CmdCode::ModifyQp,
            ModifyQpReq {
                qp_handle: qp,
                attr_mask: mask,
                attrs,
                ..Default::default()
            },
        )?;
        Ok(())
    }

    pub fn query_qp(&mut self, qp: u32) -> Result<QpAttr, Failure> {
        let resp: QueryQpResp = self.cmd(
            CmdCode::QueryQp,
            QueryQpReq {
                qp_handle: qp,
                attr_mask: m::ALL,
                ..Default::default()
            },
        )?;
        Ok(resp.attrs)
    }

    /// RESET -> INIT -> RTR -> RTS with what rdma_cm / ib_mad send; RC QPs
    /// need GID 0 bound.
    pub fn to_rts(&mut self, qp: u32, t: u8) -> Result<(), Failure> {
        let rc = t == qp_type::RC;
        let init = QpAttr {
            qp_state: qp_state::INIT,
            port_num: 1,
            qkey: GSI_QKEY,
            qp_access_flags: 0x7,
            ..QpAttr::default()
        };
        let init_mask = if rc {
            RC_INIT_MASK
        } else {
            m::STATE | m::PKEY_INDEX | m::QKEY | if t == qp_type::UD { m::PORT } else { 0 }
        };
        self.modify_qp(qp, init_mask, init)?;
        let rtr = QpAttr {
            qp_state: qp_state::RTR,
            path_mtu: 3,
            dest_qp_num: 0x12_3456,
            rq_psn: 0x100,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            ah_attr: AhAttr {
                port_num: 1,
                ah_flags: AH_FLAG_GRH,
                dmac: [2, 0, 0, 0, 0, 9],
                ..AhAttr::default()
            },
            ..QpAttr::default()
        };
        let rtr_mask = if rc { RC_RTR_MASK } else { m::STATE };
        self.modify_qp(qp, rtr_mask, rtr)?;
        let rts = QpAttr {
            qp_state: qp_state::RTS,
            sq_psn: 0x200,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
            ..QpAttr::default()
        };
        let rts_mask = if rc {
            m::STATE | m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::SQ_PSN | m::MAX_QP_RD_ATOMIC
        } else {
            m::STATE | m::SQ_PSN
        };
        self.modify_qp(qp, rts_mask, rts)
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The simulated driver's data path: posting WQEs, ringing doorbells and
//! draining the rings the device fills, with the driver's own arithmetic.

use super::*;

/// A signaled UD SEND `wr_id` (verbs opcode) to QP `remote_qpn`, Q_Key
/// [`GSI_QKEY`], at `dgid` behind `dmac` with hop limit 64: `wr.ud` is
/// the QPN and Q_Key, then the `pvrdma_av` (as the device decodes it in
/// `datapath::wqe`).
pub fn ud_send(wr_id: u64, remote_qpn: u32, dgid: [u8; 16], dmac: [u8; 6]) -> SqWqeHdr {
    let mut av = [0u8; 40];
    av[8..24].copy_from_slice(&dgid);
    av[27] = 64;
    av[28..34].copy_from_slice(&dmac);
    let mut hdr = SqWqeHdr {
        wr_id,
        opcode: ib::wr::SEND,
        send_flags: pvrdma_abi::wqe::send_flags::SIGNALED,
        ..SqWqeHdr::default()
    };
    hdr.wr[0] = u64::from(remote_qpn) | u64::from(GSI_QKEY) << 32;
    for (w, chunk) in hdr.wr[1..].iter_mut().zip(av.chunks_exact(8)) {
        *w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
    }
    hdr
}

impl SimDriver {
    /// A 32-bit write to UAR page `page`, delivered as KVM would: to a
    /// matching ioeventfd, else as MMIO to the device.
    pub fn doorbell(&self, page: u32, offset: u64, value: u32) {
        let addr = self.bars[BAR_UAR] + u64::from(page) * PAGE_SIZE + offset;
        if !self.ioevents.signal(addr, value) {
            self.write32(addr, value);
        }
    }

    /// Writes a WQE at the producer index of `wq` and advances it.
    fn post_wqe<T: ByteValued>(&self, wq: &SimWq, wqe: T) {
        let prod: u32 = self.read(wq.indices);
        let offset = u64::from(wq.geometry.slot(prod)) * wq.stride;
        let page = wq.data[(offset / PAGE_SIZE) as usize];
        self.write(page + offset % PAGE_SIZE, wqe);
        self.write(wq.indices, wq.geometry.next(prod));
    }

    /// Writes a WQE header and its SGEs at the producer index of `wq`.
    fn post_wqe_sges<T: ByteValued>(&self, wq: &SimWq, hdr: T, sges: &[Sge]) {
        let prod: u32 = self.read(wq.indices);
        let offset = u64::from(wq.geometry.slot(prod)) * wq.stride;
        let at = wq.data[(offset / PAGE_SIZE) as usize] + offset % PAGE_SIZE;
        self.write(at, hdr);
        for (i, sge) in sges.iter().enumerate() {
            self.write(at + (size_of::<T>() + i * size_of::<Sge>()) as u64, *sge);
        }
        self.write(wq.indices, wq.geometry.next(prod));
    }

    /// Posts a whole send WR and rings: `hdr.opcode` is the verbs opcode
    /// ([`ib::wr`](super::ib::wr)), stored as the QP's writer stores it, and
    /// `hdr.num_sge` is set from `sges`.
    pub fn post_send_wqe(&self, qp: &SimQp, mut hdr: SqWqeHdr, sges: &[Sge]) {
        hdr.num_sge = sges.len() as u32;
        hdr.opcode = qp.writer.wqe_opcode(hdr.opcode);
        self.post_wqe_sges(&qp.sq, hdr, sges);
        self.doorbell(qp.page, uar::QP_OFFSET, qp.handle | uar::QP_SEND);
    }

    /// Posts a receive WQE with `sges` and rings.
    pub fn post_recv_sges(&self, qp: &SimQp, wr_id: u64, sges: &[Sge]) {
        let rq = qp.rq.as_ref().expect("QP has a receive queue");
        let hdr = RqWqeHdr {
            wr_id,
            num_sge: sges.len() as u32,
            total_len: 0,
        };
        self.post_wqe_sges(rq, hdr, sges);
        self.doorbell(qp.page, uar::QP_OFFSET, qp.handle | uar::QP_RECV);
    }

    /// Posts a receive WQE with `sges` to an SRQ and rings.
    pub fn post_srq_recv_sges(&self, srq: &SimSrq, wr_id: u64, sges: &[Sge]) {
        let hdr = RqWqeHdr {
            wr_id,
            num_sge: sges.len() as u32,
            total_len: 0,
        };
        self.post_wqe_sges(&srq.wq, hdr, sges);
        self.doorbell(srq.page, uar::SRQ_OFFSET, srq.handle | uar::SRQ_RECV);
    }

    /// Writes `data` at IOVA offset `off` of a buffer made of `pages`.
    pub fn write_buf(&self, pages: &[u64], off: u64, data: &[u8]) {
        for (i, b) in data.iter().enumerate() {
            let o = off + i as u64;
            self.write(pages[(o / PAGE_SIZE) as usize] + o % PAGE_SIZE, *b);
        }
    }

    /// Reads `len` bytes at offset `off` of a buffer made of `pages`.
    pub fn read_buf(&self, pages: &[u64], off: u64, len: usize) -> Vec<u8> {
        (0..len as u64)
            .map(|i| {
                let o = off + i;
                self.read::<u8>(pages[(o / PAGE_SIZE) as usize] + o % PAGE_SIZE)
            })
            .collect()
    }

    /// `pvrdma_post_send` of one WR with verbs opcode `opcode`
    /// ([`ib::wr`](super::ib::wr)), and its doorbell.
    pub fn post_send(&self, qp: &SimQp, wr_id: u64, opcode: u32) {
        let wqe = SqWqeHdr {
            wr_id,
            num_sge: 0,
            opcode: qp.writer.wqe_opcode(opcode),
            send_flags: pvrdma_abi::wqe::send_flags::SIGNALED,
            ..SqWqeHdr::default()
        };
        self.post_wqe(&qp.sq, wqe);
        self.doorbell(qp.page, uar::QP_OFFSET, qp.handle | uar::QP_SEND);
    }

    /// `pvrdma_post_recv` of one WR, and its doorbell.
    pub fn post_recv(&self, qp: &SimQp, wr_id: u64) {
        let rq = qp.rq.as_ref().expect("QP has a receive queue");
        self.post_wqe(
            rq,
            RqWqeHdr {
                wr_id,
                num_sge: 0,
                total_len: 0,
            },
        );
        self.doorbell(qp.page, uar::QP_OFFSET, qp.handle | uar::QP_RECV);
    }

    /// Posts a receive to an SRQ and rings its doorbell.
    pub fn post_srq_recv(&self, srq: &SimSrq, wr_id: u64) {
        self.post_wqe(
            &srq.wq,
            RqWqeHdr {
                wr_id,
                num_sge: 0,
                total_len: 0,
            },
        );
        self.doorbell(srq.page, uar::SRQ_OFFSET, srq.handle | uar::SRQ_RECV);
    }

    /// `pvrdma_req_notify_cq`.
    pub fn arm_cq(&self, cq: &SimCq, solicited: bool) {
        let flag = if solicited {
            uar::CQ_ARM_SOL
        } else {
            uar::CQ_ARM
        };
        self.doorbell(cq.page, uar::CQ_OFFSET, cq.handle | flag);
    }

    /// Drains a device ring with the driver's arithmetic.
    pub fn consume<T: ByteValued>(&self, ring: &DeviceRing) -> Vec<T> {
        let mut out = Vec::new();
        loop {
            let prod: u32 = self.read(ring.indices);
            let cons: u32 = self.read(ring.indices + 4);
            let indices = pvrdma_abi::ring::RingIndices {
                prod_tail: prod,
                cons_head: cons,
            };
            if ring.geometry.has_data(indices) != Some(true) {
                return out;
            }
            let offset = u64::from(ring.geometry.slot(cons)) * ring.elem;
            let page = ring.data[(offset / PAGE_SIZE) as usize];
            out.push(self.read(page + offset % PAGE_SIZE));
            self.write(ring.indices + 4, ring.geometry.next(cons));
        }
    }

    pub fn async_events(&self) -> Vec<Eqe> {
        let ring = self.async_ring.clone().expect("probed");
        self.consume(&ring)
    }

    pub fn cq_notifications(&self) -> Vec<u32> {
        let ring = self.cq_notify_ring.clone().expect("probed");
        self.consume::<Cqne>(&ring)
            .into_iter()
            .map(|n| n.info)
            .collect()
    }

    /// The CQEs the device wrote, their `opcode` read as the CQ's reader
    /// reads it (a verbs opcode, [`ib::wc`](super::ib::wc)).
    pub fn poll_cq(&self, cq: &SimCq) -> Vec<Cqe> {
        let mut cqes: Vec<Cqe> = self.consume(&cq.ring);
        for cqe in &mut cqes {
            cqe.opcode = cq.writer.wc_opcode(cqe.opcode);
        }
        cqes
    }
}

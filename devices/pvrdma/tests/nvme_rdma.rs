// SPDX-License-Identifier: Apache-2.0
//! The memory-registration cycle of Linux's NVMe over Fabrics initiator (nvme-rdma) against a
//! target (nvmet-rdma), in process: what the e2e suite `nvmeof` runs thousands of times through
//! the real drivers, here per step with its data and CQEs checked, so that a change to the data
//! path that breaks it fails without a test host.
//!
//! Per I/O the initiator (B, kernel QP) fast-registers its buffer pages under the MR's next key
//! (ib_update_fast_reg_key: same MR, key byte + 1), the target (A) RDMA READs them (a write to
//! the namespace) or RDMA WRITEs them (a read), then answers with SEND_WITH_INV of that key; the
//! initiator sees the remote invalidation and the key in its receive CQE (so it posts no
//! LOCAL_INV) and registers the same MR again for the next I/O.

use pvrdma::sim_driver::endpoint::rc_pair;
use pvrdma::sim_driver::ib::{wc, wr};
use pvrdma_abi::wqe::{wc_flags, wc_status};

/// Where B maps its fast-registered buffer (nvme-rdma uses the pages' own addresses; any IOVA
/// works).
const IOVA: u64 = 0x5_0000;
/// Two pages, so that every transfer crosses a page boundary of the MR's page list.
const LEN: u32 = 8192;

#[test]
fn one_mr_cycles_through_new_keys_with_remote_invalidation() {
    let (mut a, mut b) = rc_pair();
    let (key, pages, list) = b.alloc_frmr(4);
    for round in 1..=6u32 {
        let k = (key & !0xff) | round;
        let id = u64::from(round) * 10;
        b.reg_mr(id, k, IOVA, (list, 2), LEN);
        let reg = b.cqes(1);
        assert_eq!(
            (reg[0].wr_id, reg[0].opcode, reg[0].status),
            (id, wc::REG_MR, wc_status::SUCCESS),
            "round {round}: REG_MR"
        );
        let data: Vec<u8> = (0..LEN)
            .map(|i| (i.wrapping_mul(7) + round) as u8)
            .collect();
        if round % 2 == 1 {
            // A write to the namespace: the target reads the initiator's buffer.
            b.sim.write_buf(&pages, 0, &data);
            a.send(id + 1, wr::RDMA_READ, &[a.sge(0, LEN)], (IOVA, k), 0);
            assert_eq!(
                a.cqes(1)[0].status,
                wc_status::SUCCESS,
                "round {round}: READ"
            );
            assert_eq!(a.read(0, LEN as usize), data, "round {round}: READ data");
        } else {
            // A read from the namespace: the target writes into the initiator's buffer.
            a.write(0, &data);
            a.send(id + 1, wr::RDMA_WRITE, &[a.sge(0, LEN)], (IOVA, k), 0);
            assert_eq!(
                a.cqes(1)[0].status,
                wc_status::SUCCESS,
                "round {round}: WRITE"
            );
            assert_eq!(
                b.sim.read_buf(&pages, 0, LEN as usize),
                data,
                "round {round}: WRITE data"
            );
        }
        // The response capsule, sent with invalidation of the key.
        b.sim.post_recv_sges(&b.qp, id + 2, &[b.sge(0, 64)]);
        a.send(id + 3, wr::SEND_WITH_INV, &[a.sge(0, 16)], (0, 0), k);
        let got = b.cqes(1);
        assert_eq!(
            (got[0].wr_id, got[0].opcode, got[0].status, got[0].byte_len),
            (id + 2, wc::RECV, wc_status::SUCCESS, 16),
            "round {round}: the response's receive"
        );
        assert_ne!(
            got[0].wc_flags & wc_flags::WITH_INVALIDATE,
            0,
            "round {round}: remote invalidation reported"
        );
        assert_eq!(got[0].imm_data, k, "round {round}: the invalidated key");
        assert_eq!(
            a.cqes(1)[0].status,
            wc_status::SUCCESS,
            "round {round}: SEND_WITH_INV"
        );
    }
    // The last key was invalidated with its response: the target can no longer reach the buffer.
    let last = (key & !0xff) | 6;
    a.send(99, wr::RDMA_WRITE, &[a.sge(0, 8)], (IOVA, last), 0);
    // 10: IB_WC_REM_ACCESS_ERR.
    assert_eq!(a.cqes(1)[0].status, 10, "an invalidated key is refused");
    let _ = (&mut a.pd, &mut b.pd);
}

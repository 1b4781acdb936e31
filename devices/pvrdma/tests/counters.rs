// SPDX-License-Identifier: Apache-2.0
//! The counters handle the VMM serves as `vm.counters`: device counters
//! and each connected QP's transport counters, read while the device is
//! busy (its bus mutex held elsewhere).

use std::sync::atomic::Ordering;

use pvrdma::sim_driver::endpoint::rc_pair;
use pvrdma::sim_driver::ib::wr;
use pvrdma_abi::wqe::wc_status;

#[test]
fn counters_show_traffic_and_retransmissions_per_qp() {
    let (a, b) = rc_pair();
    let counters = a.sim.device().counters();
    a.sim.wire.drop_one_in.store(4, Ordering::Relaxed);
    let data = vec![0x5a; 40_000];
    a.write(0, &data);
    b.sim.post_recv_sges(&b.qp, 1, &[b.sge(0, 40_000)]);
    a.send(1, wr::SEND, &[a.sge(0, 40_000)], (0, 0), 0);
    assert_eq!(b.cqes(1)[0].status, wc_status::SUCCESS);
    assert_eq!(a.cqes(1)[0].status, wc_status::SUCCESS);

    // The device's own mutex (what vCPU exits take) is not needed.
    let _device = a.sim.device();
    let values = counters.values();
    let value = |name: &str| {
        values
            .iter()
            .find(|(n, _)| *n == name)
            .map_or_else(|| panic!("no counter {name}"), |(_, v)| *v)
    };
    assert!(value("roce_tx") >= 40, "{values:?}");
    assert!(value("roce_rx") >= 1, "the ACKs: {values:?}");
    assert_eq!(value("roce_local_tx"), 0, "no same-host channel here");

    let qps = counters.queue_pairs().unwrap_or_default();
    let qp = qps
        .iter()
        .find(|q| q.qpn == a.qp.qpn)
        .unwrap_or_else(|| panic!("QP {:#x} missing from {qps:?}", a.qp.qpn));
    assert!(!qp.error);
    let retries = qp
        .values
        .iter()
        .find(|(n, _)| *n == "completer_retry")
        .map(|(_, v)| *v);
    assert!(retries > Some(0), "lost frames were resent: {qp:?}");

    // The handle outlives the device without keeping it: the counters stay, the QPs go.
    drop(_device);
    drop(a);
    assert_eq!(counters.values(), values);
    assert_eq!(counters.queue_pairs(), Some(Vec::new()));
}

// SPDX-License-Identifier: Apache-2.0
/*
 * pvrdma-verbs-check: the PVRDMA control path through libibverbs, as an unmodified application
 * sees it (issue 4). Built into the guest image by recipes/userspace.sh against Debian's
 * libibverbs-dev, dynamically linked to the image's libibverbs.so.1 (which loads libvmw_pvrdma).
 *
 * Usage: pvrdma-verbs-check DEVICE IPV4
 *   Opens DEVICE (e.g. vmw_pvrdma0), queries device, port and GID table, finds the RoCE v2 GID
 *   of IPV4 (::ffff:a.b.c.d), then creates a PD, a completion channel and a CQ armed for
 *   notification, an MR, an SRQ (modified and queried), an RC QP on the SRQ, an RC QP with its
 *   own receive queue and a UD QP; takes both RC QPs through INIT, RTR and RTS connected to each
 *   other through that GID (loopback), the UD QP through INIT, RTR and RTS with a Q_Key, queries
 *   each, takes one RC QP to ERR, RESET and INIT again, then destroys everything in reverse order.
 *   No work request is posted: the data path is not part of this check.
 *
 * Output: one line per step, "VERBS-STEP <name> ok [details]"; on the first failure
 * "VERBS-FAIL <name>: <reason>" and exit status 1; "VERBS-CHECK-OK steps=N" and 0 at the end.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEP_TAG "VERBS-STEP"
#define FAIL_TAG "VERBS-FAIL"
#include "check.h"

#define PORT 1
#define CQE 64
#define MR_LEN (64 * 1024)
#define SRQ_WR 32
#define SRQ_LIMIT 8
#define QP_WR 16
#define QKEY 0x11111111u
#define MAX_GIDS 256


static const char *qp_state_name(enum ibv_qp_state s)
{
	switch (s) {
	case IBV_QPS_RESET: return "RESET";
	case IBV_QPS_INIT: return "INIT";
	case IBV_QPS_RTR: return "RTR";
	case IBV_QPS_RTS: return "RTS";
	case IBV_QPS_SQD: return "SQD";
	case IBV_QPS_SQE: return "SQE";
	case IBV_QPS_ERR: return "ERR";
	default: return "UNKNOWN";
	}
}

static void gid_str(const union ibv_gid *gid, char *buf, size_t len)
{
	if (!inet_ntop(AF_INET6, gid->raw, buf, len))
		snprintf(buf, len, "?");
}

static struct ibv_qp *create_qp(const char *step, struct ibv_pd *pd, struct ibv_cq *cq,
				struct ibv_srq *srq, enum ibv_qp_type type)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = cq,
		.recv_cq = cq,
		.srq = srq,
		.cap = {
			.max_send_wr = QP_WR,
			.max_recv_wr = srq ? 0 : QP_WR,
			.max_send_sge = 1,
			.max_recv_sge = srq ? 0 : 1,
		},
		.qp_type = type,
	};
	struct ibv_qp *qp = check_ptr(step, ibv_create_qp(pd, &attr));

	ok(step, "qpn=%u max_send_wr=%u max_recv_wr=%u", qp->qp_num, attr.cap.max_send_wr,
	   attr.cap.max_recv_wr);
	return qp;
}

static void to_init(const char *step, struct ibv_qp *qp)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = PORT,
	};
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;

	if (qp->qp_type == IBV_QPT_UD) {
		attr.qkey = QKEY;
		mask |= IBV_QP_QKEY;
	} else {
		attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				       IBV_ACCESS_REMOTE_READ;
		mask |= IBV_QP_ACCESS_FLAGS;
	}
	check_rc(step, ibv_modify_qp(qp, &attr, mask));
	ok(step, "qpn=%u", qp->qp_num);
}

static void to_rtr(const char *step, struct ibv_qp *qp, uint32_t dest_qpn, const union ibv_gid *dgid,
		   int sgid_index)
{
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_RTR };
	int mask = IBV_QP_STATE;

	if (qp->qp_type == IBV_QPT_RC) {
		attr.path_mtu = IBV_MTU_1024;
		attr.dest_qp_num = dest_qpn;
		attr.rq_psn = 0x123;
		attr.max_dest_rd_atomic = 1;
		attr.min_rnr_timer = 12;
		attr.ah_attr.is_global = 1;
		attr.ah_attr.grh.dgid = *dgid;
		attr.ah_attr.grh.sgid_index = sgid_index;
		attr.ah_attr.grh.hop_limit = 1;
		attr.ah_attr.port_num = PORT;
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	}
	check_rc(step, ibv_modify_qp(qp, &attr, mask));
	ok(step, "qpn=%u dest_qpn=%u", qp->qp_num, qp->qp_type == IBV_QPT_RC ? dest_qpn : 0);
}

static void to_rts(const char *step, struct ibv_qp *qp)
{
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_RTS, .sq_psn = 0x123 };
	int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;

	if (qp->qp_type == IBV_QPT_RC) {
		attr.timeout = 14;
		attr.retry_cnt = 7;
		attr.rnr_retry = 7;
		attr.max_rd_atomic = 1;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	}
	check_rc(step, ibv_modify_qp(qp, &attr, mask));
	ok(step, "qpn=%u", qp->qp_num);
}

static void set_state(const char *step, struct ibv_qp *qp, enum ibv_qp_state state)
{
	struct ibv_qp_attr attr = { .qp_state = state };

	check_rc(step, ibv_modify_qp(qp, &attr, IBV_QP_STATE));
	ok(step, "qpn=%u state=%s", qp->qp_num, qp_state_name(state));
}

/* Queries qp and checks what the device reports against what was set. */
static void query_qp(const char *step, struct ibv_qp *qp, enum ibv_qp_state want, uint32_t dest_qpn)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	int mask = IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_CAP;

	memset(&attr, 0, sizeof(attr));
	memset(&init, 0, sizeof(init));
	if (qp->qp_type == IBV_QPT_RC && want != IBV_QPS_INIT)
		mask |= IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_SQ_PSN |
			IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
	if (qp->qp_type == IBV_QPT_UD)
		mask |= IBV_QP_QKEY | IBV_QP_SQ_PSN;
	check_rc(step, ibv_query_qp(qp, &attr, mask, &init));
	if (attr.qp_state != want)
		fail(step, "qpn=%u state %s, expected %s", qp->qp_num, qp_state_name(attr.qp_state),
		     qp_state_name(want));
	if (qp->qp_type == IBV_QPT_RC && want == IBV_QPS_RTS) {
		if (attr.dest_qp_num != dest_qpn)
			fail(step, "qpn=%u dest_qp_num %u, expected %u", qp->qp_num, attr.dest_qp_num,
			     dest_qpn);
		if (attr.path_mtu != IBV_MTU_1024)
			fail(step, "qpn=%u path_mtu %d, expected %d", qp->qp_num, attr.path_mtu,
			     IBV_MTU_1024);
		if (attr.sq_psn != 0x123 || attr.rq_psn != 0x123)
			fail(step, "qpn=%u sq_psn %#x rq_psn %#x, expected 0x123", qp->qp_num,
			     attr.sq_psn, attr.rq_psn);
	}
	if (qp->qp_type == IBV_QPT_UD && want == IBV_QPS_RTS && attr.qkey != QKEY)
		fail(step, "qpn=%u qkey %#x, expected %#x", qp->qp_num, attr.qkey, QKEY);
	ok(step, "qpn=%u state=%s dest_qpn=%u path_mtu=%d qkey=%#x port=%u", qp->qp_num,
	   qp_state_name(attr.qp_state), attr.dest_qp_num, attr.path_mtu, attr.qkey, attr.port_num);
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_device_attr dev;
	struct ibv_port_attr port;
	struct ibv_gid_entry gids[MAX_GIDS];
	union ibv_gid want_gid;
	struct in_addr v4;
	ssize_t ngids;
	int i, n, gid_index = -1;
	char buf[INET6_ADDRSTRLEN];

	if (argc != 3 || inet_pton(AF_INET, argv[2], &v4) != 1) {
		fprintf(stderr, "usage: %s DEVICE IPV4\n", argv[0]);
		return 2;
	}
	memset(&want_gid, 0, sizeof(want_gid));
	want_gid.raw[10] = 0xff;
	want_gid.raw[11] = 0xff;
	memcpy(&want_gid.raw[12], &v4, 4);

	list = check_ptr("get_device_list", ibv_get_device_list(&n));
	for (i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			ctx = check_ptr("open_device", ibv_open_device(list[i]));
	if (!ctx)
		fail("open_device", "no device %s among %d", argv[1], n);
	ibv_free_device_list(list);
	ok("open_device", "%s", argv[1]);

	check_rc("query_device", ibv_query_device(ctx, &dev));
	if (!dev.max_qp || !dev.max_cq || !dev.max_mr || !dev.max_pd || !dev.max_srq || !dev.max_qp_wr ||
	    !dev.max_cqe || !dev.max_sge)
		fail("query_device", "a zero limit: max_qp=%d max_cq=%d max_mr=%d max_pd=%d max_srq=%d",
		     dev.max_qp, dev.max_cq, dev.max_mr, dev.max_pd, dev.max_srq);
	ok("query_device", "vendor_id=%#x vendor_part_id=%u max_qp=%d max_cq=%d max_mr=%d max_pd=%d max_srq=%d",
	   dev.vendor_id, dev.vendor_part_id, dev.max_qp, dev.max_cq, dev.max_mr, dev.max_pd,
	   dev.max_srq);

	check_rc("query_port", ibv_query_port(ctx, PORT, &port));
	if (port.state != IBV_PORT_ACTIVE || port.link_layer != IBV_LINK_LAYER_ETHERNET)
		fail("query_port", "state %d link_layer %d, expected ACTIVE on Ethernet", port.state,
		     port.link_layer);
	ok("query_port", "state=ACTIVE link_layer=Ethernet gid_tbl_len=%d active_mtu=%d",
	   port.gid_tbl_len, port.active_mtu);

	ngids = ibv_query_gid_table(ctx, gids, MAX_GIDS, 0);
	if (ngids < 0)
		fail("query_gid_table", "%s", strerror((int)-ngids));
	for (i = 0; i < ngids; i++) {
		gid_str(&gids[i].gid, buf, sizeof(buf));
		printf("VERBS-GID index=%u type=%s gid=%s\n", gids[i].gid_index,
		       gids[i].gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCEv2" :
		       gids[i].gid_type == IBV_GID_TYPE_ROCE_V1 ? "RoCEv1" : "IB",
		       buf);
		if (gids[i].port_num == PORT && gids[i].gid_type == IBV_GID_TYPE_ROCE_V2 &&
		    !memcmp(gids[i].gid.raw, want_gid.raw, sizeof(want_gid.raw)))
			gid_index = (int)gids[i].gid_index;
	}
	gid_str(&want_gid, buf, sizeof(buf));
	if (gid_index < 0)
		fail("query_gid_table", "no RoCE v2 GID %s among %zd entries", buf, ngids);
	{
		union ibv_gid g;

		check_rc("query_gid", ibv_query_gid(ctx, PORT, gid_index, &g));
		if (memcmp(g.raw, want_gid.raw, sizeof(g.raw)))
			fail("query_gid", "index %d changed under us", gid_index);
	}
	ok("query_gid_table", "entries=%zd ipv4_gid=%s index=%d", ngids, buf, gid_index);

	struct ibv_pd *pd = check_ptr("alloc_pd", ibv_alloc_pd(ctx));
	ok("alloc_pd", NULL);

	struct ibv_comp_channel *ch = check_ptr("create_comp_channel", ibv_create_comp_channel(ctx));
	ok("create_comp_channel", "fd=%d", ch->fd);

	struct ibv_cq *cq = check_ptr("create_cq", ibv_create_cq(ctx, CQE, NULL, ch, 0));
	ok("create_cq", "cqe=%d", cq->cqe);
	check_rc("req_notify_cq", ibv_req_notify_cq(cq, 0));
	ok("req_notify_cq", NULL);
	{
		struct ibv_wc wc;
		int polled = ibv_poll_cq(cq, 1, &wc);

		if (polled != 0)
			fail("poll_cq_empty", "returned %d on a CQ nothing was posted to", polled);
		ok("poll_cq_empty", NULL);
	}

	void *mem = check_ptr("reg_mr", aligned_alloc(4096, MR_LEN));
	memset(mem, 0x5a, MR_LEN);
	struct ibv_mr *mr = check_ptr("reg_mr", ibv_reg_mr(pd, mem, MR_LEN,
						      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						      IBV_ACCESS_REMOTE_READ));
	ok("reg_mr", "len=%d lkey=%#x rkey=%#x", MR_LEN, mr->lkey, mr->rkey);

	struct ibv_srq_init_attr srq_init = { .attr = { .max_wr = SRQ_WR, .max_sge = 1 } };
	struct ibv_srq *srq = check_ptr("create_srq", ibv_create_srq(pd, &srq_init));
	ok("create_srq", "max_wr=%u max_sge=%u", srq_init.attr.max_wr, srq_init.attr.max_sge);
	{
		struct ibv_srq_attr sa = { .srq_limit = SRQ_LIMIT };

		check_rc("modify_srq", ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT));
		ok("modify_srq", "srq_limit=%d", SRQ_LIMIT);
		memset(&sa, 0, sizeof(sa));
		check_rc("query_srq", ibv_query_srq(srq, &sa));
		if (sa.max_wr < SRQ_WR || sa.srq_limit != SRQ_LIMIT)
			fail("query_srq", "max_wr=%u srq_limit=%u, expected >=%d and %d", sa.max_wr,
			     sa.srq_limit, SRQ_WR, SRQ_LIMIT);
		ok("query_srq", "max_wr=%u srq_limit=%u", sa.max_wr, sa.srq_limit);
	}

	struct ibv_qp *rc_srq = create_qp("create_qp_rc_srq", pd, cq, srq, IBV_QPT_RC);
	struct ibv_qp *rc = create_qp("create_qp_rc", pd, cq, NULL, IBV_QPT_RC);
	struct ibv_qp *ud = create_qp("create_qp_ud", pd, cq, NULL, IBV_QPT_UD);

	/* The two RC QPs form a loopback connection through the IPv4 GID. */
	to_init("modify_qp_rc_srq_init", rc_srq);
	to_init("modify_qp_rc_init", rc);
	to_init("modify_qp_ud_init", ud);
	query_qp("query_qp_rc_init", rc, IBV_QPS_INIT, 0);
	to_rtr("modify_qp_rc_srq_rtr", rc_srq, rc->qp_num, &want_gid, gid_index);
	to_rtr("modify_qp_rc_rtr", rc, rc_srq->qp_num, &want_gid, gid_index);
	to_rtr("modify_qp_ud_rtr", ud, 0, NULL, 0);
	to_rts("modify_qp_rc_srq_rts", rc_srq);
	to_rts("modify_qp_rc_rts", rc);
	to_rts("modify_qp_ud_rts", ud);
	query_qp("query_qp_rc_srq", rc_srq, IBV_QPS_RTS, rc->qp_num);
	query_qp("query_qp_rc", rc, IBV_QPS_RTS, rc_srq->qp_num);
	query_qp("query_qp_ud", ud, IBV_QPS_RTS, 0);

	/* Back through the error and reset states: a QP can be reused after RESET. */
	set_state("modify_qp_rc_err", rc, IBV_QPS_ERR);
	query_qp("query_qp_rc_err", rc, IBV_QPS_ERR, 0);
	set_state("modify_qp_rc_reset", rc, IBV_QPS_RESET);
	query_qp("query_qp_rc_reset", rc, IBV_QPS_RESET, 0);
	to_init("modify_qp_rc_reinit", rc);

	check_rc("destroy_qp_ud", ibv_destroy_qp(ud));
	ok("destroy_qp_ud", NULL);
	check_rc("destroy_qp_rc", ibv_destroy_qp(rc));
	ok("destroy_qp_rc", NULL);
	check_rc("destroy_qp_rc_srq", ibv_destroy_qp(rc_srq));
	ok("destroy_qp_rc_srq", NULL);
	check_rc("destroy_srq", ibv_destroy_srq(srq));
	ok("destroy_srq", NULL);
	check_rc("dereg_mr", ibv_dereg_mr(mr));
	free(mem);
	ok("dereg_mr", NULL);
	check_rc("destroy_cq", ibv_destroy_cq(cq));
	ok("destroy_cq", NULL);
	check_rc("destroy_comp_channel", ibv_destroy_comp_channel(ch));
	ok("destroy_comp_channel", NULL);
	check_rc("dealloc_pd", ibv_dealloc_pd(pd));
	ok("dealloc_pd", NULL);
	check_rc("close_device", ibv_close_device(ctx));
	ok("close_device", NULL);
	printf("VERBS-CHECK-OK steps=%d\n", steps);
	return 0;
}

// SPDX-License-Identifier: Apache-2.0
/*
 * pvrdma-access-check: a responder QP's own remote access rights (qp_access_flags) are enforced
 * by the device, beside the memory region's (issue 17). Built into the guest image by
 * recipes/userspace.sh against Debian's libibverbs-dev, dynamically linked to the image's
 * libibverbs.so.1 (which loads libvmw_pvrdma).
 *
 * Usage: pvrdma-access-check DEVICE IPV4
 *   Opens DEVICE, finds the RoCE v2 GID of IPV4, and registers a 4 KiB `target` MR that allows
 *   every remote operation. Each case connects a fresh pair of RC QPs to each other through that
 *   GID (loopback through the device): a requester and a responder whose MR is `target`. For each
 *   of RDMA WRITE, RDMA READ, FETCH_AND_ADD and CMP_AND_SWP:
 *     deny_<op>   the responder QP allows every remote operation but this one: the requester's
 *                 completion must be REM_ACCESS_ERR, and neither `target` nor the requester's
 *                 buffer may change;
 *     grant_<op>  the responder QP starts without the right and gets it by modify_qp RTS -> RTS
 *                 (IBV_QP_ACCESS_FLAGS): the same request must succeed, its effect checked (the
 *                 written bytes, the read bytes, the returned and the stored atomic values).
 *   Last, revoke_write: a WRITE succeeds, modify_qp RTS -> RTS takes REMOTE_WRITE away, and the
 *   next WRITE must fail with REM_ACCESS_ERR and leave `target` as the first WRITE left it.
 *   Every completion is awaited for at most 30 s (polling).
 *
 * Output: one line per case, "ACCESS-STEP <case> ok [details]"; on the first failure
 * "ACCESS-FAIL <case>: <reason>" and exit status 1; "ACCESS-CHECK-OK steps=N" and 0 at the end.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STEP_TAG "ACCESS-STEP"
#define FAIL_TAG "ACCESS-FAIL"
#include "check.h"

#define PORT 1
#define BUF 4096
#define LEN 64			/* bytes of a WRITE or READ */
#define WORD_OFF 512		/* the atomics' 8-byte word in `target` */
#define MAX_GIDS 256
#define WAIT_S 30
#define REMOTE_ALL (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

enum op { OP_WRITE, OP_READ, OP_FETCH_ADD, OP_CMP_SWAP };

static const struct {
	const char *name;
	enum ibv_wr_opcode opcode;
	enum ibv_wc_opcode wc;
	int right;
} ops[] = {
	[OP_WRITE] = { "write", IBV_WR_RDMA_WRITE, IBV_WC_RDMA_WRITE, IBV_ACCESS_REMOTE_WRITE },
	[OP_READ] = { "read", IBV_WR_RDMA_READ, IBV_WC_RDMA_READ, IBV_ACCESS_REMOTE_READ },
	[OP_FETCH_ADD] = { "fetch_add", IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WC_FETCH_ADD,
			   IBV_ACCESS_REMOTE_ATOMIC },
	[OP_CMP_SWAP] = { "cmp_swap", IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WC_COMP_SWAP,
			  IBV_ACCESS_REMOTE_ATOMIC },
};

struct env {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	union ibv_gid gid;
	int gid_index;
	uint8_t *target, *local;
	struct ibv_mr *target_mr, *local_mr;
};

/* A requester and a responder RC QP connected to each other, each with its own CQ. */
struct pair {
	struct ibv_cq *req_cq, *resp_cq;
	struct ibv_qp *req, *resp;
};


static void modify(const char *step, struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	check_rc(step, ibv_modify_qp(qp, attr, mask));
}

/* RESET -> INIT (with `access`) -> RTR -> RTS towards dest_qpn through our own GID. */
static void connect_qp(const char *step, const struct env *e, struct ibv_qp *qp, uint32_t dest_qpn,
		       int access)
{
	struct ibv_qp_attr init = {
		.qp_state = IBV_QPS_INIT,
		.port_num = PORT,
		.qp_access_flags = access,
	};
	struct ibv_qp_attr rtr = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = dest_qpn,
		.rq_psn = 0x100,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = {
			.is_global = 1,
			.grh = { .dgid = e->gid, .sgid_index = e->gid_index, .hop_limit = 1 },
			.port_num = PORT,
		},
	};
	struct ibv_qp_attr rts = {
		.qp_state = IBV_QPS_RTS,
		.sq_psn = 0x100,
		.timeout = 14,
		.retry_cnt = 7,
		.rnr_retry = 7,
		.max_rd_atomic = 1,
	};

	modify(step, qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	modify(step, qp, &rtr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	modify(step, qp, &rts, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

static struct ibv_qp *create_rc(const char *step, const struct env *e, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};

	return check_ptr(step, ibv_create_qp(e->pd, &attr));
}

static struct pair open_pair(const char *step, const struct env *e, int resp_access)
{
	struct pair p;

	p.req_cq = check_ptr(step, ibv_create_cq(e->ctx, 8, NULL, NULL, 0));
	p.resp_cq = check_ptr(step, ibv_create_cq(e->ctx, 8, NULL, NULL, 0));
	p.req = create_rc(step, e, p.req_cq);
	p.resp = create_rc(step, e, p.resp_cq);
	connect_qp(step, e, p.req, p.resp->qp_num, IBV_ACCESS_LOCAL_WRITE);
	connect_qp(step, e, p.resp, p.req->qp_num, IBV_ACCESS_LOCAL_WRITE | resp_access);
	return p;
}

static void close_pair(const char *step, struct pair *p)
{
	check_rc(step, ibv_destroy_qp(p->req));
	check_rc(step, ibv_destroy_qp(p->resp));
	check_rc(step, ibv_destroy_cq(p->req_cq));
	check_rc(step, ibv_destroy_cq(p->resp_cq));
}

/* modify_qp RTS -> RTS of the responder with new access flags. */
static void set_access(const char *step, struct pair *p, int resp_access)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_RTS,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | resp_access,
	};

	modify(step, p->resp, &attr, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS);
}

/* Posts `op` from the requester (compare/add and swap as given) and returns its completion. */
static struct ibv_wc run(const char *step, const struct env *e, struct pair *p, enum op op,
			 uint64_t compare_add, uint64_t swap)
{
	int atomic = op == OP_FETCH_ADD || op == OP_CMP_SWAP;
	struct ibv_sge sge = {
		.addr = (uintptr_t)e->local,
		.length = atomic ? 8 : LEN,
		.lkey = e->local_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = 0xacce55,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = ops[op].opcode,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	struct ibv_wc wc;
	struct timespec start, now;
	int n;

	if (atomic) {
		wr.wr.atomic.remote_addr = (uintptr_t)(e->target + WORD_OFF);
		wr.wr.atomic.rkey = e->target_mr->rkey;
		wr.wr.atomic.compare_add = compare_add;
		wr.wr.atomic.swap = swap;
	} else {
		wr.wr.rdma.remote_addr = (uintptr_t)e->target;
		wr.wr.rdma.rkey = e->target_mr->rkey;
	}
	check_rc(step, ibv_post_send(p->req, &wr, &bad));
	clock_gettime(CLOCK_MONOTONIC, &start);
	while ((n = ibv_poll_cq(p->req_cq, 1, &wc)) == 0) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - start.tv_sec > WAIT_S)
			fail(step, "no completion within %d s", WAIT_S);
	}
	if (n < 0)
		fail(step, "ibv_poll_cq returned %d", n);
	if (wc.wr_id != wr.wr_id)
		fail(step, "completion of wr_id %#" PRIx64 ", expected %#" PRIx64, wc.wr_id, wr.wr_id);
	if (wc.status == IBV_WC_SUCCESS && wc.opcode != ops[op].wc)
		fail(step, "completion opcode %d, expected %d", wc.opcode, ops[op].wc);
	return wc;
}

/* Fills both buffers with known bytes: `target` with 0xA0 + i, the requester's with 0x50 + i. */
static void fill(const struct env *e)
{
	for (int i = 0; i < BUF; i++) {
		e->target[i] = (uint8_t)(0xa0 + i);
		e->local[i] = (uint8_t)(0x50 + i);
	}
}

static uint64_t word(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static void deny(const struct env *e, enum op op)
{
	char step[32];
	uint8_t target[BUF], local[BUF];

	snprintf(step, sizeof(step), "deny_%s", ops[op].name);
	fill(e);
	memcpy(target, e->target, BUF);
	memcpy(local, e->local, BUF);
	struct pair p = open_pair(step, e, REMOTE_ALL & ~ops[op].right);
	struct ibv_wc wc = run(step, e, &p, op, 1, 2);

	if (wc.status != IBV_WC_REM_ACCESS_ERR)
		fail(step, "status %s (%d), expected %s", ibv_wc_status_str(wc.status), wc.status,
		     ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));
	if (memcmp(target, e->target, BUF))
		fail(step, "the target memory changed");
	if (memcmp(local, e->local, BUF))
		fail(step, "the requester's buffer changed");
	close_pair(step, &p);
	ok(step, "status=%s", ibv_wc_status_str(wc.status));
}

static void grant(const struct env *e, enum op op)
{
	char step[32];
	uint64_t before;

	snprintf(step, sizeof(step), "grant_%s", ops[op].name);
	fill(e);
	before = word(e->target + WORD_OFF);
	struct pair p = open_pair(step, e, REMOTE_ALL & ~ops[op].right);

	set_access(step, &p, REMOTE_ALL);
	struct ibv_wc wc = run(step, e, &p, op, op == OP_CMP_SWAP ? before : 7, 0x1122334455667788);

	if (wc.status != IBV_WC_SUCCESS)
		fail(step, "status %s (%d) after the right was granted", ibv_wc_status_str(wc.status),
		     wc.status);
	switch (op) {
	case OP_WRITE:
		if (memcmp(e->target, e->local, LEN))
			fail(step, "the written bytes did not land");
		break;
	case OP_READ:
		if (memcmp(e->local, e->target, LEN))
			fail(step, "the read bytes are not the target's");
		break;
	case OP_FETCH_ADD:
	case OP_CMP_SWAP:
		if (word(e->local) != before)
			fail(step, "returned %#" PRIx64 ", expected the old value %#" PRIx64,
			     word(e->local), before);
		if (word(e->target + WORD_OFF) != (op == OP_FETCH_ADD ? before + 7 : 0x1122334455667788))
			fail(step, "the target word holds %#" PRIx64, word(e->target + WORD_OFF));
		break;
	}
	close_pair(step, &p);
	ok(step, "status=%s", ibv_wc_status_str(wc.status));
}

static void revoke_write(const struct env *e)
{
	const char *step = "revoke_write";
	uint8_t after_first[BUF];

	fill(e);
	struct pair p = open_pair(step, e, REMOTE_ALL);
	struct ibv_wc wc = run(step, e, &p, OP_WRITE, 0, 0);

	if (wc.status != IBV_WC_SUCCESS || memcmp(e->target, e->local, LEN))
		fail(step, "the first WRITE did not land (status %s)", ibv_wc_status_str(wc.status));
	memcpy(after_first, e->target, BUF);
	set_access(step, &p, REMOTE_ALL & ~IBV_ACCESS_REMOTE_WRITE);
	memset(e->local, 0xee, LEN);
	wc = run(step, e, &p, OP_WRITE, 0, 0);
	if (wc.status != IBV_WC_REM_ACCESS_ERR)
		fail(step, "status %s (%d) after REMOTE_WRITE was revoked, expected %s",
		     ibv_wc_status_str(wc.status), wc.status, ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));
	if (memcmp(after_first, e->target, BUF))
		fail(step, "the target memory changed after REMOTE_WRITE was revoked");
	close_pair(step, &p);
	ok(step, "status=%s", ibv_wc_status_str(wc.status));
}

static void open_env(struct env *e, const char *device, const struct in_addr *v4)
{
	struct ibv_device **list;
	struct ibv_gid_entry gids[MAX_GIDS];
	ssize_t ngids;
	int i, n;

	memset(e, 0, sizeof(*e));
	e->gid.raw[10] = 0xff;
	e->gid.raw[11] = 0xff;
	memcpy(&e->gid.raw[12], v4, 4);
	list = check_ptr("open_device", ibv_get_device_list(&n));
	for (i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), device))
			e->ctx = check_ptr("open_device", ibv_open_device(list[i]));
	ibv_free_device_list(list);
	if (!e->ctx)
		fail("open_device", "no device %s among %d", device, n);
	ngids = ibv_query_gid_table(e->ctx, gids, MAX_GIDS, 0);
	if (ngids < 0)
		fail("open_device", "ibv_query_gid_table: %s", strerror((int)-ngids));
	e->gid_index = -1;
	for (i = 0; i < ngids; i++)
		if (gids[i].port_num == PORT && gids[i].gid_type == IBV_GID_TYPE_ROCE_V2 &&
		    !memcmp(gids[i].gid.raw, e->gid.raw, sizeof(e->gid.raw)))
			e->gid_index = (int)gids[i].gid_index;
	if (e->gid_index < 0)
		fail("open_device", "no RoCE v2 GID of the address among %zd entries", ngids);
	e->pd = check_ptr("open_device", ibv_alloc_pd(e->ctx));
	e->target = check_ptr("open_device", aligned_alloc(BUF, BUF));
	e->local = check_ptr("open_device", aligned_alloc(BUF, BUF));
	e->target_mr = check_ptr("open_device", ibv_reg_mr(e->pd, e->target, BUF,
							   IBV_ACCESS_LOCAL_WRITE | REMOTE_ALL));
	e->local_mr = check_ptr("open_device", ibv_reg_mr(e->pd, e->local, BUF,
							  IBV_ACCESS_LOCAL_WRITE));
	ok("open_device", "%s gid_index=%d", device, e->gid_index);
}

int main(int argc, char **argv)
{
	struct env e;
	struct in_addr v4;

	if (argc != 3 || inet_pton(AF_INET, argv[2], &v4) != 1) {
		fprintf(stderr, "usage: %s DEVICE IPV4\n", argv[0]);
		return 2;
	}
	open_env(&e, argv[1], &v4);
	for (enum op op = OP_WRITE; op <= OP_CMP_SWAP; op++) {
		deny(&e, op);
		grant(&e, op);
	}
	revoke_write(&e);
	check_rc("close", ibv_dereg_mr(e.target_mr));
	check_rc("close", ibv_dereg_mr(e.local_mr));
	check_rc("close", ibv_dealloc_pd(e.pd));
	check_rc("close", ibv_close_device(e.ctx));
	printf("ACCESS-CHECK-OK steps=%d\n", steps);
	return 0;
}

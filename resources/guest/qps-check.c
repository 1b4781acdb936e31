// SPDX-License-Identifier: Apache-2.0
/*
 * pvrdma-qps-check: many RC QPs between two guests, every one of them carrying checked data for
 * the whole run (issue 16: 4096 busy QPs across a live migration). Built into the guest image by
 * recipes/userspace.sh against Debian's libibverbs-dev, linked to the image's libibverbs.so.1.
 *
 * Usage: pvrdma-qps-check server PORT NQP GID_INDEX SECONDS
 *        pvrdma-qps-check client SERVER_IPV4 PORT NQP GID_INDEX SECONDS
 *   PORT 1..65535, NQP 1..MAX_QPS, GID_INDEX the RoCE v2 GID of this guest's address on the first
 *   device, SECONDS 1..3600. Both sides open the first RDMA device, make one PD, one CQ (with a
 *   completion channel) and NQP RC QPs on it, and one buffer of NQP slots of SLOT bytes
 *   registered for local and remote write. The server listens on TCP PORT before it makes its QPs;
 *   the client, once its QPs are made, connects (again for 120 s while the server does not listen
 *   yet) and sends {nqp, slot buffer address, rkey, GID, QPNs}; the server
 *   brings its QPs to RTS towards the client's and answers the same; the client does too. Then, on
 *   every QP i independently, rounds r = 1, 2...: the client writes pattern(i, r) into its slot i
 *   and RDMA WRITEs it WITH_IMM (imm = r, bit 31 on the final round) into the server's slot i; the
 *   server checks its slot i against pattern(i, r), r against the QP's previous round + 1, and
 *   SENDs back an 8-byte ack {r, bad words}; on the ack the client checks r and starts round r + 1.
 *   Once every QP has finished a round the client says RUNNING and starts its SECONDS; the first
 *   round each QP starts after them is its final one. Each side ends when every QP has finished
 *   its final round.
 *   Pattern: 64-bit word w of slot i in round r is ((u64)r << 40) ^ ((u64)i << 24) ^ (w * GOLDEN).
 *   Timeouts: no completion at all for STALL_S seconds, a peer that does not connect within
 *   ACCEPT_TIMEOUT_S, or a run longer than SECONDS plus RUN_MARGIN_S (counted from RUNNING, or from
 *   the connection on the server) is a failure. QPs: path MTU 1024, ACK timeout 4.096 us * 2^20
 *   (4.3 s: the guests run at nested TCG speed and the peer may be migrating), 7 retries.
 *
 * Output (stdout, flushed after every line):
 *   "QPS-CHECK-CONNECTED qps=N first_qpn=0x.. last_qpn=0x.. peer_first_qpn=0x..", the client's
 *   "QPS-CHECK-RUNNING qps=N" (every QP has finished a round), every PROGRESS_S seconds
 *   "QPS-CHECK-PROGRESS rounds=R min=M max=X", at the end "QPS-CHECK-OK server|client qps=N
 *   rounds=R min=M max=X" (rounds finished in all, and per QP) and exit status 0. A slot that does
 *   not verify, an ack out of order or a bad completion prints "QPS-CHECK-FAIL <what>" (at most
 *   MAX_PRINTED), the run goes on for the other QPs where it can, and ends with
 *   "QPS-CHECK-FAIL summary: B bad rounds" and exit status 1; set-up errors and timeouts print
 *   "QPS-CHECK-FAIL <step>: <reason>" and exit 1 at once; usage errors exit 2.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define FAIL_TAG "QPS-CHECK-FAIL"
#define SAY
#include "check.h"

#define MAX_QPS 8192		/* 3 CQEs a QP must fit the device's 32768 per CQ */
#define SLOT 256		/* bytes written per QP and round */
#define SLOT_WORDS (SLOT / 8)
#define ACK_BYTES 8
#define WR_DEPTH 4
#define STALL_S 120
#define ACCEPT_TIMEOUT_S 1200	/* the client sets up its QPs before it connects */
#define CONNECT_TIMEOUT_S 120
#define RUN_MARGIN_S 600
#define PROGRESS_S 10
#define POLL_BATCH 64
#define MAX_PRINTED 20
#define FINAL_BIT 0x80000000u
#define GOLDEN 0x9E3779B97F4A7C15ULL
#define PSN 0x1000

/* wr_id: the kind in the high half, the QP's index in the low half. */
enum { WR_RECV = 1, WR_SEND = 2, WR_WRITE = 3 };
#define WRID(kind, idx) (((uint64_t)(kind) << 32) | (uint32_t)(idx))

/* What each side tells the other once, over TCP (host byte order, both ends x86-64). */
struct hello {
	uint32_t nqp;
	uint32_t rkey;
	uint64_t addr;
	uint8_t gid[16];
};

struct qp_state {
	struct ibv_qp *qp;
	uint32_t round;		/* last round finished (client: acked; server: verified) */
	int final;		/* the round in flight (client) or acked (server) is the final one */
	int sends;		/* server: acks not completed yet */
};

static int is_client;
static uint32_t nqp;
static struct qp_state *qps;
static uint64_t *slots;		/* nqp slots, then nqp ack slots */
static struct ibv_mr *mr;
static struct ibv_cq *cq;
static struct ibv_comp_channel *channel;
static uint64_t bad_rounds;
static unsigned printed;

/* A failed round: counted, printed MAX_PRINTED times at most; the run goes on. */
static void __attribute__((format(printf, 1, 2))) bad(const char *fmt, ...)
{
	va_list ap;

	bad_rounds++;
	if (printed++ >= MAX_PRINTED)
		return;
	printf(FAIL_TAG " ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static int64_t now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec;
}

static uint64_t pattern(uint32_t qp, uint32_t round, unsigned word)
{
	return ((uint64_t)round << 40) ^ ((uint64_t)qp << 24) ^ (word * GOLDEN);
}

static uint64_t *slot(uint32_t i) { return slots + (size_t)i * SLOT_WORDS; }
static uint64_t *ack_slot(uint32_t i) { return slots + ((size_t)nqp + i) * SLOT_WORDS; }

static void post_recv(uint32_t i)
{
	struct ibv_sge sge = { (uintptr_t)ack_slot(i), ACK_BYTES, mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = WRID(WR_RECV, i), .sg_list = &sge, .num_sge = 1 }, *bad_wr;

	check_rc("ibv_post_recv", ibv_post_recv(qps[i].qp, &wr, &bad_wr));
}

/* Client: round `round` of QP i into the server's slot i. */
static void post_write(uint32_t i, uint32_t round, const struct hello *peer)
{
	uint64_t *s = slot(i);
	struct ibv_sge sge = { (uintptr_t)s, SLOT, mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = WRID(WR_WRITE, i),
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED,
		.imm_data = htonl(round | (qps[i].final ? FINAL_BIT : 0)),
	}, *bad_wr;
	unsigned w;

	for (w = 0; w < SLOT_WORDS; w++)
		s[w] = pattern(i, round, w);
	wr.wr.rdma.remote_addr = peer->addr + (uint64_t)i * SLOT;
	wr.wr.rdma.rkey = peer->rkey;
	check_rc("ibv_post_send write", ibv_post_send(qps[i].qp, &wr, &bad_wr));
}

/* Server: the ack of QP i's round, from its ack slot (the client acks it before it writes
 * again, so the slot is free by the next round). The receive posted for the client's WRITE_WITH_IMM
 * names the same slot, but such a receive takes no bytes. */
static void post_ack(uint32_t i, uint32_t round, uint32_t bad_words)
{
	uint32_t *ack = (uint32_t *)ack_slot(i);
	struct ibv_sge sge = { (uintptr_t)ack, ACK_BYTES, mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = WRID(WR_SEND, i),
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad_wr;

	ack[0] = round;
	ack[1] = bad_words;
	qps[i].sends++;
	check_rc("ibv_post_send ack", ibv_post_send(qps[i].qp, &wr, &bad_wr));
}

static void to_rts(struct ibv_qp *qp, int gidx, const struct hello *peer, uint32_t dest_qpn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};

	check_rc("modify_qp INIT", ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
						  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = PSN;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.grh.sgid_index = gidx;
	memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
	check_rc("modify_qp RTR", ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
						 IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 20;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = PSN;
	a.max_rd_atomic = 1;
	check_rc("modify_qp RTS", ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
						 IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
						 IBV_QP_MAX_QP_RD_ATOMIC));
}

static void full_io(const char *step, int fd, void *buf, size_t len, int writing)
{
	char *p = buf;

	while (len) {
		ssize_t n = writing ? write(fd, p, len) : read(fd, p, len);

		if (n <= 0)
			fail(step, "%s", n ? strerror(errno) : "connection closed");
		p += n;
		len -= (size_t)n;
	}
}

static void send_hello(int fd, const struct hello *ours)
{
	uint32_t *qpns = check_ptr("calloc", calloc(nqp, sizeof(*qpns)));
	uint32_t i;

	for (i = 0; i < nqp; i++)
		qpns[i] = qps[i].qp->qp_num;
	full_io("send hello", fd, (void *)ours, sizeof(*ours), 1);
	full_io("send QPNs", fd, qpns, nqp * sizeof(*qpns), 1);
	free(qpns);
}

static void read_hello(int fd, struct hello *peer, uint32_t *peer_qpns)
{
	full_io("read hello", fd, peer, sizeof(*peer), 0);
	if (peer->nqp != nqp)
		fail("hello", "the peer has %u QPs, we have %u", peer->nqp, nqp);
	full_io("read QPNs", fd, peer_qpns, nqp * sizeof(*peer_qpns), 0);
}

static int tcp_connect(const char *ip, int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int64_t end = now_s() + CONNECT_TIMEOUT_S;

	if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1)
		fail("address", "%s is not an IPv4 address", ip);
	for (;;) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);

		if (fd < 0)
			fail("socket", "%s", strerror(errno));
		if (!connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
			return fd;
		close(fd);
		if (now_s() >= end)
			fail("connect", "%s:%d: %s", ip, port, strerror(errno));
		sleep(1);
	}
}

/* Listens before the QPs are made: a client that is done with its own QPs first connects and
 * waits for our answer. */
static int tcp_listen(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 1))
		fail("listen", "port %d: %s", port, strerror(errno));
	return fd;
}

static int tcp_accept(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int c;

	if (poll(&p, 1, ACCEPT_TIMEOUT_S * 1000) != 1)
		fail("accept", "no client within %d s", ACCEPT_TIMEOUT_S);
	c = accept(fd, NULL, NULL);
	if (c < 0)
		fail("accept", "%s", strerror(errno));
	close(fd);
	return c;
}

/* One completion. Returns 1 when it finished a QP's final round. */
static int complete(const struct ibv_wc *wc, const struct hello *peer, int64_t deadline)
{
	uint32_t i = (uint32_t)wc->wr_id, kind = (uint32_t)(wc->wr_id >> 32);
	struct qp_state *q;

	if (i >= nqp)
		fail("completion", "wr_id %#" PRIx64 " names no QP", wc->wr_id);
	q = &qps[i];
	if (wc->status != IBV_WC_SUCCESS)
		fail("completion", "QP %u (qpn %#x) kind %u: %s", i, wc->qp_num, kind,
		     ibv_wc_status_str(wc->status));
	if (kind == WR_SEND) {
		/* The server is done with a QP once its final ack arrived (RC ACK). */
		q->sends--;
		return q->final && !q->sends;
	}
	if (kind != WR_RECV)
		return 0;	/* a WRITE: the ack says what happened to it */
	if (is_client) {
		const uint32_t *ack = (const uint32_t *)ack_slot(i);
		uint32_t want = q->round + 1;

		if (ack[0] != want || ack[1])
			bad("ack: QP %u: round %u with %u bad words, expected round %u", i, ack[0],
			    ack[1], want);
		q->round = want;
		if (q->final)
			return 1;
		q->final = now_s() >= deadline;
		post_recv(i);
		post_write(i, q->round + 1, peer);
		return 0;
	}
	{
		uint32_t imm = ntohl(wc->imm_data), round = imm & ~FINAL_BIT, bad_words = 0;
		const uint64_t *s = slot(i);
		unsigned w;

		if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc->wc_flags & IBV_WC_WITH_IMM))
			fail("completion", "QP %u: opcode %d without immediate data", i, wc->opcode);
		__asm__ __volatile__("" ::: "memory");
		for (w = 0; w < SLOT_WORDS; w++)
			bad_words += s[w] != pattern(i, round, w);
		if (round != q->round + 1 || bad_words)
			bad("data: QP %u: round %u (expected %u): %u of %u words differ", i, round,
			    q->round + 1, bad_words, SLOT_WORDS);
		q->round = round;
		q->final = !!(imm & FINAL_BIT);
		if (!q->final)
			post_recv(i);
		post_ack(i, round, bad_words);
		return 0;
	}
}

static void rounds(uint32_t *min, uint32_t *max, uint64_t *sum)
{
	uint32_t i;

	*min = UINT32_MAX;
	*max = 0;
	*sum = 0;
	for (i = 0; i < nqp; i++) {
		*min = qps[i].round < *min ? qps[i].round : *min;
		*max = qps[i].round > *max ? qps[i].round : *max;
		*sum += qps[i].round;
	}
}

static void __attribute__((noreturn)) usage(void)
{
	fprintf(stderr, "usage: pvrdma-qps-check server PORT NQP GID_INDEX SECONDS\n"
			"       pvrdma-qps-check client SERVER_IPV4 PORT NQP GID_INDEX SECONDS\n");
	exit(2);
}

static long number(const char *s, long lo, long hi)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (*s == '\0' || *end != '\0' || v < lo || v > hi)
		usage();
	return v;
}

int main(int argc, char **argv)
{
	struct ibv_device **devs;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct hello ours = { 0 }, peer;
	uint32_t *peer_qpns, i, left, min, max, running = 0;
	uint64_t sum;
	int64_t started, deadline, last_event, last_progress;
	int port, gidx, seconds, fd = -1, a = 2;
	const char *server_ip = NULL;
	size_t len;

	if (argc < 2)
		usage();
	is_client = !strcmp(argv[1], "client");
	if (!is_client && strcmp(argv[1], "server"))
		usage();
	if (argc != (is_client ? 7 : 6))
		usage();
	if (is_client)
		server_ip = argv[a++];
	port = (int)number(argv[a++], 1, 65535);
	nqp = (uint32_t)number(argv[a++], 1, MAX_QPS);
	gidx = (int)number(argv[a++], 0, 255);
	seconds = (int)number(argv[a], 1, 3600);

	if (!is_client)
		fd = tcp_listen(port);
	devs = check_ptr("ibv_get_device_list", ibv_get_device_list(NULL));
	if (!devs[0])
		fail("ibv_get_device_list", "no RDMA device");
	ctx = check_ptr("ibv_open_device", ibv_open_device(devs[0]));
	pd = check_ptr("ibv_alloc_pd", ibv_alloc_pd(ctx));
	channel = check_ptr("ibv_create_comp_channel", ibv_create_comp_channel(ctx));
	/* At most 3 completions of a QP wait at once: two WRITEs and an ack (client), an incoming
	 * WRITE and two acks (server). */
	cq = check_ptr("ibv_create_cq", ibv_create_cq(ctx, 3 * (int)nqp + 16, NULL, channel, 0));
	len = (size_t)nqp * SLOT * 2;
	slots = check_ptr("aligned_alloc", aligned_alloc(4096, (len + 4095) & ~(size_t)4095));
	memset(slots, 0, len);
	mr = check_ptr("ibv_reg_mr", ibv_reg_mr(pd, slots, len, IBV_ACCESS_LOCAL_WRITE |
						IBV_ACCESS_REMOTE_WRITE));
	qps = check_ptr("calloc", calloc(nqp, sizeof(*qps)));
	peer_qpns = check_ptr("calloc", calloc(nqp, sizeof(*peer_qpns)));
	for (i = 0; i < nqp; i++) {
		struct ibv_qp_init_attr init = {
			.send_cq = cq,
			.recv_cq = cq,
			.cap = { .max_send_wr = WR_DEPTH, .max_recv_wr = WR_DEPTH,
				 .max_send_sge = 1, .max_recv_sge = 1 },
			.qp_type = IBV_QPT_RC,
		};

		qps[i].qp = ibv_create_qp(pd, &init);
		if (!qps[i].qp)
			fail("ibv_create_qp", "QP %u of %u: %s", i + 1, nqp, strerror(errno));
	}
	ours.nqp = nqp;
	ours.rkey = mr->rkey;
	ours.addr = (uintptr_t)slots;
	{
		union ibv_gid gid;

		check_rc("ibv_query_gid", ibv_query_gid(ctx, 1, gidx, &gid));
		memcpy(ours.gid, gid.raw, 16);
	}
	if (is_client) {
		fd = tcp_connect(server_ip, port);
		send_hello(fd, &ours);
		read_hello(fd, &peer, peer_qpns);
		for (i = 0; i < nqp; i++) {
			to_rts(qps[i].qp, gidx, &peer, peer_qpns[i]);
			post_recv(i);
		}
	} else {
		fd = tcp_accept(fd);
		read_hello(fd, &peer, peer_qpns);
		/* Ready to take the client's first WRITE before it learns our QPNs. */
		for (i = 0; i < nqp; i++) {
			to_rts(qps[i].qp, gidx, &peer, peer_qpns[i]);
			post_recv(i);
		}
		send_hello(fd, &ours);
	}
	close(fd);
	say("QPS-CHECK-CONNECTED qps=%u first_qpn=%#x last_qpn=%#x peer_first_qpn=%#x", nqp,
	    qps[0].qp->qp_num, qps[nqp - 1].qp->qp_num, peer_qpns[0]);

	started = now_s();
	/* The client's SECONDS start once every QP has finished a round. */
	deadline = is_client ? INT64_MAX : started + seconds;
	if (is_client)
		for (i = 0; i < nqp; i++)
			post_write(i, 1, &peer);
	check_rc("ibv_req_notify_cq", ibv_req_notify_cq(cq, 0));
	last_event = last_progress = now_s();
	left = nqp;
	while (left) {
		struct ibv_wc wc[POLL_BATCH];
		int n, k;
		int64_t now = now_s();

		n = ibv_poll_cq(cq, POLL_BATCH, wc);
		if (n < 0)
			fail("ibv_poll_cq", "%d", n);
		for (k = 0; k < n; k++)
			left -= (uint32_t)complete(&wc[k], &peer, deadline);
		if (n)
			last_event = now;
		if (is_client && !running) {
			rounds(&min, &max, &sum);
			if (min >= 1) {
				running = 1;
				deadline = now + seconds;
				say("QPS-CHECK-RUNNING qps=%u", nqp);
			}
		}
		if (now - last_progress >= PROGRESS_S) {
			rounds(&min, &max, &sum);
			say("QPS-CHECK-PROGRESS rounds=%" PRIu64 " min=%u max=%u", sum, min, max);
			last_progress = now;
		}
		if (now - last_event >= STALL_S) {
			rounds(&min, &max, &sum);
			fail("stall", "no completion for %d s (rounds=%" PRIu64 " min=%u, %u QPs not done)",
			     STALL_S, sum, min, left);
		}
		if (now > (is_client && running ? deadline : started + seconds) + RUN_MARGIN_S)
			fail("run", "%u QPs not done %d s after the end", left, RUN_MARGIN_S);
		if (n == POLL_BATCH || !left)
			continue;
		/* Empty: wait for the next completion event (a slice at most). */
		{
			struct pollfd p = { channel->fd, POLLIN, 0 };

			if (poll(&p, 1, 1000) == 1) {
				struct ibv_cq *ev_cq;
				void *ev_ctx;

				check_rc("ibv_get_cq_event", ibv_get_cq_event(channel, &ev_cq, &ev_ctx));
				ibv_ack_cq_events(ev_cq, 1);
			}
			check_rc("ibv_req_notify_cq", ibv_req_notify_cq(cq, 0));
		}
	}
	rounds(&min, &max, &sum);
	if (bad_rounds)
		fail("summary", "%" PRIu64 " bad rounds", bad_rounds);
	say("QPS-CHECK-OK %s qps=%u rounds=%" PRIu64 " min=%u max=%u", is_client ? "client" : "server",
	    nqp, sum, min, max);
	return 0;
}

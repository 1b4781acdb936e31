// SPDX-License-Identifier: Apache-2.0
/*
 * pvrdma-write-check: during a live migration of the VM running the server, memory written by the
 * PVRDMA device (incoming RDMA WRITEs from a peer) and memory written by the guest's own CPU must
 * arrive intact on the destination; a page the dirty log misses shows up as stale data. Every
 * round of writes is verified, wherever the VM is running at that moment. Built into the guest
 * image by recipes/userspace.sh against Debian's libibverbs-dev and librdmacm-dev, dynamically
 * linked to the image's libibverbs.so.1 and librdmacm.so.1.
 *
 * Usage: pvrdma-write-check server PORT MIB SECONDS
 *        pvrdma-write-check client SERVER_IPV4 PORT MIB SECONDS
 *   PORT 1..65535, MIB 1..1024 (buffer size in MiB, the same on both sides), SECONDS 1..3600.
 *   The server listens (rdma_cm, RC QP) on 0.0.0.0:PORT and accepts exactly one client. It maps a
 *   `target` buffer of MIB MiB registered for remote write, whose {u64 addr, u32 rkey, u32 len}
 *   (host byte order) it sends in the accept's private data, and an `own` buffer of MIB MiB for
 *   its CPU writer. The client, for SECONDS seconds (CLOCK_MONOTONIC), runs rounds r = 1, 2...:
 *   fills its registered `src` buffer with pattern(r), RDMA WRITEs it all to `target` in 1 MiB
 *   work requests (WRITE_DEPTH in flight, every completion checked), then SENDs
 *   {u32 magic, u32 round, u64 checksum of src, u32 final} and waits for the server's ack before
 *   the next round. The round after which SECONDS have passed carries final=1 (there is always at
 *   least one round). The server, for each message: checks `target` against pattern(round) and
 *   the checksum, acks {u32 magic, u32 round, u32 verified} (the client does not touch `target`
 *   before the ack), then runs one CPU round on `own` (writes pattern(m) across it, reads it all
 *   back), while the client already writes the next round. After the final message it prints its
 *   summary. The server's SECONDS bounds its run: no final message within SECONDS plus twice the
 *   per-message timeout is a failure.
 *   Pattern: 64-bit word i (from the start of the buffer) of round r is
 *   ((uint64_t)r << 40) ^ (i * 0x9E3779B97F4A7C15), so every page changes every round.
 *   Checksum: FNV-1a 64 over the buffer's 64-bit words (h ^= word; h *= 0x100000001b3, starting
 *   from 0xcbf29ce484222325), not over its bytes.
 *   Timeouts: every wait has one, reported as a failure: 60 s for a completion or CM event, 60 s
 *   plus 1 s per 4 MiB for the peer's next message or ack (the peer also reads/writes MIB MiB),
 *   600 s for the server's wait for its client, 60 s of attempts (one a second) for the client's
 *   connection (the server may not listen yet). rdma_cm's defaults set the QP's ACK timeout.
 *
 * Output (stdout, flushed after every line):
 *   server: "WRITE-CHECK-LISTENING port=P mib=X", "WRITE-CHECK-CONNECTED", every 10 rounds
 *   "WRITE-CHECK-ROUND device=N cpu=M", at the end "WRITE-CHECK-OK device_rounds=N cpu_rounds=M
 *   mib=X checksum=0x<16 hex>" (the checksum of `target` in the last round) and exit status 0.
 *   A round that does not verify prints "WRITE-CHECK-FAIL device|cpu: round R, P of Q pages
 *   differ, first at offsets 0x.., 0x.. (first bad word at 0x..: 0x.. expected 0x.., <what it
 *   holds>)" (or "..., 0 of Q pages differ, but checksum 0x.. != sent 0x.."; at most 20 such
 *   lines per kind); the run goes on, then ends with "WRITE-CHECK-FAIL summary: D of N device
 *   rounds and C of M cpu rounds failed" and exit status 1.
 *   client: "WRITE-CHECK-RUNNING", at the end "WRITE-CHECK-SENT rounds=N checksum=0x<16 hex>"
 *   (the checksum of the last round, the server's OK checksum) and exit status 0.
 *   Both: any verbs/rdma_cm error, timeout or protocol error prints "WRITE-CHECK-FAIL <step>:
 *   <reason>" and exits 1 at once; usage errors exit 2.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define FAIL_TAG "WRITE-CHECK-FAIL"
#define SAY
#include "check.h"

#define MIB_BYTES (1024u * 1024u)
#define PAGE 4096u
#define PAGE_WORDS (PAGE / 8)
#define WRITE_DEPTH 8		/* 1 MiB RDMA WRITEs in flight */
#define RECV_SLOTS 4
#define SEND_SLOTS 4
#define SLOT_SIZE 64
#define CQE 64
#define TIMEOUT_S 60		/* a completion or a CM event */
#define ACCEPT_TIMEOUT_S 600	/* the server waiting for its client to connect */
#define CONNECT_TIMEOUT_S 60	/* the client's connection attempts */
#define RESOLVE_MS 5000		/* rdma_resolve_addr / rdma_resolve_route */
#define POLL_SLICE_MS 100
#define MAX_PRINTED 20		/* data failure lines printed per kind (all are counted) */
#define MSG_MAGIC 0x57434b4du	/* "WCKM" */
#define ACK_MAGIC 0x57434b41u	/* "WCKA" */
#define GOLDEN 0x9E3779B97F4A7C15ULL
#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

/* Accept private data: where the server's target buffer is (host byte order, both ends x86-64). */
struct target_info {
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

/* Client -> server after each round's writes. */
struct round_msg {
	uint32_t magic;
	uint32_t round;
	uint64_t checksum;
	uint32_t final;
	uint32_t pad;
};

/* Server -> client once the round is verified. */
struct ack_msg {
	uint32_t magic;
	uint32_t round;
	uint32_t verified;
	uint32_t pad;
};

_Static_assert(sizeof(struct round_msg) <= SLOT_SIZE && sizeof(struct ack_msg) <= SLOT_SIZE,
	       "messages fit a slot");

/* wr_id: the kind of work request in the high half (a failed completion's opcode is undefined). */
enum { WR_RECV = 1, WR_SEND = 2, WR_WRITE = 3 };
#define WRID(kind, idx) (((uint64_t)(kind) << 32) | (uint32_t)(idx))
#define WRID_KIND(id) ((unsigned)((id) >> 32))
#define WRID_IDX(id) ((uint32_t)(id))

/* Keeps the compiler from assuming what a buffer holds (the device or an earlier loop wrote it). */
#define barrier() __asm__ __volatile__("" ::: "memory")

struct conn {
	struct rdma_event_channel *cm;
	struct rdma_cm_id *id;
	struct ibv_context *verbs;
	struct ibv_pd *pd;
	struct ibv_comp_channel *comp;
	struct ibv_cq *cq;
	int armed;
	char *slots;		/* RECV_SLOTS receive slots, then SEND_SLOTS send slots */
	struct ibv_mr *slots_mr;
};

/* A buffer checked against the pattern of a round. */
struct check {
	size_t bad_pages;
	size_t first[4];	/* byte offsets of the first bad pages */
	size_t bad_word;	/* index of the first bad word, and what it held */
	uint64_t got, want;
	uint64_t sum;
};

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void set_nonblock(const char *step, int fd)
{
	int flags = fcntl(fd, F_GETFL);

	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
		fail(step, "fcntl O_NONBLOCK: %s", strerror(errno));
}

static uint64_t *map_buffer(const char *step, size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		fail(step, "mmap of %zu bytes: %s", len, strerror(errno));
	return p;
}

/* Writes pattern(round) over buf; returns its checksum. */
static uint64_t fill(uint64_t *buf, size_t words, uint32_t round)
{
	uint64_t hi = (uint64_t)round << 40, h = FNV_OFFSET;
	size_t i;

	for (i = 0; i < words; i++) {
		uint64_t w = hi ^ (i * GOLDEN);

		buf[i] = w;
		h = (h ^ w) * FNV_PRIME;
	}
	return h;
}

/* Compares buf with pattern(round) page by page and computes its checksum. */
static void verify(const uint64_t *buf, size_t words, uint32_t round, struct check *ck)
{
	uint64_t hi = (uint64_t)round << 40, h = FNV_OFFSET;
	size_t p, i;

	memset(ck, 0, sizeof(*ck));
	barrier();
	for (p = 0; p < words; p += PAGE_WORDS) {
		uint64_t diff = 0;

		for (i = p; i < p + PAGE_WORDS; i++) {
			uint64_t w = buf[i];

			diff |= w ^ hi ^ (i * GOLDEN);
			h = (h ^ w) * FNV_PRIME;
		}
		if (!diff)
			continue;
		if (ck->bad_pages < 4)
			ck->first[ck->bad_pages] = p * 8;
		if (!ck->bad_pages) {
			for (i = p; i < p + PAGE_WORDS - 1 && buf[i] == (hi ^ (i * GOLDEN)); i++)
				;
			ck->bad_word = i;
			ck->got = buf[i];
			ck->want = hi ^ (i * GOLDEN);
		}
		ck->bad_pages++;
	}
	ck->sum = h;
}

/* One failure line; see the header for its format. */
static void report(const char *what, uint32_t round, const struct check *ck, size_t pages,
		   uint64_t sent_sum)
{
	char offs[96], held[64];
	size_t i, n = 0;
	uint64_t v;

	if (!ck->bad_pages) {
		say("WRITE-CHECK-FAIL %s: round %u, 0 of %zu pages differ, but checksum 0x%016" PRIx64
		    " != sent 0x%016" PRIx64, what, round, pages, ck->sum, sent_sum);
		return;
	}
	offs[0] = 0;
	for (i = 0; i < ck->bad_pages && i < 4; i++)
		n += snprintf(offs + n, sizeof(offs) - n, "%s0x%zx", i ? ", " : "", ck->first[i]);
	/* A stale word still holds the pattern of the round that wrote it. */
	v = ck->got ^ (ck->bad_word * GOLDEN);
	if (!ck->got)
		snprintf(held, sizeof(held), "zero");
	else if (!(v & ((1ULL << 40) - 1)))
		snprintf(held, sizeof(held), "the data of round %" PRIu64, v >> 40);
	else
		snprintf(held, sizeof(held), "not the pattern of this offset");
	say("WRITE-CHECK-FAIL %s: round %u, %zu of %zu pages differ, first at offsets %s (first bad word "
	    "at 0x%zx: 0x%016" PRIx64 " expected 0x%016" PRIx64 ", %s)", what, round, ck->bad_pages,
	    pages, offs, ck->bad_word * 8, ck->got, ck->want, held);
}

static void setup_verbs(struct conn *c, struct ibv_context *verbs)
{
	c->verbs = verbs;
	c->pd = check_ptr("alloc_pd", ibv_alloc_pd(verbs));
	c->comp = check_ptr("create_comp_channel", ibv_create_comp_channel(verbs));
	set_nonblock("create_comp_channel", c->comp->fd);
	c->cq = check_ptr("create_cq", ibv_create_cq(verbs, CQE, NULL, c->comp, 0));
	c->slots = check_ptr("reg_mr_msgs", aligned_alloc(4096, 4096));
	memset(c->slots, 0, 4096);
	c->slots_mr = check_ptr("reg_mr_msgs", ibv_reg_mr(c->pd, c->slots, 4096, IBV_ACCESS_LOCAL_WRITE));
}

/* The connection's RC QP on id: 0, or -1 with errno. */
static int create_qp(struct conn *c, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = c->cq,
		.recv_cq = c->cq,
		.cap = {
			.max_send_wr = WRITE_DEPTH + SEND_SLOTS,
			.max_recv_wr = RECV_SLOTS,
			.max_send_sge = 1,
			.max_recv_sge = 1,
		},
		.qp_type = IBV_QPT_RC,
	};

	return rdma_create_qp(id, c->pd, &attr);
}

static void *slot(struct conn *c, unsigned i)
{
	return c->slots + (size_t)i * SLOT_SIZE;
}

static void post_recv(struct conn *c, unsigned i)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)slot(c, i),
		.length = SLOT_SIZE,
		.lkey = c->slots_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = WRID(WR_RECV, i), .sg_list = &sge, .num_sge = 1 }, *bad;

	check_rc("post_recv", ibv_post_recv(c->id->qp, &wr, &bad));
}

static void post_send(struct conn *c, unsigned i, const void *msg, size_t len)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)slot(c, RECV_SLOTS + i),
		.length = (uint32_t)len,
		.lkey = c->slots_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = WRID(WR_SEND, i),
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;

	memcpy(slot(c, RECV_SLOTS + i), msg, len);
	check_rc("post_send", ibv_post_send(c->id->qp, &wr, &bad));
}

/*
 * The next completion, waiting at most timeout_s. Sleeps on the completion channel, but wakes
 * every POLL_SLICE_MS to poll the CQ anyway: a lost notification costs time, never a hang.
 */
static void next_wc(struct conn *c, struct ibv_wc *wc, int timeout_s, const char *step,
		    const char *what)
{
	int64_t deadline = now_ms() + (int64_t)timeout_s * 1000, left;
	struct pollfd pfd = { .fd = c->comp->fd, .events = POLLIN };
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	int n;

	for (;;) {
		n = ibv_poll_cq(c->cq, 1, wc);
		if (n < 0)
			fail(step, "ibv_poll_cq returned %d", n);
		if (n)
			return;
		if (!c->armed) {
			/* Arm, then poll again: what completed before the arm raises no event. */
			check_rc(step, ibv_req_notify_cq(c->cq, 0));
			c->armed = 1;
			continue;
		}
		left = deadline - now_ms();
		if (left <= 0)
			fail(step, "no completion within %d s while waiting for %s", timeout_s, what);
		if (poll(&pfd, 1, left < POLL_SLICE_MS ? (int)left : POLL_SLICE_MS) < 0 && errno != EINTR)
			fail(step, "poll: %s", strerror(errno));
		if (!ibv_get_cq_event(c->comp, &ev_cq, &ev_ctx)) {
			ibv_ack_cq_events(ev_cq, 1);
			c->armed = 0;
		} else if (errno != EAGAIN) {
			fail(step, "ibv_get_cq_event: %s", strerror(errno));
		}
	}
}

static void wc_ok(const char *step, const struct ibv_wc *wc)
{
	static const char *const kinds[] = { "?", "RECV", "SEND", "RDMA WRITE" };
	unsigned kind = WRID_KIND(wc->wr_id);

	if (wc->status != IBV_WC_SUCCESS)
		fail(step, "%s (work request %u) completed with %s (status %d, vendor_err %#x)",
		     kinds[kind < 4 ? kind : 0], WRID_IDX(wc->wr_id), ibv_wc_status_str(wc->status),
		     wc->status, wc->vendor_err);
}

/*
 * The next CM event of id (a connection request to the listening id) before deadline; NULL on
 * timeout. Not acked.
 */
static struct rdma_cm_event *cm_event(struct rdma_event_channel *ch, struct rdma_cm_id *id,
				      int64_t deadline)
{
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	int64_t left;

	for (;;) {
		if (!rdma_get_cm_event(ch, &ev)) {
			if (ev->id == id || ev->listen_id == id)
				return ev;
			rdma_ack_cm_event(ev);	/* a leftover of an earlier attempt */
			continue;
		}
		if (errno != EAGAIN)
			fail("get_cm_event", "%s", strerror(errno));
		left = deadline - now_ms();
		if (left <= 0)
			return NULL;
		if (poll(&pfd, 1, left > INT_MAX ? INT_MAX : (int)left) < 0 && errno != EINTR)
			fail("get_cm_event", "poll: %s", strerror(errno));
	}
}

/*
 * Waits for `want` on id before deadline. On anything else, or a timeout, writes why into
 * why[n] and returns NULL (the client retries); the event it returns is not acked.
 */
static struct rdma_cm_event *attempt_event(struct conn *c, struct rdma_cm_id *id,
					   enum rdma_cm_event_type want, int64_t deadline,
					   const char *step, char *why, size_t n)
{
	struct rdma_cm_event *ev = cm_event(c->cm, id, deadline);

	if (!ev) {
		snprintf(why, n, "%s: no %s event in time", step, rdma_event_str(want));
		return NULL;
	}
	if (ev->event == want)
		return ev;
	snprintf(why, n, "%s: %s (status %d)", step, rdma_event_str(ev->event), ev->status);
	rdma_ack_cm_event(ev);
	return NULL;
}

/* One connection attempt of the client: 0 and c->id connected, or -1 and why[n] (retryable). */
static int try_connect(struct conn *c, const struct sockaddr_in *dst, struct target_info *ti,
		       int64_t deadline, char *why, size_t n)
{
	struct rdma_conn_param param = {
		.responder_resources = 1,
		.initiator_depth = 1,
		.retry_count = 7,
		.rnr_retry_count = 7,
	};
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	int have_qp = 0;

	check_rc("create_id", rdma_create_id(c->cm, &id, NULL, RDMA_PS_TCP));
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)dst, RESOLVE_MS)) {
		snprintf(why, n, "resolve_addr: %s", strerror(errno));
		goto out;
	}
	ev = attempt_event(c, id, RDMA_CM_EVENT_ADDR_RESOLVED, deadline, "resolve_addr", why, n);
	if (!ev)
		goto out;
	rdma_ack_cm_event(ev);
	if (rdma_resolve_route(id, RESOLVE_MS)) {
		snprintf(why, n, "resolve_route: %s", strerror(errno));
		goto out;
	}
	ev = attempt_event(c, id, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, "resolve_route", why, n);
	if (!ev)
		goto out;
	rdma_ack_cm_event(ev);
	if (!c->verbs)
		setup_verbs(c, id->verbs);
	else if (id->verbs != c->verbs)
		fail("resolve_route", "the route to the server moved to another device between attempts");
	check_rc("create_qp", create_qp(c, id));
	have_qp = 1;
	/* No receive is posted yet: the server sends nothing before the first round. */
	if (rdma_connect(id, &param)) {
		snprintf(why, n, "connect: %s", strerror(errno));
		goto out;
	}
	ev = attempt_event(c, id, RDMA_CM_EVENT_ESTABLISHED, deadline, "connect", why, n);
	if (!ev)
		goto out;
	if (!ev->param.conn.private_data || ev->param.conn.private_data_len < sizeof(*ti))
		fail("connect", "the server's accept carries %u bytes of private data, expected %zu",
		     ev->param.conn.private_data_len, sizeof(*ti));
	memcpy(ti, ev->param.conn.private_data, sizeof(*ti));
	rdma_ack_cm_event(ev);
	c->id = id;
	return 0;
out:
	if (have_qp)
		rdma_destroy_qp(id);
	rdma_destroy_id(id);
	return -1;
}

/*
 * Accepts the connection request on c->id with a QP and its receives posted: 0 once the
 * connection is established, or -1 with why[n] (the client gave up on this request).
 */
static int accept_one(struct conn *c, struct rdma_conn_param *param, char *why, size_t n)
{
	struct rdma_cm_event *ev;
	unsigned i;

	if (create_qp(c, c->id)) {
		snprintf(why, n, "create_qp: %s", strerror(errno));
		return -1;
	}
	for (i = 0; i < RECV_SLOTS; i++)
		post_recv(c, i);
	if (rdma_accept(c->id, param)) {
		snprintf(why, n, "accept: %s", strerror(errno));
		return -1;
	}
	ev = attempt_event(c, c->id, RDMA_CM_EVENT_ESTABLISHED, now_ms() + (int64_t)TIMEOUT_S * 1000,
			   "accept", why, n);
	if (!ev)
		return -1;
	rdma_ack_cm_event(ev);
	return 0;
}

static int run_client(const struct sockaddr_in *dst, unsigned mib, unsigned seconds)
{
	size_t len = (size_t)mib * MIB_BYTES, words = len / 8, posted, done;
	int ack_timeout = TIMEOUT_S + (int)mib / 4, attempts = 0, sent, acked, final;
	uint64_t *src = map_buffer("alloc_src", len), sum = 0;
	int64_t deadline = now_ms() + CONNECT_TIMEOUT_S * 1000, start;
	struct conn c = { 0 };
	struct target_info ti;
	struct ibv_mr *mr;
	struct ibv_wc wc;
	struct round_msg msg;
	struct ack_msg ack;
	char why[160] = "";
	uint32_t r;
	unsigned i;

	c.cm = check_ptr("create_event_channel", rdma_create_event_channel());
	set_nonblock("create_event_channel", c.cm->fd);
	while (attempts++, try_connect(&c, dst, &ti, deadline, why, sizeof(why))) {
		if (now_ms() + 1000 >= deadline)
			fail("connect", "%s (%d attempts in %d s)", why, attempts, CONNECT_TIMEOUT_S);
		sleep(1);
	}
	if (ti.len != len)
		fail("connect", "the server's target is %u bytes, this client writes %zu (MIB differs)",
		     ti.len, len);
	mr = check_ptr("reg_mr_src", ibv_reg_mr(c.pd, src, len, IBV_ACCESS_LOCAL_WRITE));
	for (i = 0; i < RECV_SLOTS; i++)
		post_recv(&c, i);
	say("WRITE-CHECK-RUNNING");

	start = now_ms();
	for (r = 1;; r++) {
		sum = fill(src, words, r);
		barrier();
		for (posted = done = 0; done < mib;) {
			for (; posted < mib && posted - done < WRITE_DEPTH; posted++) {
				struct ibv_sge sge = {
					.addr = (uintptr_t)src + posted * MIB_BYTES,
					.length = MIB_BYTES,
					.lkey = mr->lkey,
				};
				struct ibv_send_wr wr = {
					.wr_id = WRID(WR_WRITE, posted),
					.sg_list = &sge,
					.num_sge = 1,
					.opcode = IBV_WR_RDMA_WRITE,
					.send_flags = IBV_SEND_SIGNALED,
					.wr.rdma = {
						.remote_addr = ti.addr + posted * MIB_BYTES,
						.rkey = ti.rkey,
					},
				}, *bad;

				check_rc("post_write", ibv_post_send(c.id->qp, &wr, &bad));
			}
			next_wc(&c, &wc, TIMEOUT_S, "write", "an RDMA WRITE to complete");
			wc_ok("write", &wc);
			if (WRID_KIND(wc.wr_id) != WR_WRITE)
				fail("write", "unexpected completion (wr_id %#" PRIx64 ") in round %u",
				     wc.wr_id, r);
			done++;
		}

		final = now_ms() - start >= (int64_t)seconds * 1000;
		msg = (struct round_msg){ .magic = MSG_MAGIC, .round = r, .checksum = sum, .final = final };
		post_send(&c, 0, &msg, sizeof(msg));
		for (sent = acked = 0; !sent || !acked;) {
			next_wc(&c, &wc, ack_timeout, "ack", "the server's ack");
			switch (WRID_KIND(wc.wr_id)) {
			case WR_SEND:
				wc_ok("send", &wc);
				sent = 1;
				break;
			case WR_RECV:
				wc_ok("ack", &wc);
				if (wc.byte_len != sizeof(ack))
					fail("ack", "%u bytes, expected %zu", wc.byte_len, sizeof(ack));
				memcpy(&ack, slot(&c, WRID_IDX(wc.wr_id)), sizeof(ack));
				post_recv(&c, WRID_IDX(wc.wr_id));
				if (ack.magic != ACK_MAGIC || ack.round != r)
					fail("ack", "magic %#x round %u, expected %#x round %u", ack.magic,
					     ack.round, ACK_MAGIC, r);
				acked = 1;
				break;
			default:
				fail("ack", "unexpected completion (wr_id %#" PRIx64 ")", wc.wr_id);
			}
		}
		if (final)
			break;
	}
	say("WRITE-CHECK-SENT rounds=%u checksum=0x%016" PRIx64, r, sum);
	/* The process's exit releases the rest; a disconnect tells the server at once. */
	rdma_disconnect(c.id);
	return 0;
}

static int run_server(int port, unsigned mib, unsigned seconds)
{
	size_t len = (size_t)mib * MIB_BYTES, words = len / 8, pages = len / PAGE;
	int msg_timeout = TIMEOUT_S + (int)mib / 4;
	uint64_t *target = map_buffer("alloc_target", len), *own = map_buffer("alloc_own", len);
	uint64_t last_sum = 0;
	uint32_t rounds = 0, cpu_rounds = 0, bad_dev = 0, bad_cpu = 0;
	unsigned sends = 0;
	int final = 0, verified;
	int64_t run_deadline;
	struct sockaddr_in sin = {
		.sin_family = AF_INET,
		.sin_port = htons((uint16_t)port),
		.sin_addr.s_addr = htonl(INADDR_ANY),
	};
	struct conn c = { 0 };
	struct rdma_cm_id *listen_id;
	struct rdma_cm_event *ev;
	struct ibv_mr *mr;
	struct ibv_wc wc;
	struct round_msg msg;
	struct ack_msg ack;
	struct check ck;
	struct target_info ti;
	char why[160] = "";
	int64_t accept_deadline;
	struct rdma_conn_param param = {
		.private_data = &ti,
		.private_data_len = sizeof(ti),
		.responder_resources = 1,
		.initiator_depth = 1,
		.rnr_retry_count = 7,
	};

	c.cm = check_ptr("create_event_channel", rdma_create_event_channel());
	set_nonblock("create_event_channel", c.cm->fd);
	check_rc("create_id", rdma_create_id(c.cm, &listen_id, NULL, RDMA_PS_TCP));
	check_rc("bind_addr", rdma_bind_addr(listen_id, (struct sockaddr *)&sin));
	check_rc("listen", rdma_listen(listen_id, 1));
	say("WRITE-CHECK-LISTENING port=%d mib=%u", port, mib);

	/*
	 * The client retries its connection attempts until a deadline of its own: a request it has
	 * given up on meanwhile (create_qp then fails with EINVAL, or the connection never comes
	 * up) is dropped here, and the server waits for its next one.
	 */
	accept_deadline = now_ms() + (int64_t)ACCEPT_TIMEOUT_S * 1000;
	for (;;) {
		ev = cm_event(c.cm, listen_id, accept_deadline);
		if (!ev)
			fail("accept", "timed out after %d s waiting for a client to connect",
			     ACCEPT_TIMEOUT_S);
		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
			rdma_ack_cm_event(ev);
			continue;
		}
		c.id = ev->id;
		rdma_ack_cm_event(ev);
		if (!c.verbs) {
			setup_verbs(&c, c.id->verbs);
			mr = check_ptr("reg_mr_target",
				       ibv_reg_mr(c.pd, target, len,
						  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
			ti = (struct target_info){ .addr = (uintptr_t)target, .rkey = mr->rkey,
						   .len = (uint32_t)len };
		} else if (c.id->verbs != c.verbs) {
			fail("accept", "a connection request on another device");
		}
		if (!accept_one(&c, &param, why, sizeof(why)))
			break;
		say("WRITE-CHECK-REQUEST-DROPPED %s", why);
		if (c.id->qp) {
			rdma_destroy_qp(c.id);
			/* What the dropped QP's receives left behind. */
			while (ibv_poll_cq(c.cq, 1, &wc) > 0)
				;
		}
		rdma_destroy_id(c.id);
	}
	rdma_destroy_id(listen_id);	/* exactly one client */
	say("WRITE-CHECK-CONNECTED");

	run_deadline = now_ms() + ((int64_t)seconds + 2 * msg_timeout) * 1000;
	while (!final) {
		next_wc(&c, &wc, msg_timeout, "recv", "the client's next round");
		if (WRID_KIND(wc.wr_id) == WR_SEND) {
			wc_ok("send_ack", &wc);
			sends--;
			continue;
		}
		wc_ok("recv", &wc);
		if (WRID_KIND(wc.wr_id) != WR_RECV)
			fail("recv", "unexpected completion (wr_id %#" PRIx64 ")", wc.wr_id);
		if (wc.byte_len != sizeof(msg))
			fail("recv", "%u bytes, expected %zu", wc.byte_len, sizeof(msg));
		memcpy(&msg, slot(&c, WRID_IDX(wc.wr_id)), sizeof(msg));
		post_recv(&c, WRID_IDX(wc.wr_id));
		if (msg.magic != MSG_MAGIC || msg.round != rounds + 1)
			fail("recv", "magic %#x round %u, expected %#x round %u", msg.magic, msg.round,
			     MSG_MAGIC, rounds + 1);
		rounds++;
		final = msg.final != 0;

		/* The device's writes: the client leaves target alone until our ack. */
		verify(target, words, msg.round, &ck);
		verified = !ck.bad_pages && ck.sum == msg.checksum;
		if (!verified && ++bad_dev <= MAX_PRINTED)
			report("device", msg.round, &ck, pages, msg.checksum);
		last_sum = ck.sum;

		while (sends >= SEND_SLOTS) {
			next_wc(&c, &wc, TIMEOUT_S, "send_ack", "an earlier ack to complete");
			wc_ok("send_ack", &wc);
			if (WRID_KIND(wc.wr_id) != WR_SEND)
				fail("send_ack", "unexpected completion (wr_id %#" PRIx64 ")", wc.wr_id);
			sends--;
		}
		ack = (struct ack_msg){ .magic = ACK_MAGIC, .round = msg.round, .verified = verified };
		post_send(&c, rounds % SEND_SLOTS, &ack, sizeof(ack));
		sends++;

		/* The CPU's writes, while the client writes the next round. */
		cpu_rounds++;
		fill(own, words, cpu_rounds);
		verify(own, words, cpu_rounds, &ck);
		if (ck.bad_pages && ++bad_cpu <= MAX_PRINTED)
			report("cpu", cpu_rounds, &ck, pages, 0);

		if (rounds % 10 == 0)
			say("WRITE-CHECK-ROUND device=%u cpu=%u", rounds, cpu_rounds);
		if (!final && now_ms() > run_deadline)
			fail("run", "no final round after %u rounds and %d s (the client runs %u s)", rounds,
			     (int)(seconds + 2 * msg_timeout), seconds);
	}
	while (sends) {
		next_wc(&c, &wc, TIMEOUT_S, "send_ack", "the last ack to complete");
		wc_ok("send_ack", &wc);
		if (WRID_KIND(wc.wr_id) != WR_SEND)
			fail("send_ack", "unexpected completion (wr_id %#" PRIx64 ")", wc.wr_id);
		sends--;
	}
	/* The process's exit releases the rest. */
	rdma_disconnect(c.id);
	if (bad_dev || bad_cpu) {
		say("WRITE-CHECK-FAIL summary: %u of %u device rounds and %u of %u cpu rounds failed",
		    bad_dev, rounds, bad_cpu, cpu_rounds);
		return 1;
	}
	say("WRITE-CHECK-OK device_rounds=%u cpu_rounds=%u mib=%u checksum=0x%016" PRIx64, rounds,
	    cpu_rounds, mib, last_sum);
	return 0;
}

static void __attribute__((noreturn)) usage(const char *prog, const char *why, const char *arg)
{
	if (why)
		fprintf(stderr, "%s: bad %s '%s'\n", prog, why, arg);
	fprintf(stderr,
		"usage: %s server PORT MIB SECONDS\n"
		"       %s client SERVER_IPV4 PORT MIB SECONDS\n"
		"  PORT 1..65535, MIB 1..1024 (buffer size in MiB), SECONDS 1..3600\n",
		prog, prog);
	exit(2);
}

/* A decimal number in min..max, or usage(). */
static unsigned number(const char *prog, const char *name, const char *s, unsigned long min,
		       unsigned long max)
{
	unsigned long v;
	char *end;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || *s == '+' || v < min || v > max)
		usage(prog, name, s);
	return (unsigned)v;
}

int main(int argc, char **argv)
{
	const char *prog = argc > 0 ? argv[0] : "pvrdma-write-check";
	struct sockaddr_in dst = { .sin_family = AF_INET };
	unsigned port, mib;

	if (argc == 5 && !strcmp(argv[1], "server")) {
		port = number(prog, "PORT", argv[2], 1, 65535);
		mib = number(prog, "MIB", argv[3], 1, 1024);
		return run_server((int)port, mib, number(prog, "SECONDS", argv[4], 1, 3600));
	}
	if (argc == 6 && !strcmp(argv[1], "client")) {
		if (inet_pton(AF_INET, argv[2], &dst.sin_addr) != 1)
			usage(prog, "SERVER_IPV4", argv[2]);
		dst.sin_port = htons((uint16_t)number(prog, "PORT", argv[3], 1, 65535));
		mib = number(prog, "MIB", argv[4], 1, 1024);
		return run_client(&dst, mib, number(prog, "SECONDS", argv[5], 1, 3600));
	}
	usage(prog, NULL, NULL);
}

// SPDX-License-Identifier: Apache-2.0
/*
 * pvrdma-mpi-check: an MPI job that moves data and verifies every byte of it (issue 14 item 3,
 * the ucx suite). Each round, every rank
 *   - sends BYTES of a pattern of (its rank, the round) to the next rank of a ring and receives the
 *     previous rank's, then compares all of it with that rank's pattern (point to point: pml ucx's
 *     eager and, above UCX's rendezvous threshold, rendezvous protocols);
 *   - takes part in an MPI_Allreduce (sum) of BYTES/8 64-bit words, word k of rank i being
 *     (i + 1) * (k + 1) + round, and compares every word with the sum it must be:
 *     (k + 1) * n (n + 1) / 2 + n * round (+ SKEW, which only a broken run sets: -x).
 * Rank 0 prints one line per round with the round's wall time (the longest shows a stall, such as
 * a live migration's blackout) and, once every rank agreed the run is over, the total. A run ends
 * after ROUNDS rounds, or, with -f FILE, at the end of the first round after rank 0 saw FILE exist
 * (and at least ROUNDS rounds): rank 0 broadcasts the decision every round.
 *
 * Usage: pvrdma-mpi-check [-r ROUNDS] [-s BYTES] [-f STOPFILE] [-x SKEW]
 * Output (rank 0 unless said):
 *   MPI-START ranks=N bytes=B rounds=R host0=H
 *   MPI-ROUND r=N usecs=T ok=1
 *   MPI-BAD rank=I round=N what=ring|allreduce index=K got=G want=W   (any rank, first few)
 *   MPI-END rounds=N bad=M max_usecs=T total_usecs=T MiB=X
 * Exit status: 0 if every rank verified everything, 1 otherwise (or MPI's own failure).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* At most this many MPI-BAD lines per rank: the count says the rest. */
#define MAX_REPORTS 4

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Byte j of rank r's ring message in round n: differs between ranks, rounds and neighbouring
 * bytes, so a message from the wrong peer or round, or shifted, shows. */
static uint8_t ring_byte(int r, long n, size_t j)
{
	return (uint8_t)(j * 131u + (size_t)r * 17u + (size_t)n * 7u + (j >> 8));
}

static void report(int rank, long round, const char *what, size_t k, uint64_t got, uint64_t want,
		   long *bad)
{
	if (++*bad <= MAX_REPORTS) {
		printf("MPI-BAD rank=%d round=%ld what=%s index=%zu got=%llu want=%llu\n", rank,
		       round, what, k, (unsigned long long)got, (unsigned long long)want);
		fflush(stdout);
	}
}

int main(int argc, char **argv)
{
	long rounds = 10, skew = 0, round, bad = 0, total_bad = 0;
	size_t bytes = 1 << 20, words, j;
	const char *stop_file = NULL;
	int rank, n, opt, stop = 0, next, prev;
	uint64_t t0, t, max_us = 0;
	uint8_t *out, *in;
	uint64_t *mine, *sum;
	char host[256] = "";

	while ((opt = getopt(argc, argv, "r:s:f:x:")) != -1) {
		switch (opt) {
		case 'r':
			rounds = strtol(optarg, NULL, 10);
			break;
		case 's':
			bytes = strtoul(optarg, NULL, 10);
			break;
		case 'f':
			stop_file = optarg;
			break;
		case 'x':
			skew = strtol(optarg, NULL, 10);
			break;
		default:
			fprintf(stderr, "usage: %s [-r ROUNDS] [-s BYTES] [-f STOPFILE] [-x SKEW]\n",
				argv[0]);
			return 2;
		}
	}
	if (rounds < 1 || bytes < 8 || bytes % 8 || bytes > (1u << 30)) {
		fprintf(stderr, "want ROUNDS >= 1 and BYTES a multiple of 8 in [8, 1 GiB]\n");
		return 2;
	}
	words = bytes / 8;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	next = (rank + 1) % n;
	prev = (rank + n - 1) % n;
	out = malloc(bytes);
	in = malloc(bytes);
	mine = malloc(bytes);
	sum = malloc(bytes);
	if (!out || !in || !mine || !sum) {
		fprintf(stderr, "rank %d: out of memory for 4 x %zu bytes\n", rank, bytes);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	gethostname(host, sizeof(host) - 1);
	if (rank == 0) {
		printf("MPI-START ranks=%d bytes=%zu rounds=%ld host0=%s\n", n, bytes, rounds, host);
		fflush(stdout);
	}

	t0 = now_us();
	for (round = 0; !stop; round++) {
		long round_bad = 0;
		const uint64_t tri = (uint64_t)n * (uint64_t)(n + 1) / 2;

		t = now_us();
		for (j = 0; j < bytes; j++)
			out[j] = ring_byte(rank, round, j);
		memset(in, 0, bytes);
		MPI_Sendrecv(out, (int)bytes, MPI_BYTE, next, (int)(round & 0x7fff), in, (int)bytes,
			     MPI_BYTE, prev, (int)(round & 0x7fff), MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		for (j = 0; j < bytes; j++)
			if (in[j] != ring_byte(prev, round, j)) {
				report(rank, round, "ring", j, in[j], ring_byte(prev, round, j), &round_bad);
				break;
			}

		for (j = 0; j < words; j++)
			mine[j] = (uint64_t)(rank + 1) * (j + 1) + (uint64_t)round;
		memset(sum, 0, bytes);
		MPI_Allreduce(mine, sum, (int)words, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
		for (j = 0; j < words; j++) {
			uint64_t want = (j + 1) * tri + (uint64_t)n * (uint64_t)round + (uint64_t)skew;

			if (sum[j] != want) {
				report(rank, round, "allreduce", j, sum[j], want, &round_bad);
				break;
			}
		}
		bad += round_bad;

		/* Rank 0 decides whether this was the last round; everyone follows. */
		if (rank == 0)
			stop = round + 1 >= rounds && (!stop_file || access(stop_file, F_OK) == 0);
		MPI_Bcast(&stop, 1, MPI_INT, 0, MPI_COMM_WORLD);
		t = now_us() - t;
		if (t > max_us)
			max_us = t;
		if (rank == 0) {
			printf("MPI-ROUND r=%ld usecs=%llu ok=%d\n", round, (unsigned long long)t,
			       round_bad == 0);
			fflush(stdout);
		}
	}
	MPI_Reduce(&bad, &total_bad, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
	MPI_Bcast(&total_bad, 1, MPI_LONG, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		printf("MPI-END rounds=%ld bad=%ld max_usecs=%llu total_usecs=%llu MiB=%.1f\n", round,
		       total_bad, (unsigned long long)max_us, (unsigned long long)(now_us() - t0),
		       (double)round * (double)bytes * 2.0 / 1048576.0);
		fflush(stdout);
	}
	free(out);
	free(in);
	free(mine);
	free(sum);
	MPI_Finalize();
	return total_bad ? 1 : 0;
}

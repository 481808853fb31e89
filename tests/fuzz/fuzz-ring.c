/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: a hostile client's ring.  The input becomes the submission entries, the
 * data area and the indices of a real session's ring; the daemon's ring_process() runs them
 * against a real block manager.  Afterwards every invariant must hold, whatever happened.
 *
 * Each input gets a fresh pool, so that it runs the same way alone (replayed, minimized) as in
 * a fuzzing run, and the sequence ids it names mean the same: the first OPEN answers
 * 1 << 32 | 0, the next 1 << 32 | 1 (generation 1, slot 0, 1, ...).
 *
 * Built twice: with libFuzzer (configure --enable-fuzzers) and, with any compiler, as a replay
 * program over the committed seeds (tests/fuzz/replay.c, tests/fuzz/replay.test).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/server/server.h"

#define ENTRIES 16
#define DATA_BYTES 4096

static struct server srv;
static struct kvpd_config cfg;
static struct kvpd_pool_config pool_cfg;
static struct dpool pool;
static struct session_ring ring;
static uint8_t mem[sizeof(struct kvp_ring_indices) * 2 + ENTRIES * (sizeof(struct kvp_sqe) +
								  sizeof(struct kvp_cqe)) + DATA_BYTES];

static void setup(void)
{
	pool_cfg = (struct kvpd_pool_config){ .name = "fuzz", .layers = 1, .kv_heads = 1,
					      .head_dim = 2, .element_bytes = 4, .block_tokens = 4,
					      .capacity_blocks = 64, .max_sequences = 32,
					      .max_seq_tokens = 1024 };
	cfg.limits = (struct kvpd_limits){ .max_sequences = 16, .max_blocks = 48,
					   .max_inflight = 64, .max_tokens_per_request = 512,
					   .max_ring_entries = ENTRIES };
	cfg.pools = &pool_cfg;
	cfg.npools = 1;
	srv.cfg = &cfg;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct uid_account acct = { .refs = 1 };
	struct session s = { .srv = &srv, .pool = &pool, .refs = 1, .name = "fuzz", .acct = &acct };
	struct ns_stats stats = { 0 };
	const char *why = NULL;
	char detail[256];
	uint32_t tail;

	if (!srv.cfg)
		setup();
	if (size < sizeof(tail))
		return 0;
	pool = (struct dpool){ 0 };
	if (dpool_init(&pool, &pool_cfg) < 0)
		abort();
	memcpy(&tail, data, sizeof(tail));
	data += sizeof(tail);
	size -= sizeof(tail);
	memset(mem, 0, sizeof(mem));
	ring = (struct session_ring){ .entries = ENTRIES, .mask = ENTRIES - 1,
				      .data_bytes = DATA_BYTES };
	ring.sq = (struct kvp_ring_indices *)mem;
	ring.cq = ring.sq + 1;
	ring.sqes = (struct kvp_sqe *)(ring.cq + 1);
	ring.cqes = (struct kvp_cqe *)(ring.sqes + ENTRIES);
	ring.data = (uint8_t *)(ring.cqes + ENTRIES);
	/* The entries and the data area are the input; the tail is whatever it says. */
	memcpy(ring.sqes, data, size < ENTRIES * sizeof(struct kvp_sqe) ? size : ENTRIES * sizeof(struct kvp_sqe));
	if (size > ENTRIES * sizeof(struct kvp_sqe))
		memcpy(ring.data, data + ENTRIES * sizeof(struct kvp_sqe),
		       size - ENTRIES * sizeof(struct kvp_sqe) < DATA_BYTES
			       ? size - ENTRIES * sizeof(struct kvp_sqe) : DATA_BYTES);
	ring.sq->tail = tail;
	ring.cq->head = 0;
	ring.cq_event_fd = -1;
	s.ring = &ring;
	s.stats = &stats;

	(void)ring_process(&s, &why);
	ops_close_all(&s);
	/* What ring_free does of the ring's own copy of the inputs (the ring itself is static). */
	account_bytes(&s, -(int64_t)ring.scratch_bytes);
	free(ring.scratch);
	if (dpool_verify(&pool, detail, sizeof(detail)) < 0) {
		fprintf(stderr, "invariant broken: %s\n", detail);
		abort();
	}
	/* Whatever the ring did, closing gave every charge back, at every level. */
	if (s.bytes || s.blocks || acct.use.bytes || acct.use.blocks || acct.use.sequences ||
	    stats.use.bytes || stats.use.blocks || stats.use.sequences || srv.use.bytes) {
		fprintf(stderr, "charges left after closing: session %llu bytes %llu blocks, uid "
			"%llu bytes %llu blocks %u sequences\n", (unsigned long long)s.bytes,
			(unsigned long long)s.blocks, (unsigned long long)acct.use.bytes,
			(unsigned long long)acct.use.blocks, acct.use.sequences);
		abort();
	}
	free(s.seqs);
	dpool_done(&pool);
	return 0;
}

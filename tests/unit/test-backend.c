/* SPDX-License-Identifier: MIT */
/*
 * The host memory backends, backend_host (every operation done inside the call) and
 * backend_host_threaded (operations queued to a helper thread), held to daemon/backend/backend.h:
 *
 *   - a new pool reads as zeros, through the daemon's mapping and a client's mapping of its fd;
 *   - copy_blocks, copy_slots and move (both ways) give, byte for byte, what a reference model
 *     written here from the layout's definition says, on two layouts (one 24-byte slots, one
 *     16-byte aligned), and touch nothing else;
 *   - tickets go 1, 2, 3, ... across all operations, n == 0 queues nothing and gives ticket 0,
 *     done() reports the last completed one, wait() blocks until it and refuses one never
 *     issued;
 *   - the threaded backend runs operations in the order issued: a chain of dependent 4 MiB
 *     operations queued without waiting ends with the bytes the model computes; done() is never
 *     ahead of what was issued, never goes back, and a ticket it reports has its bytes in place
 *     while later ones are still running;
 *   - the lists are read during the call only (the caller overwrites and frees them at once);
 *   - done_fd wakes an event loop that reads it then asks done(), until the last ticket, with
 *     no lost wakeup;
 *   - bad arguments fail with -EINVAL, queue nothing (the next ticket is the previous + 1) and
 *     change no byte;
 *   - destroy() with operations still queued runs them first (their host buffers hold the
 *     result), and accepts a pool that create() failed on;
 *   - host_alloc()/host_free() give usable memory, and refuse 0 bytes.
 *
 * Most tests are loop tests: _i picks the backend (and the layout), so every check runs on both.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "daemon/backend/backend.h"
#include "proto/memfd.h"
#include "tests/check-runner.h"
#include "tests/unit/memfd-probe.h"

static const struct backend_ops *const backends[] = { &backend_host, &backend_host_threaded };
#define NBACKENDS 2

/* A pool's in-block layout, as daemon/server/pool.c derives it from the model. */
struct layout {
	const char *name;
	uint32_t layers, block_tokens;
	uint64_t slot_stride; /* kv_heads * head_dim * element_bytes */
};

static const struct layout layouts[] = {
	/* 3 layers, 24-byte slots (kv_heads 3, head_dim 4, 2 bytes), 5 tokens: 720-byte blocks. */
	{ "odd", 3, 5, 24 },
	/* 3 layers, 48-byte slots (3 x 8 x 2), 7 tokens: 2016-byte blocks, strides 16-aligned. */
	{ "aligned16", 3, 7, 48 },
};
#define NLAYOUTS 2

/* 4 layers, 32 KiB slots, 16 tokens: 4 MiB blocks, long enough that the thread falls behind. */
static const struct layout big = { "big", 4, 16, 32768 };

static uint64_t kv_stride_of(const struct layout *g)
{
	return g->slot_stride * g->block_tokens;
}

static uint64_t layer_stride_of(const struct layout *g)
{
	return 2 * kv_stride_of(g);
}

static uint64_t block_bytes_of(const struct layout *g)
{
	return layer_stride_of(g) * g->layers;
}

#define CAP 8 /* blocks per pool */

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Bytes that differ from any other seed's at (nearly) every offset. */
static void fill(uint8_t *d, uint64_t n, uint64_t seed)
{
	for (uint64_t i = 0; i < n; i += 8) {
		uint64_t v = mix((seed << 40) ^ i);

		memcpy(d + i, &v, n - i < 8 ? n - i : 8);
	}
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n);

	ck_assert_ptr_nonnull(p);
	return p;
}

/*
 * A pool of CAP blocks of layout g, laid out the way the daemon does it: create(), then the
 * layout fields set by the caller.
 */
static void pool_open(const struct backend_ops *ops, const struct layout *g,
		      struct backend_pool *p)
{
	uint64_t bb = block_bytes_of(g);

	*p = (struct backend_pool){ .fd = -1, .done_fd = -1 };
	ck_assert_int_eq(ops->create("test", CAP * bb, bb, 0, p), 0);
	ck_assert_ptr_eq(p->ops, ops);
	ck_assert_ptr_nonnull(p->base);
	ck_assert_int_ge(p->fd, 0);
	ck_assert_int_ge(p->done_fd, 0);
	ck_assert_uint_eq(p->block_bytes, bb);
	ck_assert_uint_ge(p->bytes, CAP * bb);
	p->layers = g->layers;
	p->slot_stride = g->slot_stride;
	p->kv_stride = kv_stride_of(g);
	p->layer_stride = layer_stride_of(g);
}

static void *halloc(struct backend_pool *p, uint64_t bytes)
{
	void *mem = NULL;

	ck_assert_int_eq(p->ops->host_alloc(p, bytes, &mem), 0);
	ck_assert_ptr_nonnull(mem);
	return mem;
}

static uint64_t done_of(struct backend_pool *p)
{
	uint64_t t = UINT64_MAX;

	ck_assert_int_eq(p->ops->done(p, &t), 0);
	return t;
}

/*
 * Compares n bytes, naming the first difference by block, layer, K/V, slot and byte when the
 * buffer is pool-shaped (g non-NULL), so that a failure says which part of the layout is wrong.
 */
static void expect_bytes(const uint8_t *got, const uint8_t *want, uint64_t n,
			 const struct layout *g, const char *what)
{
	uint64_t i;

	if (!memcmp(got, want, n))
		return;
	for (i = 0; got[i] == want[i]; i++)
		;
	if (g) {
		uint64_t bb = block_bytes_of(g), off = i % bb;
		uint64_t l = off / layer_stride_of(g), in_l = off % layer_stride_of(g);
		uint64_t kv = in_l / kv_stride_of(g), in_kv = in_l % kv_stride_of(g);

		ck_abort_msg("%s (%s): byte %llu differs (block %llu layer %llu %s slot %llu "
			     "byte %llu): got 0x%02x, want 0x%02x",
			     what, g->name, (unsigned long long)i, (unsigned long long)(i / bb),
			     (unsigned long long)l, kv ? "V" : "K",
			     (unsigned long long)(in_kv / g->slot_stride),
			     (unsigned long long)(in_kv % g->slot_stride), got[i], want[i]);
	}
	ck_abort_msg("%s: byte %llu differs: got 0x%02x, want 0x%02x", what, (unsigned long long)i,
		     got[i], want[i]);
}

/* ---- the reference model ------------------------------------------------------------------ */

/*
 * What the pool's bytes must be, computed from the layout's definition alone: slot s of layer
 * l's K (kv 0) or V (kv 1) in block b is slot_stride bytes at
 * b * block_bytes + l * layer_stride + kv * kv_stride + s * slot_stride.
 */
struct model {
	const struct layout *g;
	uint8_t *bytes; /* CAP blocks */
};

static uint8_t *model_slot(struct model *m, uint32_t b, uint32_t l, uint32_t kv, uint32_t s)
{
	const struct layout *g = m->g;

	return m->bytes + b * block_bytes_of(g) + l * layer_stride_of(g) + kv * kv_stride_of(g) +
	       s * g->slot_stride;
}

static uint8_t *model_block(struct model *m, uint32_t b)
{
	return m->bytes + b * block_bytes_of(m->g);
}

static void model_init(struct model *m, const struct layout *g)
{
	m->g = g;
	m->bytes = calloc(CAP, block_bytes_of(g));
	ck_assert_ptr_nonnull(m->bytes);
}

/* Every block of the pool and of the model gets its own pattern (seed + block). */
static void fill_pool(struct backend_pool *p, struct model *m, uint64_t seed)
{
	uint64_t bb = block_bytes_of(m->g);

	for (uint32_t b = 0; b < CAP; b++)
		fill(model_block(m, b), bb, seed + b);
	memcpy(p->base, m->bytes, CAP * bb);
}

static void model_copy_blocks(struct model *m, const struct backend_block_copy *c, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		memcpy(model_block(m, c[i].dst), model_block(m, c[i].src), block_bytes_of(m->g));
}

static void model_copy_slots(struct model *m, const struct backend_slot_copy *c, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < m->g->layers; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				memcpy(model_slot(m, c[i].dst, l, kv, c[i].dst_slot),
				       model_slot(m, c[i].src, l, kv, c[i].src_slot),
				       m->g->slot_stride);
}

/* host[i] is the model's copy of the host buffer of entry i (the test's own shadow of it). */
static void model_move(struct model *m, enum backend_dir dir, const struct backend_move *mv,
		       uint8_t *const *host, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		if (dir == BACKEND_TO_HOST)
			memcpy(host[i], model_block(m, mv[i].block), block_bytes_of(m->g));
		else
			memcpy(model_block(m, mv[i].block), host[i], block_bytes_of(m->g));
	}
}

static void expect_pool(struct backend_pool *p, struct model *m, const char *what)
{
	expect_bytes(p->base, m->bytes, CAP * block_bytes_of(m->g), m->g, what);
}

/* ---- 1: a new pool ------------------------------------------------------------------------ */

/* _i: backend * NLAYOUTS + layout. */
START_TEST(test_new_pool_is_zero)
{
	const struct backend_ops *ops = backends[_i / NLAYOUTS];
	const struct layout *g = &layouts[_i % NLAYOUTS];
	uint64_t n = CAP * block_bytes_of(g), seals;
	struct backend_pool p;
	uint8_t *zero = calloc(1, n), *client;

	ck_assert_ptr_nonnull(zero);
	pool_open(ops, g, &p);
	ck_assert_str_eq(ops->name, "host");
	expect_bytes(p.base, zero, n, g, "new pool (daemon mapping)");
	/* A client maps the fd: the same zeros, and the daemon's writes show through it. */
	client = mmap(NULL, p.bytes, PROT_READ, MAP_SHARED, p.fd, 0);
	ck_assert_ptr_ne(client, MAP_FAILED);
	expect_bytes(client, zero, n, g, "new pool (client mapping)");
	((uint8_t *)p.base)[n - 1] = 0xa5;
	ck_assert_uint_eq(client[n - 1], 0xa5);
	/* Sealed: no client can shrink it under the others. */
	seals = (uint64_t)fcntl(p.fd, F_GET_SEALS);
	ck_assert_uint_eq(seals & (F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL),
			  F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
	ck_assert_int_lt(ftruncate(p.fd, 4096), 0);
	/* ...nor make it executable, where the kernel can promise that (MFD_NOEXEC_SEAL). */
	if (kernel_has_noexec_seal())
		ck_assert_msg(seals & F_SEAL_EXEC, "pool memfd: no F_SEAL_EXEC (seals %#llx)",
			      (unsigned long long)seals);
	else
		fprintf(stderr, "pool memfd: this kernel has no MFD_NOEXEC_SEAL (Linux 6.3): "
			"F_SEAL_EXEC not checked\n");
	/* done_fd: an eventfd the event loop polls, non-blocking and close-on-exec. */
	ck_assert(fcntl(p.done_fd, F_GETFL) & O_NONBLOCK);
	ck_assert(fcntl(p.done_fd, F_GETFD) & FD_CLOEXEC);
	ck_assert_uint_eq(done_of(&p), 0);
	munmap(client, p.bytes);
	ops->destroy(&p);
	free(zero);
}
END_TEST

/* create() refuses what it cannot lay out, leaves *ret alone, and destroy() accepts the pool. */
START_TEST(test_create_fails_cleanly)
{
	const struct backend_ops *ops = backends[_i];
	static const uint64_t bad[][2] = { { 0, 720 }, { 720, 0 }, { 721, 720 }, { 720, 1440 } };

	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct backend_pool p, saved;

		memset(&p, 0x5a, sizeof(p));
		saved = p;
		ck_assert_int_eq(ops->create("bad", bad[i][0], bad[i][1], 0, &p), -EINVAL);
		ck_assert_msg(!memcmp(&p, &saved, sizeof(p)), "create %u touched *ret", i);
		/* The daemon's way: fds -1 before create, destroy whatever happened. */
		p = (struct backend_pool){ .fd = -1, .done_fd = -1 };
		ck_assert_int_eq(ops->create("bad", bad[i][0], bad[i][1], 0, &p), -EINVAL);
		ops->destroy(&p);
	}
}
END_TEST

/* ---- 2: what the operations do ------------------------------------------------------------ */

/*
 * Each operation on its own, waited for, then the whole pool and the host buffers compared with
 * the model: a copy that used the wrong stride, or touched a byte it should not, shows up.
 */
START_TEST(test_operations_match_model)
{
	const struct backend_ops *ops = backends[_i / NLAYOUTS];
	const struct layout *g = &layouts[_i % NLAYOUTS];
	const uint32_t T = g->block_tokens;
	uint64_t bb = block_bytes_of(g), t;
	struct backend_pool p;
	struct model m;
	uint8_t *h[2], *sh[2];

	pool_open(ops, g, &p);
	model_init(&m, g);
	fill_pool(&p, &m, 100);
	for (int i = 0; i < 2; i++) {
		h[i] = halloc(&p, bb);
		sh[i] = xmalloc(bb);
		fill(h[i], bb, 200 + i);
		memcpy(sh[i], h[i], bb);
	}

	/* Two whole blocks in one call; blocks 0 and 3 are read, 1 and 2 written. */
	{
		const struct backend_block_copy c[] = { { .dst = 1, .src = 0 },
							{ .dst = 2, .src = 3 } };

		ck_assert_int_eq(ops->copy_blocks(&p, c, 2, &t), 0);
		ck_assert_int_eq(ops->wait(&p, t), 0);
		model_copy_blocks(&m, c, 2);
		expect_pool(&p, &m, "copy_blocks");
	}
	/* Slots: first to last, last to first, a middle one to another block's middle. */
	{
		const struct backend_slot_copy c[] = {
			{ .dst = 4, .dst_slot = 0, .src = 5, .src_slot = T - 1 },
			{ .dst = 4, .dst_slot = T - 1, .src = 5, .src_slot = 0 },
			{ .dst = 6, .dst_slot = 2, .src = 0, .src_slot = 3 },
			{ .dst = 6, .dst_slot = 1, .src = 5, .src_slot = 1 },
		};

		ck_assert_int_eq(ops->copy_slots(&p, c, 4, &t), 0);
		ck_assert_int_eq(ops->wait(&p, t), 0);
		model_copy_slots(&m, c, 4);
		expect_pool(&p, &m, "copy_slots");
	}
	/* Swap out two blocks, one of them just written by copy_slots. */
	{
		const struct backend_move mv[] = { { .block = 7, .host = h[0] },
						   { .block = 4, .host = h[1] } };

		ck_assert_int_eq(ops->move(&p, BACKEND_TO_HOST, mv, 2, &t), 0);
		ck_assert_int_eq(ops->wait(&p, t), 0);
		model_move(&m, BACKEND_TO_HOST, mv, sh, 2);
		expect_pool(&p, &m, "move to host (pool side)");
		expect_bytes(h[0], sh[0], bb, NULL, "move to host: buffer 0");
		expect_bytes(h[1], sh[1], bb, NULL, "move to host: buffer 1");
	}
	/* Change the host copies, then swap them in crosswise. */
	{
		const struct backend_move mv[] = { { .block = 0, .host = h[1] },
						   { .block = 7, .host = h[0] } };
		uint8_t *shx[] = { sh[1], sh[0] };

		for (int i = 0; i < 2; i++) {
			fill(h[i], bb, 300 + i);
			memcpy(sh[i], h[i], bb);
		}
		ck_assert_int_eq(ops->move(&p, BACKEND_FROM_HOST, mv, 2, &t), 0);
		ck_assert_int_eq(ops->wait(&p, t), 0);
		model_move(&m, BACKEND_FROM_HOST, mv, shx, 2);
		expect_pool(&p, &m, "move from host");
		/* Swap-in leaves the host side as it was. */
		expect_bytes(h[0], sh[0], bb, NULL, "move from host: buffer 0");
		expect_bytes(h[1], sh[1], bb, NULL, "move from host: buffer 1");
	}
	for (int i = 0; i < 2; i++) {
		ops->host_free(&p, h[i], bb);
		free(sh[i]);
	}
	ops->destroy(&p);
	free(m.bytes);
}
END_TEST

/* ---- 3: tickets --------------------------------------------------------------------------- */

START_TEST(test_tickets)
{
	const struct backend_ops *ops = backends[_i];
	const struct layout *g = &layouts[0];
	uint64_t bb = block_bytes_of(g), t = 77, last = 0;
	const struct backend_block_copy bc = { .dst = 1, .src = 0 };
	const struct backend_slot_copy sc = { .dst = 2, .dst_slot = 1, .src = 3, .src_slot = 4 };
	struct backend_move mv = { .block = 5 };
	struct backend_pool p;

	pool_open(ops, g, &p);
	mv.host = halloc(&p, bb);
	/* Nothing issued yet: 0 is complete, 1 was never issued. */
	ck_assert_int_eq(ops->wait(&p, 0), 0);
	ck_assert_int_eq(ops->wait(&p, 1), -EINVAL);
	ck_assert_uint_eq(done_of(&p), 0);

	/* n == 0 queues nothing, whatever the operation, and does not use up a ticket. */
	ck_assert_int_eq(ops->copy_blocks(&p, &bc, 0, &t), 0);
	ck_assert_uint_eq(t, 0);
	t = 77;
	ck_assert_int_eq(ops->copy_slots(&p, &sc, 0, &t), 0);
	ck_assert_uint_eq(t, 0);
	t = 77;
	ck_assert_int_eq(ops->move(&p, BACKEND_TO_HOST, &mv, 0, &t), 0);
	ck_assert_uint_eq(t, 0);
	ck_assert_int_eq(ops->wait(&p, 1), -EINVAL);

	/* Mixed operations, none waited for: 1, 2, 3, ... with zeros in between taking none. */
	for (int round = 0; round < 5; round++) {
		ck_assert_int_eq(ops->copy_blocks(&p, &bc, 1, &t), 0);
		ck_assert_uint_eq(t, ++last);
		ck_assert_int_eq(ops->move(&p, BACKEND_TO_HOST, &mv, 0, &t), 0);
		ck_assert_uint_eq(t, 0);
		ck_assert_int_eq(ops->copy_slots(&p, &sc, 1, &t), 0);
		ck_assert_uint_eq(t, ++last);
		ck_assert_int_eq(ops->move(&p, round % 2 ? BACKEND_FROM_HOST : BACKEND_TO_HOST, &mv,
					   1, &t), 0);
		ck_assert_uint_eq(t, ++last);
		/* Never ahead of what was issued. */
		ck_assert_uint_le(done_of(&p), last);
	}
	ck_assert_int_eq(ops->wait(&p, last + 1), -EINVAL);
	ck_assert_int_eq(ops->wait(&p, UINT64_MAX), -EINVAL);
	ck_assert_int_eq(ops->wait(&p, last), 0);
	ck_assert_uint_eq(done_of(&p), last);
	/* Waiting for an earlier ticket, or again, or for 0, returns at once. */
	ck_assert_int_eq(ops->wait(&p, 1), 0);
	ck_assert_int_eq(ops->wait(&p, last), 0);
	ck_assert_int_eq(ops->wait(&p, 0), 0);
	ck_assert_int_eq(ops->wait(&p, last + 1), -EINVAL);
	/* The count goes on from where it was. */
	ck_assert_int_eq(ops->copy_blocks(&p, &bc, 1, &t), 0);
	ck_assert_uint_eq(t, last + 1);
	ck_assert_int_eq(ops->wait(&p, t), 0);
	ck_assert_uint_eq(done_of(&p), last + 1);
	ops->host_free(&p, mv.host, bb);
	ops->destroy(&p);
}
END_TEST

/* ---- 4: order ----------------------------------------------------------------------------- */

/*
 * Rounds of four operations, each reading what the one before wrote, queued back to back on
 * 4 MiB blocks without a wait: swap block a out to H, H into block b, b copied whole to c, some
 * of c's slots gathered into d; the next round starts from d.  Run out of order, or with one
 * skipped, the bytes differ from the model's.  done(), polled as the thread works, never goes
 * back and never passes the last ticket issued.
 */
START_TEST(test_order_of_dependent_operations)
{
	const struct backend_ops *ops = backends[_i];
	const struct layout *g = &big;
	const uint32_t T = g->block_tokens, rounds = 12;
	uint64_t bb = block_bytes_of(g), t, last = 0, seen = 0;
	struct backend_pool p;
	struct model m;
	uint8_t *h, *sh;
	uint32_t a = 0;
	double until;

	pool_open(ops, g, &p);
	model_init(&m, g);
	fill_pool(&p, &m, 1000);
	h = halloc(&p, bb);
	sh = xmalloc(bb);
	fill(h, bb, 999);
	memcpy(sh, h, bb);

	for (uint32_t r = 0; r < rounds; r++) {
		uint32_t b = (a + 1) % CAP, c = (a + 2) % CAP, d = (a + 3) % CAP;
		const struct backend_move out = { .block = a, .host = h };
		const struct backend_move in = { .block = b, .host = h };
		const struct backend_block_copy bc = { .dst = c, .src = b };
		struct backend_slot_copy sc[3];

		/* d's slots from c, shifted by the round so that each round's gather differs. */
		for (uint32_t i = 0; i < 3; i++)
			sc[i] = (struct backend_slot_copy){ .dst = d,
							    .dst_slot = (r + 5 * i) % T,
							    .src = c,
							    .src_slot = (r + 3 * i + 1) % T };
		ck_assert_int_eq(ops->move(&p, BACKEND_TO_HOST, &out, 1, &t), 0);
		ck_assert_uint_eq(t, ++last);
		ck_assert_int_eq(ops->move(&p, BACKEND_FROM_HOST, &in, 1, &t), 0);
		ck_assert_uint_eq(t, ++last);
		ck_assert_int_eq(ops->copy_blocks(&p, &bc, 1, &t), 0);
		ck_assert_uint_eq(t, ++last);
		ck_assert_int_eq(ops->copy_slots(&p, sc, 3, &t), 0);
		ck_assert_uint_eq(t, ++last);
		model_move(&m, BACKEND_TO_HOST, &out, &sh, 1);
		model_move(&m, BACKEND_FROM_HOST, &in, &sh, 1);
		model_copy_blocks(&m, &bc, 1);
		model_copy_slots(&m, sc, 3);
		/* The next round's swap-out reads this round's gather result. */
		a = d;
	}
	/* The thread may be behind (it should be); it is never ahead, and never goes back. */
	until = now_s() + 10;
	while (seen < last) {
		uint64_t now = done_of(&p);

		ck_assert_uint_ge(now, seen);
		ck_assert_uint_le(now, last);
		seen = now;
		if (now_s() > until)
			ck_abort_msg("done() stuck at %llu of %llu", (unsigned long long)seen,
				     (unsigned long long)last);
		sched_yield();
	}
	ck_assert_int_eq(ops->wait(&p, last), 0);
	ck_assert_uint_eq(done_of(&p), last);
	expect_pool(&p, &m, "dependent chain");
	expect_bytes(h, sh, bb, NULL, "dependent chain: host buffer");
	ops->host_free(&p, h, bb);
	free(sh);
	ops->destroy(&p);
	free(m.bytes);
}
END_TEST

/*
 * A ticket done() reports is really done: as the thread works through a batch of 4 MiB
 * swap-outs, each polled done() has every buffer up to it filled, while the later ones are still
 * being written.  (A done() that counted an operation before running it, or reported what was
 * issued, passes the loop above but fails here.)
 */
START_TEST(test_done_means_done)
{
	const struct backend_ops *ops = backends[_i];
	const struct layout *g = &big;
	enum { N = 12 };
	uint64_t bb = block_bytes_of(g), t, checked = 0;
	struct backend_pool p;
	struct model m;
	uint8_t *h[N];
	struct backend_move mv[N];
	double until;

	pool_open(ops, g, &p);
	model_init(&m, g);
	fill_pool(&p, &m, 6000);
	for (uint32_t k = 0; k < N; k++) {
		h[k] = halloc(&p, bb);
		memset(h[k], 0xee, bb);
		mv[k] = (struct backend_move){ .block = k % CAP, .host = h[k] };
	}
	for (uint32_t k = 0; k < N; k++) {
		ck_assert_int_eq(ops->move(&p, BACKEND_TO_HOST, &mv[k], 1, &t), 0);
		ck_assert_uint_eq(t, k + 1);
	}
	until = now_s() + 10;
	while (checked < N) {
		uint64_t now = done_of(&p);

		ck_assert_uint_ge(now, checked);
		ck_assert_uint_le(now, N);
		/* Ticket k + 1 complete: buffer k is the caller's again, and holds its block. */
		for (; checked < now; checked++) {
			char what[64];

			snprintf(what, sizeof(what), "buffer of ticket %llu once done() said so",
				 (unsigned long long)checked + 1);
			expect_bytes(h[checked], model_block(&m, mv[checked].block), bb, NULL,
				     what);
		}
		if (now_s() > until)
			ck_abort_msg("done() stuck at %llu of %d", (unsigned long long)checked, N);
	}
	for (uint32_t k = 0; k < N; k++)
		ops->host_free(&p, h[k], bb);
	ops->destroy(&p);
	free(m.bytes);
}
END_TEST

/* ---- 5: the lists are the caller's again when the call returns ------------------------------ */

/*
 * Behind 48 MiB of copies that keep the thread busy, three operations whose lists are
 * overwritten with other valid entries and freed as soon as each call returns.  The result is
 * what the lists said when passed; a backend that read them later does other copies (or, under
 * ASan, a use after free).
 */
START_TEST(test_lists_are_copied)
{
	const struct backend_ops *ops = backends[_i];
	const struct layout *g = &big;
	uint64_t bb = block_bytes_of(g), t;
	struct backend_pool p;
	struct model m;
	uint8_t *h[2], *sh[2];
	struct backend_block_copy *bc;
	struct backend_slot_copy *sc;
	struct backend_move *mv;

	pool_open(ops, g, &p);
	model_init(&m, g);
	fill_pool(&p, &m, 2000);
	for (int i = 0; i < 2; i++) {
		h[i] = halloc(&p, bb);
		sh[i] = xmalloc(bb);
		fill(h[i], bb, 2100 + i);
		memcpy(sh[i], h[i], bb);
	}
	/* The ballast: copies of blocks 0..2 over 3..5, several times over. */
	for (int k = 0; k < 4; k++) {
		const struct backend_block_copy ballast[] = { { 3, 0 }, { 4, 1 }, { 5, 2 } };

		ck_assert_int_eq(ops->copy_blocks(&p, ballast, 3, &t), 0);
		model_copy_blocks(&m, ballast, 3);
	}

	bc = xmalloc(2 * sizeof(*bc));
	bc[0] = (struct backend_block_copy){ .dst = 6, .src = 0 };
	bc[1] = (struct backend_block_copy){ .dst = 7, .src = 1 };
	ck_assert_int_eq(ops->copy_blocks(&p, bc, 2, &t), 0);
	model_copy_blocks(&m, bc, 2);
	bc[0] = (struct backend_block_copy){ .dst = 0, .src = 6 };
	bc[1] = (struct backend_block_copy){ .dst = 1, .src = 7 };
	free(bc);

	sc = xmalloc(2 * sizeof(*sc));
	sc[0] = (struct backend_slot_copy){ .dst = 2, .dst_slot = 0, .src = 6, .src_slot = 9 };
	sc[1] = (struct backend_slot_copy){ .dst = 2, .dst_slot = 15, .src = 7, .src_slot = 4 };
	ck_assert_int_eq(ops->copy_slots(&p, sc, 2, &t), 0);
	model_copy_slots(&m, sc, 2);
	sc[0] = (struct backend_slot_copy){ .dst = 6, .dst_slot = 9, .src = 2, .src_slot = 0 };
	sc[1] = (struct backend_slot_copy){ .dst = 7, .dst_slot = 4, .src = 2, .src_slot = 15 };
	free(sc);

	mv = xmalloc(2 * sizeof(*mv));
	mv[0] = (struct backend_move){ .block = 2, .host = h[0] };
	mv[1] = (struct backend_move){ .block = 3, .host = h[1] };
	ck_assert_int_eq(ops->move(&p, BACKEND_TO_HOST, mv, 2, &t), 0);
	model_move(&m, BACKEND_TO_HOST, mv, sh, 2);
	mv[0] = (struct backend_move){ .block = 4, .host = h[1] };
	mv[1] = (struct backend_move){ .block = 5, .host = h[0] };
	free(mv);

	ck_assert_uint_eq(t, 4 + 3);
	ck_assert_int_eq(ops->wait(&p, t), 0);
	expect_pool(&p, &m, "lists overwritten after the call");
	expect_bytes(h[0], sh[0], bb, NULL, "lists overwritten: buffer 0");
	expect_bytes(h[1], sh[1], bb, NULL, "lists overwritten: buffer 1");
	for (int i = 0; i < 2; i++) {
		ops->host_free(&p, h[i], bb);
		free(sh[i]);
	}
	ops->destroy(&p);
	free(m.bytes);
}
END_TEST

/* ---- 6: done_fd --------------------------------------------------------------------------- */

/* Reads done_fd's counter: 0 when there is nothing to read (EAGAIN: it never blocks). */
static uint64_t drain(int fd)
{
	uint64_t v = 0;
	ssize_t n = read(fd, &v, sizeof(v));

	if (n < 0) {
		ck_assert_int_eq(errno, EAGAIN);
		return 0;
	}
	ck_assert_int_eq(n, (ssize_t)sizeof(v));
	ck_assert_uint_ge(v, 1);
	return v;
}

/*
 * The threaded backend, as the daemon's event loop sees it: poll done_fd, read it, ask done();
 * again until the last ticket.  A completion that wrote done_fd before counting itself would
 * leave the loop asleep with work done (the 5 s poll times out).
 */
START_TEST(test_done_fd_threaded)
{
	const struct backend_ops *ops = &backend_host_threaded;
	const struct layout *g = &big;
	struct pollfd pfd;
	uint64_t t, seen = 0, wakeups = 0;
	struct backend_pool p;
	const struct backend_block_copy one = { .dst = 1, .src = 0 };

	pool_open(ops, g, &p);
	pfd = (struct pollfd){ .fd = p.done_fd, .events = POLLIN };
	/* Nothing completed: nothing to read, and reading does not block. */
	ck_assert_uint_eq(drain(p.done_fd), 0);

	/* One operation: done_fd becomes readable, and then done() has it. */
	ck_assert_int_eq(ops->copy_blocks(&p, &one, 1, &t), 0);
	ck_assert_uint_eq(t, 1);
	ck_assert_int_eq(poll(&pfd, 1, 5000), 1);
	ck_assert(pfd.revents & POLLIN);
	ck_assert_uint_ge(drain(p.done_fd), 1);
	ck_assert_uint_eq(done_of(&p), 1);

	/* A batch: the loop, until done() says the last one. */
	for (int k = 0; k < 24; k++) {
		const struct backend_block_copy c[] = { { .dst = 2 + k % 3, .src = 5 + k % 3 } };

		ck_assert_int_eq(ops->copy_blocks(&p, c, 1, &t), 0);
	}
	ck_assert_uint_eq(t, 25);
	while (seen < t) {
		uint64_t now;

		pfd.revents = 0;
		ck_assert_msg(poll(&pfd, 1, 5000) == 1,
			      "done_fd never became readable: done() at %llu of %llu",
			      (unsigned long long)seen, (unsigned long long)t);
		wakeups += drain(p.done_fd);
		now = done_of(&p);
		ck_assert_uint_ge(now, seen);
		ck_assert_uint_le(now, t);
		seen = now;
	}
	ck_assert_uint_ge(wakeups, 1);
	ops->destroy(&p);
}
END_TEST

/* backend_host: every ticket is complete when its call returns; nothing is left to wait for. */
START_TEST(test_done_immediate_host)
{
	const struct backend_ops *ops = &backend_host;
	const struct layout *g = &layouts[1];
	uint64_t bb = block_bytes_of(g), t;
	struct backend_pool p;
	const struct backend_block_copy bc = { .dst = 1, .src = 0 };
	const struct backend_slot_copy sc = { .dst = 3, .dst_slot = 0, .src = 2, .src_slot = 6 };
	struct backend_move mv = { .block = 4 };

	pool_open(ops, g, &p);
	mv.host = halloc(&p, bb);
	for (uint64_t k = 1; k <= 20; k++) {
		switch (k % 4) {
		case 0:
			ck_assert_int_eq(ops->copy_blocks(&p, &bc, 1, &t), 0);
			break;
		case 1:
			ck_assert_int_eq(ops->copy_slots(&p, &sc, 1, &t), 0);
			break;
		case 2:
			ck_assert_int_eq(ops->move(&p, BACKEND_TO_HOST, &mv, 1, &t), 0);
			break;
		default:
			ck_assert_int_eq(ops->move(&p, BACKEND_FROM_HOST, &mv, 1, &t), 0);
			break;
		}
		ck_assert_uint_eq(t, k);
		ck_assert_uint_eq(done_of(&p), k);
	}
	ops->host_free(&p, mv.host, bb);
	ops->destroy(&p);
}
END_TEST

/* ---- 7: bad arguments --------------------------------------------------------------------- */

/*
 * Every list has a good entry first and the bad one after it: refused whole, no byte of the
 * pool or of the host buffer changed (also once the queue has run), no ticket used up.
 */
START_TEST(test_bad_arguments)
{
	const struct backend_ops *ops = backends[_i / NLAYOUTS];
	const struct layout *g = &layouts[_i % NLAYOUTS];
	const uint32_t T = g->block_tokens;
	uint64_t bb = block_bytes_of(g), t, last;
	struct backend_pool p;
	struct model m;
	uint8_t *h, *sh;
	const struct backend_block_copy good_bc = { .dst = 1, .src = 0 };
	const struct backend_slot_copy good_sc = { .dst = 3, .dst_slot = 1, .src = 2,
						   .src_slot = 2 };
	const struct backend_block_copy bad_bc[][2] = {
		{ good_bc, { .dst = CAP, .src = 2 } },
		{ good_bc, { .dst = 2, .src = CAP } },
		{ good_bc, { .dst = UINT32_MAX, .src = 2 } },
		{ good_bc, { .dst = 2, .src = UINT32_MAX } },
	};
	const struct backend_slot_copy bad_sc[][2] = {
		{ good_sc, { .dst = CAP, .dst_slot = 0, .src = 4, .src_slot = 0 } },
		{ good_sc, { .dst = 5, .dst_slot = 0, .src = CAP, .src_slot = 0 } },
		{ good_sc, { .dst = 5, .dst_slot = T, .src = 4, .src_slot = 0 } },
		{ good_sc, { .dst = 5, .dst_slot = 0, .src = 4, .src_slot = T } },
		{ good_sc, { .dst = 5, .dst_slot = UINT32_MAX, .src = 4, .src_slot = 0 } },
		{ good_sc, { .dst = 5, .dst_slot = 0, .src = 4, .src_slot = UINT32_MAX } },
	};
	struct backend_move bad_mv[3][2];

	pool_open(ops, g, &p);
	model_init(&m, g);
	fill_pool(&p, &m, 3000);
	h = halloc(&p, bb);
	sh = xmalloc(bb);
	fill(h, bb, 3100);
	memcpy(sh, h, bb);
	for (int i = 0; i < 3; i++)
		bad_mv[i][0] = (struct backend_move){ .block = 6, .host = h };
	bad_mv[0][1] = (struct backend_move){ .block = CAP, .host = h };
	bad_mv[1][1] = (struct backend_move){ .block = UINT32_MAX, .host = h };
	bad_mv[2][1] = (struct backend_move){ .block = 7, .host = NULL };

	/* A good operation first, so that "nothing queued" is seen as the count going on. */
	ck_assert_int_eq(ops->copy_blocks(&p, &good_bc, 1, &last), 0);
	ck_assert_uint_eq(last, 1);
	model_copy_blocks(&m, &good_bc, 1);

	for (unsigned i = 0; i < sizeof(bad_bc) / sizeof(bad_bc[0]); i++)
		ck_assert_msg(ops->copy_blocks(&p, bad_bc[i], 2, &t) == -EINVAL,
			      "copy_blocks case %u not refused", i);
	for (unsigned i = 0; i < sizeof(bad_sc) / sizeof(bad_sc[0]); i++)
		ck_assert_msg(ops->copy_slots(&p, bad_sc[i], 2, &t) == -EINVAL,
			      "copy_slots case %u not refused", i);
	for (unsigned i = 0; i < 3; i++) {
		ck_assert_msg(ops->move(&p, BACKEND_TO_HOST, bad_mv[i], 2, &t) == -EINVAL,
			      "move to host case %u not refused", i);
		ck_assert_msg(ops->move(&p, BACKEND_FROM_HOST, bad_mv[i], 2, &t) == -EINVAL,
			      "move from host case %u not refused", i);
	}
	/* A bad entry alone, too. */
	ck_assert_int_eq(ops->move(&p, BACKEND_FROM_HOST, &bad_mv[2][1], 1, &t), -EINVAL);
	ck_assert_int_eq(ops->copy_slots(&p, &bad_sc[2][1], 1, &t), -EINVAL);

	/* Nothing was queued: the next ticket is 2, and after it the bytes are the model's. */
	ck_assert_int_eq(ops->wait(&p, 2), -EINVAL);
	ck_assert_int_eq(ops->copy_slots(&p, &good_sc, 1, &t), 0);
	ck_assert_uint_eq(t, last + 1);
	model_copy_slots(&m, &good_sc, 1);
	ck_assert_int_eq(ops->wait(&p, t), 0);
	ck_assert_uint_eq(done_of(&p), t);
	expect_pool(&p, &m, "after refused operations");
	expect_bytes(h, sh, bb, NULL, "host buffer after refused moves");
	ops->host_free(&p, h, bb);
	free(sh);
	ops->destroy(&p);
	free(m.bytes);
}
END_TEST

/* ---- 8: destroy with work queued ---------------------------------------------------------- */

/*
 * A batch of 4 MiB copies and swap-outs queued, then destroy() at once: it runs them all before
 * freeing the pool, so the host buffers (plain memory of the test's, which outlives the pool)
 * hold what the model says.  Under the sanitizers build, a job run on freed memory or leaked
 * shows up too.
 */
START_TEST(test_destroy_with_work_queued)
{
	const struct backend_ops *ops = backends[_i];
	const struct layout *g = &big;
	uint64_t bb = block_bytes_of(g), t;
	struct backend_pool p;
	struct model m;
	uint8_t *h[CAP], *sh[CAP];
	struct backend_block_copy bc[6];
	struct backend_move mv[CAP];

	pool_open(ops, g, &p);
	model_init(&m, g);
	fill_pool(&p, &m, 4000);
	for (uint32_t b = 0; b < CAP; b++) {
		h[b] = aligned_alloc(64, bb);
		ck_assert_ptr_nonnull(h[b]);
		sh[b] = xmalloc(bb);
		memset(h[b], 0xee, bb);
		memset(sh[b], 0xee, bb);
	}
	/*
	 * A chain of copies (block k to k + 1), then every block out, the last of them in its own
	 * operation.  The lists are made first and the model run after destroy(), so that nothing
	 * between the calls gives the thread time to catch up.
	 */
	for (uint32_t k = 0; k < 6; k++)
		bc[k] = (struct backend_block_copy){ .dst = k + 1, .src = k };
	for (uint32_t b = 0; b < CAP; b++)
		mv[b] = (struct backend_move){ .block = b, .host = h[b] };
	for (uint32_t k = 0; k < 6; k++)
		ck_assert_int_eq(ops->copy_blocks(&p, &bc[k], 1, &t), 0);
	ck_assert_int_eq(ops->move(&p, BACKEND_TO_HOST, mv, CAP - 1, &t), 0);
	ck_assert_int_eq(ops->move(&p, BACKEND_TO_HOST, mv + CAP - 1, 1, &t), 0);
	ops->destroy(&p);
	ck_assert_uint_eq(t, 8);
	for (uint32_t k = 0; k < 6; k++)
		model_copy_blocks(&m, &bc[k], 1);
	model_move(&m, BACKEND_TO_HOST, mv, sh, CAP);

	for (uint32_t b = 0; b < CAP; b++) {
		char what[64];

		snprintf(what, sizeof(what), "host buffer %u after destroy", b);
		expect_bytes(h[b], sh[b], bb, NULL, what);
		free(h[b]);
		free(sh[b]);
	}
	free(m.bytes);
}
END_TEST

/* ---- 9: host memory ----------------------------------------------------------------------- */

START_TEST(test_host_alloc)
{
	const struct backend_ops *ops = backends[_i];
	static const uint64_t sizes[] = { 1, 16, 4095, 4097, 1 << 20 };
	struct backend_pool p;
	void *mem = NULL;

	pool_open(ops, &layouts[0], &p);
	for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		uint8_t *want = xmalloc(sizes[i]);

		mem = NULL;
		ck_assert_int_eq(ops->host_alloc(&p, sizes[i], &mem), 0);
		ck_assert_ptr_nonnull(mem);
		/* Moves want 16-byte aligned host memory when slot_stride is. */
		ck_assert_uint_eq((uintptr_t)mem % 16, 0);
		/* Every byte is usable and keeps what was written. */
		fill(want, sizes[i], 5000 + i);
		memcpy(mem, want, sizes[i]);
		expect_bytes(mem, want, sizes[i], NULL, "host_alloc memory");
		ops->host_free(&p, mem, sizes[i]);
		free(want);
	}
	mem = NULL;
	ck_assert_int_eq(ops->host_alloc(&p, 0, &mem), -EINVAL);
	ops->destroy(&p);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("backend");
	TCase *ops = tcase_create("operations"), *queue = tcase_create("queue");

	/* Loop tests: _i over backends x layouts, or over backends. */
	tcase_add_loop_test(ops, test_new_pool_is_zero, 0, NBACKENDS * NLAYOUTS);
	tcase_add_loop_test(ops, test_create_fails_cleanly, 0, NBACKENDS);
	tcase_add_loop_test(ops, test_operations_match_model, 0, NBACKENDS * NLAYOUTS);
	tcase_add_loop_test(ops, test_bad_arguments, 0, NBACKENDS * NLAYOUTS);
	tcase_add_loop_test(ops, test_host_alloc, 0, NBACKENDS);
	tcase_add_loop_test(queue, test_tickets, 0, NBACKENDS);
	tcase_add_loop_test(queue, test_order_of_dependent_operations, 0, NBACKENDS);
	tcase_add_loop_test(queue, test_done_means_done, 0, NBACKENDS);
	tcase_add_loop_test(queue, test_lists_are_copied, 0, NBACKENDS);
	tcase_add_test(queue, test_done_fd_threaded);
	tcase_add_test(queue, test_done_immediate_host);
	tcase_add_loop_test(queue, test_destroy_with_work_queued, 0, NBACKENDS);
	suite_add_tcase(s, ops);
	suite_add_tcase(s, queue);
	return run_suite(s);
}

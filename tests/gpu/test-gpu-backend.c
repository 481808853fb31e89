/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend module against the host backend, in one process: the same pool contents,
 * the same copies (copy-on-write blocks, token gather), the same moves out to pinned host
 * memory and back in, through both swap paths (copy engines and kernel); afterwards the two
 * pools and the host buffers must be equal byte for byte.  Two layouts: a 16-byte one (the
 * vector path) and an odd one (bytes).  A host tier whose arena is the module's pinned memory,
 * as the daemon makes it for a GPU pool, takes blocks straight from the pool and gives them
 * back.  The device argument picks the device.  Exits 77 without a GPU.
 *
 * The host backend completes each operation in the call; the module only queues it, so the
 * device pool is read back only after wait() on its last ticket.  The queue's own contract is
 * checked along the way: tickets go up by one per operation whatever its kind, done() reports
 * the last one once it was waited for, done_fd becomes readable when a ticket completes, and
 * operations queued back to back without waiting see each other's results (stream order) --
 * long lists too, whose upload buffers later long lists must not overwrite too early.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>

#include "cuda/kernels.h" /* KVPD_INLINE: how long a list the module passes inline */
#include "daemon/backend/backend.h"
#include "daemon/tier/tier.h"
#include "tests/check-runner.h"
#include "tests/gpu/gpu.h"

struct geometry {
	uint32_t layers, kv_heads, head_dim, element_bytes, block_tokens, capacity;
};

struct pools {
	const struct backend_module *module;
	struct backend_pool dev, host;
	uint64_t block_bytes, bytes;
	uint64_t last; /* the device pool's last ticket */
	uint8_t *scratch; /* bytes, for reading the device pool back */
};

static void pools_open(struct pools *p, const struct geometry *g, const char *swap)
{
	const char *path = getenv("KVPAGED_TEST_CUDA_MODULE");
	uint64_t slot = (uint64_t)g->kv_heads * g->head_dim * g->element_bytes;
	char why[512];
	uint8_t *init;
	int r;

	ck_assert_msg(path && *path, "KVPAGED_TEST_CUDA_MODULE is not set");
	setenv("KVPAGED_TEST_CUDA_SWAP", swap, 1);
	*p = (struct pools){ .dev = { .fd = -1, .done_fd = -1 }, .host = { .fd = -1, .done_fd = -1 } };
	r = backend_module_load(path, 0, &p->module, why, sizeof(why));
	ck_assert_msg(r == 0, "%s", why);
	p->block_bytes = slot * g->block_tokens * 2 * g->layers;
	p->bytes = p->block_bytes * g->capacity;
	r = p->module->ops->create("test", p->bytes, p->block_bytes, 0, &p->dev);
	ck_assert_msg(r == 0, "create: %s", p->module->last_error());
	ck_assert_int_eq(backend_host.create("test", p->bytes, p->block_bytes, 0, &p->host), 0);
	ck_assert_ptr_null(p->dev.base);
	ck_assert(p->dev.device_base != 0);
	ck_assert_uint_ge(p->dev.bytes, p->bytes);
	ck_assert_int_ge(p->dev.fd, 0);
	ck_assert_int_ge(p->dev.done_fd, 0);
	for (struct backend_pool *b = &p->dev; b; b = b == &p->dev ? &p->host : NULL) {
		b->layers = g->layers;
		b->slot_stride = slot;
		b->kv_stride = slot * g->block_tokens;
		b->layer_stride = 2 * b->kv_stride;
	}
	gpu_use(0);
	p->scratch = malloc(p->bytes);
	ck_assert_ptr_nonnull(p->scratch);
	/* A new pool reads as zeros on both. */
	gpu_read(p->scratch, p->dev.device_base, p->bytes);
	ck_assert_int_eq(memcmp(p->scratch, p->host.base, p->bytes), 0);
	init = p->host.base;
	gpu_fill(init, p->bytes, 42);
	gpu_write(p->dev.device_base, init, p->bytes);
}

static void pools_close(struct pools *p)
{
	p->module->ops->destroy(&p->dev);
	backend_host.destroy(&p->host);
	free(p->scratch);
	unsetenv("KVPAGED_TEST_CUDA_SWAP");
}

/* A ticket the device pool issued: the next one, whatever the kind of operation. */
static void issued(struct pools *p, uint64_t ticket)
{
	ck_assert_msg(ticket == p->last + 1, "ticket %llu after %llu", (unsigned long long)ticket,
		      (unsigned long long)p->last);
	p->last = ticket;
}

/* Waits for everything the device pool was given; done() then says so, without error. */
static void wait_all(struct pools *p)
{
	uint64_t done = UINT64_MAX;

	ck_assert_int_eq(p->module->ops->wait(&p->dev, p->last), 0);
	ck_assert_int_eq(p->module->ops->done(&p->dev, &done), 0);
	ck_assert_uint_eq(done, p->last);
}

static void assert_same(struct pools *p, const char *after)
{
	wait_all(p);
	gpu_read(p->scratch, p->dev.device_base, p->bytes);
	for (uint64_t i = 0; i < p->bytes; i++)
		if (p->scratch[i] != ((uint8_t *)p->host.base)[i])
			ck_abort_msg("after %s: byte %llu (block %llu) differs: device %u, host %u",
				     after, (unsigned long long)i,
				     (unsigned long long)(i / p->block_bytes), p->scratch[i],
				     ((uint8_t *)p->host.base)[i]);
}

/* Queues on the device, does on the host (waited for: a threaded host backend may queue too). */
static void both_copy_blocks(struct pools *p, const struct backend_block_copy *c, uint32_t n)
{
	uint64_t t = 0, ht = 0;

	ck_assert_int_eq(p->module->ops->copy_blocks(&p->dev, c, n, &t), 0);
	issued(p, t);
	ck_assert_int_eq(backend_host.copy_blocks(&p->host, c, n, &ht), 0);
	ck_assert_int_eq(backend_host.wait(&p->host, ht), 0);
}

static void both_copy_slots(struct pools *p, const struct backend_slot_copy *c, uint32_t n)
{
	uint64_t t = 0, ht = 0;

	ck_assert_int_eq(p->module->ops->copy_slots(&p->dev, c, n, &t), 0);
	issued(p, t);
	ck_assert_int_eq(backend_host.copy_slots(&p->host, c, n, &ht), 0);
	ck_assert_int_eq(backend_host.wait(&p->host, ht), 0);
}

static void both_move(struct pools *p, enum backend_dir dir, const struct backend_move *m,
		      const struct backend_move *hm, uint32_t n)
{
	uint64_t t = 0, ht = 0;

	ck_assert_int_eq(p->module->ops->move(&p->dev, dir, m, n, &t), 0);
	issued(p, t);
	ck_assert_int_eq(backend_host.move(&p->host, dir, hm, n, &ht), 0);
	ck_assert_int_eq(backend_host.wait(&p->host, ht), 0);
}

/* Clears the completion eventfd, so that a poll after it sees later tickets only. */
static void drain(struct backend_pool *b)
{
	uint64_t v;

	(void)!read(b->done_fd, &v, sizeof(v)); /* non-blocking: EAGAIN when already clear */
}

/*
 * Waits for the completion eventfd (drained before ticket was issued), then for the ticket;
 * done() then reports it.
 */
static void wait_move(struct backend_pool *b, uint64_t ticket)
{
	struct pollfd pfd = { .fd = b->done_fd, .events = POLLIN };
	uint64_t v, done = 0;

	ck_assert_int_eq(poll(&pfd, 1, 10000), 1);
	ck_assert_int_eq(read(b->done_fd, &v, sizeof(v)), (ssize_t)sizeof(v));
	ck_assert_int_ge((int)v, 1);
	ck_assert_int_eq(b->ops->wait(b, ticket), 0);
	ck_assert_int_eq(b->ops->done(b, &done), 0);
	ck_assert_uint_ge(done, ticket);
}

/*
 * The host backend's tickets are complete when the call returns and it never writes done_fd
 * (daemon/backend/host.c), so only the device pool's done_fd is polled.
 */
static void host_wait(struct backend_pool *b, uint64_t ticket)
{
	uint64_t done = 0;

	ck_assert_int_eq(backend_host.wait(b, ticket), 0);
	ck_assert_int_eq(backend_host.done(b, &done), 0);
	ck_assert_uint_ge(done, ticket);
}

static void run_geometry(const struct geometry *g, const char *swap)
{
	const uint32_t cap = g->capacity, B = g->block_tokens;
	struct backend_block_copy bc[300];
	struct backend_slot_copy sc[600];
	struct backend_move m[300], hm[300];
	uint32_t nm = 0, ns = 0;
	uint64_t ticket, done;
	uint8_t *stage, *hstage;
	struct pools p;

	pools_open(&p, g, swap);

	/* Copy-on-write: one block, then a batch over more than one launch's worth. */
	bc[0] = (struct backend_block_copy){ .dst = 5, .src = 3 };
	both_copy_blocks(&p, bc, 1);
	assert_same(&p, "copy_blocks of 1");
	for (uint32_t i = 0; i < cap / 2; i++)
		bc[i] = (struct backend_block_copy){ .dst = cap / 2 + i, .src = (i * 7) % (cap / 2) };
	both_copy_blocks(&p, bc, cap / 2);
	assert_same(&p, "copy_blocks");

	/* Token gather: one slot, then a batch (more than one launch) into distinct slots. */
	sc[0] = (struct backend_slot_copy){ .dst = 1, .dst_slot = B - 1, .src = 2, .src_slot = 0 };
	both_copy_slots(&p, sc, 1);
	assert_same(&p, "copy_slots of 1");
	for (uint32_t dst = cap / 2; dst < cap && ns < 600; dst++)
		for (uint32_t s = 0; s < B && ns < 600; s++, ns++)
			sc[ns] = (struct backend_slot_copy){ .dst = dst, .dst_slot = s,
							     .src = (ns * 13) % (cap / 2),
							     .src_slot = (ns * 5) % B };
	both_copy_slots(&p, sc, ns);
	assert_same(&p, "copy_slots");

	/* Swap out: adjacent runs and scattered blocks, into pinned staging. */
	ck_assert_int_eq(p.module->ops->host_alloc(&p.dev, cap * p.block_bytes, (void **)&stage), 0);
	ck_assert_int_eq(backend_host.host_alloc(&p.host, cap * p.block_bytes, (void **)&hstage), 0);
	for (uint32_t b = 0; b < cap; b++)
		if (b < cap / 4 || b % 3 == 0) {
			m[nm] = (struct backend_move){ .block = b, .host = stage + nm * p.block_bytes };
			hm[nm] = (struct backend_move){ .block = b,
							.host = hstage + nm * p.block_bytes };
			nm++;
		}
	drain(&p.dev);
	ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_TO_HOST, m, nm, &ticket), 0);
	issued(&p, ticket);
	wait_move(&p.dev, ticket);
	ck_assert_int_eq(backend_host.move(&p.host, BACKEND_TO_HOST, hm, nm, &ticket), 0);
	host_wait(&p.host, ticket);
	ck_assert_int_eq(memcmp(stage, hstage, nm * p.block_bytes), 0);

	/* Swap in: changed bytes, into other blocks, reversed (so no run is adjacent). */
	for (uint64_t i = 0; i < nm * p.block_bytes; i++)
		stage[i] = hstage[i] = (uint8_t)(stage[i] ^ 0xa5);
	for (uint32_t i = 0; i < nm; i++)
		m[i].block = hm[i].block = cap - 1 - m[i].block;
	drain(&p.dev);
	ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_FROM_HOST, m, nm, &ticket), 0);
	issued(&p, ticket);
	wait_move(&p.dev, ticket);
	ck_assert_int_eq(backend_host.move(&p.host, BACKEND_FROM_HOST, hm, nm, &ticket), 0);
	host_wait(&p.host, ticket);
	assert_same(&p, "swap in");

	/*
	 * Every kind queued back to back, none waited for: one ticket each, in order, and each
	 * sees what the ones before did -- the copy reads blocks the move out still reads, the
	 * move in reads staging the move out writes, the gather and the last copy read blocks
	 * the move in writes.
	 */
	{
		enum { k = 8 };
		struct backend_move mk[k], hmk[k];
		struct backend_block_copy one;
		struct backend_slot_copy slot = { .dst = k, .dst_slot = 0, .src = cap - 1,
						  .src_slot = B - 1 };

		for (uint32_t i = 0; i < k; i++) {
			mk[i] = (struct backend_move){ .block = i,
						       .host = stage + i * p.block_bytes };
			hmk[i] = (struct backend_move){ .block = i,
							.host = hstage + i * p.block_bytes };
			bc[i] = (struct backend_block_copy){ .dst = cap - 1 - i, .src = i };
		}
		both_move(&p, BACKEND_TO_HOST, mk, hmk, k);
		both_copy_blocks(&p, bc, k);
		for (uint32_t i = 0; i < k; i++)
			mk[i].block = hmk[i].block = k + i;
		both_move(&p, BACKEND_FROM_HOST, mk, hmk, k);
		both_copy_slots(&p, &slot, 1);
		one = (struct backend_block_copy){ .dst = 2 * k + 1, .src = k };
		both_copy_blocks(&p, &one, 1);
		ck_assert_int_eq(p.module->ops->done(&p.dev, &done), 0); /* never blocks */
		ck_assert_uint_le(done, p.last);
		assert_same(&p, "mixed operations back to back");
		ck_assert_int_eq(memcmp(stage, hstage, k * p.block_bytes), 0);
	}

	/* Several moves in flight, both ways, completing in the order they were queued. */
	{
		uint64_t t[4];

		ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_TO_HOST, m, nm / 2, &t[0]), 0);
		ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_FROM_HOST, m + nm / 2,
						     nm - nm / 2, &t[1]), 0);
		ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_TO_HOST, m, 1, &t[2]), 0);
		ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_FROM_HOST, m + nm - 1, 1, &t[3]),
				 0);
		for (int i = 0; i < 4; i++)
			issued(&p, t[i]);
		ck_assert_int_eq(p.module->ops->wait(&p.dev, t[2]), 0);
		ck_assert_int_eq(p.module->ops->done(&p.dev, &done), 0);
		ck_assert_uint_ge(done, t[2]);
		ck_assert_int_eq(p.module->ops->wait(&p.dev, t[0]), 0); /* already: at once */
		ck_assert_int_eq(p.module->ops->wait(&p.dev, t[3]), 0);
		ck_assert_int_eq(p.module->ops->done(&p.dev, &done), 0);
		ck_assert_uint_eq(done, t[3]);
	}
	/* Nothing to do is no ticket, and ticket 0 is done. */
	ticket = 1;
	ck_assert_int_eq(p.module->ops->copy_blocks(&p.dev, bc, 0, &ticket), 0);
	ck_assert_uint_eq(ticket, 0);
	ticket = 1;
	ck_assert_int_eq(p.module->ops->copy_slots(&p.dev, sc, 0, &ticket), 0);
	ck_assert_uint_eq(ticket, 0);
	ticket = 1;
	ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_TO_HOST, m, 0, &ticket), 0);
	ck_assert_uint_eq(ticket, 0);
	ck_assert_int_eq(p.module->ops->wait(&p.dev, 0), 0);
	/* Bad arguments are refused, and nothing is queued: no ticket is used up. */
	m[0].block = cap;
	ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_TO_HOST, m, 1, &ticket), -EINVAL);
	bc[0] = (struct backend_block_copy){ .dst = cap, .src = 0 };
	ck_assert_int_eq(p.module->ops->copy_blocks(&p.dev, bc, 1, &ticket), -EINVAL);
	sc[0] = (struct backend_slot_copy){ .dst = 0, .dst_slot = 0, .src = cap, .src_slot = 0 };
	ck_assert_int_eq(p.module->ops->copy_slots(&p.dev, sc, 1, &ticket), -EINVAL);
	ck_assert_int_eq(p.module->ops->wait(&p.dev, p.last + 1), -EINVAL); /* not issued */
	bc[0] = (struct backend_block_copy){ .dst = 1, .src = 0 };
	ck_assert_int_eq(p.module->ops->copy_blocks(&p.dev, bc, 1, &ticket), 0);
	issued(&p, ticket);
	wait_all(&p);

	p.module->ops->host_free(&p.dev, stage, cap * p.block_bytes);
	backend_host.host_free(&p.host, hstage, cap * p.block_bytes);
	pools_close(&p);
}

/* 4 layers, 2 heads, dim 64, bf16, 16 tokens: 32 KiB blocks, 256-byte slots (16-byte path). */
static const struct geometry wide = { 4, 2, 64, 2, 16, 64 };
/*
 * 3 layers, 1 head, dim 3, 1-byte elements, 5 tokens: 90-byte blocks (byte path); enough of
 * them that lists outgrow a launch's parameters and go through the upload buffer.
 */
static const struct geometry odd = { 3, 1, 3, 1, 5, 520 };
/* 1 layer, 1 head, dim 2, bf16, 5 tokens: 40-byte blocks, 4-byte slots (4-byte path). */
static const struct geometry narrow = { 1, 1, 2, 2, 5, 300 };
/* One layer of one 1-byte slot: 2-byte blocks, so many that a list outgrows the upload buffer. */
static const struct geometry tiny = { 1, 1, 1, 1, 1, 24000 };

START_TEST(test_wide_dma)
{
	run_geometry(&wide, "dma");
}
END_TEST

START_TEST(test_wide_kernel)
{
	run_geometry(&wide, "kernel");
}
END_TEST

START_TEST(test_odd_dma)
{
	run_geometry(&odd, "dma");
}
END_TEST

START_TEST(test_odd_kernel)
{
	run_geometry(&odd, "kernel");
}
END_TEST

START_TEST(test_narrow_dma)
{
	run_geometry(&narrow, "dma");
}
END_TEST

START_TEST(test_narrow_kernel)
{
	run_geometry(&narrow, "kernel");
}
END_TEST

/*
 * Lists longer than a launch holds (KVPD_INLINE) go through the module's upload buffers, used
 * in turn.  Twelve of them queued back to back, none waited for, each reading what the one
 * before wrote: a call must not overwrite a buffer (or free it to grow it, as the second list
 * does with tiny blocks) while an earlier list may still upload from it or read it.
 */
static void run_long_lists(const struct geometry *g)
{
	const uint32_t cap = g->capacity, half = cap / 2, B = g->block_tokens;
	const uint32_t n1 = half < 300 ? half : 300, n3 = half * B < 600 ? half * B : 600;
	struct backend_block_copy *bc = calloc(half, sizeof(*bc));
	struct backend_slot_copy *sc = calloc((size_t)half * B, sizeof(*sc));
	struct pools p;

	ck_assert_ptr_nonnull(bc);
	ck_assert_ptr_nonnull(sc);
	ck_assert_uint_gt(n1, KVPD_INLINE);
	ck_assert_uint_gt(n3, KVPD_INLINE);
	pools_open(&p, g, "dma");
	/* Three rounds of four: more long lists queued than the module has buffers for them. */
	for (uint32_t round = 1; round <= 3; round++) {
		/* Lower half into the upper half... */
		for (uint32_t i = 0; i < n1; i++)
			bc[i] = (struct backend_block_copy){ .dst = half + i,
							     .src = (i * round) % half };
		both_copy_blocks(&p, bc, n1);
		/* ...the upper half (as just written) back over the lower half, all of it... */
		for (uint32_t i = 0; i < half; i++)
			bc[i] = (struct backend_block_copy){ .dst = i,
							     .src = half + (i * (5 + 2 * round)) % half };
		both_copy_blocks(&p, bc, half);
		/* ...tokens of the lower half into the upper half's slots, a few, then all. */
		for (uint32_t k = 0; k < n3; k++)
			sc[k] = (struct backend_slot_copy){ .dst = half + k / B, .dst_slot = k % B,
							    .src = (k * (11 + 2 * round)) % half,
							    .src_slot = (k * 5) % B };
		both_copy_slots(&p, sc, n3);
		for (uint32_t k = 0; k < half * B; k++)
			sc[k] = (struct backend_slot_copy){ .dst = half + k / B, .dst_slot = k % B,
							    .src = (k * (1 + 2 * round)) % half,
							    .src_slot = (k * 7) % B };
		both_copy_slots(&p, sc, half * B);
	}
	assert_same(&p, "long lists back to back");
	pools_close(&p);
	free(sc);
	free(bc);
}

START_TEST(test_long_lists)
{
	run_long_lists(&odd);
	run_long_lists(&tiny);
}
END_TEST

/* The pool's fd is an importable shareable handle; the exporter's pool is unaffected. */
START_TEST(test_fd_imports)
{
	struct pools p;
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop = { 0 };

	pools_open(&p, &wide, "dma");
	GPU_OK(cu.cuMemImportFromShareableHandle(&h, (void *)(intptr_t)p.dev.fd,
						 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	GPU_OK(cu.cuMemGetAllocationPropertiesFromHandle(&prop, h));
	ck_assert_int_eq(prop.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
	GPU_OK(cu.cuMemRelease(h));
	ck_assert(fcntl(p.dev.fd, F_GETFD) & FD_CLOEXEC);
	assert_same(&p, "import");
	pools_close(&p);
}
END_TEST

/* The daemon's pinned arena for a GPU pool's host tier (daemon/server/pool.c). */
static int arena_alloc(void *ctx, uint64_t bytes, void **ret)
{
	struct backend_pool *b = ctx;

	return b->ops->host_alloc(b, bytes, ret);
}

static void arena_free(void *ctx, void *mem, uint64_t bytes)
{
	struct backend_pool *b = ctx;

	b->ops->host_free(b, mem, bytes);
}

/*
 * Blocks moved out into host tier slots (one move, straight into the pinned arena) hold the
 * pool's bytes; moved back in from the slots (one move) into other blocks, the device pool
 * equals the host pool that copied the same blocks.
 */
static void run_host_tier(const struct geometry *g, const char *swap)
{
	enum { N = 24, TOKENS = 4 };
	const uint32_t cap = g->capacity;
	struct host_tier *t = NULL;
	struct backend_move m[N];
	uint32_t tokens[N][TOKENS];
	struct tier_key keys[N];
	uint64_t ticket;
	struct pools p;

	pools_open(&p, g, swap);
	{
		const struct host_tier_arena pinned = { arena_alloc, arena_free, &p.dev };

		ck_assert_int_eq(host_tier_new(2 * N, p.block_bytes, TOKENS, &pinned, &t), 0);
	}
	for (uint32_t i = 0; i < N; i++) {
		uint32_t slot = i < N / 2 ? i : 2 * N - 1 - i;

		for (uint32_t k = 0; k < TOKENS; k++)
			tokens[i][k] = i * 100 + k;
		keys[i] = (struct tier_key){ .hash_lo = i + 1, .hash_hi = 7, .tokens = tokens[i] };
		/* The first half one run (adjacent on both sides), the second half reversed. */
		m[i] = (struct backend_move){ .block = i < N / 2 ? i : cap / 2 - 1 - (i - N / 2),
					      .host = host_tier_slot_for_write(t, slot) };
	}
	ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_TO_HOST, m, N, &ticket), 0);
	issued(&p, ticket);
	wait_move(&p.dev, ticket);
	for (uint32_t i = 0; i < N; i++) {
		uint32_t slot = i < N / 2 ? i : 2 * N - 1 - i;
		const void *data;

		ck_assert_ptr_null(host_tier_lookup(t, slot, &keys[i])); /* not committed */
		host_tier_commit(t, slot, &keys[i]);
		data = host_tier_lookup(t, slot, &keys[i]);
		ck_assert_ptr_eq(data, m[i].host);
		ck_assert_msg(!memcmp(data, (uint8_t *)p.host.base + (uint64_t)m[i].block *
								      p.block_bytes,
				      p.block_bytes),
			      "host tier slot %u differs from block %u after the move out (%s)", slot,
			      m[i].block, swap);
		ck_assert_ptr_null(host_tier_lookup(t, slot, &keys[(i + 1) % N]));
	}

	/* Back in, from the slots as lookups give them, into the other half of the pool. */
	for (uint32_t i = 0; i < N; i++) {
		uint32_t slot = i < N / 2 ? i : 2 * N - 1 - i;
		uint32_t dst = cap / 2 + i;
		const struct backend_block_copy c = { .dst = dst, .src = m[i].block };

		ck_assert_int_eq(backend_host.copy_blocks(&p.host, &c, 1, &ticket), 0);
		ck_assert_int_eq(backend_host.wait(&p.host, ticket), 0);
		m[i] = (struct backend_move){ .block = dst,
					      .host = (void *)host_tier_lookup(t, slot, &keys[i]) };
		ck_assert_ptr_nonnull(m[i].host);
	}
	ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_FROM_HOST, m, N, &ticket), 0);
	issued(&p, ticket);
	wait_move(&p.dev, ticket);
	assert_same(&p, "moves in from the host tier");

	/* The arena goes back to the module before the pool does, as in the daemon. */
	ck_assert_ptr_null(host_tier_free(t));
	pools_close(&p);
}

START_TEST(test_host_tier_dma)
{
	run_host_tier(&wide, "dma");
	run_host_tier(&odd, "dma");
}
END_TEST

START_TEST(test_host_tier_kernel)
{
	run_host_tier(&wide, "kernel");
	run_host_tier(&odd, "kernel");
}
END_TEST

/*
 * The device argument picks the device: a pool on the last one is allocated there, and one
 * past it is refused by probe() and create() alike, with the ordinal in the message.
 */
START_TEST(test_device_argument)
{
	const char *path = getenv("KVPAGED_TEST_CUDA_MODULE");
	const struct backend_module *module;
	struct backend_pool pool = { .fd = -1, .done_fd = -1 };
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop = { 0 };
	const uint64_t block = 4096;
	char why[512] = "", want[64];
	int count = 0;

	ck_assert_msg(path && *path, "KVPAGED_TEST_CUDA_MODULE is not set");
	gpu_use(0);
	GPU_OK(cu.cuDeviceGetCount(&count));
	ck_assert_int_ge(count, 1);
	ck_assert_int_eq(backend_module_load(path, (uint32_t)count - 1, &module, why, sizeof(why)),
			 0);
	ck_assert_int_eq(module->ops->create("dev", 64 * block, block, (uint32_t)count - 1, &pool),
			 0);
	GPU_OK(cu.cuMemImportFromShareableHandle(&h, (void *)(intptr_t)pool.fd,
						 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	GPU_OK(cu.cuMemGetAllocationPropertiesFromHandle(&prop, h));
	ck_assert_int_eq(prop.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
	ck_assert_int_eq(prop.location.id, count - 1);
	GPU_OK(cu.cuMemRelease(h));
	module->ops->destroy(&pool);

	snprintf(want, sizeof(want), "no CUDA device %d", count);
	ck_assert_int_eq(backend_module_load(path, (uint32_t)count, &module, why, sizeof(why)),
			 -ENODEV);
	ck_assert_msg(strstr(why, want), "probe: %s", why);
	pool = (struct backend_pool){ .fd = -1, .done_fd = -1 };
	ck_assert_int_eq(module->ops->create("dev", 64 * block, block, (uint32_t)count, &pool),
			 -ENODEV);
	ck_assert_msg(strstr(module->last_error(), want), "create: %s", module->last_error());
}
END_TEST

int main(void)
{
	Suite *s = suite_create("gpu-backend");
	TCase *tc = tcase_create("gpu-backend");

	if (gpu_skip())
		return GPU_SKIP;
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_wide_dma);
	tcase_add_test(tc, test_wide_kernel);
	tcase_add_test(tc, test_odd_dma);
	tcase_add_test(tc, test_odd_kernel);
	tcase_add_test(tc, test_narrow_dma);
	tcase_add_test(tc, test_narrow_kernel);
	tcase_add_test(tc, test_long_lists);
	tcase_add_test(tc, test_fd_imports);
	tcase_add_test(tc, test_host_tier_dma);
	tcase_add_test(tc, test_host_tier_kernel);
	tcase_add_test(tc, test_device_argument);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

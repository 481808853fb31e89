/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend module against the host backend, in one process: the same pool contents,
 * the same copies (copy-on-write blocks, token gather), the same moves out to pinned host
 * memory and back in, through both swap paths (copy engines and kernel); afterwards the two
 * pools and the host buffers must be equal byte for byte.  Two layouts: a 16-byte one (the
 * vector path) and an odd one (bytes).  A host tier whose arena is the module's pinned memory,
 * as the daemon makes it for a GPU pool, takes blocks straight from the pool and gives them
 * back.  The device argument picks the device.  Exits 77 without a GPU.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>

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
	uint8_t *scratch; /* bytes, for reading the device pool back */
};

static void pools_open(struct pools *p, const struct geometry *g, const char *swap)
{
	const char *path = getenv("KVPAGED_CUDA_MODULE");
	uint64_t slot = (uint64_t)g->kv_heads * g->head_dim * g->element_bytes;
	char why[512];
	uint8_t *init;
	int r;

	ck_assert_msg(path && *path, "KVPAGED_CUDA_MODULE is not set");
	setenv("KVPAGED_CUDA_SWAP", swap, 1);
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
	unsetenv("KVPAGED_CUDA_SWAP");
}

static void assert_same(struct pools *p, const char *after)
{
	gpu_read(p->scratch, p->dev.device_base, p->bytes);
	for (uint64_t i = 0; i < p->bytes; i++)
		if (p->scratch[i] != ((uint8_t *)p->host.base)[i])
			ck_abort_msg("after %s: byte %llu (block %llu) differs: device %u, host %u",
				     after, (unsigned long long)i,
				     (unsigned long long)(i / p->block_bytes), p->scratch[i],
				     ((uint8_t *)p->host.base)[i]);
}

static void both_copy_blocks(struct pools *p, const struct backend_block_copy *c, uint32_t n)
{
	ck_assert_int_eq(p->module->ops->copy_blocks(&p->dev, c, n), 0);
	ck_assert_int_eq(backend_host.copy_blocks(&p->host, c, n), 0);
}

/* Waits for the completion eventfd, then for the ticket. */
static void wait_move(struct backend_pool *b, uint64_t ticket)
{
	struct pollfd pfd = { .fd = b->done_fd, .events = POLLIN };
	uint64_t v;

	ck_assert_int_eq(poll(&pfd, 1, 10000), 1);
	ck_assert_int_eq(read(b->done_fd, &v, sizeof(v)), (ssize_t)sizeof(v));
	ck_assert_int_ge((int)v, 1);
	ck_assert_int_eq(b->ops->move_wait(b, ticket), 0);
	ck_assert_int_eq(b->ops->move_done(b, ticket), 1);
}

static void run_geometry(const struct geometry *g, const char *swap)
{
	const uint32_t cap = g->capacity, B = g->block_tokens;
	struct backend_block_copy bc[300];
	struct backend_slot_copy sc[600];
	struct backend_move m[300], hm[300];
	uint32_t nm = 0, ns = 0;
	uint64_t ticket;
	uint8_t *stage, *hstage;
	struct pools p;

	pools_open(&p, g, swap);

	/* Copy-on-write: one block, then a batch over more than one launch's worth. */
	ck_assert_int_eq(p.module->ops->copy_block(&p.dev, 5, 3), 0);
	ck_assert_int_eq(backend_host.copy_block(&p.host, 5, 3), 0);
	assert_same(&p, "copy_block");
	for (uint32_t i = 0; i < cap / 2; i++)
		bc[i] = (struct backend_block_copy){ .dst = cap / 2 + i, .src = (i * 7) % (cap / 2) };
	both_copy_blocks(&p, bc, cap / 2);
	assert_same(&p, "copy_blocks");

	/* Token gather: one slot, then a batch (more than one launch) into distinct slots. */
	p.module->ops->copy_slot(&p.dev, 1, B - 1, 2, 0);
	backend_host.copy_slot(&p.host, 1, B - 1, 2, 0);
	assert_same(&p, "copy_slot");
	for (uint32_t dst = cap / 2; dst < cap && ns < 600; dst++)
		for (uint32_t s = 0; s < B && ns < 600; s++, ns++)
			sc[ns] = (struct backend_slot_copy){ .dst = dst, .dst_slot = s,
							     .src = (ns * 13) % (cap / 2),
							     .src_slot = (ns * 5) % B };
	ck_assert_int_eq(p.module->ops->copy_slots(&p.dev, sc, ns), 0);
	ck_assert_int_eq(backend_host.copy_slots(&p.host, sc, ns), 0);
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
	ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_TO_HOST, m, nm, &ticket), 0);
	wait_move(&p.dev, ticket);
	ck_assert_int_eq(backend_host.move(&p.host, BACKEND_TO_HOST, hm, nm, &ticket), 0);
	wait_move(&p.host, ticket);
	ck_assert_int_eq(memcmp(stage, hstage, nm * p.block_bytes), 0);

	/* Swap in: changed bytes, into other blocks, reversed (so no run is adjacent). */
	for (uint64_t i = 0; i < nm * p.block_bytes; i++)
		stage[i] = hstage[i] = (uint8_t)(stage[i] ^ 0xa5);
	for (uint32_t i = 0; i < nm; i++)
		m[i].block = hm[i].block = cap - 1 - m[i].block;
	ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_FROM_HOST, m, nm, &ticket), 0);
	wait_move(&p.dev, ticket);
	ck_assert_int_eq(backend_host.move(&p.host, BACKEND_FROM_HOST, hm, nm, &ticket), 0);
	wait_move(&p.host, ticket);
	assert_same(&p, "swap in");

	/* Several moves in flight, both ways, completing in order per direction. */
	{
		uint64_t t[4];

		ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_TO_HOST, m, nm / 2, &t[0]), 0);
		ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_FROM_HOST, m + nm / 2,
						     nm - nm / 2, &t[1]), 0);
		ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_TO_HOST, m, 1, &t[2]), 0);
		ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_FROM_HOST, m + nm - 1, 1, &t[3]),
				 0);
		ck_assert_int_eq(p.module->ops->move_wait(&p.dev, t[2]), 0);
		ck_assert_int_eq(p.module->ops->move_done(&p.dev, t[0]), 1);
		ck_assert_int_eq(p.module->ops->move_wait(&p.dev, t[3]), 0);
		ck_assert_int_eq(p.module->ops->move_done(&p.dev, t[1]), 1);
	}
	/* Bad arguments are refused, and nothing is queued. */
	m[0].block = cap;
	ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_TO_HOST, m, 1, &ticket), -EINVAL);
	ck_assert_int_eq(p.module->ops->copy_block(&p.dev, cap, 0), -EINVAL);

	p.module->ops->host_free(&p.dev, stage, cap * p.block_bytes);
	backend_host.host_free(&p.host, hstage, cap * p.block_bytes);
	pools_close(&p);
}

/* 4 layers, 2 heads, dim 64, bf16, 16 tokens: 32 KiB blocks, 256-byte slots (16-byte path). */
static const struct geometry wide = { 4, 2, 64, 2, 16, 64 };
/*
 * 3 layers, 1 head, dim 3, 1-byte elements, 5 tokens: 90-byte blocks (byte path); enough of
 * them that batches take more than one launch.
 */
static const struct geometry odd = { 3, 1, 3, 1, 5, 520 };

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

		ck_assert_int_eq(backend_host.copy_block(&p.host, dst, m[i].block), 0);
		m[i] = (struct backend_move){ .block = dst,
					      .host = (void *)host_tier_lookup(t, slot, &keys[i]) };
		ck_assert_ptr_nonnull(m[i].host);
	}
	ck_assert_int_eq(p.module->ops->move(&p.dev, BACKEND_FROM_HOST, m, N, &ticket), 0);
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
	const char *path = getenv("KVPAGED_CUDA_MODULE");
	const struct backend_module *module;
	struct backend_pool pool = { .fd = -1, .done_fd = -1 };
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop = { 0 };
	const uint64_t block = 4096;
	char why[512] = "", want[64];
	int count = 0;

	ck_assert_msg(path && *path, "KVPAGED_CUDA_MODULE is not set");
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
	tcase_add_test(tc, test_fd_imports);
	tcase_add_test(tc, test_host_tier_dma);
	tcase_add_test(tc, test_host_tier_kernel);
	tcase_add_test(tc, test_device_argument);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

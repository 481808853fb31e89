/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-gpu-bench: the CUDA backend's copies against plain driver copies of the same bytes,
 * in the same run, for a 7B geometry (32 layers, 8 KV heads, head dim 128, bf16) and blocks
 * of 16 to 512 tokens:
 *
 *   copy      copy_blocks of one block (copy-on-write) vs cuMemcpyDtoDAsync + sync
 *   copies    copy_blocks of many scattered blocks vs one cuMemcpyDtoDAsync of their bytes
 *   gather    copy_slots of many scattered tokens (h2o compaction) vs one cuMemcpyDtoDAsync
 *   out, in   move of scattered blocks to/from pinned staging, through the copy engines
 *             (dma) and through the kernel, vs one cuMemcpy{DtoH,HtoD}Async of the bytes
 *
 * The backend only queues an operation: each of its figures times the call and wait() for the
 * ticket it returned, as each reference times its copy and the stream's synchronization.
 * Each figure is the best of a few runs.  The bar: copies and gather at least 80% of
 * the plain copy, and out and in (the faster path) at least 80% too.  Prints a table and one
 * line per bar; exits 1 if one is missed, 77 without a GPU.  Not a test: tests/gpu/run.sh
 * runs it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/backend/backend.h"
#include "tests/gpu/gpu.h"

#define LAYERS 32
#define KV_HEADS 8
#define HEAD_DIM 128
#define ELEMENT 2
#define SLOT_BYTES ((uint64_t)KV_HEADS * HEAD_DIM * ELEMENT)
#define POOL_BYTES (UINT64_C(4) << 30)
#define MOVE_BYTES (UINT64_C(1) << 30)
#define RUNS 5
#define BAR 0.80

static const struct backend_module *module;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t rnd(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static void shuffle(uint32_t *v, uint32_t n, uint64_t seed)
{
	for (uint32_t i = n; i > 1; i--) {
		uint32_t j = (uint32_t)(rnd(&seed) % i), t = v[i - 1];

		v[i - 1] = v[j];
		v[j] = t;
	}
}

struct result {
	double copy, copy_ref, copies, copies_ref, gather, gather_ref;
	double out[2], in[2], out_ref, in_ref; /* [0] dma, [1] kernel */
};

static void die(const char *what, int r)
{
	fprintf(stderr, "bench: %s: %s (%s)\n", what, strerror(-r), module->last_error());
	exit(2);
}

/* An operation's result r and ticket: waited for, as a caller needing its bytes would. */
static void finish(struct backend_pool *p, const char *what, int r, uint64_t ticket)
{
	if (r == 0)
		r = module->ops->wait(p, ticket);
	if (r < 0)
		die(what, r);
}

static struct backend_pool pool_new(uint32_t tokens, const char *swap)
{
	uint64_t block = SLOT_BYTES * tokens * 2 * LAYERS;
	struct backend_pool p = { .fd = -1, .done_fd = -1 };
	int r;

	setenv("KVPAGED_TEST_CUDA_SWAP", swap, 1);
	r = module->ops->create("bench", POOL_BYTES / block * block, block, 0, &p);
	if (r < 0)
		die("create", r);
	p.layers = LAYERS;
	p.slot_stride = SLOT_BYTES;
	p.kv_stride = SLOT_BYTES * tokens;
	p.layer_stride = 2 * p.kv_stride;
	return p;
}

/* Bytes per second of the best of RUNS. */
#define BEST(bytes, body)                                                                          \
	({                                                                                         \
		double best_ = 0;                                                                  \
		for (int run_ = 0; run_ < RUNS; run_++) {                                          \
			double t_ = now();                                                         \
			body;                                                                      \
			t_ = now() - t_;                                                           \
			if (t_ > 0 && (double)(bytes) / t_ > best_)                                \
				best_ = (double)(bytes) / t_;                                      \
		}                                                                                  \
		best_;                                                                             \
	})

static void bench_moves(struct backend_pool *p, int kernel, uint8_t *stage, uint32_t n,
			const uint32_t *order, struct result *res, CUstream ref_stream)
{
	struct backend_move *m = calloc(n, sizeof(*m));
	uint64_t bytes = (uint64_t)n * p->block_bytes, ticket = 0;
	int r;

	for (uint32_t i = 0; i < n; i++)
		m[i] = (struct backend_move){ .block = order[i],
					      .host = stage + (uint64_t)i * p->block_bytes };
	res->out[kernel] = BEST(bytes, {
		r = module->ops->move(p, BACKEND_TO_HOST, m, n, &ticket);
		finish(p, "move out", r, ticket);
	});
	res->in[kernel] = BEST(bytes, {
		r = module->ops->move(p, BACKEND_FROM_HOST, m, n, &ticket);
		finish(p, "move in", r, ticket);
	});
	if (!kernel) {
		res->out_ref = BEST(bytes, {
			GPU_OK(cu.cuMemcpyDtoHAsync(stage, (CUdeviceptr)p->device_base, bytes,
						    ref_stream));
			GPU_OK(cu.cuStreamSynchronize(ref_stream));
		});
		res->in_ref = BEST(bytes, {
			GPU_OK(cu.cuMemcpyHtoDAsync((CUdeviceptr)p->device_base, stage, bytes,
						    ref_stream));
			GPU_OK(cu.cuStreamSynchronize(ref_stream));
		});
	}
	free(m);
}

static void bench_size(uint32_t tokens, struct result *res)
{
	struct backend_pool p = pool_new(tokens, "dma");
	uint32_t cap = (uint32_t)(p.bytes / p.block_bytes), half = cap / 2, nmove, ngather;
	uint32_t *order = calloc(cap, sizeof(*order));
	struct backend_block_copy *bc = calloc(half, sizeof(*bc));
	struct backend_slot_copy *sc;
	uint64_t bytes, seed = 7, ticket = 0;
	CUdeviceptr scratch;
	CUstream s;
	uint8_t *stage;
	int r;

	GPU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	GPU_OK(cu.cuMemAlloc(&scratch, POOL_BYTES / 2));
	for (uint32_t i = 0; i < cap; i++)
		order[i] = i;
	shuffle(order, cap, tokens);

	/* One copy-on-write copy, waited for both ways. */
	bc[0] = (struct backend_block_copy){ .dst = order[1], .src = order[0] };
	res->copy = BEST(p.block_bytes, {
		r = module->ops->copy_blocks(&p, bc, 1, &ticket);
		finish(&p, "copy_blocks of 1", r, ticket);
	});
	res->copy_ref = BEST(p.block_bytes, {
		GPU_OK(cu.cuMemcpyDtoDAsync((CUdeviceptr)p.device_base +
						    (CUdeviceptr)order[1] * p.block_bytes,
					    (CUdeviceptr)p.device_base +
						    (CUdeviceptr)order[0] * p.block_bytes,
					    p.block_bytes, s));
		GPU_OK(cu.cuStreamSynchronize(s));
	});

	/* Half the pool copied into the other half, blocks scattered. */
	for (uint32_t i = 0; i < half; i++)
		bc[i] = (struct backend_block_copy){ .dst = order[half + i], .src = order[i] };
	bytes = (uint64_t)half * p.block_bytes;
	res->copies = BEST(bytes, {
		r = module->ops->copy_blocks(&p, bc, half, &ticket);
		finish(&p, "copy_blocks", r, ticket);
	});
	res->copies_ref = BEST(bytes, {
		GPU_OK(cu.cuMemcpyDtoDAsync(scratch, (CUdeviceptr)p.device_base, bytes, s));
		GPU_OK(cu.cuStreamSynchronize(s));
	});

	/* Tokens from the first half packed into the slots of the second, scattered. */
	ngather = half * tokens;
	ngather = ngather > 16384 ? 16384 : ngather;
	sc = calloc(ngather, sizeof(*sc));
	for (uint32_t k = 0; k < ngather; k++)
		sc[k] = (struct backend_slot_copy){
			.dst = order[half + k / tokens], .dst_slot = k % tokens,
			.src = order[rnd(&seed) % half], .src_slot = (uint32_t)(rnd(&seed) % tokens)
		};
	bytes = (uint64_t)ngather * 2 * LAYERS * SLOT_BYTES;
	res->gather = BEST(bytes, {
		r = module->ops->copy_slots(&p, sc, ngather, &ticket);
		finish(&p, "copy_slots", r, ticket);
	});
	res->gather_ref = BEST(bytes, {
		GPU_OK(cu.cuMemcpyDtoDAsync(scratch, (CUdeviceptr)p.device_base, bytes, s));
		GPU_OK(cu.cuStreamSynchronize(s));
	});

	/* Swap: scattered blocks to and from pinned staging, both paths. */
	nmove = (uint32_t)(MOVE_BYTES / p.block_bytes);
	nmove = nmove > cap ? cap : nmove;
	r = module->ops->host_alloc(&p, (uint64_t)nmove * p.block_bytes, (void **)&stage);
	if (r < 0)
		die("host_alloc", r);
	memset(stage, 1, (size_t)nmove * p.block_bytes);
	bench_moves(&p, 0, stage, nmove, order, res, s);
	module->ops->host_free(&p, stage, (uint64_t)nmove * p.block_bytes);
	module->ops->destroy(&p);

	p = pool_new(tokens, "kernel");
	r = module->ops->host_alloc(&p, (uint64_t)nmove * p.block_bytes, (void **)&stage);
	if (r < 0)
		die("host_alloc", r);
	memset(stage, 1, (size_t)nmove * p.block_bytes);
	bench_moves(&p, 1, stage, nmove, order, res, s);
	module->ops->host_free(&p, stage, (uint64_t)nmove * p.block_bytes);
	module->ops->destroy(&p);

	GPU_OK(cu.cuMemFree(scratch));
	GPU_OK(cu.cuStreamDestroy(s));
	free(sc);
	free(bc);
	free(order);
}

static int verdict(const char *what, uint32_t tokens, double got, double ref)
{
	double ratio = ref > 0 ? got / ref : 0;

	printf("bench: %s %-7s %3u tokens: %6.1f of %6.1f GB/s = %3.0f%%\n",
	       ratio >= BAR ? "PASS" : "MISS", what, tokens, got / 1e9, ref / 1e9, ratio * 100);
	return ratio >= BAR ? 0 : 1;
}

int main(void)
{
	static const uint32_t sizes[] = { 16, 32, 64, 128, 256, 512 };
	const char *path = getenv("KVPAGED_TEST_CUDA_MODULE");
	struct result res[6];
	char why[512];
	int misses = 0;

	if (gpu_skip())
		return GPU_SKIP;
	if (!path || !*path || backend_module_load(path, 0, &module, why, sizeof(why)) < 0) {
		fprintf(stderr, "bench: cannot load the module %s: %s\n", path ? path : "(unset)",
			path ? why : "set KVPAGED_TEST_CUDA_MODULE");
		return 2;
	}
	gpu_use(0);
	printf("7B geometry: %d layers, %d KV heads, head dim %d, bf16; GB/s, best of %d\n",
	       LAYERS, KV_HEADS, HEAD_DIM, RUNS);
	printf("%6s %9s | %7s %7s | %7s %7s | %7s %7s | %7s %7s %7s | %7s %7s %7s\n", "tokens",
	       "block", "copy", "ref", "copies", "ref", "gather", "ref", "out-dma", "out-krn",
	       "ref", "in-dma", "in-krn", "ref");
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		struct result *r = &res[i];

		bench_size(sizes[i], r);
		printf("%6u %8lluK | %7.1f %7.1f | %7.1f %7.1f | %7.1f %7.1f | %7.1f %7.1f %7.1f | "
		       "%7.1f %7.1f %7.1f\n",
		       sizes[i], (unsigned long long)(SLOT_BYTES * sizes[i] * 2 * LAYERS >> 10),
		       r->copy / 1e9, r->copy_ref / 1e9, r->copies / 1e9, r->copies_ref / 1e9,
		       r->gather / 1e9, r->gather_ref / 1e9, r->out[0] / 1e9, r->out[1] / 1e9,
		       r->out_ref / 1e9, r->in[0] / 1e9, r->in[1] / 1e9, r->in_ref / 1e9);
		fflush(stdout);
	}
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		const struct result *r = &res[i];
		uint32_t t = sizes[i];

		/* Reported, not judged: one small copy is launch latency more than bandwidth. */
		printf("bench: INFO copy    %3u tokens: %6.1f of %6.1f GB/s = %3.0f%%\n", t,
		       r->copy / 1e9, r->copy_ref / 1e9,
		       r->copy_ref > 0 ? 100 * r->copy / r->copy_ref : 0);
		misses += verdict("copies", t, r->copies, r->copies_ref);
		misses += verdict("gather", t, r->gather, r->gather_ref);
		misses += verdict("out", t, r->out[0] > r->out[1] ? r->out[0] : r->out[1],
				  r->out_ref);
		misses += verdict("in", t, r->in[0] > r->in[1] ? r->in[0] : r->in[1], r->in_ref);
	}
	printf("bench: %d of %zu bars missed\n", misses, 4 * sizeof(sizes) / sizeof(sizes[0]));
	return misses ? 1 : 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-bench micro: nanoseconds per core operation, medians over repeated batches, each
 * beside its baseline measured in the same run (raw XXH3-128 over the same token bytes).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "daemon/core/core-internal.h"
#include "daemon/core/pool.h"
#include "daemon/core/value.h"
#include "tools/bench/bench.h"

#define MAX_SIZES 8

static volatile uint64_t sink;
static uint32_t repeat = 31;
static bool json;

static void report(const char *metric, uint32_t B, double ns, const char *unit,
		   const char *baseline, double base_ns)
{
	if (json) {
		json_object *o = json_object_new_object();

		json_object_object_add(o, "metric", json_object_new_string(metric));
		json_object_object_add(o, "block_tokens", json_object_new_int64(B));
		json_object_object_add(o, "median_ns", json_object_new_double(ns));
		json_object_object_add(o, "per", json_object_new_string(unit));
		if (baseline) {
			json_object_object_add(o, "baseline", json_object_new_string(baseline));
			json_object_object_add(o, "baseline_ns", json_object_new_double(base_ns));
			json_object_object_add(o, "ratio", json_object_new_double(ns / base_ns));
		}
		json_print(o);
		return;
	}
	printf("%-22s %5u %10.1f ns/%-8s", metric, B, ns, unit);
	if (baseline)
		printf("  %s %.1f ns, ratio %.2f", baseline, base_ns, ns / base_ns);
	putchar('\n');
}

static void on_evict(void *ctx, uint32_t b)
{
}

static int no_copy(void *ctx, uint32_t dst, uint32_t src)
{
	sink += dst ^ src;
	return 0;
}

static double bench_alloc_free(void)
{
	enum { BATCH = 1024 };
	uint64_t *samples = calloc(repeat, sizeof(*samples));
	uint32_t blocks[BATCH];
	struct pool p;
	double med;

	if (pool_init(&p, 65536, on_evict, NULL) < 0)
		abort();
	for (uint32_t r = 0; r < repeat; r++) {
		uint64_t t = now_ns();

		for (int i = 0; i < BATCH; i++)
			blocks[i] = pool_alloc(&p);
		for (int i = 0; i < BATCH; i++)
			pool_unref(&p, blocks[i]);
		samples[r] = (now_ns() - t) * 1000 / BATCH; /* picoseconds per pair */
	}
	med = median_u64(samples, repeat) / 1000;
	pool_done(&p);
	free(samples);
	return med;
}

static struct core *make_core(uint32_t B, uint32_t capacity, uint32_t max_tokens)
{
	struct core_config cfg = { .capacity_blocks = capacity, .block_tokens = B,
				   .max_sequences = 64, .max_seq_tokens = max_tokens,
				   .copy_block = no_copy };
	struct core *c;

	if (core_new(&cfg, &c) < 0)
		abort();
	return c;
}

static double bench_append(uint32_t B)
{
	enum { N = 4096 };
	uint64_t *samples = calloc(repeat, sizeof(*samples));
	struct core *c = make_core(B, 2 * N / B + 16, N + 1);
	uint32_t tok = 1;
	double med;

	for (uint32_t r = 0; r < repeat; r++) {
		struct core_open o = { .tokens = &tok, .ntokens = 1 };
		uint64_t seq, t;
		if (core_seq_open(c, &o, &seq, NULL) < 0)
			abort();
		t = now_ns();
		for (uint32_t i = 0; i < N; i++) {
			tok = i;
			if (core_seq_append(c, seq, &tok, 1) < 0)
				abort();
		}
		samples[r] = (now_ns() - t) * 1000 / N;
		core_seq_close(c, seq);
	}
	med = median_u64(samples, repeat) / 1000;
	core_free(c);
	free(samples);
	return med;
}

/* Lookup of cached prompts (per block) and of unknown ones (per lookup), beside raw XXH3. */
static void bench_lookup(uint32_t B)
{
	const uint32_t K = 64, blocks_per = B >= 256 ? 16 : 64, L = blocks_per * B;
	uint64_t *hit = calloc(repeat, sizeof(uint64_t)), *raw = calloc(repeat, sizeof(uint64_t));
	uint64_t *miss = calloc(repeat, sizeof(uint64_t));
	struct core *c = make_core(B, K * blocks_per + 16, L);
	uint32_t *prompts = malloc((size_t)K * L * sizeof(uint32_t));
	uint32_t *others = malloc((size_t)K * L * sizeof(uint32_t));

	for (size_t i = 0; i < (size_t)K * L; i++) {
		prompts[i] = token_of(1, i);
		others[i] = token_of(2, i);
	}
	for (uint32_t k = 0; k < K; k++) {
		struct core_open o = { .tokens = prompts + (size_t)k * L, .ntokens = L };
		uint64_t seq;
		if (core_seq_open(c, &o, &seq, NULL) < 0 || core_seq_commit(c, seq, L) < 0)
			abort();
		core_seq_close(c, seq);
	}
	for (uint32_t r = 0; r < repeat; r++) {
		uint64_t t = now_ns(), n = 0;

		for (uint32_t k = 0; k < K; k++) {
			struct core_open o = { .tokens = prompts + (size_t)k * L, .ntokens = L };
			n += core_lookup(c, &o);
		}
		if (n != (uint64_t)K * L)
			abort(); /* everything must hit */
		hit[r] = (now_ns() - t) * 1000 / ((uint64_t)K * blocks_per);

		t = now_ns();
		for (uint32_t k = 0; k < K; k++)
			for (uint32_t j = 0; j < blocks_per; j++)
				sink += XXH3_128bits(prompts + (size_t)k * L + (size_t)j * B,
						     (size_t)B * sizeof(uint32_t)).low64;
		raw[r] = (now_ns() - t) * 1000 / ((uint64_t)K * blocks_per);

		t = now_ns();
		for (uint32_t k = 0; k < K; k++) {
			struct core_open o = { .tokens = others + (size_t)k * L, .ntokens = L };
			n += core_lookup(c, &o);
		}
		miss[r] = (now_ns() - t) * 1000 / K;
	}
	double h = median_u64(hit, repeat) / 1000, x = median_u64(raw, repeat) / 1000;
	report("lookup_hit", B, h, "block", "xxh3_128", x);
	report("lookup_miss", B, median_u64(miss, repeat) / 1000, "lookup", "xxh3_128", x);
	core_free(c);
	free(prompts);
	free(others);
	free(hit);
	free(raw);
	free(miss);
}

static void bench_fork_cow(uint32_t B)
{
	enum { N = 1024 };
	uint64_t *cow = calloc(repeat, sizeof(uint64_t)), *plain = calloc(repeat, sizeof(uint64_t));
	uint32_t len = B + (B + 1) / 2, *t = malloc(len * sizeof(uint32_t)), x = 7;
	struct core *c = make_core(B, 64, 4 * B);
	struct core_open o = { .tokens = t, .ntokens = len };
	uint64_t seq, child;

	for (uint32_t i = 0; i < len; i++)
		t[i] = i;
	if (core_seq_open(c, &o, &seq, NULL) < 0 || core_seq_commit(c, seq, len) < 0)
		abort();
	for (uint32_t r = 0; r < repeat; r++) {
		uint64_t t0 = now_ns();

		for (int i = 0; i < N; i++) {
			/* fork, write one token into the shared partial block (copy), close */
			if (core_seq_fork(c, seq, &child) < 0 || core_seq_append(c, child, &x, 1) < 0)
				abort();
			core_seq_close(c, child);
		}
		cow[r] = (now_ns() - t0) * 1000 / N;
		t0 = now_ns();
		for (int i = 0; i < N; i++) {
			if (core_seq_fork(c, seq, &child) < 0)
				abort();
			core_seq_close(c, child);
		}
		plain[r] = (now_ns() - t0) * 1000 / N;
	}
	report("fork_cow_close", B, median_u64(cow, repeat) / 1000, "op", "fork_close",
	       median_u64(plain, repeat) / 1000);
	core_free(c);
	free(t);
	free(cow);
	free(plain);
}

static void bench_hash(uint32_t B)
{
	const uint32_t nblocks = B >= 256 ? 256 : 4096;
	uint32_t *tokens = malloc((size_t)nblocks * B * sizeof(uint32_t));
	uint64_t *ours = calloc(repeat, sizeof(uint64_t)), *raw = calloc(repeat, sizeof(uint64_t));

	for (size_t i = 0; i < (size_t)nblocks * B; i++)
		tokens[i] = token_of(3, i);
	for (uint32_t r = 0; r < repeat; r++) {
		struct core_hash h = { 0, 0 };
		uint64_t ns = core_hash_ns(1, 2), t = now_ns();

		for (uint32_t j = 0; j < nblocks; j++)
			h = core_hash_block(NULL, h, ns, tokens + (size_t)j * B, B);
		ours[r] = (now_ns() - t) * 1000000 / ((uint64_t)nblocks * B);
		sink += h.lo;
		t = now_ns();
		for (uint32_t j = 0; j < nblocks; j++)
			sink += XXH3_128bits(tokens + (size_t)j * B, (size_t)B * sizeof(uint32_t)).low64;
		raw[r] = (now_ns() - t) * 1000000 / ((uint64_t)nblocks * B);
	}
	/* Femtoseconds per token -> tokens/s, shown as ns/token plus throughput. */
	double o_ns = median_u64(ours, repeat) / 1e6, r_ns = median_u64(raw, repeat) / 1e6;
	report("hash_chain", B, o_ns, "token", "xxh3_128", r_ns);
	if (!json)
		printf("%-22s %5u %10.0f Mtokens/s  xxh3_128 %.0f Mtokens/s\n", "hash_throughput", B,
		       1e3 / o_ns, 1e3 / r_ns);
	free(tokens);
	free(ours);
	free(raw);
}

/*
 * Bounded retention, per generated token: append one token, report the attention over every
 * held token (h2o), commit.  K/V memory of a 7B geometry (32 layers, 8 KV heads, head dim 128,
 * bf16: 2 KiB of K and 2 KiB of V per layer and token) so token-granular compaction copies what
 * a real pool would.
 */
enum { RET_FULL, RET_SINKS, RET_H2O_BLOCKS, RET_H2O_TOKENS };

struct kv_arena {
	uint8_t *mem;
	uint32_t B;
};

#define KV_LAYERS 32u
#define KV_SLOT 2048u /* one layer's K (or V) of one token */

/* The host backend's gather: per slot, per layer a K and a V copy. */
static void arena_copy_slots(void *ctx, const struct core_slot_copy *c, uint32_t n)
{
	struct kv_arena *a = ctx;
	const uint64_t layer = 2ull * a->B * KV_SLOT, block = KV_LAYERS * layer;

	for (uint32_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < KV_LAYERS; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				uint64_t off = l * layer + kv * (uint64_t)a->B * KV_SLOT;

				memcpy(a->mem + c[i].dst * block + off + c[i].dst_slot * KV_SLOT,
				       a->mem + c[i].src * block + off + c[i].src_slot * KV_SLOT,
				       KV_SLOT);
			}
}

static double bench_retention_one(uint32_t B, int kind, uint32_t budget)
{
	enum { N = 20000 };
	const uint32_t capacity = kind == RET_FULL ? N / B + 8 : 2 * budget / B + 16;
	struct kv_arena a = { .B = B };
	struct core_config cfg = { .capacity_blocks = capacity, .block_tokens = B,
				   .max_sequences = 4, .max_seq_tokens = N + 1,
				   .copy_block = no_copy, .copy_slots = arena_copy_slots,
				   .copy_ctx = &a };
	uint64_t *samples = calloc(repeat, sizeof(*samples));
	float *w = malloc((size_t)(budget + 2 * B) * sizeof(*w));
	struct core *c;
	double med;

	a.mem = kind == RET_H2O_TOKENS ? calloc((size_t)capacity * B, 2ull * KV_LAYERS * KV_SLOT)
				       : NULL;
	if (!samples || !w || (kind == RET_H2O_TOKENS && !a.mem) || core_new(&cfg, &c) < 0)
		abort();
	for (uint32_t i = 0; i < budget + 2 * B; i++)
		w[i] = 0.001f * (float)(i % 97);
	uint32_t *held = malloc((size_t)(N / B + 2) * sizeof(*held));

	if (!held)
		abort();
	for (uint32_t r = 0; r < repeat; r++) {
		uint32_t tok = 1, nheld = 0;
		struct core_open o = { .tokens = &tok, .ntokens = 1 };
		uint64_t seq, t;

		if (kind == RET_SINKS) {
			o.retention = CORE_RETAIN_SINKS;
			o.n_sink = 4;
			o.recent = budget - 4;
		} else if (kind != RET_FULL) {
			o.retention = CORE_RETAIN_H2O;
			o.recent = budget / 4;
			o.budget = budget;
			o.decay = 0.99f;
			o.granularity = kind == RET_H2O_TOKENS ? CORE_H2O_TOKENS : CORE_H2O_BLOCKS;
		}
		if (core_seq_open(c, &o, &seq, NULL) < 0)
			abort();
		t = now_ns();
		for (uint32_t i = 1; i < N; i++) {
			struct core_seq_info si;

			tok = i;
			if (core_seq_append(c, seq, &tok, 1) < 0)
				abort();
			if (kind == RET_H2O_BLOCKS || kind == RET_H2O_TOKENS) {
				uint32_t keep = 0;

				/*
				 * The step's attention over everything held, run by run.  Like an
				 * engine, it tracks the entries it holds (entries only ever turn
				 * into holes) instead of scanning the whole table.
				 */
				core_seq_info(c, seq, &si);
				if (nheld == 0 || held[nheld - 1] != si.nblocks - 1)
					held[nheld++] = si.nblocks - 1;
				for (uint32_t k = 0; k < nheld; k++) {
					uint32_t b = held[k], n = (b + 1) * B <= i + 1 ? B : i + 1 - b * B;

					if (si.table[b] == CORE_NONE)
						continue;
					held[keep++] = b;
					if (core_seq_scores(c, seq, b * B, w, n) < 0)
						abort();
				}
				nheld = keep;
				if (si.npacked && core_seq_scores_packed(c, seq, w, si.npacked) < 0)
					abort();
			}
			if (core_seq_commit(c, seq, i + 1) < 0)
				abort();
		}
		samples[r] = (now_ns() - t) * 1000 / (N - 1);
		core_seq_close(c, seq);
	}
	med = median_u64(samples, repeat) / 1000;
	core_free(c);
	free(held);
	free(a.mem);
	free(samples);
	free(w);
	return med;
}

/*
 * A pool full of cached chains of many kinds, as a serving pool is: conversations that come
 * back turn after turn (each turn its chain plus a block), documents of 1 to 128 blocks asked
 * about once or again, all at a request per time unit.  Every value class gets blocks.
 */
static void warm_pool(struct core *c, uint32_t B, uint32_t capacity, uint32_t *buf,
		      uint64_t *rng, double *now)
{
	enum { CONVS = 256, MAX_TURN_BLOCKS = 48 };
	static uint32_t turns[CONVS];
	static uint64_t stream[CONVS];

	for (uint32_t i = 0; i < 4 * capacity / 8; i++) {
		uint64_t x = *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
		uint32_t kind = (uint32_t)(x >> 60) % 3, nb;
		uint64_t id;

		if (kind == 0) { /* a conversation's next turn */
			uint32_t k = (uint32_t)(x >> 32) % CONVS;

			if (turns[k] == 0 || turns[k] >= MAX_TURN_BLOCKS)
				stream[k] = x, turns[k] = 0;
			nb = ++turns[k];
			id = stream[k];
		} else { /* a document: a new one, or one of the last few again */
			nb = 1u << ((x >> 40) % 8);
			id = kind == 1 ? x : (x >> 20) % 16;
		}
		for (size_t t = 0; t < (size_t)nb * B; t++)
			buf[t] = token_of(id | 1, t);
		struct core_open o = { .tokens = buf, .ntokens = nb * B };
		uint64_t seq;

		core_set_now(c, ++*now);
		if (core_seq_open(c, &o, &seq, NULL) < 0 || core_seq_commit(c, seq, nb * B) < 0)
			abort();
		core_seq_close(c, seq);
	}
}

/*
 * One eviction: a fresh one-block prompt opened and closed in a full pool, under LRU and under
 * the value policy; and the value policy's decision alone (value_victim on the same warm pool,
 * undone after each call).  The target for a decision is 100 ns.
 */
static void bench_evict(uint32_t B)
{
	enum { BATCH = 4096 };
	const uint32_t capacity = B >= 256 ? 8192 : 65536;
	uint64_t *lru = calloc(repeat, sizeof(uint64_t)), *val = calloc(repeat, sizeof(uint64_t));
	uint64_t *dec = calloc(repeat, sizeof(uint64_t));
	uint32_t *buf = malloc((size_t)128 * B * sizeof(uint32_t));

	for (uint32_t e = CORE_EVICT_LRU; e <= CORE_EVICT_VALUE; e++) {
		struct core_config cfg = { .capacity_blocks = capacity, .block_tokens = B,
					   .max_sequences = 64, .max_seq_tokens = 128 * B,
					   .copy_block = no_copy, .eviction = e };
		uint64_t rng = 42, next = UINT64_C(1) << 40;
		double now = 0;
		struct core *c;

		if (core_new(&cfg, &c) < 0)
			abort();
		warm_pool(c, B, capacity, buf, &rng, &now);
		for (uint32_t r = 0; r < repeat; r++) {
			uint64_t t = now_ns();

			for (uint32_t i = 0; i < BATCH; i++) {
				struct core_open o = { .tokens = buf, .ntokens = B };
				uint64_t seq;

				for (uint32_t k = 0; k < B; k++)
					buf[k] = token_of(next, k);
				next++;
				core_set_now(c, ++now);
				if (core_seq_open(c, &o, &seq, NULL) < 0 ||
				    core_seq_commit(c, seq, B) < 0)
					abort();
				core_seq_close(c, seq);
			}
			(e == CORE_EVICT_LRU ? lru : val)[r] = (now_ns() - t) * 1000 / BATCH;
			/* Back to a pool of many kinds for the next batch. */
			warm_pool(c, B, capacity / 8, buf, &rng, &now);
		}
		if (e == CORE_EVICT_VALUE) {
			struct value *v = c->value;
			struct core_value_stats st;

			value_get_stats(v, &st);
			for (uint32_t r = 0; r < repeat; r++) {
				uint64_t t = now_ns();

				for (uint32_t i = 0; i < BATCH; i++) {
					value_set_now(v, now + i);
					sink += value_victim(v, c->pool.lru_head);
				}
				dec[r] = (now_ns() - t) * 1000 / BATCH;
			}
			/* Every class had blocks: the scan saw every segment. */
			for (uint32_t k = 1; k < st.nclasses; k++)
				if (!json && !st.cls[k].cached)
					printf("(class %s empty)\n", st.cls[k].name);
		}
		core_free(c);
	}
	double l = median_u64(lru, repeat) / 1000, vv = median_u64(val, repeat) / 1000;
	report("evict_value", B, vv, "eviction", "evict_lru", l);
	report("evict_decision", B, median_u64(dec, repeat) / 1000, "decision", NULL, 0);
	free(lru);
	free(val);
	free(dec);
	free(buf);
}

static void bench_retention(uint32_t B)
{
	static const char *const names[] = { "full", "sinks", "h2o_blocks", "h2o_tokens" };
	const uint32_t budget = 128;
	double full = bench_retention_one(B, RET_FULL, budget);

	report("retention_full", B, full, "token", NULL, 0);
	for (int k = RET_SINKS; k <= RET_H2O_TOKENS; k++) {
		char metric[32];

		snprintf(metric, sizeof(metric), "retention_%s", names[k]);
		report(metric, B, bench_retention_one(B, k, budget), "token", "full", full);
	}
}

int cmd_micro(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "block-tokens", required_argument, NULL, 'b' },
		{ "repeat", required_argument, NULL, 'r' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	uint32_t sizes[MAX_SIZES] = { 16, 512 };
	int nsizes = 2, opt;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'b':
			nsizes = parse_u32_list(optarg, sizes, MAX_SIZES);
			if (nsizes < 0) {
				fprintf(stderr, "kvpaged-bench: --block-tokens: expected N[,N...]\n");
				return 2;
			}
			for (int i = 0; i < nsizes; i++)
				if (!sizes[i] || sizes[i] > CORE_MAX_BLOCK_TOKENS) {
					fprintf(stderr, "kvpaged-bench: --block-tokens: 1..%u\n",
						CORE_MAX_BLOCK_TOKENS);
					return 2;
				}
			break;
		case 'r':
			if (parse_u32(optarg, &repeat) < 0 || repeat == 0) {
				fprintf(stderr, "kvpaged-bench: --repeat: a positive integer\n");
				return 2;
			}
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			puts("usage: kvpaged-bench micro [--block-tokens N[,N...]] [--repeat R] [--json]\n"
			     "medians over R batches (default 31); blocks default 16,512");
			return 0;
		default:
			return 2;
		}
	}
	if (!json)
		printf("%-22s %5s %13s\n", "metric", "B", "median");
	report("alloc_free", 0, bench_alloc_free(), "pair", NULL, 0);
	for (int i = 0; i < nsizes; i++) {
		report("append", sizes[i], bench_append(sizes[i]), "token", NULL, 0);
		bench_lookup(sizes[i]);
		bench_fork_cow(sizes[i]);
		bench_hash(sizes[i]);
		bench_evict(sizes[i]);
		if (sizes[i] <= 128)
			bench_retention(sizes[i]);
	}
	return 0;
}

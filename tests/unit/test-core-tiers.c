/* SPDX-License-Identifier: MIT */
/*
 * The tiers below the pool, in constructed cases: where evicted blocks go, what a lookup
 * promotes and in how many batches, the cost model's swap-or-drop per victim and its log,
 * failed loads, lost slots and restored ones, and the pass that moves what is cached down to a
 * persistent tier before a clean stop.
 */
#include <errno.h>

#include "daemon/core/core-internal.h"
#include "tests/unit/testutil.h"

#define B 4

/*
 * The levels tiered() listed: the host tier first, then the file tier, each only when it has
 * slots (0: not there), as the daemon lists them.
 */
static uint32_t HOST, FILE_TIER;

/* Storage that remembers which block (by its first token) each slot holds. */
struct fake_store {
	uint32_t host[64], file[64]; /* first token of the block stored; 0: none */
	uint32_t stores[CORE_MAX_TIERS + 1], batches, loaded;
	uint32_t file_order[64], nfile_order; /* first tokens stored into the file tier, in order */
	int fail_store;   /* a store into the file tier of a block with this first token fails */
	int fail_load_at; /* 1-based index in a batch that fails, 0: none */
	int fail_code;    /* and how */
	const struct core *c;
};

static int store(void *ctx, uint32_t from_tier, uint32_t from, uint32_t to_tier, uint32_t to,
		 const struct core_key *key)
{
	struct fake_store *fs = ctx;
	uint32_t first;

	if (from_tier == CORE_TIER_POOL) {
		ck_assert_ptr_nonnull(key->tokens);
		first = key->tokens[0];
	} else {
		ck_assert_uint_eq(from_tier, HOST);
		ck_assert_ptr_null(key->tokens);
		first = fs->host[from];
	}
	if (to_tier == FILE_TIER && fs->fail_store && first == (uint32_t)fs->fail_store)
		return -EIO;
	(to_tier == HOST ? fs->host : fs->file)[to] = first;
	fs->stores[to_tier]++;
	if (to_tier == FILE_TIER && fs->nfile_order < 64)
		fs->file_order[fs->nfile_order++] = first;
	return 0;
}

static void load(void *ctx, struct core_load *loads, uint32_t n)
{
	struct fake_store *fs = ctx;

	fs->batches++;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t first = (loads[i].tier == HOST ? fs->host : fs->file)[loads[i].slot];

		loads[i].result = first == loads[i].key.tokens[0] ? 0 : -EBADMSG;
		if (fs->fail_load_at && i + 1 == (uint32_t)fs->fail_load_at)
			loads[i].result = fs->fail_code;
		fs->loaded += loads[i].result == 0;
	}
}

static const struct core_tier_ops ops = { .store = store, .load = load };

static struct fake_mem mem;
static struct fake_store fs;

/* The cost model's figures: the model's, and each tier's bandwidth (0: unknown). */
struct tier_cost {
	struct core_cost_config model;
	double host_bandwidth, file_bandwidth;
};

static struct core *tiered(uint32_t capacity, uint32_t host, uint32_t file,
			   const struct tier_cost *cost)
{
	struct core_config cfg = {
		.capacity_blocks = capacity,
		.block_tokens = B,
		.max_sequences = 8,
		.max_seq_tokens = 64,
		.copy_block = fake_copy,
		.copy_ctx = &mem,
	};
	struct core *c = NULL;

	HOST = FILE_TIER = 0;
	if (host) {
		cfg.tiers[cfg.ntiers++] = (struct core_tier_config){
			.slots = host, .bandwidth = cost ? cost->host_bandwidth : 0, .ops = &ops,
			.ctx = &fs };
		HOST = cfg.ntiers;
	}
	if (file) {
		cfg.tiers[cfg.ntiers++] = (struct core_tier_config){
			.slots = file, .bandwidth = cost ? cost->file_bandwidth : 0, .ops = &ops,
			.ctx = &fs };
		FILE_TIER = cfg.ntiers;
	}
	if (cost)
		cfg.cost = cost->model;
	memset(&fs, 0, sizeof(fs));
	fake_mem_init(&mem, capacity, B);
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	fs.c = c;
	return c;
}

static void done(struct core *c)
{
	assert_verified(c);
	core_free(c);
	free(mem.slots);
}

static struct core_tier_stats tstats(const struct core *c, uint32_t t)
{
	struct core_tier_stats st;

	ck_assert_int_eq(core_get_tier_stats(c, t, &st), 0);
	return st;
}

/* Opens, commits and closes a prompt: its full blocks end up cached. */
static void cache_prompt(struct core *c, const uint32_t *t, uint32_t n)
{
	struct core_open o = { .tokens = t, .ntokens = n };
	uint64_t s;

	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), 0);
	ck_assert_int_eq(core_seq_commit(c, s, n), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
}

static uint32_t open_cached(struct core *c, const uint32_t *t, uint32_t n, uint64_t *s)
{
	struct core_open o = { .tokens = t, .ntokens = n };
	uint32_t cached = 99;

	ck_assert_int_eq(seq_open_cached(c, &o, s, &cached), 0);
	return cached;
}

START_TEST(test_config_needs_storage)
{
	struct core_config cfg = { .capacity_blocks = 4, .block_tokens = B, .max_sequences = 1,
				   .max_seq_tokens = 16, .copy_block = fake_copy,
				   .tiers = { { .slots = 4 } }, .ntiers = 1 };
	struct core *c = NULL;

	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
	ck_assert_ptr_null(c);
}
END_TEST

/*
 * Pool 4, host 2, file 8.  p's 3 blocks are evicted leaf first (p2, p1, p0) into the host tier;
 * p0 pushes p2 on into the file.  Reopening p promotes all three in one batch.
 */
START_TEST(test_demote_then_promote_in_one_batch)
{
	struct core *c = tiered(4, 2, 8, NULL);
	uint32_t p[12], q[16];
	uint64_t s;

	fill_tokens(p, 12, 100);
	fill_tokens(q, 16, 500);
	cache_prompt(c, p, 12);
	ck_assert_uint_eq(open_cached(c, q, 16, &s), 0);
	ck_assert_uint_eq(tstats(c, HOST).demotions, 3);
	ck_assert_uint_eq(tstats(c, FILE_TIER).demotions, 1);
	ck_assert_uint_eq(fs.file[0], 108); /* p2 */
	ck_assert_uint_eq(tstats(c, HOST).used, 2);
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = p, .ntokens = 12 }), 12);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	assert_verified(c);

	ck_assert_uint_eq(open_cached(c, p, 12, &s), 12);
	ck_assert_uint_eq(fs.batches, 1);
	ck_assert_uint_eq(fs.loaded, 3);
	ck_assert_uint_eq(tstats(c, HOST).promotions, 2);
	ck_assert_uint_eq(tstats(c, FILE_TIER).promotions, 1);
	/* Promotion moves: the slots are free again, and the blocks are findable in the pool. */
	ck_assert_uint_eq(tstats(c, FILE_TIER).used, 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	ck_assert_uint_eq(open_cached(c, p, 12, &s), 12);
	ck_assert_uint_eq(fs.batches, 1); /* from the pool this time */
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/*
 * A load that fails ends the reused prefix there and is counted.  A damaged slot (-EBADMSG) is
 * thrown away; after an I/O error the slot stays, and a later lookup may load it.
 */
START_TEST(test_failed_load_is_a_counted_miss)
{
	struct core *c = tiered(4, 0, 8, NULL);
	uint32_t p[12], q[16], cached;
	uint64_t s;

	fill_tokens(p, 12, 100);
	fill_tokens(q, 16, 500);
	cache_prompt(c, p, 12);
	cache_prompt(c, q, 16);
	ck_assert_uint_eq(tstats(c, FILE_TIER).used, 3);
	fs.fail_load_at = 2;
	fs.fail_code = -EIO;
	ck_assert_uint_eq(open_cached(c, p, 12, &s), 4);
	ck_assert_uint_eq(tstats(c, FILE_TIER).load_errors, 1);
	ck_assert_uint_eq(tstats(c, FILE_TIER).used, 2 + 3); /* p1 and p2 stay */
	ck_assert_int_eq(core_seq_close(c, s), 0);
	assert_verified(c);
	core_free(c);
	free(mem.slots);

	c = tiered(4, 0, 8, NULL);
	cache_prompt(c, p, 12);
	cache_prompt(c, q, 16);
	fs.fail_load_at = 2;
	fs.fail_code = -EBADMSG;
	cached = open_cached(c, p, 12, &s);
	ck_assert_uint_eq(cached, 4);
	ck_assert_uint_eq(tstats(c, FILE_TIER).load_errors, 1);
	ck_assert_uint_eq(tstats(c, FILE_TIER).promotions, 1);
	/*
	 * p0 moved up, p1 was thrown away, p2 stays below (unreachable until p1 is back); the
	 * three blocks of q the open evicted came down.
	 */
	ck_assert_uint_eq(tstats(c, FILE_TIER).used, 1 + 3);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

static uint64_t open_deferred(struct core *c, const uint32_t *t, uint32_t n, uint32_t *cached)
{
	struct core_open o = { .tokens = t, .ntokens = n, .flags = CORE_OPEN_DEFER_LOADS };
	uint64_t s;

	ck_assert_int_eq(seq_open_cached(c, &o, &s, cached), 0);
	return s;
}

static uint32_t committed(const struct core *c, uint64_t s)
{
	struct core_seq_info si;

	ck_assert_int_eq(core_seq_info(c, s, &si), 0);
	return si.ncommitted;
}

/*
 * Deferred loads: the open returns LOADING without calling the tier's load, the caller fills
 * the blocks and reports, and core_seq_loaded takes the results as a synchronous promotion
 * would.  Meanwhile the sequence refuses everything, its slots stay held (verified), and a
 * second open of the same prompt loads the same slots into blocks of its own.
 */
START_TEST(test_deferred_loads)
{
	struct core *c = tiered(8, 2, 8, NULL);
	uint32_t p[12], q[32], cached = 99, n, n2;
	struct core_load *loads, *loads2;
	struct core_seq_info si;
	uint64_t s, s2, child;

	fill_tokens(p, 12, 100);
	fill_tokens(q, 32, 500);
	cache_prompt(c, p, 12);
	cache_prompt(c, q, 32); /* pushes p's 3 blocks down */
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = p, .ntokens = 12 }), 12);

	s = open_deferred(c, p, 12, &cached);
	ck_assert_uint_eq(cached, 0);
	ck_assert_uint_eq(fs.batches, 0);
	ck_assert_int_eq(core_seq_info(c, s, &si), 0);
	ck_assert_uint_eq(si.state, CORE_SEQ_LOADING);
	ck_assert_int_eq(core_seq_pending_loads(c, s, &loads, &n), 0);
	ck_assert_uint_eq(n, 3);
	for (uint32_t k = 0; k < n; k++) {
		ck_assert_uint_eq(loads[k].block, si.table[k]);
		ck_assert_uint_eq(loads[k].key.tokens[0], p[k * B]);
	}
	assert_verified(c);
	ck_assert_int_eq(core_seq_append(c, s, p, 1), -EBUSY);
	ck_assert_int_eq(core_seq_commit(c, s, 12), -EBUSY);
	ck_assert_int_eq(core_seq_park(c, s), -EBUSY);
	ck_assert_int_eq(core_seq_fork(c, s, &child), -EBUSY);
	ck_assert_int_eq(core_seq_resume(c, s, NULL), -EBUSY);
	ck_assert_int_eq(core_seq_close(c, s), -EBUSY);

	/* The same prompt again, before the first is loaded: its own blocks, the same slots. */
	s2 = open_deferred(c, p, 12, &cached);
	ck_assert_int_eq(core_seq_pending_loads(c, s2, &loads2, &n2), 0);
	ck_assert_uint_eq(n2, 3);
	for (uint32_t k = 0; k < n2; k++) {
		ck_assert_uint_eq(loads2[k].slot, loads[k].slot);
		ck_assert_uint_ne(loads2[k].block, loads[k].block);
	}
	assert_verified(c);

	/* The caller's reads: the fake storage checks what each slot holds. */
	load(&fs, loads, n);
	ck_assert_int_eq(core_seq_loaded(c, s), 0);
	ck_assert_int_eq(core_seq_loaded(c, s), -EINVAL);
	ck_assert_uint_eq(committed(c, s), 12);
	ck_assert_uint_eq(tstats(c, HOST).promotions + tstats(c, FILE_TIER).promotions,
			  3);
	assert_verified(c);
	/*
	 * The second: its slots were released by the first, but it held them, so its reads are
	 * good too.  Its first two blocks are the first's, which are cached by now: it shares
	 * them (as a commit would) and frees its own copies; its third read failed.
	 */
	load(&fs, loads2, n2);
	loads2[2].result = -EBADMSG;
	ck_assert_int_eq(core_seq_loaded(c, s2), 0);
	ck_assert_uint_eq(committed(c, s2), 8);
	{
		struct core_seq_info a, b;
		struct core_stats st;

		ck_assert_int_eq(core_seq_info(c, s, &a), 0);
		ck_assert_int_eq(core_seq_info(c, s2, &b), 0);
		ck_assert_uint_eq(b.table[0], a.table[0]);
		ck_assert_uint_eq(b.table[1], a.table[1]);
		ck_assert_uint_ne(b.table[2], a.table[2]);
		core_get_stats(c, &st);
		ck_assert_uint_eq(st.dedup_blocks, 2);
	}
	assert_verified(c);
	/* Its third block, recomputed and committed, is the first's too: replaced, shared. */
	ck_assert_int_eq(core_seq_commit(c, s2, 12), 1);
	ck_assert_int_eq(core_seq_close(c, s2), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	/* A prompt whose blocks are all in the pool opens ACTIVE, as without the flag. */
	s = open_deferred(c, p, 12, &cached);
	ck_assert_uint_eq(cached, 12);
	ck_assert_int_eq(core_seq_pending_loads(c, s, &loads, &n), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/* A dropped sequence whose blocks were swapped out resumes LOADING, then takes its loads. */
START_TEST(test_deferred_resume)
{
	struct core *c = tiered(4, 8, 0, NULL);
	uint32_t a[16], b[16], recompute = 99, n;
	struct core_load *loads;
	uint64_t sa, sb;

	fill_tokens(a, 16, 100);
	fill_tokens(b, 16, 500);
	ck_assert_uint_eq(open_cached(c, a, 16, &sa), 0);
	ck_assert_int_eq(core_seq_commit(c, sa, 16), 0);
	ck_assert_int_eq(core_seq_park(c, sa), 0);
	ck_assert_uint_eq(open_cached(c, b, 16, &sb), 0); /* swaps a out */
	ck_assert_int_eq(core_seq_close(c, sb), 0);
	ck_assert_int_eq(core_seq_resume_flags(c, sa, CORE_OPEN_DEFER_LOADS, &recompute), 0);
	ck_assert_int_eq(core_seq_pending_loads(c, sa, &loads, &n), 0);
	ck_assert_uint_eq(n, 3); /* the last block is recomputed (its logits are needed) */
	ck_assert_uint_eq(recompute, 16);
	ck_assert_uint_eq(fs.batches, 0);
	assert_verified(c);
	load(&fs, loads, n);
	ck_assert_int_eq(core_seq_loaded(c, sa), 0);
	ck_assert_uint_eq(committed(c, sa), 12);
	ck_assert_int_eq(core_seq_resume_flags(c, sa, 1u << 3, &recompute), -EINVAL);
	ck_assert_int_eq(core_seq_close(c, sa), 0);
	done(c);
}
END_TEST

/* One parked victim each way: the cost model swaps a big model's blocks, drops a tiny one's. */
static void preempt_one(const struct tier_cost *cost, struct core_preemption *ret,
			uint32_t *ret_host_demotions)
{
	struct core *c = tiered(4, 8, 0, cost);
	uint32_t a[16], b[16];
	uint64_t sa, sb;

	fill_tokens(a, 16, 100);
	fill_tokens(b, 16, 500);
	ck_assert_uint_eq(open_cached(c, a, 16, &sa), 0);
	ck_assert_int_eq(core_seq_commit(c, sa, 16), 0);
	ck_assert_int_eq(core_seq_park(c, sa), 0);
	ck_assert_uint_eq(open_cached(c, b, 16, &sb), 0);
	ck_assert_uint_eq(core_get_preemptions(c, ret, 1), 1);
	*ret_host_demotions = (uint32_t)tstats(c, HOST).demotions;
	ck_assert_int_eq(core_seq_close(c, sb), 0);
	ck_assert_int_eq(core_seq_close(c, sa), 0);
	done(c);
}

START_TEST(test_swap_or_drop_by_cost)
{
	/* 1 MB blocks over 1 GB/s: 4 ms to bring 4 blocks back. */
	struct tier_cost big = { .model = { .block_bytes = 1e6, .params = 1e9, .flops = 1e12 },
				 .host_bandwidth = 1e9 };
	struct tier_cost tiny = big;
	struct core_preemption p;
	uint32_t demoted;

	tiny.model.params = 1e6;
	/* Recompute 16 tokens of a 1e9-parameter model at 1 TFLOP/s: 32 ms > 4 ms: swap. */
	preempt_one(&big, &p, &demoted);
	ck_assert_uint_eq(p.decision, CORE_DECISION_SWAP);
	ck_assert_uint_eq(p.reason, CORE_REASON_SWAP_CHEAPER);
	ck_assert_uint_eq(p.swap_blocks, 4);
	ck_assert_uint_eq(p.tier, HOST);
	ck_assert_double_eq_tol(p.swap_s, 4e-3, 1e-12);
	ck_assert_double_eq_tol(p.recompute_s, 32e-3, 1e-12);
	ck_assert_uint_eq(demoted, 4);
	/* A 1e6-parameter model: 32 us < 4 ms: drop, and its blocks are not moved down. */
	preempt_one(&tiny, &p, &demoted);
	ck_assert_uint_eq(p.decision, CORE_DECISION_DROP);
	ck_assert_uint_eq(p.reason, CORE_REASON_RECOMPUTE_CHEAPER);
	ck_assert_uint_eq(demoted, 0);
	/* No figures: swap, which loses no work. */
	preempt_one(NULL, &p, &demoted);
	ck_assert_uint_eq(p.decision, CORE_DECISION_SWAP);
	ck_assert_uint_eq(p.reason, CORE_REASON_NO_COST_MODEL);
	ck_assert_uint_eq(demoted, 4);
}
END_TEST

/* A tier too slow to beat recomputing is searched but not promoted from: counted skipped. */
START_TEST(test_slow_tier_is_not_promoted_from)
{
	struct tier_cost cost = { .model = { .block_bytes = 1e6, .params = 1e6, .flops = 1e12 },
				  .file_bandwidth = 1e6 };
	struct core *c = tiered(4, 0, 8, &cost);
	uint32_t p[12], q[16];
	uint64_t s;

	ck_assert(!core_tier_promotes(c, FILE_TIER));
	ck_assert(!core_tier_promotes(c, HOST)); /* there is no host tier */
	fill_tokens(p, 12, 100);
	fill_tokens(q, 16, 500);
	cache_prompt(c, p, 12);
	cache_prompt(c, q, 16);
	ck_assert_uint_eq(tstats(c, FILE_TIER).used, 3);
	ck_assert_uint_eq(open_cached(c, p, 12, &s), 0);
	ck_assert_uint_eq(fs.batches, 0);
	ck_assert_uint_eq(tstats(c, FILE_TIER).skipped, 1);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/* Restored slots (a persisted file tier) serve lookups; lost ones are forgotten. */
START_TEST(test_restore_and_lose)
{
	struct core *c, *ref = tiered(4, 0, 0, NULL);
	uint32_t p[8];
	struct core_key k0, k1;
	uint64_t s;

	/* The hashes a pool computes for p's two blocks. */
	fill_tokens(p, 8, 100);
	cache_prompt(ref, p, 8);
	for (uint32_t b = 0; b < 4; b++) {
		const struct core_block *blk = &ref->pool.blocks[b];

		if (!(blk->flags & CORE_BLOCK_INDEXED))
			continue;
		if (!blk->parent.lo && !blk->parent.hi)
			k0 = (struct core_key){ .hash = blk->hash };
		else
			k1 = (struct core_key){ .hash = blk->hash, .parent = blk->parent };
	}
	core_free(ref);
	free(mem.slots);
	c = tiered(4, 0, 8, NULL);
	fs.file[5] = 100;
	fs.file[2] = 104;
	ck_assert_int_eq(core_tier_restore(c, FILE_TIER, 5, &k0), 0);
	ck_assert_int_eq(core_tier_restore(c, FILE_TIER, 2, &k1), 0);
	ck_assert_int_eq(core_tier_restore(c, FILE_TIER, 3, &k1), -EEXIST);
	ck_assert_int_eq(core_tier_restore(c, FILE_TIER, 5, &k1), -EEXIST);
	ck_assert_int_eq(core_tier_restore(c, FILE_TIER, 8, &k1), -EINVAL);
	ck_assert_int_eq(core_tier_restore(c, HOST, 0, &k1), -EINVAL);
	assert_verified(c);
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = p, .ntokens = 8 }), 8);

	ck_assert_int_eq(core_tier_lost(c, FILE_TIER, 2), 0);
	ck_assert_int_eq(core_tier_lost(c, FILE_TIER, 2), -ENOENT);
	ck_assert_uint_eq(tstats(c, FILE_TIER).lost, 1);
	ck_assert_uint_eq(open_cached(c, p, 8, &s), 4);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/*
 * A persisted file tier can hold a chain longer than the pool it is restored under: a lookup
 * walks no further than a sequence could hold (ASan would see the walk arrays overrun).
 */
START_TEST(test_restored_chain_longer_than_the_pool)
{
	struct core *c = tiered(4, 0, 32, NULL);
	struct core_hash parent = { 0, 0 };
	uint32_t p[64];

	fill_tokens(p, 64, 100);
	for (uint32_t i = 0; i < 16; i++) {
		struct core_key k = { .parent = parent };

		k.hash = core_hash_block(NULL, parent, core_hash_ns(0, 0), p + i * B, B);
		ck_assert_int_eq(core_tier_restore(c, FILE_TIER, i, &k), 0);
		fs.file[i] = p[i * B];
		parent = k.hash;
	}
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = p, .ntokens = 64 }),
			  4 * B);
	done(c);
}
END_TEST

/* drop-cache empties every level and moves nothing. */
START_TEST(test_drop_cache_empties_the_tiers)
{
	struct core *c = tiered(4, 2, 8, NULL);
	uint32_t p[12], q[16];
	uint32_t stores, below;

	fill_tokens(p, 12, 100);
	fill_tokens(q, 16, 500);
	cache_prompt(c, p, 12);
	cache_prompt(c, q, 16);
	stores = fs.stores[HOST] + fs.stores[FILE_TIER];
	below = tstats(c, HOST).used + tstats(c, FILE_TIER).used;
	ck_assert_uint_eq(below, 2 + 1);
	ck_assert_uint_eq(core_drop_cache(c), 4 + below);
	ck_assert_uint_eq(fs.stores[HOST] + fs.stores[FILE_TIER], stores);
	ck_assert_uint_eq(tstats(c, HOST).used, 0);
	ck_assert_uint_eq(tstats(c, FILE_TIER).used, 0);
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = p, .ntokens = 12 }), 0);
	done(c);
}
END_TEST

/* Runs a persist pass into the file tier, max blocks per call, to its end. */
static struct core_persist_pass persist_all(struct core *c, uint32_t max)
{
	struct core_persist_pass pass = { 0 };
	int n, calls = 0;

	while ((n = core_tier_persist(c, FILE_TIER, max, &pass)) > 0) {
		ck_assert_int_le(n, (int)max);
		ck_assert_int_lt(++calls, 100);
		assert_verified(c);
	}
	ck_assert_int_eq(n, 0);
	return pass;
}

/*
 * Pool 4, host 2, file 8: p's blocks went down (p1, p0 in the host tier, p2 in the file), q's
 * four are cached in the pool.  The pass moves the pool's newest first (q0: a parent before its
 * children), then the host tier's newest first, and the whole of both prefixes is then found in
 * the file tier alone.  A block a sequence holds stays where it is.
 */
START_TEST(test_persist_moves_the_pool_and_the_host_tier_down)
{
	static const uint32_t order[] = { 500, 504, 508, 512, 100, 104 };
	struct core *c = tiered(4, 2, 8, NULL);
	struct core_persist_pass pass;
	uint32_t p[12], q[16], r[4];
	struct core_usage u;
	uint64_t s;

	fill_tokens(p, 12, 100);
	fill_tokens(q, 16, 500);
	fill_tokens(r, 4, 900);
	cache_prompt(c, p, 12);
	cache_prompt(c, q, 16);
	ck_assert_uint_eq(fs.nfile_order, 1); /* p2, pushed out of the host tier */
	fs.nfile_order = 0;
	ck_assert_int_eq(core_tier_persist(c, CORE_TIER_POOL, 8, &pass), -EINVAL); /* no tier */
	ck_assert_int_eq(core_tier_persist(c, c->cfg.ntiers + 1, 8, &pass), -EINVAL);
	ck_assert_int_eq(core_tier_persist(c, FILE_TIER, 8, NULL), -EINVAL);

	pass = persist_all(c, 2);
	ck_assert_uint_eq(pass.moved, 6);
	ck_assert_uint_eq(pass.from_pool, 4);
	ck_assert_uint_eq(pass.from_tiers, 2);
	ck_assert_uint_eq(pass.dropped, 0);
	ck_assert(!pass.full);
	ck_assert_uint_eq(fs.nfile_order, 6);
	ck_assert_mem_eq(fs.file_order, order, sizeof(order));
	core_get_usage(c, &u);
	ck_assert_uint_eq(u.cached, 0);
	ck_assert_uint_eq(u.free, 4);
	ck_assert_uint_eq(tstats(c, HOST).used, 0);
	ck_assert_uint_eq(tstats(c, FILE_TIER).used, 7);
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = q, .ntokens = 16 }), 16);
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = p, .ntokens = 12 }), 12);
	/* A second pass finds nothing to move. */
	pass = persist_all(c, 8);
	ck_assert_uint_eq(pass.moved, 0);
	/* And they load back from the file. */
	ck_assert_uint_eq(open_cached(c, q, 16, &s), 16);
	ck_assert_uint_eq(tstats(c, FILE_TIER).promotions, 4);
	ck_assert_int_eq(core_seq_close(c, s), 0);

	/* A block a sequence holds is not the pass's. */
	ck_assert_uint_eq(open_cached(c, r, 4, &s), 0);
	ck_assert_int_eq(core_seq_commit(c, s, 4), 0);
	fs.nfile_order = 0;
	pass = persist_all(c, 8);
	ck_assert_uint_eq(pass.moved, 4); /* q again, not r */
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = r, .ntokens = 4 }), 4);
	core_get_usage(c, &u);
	ck_assert_uint_eq(u.in_use, 1);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/*
 * A file tier of 3 slots under 4 cached pool blocks and 2 host ones: the pass fills it with
 * the pool's 3 newest (q0..q2; p2, older, is pushed out) and stops there, leaving q3 and the
 * host tier as they were.  A block marked to be dropped, and one whose store fails, are
 * dropped, not kept.
 */
START_TEST(test_persist_stops_when_the_tier_is_full)
{
	struct core *c = tiered(4, 2, 3, NULL);
	struct core_persist_pass pass;
	uint32_t p[12], q[16];
	struct core_usage u;

	fill_tokens(p, 12, 100);
	fill_tokens(q, 16, 500);
	cache_prompt(c, p, 12);
	cache_prompt(c, q, 16);
	pass = persist_all(c, 8);
	ck_assert_uint_eq(pass.moved, 3);
	ck_assert(pass.full);
	core_get_usage(c, &u);
	ck_assert_uint_eq(u.cached, 1); /* q3, the leaf */
	ck_assert_uint_eq(tstats(c, HOST).used, 2);
	/* q0..q2 from the file (a walk that went below the pool stays below it), p0 and p1. */
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = q, .ntokens = 16 }), 12);
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = p, .ntokens = 12 }), 8);
	done(c);

	c = tiered(4, 2, 8, NULL);
	cache_prompt(c, p, 12);
	cache_prompt(c, q, 16);
	/* q1 was chosen to be recomputed; q2's write fails. */
	for (uint32_t b = 0; b < 4; b++)
		if (core_block_tokens(c, b)[0] == 504)
			c->pool.blocks[b].flags |= CORE_BLOCK_NODEMOTE;
	fs.fail_store = 508;
	pass = persist_all(c, 8);
	ck_assert_uint_eq(pass.moved, 4); /* q0, q3, p0, p1 */
	ck_assert_uint_eq(pass.dropped, 2);
	ck_assert_uint_eq(tstats(c, FILE_TIER).store_errors, 1);
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = q, .ntokens = 16 }), 4);
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = p, .ntokens = 12 }), 12);
	done(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("core-tiers");
	TCase *tc = tcase_create("tiers");

	tcase_add_test(tc, test_config_needs_storage);
	tcase_add_test(tc, test_demote_then_promote_in_one_batch);
	tcase_add_test(tc, test_failed_load_is_a_counted_miss);
	tcase_add_test(tc, test_deferred_loads);
	tcase_add_test(tc, test_deferred_resume);
	tcase_add_test(tc, test_swap_or_drop_by_cost);
	tcase_add_test(tc, test_slow_tier_is_not_promoted_from);
	tcase_add_test(tc, test_restore_and_lose);
	tcase_add_test(tc, test_drop_cache_empties_the_tiers);
	tcase_add_test(tc, test_restored_chain_longer_than_the_pool);
	tcase_add_test(tc, test_persist_moves_the_pool_and_the_host_tier_down);
	tcase_add_test(tc, test_persist_stops_when_the_tier_is_full);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

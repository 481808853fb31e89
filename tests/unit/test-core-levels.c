/* SPDX-License-Identifier: MIT */
/*
 * The tiers below the pool as a list of levels: three of them (pool -> A -> B -> C), each its
 * own storage that keeps the bytes it is given.  Demotion cascades down the whole chain, a
 * lookup finds blocks on every level and brings them up byte for byte with one load call per
 * level, each level's bandwidth decides on its own whether it is promoted from, and the list's
 * bounds are checked.
 */
#include <errno.h>

#include "daemon/core/core-internal.h"
#include "tests/unit/testutil.h"

#define B 4
#define NLEVELS 3

/* One level's storage: each slot keeps a block's "K/V" words, tokens and hash. */
struct level {
	struct levels *all;
	uint32_t id; /* its level in the core, 1 .. NLEVELS */
	uint32_t nslots;
	uint64_t *words;
	uint32_t *tokens;
	struct core_hash *hash;
	uint32_t stores, load_calls, loaded;
};

struct levels {
	struct level lv[NLEVELS + 1]; /* by level; [0] unused: the pool */
	struct fake_mem *mem;
};

static struct fake_mem mem;
static struct levels L;

static int level_store(void *ctx, uint32_t from_tier, uint32_t from, uint32_t to_tier,
		       uint32_t to, const struct core_key *key)
{
	struct level *dst = ctx;

	ck_assert_uint_eq(to_tier, dst->id);
	ck_assert_uint_lt(to, dst->nslots);
	if (from_tier == CORE_TIER_POOL) {
		/* Into the first level, or further down past levels whose every slot is held. */
		ck_assert_ptr_nonnull(key->tokens);
		memcpy(dst->words + (size_t)to * B, dst->all->mem->slots + (size_t)from * B,
		       B * sizeof(uint64_t));
		memcpy(dst->tokens + (size_t)to * B, key->tokens, B * sizeof(uint32_t));
	} else {
		const struct level *src = &dst->all->lv[from_tier];

		/* Down, from the storage of a level above. */
		ck_assert_uint_lt(from_tier, dst->id);
		ck_assert_ptr_null(key->tokens);
		ck_assert(core_hash_eq(src->hash[from], key->hash));
		memcpy(dst->words + (size_t)to * B, src->words + (size_t)from * B,
		       B * sizeof(uint64_t));
		memcpy(dst->tokens + (size_t)to * B, src->tokens + (size_t)from * B,
		       B * sizeof(uint32_t));
	}
	dst->hash[to] = key->hash;
	dst->stores++;
	return 0;
}

static void level_load(void *ctx, struct core_load *loads, uint32_t n)
{
	struct level *lv = ctx;

	lv->load_calls++;
	for (uint32_t i = 0; i < n; i++) {
		struct core_load *l = &loads[i];

		/* Each level is handed only its own hits. */
		ck_assert_uint_eq(l->tier, lv->id);
		if (!core_hash_eq(lv->hash[l->slot], l->key.hash) ||
		    memcmp(lv->tokens + (size_t)l->slot * B, l->key.tokens, B * sizeof(uint32_t))) {
			l->result = -EBADMSG;
			continue;
		}
		memcpy(lv->all->mem->slots + (size_t)l->block * B, lv->words + (size_t)l->slot * B,
		       B * sizeof(uint64_t));
		l->result = 0;
		lv->loaded++;
	}
}

static const struct core_tier_ops level_ops = { .store = level_store, .load = level_load };

/* A pool of capacity blocks over levels of slots[0], slots[1], slots[2] at these bandwidths. */
static struct core *chain(uint32_t capacity, const uint32_t slots[NLEVELS],
			  const double bandwidth[NLEVELS], const struct core_cost_config *cost)
{
	struct core_config cfg = {
		.capacity_blocks = capacity,
		.block_tokens = B,
		.max_sequences = 8,
		.max_seq_tokens = 64,
		.copy_block = fake_copy,
		.copy_ctx = &mem,
		.ntiers = NLEVELS,
	};
	struct core *c = NULL;

	fake_mem_init(&mem, capacity, B);
	memset(&L, 0, sizeof(L));
	L.mem = &mem;
	for (uint32_t t = 1; t <= NLEVELS; t++) {
		struct level *lv = &L.lv[t];

		*lv = (struct level){ .all = &L, .id = t, .nslots = slots[t - 1] };
		lv->words = calloc((size_t)lv->nslots * B, sizeof(*lv->words));
		lv->tokens = calloc((size_t)lv->nslots * B, sizeof(*lv->tokens));
		lv->hash = calloc(lv->nslots, sizeof(*lv->hash));
		ck_assert(lv->words && lv->tokens && lv->hash);
		cfg.tiers[t - 1] = (struct core_tier_config){
			.slots = slots[t - 1], .bandwidth = bandwidth ? bandwidth[t - 1] : 0,
			.ops = &level_ops, .ctx = lv };
	}
	if (cost)
		cfg.cost = *cost;
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	return c;
}

static void done(struct core *c)
{
	assert_verified(c);
	core_free(c);
	for (uint32_t t = 1; t <= NLEVELS; t++) {
		free(L.lv[t].words);
		free(L.lv[t].tokens);
		free(L.lv[t].hash);
	}
	free(mem.slots);
}

static struct core_tier_stats tstats(const struct core *c, uint32_t t)
{
	struct core_tier_stats st;

	ck_assert_int_eq(core_get_tier_stats(c, t, &st), 0);
	return st;
}

/* The "K/V" the engine computes for token position i of the prompt starting at base. */
static uint64_t kv_word(uint32_t base, uint32_t i)
{
	return (uint64_t)base << 32 | (i * 2654435761u);
}

/* Opens a prompt, "prefills" its K/V into the pool, commits and closes it: cached. */
static void cache_prompt(struct core *c, const uint32_t *t, uint32_t n)
{
	struct core_open o = { .tokens = t, .ntokens = n };
	struct core_seq_info si;
	uint64_t s;

	ck_assert_int_eq(core_seq_open(c, &o, &s, NULL), 0);
	ck_assert_int_eq(core_seq_info(c, s, &si), 0);
	for (uint32_t i = 0; i < n; i++)
		mem.slots[(size_t)si.table[i / B] * B + i % B] = kv_word(t[0], i);
	ck_assert_int_eq(core_seq_commit(c, s, n), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
}

/* Whether every token of seq's first n reads the K/V its prompt (starting at base) had. */
static void assert_kv(const struct core *c, uint64_t s, uint32_t base, uint32_t n)
{
	struct core_seq_info si;

	ck_assert_int_eq(core_seq_info(c, s, &si), 0);
	for (uint32_t i = 0; i < n; i++)
		ck_assert_uint_eq(mem.slots[(size_t)si.table[i / B] * B + i % B], kv_word(base, i));
}

/* Which level holds the block of prompt t's full block k (0: none below the pool). */
static uint32_t level_of(const struct core *c, const uint32_t *t, uint32_t k)
{
	for (uint32_t lv = 1; lv <= NLEVELS; lv++)
		for (uint32_t s = 0; s < L.lv[lv].nslots; s++) {
			const struct core_block *e = &c->tiers[lv].pool.blocks[s];

			if ((e->flags & CORE_BLOCK_INDEXED) &&
			    !memcmp(L.lv[lv].tokens + (size_t)s * B, t + (size_t)k * B,
				    B * sizeof(uint32_t)))
				return lv;
		}
	return 0;
}

/*
 * A pool of 4 blocks over A (1 slot), B (1) and C (8), and what fills it: p0 (3 blocks), p1 (3)
 * and p2 (1).  p1 pushes p0's leaf and middle out of the pool, leaf first: the leaf goes to A
 * and on to B as the middle follows it.  p2 pushes p0's root out: root to A, middle to B, leaf
 * on to C.  So p0 spans the three levels, one block in each, and opening it again brings each
 * level's block up in one call of that level's, byte for byte.
 */
static struct core *spanning(const double bandwidth[NLEVELS], const struct core_cost_config *cost,
			     uint32_t p[3][12])
{
	static const uint32_t slots[NLEVELS] = { 1, 1, 8 };
	static const uint32_t len[3] = { 12, 12, 4 };
	struct core *c = chain(4, slots, bandwidth, cost);

	for (uint32_t i = 0; i < 3; i++) {
		fill_tokens(p[i], len[i], 1000 * (i + 1));
		cache_prompt(c, p[i], len[i]);
		assert_verified(c);
	}
	for (uint32_t k = 0; k < 3; k++)
		ck_assert_uint_eq(level_of(c, p[0], k), k + 1);
	return c;
}

START_TEST(test_demotion_cascades_to_the_third_level_and_back)
{
	uint32_t p[3][12], cached;
	struct core *c = spanning(NULL, NULL, p);
	uint64_t s;

	/* Each level got what the one above let go, and the last let nothing go. */
	ck_assert_uint_eq(tstats(c, 1).demotions, 3);
	ck_assert_uint_eq(tstats(c, 1).evictions, 2);
	ck_assert_uint_eq(tstats(c, 2).demotions, 2);
	ck_assert_uint_eq(tstats(c, 2).evictions, 1);
	ck_assert_uint_eq(tstats(c, 3).demotions, 1);
	ck_assert_uint_eq(tstats(c, 3).evictions, 0);
	for (uint32_t lv = 1; lv <= NLEVELS; lv++) {
		ck_assert_uint_eq(tstats(c, lv).used, 1);
		ck_assert_uint_eq(L.lv[lv].stores, tstats(c, lv).demotions);
	}
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = p[0], .ntokens = 12 }), 12);

	ck_assert_int_eq(seq_open_cached(c, &(struct core_open){ .tokens = p[0], .ntokens = 12 }, &s,
					 &cached),
			 0);
	ck_assert_uint_eq(cached, 12);
	assert_kv(c, s, p[0][0], 12);
	for (uint32_t lv = 1; lv <= NLEVELS; lv++) {
		/* One call for each level, with its one block. */
		ck_assert_uint_eq(L.lv[lv].load_calls, 1);
		ck_assert_uint_eq(L.lv[lv].loaded, 1);
		ck_assert_uint_eq(tstats(c, lv).promotions, 1);
	}
	/* Promotion moves: no level keeps a copy. */
	for (uint32_t k = 0; k < 3; k++)
		ck_assert_uint_eq(level_of(c, p[0], k), 0);
	assert_verified(c);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	/* From the pool this time. */
	ck_assert_int_eq(seq_open_cached(c, &(struct core_open){ .tokens = p[0], .ntokens = 12 }, &s,
					 &cached),
			 0);
	ck_assert_uint_eq(cached, 12);
	for (uint32_t lv = 1; lv <= NLEVELS; lv++)
		ck_assert_uint_eq(L.lv[lv].load_calls, 1);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/*
 * Each level's bandwidth, each level's decision.  Recomputing a block (4 tokens of a 1e6
 * parameter model at 1 TFLOP/s) takes 8 us; a 1 MB block takes 1 us from A and B (1 TB/s) but
 * 1 ms from C (1 GB/s).  A lookup promotes from A and B and stops at C, counted skipped there.
 */
START_TEST(test_a_slow_third_level_is_not_promoted_from)
{
	static const double bw[NLEVELS] = { 1e12, 1e12, 1e9 };
	const struct core_cost_config cost = { .block_bytes = 1e6, .params = 1e6, .flops = 1e12 };
	uint32_t p[3][12], cached;
	struct core *c = spanning(bw, &cost, p);
	uint64_t s;

	ck_assert(core_tier_promotes(c, 1));
	ck_assert(core_tier_promotes(c, 2));
	ck_assert(!core_tier_promotes(c, 3));
	ck_assert(!core_tier_promotes(c, 4)); /* no such level */
	/* A lookup stops where promoting stops: the leaf, in C, is recomputed. */
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = p[0], .ntokens = 12 }),
			  2 * B);
	ck_assert_int_eq(seq_open_cached(c, &(struct core_open){ .tokens = p[0], .ntokens = 12 }, &s,
					 &cached),
			 0);
	ck_assert_uint_eq(cached, 2 * B);
	assert_kv(c, s, p[0][0], cached);
	ck_assert_uint_eq(L.lv[1].load_calls, 1);
	ck_assert_uint_eq(L.lv[2].load_calls, 1);
	ck_assert_uint_eq(L.lv[3].load_calls, 0);
	ck_assert_uint_eq(tstats(c, 3).skipped, 1);
	ck_assert_uint_eq(tstats(c, 3).promotions, 0);
	ck_assert_uint_eq(level_of(c, p[0], 2), 3); /* still there */
	assert_verified(c);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/*
 * Deferred loads over three levels: the pending loads come in table order, each naming its
 * level; the caller reads each through its own level and the core takes the results.
 */
START_TEST(test_deferred_loads_name_their_levels)
{
	uint32_t p[3][12], n;
	struct core *c = spanning(NULL, NULL, p);
	struct core_seq_info si;
	struct core_load *loads;
	uint64_t s;

	ck_assert_int_eq(core_seq_open(c,
				       &(struct core_open){ .tokens = p[0], .ntokens = 12,
							    .flags = CORE_OPEN_DEFER_LOADS },
				       &s, NULL),
			 0);
	ck_assert_int_eq(core_seq_pending_loads(c, s, &loads, &n), 0);
	ck_assert_uint_eq(n, 3);
	for (uint32_t k = 0; k < n; k++)
		ck_assert_uint_eq(loads[k].tier, k + 1);
	for (uint32_t lv = 1; lv <= NLEVELS; lv++)
		ck_assert_uint_eq(L.lv[lv].load_calls, 0); /* the core loaded nothing itself */
	assert_verified(c); /* the slots are held by the pending loads */
	for (uint32_t k = 0; k < n; k++)
		level_load(&L.lv[loads[k].tier], &loads[k], 1);
	ck_assert_int_eq(core_seq_loaded(c, s), 0);
	ck_assert_int_eq(core_seq_info(c, s, &si), 0);
	ck_assert_uint_eq(si.ncommitted, 12);
	assert_kv(c, s, p[0][0], 12);
	for (uint32_t lv = 1; lv <= NLEVELS; lv++)
		ck_assert_uint_eq(tstats(c, lv).promotions, 1);
	assert_verified(c);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/* The list holds at most CORE_MAX_TIERS levels, each with room and both callbacks. */
START_TEST(test_the_list_is_checked)
{
	static struct level lv[CORE_MAX_TIERS + 1];
	struct core_config cfg = { .capacity_blocks = 4, .block_tokens = B, .max_sequences = 1,
				   .max_seq_tokens = 16, .copy_block = fake_copy, .copy_ctx = &mem };
	const struct core_tier_ops no_load = { .store = level_store };
	struct core_tier_stats st;
	struct core *c = NULL;

	for (uint32_t i = 0; i < CORE_MAX_TIERS; i++)
		cfg.tiers[i] = (struct core_tier_config){ .slots = 2, .ops = &level_ops,
							  .ctx = &lv[i + 1] };
	cfg.ntiers = CORE_MAX_TIERS + 1;
	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
	ck_assert_ptr_null(c);

	/* As many as fit: every level is there, and the one after the last is not. */
	cfg.ntiers = CORE_MAX_TIERS;
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	for (uint32_t t = 1; t <= CORE_MAX_TIERS; t++) {
		ck_assert_int_eq(core_get_tier_stats(c, t, &st), 0);
		ck_assert_uint_eq(st.capacity, 2);
	}
	ck_assert_int_eq(core_get_tier_stats(c, CORE_MAX_TIERS + 1, &st), -EINVAL);
	ck_assert_int_eq(core_get_tier_stats(c, CORE_TIER_POOL, &st), -EINVAL);
	c = core_free(c);

	/* A level with no room, or without one of its callbacks, is refused. */
	cfg.ntiers = 2;
	cfg.tiers[1].slots = 0;
	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
	cfg.tiers[1].slots = 2;
	cfg.tiers[1].ops = &no_load;
	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
	cfg.tiers[1].ops = NULL;
	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
	ck_assert_ptr_null(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("core-levels");
	TCase *tc = tcase_create("levels");

	tcase_add_test(tc, test_demotion_cascades_to_the_third_level_and_back);
	tcase_add_test(tc, test_a_slow_third_level_is_not_promoted_from);
	tcase_add_test(tc, test_deferred_loads_name_their_levels);
	tcase_add_test(tc, test_the_list_is_checked);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

/* SPDX-License-Identifier: MIT */
/*
 * Retention policies: attention sinks per sequence and sliding-window pools.  Memory stays at
 * its bound over a million tokens; released blocks leave holes in the table; what a pruned
 * sequence commits is never found by others; bad policies are refused.
 */
#include <errno.h>

#include "daemon/core/core-internal.h"
#include "tests/unit/testutil.h"

#define B 16

static struct fake_mem mem;

static struct core *pool_with(uint32_t capacity, uint32_t window, uint32_t max_seq_tokens)
{
	struct core_config cfg = {
		.capacity_blocks = capacity,
		.block_tokens = B,
		.max_sequences = 8,
		.max_seq_tokens = max_seq_tokens,
		.copy_block = fake_copy,
		.copy_ctx = &mem,
		.window = window,
	};
	struct core *c = NULL;

	fake_mem_init(&mem, capacity, B);
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	return c;
}

static void done(struct core *c)
{
	assert_verified(c);
	core_free(c);
	free(mem.slots);
}

static struct core_seq_info info_of(const struct core *c, uint64_t s)
{
	struct core_seq_info si;

	ck_assert_int_eq(core_seq_info(c, s, &si), 0);
	return si;
}

/*
 * Streams a million tokens, one at a time, committing each; every 10,000 tokens checks that
 * the blocks held stay within bound, that the sinks are still there and that the table has a
 * hole for every block released.
 */
static void stream(struct core *c, uint64_t s, uint32_t n_sink, uint32_t bound)
{
	uint32_t t = 7, ntokens = info_of(c, s).ntokens;
	struct core_stats st;

	for (uint32_t k = ntokens; k < 1000000; k++) {
		ck_assert_int_ge(core_seq_append(c, s, &t, 1), 0);
		ck_assert_int_eq(core_seq_commit(c, s, k + 1), 0);
		t = (t * 1103515245u + 12345u) % 50000u;
		if ((k + 1) % 10000 == 0) {
			struct core_seq_info si = info_of(c, s);

			ck_assert_msg(si.held_blocks <= bound, "%u blocks held at %u tokens (bound %u)",
				      si.held_blocks, k + 1, bound);
			ck_assert_uint_eq(si.held_blocks + si.freed_blocks, si.nblocks);
			for (uint32_t i = 0; i < (n_sink + B - 1) / B; i++)
				ck_assert_uint_ne(si.table[i], CORE_NONE);
			ck_assert_uint_ne(si.table[si.nblocks - 1], CORE_NONE);
		}
		if ((k + 1) % 250000 == 0)
			assert_verified(c);
	}
	core_get_stats(c, &st);
	ck_assert_uint_ge(st.pruned_blocks, 1000000 / B - bound);
	ck_assert_uint_eq(st.pruned_tokens, st.pruned_blocks * B);
}

START_TEST(test_sinks_stay_bounded_over_a_million_tokens)
{
	struct core *c = pool_with(16, 0, 1u << 20);
	uint32_t prompt[40];
	uint64_t s;
	struct core_open o = { .tokens = prompt, .ntokens = 40, .retention = CORE_RETAIN_SINKS,
			       .n_sink = 4, .recent = 64 };

	fill_tokens(prompt, 40, 1);
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), 0);
	ck_assert_int_eq(core_seq_commit(c, s, 40), 0);
	/* One block for the sinks, the blocks over the last 64 tokens and the one being filled. */
	stream(c, s, 4, 1 + 64 / B + 1);
	ck_assert_uint_eq(info_of(c, s).retention, CORE_RETAIN_SINKS);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

START_TEST(test_window_pool_stays_at_its_bound)
{
	/* The bound: ceil(W / B) + 1 blocks. */
	struct core *c = pool_with(32, 256, 1u << 20);
	uint32_t prompt[1];
	uint64_t s;
	struct core_open o = { .tokens = prompt, .ntokens = 1 };

	prompt[0] = 3;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), 0);
	stream(c, s, 0, 256 / B + 1);
	ck_assert_uint_eq(info_of(c, s).recent, 256);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/*
 * Only blocks whose every token attended to the whole prefix are findable by any sequence:
 * with n_sink 16 and recent 32 those below position 48.  Blocks committed later saw a pruned
 * context: only sequences with the same policy find them.
 */
START_TEST(test_pruned_commits_are_private)
{
	struct core *c = pool_with(64, 0, 4096);
	uint32_t p[112];
	uint64_t s, other;
	uint32_t cached;
	struct core_open o = { .tokens = p, .ntokens = 48, .retention = CORE_RETAIN_SINKS,
			       .n_sink = 16, .recent = 32 };
	struct core_open probe = { .tokens = p, .ntokens = 112 };
	struct core_seq_info si;

	fill_tokens(p, 112, 1000);
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), 0);
	ck_assert_int_eq(core_seq_commit(c, s, 48), 0);
	ck_assert_uint_eq(info_of(c, s).freed_blocks, 0);
	ck_assert_int_ge(core_seq_append(c, s, p + 48, 48), 0);
	ck_assert_int_eq(core_seq_commit(c, s, 96), 0);
	/* [16, 96 - 32) released: blocks 1, 2, 3. */
	si = info_of(c, s);
	ck_assert_uint_eq(si.freed_blocks, 3);
	ck_assert_uint_ne(si.table[0], CORE_NONE);
	for (uint32_t i = 1; i <= 3; i++)
		ck_assert_uint_eq(si.table[i], CORE_NONE);
	ck_assert_uint_eq(core_lookup(c, &probe), 48);
	ck_assert_int_ge(core_seq_append(c, s, p + 96, 16), 0);
	ck_assert_int_eq(core_seq_commit(c, s, 112), 0);
	ck_assert_uint_eq(core_lookup(c, &probe), 48);
	/* The same policy computes the same K/V: it finds everything (keyed with its tag). */
	probe.retention = CORE_RETAIN_SINKS;
	probe.n_sink = 16;
	probe.recent = 32;
	ck_assert_uint_eq(core_lookup(c, &probe), 112);
	probe.recent = 48; /* another policy: only the untagged prefix */
	ck_assert_uint_eq(core_lookup(c, &probe), 48);
	assert_verified(c);

	/* Another sequence gets the intact prefix, released blocks included (still cached). */
	probe.retention = CORE_RETAIN_FULL;
	ck_assert_int_eq(seq_open_cached(c, &probe, &other, &cached), 0);
	ck_assert_uint_eq(cached, 48);
	ck_assert_int_eq(core_seq_close(c, other), 0);

	/* [16, 112 - 32): block 4 went too.  A fork keeps the holes. */
	ck_assert_uint_eq(info_of(c, s).freed_blocks, 4);
	ck_assert_int_eq(core_seq_fork(c, s, &other), 0);
	ck_assert_uint_eq(info_of(c, other).freed_blocks, 4);
	assert_verified(c);
	ck_assert_int_eq(core_seq_close(c, other), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/* A window pool's blocks stay findable: every sequence there computes K/V the same way. */
START_TEST(test_window_pool_blocks_are_shared)
{
	struct core *c = pool_with(64, 64, 4096);
	uint32_t p[200], cached;
	uint64_t a, b;
	struct core_open o = { .tokens = p, .ntokens = 1 };

	fill_tokens(p, 200, 1);
	ck_assert_int_eq(seq_open_cached(c, &o, &a, NULL), 0);
	for (uint32_t k = 1; k < 200; k++) {
		ck_assert_int_ge(core_seq_append(c, a, p + k, 1), 0);
		ck_assert_int_eq(core_seq_commit(c, a, k + 1), 0);
	}
	ck_assert_uint_eq(info_of(c, a).freed_blocks, (200 - 64) / B);
	ck_assert_int_eq(core_seq_close(c, a), 0);
	o.ntokens = 200;
	ck_assert_int_eq(seq_open_cached(c, &o, &b, &cached), 0);
	ck_assert_uint_eq(cached, 192); /* every full block */
	/* Opening releases what the window no longer needs at once. */
	ck_assert_uint_eq(info_of(c, b).held_blocks, 5);
	ck_assert_int_eq(core_seq_close(c, b), 0);
	done(c);
}
END_TEST

/*
 * vLLM's rule in a window pool: a hit needs only the blocks covering the window at the hit
 * point.  The prefix's first blocks were evicted; the last ceil(63 / 16) = 4 are still cached,
 * so the whole prefix is a hit and the entries before those 4 are holes.
 */
START_TEST(test_window_hit_without_early_blocks)
{
	struct core *c = pool_with(16, 64, 4096);
	uint32_t p[200], q[100], cached;
	uint64_t a, b;
	struct core_open o = { .tokens = p, .ntokens = 1 };
	struct core_seq_info si;

	fill_tokens(p, 200, 1);
	fill_tokens(q, 100, 5000);
	ck_assert_int_eq(seq_open_cached(c, &o, &a, NULL), 0);
	for (uint32_t k = 1; k < 200; k++) {
		ck_assert_int_ge(core_seq_append(c, a, p + k, 1), 0);
		ck_assert_int_eq(core_seq_commit(c, a, k + 1), 0);
	}
	ck_assert_int_eq(core_seq_close(c, a), 0);
	/* 7 blocks: the 4 free ones and the 3 oldest cached, a's blocks 0, 1 and 2. */
	o = (struct core_open){ .tokens = q, .ntokens = 100 };
	ck_assert_int_eq(seq_open_cached(c, &o, &b, NULL), 0);
	ck_assert_int_eq(core_seq_close(c, b), 0);
	o = (struct core_open){ .tokens = p, .ntokens = 200 };
	ck_assert_uint_eq(core_lookup(c, &o), 192);
	ck_assert_int_eq(seq_open_cached(c, &o, &b, &cached), 0);
	ck_assert_uint_eq(cached, 192);
	si = info_of(c, b);
	for (uint32_t i = 0; i < 8; i++)
		ck_assert_uint_eq(si.table[i], CORE_NONE);
	for (uint32_t i = 8; i < 13; i++)
		ck_assert_uint_ne(si.table[i], CORE_NONE);
	ck_assert_uint_eq(si.freed_blocks, 8);
	assert_verified(c);
	/* It goes on as any windowed sequence. */
	ck_assert_int_ge(core_seq_append(c, b, p, 16), 0);
	ck_assert_int_eq(core_seq_commit(c, b, 216), 0);
	ck_assert_uint_le(info_of(c, b).held_blocks, 5);
	ck_assert_int_eq(core_seq_close(c, b), 0);
	done(c);
}
END_TEST

START_TEST(test_bad_policies)
{
	struct core *c = pool_with(16, 0, 4096), *w;
	uint32_t p[8];
	uint64_t s;
	struct core_open o = { .tokens = p, .ntokens = 8 };

	fill_tokens(p, 8, 1);
	o.retention = 7;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), -EINVAL);
	o.retention = CORE_RETAIN_SINKS;
	o.recent = 0;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), -EINVAL);
	o.recent = 16;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), 0);
	ck_assert_int_eq(core_seq_park(c, s), -EINVAL); /* its released tokens are gone */
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);

	w = pool_with(16, 64, 4096);
	ck_assert_int_eq(seq_open_cached(w, &o, &s, NULL), -EINVAL); /* the pool's window applies */
	o.retention = CORE_RETAIN_FULL;
	ck_assert_int_eq(seq_open_cached(w, &o, &s, NULL), 0);
	ck_assert_uint_eq(info_of(w, s).retention, CORE_RETAIN_SINKS);
	ck_assert_int_eq(core_seq_close(w, s), 0);
	done(w);
}
END_TEST

static uint64_t open_h2o(struct core *c, const uint32_t *p, uint32_t n, uint32_t budget,
			 uint32_t recent, float decay)
{
	struct core_open o = { .tokens = p, .ntokens = n, .retention = CORE_RETAIN_H2O,
			       .budget = budget, .recent = recent, .decay = decay };
	uint64_t s;

	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), 0);
	return s;
}

/*
 * Reports weight hi for the tokens of the listed blocks, lo for the other held ones in
 * [0, n): one report per held block, as released positions cannot be scored.
 */
static void report(struct core *c, uint64_t s, uint32_t n, uint32_t mask, float hi, float lo)
{
	struct core_seq_info si = info_of(c, s);
	float w[B];

	for (uint32_t i = 0; i * B < n; i++) {
		uint32_t len = n - i * B < B ? n - i * B : B;

		if (si.table[i] == CORE_NONE)
			continue;
		for (uint32_t j = 0; j < len; j++)
			w[j] = mask & (1u << i) ? hi : lo;
		ck_assert_int_eq(core_seq_scores(c, s, i * B, w, len), 0);
	}
}

static uint32_t holes_mask(const struct core *c, uint64_t s)
{
	struct core_seq_info si = info_of(c, s);
	uint32_t m = 0;

	for (uint32_t i = 0; i < si.nblocks; i++)
		m |= (uint32_t)(si.table[i] == CORE_NONE) << i;
	return m;
}

/*
 * Eight blocks, budget 64 tokens, the last 16 always kept.  Blocks 2 and 5 got the attention:
 * the lowest-scoring blocks go, the earliest first among equals (0, 1, 3, 4), until 64 tokens
 * are held: 2, 5, 6 and the recent 7.
 */
START_TEST(test_h2o_keeps_recent_and_heavy_hitters)
{
	struct core *c = pool_with(64, 0, 4096);
	uint32_t p[128];
	uint64_t s;
	struct core_stats st;

	fill_tokens(p, 128, 1);
	s = open_h2o(c, p, 128, 64, 16, 0);
	report(c, s, 128, 1u << 2 | 1u << 5, 1.0f, 0.01f);
	ck_assert_int_eq(core_seq_commit(c, s, 128), 0);
	ck_assert_uint_eq(holes_mask(c, s), 1u << 0 | 1u << 1 | 1u << 3 | 1u << 4);
	ck_assert_uint_eq(info_of(c, s).held_blocks, 4);
	ck_assert_uint_eq(info_of(c, s).budget, 64);
	core_get_stats(c, &st);
	ck_assert_uint_eq(st.pruned_tokens, 4 * B);
	assert_verified(c);

	/* The next block: the lowest of the older ones goes (6: nothing reported for it since). */
	ck_assert_int_ge(core_seq_append(c, s, p, 16), 0);
	report(c, s, 144, 1u << 2 | 1u << 5 | 1u << 7 | 1u << 8, 1.0f, 0.0f);
	ck_assert_int_eq(core_seq_commit(c, s, 144), 0);
	ck_assert_uint_eq(holes_mask(c, s), 1u << 0 | 1u << 1 | 1u << 3 | 1u << 4 | 1u << 6);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/*
 * The same with one sink token: block 0, which holds it, stays whatever its score, and the
 * lowest of the others go (1, 3, 4, then 6) until 64 tokens are held.
 */
START_TEST(test_h2o_keeps_the_sinks)
{
	struct core *c = pool_with(64, 0, 4096);
	struct core_open o = { .ntokens = 128, .retention = CORE_RETAIN_H2O, .budget = 64,
			       .recent = 16, .n_sink = 1 };
	uint32_t p[128];
	uint64_t s;

	fill_tokens(p, 128, 1);
	o.tokens = p;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), 0);
	report(c, s, 128, 1u << 2 | 1u << 5, 1.0f, 0.01f);
	ck_assert_int_eq(core_seq_commit(c, s, 128), 0);
	ck_assert_uint_eq(holes_mask(c, s), 1u << 1 | 1u << 3 | 1u << 4 | 1u << 6);
	assert_verified(c);
	/* Later steps never take block 0, even with nothing reported for it. */
	for (uint32_t k = 0; k < 4; k++) {
		ck_assert_int_ge(core_seq_append(c, s, p, 16), 0);
		report(c, s, 144 + 16 * k, ~1u, 1.0f, 0.0f);
		ck_assert_int_eq(core_seq_commit(c, s, 144 + 16 * k), 0);
		ck_assert_uint_eq(holes_mask(c, s) & 1u, 0);
		ck_assert_uint_eq(info_of(c, s).held_blocks, 4);
	}
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/*
 * With decay, old attention fades.  Block 0 got 40 once, block 1 got 8 in each of three later
 * steps: without decay block 1 (24) is the one to go; with decay 0.5 a step block 0 is down to
 * 40 / 32 = 1.25 against 7, and goes.  Decay is per step (a commit), however many reports.
 */
static void decay_case(float decay, uint32_t want_holes)
{
	struct core *c = pool_with(64, 0, 4096);
	uint32_t p[64];
	uint64_t s;

	fill_tokens(p, 64, 1);
	s = open_h2o(c, p, 64, 32, 16, decay);
	report(c, s, 64, 1u << 0, 2.5f, 0.0f);
	ck_assert_int_eq(core_seq_commit(c, s, 16), 0);
	for (uint32_t k = 17; k <= 19; k++) {
		/* Two reports in one step: the decay still applies once. */
		report(c, s, 32, 1u << 1, 0.25f, 0.0f);
		report(c, s, 32, 1u << 1, 0.25f, 0.0f);
		ck_assert_int_eq(core_seq_commit(c, s, k), 0);
	}
	ck_assert_uint_eq(holes_mask(c, s), 0);
	ck_assert_int_eq(core_seq_commit(c, s, 64), 0);
	ck_assert_uint_eq(holes_mask(c, s), want_holes);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}

START_TEST(test_h2o_decay)
{
	decay_case(0.5f, 1u << 0 | 1u << 2);
	decay_case(0, 1u << 1 | 1u << 2);
}
END_TEST

/* A long stream with random attention: held tokens stay within budget plus one block. */
START_TEST(test_h2o_stream_bounded)
{
	struct core *c = pool_with(32, 0, 1u << 20);
	uint32_t t = 1, rng = 12345;
	uint64_t s = open_h2o(c, &t, 1, 128, 32, 0.9f);

	for (uint32_t k = 1; k < 100000; k++) {
		struct core_seq_info si;
		float w[B];

		ck_assert_int_ge(core_seq_append(c, s, &t, 1), 0);
		si = info_of(c, s);
		/* Attention over one held block, as a decode step would report it. */
		for (uint32_t i = 0; i < si.nblocks; i++) {
			rng = rng * 1103515245u + 12345u;
			if (si.table[i] == CORE_NONE || (i + 1) * B > k + 1 || rng % 3)
				continue;
			for (uint32_t j = 0; j < B; j++)
				w[j] = (float)(rng >> 16 & 0xff) / 256.0f;
			ck_assert_int_eq(core_seq_scores(c, s, i * B, w, B), 0);
			break;
		}
		ck_assert_int_eq(core_seq_commit(c, s, k + 1), 0);
		if ((k + 1) % 10000 == 0)
			ck_assert_uint_le(info_of(c, s).held_blocks, 128 / B + 1);
	}
	assert_verified(c);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

START_TEST(test_h2o_bad_input)
{
	struct core *c = pool_with(64, 0, 4096);
	struct core_open o = { .ntokens = 64, .retention = CORE_RETAIN_H2O, .budget = 16,
			       .recent = 32 };
	uint32_t p[64];
	float w[4] = { 1, 1, 1, 1 }, bad[1];
	uint64_t s, full;

	fill_tokens(p, 64, 1);
	o.tokens = p;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), -EINVAL); /* budget < recent */
	o.budget = 32;
	o.decay = 1.5f;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), -EINVAL);
	o.decay = 0;
	o.recent = 0;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), -EINVAL);
	/* Sinks must fit in the budget beside the recent tokens. */
	o.recent = 16;
	o.n_sink = 32;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), -EINVAL); /* n_sink >= budget */
	o.n_sink = 17;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), -EINVAL); /* n_sink + recent > budget */
	o.n_sink = 16;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), 0);
	ck_assert_uint_eq(info_of(c, s).n_sink, 16);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	s = open_h2o(c, p, 64, 32, 16, 0);
	ck_assert_int_eq(core_seq_scores(c, s, 62, w, 4), -EINVAL); /* beyond its tokens */
	ck_assert_int_eq(core_seq_scores(c, s, 0, w, 0), -EINVAL);
	bad[0] = -1;
	ck_assert_int_eq(core_seq_scores(c, s, 0, bad, 1), -EINVAL);
	bad[0] = __builtin_nanf("");
	ck_assert_int_eq(core_seq_scores(c, s, 0, bad, 1), -EINVAL);
	ck_assert_int_eq(core_seq_commit(c, s, 64), 0);
	ck_assert_uint_eq(holes_mask(c, s), 1u << 0 | 1u << 1);
	ck_assert_int_eq(core_seq_scores(c, s, 0, w, 4), -EINVAL); /* released */
	ck_assert_int_eq(core_seq_scores(c, s, 60, w, 4), 0);
	o = (struct core_open){ .tokens = p, .ntokens = 8 };
	ck_assert_int_eq(seq_open_cached(c, &o, &full, NULL), 0);
	ck_assert_int_eq(core_seq_scores(c, full, 0, w, 4), -EINVAL); /* not an H2O sequence */
	ck_assert_int_eq(core_seq_close(c, full), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/*
 * The gather, checked for what the core promises: no slot written twice or read after being
 * written in one call (so the copies could run in any order).
 */
static void fake_copy_slots(void *ctx, const struct core_slot_copy *c, uint32_t n)
{
	struct fake_mem *m = ctx;

	ck_assert_uint_gt(n, 0);
	for (uint32_t i = 0; i < n; i++) {
		ck_assert_uint_lt(c[i].dst, m->capacity);
		ck_assert_uint_lt(c[i].src, m->capacity);
		for (uint32_t j = 0; j < n; j++) {
			ck_assert(j == i || c[j].dst != c[i].dst || c[j].dst_slot != c[i].dst_slot);
			ck_assert(c[j].src != c[i].dst || c[j].src_slot != c[i].dst_slot);
		}
	}
	for (uint32_t i = 0; i < n; i++)
		m->slots[(size_t)c[i].dst * m->block_tokens + c[i].dst_slot] =
			m->slots[(size_t)c[i].src * m->block_tokens + c[i].src_slot];
	m->copies += n;
	m->gathers++;
}

/*
 * Token granularity, 4-token blocks, budget 8, the last 4 kept: the four highest-scoring of
 * positions 0..11 survive, packed, each slot holding exactly its token's K/V; every other
 * token is gone and the emptied blocks are released.
 */
START_TEST(test_h2o_tokens_pack_the_heavy_hitters)
{
	static const float score[16] = { 5, 0.1f, 0.2f, 9, 0.3f, 8, 0.4f, 0.5f,
					 7, 0.6f, 6, 0.7f, 1, 1, 1, 1 };
	struct core_config cfg = { .capacity_blocks = 16, .block_tokens = 4, .max_sequences = 2,
				   .max_seq_tokens = 64, .copy_block = fake_copy,
				   .copy_slots = fake_copy_slots, .copy_ctx = &mem };
	struct core_open o = { .ntokens = 16, .retention = CORE_RETAIN_H2O, .budget = 8,
			       .recent = 4, .granularity = CORE_H2O_TOKENS };
	struct core_seq_info si;
	struct core_stats st;
	struct core *c = NULL;
	uint32_t p[16], kept = 0;
	float w[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
	uint64_t s;

	fake_mem_init(&mem, 16, 4);
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	fill_tokens(p, 16, 100);
	o.tokens = p;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), 0);
	si = info_of(c, s);
	/* The engine's K/V: a word naming the position. */
	for (uint32_t pos = 0; pos < 16; pos++)
		mem.slots[(size_t)si.table[pos / 4] * 4 + pos % 4] = 1000 + pos;
	ck_assert_int_eq(core_seq_scores(c, s, 0, score, 16), 0);
	ck_assert_int_eq(core_seq_commit(c, s, 16), 0);

	si = info_of(c, s);
	ck_assert_uint_eq(si.npacked, 4);
	for (uint32_t k = 0; k < si.npacked; k++) {
		uint32_t pos = si.packed_positions[k];

		kept |= 1u << pos;
		ck_assert_uint_eq(mem.slots[(size_t)si.packed[k / 4] * 4 + k % 4], 1000 + pos);
		ck_assert_uint_eq(core_block_tokens(c, si.packed[k / 4])[k % 4], 100 + pos);
	}
	ck_assert_uint_eq(kept, 1u << 3 | 1u << 5 | 1u << 8 | 1u << 10);
	for (uint32_t i = 0; i < 3; i++)
		ck_assert_uint_eq(si.table[i], CORE_NONE);
	ck_assert_uint_ne(si.table[3], CORE_NONE);
	core_get_stats(c, &st);
	ck_assert_uint_eq(st.pruned_tokens, 8);
	ck_assert_uint_eq(st.compactions, 9);
	/* One gather per compacted block (3 slots each), one per packed slot refilled. */
	ck_assert_uint_eq(mem.gathers, 6);
	ck_assert_uint_eq(mem.copies, 12);
	assert_verified(c);

	/* The packed tokens take scores in packed order; positions are refused. */
	ck_assert_int_eq(core_seq_scores(c, s, 3, w, 1), -EINVAL);
	ck_assert_int_eq(core_seq_scores_packed(c, s, w, 3), -EINVAL);
	ck_assert_int_eq(core_seq_scores_packed(c, s, w, 4), 0);
	ck_assert_int_eq(core_seq_fork(c, s, &(uint64_t){ 0 }), -EINVAL);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/*
 * Token granularity with two sink tokens (positions 0 and 1, low scores): they survive, packed
 * with the two heavy hitters 3 and 5 beside the recent 12..15, budget 8.
 */
START_TEST(test_h2o_tokens_keep_the_sinks)
{
	static const float score[16] = { 0.05f, 0.01f, 0.2f, 9, 0.3f, 8, 0.4f, 0.5f,
					 7, 0.6f, 6, 0.7f, 1, 1, 1, 1 };
	struct core_config cfg = { .capacity_blocks = 16, .block_tokens = 4, .max_sequences = 2,
				   .max_seq_tokens = 64, .copy_block = fake_copy,
				   .copy_slots = fake_copy_slots, .copy_ctx = &mem };
	struct core_open o = { .ntokens = 16, .retention = CORE_RETAIN_H2O, .budget = 8,
			       .recent = 4, .n_sink = 2, .granularity = CORE_H2O_TOKENS };
	struct core_seq_info si;
	struct core *c = NULL;
	uint32_t p[16], kept = 0;
	uint64_t s;

	fake_mem_init(&mem, 16, 4);
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	fill_tokens(p, 16, 100);
	o.tokens = p;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), 0);
	si = info_of(c, s);
	for (uint32_t pos = 0; pos < 16; pos++)
		mem.slots[(size_t)si.table[pos / 4] * 4 + pos % 4] = 1000 + pos;
	ck_assert_int_eq(core_seq_scores(c, s, 0, score, 16), 0);
	ck_assert_int_eq(core_seq_commit(c, s, 16), 0);

	si = info_of(c, s);
	ck_assert_uint_eq(si.npacked, 4);
	for (uint32_t k = 0; k < si.npacked; k++) {
		uint32_t pos = si.packed_positions[k];

		kept |= 1u << pos;
		ck_assert_uint_eq(mem.slots[(size_t)si.packed[k / 4] * 4 + k % 4], 1000 + pos);
	}
	ck_assert_uint_eq(kept, 1u << 0 | 1u << 1 | 1u << 3 | 1u << 5);
	/* Blocks 0..2 were emptied into the packed set; block 3 holds the recent 12..15. */
	for (uint32_t i = 0; i < 3; i++)
		ck_assert_uint_eq(si.table[i], CORE_NONE);
	ck_assert_uint_ne(si.table[3], CORE_NONE);
	for (uint32_t pos = 12; pos < 16; pos++)
		ck_assert_uint_eq(mem.slots[(size_t)si.table[3] * 4 + pos % 4], 1000 + pos);
	assert_verified(c);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/*
 * A fork takes a free slot: nothing of the slot's last sequence may come with it.  Here the
 * fork of a block-granular h2o sequence lands in the slot a token-granular one just left;
 * its commits must prune by blocks (it has no per-token scores).
 */
START_TEST(test_fork_into_a_used_slot)
{
	struct core_config cfg = { .capacity_blocks = 32, .block_tokens = 4, .max_sequences = 4,
				   .max_seq_tokens = 64, .copy_block = fake_copy,
				   .copy_slots = fake_copy_slots, .copy_ctx = &mem };
	struct core_open blocks = { .ntokens = 16, .retention = CORE_RETAIN_H2O, .budget = 8,
				    .recent = 4 };
	struct core_open tokens = blocks;
	struct core *c = NULL;
	uint32_t p[16];
	uint64_t s, t, child;

	fake_mem_init(&mem, 32, 4);
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	fill_tokens(p, 16, 100);
	blocks.tokens = tokens.tokens = p;
	tokens.granularity = CORE_H2O_TOKENS;
	ck_assert_int_eq(seq_open_cached(c, &blocks, &s, NULL), 0);
	ck_assert_int_eq(seq_open_cached(c, &tokens, &t, NULL), 0);
	ck_assert_int_eq(core_seq_close(c, t), 0);
	ck_assert_int_eq(core_seq_fork(c, s, &child), 0);
	ck_assert_uint_eq((uint32_t)child, (uint32_t)t); /* the slot t left */
	ck_assert_uint_eq(info_of(c, child).granularity, CORE_H2O_BLOCKS);
	ck_assert_int_eq(core_seq_commit(c, child, 16), 0);
	ck_assert_uint_eq(info_of(c, child).held_blocks, 2);
	assert_verified(c);
	ck_assert_int_eq(core_seq_close(c, child), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/* Without the backend's gather, token granularity is refused. */
START_TEST(test_h2o_tokens_need_a_gather)
{
	struct core *c = pool_with(16, 0, 4096);
	uint32_t p[8];
	uint64_t s;
	struct core_open o = { .tokens = p, .ntokens = 8, .retention = CORE_RETAIN_H2O,
			       .budget = 8, .recent = 4, .granularity = CORE_H2O_TOKENS };

	fill_tokens(p, 8, 1);
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), -EOPNOTSUPP);
	o.granularity = 2;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), -EINVAL);
	done(c);
}
END_TEST

/* A long token-granular stream: held tokens at the budget, verified as it goes. */
START_TEST(test_h2o_tokens_stream)
{
	struct core_config cfg = { .capacity_blocks = 64, .block_tokens = B, .max_sequences = 2,
				   .max_seq_tokens = 1u << 20, .copy_block = fake_copy,
				   .copy_slots = fake_copy_slots, .copy_ctx = &mem };
	struct core_open o = { .ntokens = 1, .retention = CORE_RETAIN_H2O, .budget = 100,
			       .recent = 32, .granularity = CORE_H2O_TOKENS, .decay = 0.95f };
	struct core *c = NULL;
	uint32_t t = 1, rng = 7;
	uint64_t s;
	float w[1];

	fake_mem_init(&mem, 64, B);
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	o.tokens = &t;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), 0);
	for (uint32_t k = 1; k < 50000; k++) {
		struct core_seq_info si;

		ck_assert_int_ge(core_seq_append(c, s, &t, 1), 0);
		rng = rng * 1103515245u + 12345u;
		w[0] = (float)(rng >> 16 & 0xff);
		ck_assert_int_eq(core_seq_scores(c, s, k, w, 1), 0);
		ck_assert_int_eq(core_seq_commit(c, s, k + 1), 0);
		si = info_of(c, s);
		ck_assert_uint_le(si.npacked + (k + 1) - si.freed_blocks * B, 100);
		if ((k + 1) % 5000 == 0)
			assert_verified(c);
	}
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("core-retention");
	TCase *tc = tcase_create("retention");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_sinks_stay_bounded_over_a_million_tokens);
	tcase_add_test(tc, test_window_pool_stays_at_its_bound);
	tcase_add_test(tc, test_pruned_commits_are_private);
	tcase_add_test(tc, test_window_pool_blocks_are_shared);
	tcase_add_test(tc, test_bad_policies);
	tcase_add_test(tc, test_window_hit_without_early_blocks);
	tcase_add_test(tc, test_h2o_keeps_recent_and_heavy_hitters);
	tcase_add_test(tc, test_h2o_keeps_the_sinks);
	tcase_add_test(tc, test_h2o_decay);
	tcase_add_test(tc, test_h2o_stream_bounded);
	tcase_add_test(tc, test_h2o_bad_input);
	tcase_add_test(tc, test_h2o_tokens_pack_the_heavy_hitters);
	tcase_add_test(tc, test_h2o_tokens_keep_the_sinks);
	tcase_add_test(tc, test_fork_into_a_used_slot);
	tcase_add_test(tc, test_h2o_tokens_need_a_gather);
	tcase_add_test(tc, test_h2o_tokens_stream);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

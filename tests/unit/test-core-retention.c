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
	ck_assert_int_eq(core_seq_open(c, &o, &s, NULL), 0);
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
	ck_assert_int_eq(core_seq_open(c, &o, &s, NULL), 0);
	stream(c, s, 0, 256 / B + 1);
	ck_assert_uint_eq(info_of(c, s).recent, 256);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);
}
END_TEST

/*
 * Blocks committed before a sequence first released one are intact and stay findable; blocks
 * it commits afterwards were computed over a pruned cache and are never found.
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
	ck_assert_int_eq(core_seq_open(c, &o, &s, NULL), 0);
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
	ck_assert_uint_eq(core_lookup(c, &probe), 96);
	ck_assert_int_ge(core_seq_append(c, s, p + 96, 16), 0);
	ck_assert_int_eq(core_seq_commit(c, s, 112), 0);
	/* Block 6 came after the first release: private. */
	ck_assert_uint_eq(core_lookup(c, &probe), 96);
	assert_verified(c);

	/* Another sequence gets the intact prefix, released blocks included (still cached). */
	probe.retention = CORE_RETAIN_FULL;
	ck_assert_int_eq(core_seq_open(c, &probe, &other, &cached), 0);
	ck_assert_uint_eq(cached, 96);
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
	ck_assert_int_eq(core_seq_open(c, &o, &a, NULL), 0);
	for (uint32_t k = 1; k < 200; k++) {
		ck_assert_int_ge(core_seq_append(c, a, p + k, 1), 0);
		ck_assert_int_eq(core_seq_commit(c, a, k + 1), 0);
	}
	ck_assert_uint_eq(info_of(c, a).freed_blocks, (200 - 64) / B);
	ck_assert_int_eq(core_seq_close(c, a), 0);
	o.ntokens = 200;
	ck_assert_int_eq(core_seq_open(c, &o, &b, &cached), 0);
	ck_assert_uint_eq(cached, 192); /* every full block */
	/* Opening releases what the window no longer needs at once. */
	ck_assert_uint_eq(info_of(c, b).held_blocks, 5);
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
	ck_assert_int_eq(core_seq_open(c, &o, &s, NULL), -EINVAL);
	o.retention = CORE_RETAIN_SINKS;
	o.recent = 0;
	ck_assert_int_eq(core_seq_open(c, &o, &s, NULL), -EINVAL);
	o.recent = 16;
	ck_assert_int_eq(core_seq_open(c, &o, &s, NULL), 0);
	ck_assert_int_eq(core_seq_park(c, s), -EINVAL); /* its released tokens are gone */
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c);

	w = pool_with(16, 64, 4096);
	ck_assert_int_eq(core_seq_open(w, &o, &s, NULL), -EINVAL); /* the pool's window applies */
	o.retention = CORE_RETAIN_FULL;
	ck_assert_int_eq(core_seq_open(w, &o, &s, NULL), 0);
	ck_assert_uint_eq(info_of(w, s).retention, CORE_RETAIN_SINKS);
	ck_assert_int_eq(core_seq_close(w, s), 0);
	done(w);
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
	suite_add_tcase(s, tc);
	return run_suite(s);
}

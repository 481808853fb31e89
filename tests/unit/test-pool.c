/* SPDX-License-Identifier: MIT */
/* The block pool: free list, refcounts, LRU order. */
#include <errno.h>

#include "daemon/core/pool.h"
#include "tests/unit/testutil.h"

static uint32_t evicted[64];
static uint32_t nevicted;

static void record_evict(void *ctx, uint32_t b)
{
	struct pool *p = ctx;

	ck_assert(p->blocks[b].flags & CORE_BLOCK_INDEXED);
	p->blocks[b].flags &= ~CORE_BLOCK_INDEXED;
	evicted[nevicted++] = b;
}

static void pool_setup(struct pool *p, uint32_t capacity)
{
	nevicted = 0;
	ck_assert_int_eq(pool_init(p, capacity, record_evict, p), 0);
}

START_TEST(test_init_limits)
{
	struct pool p;

	ck_assert_int_eq(pool_init(&p, 0, record_evict, &p), -EINVAL);
	ck_assert_int_eq(pool_init(&p, UINT32_MAX, record_evict, &p), -EINVAL);
}
END_TEST

START_TEST(test_alloc_until_empty)
{
	struct pool p;
	uint8_t seen[8] = { 0 };

	pool_setup(&p, 8);
	for (int i = 0; i < 8; i++) {
		uint32_t b = pool_alloc(&p);

		ck_assert_uint_lt(b, 8);
		ck_assert(!seen[b]);
		seen[b] = 1;
		ck_assert_uint_eq(p.blocks[b].refcount, 1);
		ck_assert_uint_eq(p.blocks[b].state, CORE_BLOCK_FILLING);
	}
	ck_assert_uint_eq(pool_alloc(&p), CORE_NONE);
	ck_assert_uint_eq(p.nfree, 0);
	ck_assert_uint_eq(pool_in_use(&p), 8);
	pool_done(&p);
}
END_TEST

START_TEST(test_unindexed_goes_free_indexed_goes_cached)
{
	struct pool p;
	uint32_t a, b;

	pool_setup(&p, 4);
	a = pool_alloc(&p);
	b = pool_alloc(&p);
	p.blocks[b].flags |= CORE_BLOCK_INDEXED;
	p.blocks[b].state = CORE_BLOCK_READY;
	pool_ref(&p, b);
	pool_unref(&p, b);
	ck_assert_uint_eq(p.ncached, 0); /* still referenced once */
	pool_unref(&p, a);
	pool_unref(&p, b);
	ck_assert_uint_eq(p.nfree, 3);
	ck_assert_uint_eq(p.ncached, 1);
	ck_assert_uint_eq(p.lru_head, b);
	ck_assert_uint_eq(p.blocks[a].state, CORE_BLOCK_FREE);
	pool_done(&p);
}
END_TEST

START_TEST(test_lru_reuse_order)
{
	struct pool p;
	uint32_t b[4];

	pool_setup(&p, 4);
	for (int i = 0; i < 4; i++) {
		b[i] = pool_alloc(&p);
		p.blocks[b[i]].flags |= CORE_BLOCK_INDEXED;
		p.blocks[b[i]].state = CORE_BLOCK_READY;
	}
	/* Cached in the order 2, 0, 3, 1; then 0 is used again and released: 2, 3, 1, 0. */
	pool_unref(&p, b[2]);
	pool_unref(&p, b[0]);
	pool_unref(&p, b[3]);
	pool_unref(&p, b[1]);
	pool_ref(&p, b[0]);
	ck_assert_uint_eq(p.ncached, 3);
	pool_unref(&p, b[0]);
	ck_assert_uint_eq(pool_available(&p), 4);

	ck_assert_uint_eq(pool_alloc(&p), b[2]);
	ck_assert_uint_eq(pool_alloc(&p), b[3]);
	ck_assert(pool_evict_oldest(&p));
	ck_assert_uint_eq(p.nfree, 1);
	ck_assert_uint_eq(pool_alloc(&p), b[1]); /* the one just evicted, now free */
	ck_assert_uint_eq(pool_alloc(&p), b[0]);
	ck_assert_uint_eq(pool_alloc(&p), CORE_NONE);
	ck_assert_uint_eq(nevicted, 4);
	ck_assert_uint_eq(evicted[0], b[2]);
	ck_assert_uint_eq(evicted[1], b[3]);
	ck_assert_uint_eq(evicted[2], b[1]);
	ck_assert_uint_eq(evicted[3], b[0]);
	ck_assert_uint_eq(p.reused, 3);
	ck_assert(!pool_evict_oldest(&p));
	pool_done(&p);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("pool");
	TCase *tc = tcase_create("pool");

	tcase_add_test(tc, test_init_limits);
	tcase_add_test(tc, test_alloc_until_empty);
	tcase_add_test(tc, test_unindexed_goes_free_indexed_goes_cached);
	tcase_add_test(tc, test_lru_reuse_order);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

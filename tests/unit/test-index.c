/* SPDX-License-Identifier: MIT */
/* The prefix index: open addressing with backward-shift deletion. */
#include <errno.h>

#include "daemon/core/index.h"
#include "tests/unit/testutil.h"

#define N 1000

static struct core_block blocks[N];

/* Every key lands on one of four home slots, so probe runs are long and wrap around. */
static struct core_hash key_for(uint32_t i)
{
	return (struct core_hash){ .lo = ((uint64_t)i << 32) | (i % 4), .hi = 0x9e3779b97f4a7c15ull * (i + 1) };
}

START_TEST(test_insert_find_remove_clustered)
{
	struct prefix_index ix;
	uint64_t rnd = 12345;

	ck_assert_int_eq(index_init(&ix, N), 0);
	ck_assert_uint_ge(ix.mask + 1, 2 * N);
	for (uint32_t i = 0; i < N; i++) {
		blocks[i].hash = key_for(i);
		ck_assert_uint_eq(index_find(&ix, blocks, blocks[i].hash), CORE_NONE);
		index_insert(&ix, blocks[i].hash, i);
	}
	ck_assert_uint_eq(ix.count, N);
	/* Remove a pseudo-random half, then everything left must still be found. */
	uint8_t gone[N] = { 0 };
	for (uint32_t k = 0; k < N / 2; k++) {
		uint32_t i;

		do {
			rnd = rnd * 6364136223846793005ull + 1442695040888963407ull;
			i = (uint32_t)(rnd >> 33) % N;
		} while (gone[i]);
		gone[i] = 1;
		ck_assert_int_eq(index_remove(&ix, blocks[i].hash, i), 0);
		ck_assert_int_eq(index_remove(&ix, blocks[i].hash, i), -ENOENT);
	}
	for (uint32_t i = 0; i < N; i++)
		ck_assert_uint_eq(index_find(&ix, blocks, blocks[i].hash), gone[i] ? CORE_NONE : i);
	ck_assert_uint_eq(ix.count, N / 2);
	index_done(&ix);
}
END_TEST

START_TEST(test_same_low_bits_other_high_bits)
{
	struct prefix_index ix;

	ck_assert_int_eq(index_init(&ix, 4), 0);
	blocks[0].hash = (struct core_hash){ .lo = 7, .hi = 1 };
	blocks[1].hash = (struct core_hash){ .lo = 7, .hi = 1ull << 40 }; /* same low 32 bits of hi */
	index_insert(&ix, blocks[0].hash, 0);
	ck_assert_uint_eq(index_find(&ix, blocks, blocks[1].hash), CORE_NONE);
	index_insert(&ix, blocks[1].hash, 1);
	ck_assert_uint_eq(index_find(&ix, blocks, blocks[1].hash), 1);
	ck_assert_uint_eq(index_find(&ix, blocks, blocks[0].hash), 0);
	index_done(&ix);
}
END_TEST

START_TEST(test_init_limits)
{
	struct prefix_index ix;

	ck_assert_int_eq(index_init(&ix, 0), -EINVAL);
	ck_assert_int_eq(index_init(&ix, UINT32_MAX), -EINVAL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("index");
	TCase *tc = tcase_create("index");

	tcase_add_test(tc, test_insert_find_remove_clustered);
	tcase_add_test(tc, test_same_low_bits_other_high_bits);
	tcase_add_test(tc, test_init_limits);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

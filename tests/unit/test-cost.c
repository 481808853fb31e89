/* SPDX-License-Identifier: MIT */
/* The cost model against the lesson's worked answers. */
#include <math.h>

#include "daemon/core/cost.h"
#include "tests/unit/testutil.h"

START_TEST(test_bytes_per_token)
{
	/* Mistral 7B: 2 x 32 x 8 x 128 x 2 = 128 KiB. */
	ck_assert_uint_eq(cost_bytes_per_token(32, 8, 128, 2), 131072);
	/* stories260K: 5 layers, 4 kv heads of 8 float32s. */
	ck_assert_uint_eq(cost_bytes_per_token(5, 4, 8, 4), 1280);
	ck_assert_uint_eq(cost_bytes_per_token(UINT32_MAX, UINT32_MAX, UINT32_MAX, 8), 0);
}
END_TEST

START_TEST(test_swap_or_recompute)
{
	/* 800 MB over 25 GB/s against 6,400 tokens of a 7B model at 150 TFLOP/s. */
	double swap = cost_transfer_s(800e6, 25e9), rec = cost_recompute_s(7e9, 6400, 150e12);

	ck_assert(fabs(swap - 0.032) < 1e-12);
	ck_assert(fabs(rec - 0.597333333) < 1e-6);
	ck_assert_int_eq(cost_choose(swap, rec), COST_SWAP);
	ck_assert_int_eq(cost_choose(1.0, 0.5), COST_RECOMPUTE);
	ck_assert_int_eq(cost_choose(0.5, 0.5), COST_SWAP); /* ties lose no work */
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cost");
	TCase *tc = tcase_create("cost");

	tcase_add_test(tc, test_bytes_per_token);
	tcase_add_test(tc, test_swap_or_recompute);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

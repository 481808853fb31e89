/* SPDX-License-Identifier: MIT */
/*
 * The admin socket's Prometheus text: label values escaped as the text format wants them
 * (tests/ops/metrics.test runs promtool on a live daemon's metrics).
 */
#include "daemon/server/server.h"
#include "tests/unit/testutil.h"

START_TEST(test_label_escapes)
{
	char out[64];

	ck_assert_str_eq(admin_label_value("uid:0/plain", out, sizeof(out)), "uid:0/plain");
	/* Backslash, quote and newline, and nothing else. */
	ck_assert_str_eq(admin_label_value("a\\b\"c\nd\te'", out, sizeof(out)),
			 "a\\\\b\\\"c\\nd\te'");
	ck_assert_str_eq(admin_label_value("", out, sizeof(out)), "");
}
END_TEST

/* Cut short, never inside an escape: what is left is still a valid value. */
START_TEST(test_label_cut_short)
{
	char out[6];

	ck_assert_str_eq(admin_label_value("abcdefgh", out, sizeof(out)), "abc");
	ck_assert_str_eq(admin_label_value("ab\ncd", out, sizeof(out)), "ab\\n");
	ck_assert_str_eq(admin_label_value("abc\"", out, sizeof(out)), "abc");
	ck_assert_str_eq(admin_label_value("\"\"\"", out, sizeof(out)), "\\\"\\\"");
	ck_assert_str_eq(admin_label_value("abc", out, 1), "");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("admin");
	TCase *tc = tcase_create("admin");

	tcase_add_test(tc, test_label_escapes);
	tcase_add_test(tc, test_label_cut_short);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

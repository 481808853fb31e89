/* SPDX-License-Identifier: MIT */
/* The main() helper every Check suite shares: runs it and turns failures into the exit status. */
#pragma once

#include <check.h>
#include <stdlib.h>

static inline int run_suite(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

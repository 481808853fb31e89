/* SPDX-License-Identifier: MIT */
/*
 * The daemon's log (daemon/log.c): every control character a message carries is escaped, so
 * no text can start a line of its own (a forged "<0>" emergency line, say); lines from one call
 * site are rate limited, the rest counted and summed up in one line once the interval is
 * over; call sites are limited apart; burst 0 lifts the limit.  Each test reads what it wrote
 * to stderr back from a file.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/log.h"
#include "tests/check-runner.h"

static FILE *captured;

/* stderr goes to a file from here on (each test runs in a fork of its own). */
static void capture(void)
{
	captured = tmpfile();
	ck_assert_ptr_nonnull(captured);
	ck_assert_int_ge(dup2(fileno(captured), 2), 0);
	setvbuf(stderr, NULL, _IONBF, 0);
}

/* What was logged, and how many lines. */
static const char *logged(unsigned *ret_lines)
{
	static char text[65536];
	size_t n;

	rewind(captured);
	n = fread(text, 1, sizeof(text) - 1, captured);
	text[n] = '\0';
	if (ret_lines) {
		*ret_lines = 0;
		for (size_t i = 0; i < n; i++)
			*ret_lines += text[i] == '\n';
	}
	return text;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

START_TEST(test_control_characters_escaped)
{
	unsigned lines;

	capture();
	log_info("pool %s: %s", "nope\n<0>FORGED", "tab\there, esc\x1b[31m, del\x7f");
	ck_assert_str_eq(logged(&lines),
			 "<6>pool nope\\x0a<0>FORGED: tab\\x09here, esc\\x1b[31m, del\\x7f\n");
	ck_assert_uint_eq(lines, 1);
	/* %m, and the errno returned as a negative number. */
	ck_assert_int_eq(log_error_errno(2, "open: %m"), -2);
	ck_assert_ptr_nonnull(strstr(logged(NULL), "<3>open: No such file or directory\n"));
}
END_TEST

static void from_site_a(int i)
{
	log_notice("site a, line %d", i);
}

static void from_site_b(int i)
{
	log_warning("site b, line %d", i);
}

START_TEST(test_rate_limited_per_site)
{
	unsigned lines;
	const char *text;

	capture();
	log_set_rate_limit(300, 3);
	for (int i = 0; i < 10; i++) {
		from_site_a(i);
		from_site_b(i);
	}
	text = logged(&lines);
	ck_assert_uint_eq(lines, 6); /* three of each: one site does not silence the other */
	ck_assert_ptr_nonnull(strstr(text, "<5>site a, line 2\n"));
	ck_assert_ptr_null(strstr(text, "site a, line 3"));
	ck_assert_ptr_nonnull(strstr(text, "<4>site b, line 2\n"));
	ck_assert_uint_eq(log_suppressed_total(), 14);
	/* Nothing is said of the dropped ones before the interval ends... */
	ck_assert_uint_eq(log_flush_suppressed(), 0);
	sleep_ms(350);
	/* ...then one line per site, at the level of what it dropped, and the site starts anew. */
	from_site_a(10);
	text = logged(&lines);
	ck_assert_ptr_nonnull(strstr(text, "<5>log: 7 more lines like \"site a, line %d\" dropped"));
	ck_assert_ptr_nonnull(strstr(text, "<5>site a, line 10\n"));
	ck_assert_uint_eq(log_flush_suppressed(), 1); /* site b's, which said nothing since */
	ck_assert_ptr_nonnull(strstr(logged(&lines), "<4>log: 7 more lines like \"site b, line %d\""));
	ck_assert_uint_eq(lines, 9);
	ck_assert_uint_eq(log_flush_suppressed(), 0);
}
END_TEST

START_TEST(test_burst_zero_is_unlimited)
{
	unsigned lines;

	capture();
	log_set_rate_limit(1000, 0);
	for (int i = 0; i < 500; i++)
		from_site_a(i);
	logged(&lines);
	ck_assert_uint_eq(lines, 500);
	ck_assert_uint_eq(log_suppressed_total(), 0);
}
END_TEST

/* Debug lines are dropped below the level before the limit counts them. */
START_TEST(test_level_before_limit)
{
	unsigned lines;

	capture();
	log_set_rate_limit(60000, 2);
	for (int i = 0; i < 10; i++)
		log_debug("not shown %d", i);
	log_set_max_level(LOG_DEBUG);
	log_debug("shown");
	logged(&lines);
	ck_assert_uint_eq(lines, 1);
	ck_assert_uint_eq(log_suppressed_total(), 0);
}
END_TEST

/*
 * %m belongs to the _errno variants: a call without an error never prints strerror(0)
 * ("Success"), nor whatever errno holds, and leaves errno alone; %%m stays a literal "%m".
 */
START_TEST(test_no_errno_no_success)
{
	const char *text;

	capture();
	errno = 0;
	ck_assert_int_eq(log_warning("reading %s: %m", "the eventfd"), 0);
	errno = EBADF;
	log_info("again: %m, %d%%m", 5);
	ck_assert_int_eq(errno, EBADF);
	ck_assert_int_eq(log_warning_errno(0, "zero: %m"), 0);
	errno = 0;
	ck_assert_int_eq(log_error_errno(-EBADF, "with one: %m"), -EBADF);
	ck_assert_int_eq(errno, 0);
	text = logged(NULL);
	ck_assert_ptr_null(strstr(text, "Success"));
	ck_assert_ptr_nonnull(strstr(text, "<4>reading the eventfd: (no error given)\n"));
	ck_assert_ptr_nonnull(strstr(text, "<6>again: (no error given), 5%m\n"));
	ck_assert_ptr_nonnull(strstr(text, "<4>zero: (no error given)\n"));
	ck_assert_ptr_nonnull(strstr(text, "<3>with one: Bad file descriptor\n"));
	ck_assert_ptr_null(strstr(text, "again: Bad file descriptor"));
}
END_TEST

/* A format longer than the line still loses its %m, not its arguments. */
START_TEST(test_no_errno_long_format)
{
	const char *text;

	capture();
	errno = 0;
	log_notice("%s %m "
		   "................................................................................"
		   "................................................................................"
		   "................................................................................"
		   "................................................................................"
		   "................................................................................"
		   "................................................................................"
		   "................................................................................"
		   "................................................................................"
		   "................................................................................"
		   "................................................................................"
		   "................................................................................"
		   "................................................................................"
		   "................................................................................"
		   " %d", "start", 42);
	text = logged(NULL);
	ck_assert_ptr_null(strstr(text, "Success"));
	ck_assert_ptr_nonnull(strstr(text, "<5>start (no error given) ...."));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("log");
	TCase *tc = tcase_create("log");

	tcase_add_test(tc, test_control_characters_escaped);
	tcase_add_test(tc, test_rate_limited_per_site);
	tcase_add_test(tc, test_burst_zero_is_unlimited);
	tcase_add_test(tc, test_level_before_limit);
	tcase_add_test(tc, test_no_errno_no_success);
	tcase_add_test(tc, test_no_errno_long_format);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

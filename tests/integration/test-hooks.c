/* SPDX-License-Identifier: MIT */
/*
 * What only the test hooks can show (a build configured with --enable-test-hooks; without
 * them this program is skipped, 77): a stop while a reply waits for a slowed copy, a device
 * error under a waiting reply, and `kvpagedctl verify` reporting a pool whose state was broken
 * behind the daemon's back.
 */
#include "tests/integration/harness.h"

#ifdef KVPAGED_TEST_HOOKS
static struct daemon d;

/*
 * The two tests below: a daemon whose pool copies on its helper thread (the caller sets the
 * thread's test hooks first), and a sequence of 20 tokens forked after its commit, so that the
 * child's next append copies the shared partial block (slot 20) before its reply.
 */
struct forked {
	struct kvp_client *c;
	struct kvp_table tab, kid;
	uint64_t seq, child;
};

static void forked_on_thread(struct forked *f)
{
	uint32_t t[20], cached;

	*f = (struct forked){ 0 };
	daemon_start(&d, "[pool main]\ncopy_thread = yes\nlayers = 2\nkv_heads = 2\n"
			 "head_dim = 4\nelement_bytes = 4\nblock_tokens = 16\n"
			 "capacity_blocks = 64\n");
	prompt(t, 20, 5);
	f->c = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_open(f->c, t, 20, 0, 0, &f->seq, &cached, &f->tab), 0);
	ck_assert_int_eq(kvp_commit(f->c, f->seq, 20, &f->tab), 0);
	ck_assert_int_eq(kvp_fork(f->c, f->seq, &f->child, &f->kid), 0);
}

static void forked_done(struct forked *f)
{
	kvp_disconnect(f->c);
	kvp_table_free(&f->tab);
	kvp_table_free(&f->kid);
}

/*
 * A stop while a reply waits for the backend's queue: the copy-on-write copy of an append
 * runs on the helper thread (slowed to 300 ms by the test hook), SIGTERM arrives meanwhile,
 * and the drain must still send the reply before the session goes.
 */
START_TEST(test_drain_sends_a_reply_waiting_for_its_copy)
{
	struct forked f;
	uint32_t x = 99;
	pid_t pid;

	setenv("KVPAGED_TEST_COPY_DELAY_MS", "300", 1);
	forked_on_thread(&f);
	unsetenv("KVPAGED_TEST_COPY_DELAY_MS");
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		msleep(50);
		kill(d.pid, SIGTERM);
		_exit(0);
	}
	/* Slot 20 is in the shared partial block: the daemon copies it, then replies. */
	ck_assert_int_eq(kvp_append(f.c, f.child, &x, 1, &f.kid), 0);
	ck_assert_uint_eq(f.kid.len, 2);
	ck_assert_uint_ne(f.kid.blocks[1], f.tab.blocks[1]);
	ck_assert_int_eq(wait_child(pid), 0);
	forked_done(&f);
	daemon_wait_stopped(&d); /* stopped by the SIGTERM above */
}
END_TEST

/*
 * A device error while a reply waits for it: the copy-on-write copy of an append fails on the
 * helper thread the way a GPU stream fails (test hooks), so no completion event ever comes.  The
 * daemon must still find the error, drop the reply and stop with status 1, not hang.
 */
START_TEST(test_backend_failure_stops_the_daemon)
{
	struct forked f;
	uint32_t x = 99;

	/* It fails 300 ms in: after the daemon last looked, when the reply was held. */
	setenv("KVPAGED_TEST_COPY_FAIL_AT", "1", 1);
	setenv("KVPAGED_TEST_COPY_DELAY_MS", "300", 1);
	forked_on_thread(&f);
	unsetenv("KVPAGED_TEST_COPY_FAIL_AT");
	unsetenv("KVPAGED_TEST_COPY_DELAY_MS");
	/* The pool's first operation: its reply waits for it, and it fails. */
	ck_assert_int_lt(kvp_append(f.c, f.child, &x, 1, &f.kid), 0);
	forked_done(&f);
	ck_assert_int_eq(daemon_wait_exit(&d), 1);
	ck_assert(daemon_log_has(&d, "the pool's memory cannot be trusted"));
	daemon_remove_files(&d);
}
END_TEST

/*
 * kvpagedctl verify on a running daemon whose first pool had a block refcount raised behind
 * its back (SIGUSR2, the test hook): verify passed before, and now exits 1 naming the pool and
 * the refcount.  The other pool is untouched and not reported.
 */
START_TEST(test_verify_reports_a_corrupted_pool)
{
	static const char geometry[] = "layers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 4\n"
				       "block_tokens = 16\ncapacity_blocks = 16\n";
	char pools[512], out[4096];
	struct kvp_client *c;
	uint32_t t[40], cached;
	uint64_t seq;
	int i;

	snprintf(pools, sizeof(pools), "[pool main]\n%s\n[pool other]\n%s", geometry, geometry);
	daemon_start(&d, pools);
	c = connect_ns(NULL, 0);
	prompt(t, 40, 3);
	ck_assert_int_eq(kvp_open(c, t, 40, 0, 0, &seq, &cached, NULL), 0);
	ck_assert_int_eq(kvp_commit(c, seq, 40, NULL), 0);
	ck_assert_msg(ctl(&d, "verify", out, sizeof(out)) == 0, "verify before: %s", out);

	ck_assert_int_eq(kill(d.pid, SIGUSR2), 0);
	for (i = 0; i < 500 && !daemon_log_has(&d, "test hook: SIGUSR2: pool main"); i++)
		msleep(10);
	ck_assert_msg(i < 500, "the daemon did not take SIGUSR2 within 5 s");
	ck_assert_int_eq(ctl(&d, "verify", out, sizeof(out)), 1);
	ck_assert_msg(strstr(out, "pool main: block ") && strstr(out, "refcount"),
		      "verify does not name the problem: %s", out);
	ck_assert_msg(!strstr(out, "pool other"), "verify blames the other pool: %s", out);
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

/* This build says what it is: kvpaged --version names the test hooks. */
START_TEST(test_version_names_the_hooks)
{
	char *argv[] = { "kvpaged", "--version", NULL }, out[256];

	ck_assert_int_eq(run_output(bin("KVPAGED_BIN", "./kvpaged"), argv, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "(test hooks"), "kvpaged --version: %s", out);
}
END_TEST
#endif

int main(void)
{
#ifdef KVPAGED_TEST_HOOKS
	Suite *s = suite_create("hooks");
	TCase *tc = tcase_create("hooks");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_drain_sends_a_reply_waiting_for_its_copy);
	tcase_add_test(tc, test_backend_failure_stops_the_daemon);
	tcase_add_test(tc, test_verify_reports_a_corrupted_pool);
	tcase_add_test(tc, test_version_names_the_hooks);
	suite_add_tcase(s, tc);
	return run_suite(s);
#else
	puts("SKIP: needs the test hooks (configure --enable-test-hooks)");
	return 77;
#endif
}

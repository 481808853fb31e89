/* SPDX-License-Identifier: MIT */
/*
 * Admission against another local user, for real: root runs the daemon and its tests, and a
 * child running as user nobody attacks.  Needs root and a user nobody (Debian has both): it
 * says so and exits 77 (skipped) otherwise.
 *
 *   - nobody floods the client socket with 2 x max_sessions idle connections and keeps
 *     reconnecting (tests/stress/stress-client flood); meanwhile kvpagedctl status and a new
 *     client of root both succeed within hello_timeout_ms + 1 s, every time;
 *   - nobody's junk namespaces (one per connection) fold only nobody's own unused entries:
 *     root's namespace stays listed with its statistics;
 *   - per-uid quotas are per uid: nobody's sequences do not count against root's.
 */
#include <grp.h>
#include <pwd.h>

#include "tests/integration/peer.h"

#define POOL "[pool main]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 4\n" \
	     "block_tokens = 16\ncapacity_blocks = 256\n"

static struct daemon d;
static struct passwd nobody;

static long long ms_since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1000ll + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

/* Forks fn(arg) as user nobody; returns the child. */
static pid_t as_nobody(int (*fn)(int), int arg)
{
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		alarm(60);
		if (setgroups(0, NULL) < 0 || setgid(nobody.pw_gid) < 0 ||
		    setuid(nobody.pw_uid) < 0)
			_exit(99);
		_exit(fn(arg));
	}
	return pid;
}

static int wait_status(pid_t pid)
{
	int status;

	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/*
 * The attacker, tests/stress/stress-client as user nobody: n connections that say nothing,
 * each made again as soon as the daemon drops it, for 4 s.
 */
static pid_t flood(int n)
{
	char count[16];
	pid_t pid;

	snprintf(count, sizeof(count), "%d", n);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		execl(bin("STRESS_CLIENT", "./tests/stress/stress-client"), "stress-client", "flood",
		      d.sock, count, "4", "--as", nobody.pw_name, (char *)NULL);
		_exit(127);
	}
	return pid;
}

START_TEST(test_idle_flood_from_another_uid)
{
	const long long limit_ms = 1000 + 1000; /* hello_timeout_ms + 1 s */
	long long status_ms = 0, client_ms = 0;
	uint32_t t[32], cached;
	char out[16384];
	pid_t attacker;
	unsigned lines = 0;
	FILE *f;

	daemon_start_with(&d, NULL, "[limits]\nhello_timeout_ms = 1000\n" POOL);
	attacker = flood(2 * 256);
	msleep(500);
	prompt(t, 32, 1);
	for (int round = 0; round < 3; round++) {
		struct timespec t0;
		struct kvp_client *c;

		clock_gettime(CLOCK_MONOTONIC, &t0);
		ck_assert_int_eq(ctl(&d, "status", NULL, 0), 0);
		if (ms_since(&t0) > status_ms)
			status_ms = ms_since(&t0);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		c = connect_ns(NULL, 0);
		ck_assert_int_eq(kvp_lookup(c, t, 32, 0, 0, &cached), 0);
		if (ms_since(&t0) > client_ms)
			client_ms = ms_since(&t0);
		kvp_disconnect(c);
		msleep(700);
	}
	ck_assert_int_eq(wait_status(attacker), 0);
	printf("during the flood: kvpagedctl status took %lld ms at most, a client %lld ms\n",
	       status_ms, client_ms);
	ck_assert_int_le(status_ms, limit_ms);
	ck_assert_int_le(client_ms, limit_ms);
	ck_assert_int_eq(ctl(&d, "status", out, sizeof(out)), 0);
	ck_assert_int_gt(json_int(out, "max_sessions_per_uid"), 0);
	ck_assert_int_gt(json_int(out, "hello_timeout_ms"), 0);
	assert_verified(&d);
	/* Each refusal is a debug line, and those are rate limited too. */
	f = fopen(d.log, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(out, sizeof(out), f))
		lines++;
	fclose(f);
	ck_assert_uint_lt(lines, 2000);
	daemon_stop(&d);
}
END_TEST

static int junk_namespaces(int n)
{
	uint32_t t[32];

	prompt(t, 32, 5);
	for (int i = 0; i < n; i++) {
		char ns[32];
		struct kvp_connect_options o = { .size = sizeof(o), .ns = ns };
		struct kvp_client *c = NULL;
		uint64_t seq;

		snprintf(ns, sizeof(ns), "junk-%d", i);
		if (kvp_connect(&o, &c) < 0 || kvp_open(c, t, 32, 0, 0, &seq, NULL, NULL) < 0)
			return 1;
		kvp_disconnect(c);
	}
	return 0;
}

START_TEST(test_junk_namespaces_hide_no_one)
{
	struct kvp_client *c;
	uint32_t t[32];
	uint64_t seq;
	static char out[1 << 20];

	daemon_start_with(&d, NULL, "[limits]\nmax_namespaces_per_uid = 8\n" POOL);
	c = connect_ns("keep", 0);
	prompt(t, 32, 9);
	ck_assert_int_eq(kvp_open(c, t, 32, 0, 0, &seq, NULL, NULL), 0);
	kvp_disconnect(c); /* unused from now on, and the oldest entry */
	ck_assert_int_eq(wait_status(as_nobody(junk_namespaces, 300)), 0);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "\"uid:0/keep\""), "root's namespace is gone: %s", out);
	ck_assert_int_ge(json_int(out, "namespaces_folded"), 300 - 8);
	ck_assert_ptr_null(strstr(out, "uid:65534/junk-0\""));
	ck_assert_ptr_nonnull(strstr(out, "uid:65534/junk-299\""));
	assert_verified(&d);
	daemon_stop(&d);
}
END_TEST

static int two_sequences(int unused)
{
	struct kvp_connect_options o = { .size = sizeof(o) };
	struct kvp_client *c = NULL;
	uint32_t t[16];
	uint64_t seq;

	(void)unused;
	prompt(t, 16, 3);
	if (kvp_connect(&o, &c) < 0)
		return 1;
	for (int i = 0; i < 2; i++)
		if (kvp_open(c, t, 16, 0, 0, &seq, NULL, NULL) < 0)
			return 2;
	if (kvp_open(c, t, 16, 0, 0, &seq, NULL, NULL) != -EMFILE)
		return 3;
	kvp_disconnect(c);
	return 0;
}

START_TEST(test_uid_quotas_are_per_uid)
{
	struct kvp_client *c;
	uint32_t t[16];
	uint64_t seq;

	daemon_start_with(&d, NULL, "[limits]\nmax_sequences_per_uid = 2\n" POOL);
	c = connect_ns(NULL, 0);
	prompt(t, 16, 3);
	ck_assert_int_eq(kvp_open(c, t, 16, 0, 0, &seq, NULL, NULL), 0);
	ck_assert_int_eq(kvp_open(c, t, 16, 0, 0, &seq, NULL, NULL), 0);
	ck_assert_int_eq(wait_status(as_nobody(two_sequences, 0)), 0);
	ck_assert_int_eq(kvp_open(c, t, 16, 0, 0, &seq, NULL, NULL), -EMFILE);
	assert_verified(&d);
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("admission");
	TCase *tc = tcase_create("admission");
	struct passwd *pw = getpwnam("nobody");

	if (geteuid() != 0 || !pw) {
		printf("SKIP: these tests need root and a user nobody (%s)\n",
		       geteuid() ? "not root" : "no user nobody");
		return 77;
	}
	nobody = *pw;
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_idle_flood_from_another_uid);
	tcase_add_test(tc, test_junk_namespaces_hide_no_one);
	tcase_add_test(tc, test_uid_quotas_are_per_uid);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

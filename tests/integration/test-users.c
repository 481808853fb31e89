/* SPDX-License-Identifier: MIT */
/*
 * The daemon and other users: a pool's ACL, uid namespaces, and the admin socket refusing a
 * stranger, each seen from a client running as user nobody.  Needs root (to become nobody)
 * and a user nobody: without them the whole program is skipped (77), saying why, since none
 * of its cases can run.
 */
#include <pwd.h>

#include "tests/integration/harness.h"

static struct daemon d;
static struct passwd nobody;

/* Runs fn in a child as user nobody; returns its exit status. */
static int as_nobody(int (*fn)(void))
{
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		alarm(20);
		if (setgroups(0, NULL) < 0 || setgid(nobody.pw_gid) < 0 ||
		    setuid(nobody.pw_uid) < 0)
			_exit(125);
		_exit(fn());
	}
	return wait_child(pid);
}

static int nobody_connects(void)
{
	char why[256] = "";
	struct kvp_connect_options o = { .size = sizeof(o), .pool = "private", .error_buf = why,
					 .error_len = sizeof(why) };
	struct kvp_client *c = NULL;
	int r = kvp_connect(&o, &c);

	if (r != -EACCES || !strstr(why, "may not use pool private")) {
		fprintf(stderr, "nobody connecting to pool private: %d (%s)\n", r, why);
		return 1;
	}
	o.pool = "public";
	r = kvp_connect(&o, &c);
	if (r < 0)
		return 2;
	/* uid namespaces: nobody's blocks are not root's. */
	uint32_t t[32], cached = 1;
	prompt(t, 32, 42);
	if (kvp_lookup(c, t, 32, 0, 0, &cached) < 0 || cached != 0)
		return 3;
	if (strcmp(kvp_namespace(c), "uid:65534") != 0)
		return 4;
	kvp_disconnect(c);
	return 0;
}

START_TEST(test_acl_and_uid_namespaces)
{
	uint32_t t[32], cached;
	struct kvp_connect_options o = { .size = sizeof(o), .pool = "public" };
	struct kvp_client *c;
	uint64_t s;

	daemon_start(&d, "[pool private]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 4\n"
			 "block_tokens = 16\ncapacity_blocks = 16\nallow_users = root\n\n"
			 "[pool public]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 4\n"
			 "block_tokens = 16\ncapacity_blocks = 16\n");
	ck_assert_int_eq(kvp_connect(&o, &c), 0);
	prompt(t, 32, 42);
	ck_assert_int_eq(kvp_open(c, t, 32, 0, 0, &s, &cached, NULL), 0);
	ck_assert_int_eq(kvp_commit(c, s, 32, NULL), 0);
	ck_assert_int_eq(as_nobody(nobody_connects), 0);
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

static int nobody_admin(void)
{
	char out[1024];

	/* The socket file is opened up so the daemon itself must refuse: kvpagedctl exits 1. */
	return ctl(&d, "status", out, sizeof(out)) == 1 ? 0 : 1;
}

START_TEST(test_admin_refuses_strangers)
{
	daemon_start(&d, NULL);
	ck_assert_int_eq(chmod(d.admin, 0666), 0);
	/* nobody runs kvpagedctl from the daemon's directory, not from the build tree. */
	daemon_copy_ctl(&d);
	ck_assert_int_eq(as_nobody(nobody_admin), 0);
	ck_assert_int_eq(ctl(&d, "status", NULL, 0), 0);
	daemon_stop(&d);
}
END_TEST

/* Whether this process can become nobody: root, a user nobody, and the calls allowed. */
static const char *cannot_become_nobody(void)
{
	struct passwd *pw = getpwnam("nobody");
	int status;
	pid_t pid;

	if (geteuid() != 0)
		return "not root: cannot switch to user nobody";
	if (!pw)
		return "no user nobody";
	nobody = *pw;
	pid = fork();
	if (pid < 0)
		return "fork failed";
	if (pid == 0)
		_exit(setgroups(0, NULL) < 0 || setgid(nobody.pw_gid) < 0 ||
				      setuid(nobody.pw_uid) < 0
			      ? 1
			      : 0);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
		return "setuid(nobody) is refused here";
	return NULL;
}

int main(void)
{
	const char *why = cannot_become_nobody();
	Suite *s = suite_create("users");
	TCase *tc = tcase_create("users");

	if (why) {
		printf("SKIP: %s\n", why);
		return 77;
	}
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_acl_and_uid_namespaces);
	tcase_add_test(tc, test_admin_refuses_strangers);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

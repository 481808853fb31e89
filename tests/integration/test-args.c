/* SPDX-License-Identifier: MIT */
/*
 * libkvpaged's entry points and bad arguments: every exported function (libkvpaged.sym, which
 * the list below must cover) given a NULL client, or a NULL where it needs a pointer, returns
 * -EINVAL (the ones returning a pointer or a value: NULL, 0 or nothing) instead of
 * dereferencing it; AddressSanitizer builds run the same calls.  And the promise of
 * kvpaged.h: a call that fails, refused by the daemon or for a bad argument, leaves its ret_
 * outputs and the caller's tables as they were.
 */
#include <dlfcn.h>

#include "tests/integration/harness.h"

#define KVP_OP_BAD_FOR_TEST 0xfffu /* no opcode has this number */

#if defined(__SANITIZE_ADDRESS__)
#define HAVE_REALLOC_HOOK 0 /* AddressSanitizer has realloc to itself */
#else
#define HAVE_REALLOC_HOOK 1
/*
 * The next realloc() of exactly this many bytes fails (then the hook is off): an out-of-memory
 * the library meets while it writes a reply into the caller's table.
 */
static size_t fail_realloc_bytes;

void *realloc(void *p, size_t n)
{
	static void *(*next)(void *, size_t);

	if (fail_realloc_bytes && n == fail_realloc_bytes) {
		fail_realloc_bytes = 0;
		return NULL;
	}
	if (!next)
		next = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
	return next(p, n);
}
#endif

static struct daemon d;

static void setup(void)
{
	daemon_start(&d, NULL);
}

static void teardown(void)
{
	daemon_stop(&d);
}

/* Every function this file calls with bad arguments: libkvpaged.sym may export no other. */
static const char *const covered[] = {
	"kvp_append",	 "kvp_close",	   "kvp_commit",	  "kvp_complete",
	"kvp_connect",	 "kvp_disconnect", "kvp_fork",	  "kvp_last_error",
	"kvp_lookup",	 "kvp_namespace",  "kvp_open",	  "kvp_open_retained",
	"kvp_park",	 "kvp_pool",	   "kvp_pool_base",	  "kvp_pool_device_ptr",
	"kvp_report_scores", "kvp_resume", "kvp_seq_info",	  "kvp_seq_packed",
	"kvp_set_wait",	 "kvp_submit",	   "kvp_table_free",  "kvp_probe",
	"kvp_version",	 "kvp_completion_fd", "kvp_complete_arm",
};

START_TEST(test_every_export_covered)
{
	const char *srcdir = getenv("srcdir");
	char path[512], line[256], name[128];
	unsigned exports = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/libclient/libkvpaged.sym", srcdir ? srcdir : ".");
	f = fopen(path, "r");
	ck_assert_msg(f, "%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		bool found = false;

		if (sscanf(line, " %127[a-z_0-9];", name) != 1 || strncmp(name, "kvp_", 4))
			continue;
		exports++;
		for (size_t i = 0; i < sizeof(covered) / sizeof(covered[0]); i++)
			found |= !strcmp(covered[i], name);
		ck_assert_msg(found, "%s is exported but not called with bad arguments here", name);
	}
	fclose(f);
	ck_assert_uint_eq(exports, sizeof(covered) / sizeof(covered[0]));
}
END_TEST

/* No client: nothing to dereference, and no daemon needed. */
START_TEST(test_null_client)
{
	struct kvp_table t = { 0 }, t2 = { 0 };
	struct kvp_retention ret = { .size = sizeof(ret) };
	struct kvp_probe_info probe = { .size = sizeof(probe) };
	struct kvp_completion cq[1];
	struct kvp_op op = { .opcode = KVP_NOP };
	uint32_t tokens[4] = { 1, 2, 3, 4 }, u = 7, u2 = 7;
	uint64_t seq = 9;
	float w[4] = { 0 };

	ck_assert_int_eq(kvp_open(NULL, tokens, 4, 0, 0, &seq, &u, &t), -EINVAL);
	ck_assert_int_eq(kvp_open_retained(NULL, tokens, 4, 0, 0, &ret, &seq, &u, &t), -EINVAL);
	ck_assert_int_eq(kvp_report_scores(NULL, 1, 0, w, 4), -EINVAL);
	ck_assert_int_eq(kvp_seq_packed(NULL, 1, &t, &t2), -EINVAL);
	ck_assert_int_eq(kvp_append(NULL, 1, tokens, 4, &t), -EINVAL);
	ck_assert_int_eq(kvp_commit(NULL, 1, 4, &t), -EINVAL);
	ck_assert_int_eq(kvp_fork(NULL, 1, &seq, &t), -EINVAL);
	ck_assert_int_eq(kvp_close(NULL, 1), -EINVAL);
	ck_assert_int_eq(kvp_lookup(NULL, tokens, 4, 0, 0, &u), -EINVAL);
	ck_assert_int_eq(kvp_seq_info(NULL, 1, &u, &u2, &t), -EINVAL);
	ck_assert_int_eq(kvp_park(NULL, 1), -EINVAL);
	ck_assert_int_eq(kvp_resume(NULL, 1, &u, &t), -EINVAL);
	ck_assert_int_eq(kvp_submit(NULL, &op, 1), -EINVAL);
	ck_assert_int_eq(kvp_complete(NULL, cq, 1, 0, 0), -EINVAL);
	ck_assert_int_eq(kvp_completion_fd(NULL), -EINVAL);
	ck_assert_int_eq(kvp_complete_arm(NULL), -EINVAL);
	ck_assert_int_eq(kvp_probe(NULL, &probe), -EINVAL);
	/* Outputs untouched. */
	ck_assert_uint_eq(seq, 9);
	ck_assert_uint_eq(u, 7);
	ck_assert_uint_eq(u2, 7);
	ck_assert_uint_eq(probe.size, sizeof(probe));
	ck_assert_ptr_null(t.blocks);
	ck_assert_uint_eq(t.len, 0);
	/* The ones that return no int: documented values, no crash. */
	ck_assert_ptr_null(kvp_pool(NULL));
	ck_assert_ptr_null(kvp_pool_base(NULL));
	ck_assert_uint_eq(kvp_pool_device_ptr(NULL), 0);
	ck_assert_ptr_null(kvp_namespace(NULL));
	ck_assert_str_eq(kvp_last_error(NULL), "no client");
	ck_assert_ptr_null(kvp_disconnect(NULL));
	kvp_set_wait(NULL, 10);
	kvp_table_free(NULL);
	ck_assert_uint_ge(kvp_version(), KVP_VERSION_ENCODE(0, 2, 0));
}
END_TEST

/* kvp_connect without a place for the client: -EINVAL, said in error_buf, nothing connected. */
START_TEST(test_connect_without_ret)
{
	char why[128] = "";
	struct kvp_connect_options o = { .size = sizeof(o), .socket_path = d.sock,
					 .error_buf = why, .error_len = sizeof(why) };

	ck_assert_int_eq(kvp_connect(&o, NULL), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "ret"));
	ck_assert_int_eq(kvp_connect(NULL, NULL), -EINVAL);
}
END_TEST

static void table_copy(const struct kvp_table *t, uint32_t *copy)
{
	memcpy(copy, t->blocks, (size_t)t->len * sizeof(*copy));
}

static void assert_table_is(const struct kvp_table *t, const struct kvp_table *was,
			    const uint32_t *copy)
{
	ck_assert_ptr_eq(t->blocks, was->blocks);
	ck_assert_uint_eq(t->len, was->len);
	ck_assert_uint_eq(t->cap, was->cap);
	ck_assert_int_eq(memcmp(t->blocks, copy, (size_t)t->len * sizeof(*copy)), 0);
}

/* A client and bad arguments: -EINVAL with the argument named, outputs and tables unchanged. */
START_TEST(test_bad_arguments)
{
	struct kvp_client *c = connect_ns(NULL, 16);
	struct kvp_table t = { 0 }, was, bad = { .blocks = NULL, .len = 0, .cap = 8 };
	struct kvp_probe_info probe = { .size = sizeof(probe) };
	struct kvp_op op = { .opcode = KVP_OPEN, .ntokens = 4, .tokens = NULL };
	uint32_t tokens[40], copy[8], cached = 77, u = 77;
	uint64_t seq = 99, child = 99;

	prompt(tokens, 40, 1000);
	ck_assert_int_eq(kvp_open(c, NULL, 40, 0, 0, &seq, &cached, &t), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "tokens is NULL"));
	ck_assert_int_eq(kvp_open(c, tokens, 40, 0, 0, NULL, &cached, &t), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "ret_seq"));
	ck_assert_int_eq(kvp_open(c, tokens, 40, 0, 0, &seq, &cached, &bad), -EINVAL);
	ck_assert_uint_eq(seq, 99);
	ck_assert_uint_eq(cached, 77);
	ck_assert_ptr_null(t.blocks);
	ck_assert_ptr_null(bad.blocks);

	/* A good call after bad ones: the client is as it was. */
	ck_assert_int_eq(kvp_open(c, tokens, 40, 0, 0, &seq, &cached, &t), 0);
	ck_assert_uint_eq(t.len, 3);
	ck_assert_str_eq(kvp_last_error(c), "");
	was = t;
	table_copy(&t, copy);

	ck_assert_int_eq(kvp_append(c, seq, NULL, 2, &t), -EINVAL);
	ck_assert_int_eq(kvp_append(c, seq, tokens, 2, &bad), -EINVAL);
	ck_assert_int_eq(kvp_commit(c, seq, 40, &bad), -EINVAL);
	ck_assert_int_eq(kvp_report_scores(c, seq, 0, NULL, 3), -EINVAL);
	ck_assert_int_eq(kvp_fork(c, seq, NULL, NULL), -EINVAL);
	ck_assert_int_eq(kvp_fork(c, seq, &child, &bad), -EINVAL);
	ck_assert_int_eq(kvp_lookup(c, NULL, 4, 0, 0, &u), -EINVAL);
	ck_assert_int_eq(kvp_lookup(c, tokens, 4, 0, 0, NULL), -EINVAL);
	ck_assert_int_eq(kvp_seq_info(c, seq, &u, &u, &bad), -EINVAL);
	ck_assert_int_eq(kvp_seq_packed(c, seq, &bad, NULL), -EINVAL);
	ck_assert_int_eq(kvp_resume(c, seq, &u, &bad), -EINVAL);
	ck_assert_int_eq(kvp_submit(c, NULL, 1), -EINVAL);
	ck_assert_int_eq(kvp_submit(c, &op, 1), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "tokens is NULL"));
	{
		/* A bad op after a good one: the good one is queued and published, alone. */
		struct kvp_op two[2] = { { .opcode = KVP_NOP, .user_data = 5 },
					 { .opcode = KVP_OP_BAD_FOR_TEST } };
		struct kvp_completion cq[2];

		ck_assert_int_eq(kvp_submit(c, two, 2), 1);
		ck_assert_int_eq(kvp_complete(c, cq, 2, 1, 5000), 1);
		ck_assert_uint_eq(cq[0].user_data, 5);
		ck_assert_int_eq(cq[0].res, 0);
		ck_assert_int_eq(kvp_submit(c, two + 1, 1), -EINVAL);
		ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "unknown opcode"));
	}
	ck_assert_int_eq(kvp_complete(c, NULL, 1, 0, 0), -EINVAL);
	ck_assert_int_eq(kvp_probe(c, NULL), -EINVAL);
	ck_assert_uint_eq(child, 99);
	ck_assert_uint_eq(u, 77);
	assert_table_is(&t, &was, copy);
	/* Zero counts need no pointers. */
	ck_assert_int_eq(kvp_submit(c, NULL, 0), 0);
	ck_assert_int_eq(kvp_complete(c, NULL, 0, 0, 0), 0);

	ck_assert_ptr_nonnull(kvp_pool(c));
	ck_assert_ptr_nonnull(kvp_pool_base(c));
	ck_assert_uint_eq(kvp_pool_device_ptr(c), 0);
	ck_assert_ptr_nonnull(kvp_namespace(c));
	ck_assert_int_eq(kvp_probe(c, &probe), 0);
	ck_assert_int_eq(kvp_close(c, seq), 0);
	kvp_table_free(&t);
	kvp_disconnect(c);
}
END_TEST

/* Requests the daemon refuses: the caller's table and ret_ values stay as they were. */
START_TEST(test_refused_leaves_outputs)
{
	struct kvp_client *c = connect_ns(NULL, 0);
	struct kvp_table t = { 0 }, was, t2 = { 0 }, was2;
	uint32_t tokens[40], copy[8], copy2[8], cached = 0, ntok = 77, ncom = 77, rec = 77;
	uint64_t seq, child = 99, bogus = 0xdead0000;

	prompt(tokens, 40, 2000);
	ck_assert_int_eq(kvp_open(c, tokens, 40, 0, 0, &seq, &cached, &t), 0);
	ck_assert_int_eq(kvp_seq_info(c, seq, NULL, NULL, &t2), 0); /* a second, equal table */
	was = t;
	was2 = t2;
	table_copy(&t, copy);
	table_copy(&t2, copy2);

	ck_assert_int_lt(kvp_seq_info(c, bogus, &ntok, &ncom, &t), 0);
	ck_assert_int_lt(kvp_fork(c, bogus, &child, &t2), 0);
	ck_assert_int_lt(kvp_resume(c, bogus, &rec, &t), 0);
	ck_assert_int_lt(kvp_append(c, bogus, tokens, 4, &t), 0);
	ck_assert_int_lt(kvp_commit(c, bogus, 4, &t), 0);
	ck_assert_int_lt(kvp_seq_packed(c, bogus, &t, &t2), 0);
	ck_assert_uint_eq(ntok, 77);
	ck_assert_uint_eq(ncom, 77);
	ck_assert_uint_eq(rec, 77);
	ck_assert_uint_eq(child, 99);
	assert_table_is(&t, &was, copy);
	assert_table_is(&t2, &was2, copy2);
	ck_assert_str_ne(kvp_last_error(c), "");
	ck_assert_int_eq(kvp_close(c, seq), 0);
	kvp_table_free(&t);
	kvp_table_free(&t2);
	kvp_disconnect(c);
}
END_TEST

#if HAVE_REALLOC_HOOK
/*
 * The library runs out of memory growing the caller's table for a reply: the call fails with
 * -ENOMEM and the table (emptied first, before) and the ret_ values are as they were.
 */
START_TEST(test_enomem_leaves_table)
{
	struct kvp_client *c = connect_ns(NULL, 0);
	struct kvp_table t = { 0 }, big = { 0 }, was;
	uint32_t tokens[320], copy[8], cached = 77, ntok = 77, ncom = 77, rec = 77;
	uint64_t seq, big_seq, child = 99, s2 = 99;
	char out[8192];
	/* The library grows a table to the entries it needs plus 16. */
	const size_t grown = (320 / 16 + 16) * sizeof(uint32_t);

	prompt(tokens, 320, 3000);
	ck_assert_int_eq(kvp_open(c, tokens, 40, 0, 0, &seq, &cached, &t), 0);
	ck_assert_uint_eq(t.len, 3);
	ck_assert_uint_lt(t.cap, 320 / 16);
	ck_assert_int_eq(kvp_open(c, tokens, 320, 1, 0, &big_seq, NULL, &big), 0);
	ck_assert_uint_eq(big.len, 320 / 16);
	was = t;
	table_copy(&t, copy);

	cached = 77;
	fail_realloc_bytes = grown;
	ck_assert_int_eq(kvp_open(c, tokens, 320, 2, 0, &s2, &cached, &t), -ENOMEM);
	ck_assert_uint_eq(fail_realloc_bytes, 0); /* the hook was met */
	ck_assert_uint_eq(s2, 99);
	ck_assert_uint_eq(cached, 77);
	assert_table_is(&t, &was, copy);
	/* The daemon opened it, the caller cannot know it: the library closed it again. */
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "no memory for the reply's block table"));
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "closed"));
	ck_assert_int_eq(ctl(&d, "pools", out, sizeof(out)), 0);
	ck_assert_int_eq(json_int(out, "sequences"), 2);

	fail_realloc_bytes = grown;
	ck_assert_int_eq(kvp_seq_info(c, big_seq, &ntok, &ncom, &t), -ENOMEM);
	ck_assert_uint_eq(ntok, 77);
	ck_assert_uint_eq(ncom, 77);
	assert_table_is(&t, &was, copy);

	fail_realloc_bytes = grown;
	ck_assert_int_eq(kvp_fork(c, big_seq, &child, &t), -ENOMEM);
	ck_assert_uint_eq(child, 99);
	assert_table_is(&t, &was, copy);
	ck_assert_int_eq(ctl(&d, "pools", out, sizeof(out)), 0);
	ck_assert_int_eq(json_int(out, "sequences"), 2); /* the child was closed */

	ck_assert_int_eq(kvp_park(c, big_seq), 0);
	fail_realloc_bytes = grown;
	ck_assert_int_eq(kvp_resume(c, big_seq, &rec, &t), -ENOMEM);
	ck_assert_uint_eq(rec, 77);
	assert_table_is(&t, &was, copy);

	/* With memory, the same calls write it. */
	ck_assert_int_eq(kvp_seq_info(c, big_seq, &ntok, &ncom, &t), 0);
	ck_assert_uint_eq(t.len, 320 / 16);
	ck_assert_uint_eq(ntok, 320);
	kvp_table_free(&t);
	kvp_table_free(&big);
	kvp_disconnect(c);
}
END_TEST
#endif

int main(void)
{
	Suite *s = suite_create("args");
	TCase *plain = tcase_create("no daemon");
	TCase *tc = tcase_create("daemon");

	tcase_add_test(plain, test_every_export_covered);
	tcase_add_test(plain, test_null_client);
	suite_add_tcase(s, plain);
	tcase_set_timeout(tc, 60);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_connect_without_ret);
	tcase_add_test(tc, test_bad_arguments);
	tcase_add_test(tc, test_refused_leaves_outputs);
#if HAVE_REALLOC_HOOK
	tcase_add_test(tc, test_enomem_leaves_table);
#endif
	suite_add_tcase(s, tc);
	return run_suite(s);
}

/* SPDX-License-Identifier: MIT */
/*
 * config_apply_live(), what SIGHUP runs: live keys change in place (pointers into the running
 * configuration stay valid), every other difference is reported and keeps its running value,
 * pools are matched by name.
 */
#include <stdio.h>
#include <string.h>

#include "daemon/config.h"
#include "tests/check-runner.h"

#define POOL(name, capacity, extra)                                                         \
	"[pool " name "]\nlayers = 2\nkv_heads = 2\nhead_dim = 8\nelement_bytes = 2\n"       \
	"block_tokens = 16\ncapacity_blocks = " #capacity "\n" extra

struct reports {
	char lines[16][512];
	bool applied[16];
	unsigned n;
};

static void record(void *ctx, bool applied, const char *what)
{
	struct reports *r = ctx;

	ck_assert_uint_lt(r->n, 16);
	snprintf(r->lines[r->n], sizeof(r->lines[0]), "%s", what);
	r->applied[r->n++] = applied;
}

static void load(const char *text, struct kvpd_config *c)
{
	char err[512] = "";

	*c = (struct kvpd_config){ 0 };
	ck_assert_msg(config_load_string(text, "kvpaged.conf", c, err, sizeof(err)) == 0, "%s", err);
}

/* The report that contains want, and whether it was applied. */
static bool reported(const struct reports *r, const char *want, bool applied)
{
	for (unsigned i = 0; i < r->n; i++)
		if (strstr(r->lines[i], want))
			return r->applied[i] == applied;
	ck_abort_msg("no report contains '%s'", want);
	return false;
}

START_TEST(same_file_changes_nothing)
{
	struct kvpd_config live, next;
	struct reports r = { 0 };

	load(POOL("main", 64, "allow_users = 0, 1\n"), &live);
	load(POOL("main", 64, "allow_users = 0, 1\n"), &next);
	ck_assert_int_eq(config_apply_live(&live, &next, record, &r), 0);
	ck_assert_uint_eq(r.n, 0);
	config_free(&next);
	config_free(&live);
}
END_TEST

START_TEST(live_keys_apply_in_place)
{
	struct kvpd_config live, next;
	const struct kvpd_pool_config *pool;
	struct reports r = { 0 };

	load("[daemon]\nmax_sessions = 10\n" POOL("main", 64, "allow_groups = 5\n"), &live);
	pool = &live.pools[0];
	load("[daemon]\nmax_sessions = 3\nring_poll_us = 50\nmax_frame_bytes = 1MiB\n"
	     "metrics_max_connections = 2\nmetrics_timeout_ms = 500\n"
	     "[limits]\nmax_sequences = 8\nmax_wait_ms = 0\nmax_queued_bytes = 128KiB\n"
	     POOL("main", 64, "allow_users = 7\nallow_groups = 5, 6\n"),
	     &next);
	ck_assert_int_eq(config_apply_live(&live, &next, record, &r), 10);
	ck_assert_uint_eq(r.n, 10);
	ck_assert_ptr_eq(&live.pools[0], pool); /* sessions point here */
	ck_assert_uint_eq(live.metrics_max_connections, 2);
	ck_assert_uint_eq(live.metrics_timeout_ms, 500);
	ck_assert_uint_eq(live.max_sessions, 3);
	ck_assert_uint_eq(live.ring_poll_us, 50);
	ck_assert_uint_eq(live.max_frame_bytes, 1 << 20);
	ck_assert_uint_eq(live.limits.max_sequences, 8);
	ck_assert_uint_eq(live.limits.max_wait_ms, 0);
	ck_assert_uint_eq(live.limits.max_queued_bytes, 128 << 10);
	ck_assert_uint_eq(pool->n_allow_uids, 1);
	ck_assert_uint_eq(pool->allow_uids[0], 7);
	ck_assert_uint_eq(pool->n_allow_gids, 2);
	ck_assert_uint_eq(pool->allow_gids[1], 6);
	ck_assert(reported(&r, "[daemon] max_sessions: 10 -> 3", true));
	ck_assert(reported(&r, "[daemon] max_frame_bytes: 8MiB -> 1MiB", true));
	ck_assert(reported(&r, "[limits] max_queued_bytes: 16MiB -> 128KiB", true));
	ck_assert(reported(&r, "[pool main] allow_users: (empty) -> 7", true));
	ck_assert(reported(&r, "[pool main] allow_groups: 5 -> 5, 6", true));
	/* next now holds the old lists; freeing both frees each list once (ASan checks). */
	config_free(&next);
	config_free(&live);
}
END_TEST

START_TEST(other_keys_keep_running_values)
{
	struct kvpd_config live, next;
	struct reports r = { 0 };

	load("[daemon]\nsocket = /run/a.sock\n" POOL("main", 64, "policy = lru\n"), &live);
	load("[daemon]\nsocket = /run/b.sock\nadmin_group = 0\nmetrics_listen = 127.0.0.1:9464\n"
	     "metrics_max_request_bytes = 16K\n"
	     POOL("main", 128, "policy = cost\nnamespace = shared\nmodel_params = 7e9\n"),
	     &next);
	ck_assert_int_eq(config_apply_live(&live, &next, record, &r), 0);
	ck_assert_uint_eq(r.n, 8);
	ck_assert(reported(&r, "[daemon] metrics_listen: (not set) -> 127.0.0.1:9464", false));
	ck_assert(reported(&r, "[daemon] metrics_max_request_bytes: 8KiB -> 16KiB", false));
	ck_assert_ptr_null(live.metrics_listen);
	ck_assert_uint_eq(live.metrics_max_request_bytes, 8192);
	ck_assert(reported(&r, "[daemon] socket: /run/a.sock -> /run/b.sock", false));
	ck_assert(reported(&r, "[daemon] admin_group: (not set) -> 0", false));
	ck_assert(reported(&r, "[pool main] capacity_blocks: 64 -> 128", false));
	ck_assert(reported(&r, "[pool main] policy: lru -> cost", false));
	ck_assert(reported(&r, "[pool main] namespace: uid -> shared", false));
	ck_assert(reported(&r, "[pool main] model_params: 0 -> 7e+09", false));
	ck_assert_str_eq(live.socket_path, "/run/a.sock");
	ck_assert(!live.has_admin_gid);
	ck_assert_uint_eq(live.pools[0].capacity_blocks, 64);
	ck_assert_int_eq(live.pools[0].policy, KVPD_POLICY_LRU);
	config_free(&next);
	config_free(&live);
}
END_TEST

START_TEST(pools_match_by_name)
{
	struct kvpd_config live, next;
	struct reports r = { 0 };

	load(POOL("a", 8, "") POOL("b", 8, "") POOL("c", 8, ""), &live);
	/* b moves first and gets an ACL; c goes; d comes. */
	load(POOL("b", 8, "allow_users = 3\n") POOL("a", 8, "") POOL("d", 8, ""), &next);
	ck_assert_int_eq(config_apply_live(&live, &next, record, &r), 1);
	ck_assert(reported(&r, "[pool a]: moved from position 1 to 2", false));
	ck_assert(reported(&r, "[pool b]: moved from position 2 to 1", false));
	ck_assert(reported(&r, "[pool b] allow_users: (empty) -> 3", true));
	ck_assert(reported(&r, "[pool c]: no longer in the file", false));
	ck_assert(reported(&r, "[pool d]: a new pool", false));
	ck_assert_uint_eq(live.npools, 3);
	ck_assert_str_eq(live.pools[1].name, "b");
	ck_assert_uint_eq(live.pools[1].allow_uids[0], 3);
	config_free(&next);
	config_free(&live);
}
END_TEST

START_TEST(no_report_callback)
{
	struct kvpd_config live, next;

	load("[limits]\nmax_inflight = 4\n" POOL("main", 64, ""), &live);
	load("[limits]\nmax_inflight = 5\n" POOL("main", 65, ""), &next);
	ck_assert_int_eq(config_apply_live(&live, &next, NULL, NULL), 1);
	ck_assert_uint_eq(live.limits.max_inflight, 5);
	ck_assert_uint_eq(live.pools[0].capacity_blocks, 64);
	config_free(&next);
	config_free(&live);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("reload");
	TCase *tc = tcase_create("apply");

	tcase_add_test(tc, same_file_changes_nothing);
	tcase_add_test(tc, live_keys_apply_in_place);
	tcase_add_test(tc, other_keys_keep_running_values);
	tcase_add_test(tc, pools_match_by_name);
	tcase_add_test(tc, no_report_callback);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

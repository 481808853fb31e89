/* SPDX-License-Identifier: MIT */
/* kvpaged.conf: defaults, the round trip through config_print, and every kind of error. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"
#include "tests/unit/testutil.h"

#define NAME "kvpaged.conf"

/* A valid pool; its keys are on lines 1..7 of the text that starts with it. */
#define POOL_MAIN                                                                            \
	"[pool main]\n"                                                                      \
	"layers = 32\n"                                                                      \
	"kv_heads = 8\n"                                                                     \
	"head_dim = 128\n"                                                                   \
	"element_bytes = 2\n"                                                                \
	"block_tokens = 16\n"                                                                \
	"capacity_blocks = 4096\n"

static int load(const char *text, struct kvpd_config *c, char *err, size_t err_len)
{
	return config_load_string(text, NAME, c, err, err_len);
}

static void load_ok(const char *text, struct kvpd_config *c)
{
	char err[512] = "";
	int r;

	*c = (struct kvpd_config){ 0 };
	r = load(text, c, err, sizeof(err));
	ck_assert_msg(r == 0, "load failed with %d: %s", r, err);
	ck_assert_str_eq(err, "");
}

/* Loading fails with error, err contains want, and *ret is untouched. */
static void expect_error_code(const char *text, int error, const char *want)
{
	struct kvpd_config c, before;
	char err[512] = "";
	int r;

	memset(&c, 0xa5, sizeof(c));
	memcpy(&before, &c, sizeof(c));
	r = load(text, &c, err, sizeof(err));
	ck_assert_msg(r == error, "expected %d, got %d (%s) for:\n%s", error, r, err, text);
	ck_assert_msg(strstr(err, want), "error '%s' does not contain '%s'", err, want);
	ck_assert_msg(memcmp(&c, &before, sizeof(c)) == 0, "ret was changed on failure");
}

static void expect_error(const char *text, const char *want)
{
	expect_error_code(text, -EINVAL, want);
}

/* POOL_MAIN plus one more line in it (line 8). */
static void expect_pool_error(const char *line, const char *want)
{
	char text[1024];

	snprintf(text, sizeof(text), POOL_MAIN "%s\n", line);
	expect_error(text, want);
}

static void assert_pool_equal(const struct kvpd_pool_config *a, const struct kvpd_pool_config *b)
{
	ck_assert_str_eq(a->name, b->name);
	ck_assert_uint_eq(a->layers, b->layers);
	ck_assert_uint_eq(a->kv_heads, b->kv_heads);
	ck_assert_uint_eq(a->head_dim, b->head_dim);
	ck_assert_uint_eq(a->element_bytes, b->element_bytes);
	ck_assert_uint_eq(a->block_tokens, b->block_tokens);
	ck_assert_uint_eq(a->capacity_blocks, b->capacity_blocks);
	ck_assert_uint_eq(a->max_sequences, b->max_sequences);
	ck_assert_uint_eq(a->max_seq_tokens, b->max_seq_tokens);
	ck_assert_uint_eq(a->vocab_size, b->vocab_size);
	ck_assert_int_eq(a->namespace_mode, b->namespace_mode);
	ck_assert_int_eq(a->policy, b->policy);
	ck_assert_uint_eq(a->namespace_seed, b->namespace_seed);
	ck_assert_uint_eq(a->n_allow_uids, b->n_allow_uids);
	for (size_t i = 0; i < a->n_allow_uids; i++)
		ck_assert_uint_eq(a->allow_uids[i], b->allow_uids[i]);
	ck_assert_uint_eq(a->n_allow_gids, b->n_allow_gids);
	for (size_t i = 0; i < a->n_allow_gids; i++)
		ck_assert_uint_eq(a->allow_gids[i], b->allow_gids[i]);
	ck_assert_uint_eq(a->host_tier_blocks, b->host_tier_blocks);
	ck_assert_uint_eq(a->file_tier_blocks, b->file_tier_blocks);
	ck_assert_uint_eq(a->n_swap_files, b->n_swap_files);
	for (size_t i = 0; i < a->n_swap_files; i++)
		ck_assert_str_eq(a->swap_files[i], b->swap_files[i]);
	ck_assert_int_eq(a->file_tier_persist, b->file_tier_persist);
	ck_assert_uint_eq(a->file_tier_persist_stop_ms, b->file_tier_persist_stop_ms);
	ck_assert_uint_eq(a->file_tier_queue_depth, b->file_tier_queue_depth);
	ck_assert_double_eq(a->model_params, b->model_params);
	ck_assert_double_eq(a->engine_flops, b->engine_flops);
	ck_assert_uint_eq(a->host_tier_bandwidth, b->host_tier_bandwidth);
	ck_assert_uint_eq(a->window, b->window);
	ck_assert_uint_eq(a->file_tier_bandwidth, b->file_tier_bandwidth);
	ck_assert_int_eq(a->backend, b->backend);
	ck_assert_uint_eq(a->device, b->device);
	ck_assert_int_eq(!a->remote_tier, !b->remote_tier);
	if (a->remote_tier)
		ck_assert_str_eq(a->remote_tier, b->remote_tier);
	ck_assert_int_eq(!a->remote_tier_key_file, !b->remote_tier_key_file);
	if (a->remote_tier_key_file)
		ck_assert_str_eq(a->remote_tier_key_file, b->remote_tier_key_file);
	ck_assert_uint_eq(a->n_remote_tier_old_key_files, b->n_remote_tier_old_key_files);
	for (size_t i = 0; i < a->n_remote_tier_old_key_files; i++)
		ck_assert_str_eq(a->remote_tier_old_key_files[i], b->remote_tier_old_key_files[i]);
	ck_assert_int_eq(a->remote_tier_write, b->remote_tier_write);
	ck_assert_uint_eq(a->remote_tier_timeout_ms, b->remote_tier_timeout_ms);
	ck_assert_uint_eq(a->remote_tier_max_inflight, b->remote_tier_max_inflight);
	ck_assert_uint_eq(a->remote_tier_ttl_ms, b->remote_tier_ttl_ms);
	ck_assert_uint_eq(a->remote_tier_bandwidth, b->remote_tier_bandwidth);
	{
		const char *const sa[] = { a->events_endpoint, a->events_replay_endpoint,
					   a->events_topic, a->events_format, a->events_namespaces,
					   a->events_sched };
		const char *const sb[] = { b->events_endpoint, b->events_replay_endpoint,
					   b->events_topic, b->events_format, b->events_namespaces,
					   b->events_sched };

		for (size_t i = 0; i < 6; i++) {
			ck_assert_int_eq(!sa[i], !sb[i]);
			if (sa[i])
				ck_assert_str_eq(sa[i], sb[i]);
		}
	}
	ck_assert_uint_eq(a->events_batch_ms, b->events_batch_ms);
	ck_assert_uint_eq(a->events_buffer_batches, b->events_buffer_batches);
	ck_assert_uint_eq(a->events_queue, b->events_queue);
	ck_assert_uint_eq(a->events_hwm, b->events_hwm);
	ck_assert_uint_eq(a->events_remote_blocks, b->events_remote_blocks);
}

static void assert_config_equal(const struct kvpd_config *a, const struct kvpd_config *b)
{
	ck_assert_str_eq(a->socket_path, b->socket_path);
	ck_assert_str_eq(a->admin_socket_path, b->admin_socket_path);
	ck_assert_int_eq(a->has_admin_gid, b->has_admin_gid);
	ck_assert_uint_eq(a->admin_gid, b->admin_gid);
	ck_assert_uint_eq(a->max_sessions, b->max_sessions);
	ck_assert_uint_eq(a->ring_poll_us, b->ring_poll_us);
	ck_assert_uint_eq(a->max_frame_bytes, b->max_frame_bytes);
	ck_assert_uint_eq(a->limits.max_sequences, b->limits.max_sequences);
	ck_assert_uint_eq(a->limits.max_blocks, b->limits.max_blocks);
	ck_assert_uint_eq(a->limits.max_inflight, b->limits.max_inflight);
	ck_assert_uint_eq(a->limits.max_tokens_per_request, b->limits.max_tokens_per_request);
	ck_assert_uint_eq(a->limits.max_ring_entries, b->limits.max_ring_entries);
	ck_assert_uint_eq(a->limits.max_ring_data_bytes, b->limits.max_ring_data_bytes);
	ck_assert_uint_eq(a->limits.max_queued_bytes, b->limits.max_queued_bytes);
	ck_assert_uint_eq(a->limits.max_wait_ms, b->limits.max_wait_ms);
	ck_assert_uint_eq(a->max_sessions_per_uid, b->max_sessions_per_uid);
	ck_assert_uint_eq(a->max_admin_sessions, b->max_admin_sessions);
	ck_assert_uint_eq(a->log_rate_limit_interval_ms, b->log_rate_limit_interval_ms);
	ck_assert_uint_eq(a->log_rate_limit_burst, b->log_rate_limit_burst);
	ck_assert_uint_eq(a->limits.hello_timeout_ms, b->limits.hello_timeout_ms);
	ck_assert_uint_eq(a->limits.idle_timeout_ms, b->limits.idle_timeout_ms);
	ck_assert_int_eq(a->limits.idle_timeout_with_sequences, b->limits.idle_timeout_with_sequences);
	ck_assert_uint_eq(a->limits.max_session_bytes, b->limits.max_session_bytes);
	ck_assert_uint_eq(a->limits.max_bytes_per_uid, b->limits.max_bytes_per_uid);
	ck_assert_uint_eq(a->limits.max_bytes_per_namespace, b->limits.max_bytes_per_namespace);
	ck_assert_uint_eq(a->limits.max_total_bytes, b->limits.max_total_bytes);
	ck_assert_uint_eq(a->limits.max_sequences_per_uid, b->limits.max_sequences_per_uid);
	ck_assert_uint_eq(a->limits.max_blocks_per_uid, b->limits.max_blocks_per_uid);
	ck_assert_uint_eq(a->limits.max_sequences_per_namespace,
			  b->limits.max_sequences_per_namespace);
	ck_assert_uint_eq(a->limits.max_blocks_per_namespace, b->limits.max_blocks_per_namespace);
	ck_assert_uint_eq(a->limits.max_namespaces_per_uid, b->limits.max_namespaces_per_uid);
	ck_assert_uint_eq(a->npools, b->npools);
	for (size_t i = 0; i < a->npools; i++)
		assert_pool_equal(&a->pools[i], &b->pools[i]);
}

static char *print_to_string(const struct kvpd_config *c)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	ck_assert_ptr_nonnull(f);
	config_print(c, f);
	ck_assert_int_eq(fclose(f), 0);
	return text;
}

START_TEST(test_defaults)
{
	struct kvpd_config c;
	const struct kvpd_pool_config *p;

	load_ok(POOL_MAIN, &c);
	ck_assert_str_eq(c.socket_path, "/run/kvpaged/kvpaged.sock");
	ck_assert_str_eq(c.admin_socket_path, "/run/kvpaged/admin.sock");
	ck_assert(!c.has_admin_gid);
	ck_assert_uint_eq(c.max_sessions, 256);
	ck_assert_uint_eq(c.max_frame_bytes, 8 * 1024 * 1024);
	ck_assert_uint_eq(c.limits.max_sequences, 1024);
	ck_assert_uint_eq(c.limits.max_blocks, 0);
	ck_assert_uint_eq(c.limits.max_inflight, 256);
	ck_assert_uint_eq(c.limits.max_tokens_per_request, 1048576);
	ck_assert_uint_eq(c.limits.max_ring_entries, 4096);
	ck_assert_uint_eq(c.limits.max_ring_data_bytes, 16 * 1024 * 1024);
	ck_assert_uint_eq(c.limits.max_queued_bytes, 16 * 1024 * 1024);
	ck_assert_uint_eq(c.limits.max_wait_ms, 60000);
	ck_assert_uint_eq(c.max_sessions_per_uid, 64);
	ck_assert_uint_eq(c.max_admin_sessions, 16);
	ck_assert_uint_eq(c.log_rate_limit_interval_ms, 30000);
	ck_assert_uint_eq(c.log_rate_limit_burst, 200);
	ck_assert_uint_eq(c.limits.hello_timeout_ms, 3000);
	ck_assert_uint_eq(c.limits.idle_timeout_ms, 600000);
	ck_assert(!c.limits.idle_timeout_with_sequences);
	ck_assert_uint_eq(c.limits.max_session_bytes, 256u << 20);
	ck_assert_uint_eq(c.limits.max_bytes_per_uid, 1u << 30);
	ck_assert_uint_eq(c.limits.max_bytes_per_namespace, 0);
	ck_assert_uint_eq(c.limits.max_total_bytes, 4ull << 30);
	ck_assert_uint_eq(c.limits.max_sequences_per_uid, 1024);
	ck_assert_uint_eq(c.limits.max_blocks_per_uid, 0);
	ck_assert_uint_eq(c.limits.max_sequences_per_namespace, 0);
	ck_assert_uint_eq(c.limits.max_blocks_per_namespace, 0);
	ck_assert_uint_eq(c.limits.max_namespaces_per_uid, 64);
	ck_assert_uint_eq(c.npools, 1);
	p = &c.pools[0];
	ck_assert_str_eq(p->name, "main");
	ck_assert_uint_eq(p->layers, 32);
	ck_assert_uint_eq(p->kv_heads, 8);
	ck_assert_uint_eq(p->head_dim, 128);
	ck_assert_uint_eq(p->element_bytes, 2);
	ck_assert_uint_eq(p->block_tokens, 16);
	ck_assert_uint_eq(p->capacity_blocks, 4096);
	ck_assert_uint_eq(p->max_sequences, 4096);
	ck_assert_uint_eq(p->max_seq_tokens, 1048576);
	ck_assert_uint_eq(p->vocab_size, 0);
	ck_assert_int_eq(p->namespace_mode, KVPD_NS_UID);
	ck_assert_int_eq(p->policy, KVPD_POLICY_LRU);
	ck_assert_uint_eq(p->namespace_seed, 0);
	ck_assert_ptr_null(p->allow_uids);
	ck_assert_uint_eq(p->n_allow_uids, 0);
	ck_assert_ptr_null(p->allow_gids);
	ck_assert_uint_eq(p->n_allow_gids, 0);

	ck_assert_ptr_eq(config_find_pool(&c, NULL), p);
	ck_assert_ptr_eq(config_find_pool(&c, ""), p);
	ck_assert_ptr_eq(config_find_pool(&c, "main"), p);
	ck_assert_ptr_null(config_find_pool(&c, "mai"));
	config_free(&c);
	ck_assert_ptr_null(c.pools);
	ck_assert_uint_eq(c.npools, 0);
	ck_assert_ptr_null(config_find_pool(&c, NULL));
}
END_TEST

static const char full_config[] =
	"# every key, none at its default\n"
	"[daemon]\n"
	"socket = /tmp/kvpd-test/kvpaged.sock\n"
	"admin_socket = /tmp/kvpd-test/admin.sock ; inline comment\n"
	"admin_group = root\n"
	"max_sessions = 17\n"
	"max_sessions_per_uid = 5\n"
	"max_admin_sessions = 3\n"
	"log_rate_limit_interval_ms = 1000\n"
	"log_rate_limit_burst = 0\n"
	"ring_poll_us = 50\n"
	"max_frame_bytes = 100MB\n"
	"\n"
	"[limits]\n"
	"max_sequences = 77\n"
	"max_blocks = 2147483648\n"
	"max_inflight = 3\n"
	"max_tokens_per_request = 16777216\n"
	"max_ring_entries = 65536\n"
	"max_ring_data_bytes = 1G\n"
	"max_queued_bytes = 65537\n"
	"hello_timeout_ms = 250\n"
	"idle_timeout_ms = 0\n"
	"idle_timeout_with_sequences = yes\n"
	"max_session_bytes = 2GiB\n"
	"max_bytes_per_uid = 3GiB\n"
	"max_bytes_per_namespace = 2GiB\n"
	"max_total_bytes = 1TiB\n"
	"max_sequences_per_uid = 99\n"
	"max_blocks_per_uid = 5000\n"
	"max_sequences_per_namespace = 7\n"
	"max_blocks_per_namespace = 600\n"
	"max_namespaces_per_uid = 2\n"
	"\n"
	"[pool llama-3.1_70b]\n"
	"layers = 80\n"
	"kv_heads = 8\n"
	"head_dim = 128\n"
	"element_bytes = 2\n"
	"block_tokens = 16\n"
	"capacity_blocks = 1000\n"
	"max_sequences = 16777216\n"
	"max_seq_tokens = 2147483648\n"
	"vocab_size = 128256\n"
	"namespace = gid\n"
	"policy = cost\n"
	"namespace_seed = 18446744073709551615\n"
	"allow_users = root, 1000 1001,1002\n"
	"\t1003 1004 1005 1006 1007 1008 1009\n"
	"allow_groups = 0 5\n"
	"\n"
	"[pool draft]\n"
	"layers = 1\n"
	"kv_heads = 1\n"
	"head_dim = 1\n"
	"element_bytes = 1\n"
	"block_tokens = 1\n"
	"capacity_blocks = 1\n"
	"namespace = shared\n";

START_TEST(test_full_config_round_trips)
{
	static const uint32_t uids[] = { 0, 1000, 1001, 1002, 1003, 1004,
					 1005, 1006, 1007, 1008, 1009 };
	struct kvpd_config a, b;
	const struct kvpd_pool_config *p;
	char *text, *again;

	load_ok(full_config, &a);
	ck_assert_str_eq(a.socket_path, "/tmp/kvpd-test/kvpaged.sock");
	ck_assert_str_eq(a.admin_socket_path, "/tmp/kvpd-test/admin.sock");
	ck_assert(a.has_admin_gid);
	ck_assert_uint_eq(a.admin_gid, 0);
	ck_assert_uint_eq(a.max_sessions, 17);
	ck_assert_uint_eq(a.ring_poll_us, 50);
	ck_assert_uint_eq(a.max_frame_bytes, 100000000);
	ck_assert_uint_eq(a.limits.max_sequences, 77);
	ck_assert_uint_eq(a.limits.max_blocks, 2147483648u);
	ck_assert_uint_eq(a.limits.max_inflight, 3);
	ck_assert_uint_eq(a.limits.max_tokens_per_request, 16777216);
	ck_assert_uint_eq(a.limits.max_ring_entries, 65536);
	ck_assert_uint_eq(a.limits.max_ring_data_bytes, 1u << 30);
	ck_assert_uint_eq(a.limits.max_queued_bytes, 65537);
	ck_assert_uint_eq(a.max_sessions_per_uid, 5);
	ck_assert_uint_eq(a.max_admin_sessions, 3);
	ck_assert_uint_eq(a.log_rate_limit_interval_ms, 1000);
	ck_assert_uint_eq(a.log_rate_limit_burst, 0);
	ck_assert_uint_eq(a.limits.hello_timeout_ms, 250);
	ck_assert_uint_eq(a.limits.idle_timeout_ms, 0);
	ck_assert(a.limits.idle_timeout_with_sequences);
	ck_assert_uint_eq(a.limits.max_session_bytes, 2ull << 30);
	ck_assert_uint_eq(a.limits.max_bytes_per_uid, 3ull << 30);
	ck_assert_uint_eq(a.limits.max_bytes_per_namespace, 2ull << 30);
	ck_assert_uint_eq(a.limits.max_total_bytes, 1ull << 40);
	ck_assert_uint_eq(a.limits.max_sequences_per_uid, 99);
	ck_assert_uint_eq(a.limits.max_blocks_per_uid, 5000);
	ck_assert_uint_eq(a.limits.max_sequences_per_namespace, 7);
	ck_assert_uint_eq(a.limits.max_blocks_per_namespace, 600);
	ck_assert_uint_eq(a.limits.max_namespaces_per_uid, 2);
	ck_assert_uint_eq(a.npools, 2);

	p = config_find_pool(&a, "llama-3.1_70b");
	ck_assert_ptr_eq(p, &a.pools[0]);
	ck_assert_uint_eq(p->layers, 80);
	ck_assert_uint_eq(p->capacity_blocks, 1000);
	ck_assert_uint_eq(p->max_sequences, 16777216);
	ck_assert_uint_eq(p->max_seq_tokens, 2147483648u);
	ck_assert_uint_eq(p->vocab_size, 128256);
	ck_assert_int_eq(p->namespace_mode, KVPD_NS_GID);
	ck_assert_int_eq(p->policy, KVPD_POLICY_COST);
	ck_assert_uint_eq(p->namespace_seed, UINT64_MAX);
	ck_assert_uint_eq(p->n_allow_uids, sizeof(uids) / sizeof(uids[0]));
	ck_assert_mem_eq(p->allow_uids, uids, sizeof(uids));
	ck_assert_uint_eq(p->n_allow_gids, 2);
	ck_assert_uint_eq(p->allow_gids[0], 0);
	ck_assert_uint_eq(p->allow_gids[1], 5);

	p = config_find_pool(&a, "draft");
	ck_assert_ptr_eq(p, &a.pools[1]);
	ck_assert_ptr_eq(config_find_pool(&a, NULL), &a.pools[0]);
	ck_assert_int_eq(p->namespace_mode, KVPD_NS_SHARED);
	ck_assert_uint_eq(p->max_sequences, 4096);

	text = print_to_string(&a);
	ck_assert_ptr_nonnull(strstr(text, "\nmax_frame_bytes = 100MB\n"));
	ck_assert_ptr_nonnull(strstr(text, "\nmax_ring_data_bytes = 1GiB\n"));
	ck_assert_ptr_nonnull(strstr(text, "\nmax_queued_bytes = 65537\n"));
	ck_assert_ptr_nonnull(strstr(text, "\n[pool llama-3.1_70b]\n"));
	ck_assert_ptr_nonnull(strstr(text, "\nnamespace = gid\n"));
	ck_assert_ptr_nonnull(strstr(text, "\nadmin_group = 0\n"));
	ck_assert_ptr_nonnull(strstr(text, "\nallow_users = 0, 1000, 1001, 1002, 1003, 1004, 1005, "
					   "1006,\n\t1007, 1008, 1009\nallow_groups = 0, 5\n"));
	load_ok(text, &b);
	assert_config_equal(&a, &b);
	/* Printing is stable: the reloaded configuration prints the same text. */
	again = print_to_string(&b);
	ck_assert_str_eq(text, again);
	free(text);
	free(again);
	config_free(&a);
	config_free(&b);
}
END_TEST

START_TEST(test_defaults_round_trip)
{
	struct kvpd_config a, b;
	char *text;

	load_ok(POOL_MAIN, &a);
	text = print_to_string(&a);
	ck_assert_ptr_nonnull(strstr(text, "# admin_group is not set"));
	ck_assert_ptr_nonnull(strstr(text, "\nallow_users =\n"));
	ck_assert_ptr_nonnull(strstr(text, "\nmax_frame_bytes = 8MiB\n"));
	load_ok(text, &b);
	assert_config_equal(&a, &b);
	ck_assert(!b.has_admin_gid);
	free(text);
	config_free(&a);
	config_free(&b);
}
END_TEST

/* A list too long for one line is written on continuation lines, and reads back. */
START_TEST(test_long_list_round_trips)
{
	char text[4096] = POOL_MAIN "allow_groups =";
	struct kvpd_config a, b;
	char *printed;

	for (unsigned i = 0; i < 60; i++) {
		char id[16];

		snprintf(id, sizeof(id), "%s%u", i % 10 == 0 ? "\n\t" : " ", 4000000000u + i);
		strcat(text, id);
	}
	strcat(text, "\n");
	load_ok(text, &a);
	ck_assert_uint_eq(a.pools[0].n_allow_gids, 60);
	ck_assert_uint_eq(a.pools[0].allow_gids[59], 4000000059u);
	printed = print_to_string(&a);
	load_ok(printed, &b);
	assert_config_equal(&a, &b);
	free(printed);
	config_free(&a);
	config_free(&b);
}
END_TEST

START_TEST(test_size_parser)
{
	static const struct {
		const char *s;
		uint64_t v;
	} good[] = {
		{ "0", 0 },
		{ "4096", 4096 },
		{ "1KB", 1000 },
		{ "1kB", 1000 },
		{ "1KiB", 1024 },
		{ "1K", 1024 },
		{ "1k", 1024 },
		{ "800MB", 800000000 },
		{ "800MiB", 838860800 },
		{ "800M", 838860800 },
		{ "3GB", 3000000000 },
		{ "3GiB", UINT64_C(3221225472) },
		{ "2T", UINT64_C(2199023255552) },
		{ "2TB", UINT64_C(2000000000000) },
		{ "007", 7 },
		{ "18446744073709551615", UINT64_MAX },
		{ "16777215TiB", UINT64_C(16777215) << 40 },
	};
	static const char *const invalid[] = {
		"", "12XB", "-1", "+1", "1.5G", " 1", "1 ", "1 K", "K", "KiB", "1KIB", "1mb", "1Ki",
		"1B", "0x10", "1e6", "1GiBs", "1KK",
	};
	static const char *const too_big[] = {
		"99999999999999999999",
		"18446744073709551616",
		"16777216TiB",
		"18446744073709552KB",
	};

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		uint64_t v = 12345;

		ck_assert_msg(config_parse_size(good[i].s, &v) == 0, "'%s' rejected", good[i].s);
		ck_assert_msg(v == good[i].v, "'%s' gave %llu", good[i].s, (unsigned long long)v);
	}
	for (size_t i = 0; i < sizeof(invalid) / sizeof(invalid[0]); i++) {
		uint64_t v = 12345;

		ck_assert_msg(config_parse_size(invalid[i], &v) == -EINVAL, "'%s' not -EINVAL",
			      invalid[i]);
		ck_assert_uint_eq(v, 12345);
	}
	for (size_t i = 0; i < sizeof(too_big) / sizeof(too_big[0]); i++) {
		uint64_t v = 12345;

		ck_assert_msg(config_parse_size(too_big[i], &v) == -ERANGE, "'%s' not -ERANGE",
			      too_big[i]);
		ck_assert_uint_eq(v, 12345);
	}
	ck_assert_int_eq(config_parse_size(NULL, NULL), -EINVAL);
}
END_TEST

START_TEST(test_tiers)
{
	struct kvpd_config a, b;
	const struct kvpd_pool_config *p;
	char *text;

	load_ok(POOL_MAIN "host_tier_blocks = 100\nfile_tier_blocks = 1000\n"
			  "swap_files = /var/lib/kvpaged/a ,/var/lib/kvpaged/b\n"
			  "file_tier_persist = yes\nfile_tier_persist_stop_ms = 1500\n"
			  "file_tier_queue_depth = 64\n"
			  "model_params = 7G\nengine_flops = 1.5e14\n"
			  "host_tier_bandwidth = 25GB\nfile_tier_bandwidth = auto\n",
		&a);
	p = &a.pools[0];
	ck_assert_uint_eq(p->host_tier_blocks, 100);
	ck_assert_uint_eq(p->file_tier_blocks, 1000);
	ck_assert_uint_eq(p->n_swap_files, 2);
	ck_assert_str_eq(p->swap_files[0], "/var/lib/kvpaged/a");
	ck_assert_str_eq(p->swap_files[1], "/var/lib/kvpaged/b");
	ck_assert(p->file_tier_persist);
	ck_assert_uint_eq(p->file_tier_persist_stop_ms, 1500);
	ck_assert_uint_eq(p->file_tier_queue_depth, 64);
	ck_assert_double_eq(p->model_params, 7e9);
	ck_assert_double_eq(p->engine_flops, 1.5e14);
	ck_assert_uint_eq(p->host_tier_bandwidth, 25000000000u);
	ck_assert_uint_eq(p->file_tier_bandwidth, KVPD_MEASURE);
	text = print_to_string(&a);
	ck_assert_ptr_nonnull(strstr(text, "\nswap_files = /var/lib/kvpaged/a, /var/lib/kvpaged/b\n"));
	ck_assert_ptr_nonnull(strstr(text, "\nfile_tier_bandwidth = auto\n"));
	ck_assert_ptr_nonnull(strstr(text, "\nfile_tier_persist = yes\n"));
	ck_assert_ptr_nonnull(strstr(text, "\nfile_tier_persist_stop_ms = 1500\n"));
	load_ok(text, &b);
	assert_config_equal(&a, &b);
	free(text);
	config_free(&a);
	config_free(&b);

	/*
	 * Swap files may continue on indented lines, so 64 of them fit; a long list prints on
	 * continuation lines and loads back.
	 */
	{
		char conf[8192];
		size_t len = (size_t)snprintf(conf, sizeof(conf),
					      POOL_MAIN "file_tier_blocks = 64\nswap_files = ");

		for (int i = 0; i < 64; i++)
			len += (size_t)snprintf(conf + len, sizeof(conf) - len,
						"%s/var/lib/kvpaged/nvme%02d/kvpaged-main.swap",
						i == 0 ? "" : i % 3 ? ", " : ",\n\t", i);
		snprintf(conf + len, sizeof(conf) - len, "\n");
		load_ok(conf, &a);
		ck_assert_uint_eq(a.pools[0].n_swap_files, 64);
		ck_assert_str_eq(a.pools[0].swap_files[63], "/var/lib/kvpaged/nvme63/kvpaged-main.swap");
		text = print_to_string(&a);
		ck_assert_ptr_nonnull(strstr(text, ",\n\t/var/lib/kvpaged/nvme"));
		load_ok(text, &b);
		assert_config_equal(&a, &b);
		free(text);
		config_free(&a);
		config_free(&b);
	}

	/* Numbers print in full: a printed configuration loads back exactly. */
	load_ok(POOL_MAIN "model_params = 7241748480\nengine_flops = 1.2345678901e14\n", &a);
	text = print_to_string(&a);
	ck_assert_ptr_nonnull(strstr(text, "\nmodel_params = 7.24174848e+09\n"));
	ck_assert_ptr_nonnull(strstr(text, "\nengine_flops = 1.2345678901e+14\n"));
	load_ok(text, &b);
	assert_config_equal(&a, &b);
	free(text);
	config_free(&a);
	config_free(&b);

	expect_pool_error("file_tier_blocks = 10", "[pool main] file_tier_blocks: the file tier "
			  "needs swap_files");
	expect_pool_error("swap_files = /x", "swap_files: set file_tier_blocks to use them");
	expect_pool_error("file_tier_persist = on", "file_tier_persist: there is no file tier");
	expect_pool_error("file_tier_blocking_reads = yes",
			  "file_tier_blocking_reads: there is no file tier");
	/* Whether reads hold the loop: read at each open, so a reload changes it in place. */
	load_ok(POOL_MAIN "file_tier_blocks = 8\nswap_files = /s\n", &a);
	load_ok(POOL_MAIN "file_tier_blocks = 8\nswap_files = /s\nfile_tier_blocking_reads = yes\n",
		&b);
	ck_assert(!a.pools[0].file_tier_blocking_reads);
	ck_assert(b.pools[0].file_tier_blocking_reads);
	ck_assert_int_eq(config_apply_live(&a, &b, NULL, NULL), 1);
	ck_assert(a.pools[0].file_tier_blocking_reads);
	config_free(&a);
	config_free(&b);
	/* How long a stop may write to the files: a few seconds unless set; read at the stop. */
	load_ok(POOL_MAIN "file_tier_blocks = 8\nswap_files = /s\nfile_tier_persist = yes\n", &a);
	load_ok(POOL_MAIN "file_tier_blocks = 8\nswap_files = /s\nfile_tier_persist = yes\n"
			  "file_tier_persist_stop_ms = 0\n",
		&b);
	ck_assert_uint_eq(a.pools[0].file_tier_persist_stop_ms, 3000);
	ck_assert_uint_eq(b.pools[0].file_tier_persist_stop_ms, 0);
	ck_assert_int_eq(config_apply_live(&a, &b, NULL, NULL), 1);
	ck_assert_uint_eq(a.pools[0].file_tier_persist_stop_ms, 0);
	config_free(&a);
	config_free(&b);
	expect_pool_error("file_tier_persist_stop_ms = 600001",
			  "file_tier_persist_stop_ms: 600001 is out of range 0..600000");
	expect_pool_error("file_tier_persist_stop_ms = soon", "'soon' is not");
	expect_pool_error("file_tier_blocks = 1\nswap_files = x", "'x' is not an absolute path");
	expect_pool_error("file_tier_blocks = 1\nswap_files = /a, /a", "'/a' is named twice");
	expect_pool_error("file_tier_blocks = 1\nswap_files = /a,,/b", "an empty path");
	expect_pool_error("file_tier_persist = maybe", "'maybe' is not yes, no");
	expect_pool_error("model_params = 7X", "'7X' is not a number");
	expect_pool_error("engine_flops = -1", "'-1' is not a non-negative number");
	/* The bound is the value's, suffix applied (else it would not load back, printed). */
	expect_pool_error("engine_flops = 3e25T", "'3e25T' is more than 1e30");
	expect_pool_error("host_tier_bandwidth = fast", "'fast' is not a size");
	expect_pool_error("file_tier_queue_depth = 0", "0 is out of range 1..4096");
	expect_pool_error("window = 0", "[pool main] window: 0 is out of range 1..2147483648");

	/* A window pool; without the key, the printed file says it is not set. */
	load_ok(POOL_MAIN "window = 4096\n", &a);
	ck_assert_uint_eq(a.pools[0].window, 4096);
	text = print_to_string(&a);
	ck_assert_ptr_nonnull(strstr(text, "\nwindow = 4096\n"));
	free(text);
	config_free(&a);
	load_ok(POOL_MAIN, &a);
	text = print_to_string(&a);
	ck_assert_ptr_nonnull(strstr(text, "\n# window is not set\n"));
	load_ok(text, &b);
	ck_assert_uint_eq(b.pools[0].window, 0);
	free(text);
	config_free(&a);
	config_free(&b);
	expect_error(POOL_MAIN "file_tier_blocks = 1\nswap_files = /s\n"
		     "[pool b]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\nelement_bytes = 1\n"
		     "block_tokens = 1\ncapacity_blocks = 1\nfile_tier_blocks = 1\n"
		     "swap_files = /t, /s\n",
		     "kvpaged.conf:18: [pool b] swap_files: /s is pool main's swap file too");
}
END_TEST

START_TEST(test_exact_messages)
{
	char err[512];
	struct kvpd_config c = { 0 };

	ck_assert_int_eq(load("[daemon]\nmax_sessions = 8\nmax_sesions = 9\n" POOL_MAIN, &c, err,
			      sizeof(err)),
			 -EINVAL);
	ck_assert_str_eq(err, "kvpaged.conf:3: [daemon] max_sesions: unknown key");

	ck_assert_int_eq(load("[pool main]\nlayers = 32\nkv_heads = 8\nhead_dim = 128\n"
			      "element_bytes = 2\nblock_tokens = 16\n\n# none\n"
			      "capacity_blocks = 0\n",
			      &c, err, sizeof(err)),
			 -EINVAL);
	ck_assert_str_eq(err, "kvpaged.conf:9: [pool main] capacity_blocks: 0 is out of range "
			      "1..1073741824");

	ck_assert_int_eq(config_load_string("[daemon]\n" POOL_MAIN "\n[pool x]\nlayers = 1\n",
					    "/etc/kvpaged/kvpaged.conf", &c, err, sizeof(err)),
			 -EINVAL);
	ck_assert_str_eq(err, "/etc/kvpaged/kvpaged.conf:10: [pool x]: missing required key "
			      "kv_heads");

	ck_assert_int_eq(load("[daemon]\n", &c, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err,
			 "kvpaged.conf: no [pool NAME] section: at least one pool is required");
	ck_assert_ptr_null(c.pools);
}
END_TEST

START_TEST(test_unknown_sections_and_keys)
{
	expect_error("[bogus]\nx = 1\n" POOL_MAIN, "kvpaged.conf:1: [bogus]: unknown section");
	/* A section with no keys is still checked. */
	expect_error(POOL_MAIN "\n[bogus]\n", "kvpaged.conf:9: [bogus]: unknown section");
	expect_error(POOL_MAIN "[daemons]\nsocket = /a\n", "kvpaged.conf:8: [daemons]: unknown");
	expect_error(POOL_MAIN "[pools x]\n", "kvpaged.conf:8: [pools x]: unknown section");
	expect_error("socket = /a\n" POOL_MAIN,
		     "kvpaged.conf:1: socket: key before the first [section]");
	/* Keys belong to one section only. */
	expect_error("[limits]\nsocket = /a\n" POOL_MAIN,
		     "kvpaged.conf:2: [limits] socket: unknown key");
	expect_error("[daemon]\nlayers = 1\n" POOL_MAIN,
		     "kvpaged.conf:2: [daemon] layers: unknown key");
	expect_pool_error("max_sessions = 1",
			  "kvpaged.conf:8: [pool main] max_sessions: unknown key");
	expect_pool_error("Layers = 1", "kvpaged.conf:8: [pool main] Layers: unknown key");
	expect_pool_error("= 1", "kvpaged.conf:8: [pool main]: missing key name");
}
END_TEST

START_TEST(test_empty_sections_are_fine_unless_pools)
{
	struct kvpd_config c;

	/* A packaged file with every [daemon] key commented out must load. */
	load_ok("[daemon]\n# socket = /run/kvpaged/kvpaged.sock\n\n[limits]\n" POOL_MAIN, &c);
	ck_assert_uint_eq(c.max_sessions, 256);
	config_free(&c);
	expect_error(POOL_MAIN "[pool spare]\n; nothing yet\n",
		     "kvpaged.conf:8: [pool spare]: missing required key layers");
}
END_TEST

START_TEST(test_duplicates)
{
	expect_error(POOL_MAIN "\n" POOL_MAIN,
		     "kvpaged.conf:9: [pool main]: duplicate pool (first defined on line 1)");
	/* Back to back, libinih alone could not tell the two sections apart. */
	expect_error(POOL_MAIN "[pool main]\n",
		     "kvpaged.conf:8: [pool main]: duplicate pool (first defined on line 1)");
	expect_error("[daemon]\nmax_sessions = 1\n[daemon]\n" POOL_MAIN,
		     "kvpaged.conf:3: [daemon]: section appears twice (first on line 1)");
	expect_error("[limits]\n[limits]\n" POOL_MAIN,
		     "kvpaged.conf:2: [limits]: section appears twice (first on line 1)");
	expect_pool_error("layers = 32",
			  "kvpaged.conf:8: [pool main] layers: set twice (first on line 2)");
	expect_error("[daemon]\nsocket = /a\nsocket = /b\n" POOL_MAIN,
		     "kvpaged.conf:3: [daemon] socket: set twice (first on line 2)");
}
END_TEST

START_TEST(test_pool_names)
{
	char name63[64], text[512];
	struct kvpd_config c;

	expect_error("[pool ma/in]\nlayers = 1\n",
		     "kvpaged.conf:1: [pool ma/in]: bad pool name 'ma/in'");
	expect_error("[pool a b]\nlayers = 1\n", "kvpaged.conf:1: [pool a b]: bad pool name 'a b'");
	expect_error("[pool]\nlayers = 1\n", "kvpaged.conf:1: [pool]: missing pool name");
	expect_error("[pool é]\n", "bad pool name");

	/* 63 characters: longer than libinih keeps of a section name. */
	memset(name63, 'n', 63);
	name63[63] = '\0';
	snprintf(text, sizeof(text), "[pool %s]\n%s", name63, strchr(POOL_MAIN, '\n') + 1);
	load_ok(text, &c);
	ck_assert_str_eq(c.pools[0].name, name63);
	ck_assert_uint_eq(c.pools[0].capacity_blocks, 4096);
	config_free(&c);

	snprintf(text, sizeof(text), "[pool %sn]\n%s", name63, strchr(POOL_MAIN, '\n') + 1);
	expect_error(text, "bad pool name");

	/* Spaces around the name are not part of it. */
	load_ok("[ pool   main ]\nlayers = 32\nkv_heads = 8\nhead_dim = 128\nelement_bytes = 2\n"
		"block_tokens = 16\ncapacity_blocks = 4096\n",
		&c);
	ck_assert_str_eq(c.pools[0].name, "main");
	config_free(&c);
}
END_TEST

START_TEST(test_missing_required_keys)
{
	static const char *const required[] = {
		"layers", "kv_heads", "head_dim", "element_bytes", "block_tokens",
		"capacity_blocks",
	};

	for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
		char text[512] = "[daemon]\n[pool main]\n", want[128];
		const char *line = strchr(POOL_MAIN, '\n') + 1;

		/* POOL_MAIN without the line that sets required[i]. */
		while (*line) {
			size_t len = strcspn(line, "\n") + 1;

			if (strncmp(line, required[i], strlen(required[i])) != 0)
				strncat(text, line, len);
			line += len;
		}
		snprintf(want, sizeof(want), "kvpaged.conf:2: [pool main]: missing required key %s",
			 required[i]);
		expect_error(text, want);
	}
}
END_TEST

START_TEST(test_no_pools)
{
	expect_error("", "kvpaged.conf: no [pool NAME] section");
	expect_error("# nothing\n[daemon]\n[limits]\n", "kvpaged.conf: no [pool NAME] section");
}
END_TEST

START_TEST(test_out_of_range)
{
	static const struct {
		const char *text;
		const char *want;
	} cases[] = {
		{ "[daemon]\nmax_sessions = 0\n",
		  ":2: [daemon] max_sessions: 0 is out of range 1..65536" },
		{ "[daemon]\nmax_sessions = 65537\n", "65537 is out of range 1..65536" },
		{ "[daemon]\nmax_frame_bytes = 2K\n",
		  ":2: [daemon] max_frame_bytes: 2K is out of range 4KiB..256MiB" },
		{ "[daemon]\nmax_frame_bytes = 4095\n", "4095 is out of range 4KiB..256MiB" },
		{ "[daemon]\nmax_frame_bytes = 257M\n", "257M is out of range 4KiB..256MiB" },
		{ "[limits]\nmax_sequences = 1048577\n",
		  "[limits] max_sequences: 1048577 is out of range 1..1048576" },
		{ "[limits]\nmax_blocks = 2147483649\n",
		  "[limits] max_blocks: 2147483649 is out of range 0..2147483648" },
		{ "[limits]\nmax_inflight = 0\n",
		  "[limits] max_inflight: 0 is out of range 1..65536" },
		{ "[limits]\nmax_tokens_per_request = 16777217\n", "1..16777216" },
		{ "[limits]\nmax_ring_entries = 131072\n", "131072 is out of range 1..65536" },
		{ "[limits]\nmax_ring_data_bytes = 2G\n", "2G is out of range 4KiB..1GiB" },
		{ "[limits]\nmax_queued_bytes = 64000\n", "64000 is out of range 64KiB..1GiB" },
		{ "[limits]\nmax_queued_bytes = 99999999999999999999\n",
		  "99999999999999999999 is out of range 64KiB..1GiB" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char text[512];

		snprintf(text, sizeof(text), "%s" POOL_MAIN, cases[i].text);
		expect_error(text, cases[i].want);
	}
	expect_pool_error("max_sequences = 16777217",
			  ":8: [pool main] max_sequences: 16777217 is out of range 1..16777216");
	expect_pool_error("max_seq_tokens = 2147483649", "out of range 1..2147483648");
	expect_pool_error("max_seq_tokens = 0", "0 is out of range 1..2147483648");
	expect_pool_error("vocab_size = 4294967296", "4294967296 is out of range 0..4294967295");
	expect_pool_error("namespace_seed = 18446744073709551616",
			  "18446744073709551616 is out of range 0..18446744073709551615");
	expect_error("[pool main]\nlayers = 1025\n",
		     ":2: [pool main] layers: 1025 is out of range 1..1024");
	expect_error("[pool main]\nkv_heads = 0\n", "kv_heads: 0 is out of range 1..1024");
	expect_error("[pool main]\nhead_dim = 16385\n", "head_dim: 16385 is out of range 1..16384");
	expect_error("[pool main]\nelement_bytes = 9\n", "element_bytes: 9 is out of range 1..8");
	expect_error("[pool main]\nblock_tokens = 65537\n",
		     "block_tokens: 65537 is out of range 1..65536");
	expect_error("[pool main]\ncapacity_blocks = 1073741825\n", "1..1073741824");
}
END_TEST

START_TEST(test_range_edges_accepted)
{
	struct kvpd_config c;

	load_ok("[daemon]\nmax_sessions = 65536\nmax_frame_bytes = 256MiB\n"
		"[limits]\nmax_sequences = 1\nmax_blocks = 0\nmax_ring_entries = 1\n"
		"max_ring_data_bytes = 4K\nmax_queued_bytes = 1GiB\nmax_session_bytes = 1TiB\n"
		"max_bytes_per_uid = 1TiB\nmax_total_bytes = 16TiB\nhello_timeout_ms = 10\n"
		"idle_timeout_ms = 86400000\n" POOL_MAIN
		"vocab_size = 4294967295\nmax_seq_tokens = 1\n",
		&c);
	ck_assert_uint_eq(c.max_sessions, 65536);
	ck_assert_uint_eq(c.max_frame_bytes, 256u << 20);
	ck_assert_uint_eq(c.limits.max_ring_entries, 1);
	ck_assert_uint_eq(c.limits.max_ring_data_bytes, 4096);
	ck_assert_uint_eq(c.limits.max_queued_bytes, 1u << 30);
	ck_assert_uint_eq(c.pools[0].vocab_size, UINT32_MAX);
	ck_assert_uint_eq(c.pools[0].max_seq_tokens, 1);
	config_free(&c);
}
END_TEST

/* The memory caps nest, each naming the one it is below. */
START_TEST(test_memory_caps_nest)
{
	expect_error("[limits]\nmax_session_bytes = 16MiB\n" POOL_MAIN,
		     "kvpaged.conf:2: [limits] max_session_bytes: 16MiB is below 24MiB, "
		     "max_frame_bytes + max_ring_data_bytes (one session's largest frame and ring)");
	expect_error("[limits]\nmax_bytes_per_uid = 128MiB\n" POOL_MAIN,
		     "kvpaged.conf:2: [limits] max_bytes_per_uid: 128MiB is below 256MiB, "
		     "max_session_bytes");
	expect_error("[limits]\nmax_total_bytes = 512MiB\n" POOL_MAIN,
		     "kvpaged.conf:2: [limits] max_total_bytes: 512MiB is below 1GiB, "
		     "max_bytes_per_uid");
	expect_error("[limits]\nhello_timeout_ms = 5\n" POOL_MAIN,
		     "kvpaged.conf:2: [limits] hello_timeout_ms: 5 is out of range 10..600000");
}
END_TEST

START_TEST(test_bad_numbers)
{
	static const char *const bad[] = { "abc", "-1", "+5", "1.0", "0x10", "1 000", "", "12K" };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char line[64], want[128];

		snprintf(line, sizeof(line), "max_sequences = %s", bad[i]);
		snprintf(want, sizeof(want),
			 "kvpaged.conf:8: [pool main] max_sequences: '%s' is not a decimal number",
			 bad[i]);
		expect_pool_error(line, want);
	}
	expect_pool_error("namespace_seed = -0", "namespace_seed: '-0' is not a decimal number");
}
END_TEST

START_TEST(test_bad_sizes)
{
	static const char *const bad[] = { "12XB", "-1", "1.5G", "", "16 MiB", "16mib" };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char text[512], want[128];

		snprintf(text, sizeof(text), "\n[limits]\nmax_ring_data_bytes = %s\n" POOL_MAIN,
			 bad[i]);
		snprintf(want, sizeof(want),
			 "kvpaged.conf:3: [limits] max_ring_data_bytes: '%s' is not a size",
			 bad[i]);
		expect_error(text, want);
	}
	expect_error("[limits]\nmax_ring_data_bytes = 99999999999999999999\n" POOL_MAIN,
		     "kvpaged.conf:2: [limits] max_ring_data_bytes: 99999999999999999999 is out of "
		     "range 4KiB..1GiB");
}
END_TEST

START_TEST(test_ring_entries_power_of_two)
{
	struct kvpd_config c;

	expect_error("[limits]\nmax_ring_entries = 1000\n" POOL_MAIN,
		     "kvpaged.conf:2: [limits] max_ring_entries: 1000 is not a power of two");
	expect_error("[limits]\nmax_ring_entries = 65535\n" POOL_MAIN, "not a power of two");
	expect_error("[limits]\nmax_ring_entries = 0\n" POOL_MAIN, "0 is out of range 1..65536");
	load_ok("[limits]\nmax_ring_entries = 65536\n" POOL_MAIN, &c);
	ck_assert_uint_eq(c.limits.max_ring_entries, 65536);
	config_free(&c);
	load_ok("[limits]\nmax_ring_entries = 2\n" POOL_MAIN, &c);
	ck_assert_uint_eq(c.limits.max_ring_entries, 2);
	config_free(&c);
}
END_TEST

START_TEST(test_users_and_groups)
{
	struct kvpd_config c;
	const struct kvpd_pool_config *p;

	load_ok("[daemon]\nadmin_group = root\n" POOL_MAIN
		"allow_users = root, 0,1000\n"
		"allow_groups = root\n",
		&c);
	ck_assert(c.has_admin_gid);
	ck_assert_uint_eq(c.admin_gid, 0);
	p = &c.pools[0];
	/* root and 0 are the same user: listed once. */
	ck_assert_uint_eq(p->n_allow_uids, 2);
	ck_assert_uint_eq(p->allow_uids[0], 0);
	ck_assert_uint_eq(p->allow_uids[1], 1000);
	ck_assert_uint_eq(p->n_allow_gids, 1);
	ck_assert_uint_eq(p->allow_gids[0], 0);
	config_free(&c);

	load_ok("[daemon]\nadmin_group = 4242\n" POOL_MAIN "allow_users =\nallow_groups = 7\n", &c);
	ck_assert(c.has_admin_gid);
	ck_assert_uint_eq(c.admin_gid, 4242);
	ck_assert_uint_eq(c.pools[0].n_allow_uids, 0);
	ck_assert_uint_eq(c.pools[0].n_allow_gids, 1);
	ck_assert_uint_eq(c.pools[0].allow_gids[0], 7);
	config_free(&c);

	expect_pool_error("allow_users = root kvpd-no-such-user",
			  "kvpaged.conf:8: [pool main] allow_users: unknown user "
			  "'kvpd-no-such-user'");
	expect_pool_error("allow_groups = kvpd-no-such-group",
			  "kvpaged.conf:8: [pool main] allow_groups: unknown group "
			  "'kvpd-no-such-group'");
	expect_pool_error("allow_users = 4294967295",
			  "[pool main] allow_users: '4294967295' is not a valid user id");
	expect_pool_error("allow_users = 99999999999999999999", "is not a valid user id");
	expect_error("[daemon]\nadmin_group = kvpd-no-such-group\n" POOL_MAIN,
		     "kvpaged.conf:2: [daemon] admin_group: unknown group 'kvpd-no-such-group'");
	expect_error("[daemon]\nadmin_group =\n" POOL_MAIN,
		     "kvpaged.conf:2: [daemon] admin_group: empty value");
}
END_TEST

START_TEST(test_continuation_lines)
{
	struct kvpd_config c;

	load_ok(POOL_MAIN "allow_users = 1 2\n    3, 4\n\t5\nallow_groups = 9\n", &c);
	ck_assert_uint_eq(c.pools[0].n_allow_uids, 5);
	ck_assert_uint_eq(c.pools[0].allow_uids[4], 5);
	ck_assert_uint_eq(c.pools[0].n_allow_gids, 1);
	config_free(&c);

	/* An indented key after another key is a continuation of that key to libinih. */
	expect_error("[daemon]\nsocket = /a\n  admin_socket = /b\n" POOL_MAIN,
		     "kvpaged.conf:3: [daemon] socket: an indented line continues this value");
	expect_error("[daemon]\nsocket = /a\n  [limits]\n" POOL_MAIN,
		     "kvpaged.conf:3: [daemon] socket: an indented line continues");
	expect_pool_error("allow_users = 1\n  kvpd-no-such-user",
			  "kvpaged.conf:9: [pool main] allow_users: unknown user");
	/* An indented key right after a header is no continuation. */
	load_ok("[daemon]\n  max_sessions = 3\n" POOL_MAIN, &c);
	ck_assert_uint_eq(c.max_sessions, 3);
	config_free(&c);
}
END_TEST

START_TEST(test_namespace)
{
	static const struct {
		const char *value;
		enum kvpd_namespace_mode mode;
	} modes[] = {
		{ "uid", KVPD_NS_UID },
		{ "gid", KVPD_NS_GID },
		{ "shared", KVPD_NS_SHARED },
	};

	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		struct kvpd_config c;
		char text[512];

		snprintf(text, sizeof(text), POOL_MAIN "namespace = %s\n", modes[i].value);
		load_ok(text, &c);
		ck_assert_int_eq(c.pools[0].namespace_mode, modes[i].mode);
		config_free(&c);
	}
	expect_pool_error("namespace = user",
			  "kvpaged.conf:8: [pool main] namespace: 'user' is not one of uid, gid, "
			  "shared");
	expect_pool_error("namespace = UID", "'UID' is not one of");
	expect_pool_error("policy = fifo", "policy: 'fifo' is not one of lru, priority, cost");
	/* The eviction policy and its records (docs/policy.md). */
	struct kvpd_config c;

	load_ok(POOL_MAIN, &c);
	ck_assert_int_eq(c.pools[0].eviction, KVPD_EVICT_LRU);
	ck_assert_uint_eq(c.pools[0].value_records, 0);
	config_free(&c);
	load_ok(POOL_MAIN "eviction = value\nvalue_records = 4096\n", &c);
	ck_assert_int_eq(c.pools[0].eviction, KVPD_EVICT_VALUE);
	ck_assert_uint_eq(c.pools[0].value_records, 4096);
	config_free(&c);
	expect_pool_error("eviction = mru",
			  "kvpaged.conf:8: [pool main] eviction: 'mru' is not one of lru, value");
	expect_pool_error("value_records = 100",
			  "kvpaged.conf:8: [pool main] value_records: only the value policy keeps "
			  "records (set eviction = value)");
	expect_pool_error("eviction = value\nvalue_records = 10", "value_records");
}
END_TEST

/* Where the memory lives: backend, its module and the GPU; a host pool takes no device. */
START_TEST(test_backend_and_device)
{
	static const struct {
		const char *value;
		enum kvpd_backend backend;
	} backends[] = {
		{ "host", KVPD_BACKEND_HOST },
		{ "cuda", KVPD_BACKEND_CUDA },
		{ "auto", KVPD_BACKEND_AUTO },
	};
	struct kvpd_config a, b;
	char *text;

	load_ok(POOL_MAIN, &a);
	ck_assert_int_eq(a.pools[0].backend, KVPD_BACKEND_HOST);
	ck_assert_uint_eq(a.pools[0].device, 0);
	ck_assert_ptr_nonnull(strstr(a.pools[0].backend_module, "/kvpaged-cuda.so"));
	config_free(&a);
	for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++) {
		char conf[512];

		snprintf(conf, sizeof(conf), POOL_MAIN "backend = %s\n", backends[i].value);
		load_ok(conf, &a);
		ck_assert_int_eq(a.pools[0].backend, backends[i].backend);
		config_free(&a);
	}

	load_ok(POOL_MAIN "backend = cuda\ndevice = 3\nbackend_module = /opt/k/cuda.so\n", &a);
	ck_assert_uint_eq(a.pools[0].device, 3);
	ck_assert_str_eq(a.pools[0].backend_module, "/opt/k/cuda.so");
	text = print_to_string(&a);
	ck_assert_ptr_nonnull(strstr(text, "\nbackend = cuda\n"));
	ck_assert_ptr_nonnull(strstr(text, "\ndevice = 3\n"));
	load_ok(text, &b);
	ck_assert_uint_eq(b.pools[0].device, 3);
	free(text);
	config_free(&b);
	load_ok(POOL_MAIN "backend = auto\ndevice = 1023\n", &b);
	ck_assert_uint_eq(b.pools[0].device, 1023);
	/* The device is the pool's memory: a reload keeps the running one. */
	ck_assert_int_eq(config_apply_live(&a, &b, NULL, NULL), 0);
	ck_assert_uint_eq(a.pools[0].device, 3);
	config_free(&a);
	config_free(&b);

	/* 0 is the default: a host pool's printed configuration says it and loads back. */
	load_ok(POOL_MAIN "device = 0\n", &a);
	config_free(&a);
	expect_pool_error("device = 1",
			  "kvpaged.conf:8: [pool main] device: a host pool has no device "
			  "(backend = host); set backend = cuda or auto to put the pool on GPU 1");
	expect_pool_error("backend = host\ndevice = 2", "kvpaged.conf:9: [pool main] device: a "
			  "host pool has no device");
	expect_pool_error("backend = cuda\ndevice = 1024",
			  "kvpaged.conf:9: [pool main] device: 1024 is out of range 0..1023");
	expect_pool_error("backend = cuda\ndevice = -1", "device: '-1' is not");
	expect_pool_error("backend = gpu", "backend: 'gpu' is not one of host, cuda, auto");

	/* Keys that only a pool on a GPU (or one that may be) can use, refused elsewhere. */
	expect_pool_error("backend = cuda\ncopy_thread = yes",
			  "[pool main] copy_thread: a pool on a GPU (backend = cuda) copies on "
			  "the device");
	load_ok(POOL_MAIN "backend = auto\ncopy_thread = yes\n", &a);
	ck_assert(a.pools[0].copy_thread);
	config_free(&a);
	expect_pool_error("backend = cuda\nhost_tier_plain = yes",
			  "host_tier_plain: there is no host tier");
	expect_pool_error("host_tier_blocks = 4\nhost_tier_plain = yes",
			  "host_tier_plain: a host pool's tier is plain memory already");
	load_ok(POOL_MAIN "backend = cuda\nhost_tier_blocks = 4\nhost_tier_plain = yes\n", &a);
	ck_assert(a.pools[0].host_tier_plain);
	config_free(&a);
}
END_TEST

START_TEST(test_pool_memory_limit)
{
	struct kvpd_config c;

	/* 2 * 1 * 1 * 1 * 2 * 65536 * 2^30 = 2^48 bytes exactly. */
	load_ok("[pool edge]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\nelement_bytes = 2\n"
		"block_tokens = 65536\ncapacity_blocks = 1073741824\n",
		&c);
	ck_assert_uint_eq(c.pools[0].capacity_blocks, 1u << 30);
	config_free(&c);

	expect_error("[pool big]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\nelement_bytes = 4\n"
		     "block_tokens = 65536\ncapacity_blocks = 1073741824\n",
		     "kvpaged.conf:7: [pool big] capacity_blocks: the pool's memory, "
		     "562949953421312 bytes");
	expect_error("[pool big]\nlayers = 1\nkv_heads = 1\nhead_dim = 1\nelement_bytes = 4\n"
		     "block_tokens = 65536\ncapacity_blocks = 1073741824\n",
		     "is more than 2^48 bytes");
	/* 2^(1+10+10+14+3+16+30) = 2^84 bytes: the product itself overflows. */
	expect_error("[pool huge]\ncapacity_blocks = 1073741824\nlayers = 1024\nkv_heads = 1024\n"
		     "head_dim = 16384\nelement_bytes = 8\nblock_tokens = 65536\n",
		     "kvpaged.conf:2: [pool huge] capacity_blocks: the pool's memory, 2 * layers * "
		     "kv_heads * head_dim * element_bytes * block_tokens * capacity_blocks bytes, "
		     "overflows 64 bits");
}
END_TEST

START_TEST(test_paths)
{
	char text[512], longpath[120];

	expect_error("[daemon]\nsocket = run/kvpaged.sock\n" POOL_MAIN,
		     "kvpaged.conf:2: [daemon] socket: 'run/kvpaged.sock' is not an absolute path");
	expect_error("[daemon]\nadmin_socket =\n" POOL_MAIN,
		     "kvpaged.conf:2: [daemon] admin_socket: '' is not an absolute path");
	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[0] = '/';
	longpath[108] = '\0'; /* 108 bytes: one more than sun_path holds with its NUL */
	snprintf(text, sizeof(text), "[daemon]\nsocket = %s\n" POOL_MAIN, longpath);
	expect_error(text, "is longer than 107 bytes");
	longpath[107] = '\0';
	snprintf(text, sizeof(text), "[daemon]\nsocket = %s\n" POOL_MAIN, longpath);
	{
		struct kvpd_config c;

		load_ok(text, &c);
		ck_assert_str_eq(c.socket_path, longpath);
		config_free(&c);
	}
	expect_error("[daemon]\nadmin_socket = /run/kvpaged/kvpaged.sock\n" POOL_MAIN,
		     "kvpaged.conf:2: [daemon] admin_socket: socket and admin_socket must differ");
	expect_error("[daemon]\nsocket = /run/kvpaged/admin.sock\n" POOL_MAIN,
		     "kvpaged.conf:2: [daemon] socket: socket and admin_socket must differ");
}
END_TEST

START_TEST(test_syntax_errors_and_line_numbers)
{
	char text[1024];
	struct kvpd_config c;

	expect_error("[daemon]\nmax_sessions\n" POOL_MAIN,
		     "kvpaged.conf:2: expected '[section]' or 'key = value'");
	expect_error("[daemon\nmax_sessions = 3\n" POOL_MAIN, "kvpaged.conf:1: expected");
	/* The first error wins, whichever part found it. */
	expect_error("[daemon]\n\n; c\nnonsense\nmax_sesions = 1\n" POOL_MAIN,
		     "kvpaged.conf:4: expected");
	expect_error("[daemon]\nmax_sesions = 1\nnonsense\n" POOL_MAIN,
		     "kvpaged.conf:2: [daemon] max_sesions: unknown key");

	/* A line longer than libinih's buffer is refused, never cut into two. */
	snprintf(text, sizeof(text), "[daemon]\n# x\nsocket = /%0197d\n" POOL_MAIN, 0);
	expect_error(text, "kvpaged.conf:3: line is longer than 197 characters");
	snprintf(text, sizeof(text), "[daemon]\n#%0196d\nmax_sesions = 1\n" POOL_MAIN, 0);
	expect_error(text, "kvpaged.conf:3: [daemon] max_sesions: unknown key");

	/* CRLF line ends, comments and a byte order mark. */
	load_ok("\xEF\xBB\xBF[daemon]\r\n# comment\r\n; comment\r\nmax_sessions = 5 ; why\r\n"
		"[pool main]\r\nlayers = 32\r\nkv_heads = 8\r\nhead_dim = 128\r\n"
		"element_bytes = 2\r\nblock_tokens = 16\r\ncapacity_blocks = 4096\r\n",
		&c);
	ck_assert_uint_eq(c.max_sessions, 5);
	config_free(&c);
	expect_error("[daemon]\r\n\r\nmax_sesions = 1\r\n", "kvpaged.conf:3: [daemon] max_sesions");
	/* libinih takes ':' for '=' as well. */
	load_ok("[daemon]\nmax_sessions: 6\n" POOL_MAIN, &c);
	ck_assert_uint_eq(c.max_sessions, 6);
	config_free(&c);
}
END_TEST

START_TEST(test_error_buffer)
{
	struct kvpd_config c = { 0 };
	char err[8];

	memset(err, 'x', sizeof(err));
	ck_assert_int_eq(load("[bogus]\n", &c, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "kvpaged");
	ck_assert_int_eq(load("[bogus]\n", &c, NULL, 0), -EINVAL);
	ck_assert_int_eq(config_load_string(NULL, NAME, &c, NULL, 0), -EINVAL);
	ck_assert_int_eq(config_load_string("[bogus]\n", NULL, &c, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(c.pools);
}
END_TEST

static void write_file(const char *path, const char *data, size_t len)
{
	FILE *f = fopen(path, "we");

	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(data, 1, len, f), len);
	ck_assert_int_eq(fclose(f), 0);
}

START_TEST(test_load_file)
{
	char dir[] = "/tmp/test-config-XXXXXX", path[64], err[512], want[128];
	static const char with_nul[] = "[daemon]\nmax_sessions = 1\0\n" POOL_MAIN;
	struct kvpd_config c = { 0 }, before;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/kvpaged.conf", dir);

	write_file(path, full_config, strlen(full_config));
	ck_assert_int_eq(config_load_file(path, &c, err, sizeof(err)), 0);
	ck_assert_uint_eq(c.npools, 2);
	ck_assert_uint_eq(c.max_sessions, 17);
	config_free(&c);

	write_file(path, "[daemon]\nmax_sesions = 1\n", 25);
	ck_assert_int_eq(config_load_file(path, &c, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want), "%s:2: [daemon] max_sesions: unknown key", path);
	ck_assert_str_eq(err, want);

	/* A NUL byte would end the text early and hide what follows it. */
	write_file(path, with_nul, sizeof(with_nul) - 1);
	memset(&c, 0x5a, sizeof(c));
	memcpy(&before, &c, sizeof(c));
	ck_assert_int_eq(config_load_file(path, &c, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, ":2: the line contains a NUL byte"));
	ck_assert(memcmp(&c, &before, sizeof(c)) == 0);

	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(config_load_file(path, &c, err, sizeof(err)), -ENOENT);
	snprintf(want, sizeof(want), "%s: cannot read: ", path);
	ck_assert_ptr_nonnull(strstr(err, want));
	ck_assert_int_eq(config_load_file(dir, &c, err, sizeof(err)), -EISDIR);
	ck_assert(memcmp(&c, &before, sizeof(c)) == 0);
	ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* The HTTP metrics endpoint: off unless set; numeric addresses with a port, nothing else. */
START_TEST(test_metrics_listen)
{
	static const char *const good[] = { "127.0.0.1:9464", "0.0.0.0:1", "[::1]:9464",
					    "[::]:65535", "[fe80::1:2]:80" };
	static const char *const bad[] = {
		"127.0.0.1",	  "127.0.0.1:",	      "127.0.0.1:0",  "127.0.0.1:65536",
		"localhost:9464", "::1:9464",	      "[::1]",	      "[::1]9464",
		"[127.0.0.1]:80", "1.2.3.4:80x",      ":9464",	      "[]:80",
		"127.0.0.1:-1",	  "127.0.0.1:+80",    "1.2.3:80",
	};
	struct sockaddr_storage ss;
	struct kvpd_config c;
	socklen_t len;
	char text[512], *printed;

	load_ok(POOL_MAIN, &c);
	ck_assert_ptr_null(c.metrics_listen);
	ck_assert_uint_eq(c.metrics_max_connections, 8);
	ck_assert_uint_eq(c.metrics_max_request_bytes, 8192);
	ck_assert_uint_eq(c.metrics_timeout_ms, 10000);
	printed = print_to_string(&c);
	ck_assert_msg(strstr(printed, "# metrics_listen is not set: no HTTP endpoint\n"), "%s",
		      printed);
	free(printed);
	config_free(&c);
	load_ok("[daemon]\nmetrics_listen =\n" POOL_MAIN, &c);
	ck_assert_ptr_null(c.metrics_listen);
	config_free(&c);

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		struct kvpd_config again;

		snprintf(text, sizeof(text), "[daemon]\nmetrics_listen = %s\n" POOL_MAIN, good[i]);
		load_ok(text, &c);
		ck_assert_str_eq(c.metrics_listen, good[i]);
		ck_assert_int_eq(config_parse_listen(good[i], &ss, &len), 0);
		ck_assert_int_eq(ss.ss_family, good[i][0] == '[' ? AF_INET6 : AF_INET);
		ck_assert_uint_eq(len, good[i][0] == '[' ? sizeof(struct sockaddr_in6)
							 : sizeof(struct sockaddr_in));
		printed = print_to_string(&c);
		load_ok(printed, &again);
		ck_assert_str_eq(again.metrics_listen, good[i]);
		free(printed);
		config_free(&again);
		config_free(&c);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(text, sizeof(text), "[daemon]\nmetrics_listen = %s\n" POOL_MAIN, bad[i]);
		expect_error(text, ":2: [daemon] metrics_listen: '");
		expect_error(text, "is not an address to listen on");
		ss.ss_family = AF_UNIX;
		ck_assert_int_eq(config_parse_listen(bad[i], &ss, &len), -EINVAL);
		ck_assert_int_eq(ss.ss_family, AF_UNIX);
	}
	expect_error("[daemon]\nmetrics_max_connections = 0\n" POOL_MAIN,
		     "metrics_max_connections: 0 is out of range 1..1024");
	expect_error("[daemon]\nmetrics_max_request_bytes = 2K\n" POOL_MAIN,
		     "metrics_max_request_bytes: 2K is out of range 4KiB..1MiB");
	expect_error("[daemon]\nmetrics_timeout_ms = 99\n" POOL_MAIN,
		     "metrics_timeout_ms: 99 is out of range 100..600000");
}
END_TEST

START_TEST(test_free_accepts_zeroed)
{
	struct kvpd_config c = { 0 };

	config_free(NULL);
	config_free(&c);
	load_ok(POOL_MAIN, &c);
	config_free(&c);
	ck_assert_ptr_null(c.socket_path);
	config_free(&c); /* a second free sees a zeroed struct */
}
END_TEST

/*
 * An inline comment on a continuation line is a comment, as on the key's first line (found by
 * tests/fuzz/fuzz-config: "/b ; old disk" was a path, and --check-config's output then loaded
 * as "/b").  A ';' inside a word stays.
 */
START_TEST(test_continuation_inline_comments)
{
	struct kvpd_config a, b;
	char *text;

	load_ok(POOL_MAIN "file_tier_blocks = 8\n"
			  "swap_files = /var/lib/kvpaged/a, ; the first disk\n"
			  "\t/var/lib/kvpaged/b    ; the second disk\n"
			  "\t/var/lib/kvpaged/c;d\n"
			  "allow_users = 0 ; root\n"
			  "\t1000 ; alice\n"
			  "\t; nobody on this line\n",
		&a);
	ck_assert_uint_eq(a.pools[0].n_swap_files, 3);
	ck_assert_str_eq(a.pools[0].swap_files[0], "/var/lib/kvpaged/a");
	ck_assert_str_eq(a.pools[0].swap_files[1], "/var/lib/kvpaged/b");
	ck_assert_str_eq(a.pools[0].swap_files[2], "/var/lib/kvpaged/c;d");
	ck_assert_uint_eq(a.pools[0].n_allow_uids, 2);
	ck_assert_uint_eq(a.pools[0].allow_uids[0], 0);
	ck_assert_uint_eq(a.pools[0].allow_uids[1], 1000);
	/* What --check-config prints loads as the same configuration. */
	text = print_to_string(&a);
	load_ok(text, &b);
	assert_config_equal(&a, &b);
	free(text);
	config_free(&a);
	config_free(&b);
}
END_TEST

/* A config_apply_live report: counts refused differences. */
static void count_refused(void *ctx, bool applied, const char *what)
{
	(void)what;
	if (!applied)
		++*(int *)ctx;
}

/* Writes a key file of len bytes with mode at path. */
static void write_key(const char *path, size_t len, mode_t mode)
{
	char bytes[64];
	int fd;

	for (size_t i = 0; i < sizeof(bytes); i++)
		bytes[i] = (char)(i * 7 + 1);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, bytes, len), (ssize_t)len);
	ck_assert_int_eq(fchmod(fd, mode), 0);
	close(fd);
}

/* Loads POOL_MAIN plus extra (lines 8 on) and expects an error on line `line` containing want. */
static void expect_remote_error(const char *extra, unsigned line, const char *want)
{
	char text[2048], at[32];
	struct kvpd_config c;
	char err[512] = "";
	int r;

	snprintf(text, sizeof(text), POOL_MAIN "%s", extra);
	r = load(text, &c, err, sizeof(err));
	ck_assert_msg(r == -EINVAL, "expected -EINVAL, got %d (%s) for:\n%s", r, err, text);
	snprintf(at, sizeof(at), NAME ":%u: ", line);
	ck_assert_msg(!strncmp(err, at, strlen(at)), "error '%s' is not on line %u", err, line);
	ck_assert_msg(strstr(err, want), "error '%s' does not contain '%s'", err, want);
}

/* The event stream's keys: defaults, a full set printed back, each error on its line. */
START_TEST(test_events)
{
	struct kvpd_config a, b;
	const struct kvpd_pool_config *p;
	char *printed;

	load_ok(POOL_MAIN, &a);
	p = &a.pools[0];
	ck_assert_ptr_null(p->events_endpoint);
	ck_assert_ptr_null(p->events_replay_endpoint);
	ck_assert_str_eq(p->events_topic, "");
	ck_assert_str_eq(p->events_format, "map");
	ck_assert_str_eq(p->events_sched, "idle");
	ck_assert_ptr_null(p->events_namespaces);
	ck_assert_uint_eq(p->events_batch_ms, 10);
	ck_assert_uint_eq(p->events_buffer_batches, 10000);
	ck_assert_uint_eq(p->events_queue, 65536);
	ck_assert_uint_eq(p->events_hwm, 100000);
	ck_assert_uint_eq(p->events_remote_blocks, 65536);
	/* Printed defaults load back: events_* at their defaults need no stream. */
	printed = print_to_string(&a);
	load_ok(printed, &b);
	assert_config_equal(&a, &b);
	free(printed);
	config_free(&a);
	config_free(&b);

	load_ok(POOL_MAIN "events_endpoint = ipc:///run/kvpaged/ev\n"
			  "events_replay_endpoint = ipc:///run/kvpaged/ev-replay\n"
			  "events_topic = kv@node1@m\nevents_format = array\nevents_sched = normal\n"
			  "events_namespaces = shared, uid:1000/x\nevents_batch_ms = 50\n"
			  "events_buffer_batches = 0\nevents_queue = 16\nevents_hwm = 7\n"
			  "events_remote_blocks = 0\n",
		&a);
	p = &a.pools[0];
	ck_assert_str_eq(p->events_endpoint, "ipc:///run/kvpaged/ev");
	ck_assert_str_eq(p->events_replay_endpoint, "ipc:///run/kvpaged/ev-replay");
	ck_assert_str_eq(p->events_topic, "kv@node1@m");
	ck_assert_str_eq(p->events_format, "array");
	ck_assert_str_eq(p->events_sched, "normal");
	ck_assert_str_eq(p->events_namespaces, "shared, uid:1000/x");
	ck_assert_uint_eq(p->events_batch_ms, 50);
	ck_assert_uint_eq(p->events_buffer_batches, 0);
	ck_assert_uint_eq(p->events_queue, 16);
	ck_assert_uint_eq(p->events_hwm, 7);
	ck_assert_uint_eq(p->events_remote_blocks, 0);
	printed = print_to_string(&a);
	load_ok(printed, &b);
	assert_config_equal(&a, &b);
	free(printed);
	config_free(&a);
	config_free(&b);

	expect_pool_error("events_endpoint = tcp://0.0.0.0:5557",
			  "kvpaged.conf:8: [pool main] events_endpoint: a tcp:// endpoint shows "
			  "prompts' token ids to whoever connects: it needs CURVE keys");
	expect_pool_error("events_endpoint = tcp://0.0.0.0", "is not tcp://HOST:PORT");
	expect_pool_error("events_endpoint = ipc://relative", "is neither ipc:///ABSOLUTE/PATH nor");
	expect_pool_error("events_endpoint = /run/x", "is neither ipc:///ABSOLUTE/PATH nor");
	expect_pool_error("events_format = json", "'json' is not one of map, array");
	expect_pool_error("events_sched = low", "'low' is not one of idle, normal");
	expect_pool_error("events_namespaces = shared,,uid:1", "an empty name in the list");
	expect_pool_error("events_namespaces = tenant", "'tenant' is not a namespace");
	expect_pool_error("events_topic = kv@node1@m",
			  "kvpaged.conf:8: [pool main] events_topic: there is no event stream");
	expect_pool_error("events_queue = 8", "events_queue");
	expect_pool_error("events_remote_blocks = 16777217", "events_remote_blocks");
	expect_error(POOL_MAIN "events_endpoint = ipc:///run/e\n"
			       "events_replay_endpoint = ipc:///run/e\n",
		     "kvpaged.conf:9: [pool main] events_replay_endpoint: the same as "
		     "events_endpoint");
}
END_TEST

static void write_text(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	ck_assert_int_eq(fchmod(fd, mode), 0);
	close(fd);
}

/* CURVE for the event stream: tcp:// only with both key files, and files that load. */
START_TEST(test_events_curve)
{
	/* Two key pairs (public, secret) from zmq.curve_keypair(); # and [ are Z85. */
	static const char pub1[] = "[v=o$r@^0?.LD=B&ll-sha}#[wNAmZ2k2s$Gc9cA",
			  sec1[] = "hCwXni(d/Zm5*xD=twO}-g<!P2Mer[<x^vt?Jn2i",
			  pub2[] = "xUo&3y5K(s*Uw2j-G}S!I{GOSM!K+Mn{Jj-qm[Xf";
	char dir[] = "/tmp/kvpd-config-curve-XXXXXX", secret[64], raw[64], allowed[64],
	     open_secret[64], open_allowed[64], bad_secret[64], bad_allowed[64], empty[64],
	     text[2048], line[256];
	struct kvpd_config a, b;
	char *printed;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(secret, sizeof(secret), "%s/secret", dir);
	snprintf(raw, sizeof(raw), "%s/raw", dir);
	snprintf(allowed, sizeof(allowed), "%s/allowed", dir);
	snprintf(open_secret, sizeof(open_secret), "%s/open-secret", dir);
	snprintf(open_allowed, sizeof(open_allowed), "%s/open-allowed", dir);
	snprintf(bad_secret, sizeof(bad_secret), "%s/bad-secret", dir);
	snprintf(bad_allowed, sizeof(bad_allowed), "%s/bad-allowed", dir);
	snprintf(empty, sizeof(empty), "%s/empty", dir);
	snprintf(line, sizeof(line), "%s\n", sec1);
	write_text(secret, line, 0600);
	write_key(raw, 32, 0400);
	write_text(open_secret, line, 0644);
	write_text(bad_secret, "not a key at all, but forty chars long!!\n", 0600);
	snprintf(text, sizeof(text), "# the routers\n\n%s router-a\n  %s\n", pub1, pub2);
	write_text(allowed, text, 0644);
	write_text(open_allowed, text, 0666);
	snprintf(text, sizeof(text), "%s\n%s-too-long\n", pub1, pub2);
	write_text(bad_allowed, text, 0644);
	write_text(empty, "# nobody\n", 0644);

	/* Both files: tcp:// loads, on either socket, and prints back. */
	snprintf(text, sizeof(text), POOL_MAIN "events_endpoint = tcp://127.0.0.1:5557\n"
			   "events_replay_endpoint = tcp://127.0.0.1:5558\n"
			   "events_curve_secret_key_file = %s\nevents_curve_allowed_keys_file = %s\n",
		 secret, allowed);
	load_ok(text, &a);
	ck_assert_str_eq(a.pools[0].events_curve_secret_key_file, secret);
	ck_assert_str_eq(a.pools[0].events_curve_allowed_keys_file, allowed);
	printed = print_to_string(&a);
	load_ok(printed, &b);
	assert_config_equal(&a, &b);
	free(printed);
	config_free(&a);
	config_free(&b);
	/* 32 raw bytes are a secret key too; CURVE on ipc:// is allowed. */
	snprintf(text, sizeof(text), POOL_MAIN "events_endpoint = ipc:///run/kvpaged/ev\n"
			   "events_curve_secret_key_file = %s\nevents_curve_allowed_keys_file = %s\n",
		 raw, allowed);
	load_ok(text, &a);
	config_free(&a);

	/* The replay socket on tcp:// without keys. */
	expect_error(POOL_MAIN "events_endpoint = ipc:///run/e\n"
			       "events_replay_endpoint = tcp://127.0.0.1:5558\n",
		     "kvpaged.conf:9: [pool main] events_replay_endpoint: a tcp:// endpoint");
	/* One file without the other. */
	snprintf(text, sizeof(text), POOL_MAIN "events_endpoint = tcp://127.0.0.1:5557\n"
			   "events_curve_secret_key_file = %s\n", secret);
	expect_error(text, "kvpaged.conf:9: [pool main] events_curve_secret_key_file: CURVE needs "
			   "events_curve_allowed_keys_file too");
	/* Files that do not load: each named, with its line where it has one. */
	{
		const struct {
			const char *secret, *allowed, *want;
		} bad[] = {
			{ open_secret, allowed, "lets group or others at the key" },
			{ bad_secret, allowed, "not a CURVE secret key" },
			{ "/nonexistent/secret", allowed, "No such file or directory" },
			{ secret, open_allowed, "lets group or others add keys" },
			{ secret, bad_allowed, "bad-allowed:2: not a CURVE public key" },
			{ secret, empty, "no keys: no subscriber could get in" },
		};

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			snprintf(text, sizeof(text),
				 POOL_MAIN "events_endpoint = tcp://127.0.0.1:5557\n"
					   "events_curve_secret_key_file = %s\n"
					   "events_curve_allowed_keys_file = %s\n",
				 bad[i].secret, bad[i].allowed);
			expect_error_code(text, strstr(bad[i].want, "No such") ? -ENOENT
					  : strstr(bad[i].want, "lets") ? -EPERM : -EINVAL,
					  bad[i].want);
		}
	}
	/* Without a stream, the key files are a mistake too. */
	snprintf(text, sizeof(text), POOL_MAIN "events_curve_secret_key_file = %s\n", secret);
	expect_error(text, "events_curve_secret_key_file: there is no event stream");
	{
		const char *files[] = { secret, raw, allowed, open_secret, open_allowed,
					bad_secret, bad_allowed, empty };

		for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
			ck_assert_int_eq(unlink(files[i]), 0);
	}
	ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

START_TEST(test_remote_tier)
{
	char dir[] = "/tmp/kvpd-config-remote-XXXXXX", good[64], old[64], shrt[64], lng[64],
	     open_mode[64], missing[64], text[2048];
	struct kvpd_config a, b;
	const struct kvpd_pool_config *p;
	char *printed;
	int n = 0;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(good, sizeof(good), "%s/good.key", dir);
	snprintf(old, sizeof(old), "%s/old.key", dir);
	snprintf(shrt, sizeof(shrt), "%s/short.key", dir);
	snprintf(lng, sizeof(lng), "%s/long.key", dir);
	snprintf(open_mode, sizeof(open_mode), "%s/open.key", dir);
	snprintf(missing, sizeof(missing), "%s/missing.key", dir);
	write_key(good, 32, 0600);
	write_key(old, 32, 0400);
	write_key(shrt, 31, 0600);
	write_key(lng, 33, 0600);
	write_key(open_mode, 32, 0644);

	/* Defaults: no remote tier, and the keys' defaults as documented. */
	load_ok(POOL_MAIN, &a);
	p = &a.pools[0];
	ck_assert_ptr_null(p->remote_tier);
	ck_assert_ptr_null(p->remote_tier_key_file);
	ck_assert_uint_eq(p->n_remote_tier_old_key_files, 0);
	ck_assert_int_eq(p->remote_tier_write, KVPD_REMOTE_COMMIT);
	ck_assert_uint_eq(p->remote_tier_timeout_ms, 50);
	ck_assert_uint_eq(p->remote_tier_max_inflight, 64);
	ck_assert_uint_eq(p->remote_tier_ttl_ms, 0);
	ck_assert_uint_eq(p->remote_tier_bandwidth, 0);
	/* Printed defaults load back (remote_tier_* at their defaults need no tier). */
	printed = print_to_string(&a);
	ck_assert_ptr_nonnull(strstr(printed, "# remote_tier is not set: no remote tier\n"));
	load_ok(printed, &b);
	assert_config_equal(&a, &b);
	free(printed);
	config_free(&a);
	config_free(&b);

	/* Every key set. */
	snprintf(text, sizeof(text),
		 POOL_MAIN "remote_tier = redis://127.0.0.1:7000, 127.0.0.1:7001,[::1]:7002\n"
			   "remote_tier_key_file = %s\n"
			   "remote_tier_old_key_files = %s\n"
			   "remote_tier_write = evict\n"
			   "remote_tier_timeout_ms = 20\n"
			   "remote_tier_max_inflight = 128\n"
			   "remote_tier_ttl_ms = 3600000\n"
			   "remote_tier_bandwidth = auto\n",
		 good, old);
	load_ok(text, &a);
	p = &a.pools[0];
	ck_assert_str_eq(p->remote_tier, "redis://127.0.0.1:7000, 127.0.0.1:7001,[::1]:7002");
	ck_assert_str_eq(p->remote_tier_key_file, good);
	ck_assert_uint_eq(p->n_remote_tier_old_key_files, 1);
	ck_assert_str_eq(p->remote_tier_old_key_files[0], old);
	ck_assert_int_eq(p->remote_tier_write, KVPD_REMOTE_EVICT);
	ck_assert_uint_eq(p->remote_tier_timeout_ms, 20);
	ck_assert_uint_eq(p->remote_tier_max_inflight, 128);
	ck_assert_uint_eq(p->remote_tier_ttl_ms, 3600000);
	ck_assert_uint_eq(p->remote_tier_bandwidth, KVPD_MEASURE);
	printed = print_to_string(&a);
	ck_assert_ptr_nonnull(strstr(printed, "\nremote_tier_write = evict\n"));
	ck_assert_ptr_nonnull(strstr(printed, "\nremote_tier_bandwidth = auto\n"));
	load_ok(printed, &b);
	assert_config_equal(&a, &b);
	free(printed);

	/* A reload that changes the remote tier is refused (it needs a restart). */
	config_free(&b);
	snprintf(text, sizeof(text),
		 POOL_MAIN "remote_tier = redis://127.0.0.1:7100\n"
			   "remote_tier_key_file = %s\n"
			   "remote_tier_timeout_ms = 30\n",
		 good);
	load_ok(text, &b);
	ck_assert_int_eq(config_apply_live(&a, &b, count_refused, &n), 0);
	ck_assert_int_ge(n, 2); /* remote_tier and remote_tier_timeout_ms, at least */
	ck_assert_str_eq(a.pools[0].remote_tier,
			 "redis://127.0.0.1:7000, 127.0.0.1:7001,[::1]:7002");
	ck_assert_uint_eq(a.pools[0].remote_tier_timeout_ms, 20);
	config_free(&a);
	config_free(&b);

	/* Seeds: redis_parse_url's message, on the key's line. */
	expect_remote_error("remote_tier = http://127.0.0.1:7000\n", 8, "remote_tier: ");
	expect_remote_error("remote_tier = redis://127.0.0.1\n", 8, "remote_tier: ");
	expect_remote_error("remote_tier = redis://127.0.0.1:99999\n", 8, "remote_tier: ");
	expect_remote_error("remote_tier = redis://\n", 8, "remote_tier: ");
	/* The tier without a key file, and keys without the tier. */
	expect_remote_error("remote_tier = redis://127.0.0.1:7000\n", 8,
			    "[pool main] remote_tier: the remote tier needs remote_tier_key_file");
	snprintf(text, sizeof(text), "remote_tier_key_file = %s\n", good);
	expect_remote_error(text, 8, "[pool main] remote_tier_key_file: there is no remote tier");
	expect_remote_error("remote_tier_write = evict\n", 8,
			    "remote_tier_write: there is no remote tier");
	expect_remote_error("remote_tier_timeout_ms = 10\n", 8,
			    "remote_tier_timeout_ms: there is no remote tier");
	snprintf(text, sizeof(text), "remote_tier_old_key_files = %s\n", old);
	expect_remote_error(text, 8, "remote_tier_old_key_files: there is no remote tier");

	/* Key files: seal_key_load's messages, each naming the file, on the key's line. */
#define REMOTE(extra) "remote_tier = redis://127.0.0.1:7000\nremote_tier_key_file = %s\n" extra
	snprintf(text, sizeof(text), REMOTE(""), shrt);
	expect_remote_error(text, 9, shrt);
	expect_remote_error(text, 9, "shorter");
	snprintf(text, sizeof(text), REMOTE(""), lng);
	expect_remote_error(text, 9, "longer");
	snprintf(text, sizeof(text), REMOTE(""), open_mode);
	expect_remote_error(text, 9, open_mode);
	snprintf(text, sizeof(text), REMOTE(""), missing);
	expect_remote_error(text, 9, missing);
	snprintf(text, sizeof(text), REMOTE(""), "relative.key");
	expect_remote_error(text, 9, "not an absolute path");
	snprintf(text, sizeof(text), REMOTE("remote_tier_old_key_files = %s, %s\n"), good, old,
		 shrt);
	expect_remote_error(text, 10, shrt);
	snprintf(text, sizeof(text), REMOTE("remote_tier_old_key_files = %s\n"), good, good);
	expect_remote_error(text, 10, "is remote_tier_key_file too");
	/* A keyring holds 8 keys: the current one and 7 old ones at most (checked before any is read). */
	snprintf(text, sizeof(text),
		 REMOTE("remote_tier_old_key_files = /k1, /k2, /k3, /k4, /k5, /k6, /k7, /k8\n"), good);
	expect_remote_error(text, 10, "more than 8 keys in all");
	/* Enumerations and ranges. */
	snprintf(text, sizeof(text), REMOTE("remote_tier_write = always\n"), good);
	expect_remote_error(text, 10, "'always' is not one of commit, evict");
	snprintf(text, sizeof(text), REMOTE("remote_tier_timeout_ms = 0\n"), good);
	expect_remote_error(text, 10, "0 is out of range 1..60000");
	snprintf(text, sizeof(text), REMOTE("remote_tier_timeout_ms = 60001\n"), good);
	expect_remote_error(text, 10, "60001 is out of range 1..60000");
	snprintf(text, sizeof(text), REMOTE("remote_tier_max_inflight = 0\n"), good);
	expect_remote_error(text, 10, "0 is out of range 1..65536");
	snprintf(text, sizeof(text), REMOTE("remote_tier_max_inflight = 65537\n"), good);
	expect_remote_error(text, 10, "65537 is out of range 1..65536");
	snprintf(text, sizeof(text), REMOTE("remote_tier_ttl_ms = 31536000001\n"), good);
	expect_remote_error(text, 10, "out of range 0..31536000000");
	snprintf(text, sizeof(text), REMOTE("remote_tier_bandwidth = quick\n"), good);
	expect_remote_error(text, 10, "'quick' is not a size");
#undef REMOTE

	unlink(good);
	unlink(old);
	unlink(shrt);
	unlink(lng);
	unlink(open_mode);
	ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("config");

	tcase_add_test(tc, test_defaults);
	tcase_add_test(tc, test_full_config_round_trips);
	tcase_add_test(tc, test_defaults_round_trip);
	tcase_add_test(tc, test_long_list_round_trips);
	tcase_add_test(tc, test_size_parser);
	tcase_add_test(tc, test_exact_messages);
	tcase_add_test(tc, test_tiers);
	tcase_add_test(tc, test_remote_tier);
	tcase_add_test(tc, test_events);
	tcase_add_test(tc, test_events_curve);
	tcase_add_test(tc, test_unknown_sections_and_keys);
	tcase_add_test(tc, test_empty_sections_are_fine_unless_pools);
	tcase_add_test(tc, test_duplicates);
	tcase_add_test(tc, test_pool_names);
	tcase_add_test(tc, test_missing_required_keys);
	tcase_add_test(tc, test_no_pools);
	tcase_add_test(tc, test_out_of_range);
	tcase_add_test(tc, test_range_edges_accepted);
	tcase_add_test(tc, test_memory_caps_nest);
	tcase_add_test(tc, test_bad_numbers);
	tcase_add_test(tc, test_bad_sizes);
	tcase_add_test(tc, test_ring_entries_power_of_two);
	tcase_add_test(tc, test_users_and_groups);
	tcase_add_test(tc, test_continuation_lines);
	tcase_add_test(tc, test_continuation_inline_comments);
	tcase_add_test(tc, test_namespace);
	tcase_add_test(tc, test_backend_and_device);
	tcase_add_test(tc, test_pool_memory_limit);
	tcase_add_test(tc, test_paths);
	tcase_add_test(tc, test_syntax_errors_and_line_numbers);
	tcase_add_test(tc, test_error_buffer);
	tcase_add_test(tc, test_load_file);
	tcase_add_test(tc, test_free_accepts_zeroed);
	tcase_add_test(tc, test_metrics_listen);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

/* SPDX-License-Identifier: MIT */
/*
 * The admin socket's Prometheus text: label values escaped as the text format wants them
 * (tests/ops/metrics.test runs promtool on a live daemon's metrics), and the remote tier's
 * numbers, there and in the Pools and Stats replies, for a pool that has one and only for it:
 * a real tier thread against a seed nobody listens on, its one fetch a miss with its node down.
 */
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

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

static int probed_store(void *ctx, uint32_t from_tier, uint32_t from, uint32_t to_tier,
			uint32_t to, const struct core_key *key)
{
	(void)ctx, (void)from_tier, (void)from, (void)to_tier, (void)to, (void)key;
	return -ENOSPC;
}

static void probed_load(void *ctx, struct core_load *loads, uint32_t n)
{
	(void)ctx;
	for (uint32_t i = 0; i < n; i++)
		loads[i].result = -ENOENT;
}

static const struct core_tier_ops probed_ops = { .store = probed_store, .load = probed_load };

#define TOKENS 4

struct fixture {
	struct server srv;
	struct dpool pools[2];
	struct kvpd_pool_config cfg[2];
	struct fake_mem mem[2];
	char dir[32], key[64];
};

static struct core *fixture_core(struct fake_mem *mem, bool probed)
{
	struct core_config cfg = {
		.capacity_blocks = 8,
		.block_tokens = TOKENS,
		.max_sequences = 2,
		.max_seq_tokens = 32,
		.copy_block = fake_copy,
		.copy_ctx = mem,
	};
	struct core *c = NULL;

	fake_mem_init(mem, 8, TOKENS);
	if (probed) {
		cfg.ntiers = 1;
		cfg.tiers[0] = (struct core_tier_config){
			.slots = 2, .bandwidth = 1e9, .ops = &probed_ops, .flags = CORE_TIER_PROBED };
	}
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	return c;
}

/* Pool "plain" without a remote tier, pool "shared" with one whose only seed is down. */
static void fixture_up(struct fixture *f)
{
	struct remote_config rc = {
		.url = "redis://127.0.0.1:1",
		.geometry = { .layers = 1, .kv_heads = 1, .head_dim = 4, .elem_bytes = 2,
			      .block_tokens = TOKENS, .payload_bytes = 2 * 4 * 2 * TOKENS },
		.timeout_ms = 5000,
	};
	uint8_t k[SEAL_KEY_BYTES];
	char err[256];
	int fd;

	memset(f, 0, sizeof(*f));
	snprintf(f->dir, sizeof(f->dir), "/tmp/kvpaged-admin-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(f->dir));
	snprintf(f->key, sizeof(f->key), "%s/remote.key", f->dir);
	for (size_t i = 0; i < sizeof(k); i++)
		k[i] = (uint8_t)(i * 7 + 1);
	fd = open(f->key, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, k, sizeof(k)), (ssize_t)sizeof(k));
	close(fd);
	rc.key_file = f->key;

	snprintf(f->cfg[0].name, sizeof(f->cfg[0].name), "plain");
	snprintf(f->cfg[1].name, sizeof(f->cfg[1].name), "shared");
	for (int i = 0; i < 2; i++) {
		f->pools[i].srv = &f->srv;
		f->pools[i].cfg = &f->cfg[i];
		f->pools[i].core = fixture_core(&f->mem[i], i == 1);
	}
	f->pools[1].ntiers = 1;
	f->pools[1].tiers[0].name = "remote";
	f->pools[1].remote_level = 1;
	f->pools[1].remote_bandwidth = 1.5e9;
	f->pools[1].remote_unlocal = 3;
	ck_assert_msg(remote_new(&rc, err, sizeof(err), &f->pools[1].remote) == 0, "%s", err);
	f->srv.pools = f->pools;
	f->srv.npools = 2;
}

static void fixture_down(struct fixture *f)
{
	for (int i = 0; i < 2; i++) {
		f->pools[i].remote = remote_free(f->pools[i].remote, NULL, NULL);
		core_free(f->pools[i].core);
		free(f->mem[i].slots);
	}
	unlink(f->key);
	rmdir(f->dir);
}

static void reaped(struct remote_job *job, void *arg)
{
	*(struct remote_job **)arg = job;
}

/* One fetch of one block, answered (its node is down), reaped. */
static void fetch_one(struct remote *r)
{
	static const char ns[] = "shared";
	uint32_t tokens[TOKENS] = { 1, 2, 3, 4 };
	uint8_t data[2 * 4 * 2 * TOKENS];
	struct remote_block b = { .tokens = tokens, .data = data };
	struct remote_job job = { .kind = REMOTE_FETCH, .ns = ns, .ns_len = sizeof(ns) - 1,
				  .blocks = &b, .nblocks = 1 }, *got = NULL;
	struct pollfd pfd = { .fd = remote_fd(r), .events = POLLIN };

	b.hash[0] = 1;
	ck_assert_int_eq(remote_fetch(r, &job), 0);
	ck_assert_int_eq(poll(&pfd, 1, 10000), 1);
	ck_assert_uint_eq(remote_reap(r, reaped, &got), 1);
	ck_assert_ptr_eq(got, &job);
	ck_assert_int_eq(b.status, REMOTE_DOWN);
}

static bool has_line(const char *text, const char *line)
{
	size_t n = strlen(line);

	for (const char *p = text; (p = strstr(p, line)); p += n)
		if ((p == text || p[-1] == '\n') && p[n] == '\n')
			return true;
	return false;
}

START_TEST(test_remote_replies)
{
	struct fixture f;
	struct admin_remote *ar = calloc(1, sizeof(*ar));
	const Kvpaged__V1__RemoteTier *x = &ar->tier;
	uint64_t misses = 0;

	ck_assert_ptr_nonnull(ar);
	fixture_up(&f);
	/* No remote tier: nothing filled. */
	ar->tier.hits = 77;
	ck_assert(!admin_remote_fill(&f.pools[0], ar));
	ck_assert_uint_eq(ar->tier.hits, 77);
	/* Before any job: the seed, never needed yet. */
	ck_assert(admin_remote_fill(&f.pools[1], ar));
	ck_assert_uint_eq(x->n_nodes, 1);
	ck_assert_str_eq(x->nodes[0]->state, "idle");
	ck_assert_uint_eq(x->fetches, 0);
	fetch_one(f.pools[1].remote);
	ck_assert(admin_remote_fill(&f.pools[1], ar));
	ck_assert_uint_eq(x->n_nodes, 1);
	ck_assert_str_eq(x->nodes[0]->addr, "127.0.0.1:1");
	ck_assert_str_eq(x->nodes[0]->state, "down");
	ck_assert_double_eq(x->bandwidth, 1.5e9);
	ck_assert_uint_eq(x->local_sessions, 3);
	ck_assert_uint_eq(x->fetches, 1);
	ck_assert_uint_eq(x->hits, 0);
	ck_assert_uint_eq(x->inflight, 0);
	/* Every reason listed, OK and pending not among them. */
	ck_assert_uint_eq(x->n_misses, 7);
	for (size_t i = 0; i < x->n_misses; i++) {
		ck_assert_str_ne(x->misses[i]->reason, "ok");
		ck_assert_uint_eq(x->misses[i]->count, !strcmp(x->misses[i]->reason, "down"));
		misses += x->misses[i]->count;
	}
	ck_assert_uint_eq(misses, 1);
	ck_assert_uint_eq(x->n_verify_failures, SEAL_NREASONS - 1);
	ck_assert_str_eq(x->verify_failures[0]->reason, "truncated");
	ck_assert_str_eq(x->verify_failures[SEAL_NREASONS - 2]->reason, "tokens");
	/* It packs: the replies carry it as it is. */
	ck_assert_uint_gt(kvpaged__v1__remote_tier__get_packed_size(x), 0);
	fixture_down(&f);
	free(ar);
}
END_TEST

START_TEST(test_remote_metrics)
{
	struct fixture f;
	char *text;
	size_t len;

	fixture_up(&f);
	fetch_one(f.pools[1].remote);
	ck_assert_int_eq(admin_metrics_text(&f.srv, &text, &len), 0);
	ck_assert_uint_eq(strlen(text), len);
	ck_assert(has_line(text, "# TYPE kvpaged_remote_hits_total counter"));
	ck_assert(has_line(text, "kvpaged_remote_hits_total{pool=\"shared\"} 0"));
	ck_assert(has_line(text, "kvpaged_remote_fetches_total{pool=\"shared\"} 1"));
	ck_assert(has_line(text, "kvpaged_remote_misses_total{pool=\"shared\",reason=\"down\"} 1"));
	ck_assert(has_line(text, "kvpaged_remote_misses_total{pool=\"shared\",reason=\"absent\"} 0"));
	ck_assert(has_line(text, "kvpaged_remote_verify_failures_total{pool=\"shared\","
				 "reason=\"tag\"} 0"));
	ck_assert(has_line(text, "kvpaged_remote_node_state{pool=\"shared\",node=\"127.0.0.1:1\","
				 "state=\"down\"} 1"));
	ck_assert(has_line(text, "kvpaged_remote_node_state{pool=\"shared\",node=\"127.0.0.1:1\","
				 "state=\"up\"} 0"));
	ck_assert(has_line(text, "kvpaged_remote_stores_total{pool=\"shared\",result=\"dropped\"} 0"));
	ck_assert(has_line(text, "kvpaged_remote_inflight_blocks{pool=\"shared\"} 0"));
	ck_assert(has_line(text, "kvpaged_remote_bandwidth_bytes_per_second{pool=\"shared\"} "
				 "1500000000"));
	ck_assert(has_line(text, "kvpaged_remote_local_sessions_total{pool=\"shared\"} 3"));
	ck_assert(has_line(text, "kvpaged_remote_probes_total{pool=\"shared\"} 0"));
	ck_assert(strstr(text, "\nkvpaged_remote_fetch_latency_p99_seconds{pool=\"shared\"} "));
	ck_assert(strstr(text, "\nkvpaged_remote_fetch_latency_p50_seconds{pool=\"shared\"} "));
	ck_assert(has_line(text, "kvpaged_tier_blocks{pool=\"shared\",tier=\"remote\"} 0"));
	/* The pool without one has no remote sample at all. */
	for (const char *line = text; line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
		if (!strncmp(line, "kvpaged_remote_", 15))
			ck_assert_msg(strncmp(strchr(line, '{') + 1, "pool=\"plain\"", 13),
				      "a remote sample for pool plain: %.80s", line);
	free(text);

	/* Without any remote tier: not even the families' HELP lines. */
	f.pools[1].remote = remote_free(f.pools[1].remote, NULL, NULL);
	ck_assert_int_eq(admin_metrics_text(&f.srv, &text, &len), 0);
	ck_assert_ptr_null(strstr(text, "kvpaged_remote_"));
	free(text);
	fixture_down(&f);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("admin");
	TCase *tc = tcase_create("admin");

	tcase_add_test(tc, test_label_escapes);
	tcase_add_test(tc, test_label_cut_short);
	tcase_add_test(tc, test_remote_replies);
	tcase_add_test(tc, test_remote_metrics);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

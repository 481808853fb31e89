/* SPDX-License-Identifier: MIT */
/*
 * Two daemons ("nodes": separate runtime dirs and pools) sharing a remote tier on a real Redis
 * Cluster of three masters with a replica each, started here.  A prompt committed through node
 * A opens on node B with its full blocks cached and bytewise identical K/V; a value altered in
 * Redis (magic, version, key id, geometry, tokens, payload, tag), a value copied under another
 * block's key, and a node with another cluster key: misses, never wrong data, and the same
 * block hits again once the value is put back.  Tenants: uid namespaces stay on their node,
 * other pool names and other narrowing strings never hit each other, the same named
 * namespace does.  Skipped (77) only when redis-server or redis-cli is not installed.
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/harness.h"
#include "tests/redis-fixture.h"

#define BT 16 /* block_tokens */

static struct redis_fixture fx;
static char key_a[160], key_b[160];
static char seeds[256];

static void cluster_up(void)
{
	size_t len = 0;

	redis_fixture_cluster(&fx, 3);
	snprintf(key_a, sizeof(key_a), "%s/a.key", fx.dir);
	snprintf(key_b, sizeof(key_b), "%s/b.key", fx.dir);
	write_remote_key(key_a, 1);
	write_remote_key(key_b, 2);
	len = (size_t)snprintf(seeds, sizeof(seeds), "redis://");
	for (unsigned i = 0; i < 3; i++)
		len += (size_t)snprintf(seeds + len, sizeof(seeds) - len, "%s127.0.0.1:%u",
					i ? "," : "", fx.s[i].port);
}

static void cluster_down(void)
{
	unlink(key_a);
	unlink(key_b);
	redis_fixture_stop(&fx);
}

/* Whether the server on port is a master now (failover moves the role). */
static bool is_master(uint16_t port)
{
	redisReply *r = redis_direct(port, "ROLE");
	bool m = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
		 r->element[0]->type == REDIS_REPLY_STRING && !strcmp(r->element[0]->str, "master");

	if (r)
		freeReplyObject(r);
	return m;
}

/* Keys held by the cluster's masters. */
static long long cluster_keys(void)
{
	long long n = 0;

	for (unsigned i = 0; i < fx.n; i++) {
		redisReply *r;

		if (!fx.s[i].pid || !is_master(fx.s[i].port))
			continue;
		r = redis_direct(fx.s[i].port, "DBSIZE");
		ck_assert_ptr_nonnull(r);
		n += r->integer;
		freeReplyObject(r);
	}
	return n;
}

static void cluster_flush(void)
{
	for (unsigned i = 0; i < fx.n; i++)
		if (fx.s[i].pid && is_master(fx.s[i].port)) {
			redisReply *r = redis_direct(fx.s[i].port, "FLUSHALL");

			ck_assert_ptr_nonnull(r);
			freeReplyObject(r);
		}
}

/* Waits until the masters hold n keys (stores are asynchronous). */
static void wait_keys(long long n)
{
	for (int i = 0; i < 500 && cluster_keys() < n; i++)
		msleep(10);
	ck_assert_int_eq(cluster_keys(), n);
}

/* The master holding the cluster's only key (name in out), or -1. */
static int only_key(char *out, size_t len)
{
	for (unsigned i = 0; i < fx.n; i++) {
		redisReply *r;
		int found = -1;

		if (!fx.s[i].pid || !is_master(fx.s[i].port))
			continue;
		r = redis_direct(fx.s[i].port, "KEYS kvp:*");
		ck_assert_ptr_nonnull(r);
		if (r->elements == 1) {
			snprintf(out, len, "%s", r->element[0]->str);
			found = (int)i;
		}
		freeReplyObject(r);
		if (found >= 0)
			return found;
	}
	return -1;
}

struct node {
	struct daemon d;
	struct kvp_client *c;
};

static char conf[1024];

/*
 * A node: a pool "pool" of 2 KiB blocks of 16 tokens on the shared remote tier; extra: more
 * keys (capacity_blocks = 64 unless it sets it).
 */
static void node_up_with(struct node *n, const char *pool, const char *ns_mode, const char *key,
			 const char *narrow, const char *extra)
{
	struct kvp_connect_options o = { .size = sizeof(o), .ns = narrow, .client_name = "test" };
	char err[256] = "";
	int r;

	snprintf(conf, sizeof(conf),
		 "[pool %s]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\nelement_bytes = 4\n"
		 "block_tokens = %u\n%snamespace = %s\nremote_tier = %s\n"
		 "remote_tier_key_file = %s\nremote_tier_timeout_ms = 2000\n%s",
		 pool, BT, strstr(extra, "capacity_blocks") ? "" : "capacity_blocks = 64\n",
		 ns_mode, seeds, key, extra);
	daemon_start(&n->d, conf);
	o.socket_path = n->d.sock;
	o.error_buf = err;
	o.error_len = sizeof(err);
	r = kvp_connect(&o, &n->c);
	ck_assert_msg(r == 0, "kvp_connect: %d %s", r, err);
}

static void node_up(struct node *n, const char *pool, const char *ns_mode, const char *key,
		    const char *narrow)
{
	node_up_with(n, pool, ns_mode, key, narrow, "");
}

static void node_down(struct node *n)
{
	n->c = kvp_disconnect(n->c);
	assert_verified(&n->d);
	daemon_stop(&n->d);
	daemon_remove_files(&n->d);
}

static uint8_t pattern(uint8_t tag, uint64_t i)
{
	return (uint8_t)(tag * 29 + i * 13 + (i >> 7));
}

static void write_block(struct kvp_client *c, uint32_t block, uint8_t tag)
{
	const struct kvp_pool_info *p = kvp_pool(c);
	uint8_t *b = (uint8_t *)kvp_pool_base(c) + (uint64_t)block * p->block_stride;

	for (uint64_t i = 0; i < p->block_bytes; i++)
		b[i] = pattern(tag, i);
}

static bool block_is(struct kvp_client *c, uint32_t block, uint8_t tag)
{
	const struct kvp_pool_info *p = kvp_pool(c);
	const uint8_t *b = (uint8_t *)kvp_pool_base(c) + (uint64_t)block * p->block_stride;

	for (uint64_t i = 0; i < p->block_bytes; i++)
		if (b[i] != pattern(tag, i))
			return false;
	return true;
}

/* Opens n tokens, writes block i's pattern (tag + i) where not cached, commits, closes. */
static uint32_t commit_prompt(struct kvp_client *c, const uint32_t *t, uint32_t n, uint8_t tag)
{
	struct kvp_table tab = { 0 };
	uint32_t cached = 0;
	uint64_t s;

	ck_assert_int_eq(kvp_open(c, t, n, 0, 0, &s, &cached, &tab), 0);
	for (uint32_t i = cached / BT; i < tab.len; i++)
		write_block(c, tab.blocks[i], (uint8_t)(tag + i));
	ck_assert_int_eq(kvp_commit(c, s, n, &tab), 0);
	ck_assert_int_eq(kvp_close(c, s), 0);
	kvp_table_free(&tab);
	return cached;
}

/*
 * Opens n tokens and says how many came cached; checks that every cached block holds the
 * pattern (tag + i): a hit is never wrong data.  Closes it again.
 */
static uint32_t open_cached(struct kvp_client *c, const uint32_t *t, uint32_t n, uint8_t tag)
{
	struct kvp_table tab = { 0 };
	uint32_t cached = 0;
	uint64_t s;

	ck_assert_int_eq(kvp_open(c, t, n, 0, 0, &s, &cached, &tab), 0);
	for (uint32_t i = 0; i < cached / BT; i++)
		ck_assert_msg(block_is(c, tab.blocks[i], (uint8_t)(tag + i)),
			      "cached block %u does not hold what node A committed", i);
	ck_assert_int_eq(kvp_close(c, s), 0);
	kvp_table_free(&tab);
	return cached;
}

static void drop_cache(const struct node *n)
{
	char out[4096];

	ck_assert_int_eq(ctl(&n->d, "drop-cache", out, sizeof(out)), 0);
}

START_TEST(cross_node)
{
	struct node a, b;
	uint32_t t[5 * BT + 3];

	cluster_flush();
	node_up(&a, "main", "shared", key_a, NULL);
	node_up(&b, "main", "shared", key_a, NULL);
	/* threaded.test runs this as on a device: the pools' values go through their staging. */
	if (getenv("KVPAGED_TEST_DEVICE_POOL") && !strcmp(getenv("KVPAGED_TEST_DEVICE_POOL"), "1"))
		ck_assert(daemon_log_has(&a.d, "the remote tier goes through a pinned staging"));
	prompt(t, 5 * BT + 3, 1000);
	ck_assert_uint_eq(commit_prompt(a.c, t, 5 * BT + 3, 0x40), 0);
	wait_keys(5);
	/* Node B never saw the prompt: its five full blocks come from the remote tier. */
	ck_assert_uint_eq(open_cached(b.c, t, 5 * BT + 3, 0x40), 5 * BT);
	/* Now in B's pool: a local hit, nothing more asked of Redis. */
	ck_assert_uint_eq(open_cached(b.c, t, 5 * BT + 3, 0x40), 5 * BT);
	/* A longer prompt on B: the local chain, then the remote tier, then new blocks. */
	drop_cache(&b);
	ck_assert_uint_eq(open_cached(b.c, t, 3 * BT, 0x40), 3 * BT);
	ck_assert_uint_eq(open_cached(b.c, t, 5 * BT + 3, 0x40), 5 * BT);
	node_down(&a);
	node_down(&b);
}
END_TEST

/* Puts bytes [off, off + 1) of the only value back to what they were, or flips them. */
static void flip_at(int master, const char *key, long long off)
{
	redisReply *r = redis_direct(fx.s[master].port, "GETRANGE %s %lld %lld", key, off, off);
	char c;

	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(r->len, 1);
	c = (char)(r->str[0] ^ 0x5a);
	freeReplyObject(r);
	{
		struct timeval tv = { .tv_sec = 5 };
		redisContext *ctx = redisConnectWithTimeout("127.0.0.1", fx.s[master].port, tv);
		char offs[32];
		const char *argv[] = { "SETRANGE", key, offs, &c };
		size_t lens[] = { 8, strlen(key), 0, 1 };

		ck_assert(ctx && !ctx->err);
		lens[2] = (size_t)snprintf(offs, sizeof(offs), "%lld", off);
		r = redisCommandArgv(ctx, 4, argv, lens);
		ck_assert_ptr_nonnull(r);
		ck_assert_int_eq(r->type, REDIS_REPLY_INTEGER);
		freeReplyObject(r);
		redisFree(ctx);
	}
}

/* SET key to len raw bytes on the server on port. */
static void set_raw(uint16_t port, const char *key, const void *data, size_t len)
{
	struct timeval tv = { .tv_sec = 5 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
	const char *argv[] = { "SET", key, data };
	const size_t lens[] = { 3, strlen(key), len };
	redisReply *r;

	ck_assert_msg(c && !c->err, "cannot connect to 127.0.0.1:%u", port);
	r = redisCommandArgv(c, 3, argv, lens);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(r->type, REDIS_REPLY_STATUS);
	freeReplyObject(r);
	redisFree(c);
}

static long long value_len(int master, const char *key)
{
	redisReply *r = redis_direct(fx.s[master].port, "STRLEN %s", key);
	long long n;

	ck_assert_ptr_nonnull(r);
	n = r->integer;
	freeReplyObject(r);
	return n;
}

START_TEST(tampered)
{
	struct node a, b;
	uint32_t t[BT + 1];
	char key[128];
	int m;
	long long len;

	cluster_flush();
	node_up(&a, "main", "shared", key_a, NULL);
	node_up(&b, "main", "shared", key_a, NULL);
	prompt(t, BT + 1, 5000);
	commit_prompt(a.c, t, BT + 1, 0x11);
	wait_keys(1);
	m = only_key(key, sizeof(key));
	ck_assert_int_ge(m, 0);
	len = value_len(m, key);
	/*
	 * Magic, version, key id, nonce, geometry (the clear header), the chain hash, the
	 * namespace and a token id (encrypted), the payload's first and last bytes, the tag.
	 */
	const long long offs[] = { 0, 4, 8, 12, 24, 56, 56 + 32, 56 + 32 + 8 + 3, 56 + 32 + 8 + 4 * BT,
				   len - 17, len - 1 };

	for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
		flip_at(m, key, offs[i]);
		drop_cache(&b);
		ck_assert_msg(open_cached(b.c, t, BT + 1, 0x11) == 0,
			      "a value altered at byte %lld hit", offs[i]);
		/* Put back: the same block hits, so the alteration was why it missed. */
		flip_at(m, key, offs[i]);
		drop_cache(&b);
		ck_assert_uint_eq(open_cached(b.c, t, BT + 1, 0x11), BT);
	}
	node_down(&a);
	node_down(&b);
}
END_TEST

/* A value stored under another block's key fails its tag (the key is in the AAD). */
START_TEST(copied)
{
	struct node a, b;
	uint32_t t1[BT + 1], t2[BT + 1];
	char k1[128], k2[128];
	int m1, m2;

	cluster_flush();
	node_up(&a, "main", "shared", key_a, NULL);
	node_up(&b, "main", "shared", key_a, NULL);
	prompt(t1, BT + 1, 7000);
	prompt(t2, BT + 1, 9000);
	commit_prompt(a.c, t1, BT + 1, 0x21);
	wait_keys(1);
	m1 = only_key(k1, sizeof(k1));
	ck_assert_int_ge(m1, 0);
	/* The second block's key: the one that is new once it is stored. */
	commit_prompt(a.c, t2, BT + 1, 0x61);
	wait_keys(2);
	m2 = -1;
	for (unsigned i = 0; i < fx.n && m2 < 0; i++) {
		redisReply *keys;

		if (!is_master(fx.s[i].port))
			continue;
		keys = redis_direct(fx.s[i].port, "KEYS kvp:*");
		for (size_t j = 0; j < keys->elements; j++)
			if (strcmp(keys->element[j]->str, k1)) {
				snprintf(k2, sizeof(k2), "%s", keys->element[j]->str);
				m2 = (int)i;
			}
		freeReplyObject(keys);
	}
	ck_assert_int_ge(m2, 0);
	{
		redisReply *g = redis_direct(fx.s[m1].port, "GET %s", k1);

		ck_assert_ptr_nonnull(g);
		set_raw(fx.s[m2].port, k2, g->str, (size_t)g->len);
		freeReplyObject(g);
	}
	/* t2's key now holds t1's value: a miss on B, never t1's K/V under t2's tokens. */
	ck_assert_uint_eq(open_cached(b.c, t2, BT + 1, 0x61), 0);
	ck_assert_uint_eq(open_cached(b.c, t1, BT + 1, 0x21), BT);
	node_down(&a);
	node_down(&b);
}
END_TEST

/* Another cluster key: other Redis keys, other salts: nothing shared, nothing wrong. */
START_TEST(wrong_key)
{
	struct node a, b;
	uint32_t t[2 * BT + 1];

	cluster_flush();
	node_up(&a, "main", "shared", key_a, NULL);
	node_up(&b, "main", "shared", key_b, NULL);
	prompt(t, 2 * BT + 1, 3000);
	commit_prompt(a.c, t, 2 * BT + 1, 0x31);
	wait_keys(2);
	ck_assert_uint_eq(open_cached(b.c, t, 2 * BT + 1, 0x31), 0);
	node_down(&b);
	/* And the same key on a new node does hit. */
	node_up(&b, "main", "shared", key_a, NULL);
	ck_assert_uint_eq(open_cached(b.c, t, 2 * BT + 1, 0x31), 2 * BT);
	node_down(&a);
	node_down(&b);
}
END_TEST

/*
 * Tenants.  uid namespaces are numbers: they stay on their node (nothing stored).  A shared
 * pool of another name, or another narrowing string, is another namespace; the same name and
 * string on two nodes is one; so is a uid namespace named by its user (remote_tier_map_names).
 */
START_TEST(tenants)
{
	struct node a, b;
	uint32_t t[2 * BT + 1];

	cluster_flush();
	prompt(t, 2 * BT + 1, 11000);
	node_up(&a, "main", "uid", key_a, NULL);
	commit_prompt(a.c, t, 2 * BT + 1, 0x51);
	msleep(200);
	ck_assert_int_eq(cluster_keys(), 0);
	node_down(&a);

	node_up(&a, "main", "shared", key_a, "team-a");
	commit_prompt(a.c, t, 2 * BT + 1, 0x51);
	wait_keys(2);
	node_up(&b, "main", "shared", key_a, "team-b");
	ck_assert_uint_eq(open_cached(b.c, t, 2 * BT + 1, 0x51), 0);
	node_down(&b);
	node_up(&b, "other", "shared", key_a, "team-a");
	ck_assert_uint_eq(open_cached(b.c, t, 2 * BT + 1, 0x51), 0);
	node_down(&b);
	node_up(&b, "main", "shared", key_a, "team-a");
	ck_assert_uint_eq(open_cached(b.c, t, 2 * BT + 1, 0x51), 2 * BT);
	node_down(&b);
	node_down(&a);

	/*
	 * A uid namespace mapped to its user's name (remote_tier_map_names) is one namespace on
	 * every node: the test's user on A and on B.  Not the shared pool's, though.
	 */
	cluster_flush();
	node_up_with(&a, "main", "uid", key_a, NULL, "remote_tier_map_names = yes\n");
	commit_prompt(a.c, t, 2 * BT + 1, 0x52);
	wait_keys(2);
	node_up_with(&b, "main", "uid", key_a, NULL, "remote_tier_map_names = yes\n");
	ck_assert_uint_eq(open_cached(b.c, t, 2 * BT + 1, 0x52), 2 * BT);
	node_down(&b);
	node_up(&b, "main", "shared", key_a, NULL);
	ck_assert_uint_eq(open_cached(b.c, t, 2 * BT + 1, 0x52), 0);
	node_down(&b);
	node_down(&a);
}
END_TEST

/*
 * remote_tier_write = evict: nothing is published at commit; a block goes to Redis when it
 * leaves the node's last level in memory (the pool; or the host tier below it), and another
 * node then hits it, bytewise.  With swap files below, it is published as it goes into them,
 * and the node that published it still hits it there.
 */
START_TEST(evict_mode)
{
	char swap[] = "/tmp/kvpaged-swap-XXXXXX", cmd[64], levels[4][256];

	ck_assert_ptr_nonnull(mkdtemp(swap));
	snprintf(levels[0], sizeof(levels[0]), "capacity_blocks = 8\nremote_tier_write = evict\n");
	snprintf(levels[1], sizeof(levels[1]),
		 "capacity_blocks = 8\nhost_tier_blocks = 4\nremote_tier_write = evict\n");
	/* With swap files: published as they leave memory, the files keeping them too. */
	snprintf(levels[2], sizeof(levels[2]),
		 "capacity_blocks = 8\nfile_tier_blocks = 64\nswap_files = %s/a\n"
		 "remote_tier_write = evict\n", swap);
	snprintf(levels[3], sizeof(levels[3]),
		 "capacity_blocks = 8\nhost_tier_blocks = 4\nfile_tier_blocks = 64\n"
		 "swap_files = %s/b\nremote_tier_write = evict\n", swap);
	for (size_t l = 0; l < 4; l++) {
		struct node a, b;
		uint32_t t[3 * BT + 1], other[3 * BT + 1];

		cluster_flush();
		node_up_with(&a, "main", "shared", key_a, NULL, levels[l]);
		node_up(&b, "main", "shared", key_a, NULL);
		prompt(t, 3 * BT + 1, 31000 + 100 * (uint32_t)l);
		commit_prompt(a.c, t, 3 * BT + 1, 0x90);
		msleep(200);
		ck_assert_int_eq(cluster_keys(), 0); /* still in A's pool: not published */
		/* Other prompts push it out of A's pool (and host tier). */
		for (uint32_t i = 0; i < 6; i++) {
			prompt(other, 3 * BT + 1, 40000 + 1000 * ((uint32_t)l * 10 + i));
			commit_prompt(a.c, other, 3 * BT + 1, (uint8_t)(0xa0 + i));
		}
		/* Stores are asynchronous: B hits all three once they have landed. */
		for (int i = 0; i < 500 && open_cached(b.c, t, 3 * BT + 1, 0x90) != 3 * BT; i++)
			msleep(10);
		ck_assert_int_gt(cluster_keys(), 0);
		drop_cache(&b);
		ck_assert_uint_eq(open_cached(b.c, t, 3 * BT + 1, 0x90), 3 * BT);
		/* A, with swap files, has them there still: a local hit, the same bytes. */
		if (l >= 2)
			ck_assert_uint_eq(open_cached(a.c, t, 3 * BT + 1, 0x90), 3 * BT);
		node_down(&a);
		node_down(&b);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf %s", swap);
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Blocks the remote level was asked for on node n so far (kvpagedctl stats). */
static long long probes(const struct node *n)
{
	static char out[65536];

	ck_assert_int_eq(ctl(&n->d, "stats", out, sizeof(out)), 0);
	return json_int(out, "probes");
}

/*
 * remote_tier_bandwidth = auto: a measured rate at which fetching loses to recomputing (an
 * engine configured very fast) stops the fetches; the rate is forgotten after a while
 * (REMOTE_RETRY_NS, 10 s) and the tier is asked again.
 */
START_TEST(auto_bandwidth)
{
	struct node a, b;
	uint32_t t[20 * BT + 1];
	long long before;

	cluster_flush();
	node_up(&a, "main", "shared", key_a, NULL);
	node_up_with(&b, "main", "shared", key_a, NULL,
		     "remote_tier_bandwidth = auto\nmodel_params = 1\nengine_flops = 1e18\n");
	prompt(t, 20 * BT + 1, 50000);
	commit_prompt(a.c, t, 20 * BT + 1, 0x33);
	wait_keys(20);
	/* Unknown at first: fetched (20 blocks, enough for a figure), and measured to lose. */
	ck_assert_uint_eq(open_cached(b.c, t, 20 * BT + 1, 0x33), 20 * BT);
	drop_cache(&b);
	before = probes(&b);
	ck_assert_uint_eq(open_cached(b.c, t, 20 * BT + 1, 0x33), 0);
	ck_assert_int_eq(probes(&b), before);
	drop_cache(&b);
	msleep(10500);
	ck_assert_uint_eq(open_cached(b.c, t, 20 * BT + 1, 0x33), 20 * BT);
	ck_assert_int_gt(probes(&b), before);
	ck_assert(daemon_log_has(&b.d, "measuring its bandwidth again"));
	node_down(&a);
	node_down(&b);
}
END_TEST

/*
 * Redis absent when the nodes start: they serve, their opens miss and their stores drop; once
 * it is up, what is committed from then on crosses nodes.
 */
START_TEST(absent_then_up)
{
	struct redis_fixture sf;
	struct node a, b;
	uint32_t t1[2 * BT + 1], t2[2 * BT + 1];
	char saved[sizeof(seeds)];

	redis_fixture_absent(&sf);
	snprintf(key_a, sizeof(key_a), "%s/a.key", sf.dir);
	write_remote_key(key_a, 1);
	memcpy(saved, seeds, sizeof(seeds));
	snprintf(seeds, sizeof(seeds), "redis://127.0.0.1:%u", sf.s[0].port);
	node_up(&a, "main", "shared", key_a, NULL);
	node_up(&b, "main", "shared", key_a, NULL);
	prompt(t1, 2 * BT + 1, 13000);
	prompt(t2, 2 * BT + 1, 15000);
	commit_prompt(a.c, t1, 2 * BT + 1, 0x71);
	ck_assert_uint_eq(open_cached(b.c, t1, 2 * BT + 1, 0x71), 0);
	sf.s[0].pid = redis_spawn(&sf, sf.s[0].port, false);
	/* The client backs off a node that was down: give it time to try again. */
	/* A block is published once, at its commit: A commits it afresh each round. */
	for (int i = 0; i < 300; i++) {
		drop_cache(&a);
		commit_prompt(a.c, t2, 2 * BT + 1, 0x72);
		if (open_cached(b.c, t2, 2 * BT + 1, 0x72) == 2 * BT)
			break;
		drop_cache(&b);
		msleep(20);
	}
	drop_cache(&b);
	ck_assert_uint_eq(open_cached(b.c, t2, 2 * BT + 1, 0x72), 2 * BT);
	node_down(&a);
	node_down(&b);
	memcpy(seeds, saved, sizeof(seeds));
	unlink(key_a);
	redis_fixture_stop(&sf);
}
END_TEST

/*
 * A master killed while node B replays prompts node A committed: B keeps serving (every open
 * answers, with A's bytes or a miss), the dead master's blocks miss until a replica takes
 * over, then its slots store and hit again.  Runs last: the cluster is left a node fewer.
 */
START_TEST(master_killed)
{
	struct node a, b;
	enum { NP = 24 };
	static uint32_t t[NP][BT + 1];
	uint32_t hits = 0;
	int victim = -1;

	cluster_flush();
	node_up(&a, "main", "shared", key_a, NULL);
	node_up(&b, "main", "shared", key_a, NULL);
	for (unsigned i = 0; i < NP; i++) {
		prompt(t[i], BT + 1, 20000 + 100 * i);
		commit_prompt(a.c, t[i], BT + 1, (uint8_t)(0x80 + i));
	}
	wait_keys(NP);
	for (unsigned i = 0; i < fx.n && victim < 0; i++)
		if (is_master(fx.s[i].port))
			victim = (int)i;
	ck_assert_int_ge(victim, 0);
	redis_server_kill(&fx.s[victim]);
	/* During the outage: every open answers, hits are A's bytes, the rest are misses. */
	for (unsigned i = 0; i < NP; i++)
		hits += open_cached(b.c, t[i], BT + 1, (uint8_t)(0x80 + i)) / BT;
	ck_assert_uint_lt(hits, NP);
	/*
	 * After the failover (the fixture's cluster-node-timeout, then the election) the dead
	 * master's slots are served again.  Replication is asynchronous, so what the new master
	 * holds is Redis's matter: node A publishes its blocks afresh, and every one hits.
	 */
	for (int round = 0; round < 400 && hits < NP; round++) {
		drop_cache(&a);
		for (unsigned i = 0; i < NP; i++)
			commit_prompt(a.c, t[i], BT + 1, (uint8_t)(0x80 + i));
		msleep(20);
		drop_cache(&b);
		hits = 0;
		for (unsigned i = 0; i < NP; i++)
			hits += open_cached(b.c, t[i], BT + 1, (uint8_t)(0x80 + i)) / BT;
		if (hits < NP)
			msleep(50);
	}
	if (hits < NP) {
		char cmd[256];

		snprintf(cmd, sizeof(cmd), "grep -iv sequence %s | tail -20 >&2", b.d.log);
		(void)system(cmd);
		for (unsigned i = 0; i < fx.n; i++)
			if (fx.s[i].pid) {
				redisReply *r = redis_direct(fx.s[i].port, "DBSIZE");

				fprintf(stderr, "redis 127.0.0.1:%u: master %d, %lld keys\n", fx.s[i].port,
					is_master(fx.s[i].port), r ? r->integer : -1LL);
			}
	}
	ck_assert_uint_eq(hits, NP);
	node_down(&a);
	node_down(&b);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("remote-daemon");
	TCase *cl = tcase_create("cluster"), *solo = tcase_create("standalone");

	signal(SIGPIPE, SIG_IGN);
	if (!redis_installed()) {
		fprintf(stderr, "redis-server or redis-cli not installed: skipped\n");
		return 77;
	}
	tcase_add_unchecked_fixture(cl, cluster_up, cluster_down);
	tcase_set_timeout(cl, 120);
	tcase_add_test(cl, cross_node);
	tcase_add_test(cl, tampered);
	tcase_add_test(cl, copied);
	tcase_add_test(cl, wrong_key);
	tcase_add_test(cl, tenants);
	tcase_add_test(cl, evict_mode);
	tcase_add_test(cl, auto_bandwidth);
	tcase_add_test(cl, master_killed);
	suite_add_tcase(s, cl);
	tcase_set_timeout(solo, 60);
	tcase_add_test(solo, absent_then_up);
	suite_add_tcase(s, solo);
	return run_suite(s);
}

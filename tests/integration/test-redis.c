/* SPDX-License-Identifier: MIT */
/*
 * The remote tier's Redis Cluster client against real servers started here: a cluster of three
 * masters with a replica each, and standalone servers.  Batches over every slot, CRC16 against
 * CLUSTER KEYSLOT, MOVED after a slot is migrated, ASK during a migration, 2 MiB values
 * pipelined, a hung master (timeouts, then the pipeline still in step), a killed master (its
 * keys down at once, the others fine; back after the failover), Redis absent at start, and a
 * connect that never completes (down after connect_timeout_ms, not a deadline per batch),
 * values framed by the client among replies hiredis parses, through a sink or whole, and a
 * deadline in the middle of a value.
 * The URL parser and the slot function run without Redis; the rest is skipped (77) only when
 * redis-server is not installed.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tier/redis.h"
#include "tests/check-runner.h"
#include "tests/redis-fixture.h"

static struct redis_fixture fx;

static struct redis_cluster *client_of(const struct redis_fixture *f, unsigned nseeds,
				       const struct redis_options *o)
{
	struct redis_addr seeds[FIXTURE_MAX];
	struct redis_cluster *c;

	for (unsigned i = 0; i < nseeds; i++) {
		snprintf(seeds[i].host, sizeof(seeds[i].host), "127.0.0.1");
		seeds[i].port = f->s[i].port;
	}
	ck_assert_int_eq(redis_cluster_new(seeds, nseeds, o, &c), 0);
	return c;
}

static void cmd_set(struct redis_cmd *c, const char *key, const void *v, size_t n)
{
	memset(c, 0, sizeof(*c));
	c->op = REDIS_SET;
	c->key = key;
	c->key_len = strlen(key);
	c->value = v;
	c->value_len = n;
}

static void cmd_get(struct redis_cmd *c, const char *key)
{
	memset(c, 0, sizeof(*c));
	c->op = REDIS_GET;
	c->key = key;
	c->key_len = strlen(key);
}

/* ---- without a server ---------------------------------------------------------------------- */

START_TEST(url_parse)
{
	struct redis_addr a[4];
	size_t n = 0;
	char err[256];

	ck_assert_int_eq(redis_parse_url("redis://127.0.0.1:7000,10.0.0.2:7001, [::1]:7002", a, 4,
					 &n, err, sizeof(err)),
			 0);
	ck_assert_uint_eq(n, 3);
	ck_assert_str_eq(a[0].host, "127.0.0.1");
	ck_assert_uint_eq(a[0].port, 7000);
	ck_assert_str_eq(a[1].host, "10.0.0.2");
	ck_assert_str_eq(a[2].host, "::1");
	ck_assert_uint_eq(a[2].port, 7002);
	ck_assert_int_eq(redis_parse_url("redis://cache.local:6379", a, 4, &n, err, sizeof(err)),
			 0);
	ck_assert_uint_eq(n, 1);

	static const struct {
		const char *url, *msg;
	} bad[] = {
		{ "http://h:1", "expected redis://" },
		{ "redis://", "empty host" },
		{ "redis://h", "expected :PORT" },
		{ "redis://h:", "port must be" },
		{ "redis://h:0", "port must be" },
		{ "redis://h:65536", "port must be" },
		{ "redis://h:1234567", "port must be" },
		{ "redis://h:12x", "expected , or the end" },
		{ "redis://h:1,", "empty host" },
		{ "redis://[::1:5", "unclosed [" },
		{ "redis://h:1/0", "expected , or the end" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		ck_assert_int_eq(redis_parse_url(bad[i].url, a, 4, &n, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, bad[i].msg) && strstr(err, bad[i].url),
			      "%s: \"%s\", expected \"%s\"", bad[i].url, err, bad[i].msg);
	}
	ck_assert_int_eq(redis_parse_url("redis://a:1,b:2,c:3", a, 2, &n, err, sizeof(err)),
			 -E2BIG);
}
END_TEST

START_TEST(slots_known)
{
	/* The XMODEM check value, and slots from the Redis Cluster specification. */
	ck_assert_uint_eq(redis_crc16("123456789", 9), 0x31c3);
	ck_assert_uint_eq(redis_key_slot("foo", 3), 12182);
	ck_assert_uint_eq(redis_key_slot("{user1000}.following", 20),
			  redis_key_slot("user1000", 8));
	ck_assert_uint_eq(redis_key_slot("foo{}{bar}", 10), redis_key_slot("foo{}{bar}", 10));
	ck_assert_uint_ne(redis_key_slot("foo{}{bar}", 10), redis_key_slot("bar", 3));
	ck_assert_uint_eq(redis_key_slot("foo{{bar}}zap", 13), redis_key_slot("{bar", 4));
	ck_assert_uint_eq(redis_key_slot("foo{bar}{zap}", 13), redis_key_slot("bar", 3));
}
END_TEST

/*
 * A node whose connect never completes: a listener with a full accept queue drops further
 * SYNs.  The first batch gives up on it after connect_timeout_ms, well before its deadline; from
 * then on the node is down and batches return at once (the deadlines are long, so that only
 * the client's own limits can explain a fast return).
 */
START_TEST(connect_hangs)
{
	const struct redis_options o = { .connect_timeout_ms = 300, .backoff_min_ms = 1000 };
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct redis_fixture f = { .n = 1 };
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), fill[4];
	struct redis_node_info info;
	struct redis_cluster *c;
	struct redis_cmd cmd;
	uint64_t t0;

	f.s[0].port = free_port();
	sa.sin_port = htons(f.s[0].port);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(lfd, 0), 0);
	for (int i = 0; i < 4; i++) {
		fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		connect(fill[i], (struct sockaddr *)&sa, sizeof(sa));
	}
	fixture_msleep(50);
	c = client_of(&f, 1, &o);
	cmd_get(&cmd, "k");
	t0 = fixture_now_ms();
	ck_assert_int_eq(redis_cluster_run(c, &cmd, 1, 3000), 0);
	ck_assert_uint_ge(fixture_now_ms() - t0, 290);
	ck_assert_uint_lt(fixture_now_ms() - t0, 2000);
	ck_assert_int_eq(cmd.status, REDIS_CMD_DOWN); /* no map: the refresh had no answer */
	redis_cluster_nodes(c, &info, 1);
	ck_assert_int_eq(info.state, REDIS_NODE_DOWN);
	ck_assert_uint_eq(info.failures, 1);
	for (int round = 0; round < 2; round++) {
		t0 = fixture_now_ms();
		ck_assert_int_eq(redis_cluster_run(c, &cmd, 1, 3000), 0);
		ck_assert_uint_lt(fixture_now_ms() - t0, 1000);
		ck_assert_int_eq(cmd.status, REDIS_CMD_DOWN);
		redis_cluster_nodes(c, &info, 1);
		ck_assert_int_eq(info.state, REDIS_NODE_DOWN);
		ck_assert_uint_eq(info.failures, 1);
	}
	redis_cluster_free(c);
	for (int i = 0; i < 4; i++)
		close(fill[i]);
	close(lfd);
}
END_TEST

/* ---- a cluster ----------------------------------------------------------------------------- */

static void cluster_up(void)
{
	redis_fixture_cluster(&fx, 3);
}

static void cluster_down(void)
{
	redis_fixture_stop(&fx);
}

START_TEST(keyslot)
{
	char key[64];

	for (int i = 0; i < 300; i++) {
		redisReply *r;

		switch (i % 5) {
		case 0:
			snprintf(key, sizeof(key), "kvp:%08x", i * 2654435761u);
			break;
		case 1:
			snprintf(key, sizeof(key), "{tag%d}.rest", i);
			break;
		case 2:
			snprintf(key, sizeof(key), "a{}b{c%d}", i);
			break;
		case 3:
			snprintf(key, sizeof(key), "x{y%d", i);
			break;
		default:
			snprintf(key, sizeof(key), "pre{%d}mid{z}", i);
		}
		r = redis_direct(fx.s[i % 3].port, "CLUSTER KEYSLOT %s", key);
		ck_assert(r && r->type == REDIS_REPLY_INTEGER);
		ck_assert_msg(redis_key_slot(key, strlen(key)) == r->integer, "%s: %u, redis %lld",
			      key, redis_key_slot(key, strlen(key)), r->integer);
		freeReplyObject(r);
	}
}
END_TEST

/* One key in every slot. */
#define MANY REDIS_SLOTS

START_TEST(many_keys)
{
	struct redis_cluster *c = client_of(&fx, 1, NULL);
	struct redis_cmd *cmds = calloc(MANY + 1, sizeof(*cmds));
	static char keys[MANY][24], vals[MANY][32];
	struct redis_node_info info[16];
	static bool slot_seen[REDIS_SLOTS];
	size_t nn, masters = 0, covered = 0;
	int next = 0;

	for (int i = 0; i < MANY; i++) {
		uint16_t slot;

		do {
			snprintf(keys[i], sizeof(keys[i]), "many:%d", next++);
			slot = redis_key_slot(keys[i], strlen(keys[i]));
		} while (slot_seen[slot]);
		slot_seen[slot] = true;
		snprintf(vals[i], sizeof(vals[i]), "value %d", i * 7);
		cmd_set(&cmds[i], keys[i], vals[i], strlen(vals[i]));
	}
	cmd_set(&cmds[MANY], "many:ttl", "t", 1);
	cmds[MANY].ttl_ms = 100000;
	ck_assert_int_eq(redis_cluster_run(c, cmds, MANY + 1, 5000), 0);
	for (int i = 0; i <= MANY; i++) {
		ck_assert_msg(cmds[i].status == REDIS_CMD_OK, "SET %d: %s", i,
			      redis_status_name(cmds[i].status));
		ck_assert_uint_eq(cmds[i].flags, 0); /* the map was right from the start */
	}
	for (int i = 0; i < MANY; i++)
		cmd_get(&cmds[i], keys[i]);
	cmd_get(&cmds[MANY], "many:absent");
	ck_assert_int_eq(redis_cluster_run(c, cmds, MANY + 1, 5000), 0);
	for (int i = 0; i < MANY; i++) {
		ck_assert_int_eq(cmds[i].status, REDIS_CMD_OK);
		ck_assert_uint_eq(cmds[i].data_len, strlen(vals[i]));
		ck_assert(!memcmp(cmds[i].data, vals[i], cmds[i].data_len));
		redis_cmd_release(&cmds[i]);
	}
	ck_assert_int_eq(cmds[MANY].status, REDIS_CMD_NIL);

	/* The TTL reached the server. */
	uint16_t ts = redis_key_slot("many:ttl", 8);
	int owner = redis_fixture_owner(&fx, 0, ts);
	redisReply *r = redis_direct(fx.s[owner].port, "PTTL many:ttl");

	ck_assert(r && r->type == REDIS_REPLY_INTEGER && r->integer > 90000 && r->integer <= 100000);
	freeReplyObject(r);

	/* Every master took its share, and the map covers every slot. */
	nn = redis_cluster_nodes(c, info, 16);
	for (size_t i = 0; i < nn && i < 16; i++)
		if (info[i].slots) {
			masters++;
			covered += info[i].slots;
			ck_assert_int_eq(info[i].state, REDIS_NODE_UP);
			ck_assert_uint_gt(info[i].commands, MANY / 6);
			ck_assert_uint_gt(info[i].bytes_out, 0);
			ck_assert_uint_gt(info[i].bytes_in, 0);
			ck_assert_uint_eq(info[i].errors, 0);
		}
	ck_assert_uint_eq(masters, 3);
	ck_assert_uint_eq(covered, REDIS_SLOTS);
	for (unsigned s = 0; s < REDIS_SLOTS; s++)
		ck_assert_ptr_nonnull(redis_cluster_slot_addr(c, (uint16_t)s));
	free(cmds);
	redis_cluster_free(c);
}
END_TEST

#define BIG (2u << 20)
#define NBIG 64

START_TEST(big_values)
{
	struct redis_cluster *c = client_of(&fx, 3, NULL);
	struct redis_cmd cmds[NBIG];
	static char keys[NBIG][24];
	uint8_t *v = malloc((size_t)NBIG * BIG);

	for (size_t i = 0; i < (size_t)NBIG * BIG; i++)
		v[i] = (uint8_t)(i * 2654435761u >> 13);
	for (int i = 0; i < NBIG; i++) {
		snprintf(keys[i], sizeof(keys[i]), "big:%d", i);
		cmd_set(&cmds[i], keys[i], v + (size_t)i * BIG, BIG);
	}
	ck_assert_int_eq(redis_cluster_run(c, cmds, NBIG, 30000), 0);
	for (int i = 0; i < NBIG; i++)
		ck_assert_msg(cmds[i].status == REDIS_CMD_OK, "SET %d: %s", i,
			      redis_status_name(cmds[i].status));
	for (int i = 0; i < NBIG; i++)
		cmd_get(&cmds[i], keys[i]);
	ck_assert_int_eq(redis_cluster_run(c, cmds, NBIG, 30000), 0);
	for (int i = 0; i < NBIG; i++) {
		ck_assert_int_eq(cmds[i].status, REDIS_CMD_OK);
		ck_assert_uint_eq(cmds[i].data_len, BIG);
		ck_assert(!memcmp(cmds[i].data, v + (size_t)i * BIG, BIG));
		redis_cmd_release(&cmds[i]);
	}
	free(v);
	redis_cluster_free(c);
}
END_TEST

/* A key whose slot a given master serves, found by trying names. */
static void key_on(unsigned master, const char *prefix, char *key, size_t len, uint16_t *slot)
{
	for (int i = 0;; i++) {
		snprintf(key, len, "%s:%d", prefix, i);
		*slot = redis_key_slot(key, strlen(key));
		if (redis_fixture_owner(&fx, 0, *slot) == (int)master)
			return;
	}
}

static void expect_ok(redisReply *r)
{
	ck_assert_msg(r && r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "OK"), "%s",
		      r ? r->str : "no reply");
	freeReplyObject(r);
}

/* Both ends of a slot migration, then the keys moved with MIGRATE. */
static void migrate_begin(int src, int dst, uint16_t slot)
{
	expect_ok(redis_direct(fx.s[dst].port, "CLUSTER SETSLOT %u IMPORTING %s", slot,
			       fx.s[src].id));
	expect_ok(redis_direct(fx.s[src].port, "CLUSTER SETSLOT %u MIGRATING %s", slot,
			       fx.s[dst].id));
}

static void migrate_key(int src, int dst, const char *key)
{
	redisReply *r = redis_direct(fx.s[src].port, "MIGRATE 127.0.0.1 %u %s 0 5000",
				     fx.s[dst].port, key);

	ck_assert_msg(r && r->type == REDIS_REPLY_STATUS, "MIGRATE: %s", r ? r->str : "none");
	freeReplyObject(r);
}

/*
 * The rest of the slot's keys (many_keys left one in every slot), so that src can give the
 * slot up, then every node learns the new owner at once (no waiting for gossip).
 */
static void migrate_end(int src, int dst, uint16_t slot)
{
	for (;;) {
		redisReply *keys = redis_direct(fx.s[src].port, "CLUSTER GETKEYSINSLOT %u 100", slot);

		ck_assert(keys && keys->type == REDIS_REPLY_ARRAY);
		if (!keys->elements) {
			freeReplyObject(keys);
			break;
		}
		for (size_t k = 0; k < keys->elements; k++)
			migrate_key(src, dst, keys->element[k]->str);
		freeReplyObject(keys);
	}
	expect_ok(redis_direct(fx.s[src].port, "CLUSTER SETSLOT %u NODE %s", slot, fx.s[dst].id));
	for (unsigned i = 0; i < fx.n; i++) {
		redisReply *r = redis_direct(fx.s[i].port, "CLUSTER SETSLOT %u NODE %s", slot,
					     fx.s[dst].id);

		if (r)
			freeReplyObject(r);
	}
}

static int owner_master(uint16_t slot)
{
	return redis_fixture_owner(&fx, 0, slot);
}

START_TEST(moved)
{
	struct redis_cluster *c = client_of(&fx, 1, NULL);
	char key[32], addr[32];
	struct redis_cmd cmd;
	uint16_t slot;
	int src, dst;

	key_on((unsigned)owner_master(100), "moved", key, sizeof(key), &slot);
	src = owner_master(slot);
	dst = owner_master(16000) == src ? owner_master(8000) : owner_master(16000);
	ck_assert_int_ne(src, dst);
	cmd_set(&cmd, key, "here", 4);
	ck_assert_int_eq(redis_cluster_run(c, &cmd, 1, 2000), 0);
	ck_assert_int_eq(cmd.status, REDIS_CMD_OK);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", fx.s[src].port);
	ck_assert_str_eq(redis_cluster_slot_addr(c, slot), addr);

	migrate_begin(src, dst, slot);
	migrate_key(src, dst, key);
	migrate_end(src, dst, slot);

	/* The client still thinks src: MOVED, followed, and the map points at dst. */
	cmd_get(&cmd, key);
	ck_assert_int_eq(redis_cluster_run(c, &cmd, 1, 2000), 0);
	ck_assert_int_eq(cmd.status, REDIS_CMD_OK);
	ck_assert_uint_eq(cmd.flags, REDIS_F_MOVED);
	ck_assert_uint_eq(cmd.data_len, 4);
	ck_assert(!memcmp(cmd.data, "here", 4));
	redis_cmd_release(&cmd);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", fx.s[dst].port);
	ck_assert_str_eq(redis_cluster_slot_addr(c, slot), addr);

	/* Next time it goes straight there. */
	fixture_msleep(150); /* past refresh_min_ms: the full refresh runs first */
	cmd_get(&cmd, key);
	ck_assert_int_eq(redis_cluster_run(c, &cmd, 1, 2000), 0);
	ck_assert_int_eq(cmd.status, REDIS_CMD_OK);
	ck_assert_uint_eq(cmd.flags, 0);
	redis_cmd_release(&cmd);
	ck_assert_str_eq(redis_cluster_slot_addr(c, slot), addr);
	redis_cluster_free(c);
}
END_TEST

START_TEST(ask)
{
	struct redis_cluster *c = client_of(&fx, 1, NULL);
	char key[32], absent[48], addr[32];
	struct redis_cmd cmds[3];
	uint16_t slot;
	int src, dst;

	key_on((unsigned)owner_master(5000), "ask", key, sizeof(key), &slot);
	src = owner_master(slot);
	dst = owner_master(16000) == src ? owner_master(100) : owner_master(16000);
	ck_assert_int_ne(src, dst);
	cmd_set(&cmds[0], key, "moving", 6);
	ck_assert_int_eq(redis_cluster_run(c, cmds, 1, 2000), 0);
	ck_assert_int_eq(cmds[0].status, REDIS_CMD_OK);

	migrate_begin(src, dst, slot);
	migrate_key(src, dst, key);
	/* Mid-migration: src answers ASK for keys it no longer has. */
	snprintf(absent, sizeof(absent), "{%s}.absent", key);
	cmd_get(&cmds[0], key);
	cmd_get(&cmds[1], absent);
	cmd_set(&cmds[2], "ask-elsewhere", "x", 1);
	ck_assert_int_eq(redis_cluster_run(c, cmds, 3, 2000), 0);
	ck_assert_int_eq(cmds[0].status, REDIS_CMD_OK);
	ck_assert_uint_eq(cmds[0].flags, REDIS_F_ASK);
	ck_assert(cmds[0].data_len == 6 && !memcmp(cmds[0].data, "moving", 6));
	ck_assert_int_eq(cmds[1].status, REDIS_CMD_NIL);
	ck_assert_uint_eq(cmds[1].flags, REDIS_F_ASK);
	ck_assert_int_eq(cmds[2].status, REDIS_CMD_OK);
	redis_cmd_release(&cmds[0]);
	/* ASK is for one command: the slot is still src's. */
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", fx.s[src].port);
	ck_assert_str_eq(redis_cluster_slot_addr(c, slot), addr);

	migrate_end(src, dst, slot);
	redis_cluster_free(c);
}
END_TEST

/* ---- failures ------------------------------------------------------------------------------ */

#define NFAIL 600

static char fkeys[NFAIL][24];
static int fowner[NFAIL]; /* the master of each key's slot, before anything fails */

static void fill_keys(struct redis_cluster *c, struct redis_cmd *cmds)
{
	for (int i = 0; i < NFAIL; i++) {
		snprintf(fkeys[i], sizeof(fkeys[i]), "fail:%d", i);
		cmd_set(&cmds[i], fkeys[i], fkeys[i], strlen(fkeys[i]));
		fowner[i] = owner_master(redis_key_slot(fkeys[i], strlen(fkeys[i])));
	}
	ck_assert_int_eq(redis_cluster_run(c, cmds, NFAIL, 5000), 0);
	for (int i = 0; i < NFAIL; i++)
		ck_assert_int_eq(cmds[i].status, REDIS_CMD_OK);
}

struct done_count {
	int calls;
	bool release;
};

/* Each command is reported once, with its status, and may be released on the spot. */
static void on_done(struct redis_cmd *cmd, void *arg)
{
	struct done_count *d = arg;

	ck_assert_int_ne(cmd->status, REDIS_CMD_PENDING);
	d->calls++;
	if (d->release)
		redis_cmd_release(cmd);
}

static void get_all(struct redis_cluster *c, struct redis_cmd *cmds, uint32_t timeout_ms)
{
	for (int i = 0; i < NFAIL; i++)
		cmd_get(&cmds[i], fkeys[i]);
	ck_assert_int_eq(redis_cluster_run(c, cmds, NFAIL, timeout_ms), 0);
}

static void get_all_cb(struct redis_cluster *c, struct redis_cmd *cmds, uint32_t timeout_ms)
{
	struct done_count d = { .release = true };

	for (int i = 0; i < NFAIL; i++)
		cmd_get(&cmds[i], fkeys[i]);
	ck_assert_int_eq(redis_cluster_run_cb(c, cmds, NFAIL, timeout_ms, on_done, &d), 0);
	ck_assert_int_eq(d.calls, NFAIL);
	for (int i = 0; i < NFAIL; i++)
		ck_assert_ptr_null(cmds[i].data);
}

static void release_all(struct redis_cmd *cmds)
{
	for (int i = 0; i < NFAIL; i++)
		redis_cmd_release(&cmds[i]);
}

START_TEST(hung_master)
{
	const struct redis_options o = { .backoff_min_ms = 20, .backoff_max_ms = 200 };
	struct redis_cluster *c = client_of(&fx, 2, &o);
	struct redis_cmd *cmds = calloc(NFAIL, sizeof(*cmds));
	int victim = owner_master(0);
	uint64_t t0;
	int late = 0;

	fill_keys(c, cmds);
	kill(fx.s[victim].pid, SIGSTOP);
	t0 = fixture_now_ms();
	get_all_cb(c, cmds, 200);
	/* The deadline holds, with no more than scheduling slack. */
	ck_assert_uint_lt(fixture_now_ms() - t0, 400);
	for (int i = 0; i < NFAIL; i++) {
		if (fowner[i] == victim) {
			ck_assert_int_eq(cmds[i].status, REDIS_CMD_TIMEOUT);
			late++;
		} else {
			ck_assert_msg(cmds[i].status == REDIS_CMD_OK, "%s: %s", fkeys[i],
				      redis_status_name(cmds[i].status));
		}
	}
	ck_assert_int_gt(late, NFAIL / 6);
	release_all(cmds);

	/* Woken, it answers the timed-out commands first; those are dropped, and the new ones
	 * get their own answers (the pipeline is still in step). */
	kill(fx.s[victim].pid, SIGCONT);
	get_all(c, cmds, 3000);
	for (int i = 0; i < NFAIL; i++) {
		ck_assert_msg(cmds[i].status == REDIS_CMD_OK, "%s: %s", fkeys[i],
			      redis_status_name(cmds[i].status));
		ck_assert_uint_eq(cmds[i].data_len, strlen(fkeys[i]));
		ck_assert(!memcmp(cmds[i].data, fkeys[i], cmds[i].data_len));
	}
	release_all(cmds);
	free(cmds);
	redis_cluster_free(c);
}
END_TEST

START_TEST(killed_master)
{
	const struct redis_options o = { .backoff_min_ms = 20, .backoff_max_ms = 200,
					 .refresh_min_ms = 50 };
	struct redis_cluster *c = client_of(&fx, 2, &o);
	struct redis_cmd *cmds = calloc(NFAIL, sizeof(*cmds));
	int victim = owner_master(0), down = 0;
	bool recovered = false;
	struct redis_node_info info[16];
	size_t nn;
	uint64_t t0;
	char addr[32];

	fill_keys(c, cmds);
	/* Let the replicas catch up before their master goes. */
	for (unsigned i = 0; i < fx.n; i++) {
		redisReply *r = redis_direct(fx.s[i].port, "WAIT 1 2000");

		if (r)
			freeReplyObject(r);
	}
	fixture_msleep(200);
	redis_server_kill(&fx.s[victim]);

	/* Its keys fail as down within the deadline (no waiting for it), the others succeed. */
	/*
	 * One round, before the cluster itself notices (cluster-node-timeout): later, until the
	 * failover, every node answers CLUSTERDOWN for every key, which is a down too.  The
	 * deadline is long: only failing fast explains a quick return.
	 */
	t0 = fixture_now_ms();
	get_all(c, cmds, 3000);
	ck_assert_uint_lt(fixture_now_ms() - t0, 1000);
	for (int i = 0; i < NFAIL; i++) {
		if (fowner[i] == victim) {
			ck_assert_msg(cmds[i].status == REDIS_CMD_DOWN, "%s: %s", fkeys[i],
				      redis_status_name(cmds[i].status));
			down++;
		} else {
			ck_assert_msg(cmds[i].status == REDIS_CMD_OK, "%s: %s", fkeys[i],
				      redis_status_name(cmds[i].status));
		}
	}
	release_all(cmds);
	ck_assert_int_gt(down, NFAIL / 6);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", fx.s[victim].port);
	nn = redis_cluster_nodes(c, info, 16);
	for (size_t i = 0; i < nn && i < 16; i++)
		if (!strcmp(info[i].addr, addr)) {
			ck_assert_uint_gt(info[i].failures, 0);
			ck_assert_uint_gt(info[i].errors, 0);
		}

	/* The replica is promoted (cluster-node-timeout 1 s): every key is back, with its value. */
	t0 = fixture_now_ms();
	int statuses[REDIS_CMD_NSTATUS] = { 0 };

	while (!recovered && fixture_now_ms() - t0 < 40000) {
		fixture_msleep(100);
		get_all(c, cmds, 300);
		recovered = true;
		memset(statuses, 0, sizeof(statuses));
		for (int i = 0; i < NFAIL; i++) {
			statuses[cmds[i].status]++;
			if (cmds[i].status != REDIS_CMD_OK)
				recovered = false;
		}
		if (recovered)
			for (int i = 0; i < NFAIL; i++)
				ck_assert(cmds[i].data_len == strlen(fkeys[i]) &&
					  !memcmp(cmds[i].data, fkeys[i], cmds[i].data_len));
		release_all(cmds);
	}
	if (!recovered) {
		/* What the client and the cluster think, to tell a slow failover from a stale map. */
		unsigned live = victim == 0 ? 1 : 0;
		redisReply *r = redis_direct(fx.s[live].port, "CLUSTER NODES");

		fprintf(stderr, "killed %s; client: slot 0 at %s; ok %d down %d timeout %d other %d\n"
			"cluster:\n%s\n", addr, redis_cluster_slot_addr(c, 0),
			statuses[REDIS_CMD_OK], statuses[REDIS_CMD_DOWN], statuses[REDIS_CMD_TIMEOUT],
			NFAIL - statuses[REDIS_CMD_OK] - statuses[REDIS_CMD_DOWN] -
				statuses[REDIS_CMD_TIMEOUT],
			r && r->type == REDIS_REPLY_STRING ? r->str : "?");
		if (r)
			freeReplyObject(r);
	}
	ck_assert_msg(recovered, "no failover within 40 s");
	ck_assert_str_ne(redis_cluster_slot_addr(c, 0), addr);
	free(cmds);
	redis_cluster_free(c);
}
END_TEST

START_TEST(standalone)
{
	struct redis_fixture sf;
	struct redis_cluster *c;
	struct redis_cmd cmds[200];
	static char keys[200][16];
	char addr[32];

	redis_fixture_standalone(&sf);
	c = client_of(&sf, 1, NULL);
	for (int i = 0; i < 200; i++) {
		snprintf(keys[i], sizeof(keys[i]), "solo:%d", i);
		cmd_set(&cmds[i], keys[i], keys[i], strlen(keys[i]));
	}
	ck_assert_int_eq(redis_cluster_run(c, cmds, 200, 2000), 0);
	for (int i = 0; i < 200; i++)
		ck_assert_int_eq(cmds[i].status, REDIS_CMD_OK);
	for (int i = 0; i < 200; i++)
		cmd_get(&cmds[i], keys[i]);
	ck_assert_int_eq(redis_cluster_run(c, cmds, 200, 2000), 0);
	for (int i = 0; i < 200; i++) {
		ck_assert_int_eq(cmds[i].status, REDIS_CMD_OK);
		ck_assert(!memcmp(cmds[i].data, keys[i], cmds[i].data_len));
		redis_cmd_release(&cmds[i]);
	}
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", sf.s[0].port);
	for (unsigned s = 0; s < REDIS_SLOTS; s++)
		ck_assert_str_eq(redis_cluster_slot_addr(c, (uint16_t)s), addr);
	redis_cluster_free(c);
	redis_fixture_stop(&sf);
}
END_TEST

/* What a sink saw of one value: its pieces must come in order, without gaps. */
struct sunk {
	uint8_t *buf;
	size_t cap, got, total;
	unsigned pieces;
	bool bad;
	unsigned stall_ms; /* slept at the first piece (a slow sink) */
};

static void sink_to(struct redis_cmd *cmd, size_t off, const void *piece, size_t n,
		    size_t total, void *arg)
{
	struct sunk *k = arg;

	(void)cmd;
	if (off != k->got || off + n > total || off + n > k->cap || (k->pieces && total != k->total))
		k->bad = true;
	else
		memcpy(k->buf + off, piece, n);
	k->got = off + n;
	k->total = total;
	if (!k->pieces++ && k->stall_ms)
		fixture_msleep(k->stall_ms);
}

static unsigned done_calls;

static void count_done(struct redis_cmd *cmd, void *arg)
{
	(void)cmd;
	(void)arg;
	done_calls++;
}

/*
 * The client frames values itself and hands every other reply to hiredis, taking back what
 * hiredis was given past it: one pipeline mixing big values (whole, and through a sink), a
 * missing key, an empty value, a small one and SETs' statuses, so that value and non-value
 * replies share reads in every order.  Twice: without a callback, and with one.
 */
START_TEST(value_framing)
{
	enum { N = 12 };
	const size_t big = 3u << 20;
	struct redis_fixture sf;
	struct redis_cluster *c;
	struct redis_cmd cmds[N];
	struct sunk k = { 0 };
	uint8_t *v = malloc(big);

	for (size_t i = 0; i < big; i++)
		v[i] = (uint8_t)(i * 2654435761u >> 11);
	k = (struct sunk){ .buf = malloc(big), .cap = big };
	redis_fixture_standalone(&sf);
	c = client_of(&sf, 1, NULL);
	cmd_set(&cmds[0], "f:big", v, big);
	cmd_set(&cmds[1], "f:empty", "", 0);
	cmd_set(&cmds[2], "f:small", "hello", 5);
	ck_assert_int_eq(redis_cluster_run(c, cmds, 3, 10000), 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(cmds[i].status, REDIS_CMD_OK);
	for (int pass = 0; pass < 2; pass++) {
		k = (struct sunk){ .buf = k.buf, .cap = big };
		cmd_get(&cmds[0], "f:big");
		cmd_get(&cmds[1], "f:none");
		cmd_get(&cmds[2], "f:empty");
		cmd_set(&cmds[3], "f:other", "x", 1);
		cmd_get(&cmds[4], "f:small");
		cmd_get(&cmds[5], "f:big");
		cmds[5].sink = sink_to;
		cmds[5].sink_arg = &k;
		cmd_get(&cmds[6], "f:none");
		cmd_get(&cmds[7], "f:big");
		cmd_get(&cmds[8], "f:small");
		cmd_set(&cmds[9], "f:other", "y", 1);
		cmd_get(&cmds[10], "f:empty");
		cmd_get(&cmds[11], "f:big");
		done_calls = 0;
		ck_assert_int_eq(pass ? redis_cluster_run_cb(c, cmds, N, 10000, count_done, NULL)
				      : redis_cluster_run(c, cmds, N, 10000),
				 0);
		ck_assert_uint_eq(done_calls, pass ? N : 0);
		for (int i = 0; i < N; i++) {
			const bool none = i == 1 || i == 6, empty = i == 2 || i == 10;
			const bool small = i == 4 || i == 8, set = i == 3 || i == 9;

			ck_assert_msg(cmds[i].status == (none ? REDIS_CMD_NIL : REDIS_CMD_OK),
				      "pass %d cmd %d: %s", pass, i,
				      redis_status_name(cmds[i].status));
			if (none || set)
				continue;
			if (i == 5) {
				/* Through the sink: nothing in data, every byte there in order. */
				ck_assert_ptr_null(cmds[i].data);
				ck_assert_uint_eq(cmds[i].data_len, big);
				ck_assert(!k.bad);
				ck_assert_uint_eq(k.got, big);
				ck_assert_uint_gt(k.pieces, 1);
				ck_assert(!memcmp(k.buf, v, big));
			} else if (empty) {
				ck_assert_uint_eq(cmds[i].data_len, 0);
			} else if (small) {
				ck_assert_uint_eq(cmds[i].data_len, 5);
				ck_assert(!memcmp(cmds[i].data, "hello", 5));
			} else {
				ck_assert_uint_eq(cmds[i].data_len, big);
				ck_assert(!memcmp(cmds[i].data, v, big));
			}
			redis_cmd_release(&cmds[i]);
		}
	}
	free(k.buf);
	free(v);
	redis_cluster_free(c);
	redis_fixture_stop(&sf);
}
END_TEST

/*
 * A deadline that passes in the middle of a value (a sink slower than the deadline): the GET
 * is late, its sink saw part of it, and the rest of that value (read and dropped later) never
 * reaches it or the next command: the pipeline stays in step.
 */
START_TEST(deadline_mid_value)
{
	const size_t big = 64u << 20;
	struct redis_fixture sf;
	struct redis_cluster *c;
	struct redis_cmd cmds[2];
	struct sunk k = { 0 };
	uint8_t *v = malloc(big);
	bool mid = false;

	for (size_t i = 0; i < big; i++)
		v[i] = (uint8_t)(i * 2654435761u >> 9);
	k = (struct sunk){ .buf = malloc(big), .cap = big };
	redis_fixture_standalone(&sf);
	c = client_of(&sf, 1, NULL);
	cmd_set(&cmds[0], "d:big", v, big);
	cmd_set(&cmds[1], "d:small", "after", 5);
	ck_assert_int_eq(redis_cluster_run(c, cmds, 2, 30000), 0);
	ck_assert_int_eq(cmds[0].status, REDIS_CMD_OK);
	ck_assert_int_eq(cmds[1].status, REDIS_CMD_OK);
	for (int round = 0; round < 3; round++) {
		k = (struct sunk){ .buf = k.buf, .cap = big };
		cmd_get(&cmds[0], "d:big");
		cmds[0].sink = sink_to;
		cmds[0].sink_arg = &k;
		/* The sink sleeps past the deadline at its first piece: it passes mid-value. */
		k.stall_ms = 400;
		ck_assert_int_eq(redis_cluster_run(c, cmds, 1, 300), 0);
		ck_assert_int_eq(cmds[0].status, REDIS_CMD_TIMEOUT);
		ck_assert(!k.bad);
		ck_assert_uint_lt(k.got, big);
		ck_assert(!memcmp(k.buf, v, k.got));
		mid |= k.got > 0;
		redis_cmd_release(&cmds[0]);
		/* Its sink is not called again, whatever arrives of it now. */
		cmds[0].sink = NULL;
		cmd_get(&cmds[1], "d:small");
		ck_assert_int_eq(redis_cluster_run(c, &cmds[1], 1, 30000), 0);
		ck_assert_int_eq(cmds[1].status, REDIS_CMD_OK);
		ck_assert_uint_eq(cmds[1].data_len, 5);
		ck_assert(!memcmp(cmds[1].data, "after", 5));
		redis_cmd_release(&cmds[1]);
		ck_assert(!k.bad);
	}
	ck_assert(mid);
	free(k.buf);
	free(v);
	redis_cluster_free(c);
	redis_fixture_stop(&sf);
}
END_TEST

START_TEST(absent_at_start)
{
	const struct redis_options o = { .backoff_min_ms = 20, .backoff_max_ms = 100,
					 .refresh_min_ms = 20 };
	struct redis_fixture sf;
	struct redis_cluster *c;
	struct redis_cmd cmds[50];
	static char keys[50][16];
	struct redis_node_info info;
	bool ok = false;
	uint64_t t0;

	redis_fixture_absent(&sf);
	c = client_of(&sf, 1, &o);
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 50; i++) {
			snprintf(keys[i], sizeof(keys[i]), "late:%d", i);
			cmd_set(&cmds[i], keys[i], "v", 1);
		}
		t0 = fixture_now_ms();
		ck_assert_int_eq(redis_cluster_run(c, cmds, 50, 3000), 0);
		ck_assert_uint_lt(fixture_now_ms() - t0, 1000); /* refused at once, not waited for */
		for (int i = 0; i < 50; i++)
			ck_assert_int_eq(cmds[i].status, REDIS_CMD_DOWN);
		ck_assert_uint_eq(redis_cluster_nodes(c, &info, 1), 1);
		ck_assert_int_eq(info.state, REDIS_NODE_DOWN);
		fixture_msleep(30);
	}
	sf.s[0].pid = redis_spawn(&sf, sf.s[0].port, false);
	t0 = fixture_now_ms();
	while (!ok && fixture_now_ms() - t0 < 3000) {
		fixture_msleep(20);
		ck_assert_int_eq(redis_cluster_run(c, cmds, 50, 200), 0);
		ok = true;
		for (int i = 0; i < 50; i++)
			ok &= cmds[i].status == REDIS_CMD_OK;
	}
	ck_assert_msg(ok, "not up 3 s after redis started");
	redis_cluster_nodes(c, &info, 1);
	ck_assert_int_eq(info.state, REDIS_NODE_UP);
	ck_assert_uint_eq(info.slots, REDIS_SLOTS);
	redis_cluster_free(c);
	redis_fixture_stop(&sf);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("redis");
	TCase *offline = tcase_create("offline"), *cl, *fail, *solo;
	int r;

	tcase_add_test(offline, url_parse);
	tcase_add_test(offline, slots_known);
	tcase_add_test(offline, connect_hangs);
	suite_add_tcase(s, offline);
	if (!redis_fixture_suite_ready(s, &r))
		return r;
	/* One cluster per case; the failures case gets a fresh one. */
	cl = redis_fixture_cluster_case(s, "cluster", cluster_up, cluster_down);
	tcase_add_test(cl, keyslot);
	tcase_add_test(cl, many_keys);
	tcase_add_test(cl, big_values);
	tcase_add_test(cl, moved);
	tcase_add_test(cl, ask);
	fail = redis_fixture_cluster_case(s, "failures", cluster_up, cluster_down);
	tcase_add_test(fail, hung_master);
	tcase_add_test(fail, killed_master);
	solo = redis_fixture_case(s, "standalone", 60);
	tcase_add_test(solo, standalone);
	tcase_add_test(solo, absent_at_start);
	tcase_add_test(solo, value_framing);
	tcase_add_test(solo, deadline_mid_value);
	return run_suite(s);
}

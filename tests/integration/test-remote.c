/* SPDX-License-Identifier: MIT */
/*
 * The remote tier's thread (daemon/tier/remote.c) against real Redis servers started here: a
 * cluster of three masters with a replica each, and a standalone server.  Round trips of 2 MiB
 * blocks bytewise, an absent block, a value altered in Redis, a value copied under another key,
 * another cluster's key, a full queue (stores dropped and counted, fetches busy, submits that
 * never wait even with a stopped master), a fetch's deadline with a stopped master (its blocks
 * late, the others hit), fetches taken together that keep their own deadlines, stores to a
 * stopped master that neither starve a fetch nor hold remote_free, a job larger than the bound
 * (busy), a completed job counted until reaped, Redis absent then started (down, then fine),
 * remote_free with jobs in flight (cancelled, counted), and the completion eventfd.  Skipped
 * (77) only when redis-server or redis-cli is not installed.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/tier/remote.h"
#include "tests/check-runner.h"
#include "tests/redis-fixture.h"

#define MiB (1024u * 1024u)
#define TOKENS 16

static struct redis_fixture fx;
static char key_a[128], key_b[128];

static const char ns_name[] = "pool main";

static void write_key(const char *path, uint8_t seed)
{
	uint8_t k[SEAL_KEY_BYTES];
	int fd;

	for (size_t i = 0; i < sizeof(k); i++)
		k[i] = (uint8_t)(seed * 31 + i * 7);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, k, sizeof(k)), (ssize_t)sizeof(k));
	close(fd);
}

static void keys_up(const struct redis_fixture *f)
{
	snprintf(key_a, sizeof(key_a), "%s/a.key", f->dir);
	snprintf(key_b, sizeof(key_b), "%s/b.key", f->dir);
	write_key(key_a, 1);
	write_key(key_b, 2);
}

static void cluster_up(void)
{
	redis_fixture_cluster(&fx, 3);
	keys_up(&fx);
}

static void cluster_down(void)
{
	redis_fixture_stop(&fx);
}

static struct seal_geometry geometry(uint64_t payload)
{
	return (struct seal_geometry){ .layers = 1, .kv_heads = 1, .head_dim = 1,
				       .elem_bytes = 1, .block_tokens = TOKENS,
				       .payload_bytes = payload };
}

struct opts {
	const char *key_file;
	uint64_t payload;
	uint32_t inflight, timeout_ms, store_timeout_ms;
};

static struct remote *remote_on(const struct redis_fixture *f, unsigned nseeds,
				const struct opts *o)
{
	struct remote_config cfg = {
		.key_file = o->key_file ? o->key_file : key_a,
		.geometry = geometry(o->payload),
		.timeout_ms = o->timeout_ms ? o->timeout_ms : 2000,
		.store_timeout_ms = o->store_timeout_ms ? o->store_timeout_ms : 5000,
		.max_inflight = o->inflight ? o->inflight : 64,
		.redis = { .backoff_min_ms = 20, .backoff_max_ms = 100, .refresh_min_ms = 20 },
	};
	char url[512], err[512] = "";
	size_t len = (size_t)snprintf(url, sizeof(url), "redis://");
	struct remote *r;
	int e;

	for (unsigned i = 0; i < nseeds; i++)
		len += (size_t)snprintf(url + len, sizeof(url) - len, "%s127.0.0.1:%u",
					i ? "," : "", f->s[i].port);
	cfg.url = url;
	e = remote_new(&cfg, err, sizeof(err), &r);
	ck_assert_msg(e == 0, "remote_new: %d %s", e, err);
	return r;
}

/* A block numbered i: its hash, parent, tokens and payload are functions of i and salt. */
struct test_block {
	struct remote_block b;
	uint32_t tokens[TOKENS];
	uint8_t *data;
};

static void make_block(struct test_block *t, unsigned i, unsigned salt, uint64_t payload,
		       bool fill)
{
	memset(&t->b, 0, sizeof(t->b));
	for (int k = 0; k < 16; k++) {
		t->b.hash[k] = (uint8_t)(i * 13 + k + salt * 101);
		t->b.parent[k] = i ? (uint8_t)((i - 1) * 13 + k + salt * 101) : 0;
	}
	memcpy(t->b.hash, &i, sizeof(i));
	memcpy(t->b.hash + 4, &salt, sizeof(salt));
	for (int k = 0; k < TOKENS; k++)
		t->tokens[k] = i * 1000 + (uint32_t)k;
	t->b.tokens = t->tokens;
	if (!t->data)
		t->data = malloc(payload);
	ck_assert_ptr_nonnull(t->data);
	if (fill)
		for (uint64_t k = 0; k < payload; k++)
			t->data[k] = (uint8_t)(k * 7 + i * 3 + salt + (k >> 12));
	else
		memset(t->data, 0xee, payload);
	t->b.data = t->data;
}

static void block_expected(uint8_t *out, unsigned i, unsigned salt, uint64_t payload)
{
	for (uint64_t k = 0; k < payload; k++)
		out[k] = (uint8_t)(k * 7 + i * 3 + salt + (k >> 12));
}

struct reaped {
	struct remote_job *jobs[256];
	size_t n;
};

static void on_done(struct remote_job *job, void *arg)
{
	struct reaped *rp = arg;

	ck_assert_uint_lt(rp->n, 256);
	rp->jobs[rp->n++] = job;
}

/* remote_free's done: what on_done does, and the counters as of the last job back. */
struct freed {
	struct reaped rp;
	struct remote *r;
	struct remote_stats st;
};

static void on_freed(struct remote_job *job, void *arg)
{
	struct freed *fr = arg;

	on_done(job, &fr->rp);
	remote_get_stats(fr->r, &fr->st);
}

static void sleep_until(uint64_t ms)
{
	uint64_t now = fixture_now_ms();

	if (now < ms)
		fixture_msleep((unsigned)(ms - now));
}

/* Waits (poll on the eventfd: it must become readable) until want jobs came back. */
static void wait_jobs(struct remote *r, struct reaped *rp, size_t want, unsigned timeout_ms)
{
	uint64_t until = fixture_now_ms() + timeout_ms;

	while (rp->n < want) {
		struct pollfd p = { .fd = remote_fd(r), .events = POLLIN };
		int left = (int)(until - fixture_now_ms());

		ck_assert_msg(fixture_now_ms() < until, "%zu of %zu jobs back after %u ms", rp->n,
			      want, timeout_ms);
		if (poll(&p, 1, left) == 1)
			remote_reap(r, on_done, rp);
	}
}

static void job_init(struct remote_job *j, enum remote_kind kind, struct remote_block *blocks,
		     size_t n)
{
	memset(j, 0, sizeof(*j));
	j->kind = kind;
	j->ns = ns_name;
	j->ns_len = strlen(ns_name);
	j->blocks = blocks;
	j->nblocks = n;
}

/* Stores n blocks (numbered first.., with salt), one job, and waits for it: all OK. */
static void store_blocks(struct remote *r, unsigned first, size_t n, unsigned salt,
			 uint64_t payload)
{
	struct test_block *t = calloc(n, sizeof(*t));
	struct remote_block *b = calloc(n, sizeof(*b));
	struct reaped rp = { .n = 0 };
	struct remote_job j;

	for (size_t i = 0; i < n; i++) {
		make_block(&t[i], first + (unsigned)i, salt, payload, true);
		b[i] = t[i].b;
	}
	job_init(&j, REMOTE_STORE, b, n);
	ck_assert_int_eq(remote_store(r, &j), 0);
	wait_jobs(r, &rp, 1, 10000);
	ck_assert_ptr_eq(rp.jobs[0], &j);
	for (size_t i = 0; i < n; i++) {
		ck_assert_msg(b[i].status == REMOTE_OK, "store %zu: %s", i,
			      remote_status_name(b[i].status));
		free(t[i].data);
	}
	free(t);
	free(b);
}

/* The Redis key of block i of salt under key file path, and the fixture index of its master. */
static int redis_key_of(const char *path, unsigned i, unsigned salt, char out[64])
{
	struct seal_keyring *k;
	uint8_t key[SEAL_KEY_BYTES];
	struct test_block t = { .data = NULL };
	char err[256];

	make_block(&t, i, salt, 1, false);
	free(t.data);
	ck_assert_int_eq(seal_keyring_new(&k), 0);
	ck_assert_int_eq(seal_key_load(path, key, err, sizeof(err)), 0);
	ck_assert_int_eq(seal_keyring_add(k, key, 1, NULL), 0);
	ck_assert_int_eq(seal_redis_key(k, ns_name, strlen(ns_name), t.b.hash, out), 0);
	seal_keyring_free(k);
	return redis_fixture_owner(&fx, 0, redis_key_slot(out, SEAL_REDIS_KEY_LEN));
}

/* SET key to len raw bytes on the server at port (redis_direct's format has no %b). */
static void set_raw(uint16_t port, const char *key, const void *value, size_t len)
{
	struct timeval tv = { .tv_sec = 5 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
	const char *argv[] = { "SET", key, value };
	const size_t lens[] = { 3, strlen(key), len };
	redisReply *rep;

	ck_assert(c && !c->err);
	rep = redisCommandArgv(c, 3, argv, lens);
	ck_assert(rep && rep->type == REDIS_REPLY_STATUS);
	freeReplyObject(rep);
	redisFree(c);
}

/* Fetches block i of salt into a fresh buffer; returns its status (reason and data out). */
static enum remote_status fetch_one(struct remote *r, unsigned i, unsigned salt, uint64_t payload,
				    enum seal_reason *reason, uint8_t **data)
{
	struct test_block t = { .data = NULL };
	struct reaped rp = { .n = 0 };
	struct remote_job j;

	make_block(&t, i, salt, payload, false);
	job_init(&j, REMOTE_FETCH, &t.b, 1);
	ck_assert_int_eq(remote_fetch(r, &j), 0);
	wait_jobs(r, &rp, 1, 10000);
	if (reason)
		*reason = t.b.reason;
	if (data)
		*data = t.data;
	else
		free(t.data);
	return t.b.status;
}

/* ---- without a server ---------------------------------------------------------------------- */

START_TEST(bad_setup)
{
	char dir[] = "/tmp/kvp-remote-XXXXXX", good[128], missing[128], err[512];
	struct remote_config cfg = { .geometry = geometry(4096) };
	struct remote *r = NULL;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(good, sizeof(good), "%s/good.key", dir);
	snprintf(missing, sizeof(missing), "%s/missing.key", dir);
	write_key(good, 3);

	cfg.url = "redis://127.0.0.1";
	cfg.key_file = good;
	err[0] = '\0';
	ck_assert_int_eq(remote_new(&cfg, err, sizeof(err), &r), -EINVAL);
	ck_assert_msg(strlen(err) > 0, "no message for a bad URL");
	ck_assert_ptr_null(r);

	cfg.url = "redis://127.0.0.1:1";
	cfg.key_file = missing;
	err[0] = '\0';
	ck_assert_int_lt(remote_new(&cfg, err, sizeof(err), &r), 0);
	ck_assert_msg(strstr(err, missing), "'%s' does not name the key file", err);

	/* The same key as current and old: refused, naming it. */
	cfg.key_file = good;
	cfg.old_key_files = (const char *const[]){ good };
	cfg.n_old_key_files = 1;
	err[0] = '\0';
	ck_assert_int_eq(remote_new(&cfg, err, sizeof(err), &r), -EEXIST);
	ck_assert_msg(strstr(err, good), "'%s' does not name the key file", err);

	unlink(good);
	rmdir(dir);
}
END_TEST

/* ---- the cluster --------------------------------------------------------------------------- */

START_TEST(round_trip)
{
	const uint64_t payload = 2 * MiB;
	struct remote *r = remote_on(&fx, 3, &(struct opts){ .payload = payload });
	struct test_block t[8] = { 0 };
	struct remote_block b[8];
	struct reaped rp = { .n = 0 };
	struct remote_job j;
	struct remote_stats st;
	uint8_t *want = malloc(payload);
	struct pollfd p = { .fd = remote_fd(r), .events = POLLIN };

	/* Nothing completed: the eventfd is not readable. */
	ck_assert_int_eq(poll(&p, 1, 0), 0);
	store_blocks(r, 0, 8, 1, payload);
	for (unsigned i = 0; i < 8; i++) {
		make_block(&t[i], i, 1, payload, false);
		b[i] = t[i].b;
	}
	job_init(&j, REMOTE_FETCH, b, 8);
	ck_assert_int_eq(remote_fetch(r, &j), 0);
	ck_assert_int_eq(poll(&p, 1, 10000), 1); /* readable once the fetch completed */
	wait_jobs(r, &rp, 1, 10000);
	ck_assert_int_eq(poll(&p, 1, 0), 0); /* and cleared by the reap */
	for (unsigned i = 0; i < 8; i++) {
		ck_assert_msg(b[i].status == REMOTE_OK, "block %u: %s", i,
			      remote_status_name(b[i].status));
		block_expected(want, i, 1, payload);
		ck_assert_msg(!memcmp(t[i].data, want, payload), "block %u differs", i);
		free(t[i].data);
	}
	ck_assert_uint_gt(j.latency_ns, 0);
	remote_get_stats(r, &st);
	ck_assert_uint_eq(st.stores_ok, 8);
	ck_assert_uint_eq(st.hits, 8);
	ck_assert_uint_eq(st.fetches, 1);
	ck_assert_uint_ge(st.bytes_out, 8 * payload);
	ck_assert_uint_ge(st.bytes_in, 8 * payload);
	ck_assert_uint_gt(st.latency_p50_ns, 0);
	ck_assert_uint_ge(st.latency_p99_ns, st.latency_p50_ns);
	ck_assert_uint_eq(st.inflight, 0);
	ck_assert_uint_ge(st.nnodes, 3);
	for (size_t i = 0; i < st.nnodes; i++)
		if (st.nodes[i].slots)
			ck_assert_int_eq(st.nodes[i].state, REDIS_NODE_UP);
	free(want);
	remote_free(r, NULL, NULL);
}
END_TEST

START_TEST(absent)
{
	struct remote *r = remote_on(&fx, 1, &(struct opts){ .payload = 4096 });
	struct remote_stats st;

	ck_assert_int_eq(fetch_one(r, 7, 999, 4096, NULL, NULL), REMOTE_ABSENT);
	remote_get_stats(r, &st);
	ck_assert_uint_eq(st.misses[REMOTE_ABSENT], 1);
	ck_assert_uint_eq(st.hits, 0);
	remote_free(r, NULL, NULL);
}
END_TEST

START_TEST(altered)
{
	const uint64_t payload = 64 * 1024;
	struct remote *r = remote_on(&fx, 3, &(struct opts){ .payload = payload });
	enum seal_reason reason;
	struct remote_stats st;
	char key[64];
	int owner;
	redisReply *rep;

	store_blocks(r, 0, 1, 2, payload);
	ck_assert_int_eq(fetch_one(r, 0, 2, payload, NULL, NULL), REMOTE_OK);
	/* One byte of the payload changed in Redis. */
	owner = redis_key_of(key_a, 0, 2, key);
	ck_assert_int_ge(owner, 0);
	rep = redis_direct(fx.s[owner].port, "SETRANGE %s %d X", key, 1000);
	ck_assert(rep && rep->type == REDIS_REPLY_INTEGER);
	freeReplyObject(rep);
	ck_assert_int_eq(fetch_one(r, 0, 2, payload, &reason, NULL), REMOTE_VERIFY);
	ck_assert_int_eq(reason, SEAL_TAG);
	remote_get_stats(r, &st);
	ck_assert_uint_eq(st.misses[REMOTE_VERIFY], 1);
	ck_assert_uint_eq(st.verify[SEAL_TAG], 1);
	remote_free(r, NULL, NULL);
}
END_TEST

/* Block 1's value stored under block 2's key: it fails its tag (the key is in the AAD). */
START_TEST(copied)
{
	const uint64_t payload = 64 * 1024;
	struct remote *r = remote_on(&fx, 3, &(struct opts){ .payload = payload });
	enum seal_reason reason;
	char k1[64], k2[64];
	int o1, o2;
	redisReply *v;

	store_blocks(r, 1, 1, 3, payload);
	o1 = redis_key_of(key_a, 1, 3, k1);
	o2 = redis_key_of(key_a, 2, 3, k2);
	v = redis_direct(fx.s[o1].port, "GET %s", k1);
	ck_assert(v && v->type == REDIS_REPLY_STRING);
	set_raw(fx.s[o2].port, k2, v->str, v->len);
	freeReplyObject(v);
	ck_assert_int_eq(fetch_one(r, 2, 3, payload, &reason, NULL), REMOTE_VERIFY);
	ck_assert_int_eq(reason, SEAL_TAG);
	remote_free(r, NULL, NULL);
}
END_TEST

/*
 * Another cluster's key: its Redis keys are other names (absent), and a value copied under the
 * name it would use is refused (its key id is unknown), never opened.
 */
START_TEST(wrong_key)
{
	const uint64_t payload = 64 * 1024;
	struct remote *a = remote_on(&fx, 3, &(struct opts){ .payload = payload });
	struct remote *b = remote_on(&fx, 3, &(struct opts){ .payload = payload, .key_file = key_b });
	enum seal_reason reason;
	uint64_t sa, sb, sa2;
	char ka[64], kb[64];
	int oa, ob;
	redisReply *v;

	store_blocks(a, 5, 1, 4, payload);
	ck_assert_int_eq(fetch_one(b, 5, 4, payload, NULL, NULL), REMOTE_ABSENT);
	oa = redis_key_of(key_a, 5, 4, ka);
	ob = redis_key_of(key_b, 5, 4, kb);
	ck_assert_str_ne(ka, kb);
	v = redis_direct(fx.s[oa].port, "GET %s", ka);
	ck_assert(v && v->type == REDIS_REPLY_STRING);
	set_raw(fx.s[ob].port, kb, v->str, v->len);
	freeReplyObject(v);
	ck_assert_int_eq(fetch_one(b, 5, 4, payload, &reason, NULL), REMOTE_VERIFY);
	ck_assert_int_eq(reason, SEAL_UNKNOWN_KEY);

	/* Namespace salts: deterministic per key and name, different across keys and names. */
	ck_assert_int_eq(remote_namespace_salt(a, "shared", 6, &sa), 0);
	ck_assert_int_eq(remote_namespace_salt(a, "shared", 6, &sa2), 0);
	ck_assert_int_eq(remote_namespace_salt(b, "shared", 6, &sb), 0);
	ck_assert_uint_eq(sa, sa2);
	ck_assert_uint_ne(sa, sb);
	ck_assert_int_eq(remote_namespace_salt(a, "other", 5, &sa2), 0);
	ck_assert_uint_ne(sa, sa2);
	remote_free(a, NULL, NULL);
	remote_free(b, NULL, NULL);
}
END_TEST

/* The first block number, from start, whose Redis key the master victim owns (or not). */
static unsigned block_on(unsigned start, unsigned salt, int victim, bool on)
{
	char key[64];

	for (unsigned i = start;; i++)
		if ((redis_key_of(key_a, i, salt, key) == victim) == on)
			return i;
}

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/*
 * A stopped master holds the thread's batch until its deadline: the queue fills, and every
 * further submit returns at once, stores dropped and counted, fetches busy.
 */
START_TEST(queue_full)
{
	const uint64_t payload = 64 * 1024;
	const int victim = redis_fixture_owner(&fx, 0, 0);
	struct remote *r = remote_on(&fx, 3, &(struct opts){ .payload = payload, .inflight = 4,
							      .store_timeout_ms = 600 });
	struct test_block t[12] = { 0 };
	struct remote_job jobs[12];
	struct reaped rp = { .n = 0 };
	struct remote_stats st;
	unsigned ok = 0, dropped = 0, blk = 100;
	uint64_t worst = 0;

	/* A master known to the client first, so that its commands wait rather than fail. */
	store_blocks(r, block_on(0, 5, victim, true), 1, 5, payload);
	/* Blocks the victim owns, found before it stops (the fixture asks the cluster). */
	for (unsigned i = 0; i < 12; i++) {
		blk = block_on(blk + 1, 5, victim, true);
		make_block(&t[i], blk, 5, payload, true);
		job_init(&jobs[i], REMOTE_STORE, &t[i].b, 1);
	}
	/* Stopped for well under cluster-node-timeout (1 s): no failover. */
	kill(fx.s[victim].pid, SIGSTOP);
	for (unsigned i = 0; i < 12; i++) {
		uint64_t t0;
		int e;

		t0 = now_us();
		e = remote_store(r, &jobs[i]);
		if (now_us() - t0 > worst)
			worst = now_us() - t0;
		ck_assert_msg(e == 0 || e == -EBUSY, "remote_store: %d", e);
		e == 0 ? ok++ : dropped++;
		if (i == 0)
			fixture_msleep(50); /* the thread is in its batch now */
	}
	ck_assert_uint_eq(ok, 4);
	ck_assert_uint_eq(dropped, 8);
	/* Never waits: a submit is a few pointer writes, far under a millisecond. */
	ck_assert_msg(worst < 5000, "a submit took %" PRIu64 " us", worst);
	{
		struct test_block f = { .data = NULL };
		struct remote_job fj;
		uint64_t t0 = now_us();

		make_block(&f, 1, 5, payload, false);
		job_init(&fj, REMOTE_FETCH, &f.b, 1);
		ck_assert_int_eq(remote_fetch(r, &fj), -EBUSY);
		ck_assert_uint_lt(now_us() - t0, 5000);
		ck_assert_int_eq(f.b.status, REMOTE_BUSY);
		free(f.data);
	}
	remote_get_stats(r, &st);
	ck_assert_uint_eq(st.stores_dropped, 8);
	ck_assert_uint_eq(st.fetches_busy, 1);
	ck_assert_uint_eq(st.misses[REMOTE_BUSY], 1);
	ck_assert_uint_eq(st.inflight, 4);
	kill(fx.s[victim].pid, SIGCONT);
	wait_jobs(r, &rp, 4, 10000);
	remote_get_stats(r, &st);
	ck_assert_uint_eq(st.inflight, 0);
	for (unsigned i = 0; i < 12; i++)
		free(t[i].data);
	remote_free(r, NULL, NULL);
}
END_TEST

/* A fetch with a stopped master: its blocks late by the deadline, the other masters' hit. */
START_TEST(deadline)
{
	const uint64_t payload = 64 * 1024;
	const int victim = redis_fixture_owner(&fx, 0, 8000);
	struct remote *r = remote_on(&fx, 3, &(struct opts){ .payload = payload, .timeout_ms = 150 });
	struct test_block t[12] = { 0 };
	struct remote_block b[12];
	struct remote_job j;
	struct reaped rp = { .n = 0 };
	struct remote_stats st;
	unsigned nums[12], late = 0, hit = 0, n = 0;
	uint64_t t0, took;

	/* Half on the victim, half elsewhere. */
	for (unsigned i = 0, on = 200, off = 200; i < 12; i++) {
		if (i % 2) {
			on = block_on(on + 1, 6, victim, true);
			nums[n++] = on;
		} else {
			off = block_on(off + 1, 6, victim, false);
			nums[n++] = off;
		}
		store_blocks(r, nums[i], 1, 6, payload);
	}
	kill(fx.s[victim].pid, SIGSTOP);
	for (unsigned i = 0; i < 12; i++) {
		make_block(&t[i], nums[i], 6, payload, false);
		b[i] = t[i].b;
	}
	job_init(&j, REMOTE_FETCH, b, 12);
	t0 = fixture_now_ms();
	ck_assert_int_eq(remote_fetch(r, &j), 0);
	wait_jobs(r, &rp, 1, 5000);
	took = fixture_now_ms() - t0;
	kill(fx.s[victim].pid, SIGCONT);
	ck_assert_msg(took >= 140 && took < 150 + 250, "the fetch took %" PRIu64 " ms", took);
	for (unsigned i = 0; i < 12; i++) {
		if (i % 2) {
			ck_assert_msg(b[i].status == REMOTE_LATE, "block %u: %s", nums[i],
				      remote_status_name(b[i].status));
			late++;
		} else {
			ck_assert_msg(b[i].status == REMOTE_OK, "block %u: %s", nums[i],
				      remote_status_name(b[i].status));
			hit++;
		}
		free(t[i].data);
	}
	remote_get_stats(r, &st);
	ck_assert_uint_eq(st.misses[REMOTE_LATE], late);
	ck_assert_uint_eq(st.hits, hit);
	remote_free(r, NULL, NULL);
}
END_TEST

/* remote_free while the thread waits on a stopped master: what it never took is cancelled. */
START_TEST(free_cancels)
{
	const uint64_t payload = 64 * 1024;
	const int victim = redis_fixture_owner(&fx, 0, 16000);
	struct remote *r = remote_on(&fx, 3, &(struct opts){ .payload = payload,
							      .store_timeout_ms = 400 });
	struct test_block t[10] = { 0 };
	struct remote_job jobs[10];
	struct reaped rp = { .n = 0 };
	unsigned blk = 300, cancelled = 0;
	struct freed fr = { .rp.n = 0, .r = r };
	uint64_t t0;

	store_blocks(r, block_on(0, 7, victim, true), 1, 7, payload);
	for (unsigned i = 0; i < 10; i++) {
		blk = block_on(blk + 1, 7, victim, true);
		make_block(&t[i], blk, 7, payload, true);
		job_init(&jobs[i], REMOTE_STORE, &t[i].b, 1);
	}
	kill(fx.s[victim].pid, SIGSTOP); /* about 450 ms: under cluster-node-timeout */
	for (unsigned i = 0; i < 10; i++) {
		ck_assert_int_eq(remote_store(r, &jobs[i]), 0);
		if (i == 0)
			fixture_msleep(50); /* the thread took job 0 and waits on the victim */
	}
	t0 = fixture_now_ms();
	remote_free(r, on_freed, &fr);
	ck_assert_uint_lt(fixture_now_ms() - t0, 400 + 300);
	kill(fx.s[victim].pid, SIGCONT);
	rp = fr.rp;
	ck_assert_uint_eq(rp.n, 10);
	for (unsigned i = 0; i < 10; i++) {
		enum remote_status s = t[i].b.status;

		ck_assert_msg(s != REMOTE_PENDING, "job %u came back pending", i);
		cancelled += s == REMOTE_CANCELLED;
		free(t[i].data);
	}
	/* Job 0 ran (late: the victim never answered); the nine queued behind it were not. */
	ck_assert_int_eq(t[0].b.status, REMOTE_LATE);
	ck_assert_uint_eq(cancelled, 9);
	/* All counted: the late one and the cancelled ones failed; none in a fetch's misses. */
	ck_assert_uint_eq(fr.st.stores_ok, 1);
	ck_assert_uint_eq(fr.st.stores_failed, 10);
	ck_assert_uint_eq(fr.st.misses[REMOTE_CANCELLED], 0);
	ck_assert_uint_eq(fr.st.inflight, 0);
}
END_TEST

/* n block numbers from start (salt) whose Redis keys the master victim owns (or not). */
static unsigned blocks_on(unsigned start, unsigned salt, int victim, bool on, unsigned *nums,
			  size_t n)
{
	for (size_t i = 0; i < n; i++)
		start = nums[i] = block_on(start + 1, salt, victim, on);
	return start;
}

static void job_of(struct remote_job *j, enum remote_kind kind, struct test_block *t,
		   struct remote_block *b, const unsigned *nums, size_t n, unsigned salt,
		   uint64_t payload)
{
	for (size_t i = 0; i < n; i++) {
		make_block(&t[i], nums[i], salt, payload, kind == REMOTE_STORE);
		b[i] = t[i].b;
	}
	job_init(j, kind, b, n);
}

static void free_blocks(struct test_block *t, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(t[i].data);
		t[i].data = NULL;
	}
}

/*
 * Two fetches taken in one round keep their own deadlines.  A store on a stopped master holds
 * the thread (until its store deadline, 250 ms), so fetch A (at 20 ms) and fetch B (at 200 ms),
 * each with a block on the stopped master and one elsewhere, are taken together.  At A's
 * deadline (620 ms) A's block there is late; the master is resumed at 660 ms, before B's
 * deadline (800 ms): B's block there is asked again and hits, it is not cut short at A's.
 * Fetch C (at 100 ms), all on healthy masters, comes back as its blocks do, not at A's deadline.
 */
START_TEST(own_deadlines)
{
	const uint64_t payload = 64 * 1024;
	const int victim = redis_fixture_owner(&fx, 0, 4000);
	struct remote *r = remote_on(&fx, 3, &(struct opts){ .payload = payload, .timeout_ms = 600,
							      .store_timeout_ms = 250 });
	struct test_block ts[1] = { 0 }, ta[2] = { 0 }, tb[2] = { 0 }, tc[2] = { 0 };
	struct remote_block bs[1], ba[2], bb[2], bc[2];
	struct remote_job js, ja, jb, jc;
	struct reaped rp = { .n = 0 };
	unsigned ns[1], na[2], nb[2], nc[2], blk = 400;
	uint64_t t0;

	blk = blocks_on(blk, 9, victim, true, ns, 1);
	blk = blocks_on(blk, 9, victim, true, &na[0], 1);
	blk = blocks_on(blk, 9, victim, false, &na[1], 1);
	blk = blocks_on(blk, 9, victim, true, &nb[0], 1);
	blk = blocks_on(blk, 9, victim, false, &nb[1], 1);
	blocks_on(blk, 9, victim, false, nc, 2);
	for (unsigned i = 0; i < 2; i++) {
		store_blocks(r, na[i], 1, 9, payload);
		store_blocks(r, nb[i], 1, 9, payload);
		store_blocks(r, nc[i], 1, 9, payload);
	}
	job_of(&js, REMOTE_STORE, ts, bs, ns, 1, 9, payload);
	job_of(&ja, REMOTE_FETCH, ta, ba, na, 2, 9, payload);
	job_of(&jb, REMOTE_FETCH, tb, bb, nb, 2, 9, payload);
	job_of(&jc, REMOTE_FETCH, tc, bc, nc, 2, 9, payload);
	kill(fx.s[victim].pid, SIGSTOP); /* about 660 ms: under cluster-node-timeout */
	t0 = fixture_now_ms();
	ck_assert_int_eq(remote_store(r, &js), 0);
	sleep_until(t0 + 20);
	ck_assert_int_eq(remote_fetch(r, &ja), 0);
	sleep_until(t0 + 100);
	ck_assert_int_eq(remote_fetch(r, &jc), 0);
	sleep_until(t0 + 200);
	ck_assert_int_eq(remote_fetch(r, &jb), 0);
	sleep_until(t0 + 660);
	kill(fx.s[victim].pid, SIGCONT);
	wait_jobs(r, &rp, 4, 5000);
	ck_assert_int_eq(bs[0].status, REMOTE_LATE);
	ck_assert_msg(ba[0].status == REMOTE_LATE, "A on the stopped master: %s",
		      remote_status_name(ba[0].status));
	ck_assert_int_eq(ba[1].status, REMOTE_OK);
	ck_assert_msg(bb[0].status == REMOTE_OK, "B on the stopped master: %s",
		      remote_status_name(bb[0].status));
	ck_assert_int_eq(bb[1].status, REMOTE_OK);
	ck_assert_int_eq(bc[0].status, REMOTE_OK);
	ck_assert_int_eq(bc[1].status, REMOTE_OK);
	/* C came back when its blocks did (taken at 250 ms), not at A's deadline (620 ms). */
	ck_assert_msg(jc.latency_ns / 1000000 < 150 + 200, "C took %" PRIu64 " ms",
		      jc.latency_ns / 1000000);
	/* A came back at its own deadline, not later; B within its own. */
	ck_assert_uint_lt(ja.latency_ns / 1000000, 600 + 150);
	ck_assert_uint_lt(jb.latency_ns / 1000000, 600);
	free_blocks(ts, 1);
	free_blocks(ta, 2);
	free_blocks(tb, 2);
	free_blocks(tc, 2);
	remote_free(r, NULL, NULL);
}
END_TEST

/*
 * Many stores to a stopped master do not starve a fetch submitted after them: the stores'
 * deadline is one (250 ms) from their submit, not one per chunk of 16 (four chunks here: a
 * second), and the fetch goes between two chunks.  It hits within its own deadline (600 ms).
 */
START_TEST(stores_yield)
{
	const uint64_t payload = 64 * 1024;
	const int victim = redis_fixture_owner(&fx, 0, 12000);
	struct remote *r = remote_on(&fx, 3, &(struct opts){ .payload = payload, .timeout_ms = 600,
							      .store_timeout_ms = 250,
							      .inflight = 128 });
	struct test_block ts[64] = { 0 }, tf[1] = { 0 };
	struct remote_block bs[64], bf[1];
	struct remote_job js, jf;
	struct reaped rp = { .n = 0 };
	struct remote_stats st;
	unsigned ns[64], nf[1];

	blocks_on(500, 10, victim, true, ns, 64);
	blocks_on(500, 10, victim, false, nf, 1);
	store_blocks(r, ns[0], 1, 11, payload); /* the victim known to the client */
	store_blocks(r, nf[0], 1, 10, payload);
	job_of(&js, REMOTE_STORE, ts, bs, ns, 64, 10, payload);
	job_of(&jf, REMOTE_FETCH, tf, bf, nf, 1, 10, payload);
	kill(fx.s[victim].pid, SIGSTOP); /* about 300 ms */
	ck_assert_int_eq(remote_store(r, &js), 0);
	fixture_msleep(30); /* the thread is in the first chunk */
	ck_assert_int_eq(remote_fetch(r, &jf), 0);
	wait_jobs(r, &rp, 2, 5000);
	kill(fx.s[victim].pid, SIGCONT);
	ck_assert_msg(bf[0].status == REMOTE_OK, "the fetch: %s", remote_status_name(bf[0].status));
	ck_assert_uint_lt(jf.latency_ns / 1000000, 600);
	/* The store came back at its deadline: one, not a chunk's each. */
	ck_assert_uint_lt(js.latency_ns / 1000000, 250 + 300);
	for (unsigned i = 0; i < 64; i++)
		ck_assert_int_eq(bs[i].status, REMOTE_LATE);
	remote_get_stats(r, &st);
	ck_assert_uint_eq(st.stores_failed, 64);
	ck_assert_uint_eq(st.hits, 1);
	free_blocks(ts, 64);
	free_blocks(tf, 1);
	remote_free(r, NULL, NULL);
}
END_TEST

/*
 * remote_free between two chunks: a store on a stopped master (S0, 1 block) holds the thread
 * while S1 (16 blocks) and S2 (32) are queued; the thread takes both, and remote_free during
 * S1's chunk returns once it ends (S1's deadline), S2 never sent: cancelled and counted, not
 * two more chunks' waits.
 */
START_TEST(free_between_chunks)
{
	const uint64_t payload = 64 * 1024;
	const int victim = redis_fixture_owner(&fx, 0, 2000);
	struct remote *r = remote_on(&fx, 3, &(struct opts){ .payload = payload,
							      .store_timeout_ms = 300,
							      .inflight = 128 });
	struct test_block t0b[1] = { 0 }, t1b[16] = { 0 }, t2b[32] = { 0 };
	struct remote_block b0[1], b1[16], b2[32];
	struct remote_job j0, j1, j2;
	struct freed fr = { .rp.n = 0, .r = r };
	unsigned n0[1], n1[16], n2[32], blk = 700;
	uint64_t t0, t1, took;

	blk = blocks_on(blk, 12, victim, true, n0, 1);
	blk = blocks_on(blk, 12, victim, true, n1, 16);
	blocks_on(blk, 12, victim, true, n2, 32);
	store_blocks(r, n0[0], 1, 13, payload); /* the victim known to the client */
	job_of(&j0, REMOTE_STORE, t0b, b0, n0, 1, 12, payload);
	job_of(&j1, REMOTE_STORE, t1b, b1, n1, 16, 12, payload);
	job_of(&j2, REMOTE_STORE, t2b, b2, n2, 32, 12, payload);
	kill(fx.s[victim].pid, SIGSTOP); /* about 650 ms */
	t0 = fixture_now_ms();
	ck_assert_int_eq(remote_store(r, &j0), 0);
	sleep_until(t0 + 150);
	ck_assert_int_eq(remote_store(r, &j1), 0);
	ck_assert_int_eq(remote_store(r, &j2), 0);
	sleep_until(t0 + 350); /* S0 is back (300 ms); the thread is in S1's chunk (to 450 ms) */
	t1 = fixture_now_ms();
	remote_free(r, on_freed, &fr);
	took = fixture_now_ms() - t1;
	kill(fx.s[victim].pid, SIGCONT);
	/* S1's chunk ends at 450 ms; two more chunks of S2 would be 600 ms more. */
	ck_assert_msg(took < 100 + 400, "remote_free took %" PRIu64 " ms", took);
	ck_assert_uint_eq(fr.rp.n, 3);
	ck_assert_int_eq(b0[0].status, REMOTE_LATE);
	for (unsigned i = 0; i < 16; i++)
		ck_assert_int_eq(b1[i].status, REMOTE_LATE);
	for (unsigned i = 0; i < 32; i++)
		ck_assert_msg(b2[i].status == REMOTE_CANCELLED, "S2 block %u: %s", i,
			      remote_status_name(b2[i].status));
	ck_assert_uint_eq(fr.st.stores_failed, 1 + 16 + 32);
	ck_assert_uint_eq(fr.st.inflight, 0);
	free_blocks(t0b, 1);
	free_blocks(t1b, 16);
	free_blocks(t2b, 32);
}
END_TEST

/* A job larger than max_inflight can never fit: busy and counted, like a full queue. */
START_TEST(too_big)
{
	const uint64_t payload = 4096;
	struct remote *r = remote_on(&fx, 3, &(struct opts){ .payload = payload, .inflight = 4 });
	struct test_block t[5] = { 0 };
	struct remote_block b[5];
	struct remote_job j;
	struct remote_stats st;
	unsigned nums[5] = { 1, 2, 3, 4, 5 };

	job_of(&j, REMOTE_FETCH, t, b, nums, 5, 14, payload);
	ck_assert_int_eq(remote_fetch(r, &j), -EBUSY);
	for (unsigned i = 0; i < 5; i++)
		ck_assert_int_eq(b[i].status, REMOTE_BUSY);
	free_blocks(t, 5);
	job_of(&j, REMOTE_STORE, t, b, nums, 5, 14, payload);
	ck_assert_int_eq(remote_store(r, &j), -EBUSY);
	/* Four fit. */
	job_of(&j, REMOTE_FETCH, t, b, nums, 4, 14, payload);
	ck_assert_int_eq(remote_fetch(r, &j), 0);
	{
		struct pollfd p = { .fd = remote_fd(r), .events = POLLIN };
		struct reaped rp = { .n = 0 };
		struct test_block t1 = { .data = NULL };
		struct remote_job j1;

		/* Completed, not reaped: its blocks are still the caller's, and still count. */
		ck_assert_int_eq(poll(&p, 1, 5000), 1);
		remote_get_stats(r, &st);
		ck_assert_uint_eq(st.inflight, 4);
		make_block(&t1, 9, 14, payload, false);
		job_init(&j1, REMOTE_FETCH, &t1.b, 1);
		ck_assert_int_eq(remote_fetch(r, &j1), -EBUSY);
		free(t1.data);
		wait_jobs(r, &rp, 1, 5000);
		ck_assert_ptr_eq(rp.jobs[0], &j);
	}
	for (unsigned i = 0; i < 4; i++)
		ck_assert_int_eq(b[i].status, REMOTE_ABSENT);
	remote_get_stats(r, &st);
	ck_assert_uint_eq(st.fetches, 3);
	ck_assert_uint_eq(st.fetches_busy, 2);
	ck_assert_uint_eq(st.misses[REMOTE_BUSY], 6);
	ck_assert_uint_eq(st.stores_dropped, 5);
	ck_assert_uint_eq(st.inflight, 0);
	free_blocks(t, 5);
	remote_free(r, NULL, NULL);
}
END_TEST

/* ---- a standalone server ------------------------------------------------------------------- */

START_TEST(absent_then_up)
{
	const uint64_t payload = 4096;
	struct redis_fixture sf;
	struct remote *r;
	struct remote_stats st;
	bool ok = false;
	uint64_t t0;

	redis_fixture_absent(&sf);
	keys_up(&sf);
	r = remote_on(&sf, 1, &(struct opts){ .payload = payload });
	t0 = fixture_now_ms();
	ck_assert_int_eq(fetch_one(r, 1, 8, payload, NULL, NULL), REMOTE_DOWN);
	ck_assert_uint_lt(fixture_now_ms() - t0, 1000); /* at once, not at the deadline */
	remote_get_stats(r, &st);
	ck_assert_uint_eq(st.misses[REMOTE_DOWN], 1);
	ck_assert_uint_eq(st.nnodes, 1);
	ck_assert_int_eq(st.nodes[0].state, REDIS_NODE_DOWN);

	sf.s[0].pid = redis_spawn(&sf, sf.s[0].port, false);
	t0 = fixture_now_ms();
	while (!ok && fixture_now_ms() - t0 < 5000) {
		fixture_msleep(30);
		ok = fetch_one(r, 1, 8, payload, NULL, NULL) == REMOTE_ABSENT;
	}
	ck_assert_msg(ok, "not up 5 s after redis started");
	store_blocks(r, 1, 1, 8, payload);
	ck_assert_int_eq(fetch_one(r, 1, 8, payload, NULL, NULL), REMOTE_OK);
	remote_get_stats(r, &st);
	ck_assert_int_eq(st.nodes[0].state, REDIS_NODE_UP);
	remote_free(r, NULL, NULL);
	redis_fixture_stop(&sf);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("remote");
	TCase *offline = tcase_create("offline"), *cl, *solo;
	int r;

	tcase_add_test(offline, bad_setup);
	suite_add_tcase(s, offline);
	if (!redis_fixture_suite_ready(s, &r))
		return r;
	cl = redis_fixture_cluster_case(s, "cluster", cluster_up, cluster_down);
	tcase_add_test(cl, round_trip);
	tcase_add_test(cl, absent);
	tcase_add_test(cl, altered);
	tcase_add_test(cl, copied);
	tcase_add_test(cl, wrong_key);
	tcase_add_test(cl, queue_full);
	tcase_add_test(cl, deadline);
	tcase_add_test(cl, free_cancels);
	tcase_add_test(cl, own_deadlines);
	tcase_add_test(cl, stores_yield);
	tcase_add_test(cl, free_between_chunks);
	tcase_add_test(cl, too_big);
	solo = redis_fixture_case(s, "standalone", 60);
	tcase_add_test(solo, absent_then_up);
	return run_suite(s);
}

/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-bench seal: AES-256-GCM seal and open of remote-tier values on one core, beside
 * memcpy of the same bytes (the floor any copy into or out of the pool pays).
 *
 * kvpaged-bench redis: the remote tier's cluster client (daemon/tier/redis.c) beside plain
 * pipelined hiredis against the same cluster, GET and SET of one block size at queue depths
 * 1..64.  Both go in batches of the queue depth, one pipeline per node.
 *
 * kvpaged-bench remote: the same, through the remote tier's thread (sealing included).
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "daemon/tier/redis.h"
#include "daemon/tier/remote.h"
#include "daemon/tier/seal.h"
#include "tools/bench/bench.h"

static void seal_usage(FILE *f)
{
	fputs("usage: kvpaged-bench seal [--block-bytes N] [--blocks N] [--runs N] [--json]\n"
	      "\n"
	      "AES-256-GCM seal and open GB/s of remote-tier values (default 2 MiB of K/V, 16\n"
	      "tokens) on one core, beside memcpy of the same size; medians of --runs rounds over\n"
	      "--blocks distinct blocks (default 32: more than the caches).\n",
	      f);
}

static double gbps(uint64_t bytes, double ns)
{
	return ns > 0 ? (double)bytes / ns : 0;
}

int cmd_seal(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "block-bytes", required_argument, NULL, 'b' },
		{ "blocks", required_argument, NULL, 'n' },
		{ "runs", required_argument, NULL, 'r' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	uint32_t block_bytes = 2u << 20, nblocks = 32, runs = 7, *target;
	bool json = false;
	struct seal_geometry g = { .layers = 32, .kv_heads = 8, .head_dim = 128, .elem_bytes = 2,
				   .block_tokens = 16 };
	struct seal_identity id = { .ns = "bench", .ns_len = 5 };
	struct seal_keyring *ring = NULL;
	uint8_t key[SEAL_KEY_BYTES];
	uint32_t tokens[16];
	uint8_t *plain, *sealed, *out;
	uint64_t *t_seal, *t_open, *t_copy;
	char rkey[SEAL_REDIS_KEY_LEN + 1];
	size_t vlen;
	int opt;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		target = NULL;
		switch (opt) {
		case 'b': target = &block_bytes; break;
		case 'n': target = &nblocks; break;
		case 'r': target = &runs; break;
		case 'j': json = true; break;
		case 'h': seal_usage(stdout); return 0;
		default: seal_usage(stderr); return 2;
		}
		if (target && (parse_u32(optarg, target) < 0 || *target == 0)) {
			fprintf(stderr, "kvpaged-bench: %s: not a positive integer\n", optarg);
			return 2;
		}
	}
	if (optind != argc || block_bytes > (256u << 20) || nblocks > 4096 || runs > 1000 ||
	    (uint64_t)block_bytes * nblocks > (8ull << 30)) {
		seal_usage(stderr);
		return 2;
	}
	g.payload_bytes = block_bytes;
	for (int i = 0; i < SEAL_KEY_BYTES; i++)
		key[i] = (uint8_t)mix64((uint64_t)i);
	for (int i = 0; i < 16; i++)
		tokens[i] = token_of(1, (uint64_t)i);
	id.tokens = tokens;
	vlen = seal_size(&g, id.ns_len);
	plain = malloc((size_t)block_bytes * nblocks);
	sealed = malloc(vlen * nblocks);
	out = malloc((size_t)block_bytes * nblocks);
	t_seal = calloc(runs, sizeof(*t_seal));
	t_open = calloc(runs, sizeof(*t_open));
	t_copy = calloc(runs, sizeof(*t_copy));
	if (!plain || !sealed || !out || !t_seal || !t_open || !t_copy ||
	    seal_keyring_new(&ring) < 0 || seal_keyring_add(ring, key, 1, NULL) < 0 ||
	    seal_redis_key(ring, id.ns, id.ns_len, id.hash, rkey) < 0) {
		fprintf(stderr, "kvpaged-bench: seal: setup failed\n");
		return 1;
	}
	/* Touch everything first: page faults are not what is measured. */
	for (size_t i = 0; i < (size_t)block_bytes * nblocks; i++)
		plain[i] = (uint8_t)mix64(i);
	memset(sealed, 0, vlen * nblocks);
	memset(out, 0, (size_t)block_bytes * nblocks);

	for (uint32_t r = 0; r < runs; r++) {
		uint64_t t0 = now_ns();

		for (uint32_t b = 0; b < nblocks; b++)
			if (seal_seal(ring, &g, &id, plain + (size_t)b * block_bytes, rkey,
				      sealed + vlen * b) < 0) {
				fprintf(stderr, "kvpaged-bench: seal failed\n");
				return 1;
			}
		t_seal[r] = now_ns() - t0;
		t0 = now_ns();
		for (uint32_t b = 0; b < nblocks; b++) {
			enum seal_reason why;

			if (seal_open(ring, &g, &id, sealed + vlen * b, vlen, rkey,
				      out + (size_t)b * block_bytes, &why) < 0) {
				fprintf(stderr, "kvpaged-bench: open failed: %s\n",
					seal_reason_name(why));
				return 1;
			}
		}
		t_open[r] = now_ns() - t0;
		/* What open gave back is what was sealed (checked untimed, before memcpy's turn). */
		if (memcmp(out, plain, (size_t)block_bytes * nblocks)) {
			fprintf(stderr, "kvpaged-bench: seal: round trip differs\n");
			return 1;
		}
		memset(out, 0, (size_t)block_bytes * nblocks);
		t0 = now_ns();
		for (uint32_t b = 0; b < nblocks; b++)
			memcpy(out + (size_t)b * block_bytes, plain + (size_t)b * block_bytes,
			       block_bytes);
		t_copy[r] = now_ns() - t0;
	}
	uint64_t bytes = (uint64_t)block_bytes * nblocks;
	double s = gbps(bytes, median_u64(t_seal, runs)), o = gbps(bytes, median_u64(t_open, runs));
	double m = gbps(bytes, median_u64(t_copy, runs));

	if (json) {
		json_object *j = json_object_new_object();

		json_object_object_add(j, "bench", json_object_new_string("seal"));
		json_object_object_add(j, "block_bytes", json_object_new_int64(block_bytes));
		json_object_object_add(j, "blocks", json_object_new_int64(nblocks));
		json_object_object_add(j, "runs", json_object_new_int64(runs));
		json_object_object_add(j, "seal_gbps", json_object_new_double(s));
		json_object_object_add(j, "open_gbps", json_object_new_double(o));
		json_object_object_add(j, "memcpy_gbps", json_object_new_double(m));
		json_print(j);
	} else {
		printf("seal: %u blocks of %u bytes (+%zu sealed), median of %u rounds, one core\n",
		       nblocks, block_bytes, vlen - block_bytes, runs);
		printf("  AES-256-GCM seal  %7.2f GB/s  (%.2fx memcpy)\n", s, m > 0 ? s / m : 0);
		printf("  AES-256-GCM open  %7.2f GB/s  (%.2fx memcpy)\n", o, m > 0 ? o / m : 0);
		printf("  memcpy            %7.2f GB/s\n", m);
	}
	seal_keyring_free(ring);
	free(plain);
	free(sealed);
	free(out);
	free(t_seal);
	free(t_open);
	free(t_copy);
	return 0;
}

static void redis_usage(FILE *f)
{
	fputs("usage: kvpaged-bench redis --seeds redis://HOST:PORT[,...] [--block-bytes N]\n"
	      "                           [--depths 1,2,4,...] [--ops N] [--json]\n"
	      "\n"
	      "GET and SET GB/s of --block-bytes values (default 2 MiB) through the remote tier's\n"
	      "cluster client, beside plain pipelined hiredis (one blocking context per master) on\n"
	      "the same cluster, at each queue depth (default 1,2,4,8,16,32,64), --ops commands\n"
	      "each (default 256).  Writes keys bench:N into the cluster.\n",
	      f);
}

#define BENCH_KEYS 64
#define MAX_MASTERS 64

struct raw_nodes {
	redisContext *ctx[MAX_MASTERS];
	char addr[MAX_MASTERS][REDIS_HOST_MAX + 8];
	unsigned n;
	int of_key[BENCH_KEYS];
};

static int raw_connect(struct raw_nodes *rn, struct redis_cluster *c, char keys[][16])
{
	for (int k = 0; k < BENCH_KEYS; k++) {
		const char *a = redis_cluster_slot_addr(c, redis_key_slot(keys[k], strlen(keys[k])));
		unsigned i;

		if (!a)
			return -EHOSTUNREACH;
		for (i = 0; i < rn->n && strcmp(rn->addr[i], a); i++)
			;
		if (i == rn->n) {
			const char *colon = strrchr(a, ':');
			char host[REDIS_HOST_MAX];

			if (rn->n == MAX_MASTERS || !colon)
				return -E2BIG;
			snprintf(host, sizeof(host), "%.*s", (int)(colon - a), a);
			rn->ctx[i] = redisConnect(host, atoi(colon + 1));
			if (!rn->ctx[i] || rn->ctx[i]->err)
				return -ECONNREFUSED;
			snprintf(rn->addr[i], sizeof(rn->addr[i]), "%s", a);
			rn->n++;
		}
		rn->of_key[k] = (int)i;
	}
	return 0;
}

/* One batch of depth commands on the raw contexts: every node's pipeline written, then read. */
static int raw_batch(struct raw_nodes *rn, char keys[][16], uint32_t first, uint32_t depth,
		     bool set, const void *value, size_t len)
{
	unsigned count[MAX_MASTERS] = { 0 };

	for (uint32_t j = 0; j < depth; j++) {
		int k = (int)((first + j) % BENCH_KEYS), n = rn->of_key[k];
		const char *argv[3] = { set ? "SET" : "GET", keys[k], value };
		size_t argvlen[3] = { 3, strlen(keys[k]), len };

		if (redisAppendCommandArgv(rn->ctx[n], set ? 3 : 2, argv, argvlen) != REDIS_OK)
			return -ENOMEM;
		count[n]++;
	}
	for (unsigned n = 0; n < rn->n; n++) {
		int done = 0;

		while (count[n] && !done)
			if (redisBufferWrite(rn->ctx[n], &done) != REDIS_OK)
				return -EIO;
	}
	for (unsigned n = 0; n < rn->n; n++)
		while (count[n]--) {
			redisReply *r = NULL;

			if (redisGetReply(rn->ctx[n], (void **)&r) != REDIS_OK || !r ||
			    r->type == REDIS_REPLY_ERROR ||
			    (!set && (r->type != REDIS_REPLY_STRING || r->len != len))) {
				if (r)
					freeReplyObject(r);
				return -EPROTO;
			}
			freeReplyObject(r);
		}
	return 0;
}

/* Checks and frees each reply as it arrives, like the raw loop. */
static void client_done(struct redis_cmd *cmd, void *arg)
{
	size_t *bad = arg;

	if (cmd->status != REDIS_CMD_OK ||
	    (cmd->op == REDIS_GET && cmd->data_len != cmd->value_len))
		(*bad)++;
	redis_cmd_release(cmd);
}

static int client_batch(struct redis_cluster *c, struct redis_cmd *cmds, char keys[][16],
			uint32_t first, uint32_t depth, bool set, const void *value, size_t len)
{
	size_t bad = 0;

	for (uint32_t j = 0; j < depth; j++) {
		int k = (int)((first + j) % BENCH_KEYS);

		memset(&cmds[j], 0, sizeof(cmds[j]));
		cmds[j].op = set ? REDIS_SET : REDIS_GET;
		cmds[j].key = keys[k];
		cmds[j].key_len = strlen(keys[k]);
		cmds[j].value = value;
		cmds[j].value_len = len;
	}
	if (redis_cluster_run_cb(c, cmds, depth, 30000, client_done, &bad) < 0)
		return -ENOMEM;
	return bad ? -EPROTO : 0;
}

int cmd_redis(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "seeds", required_argument, NULL, 's' },
		{ "block-bytes", required_argument, NULL, 'b' },
		{ "depths", required_argument, NULL, 'd' },
		{ "ops", required_argument, NULL, 'o' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	uint32_t block_bytes = 2u << 20, ops = 256, depths[16] = { 1, 2, 4, 8, 16, 32, 64 }, *target;
	int ndepths = 7, opt, r;
	const char *url = NULL;
	bool json = false;
	struct redis_addr seeds[REDIS_MAX_SEEDS];
	struct redis_cluster *c = NULL;
	struct raw_nodes rn = { .n = 0 };
	static char keys[BENCH_KEYS][16];
	struct redis_cmd cmds[64];
	size_t nseeds;
	char err[256];
	uint8_t *value;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		target = NULL;
		switch (opt) {
		case 's': url = optarg; break;
		case 'b': target = &block_bytes; break;
		case 'o': target = &ops; break;
		case 'd':
			ndepths = parse_u32_list(optarg, depths, 16);
			if (ndepths < 0) {
				fprintf(stderr, "kvpaged-bench: --depths %s: not a list\n", optarg);
				return 2;
			}
			for (int i = 0; i < ndepths; i++)
				if (!depths[i] || depths[i] > 64) {
					fprintf(stderr, "kvpaged-bench: depths are 1 to 64\n");
					return 2;
				}
			break;
		case 'j': json = true; break;
		case 'h': redis_usage(stdout); return 0;
		default: redis_usage(stderr); return 2;
		}
		if (target && (parse_u32(optarg, target) < 0 || *target == 0)) {
			fprintf(stderr, "kvpaged-bench: %s: not a positive integer\n", optarg);
			return 2;
		}
	}
	if (optind != argc || !url || block_bytes > (64u << 20)) {
		redis_usage(stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN); /* a node that dies mid-run fails its commands (redis.h) */
	r = redis_parse_url(url, seeds, REDIS_MAX_SEEDS, &nseeds, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "kvpaged-bench: --seeds: %s\n", err);
		return 2;
	}
	if (redis_cluster_new(seeds, nseeds, NULL, &c) < 0 || redis_cluster_refresh(c, 5000) < 0) {
		fprintf(stderr, "kvpaged-bench: redis: no node of %s answers\n", url);
		return 1;
	}
	for (int k = 0; k < BENCH_KEYS; k++)
		snprintf(keys[k], sizeof(keys[k]), "bench:%d", k);
	value = malloc(block_bytes);
	if (!value || raw_connect(&rn, c, keys) < 0) {
		fprintf(stderr, "kvpaged-bench: redis: cannot connect to the masters\n");
		return 1;
	}
	for (uint32_t i = 0; i < block_bytes; i++)
		value[i] = (uint8_t)mix64(i);
	if (!json)
		printf("redis: %u-byte values, %u commands per depth, %u masters\n"
		       "  depth    SET client    SET hiredis   ratio    GET client    GET hiredis   ratio\n",
		       block_bytes, ops, rn.n);
	for (int d = 0; d < ndepths; d++) {
		uint32_t depth = depths[d], batches = (ops + depth - 1) / depth;
		double gb[4];

		for (int phase = 0; phase < 4; phase++) {
			bool set = phase < 2, raw = phase & 1;
			uint64_t t0 = now_ns();

			for (uint32_t b = 0; b < batches && r >= 0; b++)
				r = raw ? raw_batch(&rn, keys, b * depth, depth, set, value, block_bytes)
					: client_batch(c, cmds, keys, b * depth, depth, set, value,
						       block_bytes);
			if (r < 0) {
				fprintf(stderr, "kvpaged-bench: redis: depth %u %s %s failed: %s\n",
					depth, raw ? "hiredis" : "client", set ? "SET" : "GET",
					strerror(-r));
				return 1;
			}
			gb[phase] = gbps((uint64_t)batches * depth * block_bytes,
					 (double)(now_ns() - t0));
		}
		if (json) {
			json_object *j = json_object_new_object();

			json_object_object_add(j, "bench", json_object_new_string("redis"));
			json_object_object_add(j, "depth", json_object_new_int64(depth));
			json_object_object_add(j, "block_bytes", json_object_new_int64(block_bytes));
			json_object_object_add(j, "set_client_gbps", json_object_new_double(gb[0]));
			json_object_object_add(j, "set_hiredis_gbps", json_object_new_double(gb[1]));
			json_object_object_add(j, "get_client_gbps", json_object_new_double(gb[2]));
			json_object_object_add(j, "get_hiredis_gbps", json_object_new_double(gb[3]));
			json_print(j);
		} else {
			printf("  %5u  %7.2f GB/s   %7.2f GB/s  %5.0f%%  %7.2f GB/s   %7.2f GB/s  %5.0f%%\n",
			       depth, gb[0], gb[1], gb[1] > 0 ? 100 * gb[0] / gb[1] : 0, gb[2], gb[3],
			       gb[3] > 0 ? 100 * gb[2] / gb[3] : 0);
		}
	}
	for (unsigned n = 0; n < rn.n; n++)
		redisFree(rn.ctx[n]);
	redis_cluster_free(c);
	free(value);
	return 0;
}

/*
 * kvpaged-bench remote: the remote tier's thread (daemon/tier/remote.c, sealing and opening
 * included) beside plain pipelined hiredis of values of the same size, in the same run.  Each
 * depth is one job of depth blocks submitted, waited for on the eventfd and reaped, then the
 * next: the same batch-at-a-time shape as the hiredis loop.
 */
static void remote_usage(FILE *f)
{
	fputs("usage: kvpaged-bench remote --seeds redis://HOST:PORT[,...] --key-file PATH\n"
	      "                            [--block-bytes N] [--depths 1,2,4,...] [--ops N] [--json]\n"
	      "\n"
	      "Store and fetch GB/s of --block-bytes blocks (default 2 MiB of K/V) through the\n"
	      "remote tier's thread (sealed with AES-256-GCM, opened and verified), beside plain\n"
	      "pipelined hiredis SET and GET of values of the sealed size on the same cluster, at\n"
	      "each queue depth (default 1,2,4,8,16,32,64), --ops blocks each (default 256).\n"
	      "Writes keys bench:N and the tier's kvp: keys into the cluster.\n",
	      f);
}

#define RB_TOKENS 16

struct rb_blocks {
	struct remote_block b[BENCH_KEYS];
	uint32_t tokens[BENCH_KEYS][RB_TOKENS];
	uint8_t *dst[BENCH_KEYS];
};

static void rb_done(struct remote_job *job, void *arg)
{
	(void)job;
	++*(size_t *)arg;
}

/* One job of depth blocks (from first, mod BENCH_KEYS), waited for.  0, or -EPROTO on a miss. */
static int rb_batch(struct remote *r, struct rb_blocks *rb, const uint8_t *payload,
		    uint32_t first, uint32_t depth, bool store)
{
	struct remote_block blocks[64];
	struct remote_job job = { .kind = store ? REMOTE_STORE : REMOTE_FETCH,
				  .ns = "bench", .ns_len = 5, .blocks = blocks, .nblocks = depth };
	size_t done = 0;
	int e;

	for (uint32_t j = 0; j < depth; j++) {
		uint32_t k = (first + j) % BENCH_KEYS;

		blocks[j] = rb->b[k];
		/* Stores seal straight from one payload; fetches open into their own buffers. */
		blocks[j].data = store ? (void *)payload : rb->dst[j];
	}
	e = store ? remote_store(r, &job) : remote_fetch(r, &job);
	if (e < 0)
		return e;
	while (!done) {
		struct pollfd p = { .fd = remote_fd(r), .events = POLLIN };

		if (poll(&p, 1, -1) < 0 && errno != EINTR)
			return -errno;
		remote_reap(r, rb_done, &done);
	}
	for (uint32_t j = 0; j < depth; j++)
		if (blocks[j].status != REMOTE_OK) {
			fprintf(stderr, "kvpaged-bench: remote: %s of block %u: %s\n",
				store ? "store" : "fetch", (first + j) % BENCH_KEYS,
				remote_status_name(blocks[j].status));
			return -EPROTO;
		}
	return 0;
}

int cmd_remote(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "seeds", required_argument, NULL, 's' },
		{ "key-file", required_argument, NULL, 'k' },
		{ "block-bytes", required_argument, NULL, 'b' },
		{ "depths", required_argument, NULL, 'd' },
		{ "ops", required_argument, NULL, 'o' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	uint32_t block_bytes = 2u << 20, ops = 256, depths[16] = { 1, 2, 4, 8, 16, 32, 64 }, *target;
	int ndepths = 7, opt, r = 0;
	const char *url = NULL, *key_file = NULL;
	bool json = false;
	struct redis_addr seeds[REDIS_MAX_SEEDS];
	struct redis_cluster *c = NULL;
	struct raw_nodes rn = { .n = 0 };
	static char keys[BENCH_KEYS][16];
	static struct rb_blocks rb;
	struct remote *rt = NULL;
	struct remote_config cfg = { 0 };
	size_t nseeds, sealed;
	char err[512];
	uint8_t *payload, *value;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		target = NULL;
		switch (opt) {
		case 's': url = optarg; break;
		case 'k': key_file = optarg; break;
		case 'b': target = &block_bytes; break;
		case 'o': target = &ops; break;
		case 'd':
			ndepths = parse_u32_list(optarg, depths, 16);
			if (ndepths < 0) {
				fprintf(stderr, "kvpaged-bench: --depths %s: not a list\n", optarg);
				return 2;
			}
			for (int i = 0; i < ndepths; i++)
				if (!depths[i] || depths[i] > 64) {
					fprintf(stderr, "kvpaged-bench: depths are 1 to 64\n");
					return 2;
				}
			break;
		case 'j': json = true; break;
		case 'h': remote_usage(stdout); return 0;
		default: remote_usage(stderr); return 2;
		}
		if (target && (parse_u32(optarg, target) < 0 || *target == 0)) {
			fprintf(stderr, "kvpaged-bench: %s: not a positive integer\n", optarg);
			return 2;
		}
	}
	if (optind != argc || !url || !key_file || block_bytes > (64u << 20)) {
		remote_usage(stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	cfg.url = url;
	cfg.key_file = key_file;
	cfg.geometry = (struct seal_geometry){ .layers = 1, .kv_heads = 1, .head_dim = 1,
					       .elem_bytes = 1, .block_tokens = RB_TOKENS,
					       .payload_bytes = block_bytes };
	cfg.timeout_ms = 30000; /* throughput, not deadlines: nothing may come back late */
	cfg.store_timeout_ms = 30000;
	cfg.max_inflight = 64;
	if (remote_new(&cfg, err, sizeof(err), &rt) < 0) {
		fprintf(stderr, "kvpaged-bench: remote: %s\n", err);
		return 1;
	}
	r = redis_parse_url(url, seeds, REDIS_MAX_SEEDS, &nseeds, err, sizeof(err));
	if (r < 0 || redis_cluster_new(seeds, nseeds, NULL, &c) < 0 ||
	    redis_cluster_refresh(c, 5000) < 0) {
		fprintf(stderr, "kvpaged-bench: remote: no node of %s answers\n", url);
		return 1;
	}
	for (int k = 0; k < BENCH_KEYS; k++)
		snprintf(keys[k], sizeof(keys[k]), "bench:%d", k);
	sealed = seal_size(&cfg.geometry, 5);
	payload = malloc(block_bytes);
	value = malloc(sealed);
	if (!payload || !value || raw_connect(&rn, c, keys) < 0) {
		fprintf(stderr, "kvpaged-bench: remote: cannot connect to the masters\n");
		return 1;
	}
	for (uint32_t i = 0; i < block_bytes; i++)
		payload[i] = (uint8_t)mix64(i);
	memcpy(value, payload, block_bytes < sealed ? block_bytes : sealed);
	for (int k = 0; k < BENCH_KEYS; k++) {
		uint64_t h = mix64((uint64_t)k + 1), g = mix64(h);

		memcpy(rb.b[k].hash, &h, 8);
		memcpy(rb.b[k].hash + 8, &g, 8);
		for (int t = 0; t < RB_TOKENS; t++)
			rb.tokens[k][t] = (uint32_t)(k * RB_TOKENS + t);
		rb.b[k].tokens = rb.tokens[k];
		rb.dst[k] = malloc(block_bytes);
		if (!rb.dst[k]) {
			fprintf(stderr, "kvpaged-bench: remote: out of memory\n");
			return 1;
		}
	}
	if (!json)
		printf("remote: %u-byte blocks (%zu sealed), %u blocks per depth, %u masters\n"
		       "  depth  store tier   SET hiredis  ratio   fetch tier   GET hiredis  ratio\n",
		       block_bytes, sealed, ops, rn.n);
	for (int d = 0; d < ndepths; d++) {
		uint32_t depth = depths[d], batches = (ops + depth - 1) / depth;
		double gb[4];

		for (int phase = 0; phase < 4; phase++) {
			bool set = phase < 2, raw = phase & 1;
			uint64_t t0 = now_ns();

			for (uint32_t b = 0; b < batches && r >= 0; b++)
				r = raw ? raw_batch(&rn, keys, b * depth, depth, set, value, sealed)
					: rb_batch(rt, &rb, payload, b * depth, depth, set);
			if (r < 0) {
				fprintf(stderr, "kvpaged-bench: remote: depth %u %s %s failed: %s\n",
					depth, raw ? "hiredis" : "tier", set ? "SET" : "GET",
					strerror(-r));
				return 1;
			}
			gb[phase] = gbps((uint64_t)batches * depth * block_bytes,
					 (double)(now_ns() - t0));
		}
		if (json) {
			json_object *j = json_object_new_object();

			json_object_object_add(j, "bench", json_object_new_string("remote"));
			json_object_object_add(j, "depth", json_object_new_int64(depth));
			json_object_object_add(j, "block_bytes", json_object_new_int64(block_bytes));
			json_object_object_add(j, "store_tier_gbps", json_object_new_double(gb[0]));
			json_object_object_add(j, "set_hiredis_gbps", json_object_new_double(gb[1]));
			json_object_object_add(j, "fetch_tier_gbps", json_object_new_double(gb[2]));
			json_object_object_add(j, "get_hiredis_gbps", json_object_new_double(gb[3]));
			json_print(j);
		} else {
			printf("  %5u  %6.2f GB/s  %6.2f GB/s  %4.0f%%  %6.2f GB/s  %6.2f GB/s  %4.0f%%\n",
			       depth, gb[0], gb[1], gb[1] > 0 ? 100 * gb[0] / gb[1] : 0, gb[2], gb[3],
			       gb[3] > 0 ? 100 * gb[2] / gb[3] : 0);
		}
	}
	for (unsigned n = 0; n < rn.n; n++)
		redisFree(rn.ctx[n]);
	redis_cluster_free(c);
	remote_free(rt, NULL, NULL);
	for (int k = 0; k < BENCH_KEYS; k++)
		free(rb.dst[k]);
	free(payload);
	free(value);
	return 0;
}

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

#define BENCH_KEYS 64
#define MAX_MASTERS 64
#define MAX_DEPTHS 16
#define MAX_ROUNDS 99

/* What kvpaged-bench redis and remote are told; only remote takes (and needs) --key-file. */
struct depth_args {
	const char *url, *key_file;
	uint32_t block_bytes, ops, rounds, depths[MAX_DEPTHS];
	int ndepths;
	bool json;
};

/*
 * Parses redis's arguments, or remote's (with_key_file), into a.  Returns whether the bench is
 * to run; if not, *ret_status is the exit status (0 after --help, 2 for a usage error).
 */
static bool depth_args_parse(int argc, char **argv, bool with_key_file, void (*usage)(FILE *f),
			     struct depth_args *a, int *ret_status)
{
	/* First, so that redis's table is the rest of remote's. */
	static const struct option opts[] = {
		{ "key-file", required_argument, NULL, 'k' },
		{ "seeds", required_argument, NULL, 's' },
		{ "block-bytes", required_argument, NULL, 'b' },
		{ "depths", required_argument, NULL, 'd' },
		{ "ops", required_argument, NULL, 'o' },
		{ "rounds", required_argument, NULL, 'r' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	uint32_t *target;
	int opt;

	*a = (struct depth_args){ .block_bytes = 2u << 20, .ops = 256, .rounds = 5,
				  .depths = { 1, 2, 4, 8, 16, 32, 64 }, .ndepths = 7 };
	optind = 1;
	while ((opt = getopt_long(argc, argv, "", with_key_file ? opts : opts + 1, NULL)) != -1) {
		target = NULL;
		switch (opt) {
		case 's': a->url = optarg; break;
		case 'k': a->key_file = optarg; break;
		case 'b': target = &a->block_bytes; break;
		case 'o': target = &a->ops; break;
		case 'r': target = &a->rounds; break;
		case 'd':
			a->ndepths = parse_u32_list(optarg, a->depths, MAX_DEPTHS);
			if (a->ndepths < 0) {
				fprintf(stderr, "kvpaged-bench: --depths %s: not a list\n", optarg);
				*ret_status = 2;
				return false;
			}
			for (int i = 0; i < a->ndepths; i++)
				if (!a->depths[i] || a->depths[i] > 64) {
					fprintf(stderr, "kvpaged-bench: depths are 1 to 64\n");
					*ret_status = 2;
					return false;
				}
			break;
		case 'j': a->json = true; break;
		case 'h': usage(stdout); *ret_status = 0; return false;
		default: usage(stderr); *ret_status = 2; return false;
		}
		if (target && (parse_u32(optarg, target) < 0 || *target == 0)) {
			fprintf(stderr, "kvpaged-bench: %s: not a positive integer\n", optarg);
			*ret_status = 2;
			return false;
		}
	}
	if (optind != argc || !a->url || (with_key_file && !a->key_file) ||
	    a->block_bytes > (64u << 20) || a->rounds > MAX_ROUNDS) {
		usage(stderr);
		*ret_status = 2;
		return false;
	}
	return true;
}

struct raw_nodes {
	redisContext *ctx[MAX_MASTERS];
	char addr[MAX_MASTERS][REDIS_HOST_MAX + 8];
	unsigned n;
	int of_key[BENCH_KEYS];
};

/*
 * The cluster a bench runs on: the remote tier's client, plain hiredis's contexts, the keys, and
 * the value hiredis sets.
 */
struct bench_cluster {
	struct redis_cluster *c;
	struct raw_nodes rn;
	char keys[BENCH_KEYS][16];
	const void *value;
	size_t value_len;
};

/*
 * Connects bc's cluster client to the cluster at url and names the keys; the masters' contexts
 * are raw_connect's.  Returns 0, or the exit status once it said why (bench names the bench).
 */
static int bench_cluster_open(struct bench_cluster *bc, const char *bench, const char *url)
{
	struct redis_addr seeds[REDIS_MAX_SEEDS];
	size_t nseeds;
	char err[256];

	bc->c = NULL;
	bc->rn.n = 0;
	if (redis_parse_url(url, seeds, REDIS_MAX_SEEDS, &nseeds, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvpaged-bench: --seeds: %s\n", err);
		return 2;
	}
	if (redis_cluster_new(seeds, nseeds, NULL, &bc->c) < 0 ||
	    redis_cluster_refresh(bc->c, 5000) < 0) {
		fprintf(stderr, "kvpaged-bench: %s: no node of %s answers\n", bench, url);
		return 1;
	}
	for (int k = 0; k < BENCH_KEYS; k++)
		snprintf(bc->keys[k], sizeof(bc->keys[k]), "bench:%d", k);
	return 0;
}

static void bench_cluster_close(struct bench_cluster *bc)
{
	for (unsigned n = 0; n < bc->rn.n; n++)
		redisFree(bc->rn.ctx[n]);
	redis_cluster_free(bc->c);
}

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

/*
 * A bench of one side of the remote tier beside plain hiredis, at each queue depth: four phases
 * (SET ours, SET hiredis, GET ours, GET hiredis; for remote, store and fetch are SET and GET).
 */
struct depth_bench {
	const char *name;	  /* the bench's, in messages and in JSON */
	const char *ours;	  /* what messages call the side beside hiredis */
	const char *json_keys[4]; /* each phase's GB/s */
	/* Our batch of depth commands or blocks from first (mod BENCH_KEYS): 0 or -errno. */
	int (*batch)(void *ctx, bool set, uint32_t first, uint32_t depth);
	/*
	 * The table's GB/s columns are this wide; the ratios two less, and the gap before
	 * hiredis's columns is four less (as the benches have always printed them).
	 */
	int width;
};

/*
 * Runs and prints every depth (a row, or a JSON object, each): ours with ctx, hiredis on bc.
 * 0, or 1 once it said why.
 */
static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median_double(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * Each depth: --rounds rounds of the four phases in turn (ours SET, hiredis SET, ours GET,
 * hiredis GET), so that ours and the baseline share the machine's moods; the medians of each
 * phase, their ratio, and the range of the rounds' own ratios.
 */
static int depth_bench_run(const struct depth_bench *b, void *ctx, struct bench_cluster *bc,
			   const struct depth_args *a)
{
	for (int d = 0; d < a->ndepths; d++) {
		uint32_t depth = a->depths[d], batches = (a->ops + depth - 1) / depth;
		double gb[4][MAX_ROUNDS], med[4], ratio[2][MAX_ROUNDS], lo[2], hi[2];

		for (uint32_t round = 0; round < a->rounds; round++)
			for (int phase = 0; phase < 4; phase++) {
				bool set = phase < 2, raw = phase & 1;
				uint64_t t0 = now_ns();
				int r = 0;

				for (uint32_t i = 0; i < batches && r >= 0; i++)
					r = raw ? raw_batch(&bc->rn, bc->keys, i * depth, depth, set,
							    bc->value, bc->value_len)
						: b->batch(ctx, set, i * depth, depth);
				if (r < 0) {
					fprintf(stderr, "kvpaged-bench: %s: depth %u %s %s failed: %s\n",
						b->name, depth, raw ? "hiredis" : b->ours,
						set ? "SET" : "GET", strerror(-r));
					return 1;
				}
				gb[phase][round] = gbps((uint64_t)batches * depth * a->block_bytes,
							(double)(now_ns() - t0));
			}
		for (int k = 0; k < 2; k++) {
			lo[k] = 1e300;
			hi[k] = 0;
			for (uint32_t round = 0; round < a->rounds; round++) {
				double x = gb[2 * k + 1][round] > 0
						   ? gb[2 * k][round] / gb[2 * k + 1][round]
						   : 0;

				ratio[k][round] = x;
				lo[k] = x < lo[k] ? x : lo[k];
				hi[k] = x > hi[k] ? x : hi[k];
			}
		}
		for (int phase = 0; phase < 4; phase++)
			med[phase] = median_double(gb[phase], a->rounds);
		if (a->json) {
			json_object *j = json_object_new_object();

			json_object_object_add(j, "bench", json_object_new_string(b->name));
			json_object_object_add(j, "depth", json_object_new_int64(depth));
			json_object_object_add(j, "block_bytes",
					       json_object_new_int64(a->block_bytes));
			json_object_object_add(j, "rounds", json_object_new_int64(a->rounds));
			for (int phase = 0; phase < 4; phase++)
				json_object_object_add(j, b->json_keys[phase],
						       json_object_new_double(med[phase]));
			json_object_object_add(j, "set_ratio_median",
					       json_object_new_double(median_double(ratio[0],
										    a->rounds)));
			json_object_object_add(j, "get_ratio_median",
					       json_object_new_double(median_double(ratio[1],
										    a->rounds)));
			json_print(j);
		} else {
			int w = b->width;

			printf("  %5u  %*.2f GB/s%*s%*.2f GB/s  %*.0f%% (%3.0f-%3.0f)  %*.2f GB/s%*s%*.2f GB/s  %*.0f%% (%3.0f-%3.0f)\n",
			       depth, w, med[0], w - 4, "", w, med[1], w - 2,
			       med[1] > 0 ? 100 * med[0] / med[1] : 0, 100 * lo[0], 100 * hi[0], w,
			       med[2], w - 4, "", w, med[3], w - 2,
			       med[3] > 0 ? 100 * med[2] / med[3] : 0, 100 * lo[1], 100 * hi[1]);
		}
	}
	return 0;
}

static void redis_usage(FILE *f)
{
	fputs("usage: kvpaged-bench redis --seeds redis://HOST:PORT[,...] [--block-bytes N]\n"
	      "                           [--depths 1,2,4,...] [--ops N] [--rounds N] [--json]\n"
	      "\n"
	      "GET and SET GB/s of --block-bytes values (default 2 MiB) through the remote tier's\n"
	      "cluster client, beside plain pipelined hiredis (one blocking context per master) on\n"
	      "the same cluster, at each queue depth (default 1,2,4,8,16,32,64), --ops commands\n"
	      "each (default 256), --rounds rounds of each in turn (default 5): medians.  Writes\n"
	      "keys bench:N into the cluster.\n",
	      f);
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

struct redis_bench {
	struct bench_cluster *bc;
	struct redis_cmd cmds[64];
};

static int redis_bench_batch(void *ctx, bool set, uint32_t first, uint32_t depth)
{
	struct redis_bench *x = ctx;

	return client_batch(x->bc->c, x->cmds, x->bc->keys, first, depth, set, x->bc->value,
			    x->bc->value_len);
}

static const struct depth_bench redis_depth_bench = {
	.name = "redis", .ours = "client",
	.json_keys = { "set_client_gbps", "set_hiredis_gbps",
		       "get_client_gbps", "get_hiredis_gbps" },
	.batch = redis_bench_batch, .width = 7,
};

int cmd_redis(int argc, char **argv)
{
	static struct bench_cluster bc;
	static struct redis_bench x = { .bc = &bc };
	struct depth_args a;
	uint8_t *value;
	int r;

	if (!depth_args_parse(argc, argv, false, redis_usage, &a, &r))
		return r;
	signal(SIGPIPE, SIG_IGN); /* a node that dies mid-run fails its commands (redis.h) */
	r = bench_cluster_open(&bc, "redis", a.url);
	if (r)
		return r;
	value = malloc(a.block_bytes);
	if (!value || raw_connect(&bc.rn, bc.c, bc.keys) < 0) {
		fprintf(stderr, "kvpaged-bench: redis: cannot connect to the masters\n");
		return 1;
	}
	for (uint32_t i = 0; i < a.block_bytes; i++)
		value[i] = (uint8_t)mix64(i);
	bc.value = value;
	bc.value_len = a.block_bytes;
	if (!a.json)
		printf("redis: %u-byte values, %u commands per depth, %u masters, medians of %u rounds\n"
		       "  (ratio: of the medians; in brackets, the lowest and highest of the rounds')\n"
		       "  depth    SET client    SET hiredis   ratio              GET client    GET hiredis   ratio\n",
		       a.block_bytes, a.ops, bc.rn.n, a.rounds);
	r = depth_bench_run(&redis_depth_bench, &x, &bc, &a);
	if (r)
		return r;
	bench_cluster_close(&bc);
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
	      "                            [--block-bytes N] [--depths 1,2,4,...] [--ops N]\n"
	      "                            [--rounds N] [--json]\n"
	      "\n"
	      "Store and fetch GB/s of --block-bytes blocks (default 2 MiB of K/V) through the\n"
	      "remote tier's thread (sealed with AES-256-GCM, opened and verified), beside plain\n"
	      "pipelined hiredis SET and GET of values of the sealed size on the same cluster, at\n"
	      "each queue depth (default 1,2,4,8,16,32,64), --ops blocks each (default 256),\n"
	      "--rounds rounds of each in turn (default 5): medians.  Writes keys bench:N and the\n"
	      "tier's kvp: keys into the cluster.\n",
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

struct remote_bench {
	struct remote *rt;
	struct rb_blocks rb;
	const uint8_t *payload; /* what the tier stores */
};

static int remote_bench_batch(void *ctx, bool set, uint32_t first, uint32_t depth)
{
	struct remote_bench *x = ctx;

	return rb_batch(x->rt, &x->rb, x->payload, first, depth, set);
}

static const struct depth_bench remote_depth_bench = {
	.name = "remote", .ours = "tier",
	.json_keys = { "store_tier_gbps", "set_hiredis_gbps",
		       "fetch_tier_gbps", "get_hiredis_gbps" },
	.batch = remote_bench_batch, .width = 6,
};

int cmd_remote(int argc, char **argv)
{
	static struct bench_cluster bc;
	static struct remote_bench x;
	struct rb_blocks *rb = &x.rb;
	struct remote_config cfg = { 0 };
	struct depth_args a;
	size_t sealed;
	char err[512];
	uint8_t *payload, *value;
	int r;

	if (!depth_args_parse(argc, argv, true, remote_usage, &a, &r))
		return r;
	signal(SIGPIPE, SIG_IGN);
	cfg.url = a.url;
	cfg.key_file = a.key_file;
	cfg.geometry = (struct seal_geometry){ .layers = 1, .kv_heads = 1, .head_dim = 1,
					       .elem_bytes = 1, .block_tokens = RB_TOKENS,
					       .payload_bytes = a.block_bytes };
	cfg.timeout_ms = 30000; /* throughput, not deadlines: nothing may come back late */
	cfg.store_timeout_ms = 30000;
	cfg.max_inflight = 64;
	if (remote_new(&cfg, err, sizeof(err), &x.rt) < 0) {
		fprintf(stderr, "kvpaged-bench: remote: %s\n", err);
		return 1;
	}
	/* remote_new took the same seeds: only the cluster not answering can fail here. */
	r = bench_cluster_open(&bc, "remote", a.url);
	if (r)
		return r;
	sealed = seal_size(&cfg.geometry, 5);
	payload = malloc(a.block_bytes);
	value = malloc(sealed);
	if (!payload || !value || raw_connect(&bc.rn, bc.c, bc.keys) < 0) {
		fprintf(stderr, "kvpaged-bench: remote: cannot connect to the masters\n");
		return 1;
	}
	for (uint32_t i = 0; i < a.block_bytes; i++)
		payload[i] = (uint8_t)mix64(i);
	memcpy(value, payload, a.block_bytes < sealed ? a.block_bytes : sealed);
	for (int k = 0; k < BENCH_KEYS; k++) {
		uint64_t h = mix64((uint64_t)k + 1), g = mix64(h);

		memcpy(rb->b[k].hash, &h, 8);
		memcpy(rb->b[k].hash + 8, &g, 8);
		for (int t = 0; t < RB_TOKENS; t++)
			rb->tokens[k][t] = (uint32_t)(k * RB_TOKENS + t);
		rb->b[k].tokens = rb->tokens[k];
		rb->dst[k] = malloc(a.block_bytes);
		if (!rb->dst[k]) {
			fprintf(stderr, "kvpaged-bench: remote: out of memory\n");
			return 1;
		}
	}
	x.payload = payload;
	bc.value = value; /* as long as the tier's sealed values */
	bc.value_len = sealed;
	if (!a.json)
		printf("remote: %u-byte blocks (%zu sealed), %u blocks per depth, %u masters, medians of %u rounds\n"
		       "  (ratio: of the medians; in brackets, the lowest and highest of the rounds')\n"
		       "  depth  store tier   SET hiredis  ratio             fetch tier   GET hiredis  ratio\n",
		       a.block_bytes, sealed, a.ops, bc.rn.n, a.rounds);
	r = depth_bench_run(&remote_depth_bench, &x, &bc, &a);
	if (r)
		return r;
	bench_cluster_close(&bc);
	remote_free(x.rt, NULL, NULL);
	for (int k = 0; k < BENCH_KEYS; k++)
		free(rb->dst[k]);
	free(payload);
	free(value);
	return 0;
}

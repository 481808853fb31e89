/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-bench stall: what a client's swaps cost everyone else.
 *
 * A loader process opens long prompts that the pool has pushed down to its tiers, one after
 * another, so that every open brings blocks back (and pushes others down).  Meanwhile a prober
 * times cheap round trips (a LOOKUP of one block) to the same daemon.  Swap-file reads: with
 * the daemon's deferred reads the prober is served while they are in flight; with
 * file_tier_blocking_reads = yes it waits behind each batch.  Host-tier copies: with
 * copy_thread = yes they run on the backend's helper thread while the prober is served; without
 * it the loop copies them itself.  Remote-tier fetches: a pool with a remote tier and no tier
 * below it forgets what it evicts, so each open fetches its blocks back from Redis on the tier's
 * thread while the prober is served.  Each pool named is measured in turn, in one run: the
 * prober alone first, then beside the loader.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "libclient/include/kvpaged.h"
#include "tools/bench/bench.h"
#include "tools/bench/hist.h"
#include "tools/bench/remote.h"

#define MAX_POOLS 8
#define STREAM_STALL (UINT64_C(5) << 56) /* | prompt: the loader's prompts */
#define STREAM_PROBE (UINT64_C(6) << 56)

struct stall_options {
	const char *socket;
	const char *admin; /* NULL: no remote-tier counters, no waiting for stores */
	const char *pools[MAX_POOLS];
	int npools;
	uint32_t blocks;  /* per prompt */
	uint32_t prompts; /* the loader cycles through these */
	uint32_t seconds; /* per phase */
	bool json;
};

/* What the loader did, sent up a pipe. */
struct loader_result {
	uint64_t opens, cached_tokens, ns;
	int error;
};

struct pool_result {
	const char *pool;
	uint32_t block_tokens;
	struct hist idle, busy;
	struct loader_result load;
	/* The remote tier's counters over the busy phase (remote.present: the pool has one). */
	struct admin_remote remote;
	uint64_t stores_dropped; /* while the prompts were cached: then opens miss */
};

static int connect_pool(const struct stall_options *o, const char *pool, const char *who,
			struct kvp_client **ret)
{
	struct kvp_connect_options co = { .size = sizeof(co), .socket_path = o->socket,
					  .pool = pool, .client_name = who };
	int r = kvp_connect(&co, ret);

	if (r < 0)
		fprintf(stderr, "kvpaged-bench stall: %s: cannot connect to pool '%s' at %s: %s\n",
			who, pool, o->socket, strerror(-r));
	return r;
}

static void prompt_tokens(uint32_t *t, uint32_t n, uint32_t k)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = token_of(STREAM_STALL | k, i);
}

/* Opens and closes prompt k: an open whose blocks are below the pool reads them back. */
static int open_close(struct kvp_client *c, const uint32_t *t, uint32_t n, bool commit,
		      uint32_t *ret_cached)
{
	uint64_t seq;
	int r = kvp_open(c, t, n, 0, 0, &seq, ret_cached, NULL);

	if (r < 0)
		return r;
	if (commit && (r = kvp_commit(c, seq, n, NULL)) < 0)
		return r;
	return kvp_close(c, seq);
}

/*
 * The loader: connects, says so down the pipe (a byte: the busy phase starts then), opens the
 * prompts in turn for the phase's seconds, then sends what it did.
 */
static void loader(const struct stall_options *o, const char *pool, uint32_t n, int fd)
{
	struct loader_result res = { 0 };
	struct kvp_client *c = NULL;
	uint32_t *t = malloc((size_t)n * sizeof(*t)), cached = 0;
	uint64_t start, stop_ns;
	char ready = 1;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	res.error = t ? connect_pool(o, pool, "stall-loader", &c) : -ENOMEM;
	if (write(fd, &ready, 1) != 1)
		_exit(1);
	start = now_ns();
	stop_ns = start + (uint64_t)o->seconds * 1000000000u;
	for (uint64_t k = 0; res.error == 0 && now_ns() < stop_ns; k++) {
		prompt_tokens(t, n, (uint32_t)(k % o->prompts));
		res.error = open_close(c, t, n, false, &cached);
		res.opens++;
		res.cached_tokens += cached;
	}
	res.ns = now_ns() - start;
	if (write(fd, &res, sizeof(res)) != sizeof(res))
		_exit(1);
	kvp_disconnect(c);
	free(t);
	_exit(0);
}

/*
 * Waits until the remote tier holds no job of the pool: the stores of the blocks just committed
 * have landed in Redis (or failed, counted), and the next commit's stores find room in the
 * queue instead of being dropped.
 */
static int remote_settle(const struct stall_options *o, const char *pool)
{
	uint64_t stop = now_ns() + (uint64_t)REMOTE_TIMEOUT_MS * 1000000u;
	struct admin_remote a;
	int r;

	for (;;) {
		r = admin_remote_query(o->admin, pool, &a);
		if (r < 0 || !a.present || a.inflight == 0)
			return r;
		if (now_ns() > stop) {
			fprintf(stderr, "kvpaged-bench stall: pool '%s': %u blocks still in flight "
					"to the remote tier after %d ms\n", pool, a.inflight,
				REMOTE_TIMEOUT_MS);
			return -ETIMEDOUT;
		}
		usleep(1000);
	}
}

/* Times LOOKUPs of one block until stop_ns. */
static int probe(struct kvp_client *c, const uint32_t *t, uint32_t n, uint64_t stop_ns,
		 struct hist *h)
{
	uint32_t cached;

	while (now_ns() < stop_ns) {
		uint64_t t0 = now_ns();
		int r = kvp_lookup(c, t, n, 0, 0, &cached);

		if (r < 0)
			return r;
		hist_add(h, now_ns() - t0);
	}
	return 0;
}

static int measure_pool(const struct stall_options *o, const char *pool, struct pool_result *res)
{
	struct kvp_client *c = NULL;
	struct admin_remote before = { 0 }, after = { 0 };
	uint32_t B, n, *t = NULL, probe_t[4096], cached;
	uint64_t stop;
	char ready;
	int fds[2], r, status;
	pid_t pid;

	r = connect_pool(o, pool, "stall-prober", &c);
	if (r < 0)
		return r;
	B = kvp_pool(c)->block_tokens;
	n = o->blocks * B;
	res->pool = pool;
	res->block_tokens = B;
	if (B > sizeof(probe_t) / sizeof(probe_t[0])) {
		fprintf(stderr, "kvpaged-bench stall: pool '%s': blocks of %u tokens are too long "
				"to probe\n", pool, B);
		r = -EINVAL;
		goto out;
	}
	for (uint32_t i = 0; i < B; i++)
		probe_t[i] = token_of(STREAM_PROBE, i);
	t = malloc((size_t)n * sizeof(*t));
	if (!t) {
		r = -ENOMEM;
		goto out;
	}
	if (o->admin && (r = admin_remote_query(o->admin, pool, &before)) < 0)
		goto out;
	/*
	 * Cache every prompt; the pool keeps only some of them, the rest go below (or, with a
	 * remote tier and nothing between, only to Redis, where every commit published them).
	 */
	for (uint32_t k = 0; k < o->prompts; k++) {
		prompt_tokens(t, n, k);
		r = open_close(c, t, n, true, &cached);
		if (r == 0 && before.present)
			r = remote_settle(o, pool);
		if (r < 0) {
			fprintf(stderr, "kvpaged-bench stall: pool '%s': caching prompt %u: %s\n",
				pool, k, strerror(-r));
			goto out;
		}
	}
	r = probe(c, probe_t, B, now_ns() + (uint64_t)o->seconds * 1000000000u, &res->idle);
	if (r == 0 && before.present) {
		r = admin_remote_query(o->admin, pool, &after);
		res->stores_dropped = after.stores_dropped - before.stores_dropped;
		before = after;
	}
	if (r < 0 || pipe(fds) < 0) {
		r = r < 0 ? r : -errno;
		goto out;
	}
	pid = fork();
	if (pid < 0) {
		r = -errno;
		close(fds[0]);
		close(fds[1]);
		goto out;
	}
	if (pid == 0) {
		close(fds[0]);
		loader(o, pool, n, fds[1]);
	}
	close(fds[1]);
	/* The busy phase starts once the loader is connected. */
	if (read(fds[0], &ready, 1) != 1)
		r = -EIO;
	stop = now_ns() + (uint64_t)o->seconds * 1000000000u;
	if (r == 0)
		r = probe(c, probe_t, B, stop, &res->busy);
	if (read(fds[0], &res->load, sizeof(res->load)) != sizeof(res->load))
		res->load.error = -EIO;
	close(fds[0]);
	waitpid(pid, &status, 0);
	if (r == 0 && before.present && (r = admin_remote_query(o->admin, pool, &after)) == 0) {
		res->remote = (struct admin_remote){
			.present = true,
			.fetches = after.fetches - before.fetches,
			.fetches_busy = after.fetches_busy - before.fetches_busy,
			.hits = after.hits - before.hits,
			.misses = after.misses - before.misses,
		};
	}
	if (r == 0 && res->load.error < 0) {
		fprintf(stderr, "kvpaged-bench stall: pool '%s': the loader failed: %s\n", pool,
			strerror(-res->load.error));
		r = res->load.error;
	}
out:
	free(t);
	kvp_disconnect(c);
	return r;
}

static double us(double ns)
{
	return ns / 1000.0;
}

static void report(const struct stall_options *o, const struct pool_result *r, int n)
{
	if (o->json) {
		json_object *top = json_object_new_object(), *arr = json_object_new_array();

		for (int i = 0; i < n; i++) {
			json_object *p = json_object_new_object();
			const struct loader_result *l = &r[i].load;

			json_object_object_add(p, "pool", json_object_new_string(r[i].pool));
			json_object_object_add(p, "idle_p50_us",
					       json_object_new_double(us(hist_quantile(&r[i].idle, 0.5))));
			json_object_object_add(p, "idle_p99_us",
					       json_object_new_double(us(hist_quantile(&r[i].idle, 0.99))));
			json_object_object_add(p, "idle_max_us",
					       json_object_new_double(us((double)r[i].idle.max_ns)));
			json_object_object_add(p, "busy_p50_us",
					       json_object_new_double(us(hist_quantile(&r[i].busy, 0.5))));
			json_object_object_add(p, "busy_p99_us",
					       json_object_new_double(us(hist_quantile(&r[i].busy, 0.99))));
			json_object_object_add(p, "busy_max_us",
					       json_object_new_double(us((double)r[i].busy.max_ns)));
			json_object_object_add(p, "probes", json_object_new_int64((int64_t)r[i].busy.count));
			json_object_object_add(p, "loader_opens_per_s",
					       json_object_new_double(l->ns ? l->opens * 1e9 / l->ns : 0));
			json_object_object_add(p, "loader_blocks_per_open",
					       json_object_new_double(l->opens ? (double)l->cached_tokens /
										 r[i].block_tokens / l->opens
									       : 0));
			if (r[i].remote.present) {
				const struct admin_remote *a = &r[i].remote;

				json_object_object_add(p, "remote_fetches",
						       json_object_new_int64((int64_t)a->fetches));
				json_object_object_add(p, "remote_fetches_busy",
						       json_object_new_int64((int64_t)a->fetches_busy));
				json_object_object_add(p, "remote_hits",
						       json_object_new_int64((int64_t)a->hits));
				json_object_object_add(p, "remote_misses",
						       json_object_new_int64((int64_t)a->misses));
				json_object_object_add(p, "remote_stores_dropped",
						       json_object_new_int64((int64_t)r[i].stores_dropped));
			}
			json_object_array_add(arr, p);
		}
		json_object_object_add(top, "blocks_per_prompt", json_object_new_int64(o->blocks));
		json_object_object_add(top, "prompts", json_object_new_int64(o->prompts));
		json_object_object_add(top, "seconds", json_object_new_int64(o->seconds));
		json_object_object_add(top, "pools", arr);
		json_print(top);
		return;
	}
	printf("stall: a LOOKUP round trip while another client opens %u-block prompts brought "
	       "back from the tiers (%u s per phase)\n", o->blocks, o->seconds);
	printf("%-16s %12s %12s %12s %12s %12s %10s %12s\n", "pool", "idle p50 us", "idle p99 us",
	       "busy p50 us", "busy p99 us", "busy max us", "opens/s", "blocks/open");
	for (int i = 0; i < n; i++) {
		const struct loader_result *l = &r[i].load;

		printf("%-16s %12.1f %12.1f %12.1f %12.1f %12.1f %10.1f %12.1f\n", r[i].pool,
		       us(hist_quantile(&r[i].idle, 0.5)), us(hist_quantile(&r[i].idle, 0.99)),
		       us(hist_quantile(&r[i].busy, 0.5)), us(hist_quantile(&r[i].busy, 0.99)),
		       us((double)r[i].busy.max_ns), l->ns ? l->opens * 1e9 / l->ns : 0,
		       l->opens ? (double)l->cached_tokens / r[i].block_tokens / l->opens : 0);
	}
	for (int i = 0; i < n; i++) {
		const struct admin_remote *a = &r[i].remote;

		if (!a->present)
			continue;
		printf("%-16s remote tier over the busy phase: %" PRIu64 " fetches (%" PRIu64
		       " refused busy), %" PRIu64 " blocks fetched, %" PRIu64 " missed; %" PRIu64
		       " stores dropped while caching\n", r[i].pool, a->fetches, a->fetches_busy,
		       a->hits, a->misses, r[i].stores_dropped);
	}
}

static void usage(FILE *f)
{
	fputs("usage: kvpaged-bench stall --daemon SOCKET --pool NAME[,NAME...] [--blocks N]\n"
	      "                           [--prompts K] [--seconds S] [--admin SOCKET] [--json]\n"
	      "  Each pool needs a tier below it and room for fewer than K prompts of N blocks, so\n"
	      "  that every open brings blocks back from the tiers (docs/bench.md).  With --admin,\n"
	      "  a pool's remote tier is waited for after each prompt is cached and its fetches\n"
	      "  over the busy phase are reported.\n",
	      f);
}

int cmd_stall(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "daemon", required_argument, NULL, 'd' }, { "pool", required_argument, NULL, 'p' },
		{ "blocks", required_argument, NULL, 'b' }, { "prompts", required_argument, NULL, 'k' },
		{ "seconds", required_argument, NULL, 's' }, { "json", no_argument, NULL, 'j' },
		{ "admin", required_argument, NULL, 'a' },   { "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	struct stall_options o = { .blocks = 32, .prompts = 4, .seconds = 5 };
	struct pool_result *res;
	char *pools = NULL, *save = NULL;
	int c, r = 0;

	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case 'd': o.socket = optarg; break;
		case 'a': o.admin = optarg; break;
		case 'p': pools = optarg; break;
		case 'b':
			if (parse_u32(optarg, &o.blocks) < 0 || o.blocks == 0)
				goto bad;
			break;
		case 'k':
			if (parse_u32(optarg, &o.prompts) < 0 || o.prompts < 2)
				goto bad;
			break;
		case 's':
			if (parse_u32(optarg, &o.seconds) < 0 || o.seconds == 0 || o.seconds > 3600)
				goto bad;
			break;
		case 'j': o.json = true; break;
		case 'h': usage(stdout); return 0;
		default: goto bad;
		}
	}
	if (!o.socket || !pools || optind != argc)
		goto bad;
	for (char *tok = strtok_r(pools, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (o.npools == MAX_POOLS)
			goto bad;
		o.pools[o.npools++] = tok;
	}
	if (o.npools == 0)
		goto bad;
	res = calloc((size_t)o.npools, sizeof(*res));
	if (!res)
		return 1;
	for (int i = 0; i < o.npools && r == 0; i++)
		r = measure_pool(&o, o.pools[i], &res[i]);
	if (r == 0)
		report(&o, res, o.npools);
	free(res);
	return r == 0 ? 0 : 1;
bad:
	usage(stderr);
	return 2;
}

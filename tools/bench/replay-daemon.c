/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-bench replay --daemon: the trace replayed through a running kvpaged by N client
 * processes.  Request i goes to client i % N; each client replays its requests in file order
 * exactly as replay_core() does in-process (open, commit, appends and commits, close), with the
 * same tokens.  The in-process replay at the pool's capacity runs first, in the same run, so the
 * hit fractions can be compared: they differ only by how the clients' requests interleave.
 *
 * With --daemon given more than once, the requests are dealt round-robin across the daemons
 * (nodes): client c connects to node c % nodes, so request i goes to node i % nodes, and each
 * node's hit fraction is printed after the total.  Nodes that share a remote tier hit on what
 * the others committed; the in-process replay then runs at the nodes' capacities summed.
 *
 * Free-running clients drift apart (one served faster than another gets hundreds of requests
 * ahead), and a request then no longer meets the prefixes its neighbours in the trace cached;
 * the clients report how far apart they got.  --ordered makes the opens happen in trace order.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tools/bench/bench.h"
#include "tools/bench/hist.h"
#include "tools/bench/remote.h"
#include "tools/bench/workload.h"

/* What a client sends back through its pipe. */
struct replay_part {
	int32_t error; /* 0, or the -errno that stopped the client */
	char why[160];
	uint32_t requests, rejected;
	uint64_t blocks, hit_blocks, hit_tokens;
	uint32_t max_lag; /* requests between the clients farthest apart, as this one saw it */
	uint64_t busy_ns; /* inside library calls */
	struct hist lat;  /* every call: open, commit, append, close */
};

/* Shared memory of the clients (MAP_SHARED before they are forked). */
struct replay_shared {
	uint64_t start_ns;  /* --speed: when the trace's first request is due */
	uint32_t next_open; /* --ordered: the request whose turn it is to open (a futex) */
	uint32_t failed;    /* a client gave up: nobody may wait for it */
	uint32_t pos[];     /* the request each client is at; UINT32_MAX once it is done */
};

#define POS_DONE UINT32_MAX

struct replay_ctx {
	const struct workload *w;
	const struct replay_daemon_options *o;
	struct remote_options ro;
	struct replay_shared *shared;
	uint32_t B;
	uint32_t nclients; /* over all nodes: o->clients · o->nodes */
};

static void futex_wake_all(uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* --ordered: waits until request i may open. */
static int wait_turn(struct replay_shared *sh, uint32_t i)
{
	uint64_t deadline = now_ns() + REMOTE_TIMEOUT_MS * UINT64_C(1000000);
	uint32_t v;

	while ((v = __atomic_load_n(&sh->next_open, __ATOMIC_ACQUIRE)) != i) {
		struct timespec ts = { .tv_sec = 1 };

		if (__atomic_load_n(&sh->failed, __ATOMIC_ACQUIRE))
			return -ECANCELED;
		if (now_ns() > deadline)
			return -ETIMEDOUT;
		/* Sleeps only while next_open is still v: whoever moves it wakes everyone. */
		syscall(SYS_futex, &sh->next_open, FUTEX_WAIT, v, &ts, NULL, 0);
	}
	return 0;
}

static void pass_turn(struct replay_shared *sh, uint32_t i)
{
	__atomic_store_n(&sh->next_open, i + 1, __ATOMIC_RELEASE);
	futex_wake_all(&sh->next_open);
}

/* Publishes where this client is; returns how far apart the clients still replaying are. */
static uint32_t publish_pos(struct replay_shared *sh, uint32_t clients, uint32_t idx, uint32_t i)
{
	uint32_t lo = i, hi = i;

	__atomic_store_n(&sh->pos[idx], i, __ATOMIC_RELAXED);
	for (uint32_t k = 0; k < clients; k++) {
		uint32_t p = __atomic_load_n(&sh->pos[k], __ATOMIC_RELAXED);

		if (p == POS_DONE)
			continue;
		lo = p < lo ? p : lo;
		hi = p > hi ? p : hi;
	}
	return hi - lo;
}

static void timed(struct replay_part *part, uint64_t t0)
{
	uint64_t ns = now_ns() - t0;

	hist_add(&part->lat, ns);
	part->busy_ns += ns;
}

/* A request the pool (or the session's quota, which is the pool's size) cannot hold. */
static bool rejected(int r)
{
	return r == -ENOSPC || r == -EDQUOT;
}

static int replay_requests(const struct replay_ctx *x, uint32_t idx, struct remote_conn *k,
			   uint32_t *prompt, struct replay_part *part, const char **what)
{
	const struct workload *w = x->w;
	int r = 0;

	for (uint32_t i = idx; i < w->nreqs; i += x->nclients) {
		const struct wreq *q = &w->reqs[i];
		uint32_t cached, lag;
		uint64_t seq, t;

		workload_prompt(w, i, prompt);
		part->requests++;
		lag = publish_pos(x->shared, x->nclients, idx, i);
		if (lag > part->max_lag)
			part->max_lag = lag;
		if (x->o->speed > 0) {
			/* Paced: the request's timestamp, scaled, from the run's start. */
			uint64_t due = x->shared->start_ns +
				       (uint64_t)((q->t - w->reqs[0].t) / x->o->speed * 1e9);
			struct timespec ts = { .tv_sec = (time_t)(due / 1000000000u),
					       .tv_nsec = (long)(due % 1000000000u) };

			*what = "waiting for its time";
			while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
				;
		}
		*what = "waiting for its turn";
		if (x->o->ordered) {
			r = wait_turn(x->shared, i);
			if (r < 0)
				return r;
		}
		*what = "open";
		t = now_ns();
		r = remote_open(k, prompt, q->input_len, &seq, &cached);
		timed(part, t);
		if (x->o->ordered)
			pass_turn(x->shared, i);
		if (rejected(r)) {
			part->rejected++;
			continue;
		}
		if (r < 0)
			return r;
		part->blocks += (q->input_len + x->B - 1) / x->B;
		part->hit_blocks += cached / x->B;
		part->hit_tokens += cached;
		/* The engine prefills the rest and commits it. */
		*what = "commit";
		t = now_ns();
		r = remote_commit(k, seq, q->input_len);
		timed(part, t);
		for (uint32_t n = 0; r >= 0 && !x->o->prompt_only && n < q->output_len; n++) {
			uint32_t tok = token_of(STREAM_OUTPUT | i, n);

			*what = "append";
			t = now_ns();
			r = remote_append(k, seq, &tok, 1);
			timed(part, t);
			if (r < 0)
				break;
			*what = "commit";
			t = now_ns();
			r = remote_commit(k, seq, q->input_len + n + 1);
			timed(part, t);
		}
		if (rejected(r)) {
			part->rejected++;
			r = 0;
		}
		if (r < 0)
			return r;
		*what = "close";
		t = now_ns();
		r = remote_close(k, seq);
		timed(part, t);
		if (r < 0)
			return r;
	}
	return 0;
}

static int replay_client(uint32_t idx, void *arg, struct worker_io *io)
{
	const struct replay_ctx *x = arg;
	struct remote_options ro = x->ro;
	struct replay_part *part = calloc(1, sizeof(*part));
	uint32_t *prompt = malloc(((size_t)x->w->max_tokens + 1) * sizeof(*prompt));
	const char *what = "connect";
	struct remote_conn k = { 0 };
	char who[32];
	int r;

	snprintf(who, sizeof(who), "client %u", idx);
	ro.socket = x->o->sockets[idx % x->o->nodes];
	r = part && prompt ? remote_connect(&k, &ro, who) : -ENOMEM;
	r = worker_ready(io, r);
	if (r < 0)
		return r;
	r = replay_requests(x, idx, &k, prompt, part, &what);
	__atomic_store_n(&x->shared->pos[idx], POS_DONE, __ATOMIC_RELAXED);
	if (r < 0) {
		/* Whoever waits for this client's turn must not wait forever. */
		__atomic_store_n(&x->shared->failed, 1, __ATOMIC_RELEASE);
		futex_wake_all(&x->shared->next_open);
		/* Ring completions carry an errno only; the socket calls say more. */
		part->error = r;
		snprintf(part->why, sizeof(part->why), "%s: %s", what,
			 !k.ring && *kvp_last_error(k.c) ? kvp_last_error(k.c) : strerror(-r));
	}
	remote_disconnect(&k);
	free(prompt);
	r = worker_send(io, part, sizeof(*part));
	free(part);
	return r;
}

/* What one node's clients did. */
struct node_result {
	uint32_t capacity;
	uint32_t requests, rejected;
	uint64_t blocks, hit_blocks;
};

/* The sum of what the clients did, as the in-process replay reports it. */
struct daemon_result {
	struct replay_result res;
	struct hist lat;
	uint32_t max_lag;
	bool have_admin;
	struct node_result node[REPLAY_MAX_NODES];
};

static double fraction(uint64_t hits, uint64_t blocks)
{
	return blocks ? (double)hits / (double)blocks : 0;
}

static int run_clients(struct replay_ctx *x, struct daemon_result *d)
{
	struct replay_part *part = malloc(sizeof(*part));
	struct workers ws;
	int r, failed = 0;

	if (!part)
		return -ENOMEM;
	r = workers_spawn(&ws, x->nclients, replay_client, x);
	if (r < 0) {
		fprintf(stderr, "kvpaged-bench: cannot start clients: %s\n", strerror(-r));
		free(part);
		return r;
	}
	/* Paced clients count from here (a little ahead: each must reach its first wait). */
	x->shared->start_ns = now_ns() + 20 * UINT64_C(1000000);
	r = workers_start(&ws);
	for (uint32_t i = 0; r == 0 && i < ws.n; i++) {
		struct node_result *node = &d->node[i % x->o->nodes];

		r = workers_collect(&ws, i, part, sizeof(*part));
		if (r < 0) {
			fprintf(stderr, "kvpaged-bench: client %u died\n", i);
			break;
		}
		if (part->error < 0) {
			part->why[sizeof(part->why) - 1] = '\0';
			fprintf(stderr, "kvpaged-bench: client %u: %s\n", i, part->why);
			failed = part->error;
		}
		node->requests += part->requests;
		node->rejected += part->rejected;
		node->blocks += part->blocks;
		node->hit_blocks += part->hit_blocks;
		d->res.requests += part->requests;
		d->res.rejected += part->rejected;
		d->res.blocks += part->blocks;
		d->res.hit_blocks += part->hit_blocks;
		d->res.hit_tokens += part->hit_tokens;
		d->res.core_ns += part->busy_ns;
		if (part->max_lag > d->max_lag)
			d->max_lag = part->max_lag;
		hist_merge(&d->lat, &part->lat);
	}
	d->res.ops = d->lat.count;
	d->res.wall_ns = now_ns() - ws.start_ns;
	if (workers_finish(&ws, r < 0) < 0 && r == 0 && failed == 0) {
		fprintf(stderr, "kvpaged-bench: a client failed\n");
		r = -ECHILD;
	}
	free(part);
	return r < 0 ? r : failed;
}

static void print_text(const struct replay_daemon_options *o, const struct replay_result *local,
		       const struct daemon_result *d)
{
	const struct replay_result *res = &d->res;
	double frac = res->blocks ? (double)res->hit_blocks / (double)res->blocks : 0;
	double lfrac = local->blocks ? (double)local->hit_blocks / (double)local->blocks : 0;
	char evicted[24] = "n/a";

	printf("%10s %6s %9s %8s %8s %9s %8s %9s %8s %8s %8s\n", "capacity", "B", "requests",
	       "blocks", "hits", "hit_frac", "evicted", "wall_ms", "ns/op", "p50_us", "p99_us");
	printf("%10u %6u %9u %8" PRIu64 " %8" PRIu64 " %9.4f %8" PRIu64 " %9.1f %8.1f %8s %8s"
	       "  in-process\n", local->capacity, local->block_tokens, local->requests,
	       local->blocks, local->hit_blocks, lfrac, local->evictions,
	       (double)local->wall_ns / 1e6,
	       local->ops ? (double)local->core_ns / (double)local->ops : 0, "-", "-");
	if (d->have_admin)
		snprintf(evicted, sizeof(evicted), "%" PRIu64, res->evictions);
	printf("%10u %6u %9u %8" PRIu64 " %8" PRIu64 " %9.4f %8s %9.1f %8.1f %8.2f %8.2f",
	       res->capacity, res->block_tokens, res->requests, res->blocks, res->hit_blocks, frac,
	       evicted, (double)res->wall_ns / 1e6,
	       res->ops ? (double)res->core_ns / (double)res->ops : 0,
	       hist_quantile(&d->lat, 0.50) / 1e3, hist_quantile(&d->lat, 0.99) / 1e3);
	if (o->nodes == 1)
		printf("  daemon, %u client%s, %s\n", o->clients, o->clients == 1 ? "" : "s",
		       o->ring ? "rings" : "socket");
	else
		printf("  %u daemons, %u client%s each, %s\n", o->nodes, o->clients,
		       o->clients == 1 ? "" : "s", o->ring ? "rings" : "socket");
	for (uint32_t n = 0; o->nodes > 1 && n < o->nodes; n++) {
		const struct node_result *node = &d->node[n];

		printf("%10u %6u %9u %8" PRIu64 " %8" PRIu64 " %9.4f %8s %9s %8s %8s %8s"
		       "  node %u, %s\n", node->capacity, res->block_tokens, node->requests,
		       node->blocks, node->hit_blocks, fraction(node->hit_blocks, node->blocks),
		       "-", "-", "-", "-", "-", n, o->sockets[n]);
	}
	if (local->rejected || res->rejected)
		printf("rejected (larger than the pool): %u in-process, %u daemon\n",
		       local->rejected, res->rejected);
	printf("hit_frac daemon - in-process: %+.4f; the clients were up to %u request%s apart%s\n",
	       frac - lfrac, d->max_lag, d->max_lag == 1 ? "" : "s",
	       o->ordered ? " (opens in trace order)" : "");
	if (local->belady_hit_fraction >= 0)
		printf("belady (offline optimum) at capacity %u: %.4f\n", local->capacity,
		       local->belady_hit_fraction);
	if (o->nodes > 1) {
		printf("hit_frac per node:");
		for (uint32_t n = 0; n < o->nodes; n++)
			printf(" %.4f", fraction(d->node[n].hit_blocks, d->node[n].blocks));
		printf("; total %.4f over %u nodes\n", frac, o->nodes);
	}
}

static void print_json(const struct replay_daemon_options *o, const struct replay_result *local,
		       const struct daemon_result *d)
{
	const struct replay_result *res = &d->res;
	double frac = res->blocks ? (double)res->hit_blocks / (double)res->blocks : 0;
	double lfrac = local->blocks ? (double)local->hit_blocks / (double)local->blocks : 0;
	json_object *j = json_object_new_object();

	json_object_object_add(j, "policy", json_object_new_string(
					   o->eviction == CORE_EVICT_VALUE ? "value" : "lru"));
	json_object_object_add(j, "speed", json_object_new_double(o->speed));
	json_object_object_add(j, "capacity_blocks", json_object_new_int64(res->capacity));
	json_object_object_add(j, "block_tokens", json_object_new_int64(res->block_tokens));
	json_object_object_add(j, "requests", json_object_new_int64(res->requests));
	json_object_object_add(j, "rejected", json_object_new_int64(res->rejected));
	json_object_object_add(j, "blocks", json_object_new_int64((int64_t)res->blocks));
	json_object_object_add(j, "hit_blocks", json_object_new_int64((int64_t)res->hit_blocks));
	json_object_object_add(j, "hit_tokens", json_object_new_int64((int64_t)res->hit_tokens));
	json_object_object_add(j, "hit_fraction", json_object_new_double(frac));
	/* Only the admin socket knows these; null says "not measured", never 0. */
	json_object_object_add(j, "evictions", d->have_admin ?
			       json_object_new_int64((int64_t)res->evictions) : NULL);
	json_object_object_add(j, "collisions", d->have_admin ?
			       json_object_new_int64((int64_t)res->collisions) : NULL);
	json_object_object_add(j, "ops", json_object_new_int64((int64_t)res->ops));
	json_object_object_add(j, "core_ms", json_object_new_double((double)res->core_ns / 1e6));
	json_object_object_add(j, "wall_ms", json_object_new_double((double)res->wall_ns / 1e6));
	json_object_object_add(j, "ns_per_op",
			       json_object_new_double(res->ops ? (double)res->core_ns /
								 (double)res->ops : 0));
	replay_json_belady(j, local);
	json_object_object_add(j, "clients", json_object_new_int64(o->clients));
	json_object_object_add(j, "transport", json_object_new_string(o->ring ? "ring" : "socket"));
	json_object_object_add(j, "ordered", json_object_new_boolean(o->ordered));
	json_object_object_add(j, "max_lag_requests", json_object_new_int64(d->max_lag));
	json_object_object_add(j, "p50_us",
			       json_object_new_double(hist_quantile(&d->lat, 0.50) / 1e3));
	json_object_object_add(j, "p99_us",
			       json_object_new_double(hist_quantile(&d->lat, 0.99) / 1e3));
	json_object_object_add(j, "inprocess_hit_blocks",
			       json_object_new_int64((int64_t)local->hit_blocks));
	json_object_object_add(j, "inprocess_hit_fraction", json_object_new_double(lfrac));
	json_object_object_add(j, "hit_fraction_diff", json_object_new_double(frac - lfrac));
	if (o->nodes > 1) {
		json_object *nodes = json_object_new_array();

		for (uint32_t n = 0; n < o->nodes; n++) {
			const struct node_result *node = &d->node[n];
			json_object *e = json_object_new_object();

			json_object_object_add(e, "socket", json_object_new_string(o->sockets[n]));
			json_object_object_add(e, "capacity_blocks",
					       json_object_new_int64(node->capacity));
			json_object_object_add(e, "requests", json_object_new_int64(node->requests));
			json_object_object_add(e, "rejected", json_object_new_int64(node->rejected));
			json_object_object_add(e, "blocks",
					       json_object_new_int64((int64_t)node->blocks));
			json_object_object_add(e, "hit_blocks",
					       json_object_new_int64((int64_t)node->hit_blocks));
			json_object_object_add(e, "hit_fraction", json_object_new_double(
					       fraction(node->hit_blocks, node->blocks)));
			json_object_array_add(nodes, e);
		}
		json_object_object_add(j, "nodes", nodes);
	}
	json_print(j);
}

int replay_daemon(const struct workload *w, uint32_t B, const struct replay_daemon_options *o)
{
	struct replay_ctx x = { .w = w, .o = o, .B = B };
	struct admin_pool before = { 0 }, after = { 0 };
	struct daemon_result *d = NULL;
	size_t shared_bytes;
	struct replay_result local;
	struct kvp_pool_info pool, pools[REPLAY_MAX_NODES];
	uint32_t capacity = 0;
	uint64_t max_op;
	char ns[64];
	int r;

	x.nclients = o->clients * o->nodes;
	shared_bytes = sizeof(struct replay_shared) + (size_t)x.nclients * sizeof(uint32_t);
	for (uint32_t n = 0; n < o->nodes; n++) {
		struct remote_conn probe;

		r = remote_connect(&probe, &(struct remote_options){ .socket = o->sockets[n] },
				   "replay");
		if (r < 0)
			return r;
		pools[n] = *kvp_pool(probe.c);
		remote_disconnect(&probe);
		if (pools[n].block_tokens != B) {
			fprintf(stderr, "kvpaged-bench: --block-tokens %u, but pool %s of %s has "
				"blocks of %u tokens\n", B, pools[n].name, o->sockets[n],
				pools[n].block_tokens);
			return -EINVAL;
		}
		/* Only a pool of the same name shares the remote tier's blocks. */
		if (strcmp(pools[n].name, pools[0].name))
			fprintf(stderr, "kvpaged-bench: note: pool %s of %s, pool %s of %s: they "
				"share no blocks\n", pools[0].name, o->sockets[0], pools[n].name,
				o->sockets[n]);
		if (pools[n].capacity_blocks > UINT32_MAX - capacity) {
			fprintf(stderr, "kvpaged-bench: the pools are too large together\n");
			return -EOVERFLOW;
		}
		capacity += pools[n].capacity_blocks;
	}
	pool = pools[0];

	/*
	 * A namespace of its own, shared by this run's clients: blocks cached by an earlier run
	 * (same tokens, same uid) must not count as hits.  They still fill the pool, as cached
	 * blocks the LRU reuses first.
	 */
	snprintf(ns, sizeof(ns), "kvpaged-bench-%ld-%" PRIu64, (long)getpid(), now_ns());
	x.ro = (struct remote_options){ .ns = ns, .ring = o->ring };
	if (o->ring) {
		/*
		 * One operation in flight: its tokens and its table, twice over, since the data
		 * area is a FIFO that does not split an operation across its end.
		 */
		x.ro.max_blocks = (uint32_t)(((uint64_t)w->max_tokens + B - 1) / B + 1);
		max_op = ((uint64_t)w->max_tokens + x.ro.max_blocks) * sizeof(uint32_t);
		if (2 * max_op > (1u << 30)) {
			fprintf(stderr, "kvpaged-bench: requests too long for the rings\n");
			return -E2BIG;
		}
		x.ro.ring_entries = 64;
		x.ro.ring_data_bytes = pow2_at_least((uint32_t)(2 * max_op));
		if (x.ro.ring_data_bytes < 65536)
			x.ro.ring_data_bytes = 65536;
		x.ro.spin_us = o->spin_us;
	}

	/*
	 * The same replay in-process at the same capacity and eviction policy, for comparison in
	 * the same run; its clock is the trace's timestamps, the daemon's its own.
	 */
	r = replay_core_policy(w, B, capacity, 0, 0, o->prompt_only, o->eviction, &local);
	if (r == 0 && o->belady)
		r = replay_belady(w, B, capacity, o->prompt_only, &local);
	if (r < 0) {
		fprintf(stderr, "kvpaged-bench: in-process replay: %s\n", strerror(-r));
		return r;
	}
	d = calloc(1, sizeof(*d));
	x.shared = mmap(NULL, shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
			0);
	if (!d || x.shared == MAP_FAILED) {
		if (x.shared != MAP_FAILED)
			munmap(x.shared, shared_bytes);
		free(d);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < x.nclients; i++)
		x.shared->pos[i] = POS_DONE;
	d->res = (struct replay_result){ .capacity = capacity, .block_tokens = B,
					 .belady_hit_fraction = local.belady_hit_fraction };
	for (uint32_t n = 0; n < o->nodes; n++)
		d->node[n].capacity = pools[n].capacity_blocks;
	if (o->admin) {
		r = admin_pool_query(o->admin, pool.name, &before);
		if (r < 0)
			goto out;
		if (before.value != (o->eviction == CORE_EVICT_VALUE)) {
			fprintf(stderr, "kvpaged-bench: pool %s evicts by %s; the in-process replay "
				"would use %s (--policy %s)\n", pool.name,
				before.value ? "value" : "lru",
				o->eviction == CORE_EVICT_VALUE ? "value" : "lru",
				before.value ? "value" : "lru");
			r = -EINVAL;
			goto out;
		}
		if (before.cached || before.in_use)
			fprintf(stderr, "kvpaged-bench: note: pool %s held %u cached and %u in-use "
				"blocks at the start; evictions count their reuse too\n", pool.name,
				before.cached, before.in_use);
	}
	r = run_clients(&x, d);
	if (r < 0)
		goto out;
	if (o->admin) {
		r = admin_pool_query(o->admin, pool.name, &after);
		if (r < 0)
			goto out;
		d->have_admin = true;
		d->res.evictions = after.evictions - before.evictions;
		d->res.collisions = after.collisions - before.collisions;
		if (after.query_blocks - before.query_blocks != d->res.blocks ||
		    after.hit_blocks - before.hit_blocks != d->res.hit_blocks)
			fprintf(stderr, "kvpaged-bench: note: the daemon counted %" PRIu64
				" blocks and %" PRIu64 " hits in pool %s during the run, the "
				"clients %" PRIu64 " and %" PRIu64 ": someone else used the pool\n",
				after.query_blocks - before.query_blocks,
				after.hit_blocks - before.hit_blocks, pool.name, d->res.blocks,
				d->res.hit_blocks);
	}
	if (o->json) {
		print_json(o, &local, d);
	} else if (o->nodes == 1) {
		printf("daemon %s, pool %s: %u blocks of %u tokens; %u client%s through the %s; "
		       "eviction %s", o->sockets[0], pool.name, pool.capacity_blocks,
		       pool.block_tokens, o->clients, o->clients == 1 ? "" : "s",
		       o->ring ? "rings" : "socket", o->eviction == CORE_EVICT_VALUE ? "value" : "lru");
		if (o->speed > 0)
			printf(", paced at %gx the trace", o->speed);
		putchar('\n');
		print_text(o, &local, d);
	} else {
		for (uint32_t n = 0; n < o->nodes; n++)
			printf("node %u: daemon %s, pool %s: %u blocks of %u tokens\n", n,
			       o->sockets[n], pools[n].name, pools[n].capacity_blocks,
			       pools[n].block_tokens);
		printf("%u nodes, %u client%s each through the %s; requests dealt round-robin "
		       "across the nodes\n", o->nodes, o->clients, o->clients == 1 ? "" : "s",
		       o->ring ? "rings" : "socket");
		print_text(o, &local, d);
	}
out:
	munmap(x.shared, shared_bytes);
	free(d);
	return r;
}

/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-bench route: a trace replayed across N running daemons (nodes), each request sent
 * to a node by a router, every router in one run, beside the in-process replay of one node
 * holding all their capacity.
 *
 * The prefix router is written as llm-d's KV cache indexer works: it subscribes to every
 * node's event stream and keeps an index built only from what the events say.  Each
 * BlockStored's token ids are re-hashed by the router (a chain of XXH3-64 over each block's
 * tokens, seeded with the parent's hash), so the index knows nothing of the daemons' own
 * hashes but the map from them to its own, which BlockRemoved needs.  A request is hashed the
 * same way and scored per node by the blocks cached there consecutively from its first; the
 * longest wins, ties to the least loaded.  A node already past load_factor times the mean
 * (requests sent to it so far) is passed over, as a production router's load scorer would;
 * without that, a prefix every request shares sends them all to one node.
 *
 * Each router's run uses its own narrowed namespace (shared/route-NAME-PID), so one run's
 * cached blocks never serve another's (nor another invocation's), and the daemons' events_namespaces must list shared and its
 * narrowings.  Requests are replayed one after the other, prompts only (open, commit, close),
 * and the events are read between requests: the index lags the daemons by what their batching holds back
 * (events_batch_ms), as a router's does.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include <zmq.h>

#include "tools/bench/bench.h"
#include "tools/bench/remote.h"
#include "tools/bench/u64map.h"
#include "tools/bench/workload.h"
#include "tools/evdecode.h"

enum router { ROUTER_PREFIX, ROUTER_ROUND_ROBIN, ROUTER_RANDOM, ROUTER_FIRST_BLOCK, NROUTERS };

static const char *const router_names[NROUTERS] = {
	[ROUTER_PREFIX] = "prefix",
	[ROUTER_ROUND_ROBIN] = "round-robin",
	[ROUTER_RANDOM] = "random",
	[ROUTER_FIRST_BLOCK] = "first-block-hash",
};

/* A daemon block as the router knows it: its own hash, and at how many media it is. */
struct known {
	uint64_t rh;
	uint32_t media;
};

struct node {
	const char *socket, *events;
	struct remote_conn k;
	void *sub;
	struct u64map engine; /* the daemon's hash -> index in known */
	struct known *known;
	size_t nknown, cap_known;
	uint32_t requests;
	uint64_t blocks, hit_blocks;
};

struct route {
	struct node node[REPLAY_MAX_NODES];
	uint32_t nodes, B;
	struct u64map index; /* the router's block hash -> bitmask of nodes holding it */
	uint64_t events, batches, orphans, bad;
	void *zmq;
	double load_factor;
};

struct route_result {
	enum router router;
	double hit_fraction, imbalance, wall_s;
	uint64_t events, batches, orphans;
	uint32_t requests[REPLAY_MAX_NODES];
};

static uint32_t *index_slot(struct route *x, uint64_t rh)
{
	int inserted;
	uint32_t *v = u64map_get(&x->index, rh, &inserted);

	if (inserted)
		*v = 0;
	return v;
}

static uint32_t index_mask(const struct route *x, uint64_t rh)
{
	const uint32_t *v = u64map_find(&x->index, rh);

	return v ? *v : 0;
}

static uint64_t block_hash(const uint32_t *tokens, uint32_t n, uint64_t parent)
{
	return XXH3_64bits_withSeed(tokens, n * sizeof(*tokens), parent);
}

static struct known *known_of(struct node *nd, uint64_t eh, bool add)
{
	int inserted;
	uint32_t *v;

	if (!add) {
		const uint32_t *f = u64map_find(&nd->engine, eh);

		return f ? &nd->known[*f] : NULL;
	}
	v = u64map_get(&nd->engine, eh, &inserted);
	if (inserted) {
		if (nd->nknown == nd->cap_known) {
			nd->cap_known = nd->cap_known ? 2 * nd->cap_known : 4096;
			nd->known = realloc(nd->known, nd->cap_known * sizeof(*nd->known));
			if (!nd->known)
				abort();
		}
		nd->known[nd->nknown] = (struct known){ 0 };
		*v = (uint32_t)nd->nknown++;
	}
	return &nd->known[*v];
}

static void stored(struct route *x, uint32_t n, const msgpack_object *ev, const msgpack_object *t)
{
	const msgpack_object *hs = evd_field(ev, t, "block_hashes"),
			     *parent = evd_field(ev, t, "parent_block_hash"),
			     *toks = evd_field(ev, t, "token_ids"), *bs = evd_field(ev, t, "block_size");
	struct node *nd = &x->node[n];
	uint32_t size, tok[4096];
	uint64_t prev = 0;

	if (!hs || !toks || !bs || hs->type != MSGPACK_OBJECT_ARRAY ||
	    toks->type != MSGPACK_OBJECT_ARRAY || bs->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
	    bs->via.u64 == 0 || bs->via.u64 > 4096 ||
	    toks->via.array.size != hs->via.array.size * bs->via.u64) {
		x->bad++;
		return;
	}
	size = (uint32_t)bs->via.u64;
	if (parent && parent->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		const struct known *p = known_of(nd, parent->via.u64, false);

		if (!p) {
			x->orphans += hs->via.array.size; /* its chain is unknown here: unusable */
			return;
		}
		prev = p->rh;
	}
	for (uint32_t b = 0; b < hs->via.array.size; b++) {
		struct known *k;

		for (uint32_t i = 0; i < size; i++)
			tok[i] = (uint32_t)toks->via.array.ptr[b * size + i].via.u64;
		prev = block_hash(tok, size, prev);
		k = known_of(nd, hs->via.array.ptr[b].via.u64, true);
		k->rh = prev;
		k->media++;
		*index_slot(x, prev) |= 1u << n;
	}
}

static void removed(struct route *x, uint32_t n, const msgpack_object *ev, const msgpack_object *t)
{
	const msgpack_object *hs = evd_field(ev, t, "block_hashes");

	if (!hs || hs->type != MSGPACK_OBJECT_ARRAY) {
		x->bad++;
		return;
	}
	for (uint32_t b = 0; b < hs->via.array.size; b++) {
		struct known *k = known_of(&x->node[n], hs->via.array.ptr[b].via.u64, false);

		/* Unknown: a block of another run's namespace, or one announced before we came. */
		if (k && k->media && !--k->media)
			*index_slot(x, k->rh) &= ~(1u << n);
	}
}

static void cleared(struct route *x, uint32_t n)
{
	struct node *nd = &x->node[n];

	for (size_t i = 0; i < nd->nknown; i++)
		nd->known[i].media = 0;
	for (size_t j = 0; j <= x->index.mask; j++)
		if (x->index.used[j])
			x->index.vals[j] &= ~(1u << n);
}

static void apply_batch(struct route *x, uint32_t n, const void *payload, size_t len)
{
	msgpack_unpacked u;
	const msgpack_object *evs;

	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, payload, len, NULL) != MSGPACK_UNPACK_SUCCESS ||
	    !(evs = evd_events(&u.data))) {
		x->bad++;
		msgpack_unpacked_destroy(&u);
		return;
	}
	x->batches++;
	for (uint32_t i = 0; i < evs->via.array.size; i++) {
		const msgpack_object *ev = &evs->via.array.ptr[i], *t = evd_type(ev);

		x->events++;
		if (evd_is_str(t, "BlockStored"))
			stored(x, n, ev, t);
		else if (evd_is_str(t, "BlockRemoved"))
			removed(x, n, ev, t);
		else if (evd_is_str(t, "AllBlocksCleared"))
			cleared(x, n);
	}
	msgpack_unpacked_destroy(&u);
}

/*
 * Reads what the streams hold now, waiting up to wait_ms for the first message; apply false
 * reads and forgets (between runs).  Returns the batches read.
 */
static uint64_t drain(struct route *x, int wait_ms, bool apply)
{
	zmq_pollitem_t it[REPLAY_MAX_NODES];
	uint64_t got = 0;

	if (!x->node[0].sub)
		return 0; /* no router here reads the streams */
	for (uint32_t n = 0; n < x->nodes; n++)
		it[n] = (zmq_pollitem_t){ .socket = x->node[n].sub, .events = ZMQ_POLLIN };
	while (zmq_poll(it, (int)x->nodes, got ? 0 : wait_ms) > 0) {
		for (uint32_t n = 0; n < x->nodes; n++) {
			zmq_msg_t part[3];
			int nparts = 0, more = 1;

			if (!(it[n].revents & ZMQ_POLLIN))
				continue;
			while (more && nparts < 3) {
				size_t len = sizeof(more);

				zmq_msg_init(&part[nparts]);
				if (zmq_msg_recv(&part[nparts], x->node[n].sub, ZMQ_DONTWAIT) < 0) {
					zmq_msg_close(&part[nparts]);
					break;
				}
				zmq_getsockopt(x->node[n].sub, ZMQ_RCVMORE, &more, &len);
				nparts++;
			}
			if (nparts == 3 && !more && apply)
				apply_batch(x, n, zmq_msg_data(&part[2]), zmq_msg_size(&part[2]));
			else if (apply)
				x->bad++;
			got++;
			for (int i = 0; i < nparts; i++)
				zmq_msg_close(&part[i]);
		}
	}
	return got;
}

/* The router's hashes of a prompt's full blocks (at least the first, partial if need be). */
static uint32_t prompt_hashes(const uint32_t *p, uint32_t len, uint32_t B, uint64_t *out)
{
	uint32_t n = len / B;
	uint64_t prev = 0;

	if (!n) {
		out[0] = block_hash(p, len, 0);
		return 0;
	}
	for (uint32_t b = 0; b < n; b++)
		out[b] = prev = block_hash(p + (size_t)b * B, B, prev);
	return n;
}

static uint32_t pick_prefix(const struct route *x, const uint64_t *h, uint32_t nh, uint32_t sent)
{
	uint32_t score[REPLAY_MAX_NODES] = { 0 }, alive = (1u << x->nodes) - 1, best = UINT32_MAX;
	const double cap = ceil(x->load_factor * (double)(sent + 1) / x->nodes);

	for (uint32_t b = 0; b < nh && alive; b++) {
		alive &= index_mask(x, h[b]);
		for (uint32_t n = 0; n < x->nodes; n++)
			score[n] += (alive >> n) & 1;
	}
	for (uint32_t n = 0; n < x->nodes; n++) {
		const struct node *nd = &x->node[n];

		if (nd->requests + 1 > cap)
			continue;
		if (best == UINT32_MAX || score[n] > score[best] ||
		    (score[n] == score[best] && nd->requests < x->node[best].requests))
			best = n;
	}
	return best == UINT32_MAX ? 0 : best;
}

static uint32_t pick(struct route *x, enum router r, uint32_t i, const uint64_t *h, uint32_t nh,
		     uint64_t *rng)
{
	switch (r) {
	case ROUTER_PREFIX:
		return pick_prefix(x, h, nh, i);
	case ROUTER_ROUND_ROBIN:
		return i % x->nodes;
	case ROUTER_RANDOM:
		*rng ^= *rng << 13;
		*rng ^= *rng >> 7;
		*rng ^= *rng << 17;
		return (uint32_t)(*rng % x->nodes);
	default:
		return (uint32_t)(mix64(h[0]) % x->nodes);
	}
}

static void forget(struct route *x)
{
	for (size_t j = 0; j <= x->index.mask; j++)
		x->index.used[j] = 0;
	x->index.count = 0;
	for (uint32_t n = 0; n < x->nodes; n++) {
		struct node *nd = &x->node[n];

		memset(nd->engine.used, 0, nd->engine.mask + 1);
		nd->engine.count = 0;
		nd->nknown = 0;
		nd->requests = 0;
		nd->blocks = nd->hit_blocks = 0;
	}
	x->events = x->batches = x->orphans = x->bad = 0;
}

static int run(struct route *x, const struct workload *w, enum router r, struct route_result *res)
{
	uint32_t *prompt = malloc(w->max_tokens * sizeof(*prompt) + sizeof(*prompt));
	uint64_t *h = malloc((w->max_tokens / x->B + 2) * sizeof(*h)), rng = 0x9e3779b97f4a7c15;
	uint64_t blocks = 0, hits = 0, t0;
	char ns[64];
	int err = 0;

	if (!prompt || !h) {
		free(prompt);
		free(h);
		return -ENOMEM;
	}
	/* Its own namespace, this run's: another invocation's blocks never serve it either. */
	snprintf(ns, sizeof(ns), "route-%s-%d", router_names[r], (int)getpid());
	/* What the last run's blocks still say as they leave, read and forgotten. */
	while (drain(x, 200, false))
		;
	forget(x);
	for (uint32_t n = 0; n < x->nodes && !err; n++) {
		struct remote_options o = { .socket = x->node[n].socket, .ns = ns };

		err = remote_connect(&x->node[n].k, &o, "route");
		for (uint32_t m = 0; err && m < n; m++)
			remote_disconnect(&x->node[m].k);
	}
	if (err)
		goto out;
	t0 = now_ns();
	for (uint32_t i = 0; i < w->nreqs && !err; i++) {
		const struct wreq *q = &w->reqs[i];
		uint32_t nh, n, cached = 0;
		struct node *nd;
		uint64_t seq;

		workload_prompt(w, i, prompt);
		nh = prompt_hashes(prompt, q->input_len, x->B, h);
		n = pick(x, r, i, h, nh, &rng);
		nd = &x->node[n];
		nd->requests++;
		err = remote_open(&nd->k, prompt, q->input_len, &seq, &cached);
		if (err == -ENOSPC || err == -E2BIG) {
			err = 0; /* did not fit: counted as a miss, as replay does */
			cached = 0;
		} else if (!err) {
			err = remote_commit(&nd->k, seq, q->input_len);
			if (!err)
				err = remote_close(&nd->k, seq);
		}
		if (err)
			fprintf(stderr, "kvpaged-bench route: request %u on %s: %s\n", i, nd->socket,
				strerror(-err));
		nd->blocks += (q->input_len + x->B - 1) / x->B;
		nd->hit_blocks += cached / x->B;
		blocks += (q->input_len + x->B - 1) / x->B;
		hits += cached / x->B;
		if (r == ROUTER_PREFIX)
			drain(x, 0, true);
	}
	res->wall_s = (double)(now_ns() - t0) / 1e9;
	res->router = r;
	res->hit_fraction = blocks ? (double)hits / (double)blocks : 0;
	res->events = x->events;
	res->batches = x->batches;
	res->orphans = x->orphans;
	{
		uint32_t max = 0;

		for (uint32_t n = 0; n < x->nodes; n++) {
			res->requests[n] = x->node[n].requests;
			if (x->node[n].requests > max)
				max = x->node[n].requests;
		}
		res->imbalance = w->nreqs ? (double)max * x->nodes / w->nreqs : 0;
	}
	for (uint32_t n = 0; n < x->nodes; n++)
		remote_disconnect(&x->node[n].k);
out:
	free(prompt);
	free(h);
	return err;
}

static void route_usage(FILE *f)
{
	fputs("usage: kvpaged-bench route --trace FILE --block-tokens N\n"
	      "                           --daemon SOCKET --events ENDPOINT [--daemon ... --events ...]\n"
	      "                           [--router prefix,round-robin,random,first-block-hash]\n"
	      "                           [--load-factor F] [--requests N] [--json]\n"
	      "\n"
	      "Replays the trace's prompts across the daemons (nodes), each request sent to a node\n"
	      "by each router in turn (a namespace of its own per router, shared/route-NAME-PID: the\n"
	      "pools need events_namespaces = shared/*), beside the in-process replay of one node\n"
	      "with all their capacity.  --events is each node's events_endpoint, in --daemon's\n"
	      "order; the prefix router builds its index only from them.  prefix: the node with\n"
	      "the longest cached prefix, ties to the least loaded, none past --load-factor times\n"
	      "the mean load (default 1.25); round-robin; random; first-block-hash: the first\n"
	      "block's hash modulo the nodes.  Prints per router the hit fraction, the load\n"
	      "imbalance (max/mean requests per node) and the events consumed.\n",
	      f);
}

static void print_results(const struct route *x, const struct workload *w, const char *trace,
			  uint32_t capacity, double single, const struct route_result *res,
			  uint32_t nres, bool json)
{
	if (json) {
		json_object *o = json_object_new_object(), *a = json_object_new_array();

		json_object_object_add(o, "trace", json_object_new_string(trace));
		json_object_object_add(o, "requests", json_object_new_int64(w->nreqs));
		json_object_object_add(o, "block_tokens", json_object_new_int64(x->B));
		json_object_object_add(o, "nodes", json_object_new_int64(x->nodes));
		json_object_object_add(o, "single_node_capacity", json_object_new_int64(capacity));
		json_object_object_add(o, "single_node_hit_fraction", json_object_new_double(single));
		for (uint32_t i = 0; i < nres; i++) {
			json_object *r = json_object_new_object(), *per = json_object_new_array();

			json_object_object_add(r, "router",
					       json_object_new_string(router_names[res[i].router]));
			json_object_object_add(r, "hit_fraction",
					       json_object_new_double(res[i].hit_fraction));
			json_object_object_add(r, "imbalance",
					       json_object_new_double(res[i].imbalance));
			json_object_object_add(r, "events", json_object_new_int64((int64_t)res[i].events));
			json_object_object_add(r, "batches",
					       json_object_new_int64((int64_t)res[i].batches));
			json_object_object_add(r, "orphans",
					       json_object_new_int64((int64_t)res[i].orphans));
			json_object_object_add(r, "wall_s", json_object_new_double(res[i].wall_s));
			for (uint32_t n = 0; n < x->nodes; n++)
				json_object_array_add(per, json_object_new_int64(res[i].requests[n]));
			json_object_object_add(r, "requests_per_node", per);
			json_object_array_add(a, r);
		}
		json_object_object_add(o, "routers", a);
		json_print(o);
		return;
	}
	printf("trace %s: %u requests, block %u tokens, %u nodes of %u blocks in all\n", trace,
	       w->nreqs, x->B, x->nodes, capacity);
	printf("%-18s %8s %10s %10s %8s  %s\n", "router", "hit", "imbalance", "events", "wall s",
	       "requests per node");
	printf("%-18s %8.4f %10s %10s %8s  (in-process, %u blocks)\n", "one node", single, "-",
	       "-", "-", capacity);
	for (uint32_t i = 0; i < nres; i++) {
		printf("%-18s %8.4f %10.3f %10" PRIu64 " %8.1f ", router_names[res[i].router],
		       res[i].hit_fraction, res[i].imbalance, res[i].events, res[i].wall_s);
		for (uint32_t n = 0; n < x->nodes; n++)
			printf(" %u", res[i].requests[n]);
		putchar('\n');
	}
}

int cmd_route(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "trace", required_argument, NULL, 't' },
		{ "block-tokens", required_argument, NULL, 'b' },
		{ "daemon", required_argument, NULL, 'd' },
		{ "events", required_argument, NULL, 'e' },
		{ "router", required_argument, NULL, 'r' },
		{ "load-factor", required_argument, NULL, 'l' },
		{ "requests", required_argument, NULL, 'n' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	static struct route x;
	struct route_result res[NROUTERS];
	const char *trace = NULL, *routers = "prefix,round-robin,random,first-block-hash";
	uint32_t nevents = 0, max_requests = 0, capacity = 0, nres = 0;
	struct replay_result single = { 0 };
	bool json = false, want[NROUTERS] = { false };
	struct workload w;
	int opt, r = 0;

	x.load_factor = 1.25;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 't':
			trace = optarg;
			break;
		case 'b':
			if (parse_u32(optarg, &x.B) < 0 || !x.B)
				return 2;
			break;
		case 'd':
			if (x.nodes == REPLAY_MAX_NODES) {
				fprintf(stderr, "kvpaged-bench route: at most %d --daemon\n",
					REPLAY_MAX_NODES);
				return 2;
			}
			x.node[x.nodes++].socket = optarg;
			break;
		case 'e':
			if (nevents == REPLAY_MAX_NODES)
				return 2;
			x.node[nevents++].events = optarg;
			break;
		case 'r':
			routers = optarg;
			break;
		case 'l':
			x.load_factor = strtod(optarg, NULL);
			if (!(x.load_factor >= 1)) {
				fprintf(stderr, "kvpaged-bench route: --load-factor is 1 or more\n");
				return 2;
			}
			break;
		case 'n':
			if (parse_u32(optarg, &max_requests) < 0)
				return 2;
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			route_usage(stdout);
			return 0;
		default:
			route_usage(stderr);
			return 2;
		}
	}
	for (const char *s = routers; *s;) {
		size_t len = strcspn(s, ",");
		int k = -1;

		for (int i = 0; i < NROUTERS; i++)
			if (strlen(router_names[i]) == len && !strncmp(s, router_names[i], len))
				k = i;
		if (k < 0) {
			fprintf(stderr, "kvpaged-bench route: unknown router '%.*s'\n", (int)len, s);
			return 2;
		}
		want[k] = true;
		s += len + (s[len] == ',');
	}
	if (!trace || !x.B || !x.nodes || optind != argc ||
	    (want[ROUTER_PREFIX] && nevents != x.nodes)) {
		if (want[ROUTER_PREFIX] && nevents != x.nodes)
			fprintf(stderr, "kvpaged-bench route: the prefix router needs one --events "
					"per --daemon, in the same order\n");
		route_usage(stderr);
		return 2;
	}
	if (workload_init(&w) < 0)
		return 1;
	r = workload_load_trace(trace, &w, max_requests);
	if (r < 0)
		goto out;
	/* The nodes' capacity and block size, from their pools. */
	for (uint32_t n = 0; n < x.nodes && r >= 0; n++) {
		struct remote_options o = { .socket = x.node[n].socket };
		struct remote_conn k;

		r = remote_connect(&k, &o, "route");
		if (r < 0)
			goto out;
		if (kvp_pool(k.c)->block_tokens != x.B) {
			fprintf(stderr, "kvpaged-bench route: %s has %u-token blocks, not %u\n",
				x.node[n].socket, kvp_pool(k.c)->block_tokens, x.B);
			r = -EINVAL;
		}
		capacity += kvp_pool(k.c)->capacity_blocks;
		remote_disconnect(&k);
	}
	if (r < 0)
		goto out;
	x.zmq = zmq_ctx_new();
	if (!x.zmq || u64map_init(&x.index, 1 << 16) < 0) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t n = 0; n < x.nodes; n++) {
		struct node *nd = &x.node[n];
		int linger = 0, hwm = 0; /* never drop: the router must see every event */

		if (u64map_init(&nd->engine, 1 << 14) < 0) {
			r = -ENOMEM;
			goto out;
		}
		if (!want[ROUTER_PREFIX])
			continue;
		nd->sub = zmq_socket(x.zmq, ZMQ_SUB);
		if (!nd->sub || zmq_setsockopt(nd->sub, ZMQ_LINGER, &linger, sizeof(linger)) < 0 ||
		    zmq_setsockopt(nd->sub, ZMQ_RCVHWM, &hwm, sizeof(hwm)) < 0 ||
		    zmq_setsockopt(nd->sub, ZMQ_SUBSCRIBE, "", 0) < 0 ||
		    zmq_connect(nd->sub, nd->events) < 0) {
			fprintf(stderr, "kvpaged-bench route: %s: %s\n", nd->events,
				zmq_strerror(errno));
			r = -EINVAL;
			goto out;
		}
	}
	r = replay_core(&w, x.B, capacity, true, &single);
	if (r < 0)
		goto out;
	if (want[ROUTER_PREFIX])
		drain(&x, 500, false); /* subscribed: what the streams sent before, forgotten */
	for (int k = 0; k < NROUTERS && r >= 0; k++)
		if (want[k])
			r = run(&x, &w, (enum router)k, &res[nres++]);
	if (r >= 0)
		print_results(&x, &w, trace, capacity,
			      single.blocks ? (double)single.hit_blocks / (double)single.blocks : 0,
			      res, nres, json);
out:
	for (uint32_t n = 0; n < x.nodes; n++) {
		if (x.node[n].sub)
			zmq_close(x.node[n].sub);
		if (x.node[n].engine.keys)
			u64map_free(&x.node[n].engine);
		free(x.node[n].known);
	}
	if (x.index.keys)
		u64map_free(&x.index);
	if (x.zmq)
		zmq_ctx_term(x.zmq);
	workload_free(&w);
	return r < 0 ? 1 : 0;
}

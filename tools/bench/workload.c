/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/core/core.h"
#include "tools/bench/workload.h"

int workload_init(struct workload *w)
{
	memset(w, 0, sizeof(*w));
	return u64map_init(&w->streams, 1024) < 0 ? -ENOMEM : 0;
}

void workload_free(struct workload *w)
{
	free(w->reqs);
	free(w->segs);
	free(w->arena);
	u64map_free(&w->streams);
	memset(w, 0, sizeof(*w));
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
	size_t n = *cap ? *cap : 256;
	void *q;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	q = realloc(*p, n * elem);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = n;
	return 0;
}

/* A stream's tokens are generated once, as long as its longest use. */
static int stream_tokens(struct workload *w, uint64_t stream, uint32_t len, uint32_t *ret_off)
{
	int inserted;
	uint32_t *off = u64map_get(&w->streams, stream, &inserted);

	if (!inserted) {
		/* Streams are prefixes: a longer use of a known stream is a bug in the input. */
		*ret_off = *off;
		return 0;
	}
	if (grow((void **)&w->arena, &w->arena_cap, w->arena_len + len, sizeof(uint32_t)) < 0)
		return -ENOMEM;
	if (w->arena_len + len > UINT32_MAX)
		return -E2BIG;
	*off = (uint32_t)w->arena_len;
	for (uint32_t i = 0; i < len; i++)
		w->arena[w->arena_len + i] = token_of(stream, i);
	w->arena_len += len;
	*ret_off = *off;
	return 0;
}

int workload_add(struct workload *w, const struct wseg *segs, uint32_t nseg, uint32_t output_len)
{
	size_t cap_r = w->cap_reqs, cap_s = w->cap_segs;
	uint64_t input = 0;
	int r;

	for (uint32_t i = 0; i < nseg; i++)
		input += segs[i].len;
	if (input == 0 || input + output_len > UINT32_MAX)
		return -EINVAL;
	if (grow((void **)&w->reqs, &cap_r, w->nreqs + 1, sizeof(*w->reqs)) < 0 ||
	    grow((void **)&w->segs, &cap_s, w->nsegs + nseg, sizeof(*w->segs)) < 0)
		return -ENOMEM;
	w->cap_reqs = (uint32_t)cap_r;
	w->cap_segs = (uint32_t)cap_s;
	for (uint32_t i = 0; i < nseg; i++) {
		struct wseg *s = &w->segs[w->nsegs + i];

		*s = segs[i];
		/* Every segment but the last is whole; the last may be cut short. */
		r = stream_tokens(w, s->stream, s->len, &s->arena_off);
		if (r < 0)
			return r;
	}
	w->reqs[w->nreqs] = (struct wreq){ .seg_off = w->nsegs, .nseg = nseg,
					   .input_len = (uint32_t)input, .output_len = output_len,
					   .t = w->nreqs };
	w->nreqs++;
	w->nsegs += nseg;
	if (input + output_len > w->max_tokens)
		w->max_tokens = (uint32_t)(input + output_len);
	return 0;
}

void workload_prompt(const struct workload *w, uint32_t r, uint32_t *out)
{
	const struct wreq *q = &w->reqs[r];

	for (uint32_t i = 0; i < q->nseg; i++) {
		const struct wseg *s = &w->segs[q->seg_off + i];

		memcpy(out, w->arena + s->arena_off, (size_t)s->len * sizeof(*out));
		out += s->len;
	}
}

uint64_t workload_prefix_key(const struct workload *w, uint32_t r, uint32_t pos)
{
	const struct wreq *q = &w->reqs[r];

	for (uint32_t i = 0; i < q->nseg; i++) {
		const struct wseg *s = &w->segs[q->seg_off + i];

		if (pos < s->len)
			return mix64(s->stream ^ mix64(pos));
		pos -= s->len;
	}
	return 0;
}

static int no_copy(void *ctx, uint32_t dst, uint32_t src)
{
	return 0; /* the replay measures bookkeeping; there is no KV memory behind it */
}

/* Tiers without bytes: the replay measures where hits come from, not the copies. */
static int no_store(void *ctx, uint32_t from_tier, uint32_t from, uint32_t to_tier, uint32_t to,
		    const struct core_key *key)
{
	return 0;
}

static void no_load(void *ctx, struct core_load *loads, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		loads[i].result = 0;
}

static const struct core_tier_ops no_tier_ops = { .store = no_store, .load = no_load };

int replay_core(const struct workload *w, uint32_t B, uint32_t capacity, bool prompt_only,
		struct replay_result *res)
{
	return replay_core_tiers(w, B, capacity, 0, 0, prompt_only, res);
}

int replay_core_tiers(const struct workload *w, uint32_t B, uint32_t capacity, uint32_t host,
		      uint32_t file, bool prompt_only, struct replay_result *res)
{
	return replay_core_policy(w, B, capacity, host, file, prompt_only, CORE_EVICT_LRU, res);
}

int replay_core_policy(const struct workload *w, uint32_t B, uint32_t capacity, uint32_t host,
		       uint32_t file, bool prompt_only, uint32_t eviction,
		       struct replay_result *res)
{
	struct core_config cfg = {
		.capacity_blocks = capacity,
		.block_tokens = B,
		.max_sequences = 4,
		.max_seq_tokens = w->max_tokens ? w->max_tokens : 1,
		.copy_block = no_copy,
		.eviction = eviction,
	};
	uint32_t level[REPLAY_LEVELS] = { 0 }; /* each one's level in the core; 0: none */
	uint64_t t_start = now_ns(), t;
	struct core_stats st;
	struct core *c;
	uint32_t *prompt;
	int r;

	/* The core lists only the levels there are. */
	if (host) {
		cfg.tiers[cfg.ntiers++] = (struct core_tier_config){ .slots = host,
								     .ops = &no_tier_ops };
		level[REPLAY_HOST] = cfg.ntiers;
	}
	if (file) {
		cfg.tiers[cfg.ntiers++] = (struct core_tier_config){ .slots = file,
								     .ops = &no_tier_ops };
		level[REPLAY_FILE] = cfg.ntiers;
	}
	r = core_new(&cfg, &c);
	if (r < 0)
		return r;
	prompt = malloc(((size_t)w->max_tokens + 1) * sizeof(*prompt));
	if (!prompt) {
		core_free(c);
		return -ENOMEM;
	}
	*res = (struct replay_result){ .capacity = capacity, .block_tokens = B,
				       .belady_hit_fraction = -1,
				       .tier_capacity = { capacity, host, file } };
	for (uint32_t i = 0; i < w->nreqs; i++) {
		const struct wreq *q = &w->reqs[i];
		struct core_open o = { .tokens = prompt, .ntokens = q->input_len };
		uint64_t seq;

		workload_prompt(w, i, prompt);
		t = now_ns();
		core_set_now(c, q->t);
		r = core_seq_open(c, &o, &seq, NULL);
		if (r == -ENOSPC) {
			res->rejected++;
			res->core_ns += now_ns() - t;
			continue;
		}
		if (r < 0)
			goto out;
		/* The engine prefills the rest and commits it. */
		r = core_seq_commit(c, seq, q->input_len);
		res->ops += 3;
		for (uint32_t k = 0; r >= 0 && !prompt_only && k < q->output_len; k++) {
			uint32_t tok = token_of(STREAM_OUTPUT | i, k);

			r = core_seq_append(c, seq, &tok, 1);
			if (r >= 0)
				r = core_seq_commit(c, seq, q->input_len + k + 1);
			res->ops += 2;
		}
		if (r == -ENOSPC) {
			res->rejected++;
			r = 0;
		}
		if (r < 0)
			goto out;
		r = core_seq_close(c, seq);
		res->core_ns += now_ns() - t;
		if (r < 0)
			goto out;
	}
	core_get_stats(c, &st);
	res->requests = w->nreqs;
	res->blocks = st.query_blocks;
	res->tier_hit_blocks[REPLAY_POOL] = st.hit_blocks;
	res->hit_blocks = st.hit_blocks;
	for (uint32_t k = REPLAY_HOST; k < REPLAY_LEVELS; k++) {
		struct core_tier_stats ts;

		if (!level[k] || core_get_tier_stats(c, level[k], &ts) < 0)
			continue;
		res->tier_hit_blocks[k] = ts.promotions;
		res->hit_blocks += ts.promotions;
	}
	res->hit_tokens = st.hit_tokens;
	res->evictions = st.evictions;
	res->collisions = st.collisions;
	res->wall_ns = now_ns() - t_start;
	r = 0;
out:
	free(prompt);
	core_free(c);
	return r;
}

void replay_infinite(const struct workload *w, uint32_t B, struct replay_result *res)
{
	struct u64map seen;
	uint64_t total = 0;

	for (uint32_t r = 0; r < w->nreqs; r++)
		total += w->reqs[r].input_len / B;
	if (u64map_init(&seen, total / 4 + 16) < 0)
		abort();
	res->blocks = res->hit_blocks = 0;
	for (uint32_t r = 0; r < w->nreqs; r++) {
		const struct wreq *q = &w->reqs[r];
		bool chain = true;

		res->blocks += (q->input_len + B - 1) / B;
		for (uint32_t j = 0; j < q->input_len / B; j++) {
			int ins;

			u64map_get(&seen, workload_prefix_key(w, r, (j + 1) * B - 1), &ins);
			chain = chain && !ins;
			res->hit_blocks += chain;
		}
	}
	u64map_free(&seen);
}

/* Belady: a max-heap of (next use, depth) with lazy deletion of stale entries. */
struct heap_ent {
	uint32_t next_use, depth, node;
};

struct bnode {
	uint32_t next_use;
	bool cached;
};

static bool heap_less(const struct heap_ent *a, const struct heap_ent *b)
{
	return a->next_use != b->next_use ? a->next_use < b->next_use : a->depth < b->depth;
}

struct heap {
	struct heap_ent *v;
	size_t n, cap;
};

static void heap_push(struct heap *h, struct heap_ent e)
{
	size_t i;

	if (h->n == h->cap) {
		h->cap = h->cap ? 2 * h->cap : 1024;
		h->v = realloc(h->v, h->cap * sizeof(*h->v));
		if (!h->v)
			abort();
	}
	for (i = h->n++; i > 0 && heap_less(&h->v[(i - 1) / 2], &e); i = (i - 1) / 2)
		h->v[i] = h->v[(i - 1) / 2];
	h->v[i] = e;
}

static struct heap_ent heap_pop(struct heap *h)
{
	struct heap_ent top = h->v[0], last = h->v[--h->n];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= h->n)
			break;
		if (c + 1 < h->n && heap_less(&h->v[c], &h->v[c + 1]))
			c++;
		if (!heap_less(&last, &h->v[c]))
			break;
		h->v[i] = h->v[c];
		i = c;
	}
	if (h->n)
		h->v[i] = last;
	return top;
}

#define NEVER UINT32_MAX

struct belady {
	struct bnode *nodes;
	struct heap heap;
	uint32_t cached; /* cached blocks, the current request's hits among them */
};

/*
 * Evicts what is used farthest in the future until at most target blocks are cached, never a
 * block request r uses (its hits, pinned while it runs, as in the live pool).
 */
static void belady_evict(struct belady *b, uint32_t r, uint32_t target)
{
	while (b->cached > target && b->heap.n) {
		struct heap_ent e = heap_pop(&b->heap);
		struct bnode *n = &b->nodes[e.node];

		if (!n->cached || n->next_use != e.next_use)
			continue; /* stale */
		if (e.next_use == r) {
			heap_push(&b->heap, e); /* only this request's blocks are left */
			break;
		}
		n->cached = false;
		b->cached--;
	}
}

/*
 * Each request is admitted and rejected by the live replay's rule (replay_core_tiers): its open
 * needs the prompt's blocks beyond its hits, and fails, counting nothing, when even an empty
 * pool could not hold them (ENOSPC before anything is taken).  Once open, its hits and blocks
 * count; the output, appended a token at a time, needs the rest of its blocks, and where they do
 * not fit the request stops there (rejected, its hits kept), after the pool gave up every
 * cached block trying.  Either way its committed prompt blocks stay cached.  Only which cached
 * block goes first differs from the live pool.
 */
int replay_belady(const struct workload *w, uint32_t B, uint32_t capacity, bool prompt_only,
		  struct replay_result *res)
{
	uint64_t total_full = 0, hits = 0, blocks = 0;
	uint32_t *node_of, *next_use, *first, rejected = 0;
	struct u64map ids, last_use;
	struct belady b = { 0 };
	uint32_t nnodes = 0;

	/* Node per distinct full-block prefix; next use of every (request, block) access. */
	first = malloc(((size_t)w->nreqs + 1) * sizeof(*first));
	if (!first)
		return -ENOMEM;
	for (uint32_t r = 0; r < w->nreqs; r++) {
		first[r] = (uint32_t)total_full;
		total_full += w->reqs[r].input_len / B;
	}
	first[w->nreqs] = (uint32_t)total_full;
	node_of = malloc(total_full * sizeof(*node_of) + 1);
	next_use = malloc(total_full * sizeof(*next_use) + 1);
	if (!node_of || !next_use || u64map_init(&ids, total_full / 4 + 16) < 0 ||
	    u64map_init(&last_use, total_full / 4 + 16) < 0)
		abort();
	for (uint32_t r = 0; r < w->nreqs; r++)
		for (uint32_t j = 0; j < w->reqs[r].input_len / B; j++) {
			int ins;
			uint32_t *id = u64map_get(&ids, workload_prefix_key(w, r, (j + 1) * B - 1), &ins);

			if (ins)
				*id = nnodes++;
			node_of[first[r] + j] = *id;
		}
	for (uint32_t r = w->nreqs; r-- > 0;)
		for (uint32_t j = 0; j < w->reqs[r].input_len / B; j++) {
			int ins;
			uint32_t *nu = u64map_get(&last_use, node_of[first[r] + j], &ins);

			next_use[first[r] + j] = ins ? NEVER : *nu;
			*nu = r;
		}
	b.nodes = calloc(nnodes + 1, sizeof(*b.nodes));
	if (!b.nodes)
		abort();

	for (uint32_t r = 0; r < w->nreqs; r++) {
		const struct wreq *q = &w->reqs[r];
		uint32_t nfull = q->input_len / B, nhit = 0;
		uint32_t nprompt = (q->input_len + B - 1) / B;
		uint64_t nall = ((uint64_t)q->input_len + (prompt_only ? 0 : q->output_len) + B - 1) / B;

		while (nhit < nfull && b.nodes[node_of[first[r] + nhit]].cached)
			nhit++;
		/* The open: rejected before anything is taken or counted. */
		if (nprompt > capacity) {
			rejected++;
			continue;
		}
		belady_evict(&b, r, capacity - (nprompt - nhit));
		hits += nhit;
		blocks += nprompt;
		/* The output: its blocks, or every cached block but the hits, then the end. */
		if (nall > capacity) {
			rejected++;
			belady_evict(&b, r, nhit);
		} else {
			belady_evict(&b, r, capacity - (uint32_t)(nall - nhit));
		}
		for (uint32_t j = 0; j < nfull; j++) {
			struct bnode *n = &b.nodes[node_of[first[r] + j]];

			if (!n->cached) {
				n->cached = true;
				b.cached++;
			}
			n->next_use = next_use[first[r] + j];
			heap_push(&b.heap, (struct heap_ent){ n->next_use, j, node_of[first[r] + j] });
		}
	}
	res->belady_hit_fraction = blocks ? (double)hits / (double)blocks : 0;
	res->belady_blocks = blocks;
	res->belady_hit_blocks = hits;
	res->belady_rejected = rejected;
	free(first);
	free(node_of);
	free(next_use);
	free(b.nodes);
	free(b.heap.v);
	u64map_free(&ids);
	u64map_free(&last_use);
	return 0;
}

void replay_json_belady(json_object *o, const struct replay_result *res)
{
	if (res->belady_hit_fraction < 0)
		return;
	json_object_object_add(o, "belady_hit_fraction",
			       json_object_new_double(res->belady_hit_fraction));
	json_object_object_add(o, "belady_hit_blocks",
			       json_object_new_int64((int64_t)res->belady_hit_blocks));
	json_object_object_add(o, "belady_blocks", json_object_new_int64((int64_t)res->belady_blocks));
	json_object_object_add(o, "belady_rejected", json_object_new_int64(res->belady_rejected));
}

void replay_print_header(bool with_belady)
{
	printf("%10s %6s %9s %8s %8s %9s %8s %9s %8s%s\n", "capacity", "B", "requests", "blocks",
	       "hits", "hit_frac", "evicted", "wall_ms", "ns/op", with_belady ? "  belady" : "");
}

void replay_print(const struct replay_result *res, bool json)
{
	double frac = res->blocks ? (double)res->hit_blocks / (double)res->blocks : 0;
	double ns_op = res->ops ? (double)res->core_ns / (double)res->ops : 0;

	if (json) {
		json_object *o = json_object_new_object();

		if (res->policy)
			json_object_object_add(o, "policy", json_object_new_string(res->policy));
		json_object_object_add(o, "capacity_blocks", json_object_new_int64(res->capacity));
		json_object_object_add(o, "block_tokens", json_object_new_int64(res->block_tokens));
		json_object_object_add(o, "requests", json_object_new_int64(res->requests));
		json_object_object_add(o, "rejected", json_object_new_int64(res->rejected));
		json_object_object_add(o, "blocks", json_object_new_int64((int64_t)res->blocks));
		json_object_object_add(o, "hit_blocks", json_object_new_int64((int64_t)res->hit_blocks));
		json_object_object_add(o, "hit_tokens", json_object_new_int64((int64_t)res->hit_tokens));
		json_object_object_add(o, "hit_fraction", json_object_new_double(frac));
		json_object_object_add(o, "evictions", json_object_new_int64((int64_t)res->evictions));
		json_object_object_add(o, "collisions", json_object_new_int64((int64_t)res->collisions));
		json_object_object_add(o, "ops", json_object_new_int64((int64_t)res->ops));
		json_object_object_add(o, "core_ms", json_object_new_double((double)res->core_ns / 1e6));
		json_object_object_add(o, "wall_ms", json_object_new_double((double)res->wall_ns / 1e6));
		json_object_object_add(o, "ns_per_op", json_object_new_double(ns_op));
		replay_json_belady(o, res);
		if (res->tier_capacity[REPLAY_HOST] || res->tier_capacity[REPLAY_FILE]) {
			static const char *const names[REPLAY_LEVELS] = { "pool", "host", "file" };
			json_object *tiers = json_object_new_object();

			for (uint32_t t = 0; t < REPLAY_LEVELS; t++) {
				json_object *to = json_object_new_object();

				json_object_object_add(to, "capacity_blocks",
						       json_object_new_int64(res->tier_capacity[t]));
				json_object_object_add(to, "hit_blocks",
						       json_object_new_int64((int64_t)res->tier_hit_blocks[t]));
				json_object_object_add(to, "hit_fraction",
						       json_object_new_double(res->blocks ? (double)res->tier_hit_blocks[t] / (double)res->blocks : 0));
				json_object_object_add(tiers, names[t], to);
			}
			json_object_object_add(o, "tiers", tiers);
		}
		json_print(o);
		return;
	}
	printf("%10u %6u %9u %8" PRIu64 " %8" PRIu64 " %9.4f %8" PRIu64 " %9.1f %8.1f", res->capacity,
	       res->block_tokens, res->requests, res->blocks, res->hit_blocks, frac, res->evictions,
	       (double)res->wall_ns / 1e6, ns_op);
	if (res->belady_hit_fraction >= 0)
		printf("  %6.4f", res->belady_hit_fraction);
	if (res->rejected)
		printf("  (%u rejected: larger than the pool)", res->rejected);
	putchar('\n');
	if (res->tier_capacity[REPLAY_HOST] || res->tier_capacity[REPLAY_FILE]) {
		static const char *const names[REPLAY_LEVELS] = { "pool", "host", "file" };

		for (uint32_t t = 0; t < REPLAY_LEVELS; t++)
			printf("%10s %10u blocks: %9" PRIu64 " hits, hit_frac %.4f\n", names[t],
			       res->tier_capacity[t], res->tier_hit_blocks[t],
			       res->blocks ? (double)res->tier_hit_blocks[t] / (double)res->blocks : 0);
	}
}

/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-llama: the sequence operations over both caches, generation and perplexity.
 *
 * With the pool, a prompt is opened with KVP_OPEN_RECOMPUTE_LAST: the daemon says how many
 * leading tokens already have their K/V in the pool, and those are not run at all.  The rest
 * are run one by one, writing into the slots the block table gives, and committed together.
 * Every generated token is then appended, run and committed: the commit of one token goes to
 * the daemon with the append of the next (one submission on the rings), and the last one on
 * its own, so another process can reuse a block as soon as it is full.
 *
 * Under H2O (--h2o) each token attends to what the daemon kept and reports the attention every
 * kept token received; the engine runs the same policy itself, to be the contiguous cache's
 * and to check the daemon's choices against.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/llama/engine.h"

#define STORY_SEPARATOR "<|endoftext|>"

static int paged_fail(struct engine *e, int r, const char *what)
{
	fprintf(stderr, "kvpaged-llama: %s: %s\n", what,
		*kvp_last_error(e->client) ? kvp_last_error(e->client) : strerror(-r));
	return r;
}

static int table_fail(void)
{
	fprintf(stderr, "kvpaged-llama: the daemon returned a block table that does not fit the "
			"sequence or the pool\n");
	return -EPROTO;
}

/*
 * A mask's K/V differs from full attention's once it leaves positions out, so its prefixes get
 * a key of their own: the model's fingerprint mixed with the mask.
 */
void engine_set_mask(struct engine *e, const struct llama_mask *mask)
{
	uint64_t z;

	e->mask = mask && mask->window ? *mask : (struct llama_mask){ 0 };
	if (!e->mask.window) {
		e->prefix_key = e->model_key;
		return;
	}
	/* splitmix64's finalizer over the mask, mixed into the model's fingerprint. */
	z = ((uint64_t)e->mask.n_sink << 32 | e->mask.window) + 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	e->prefix_key = e->model_key ^ z ^ (z >> 31);
}

/* Room for the table of a sequence of e->max_tokens in each ring table. */
static int ring_tables_reserve(struct engine *e)
{
	const uint32_t cap = e->max_tokens / kvp_pool(e->client)->block_tokens + 2;

	if (!e->rings || cap <= e->ring_table_cap)
		return 0;
	if (e->h2o && e->h2o_cfg.tokens) {
		/*
		 * The packed blocks and a position per packed slot: fewer than the tokens.  At
		 * most 64 KiB of the data area; a longer map comes over the socket.
		 */
		const uint32_t n = cap + e->max_tokens < 16384 ? cap + e->max_tokens : 16384;
		uint32_t *t = realloc(e->ring_packed, (size_t)n * sizeof(*t));

		if (!t)
			return -ENOMEM;
		e->ring_packed = t;
		e->ring_packed_cap = n;
	}
	for (int i = 0; i < 3; i++) {
		uint32_t *t = realloc(e->ring_tables[i], (size_t)cap * sizeof(*t));

		if (!t)
			return -ENOMEM;
		e->ring_tables[i] = t;
	}
	e->ring_table_cap = cap;
	return 0;
}

static int open_paged(struct engine *e, struct seq *s, const uint32_t *tokens, uint32_t n,
		      uint32_t flags, uint32_t *ret_cached)
{
	const struct kvp_retention keep = { .size = sizeof(keep), .policy = KVP_RETAIN_SINKS,
					    .n_sink = e->mask.n_sink,
					    .recent = e->mask.window };
	const struct kvp_retention h2o = { .size = sizeof(h2o), .policy = KVP_RETAIN_H2O,
					   .n_sink = e->h2o_cfg.n_sink,
					   .recent = e->h2o_cfg.recent, .budget = e->h2o_cfg.budget,
					   .granularity = e->h2o_cfg.tokens,
					   .decay = e->h2o_cfg.decay };
	int r;

	if (e->h2o) {
		r = kvp_open_retained(e->client, tokens, n, e->prefix_key, flags, &h2o, &s->id,
				      ret_cached, &s->paged.table);
		return r < 0 ? paged_fail(e, r, "open (h2o)") : 0;
	}
	if (engine_bounded(e) && !e->pool_window) {
		r = kvp_open_retained(e->client, tokens, n, e->prefix_key, flags, &keep, &s->id,
				      ret_cached, &s->paged.table);
		/*
		 * The request is valid, so the refusal is a pool with a sliding window (the pool
		 * description the library gives does not say).  It keeps every sequence's last
		 * window tokens and no sinks.
		 */
		if (r != -EINVAL)
			return r < 0 ? paged_fail(e, r, "open") : 0;
		e->pool_window = true;
	}
	if (e->pool_window && e->mask.n_sink) {
		fprintf(stderr, "kvpaged-llama: pool '%s' has a sliding window, which decides what "
				"its sequences keep: --sinks needs a pool without one\n",
			kvp_pool(e->client)->name);
		return -EINVAL;
	}
	r = kvp_open(e->client, tokens, n, e->prefix_key, flags, &s->id, ret_cached,
		     &s->paged.table);
	return r < 0 ? paged_fail(e, r, "open") : 0;
}

int seq_open(struct engine *e, struct seq *s, const uint32_t *tokens, uint32_t n, uint32_t flags,
	     uint32_t *ret_cached)
{
	const struct llama_config *cfg = &e->model.cfg;
	uint32_t cached = 0, span = e->max_tokens;
	int r;

	if (engine_bounded(e) && span > e->mask.n_sink + e->mask.window)
		span = e->mask.n_sink + e->mask.window;
	/* H2O: what the policy holds, which seq_forward() makes room for as it goes. */
	if (e->h2o && span > e->h2o_cfg.budget + 2 * e->h2o_cfg.block_tokens)
		span = e->h2o_cfg.budget + 2 * e->h2o_cfg.block_tokens;
	r = llama_state_reserve(&e->st, cfg, span);
	if (r < 0)
		return r;
	if (e->h2o) {
		if (n != 1)
			return -EINVAL;
		/* One token, never cached: the policy sees every token's attention. */
		flags |= KVP_OPEN_RECOMPUTE_LAST;
		r = kv_h2o_init(&s->h2o, &e->h2o_cfg, e->max_tokens, n);
		if (r < 0)
			return r;
	}
	if (!e->client) {
		r = kv_contig_init(&s->contig, cfg, e->max_tokens);
		if (r < 0)
			return r;
		s->kv = &s->contig.base;
		s->open = true;
		*ret_cached = 0;
		return 0;
	}
	r = ring_tables_reserve(e);
	if (r < 0)
		return r;
	kv_paged_init(&s->paged, e->client, cfg);
	s->kv = &s->paged.base;
	r = open_paged(e, s, tokens, n, flags, &cached);
	if (r < 0)
		return r;
	s->open = true;
	if (kv_paged_check_table(&s->paged, n) < 0 || cached > n || (e->h2o && cached))
		return table_fail();
	/* Cached blocks are someone else's too, and immutable. */
	s->paged.readonly_below = cached;
	*ret_cached = cached;
	return 0;
}

/* ------------------------------------------------------------------------------------- H2O */

/* Whether table entry i is held: the daemon's table, or the policy's with the private cache. */
static bool h2o_block_held(const struct engine *e, const struct seq *s, uint32_t i)
{
	if (e->client)
		return i < s->paged.table.len && s->paged.table.blocks[i] != KVP_TABLE_HOLE;
	return kv_h2o_block_held(&s->h2o, i);
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

/* Room for a forward pass attending to natt positions, and for its report. */
static int h2o_reserve(struct seq *s, uint32_t natt)
{
	struct llama_span *spans;
	struct h2o_run *runs;
	uint32_t *order;
	float *w[3];

	if (natt <= s->weights_cap)
		return 0;
	natt += 64;
	spans = realloc(s->spans, (size_t)natt * sizeof(*spans));
	if (spans)
		s->spans = spans;
	runs = realloc(s->runs, (size_t)natt * sizeof(*runs));
	if (runs)
		s->runs = runs;
	order = realloc(s->packed_order, (size_t)natt * sizeof(*order));
	if (order)
		s->packed_order = order;
	w[0] = realloc(s->run_weights, (size_t)natt * sizeof(float));
	if (w[0])
		s->run_weights = w[0];
	w[1] = realloc(s->packed_weights, (size_t)natt * sizeof(float));
	if (w[1])
		s->packed_weights = w[1];
	w[2] = realloc(s->packed_order_weights, (size_t)natt * sizeof(float));
	if (w[2])
		s->packed_order_weights = w[2];
	if (!spans || !runs || !order || !w[0] || !w[1] || !w[2])
		return -ENOMEM;
	s->weights_cap = natt;
	return 0;
}

static void h2o_span_add(struct seq *s, uint32_t begin, uint32_t end)
{
	if (s->nspans && s->spans[s->nspans - 1].end == begin)
		s->spans[s->nspans - 1].end = end;
	else
		s->spans[s->nspans++] = (struct llama_span){ begin, end };
}

/*
 * The positions the token at pos attends to: those of the held table entries up to pos, and
 * the packed ones, in increasing order (so both caches sum in the same order).  The packed
 * positions, sorted, are left in s->packed_order.
 */
static int h2o_spans(struct engine *e, struct seq *s, uint32_t pos, uint32_t *ret_natt)
{
	const uint32_t B = e->h2o_cfg.block_tokens;
	const uint32_t *packed = e->client ? s->paged.packed_positions.blocks : s->h2o.packed_list;
	const uint32_t npacked = e->client ? s->paged.packed_positions.len : s->h2o.npacked;
	uint32_t natt = npacked, k = 0;
	int r;

	if (e->client && pos / B >= s->paged.table.len)
		return table_fail();
	for (uint32_t i = 0; i <= pos / B; i++)
		natt += h2o_block_held(e, s, i) ? B : 0;
	r = h2o_reserve(s, natt + 1);
	if (r < 0)
		return r;
	if (npacked)
		memcpy(s->packed_order, packed, (size_t)npacked * sizeof(*packed));
	qsort(s->packed_order, npacked, sizeof(*s->packed_order), cmp_u32);
	s->nspans = 0;
	natt = 0;
	for (uint32_t i = 0; i <= pos / B; i++) {
		const uint32_t begin = i * B, end = begin + B < pos + 1 ? begin + B : pos + 1;

		if (!h2o_block_held(e, s, i)) {
			if (i == pos / B) {
				fprintf(stderr, "kvpaged-llama: h2o: the block of position "
						"%u, which is being run, was released\n", pos);
				return -EPROTO;
			}
			continue;
		}
		/* Packed positions are in released entries: never inside a held one. */
		for (; k < npacked && s->packed_order[k] < begin; k++, natt++)
			h2o_span_add(s, s->packed_order[k], s->packed_order[k] + 1);
		h2o_span_add(s, begin, end);
		natt += end - begin;
	}
	if (k < npacked) {
		fprintf(stderr, "kvpaged-llama: h2o: packed position %u is past position %u\n",
			s->packed_order[k], pos);
		return -EPROTO;
	}
	*ret_natt = natt;
	return 0;
}

/*
 * The attention each attended position received, as reports: one per run of held table
 * positions, in increasing order, then one for the packed slots (by slot for the daemon).
 * The policy takes them now; the daemon with the next step or commit.
 */
static int h2o_collect(struct engine *e, struct seq *s)
{
	const uint32_t B = e->h2o_cfg.block_tokens;
	const float *w = e->st.received;
	uint32_t j = 0, np = 0;

	s->nruns = 0;
	for (uint32_t r = 0; r < s->nspans; r++) {
		for (uint32_t p = s->spans[r].begin; p < s->spans[r].end; p++, j++) {
			struct h2o_run *run = s->nruns ? &s->runs[s->nruns - 1] : NULL;

			if (!h2o_block_held(e, s, p / B)) {
				const uint32_t slot = kv_paged_packed_slot(&s->paged, p);

				s->packed_order[np] = p;
				s->packed_order_weights[np++] = w[j];
				if (e->client)
					s->packed_weights[slot] = w[j];
				continue;
			}
			if (run && run->first + run->n == p)
				run->n++;
			else
				s->runs[s->nruns++] = (struct h2o_run){ p, 1, j - np };
			s->run_weights[j - np] = w[j];
		}
	}
	for (uint32_t r = 0; r < s->nruns; r++)
		kv_h2o_report(&s->h2o, s->runs[r].first, s->run_weights + s->runs[r].off,
			      s->runs[r].n);
	if (np)
		kv_h2o_report_packed(&s->h2o, s->packed_order, s->packed_order_weights, np);
	s->npacked_weights = np;
	s->report_pending = e->client != NULL;
	return 0;
}

static int h2o_forward(struct engine *e, struct seq *s, uint32_t token, uint32_t pos,
		       const float **ret_logits)
{
	struct llama_mask m = { 0 };
	uint32_t natt;
	int r;

	r = h2o_spans(e, s, pos, &natt);
	if (r == 0)
		r = llama_state_reserve(&e->st, &e->model.cfg, natt);
	if (r < 0)
		return r;
	m.spans = s->spans;
	m.nspans = s->nspans;
	e->st.keep_received = true;
	*ret_logits = llama_forward(&e->model, &e->st, s->kv, &m, token, pos);
	e->st.keep_received = false;
	return h2o_collect(e, s);
}

int seq_forward(struct engine *e, struct seq *s, uint32_t token, uint32_t pos,
		const float **ret_logits)
{
	uint32_t hole;

	if (e->h2o)
		return h2o_forward(e, s, token, pos, ret_logits);
	if (e->client && kv_paged_check_mask(&s->paged, &e->mask, pos, &hole) < 0) {
		fprintf(stderr, "kvpaged-llama: position %u, which the token at %u attends to, is "
				"in a block the daemon released%s\n", hole, pos,
			!engine_bounded(e) ? ": the pool has a sliding window (give --window)"
			: e->pool_window   ? " (the pool's window is smaller than --window)"
					   : "");
		return -EPROTO;
	}
	*ret_logits = llama_forward(&e->model, &e->st, s->kv, &e->mask, token, pos);
	return 0;
}

#define RING_TIMEOUT_MS 30000

static int ring_reap(struct engine *e, struct kvp_completion *done, unsigned n)
{
	unsigned got = 0;
	int r;

	while (got < n) {
		r = kvp_complete(e->client, done + got, n - got, n - got, RING_TIMEOUT_MS);
		if (r < 0)
			return paged_fail(e, r, "ring completion");
		got += (unsigned)r;
	}
	return 0;
}

/* Every operation goes on the rings with its opcode as user_data. */
static int completion_fail(const struct kvp_completion *c)
{
	const char *what = c->user_data == KVP_COMMIT ? "commit"
			   : c->user_data == KVP_PARK ? "park"
			   : c->user_data == KVP_RESUME ? "resume"
			   : c->user_data == KVP_SEQ_INFO ? "seq info"
			   : c->user_data == KVP_SCORES ? "scores"
							: "append";

	fprintf(stderr, "kvpaged-llama: %s: %s\n", what, strerror(-c->res));
	return c->res;
}

/* Room for n operations of one step (and their completions). */
static int ring_ops_reserve(struct engine *e, uint32_t n)
{
	struct kvp_op *ops;
	struct kvp_completion *done;

	if (n <= e->ring_ops_cap)
		return 0;
	n += 16;
	ops = realloc(e->ring_ops, (size_t)n * sizeof(*ops));
	if (!ops)
		return -ENOMEM;
	e->ring_ops = ops;
	done = realloc(e->ring_done, (size_t)n * sizeof(*done));
	if (!done)
		return -ENOMEM;
	e->ring_done = done;
	e->ring_ops_cap = n;
	return 0;
}

/*
 * Submits e->ring_ops[0, n).  When the ring (or its data area) is full, completions of what
 * went first are reaped into e->ring_done to make room; *ret_reaped says how many.
 */
static int ring_submit_all(struct engine *e, unsigned n, unsigned *ret_reaped)
{
	unsigned sent = 0, reaped = 0;
	int r;

	while (sent < n) {
		r = kvp_submit(e->client, e->ring_ops + sent, n - sent);
		if (r < 0)
			return paged_fail(e, r, "ring submit");
		if (r == 0) {
			if (reaped == sent) /* nothing of ours in flight, and still no room */
				return paged_fail(e, -EAGAIN, "ring submit");
			r = ring_reap(e, e->ring_done + reaped, 1);
			if (r < 0)
				return r;
			reaped++;
			continue;
		}
		sent += (unsigned)r;
	}
	*ret_reaped = reaped;
	return 0;
}

/* The ring operations of a pending H2O report, from ops on; returns how many. */
static unsigned h2o_ring_ops(const struct seq *s, struct kvp_op *ops)
{
	unsigned n = 0;

	/* The weights go as the operation's 32-bit words; the library copies them. */
	for (uint32_t r = 0; r < s->nruns; r++)
		ops[n++] = (struct kvp_op){ .opcode = KVP_SCORES, .arg = s->runs[r].first,
					    .user_data = KVP_SCORES, .seq = s->id,
					    .tokens = (const void *)(s->run_weights +
								     s->runs[r].off),
					    .ntokens = s->runs[r].n };
	if (s->npacked_weights)
		ops[n++] = (struct kvp_op){ .opcode = KVP_SCORES, .arg = KVP_SCORES_PACKED,
					    .user_data = KVP_SCORES, .seq = s->id,
					    .tokens = (const void *)s->packed_weights,
					    .ntokens = s->npacked_weights };
	return n;
}

/*
 * Reaps a deferred step.  Its append needed no block and its commit completed none (nor, with
 * H2O, released any), so the daemon cannot have changed the table; anything else breaks what
 * the deferral relied on.
 */
static int ring_settle(struct engine *e, struct seq *s)
{
	unsigned n = s->inflight;
	int r;

	if (!n)
		return 0;
	s->inflight = 0;
	r = ring_reap(e, e->ring_done, n);
	if (r < 0)
		return r;
	for (unsigned i = 0; i < n; i++) {
		const struct kvp_completion *c = &e->ring_done[i];

		if (c->res < 0)
			return completion_fail(c);
		if (c->user_data == KVP_SCORES)
			continue;
		if (c->user_data == KVP_COMMIT ? c->aux != 0 || (e->h2o && c->value != 0)
					       : c->aux != s->inflight_len || c->table_len != 0) {
			fprintf(stderr, "kvpaged-llama: the daemon changed the block table "
					"in a step that needed no block\n");
			return -EPROTO;
		}
	}
	return 0;
}

/* A table the daemon sent whole: it must hold ntokens; count what it holds. */
static int table_refreshed(struct engine *e, struct seq *s, uint32_t tokens, uint32_t ntokens)
{
	uint32_t held;

	if (tokens != ntokens || kv_paged_check_table(&s->paged, ntokens) < 0)
		return table_fail();
	held = kv_paged_held(&s->paged);
	if (!engine_retains(e) && held != s->paged.table.len) {
		fprintf(stderr, "kvpaged-llama: pool '%s' released blocks of a sequence with full "
				"attention: it has a sliding window (give --window)\n",
			kvp_pool(e->client)->name);
		return -EPROTO;
	}
	if (held > e->max_held)
		e->max_held = held;
	return 0;
}

/* A position map from a KVP_PACKED completion into the sequence's next_packed tables. */
static int packed_fetched(struct engine *e, struct seq *s, const struct kvp_completion *c)
{
	const uint32_t nblocks = c->aux, npos = (uint32_t)c->value;

	if (c->table_len != nblocks + npos)
		return table_fail();
	for (int i = 0; i < 2; i++) {
		struct kvp_table *t = i ? &s->next_packed_positions : &s->next_packed_blocks;
		const uint32_t n = i ? npos : nblocks;

		if (t->cap < n) {
			uint32_t *b = realloc(t->blocks, (size_t)n * sizeof(uint32_t));

			if (!b)
				return -ENOMEM;
			t->blocks = b;
			t->cap = n;
		}
		memcpy(t->blocks, e->ring_packed + (i ? nblocks : 0), (size_t)n * sizeof(uint32_t));
		t->len = n;
	}
	s->packed_fetched = true;
	return 0;
}

/*
 * Both operations in one submission, reaped together: one wake-up of the daemon per token.
 * A pending H2O report goes first, so that the commit's evictions count it.  With refresh (the
 * sequence's tokens after the append), a SEQ_INFO goes last and its table, which shows the
 * blocks the commit released, replaces ours.  With packed (a commit that may evict at token
 * granularity), a PACKED after the commit brings the position map in the same round trip.
 */
static int ring_step(struct engine *e, struct seq *s, uint32_t commit_ntokens, uint32_t token,
		     bool wait, uint32_t refresh, bool packed)
{
	unsigned n = 0, reaped = 0;
	int r;

	r = ring_settle(e, s);
	if (r < 0)
		return r;
	r = ring_ops_reserve(e, (s->report_pending ? s->nruns + 1 : 0) + 4);
	if (r < 0)
		return r;
	if (s->report_pending)
		n += h2o_ring_ops(s, e->ring_ops);
	if (commit_ntokens)
		e->ring_ops[n++] = (struct kvp_op){ .opcode = KVP_COMMIT, .arg = commit_ntokens,
						    .user_data = KVP_COMMIT, .seq = s->id,
						    .table_cap = e->ring_table_cap,
						    .table_out = e->ring_tables[0] };
	if (commit_ntokens && packed)
		e->ring_ops[n++] = (struct kvp_op){ .opcode = KVP_PACKED,
						    .user_data = KVP_PACKED, .seq = s->id,
						    .table_cap = e->ring_packed_cap,
						    .table_out = e->ring_packed };
	e->ring_ops[n++] = (struct kvp_op){ .opcode = KVP_APPEND, .user_data = KVP_APPEND,
					    .seq = s->id, .tokens = &token, .ntokens = 1,
					    .table_cap = e->ring_table_cap,
					    .table_out = e->ring_tables[1] };
	if (refresh)
		e->ring_ops[n++] = (struct kvp_op){ .opcode = KVP_SEQ_INFO,
						    .user_data = KVP_SEQ_INFO, .seq = s->id,
						    .table_cap = e->ring_table_cap,
						    .table_out = e->ring_tables[2] };
	r = ring_submit_all(e, n, &reaped);
	if (r < 0)
		return r;
	s->report_pending = false; /* the library copied the weights */
	if (!wait && !reaped) {
		s->inflight = n;
		s->inflight_len = s->paged.table.len;
		return 0;
	}
	r = ring_reap(e, e->ring_done + reaped, n - reaped);
	if (r < 0)
		return r;
	/*
	 * Completions come in submission order: the reports', the commit's table (when it
	 * replaced or released entries), the append's, then all.
	 */
	for (unsigned i = 0; i < n; i++) {
		const struct kvp_completion *c = &e->ring_done[i];
		const bool commit = c->user_data == KVP_COMMIT;
		const bool info = c->user_data == KVP_SEQ_INFO;

		if (c->res < 0)
			return completion_fail(c);
		if (c->user_data == KVP_SCORES)
			continue;
		if (c->user_data == KVP_PACKED) {
			/* Short of room: h2o_committed asks over the socket instead. */
			r = c->flags & KVP_COMPLETION_TRUNCATED ? 0 : packed_fetched(e, s, c);
			if (r < 0)
				return r;
			continue;
		}
		if (c->flags & KVP_COMPLETION_TRUNCATED)
			return table_fail();
		if (commit && c->aux == 0 && c->value == 0)
			continue;
		r = kv_paged_table_set(&s->paged, commit || info ? 0 : c->aux,
				       e->ring_tables[commit ? 0 : info ? 2 : 1], c->table_len);
		if (r < 0)
			return r == -ENOMEM ? r : table_fail();
		if (commit)
			e->replaced += c->aux;
		if (info) {
			r = table_refreshed(e, s, (uint32_t)(c->value >> 32), refresh);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

/* Sends a pending H2O report on its own (before a commit that is not part of a step). */
static int h2o_flush(struct engine *e, struct seq *s)
{
	unsigned n, reaped = 0;
	int r;

	if (!s->report_pending)
		return 0;
	if (!e->rings) {
		for (uint32_t i = 0; i < s->nruns; i++) {
			r = kvp_report_scores(e->client, s->id, s->runs[i].first,
					      s->run_weights + s->runs[i].off, s->runs[i].n);
			if (r < 0)
				return paged_fail(e, r, "scores");
		}
		if (s->npacked_weights) {
			r = kvp_report_scores(e->client, s->id, KVP_SCORES_PACKED,
					      s->packed_weights, s->npacked_weights);
			if (r < 0)
				return paged_fail(e, r, "scores (packed)");
		}
		s->report_pending = false;
		return 0;
	}
	r = ring_settle(e, s);
	if (r == 0)
		r = ring_ops_reserve(e, s->nruns + 1);
	if (r < 0)
		return r;
	n = h2o_ring_ops(s, e->ring_ops);
	r = ring_submit_all(e, n, &reaped);
	if (r == 0)
		r = ring_reap(e, e->ring_done + reaped, n - reaped);
	if (r < 0)
		return r;
	s->report_pending = false;
	for (unsigned i = 0; i < n; i++)
		if (e->ring_done[i].res < 0)
			return completion_fail(&e->ring_done[i]);
	return 0;
}

/*
 * Tokens the daemon's sequence holds, as far as the engine knows: those of held table entries
 * (every hole is a whole block) and the packed ones.  The daemon evicts at a commit only
 * while this is over the budget.
 */
static uint32_t h2o_view_held(const struct seq *s)
{
	const uint32_t holes = s->paged.table.len - kv_paged_held(&s->paged);

	return s->h2o.ntokens - holes * s->paged.block_tokens + s->paged.packed_positions.len;
}

/* Says where the daemon's H2O choice and the policy's first differ.  Returns -EPROTO. */
static int h2o_differ(const struct seq *s, const char *what, uint32_t at, bool daemon_holds)
{
	fprintf(stderr, "kvpaged-llama: h2o: after the commit of %u tokens (%u held by the "
			"daemon, %u by the policy), the daemon %s %s %u, which H2O %s\n",
		s->h2o.ncommitted, h2o_view_held(s), kv_h2o_held_tokens(&s->h2o),
		daemon_holds ? "holds" : "released", what, at,
		daemon_holds ? "evicts" : "keeps");
	return -EPROTO;
}

/*
 * After a commit the daemon answered (its table updated) and appended more tokens: the
 * policy commits and appends the same, and when either evicted, what the daemon holds (the
 * table, and at token granularity the packed slots, fetched again) must be exactly what the
 * policy holds.  prune: the daemon may have evicted (it held more than budget tokens).
 */
static int h2o_committed(struct engine *e, struct seq *s, uint32_t ncommitted,
			 uint32_t appended, bool prune)
{
	struct kv_paged *kv = &s->paged;
	const uint64_t compactions = s->h2o.compactions;
	uint32_t evicted, held;
	int r;

	evicted = kv_h2o_commit(&s->h2o, ncommitted);
	e->h2o_evicted += evicted;
	e->h2o_compactions += s->h2o.compactions - compactions;
	kv_h2o_append(&s->h2o, appended);
	/* A sequence gains a block only when a token starts one. */
	if (e->client && appended && (s->h2o.ntokens - 1) % kv->block_tokens == 0) {
		held = kv_paged_held(kv) + kv->packed_blocks.len;
		if (held > e->max_held)
			e->max_held = held;
	}
	if (!e->client || (!prune && !evicted))
		return 0;
	if (e->h2o_cfg.tokens && prune) {
		r = s->packed_fetched ? 0
				      : kvp_seq_packed(e->client, s->id, &s->next_packed_blocks,
						       &s->next_packed_positions);
		s->packed_fetched = false;
		if (r < 0)
			return paged_fail(e, r, "packed blocks");
		r = kv_paged_set_packed(kv, &s->next_packed_blocks, &s->next_packed_positions,
					s->h2o.ntokens);
		if (r < 0) {
			if (r == -ENOMEM)
				return r;
			fprintf(stderr, "kvpaged-llama: h2o: the daemon's packed blocks do not "
					"fit the sequence (a position not in a released block, "
					"twice, or past the tokens; or a block not in the pool)\n");
			return r;
		}
	}
	for (uint32_t i = 0; i < kv->table.len; i++) {
		const bool daemon = kv->table.blocks[i] != KVP_TABLE_HOLE;

		if (daemon != kv_h2o_block_held(&s->h2o, i))
			return h2o_differ(s, "block", i, daemon);
	}
	for (uint32_t k = 0; k < kv->packed_positions.len; k++)
		if (!kv_h2o_packed(&s->h2o, kv->packed_positions.blocks[k]))
			return h2o_differ(s, "packed position", kv->packed_positions.blocks[k],
					  true);
	if (kv->packed_positions.len != s->h2o.npacked) {
		for (uint32_t k = 0; k < s->h2o.npacked; k++)
			if (kv_paged_packed_slot(kv, s->h2o.packed_list[k]) == KVP_TABLE_HOLE)
				return h2o_differ(s, "packed position", s->h2o.packed_list[k],
						  false);
	}
	held = kv_paged_held(kv) + kv->packed_blocks.len;
	if (held > e->max_held)
		e->max_held = held;
	return 0;
}

int seq_step(struct engine *e, struct seq *s, uint32_t commit_ntokens, uint32_t token,
	     uint32_t ntokens)
{
	const uint32_t B = s->paged.block_tokens;
	bool refresh, prune = false;
	int r;

	if (!e->client)
		return e->h2o ? h2o_committed(e, s, commit_ntokens, 1, false) : 0;
	/*
	 * Releases come with commits, and a deferred step's commit is not looked at: see them
	 * at block starts (on the rings, in a step that waits anyway).  Full attention too, to
	 * find a pool with a sliding window, which the pool description does not show.  H2O
	 * needs none of this: it cannot be in such a pool, and it waits for every commit that
	 * may evict, whose reply carries the table.
	 */
	refresh = !e->h2o && (ntokens % B == 0 || (engine_bounded(e) && e->pool_window));
	/* H2O evicts at a commit while more than budget tokens are held: see what it did. */
	if (e->h2o && commit_ntokens > s->h2o.ncommitted)
		prune = h2o_view_held(s) > e->h2o_cfg.budget;
	if (e->rings) {
		/*
		 * Waiting is needed when the token starts a block (the append allocates it, and
		 * the commit that goes with it completes the previous block, which the daemon
		 * may switch to an equal one and free).  Otherwise the slot is in our own last
		 * block, and the forward pass may write it while the daemon catches up.  A
		 * refreshed table is waited for: the forward pass checks it; so is a commit
		 * that may evict.
		 */
		bool wait = !e->defer || ntokens % B == 0 ||
			    (uint64_t)s->paged.table.len * B <= ntokens || refresh || prune;

		r = ring_step(e, s, commit_ntokens, token, wait, refresh ? ntokens + 1 : 0,
			      prune && e->h2o_cfg.tokens);
		if (r < 0)
			return r;
	} else {
		if (commit_ntokens) {
			r = e->h2o ? h2o_flush(e, s) : 0;
			if (r < 0)
				return r;
			r = kvp_commit(e->client, s->id, commit_ntokens, &s->paged.table);
			if (r < 0)
				return paged_fail(e, r, "commit");
			e->replaced += (uint32_t)r;
		}
		r = kvp_append(e->client, s->id, &token, 1, &s->paged.table);
		if (r < 0)
			return paged_fail(e, r, "append");
		if (refresh)
			return seq_refresh(e, s, ntokens + 1);
	}
	if (kv_paged_check_table(&s->paged, ntokens + 1) < 0)
		return table_fail();
	return e->h2o ? h2o_committed(e, s, commit_ntokens, 1, prune) : 0;
}

int seq_commit(struct engine *e, struct seq *s, uint32_t ntokens)
{
	bool prune = false;
	int r;

	if (!e->client)
		return e->h2o ? h2o_committed(e, s, ntokens, 0, false) : 0;
	r = ring_settle(e, s);
	if (r < 0)
		return r;
	if (e->h2o) {
		prune = ntokens > s->h2o.ncommitted && h2o_view_held(s) > e->h2o_cfg.budget;
		r = h2o_flush(e, s);
		if (r < 0)
			return r;
	}
	r = kvp_commit(e->client, s->id, ntokens, &s->paged.table);
	if (r < 0)
		return paged_fail(e, r, "commit");
	e->replaced += (uint32_t)r;
	if (kv_paged_check_table(&s->paged, ntokens) < 0)
		return table_fail();
	return e->h2o ? h2o_committed(e, s, ntokens, 0, prune) : 0;
}

int seq_fork(struct engine *e, struct seq *parent, uint32_t ntokens, struct seq *child)
{
	int r;

	if (!e->client) {
		r = kv_contig_init(&child->contig, &e->model.cfg, parent->contig.positions);
		if (r < 0)
			return r;
		kv_contig_copy(&child->contig, &parent->contig, ntokens);
		child->kv = &child->contig.base;
		child->open = true;
		return 0;
	}
	r = ring_settle(e, parent);
	if (r < 0)
		return r;
	kv_paged_init(&child->paged, e->client, &e->model.cfg);
	child->kv = &child->paged.base;
	r = kvp_fork(e->client, parent->id, &child->id, &child->paged.table);
	if (r < 0)
		return paged_fail(e, r, "fork");
	child->open = true;
	child->paged.readonly_below = parent->paged.readonly_below;
	return kv_paged_check_table(&child->paged, ntokens) < 0 ? table_fail() : 0;
}

/* One operation over the rings, waited for, after the deferred step before it. */
static int ring_call(struct engine *e, struct seq *s, const struct kvp_op *op,
		     struct kvp_completion *ret)
{
	int r;

	r = ring_settle(e, s);
	if (r < 0)
		return r;
	r = kvp_submit(e->client, op, 1);
	if (r < 0)
		return paged_fail(e, r, "ring submit");
	if (r == 0) /* nothing else of ours is in flight */
		return paged_fail(e, -EAGAIN, "ring submit");
	r = ring_reap(e, ret, 1);
	if (r < 0)
		return r;
	return ret->res < 0 ? completion_fail(ret) : 0;
}

int seq_refresh(struct engine *e, struct seq *s, uint32_t ntokens)
{
	struct kvp_op op = { .opcode = KVP_SEQ_INFO, .user_data = KVP_SEQ_INFO, .seq = s->id,
			     .table_cap = e->ring_table_cap, .table_out = e->ring_tables[2] };
	struct kvp_completion done;
	uint32_t tokens;
	int r;

	if (!e->client)
		return 0;
	if (e->rings) {
		r = ring_call(e, s, &op, &done);
		if (r < 0)
			return r;
		if (done.flags & KVP_COMPLETION_TRUNCATED)
			return table_fail();
		r = kv_paged_table_set(&s->paged, 0, e->ring_tables[2], done.table_len);
		if (r < 0)
			return r == -ENOMEM ? r : table_fail();
		tokens = (uint32_t)(done.value >> 32);
	} else {
		r = kvp_seq_info(e->client, s->id, &tokens, NULL, &s->paged.table);
		if (r < 0)
			return paged_fail(e, r, "seq info");
	}
	return table_refreshed(e, s, tokens, ntokens);
}

int seq_park(struct engine *e, struct seq *s)
{
	struct kvp_op op = { .opcode = KVP_PARK, .user_data = KVP_PARK, .seq = s->id };
	struct kvp_completion done;
	int r;

	if (!e->client)
		return -EOPNOTSUPP;
	if (e->rings)
		return ring_call(e, s, &op, &done);
	r = kvp_park(e->client, s->id);
	return r < 0 ? paged_fail(e, r, "park") : 0;
}

int seq_resume(struct engine *e, struct seq *s, uint32_t ntokens, uint32_t *ret_recompute)
{
	struct kvp_op op = { .opcode = KVP_RESUME, .user_data = KVP_RESUME, .seq = s->id,
			     .table_cap = e->ring_table_cap, .table_out = e->ring_tables[1] };
	struct kvp_completion done;
	uint32_t recompute;
	int r;

	if (!e->client)
		return -EOPNOTSUPP;
	if (e->rings) {
		r = ring_call(e, s, &op, &done);
		if (r < 0)
			return r;
		if (done.flags & KVP_COMPLETION_TRUNCATED)
			return table_fail();
		recompute = done.aux;
		/* The whole table: blocks that were dropped or swapped come back elsewhere. */
		r = kv_paged_table_set(&s->paged, 0, e->ring_tables[1], done.table_len);
		if (r < 0)
			return r == -ENOMEM ? r : table_fail();
	} else {
		r = kvp_resume(e->client, s->id, &recompute, &s->paged.table);
		if (r < 0)
			return paged_fail(e, r, "resume");
	}
	if (recompute > ntokens) {
		fprintf(stderr, "kvpaged-llama: resume: the daemon says %u tokens must be "
				"recomputed; the sequence has %u\n", recompute, ntokens);
		return -EPROTO;
	}
	if (kv_paged_check_table(&s->paged, ntokens) < 0)
		return table_fail();
	/*
	 * What came back (kept, cached, or loaded from a tier) is committed and may be shared
	 * now; what is left is in fresh blocks of our own.
	 */
	s->paged.readonly_below = ntokens - recompute;
	*ret_recompute = recompute;
	return 0;
}

void seq_close(struct engine *e, struct seq *s)
{
	kv_h2o_free(&s->h2o);
	free(s->spans);
	free(s->runs);
	free(s->run_weights);
	free(s->packed_weights);
	free(s->packed_order);
	free(s->packed_order_weights);
	s->spans = NULL;
	s->runs = NULL;
	s->run_weights = s->packed_weights = s->packed_order_weights = NULL;
	s->packed_order = NULL;
	s->weights_cap = 0;
	kvp_table_free(&s->next_packed_blocks);
	kvp_table_free(&s->next_packed_positions);
	if (e->client) {
		if (s->open)
			ring_settle(e, s);
		if (s->open && kvp_close(e->client, s->id) < 0)
			paged_fail(e, -EIO, "close");
		kv_paged_free(&s->paged);
	} else {
		kv_contig_free(&s->contig);
	}
	s->open = false;
}

void json_string(FILE *f, const char *s, size_t len)
{
	fputc('"', f);
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)s[i];

		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch == '\n')
			fputs("\\n", f);
		else if (ch < 0x20 || ch == 0x7f)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

/* ------------------------------------------------------------------------------ generation */

/* Text that grows; allocation failure aborts (the engine cannot go on without its output). */
struct text {
	char *s;
	size_t len, cap;
};

static void text_add(struct text *t, const char *s, size_t n)
{
	if (t->len + n + 1 > t->cap) {
		t->cap = (t->len + n + 1) * 2;
		t->s = realloc(t->s, t->cap);
		if (!t->s)
			abort();
	}
	memcpy(t->s + t->len, s, n);
	t->len += n;
	t->s[t->len] = '\0';
}

/* Appends a token's text, dropping lone bytes that are neither printable nor space. */
static void text_add_token(struct text *t, const struct tokenizer *tok, uint32_t prev,
			   uint32_t token)
{
	size_t n;
	const char *piece = tokenizer_decode(tok, prev, token, &n);

	if (n == 1 && !isprint((unsigned char)piece[0]) && !isspace((unsigned char)piece[0]))
		return;
	text_add(t, piece, n);
}

/* xorshift64*: a small generator whose stream depends only on the seed. */
static uint32_t rng_u32(uint64_t *state)
{
	*state ^= *state >> 12;
	*state ^= *state << 25;
	*state ^= *state >> 27;
	return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

static uint64_t rng_seed(uint64_t seed)
{
	/* splitmix64 of the seed: any seed, 0 included, gives a non-zero state. */
	uint64_t z = seed + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return z ? z : 1;
}

static uint32_t sample(const float *logits, float *probs, uint32_t n, float temperature,
		       uint64_t *rng)
{
	uint32_t best = 0;
	float coin, cdf = 0.0f, max_val, sum = 0.0f;

	if (temperature == 0.0f) {
		for (uint32_t i = 1; i < n; i++)
			if (logits[i] > logits[best])
				best = i;
		return best;
	}
	max_val = logits[0] / temperature;
	for (uint32_t i = 0; i < n; i++) {
		probs[i] = logits[i] / temperature;
		if (probs[i] > max_val)
			max_val = probs[i];
	}
	for (uint32_t i = 0; i < n; i++) {
		probs[i] = expf(probs[i] - max_val);
		sum += probs[i];
	}
	coin = (float)(rng_u32(rng) >> 8) / 16777216.0f;
	for (uint32_t i = 0; i < n; i++) {
		cdf += probs[i] / sum;
		if (coin < cdf)
			return i;
	}
	return n - 1;
}

struct continuation {
	struct seq seq;
	float *logits;
	uint64_t rng;
	struct text text;
	uint32_t ntokens; /* tokens in the sequence; K/V is written for every one */
	uint32_t uncommitted; /* the count to commit with the next step (0: none) */
	uint32_t prev;
	uint32_t generated;
	bool done;
	FILE *dump;
};

static int dump_open(const char *path, uint32_t i, uint32_t n, FILE **ret)
{
	char name[4096];

	if (!path)
		return 0;
	if (n == 1)
		snprintf(name, sizeof(name), "%s", path);
	else
		snprintf(name, sizeof(name), "%s.%u", path, i);
	*ret = fopen(name, "wbe");
	if (!*ret) {
		int r = -errno;

		fprintf(stderr, "kvpaged-llama: %s: %s\n", name, strerror(errno));
		return r;
	}
	return 0;
}

static int dump_logits(FILE *f, const float *logits, uint32_t n)
{
	if (f && fwrite(logits, sizeof(float), n, f) != n) {
		fprintf(stderr, "kvpaged-llama: writing logits: %s\n", strerror(errno));
		return -EIO;
	}
	return 0;
}

#define PARK_WAIT_TIMEOUT_MS 60000
#define PARK_POLL_MS 10

/* Waits for path to exist, polling: the go-ahead is a file a test or a script creates. */
static int wait_for_file(const char *path)
{
	const struct timespec poll = { .tv_nsec = PARK_POLL_MS * 1000000L };

	for (uint32_t waited = 0;; waited += PARK_POLL_MS) {
		if (access(path, F_OK) == 0)
			return 0;
		if (errno != ENOENT) {
			int r = -errno;

			fprintf(stderr, "kvpaged-llama: --park-wait: %s: %s\n", path, strerror(errno));
			return r;
		}
		if (waited >= PARK_WAIT_TIMEOUT_MS) {
			fprintf(stderr, "kvpaged-llama: --park-wait: %s did not appear within %d s\n",
				path, PARK_WAIT_TIMEOUT_MS / 1000);
			return -ETIMEDOUT;
		}
		nanosleep(&poll, NULL);
	}
}

/*
 * --park-at: parks the sequence with every token committed, says so on stdout (whoever waits
 * for the line may now make the daemon preempt it), waits for the go-ahead and resumes.  The
 * tokens whose K/V did not come back are run again from the history into the new table; the
 * last of them is the token whose logits the next step samples from, so they must come out
 * bitwise as they were before the park.  Returns 0 or -errno.
 */
static int park_and_resume(struct engine *e, const struct generate_options *o,
			   struct continuation *c, const uint32_t *history,
			   uint32_t *ret_recompute, uint64_t *ret_resume_ns)
{
	const struct llama_config *cfg = &e->model.cfg;
	const float *logits = NULL;
	uint32_t recompute;
	uint64_t t_go;
	int r;

	/*
	 * Only committed full blocks go down the tiers on a swap, or stay findable after a drop;
	 * the partial last block is recomputed either way.
	 */
	if (c->uncommitted) {
		r = seq_commit(e, &c->seq, c->uncommitted);
		if (r < 0)
			return r;
		c->uncommitted = 0;
	}
	r = seq_park(e, &c->seq);
	if (r < 0)
		return r;
	printf("parked: %u tokens, %u generated\n", c->ntokens, c->generated);
	if (fflush(stdout) != 0) {
		fprintf(stderr, "kvpaged-llama: writing output: %s\n", strerror(errno));
		return -EIO;
	}
	if (o->park_wait) {
		r = wait_for_file(o->park_wait);
		if (r < 0)
			return r;
	}
	t_go = now_ns();
	r = seq_resume(e, &c->seq, c->ntokens, &recompute);
	if (r < 0)
		return r;
	for (uint32_t pos = c->ntokens - recompute; pos < c->ntokens; pos++) {
		r = seq_forward(e, &c->seq, history[pos], pos, &logits);
		if (r < 0)
			return r;
	}
	if (logits && memcmp(logits, c->logits, cfg->vocab_size * sizeof(float)) != 0) {
		fprintf(stderr, "kvpaged-llama: resume: the last token's logits, recomputed over "
				"the blocks that came back, differ from before the park\n");
		return -EBADMSG;
	}
	if (recompute) {
		r = seq_commit(e, &c->seq, c->ntokens);
		if (r < 0)
			return r;
	}
	*ret_resume_ns = now_ns() - t_go;
	printf("resumed: %u of %u tokens recomputed\n", recompute, c->ntokens);
	*ret_recompute = recompute;
	return 0;
}

/* The mask, and what the daemon held, as keys of a JSON summary (each followed by a comma). */
static void print_mask_json(const struct engine *e)
{
	if (e->h2o) {
		printf("\"h2o_budget\":%u,\"h2o_recent\":%u,\"h2o_sinks\":%u,\"h2o_decay\":%g,"
		       "\"h2o_granularity\":\"%s\",\"block_tokens\":%u,\"evicted_tokens\":%llu,"
		       "\"compactions\":%llu,",
		       e->h2o_cfg.budget, e->h2o_cfg.recent, e->h2o_cfg.n_sink, (double)e->h2o_cfg.decay,
		       e->h2o_cfg.tokens ? "tokens" : "blocks", e->h2o_cfg.block_tokens,
		       (unsigned long long)e->h2o_evicted, (unsigned long long)e->h2o_compactions);
		if (e->client)
			printf("\"max_held_blocks\":%u,", e->max_held);
		return;
	}
	if (!engine_bounded(e))
		return;
	printf("\"sinks\":%u,\"window\":%u,", e->mask.n_sink, e->mask.window);
	if (e->client)
		printf("\"pool_window\":%s,\"max_held_blocks\":%u,",
		       e->pool_window ? "true" : "false", e->max_held);
}

static void print_mask_text(const struct engine *e)
{
	if (e->h2o) {
		printf("; h2o (%s) keeping %u tokens, the last %u and the heaviest hitters, decay "
		       "%g: %llu evicted", e->h2o_cfg.tokens ? "tokens" : "blocks",
		       e->h2o_cfg.budget, e->h2o_cfg.recent, (double)e->h2o_cfg.decay,
		       (unsigned long long)e->h2o_evicted);
		if (e->client)
			printf(", at most %u blocks held", e->max_held);
		return;
	}
	if (!engine_bounded(e))
		return;
	printf("; attending to %u sinks and a window of %u", e->mask.n_sink, e->mask.window);
	if (e->client)
		printf(" (%s), at most %u blocks held", e->pool_window ? "the pool's window"
								      : "sinks retention",
		       e->max_held);
}

static double rate(uint64_t n, uint64_t ns)
{
	return ns ? (double)n * 1e9 / (double)ns : 0.0;
}

int engine_generate(struct engine *e, const struct generate_options *o,
		    struct generate_result *ret)
{
	const struct llama_config *cfg = &e->model.cfg;
	struct continuation *conts = NULL;
	uint32_t *tokens = NULL, *history = NULL, n, cached = 0, steps = o->steps, forwards = 0;
	uint64_t t_start, t_prefilled, t_first = 0, t_end, t_parked = 0, resume_ns = 0;
	uint32_t recompute = 0;
	bool parked = false;
	const float *logits = NULL;
	float *probs = NULL;
	int r;

	tokens = malloc((strlen(o->prompt) + 2) * sizeof(*tokens));
	conts = calloc(o->forks, sizeof(*conts));
	probs = malloc(cfg->vocab_size * sizeof(*probs));
	if (!tokens || !conts || !probs) {
		r = -ENOMEM;
		goto out;
	}
	n = (uint32_t)tokenizer_encode(&e->tok, o->prompt, 1, tokens);
	/*
	 * Bounded attention runs past the model's context: positions keep growing, and each
	 * token attends to its sinks and window only.
	 */
	const uint32_t context = engine_retains(e) ? LLAMA_MAX_POSITIONS : cfg->seq_len;

	if (n > context) {
		fprintf(stderr, "kvpaged-llama: the prompt is %u tokens; the model takes %u\n", n,
			context);
		r = -E2BIG;
		goto out;
	}
	/* Generated token i sits at position n + i and is run only if another one follows. */
	if (steps > context - n + 1)
		steps = context - n + 1;
	e->max_tokens = engine_retains(e) ? n + steps : cfg->seq_len;
	if (o->park) {
		if (o->forks != 1 || !e->client) {
			fprintf(stderr, "kvpaged-llama: --park-at parks one paged sequence\n");
			r = -EINVAL;
			goto out;
		}
		/* The tokens to run again on resume: the prompt's, then every one run after it. */
		history = malloc((size_t)(n + steps) * sizeof(*history));
		if (!history) {
			r = -ENOMEM;
			goto out;
		}
		memcpy(history, tokens, (size_t)n * sizeof(*history));
	}

	/* Forks share their last block until copy-on-write: their steps always wait. */
	e->defer = e->rings && !e->no_defer && o->forks == 1;
	e->max_held = 0;
	e->h2o_evicted = e->h2o_compactions = 0;
	t_start = now_ns();
	/* H2O opens with BOS alone and runs the prompt a step at a time, reporting as it goes. */
	r = seq_open(e, &conts[0].seq, tokens, e->h2o ? 1 : n, KVP_OPEN_RECOMPUTE_LAST, &cached);
	if (r < 0)
		goto out;
	if (cached >= n) {
		fprintf(stderr, "kvpaged-llama: the daemon says all %u prompt tokens are cached, "
				"though the last one was to be left to recompute\n", n);
		r = -EPROTO;
		goto out;
	}
	/* The cached prefix's K/V is in the pool already: start right after it. */
	for (uint32_t pos = cached; pos < n; pos++) {
		if (e->h2o && pos > 0) {
			r = seq_step(e, &conts[0].seq, pos, tokens[pos], pos);
			if (r < 0)
				goto out;
		}
		r = seq_forward(e, &conts[0].seq, tokens[pos], pos, &logits);
		if (r < 0)
			goto out;
	}
	r = seq_commit(e, &conts[0].seq, n);
	/* The commit released what no later token attends to: see which blocks are left. */
	if (r == 0 && engine_bounded(e))
		r = seq_refresh(e, &conts[0].seq, n);
	if (r < 0)
		goto out;
	t_prefilled = now_ns();

	for (uint32_t i = 0; i < o->forks; i++) {
		struct continuation *c = &conts[i];

		if (i > 0) {
			r = seq_fork(e, &conts[0].seq, n, &c->seq);
			if (r < 0)
				goto out;
		}
		c->logits = malloc(cfg->vocab_size * sizeof(float));
		if (!c->logits) {
			r = -ENOMEM;
			goto out;
		}
		memcpy(c->logits, logits, cfg->vocab_size * sizeof(float));
		c->rng = rng_seed(o->seed + i);
		c->ntokens = n;
		c->prev = tokens[n - 1];
		text_add(&c->text, "", 0);
		for (uint32_t p = 1; p < n; p++)
			text_add_token(&c->text, &e->tok, tokens[p - 1], tokens[p]);
		r = dump_open(o->dump_logits, i, o->forks, &c->dump);
		if (r < 0)
			goto out;
	}

	/* Round robin, so that the forks' first writes into the shared last block interleave. */
	for (uint32_t step = 0; step < steps; step++) {
		for (uint32_t i = 0; i < o->forks; i++) {
			struct continuation *c = &conts[i];
			uint32_t next;

			if (c->done)
				continue;
			/* Every generated token so far has been run: its K/V is in the pool. */
			if (o->park && !parked && c->generated == o->park_at) {
				uint64_t t_park = now_ns();

				r = park_and_resume(e, o, c, history, &recompute, &resume_ns);
				if (r < 0)
					goto out;
				parked = true;
				t_parked = now_ns() - t_park;
			}
			r = dump_logits(c->dump, c->logits, cfg->vocab_size);
			if (r < 0)
				goto out;
			next = sample(c->logits, probs, cfg->vocab_size, o->temperature, &c->rng);
			if (!t_first)
				t_first = now_ns();
			/* BOS starts the next story: this one is over (as in llama2.c). */
			if (next == TOKEN_BOS) {
				c->done = true;
				continue;
			}
			text_add_token(&c->text, &e->tok, c->prev, next);
			c->prev = next;
			c->generated++;
			if (step + 1 == steps)
				continue;
			/* The last token's K/V is written: commit it as this one gets a slot. */
			r = seq_step(e, &c->seq, c->uncommitted, next, c->ntokens);
			if (r < 0)
				goto out;
			if (history)
				history[c->ntokens] = next;
			r = seq_forward(e, &c->seq, next, c->ntokens, &logits);
			if (r < 0)
				goto out;
			c->ntokens++;
			c->uncommitted = c->ntokens;
			forwards++;
			memcpy(c->logits, logits, cfg->vocab_size * sizeof(float));
		}
	}
	for (uint32_t i = 0; i < o->forks; i++) {
		if (conts[i].uncommitted) {
			r = seq_commit(e, &conts[i].seq, conts[i].uncommitted);
			if (r < 0)
				goto out;
		}
	}
	t_end = now_ns();

	uint64_t generated = 0;
	for (uint32_t i = 0; i < o->forks; i++)
		generated += conts[i].generated;
	const double prefill_rate = rate(n - cached, t_prefilled - t_start);
	/* A park's wait and recompute are not decoding. */
	const double decode_rate = rate(forwards, t_end - t_prefilled - t_parked);
	/* Nor is a park before the first token (--park-at 0) part of the time to it. */
	const double ttft_ms =
		(double)((t_first ? t_first : t_end) - t_start - (o->park_at ? 0 : t_parked)) / 1e6;
	const char *mode = e->client ? "paged" : "contiguous";

	if (ret)
		*ret = (struct generate_result){
			.prompt_tokens = n,
			.cached = cached,
			.forwards = forwards,
			.prefill_tok_s = prefill_rate,
			.decode_tok_s = decode_rate,
			.ttft_ms = ttft_ms,
		};
	for (uint32_t i = 0; i < o->forks && !o->quiet; i++) {
		if (o->forks > 1)
			printf("--- continuation %u/%u ---\n", i + 1, o->forks);
		printf("%s\n", conts[i].text.s);
	}
	if (o->json && !o->quiet) {
		printf("{\"mode\":\"%s\",\"prompt_tokens\":%u,\"prefilled\":%u,\"reused\":%u,"
		       "\"generated\":%llu,\"continuations\":%u,\"decode_forwards\":%u,"
		       "\"prefill_tok_s\":%.1f,\"decode_tok_s\":%.1f,\"ttft_ms\":%.3f,"
		       "\"replaced_blocks\":%llu,",
		       mode, n, n - cached, cached, (unsigned long long)generated, o->forks,
		       forwards, prefill_rate, decode_rate, ttft_ms,
		       (unsigned long long)e->replaced);
		if (o->park)
			printf("\"parked\":%s,\"resumed_recompute\":%u,\"resume_ms\":%.3f,",
			       parked ? "true" : "false", recompute, (double)resume_ns / 1e6);
		print_mask_json(e);
		printf("\"texts\":[");
		for (uint32_t i = 0; i < o->forks; i++) {
			if (i)
				putchar(',');
			json_string(stdout, conts[i].text.s, conts[i].text.len);
		}
		printf("]}\n");
	} else if (!o->quiet) {
		printf("[%s] prefilled %u tokens, reused %u (cached); prefill %.1f tok/s, "
		       "decode %.1f tok/s (%llu tokens), first token %.3f ms",
		       mode, n - cached, cached, prefill_rate, decode_rate,
		       (unsigned long long)generated, ttft_ms);
		if (o->park && parked)
			printf("; parked after %u tokens, resumed recomputing %u in %.3f ms",
			       o->park_at, recompute, (double)resume_ns / 1e6);
		else if (o->park)
			printf("; not parked (ended before %u tokens)", o->park_at);
		print_mask_text(e);
		putchar('\n');
	}
	r = 0;
out:
	if (conts) {
		for (uint32_t i = 0; i < o->forks; i++) {
			if (conts[i].dump && fclose(conts[i].dump) != 0 && r == 0) {
				fprintf(stderr, "kvpaged-llama: writing logits: %s\n",
					strerror(errno));
				r = -EIO;
			}
			if (conts[i].seq.kv)
				seq_close(e, &conts[i].seq);
			free(conts[i].logits);
			free(conts[i].text.s);
		}
	}
	free(conts);
	free(probs);
	free(history);
	free(tokens);
	return r;
}

/* ------------------------------------------------------------------------------ perplexity */

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rbe");
	char *buf = NULL;
	size_t len = 0, cap = 0, got;

	if (!f) {
		fprintf(stderr, "kvpaged-llama: %s: %s\n", path, strerror(errno));
		return NULL;
	}
	do {
		if (len + 4096 + 1 > cap) {
			cap = (len + 4096 + 1) * 2;
			buf = realloc(buf, cap);
			if (!buf)
				abort();
		}
		got = fread(buf + len, 1, 4096, f);
		len += got;
	} while (got > 0);
	if (ferror(f)) {
		fprintf(stderr, "kvpaged-llama: %s: read error\n", path);
		free(buf);
		buf = NULL;
	} else {
		buf[len] = '\0';
	}
	fclose(f);
	return buf;
}

/* -log softmax(logits)[target], in double so that 1,804 terms add up without drift. */
static double nll(const float *logits, uint32_t n, uint32_t target)
{
	double max_val = logits[0], sum = 0.0;

	for (uint32_t i = 1; i < n; i++)
		if (logits[i] > max_val)
			max_val = logits[i];
	for (uint32_t i = 0; i < n; i++)
		sum += exp((double)logits[i] - max_val);
	return log(sum) + max_val - (double)logits[target];
}

/* What scoring found, over every story. */
struct score {
	double total; /* sum of -log p(next token) */
	uint64_t reused, checked;
	uint32_t sequence; /* the one being scored, from 1 */
};

/* Counts a scored paged sequence's reuse, and fails if a cached K/V row was not ours. */
static int score_check(struct engine *e, const struct seq *s, uint32_t cached,
		       struct score *sc)
{
	if (!e->client)
		return 0;
	if (s->paged.mismatched) {
		fprintf(stderr, "kvpaged-llama: sequence %u: %llu of %llu cached K/V rows differ "
				"from ours\n", sc->sequence,
			(unsigned long long)s->paged.mismatched,
			(unsigned long long)s->paged.compared);
		return -EBADMSG;
	}
	sc->reused += cached;
	sc->checked += s->paged.compared;
	return 0;
}

/*
 * Scores tokens[0..n).  Opened whole (steps false), as the README's procedure does for each
 * story: with the pool, its cached prefix is recomputed all the same (its logits are needed),
 * but its K/V is compared bitwise with the pool's instead of written, so a second run proves
 * that the blocks the first one committed hold exactly what this process computes.  Run a
 * token at a time (steps), as a generation is: opened with the first, then each step commits
 * what has been run and appends the next, so a bounded sequence's commits release what no
 * later token attends to and the pool holds a bounded number of its blocks however long it
 * gets.
 */
static int score_run(struct engine *e, const uint32_t *tokens, uint32_t n, bool steps,
		     FILE *dump, struct score *sc)
{
	const struct llama_config *cfg = &e->model.cfg;
	const float *logits;
	struct seq s = { 0 };
	uint32_t cached;
	int r;

	/* Flags 0: every cached block counts, since all of it is recomputed. */
	r = seq_open(e, &s, tokens, steps ? 1 : n, 0, &cached);
	for (uint32_t pos = 0; r == 0 && pos + 1 < n; pos++) {
		if (steps && pos > 0)
			r = seq_step(e, &s, pos, tokens[pos], pos);
		if (r == 0)
			r = seq_forward(e, &s, tokens[pos], pos, &logits);
		if (r == 0) {
			sc->total += nll(logits, cfg->vocab_size, tokens[pos + 1]);
			r = dump_logits(dump, logits, cfg->vocab_size);
		}
	}
	/* The last token was never run: only the ones before it hold K/V. */
	if (r == 0)
		r = seq_commit(e, &s, n - 1);
	if (r == 0)
		r = score_check(e, &s, cached, sc);
	if (s.kv)
		seq_close(e, &s);
	return r;
}

/*
 * The README's procedure: the file is split into stories on <|endoftext|>, each stripped of
 * the white space around it (empty ones skipped) and encoded as BOS plus the text with the
 * leading-space prefix; every token after BOS is predicted from those before it.  A story is
 * opened whole, or with bounded attention run a token at a time.
 *
 * --stream scores the file as one sequence instead: BOS, then every story's tokens (each with
 * its leading space, no BOS between them), run a token at a time past the model's context.
 * The same tokens are predicted.
 */
int engine_perplexity(struct engine *e, const struct perplexity_options *o)
{
	const struct llama_config *cfg = &e->model.cfg;
	const uint32_t context = o->stream ? LLAMA_MAX_POSITIONS : cfg->seq_len;
	uint64_t predicted = 0, t_start, t_end;
	uint32_t *tokens = NULL, stories = 0, len = 0;
	const bool steps = engine_retains(e);
	struct score sc = { 0 };
	FILE *dump = NULL;
	char *text, *p;
	int r = 0;

	text = read_file(o->path);
	if (!text)
		return -EIO;
	/* Each story's encoding takes at most its length + 2 entries, and a story is >= 1 byte. */
	tokens = malloc((strlen(text) * 3 + 3) * sizeof(*tokens));
	if (!tokens) {
		free(text);
		return -ENOMEM;
	}
	r = dump_open(o->dump_logits, 0, 1, &dump);
	if (r < 0)
		goto out;
	e->defer = e->rings && !e->no_defer;
	e->max_held = 0;
	e->h2o_evicted = e->h2o_compactions = 0;

	t_start = now_ns();
	if (o->stream)
		tokens[len++] = TOKEN_BOS;
	for (p = text; p;) {
		char *sep = strstr(p, STORY_SEPARATOR), *end = sep ? sep : p + strlen(p);
		uint32_t n;

		while (p < end && isspace((unsigned char)*p))
			p++;
		while (end > p && isspace((unsigned char)end[-1]))
			end--;
		if (end > p) {
			*end = '\0';
			n = (uint32_t)tokenizer_encode(&e->tok, p, !o->stream, tokens + len);
			if (len + n > context) {
				fprintf(stderr, "kvpaged-llama: %s %u tokens; the model takes %u\n",
					o->stream ? "the stream reaches" : "a story is",
					len + n, context);
				r = -E2BIG;
				goto out;
			}
			stories++;
			sc.sequence = stories;
			if (o->stream) {
				len += n;
			} else {
				e->max_tokens = steps ? n : cfg->seq_len;
				r = score_run(e, tokens, n, steps, dump, &sc);
				if (r < 0)
					goto out;
				predicted += n - 1;
			}
		}
		p = sep ? sep + strlen(STORY_SEPARATOR) : NULL;
	}
	if (o->stream && len > 1) {
		e->max_tokens = len;
		sc.sequence = 1;
		r = score_run(e, tokens, len, true, dump, &sc);
		if (r < 0)
			goto out;
		predicted = len - 1;
	}
	t_end = now_ns();
	if (predicted == 0) {
		fprintf(stderr, "kvpaged-llama: %s: no text to score\n", o->path);
		r = -EINVAL;
		goto out;
	}

	const double per_token = sc.total / (double)predicted;
	const char *mode = e->client ? "paged" : "contiguous";

	if (o->json) {
		printf("{\"mode\":\"%s\",\"nats_per_token\":%.6f,\"perplexity\":%.6f,"
		       "\"tokens\":%llu,\"stories\":%u,\"stream\":%s,\"reused\":%llu,"
		       "\"checked_rows\":%llu,",
		       mode, per_token, exp(per_token), (unsigned long long)predicted, stories,
		       o->stream ? "true" : "false", (unsigned long long)sc.reused,
		       (unsigned long long)sc.checked);
		print_mask_json(e);
		printf("\"tok_s\":%.1f}\n", rate(predicted, t_end - t_start));
	} else {
		printf("[%s] %.6f nats/token (perplexity %.4f) over %llu tokens in %u stories%s; "
		       "reused %llu (cached; %llu K/V rows equal to the pool's); %.1f tok/s",
		       mode, per_token, exp(per_token), (unsigned long long)predicted, stories,
		       o->stream ? " streamed as one sequence" : "", (unsigned long long)sc.reused,
		       (unsigned long long)sc.checked, rate(predicted, t_end - t_start));
		print_mask_text(e);
		putchar('\n');
	}
out:
	if (dump && fclose(dump) != 0 && r == 0) {
		fprintf(stderr, "kvpaged-llama: writing logits: %s\n", strerror(errno));
		r = -EIO;
	}
	free(tokens);
	free(text);
	return r;
}

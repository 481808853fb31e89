/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-llama: the sequence operations over both caches (generate.c and perplexity.c use them).
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

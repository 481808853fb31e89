/* SPDX-License-Identifier: MIT */
/*
 * Sequences and block tables on top of the pool and the prefix index.  Every mutating call
 * first checks everything that can fail (arguments, space, memory) and only then changes
 * state, so a failed call changes nothing.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/core/core-internal.h"

static void on_evict(void *ctx, uint32_t b)
{
	struct core *c = ctx;
	struct core_block *blk = &c->pool.blocks[b];

	tier_demote_block(c, b);
	/* Only indexed blocks are ever cached. */
	if (blk->flags & CORE_BLOCK_INDEXED)
		core_observe_removed(c, CORE_TIER_POOL, b);
	index_remove(&c->index, blk->hash, b);
	blk->flags &= ~CORE_BLOCK_INDEXED;
}

static int config_check(const struct core_config *cfg)
{
	if (cfg->policy > CORE_POLICY_COST || cfg->eviction > CORE_EVICT_VALUE)
		return -EINVAL;
	if (cfg->capacity_blocks == 0 || cfg->block_tokens == 0 ||
	    cfg->block_tokens > CORE_MAX_BLOCK_TOKENS || cfg->max_sequences == 0 ||
	    cfg->max_sequences > CORE_MAX_SEQUENCES || cfg->max_seq_tokens == 0 ||
	    !cfg->copy_block)
		return -EINVAL;
	if ((uint64_t)cfg->capacity_blocks * cfg->block_tokens > SIZE_MAX / sizeof(uint32_t))
		return -EINVAL;
	if (cfg->ntiers > CORE_MAX_TIERS)
		return -EINVAL;
	/* A level with no room would only shift the ones after it: the list holds what exists. */
	for (uint32_t i = 0; i < cfg->ntiers; i++) {
		const struct core_tier_config *t = &cfg->tiers[i];

		if (t->slots == 0 || !t->ops || !t->ops->store || !t->ops->load)
			return -EINVAL;
		/* A level nobody can see into ends the list: nothing is demoted past it. */
		if ((t->flags & ~(CORE_TIER_PROBED | CORE_TIER_STORE_EVICTED | CORE_TIER_COLD)) ||
		    ((t->flags & CORE_TIER_PROBED) && i + 1 != cfg->ntiers) ||
		    ((t->flags & CORE_TIER_STORE_EVICTED) && !(t->flags & CORE_TIER_PROBED)) ||
		    ((t->flags & CORE_TIER_COLD) && (t->flags & CORE_TIER_PROBED)))
			return -EINVAL;
		/* Cold levels last: a warm one below a cold one would be published from nowhere. */
		if (i > 0 && (cfg->tiers[i - 1].flags & CORE_TIER_COLD) &&
		    !(t->flags & (CORE_TIER_COLD | CORE_TIER_PROBED)))
			return -EINVAL;
	}
	return 0;
}

int core_new(const struct core_config *cfg, struct core **ret)
{
	struct core *c;
	size_t walk;
	int r;

	r = config_check(cfg);
	if (r < 0)
		return r;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->cfg = *cfg;

	r = pool_init(&c->pool, cfg->capacity_blocks, on_evict, c);
	if (r < 0)
		goto fail;
	r = index_init(&c->index, cfg->capacity_blocks);
	if (r < 0)
		goto fail;
	r = tiers_init(c);
	if (r < 0)
		goto fail;
	if (cfg->eviction == CORE_EVICT_VALUE) {
		r = value_new(cfg->capacity_blocks, cfg->block_tokens, cfg->value_records, c->pool.blocks, &c->index,
			      &c->value);
		if (r < 0)
			goto fail;
		c->pool.value = c->value;
	}
	r = -ENOMEM;
	c->tokens = calloc((size_t)cfg->capacity_blocks * cfg->block_tokens, sizeof(uint32_t));
	/* No sequence can hold more blocks than the pool has. */
	walk = (cfg->max_seq_tokens / cfg->block_tokens < cfg->capacity_blocks
			? cfg->max_seq_tokens / cfg->block_tokens
			: cfg->capacity_blocks) + 1;
	c->walk_cap = (uint32_t)walk - 1;
	c->walk = malloc(walk * sizeof(*c->walk));
	c->hit_tier = malloc(walk * sizeof(*c->hit_tier));
	c->hit_slot = malloc(walk * sizeof(*c->hit_slot));
	c->hit_hash = malloc((walk + 1) * sizeof(*c->hit_hash));
	c->loads = malloc(walk * sizeof(*c->loads));
	if (cfg->ntiers > 1)
		c->batch = malloc(walk * sizeof(*c->batch));
	c->seqs = calloc(cfg->max_sequences, sizeof(*c->seqs));
	c->victims = malloc((size_t)cfg->max_sequences * sizeof(*c->victims));
	c->free_slots = malloc((size_t)cfg->max_sequences * sizeof(*c->free_slots));
	if (cfg->copy_slots)
		c->gather = malloc((size_t)cfg->block_tokens * sizeof(*c->gather));
	if (!c->tokens || !c->walk || !c->seqs || !c->victims || !c->free_slots || !c->hit_tier ||
	    !c->hit_slot || !c->hit_hash || !c->loads || (cfg->ntiers > 1 && !c->batch) ||
	    (cfg->copy_slots && !c->gather))
		goto fail;
	/* Hand out low slots first: ids stay small and the slot array stays warm. */
	for (uint32_t i = 0; i < cfg->max_sequences; i++)
		c->free_slots[i] = cfg->max_sequences - 1 - i;
	c->nfree_slots = cfg->max_sequences;
	*ret = c;
	return 0;
fail:
	core_free(c);
	return r;
}

struct core *core_free(struct core *c)
{
	if (!c)
		return NULL;
	if (c->seqs)
		for (uint32_t i = 0; i < c->cfg.max_sequences; i++) {
			free(c->seqs[i].table);
			free(c->seqs[i].score);
			free(c->seqs[i].tscore);
			free(c->seqs[i].packed);
			free(c->seqs[i].ppos);
			free(c->seqs[i].pscore);
			free(c->seqs[i].hl);
			free(c->seqs[i].history);
			free(c->seqs[i].loads);
		}
	pool_done(&c->pool);
	index_done(&c->index);
	value_free(c->value);
	tiers_done(c);
	free(c->tokens);
	free(c->walk);
	free(c->hit_tier);
	free(c->hit_slot);
	free(c->hit_hash);
	free(c->loads);
	free(c->batch);
	free(c->gather);
	free(c->seqs);
	free(c->victims);
	free(c->free_slots);
	free(c);
	return NULL;
}

struct core_hash core_chain_hash(const struct core *c, struct core_hash parent, uint64_t salt,
				 uint64_t extra, const uint32_t *tokens)
{
	return core_hash_block(c->cfg.hash_fn, parent, core_hash_ns(salt, extra), tokens,
			       c->cfg.block_tokens);
}

/*
 * Grows a table (and its scores) to hold nblocks entries of B tokens.  0 or -ENOMEM; the table
 * is unchanged on failure.
 */
static int table_reserve(struct core_seq *s, uint32_t nblocks, uint32_t B)
{
	uint32_t cap = s->cap_blocks ? s->cap_blocks : 4;
	uint32_t *t;

	if (nblocks <= s->cap_blocks)
		return 0;
	while (cap < nblocks)
		cap = cap > UINT32_MAX / 2 ? nblocks : cap * 2;
	if (s->score) {
		/* Scores first: a table grown alone would be harmless, the reverse not. */
		float *sc = realloc(s->score, (size_t)cap * sizeof(*sc));

		if (!sc)
			return -ENOMEM;
		memset(sc + s->cap_blocks, 0, (size_t)(cap - s->cap_blocks) * sizeof(*sc));
		s->score = sc;
	}
	if (s->hl) {
		uint32_t *h = realloc(s->hl, (size_t)cap * sizeof(*h));

		if (!h)
			return -ENOMEM;
		s->hl = h;
	}
	if (s->tscore) {
		size_t per = B;
		float *sc = realloc(s->tscore, (size_t)cap * per * sizeof(*sc));

		if (!sc)
			return -ENOMEM;
		memset(sc + s->cap_blocks * per, 0, (size_t)(cap - s->cap_blocks) * per * sizeof(*sc));
		s->tscore = sc;
	}
	t = realloc(s->table, (size_t)cap * sizeof(*t));
	if (!t)
		return -ENOMEM;
	s->table = t;
	s->cap_blocks = cap;
	return 0;
}

/*
 * Gives back what table_reserve grew beyond cap entries, after a call that failed: a failed call
 * changes nothing, its memory included (core_seq_bytes counts on that).  Shrinking in place
 * does not fail with glibc; should it, the larger arrays are kept and stay correct.
 */
static void table_trim(struct core_seq *s, uint32_t cap, uint32_t B)
{
	void *p;

	if (cap >= s->cap_blocks)
		return;
	if (s->score && (p = realloc(s->score, (size_t)cap * sizeof(*s->score))))
		s->score = p;
	if (s->hl && (p = realloc(s->hl, (size_t)cap * sizeof(*s->hl))))
		s->hl = p;
	if (s->tscore && (p = realloc(s->tscore, (size_t)cap * B * sizeof(*s->tscore))))
		s->tscore = p;
	p = realloc(s->table, (size_t)cap * sizeof(*s->table));
	if (!p)
		return;
	s->table = p;
	s->cap_blocks = cap;
}

/* Writes token ids into the slots [from, from + n) of a sequence whose blocks exist. */
static void write_tokens(struct core *c, const struct core_seq *s, uint32_t from,
			 const uint32_t *tokens, uint32_t n)
{
	const uint32_t B = c->cfg.block_tokens;

	while (n > 0) {
		uint32_t slot = from % B, chunk = B - slot;

		if (chunk > n)
			chunk = n;
		memcpy(c->tokens + (size_t)s->table[from / B] * B + slot, tokens,
		       (size_t)chunk * sizeof(uint32_t));
		from += chunk;
		tokens += chunk;
		n -= chunk;
	}
}

/* An open's figures: nhit pool hits, the rest of what it holds from the tiers or missing. */
static void open_counted(struct core *c, const struct core_seq *s, uint32_t nhit)
{
	const uint32_t ready = s->ncommitted / c->cfg.block_tokens;

	c->stats.lookups++;
	c->stats.query_blocks += s->nblocks;
	c->stats.hit_blocks += nhit;
	c->stats.hit_tokens += s->ncommitted;
	c->stats.miss_blocks += s->nblocks - ready;
}

/* core_open_check's, with the flags the caller may set besides (CORE_OPEN_DEFER_LOADS). */
static int open_check(const struct core *c, const struct core_open *o, uint32_t flags,
		      const char **ret_why)
{
	const char *why;
	int r;

	if (o->ntokens == 0 || !o->tokens) {
		*ret_why = "empty prompt";
		return -EINVAL;
	}
	if (tokens_check(c, o->tokens, o->ntokens) < 0) {
		*ret_why = "a token id at or past the pool's vocab_size";
		return -EINVAL;
	}
	if (o->flags & ~(CORE_OPEN_RECOMPUTE_LAST | flags)) {
		*ret_why = "unknown flags";
		return -EINVAL;
	}
	why = core_retention_why(c, o, &r);
	if (why) {
		*ret_why = why;
		return r;
	}
	return 0;
}

int core_open_check(const struct core *c, const struct core_open *o, const char **ret_why)
{
	return open_check(c, o, 0, ret_why);
}

/* What core_seq_info tells of s (and core_seq_open of the sequence it opened). */
static void info_of(const struct core *c, const struct core_seq *s, struct core_seq_info *ret)
{
	*ret = (struct core_seq_info){
		.state = s->state,
		.priority = s->priority,
		.salt = s->salt,
		.extra = s->extra,
		.ntokens = s->ntokens,
		.ncommitted = s->ncommitted,
		.nblocks = s->nblocks,
		.table = s->table,
		.retention = s->retention,
		.n_sink = s->n_sink,
		.recent = s->recent,
		.budget = s->budget,
		.granularity = s->granularity,
		.packed = s->packed,
		.packed_positions = s->ppos,
		.npacked = s->npacked,
		.held_blocks = s->nblocks - s->freed + s->packed_cap / c->cfg.block_tokens,
		.retained_tokens = s->ntokens - s->freed * c->cfg.block_tokens + s->npacked,
		.freed_blocks = s->freed,
	};
}

int core_seq_open(struct core *c, const struct core_open *o, uint64_t *ret_seq,
		  struct core_seq_info *ret_info)
{
	uint32_t nblocks, nhit, ready, slot;
	struct core_hash chain;
	struct core_seq *s;
	uint32_t *table, *hl = NULL, holes = 0, nloads = 0;
	struct core_load *loads = NULL;
	float *score = NULL;
	int r;

	r = open_check(c, o, CORE_OPEN_DEFER_LOADS | CORE_OPEN_PROBED, &(const char *){ NULL });
	if (r < 0)
		return r;
	if (o->ntokens > c->cfg.max_seq_tokens)
		return -E2BIG;
	if (c->nfree_slots == 0)
		return -EMFILE;
	if (o->retention == CORE_RETAIN_H2O) {
		/* Blocks: a score per table entry; tokens: one per position. */
		score = calloc((size_t)blocks_for(c, o->ntokens) *
				       (o->granularity == CORE_H2O_TOKENS ? c->cfg.block_tokens : 1),
			       sizeof(*score));
		hl = malloc((size_t)blocks_for(c, o->ntokens) * sizeof(*hl));
		if (!score || !hl) {
			free(score);
			free(hl);
			return -ENOMEM;
		}
		for (uint32_t i = 0; i < blocks_for(c, o->ntokens); i++)
			hl[i] = i;
	}
	r = lookup_attach(c, o, o->priority, &table, &nblocks, &nhit, &ready, &chain, &holes,
			  o->flags & CORE_OPEN_DEFER_LOADS ? &loads : NULL, &nloads);
	if (r < 0) {
		free(score);
		free(hl);
		return r;
	}

	slot = c->free_slots[--c->nfree_slots];
	s = &c->seqs[slot];
	s->gen++;
	s->state = CORE_SEQ_ACTIVE;
	s->priority = o->priority;
	s->last_use = ++c->tick;
	s->opened = c->now;
	s->salt = o->salt;
	s->extra = o->extra;
	s->table = table;
	s->cap_blocks = nblocks;
	s->nblocks = nblocks;
	s->ntokens = o->ntokens;
	s->ncommitted = ready * c->cfg.block_tokens;
	s->chain = chain;
	s->pruned = false;
	s->probed = o->flags & CORE_OPEN_PROBED;
	/* A window pool's hit may leave out blocks the window does not need. */
	s->freed = s->prune_from = holes;
	if (c->cfg.window) {
		s->retention = CORE_RETAIN_SINKS;
		s->n_sink = 0;
		s->recent = c->cfg.window;
	} else {
		s->retention = (uint8_t)o->retention;
		s->n_sink = o->retention == CORE_RETAIN_FULL ? 0 : o->n_sink;
		s->recent = o->recent;
		s->budget = o->budget;
		s->decay = o->decay > 0 ? o->decay : 1;
		s->granularity = (uint8_t)o->granularity;
	}
	s->hl = hl;
	s->nhl = hl ? nblocks : 0;
	s->scale = 1;
	if (s->retention == CORE_RETAIN_H2O && s->granularity == CORE_H2O_TOKENS) {
		s->tscore = score;
		s->score = NULL;
	} else {
		s->score = score;
		s->tscore = NULL;
	}
	write_tokens(c, s, s->ncommitted, o->tokens + s->ncommitted, o->ntokens - s->ncommitted);
	*ret_seq = seq_id(c, slot);
	if (loads) {
		/* Pruning and the lookup's figures wait for the loads (core_seq_loaded). */
		s->state = CORE_SEQ_LOADING;
		s->loads = loads;
		s->nloads = nloads;
		s->load_nhit = ready;
		s->load_resume = false;
	} else {
		retain_prune(c, s);
		open_counted(c, s, nhit);
	}
	if (ret_info)
		info_of(c, s, ret_info);
	return 0;
}

int core_seq_append(struct core *c, uint64_t id, const uint32_t *tokens, uint32_t n)
{
	const uint32_t B = c->cfg.block_tokens;
	uint32_t nblocks, need, last, first_changed, cap;
	struct core_seq *s;
	bool cow;
	int r;

	r = seq_get_active(c, id, &s);
	if (r < 0)
		return r;
	r = tokens_check(c, tokens, n);
	if (r < 0)
		return r;
	if ((uint64_t)s->ntokens + n > c->cfg.max_seq_tokens)
		return -E2BIG;

	last = s->nblocks - 1;
	/* A partly filled last block that others share must be copied before it is written. */
	cow = s->ntokens % B != 0 && c->pool.blocks[s->table[last]].refcount > 1;
	nblocks = blocks_for(c, s->ntokens + n);
	need = nblocks - s->nblocks + cow;
	/* Memory first (table growth cannot be undone after drops), then room in the pool. */
	cap = s->cap_blocks;
	r = table_reserve(s, nblocks, c->cfg.block_tokens);
	if (r < 0)
		return r;
	r = preempt_make_room(c, need, 0, s->priority);
	if (r < 0) {
		table_trim(s, cap, B);
		return r;
	}
	s->last_use = ++c->tick;

	first_changed = s->nblocks;
	if (cow) {
		uint32_t old = s->table[last], copy = pool_alloc(&c->pool);

		r = c->cfg.copy_block(c->cfg.copy_ctx, copy, old);
		if (r < 0) {
			pool_unref(&c->pool, copy);
			table_trim(s, cap, B);
			return r;
		}
		memcpy(c->tokens + (size_t)copy * B, core_slot_tokens(c, old),
		       (size_t)(s->ntokens % B) * sizeof(uint32_t));
		s->table[last] = copy;
		pool_unref(&c->pool, old);
		c->stats.cow_copies++;
		first_changed = last;
	}
	for (uint32_t i = s->nblocks; i < nblocks; i++) {
		s->table[i] = pool_alloc(&c->pool);
		if (s->hl)
			s->hl[s->nhl++] = i; /* room: table_reserve grew it with the table */
	}
	s->nblocks = nblocks;
	write_tokens(c, s, s->ntokens, tokens, n);
	s->ntokens += n;
	return (int)first_changed;
}

/* How many leading tokens a retention policy lets attend to everything before them. */
static uint64_t full_prefix(const struct core_seq *s)
{
	if (s->retention == CORE_RETAIN_SINKS)
		return (uint64_t)s->n_sink + s->recent;
	if (s->retention == CORE_RETAIN_H2O)
		return s->budget;
	return UINT64_MAX;
}

/* Block i of s just became full and committed: make it READY and, when possible, findable. */
static int commit_block(struct core *c, struct core_seq *s, uint32_t i)
{
	uint32_t b = s->table[i], parent = i > 0 ? s->table[i - 1] : CORE_NONE, found;
	struct core_block *blk = &c->pool.blocks[b];
	uint64_t extra;

	if (blk->state == CORE_BLOCK_READY) {
		s->chain = blk->hash; /* a fork sibling committed this shared block already */
		return 0;
	}
	/* s->chain is block i - 1's hash (blocks are committed in order). */
	/* A window pool's sequences all compute K/V the same way: no tag there. */
	extra = block_extra(c, s->extra,
			    c->cfg.window ? 0 : retention_tag(s->retention, s->n_sink, s->recent),
			    full_prefix(s), i);
	blk->hash = core_chain_hash(c, s->chain, s->salt, extra, core_slot_tokens(c, b));
	blk->salt = s->salt;
	blk->extra = extra;
	blk->parent = s->chain;
	blk->state = CORE_BLOCK_READY;
	s->chain = blk->hash;
	c->stats.commits++;

	/*
	 * Under h2o a token's attention leaves out earlier tokens as soon as more than budget
	 * precede it, and what it leaves out depends on the scores the client reported: such
	 * blocks stay this sequence's own.  (Sinks blocks past n_sink + recent are keyed with the
	 * policy's tag instead: the same policy computes the same K/V.)
	 */
	if (s->retention == CORE_RETAIN_H2O &&
	    (s->pruned || (uint64_t)(i + 1) * c->cfg.block_tokens > full_prefix(s)))
		return 0;
	/* A block is findable only through its parent, so an unfindable parent ends the chain. */
	if (parent != CORE_NONE && !(c->pool.blocks[parent].flags & CORE_BLOCK_INDEXED))
		return 0;
	if (i > 0 && parent == CORE_NONE)
		return 0; /* the parent was pruned from this sequence */

	found = index_find(&c->index, c->pool.blocks, blk->hash);
	if (found == CORE_NONE) {
		index_insert(&c->index, blk->hash, b);
		blk->flags |= CORE_BLOCK_INDEXED;
		core_observe_stored(c, CORE_TIER_POOL, b, core_slot_tokens(c, b), 0, 0);
		if (s->probed && c->probe_tier) {
			blk->flags |= CORE_BLOCK_REMOTE;
			if (!(c->tiers[c->probe_tier].cfg->flags & CORE_TIER_STORE_EVICTED))
				tier_publish(c, b);
		}
		return 0;
	}

	const struct core_block *fb = &c->pool.blocks[found];
	if (!core_hash_eq(fb->parent, blk->parent) || fb->salt != s->salt || fb->extra != extra ||
	    memcmp(core_slot_tokens(c, found), core_slot_tokens(c, b),
		   (size_t)c->cfg.block_tokens * sizeof(uint32_t)) != 0) {
		c->stats.collisions++;
		return 0;
	}
	/*
	 * Someone committed the same block first.  When we are the only holder of our copy, use
	 * theirs and free ours, so the rest of this chain stays findable and memory is not
	 * duplicated.  A shared copy stays as it is (not findable).
	 */
	if (blk->refcount != 1)
		return 0;
	pool_ref(&c->pool, found);
	s->table[i] = found;
	pool_unref(&c->pool, b);
	c->stats.dedup_blocks++;
	return 1;
}

int core_seq_commit(struct core *c, uint64_t id, uint32_t ntokens)
{
	const uint32_t B = c->cfg.block_tokens;
	struct core_seq *s;
	int replaced = 0, r;

	r = seq_get_active(c, id, &s);
	if (r < 0)
		return r;
	if (ntokens > s->ntokens)
		return -EINVAL;
	if (ntokens <= s->ncommitted)
		return 0;
	if (s->retention == CORE_RETAIN_H2O)
		retain_decay_scores(c, s);
	for (uint32_t i = s->ncommitted / B; i < ntokens / B; i++)
		replaced += commit_block(c, s, i);
	s->ncommitted = ntokens;
	s->last_use = ++c->tick;
	retain_prune(c, s);
	return replaced;
}

int core_seq_fork(struct core *c, uint64_t id, uint64_t *ret_child)
{
	struct core_seq *s, *child;
	uint32_t *table, slot, *hl = NULL;
	float *score = NULL;
	int r;

	r = seq_get_active(c, id, &s);
	if (r < 0)
		return r;
	if (c->nfree_slots == 0)
		return -EMFILE;
	/* Packed blocks are rewritten in place: sharing them would need copy-on-write. */
	if (s->tscore)
		return -EINVAL;
	if (s->score) {
		score = malloc((size_t)s->nblocks * sizeof(*score) + 1);
		hl = malloc((size_t)s->nblocks * sizeof(*hl) + 1);
		if (!score || !hl) {
			free(score);
			free(hl);
			return -ENOMEM;
		}
		memcpy(score, s->score, (size_t)s->nblocks * sizeof(*score));
		memcpy(hl, s->hl, (size_t)s->nhl * sizeof(*hl));
	}
	table = malloc((size_t)s->nblocks * sizeof(*table));
	if (!table) {
		free(score);
		free(hl);
		return -ENOMEM;
	}
	memcpy(table, s->table, (size_t)s->nblocks * sizeof(*table));
	for (uint32_t i = 0; i < s->nblocks; i++)
		if (table[i] != CORE_NONE)
			pool_ref(&c->pool, table[i]);

	slot = c->free_slots[--c->nfree_slots];
	child = &c->seqs[slot];
	child->gen++;
	child->state = CORE_SEQ_ACTIVE;
	child->priority = s->priority;
	child->last_use = s->last_use = ++c->tick;
	child->opened = c->now;
	child->salt = s->salt;
	child->extra = s->extra;
	child->table = table;
	child->cap_blocks = s->nblocks;
	child->nblocks = s->nblocks;
	child->ntokens = s->ntokens;
	child->ncommitted = s->ncommitted;
	child->chain = s->chain;
	child->retention = s->retention;
	child->pruned = s->pruned;
	child->probed = s->probed; /* the same namespace: its commits are offered too */
	child->n_sink = s->n_sink;
	child->recent = s->recent;
	child->prune_from = s->prune_from;
	child->freed = s->freed;
	child->budget = s->budget;
	child->decay = s->decay;
	child->granularity = s->granularity;
	child->score = score;
	child->hl = hl;
	child->nhl = hl ? s->nhl : 0;
	child->scale = s->scale;
	*ret_child = seq_id(c, slot);
	return 0;
}

int core_seq_park(struct core *c, uint64_t id)
{
	const uint32_t B = c->cfg.block_tokens;
	struct core_seq *s;
	uint32_t *history;
	int r;

	r = seq_get_active(c, id, &s);
	if (r < 0)
		return r;
	/* Its released blocks' tokens are gone: it could not be recomputed. */
	if (s->retention != CORE_RETAIN_FULL)
		return -EINVAL;
	/* Keep the token ids now: once dropped, its blocks may be reused by anyone. */
	history = malloc((size_t)s->ntokens * sizeof(*history));
	if (!history)
		return -ENOMEM;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		uint32_t n = i + 1 < s->nblocks ? B : s->ntokens - i * B;

		memcpy(history + (size_t)i * B, core_slot_tokens(c, s->table[i]),
		       (size_t)n * sizeof(*history));
	}
	s->history = history;
	s->state = CORE_SEQ_PARKED;
	s->last_use = ++c->tick;
	return 0;
}

int core_seq_resume(struct core *c, uint64_t id, uint32_t *ret_recompute)
{
	return core_seq_resume_flags(c, id, 0, ret_recompute);
}

int core_seq_resume_flags(struct core *c, uint64_t id, uint32_t flags, uint32_t *ret_recompute)
{
	struct core_seq *s = seq_get(c, id);
	struct core_open o;
	uint32_t nblocks, nhit, ready, nloads = 0;
	struct core_load *loads = NULL;
	uint32_t *table;
	int r;

	if (!s)
		return -ENOENT;
	if (flags & ~CORE_OPEN_DEFER_LOADS)
		return -EINVAL;
	if (s->state == CORE_SEQ_ACTIVE)
		return -EINVAL;
	if (s->state == CORE_SEQ_LOADING)
		return -EBUSY;
	if (s->state == CORE_SEQ_PARKED) {
		free(s->history);
		s->history = NULL;
		s->state = CORE_SEQ_ACTIVE;
		s->last_use = ++c->tick;
		if (ret_recompute)
			*ret_recompute = 0;
		return 0;
	}

	/* Dropped: reopen from the history, taking whatever of it is still cached or swapped. */
	o = (struct core_open){ .salt = s->salt, .extra = s->extra, .tokens = s->history,
				.ntokens = s->ntokens,
				.flags = CORE_OPEN_RECOMPUTE_LAST | (s->probed ? CORE_OPEN_PROBED : 0) };
	r = lookup_attach(c, &o, s->priority, &table, &nblocks, &nhit, &ready, &s->chain, NULL,
			  flags & CORE_OPEN_DEFER_LOADS ? &loads : NULL, &nloads);
	if (r < 0)
		return r;
	s->table = table;
	s->cap_blocks = s->nblocks = nblocks;
	s->ncommitted = ready * c->cfg.block_tokens;
	write_tokens(c, s, s->ncommitted, s->history + s->ncommitted, s->ntokens - s->ncommitted);
	free(s->history);
	s->history = NULL;
	s->state = loads ? CORE_SEQ_LOADING : CORE_SEQ_ACTIVE;
	s->loads = loads;
	s->nloads = nloads;
	s->load_nhit = ready;
	s->load_resume = true;
	s->last_use = ++c->tick;
	s->opened = c->now;
	if (ret_recompute)
		*ret_recompute = s->ntokens - s->ncommitted;
	return 0;
}

int core_seq_pending_loads(struct core *c, uint64_t id, struct core_load **ret,
			   uint32_t *ret_n)
{
	struct core_seq *s = seq_get(c, id);

	if (!s)
		return -ENOENT;
	*ret = s->state == CORE_SEQ_LOADING ? s->loads : NULL;
	*ret_n = s->state == CORE_SEQ_LOADING ? s->nloads : 0;
	return 0;
}

int core_seq_loaded(struct core *c, uint64_t id)
{
	struct core_seq *s = seq_get(c, id);
	uint32_t good, ready;

	if (!s)
		return -ENOENT;
	if (s->state != CORE_SEQ_LOADING)
		return -EINVAL;
	good = lookup_promote_finish(c, s->table, s->load_nhit, s->loads, s->nloads);
	ready = s->load_nhit + good;
	s->ncommitted = ready * c->cfg.block_tokens;
	s->chain = ready ? c->pool.blocks[s->table[ready - 1]].hash : (struct core_hash){ 0, 0 };
	free(s->loads);
	s->loads = NULL;
	s->nloads = 0;
	s->state = CORE_SEQ_ACTIVE;
	s->last_use = ++c->tick;
	if (!s->load_resume) {
		retain_prune(c, s);
		open_counted(c, s, s->load_nhit);
	}
	return 0;
}

int core_seq_close(struct core *c, uint64_t id)
{
	return core_seq_close_reuse(c, id, CORE_REUSE_DEFAULT);
}

int core_seq_close_reuse(struct core *c, uint64_t id, uint32_t reuse)
{
	struct core_seq *s = seq_get(c, id);

	if (!s)
		return -ENOENT;
	if (reuse > CORE_REUSE_MAX)
		return -EINVAL;
	/* Its blocks are being written: closing waits for core_seq_loaded. */
	if (s->state == CORE_SEQ_LOADING)
		return -EBUSY;
	if (s->table)
		release_table_reuse(c, s, reuse);
	for (uint32_t k = 0; k < s->packed_cap / c->cfg.block_tokens; k++)
		pool_unref(&c->pool, s->packed[k]);
	free(s->table);
	free(s->history);
	free(s->score);
	free(s->tscore);
	free(s->packed);
	free(s->ppos);
	free(s->pscore);
	free(s->hl);
	/*
	 * The whole slot back to zero but its generation: open and fork set what they use, and
	 * nothing of this sequence (its policy, granularity, budget) can leak into the next.
	 */
	*s = (struct core_seq){ .gen = s->gen };
	c->free_slots[c->nfree_slots++] = (uint32_t)id;
	return 0;
}

int core_seq_info(const struct core *c, uint64_t id, struct core_seq_info *ret)
{
	const struct core_seq *s = seq_get(c, id);

	if (!s)
		return -ENOENT;
	info_of(c, s, ret);
	return 0;
}

uint64_t core_seq_bytes(const struct core *c, uint32_t retention, uint32_t granularity,
			uint32_t ntokens, uint32_t state)
{
	const uint64_t B = c->cfg.block_tokens, nb = (ntokens + B - 1) / B;
	/* A table grows by doubling from what it needs (4 entries at least): under twice that. */
	const uint64_t entries = nb * 2 > 4 ? nb * 2 : 4;
	uint64_t per_entry = sizeof(uint32_t), bytes = 0;

	if (retention == CORE_RETAIN_H2O) {
		/* The held list, and a score per entry or per position. */
		per_entry += sizeof(uint32_t) +
			     (granularity == CORE_H2O_TOKENS ? B : 1) * sizeof(float);
		/* Packed slots: fewer than the tokens plus one block, each a position and score. */
		if (granularity == CORE_H2O_TOKENS)
			bytes += (nb + 1) * (sizeof(uint32_t) + B * (sizeof(uint32_t) + sizeof(float)));
	}
	if (state != CORE_SEQ_DROPPED)
		bytes += entries * per_entry;
	if (state == CORE_SEQ_PARKED || state == CORE_SEQ_DROPPED)
		bytes += (uint64_t)ntokens * sizeof(uint32_t);
	return bytes;
}

uint32_t core_drop_cache(struct core *c)
{
	uint32_t n = 0;

	c->dropping = true;
	while (pool_evict_oldest(&c->pool))
		n++;
	n += tiers_drop_all(c);
	c->dropping = false;
	return n;
}

uint32_t core_get_preemptions(const struct core *c, struct core_preemption *ret, uint32_t max)
{
	uint32_t n = c->nlog < CORE_PREEMPTION_LOG ? c->nlog : CORE_PREEMPTION_LOG;

	if (n > max)
		n = max;
	for (uint32_t i = 0; i < n; i++)
		ret[i] = c->log[(c->nlog - 1 - i) % CORE_PREEMPTION_LOG];
	return n;
}

void core_set_now(struct core *c, double now)
{
	c->now = now;
	if (c->value)
		value_set_now(c->value, now);
}

int core_get_value_stats(const struct core *c, struct core_value_stats *ret)
{
	if (!c->value)
		return -ENOENT;
	value_get_stats(c->value, ret);
	return 0;
}

const uint32_t *core_block_tokens(const struct core *c, uint32_t b)
{
	return b < c->cfg.capacity_blocks ? core_slot_tokens(c, b) : NULL;
}

void core_get_stats(const struct core *c, struct core_stats *ret)
{
	*ret = c->stats;
	ret->evictions = c->pool.reused;
}

void core_get_usage(const struct core *c, struct core_usage *ret)
{
	*ret = (struct core_usage){
		.capacity = c->pool.capacity,
		.free = c->pool.nfree,
		.cached = c->pool.ncached,
		.in_use = pool_in_use(&c->pool),
		.indexed = c->index.count,
		.sequences = c->cfg.max_sequences - c->nfree_slots,
	};
}

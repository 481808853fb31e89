/* SPDX-License-Identifier: MIT */
/*
 * The tiers below the pool: bookkeeping only.  Each tier reuses the pool's machinery (block
 * metadata, free list, LRU) and the prefix index, keyed by the same chain hashes, so a lookup
 * walks one namespace from the pool down.  The levels are a list (cfg.tiers): nothing here
 * knows what one is made of, and the bytes move through each level's own ops.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/core/core-internal.h"
#include "daemon/core/cost.h"

static struct core_key slot_key(const struct tier *t, uint32_t slot)
{
	const struct core_block *e = &t->pool.blocks[slot];

	return (struct core_key){ .hash = e->hash, .parent = e->parent, .salt = e->salt,
				  .extra = e->extra };
}

static int store_into(struct core *c, uint32_t to, uint32_t from_tier, uint32_t from,
		      const struct core_key *key);

/* A tier slot is being reused: move its block one tier down (if any), then forget it. */
static void on_tier_evict(void *ctx, uint32_t slot)
{
	struct tier *t = ctx;
	struct core *c = t->c;
	struct core_block *e = &t->pool.blocks[slot];
	struct core_key key = slot_key(t, slot);

	/* Out of the index first, so a demotion below cannot find two copies. */
	core_observe_removed(c, t->id, slot);
	index_remove(&t->index, e->hash, slot);
	e->flags &= ~CORE_BLOCK_INDEXED;
	t->stats.evictions++;
	if (c->dropping)
		return;
	/* The last level whose slots can be read back (the last local one, or above the cold). */
	if (t->id == c->publish_tier && (e->flags & CORE_BLOCK_REMOTE))
		tier_publish_evicted(c, t->id, slot, &key);
	if (local_tier_exists(c, t->id + 1))
		(void)store_into(c, t->id + 1, t->id, slot, &key);
}

/*
 * Stores a block into tier to.  A block already there only gets fresher.  When every slot of
 * the tier is held by a lookup in progress the block goes one tier further down (and is left
 * out below the last: -ENOSPC); a failed store leaves it out (its -errno).  0 when it is kept.
 */
static int store_into(struct core *c, uint32_t to, uint32_t from_tier, uint32_t from,
		      const struct core_key *key)
{
	struct tier *t = &c->tiers[to];
	struct core_block *e;
	uint32_t slot;
	int r;

	slot = index_find(&t->index, t->pool.blocks, key->hash);
	if (slot != CORE_NONE) {
		e = &t->pool.blocks[slot];
		if (e->refcount == 0) {
			pool_ref(&t->pool, slot);
			pool_unref(&t->pool, slot); /* newest on the LRU */
		}
		return 0;
	}
	slot = pool_alloc(&t->pool);
	if (slot == CORE_NONE)
		return local_tier_exists(c, to + 1) ? store_into(c, to + 1, from_tier, from, key)
						    : -ENOSPC;
	r = t->cfg->ops->store(t->cfg->ctx, from_tier, from, to, slot, key);
	if (r < 0) {
		t->stats.store_errors++;
		pool_unref(&t->pool, slot); /* not indexed: back to the free list */
		return r;
	}
	e = &t->pool.blocks[slot];
	e->hash = key->hash;
	e->salt = key->salt;
	e->extra = key->extra;
	e->parent = key->parent;
	e->state = CORE_BLOCK_READY;
	/* Whether it may go on to the probed level goes down with it. */
	e->flags |= CORE_BLOCK_INDEXED |
		    ((from_tier == CORE_TIER_POOL ? c->pool.blocks[from].flags
						  : c->tiers[from_tier].pool.blocks[from].flags) &
		     CORE_BLOCK_REMOTE);
	index_insert(&t->index, key->hash, slot);
	core_observe_stored(c, to, slot, key->tokens, from_tier, from);
	pool_unref(&t->pool, slot); /* cached: newest on the LRU */
	t->stats.demotions++;
	return 0;
}

void tier_demote_block(struct core *c, uint32_t b)
{
	const struct core_block *blk = &c->pool.blocks[b];
	struct core_key key;
	bool leaves;

	if (c->dropping)
		return;
	key = (struct core_key){
		.hash = blk->hash,
		.parent = blk->parent,
		.salt = blk->salt,
		.extra = blk->extra,
		.tokens = core_slot_tokens(c, b),
	};
	/*
	 * It leaves every local level (the pool is the last, or the cost model chose to recompute
	 * it here rather than move it down: another node may still want it), or it leaves the
	 * last level that can be read back (every local level is cold).
	 */
	leaves = !c->first_tier || (blk->flags & CORE_BLOCK_NODEMOTE);
	if ((leaves || c->publish_tier == CORE_TIER_POOL) && (blk->flags & CORE_BLOCK_REMOTE))
		tier_publish_evicted(c, CORE_TIER_POOL, b, &key);
	if (!leaves)
		(void)store_into(c, c->first_tier, CORE_TIER_POOL, b, &key);
}

static void observe(struct core *c, enum core_event_kind kind, uint32_t level, uint32_t slot,
		    const uint32_t *tokens, uint32_t from_level, uint32_t from_slot)
{
	const struct core_block *e = level == CORE_TIER_POOL ? &c->pool.blocks[slot]
							     : &c->tiers[level].pool.blocks[slot];
	struct core_event ev = { .kind = kind, .level = level, .slot = slot, .hash = e->hash,
				 .parent = e->parent, .salt = e->salt, .extra = e->extra,
				 .tokens = tokens, .from_level = from_level,
				 .from_slot = from_slot };

	c->cfg.observe(c->cfg.observe_ctx, &ev);
}

void core_observe_stored(struct core *c, uint32_t level, uint32_t slot, const uint32_t *tokens,
			 uint32_t from_level, uint32_t from_slot)
{
	if (c->cfg.observe)
		observe(c, CORE_EVENT_STORED, level, slot, tokens, from_level, from_slot);
}

void core_observe_removed(struct core *c, uint32_t level, uint32_t slot)
{
	if (c->cfg.observe)
		observe(c, CORE_EVENT_REMOVED, level, slot, NULL, 0, 0);
}

void tier_publish_evicted(struct core *c, uint32_t from_tier, uint32_t from,
			  const struct core_key *key)
{
	struct tier *t;
	int r;

	if (!c->probe_tier)
		return;
	t = &c->tiers[c->probe_tier];
	if (!(t->cfg->flags & CORE_TIER_STORE_EVICTED))
		return;
	t->stats.published++;
	r = t->cfg->ops->store(t->cfg->ctx, from_tier, from, t->id, CORE_NONE, key);
	if (r < 0)
		t->stats.store_errors++;
}

uint32_t tier_find(const struct core *c, struct core_hash h, struct core_hash parent,
		   uint64_t salt, uint64_t extra, uint32_t *ret_slot)
{
	for (uint32_t t = 1; t <= c->cfg.ntiers && !c->tiers[t].probed; t++) {
		const struct tier *tr = &c->tiers[t];
		const struct core_block *e;
		uint32_t slot;

		slot = index_find(&tr->index, tr->pool.blocks, h);
		if (slot == CORE_NONE)
			continue;
		e = &tr->pool.blocks[slot];
		/* The tokens are checked by the load, against the prompt. */
		if (!core_hash_eq(e->parent, parent) || e->salt != salt || e->extra != extra)
			return 0;
		*ret_slot = slot;
		return t;
	}
	return 0;
}

/* A probed level's loads hold nothing: hold, put and release are no-ops there. */
void tier_hold(struct core *c, uint32_t t, uint32_t slot)
{
	if (!c->tiers[t].probed)
		pool_ref(&c->tiers[t].pool, slot);
}

void tier_put(struct core *c, uint32_t t, uint32_t slot)
{
	if (!c->tiers[t].probed)
		pool_unref(&c->tiers[t].pool, slot);
}

void tier_release(struct core *c, uint32_t t, uint32_t slot)
{
	struct tier *tr = &c->tiers[t];
	struct core_block *e;

	if (tr->probed)
		return;
	e = &tr->pool.blocks[slot];
	if (e->flags & CORE_BLOCK_INDEXED)
		core_observe_removed(c, t, slot);
	index_remove(&tr->index, e->hash, slot);
	e->flags &= ~CORE_BLOCK_INDEXED;
	pool_unref(&tr->pool, slot); /* unindexed: to the free list */
}

/*
 * The next block a persist pass takes, the most worth keeping first: the pool's newest cached
 * block, else the newest of the nearest tier above `to` that holds any.  *ret_tier: where.
 */
static uint32_t persist_next(const struct core *c, uint32_t to, uint32_t *ret_tier)
{
	*ret_tier = CORE_TIER_POOL;
	if (c->pool.lru_tail != CORE_NONE)
		return c->pool.lru_tail;
	for (uint32_t t = 1; t < to; t++)
		if (c->tiers[t].pool.lru_tail != CORE_NONE) {
			*ret_tier = t;
			return c->tiers[t].pool.lru_tail;
		}
	return CORE_NONE;
}

int core_tier_persist(struct core *c, uint32_t to, uint32_t max, struct core_persist_pass *pass)
{
	uint32_t n = 0;

	if (!local_tier_exists(c, to) || !pass)
		return -EINVAL;
	while (n < max && !pass->full) {
		uint32_t from, b = persist_next(c, to, &from);
		struct core_key key;
		int r = 0;

		if (b == CORE_NONE)
			break;
		/* One more would push out a block this pass moved: what is left is worth less. */
		if (pass->moved == c->tiers[to].pool.capacity) {
			pass->full = true;
			break;
		}
		if (from == CORE_TIER_POOL) {
			const struct core_block *blk = &c->pool.blocks[b];

			key = (struct core_key){ .hash = blk->hash, .parent = blk->parent,
						 .salt = blk->salt, .extra = blk->extra,
						 .tokens = core_slot_tokens(c, b) };
			/* The cost model chose to recompute it: dropped, as its eviction would. */
			r = blk->flags & CORE_BLOCK_NODEMOTE ? -ECANCELED
							     : store_into(c, to, from, b, &key);
		} else {
			key = slot_key(&c->tiers[from], b);
			r = store_into(c, to, from, b, &key);
		}
		if (r == -ENOSPC) {
			/* Every slot of `to` is held (by loads in flight): nothing more goes in. */
			pass->full = true;
			break;
		}
		/* Moved, or dropped (a failed store leaves a block out, as a demotion does). */
		if (from == CORE_TIER_POOL) {
			c->dropping = true; /* out of the pool without a demotion of its own */
			pool_evict(&c->pool, b);
			c->dropping = false;
		} else {
			tier_hold(c, from, b); /* off the LRU */
			tier_release(c, from, b);
		}
		pass->moved += r == 0;
		pass->dropped += r != 0;
		pass->from_pool += r == 0 && from == CORE_TIER_POOL;
		pass->from_tiers += r == 0 && from != CORE_TIER_POOL;
		n++;
	}
	return (int)n;
}

uint32_t tiers_drop_all(struct core *c)
{
	uint32_t n = 0;

	for (uint32_t t = 1; t <= c->cfg.ntiers; t++)
		while (!c->tiers[t].probed && pool_evict_oldest(&c->tiers[t].pool))
			n++;
	return n;
}

/* Whether a block's transfer from a level at this rate beats recomputing it. */
static bool worth_promoting(const struct core *c, double bandwidth)
{
	const struct core_cost_config *cost = &c->cfg.cost;
	double recompute = cost_recompute_s(cost->params, c->cfg.block_tokens, cost->flops);

	/* Unknown figures promote: a transfer loses no work. */
	return cost->params <= 0 || cost->flops <= 0 || cost->block_bytes <= 0 || bandwidth <= 0 ||
	       cost_choose(cost_transfer_s(cost->block_bytes, bandwidth), recompute) == COST_SWAP;
}

int core_tier_set_bandwidth(struct core *c, uint32_t t, double bandwidth)
{
	if (!tier_exists(c, t) || !(bandwidth >= 0))
		return -EINVAL;
	c->cfg.tiers[t - 1].bandwidth = bandwidth;
	c->tiers[t].promote = worth_promoting(c, bandwidth);
	return 0;
}

int tiers_init(struct core *c)
{
	int r;

	for (uint32_t t = 1; t <= c->cfg.ntiers; t++) {
		struct tier *tr = &c->tiers[t];
		const struct core_tier_config *tc = &c->cfg.tiers[t - 1];

		tr->c = c;
		tr->cfg = tc;
		tr->id = t;
		tr->promote = worth_promoting(c, tc->bandwidth);
		if (tc->flags & CORE_TIER_PROBED) {
			tr->probed = true;
			c->probe_tier = t;
			continue;
		}
		r = pool_init(&tr->pool, tc->slots, on_tier_evict, tr);
		if (r < 0)
			return r;
		r = index_init(&tr->index, tc->slots);
		if (r < 0)
			return r;
		tr->stats.capacity = tc->slots;
	}
	c->first_tier = local_tier_exists(c, 1) ? 1 : 0;
	c->publish_tier = CORE_TIER_POOL;
	for (uint32_t t = 1; local_tier_exists(c, t) && !(c->tiers[t].cfg->flags & CORE_TIER_COLD);
	     t++)
		c->publish_tier = t;
	return 0;
}

void tiers_done(struct core *c)
{
	for (uint32_t t = 1; t <= c->cfg.ntiers; t++) {
		if (c->tiers[t].probed)
			continue;
		pool_done(&c->tiers[t].pool);
		index_done(&c->tiers[t].index);
	}
}

void tier_publish(struct core *c, uint32_t b)
{
	struct tier *t = &c->tiers[c->probe_tier];
	struct core_block *blk = &c->pool.blocks[b];
	const struct core_key key = { .hash = blk->hash, .parent = blk->parent, .salt = blk->salt,
				      .extra = blk->extra, .tokens = core_slot_tokens(c, b) };
	int r;

	t->stats.published++;
	r = t->cfg->ops->store(t->cfg->ctx, CORE_TIER_POOL, b, t->id, CORE_NONE, &key);
	if (r < 0) {
		t->stats.store_errors++;
	} else if (r > 0) {
		pool_ref(&c->pool, b);
		blk->flags |= CORE_BLOCK_STORING;
		c->nstoring++;
	}
}

/*
 * The nearest cached ancestor of pool block b (CORE_NONE: none), past the held ones.
 * Leaf-first eviction rests on whoever holds a block holding its parent, so a block is
 * released before its parent; a store holds one block alone and finishes in any order (root
 * first, as a remote writes a chain), so a block it lets go of must go in older than its
 * cached ancestors, not newest: else the root is evicted first, and the rest of the chain with
 * it can no longer be found.  Its ancestors that are held go in later, newer than it.
 */
static uint32_t cached_ancestor(const struct core *c, uint32_t b)
{
	struct core_hash h = c->pool.blocks[b].parent;

	/* Bounded: a weak test hash_fn can make a chain of hashes loop. */
	for (uint32_t n = 0; (h.lo || h.hi) && n < c->pool.capacity; n++) {
		uint32_t a = index_find(&c->index, c->pool.blocks, h);

		if (a == CORE_NONE)
			return CORE_NONE;
		if (c->pool.blocks[a].flags & CORE_BLOCK_ON_LRU)
			return a;
		h = c->pool.blocks[a].parent;
	}
	return CORE_NONE;
}

int core_tier_stored(struct core *c, uint32_t t, uint32_t b)
{
	struct core_block *blk;

	if (!c->probe_tier || t != c->probe_tier || b >= c->pool.capacity)
		return -EINVAL;
	blk = &c->pool.blocks[b];
	if (!(blk->flags & CORE_BLOCK_STORING))
		return -EINVAL;
	blk->flags &= ~CORE_BLOCK_STORING;
	c->nstoring--;
	/*
	 * The store held it past its sequence, whose children went back to the LRU before it
	 * (leaf first) while it stayed out.  Cached now, it goes just before its nearest cached
	 * ancestor, which keeps it older than its parent; a child cached before it may still be
	 * older (stores finish in any order), so it is LATE: evicting it first costs a fetch
	 * from the tier that has it, not a wrong hit.
	 */
	if (blk->refcount == 1)
		blk->flags |= CORE_BLOCK_LATE;
	pool_unref_before(&c->pool, b, blk->refcount == 1 ? cached_ancestor(c, b) : CORE_NONE);
	return 0;
}

uint32_t core_tier_storing(const struct core *c)
{
	return c->nstoring;
}

int core_get_tier_stats(const struct core *c, uint32_t t, struct core_tier_stats *ret)
{
	if (!tier_exists(c, t))
		return -EINVAL;
	*ret = c->tiers[t].stats;
	ret->used = c->tiers[t].pool.capacity - c->tiers[t].pool.nfree;
	return 0;
}

bool core_tier_promotes(const struct core *c, uint32_t t)
{
	return tier_exists(c, t) && c->tiers[t].promote;
}

int core_tier_lost(struct core *c, uint32_t t, uint32_t slot)
{
	struct tier *tr;

	if (!tier_exists(c, t) || slot >= c->tiers[t].pool.capacity)
		return -EINVAL;
	tr = &c->tiers[t];
	if (!(tr->pool.blocks[slot].flags & CORE_BLOCK_INDEXED))
		return -ENOENT;
	tr->stats.lost++;
	tier_hold(c, t, slot); /* off the LRU */
	tier_release(c, t, slot);
	return 0;
}

int core_tier_restore(struct core *c, uint32_t t, uint32_t slot, const struct core_key *key)
{
	struct tier *tr;
	struct core_block *e;
	int r;

	if (!tier_exists(c, t) || slot >= c->tiers[t].pool.capacity)
		return -EINVAL;
	tr = &c->tiers[t];
	if (index_find(&tr->index, tr->pool.blocks, key->hash) != CORE_NONE)
		return -EEXIST;
	r = pool_claim(&tr->pool, slot);
	if (r < 0)
		return r;
	e = &tr->pool.blocks[slot];
	e->hash = key->hash;
	e->salt = key->salt;
	e->extra = key->extra;
	e->parent = key->parent;
	e->state = CORE_BLOCK_READY;
	e->flags |= CORE_BLOCK_INDEXED;
	index_insert(&tr->index, key->hash, slot);
	core_observe_stored(c, t, slot, key->tokens, 0, 0);
	pool_unref(&tr->pool, slot);
	return 0;
}

__attribute__((format(printf, 3, 4))) static int fail(char *why, size_t len, const char *fmt,
							 ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, len, fmt, ap);
	va_end(ap);
	return -EUCLEAN;
}

/* How many pending loads of LOADING sequences hold slot of tier t. */
static uint32_t load_holds(const struct core *c, uint32_t t, uint32_t slot)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < c->cfg.max_sequences; i++) {
		const struct core_seq *s = &c->seqs[i];

		if (s->state != CORE_SEQ_LOADING)
			continue;
		for (uint32_t k = 0; k < s->nloads; k++)
			n += s->loads[k].tier == t && s->loads[k].slot == slot;
	}
	return n;
}

int tiers_verify(const struct core *c, char *why, size_t why_len)
{
	for (uint32_t t = 1; t <= c->cfg.ntiers; t++) {
		const struct tier *tr = &c->tiers[t];
		uint32_t nfree = 0, ncached = 0, nindexed = 0, nheld = 0, nheld_indexed = 0;

		if (tr->probed)
			continue;

		for (uint32_t s = tr->pool.free_head; s != CORE_NONE; s = tr->pool.blocks[s].next)
			if (++nfree > tr->pool.capacity || tr->pool.blocks[s].state != CORE_BLOCK_FREE)
				return fail(why, why_len, "tier %u: free list broken at slot %u", t,
					    s);
		for (uint32_t s = tr->pool.lru_head; s != CORE_NONE; s = tr->pool.blocks[s].next)
			if (++ncached > tr->pool.capacity ||
			    !(tr->pool.blocks[s].flags & CORE_BLOCK_INDEXED))
				return fail(why, why_len, "tier %u: LRU list broken at slot %u", t,
					    s);
		if (nfree != tr->pool.nfree || ncached != tr->pool.ncached)
			return fail(why, why_len, "tier %u: %u free and %u cached slots on the lists",
				    t, nfree, ncached);
		/*
		 * Outside a call only the loads of LOADING sequences hold slots: every other slot
		 * is free or cached.  (Linear in the loads per held slot: a check, not a path.)
		 */
		for (uint32_t s = 0; s < tr->pool.capacity; s++) {
			const struct core_block *e = &tr->pool.blocks[s];

			if (e->refcount == 0)
				continue;
			nheld++;
			nheld_indexed += !!(e->flags & CORE_BLOCK_INDEXED);
			if (e->refcount != load_holds(c, t, s))
				return fail(why, why_len, "tier %u: slot %u held %u times, by %u loads",
					    t, s, e->refcount, load_holds(c, t, s));
		}
		if (nfree + ncached + nheld != tr->pool.capacity)
			return fail(why, why_len, "tier %u: %u slots neither free, cached nor held",
				    t, tr->pool.capacity - nfree - ncached - nheld);
		for (uint32_t s = 0; s < tr->pool.capacity; s++) {
			const struct core_block *e = &tr->pool.blocks[s];

			if (!(e->flags & CORE_BLOCK_INDEXED))
				continue;
			nindexed++;
			if (index_find(&tr->index, tr->pool.blocks, e->hash) != s)
				return fail(why, why_len, "tier %u: slot %u not found under its hash",
					    t, s);
		}
		if (nindexed != tr->index.count || nindexed != ncached + nheld_indexed)
			return fail(why, why_len, "tier %u: %u indexed slots, index holds %u", t,
				    nindexed, tr->index.count);
	}
	return 0;
}

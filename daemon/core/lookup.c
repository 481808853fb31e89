/* SPDX-License-Identifier: MIT */
/*
 * Prefix lookup and promotion: the walks that find a prompt's cached prefix in the pool (and
 * the rest of it in the tiers below), the loads that bring tier hits back up, and the block
 * table an open or a resume is built from.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/core/core-internal.h"
#include "daemon/core/hash-inline.h"

static uint64_t open_full_prefix(const struct core_open *o)
{
	return o->retention == CORE_RETAIN_SINKS ? (uint64_t)o->n_sink + o->recent : UINT64_MAX;
}

/*
 * Walks the index for the prompt's leading full blocks.  A candidate is accepted only when its
 * parent, salt, extra key and every token id match: the hash only finds candidates.  Fills
 * hits[] and returns their number; *ret_collisions counts hash matches with other content.
 *
 * Where the pool's chain ends, the walk goes on in the tiers below (parent hash, salt and
 * extra key checked here, tokens by the load): c->hit_tier/hit_slot[0, *ret_ntier) get the
 * blocks a promotion would bring up, c->hit_hash[k] the parent hash of tier hit k (and
 * [k + 1] its own).  It stops at a tier whose hits are not worth promoting (*ret_skipped:
 * that tier) since the blocks after it would have no parent.
 */
/*
 * flatten: the hot loop of every lookup.  Without it GCC may stop inlining XXH3 here as the
 * function grows, which doubled the cost of a cached block (kvpaged-bench micro).
 */
__attribute__((flatten)) static uint32_t prefix_walk(const struct core *c,
						    const struct core_open *o, bool probe,
						    uint32_t *hits, uint32_t *ret_ntier,
						    uint32_t *ret_skipped, uint32_t *ret_collisions)
{
	const uint32_t B = c->cfg.block_tokens;
	const core_hash_fn fn = c->cfg.hash_fn;
	const uint64_t tag = retention_tag(o->retention, o->n_sink, o->recent);
	const uint64_t full = open_full_prefix(o);
	const uint64_t ns_full = core_hash_ns(o->salt, o->extra);
	const uint64_t ns_tag = tag ? core_hash_ns(o->salt, o->extra ^ tag) : ns_full;
	uint32_t limit = o->ntokens / B, n = 0, ntier = 0;
	struct core_hash ph = { 0, 0 }, h = { 0, 0 };

	if ((o->flags & CORE_OPEN_RECOMPUTE_LAST) && limit * B == o->ntokens)
		limit--;
	*ret_collisions = 0;
	*ret_ntier = *ret_skipped = 0;
	/*
	 * Past the policy's full prefix a sinks chain is keyed with its tag (see retention_tag):
	 * two runs, each with one namespace, so the common untagged walk stays a tight loop.
	 */
	const uint32_t tagged_from = tag ? (uint32_t)(full / B) : UINT32_MAX;

	for (int part = 0; part < 2 && n < limit; part++) {
		const uint32_t end = part || tagged_from > limit ? limit : tagged_from;
		const uint64_t ns = part ? ns_tag : ns_full, extra = part ? o->extra ^ tag : o->extra;

		for (; n < end; n++) {
			const uint32_t *want = o->tokens + (size_t)n * B;
			uint32_t b;
			const struct core_block *blk;

			h = hash_link(fn, ph, ns, hash_tokens(fn, want, B));
			b = index_find(&c->index, c->pool.blocks, h);
			if (b == CORE_NONE)
				break;
			blk = &c->pool.blocks[b];
			if (!core_hash_eq(blk->parent, ph) || blk->salt != o->salt ||
			    blk->extra != extra ||
			    memcmp(core_slot_tokens(c, b), want, (size_t)B * sizeof(uint32_t)) != 0) {
				(*ret_collisions)++;
				return n;
			}
			hits[n] = b;
			ph = h;
		}
		if (n < end)
			break;
	}
	if (n == limit || !c->cfg.ntiers)
		return n;

	/*
	 * h is block n's hash, which the pool does not have.  A chain longer than the pool could
	 * not be opened anyway (a persisted file tier may hold one from a larger pool): the walk
	 * arrays stop there.
	 */
	c->hit_hash[0] = ph;
	if (limit > c->walk_cap)
		limit = c->walk_cap;
	uint32_t k = n;

	for (; k < limit; k++) {
		uint64_t extra = block_extra(c, o->extra, tag, full, k);
		uint32_t slot, t;

		if (k > n)
			h = hash_link(fn, ph, extra == o->extra ? ns_full : ns_tag,
				      hash_tokens(fn, o->tokens + (size_t)k * B, B));
		t = tier_find(c, h, ph, o->salt, extra, &slot);
		if (!t)
			break;
		if (!c->tiers[t].promote) {
			*ret_skipped = t;
			break;
		}
		c->hit_tier[ntier] = (uint8_t)t;
		c->hit_slot[ntier] = slot;
		c->hit_hash[++ntier] = h;
		ph = h;
	}
	/*
	 * Where the local chain ends (h is block k's hash), a probed level is asked for what
	 * follows: nobody here knows what it holds.  Not past a level that is not promoted from,
	 * nor when fetching from it loses to recomputing.
	 */
	if (probe && c->probe_tier && k < limit && !*ret_skipped &&
	    c->tiers[c->probe_tier].promote) {
		const uint32_t max = c->tiers[c->probe_tier].cfg->slots;

		for (uint32_t j = 0; j < max && k < limit; j++, k++) {
			uint64_t extra = block_extra(c, o->extra, tag, full, k);

			if (j > 0)
				h = hash_link(fn, ph, extra == o->extra ? ns_full : ns_tag,
					      hash_tokens(fn, o->tokens + (size_t)k * B, B));
			c->hit_tier[ntier] = (uint8_t)c->probe_tier;
			c->hit_slot[ntier] = j;
			c->hit_hash[++ntier] = h;
			ph = h;
		}
	}
	*ret_ntier = ntier;
	return n;
}

/*
 * The walk of a sliding-window pool (vLLM's SlidingWindowManager rule): the next token attends
 * to the last window - 1 tokens only, so a prefix of n blocks is a hit when the
 * ceil((window - 1) / B) blocks that end it are cached, whatever came before.  Verifies every
 * candidate by content (parent hash, salt, extra key, tokens) as prefix_walk does, and returns
 * the longest such prefix; table[*ret_first, returned) get its blocks (table may be NULL), the
 * entries before are not needed (holes).
 */
static uint32_t window_walk(const struct core *c, const struct core_open *o, uint32_t *table,
			    uint32_t *ret_first, uint32_t *ret_collisions)
{
	const uint32_t B = c->cfg.block_tokens;
	const core_hash_fn fn = c->cfg.hash_fn;
	const uint64_t ns = core_hash_ns(o->salt, o->extra);
	uint32_t need = (c->cfg.window - 1 + B - 1) / B, limit = o->ntokens / B, run = 0, best = 0;
	struct core_hash ph = { 0, 0 };

	if (need == 0)
		need = 1;
	if ((o->flags & CORE_OPEN_RECOMPUTE_LAST) && limit * B == o->ntokens)
		limit--;
	*ret_collisions = 0;
	for (uint32_t n = 0; n < limit; n++) {
		const uint32_t *want = o->tokens + (size_t)n * B;
		struct core_hash h = hash_link(fn, ph, ns, hash_tokens(fn, want, B));
		uint32_t b = index_find(&c->index, c->pool.blocks, h);

		const struct core_block *blk = b != CORE_NONE ? &c->pool.blocks[b] : NULL;

		if (blk && core_hash_eq(blk->parent, ph) && blk->salt == o->salt &&
		    blk->extra == o->extra &&
		    memcmp(core_slot_tokens(c, b), want, (size_t)B * sizeof(uint32_t)) == 0) {
			if (table)
				table[n] = b;
			if (++run >= need)
				best = n + 1;
		} else {
			*ret_collisions += blk != NULL;
			run = 0;
		}
		ph = h;
	}
	*ret_first = best >= need ? best - need : 0;
	return best;
}

/*
 * The loads that bring the tier hits of the last walk into the pool blocks
 * table[nhit, nhit + ntier), with the identities they must have.
 */
static void loads_fill(struct core *c, const struct core_open *o, const uint32_t *table,
		       uint32_t nhit, uint32_t ntier, struct core_load *loads)
{
	const uint32_t B = c->cfg.block_tokens;

	for (uint32_t k = 0; k < ntier; k++)
		loads[k] = (struct core_load){
			.tier = c->hit_tier[k],
			.slot = c->hit_slot[k],
			.block = table[nhit + k],
			.key = { .hash = c->hit_hash[k + 1], .parent = c->hit_hash[k],
				 .salt = o->salt,
				 .extra = block_extra(c, o->extra,
						      retention_tag(o->retention, o->n_sink,
								    o->recent),
						      open_full_prefix(o), nhit + k),
				 .tokens = o->tokens + (size_t)(nhit + k) * B },
			.result = -EIO,
		};
}

/* Whether pool block a holds what b does: parent, namespace, extra key and every token id. */
static bool same_block(const struct core *c, uint32_t a, uint32_t b)
{
	const struct core_block *x = &c->pool.blocks[a], *y = &c->pool.blocks[b];

	return a != CORE_NONE && core_hash_eq(x->parent, y->parent) && x->salt == y->salt &&
	       x->extra == y->extra &&
	       !memcmp(core_slot_tokens(c, a), core_slot_tokens(c, b),
		       (size_t)c->cfg.block_tokens * sizeof(uint32_t));
}

/*
 * Takes the results of loads into the pool blocks table[nhit, nhit + ntier).  Returns how many
 * leading ones arrived intact; those become READY (and findable when their parent is) and
 * leave their tier.  The first bad one is discarded and counted; the ones after it stay where
 * they are.
 */
uint32_t lookup_promote_finish(struct core *c, uint32_t *table, uint32_t nhit,
			       const struct core_load *loads, uint32_t ntier)
{
	const uint32_t B = c->cfg.block_tokens;
	bool findable = nhit == 0 || (c->pool.blocks[table[nhit - 1]].flags & CORE_BLOCK_INDEXED);
	uint32_t good = 0;

	while (good < ntier && loads[good].result == 0)
		good++;

	for (uint32_t k = 0; k < good; k++) {
		uint32_t found;
		const struct core_load *l = &loads[k];
		uint32_t b = l->block;
		struct core_block *blk = &c->pool.blocks[b];

		/* A deferred load's key points at the block's own tokens already. */
		if (l->key.tokens != c->tokens + (size_t)b * B)
			memcpy(c->tokens + (size_t)b * B, l->key.tokens,
			       (size_t)B * sizeof(uint32_t));
		blk->hash = l->key.hash;
		blk->salt = l->key.salt;
		blk->extra = l->key.extra;
		blk->parent = l->key.parent;
		blk->state = CORE_BLOCK_READY;
		/* Like a commit: findable only through a findable parent, and never twice. */
		found = findable ? index_find(&c->index, c->pool.blocks, blk->hash) : CORE_NONE;
		if (findable && found == CORE_NONE) {
			index_insert(&c->index, blk->hash, b);
			blk->flags |= CORE_BLOCK_INDEXED;
			core_observe_stored(c, CORE_TIER_POOL, b, core_slot_tokens(c, b), 0, 0);
		} else if (findable && same_block(c, found, b)) {
			/*
			 * Another open of the same prompt brought it up first (their loads were
			 * deferred too): share that copy, as a commit would, so the rest of the
			 * chain stays findable.
			 */
			pool_ref(&c->pool, found);
			table[nhit + k] = found;
			pool_unref(&c->pool, b);
			c->stats.dedup_blocks++;
		} else {
			findable = false;
		}
		/* Back from a local level: whether it may go on to the probed one comes too. */
		if (!c->tiers[l->tier].probed)
			c->pool.blocks[table[nhit + k]].flags |=
				c->tiers[l->tier].pool.blocks[l->slot].flags & CORE_BLOCK_REMOTE;
		tier_release(c, l->tier, l->slot);
		c->tiers[l->tier].stats.promotions++;
	}
	for (uint32_t k = 0; k < ntier; k++)
		c->tiers[loads[k].tier].stats.probes += c->tiers[loads[k].tier].probed;
	/*
	 * Back to the LRU leaf first, so children stay older than their parents.  A slot that
	 * holds something else or is damaged (-EBADMSG) is thrown away; after an I/O or memory
	 * error the block may still be good, and stays.
	 */
	for (uint32_t k = ntier; k-- > good + 1;)
		tier_put(c, loads[k].tier, loads[k].slot);
	if (good < ntier) {
		const struct core_load *l = &loads[good];

		/* What a probed level does not have is a miss, not an error. */
		if (c->tiers[l->tier].probed && l->result == -ENOENT)
			c->tiers[l->tier].stats.misses++;
		else
			c->tiers[l->tier].stats.load_errors++;
		if (l->result == -EBADMSG)
			tier_release(c, l->tier, l->slot);
		else
			tier_put(c, l->tier, l->slot);
	}
	return good;
}

/* Whether levels a and b are one storage: the same callbacks with the same context. */
static bool same_storage(const struct core *c, uint32_t a, uint32_t b)
{
	return c->tiers[a].cfg->ops == c->tiers[b].cfg->ops &&
	       c->tiers[a].cfg->ctx == c->tiers[b].cfg->ctx;
}

/*
 * Hands each storage its part of loads (in chain order, levels mixed) in one call, so it can
 * batch its reads; the results go back to their places.  A storage is usually one level; levels
 * that share their callbacks and context get one call for all of theirs.  Most prompts come up
 * from one level: those need no copies.
 */
static void load_by_storage(struct core *c, struct core_load *loads, uint32_t n)
{
	uint32_t t = loads[0].tier;
	bool one = true;

	for (uint32_t k = 1; k < n && one; k++)
		one = same_storage(c, loads[k].tier, t);
	if (one) {
		c->tiers[t].cfg->ops->load(c->tiers[t].cfg->ctx, loads, n);
		return;
	}
	for (t = 1; t <= c->cfg.ntiers; t++) {
		const struct core_tier_config *tc = c->tiers[t].cfg;
		uint32_t m = 0, u;

		/* A storage's loads went out with its first level's. */
		for (u = 1; u < t && !same_storage(c, u, t); u++)
			;
		if (u < t)
			continue;
		for (uint32_t k = 0; k < n; k++)
			if (same_storage(c, loads[k].tier, t))
				c->batch[m++] = loads[k];
		if (!m)
			continue;
		tc->ops->load(tc->ctx, c->batch, m);
		m = 0;
		for (uint32_t k = 0; k < n; k++)
			if (same_storage(c, loads[k].tier, t))
				loads[k].result = c->batch[m++].result;
	}
}

/* Brings up the tier hits of the last walk, one load batch per storage, within the call. */
static uint32_t promote(struct core *c, const struct core_open *o, uint32_t *table,
			uint32_t nhit, uint32_t ntier)
{
	loads_fill(c, o, table, nhit, ntier, c->loads);
	load_by_storage(c, c->loads, ntier);
	return lookup_promote_finish(c, table, nhit, c->loads, ntier);
}

/*
 * Builds the block table of a prompt: its cached prefix from the pool, what the tiers below
 * hold of the rest (promoted), fresh blocks for the remainder.  Everything that can fail
 * comes first.  *ret_ready gets the leading blocks whose K/V is there.
 */
/*
 * With ret_loads (CORE_OPEN_DEFER_LOADS), the tier hits are not loaded: *ret_loads gets their
 * loads (malloc'ed; NULL when there are none), their blocks hold their tokens, and *ret_ready
 * counts the pool hits only.
 */
int lookup_attach(struct core *c, const struct core_open *o, uint32_t priority,
		  uint32_t **ret_table, uint32_t *ret_nblocks, uint32_t *ret_pool_hits,
		  uint32_t *ret_ready, struct core_hash *ret_chain, uint32_t *ret_holes,
		  struct core_load **ret_loads, uint32_t *ret_nloads)
{
	struct core_load *loads = NULL;
	uint32_t nblocks = blocks_for(c, o->ntokens), nhit, ntier = 0, skipped = 0, collisions;
	uint32_t cached_hits = 0, good = 0, first = 0;
	uint32_t *table;
	int r;

	table = malloc((size_t)nblocks * sizeof(*table));
	if (!table)
		return -ENOMEM;
	if (c->cfg.window) {
		/* table[first, nhit) are the hits; the entries before them stay holes. */
		nhit = window_walk(c, o, table, &first, &collisions);
		for (uint32_t i = 0; i < first; i++)
			table[i] = CORE_NONE;
	} else {
		nhit = prefix_walk(c, o, ret_loads && (o->flags & CORE_OPEN_PROBED), table, &ntier,
				   &skipped, &collisions);
	}
	/*
	 * The deferred loads' array first: a failed call changes nothing, preempt_make_room
	 * included.
	 */
	if (ntier && ret_loads) {
		loads = malloc((size_t)ntier * sizeof(*loads));
		if (!loads) {
			free(table);
			return -ENOMEM;
		}
	}
	for (uint32_t i = first; i < nhit; i++) {
		cached_hits += c->pool.blocks[table[i]].refcount == 0;
		c->pool.blocks[table[i]].flags |= CORE_BLOCK_PINNED;
	}
	r = preempt_make_room(c, nblocks - nhit, cached_hits, priority);
	for (uint32_t i = first; i < nhit; i++)
		c->pool.blocks[table[i]].flags &= ~CORE_BLOCK_PINNED;
	if (r < 0) {
		free(loads);
		free(table);
		return r;
	}
	/*
	 * Held, so the demotions that allocating causes cannot push them out.  (preempt_make_room
	 * only releases blocks; nothing moves down before the allocations below.)
	 */
	for (uint32_t k = 0; k < ntier; k++)
		tier_hold(c, c->hit_tier[k], c->hit_slot[k]);

	/* Nothing can fail from here on.  Take the hits first so allocating cannot evict them. */
	for (uint32_t i = first; i < nhit; i++)
		pool_ref(&c->pool, table[i]);
	for (uint32_t i = nhit; i < nblocks; i++)
		table[i] = pool_alloc(&c->pool);
	if (loads) {
		/* The keys point at the blocks' own tokens: the prompt is the caller's. */
		loads_fill(c, o, table, nhit, ntier, loads);
		for (uint32_t k = 0; k < ntier; k++) {
			uint32_t *t = c->tokens + (size_t)table[nhit + k] * c->cfg.block_tokens;

			memcpy(t, loads[k].key.tokens, c->cfg.block_tokens * sizeof(*t));
			loads[k].key.tokens = t;
		}
	} else if (ntier) {
		good = promote(c, o, table, nhit, ntier);
	}
	if (ret_loads) {
		*ret_loads = loads;
		*ret_nloads = loads ? ntier : 0;
	}
	if (skipped)
		c->tiers[skipped].stats.skipped++;
	c->stats.collisions += collisions;
	*ret_chain = nhit + good ? c->pool.blocks[table[nhit + good - 1]].hash
				 : (struct core_hash){ 0, 0 };
	*ret_table = table;
	*ret_pool_hits = nhit - first;
	*ret_nblocks = nblocks;
	*ret_ready = nhit + good;
	if (ret_holes)
		*ret_holes = first;
	return 0;
}

uint32_t core_lookup(const struct core *c, const struct core_open *o)
{
	uint32_t collisions, ntier, skipped, n;

	if (tokens_check(c, o->tokens, o->ntokens) < 0 || o->ntokens > c->cfg.max_seq_tokens)
		return 0;
	if (c->cfg.window) {
		uint32_t first;

		return window_walk(c, o, NULL, &first, &collisions) * c->cfg.block_tokens;
	}
	n = prefix_walk(c, o, false, c->walk, &ntier, &skipped, &collisions);
	/* What an open would reuse, assuming the tiers' loads succeed. */
	return (n + ntier) * c->cfg.block_tokens;
}

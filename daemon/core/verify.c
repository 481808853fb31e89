/* SPDX-License-Identifier: MIT */
/*
 * core_verify(): recomputes every invariant of the block manager from scratch.  Slow on
 * purpose (hashes every indexed block again); for tests, `kvpagedctl verify` and debugging.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/core/core-internal.h"

struct verify {
	const struct core *c;
	char *why;
	size_t why_len;
	uint32_t *refs;   /* expected refcount per block */
	uint32_t *lru_pos;/* position on the LRU list + 1, 0 when not on it */
	uint8_t *on_free;
};

__attribute__((format(printf, 2, 3))) static int fail(struct verify *v, const char *fmt, ...)
{
	va_list ap;

	if (v->why && v->why_len) {
		va_start(ap, fmt);
		vsnprintf(v->why, v->why_len, fmt, ap);
		va_end(ap);
	}
	return -EUCLEAN;
}

static int check_lists(struct verify *v)
{
	const struct pool *p = &v->c->pool;
	uint32_t n = 0, prev = CORE_NONE;

	for (uint32_t b = p->free_head; b != CORE_NONE; b = p->blocks[b].next) {
		const struct core_block *blk = &p->blocks[b];

		if (b >= p->capacity)
			return fail(v, "free list links to block %u beyond capacity", b);
		if (v->on_free[b] || ++n > p->capacity)
			return fail(v, "free list has a cycle at block %u", b);
		v->on_free[b] = 1;
		if (blk->state != CORE_BLOCK_FREE || blk->refcount || blk->flags)
			return fail(v, "block %u on the free list has state %u refcount %u flags %#x",
				    b, blk->state, blk->refcount, blk->flags);
	}
	if (n != p->nfree)
		return fail(v, "free list holds %u blocks, counter says %u", n, p->nfree);

	n = 0;
	for (uint32_t b = p->lru_head; b != CORE_NONE; prev = b, b = p->blocks[b].next) {
		const struct core_block *blk = &p->blocks[b];

		if (b >= p->capacity)
			return fail(v, "LRU list links to block %u beyond capacity", b);
		if (v->lru_pos[b] || v->on_free[b] || n >= p->capacity)
			return fail(v, "block %u is on the LRU list twice or also free", b);
		v->lru_pos[b] = ++n;
		if (blk->prev != prev)
			return fail(v, "LRU back link of block %u is %u, expected %u", b, blk->prev,
				    prev);
		if (blk->refcount || blk->state != CORE_BLOCK_READY ||
		    (blk->flags & ~(CORE_BLOCK_NODEMOTE | CORE_BLOCK_PRUNED | CORE_BLOCK_LATE |
				       CORE_BLOCK_REMOTE)) !=
			    (CORE_BLOCK_INDEXED | CORE_BLOCK_ON_LRU))
			return fail(v, "cached block %u has refcount %u state %u flags %#x", b,
				    blk->refcount, blk->state, blk->flags);
	}
	if (prev != p->lru_tail)
		return fail(v, "LRU tail is %u, list ends at %u", p->lru_tail, prev);
	if (n != p->ncached)
		return fail(v, "LRU list holds %u blocks, counter says %u", n, p->ncached);
	return 0;
}

/* What the core allocated for a sequence (its pending loads aside: see core_seq_bytes). */
static uint64_t seq_heap(const struct core *c, const struct core_seq *s)
{
	const uint64_t B = c->cfg.block_tokens, cap = s->table ? s->cap_blocks : 0;
	uint64_t bytes = cap * sizeof(*s->table);

	if (s->score)
		bytes += cap * sizeof(*s->score);
	if (s->tscore)
		bytes += cap * B * sizeof(*s->tscore);
	if (s->hl)
		bytes += cap * sizeof(*s->hl);
	bytes += s->packed_cap / B * sizeof(*s->packed) +
		 (uint64_t)s->packed_cap * (sizeof(*s->ppos) + sizeof(*s->pscore));
	if (s->history)
		bytes += (uint64_t)s->ntokens * sizeof(*s->history);
	return bytes;
}

static int check_sequences(struct verify *v, uint32_t *nseqs)
{
	const struct core *c = v->c;
	const uint32_t B = c->cfg.block_tokens;

	*nseqs = 0;
	for (uint32_t slot = 0; slot < c->cfg.max_sequences; slot++) {
		const struct core_seq *s = &c->seqs[slot];

		if (!s->state)
			continue;
		(*nseqs)++;
		if (s->state > CORE_SEQ_LOADING ||
		    (s->state == CORE_SEQ_ACTIVE || s->state == CORE_SEQ_LOADING) != !s->history)
			return fail(v, "sequence slot %u: state %u with%s a token history", slot,
				    s->state, s->history ? "" : "out");
		if ((s->state == CORE_SEQ_LOADING) != (s->loads != NULL) ||
		    (s->loads && (s->nloads == 0 || s->load_nhit + s->nloads > s->nblocks ||
				  s->ncommitted != s->load_nhit * B)))
			return fail(v, "sequence slot %u: state %u with %u loads after %u hits", slot,
				    s->state, s->nloads, s->load_nhit);
		for (uint32_t k = 0; s->loads && k < s->nloads; k++)
			if (s->loads[k].block != s->table[s->load_nhit + k])
				return fail(v, "sequence slot %u: load %u fills block %u, not its "
					    "entry %u", slot, k, s->loads[k].block,
					    s->load_nhit + k);
		if (seq_heap(c, s) > core_seq_bytes(c, s->retention, s->granularity, s->ntokens,
						    s->state))
			return fail(v, "sequence slot %u keeps %llu bytes, more than the %llu "
				    "core_seq_bytes charges for it (state %u, %u tokens, %u blocks, cap %u)", slot,
				    (unsigned long long)seq_heap(c, s),
				    (unsigned long long)core_seq_bytes(c, s->retention, s->granularity,
								       s->ntokens, s->state),
				    s->state, s->ntokens, s->nblocks, s->cap_blocks);
		if (s->state == CORE_SEQ_DROPPED) {
			if (s->table || s->nblocks || s->ncommitted || !s->ntokens)
				return fail(v, "dropped sequence slot %u still holds %u blocks", slot,
					    s->nblocks);
			continue;
		}
		if (s->ntokens == 0 || s->nblocks != (s->ntokens + B - 1) / B ||
		    s->nblocks > s->cap_blocks || s->ncommitted > s->ntokens)
			return fail(v, "sequence slot %u: %u tokens, %u committed, %u blocks", slot,
				    s->ntokens, s->ncommitted, s->nblocks);
		uint32_t holes = 0;

		for (uint32_t i = 0; i < s->nblocks; i++) {
			uint32_t b = s->table[i];
			const struct core_block *blk;

			if (b == CORE_NONE) {
				/* Released by the retention policy: only where retain_prune() may have. */
				if (s->retention == CORE_RETAIN_FULL ||
				    (uint64_t)(i + 1) * B > s->ncommitted)
					return fail(v, "sequence slot %u: entry %u released, but its "
						    "policy keeps it", slot, i);
				holes++;
				continue;
			}
			if (b >= c->pool.capacity)
				return fail(v, "sequence slot %u entry %u: block %u out of range",
					    slot, i, b);
			blk = &c->pool.blocks[b];
			v->refs[b]++;
			if (i < s->ncommitted / B) {
				if (blk->state != CORE_BLOCK_READY)
					return fail(v, "sequence slot %u: committed block %u (entry %u) "
						    "is not READY", slot, b, i);
				if (blk->salt != s->salt ||
				    (blk->extra != s->extra &&
				     blk->extra != (s->extra ^ retention_tag(s->retention, s->n_sink,
									     s->recent))))
					return fail(v, "sequence slot %u: block %u has another "
						    "namespace or extra key", slot, b);
				if (i > 0 && s->table[i - 1] != CORE_NONE &&
				    !core_hash_eq(blk->parent, c->pool.blocks[s->table[i - 1]].hash))
					return fail(v, "sequence slot %u: block %u does not chain to "
						    "block %u before it", slot, b, s->table[i - 1]);
			} else if (blk->state == CORE_BLOCK_FREE) {
				return fail(v, "sequence slot %u holds free block %u", slot, b);
			}
		}
		if (holes != s->freed)
			return fail(v, "sequence slot %u: %u entries released, %u counted", slot,
				    holes, s->freed);
		/* H2O's list of held entries: exactly the entries that are not holes, ascending. */
		if (s->hl) {
			if (s->nhl != s->nblocks - holes)
				return fail(v, "sequence slot %u: %u entries listed held, %u are",
					    slot, s->nhl, s->nblocks - holes);
			for (uint32_t k = 0; k < s->nhl; k++)
				if (s->hl[k] >= s->nblocks || s->table[s->hl[k]] == CORE_NONE ||
				    (k && s->hl[k] <= s->hl[k - 1]))
					return fail(v, "sequence slot %u: held list entry %u is wrong",
						    slot, k);
		}
		/* Packed blocks (H2O at token granularity): held, never findable. */
		if (s->npacked > s->packed_cap || s->packed_cap % B ||
		    s->packed_cap - s->npacked >= B)
			return fail(v, "sequence slot %u: %u packed slots in %u", slot, s->npacked,
				    s->packed_cap);
		for (uint32_t k = 0; k < s->packed_cap / B; k++) {
			uint32_t b = s->packed[k];

			if (b >= c->pool.capacity || c->pool.blocks[b].state != CORE_BLOCK_FILLING ||
			    (c->pool.blocks[b].flags & CORE_BLOCK_INDEXED))
				return fail(v, "sequence slot %u: packed block %u is not its own", slot,
					    b);
			v->refs[b]++;
		}
	}
	if (*nseqs != c->cfg.max_sequences - c->nfree_slots)
		return fail(v, "%u sequences open, slot stack says %u", *nseqs,
			    c->cfg.max_sequences - c->nfree_slots);
	return 0;
}

static int check_blocks(struct verify *v, uint32_t *nindexed)
{
	const struct core *c = v->c;
	const struct pool *p = &c->pool;
	uint32_t nstoring = 0;

	*nindexed = 0;
	/* A probed level's store holds its block once more (core_tier_stored lets go). */
	for (uint32_t b = 0; b < p->capacity; b++) {
		if (!(p->blocks[b].flags & CORE_BLOCK_STORING))
			continue;
		if (!c->probe_tier || p->blocks[b].state != CORE_BLOCK_READY)
			return fail(v, "block %u kept for a store is not READY or has no level", b);
		v->refs[b]++;
		nstoring++;
	}
	if (nstoring != c->nstoring)
		return fail(v, "%u blocks kept for stores, counter says %u", nstoring, c->nstoring);

	for (uint32_t b = 0; b < p->capacity; b++) {
		const struct core_block *blk = &p->blocks[b];

		if (blk->refcount != v->refs[b])
			return fail(v, "block %u: refcount %u, block tables hold %u", b,
				    blk->refcount, v->refs[b]);
		if (blk->refcount == 0 && !v->on_free[b] && !v->lru_pos[b])
			return fail(v, "block %u is unreferenced but neither free nor cached", b);
		if (blk->refcount > 0 && (v->on_free[b] || v->lru_pos[b]))
			return fail(v, "block %u is referenced and on a list", b);
		if (!(blk->flags & CORE_BLOCK_INDEXED))
			continue;
		(*nindexed)++;
		if (blk->state != CORE_BLOCK_READY)
			return fail(v, "indexed block %u is not READY", b);
		if (index_find(&c->index, p->blocks, blk->hash) != b)
			return fail(v, "indexed block %u is not found under its hash", b);
		if (!core_hash_eq(blk->hash, core_chain_hash(c, blk->parent, blk->salt, blk->extra,
							      core_slot_tokens(c, b))))
			return fail(v, "block %u: stored hash does not match its content", b);
		if (blk->parent.lo || blk->parent.hi) {
			uint32_t pb = index_find(&c->index, p->blocks, blk->parent);

			/*
			 * Leaf-first: a cached child must be evicted before its cached parent,
			 * unless a retention policy released the parent while keeping the child,
			 * or a store held the parent past the child.
			 */
			if (pb != CORE_NONE && v->lru_pos[b] && v->lru_pos[pb] &&
			    v->lru_pos[pb] < v->lru_pos[b] &&
			    !(p->blocks[pb].flags & (CORE_BLOCK_PRUNED | CORE_BLOCK_LATE)))
				return fail(v, "cached block %u is older on the LRU than its child %u",
					    pb, b);
		}
	}
	return 0;
}

static int check_index(struct verify *v, uint32_t nindexed)
{
	const struct prefix_index *ix = &v->c->index;
	uint32_t n = 0;

	for (uint32_t i = 0; i <= ix->mask; i++) {
		const struct index_slot *s = &ix->slots[i];
		const struct core_block *blk;

		if (s->block == CORE_NONE)
			continue;
		n++;
		if (s->block >= v->c->pool.capacity)
			return fail(v, "index slot %u names block %u out of range", i, s->block);
		blk = &v->c->pool.blocks[s->block];
		if (!(blk->flags & CORE_BLOCK_INDEXED) || blk->hash.lo != s->key_lo ||
		    (uint32_t)blk->hash.hi != s->key_hi32)
			return fail(v, "index slot %u names block %u, which disagrees", i, s->block);
	}
	if (n != ix->count || n != nindexed)
		return fail(v, "index holds %u entries, counter %u, indexed blocks %u", n,
			    ix->count, nindexed);
	return 0;
}

int core_verify(const struct core *c, char *why, size_t why_len)
{
	struct verify v = { .c = c, .why = why, .why_len = why_len };
	uint32_t nseqs, nindexed;
	size_t cap = c->pool.capacity;
	int r = -ENOMEM;

	v.refs = calloc(cap, sizeof(*v.refs));
	v.lru_pos = calloc(cap, sizeof(*v.lru_pos));
	v.on_free = calloc(cap, 1);
	if (!v.refs || !v.lru_pos || !v.on_free)
		goto out;

	r = check_lists(&v);
	if (r == 0)
		r = check_sequences(&v, &nseqs);
	if (r == 0)
		r = check_blocks(&v, &nindexed);
	if (r == 0)
		r = check_index(&v, nindexed);
	if (r == 0)
		r = tiers_verify(c, why, why_len);
	if (r == 0 && c->value)
		r = value_verify(c->value, c->pool.capacity, why, why_len);
	if (r == 0 && why && why_len)
		why[0] = '\0';
out:
	free(v.refs);
	free(v.lru_pos);
	free(v.on_free);
	return r;
}

#ifdef KVPAGED_TEST_HOOKS
uint32_t core_test_corrupt(struct core *c)
{
	uint32_t b = 0;

	for (uint32_t i = 0; i < c->pool.capacity; i++)
		if (c->pool.blocks[i].refcount) {
			b = i;
			break;
		}
	c->pool.blocks[b].refcount++;
	return b;
}
#endif

/* SPDX-License-Identifier: MIT */
/*
 * The core's private state, shared by core.c, lookup.c, retain.c, preempt.c and verify.c
 * only.
 */
#pragma once

#include <errno.h>

#include "daemon/core/core.h"
#include "daemon/core/index.h"
#include "daemon/core/pool.h"
#include "daemon/core/value.h"

#define CORE_MAX_SEQUENCES (UINT32_C(1) << 24)

struct core_seq {
	uint64_t salt;
	uint64_t extra;
	uint64_t last_use; /* core tick of the last operation on it */
	uint32_t *table;   /* NULL when dropped */
	uint32_t *history; /* parked and dropped: the token ids */
	uint8_t state;     /* 0: slot not in use; enum core_seq_state */
	uint32_t priority;
	uint32_t ntokens;
	uint32_t ncommitted;
	uint32_t nblocks;
	uint32_t cap_blocks;
	uint32_t gen; /* bumped at close so stale ids are refused */
	struct core_hash chain; /* hash of the last committed full block (zero: none) */
	uint8_t retention;      /* enum core_retention */
	bool pruned;            /* released a block, outside a window pool: commits stay private */
	uint32_t n_sink, recent;
	uint32_t prune_from;    /* table entries below this were looked at by retain_prune() */
	uint32_t freed;         /* table entries released (CORE_NONE) */
	uint32_t budget;        /* H2O */
	float decay;            /* H2O: 1 for none */
	float *score;           /* H2O: running score of each table entry's tokens (cap_blocks) */
	/* H2O at token granularity */
	uint8_t granularity;
	float *tscore;          /* score of every position (cap_blocks * B) */
	uint32_t *packed;       /* packed blocks */
	uint32_t *ppos;         /* position in each packed slot */
	float *pscore;          /* score of each packed slot */
	uint32_t npacked, packed_cap; /* slots used, slots allocated (a multiple of B) */
	/* H2O: the table entries held, ascending (cap_blocks of room), so eviction and scoring
	 * cost what is held, not how long the sequence is. */
	uint32_t *hl;
	uint32_t nhl;
	/* H2O: scores are kept divided by scale, the product of the decays so far. */
	double scale;
	/*
	 * LOADING: the loads of its tier hits, which the caller carries out (core_seq_loaded
	 * takes them), the pool hits before them, and whether it is a resume (else an open).
	 */
	struct core_load *loads;
	uint32_t nloads, load_nhit;
	bool load_resume;
	bool probed;            /* CORE_OPEN_PROBED */
	double opened;          /* core_set_now's time at its open, fork or resume */
};

/* One tier below the pool: slots with the same metadata, free list, LRU and index as blocks. */
struct tier {
	struct pool pool;
	struct prefix_index index;
	struct core *c;
	const struct core_tier_config *cfg; /* its entry of c->cfg.tiers: ops, ctx, bandwidth */
	uint32_t id;
	bool promote; /* a hit here is worth a transfer */
	bool probed;  /* CORE_TIER_PROBED: no slots, no index (its pool and index are unused) */
	struct core_tier_stats stats;
};

struct core {
	struct core_config cfg;
	struct pool pool;
	struct prefix_index index;
	uint32_t *tokens;       /* token id per slot: capacity_blocks * block_tokens */
	uint32_t *walk;         /* hits of core_lookup: one sequence's worth of blocks */
	uint32_t walk_cap;      /* entries of walk, hit_tier, hit_slot and loads, less one */
	struct core_seq *seqs;  /* max_sequences slots */
	uint32_t *free_slots;   /* stack of unused slots */
	uint32_t nfree_slots;
	struct core_stats stats;
	uint64_t tick;
	struct victim *victims; /* max_sequences of them: preemption candidates */
	struct tier tiers[CORE_MAX_TIERS + 1]; /* by level, 1 .. cfg.ntiers; [0] unused: the pool */
	uint32_t first_tier;  /* where the pool demotes to; 0: no tier */
	uint32_t probe_tier;  /* the CORE_TIER_PROBED level (the last); 0: none */
	uint32_t publish_tier; /* evicted blocks are offered as they leave it (CORE_TIER_COLD) */
	uint32_t nstoring;    /* blocks kept for its stores (CORE_BLOCK_STORING) */
	bool dropping;        /* core_drop_cache: evictions move nothing */
	/* One lookup's hits below the pool (walk-sized). */
	uint8_t *hit_tier;
	uint32_t *hit_slot;
	struct core_hash *hit_hash; /* walk + 1 */
	struct core_load *loads;
	struct core_load *batch; /* walk-sized: one level's part of loads, for its load callback */
	/* One eviction's gather (H2O tokens): a block's survivors, block_tokens at most. */
	struct core_slot_copy *gather;
	uint32_t ngather;
	struct core_preemption log[CORE_PREEMPTION_LOG];
	uint32_t nlog; /* preemptions recorded in all; the newest is log[(nlog - 1) % size] */
	struct value *value; /* CORE_EVICT_VALUE; NULL: LRU */
	double now;          /* core_set_now */
};

struct victim {
	uint32_t slot;
	uint32_t freeable; /* blocks dropping it would make available */
	uint64_t last_use;
	uint32_t priority;
	uint32_t tokens;
};

static inline const uint32_t *core_slot_tokens(const struct core *c, uint32_t b)
{
	return c->tokens + (size_t)b * c->cfg.block_tokens;
}

/*
 * Under sinks, a token attends to everything before it only while at most n_sink + recent
 * tokens precede it.  Blocks past that point hold K/V of that policy: they are keyed with a
 * tag of (n_sink, recent) folded into the extra key, so only sequences with the same policy
 * find them.  0: no tag (full attention; h2o keeps such blocks private instead).
 */
static inline uint64_t retention_tag(uint32_t retention, uint32_t n_sink, uint32_t recent)
{
	if (retention != CORE_RETAIN_SINKS)
		return 0;
	return ((uint64_t)n_sink << 32 | recent) * 0x9e3779b97f4a7c15ull | 1;
}

static inline bool tier_exists(const struct core *c, uint32_t t)
{
	return t > 0 && t <= c->cfg.ntiers;
}

/* A level with slots of its own (not CORE_TIER_PROBED): what demotions and persists reach. */
static inline bool local_tier_exists(const struct core *c, uint32_t t)
{
	return tier_exists(c, t) && !c->tiers[t].probed;
}

/* Sequence ids carry the slot's generation so a closed id is never mistaken for a new one. */
static inline uint64_t seq_id(const struct core *c, uint32_t slot)
{
	return ((uint64_t)c->seqs[slot].gen << 32) | slot;
}

static inline struct core_seq *seq_get(const struct core *c, uint64_t id)
{
	uint32_t slot = (uint32_t)id;
	struct core_seq *s;

	if (slot >= c->cfg.max_sequences)
		return NULL;
	s = &c->seqs[slot];
	if (!s->state || s->gen != (uint32_t)(id >> 32))
		return NULL;
	return s;
}

/* An open sequence that may be written: -ENOENT if unknown, -EBUSY if parked or dropped. */
static inline int seq_get_active(const struct core *c, uint64_t id, struct core_seq **ret)
{
	struct core_seq *s = seq_get(c, id);

	if (!s)
		return -ENOENT;
	if (s->state != CORE_SEQ_ACTIVE)
		return -EBUSY;
	*ret = s;
	return 0;
}

static inline int tokens_check(const struct core *c, const uint32_t *tokens, uint32_t n)
{
	if (n == 0 || !tokens)
		return -EINVAL;
	if (c->cfg.vocab_size)
		for (uint32_t i = 0; i < n; i++)
			if (tokens[i] >= c->cfg.vocab_size)
				return -EINVAL;
	return 0;
}

static inline uint32_t blocks_for(const struct core *c, uint32_t ntokens)
{
	return (uint32_t)(((uint64_t)ntokens + c->cfg.block_tokens - 1) / c->cfg.block_tokens);
}

/* The extra key block n is hashed and verified with (see retention_tag). */
static inline uint64_t block_extra(const struct core *c, uint64_t extra, uint64_t tag,
				   uint64_t full, uint32_t n)
{
	return tag && (uint64_t)(n + 1) * c->cfg.block_tokens > full ? extra ^ tag : extra;
}

/*
 * Releases every block a table holds, back to front: a child becomes cached before its parent,
 * which keeps the LRU list leaf-first (see pool_alloc).
 */
/* The leading committed, findable blocks of s's table: its chain, as the value policy sees it. */
static inline uint32_t chain_blocks(const struct core *c, const struct core_seq *s)
{
	uint32_t n = 0;

	while (n < s->nblocks && s->table[n] != CORE_NONE &&
	       (c->pool.blocks[s->table[n]].flags & CORE_BLOCK_INDEXED))
		n++;
	return n;
}

/*
 * Releases a closing or dropped sequence's table, last block first (leaf-first), with the
 * client's hint (enum core_reuse), which only the value policy takes: under LRU a block sent
 * to the old end could be older than a cached child another chain left, and LRU keeps no
 * count of children to know.
 */
static inline void release_table_reuse(struct core *c, struct core_seq *s, uint32_t reuse)
{
	if (c->value)
		value_release_begin(c->value, s->table, chain_blocks(c, s), s->opened, reuse);
	else
		(void)reuse;
	for (uint32_t i = s->nblocks; i-- > 0;) {
		if (s->table[i] == CORE_NONE)
			continue;
		if (c->value)
			value_release_hint(c->value, i ? s->table[i - 1] : CORE_NONE);
		pool_unref(&c->pool, s->table[i]);
	}
	if (c->value)
		value_release_end(c->value);
}

static inline void release_table(struct core *c, struct core_seq *s)
{
	release_table_reuse(c, s, CORE_REUSE_DEFAULT);
}

/* tier.c */
int tiers_init(struct core *c);
void tiers_done(struct core *c);
/* A pool block is being evicted: move it below the pool unless it is marked not to. */
void tier_demote_block(struct core *c, uint32_t b);
/*
 * The observer's two events (core_config.observe): a block of the pool (level CORE_TIER_POOL)
 * or of a tier just indexed there, or just taken out of that index.
 */
void core_observe_stored(struct core *c, uint32_t level, uint32_t slot, const uint32_t *tokens,
			 uint32_t from_level, uint32_t from_slot);
void core_observe_removed(struct core *c, uint32_t level, uint32_t slot);

/* Offers a block a probed sequence just made findable to the probed level (c->probe_tier). */
void tier_publish(struct core *c, uint32_t b);
/*
 * Offers a block leaving the last local level (from_tier, from; being reused) to a probed
 * level with CORE_TIER_STORE_EVICTED; nothing without one.
 */
void tier_publish_evicted(struct core *c, uint32_t from_tier, uint32_t from,
			  const struct core_key *key);
/* The tier that holds a block with this identity, and its slot; 0 if none. */
uint32_t tier_find(const struct core *c, struct core_hash h, struct core_hash parent,
		   uint64_t salt, uint64_t extra, uint32_t *ret_slot);
/* Keeps a hit from being evicted until tier_put / tier_release. */
void tier_hold(struct core *c, uint32_t t, uint32_t slot);
/* Undoes tier_hold: the slot keeps its block. */
void tier_put(struct core *c, uint32_t t, uint32_t slot);
/* Undoes tier_hold and frees the slot (its block moved up, or was bad). */
void tier_release(struct core *c, uint32_t t, uint32_t slot);
uint32_t tiers_drop_all(struct core *c);
int tiers_verify(const struct core *c, char *why, size_t why_len);

/* The chain hash a block with this parent, salt, extra key and tokens has. */
struct core_hash core_chain_hash(const struct core *c, struct core_hash parent, uint64_t salt,
				 uint64_t extra, const uint32_t *tokens);

/* retain.c */
/* The retention policy, at an open or a commit: releases what later tokens no longer need. */
void retain_prune(struct core *c, struct core_seq *s);
/* H2O: one step's decay of a sequence's scores (a commit that moves on), before it prunes. */
void retain_decay_scores(struct core *c, struct core_seq *s);

/* preempt.c */
/*
 * Drops parked sequences, in the pool's policy order, until need more blocks fit (reserved:
 * cached hits the caller is about to take); nothing when they cannot.  0 or -ENOSPC.
 */
int preempt_make_room(struct core *c, uint32_t need, uint32_t reserved, uint32_t priority);

/* lookup.c */
/*
 * Builds the block table of a prompt (cached prefix, promoted tier hits, fresh blocks); with
 * ret_loads the tier hits' loads are left to the caller.  0, -ENOMEM or -ENOSPC; nothing
 * changes on failure.
 */
int lookup_attach(struct core *c, const struct core_open *o, uint32_t priority,
		  uint32_t **ret_table, uint32_t *ret_nblocks, uint32_t *ret_pool_hits,
		  uint32_t *ret_ready, struct core_hash *ret_chain, uint32_t *ret_holes,
		  struct core_load **ret_loads, uint32_t *ret_nloads);
/* Takes the results of loads into table[nhit, nhit + ntier): how many leading ones are good. */
uint32_t lookup_promote_finish(struct core *c, uint32_t *table, uint32_t nhit,
			       const struct core_load *loads, uint32_t ntier);

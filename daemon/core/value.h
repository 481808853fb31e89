/* SPDX-License-Identifier: MIT */
/*
 * The value eviction policy (core_config.eviction = CORE_EVICT_VALUE): which cached pool block
 * goes when a block is needed, by predicted reuse instead of recency.  docs/policy.md explains
 * the model; in short:
 *
 * - Every sequence that closes (or is dropped) leaves a record of its chain: its class, when,
 *   its turn depth and length, indexed by the chain's blocks at positions n-1, n-2, n-4, ...
 *   (checkpoints).  The records outlive the blocks.
 * - At close, the chain's deepest checkpoint tells what the sequence was: it extended (or
 *   repeated) an earlier chain (depth + 1), shared a prefix of one, or was fresh.  That is a
 *   reuse event of the earlier record, at its age then.
 * - A class is (depth 0, 1, 2, 3+) x (fresh: half-octave length; deeper: the last gap between
 *   turns against the horizon H).  Per class and per age bin (octaves of H), decayed counts of
 *   reuse events and of records still pending at that age give a hazard; from it a hit
 *   density G(age), hits per block per unit of cache time, made nonincreasing.
 * - H, the only time scale, is the mean age of evicted blocks: no constant is in seconds.
 * - Each class is one FIFO segment of cached blocks.  The victim is the segment head with the
 *   lowest G at its age; a head with cached children is passed over (a leaf is always among
 *   the heads: the oldest cached block is one), so a parent never goes before its child.
 *
 * Pure: time comes from the caller (value_set_now), nothing is random, and a replay gives the
 * same decisions twice.  Internal to daemon/core.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/core/block.h"
#include "daemon/core/core.h"

struct prefix_index;
struct value;

#define VALUE_CLASSES CORE_VALUE_CLASSES
#define VALUE_BINS 9u

/*
 * capacity: the pool's blocks (blocks[] has that many) of block_tokens; records: records kept (0: the
 * capacity, at most 65536).  ix: the pool's prefix index, to find a block's parent.  0,
 * -EINVAL or -ENOMEM.
 */
int value_new(uint32_t capacity, uint32_t block_tokens, uint32_t records,
	      const struct core_block *blocks, const struct prefix_index *ix, struct value **ret);
void value_free(struct value *v);

/* The clock, in seconds (any origin, never going back); ages and H are measured with it. */
void value_set_now(struct value *v, double now);
double value_now(const struct value *v);

/* The pool's hooks.  A block became cached (refcount 0, indexed), stopped being cached, or
 * went back to the free list (or is about to be reused). */
void value_cached(struct value *v, uint32_t b);
void value_uncached(struct value *v, uint32_t b);
void value_freed(struct value *v, uint32_t b);

/*
 * The next victim among the cached blocks (CORE_NONE: none), still cached: the caller evicts it
 * next.  fallback is the pool's oldest cached block, taken when no head is a leaf.
 */
uint32_t value_victim(struct value *v, uint32_t fallback);

/*
 * A sequence is letting go of its table (close, or a drop): chain[0, n) are its leading
 * committed, findable blocks, opened the time it was opened (or resumed).  The blocks released
 * between begin and end go to its class (or the client's hint's, enum core_reuse: none, a
 * class that goes first; likely, the class one turn deeper); end leaves its record, of the
 * chain's own class whatever the hint.  Blocks cached outside such a
 * pair (a retention policy's, a promotion's) go to the unclassified class.
 */
void value_release_begin(struct value *v, const uint32_t *chain, uint32_t n, double opened,
			 uint32_t reuse);
void value_release_end(struct value *v);
/* Within a release: the block released next is probably the child of parent (its table's
 * entry before it), which saves a lookup when it is; CORE_NONE: no guess. */
void value_release_hint(struct value *v, uint32_t parent);

void value_get_stats(const struct value *v, struct core_value_stats *ret);

/* Checks the segments against the blocks: 0, or -EUCLEAN with why filled in. */
int value_verify(const struct value *v, uint32_t capacity, char *why, size_t len);

/* SPDX-License-Identifier: MIT */
/*
 * The block pool: metadata for every physical block, an O(1) free list, refcounts and the
 * intrusive LRU list of cached blocks (refcount 0, indexed).  No I/O.  Which cached block an
 * allocation reuses is the LRU list's oldest, or what the value policy (value.h) picks when one
 * is attached; the LRU list is kept either way (persist passes and cache drops walk it).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/core/block.h"

struct value;

/* Called for a cached block just before its memory is reused; it must drop it from the index. */
typedef void (*pool_evict_fn)(void *ctx, uint32_t block);

struct pool {
	struct core_block *blocks;
	uint32_t capacity;
	uint32_t nfree;   /* blocks on the free list */
	uint32_t ncached; /* blocks on the LRU list */
	uint32_t free_head;
	uint32_t lru_head; /* oldest cached block: evicted first */
	uint32_t lru_tail; /* newest cached block */
	uint64_t reused;   /* cached blocks taken by pool_alloc (evictions) */
	pool_evict_fn evict;
	void *evict_ctx;
	struct value *value; /* the value policy, told of every change to the cached set; NULL: LRU */
};

/* Returns 0 or -EINVAL (capacity 0 or too large) / -ENOMEM. */
int pool_init(struct pool *p, uint32_t capacity, pool_evict_fn evict, void *evict_ctx);
void pool_done(struct pool *p);

/* Blocks that an allocation may still obtain: free plus cached. */
static inline uint32_t pool_available(const struct pool *p)
{
	return p->nfree + p->ncached;
}

static inline uint32_t pool_in_use(const struct pool *p)
{
	return p->capacity - p->nfree - p->ncached;
}

/*
 * Takes a free block, or else reuses the oldest cached block, or the value policy's victim
 * (calling the evict hook first).
 * The block comes back FILLING with refcount 1.  Returns CORE_NONE when nothing is left.
 */
uint32_t pool_alloc(struct pool *p);

/* Takes one particular free block, as pool_alloc would.  0, or -EBUSY when it is not free. */
int pool_claim(struct pool *p, uint32_t b);

/* Adds a reference; a cached block leaves the LRU list. */
void pool_ref(struct pool *p, uint32_t b);

/*
 * Drops a reference.  At zero an indexed block becomes cached (newest on the LRU list) and
 * any other block goes back to the free list.
 */
void pool_unref(struct pool *p, uint32_t b);

/*
 * The same, but a block that becomes cached goes just before cached block older_than on the
 * LRU list (evicted before it) instead of newest; CORE_NONE: newest.
 */
void pool_unref_before(struct pool *p, uint32_t b, uint32_t older_than);

/*
 * Frees the oldest cached block (calling the evict hook).  Returns false when nothing is
 * cached.
 */
bool pool_evict_oldest(struct pool *p);

/* Frees cached block b (calling the evict hook), wherever it is on the LRU list. */
void pool_evict(struct pool *p, uint32_t b);

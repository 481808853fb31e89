/* SPDX-License-Identifier: MIT */
/*
 * Block metadata shared by the pool, the prefix index and the sequence layer.
 * Internal to daemon/core: nothing outside core/ includes this file.
 */
#pragma once

#include <assert.h>
#include <stdint.h>

#define CORE_NONE UINT32_MAX

/* 128-bit chain hash of a full block (see hash.h). */
struct core_hash {
	uint64_t lo;
	uint64_t hi;
};

enum core_block_state {
	CORE_BLOCK_FREE = 0, /* on the free list, content meaningless */
	CORE_BLOCK_FILLING,  /* held by sequences, not every slot committed */
	CORE_BLOCK_READY,    /* full and committed: immutable, hash valid */
};

enum {
	CORE_BLOCK_INDEXED = 1u << 0, /* findable through the prefix index */
	CORE_BLOCK_ON_LRU = 1u << 1,  /* refcount 0 and indexed: cached, on the LRU list */
	CORE_BLOCK_PINNED = 1u << 2,  /* transient, inside one call: a hit the caller will take */
	CORE_BLOCK_NODEMOTE = 1u << 3, /* cached, but dropped rather than moved below the pool when
					  evicted (a victim the cost model chose to recompute) */
	CORE_BLOCK_PRUNED = 1u << 4,   /* released by a sequence's retention policy while it kept
					  later blocks: may be cached before its children */
	CORE_BLOCK_STORING = 1u << 5,  /* a probed level's store still reads it: held once more */
	CORE_BLOCK_LATE = 1u << 6,     /* cached when a store let go of it, maybe after its
					  children: may be cached before them */
	CORE_BLOCK_REMOTE = 1u << 7,   /* committed by a CORE_OPEN_PROBED sequence: offered to the
					  probed level when it leaves the last local level
					  (CORE_TIER_STORE_EVICTED); kept through the tiers */
};

/*
 * One per physical block, and one per slot of each tier below the pool.  Kept at 64 bytes so a
 * 1M-block pool's metadata is 64 MiB.  prev/next link the block into exactly one of the free
 * list (doubly linked) or the LRU list, or neither while it is referenced.
 *
 * A block names its parent by hash, not by block id: a lookup verifies the link by content
 * whether or not the parent is still in the pool, so a block whose parent was evicted (after
 * a sequence pruned the parent, say) is merely unreachable, never misattributed.
 */
struct core_block {
	struct core_hash hash;   /* chain hash; valid in state READY */
	struct core_hash parent; /* the previous block's chain hash; zero for the first (READY) */
	uint64_t salt;           /* namespace salt of the chain (READY) */
	uint64_t extra;          /* extra key of the chain, e.g. adapter id (READY) */
	uint32_t prev;           /* LRU: towards older */
	uint32_t next;           /* LRU: towards newer; free list: next free */
	uint32_t refcount;       /* block-table references */
	uint8_t state;           /* enum core_block_state */
	uint8_t flags;           /* CORE_BLOCK_* */
	uint16_t reserved;
};

static_assert(sizeof(struct core_block) == 64, "block metadata must stay at 64 bytes");

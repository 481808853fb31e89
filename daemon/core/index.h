/* SPDX-License-Identifier: MIT */
/*
 * The prefix index: an open-addressing table (linear probing, backward-shift deletion, no
 * tombstones) from a block's 128-bit chain hash to its block id.  It never grows: at most one
 * entry per pool block, and the table has at least twice as many slots.
 */
#pragma once

#include <stdint.h>

#include "daemon/core/block.h"

struct index_slot {
	uint64_t key_lo;
	uint32_t key_hi32; /* the rest of the key is checked in the block metadata */
	uint32_t block;    /* CORE_NONE: empty slot */
};

struct prefix_index {
	struct index_slot *slots;
	uint32_t mask;
	uint32_t count;
};

/* Returns 0, -EINVAL (max_entries 0 or too large) or -ENOMEM. */
int index_init(struct prefix_index *ix, uint32_t max_entries);
void index_done(struct prefix_index *ix);

/* The block indexed under h, or CORE_NONE.  blocks resolves the full 128-bit key. */
uint32_t index_find(const struct prefix_index *ix, const struct core_block *blocks,
		    struct core_hash h);

/* Adds block b under h; the caller guarantees h is not present and the table has room. */
void index_insert(struct prefix_index *ix, struct core_hash h, uint32_t b);

/* Removes block b, indexed under h.  Returns 0 or -ENOENT. */
int index_remove(struct prefix_index *ix, struct core_hash h, uint32_t b);

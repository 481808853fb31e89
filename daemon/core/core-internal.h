/* SPDX-License-Identifier: MIT */
/* The core's private state, shared by core.c and verify.c only. */
#pragma once

#include "daemon/core/core.h"
#include "daemon/core/index.h"
#include "daemon/core/pool.h"

#define CORE_MAX_SEQUENCES (UINT32_C(1) << 24)

struct core_seq {
	uint64_t salt;
	uint64_t extra;
	uint32_t *table; /* NULL: slot not in use */
	uint32_t ntokens;
	uint32_t ncommitted;
	uint32_t nblocks;
	uint32_t cap_blocks;
	uint32_t gen; /* bumped at close so stale ids are refused */
};

struct core {
	struct core_config cfg;
	struct pool pool;
	struct prefix_index index;
	uint32_t *tokens;       /* token id per slot: capacity_blocks * block_tokens */
	uint32_t *walk;         /* hits of core_lookup: one sequence's worth of blocks */
	struct core_seq *seqs;  /* max_sequences slots */
	uint32_t *free_slots;   /* stack of unused slots */
	uint32_t nfree_slots;
	struct core_stats stats;
};

static inline const uint32_t *core_slot_tokens(const struct core *c, uint32_t b)
{
	return c->tokens + (size_t)b * c->cfg.block_tokens;
}

/* The chain hash a block with this parent, salt, extra key and tokens has. */
struct core_hash core_chain_hash(const struct core *c, uint32_t parent, uint64_t salt,
				 uint64_t extra, const uint32_t *tokens);

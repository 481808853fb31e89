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
	uint64_t tick;
	struct victim *victims; /* max_sequences of them: preemption candidates */
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

/* The chain hash a block with this parent, salt, extra key and tokens has. */
struct core_hash core_chain_hash(const struct core *c, uint32_t parent, uint64_t salt,
				 uint64_t extra, const uint32_t *tokens);

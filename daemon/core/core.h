/* SPDX-License-Identifier: MIT */
/*
 * kvpaged's block manager: paged blocks with prefix caching, refcounts and copy-on-write.
 *
 * Pure logic: no I/O, no syscalls, no locks.  One thread owns a struct core; every call runs
 * to completion.  A call that fails returns a negative errno and changes nothing, with one
 * documented exception: a copy-on-write whose copy callback fails may already have evicted
 * one cached block to make room for the copy.
 *
 * Errors, one meaning each:
 *   -EINVAL  a bad argument (zero length, token id outside the vocabulary, commit past the end)
 *   -ENOENT  no such sequence (never opened, or closed)
 *   -ENOSPC  not enough free or cached blocks left to reuse
 *   -E2BIG   the sequence would exceed max_seq_tokens
 *   -EMFILE  max_sequences sequences are open
 *   -EBUSY   the sequence is parked (resume it first)
 *   -ENOMEM  the host is out of memory
 *
 * See docs/core.md for the design.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/core/hash.h"

struct core;

/* Which parked sequences are dropped first when memory runs out. */
enum core_policy {
	CORE_POLICY_LRU = 0,  /* the least recently used */
	CORE_POLICY_PRIORITY, /* the lowest priority, least recently used first among equals;
				 never one of higher priority than the request */
	CORE_POLICY_COST,     /* the fewest tokens to recompute per block freed */
};

/* Copies the whole content of block src into block dst (copy-on-write).  0 or -errno. */
typedef int (*core_copy_block_fn)(void *ctx, uint32_t dst, uint32_t src);

#define CORE_MAX_BLOCK_TOKENS 65536u

struct core_config {
	uint32_t capacity_blocks; /* physical blocks in the pool, >= 1 */
	uint32_t block_tokens;    /* tokens per block, 1 .. CORE_MAX_BLOCK_TOKENS */
	uint32_t max_sequences;   /* open sequences at once, >= 1 */
	uint32_t max_seq_tokens;  /* tokens in one sequence, >= 1 */
	uint32_t vocab_size;      /* token ids must be below this; 0 accepts any id */
	core_copy_block_fn copy_block; /* required: the backend's block copy */
	void *copy_ctx;
	core_hash_fn hash_fn; /* NULL: XXH3-128.  Tests set a weak one to force collisions. */
	enum core_policy policy;
	/* Told about every sequence dropped to make room (may be NULL). */
	void (*on_drop)(void *ctx, uint64_t seq, uint32_t nblocks);
	void *drop_ctx;
};

struct core_stats {
	uint64_t lookups;      /* prefix lookups done by core_seq_open */
	uint64_t query_blocks; /* blocks spanned by the looked-up prompts (partial ones too) */
	uint64_t hit_blocks;   /* of those, found cached */
	uint64_t hit_tokens;
	uint64_t miss_blocks;  /* query_blocks - hit_blocks */
	uint64_t collisions;   /* right hash, other content: counted as a miss, never a hit */
	uint64_t evictions;    /* cached blocks whose memory was reused */
	uint64_t cow_copies;   /* blocks copied because a shared block was written */
	uint64_t dedup_blocks; /* committed blocks replaced by an equal block already cached */
	uint64_t commits;      /* blocks that became READY */
	uint64_t preemptions;  /* parked sequences dropped to make room */
	uint64_t dropped_tokens; /* their tokens, to be recomputed on resume (less what stays cached) */
};

struct core_usage {
	uint32_t capacity;
	uint32_t free;    /* on the free list */
	uint32_t cached;  /* refcount 0, findable, reusable */
	uint32_t in_use;  /* referenced by a block table */
	uint32_t indexed; /* findable (cached ones and referenced ones) */
	uint32_t sequences;
};

struct core_open {
	uint64_t salt;  /* namespace: chains with other salts are never shared */
	uint64_t extra; /* extra key, e.g. adapter id; part of every block hash */
	const uint32_t *tokens;
	uint32_t ntokens; /* >= 1 */
	uint32_t flags;   /* CORE_OPEN_* */
	uint32_t priority; /* higher is more important (CORE_POLICY_PRIORITY) */
};

/*
 * Leave at least the last prompt token uncached, so an engine that needs its logits has a
 * token to compute (the hit stops one block early when the whole prompt is cached).
 */
#define CORE_OPEN_RECOMPUTE_LAST (1u << 0)

enum core_seq_state {
	CORE_SEQ_ACTIVE = 1, /* in use by a client: never moved */
	CORE_SEQ_PARKED,     /* idle: may be dropped when memory runs out */
	CORE_SEQ_DROPPED,    /* its blocks were released; resume recomputes what is not cached */
};

struct core_seq_info {
	uint32_t state;      /* enum core_seq_state */
	uint32_t priority;
	uint64_t salt;
	uint64_t extra;
	uint32_t ntokens;    /* tokens with a slot */
	uint32_t ncommitted; /* leading tokens whose K/V is written */
	uint32_t nblocks;
	const uint32_t *table; /* block table, valid until the next call that changes the core */
};

/* Creates a core.  Returns 0, -EINVAL (bad config) or -ENOMEM. */
int core_new(const struct core_config *cfg, struct core **ret);
/* Frees everything; accepts NULL; returns NULL. */
struct core *core_free(struct core *c);

/*
 * Opens a sequence for a prompt.  Its leading full blocks that are cached (same salt, extra key
 * and tokens, verified token by token) are shared; blocks for the rest are allocated, reusing
 * the least recently used cached blocks when no block is free.  *ret_cached gets the number of
 * leading tokens whose K/V is already there (a multiple of block_tokens); those count as
 * committed.
 */
int core_seq_open(struct core *c, const struct core_open *o, uint64_t *ret_seq,
		  uint32_t *ret_cached);

/*
 * Gives n more tokens slots.  When the last block is partly filled and shared (after a fork),
 * it is copied first (copy-on-write).  Returns the index of the first table entry that
 * changed (>= 0).
 */
int core_seq_append(struct core *c, uint64_t seq, const uint32_t *tokens, uint32_t n);

/*
 * Marks the first ntokens tokens as written.  Blocks that become full and committed turn READY
 * and findable.  When an equal block is already findable and this sequence is the only holder
 * of its own copy, the table switches to the existing block and the copy is freed; returns the
 * number of table entries so replaced (>= 0).  ntokens at or below what is committed is a no-op.
 */
int core_seq_commit(struct core *c, uint64_t seq, uint32_t ntokens);

/* A new sequence sharing every block of seq (parallel sampling, beam search). */
int core_seq_fork(struct core *c, uint64_t seq, uint64_t *ret_child);

/*
 * Parks an idle sequence: its blocks stay, but when an allocation cannot be met from free and
 * cached blocks, parked sequences are dropped (by the configured policy) to make room.  The
 * token history is kept, so nothing is lost but the K/V.  Only resume, info and close apply
 * to a parked sequence.
 */
int core_seq_park(struct core *c, uint64_t seq);

/*
 * Makes a parked or dropped sequence active again.  A dropped one is reopened through the
 * prefix index from its token history (its committed blocks may still be cached);
 * *ret_recompute gets how many tokens' K/V must be computed again (at least the last one, so
 * its logits can be had).  A parked one that kept its blocks needs nothing: 0.
 */
int core_seq_resume(struct core *c, uint64_t seq, uint32_t *ret_recompute);

/* Releases every block reference of seq; committed full blocks stay cached. */
int core_seq_close(struct core *c, uint64_t seq);

/* Describes an open sequence.  0 or -ENOENT. */
int core_seq_info(const struct core *c, uint64_t seq, struct core_seq_info *ret);

/*
 * Probes the cache without taking references or counting statistics: the number of leading
 * tokens of a prompt that core_seq_open would find cached (flags as there).
 */
uint32_t core_lookup(const struct core *c, const struct core_open *o);

/* Frees every cached block (leaf first).  Returns how many were freed. */
uint32_t core_drop_cache(struct core *c);

/* Token ids in the slots of block b (block_tokens of them; meaningful where written). */
const uint32_t *core_block_tokens(const struct core *c, uint32_t b);

void core_get_stats(const struct core *c, struct core_stats *ret);
void core_get_usage(const struct core *c, struct core_usage *ret);

/*
 * Checks every invariant from scratch: refcounts equal block-table references; free + cached +
 * in use = capacity; every block in exactly one state; index and metadata agree; hashes
 * recompute; leaf-first LRU order.  Returns 0 or -EUCLEAN with a description in why.
 */
int core_verify(const struct core *c, char *why, size_t why_len);

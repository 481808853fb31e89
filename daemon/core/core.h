/* SPDX-License-Identifier: MIT */
/*
 * kvpaged's block manager: paged blocks with prefix caching, refcounts and copy-on-write.
 *
 * Pure logic: no I/O, no syscalls, no locks; the core never touches the pool's bytes.  What
 * moves bytes is the caller's, through the callbacks of struct core_config (the daemon queues
 * them on the pool's backend queue: daemon/server/, docs/cuda.md).  One thread owns a struct
 * core; every call runs to completion.  A call that fails returns a negative errno and
 * changes nothing, with one documented exception: a copy-on-write whose copy callback fails
 * may already have evicted one cached block to make room for the copy.
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

/*
 * Which cached block an allocation reuses when no block is free (docs/policy.md).  Either way a
 * parent goes only after its cached children (leaf-first), and referenced blocks never.
 */
enum core_eviction {
	CORE_EVICT_LRU = 0, /* the least recently released */
	CORE_EVICT_VALUE,   /* the lowest predicted hits per block and unit of cache time, learned
			       online from the pool's own history (needs core_set_now) */
};

/*
 * Has the whole content of block src copied into block dst (copy-on-write).  The core reads
 * neither block's bytes, so the copy need not be done on return: only ordered before anything
 * that later reads or writes dst or src.  The daemon queues it on the pool's backend queue and
 * holds a reply that hands dst out until it is done (its ticket, dpool_fence).  0 (copied or
 * queued), or -errno: nothing was copied, and the core's call fails.
 */
typedef int (*core_copy_block_fn)(void *ctx, uint32_t dst, uint32_t src);

/* One token slot (every layer's K and V) to copy from (src, src_slot) to (dst, dst_slot). */
struct core_slot_copy {
	uint32_t dst, dst_slot, src, src_slot;
};

/*
 * Has n token slots copied: the backend's gather, for H2O at token granularity.  As for
 * core_copy_block_fn, the copies need not be done on return, only ordered before any later
 * access to those slots: the daemon queues them on the pool's backend queue (in pieces when the
 * backend has no room for the whole list), and a reply that hands the packed blocks out waits
 * for them.  A call never writes a slot twice, nor reads a slot it writes, so the copies may
 * run in any order (one kernel launch on a GPU).  The core hands over a whole block's
 * survivors at once.  It cannot be told of a failure (the daemon logs one; only a device error,
 * which stops the daemon, or a bug causes it).
 */
typedef void (*core_copy_slots_fn)(void *ctx, const struct core_slot_copy *c, uint32_t n);

#define CORE_MAX_BLOCK_TOKENS 65536u

/*
 * Tiers below the pool: a hierarchical prefix cache.  The levels form an ordered list: the pool
 * is level 0 and the tiers below it are levels 1 .. ntiers, in the order core_config.tiers
 * lists them (fastest first).  A cached block evicted from the pool is demoted, by hash, to
 * level 1; one evicted from level t to level t + 1; one evicted from the last level is gone.
 * A prefix lookup that runs out of pool blocks goes on down the levels and promotes what it
 * finds back into the pool (when the cost model says a transfer from that level beats
 * recomputing).  Each block lives in one place: demotion and promotion move it.  The core
 * keeps the bookkeeping and knows nothing of what a level is made of: each level's bytes are
 * moved by its own callbacks (struct core_tier_ops), so a new kind of storage is a new set of
 * callbacks and one more entry in the list, not a change here.
 */
#define CORE_TIER_POOL 0u
/* Levels below the pool at most: host RAM, files, a remote store, and one to spare. */
#define CORE_MAX_TIERS 4u

/* A full block's identity, as a tier must store it and give it back. */
struct core_key {
	struct core_hash hash;
	struct core_hash parent; /* the parent block's hash; zero for a chain's first block */
	uint64_t salt;
	uint64_t extra;
	const uint32_t *tokens;  /* block_tokens ids; NULL on a move between two tiers (the
				    source tier has them) */
};

/* One block coming up from a tier into the pool. */
struct core_load {
	uint32_t tier;  /* the level it comes from, 1 .. ntiers */
	uint32_t slot;
	uint32_t block; /* the pool block to fill */
	struct core_key key; /* what the slot must hold (tokens from the lookup's prompt) */
	int result;     /* set by the callback: 0, or -errno when nothing usable was copied */
};

/* One level's storage.  Its ctx is the one of its struct core_tier_config. */
struct core_tier_ops {
	/*
	 * Copies a block from (from_tier, from) into slot to of this level, to_tier; from is a
	 * pool block for CORE_TIER_POOL, else a slot of a level above, in that level's storage:
	 * the callback reads it there.  Usually from_tier is to_tier - 1; a block skips the
	 * levels between whose every slot a lookup in progress holds.  Synchronous as far as the
	 * core is concerned: a later load of the slot must see the bytes (the daemon queues the
	 * move, and gathers demotions into one, in the order of the calls).  0, or -errno and the
	 * block is not kept there; a queued move that fails later leaves its slot matching
	 * nothing, so a lookup finds a miss there.
	 */
	int (*store)(void *ctx, uint32_t from_tier, uint32_t from, uint32_t to_tier, uint32_t to,
		     const struct core_key *key);
	/*
	 * Fills n pool blocks from this level's slots, each verified against its key (a tier
	 * never gives back another block's bytes); sets every result.  One call per level per
	 * lookup, with every hit of the lookup in this level, in chain order, so a level can
	 * batch.  Levels listed with the same ops and ctx are one storage: they get one call
	 * for all their hits (loads[i].tier says whose each is).
	 */
	void (*load)(void *ctx, struct core_load *loads, uint32_t n);
};

/*
 * A level that keeps no index: a store the core cannot see into, shared with other machines,
 * which fills and empties without it (a remote tier).  It must be the last level.  Nothing is
 * demoted into it (evictions from the level above it are gone, as from a last level) and it
 * has no slots to count: slots is how many blocks one lookup may ask it for.
 * - Lookups.  Only a lookup of a sequence opened with CORE_OPEN_PROBED and
 *   CORE_OPEN_DEFER_LOADS asks it, and only where the chain above it ends with no reason to
 *   stop (not a collision, not a level whose hits are not promoted): the prompt's next full
 *   blocks, at most slots of them, become loads of this level (slot: the load's index in the
 *   probe, 0, 1, ...) whose pool blocks are allocated as for any tier hit.  A result of
 *   -ENOENT is a plain miss (the store does not have it); any other -errno is counted as a
 *   load error.  Either ends the hit there, and what follows is recomputed.  A synchronous
 *   lookup (core_lookup, an open without CORE_OPEN_DEFER_LOADS) never asks it.
 * - Stores.  When a CORE_OPEN_PROBED sequence commits a block that becomes findable, its store
 *   callback is called with (CORE_TIER_POOL, block, this level, CORE_NONE, key with tokens):
 *   publishing.  A return of 1 means the callback goes on reading the block after the call:
 *   the core keeps it (not reused, not written) until core_tier_stored(c, level, block).  0:
 *   done with it (copied or dropped); -errno: not stored (counted in store_errors).
 */
#define CORE_TIER_PROBED (1u << 0)
/*
 * With CORE_TIER_PROBED: blocks are offered when they leave the last local level (the pool
 * when there is none) instead of at commit, once each time.  The store callback gets the
 * level they leave (from_tier, from: a pool block, or a slot of that level, in its storage;
 * key->tokens NULL from a tier, whose storage has them) while it is being reused: it must copy
 * what it needs within the call (a return of 1 counts as 0).  Only blocks of CORE_OPEN_PROBED
 * sequences are offered, and not while core_drop_cache or a persist pass moves them.
 */
#define CORE_TIER_STORE_EVICTED (1u << 1)
/*
 * A local level whose slots its owner cannot read back to publish them (swap files: the read
 * would block, and the slot is rewritten at once).  With a CORE_TIER_STORE_EVICTED level,
 * blocks are offered when they leave the last level above the cold ones (the pool when every
 * local level is cold), whether they go on into a cold level or not; nothing is offered as it
 * leaves a cold one.  Cold levels come after every other local level.
 */
#define CORE_TIER_COLD (1u << 2)

/* One level below the pool. */
struct core_tier_config {
	uint32_t slots;     /* blocks it holds, >= 1 */
	/*
	 * Bytes/s between the pool and this level; 0: unknown.  The cost model compares a
	 * block's transfer at this rate with recomputing it: a level where the transfer loses
	 * is not promoted from (its hits are recomputed), and the first level's rate decides
	 * whether a preempted sequence is swapped (docs/cost.md).
	 */
	double bandwidth;
	const struct core_tier_ops *ops; /* required, with both callbacks */
	void *ctx;
	uint32_t flags; /* CORE_TIER_* */
};

/*
 * What an observer (core_config.observe) is told: a block became findable at a level, or
 * stopped being findable there.  A move between levels is a REMOVED at one and a STORED at the
 * other, in that order or the other (a demotion stores below, then the slot above is reused);
 * a block kept at two levels (promoted, its copy below kept) is STORED at both.
 */
enum core_event_kind { CORE_EVENT_STORED, CORE_EVENT_REMOVED };

struct core_event {
	enum core_event_kind kind;
	uint32_t level; /* CORE_TIER_POOL, or a local level's id */
	uint32_t slot;  /* the pool block, or the level's slot */
	struct core_hash hash, parent; /* parent: zero for a chain's first block */
	uint64_t salt, extra;
	/*
	 * STORED: the block's token ids, or NULL when they lie in another level's storage, a slot
	 * still intact during the call: from_level, from_slot (a demotion from a tier, whose
	 * storage keeps tokens).  REMOVED: NULL.
	 */
	const uint32_t *tokens;
	uint32_t from_level, from_slot;
};

/*
 * Called from within the core's calls, on the caller's thread; it must not call the core.
 * Every STORED at a level is followed, before another STORED of the same hash there, by its
 * REMOVED; core_drop_cache reports each block it drops.
 */
typedef void core_observe_fn(void *ctx, const struct core_event *ev);

/* What the cost model needs besides each tier's bandwidth; a zero means unknown. */
struct core_cost_config {
	double block_bytes; /* bytes of one block */
	double params;      /* model parameters (recompute = 2 * params * tokens / flops) */
	double flops;       /* FLOP/s the engine recomputes at */
};

struct core_config {
	uint32_t capacity_blocks; /* physical blocks in the pool, >= 1 */
	uint32_t block_tokens;    /* tokens per block, 1 .. CORE_MAX_BLOCK_TOKENS */
	uint32_t max_sequences;   /* open sequences at once, >= 1 */
	uint32_t max_seq_tokens;  /* tokens in one sequence, >= 1 */
	uint32_t vocab_size;      /* token ids must be below this; 0 accepts any id */
	core_copy_block_fn copy_block; /* required: the backend's block copy */
	void *copy_ctx;
	core_copy_slots_fn copy_slots; /* optional (H2O at token granularity); ctx copy_ctx */
	core_hash_fn hash_fn; /* NULL: XXH3-128.  Tests set a weak one to force collisions. */
	enum core_policy policy;
	/*
	 * Told about every sequence dropped to make room (may be NULL), from within the call
	 * that drops it: the core is in the middle of that call, so note it and act after.
	 */
	void (*on_drop)(void *ctx, uint64_t seq, uint32_t nblocks);
	void *drop_ctx;
	/* Told of blocks becoming findable and ceasing to be, at every local level (NULL: no). */
	core_observe_fn *observe;
	void *observe_ctx;
	/*
	 * The levels below the pool, fastest first: tiers[i] is level i + 1.  ntiers <=
	 * CORE_MAX_TIERS; 0: nothing below the pool.
	 */
	struct core_tier_config tiers[CORE_MAX_TIERS];
	uint32_t ntiers;
	struct core_cost_config cost;
	/*
	 * A sliding-window pool: every sequence keeps only the blocks that hold its last window
	 * tokens (0: no window).  See core_open.retention for what is kept and when.
	 */
	uint32_t window;
	uint32_t eviction;      /* enum core_eviction */
	uint32_t value_records; /* CORE_EVICT_VALUE: closed chains remembered (0: the capacity,
				   at most 65536); about 250 bytes each */
};

struct core_stats {
	uint64_t lookups;      /* prefix lookups done by core_seq_open */
	uint64_t query_blocks; /* blocks spanned by the looked-up prompts (partial ones too) */
	uint64_t hit_blocks;   /* of those, found cached in the pool (tier hits: tier stats) */
	uint64_t hit_tokens;   /* tokens reused, from the pool and the tiers */
	uint64_t miss_blocks;  /* query_blocks - hit_blocks */
	uint64_t collisions;   /* right hash, other content: counted as a miss, never a hit */
	uint64_t evictions;    /* cached blocks whose memory was reused */
	uint64_t cow_copies;   /* blocks copied because a shared block was written */
	uint64_t dedup_blocks; /* committed blocks replaced by an equal block already cached */
	uint64_t commits;      /* blocks that became READY */
	uint64_t preemptions;  /* parked sequences dropped to make room */
	uint64_t swaps;        /* of those, the ones whose blocks go to the tiers */
	uint64_t pruned_blocks; /* blocks released by retention policies and windows */
	uint64_t pruned_tokens; /* their tokens (H2O at token granularity: evicted tokens) */
	uint64_t compactions;   /* tokens moved into packed blocks (H2O at token granularity) */
	uint64_t dropped_tokens; /* their tokens, to be recomputed on resume (less what stays cached) */
};

struct core_tier_stats {
	uint32_t capacity;    /* slots */
	uint32_t used;        /* slots holding a block */
	uint64_t demotions;   /* blocks stored here from the level above */
	uint64_t promotions;  /* blocks loaded from here into the pool (prefix hits) */
	uint64_t evictions;   /* blocks pushed out (to the next tier, or gone from the last) */
	uint64_t load_errors; /* loads that failed (I/O, checksum, identity): counted misses */
	uint64_t store_errors; /* stores that failed: the block was dropped instead */
	uint64_t lost;        /* blocks the storage reported lost after storing them */
	uint64_t skipped;     /* hits not promoted because recomputing is cheaper */
	/* A CORE_TIER_PROBED level: */
	uint64_t probes;      /* blocks asked for */
	uint64_t misses;      /* of those, not there (-ENOENT; other failures: load_errors) */
	uint64_t published;   /* blocks offered to its store (store_errors: those it refused) */
};

/* What happened to a parked sequence preempted to make room, and why. */
enum core_decision {
	CORE_DECISION_SWAP = 1, /* its committed blocks go to the tiers as they are evicted */
	CORE_DECISION_DROP,     /* its blocks are dropped when evicted; resume recomputes */
};

enum core_reason {
	CORE_REASON_NO_TIER = 1,     /* no tier below the pool: drop */
	CORE_REASON_NOTHING_TO_SWAP, /* no committed block of its own: drop */
	CORE_REASON_NO_COST_MODEL,   /* params or flops unknown: swap, which loses no work */
	CORE_REASON_SWAP_CHEAPER,    /* transfer back <= recompute */
	CORE_REASON_RECOMPUTE_CHEAPER,
};

struct core_preemption {
	uint64_t tick;     /* the core's operation counter when it happened */
	uint64_t seq;
	uint32_t priority;
	uint32_t tokens;       /* the sequence's tokens */
	uint32_t blocks;       /* blocks it released */
	uint32_t swap_blocks;  /* committed blocks only it held: what a swap moves */
	uint32_t decision;     /* enum core_decision */
	uint32_t reason;       /* enum core_reason */
	uint32_t tier;         /* the tier a swap goes to first */
	double swap_s;         /* estimated transfer back (0 when not applicable) */
	double recompute_s;    /* estimated recompute of the swap blocks' tokens */
};

#define CORE_PREEMPTION_LOG 64

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
	uint32_t retention; /* enum core_retention */
	uint32_t n_sink;    /* SINKS, H2O: leading tokens always kept (H2O: n_sink + recent <=
			       budget; at block granularity the blocks holding them) */
	uint32_t recent;    /* SINKS, H2O: trailing tokens always kept, >= 1 */
	uint32_t budget;    /* H2O: tokens kept in all (sinks, recent ones and heavy hitters),
			       >= recent */
	float decay;        /* H2O: running scores are multiplied by this once per step (a
			       commit that moves on), in (0, 1]; 0 means 1 (no decay) */
	uint32_t granularity; /* H2O: CORE_H2O_BLOCKS or CORE_H2O_TOKENS */
};

/*
 * H2O granularity.  Blocks: whole blocks are released, nothing is copied.  Tokens: single
 * tokens are evicted; the first eviction from a block moves its other tokens into the
 * sequence's packed blocks (copy_slots) and releases the block, and an eviction from the packed
 * blocks moves the last packed token into the hole.  The packed blocks and the position each
 * of their slots holds are in core_seq_info (the position map).
 */
#define CORE_H2O_BLOCKS 0u
#define CORE_H2O_TOKENS 1u

/*
 * What a sequence keeps as it grows.  With sinks (StreamingLLM's attention sinks), once tokens
 * are committed every block wholly inside [n_sink, ncommitted - recent) is released: the next
 * token's attention needs the first n_sink tokens and the last recent ones.  The table keeps
 * its length, with CORE_NONE where a block was released, so table[i] still holds tokens
 * [i * B, (i + 1) * B) (the position map is the table).  Blocks a sequence commits after it
 * first released one were computed over a pruned cache: they are never findable by others.
 * A sliding-window pool applies sinks with n_sink = 0 and recent = window to every sequence,
 * and its blocks stay findable (every sequence of the pool computes K/V the same way).  A
 * sequence with a retention policy cannot be parked (its history is gone): -EINVAL.
 */
enum core_retention {
	CORE_RETAIN_FULL = 0,
	CORE_RETAIN_SINKS = 1,
	CORE_RETAIN_H2O = 2, /* heavy hitters, by block or by token: see core_seq_scores() */
};

/*
 * Leave at least the last prompt token uncached, so an engine that needs its logits has a
 * token to compute (the hit stops one block early when the whole prompt is cached).
 */
#define CORE_OPEN_RECOMPUTE_LAST (1u << 0)
/*
 * The caller's, never a client's: what the tiers below the pool hold of the prompt is not
 * loaded within the call.  The sequence is opened LOADING instead, with its blocks for those
 * hits allocated; the caller reads them in (core_seq_pending_loads) as it likes, then hands
 * the results to core_seq_loaded.  Without tier hits the open is as without the flag.
 */
#define CORE_OPEN_DEFER_LOADS (1u << 16)
/*
 * The caller's, never a client's: the sequence's namespace reaches a CORE_TIER_PROBED level
 * (the names mean the same on the machines that share it).  Its lookups (with
 * CORE_OPEN_DEFER_LOADS, here and at resume) ask that level for what the levels above do not
 * hold, and the blocks it commits are offered to it; its forks share its namespace, and do the
 * same.  Without such a level it changes nothing.
 */
#define CORE_OPEN_PROBED (1u << 17)

enum core_seq_state {
	CORE_SEQ_ACTIVE = 1, /* in use by a client: never moved */
	CORE_SEQ_PARKED,     /* idle: may be dropped when memory runs out */
	CORE_SEQ_DROPPED,    /* its blocks were released; resume recomputes what is not cached */
	CORE_SEQ_LOADING,    /* opened or resumed with CORE_OPEN_DEFER_LOADS: waits for its loads
				(nothing but core_seq_loaded and core_seq_info applies) */
};

struct core_seq_info {
	uint32_t state;      /* enum core_seq_state */
	uint32_t priority;
	uint64_t salt;
	uint64_t extra;
	uint32_t ntokens;    /* tokens with a slot */
	uint32_t ncommitted; /* leading tokens whose K/V is written */
	uint32_t nblocks;      /* table entries: blocks held and released (CORE_NONE) */
	const uint32_t *table; /* block table, valid until the next call that changes the core */
	uint32_t retention;    /* enum core_retention (a window pool's sequences: SINKS) */
	uint32_t n_sink, recent;
	uint32_t budget;       /* H2O */
	uint32_t granularity;  /* H2O */
	/* H2O at token granularity: blocks holding evicted blocks' surviving tokens, packed. */
	const uint32_t *packed;          /* ceil(npacked / B) blocks */
	const uint32_t *packed_positions; /* npacked original positions, one per slot */
	uint32_t npacked;
	uint32_t held_blocks;  /* table entries that are not CORE_NONE, and packed blocks */
	uint32_t retained_tokens; /* tokens whose K/V it still holds (packed ones included) */
	uint32_t freed_blocks; /* entries released by the retention policy */
};

/* Creates a core.  Returns 0, -EINVAL (bad config) or -ENOMEM. */
int core_new(const struct core_config *cfg, struct core **ret);
/* Frees everything; accepts NULL; returns NULL. */
struct core *core_free(struct core *c);

/*
 * Opens a sequence for a prompt.  Its leading full blocks that are cached (same salt, extra key
 * and tokens, verified token by token) are shared; blocks for the rest are allocated, reusing
 * the least recently used cached blocks when no block is free.  *ret_info (may be NULL) gets
 * what core_seq_info would now: its ncommitted is the number of leading tokens whose K/V is
 * already there (a multiple of block_tokens; those count as committed), its state LOADING when
 * loads were deferred.  Both are untouched on failure.
 */
int core_seq_open(struct core *c, const struct core_open *o, uint64_t *ret_seq,
		  struct core_seq_info *ret_info);

/*
 * Whether a request's open (or lookup) arguments are what core_seq_open takes: 0, or -EINVAL
 * (no tokens, a token id past vocab_size, flags other than CORE_OPEN_RECOMPUTE_LAST, a bad
 * retention policy) or -EOPNOTSUPP (a policy this pool cannot serve), with the reason in words
 * in *ret_why.  core_seq_open checks the same first (and takes CORE_OPEN_DEFER_LOADS, which is
 * the caller's); a caller that refuses bad arguments before its own checks asks here.
 */
int core_open_check(const struct core *c, const struct core_open *o, const char **ret_why);

/*
 * Why core_seq_open refuses o's retention policy in this pool, in words (NULL: it does not),
 * with the error it returns for it in *ret_err: -EINVAL, or -EOPNOTSUPP (token granularity
 * on a backend without a gather).  A window pool decides for its sequences: any policy is
 * refused there.
 */
const char *core_retention_why(const struct core *c, const struct core_open *o, int *ret_err);

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
/* The same, with flags: CORE_OPEN_DEFER_LOADS (then *ret_recompute counts the loads as missing
 * until core_seq_loaded). */
int core_seq_resume_flags(struct core *c, uint64_t seq, uint32_t flags, uint32_t *ret_recompute);

/*
 * A LOADING sequence's loads: the pool blocks to fill from which tier slots, with the
 * identity each must have, in the order of the sequence's table (so levels may alternate:
 * the caller reads each load from its own level's storage, as that level's load callback
 * would).  The caller sets every result (0 once the block holds the bytes;
 * -EBADMSG when the slot held something else or was damaged; another -errno when the read
 * failed) and calls core_seq_loaded.  The slots stay held (never reused) until then, and the
 * blocks belong to the sequence.  0 (*ret_n = 0 if not LOADING) or -ENOENT.
 */
int core_seq_pending_loads(struct core *c, uint64_t seq, struct core_load **ret,
			   uint32_t *ret_n);
/*
 * Takes a LOADING sequence's load results as a synchronous open or resume would have: the
 * leading intact ones become READY (and findable), the first bad one is counted and dropped,
 * and what follows is to be recomputed.  The sequence becomes ACTIVE; core_seq_info then
 * gives its committed tokens (cached; for a resume, ntokens - ncommitted is to be recomputed).
 * 0, -ENOENT, or -EINVAL (not LOADING).
 */
int core_seq_loaded(struct core *c, uint64_t seq);

/*
 * Heavy-hitter retention (H2O).  A sequence opened with CORE_RETAIN_H2O accumulates the
 * attention its tokens receive: each call adds weights[i] to the running score of position
 * first + i; every commit that moves on (a step) then multiplies all scores by the sequence's
 * decay, however many reports the step made.  The client sums a decode step's attention over
 * heads and layers.  When tokens are committed and the sequence holds more than budget
 * tokens, what holds none of the last recent committed tokens (nor any of the first n_sink)
 * goes, lowest score first (ties: the earliest first), until it holds at most budget tokens or
 * nothing such is left: whole blocks scored by their tokens' sum at block granularity, single
 * tokens at token granularity (see CORE_H2O_TOKENS).  Returns 0, -ENOENT,
 * -EINVAL (not an H2O sequence, n == 0, a weight that is negative or not finite, or a
 * position the sequence does not hold: beyond its tokens or released), -EBUSY (parked).
 */
int core_seq_scores(struct core *c, uint64_t seq, uint32_t first, const float *weights,
		    uint32_t n);

/*
 * H2O at token granularity: the attention each packed slot received, in packed order (n must
 * be the sequence's npacked).  Same errors as core_seq_scores().
 */
int core_seq_scores_packed(struct core *c, uint64_t seq, const float *weights, uint32_t n);

/* Releases every block reference of seq; committed full blocks stay cached. */
int core_seq_close(struct core *c, uint64_t seq);

/*
 * What a client knows of a chain's future (docs/policy.md#hints): it overrides the prediction
 * for the blocks the close releases.
 */
enum core_reuse {
	CORE_REUSE_DEFAULT = 0, /* no hint: the policy predicts */
	CORE_REUSE_NONE,        /* will not be reused: its blocks go first (leaf-first still) */
	CORE_REUSE_LIKELY,      /* will be reused: counted one turn deeper */
};
#define CORE_REUSE_MAX CORE_REUSE_LIKELY

/*
 * core_seq_close with a hint.  Under the value policy NONE puts the blocks it releases in a
 * class that goes first (a head with cached children is still passed over) and LIKELY classes
 * the chain one turn deeper; what it learns (the chain's record) is the same as without a
 * hint.  An LRU pool takes no hint: a block sent to the old end could be older than a cached
 * child another chain left, which LRU keeps no count of.  0, -ENOENT, -EBUSY, or -EINVAL (a
 * hint past CORE_REUSE_MAX).
 */
int core_seq_close_reuse(struct core *c, uint64_t seq, uint32_t reuse);

/* Describes an open sequence.  0 or -ENOENT. */
int core_seq_info(const struct core *c, uint64_t seq, struct core_seq_info *ret);

/*
 * The most heap memory the core keeps for a sequence of ntokens tokens in state (enum
 * core_seq_state) under retention and granularity: its table and scores with their room to
 * grow, H2O's position map, and the token history of a parked or dropped sequence (pending
 * loads, which the pool's capacity bounds, are not counted).  What the core allocates for it
 * is never more (core_verify checks that), so a caller that charges this against a memory
 * quota before every call that grows a sequence enforces the quota without seeing the core's
 * allocations.
 */
uint64_t core_seq_bytes(const struct core *c, uint32_t retention, uint32_t granularity,
			uint32_t ntokens, uint32_t state);

/*
 * Probes the cache without taking references or counting statistics: the number of leading
 * tokens of a prompt that core_seq_open would find cached (flags as there).
 */
uint32_t core_lookup(const struct core *c, const struct core_open *o);

/*
 * Frees every cached block (leaf first) and empties the tiers below the pool, moving nothing.
 * Returns how many blocks and slots were freed.
 */
uint32_t core_drop_cache(struct core *c);

/*
 * A CORE_TIER_PROBED level is done reading block, which its store callback kept (returned 1
 * for): the core may reuse it.  0, or -EINVAL (no such level, or the block is not kept).
 */
int core_tier_stored(struct core *c, uint32_t tier, uint32_t block);
/*
 * A level's bandwidth changed (measured as it is used): the cost model decides again whether
 * its hits are worth a transfer.  0 or -EINVAL (no such level, or a negative rate).
 */
int core_tier_set_bandwidth(struct core *c, uint32_t tier, double bandwidth);
/* Blocks kept for a CORE_TIER_PROBED level's stores now. */
uint32_t core_tier_storing(const struct core *c);

/* Statistics of one tier (1 .. ntiers).  0 or -EINVAL (no such tier). */
int core_get_tier_stats(const struct core *c, uint32_t tier, struct core_tier_stats *ret);

/* The last preemptions, newest first; returns how many were copied (at most max). */
uint32_t core_get_preemptions(const struct core *c, struct core_preemption *ret, uint32_t max);

/* Whether a hit in this tier is promoted (the transfer beats recomputing).  False: no tier. */
bool core_tier_promotes(const struct core *c, uint32_t tier);

/*
 * The storage lost a slot after a store was accepted (a write failed later): the block is
 * forgotten.  Call outside other core calls.  0, or -ENOENT when the slot holds nothing.
 */
int core_tier_lost(struct core *c, uint32_t tier, uint32_t slot);

/*
 * Puts a block found in persistent storage back into a tier's index, before the core is
 * used.  Its identity is checked again when it is loaded.  0, -EINVAL (no such slot or tier),
 * -EBUSY (the slot is taken) or -EEXIST (that block is already indexed; the slot stays free).
 */
int core_tier_restore(struct core *c, uint32_t tier, uint32_t slot, const struct core_key *key);

/* What a pass of core_tier_persist() did so far; zeroed before its first call. */
struct core_persist_pass {
	uint32_t moved;      /* blocks now in the tier */
	uint32_t from_pool;  /* of those, from the pool's cached blocks */
	uint32_t from_tiers; /* and from the tiers above it */
	uint32_t dropped;    /* taken but not kept: marked to be dropped, or their store failed */
	bool full;           /* the tier holds what it can of this pass: the rest stays */
};

/*
 * For a clean stop over a tier that persists: moves cached blocks down into tier `to` so that a
 * restart finds them there as prefix hits.  The most worth keeping go first: the pool's cached
 * blocks, newest first, then each tier above `to`'s, newest first.  Leaf-first eviction keeps
 * a cached parent newer than its cached children and no further from the pool, so a prefix
 * goes down from its root, and a pass cut short leaves leaves, not roots.  Each block is moved
 * (`to`'s store callback, then freed where it was), or dropped when the cost model marked
 * it to be or its store fails, as in an eviction; a block already in `to` only gets fresher.
 * Blocks held by sequences or loads are not touched.  The pass ends once it has filled `to`
 * (one more would push out a block it moved) or nothing is left.  At most max blocks per call,
 * so the caller can bound the time it spends; returns how many this call took (0: the pass is
 * over), or -EINVAL (no such tier, or pass NULL).
 */
int core_tier_persist(struct core *c, uint32_t to, uint32_t max, struct core_persist_pass *pass);

/*
 * The time, in seconds from any origin, never going back: the daemon passes its monotonic
 * clock before each call, a replay the trace's timestamps.  Only CORE_EVICT_VALUE uses it (to
 * age blocks and to learn when chains come back); the core never reads a clock itself.
 */
void core_set_now(struct core *c, double now);

/* What CORE_EVICT_VALUE has learned, for operators (docs/policy.md). */
#define CORE_VALUE_CLASSES 30u

struct core_value_class {
	char name[16];       /* "fresh:12" (half-octave length band), "depth2:near", ... */
	uint32_t cached;     /* blocks in its segment now */
	double samples;      /* decayed records that reached age 0 (exposure of the first bin) */
	double events;       /* decayed reuse events */
	double p_reuse;      /* predicted chance of reuse before 16 H */
	double median_reuse; /* predicted median reuse age of those reused, in seconds; 0: none */
	double density0;     /* hit density at age 0, per block per H */
};

struct core_value_stats {
	double horizon;      /* H, seconds */
	uint64_t records;    /* records left (closes and drops with a chain) */
	uint64_t extensions; /* of those, extending or repeating an earlier chain */
	uint64_t shares;     /* sharing a prefix of one */
	uint64_t decisions;  /* victims chosen */
	uint64_t passed_over; /* heads passed over for having cached children */
	uint64_t lru_fallbacks; /* no leaf among the heads: the oldest cached block went */
	uint64_t parent_first; /* victims that had cached children (leaf-first broken): 0 unless
				  a retention policy or a store cached a parent first */
	uint32_t nclasses;
	struct core_value_class cls[CORE_VALUE_CLASSES];
};

/* What CORE_EVICT_VALUE has learned; -ENOENT for an LRU pool. */
int core_get_value_stats(const struct core *c, struct core_value_stats *ret);

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

#ifdef KVPAGED_TEST_HOOKS
/*
 * A test hook (configure --enable-test-hooks; the daemon calls it on SIGUSR2): breaks one
 * invariant, for tests that core_verify() and `kvpagedctl verify` report it.  It gives a block
 * one reference that no block table holds: the first block a sequence holds, else block 0.
 * Returns that block.
 */
uint32_t core_test_corrupt(struct core *c);
#endif

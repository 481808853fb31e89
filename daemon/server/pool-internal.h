/* SPDX-License-Identifier: MIT */
/* What pool.c, queue.c and tierio.c share of a device pool's internals (struct dpool). */
#pragma once

#include "daemon/server/server.h"

static inline void *block_at(const struct dpool *p, uint32_t b)
{
	return (char *)p->mem.base + (uint64_t)b * p->block_bytes;
}

/* queue.c: the backend's queue */
/* Blocks the loop until ticket *ticket completed: for the CPU's own use of queued memory. */
void dpool_wait(struct dpool *p, const uint64_t *ticket);
/* A move on the backend's queue; *ret_ticket (may be NULL) gets its ticket.  0 or -errno. */
int dpool_move(struct dpool *p, enum backend_dir dir, const struct backend_move *m,
	       uint32_t n, uint64_t *ret_ticket);
/* core_config.copy_block and copy_slots: queued on the backend. */
int dpool_copy_block(void *ctx, uint32_t dst, uint32_t src);
void dpool_copy_slots(void *ctx, const struct core_slot_copy *c, uint32_t n);

/* tierio.c: the tiers' stores, loads and deferred load jobs */
/* The most blocks a pinned staging holds. */
#define STAGE_MAX_BLOCKS 64u

/*
 * A deferred load: the file-tier part of one LOADING sequence's loads (its host-tier loads
 * were queued at once).  The arrays are the file tier's batch, in flight while the job is
 * the head of the pool's queue.
 */
/*
 * A deferred load's parts: a sequence may wait for the swap files and the remote tier at once;
 * the last part to finish hands the results to the core and answers the session.
 */
struct load_wait {
	struct session *s; /* a reference, dropped when the last part ends */
	uint64_t seq;
	uint32_t parts;
};

/* Ends one part of w (freed with the last). */
void dpool_load_part_done(struct dpool *p, struct load_wait *w);

struct load_job {
	struct load_job *next;
	struct load_wait *wait; /* the sequence's, which the job's end ends a part of */
	uint64_t seq;
	uint32_t n;
	uint64_t fence;  /* the reads start once this ticket is done (their blocks are free) */
	bool started, finished;
	/*
	 * The entries being read: all of them for a pool in host memory (into the blocks); for a
	 * pool on a device, a chunk at a time into the load staging, each moved in once read.
	 */
	uint32_t first, count;
	uint32_t *which; /* index in the sequence's loads */
	uint32_t *slots;
	struct tier_key *keys;
	void **dsts;
	int *results;
};

/*
 * The core's callbacks for a pool's levels (core_tier_config.ops, ctx the pool): host RAM and
 * the swap files.  Each is handed only its own level's loads.
 */
extern const struct core_tier_ops dpool_host_tier_ops;
extern const struct core_tier_ops dpool_file_tier_ops;
extern const struct core_tier_ops dpool_remote_tier_ops;
/*
 * Submits the remote part of a LOADING sequence's loads (those of p->remote_level): one fetch.
 * 0 when there is none, 1 when it went out (w gets a part), or a failure that set their
 * results at once (the blocks are recomputed).
 */
int dpool_remote_load(struct dpool *p, struct load_wait *w, struct core_load *loads,
		      uint32_t n);
/* A queued write failed: remember the slot; dpool_tier_poll tells the core between calls. */
void dpool_on_file_lost(void *ctx, uint32_t slot, int err);
/* Hands the pending stores whose moves are done to the file tier; waits for the first wait. */
void dpool_stores_settle(struct dpool *p, uint32_t wait);

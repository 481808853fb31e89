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

/* SPDX-License-Identifier: MIT */
/*
 * Every copy and move goes on the backend's one queue (daemon/backend/backend.h), whose tickets
 * complete in order.  The pool remembers, per block and per host-tier slot, the last ticket
 * that touched it, so that:
 *  - a reply that hands blocks to a client is held until their tickets are done (dpool_fence);
 *  - the daemon's own CPU reads and writes of such memory (the file tier's I/O, host-tier
 *    bytes going to the files) first wait for them (dpool_wait: the loop blocks, counted);
 *  - queued operations need no ordering among themselves: the queue keeps it.
 * For backend_host everything completes inside the call and nothing is ever held.
 */
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "daemon/log.h"
#include "daemon/server/pool-internal.h"
#include "daemon/server/server.h"

static void device_failed(struct dpool *p, int r)
{
	/* The errno says little ("Input/output error"); the module has the driver's words. */
	if (!p->failed)
		log_error("pool %s: the %s backend failed: %s%s%s%s; the pool's memory cannot be "
			  "trusted any more, so the daemon stops", p->cfg->name, p->mem.ops->name,
			  strerror(-r), p->module ? " (" : "",
			  p->module ? p->module->last_error() : "", p->module ? ")" : "");
	p->failed = r;
}

/* Whether ticket t has completed (asking the backend only when it may have moved on). */
bool dpool_passed(struct dpool *p, uint64_t t)
{
	uint64_t done;
	int r;

	if (t <= p->completed)
		return true;
	r = p->mem.ops->done(&p->mem, &done);
	if (r < 0) {
		device_failed(p, r);
		return false;
	}
	if (done > p->completed)
		p->completed = done;
	return t <= p->completed;
}

static void queued(struct dpool *p, uint64_t t)
{
	if (t > p->issued) {
		p->issued = t;
		p->queued_ops++;
	}
}

/*
 * Demotions into the host tier are gathered (p->out) and queued as one move: an eviction of n
 * blocks is then one launch or one job, not n.  The batch goes out before anything else is
 * queued, waited for or fenced, so the queue's order is the order of the calls; and before it
 * would hold a block or a slot twice (one move's entries may run in any order).
 */
static void flush_demotions(struct dpool *p)
{
	uint64_t t = 0;
	int r;

	if (!p->nout)
		return;
	r = p->mem.ops->move(&p->mem, BACKEND_TO_HOST, p->out, p->nout, &t);
	if (r < 0) {
		/*
		 * The core has them in the tier already; their slots now match nothing, so a
		 * lookup finds a miss (recomputed), never these bytes.  (A host backend does not
		 * fail here; a GPU only for a device error, which stops the daemon.)
		 */
		log_warning("pool %s: moving %u blocks out to the host tier failed: %s; their slots "
			    "are forgotten", p->cfg->name, p->nout, strerror(-r));
		for (uint32_t i = 0; i < p->nout; i++)
			(void)host_tier_slot_for_write(p->host, p->out_slots[i]);
		/* The core believes those slots full: nothing of this pool is to be trusted. */
		device_failed(p, r);
	}
	for (uint32_t i = 0; t && i < p->nout; i++)
		p->block_ticket[p->out[i].block] = p->slot_ticket[p->out_slots[i]] = t;
	queued(p, t);
	p->nout = 0;
}

void dpool_flush(struct dpool *p)
{
	flush_demotions(p);
}

/*
 * Blocks the loop until the ticket at *ticket completed: for the CPU's own use of queued
 * memory.  A pointer, read only after the gathered demotions are queued: the memory the
 * caller is about to touch may be in that batch, which sets its ticket.
 */
void dpool_wait(struct dpool *p, const uint64_t *ticket)
{
	uint64_t t;
	int r;

	flush_demotions(p);
	t = *ticket;
	if (dpool_passed(p, t))
		return;
	p->cpu_waits++;
	r = p->mem.ops->wait(&p->mem, t);
	if (r < 0) {
		device_failed(p, r);
		return;
	}
	p->completed = t;
}

uint64_t dpool_fence(struct dpool *p, const uint32_t *table, uint32_t n)
{
	uint64_t fence = 0;

	flush_demotions(p);
	if (dpool_passed(p, p->issued))
		return 0;
	for (uint32_t i = 0; i < n; i++)
		if (table[i] < p->cfg->capacity_blocks && p->block_ticket[table[i]] > fence)
			fence = p->block_ticket[table[i]];
	return fence > p->completed ? fence : 0;
}

/*
 * Whether a copy asked for (r, ticket t) was queued, counted if so.  The daemon's lists are
 * well formed, and a list the backend has no room for is split (ENOMEM); any other refusal is
 * the device's, sticky: no ticket was issued, so no event or check would find it later.
 */
static bool copy_queued(struct dpool *p, int r, uint64_t t)
{
	if (r < 0 && r != -EINVAL && r != -ENOMEM)
		device_failed(p, r);
	if (r < 0 || !t)
		return false;
	queued(p, t);
	return true;
}

static int q_copy_blocks(struct dpool *p, const struct backend_block_copy *c, uint32_t n)
{
	uint64_t t;
	int r;

	flush_demotions(p);
	r = p->mem.ops->copy_blocks(&p->mem, c, n, &t);
	if (copy_queued(p, r, t))
		for (uint32_t i = 0; i < n; i++)
			p->block_ticket[c[i].dst] = p->block_ticket[c[i].src] = t;
	return r;
}

static int q_copy_slots(struct dpool *p, const struct backend_slot_copy *c, uint32_t n)
{
	uint64_t t;
	int r;

	flush_demotions(p);
	r = p->mem.ops->copy_slots(&p->mem, c, n, &t);
	if (copy_queued(p, r, t))
		for (uint32_t i = 0; i < n; i++)
			p->block_ticket[c[i].dst] = p->block_ticket[c[i].src] = t;
	return r;
}

/* A move; *ret_ticket (may be NULL) gets its ticket for the caller's host side. */
int dpool_move(struct dpool *p, enum backend_dir dir, const struct backend_move *m,
	       uint32_t n, uint64_t *ret_ticket)
{
	uint64_t t;
	int r;

	flush_demotions(p);
	r = p->mem.ops->move(&p->mem, dir, m, n, &t);
	if (r < 0) {
		log_warning("pool %s: moving %u blocks %s the %s pool failed: %s", p->cfg->name, n,
			    dir == BACKEND_TO_HOST ? "out of" : "into", p->mem.ops->name,
			    strerror(-r));
		/* The daemon's moves are always well formed: only the device can refuse one. */
		if (r != -EINVAL)
			device_failed(p, r);
		return r;
	}
	for (uint32_t i = 0; t && i < n; i++)
		p->block_ticket[m[i].block] = t;
	queued(p, t);
	if (ret_ticket)
		*ret_ticket = t;
	return 0;
}

/* core_config.copy_block: copy-on-write, queued. */
int dpool_copy_block(void *ctx, uint32_t dst, uint32_t src)
{
	const struct backend_block_copy c = { dst, src };

	return q_copy_blocks(ctx, &c, 1);
}

/*
 * core_config.copy_slots: the backend's batched gather, queued.  The two structs are the same
 * four words in the same order (checked here), so the core's list goes to the backend as it
 * is.  A list the backend has no room for (a GPU's long-list buffer) goes in shorter pieces;
 * the core cannot be told of any other failure, which only a device error (the daemon stops)
 * or a bug can cause.
 */
_Static_assert(sizeof(struct core_slot_copy) == sizeof(struct backend_slot_copy) &&
		       offsetof(struct core_slot_copy, dst) ==
			       offsetof(struct backend_slot_copy, dst) &&
		       offsetof(struct core_slot_copy, dst_slot) ==
			       offsetof(struct backend_slot_copy, dst_slot) &&
		       offsetof(struct core_slot_copy, src) ==
			       offsetof(struct backend_slot_copy, src) &&
		       offsetof(struct core_slot_copy, src_slot) ==
			       offsetof(struct backend_slot_copy, src_slot),
	       "struct core_slot_copy and struct backend_slot_copy differ");

#define SLOT_COPY_PIECE 64u

void dpool_copy_slots(void *ctx, const struct core_slot_copy *c, uint32_t n)
{
	struct dpool *p = ctx;
	const struct backend_slot_copy *bc = (const struct backend_slot_copy *)c;
	int r = q_copy_slots(p, bc, n);

	if (r == -ENOMEM && n > SLOT_COPY_PIECE) {
		/* Every piece, whatever an earlier one returned: none may be left out. */
		r = 0;
		for (uint32_t i = 0; i < n; i += SLOT_COPY_PIECE) {
			int q = q_copy_slots(p, bc + i,
					     n - i < SLOT_COPY_PIECE ? n - i : SLOT_COPY_PIECE);

			r = q < 0 ? q : r;
		}
	}
	if (r < 0)
		log_error("pool %s: gathering %u token slots failed: %s; the sequence's packed "
			  "tokens are wrong", p->cfg->name, n, strerror(-r));
}

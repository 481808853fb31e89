/* SPDX-License-Identifier: MIT */
/*
 * Preemption under memory pressure: which parked sequences give up their blocks, in the
 * pool's policy order, and whether each one is swapped to the tiers or dropped (the cost
 * model's choice), with the log of what was decided.
 */
#include <errno.h>
#include <stdlib.h>

#include "daemon/core/core-internal.h"
#include "daemon/core/cost.h"

/* Chooses between swapping a victim's blocks to the tiers and dropping them, and logs it. */
static void decide(struct core *c, const struct core_seq *s, struct core_preemption *p)
{
	const struct core_cost_config *cost = &c->cfg.cost;
	uint32_t swap_blocks = 0;
	double bandwidth; /* a swap's transfer back: from the first level, where it goes */

	for (uint32_t i = 0; i < s->nblocks; i++) {
		const struct core_block *blk;

		if (s->table[i] == CORE_NONE)
			continue;
		blk = &c->pool.blocks[s->table[i]];
		swap_blocks += blk->refcount == 1 && (blk->flags & CORE_BLOCK_INDEXED);
	}
	*p = (struct core_preemption){
		.tick = c->tick,
		.seq = seq_id(c, (uint32_t)(s - c->seqs)),
		.priority = s->priority,
		.tokens = s->ntokens,
		.blocks = s->nblocks,
		.swap_blocks = swap_blocks,
		.tier = c->first_tier,
	};
	if (!c->first_tier) {
		p->decision = CORE_DECISION_DROP;
		p->reason = CORE_REASON_NO_TIER;
		return;
	}
	if (swap_blocks == 0) {
		p->decision = CORE_DECISION_DROP;
		p->reason = CORE_REASON_NOTHING_TO_SWAP;
		return;
	}
	bandwidth = c->tiers[c->first_tier].cfg->bandwidth;
	if (cost->params <= 0 || cost->flops <= 0 || cost->block_bytes <= 0 || bandwidth <= 0) {
		p->decision = CORE_DECISION_SWAP;
		p->reason = CORE_REASON_NO_COST_MODEL;
		return;
	}
	/* What a drop costs on resume: these blocks' tokens (a partial tail is recomputed anyway). */
	p->swap_s = cost_transfer_s((double)swap_blocks * cost->block_bytes, bandwidth);
	p->recompute_s = cost_recompute_s(cost->params, (double)swap_blocks * c->cfg.block_tokens,
					  cost->flops);
	if (cost_choose(p->swap_s, p->recompute_s) == COST_SWAP) {
		p->decision = CORE_DECISION_SWAP;
		p->reason = CORE_REASON_SWAP_CHEAPER;
	} else {
		p->decision = CORE_DECISION_DROP;
		p->reason = CORE_REASON_RECOMPUTE_CHEAPER;
	}
}

/*
 * Releases a parked sequence's blocks, keeping its token history: it becomes DROPPED.  Its
 * committed blocks become cached like any others; a swap lets them move down the tiers when
 * their memory is taken, a drop marks the ones only it held to be discarded instead.
 */
static void drop(struct core *c, struct core_seq *s)
{
	struct core_preemption *p = &c->log[c->nlog++ % CORE_PREEMPTION_LOG];
	uint32_t nblocks = s->nblocks;

	decide(c, s, p);
	if (p->decision == CORE_DECISION_DROP)
		for (uint32_t i = 0; i < s->nblocks; i++) {
			struct core_block *blk;

			if (s->table[i] == CORE_NONE)
				continue;
			blk = &c->pool.blocks[s->table[i]];
			if (blk->refcount == 1)
				blk->flags |= CORE_BLOCK_NODEMOTE;
		}
	else
		c->stats.swaps++;
	release_table(c, s);
	free(s->table);
	s->table = NULL;
	s->cap_blocks = s->nblocks = 0;
	s->ncommitted = 0;
	s->state = CORE_SEQ_DROPPED;
	c->stats.preemptions++;
	c->stats.dropped_tokens += s->ntokens;
	if (c->cfg.on_drop)
		c->cfg.on_drop(c->cfg.drop_ctx, seq_id(c, (uint32_t)(s - c->seqs)), nblocks);
}

static int policy_cmp(const void *a, const void *b, void *ctx)
{
	const struct victim *x = a, *y = b;
	const enum core_policy *policy = ctx;

	switch (*policy) {
	case CORE_POLICY_PRIORITY:
		if (x->priority != y->priority)
			return x->priority < y->priority ? -1 : 1;
		break;
	case CORE_POLICY_COST: {
		/* tokens / freeable, compared without division */
		uint64_t l = (uint64_t)x->tokens * y->freeable, r = (uint64_t)y->tokens * x->freeable;

		if (l != r)
			return l < r ? -1 : 1;
		break;
	}
	case CORE_POLICY_LRU:
		break;
	}
	if (x->last_use != y->last_use)
		return x->last_use < y->last_use ? -1 : 1;
	return x->slot < y->slot ? -1 : x->slot > y->slot;
}

/*
 * Makes room for need more blocks when free and cached ones (less the reserved cached hits
 * the caller is about to take) do not suffice: drops parked sequences in policy order.  It
 * counts only the blocks a victim alone holds (and that are not pinned hits), so its estimate
 * never overshoots, and it drops nothing unless the estimate covers the need: a failed call
 * changes nothing.  Returns 0 or -ENOSPC.
 */
int preempt_make_room(struct core *c, uint32_t need, uint32_t reserved, uint32_t priority)
{
	uint64_t avail = pool_available(&c->pool) - reserved, gain = 0;
	uint32_t n = 0, k = 0;

	if (need <= avail)
		return 0;
	for (uint32_t slot = 0; slot < c->cfg.max_sequences; slot++) {
		struct core_seq *s = &c->seqs[slot];
		uint32_t freeable = 0;

		if (s->state != CORE_SEQ_PARKED)
			continue;
		/* Never a more important sequence for a less important request. */
		if (c->cfg.policy == CORE_POLICY_PRIORITY && s->priority > priority)
			continue;
		for (uint32_t i = 0; i < s->nblocks; i++) {
			const struct core_block *blk;

			if (s->table[i] == CORE_NONE)
				continue;
			blk = &c->pool.blocks[s->table[i]];
			freeable += blk->refcount == 1 && !(blk->flags & CORE_BLOCK_PINNED);
		}
		if (freeable == 0)
			continue;
		c->victims[n++] = (struct victim){ .slot = slot, .freeable = freeable,
						   .last_use = s->last_use, .priority = s->priority,
						   .tokens = s->ntokens };
	}
	qsort_r(c->victims, n, sizeof(*c->victims), policy_cmp, &c->cfg.policy);
	while (k < n && avail + gain < need)
		gain += c->victims[k++].freeable;
	if (avail + gain < need)
		return -ENOSPC;
	for (uint32_t i = 0; i < k; i++)
		drop(c, &c->seqs[c->victims[i].slot]);
	return 0;
}

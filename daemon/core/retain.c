/* SPDX-License-Identifier: MIT */
/*
 * Retention policies: sinks and windows release the blocks the next token's attention needs
 * none of, H2O evicts by the scores clients report (by block, or by token with the kept tokens
 * packed into blocks of their own).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/core/core-internal.h"

/* Releases table entry i (retention policies): its block may stay cached for others. */
static void release_entry(struct core *c, struct core_seq *s, uint32_t i, uint32_t pruned_tokens)
{
	struct core_block *blk = &c->pool.blocks[s->table[i]];

	/* Cached (if findable) before the blocks this sequence keeps after it. */
	blk->flags |= CORE_BLOCK_PRUNED;
	pool_unref(&c->pool, s->table[i]);
	s->table[i] = CORE_NONE;
	s->freed++;
	c->stats.pruned_blocks++;
	c->stats.pruned_tokens += pruned_tokens;
	if (s->hl)
		for (uint32_t k = 0; k < s->nhl; k++)
			if (s->hl[k] == i) {
				memmove(s->hl + k, s->hl + k + 1, (s->nhl - k - 1) * sizeof(*s->hl));
				s->nhl--;
				break;
			}
	if (!c->cfg.window)
		s->pruned = true;
}

/* Room for n packed slots in all, allocating blocks as needed.  0, -ENOMEM or -ENOSPC. */
static int packed_reserve(struct core *c, struct core_seq *s, uint32_t n)
{
	const uint32_t B = c->cfg.block_tokens;

	while (s->packed_cap < n) {
		uint32_t nb = s->packed_cap / B + 1, b;
		uint32_t *pk = realloc(s->packed, (size_t)nb * sizeof(*pk)), *pp;
		float *ps;

		if (!pk)
			return -ENOMEM;
		s->packed = pk;
		pp = realloc(s->ppos, (size_t)nb * B * sizeof(*pp));
		if (!pp)
			return -ENOMEM;
		s->ppos = pp;
		ps = realloc(s->pscore, (size_t)nb * B * sizeof(*ps));
		if (!ps)
			return -ENOMEM;
		s->pscore = ps;
		b = pool_alloc(&c->pool);
		if (b == CORE_NONE)
			return -ENOSPC;
		s->packed[nb - 1] = b;
		s->packed_cap += B;
	}
	return 0;
}

/*
 * Queues copying the token in (src, src_slot) into packed slot k, and gives the slot its token
 * id, position and score.  gather_flush() runs what was queued: one eviction's copies never
 * read what they write.
 */
static void packed_put(struct core *c, struct core_seq *s, uint32_t k, uint32_t src,
		       uint32_t src_slot, uint32_t pos, float score)
{
	const uint32_t B = c->cfg.block_tokens;
	uint32_t dst = s->packed[k / B];

	c->gather[c->ngather++] = (struct core_slot_copy){ dst, k % B, src, src_slot };
	c->tokens[(size_t)dst * B + k % B] = c->tokens[(size_t)src * B + src_slot];
	s->ppos[k] = pos;
	s->pscore[k] = score;
}

/* Runs the gather packed_put() queued: one call for an eviction's copies. */
static void gather_flush(struct core *c)
{
	if (c->ngather)
		c->cfg.copy_slots(c->cfg.copy_ctx, c->gather, c->ngather);
	c->ngather = 0;
}

/*
 * H2O at token granularity: while more than budget tokens are held, evicts the token with the
 * lowest score (the earliest among equals) among the packed ones and those of blocks holding
 * none of the last recent committed tokens, leaving out the first n_sink positions.  A block
 * losing its first token has its others (sinks included) packed and is released; a packed
 * token is replaced by the last packed one.
 */
static void prune_h2o_tokens(struct core *c, struct core_seq *s)
{
	const uint32_t B = c->cfg.block_tokens;
	uint32_t held = s->npacked + s->ntokens - s->freed * B, end;

	if (s->ncommitted <= s->recent)
		return;
	end = (s->ncommitted - s->recent) / B;
	while (held > s->budget) {
		uint32_t best_pos = UINT32_MAX, best_k = CORE_NONE, best_i = CORE_NONE;
		float best = 0;

		for (uint32_t k = 0; k < s->npacked; k++)
			if (s->ppos[k] >= s->n_sink &&
			    (best_k == CORE_NONE ? true
			     : s->pscore[k] < best ||
				       (s->pscore[k] == best && s->ppos[k] < best_pos))) {
				best = s->pscore[k];
				best_pos = s->ppos[k];
				best_k = k;
			}
		for (uint32_t h = 0; h < s->nhl && s->hl[h] < end; h++) {
			uint32_t i = s->hl[h];

			for (uint32_t j = 0; j < B; j++) {
				uint32_t pos = i * B + j;
				float sc = s->tscore[pos];

				if (pos < s->n_sink)
					continue;
				if ((best_k == CORE_NONE && best_i == CORE_NONE) || sc < best ||
				    (sc == best && pos < best_pos)) {
					best = sc;
					best_pos = pos;
					best_i = i;
					best_k = CORE_NONE;
				}
			}
		}
		if (best_i != CORE_NONE) {
			uint32_t b = s->table[best_i];

			/* Room first: a block is released only once all its survivors moved. */
			if (packed_reserve(c, s, s->npacked + B - 1) < 0)
				return; /* over budget until memory frees up */
			for (uint32_t j = 0; j < B; j++) {
				uint32_t pos = best_i * B + j;

				if (pos == best_pos)
					continue;
				packed_put(c, s, s->npacked++, b, j, pos, s->tscore[pos]);
				c->stats.compactions++;
			}
			/* Copied before the block goes back: it may be handed out next. */
			gather_flush(c);
			release_entry(c, s, best_i, 1);
		} else if (best_k != CORE_NONE) {
			uint32_t last = s->npacked - 1;

			if (best_k != last) {
				packed_put(c, s, best_k, s->packed[last / B], last % B, s->ppos[last],
					   s->pscore[last]);
				gather_flush(c);
			}
			s->npacked--;
			c->stats.pruned_tokens++;
			/* The last packed block emptied: give it back. */
			if (s->packed_cap - s->npacked >= B) {
				s->packed_cap -= B;
				pool_unref(&c->pool, s->packed[s->packed_cap / B]);
			}
		} else {
			return;
		}
		held--;
	}
}

/*
 * H2O at block granularity: while more than budget tokens are held, releases the held block
 * with the lowest score among those holding none of the first n_sink and none of the last
 * recent committed tokens (ties: the earliest).  Linear in the blocks held, which the budget
 * bounds.
 */
static void prune_h2o(struct core *c, struct core_seq *s)
{
	const uint32_t B = c->cfg.block_tokens;
	const uint32_t sinks = (uint32_t)(((uint64_t)s->n_sink + B - 1) / B);
	uint32_t held = s->ntokens - s->freed * B, end;

	if (s->ncommitted <= s->recent)
		return;
	end = (s->ncommitted - s->recent) / B; /* entries below hold no recent token */
	while (held > s->budget) {
		uint32_t victim = CORE_NONE;

		for (uint32_t h = 0; h < s->nhl && s->hl[h] < end; h++) {
			uint32_t i = s->hl[h];

			if (i >= sinks && (victim == CORE_NONE || s->score[i] < s->score[victim]))
				victim = i;
		}
		if (victim == CORE_NONE)
			return;
		release_entry(c, s, victim, B);
		held -= B;
	}
}

/*
 * The retention policy, at a commit.  Sinks and windows release the blocks wholly inside
 * [n_sink, ncommitted - recent): they were committed (or will never be), so the next token's
 * attention needs none of them.  H2O evicts by score (above).
 */
void retain_prune(struct core *c, struct core_seq *s)
{
	const uint32_t B = c->cfg.block_tokens;
	uint32_t first, end;

	if (s->retention == CORE_RETAIN_H2O) {
		if (s->granularity == CORE_H2O_TOKENS)
			prune_h2o_tokens(c, s);
		else
			prune_h2o(c, s);
		return;
	}
	if (s->retention == CORE_RETAIN_FULL || s->ncommitted <= s->recent)
		return;
	first = (uint32_t)(((uint64_t)s->n_sink + B - 1) / B);
	end = (s->ncommitted - s->recent) / B;
	if (first < s->prune_from)
		first = s->prune_from;
	for (uint32_t i = first; i < end; i++)
		if (s->table[i] != CORE_NONE)
			release_entry(c, s, i, B);
	if (end > s->prune_from)
		s->prune_from = end;
}

const char *core_retention_why(const struct core *c, const struct core_open *o, int *ret_err)
{
	*ret_err = -EINVAL;
	if (o->retention == CORE_RETAIN_FULL)
		return NULL;
	if (o->retention > CORE_RETAIN_H2O)
		return "bad retention: unknown policy";
	if (c->cfg.window)
		return "the pool's window decides what its sequences keep";
	if (o->recent == 0)
		return "bad retention: recent 0 (a policy must keep the last token at least)";
	if (o->retention == CORE_RETAIN_SINKS)
		return NULL;
	if (o->budget < o->recent)
		return "bad retention: budget below recent";
	if (o->n_sink > o->budget - o->recent)
		return "bad retention: n_sink + recent exceed the budget";
	if (!(o->decay >= 0 && o->decay <= 1))
		return "bad retention: decay outside [0, 1]";
	if (o->granularity > CORE_H2O_TOKENS)
		return "bad retention: unknown granularity";
	*ret_err = -EOPNOTSUPP;
	if (o->granularity == CORE_H2O_TOKENS && !c->cfg.copy_slots)
		return "this pool's backend cannot gather tokens";
	return NULL;
}

/*
 * Applies the decay once per step (a commit that moves on), after the step's reports and
 * before evicting: O(1), as scores are kept divided by scale.  When scale gets small the held
 * scores are multiplied out and scale starts again.
 */
void retain_decay_scores(struct core *c, struct core_seq *s)
{
	const uint32_t B = c->cfg.block_tokens;

	if (s->decay >= 1)
		return;
	s->scale *= s->decay;
	if (s->scale > 1e-20)
		return;
	for (uint32_t h = 0; h < s->nhl; h++) {
		uint32_t i = s->hl[h];

		if (!s->tscore)
			s->score[i] = (float)(s->score[i] * s->scale);
		else
			for (uint32_t j = 0; j < B; j++)
				s->tscore[(size_t)i * B + j] =
					(float)(s->tscore[(size_t)i * B + j] * s->scale);
	}
	for (uint32_t k = 0; k < s->npacked; k++)
		s->pscore[k] = (float)(s->pscore[k] * s->scale);
	s->scale = 1;
}

int core_seq_scores(struct core *c, uint64_t id, uint32_t first, const float *weights,
		    uint32_t n)
{
	const uint32_t B = c->cfg.block_tokens;
	struct core_seq *s;
	int r;

	r = seq_get_active(c, id, &s);
	if (r < 0)
		return r;
	if (s->retention != CORE_RETAIN_H2O || n == 0 || !weights ||
	    (uint64_t)first + n > s->ntokens)
		return -EINVAL;
	/* Everything is checked before anything is added: a bad report changes nothing. */
	for (uint32_t i = 0; i < n; i++)
		if (!(weights[i] >= 0 && weights[i] <= 3.4e38f) ||
		    s->table[(first + i) / B] == CORE_NONE)
			return -EINVAL;
	for (uint32_t i = 0; i < n; i++)
		if (s->tscore)
			s->tscore[first + i] += (float)(weights[i] / s->scale);
		else
			s->score[(first + i) / B] += (float)(weights[i] / s->scale);
	s->last_use = ++c->tick;
	return 0;
}

int core_seq_scores_packed(struct core *c, uint64_t id, const float *weights, uint32_t n)
{
	struct core_seq *s;
	int r;

	r = seq_get_active(c, id, &s);
	if (r < 0)
		return r;
	if (!s->tscore || n != s->npacked || (n && !weights))
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++)
		if (!(weights[i] >= 0 && weights[i] <= 3.4e38f))
			return -EINVAL;
	for (uint32_t i = 0; i < n; i++)
		s->pscore[i] += (float)(weights[i] / s->scale);
	s->last_use = ++c->tick;
	return 0;
}

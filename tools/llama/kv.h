/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-llama: the two K/V caches behind struct kv_cache.
 *
 * kv_contig is a private array, K and V each [layer][pos][kv_dim], as in llama2.c.
 *
 * kv_paged is one sequence's view of a kvpaged pool: the K/V of position pos in layer l lives
 * at table[pos / block_tokens] * block_stride + l * layer_stride + kv * kv_stride +
 * (pos % block_tokens) * slot_stride, kv_dim floats (every kv head, head_stride apart).
 * Positions below readonly_below are in blocks that others may share and that are committed,
 * so they are never written: storing one compares it with what the pool holds instead.
 *
 * With a retention policy (docs/retention.md) the daemon releases blocks the sequence no
 * longer needs: their entries become KVP_TABLE_HOLE, and entry i still holds positions
 * [i * block_tokens, (i + 1) * block_tokens).  A hole is never read, except that under H2O at
 * token granularity a position in a hole may have been moved to a packed slot: the packed
 * blocks and the position of each of their slots come from kvp_seq_packed().
 *
 * kv_h2o is the H2O policy itself (docs/retention.md, daemon/core/retain.c), run by the engine:
 * it is what the contiguous cache keeps, and the model the paged one checks the daemon against.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "libclient/include/kvpaged.h"
#include "tools/llama/model.h"

struct kv_contig {
	struct kv_cache base;
	float *k, *v;
	uint32_t n_layers, positions, kv_dim;
};

/* A cache for positions [0, positions): the model's seq_len, or more for a long stream. */
int kv_contig_init(struct kv_contig *kv, const struct llama_config *cfg, uint32_t positions);
/* Copies the first ntokens positions of src into dst (a fork); both initialized. */
void kv_contig_copy(struct kv_contig *dst, const struct kv_contig *src, uint32_t ntokens);
void kv_contig_free(struct kv_contig *kv);

struct kv_paged {
	struct kv_cache base;
	struct kvp_table table;
	unsigned char *pool;
	uint64_t block_stride, layer_stride, kv_stride, slot_stride;
	uint32_t block_tokens, capacity_blocks, kv_dim;
	uint32_t readonly_below;
	uint64_t compared, mismatched; /* rows checked against the pool, and how many differed */
	/* H2O at token granularity: the packed blocks, each packed slot's position, and back. */
	struct kvp_table packed_blocks, packed_positions;
	uint32_t *packed_slot; /* per position: its packed slot, or KVP_TABLE_HOLE */
	uint32_t packed_slot_cap;
};

/*
 * Checks that the pool's geometry and layout fit the model (layers, kv heads, head size, float
 * elements, heads side by side in a slot).  Returns 0, or -EINVAL with why in msg.
 */
int kv_paged_check_pool(const struct kvp_pool_info *p, const struct llama_config *cfg,
			char *msg, size_t msg_len);
void kv_paged_init(struct kv_paged *kv, struct kvp_client *c, const struct llama_config *cfg);
/* Replaces the table's entries from from on with n entries (0 or -ENOMEM/-EPROTO). */
int kv_paged_table_set(struct kv_paged *kv, uint32_t from, const uint32_t *entries, uint32_t n);
/*
 * Checks that the table covers ntokens and names only blocks of the pool or holes (0 or
 * -EPROTO).
 */
int kv_paged_check_table(const struct kv_paged *kv, uint32_t ntokens);
/*
 * Checks that every position the token at pos attends to under mask (NULL: all), and pos
 * itself, is in a block the table names: 0, or -EPROTO with the first such position that is in
 * a hole (or past the table) in *ret_pos.
 */
int kv_paged_check_mask(const struct kv_paged *kv, const struct llama_mask *mask, uint32_t pos,
			uint32_t *ret_pos);
/* The table's entries that are not holes: the blocks the sequence holds. */
uint32_t kv_paged_held(const struct kv_paged *kv);
/*
 * Takes the packed blocks and positions kvp_seq_packed() gave for a sequence of ntokens (and
 * leaves the previous ones in their place, to be filled next time): checks that there is a
 * block for every block_tokens slots and no other, that blocks are in the pool, and that each
 * position is below ntokens, in a hole of the table and packed once; then maps each position
 * to its slot.  0, -ENOMEM or -EPROTO (nothing taken).
 */
int kv_paged_set_packed(struct kv_paged *kv, struct kvp_table *blocks,
			struct kvp_table *positions, uint32_t ntokens);
/* The packed slot holding pos, or KVP_TABLE_HOLE. */
static inline uint32_t kv_paged_packed_slot(const struct kv_paged *kv, uint32_t pos)
{
	return pos < kv->packed_slot_cap ? kv->packed_slot[pos] : KVP_TABLE_HOLE;
}
void kv_paged_free(struct kv_paged *kv);

/*
 * H2O (heavy hitters), as the daemon runs it.  Scores are floats kept divided by scale (the
 * product of the decays so far), each report first multiplying scale by the decay and each
 * weight w adding (float)(w / scale), exactly the daemon's arithmetic: the same reports give
 * the same floats, so ties and their order come out the same.  A commit of more tokens than
 * before, while more than budget tokens are held, evicts the lowest score first (the earliest
 * position among equals) among what holds none of the last recent committed tokens: whole
 * blocks scored by the sum of their tokens' scores, or single tokens, a block's survivors
 * going to the packed set.  The first n_sink positions are never evicted (at block granularity
 * the blocks holding them).
 */
struct kv_h2o {
	uint32_t budget, recent, n_sink, block_tokens;
	bool tokens;   /* token granularity */
	float decay;   /* 1: none */
	double scale;
	uint32_t ntokens, ncommitted, cap; /* cap: positions the arrays hold */
	float *score;  /* per block, or per position at token granularity */
	bool *block_held; /* per block: its entry is held (not released) */
	bool *packed;     /* per position: in the packed set (token granularity) */
	uint32_t *packed_list, npacked; /* the packed positions, in no particular order */
	uint32_t freed;   /* blocks released */
	uint64_t evicted, compactions; /* tokens evicted; tokens moved to the packed set */
};

struct kv_h2o_config {
	uint32_t budget, recent, n_sink, block_tokens;
	bool tokens;
	float decay; /* (0, 1] */
};

/* A sequence of ntokens (none committed) that may reach positions tokens.  0 or -ENOMEM. */
int kv_h2o_init(struct kv_h2o *h, const struct kv_h2o_config *cfg, uint32_t positions,
		uint32_t ntokens);
void kv_h2o_free(struct kv_h2o *h);
void kv_h2o_append(struct kv_h2o *h, uint32_t n);
/* Marks the first ncommitted tokens committed and evicts; returns how many tokens it evicted. */
uint32_t kv_h2o_commit(struct kv_h2o *h, uint32_t ncommitted);
/* One report: weights of positions [first, first + n), which must be in held blocks. */
void kv_h2o_report(struct kv_h2o *h, uint32_t first, const float *weights, uint32_t n);
/* One report for the packed set: weights[i] for packed position positions[i], all of them. */
void kv_h2o_report_packed(struct kv_h2o *h, const uint32_t *positions, const float *weights,
			  uint32_t n);
static inline bool kv_h2o_block_held(const struct kv_h2o *h, uint32_t block)
{
	return h->block_held[block];
}
static inline bool kv_h2o_packed(const struct kv_h2o *h, uint32_t pos)
{
	return h->tokens && h->packed[pos];
}
/* Tokens held: those of held blocks and the packed ones. */
static inline uint32_t kv_h2o_held_tokens(const struct kv_h2o *h)
{
	return h->ntokens - h->freed * h->block_tokens + h->npacked;
}

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
 * [i * block_tokens, (i + 1) * block_tokens).  A hole is never read.
 */
#pragma once

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
void kv_paged_free(struct kv_paged *kv);

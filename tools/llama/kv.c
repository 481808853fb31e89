/* SPDX-License-Identifier: MIT */
/* kvpaged-llama: the private contiguous K/V cache and the kvpaged pool's paged one. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/llama/kv.h"

static void contig_store(struct kv_cache *base, uint32_t layer, uint32_t pos, const float *k,
			 const float *v)
{
	struct kv_contig *kv = (struct kv_contig *)base;
	size_t off = ((size_t)layer * kv->positions + pos) * kv->kv_dim;

	memcpy(kv->k + off, k, kv->kv_dim * sizeof(float));
	memcpy(kv->v + off, v, kv->kv_dim * sizeof(float));
}

static uint32_t contig_rows(const struct kv_cache *base, uint32_t layer, unsigned which,
			    uint32_t pos, uint32_t end, const float **ret_row, size_t *ret_stride)
{
	const struct kv_contig *kv = (const struct kv_contig *)base;

	*ret_row = (which ? kv->v : kv->k) + ((size_t)layer * kv->positions + pos) * kv->kv_dim;
	*ret_stride = kv->kv_dim;
	return end - pos;
}

static const struct kv_cache_ops contig_ops = {
	.store = contig_store,
	.rows = contig_rows,
};

int kv_contig_init(struct kv_contig *kv, const struct llama_config *cfg, uint32_t positions)
{
	size_t n = (size_t)cfg->n_layers * positions * cfg->kv_dim;

	*kv = (struct kv_contig){ .base.ops = &contig_ops, .n_layers = cfg->n_layers,
				  .positions = positions, .kv_dim = cfg->kv_dim };
	kv->k = calloc(n, sizeof(float));
	kv->v = calloc(n, sizeof(float));
	if (!kv->k || !kv->v) {
		kv_contig_free(kv);
		return -ENOMEM;
	}
	return 0;
}

void kv_contig_copy(struct kv_contig *dst, const struct kv_contig *src, uint32_t ntokens)
{
	for (uint32_t l = 0; l < src->n_layers; l++) {
		size_t off = (size_t)l * src->positions * src->kv_dim;

		memcpy(dst->k + off, src->k + off, (size_t)ntokens * src->kv_dim * sizeof(float));
		memcpy(dst->v + off, src->v + off, (size_t)ntokens * src->kv_dim * sizeof(float));
	}
}

void kv_contig_free(struct kv_contig *kv)
{
	free(kv->k);
	free(kv->v);
	kv->k = kv->v = NULL;
}

static float *paged_row(const struct kv_paged *kv, uint32_t layer, unsigned which, uint32_t pos)
{
	uint64_t off = kv->table.blocks[pos / kv->block_tokens] * kv->block_stride +
		       layer * kv->layer_stride + which * kv->kv_stride +
		       (pos % kv->block_tokens) * kv->slot_stride;

	return (float *)(kv->pool + off);
}

static void paged_store(struct kv_cache *base, uint32_t layer, uint32_t pos, const float *k,
			const float *v)
{
	struct kv_paged *kv = (struct kv_paged *)base;
	float *pk = paged_row(kv, layer, 0, pos), *pv = paged_row(kv, layer, 1, pos);
	size_t bytes = kv->kv_dim * sizeof(float);

	if (pos < kv->readonly_below) {
		/* A committed block is immutable, and must hold what we computed. */
		kv->compared++;
		if (memcmp(pk, k, bytes) != 0 || memcmp(pv, v, bytes) != 0)
			kv->mismatched++;
		return;
	}
	memcpy(pk, k, bytes);
	memcpy(pv, v, bytes);
}

/* The row of packed slot k (H2O at token granularity). */
static const float *packed_row(const struct kv_paged *kv, uint32_t layer, unsigned which,
			       uint32_t k)
{
	uint64_t off = kv->packed_blocks.blocks[k / kv->block_tokens] * kv->block_stride +
		       layer * kv->layer_stride + which * kv->kv_stride +
		       (k % kv->block_tokens) * kv->slot_stride;

	return (const float *)(kv->pool + off);
}

static uint32_t paged_rows(const struct kv_cache *base, uint32_t layer, unsigned which,
			   uint32_t pos, uint32_t end, const float **ret_row, size_t *ret_stride)
{
	const struct kv_paged *kv = (const struct kv_paged *)base;
	const uint32_t B = kv->block_tokens;
	uint32_t n = B - pos % B;

	*ret_stride = kv->slot_stride / sizeof(float);
	if (kv->table.blocks[pos / B] == KVP_TABLE_HOLE) {
		/*
		 * Released, so moved to a packed slot (the caller attends only to what the
		 * sequence holds); the positions after it may follow in the same packed block.
		 */
		uint32_t k = kv->packed_slot[pos], m = 1;

		while (pos + m < end && m < B - k % B && kv_paged_packed_slot(kv, pos + m) == k + m)
			m++;
		*ret_row = packed_row(kv, layer, which, k);
		return m;
	}
	*ret_row = paged_row(kv, layer, which, pos);
	return n < end - pos ? n : end - pos;
}

static const struct kv_cache_ops paged_ops = {
	.store = paged_store,
	.rows = paged_rows,
};

int kv_paged_check_pool(const struct kvp_pool_info *p, const struct llama_config *cfg,
			char *msg, size_t msg_len)
{
	uint64_t last;

	if (p->layers != cfg->n_layers || p->kv_heads != cfg->n_kv_heads ||
	    p->head_dim != cfg->head_size || p->element_bytes != sizeof(float)) {
		snprintf(msg, msg_len,
			 "pool '%s' is %u layers x %u kv heads x head_dim %u x %u-byte "
			 "elements; the model needs %u x %u x %u x 4 (float32)",
			 p->name, p->layers, p->kv_heads, p->head_dim, p->element_bytes,
			 cfg->n_layers, cfg->n_kv_heads, cfg->head_size);
		return -EINVAL;
	}
	if (p->head_stride != (uint64_t)cfg->head_size * sizeof(float) ||
	    p->slot_stride % sizeof(float) || p->kv_stride % sizeof(float) ||
	    p->layer_stride % sizeof(float) || p->block_stride % sizeof(float) ||
	    p->block_tokens == 0 || p->capacity_blocks == 0) {
		snprintf(msg, msg_len,
			 "pool '%s' lays out a slot's heads %llu bytes apart (or strides not float "
			 "aligned); the engine needs them side by side (%u bytes)",
			 p->name, (unsigned long long)p->head_stride,
			 (unsigned)(cfg->head_size * sizeof(float)));
		return -EINVAL;
	}
	last = (uint64_t)(p->capacity_blocks - 1) * p->block_stride +
	       (uint64_t)(p->layers - 1) * p->layer_stride + p->kv_stride +
	       (uint64_t)(p->block_tokens - 1) * p->slot_stride + cfg->kv_dim * sizeof(float);
	if (last > p->pool_bytes) {
		snprintf(msg, msg_len, "pool '%s': its strides reach past its %llu bytes", p->name,
			 (unsigned long long)p->pool_bytes);
		return -EINVAL;
	}
	if (p->vocab_size && p->vocab_size < cfg->vocab_size) {
		snprintf(msg, msg_len, "pool '%s' takes token ids below %u; the model has %u",
			 p->name, p->vocab_size, cfg->vocab_size);
		return -EINVAL;
	}
	return 0;
}

void kv_paged_init(struct kv_paged *kv, struct kvp_client *c, const struct llama_config *cfg)
{
	const struct kvp_pool_info *p = kvp_pool(c);

	*kv = (struct kv_paged){
		.base.ops = &paged_ops,
		.pool = kvp_pool_base(c),
		.block_stride = p->block_stride,
		.layer_stride = p->layer_stride,
		.kv_stride = p->kv_stride,
		.slot_stride = p->slot_stride,
		.block_tokens = p->block_tokens,
		.capacity_blocks = p->capacity_blocks,
		.kv_dim = cfg->kv_dim,
	};
}

int kv_paged_table_set(struct kv_paged *kv, uint32_t from, const uint32_t *entries, uint32_t n)
{
	struct kvp_table *t = &kv->table;

	if (from > t->len || (uint64_t)from + n > UINT32_MAX / sizeof(uint32_t))
		return -EPROTO;
	if (n == 0) {
		t->len = from;
		return 0;
	}
	if (from + n > t->cap) {
		uint32_t cap = from + n + 16;
		uint32_t *b = realloc(t->blocks, (size_t)cap * sizeof(*b));

		if (!b)
			return -ENOMEM;
		t->blocks = b;
		t->cap = cap;
	}
	memcpy(t->blocks + from, entries, (size_t)n * sizeof(*entries));
	t->len = from + n;
	return 0;
}

int kv_paged_check_table(const struct kv_paged *kv, uint32_t ntokens)
{
	if ((uint64_t)kv->table.len * kv->block_tokens < ntokens)
		return -EPROTO;
	for (uint32_t i = 0; i < kv->table.len; i++)
		if (kv->table.blocks[i] >= kv->capacity_blocks &&
		    kv->table.blocks[i] != KVP_TABLE_HOLE)
			return -EPROTO;
	return 0;
}

int kv_paged_check_mask(const struct kv_paged *kv, const struct llama_mask *mask, uint32_t pos,
			uint32_t *ret_pos)
{
	const uint32_t B = kv->block_tokens;
	struct llama_span span[2];
	const unsigned n = llama_mask_spans(mask, pos, span);

	for (unsigned r = 0; r < n; r++) {
		/* Block by block: an entry covers B positions. */
		for (uint32_t t = span[r].begin; t < span[r].end; t = (t / B + 1) * B) {
			if (t / B >= kv->table.len || kv->table.blocks[t / B] == KVP_TABLE_HOLE) {
				*ret_pos = t;
				return -EPROTO;
			}
		}
	}
	return 0;
}

uint32_t kv_paged_held(const struct kv_paged *kv)
{
	uint32_t held = 0;

	for (uint32_t i = 0; i < kv->table.len; i++)
		held += kv->table.blocks[i] != KVP_TABLE_HOLE;
	return held;
}

int kv_paged_set_packed(struct kv_paged *kv, struct kvp_table *blocks,
			struct kvp_table *positions, uint32_t ntokens)
{
	const uint32_t B = kv->block_tokens;
	struct kvp_table t;
	uint32_t i;

	if (blocks->len != (positions->len + B - 1) / B)
		return -EPROTO;
	for (i = 0; i < blocks->len; i++)
		if (blocks->blocks[i] >= kv->capacity_blocks)
			return -EPROTO;
	if (ntokens > kv->packed_slot_cap) {
		uint32_t cap = ntokens + B;
		uint32_t *m = realloc(kv->packed_slot, (size_t)cap * sizeof(*m));

		if (!m)
			return -ENOMEM;
		for (i = kv->packed_slot_cap; i < cap; i++)
			m[i] = KVP_TABLE_HOLE;
		kv->packed_slot = m;
		kv->packed_slot_cap = cap;
	}
	for (i = 0; i < kv->packed_positions.len; i++)
		kv->packed_slot[kv->packed_positions.blocks[i]] = KVP_TABLE_HOLE;
	for (i = 0; i < positions->len; i++) {
		uint32_t pos = positions->blocks[i];

		if (pos >= ntokens || pos / B >= kv->table.len ||
		    kv->table.blocks[pos / B] != KVP_TABLE_HOLE ||
		    kv->packed_slot[pos] != KVP_TABLE_HOLE)
			break;
		kv->packed_slot[pos] = i;
	}
	if (i < positions->len) {
		while (i-- > 0)
			kv->packed_slot[positions->blocks[i]] = KVP_TABLE_HOLE;
		kv->packed_positions.len = 0;
		kv->packed_blocks.len = 0;
		return -EPROTO;
	}
	/* Ours now; the caller's tables get the old ones, to fill next time. */
	t = kv->packed_blocks;
	kv->packed_blocks = *blocks;
	*blocks = t;
	t = kv->packed_positions;
	kv->packed_positions = *positions;
	*positions = t;
	return 0;
}

void kv_paged_free(struct kv_paged *kv)
{
	kvp_table_free(&kv->table);
	kvp_table_free(&kv->packed_blocks);
	kvp_table_free(&kv->packed_positions);
	free(kv->packed_slot);
	kv->packed_slot = NULL;
	kv->packed_slot_cap = 0;
}

/* ------------------------------------------------------------------------------------- H2O */

int kv_h2o_init(struct kv_h2o *h, const struct kv_h2o_config *cfg, uint32_t positions,
		uint32_t ntokens)
{
	const uint32_t B = cfg->block_tokens;
	const uint32_t nblocks = positions / B + 2, cap = nblocks * B;

	*h = (struct kv_h2o){ .budget = cfg->budget, .recent = cfg->recent,
			      .n_sink = cfg->n_sink, .block_tokens = B,
			      .tokens = cfg->tokens, .decay = cfg->decay, .scale = 1, .cap = cap };
	h->score = calloc(cfg->tokens ? cap : nblocks, sizeof(*h->score));
	h->block_held = calloc(nblocks, sizeof(*h->block_held));
	if (cfg->tokens) {
		h->packed = calloc(cap, sizeof(*h->packed));
		h->packed_list = malloc((size_t)cap * sizeof(*h->packed_list));
	}
	if (!h->score || !h->block_held || (cfg->tokens && (!h->packed || !h->packed_list))) {
		kv_h2o_free(h);
		return -ENOMEM;
	}
	kv_h2o_append(h, ntokens);
	return 0;
}

void kv_h2o_free(struct kv_h2o *h)
{
	free(h->score);
	free(h->block_held);
	free(h->packed);
	free(h->packed_list);
	h->score = NULL;
	h->block_held = h->packed = NULL;
	h->packed_list = NULL;
}

void kv_h2o_append(struct kv_h2o *h, uint32_t n)
{
	for (; n > 0; n--, h->ntokens++)
		if (h->ntokens % h->block_tokens == 0)
			h->block_held[h->ntokens / h->block_tokens] = true;
}

/* Releases block i's entry; at token granularity all but pos (the evicted one) are packed. */
static void h2o_release(struct kv_h2o *h, uint32_t i, uint32_t evicted_pos)
{
	const uint32_t B = h->block_tokens;

	h->block_held[i] = false;
	h->freed++;
	if (!h->tokens) {
		h->evicted += B;
		return;
	}
	h->evicted++;
	for (uint32_t pos = i * B; pos < (i + 1) * B; pos++) {
		if (pos == evicted_pos)
			continue;
		h->packed[pos] = true;
		h->packed_list[h->npacked++] = pos;
		h->compactions++;
	}
}

/*
 * Block granularity: the held block below end and past the sinks' blocks with the lowest
 * score, the earliest of equals.
 */
static bool h2o_evict_block(struct kv_h2o *h, uint32_t end)
{
	uint32_t victim = UINT32_MAX;

	for (uint32_t i = (h->n_sink + h->block_tokens - 1) / h->block_tokens; i < end; i++)
		if (h->block_held[i] && (victim == UINT32_MAX || h->score[i] < h->score[victim]))
			victim = i;
	if (victim == UINT32_MAX)
		return false;
	h2o_release(h, victim, UINT32_MAX);
	return true;
}

static void h2o_decay(struct kv_h2o *h);

/*
 * Token granularity: the token with the lowest score (the earliest position of equals) among
 * the packed ones and those of held blocks below end, the sinks left out.
 */
static bool h2o_evict_token(struct kv_h2o *h, uint32_t end)
{
	const uint32_t B = h->block_tokens;
	uint32_t best_pos = UINT32_MAX, best_k = UINT32_MAX;
	float best = 0;

	for (uint32_t k = 0; k < h->npacked; k++) {
		uint32_t pos = h->packed_list[k];
		float sc = h->score[pos];

		if (pos < h->n_sink)
			continue;
		if (best_pos == UINT32_MAX || sc < best || (sc == best && pos < best_pos)) {
			best = sc;
			best_pos = pos;
			best_k = k;
		}
	}
	for (uint32_t i = 0; i < end; i++) {
		if (!h->block_held[i])
			continue;
		for (uint32_t pos = i * B; pos < (i + 1) * B; pos++) {
			float sc = h->score[pos];

			if (pos < h->n_sink)
				continue;
			if (best_pos == UINT32_MAX || sc < best || (sc == best && pos < best_pos)) {
				best = sc;
				best_pos = pos;
				best_k = UINT32_MAX;
			}
		}
	}
	if (best_pos == UINT32_MAX)
		return false;
	if (best_k == UINT32_MAX) {
		h2o_release(h, best_pos / B, best_pos);
	} else {
		h->packed[best_pos] = false;
		h->packed_list[best_k] = h->packed_list[--h->npacked];
		h->evicted++;
	}
	return true;
}

uint32_t kv_h2o_commit(struct kv_h2o *h, uint32_t ncommitted)
{
	const uint64_t before = h->evicted;
	uint32_t end;

	if (ncommitted <= h->ncommitted)
		return 0;
	h->ncommitted = ncommitted;
	/* A step: the decay, once, after its reports and before evicting (as the daemon). */
	h2o_decay(h);
	if (ncommitted <= h->recent)
		return 0;
	/* Blocks below end hold none of the last recent committed tokens. */
	end = (ncommitted - h->recent) / h->block_tokens;
	while (kv_h2o_held_tokens(h) > h->budget)
		if (!(h->tokens ? h2o_evict_token(h, end) : h2o_evict_block(h, end)))
			break;
	return (uint32_t)(h->evicted - before);
}

/*
 * The decay of a step: scale shrinks, and when it gets small the held scores are multiplied
 * out and it starts again at 1, as the daemon does.
 */
static void h2o_decay(struct kv_h2o *h)
{
	const uint32_t B = h->block_tokens;

	if (h->decay >= 1)
		return;
	h->scale *= h->decay;
	if (h->scale > 1e-20)
		return;
	for (uint32_t i = 0; i * B < h->ntokens; i++) {
		if (!h->block_held[i])
			continue;
		if (!h->tokens)
			h->score[i] = (float)(h->score[i] * h->scale);
		else
			for (uint32_t pos = i * B; pos < (i + 1) * B; pos++)
				h->score[pos] = (float)(h->score[pos] * h->scale);
	}
	for (uint32_t k = 0; k < h->npacked; k++)
		h->score[h->packed_list[k]] = (float)(h->score[h->packed_list[k]] * h->scale);
	h->scale = 1;
}

void kv_h2o_report(struct kv_h2o *h, uint32_t first, const float *weights, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		h->score[h->tokens ? first + i : (first + i) / h->block_tokens] +=
			(float)(weights[i] / h->scale);
}

void kv_h2o_report_packed(struct kv_h2o *h, const uint32_t *positions, const float *weights,
			  uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		h->score[positions[i]] += (float)(weights[i] / h->scale);
}

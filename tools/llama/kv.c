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

static uint32_t paged_rows(const struct kv_cache *base, uint32_t layer, unsigned which,
			   uint32_t pos, uint32_t end, const float **ret_row, size_t *ret_stride)
{
	const struct kv_paged *kv = (const struct kv_paged *)base;
	uint32_t n = kv->block_tokens - pos % kv->block_tokens;

	*ret_row = paged_row(kv, layer, which, pos);
	*ret_stride = kv->slot_stride / sizeof(float);
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

void kv_paged_free(struct kv_paged *kv)
{
	kvp_table_free(&kv->table);
}

/* SPDX-License-Identifier: MIT */
/*
 * A daemon pool: one configured pool's core, memory and bookkeeping.  The in-block layout is
 * block-major: each block holds, per layer, K then V, each a [slot][head][dim] tile, so one
 * layer's K (or V) of a block is contiguous for attention kernels.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "daemon/server/server.h"

/* The core dropped a parked sequence for someone else's request: its owner holds less now. */
static void on_drop(void *ctx, uint64_t seq, uint32_t nblocks)
{
	struct dpool *p = ctx;
	struct session *s = p->owners[(uint32_t)seq].s;

	if (s)
		s->blocks -= nblocks;
	log_debug("pool %s: parked sequence %llu dropped, %u blocks released", p->cfg->name,
		  (unsigned long long)seq, nblocks);
}

int dpool_init(struct dpool *p, const struct kvpd_pool_config *cfg)
{
	struct core_config cc = {
		.capacity_blocks = cfg->capacity_blocks,
		.block_tokens = cfg->block_tokens,
		.max_sequences = cfg->max_sequences,
		.max_seq_tokens = cfg->max_seq_tokens,
		.vocab_size = cfg->vocab_size,
		.copy_block = backend_copy_block,
		.copy_ctx = &p->mem,
		.policy = (enum core_policy)cfg->policy,
		.on_drop = on_drop,
		.drop_ctx = p,
	};
	int r;

	*p = (struct dpool){ .cfg = cfg, .mem = { .fd = -1 } };
	p->head_stride = (uint64_t)cfg->head_dim * cfg->element_bytes;
	p->slot_stride = p->head_stride * cfg->kv_heads;
	p->kv_stride = p->slot_stride * cfg->block_tokens;
	p->layer_stride = 2 * p->kv_stride;
	p->block_bytes = p->layer_stride * cfg->layers;
	p->bytes_per_token = 2ull * cfg->layers * cfg->kv_heads * cfg->head_dim * cfg->element_bytes;

	r = backend_host.create(cfg->name, p->block_bytes * cfg->capacity_blocks, p->block_bytes,
				&p->mem);
	if (r < 0)
		return log_error_errno(r, "pool %s: cannot allocate %llu bytes: %m", cfg->name,
				       (unsigned long long)(p->block_bytes * cfg->capacity_blocks));
	r = core_new(&cc, &p->core);
	if (r < 0)
		return log_error_errno(r, "pool %s: cannot create the block manager: %m", cfg->name);
	p->owners = calloc(cfg->max_sequences, sizeof(*p->owners));
	p->ns = calloc(POOL_MAX_NS_STATS, sizeof(*p->ns));
	if (!p->owners || !p->ns)
		return log_error_errno(ENOMEM, "pool %s: out of memory", cfg->name);
	return 0;
}

void dpool_done(struct dpool *p)
{
	core_free(p->core);
	if (p->mem.ops)
		p->mem.ops->destroy(&p->mem);
	free(p->owners);
	free(p->ns);
}

struct ns_stats *dpool_ns_stats(struct dpool *p, uint64_t salt, const char *name)
{
	/* Linear: namespaces are few and looked up once per session. */
	for (uint32_t i = 0; i < p->nns; i++)
		if (p->ns[i].salt == salt && strcmp(p->ns[i].name, name) == 0)
			return &p->ns[i];
	if (p->nns == POOL_MAX_NS_STATS - 1) {
		struct ns_stats *other = &p->ns[POOL_MAX_NS_STATS - 1];

		snprintf(other->name, sizeof(other->name), "(other)");
		return other;
	}
	p->ns[p->nns].salt = salt;
	snprintf(p->ns[p->nns].name, sizeof(p->ns[p->nns].name), "%s", name);
	return &p->ns[p->nns++];
}

int dpool_verify(struct dpool *p, char *why, size_t why_len)
{
	int r = core_verify(p->core, why, why_len);
	struct core_usage u;
	uint32_t owned = 0;

	if (r < 0)
		return r;
	/* Every open sequence has exactly one owning session and vice versa. */
	core_get_usage(p->core, &u);
	for (uint32_t i = 0; i < p->cfg->max_sequences; i++)
		if (p->owners[i].s) {
			struct session *s = p->owners[i].s;

			owned++;
			if (p->owners[i].idx >= s->nseqs || (uint32_t)s->seqs[p->owners[i].idx] != i) {
				snprintf(why, why_len, "sequence slot %u: owner table disagrees with "
					 "session %llu", i, (unsigned long long)s->id);
				return -EUCLEAN;
			}
		}
	if (owned != u.sequences) {
		snprintf(why, why_len, "%u sequences open, %u owned by sessions", u.sequences, owned);
		return -EUCLEAN;
	}
	return 0;
}

void dpool_describe(const struct dpool *p, Kvpaged__V1__PoolDescription *d)
{
	const struct kvpd_pool_config *c = p->cfg;

	d->name = (char *)c->name;
	d->layers = c->layers;
	d->kv_heads = c->kv_heads;
	d->head_dim = c->head_dim;
	d->element_bytes = c->element_bytes;
	d->block_tokens = c->block_tokens;
	d->capacity_blocks = c->capacity_blocks;
	d->bytes_per_token = p->bytes_per_token;
	d->block_bytes = p->block_bytes;
	d->pool_bytes = p->mem.bytes;
	d->block_stride = p->block_bytes;
	d->layer_stride = p->layer_stride;
	d->kv_stride = p->kv_stride;
	d->slot_stride = p->slot_stride;
	d->head_stride = p->head_stride;
	d->backend = (char *)p->mem.ops->name;
	d->max_seq_tokens = c->max_seq_tokens;
	d->vocab_size = c->vocab_size;
}

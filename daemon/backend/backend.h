/* SPDX-License-Identifier: MIT */
/*
 * Memory backends: where a pool's KV memory lives and how blocks are copied.  The host backend
 * (a sealed memfd) is built in; the CUDA backend will be a module loaded at run time.  The core
 * reaches a backend only through the copy callback it is given.
 */
#pragma once

#include <stdint.h>

struct backend_pool {
	const struct backend_ops *ops;
	int fd;           /* exported to clients over SCM_RIGHTS */
	void *base;       /* the daemon's own mapping (host backend) */
	uint64_t bytes;
	uint64_t block_bytes;
	/* The in-block layout (set by the pool after create): per layer, K then V, [slot][...]. */
	uint32_t layers;
	uint64_t layer_stride, kv_stride, slot_stride;
};

struct backend_ops {
	const char *name;
	/* Allocates bytes of pool memory exported as an fd.  0 or -errno. */
	int (*create)(const char *pool_name, uint64_t bytes, uint64_t block_bytes,
		      struct backend_pool *ret);
	void (*destroy)(struct backend_pool *p);
	/* Copies one whole block (copy-on-write).  0 or -errno. */
	int (*copy_block)(struct backend_pool *p, uint32_t dst, uint32_t src);
	/* Copies one token slot, every layer's K and V (gather, for compaction). */
	void (*copy_slot)(struct backend_pool *p, uint32_t dst, uint32_t dst_slot, uint32_t src,
			  uint32_t src_slot);
};

extern const struct backend_ops backend_host;

/* Adapters for core_config.copy_block and copy_slot: ctx is a struct backend_pool. */
int backend_copy_block(void *ctx, uint32_t dst, uint32_t src);
void backend_copy_slot(void *ctx, uint32_t dst, uint32_t dst_slot, uint32_t src,
		       uint32_t src_slot);

/* SPDX-License-Identifier: MIT */
/*
 * The host backend: a pool is one memfd, sealed so that no client can grow or shrink it under
 * the others (a shrink would SIGBUS every mapper), mapped shared by the daemon and by every
 * client of the pool.  Pages are allocated on first touch.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/backend/backend.h"

static int host_create(const char *pool_name, uint64_t bytes, uint64_t block_bytes,
		       struct backend_pool *ret)
{
	char name[96];
	void *base;
	int fd, r;

	if (bytes == 0 || block_bytes == 0 || bytes % block_bytes)
		return -EINVAL;
	snprintf(name, sizeof(name), "kvpaged-pool-%s", pool_name);
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)bytes) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	if (base == MAP_FAILED) {
		r = -errno;
		close(fd);
		return r;
	}
	*ret = (struct backend_pool){ .ops = &backend_host, .fd = fd, .base = base, .bytes = bytes,
				      .block_bytes = block_bytes };
	return 0;
}

static void host_destroy(struct backend_pool *p)
{
	if (p->base)
		munmap(p->base, p->bytes);
	if (p->fd >= 0)
		close(p->fd);
	p->base = NULL;
	p->fd = -1;
}

static int host_copy_block(struct backend_pool *p, uint32_t dst, uint32_t src)
{
	unsigned char *base = p->base;

	memcpy(base + (uint64_t)dst * p->block_bytes, base + (uint64_t)src * p->block_bytes,
	       p->block_bytes);
	return 0;
}

/* Per layer, the slot's K then its V: 2 * layers copies of slot_stride bytes. */
static void host_copy_slot(struct backend_pool *p, uint32_t dst, uint32_t dst_slot, uint32_t src,
			   uint32_t src_slot)
{
	uint8_t *d = (uint8_t *)p->base + (uint64_t)dst * p->block_bytes + dst_slot * p->slot_stride;
	const uint8_t *s =
		(const uint8_t *)p->base + (uint64_t)src * p->block_bytes + src_slot * p->slot_stride;

	for (uint32_t l = 0; l < p->layers; l++)
		for (uint32_t kv = 0; kv < 2; kv++) {
			uint64_t off = l * p->layer_stride + kv * p->kv_stride;

			memcpy(d + off, s + off, p->slot_stride);
		}
}

const struct backend_ops backend_host = {
	.name = "host",
	.create = host_create,
	.destroy = host_destroy,
	.copy_block = host_copy_block,
	.copy_slot = host_copy_slot,
};

int backend_copy_block(void *ctx, uint32_t dst, uint32_t src)
{
	struct backend_pool *p = ctx;

	return p->ops->copy_block(p, dst, src);
}

void backend_copy_slot(void *ctx, uint32_t dst, uint32_t dst_slot, uint32_t src,
		       uint32_t src_slot)
{
	struct backend_pool *p = ctx;

	p->ops->copy_slot(p, dst, dst_slot, src, src_slot);
}

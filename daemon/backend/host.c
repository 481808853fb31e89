/* SPDX-License-Identifier: MIT */
/*
 * The host backend: a pool is one memfd, sealed so that no client can grow or shrink it under
 * the others (a shrink would SIGBUS every mapper), mapped shared by the daemon and by every
 * client of the pool.  Pages are allocated on first touch.  Moves are memcpy: complete before
 * move() returns, with done_fd signalled, so callers need no second code path.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/backend/backend.h"

struct host_state {
	uint64_t tickets; /* the last ticket handed out */
};

/* Host memory has no devices: device is ignored (the configuration refuses one but 0). */
static int host_create(const char *pool_name, uint64_t bytes, uint64_t block_bytes,
		       uint32_t device, struct backend_pool *ret)
{
	char name[96];
	struct host_state *st;
	void *base;
	int fd, done_fd, r;

	if (bytes == 0 || block_bytes == 0 || bytes % block_bytes)
		return -EINVAL;
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (done_fd < 0) {
		r = -errno;
		free(st);
		return r;
	}
	snprintf(name, sizeof(name), "kvpaged-pool-%s", pool_name);
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		r = -errno;
		goto fail;
	}
	if (ftruncate(fd, (off_t)bytes) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
		r = -errno;
		goto fail;
	}
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	if (base == MAP_FAILED) {
		r = -errno;
		goto fail;
	}
	*ret = (struct backend_pool){ .ops = &backend_host, .fd = fd, .base = base, .bytes = bytes,
				      .block_bytes = block_bytes, .done_fd = done_fd, .priv = st };
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	close(done_fd);
	free(st);
	return r;
}

static void host_destroy(struct backend_pool *p)
{
	if (p->base)
		munmap(p->base, p->bytes);
	if (p->fd >= 0)
		close(p->fd);
	if (p->done_fd >= 0)
		close(p->done_fd);
	free(p->priv);
	p->base = NULL;
	p->priv = NULL;
	p->fd = p->done_fd = -1;
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

static int host_copy_blocks(struct backend_pool *p, const struct backend_block_copy *c,
			    uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		host_copy_block(p, c[i].dst, c[i].src);
	return 0;
}

static int host_copy_slots(struct backend_pool *p, const struct backend_slot_copy *c, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		host_copy_slot(p, c[i].dst, c[i].dst_slot, c[i].src, c[i].src_slot);
	return 0;
}

static int host_host_alloc(struct backend_pool *p, uint64_t bytes, void **ret)
{
	void *mem;

	if (bytes == 0 || bytes > SIZE_MAX)
		return -EINVAL;
	mem = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		return -ENOMEM;
	*ret = mem;
	return 0;
}

static void host_host_free(struct backend_pool *p, void *mem, uint64_t bytes)
{
	if (mem)
		munmap(mem, (size_t)bytes);
}

static int host_move(struct backend_pool *p, enum backend_dir dir, const struct backend_move *m,
		     uint32_t n, uint64_t *ret_ticket)
{
	struct host_state *st = p->priv;
	uint8_t *base = p->base;

	for (uint32_t i = 0; i < n; i++)
		if (m[i].block >= p->bytes / p->block_bytes || !m[i].host)
			return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		uint8_t *block = base + (uint64_t)m[i].block * p->block_bytes;

		if (dir == BACKEND_TO_HOST)
			memcpy(m[i].host, block, p->block_bytes);
		else
			memcpy(block, m[i].host, p->block_bytes);
	}
	/* Complete already; the counter cannot overflow in practice (2^64 - 2 moves). */
	(void)eventfd_write(p->done_fd, 1);
	*ret_ticket = ++st->tickets;
	return 0;
}

static int host_move_done(struct backend_pool *p, uint64_t ticket)
{
	const struct host_state *st = p->priv;

	return ticket > 0 && ticket <= st->tickets ? 1 : -EINVAL;
}

static int host_move_wait(struct backend_pool *p, uint64_t ticket)
{
	int r = host_move_done(p, ticket);

	return r < 0 ? r : 0;
}

const struct backend_ops backend_host = {
	.name = "host",
	.create = host_create,
	.destroy = host_destroy,
	.copy_block = host_copy_block,
	.copy_blocks = host_copy_blocks,
	.copy_slot = host_copy_slot,
	.copy_slots = host_copy_slots,
	.host_alloc = host_host_alloc,
	.host_free = host_host_free,
	.move = host_move,
	.move_done = host_move_done,
	.move_wait = host_move_wait,
};

int backend_copy_block(void *ctx, uint32_t dst, uint32_t src)
{
	struct backend_pool *p = ctx;

	return p->ops->copy_block(p, dst, src);
}

/* SPDX-License-Identifier: MIT */
/*
 * Memory backends: where a pool's KV memory lives and how its bytes move.  The host backend (a
 * sealed memfd) is built in; the CUDA backend is a module (cuda/, kvpaged-cuda.so) that the
 * daemon loads with dlopen(3) when a pool asks for it, so the daemon itself never links a GPU
 * driver.  This header is the whole interface between them: plain C, no CUDA types.
 *
 * The core reaches a backend only through the copy callbacks it is given.  Moves between the
 * pool and host memory (the tiers below the pool) are asynchronous: move() queues them and
 * returns a ticket, done_fd becomes readable when some ticket completes, and move_done() says
 * which.  The host backend completes every move inside move() and signals done_fd at once, so
 * a caller has one code path for both.
 *
 * Nothing here is thread-safe: a pool belongs to the daemon's one thread.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct backend_pool {
	const struct backend_ops *ops;
	int fd;               /* exported to clients over SCM_RIGHTS */
	void *base;           /* the daemon's own CPU mapping; NULL when the pool is on a device */
	uint64_t device_base; /* the daemon's device address of the pool (device backends), else 0 */
	uint64_t bytes;       /* what a client maps: capacity * block_bytes, rounded up to the
				 backend's mapping granularity */
	uint64_t block_bytes;
	/* The in-block layout (set by the pool after create): per layer, K then V, [slot][...]. */
	uint32_t layers;
	uint64_t layer_stride, kv_stride, slot_stride;
	/*
	 * An eventfd (non-blocking, close-on-exec) whose counter goes up when moves complete:
	 * the event loop polls it, reads it to clear it, then asks move_done() about its tickets.
	 */
	int done_fd;
	void *priv; /* the backend's own state */
	/* The user's (daemon/server/pool.c): host_alloc()ed staging for the tiers' moves. */
	void *stage;
	uint32_t stage_blocks;
};

/* One block of a move: the pool's block and block_bytes of host memory. */
struct backend_move {
	uint32_t block;
	void *host; /* from host_alloc() for full speed; 16-byte aligned when slot_stride is */
};

/* One block of a batched copy. */
struct backend_block_copy {
	uint32_t dst, src;
};

/* One token slot of a gather: every layer's K and V of (src, src_slot) to (dst, dst_slot). */
struct backend_slot_copy {
	uint32_t dst, dst_slot, src, src_slot;
};

enum backend_dir {
	BACKEND_TO_HOST = 0,   /* swap out: pool -> host */
	BACKEND_FROM_HOST = 1, /* swap in: host -> pool */
};

struct backend_ops {
	const char *name; /* "host", "cuda": what the Welcome tells clients */
	/*
	 * Allocates bytes of pool memory (block_bytes divides it) exported as an fd, zeroed, on
	 * the given device (the pool's device key; a backend without devices ignores it).
	 * 0 or -errno; on failure *ret is untouched.
	 */
	int (*create)(const char *pool_name, uint64_t bytes, uint64_t block_bytes,
		      uint32_t device, struct backend_pool *ret);
	/* Waits for what is in flight, frees everything.  Accepts a pool create() failed on. */
	void (*destroy)(struct backend_pool *p);
	/* Copies one whole block (copy-on-write), complete on return.  0 or -errno. */
	int (*copy_block)(struct backend_pool *p, uint32_t dst, uint32_t src);
	/*
	 * Copies n whole blocks in one go, complete on return.  No block may be both written and
	 * read, or written twice, by one call (they may run in any order).  0 or -errno.
	 */
	int (*copy_blocks)(struct backend_pool *p, const struct backend_block_copy *c, uint32_t n);
	/* Copies one token slot, every layer's K and V (gather, for compaction); complete on return. */
	void (*copy_slot)(struct backend_pool *p, uint32_t dst, uint32_t dst_slot, uint32_t src,
			  uint32_t src_slot);
	/*
	 * Copies n token slots in one go, complete on return.  No slot may be both written and
	 * read, or written twice, by one call (they may run in any order).  0 or -errno.
	 */
	int (*copy_slots)(struct backend_pool *p, const struct backend_slot_copy *c, uint32_t n);
	/*
	 * Host memory for moves: pinned (page-locked, device-visible) when the pool is on a
	 * device, so that moves run at full bus speed.  0 or -errno; free it with host_free().
	 */
	int (*host_alloc)(struct backend_pool *p, uint64_t bytes, void **ret);
	void (*host_free)(struct backend_pool *p, void *mem, uint64_t bytes);
	/*
	 * Queues moving n blocks between the pool and host memory, and returns their ticket (> 0).
	 * Neither side may be touched until move_done(ticket) says so.  Moves of one direction
	 * complete in the order they were queued.  0 or -errno (nothing was queued).
	 */
	int (*move)(struct backend_pool *p, enum backend_dir dir, const struct backend_move *m,
		    uint32_t n, uint64_t *ret_ticket);
	/* Never blocks: 1 if ticket completed, 0 if not yet, -errno if the device failed. */
	int (*move_done)(struct backend_pool *p, uint64_t ticket);
	/* Blocks until ticket completed: 0 or -errno. */
	int (*move_wait)(struct backend_pool *p, uint64_t ticket);
};

extern const struct backend_ops backend_host;

/*
 * The adapter for core_config.copy_block: ctx is a struct backend_pool.  (copy_slots' is in
 * daemon/server/pool.c, which knows both structs of a slot copy.)
 */
int backend_copy_block(void *ctx, uint32_t dst, uint32_t src);

/* ---- modules ------------------------------------------------------------------------------ */

/* A module exports one symbol of this name: a const struct backend_module. */
#define BACKEND_MODULE_SYMBOL "kvpaged_backend_module"
/* Bumped whenever struct backend_module or struct backend_ops changes incompatibly. */
#define BACKEND_MODULE_ABI 2 /* 2: create() and probe() take the device */

struct backend_module {
	uint32_t abi; /* BACKEND_MODULE_ABI */
	const struct backend_ops *ops;
	/*
	 * Whether the backend can work here: a driver, and device (an ordinal) present and able
	 * to export its memory.  0, or -errno (-ENODEV: no such device; -ENOENT: no driver) with
	 * why filled in.
	 */
	int (*probe)(uint32_t device, char *why, size_t why_len);
	/* Why the last failed call failed, in words ("" if unknown). */
	const char *(*last_error)(void);
};

/*
 * Loads the module at path (once per path; it stays loaded) and probes it for device.  0 with
 * *ret set, or -errno with why filled in: -ENOENT no such module or no driver, -ENODEV no such
 * device, -ENOEXEC not a kvpaged backend module (or another ABI).
 */
int backend_module_load(const char *path, uint32_t device, const struct backend_module **ret,
			char *why, size_t why_len);

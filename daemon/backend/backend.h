/* SPDX-License-Identifier: MIT */
/*
 * Memory backends: where a pool's KV memory lives and how its bytes move.  The host backend (a
 * sealed memfd) is built in; the CUDA backend is a module (cuda/, kvpaged-cuda.so) that the
 * daemon loads with dlopen(3) when a pool asks for it, so the daemon itself never links a GPU
 * driver.  This header is the whole interface between them: plain C, no CUDA types.
 *
 * Every operation that touches a pool's bytes -- copies within the pool, moves between the pool
 * and host memory -- is queued on the pool's one queue and returns a ticket.  Tickets go up by
 * one per operation, from 1, and complete in the order they were issued: ticket t complete
 * means every earlier one is, so operations on the same memory need no ordering of their own.
 * done() says how far the queue got without blocking, done_fd becomes readable as tickets
 * complete, and wait() blocks.  backend_host completes each operation inside the call (done()
 * is always the last ticket); backend_host_threaded runs them on a helper thread; the CUDA
 * backend on one stream of the device.  The caller keeps the memory an operation names
 * untouched until its ticket completes; the lists describing it are read during the call only.
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
	 * An eventfd (non-blocking, close-on-exec) whose counter goes up when tickets complete
	 * after their call returned: the event loop polls it, reads it to clear it, then asks
	 * done() how far the queue got.  (backend_host never writes it: its tickets are complete
	 * when the call returns.)
	 */
	int done_fd;
	void *priv; /* the backend's own state */
};

/* One block of a move: the pool's block and block_bytes of host memory. */
struct backend_move {
	uint32_t block;
	/*
	 * From host_alloc(): on a device the copy may read or write it directly from the GPU
	 * (pinned, device-mapped memory is then required, not only faster).  16-byte aligned when
	 * slot_stride is.
	 */
	void *host;
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
	/* Waits for what is queued, frees everything.  Accepts a pool create() failed on. */
	void (*destroy)(struct backend_pool *p);
	/*
	 * The queued operations.  Each returns 0 with *ret_ticket set (0 when n is 0: nothing
	 * was queued), or -errno with nothing left running (a part already queued has completed
	 * by then), so the caller may reuse the memory at once.
	 *
	 * copy_blocks: n whole blocks (copy-on-write).  No block may be both written and read,
	 * or written twice, by one call (its copies may run in any order).
	 */
	int (*copy_blocks)(struct backend_pool *p, const struct backend_block_copy *c, uint32_t n,
			   uint64_t *ret_ticket);
	/*
	 * copy_slots: n token slots, every layer's K and V (gather, for compaction).  No slot may
	 * be both written and read, or written twice, by one call (two slots of one block may).
	 */
	int (*copy_slots)(struct backend_pool *p, const struct backend_slot_copy *c, uint32_t n,
			  uint64_t *ret_ticket);
	/*
	 * move: n blocks between the pool and host memory (swap out, swap in).  No block and no
	 * host memory may appear twice in one call (its entries may run in any order).
	 */
	int (*move)(struct backend_pool *p, enum backend_dir dir, const struct backend_move *m,
		    uint32_t n, uint64_t *ret_ticket);
	/*
	 * Never blocks: *ret_ticket gets the last ticket completed (0: none yet).  0, or -errno if
	 * the device failed (the pool is then unusable: a device's errors are sticky).
	 */
	int (*done)(struct backend_pool *p, uint64_t *ret_ticket);
	/*
	 * Blocks until ticket completed (at once for 0): 0, -EINVAL for a ticket never issued, or
	 * -errno if the device failed.
	 */
	int (*wait)(struct backend_pool *p, uint64_t ticket);
	/*
	 * Host memory for moves: pinned (page-locked, device-visible) when the pool is on a
	 * device, so that moves run at full bus speed.  0 or -errno; free it with host_free().
	 */
	int (*host_alloc)(struct backend_pool *p, uint64_t bytes, void **ret);
	void (*host_free)(struct backend_pool *p, void *mem, uint64_t bytes);
};

/*
 * Host memory (a sealed memfd).  backend_host does each operation with memcpy inside the call;
 * backend_host_threaded hands them to a helper thread of the pool's (in order), so that long
 * copies do not hold the caller.  Both are named "host": clients see no difference.
 */
extern const struct backend_ops backend_host, backend_host_threaded;

/* ---- modules ------------------------------------------------------------------------------ */

/* A module exports one symbol of this name: a const struct backend_module. */
#define BACKEND_MODULE_SYMBOL "kvpaged_backend_module"
/* Bumped whenever struct backend_module or struct backend_ops changes incompatibly. */
#define BACKEND_MODULE_ABI 3 /* 2: create() and probe() take the device; 3: one queue, tickets */

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

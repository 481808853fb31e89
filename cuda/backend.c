/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-cuda.so: the CUDA backend, a module the daemon loads with dlopen(3) when a pool has
 * backend = cuda (or auto and a GPU is there).  It exports one symbol, kvpaged_backend_module
 * (daemon/backend/backend.h), and reaches the driver through cu.h, so it loads, and says what
 * is missing, on machines without one.
 *
 * A pool is physical device memory from cuMemCreate with a POSIX-fd shareable handle, mapped
 * into a reserved range of the daemon's address space (cuMemMap + cuMemSetAccess).  The fd
 * cuMemExportToShareableHandle gives goes to clients over SCM_RIGHTS, like a host pool's memfd;
 * libkvpaged imports and maps it.  The layout is the host backend's, byte for byte.
 *
 * All of a pool's work runs on one stream of the device's primary context, non-blocking (it
 * does not wait for the legacy default stream): copies the core asks for (copy-on-write, token
 * gather) and moves out and in (swap) alike, so everything completes in the order it was
 * issued, and work on the same memory needs no ordering of its own.  No call waits for its
 * work.  Each operation is one ticket: its copies, then a stream callback (on_done) that
 * counts it completed and writes the pool's eventfd.  Tickets are issued 1, 2, ... (queued);
 * the stream runs the callbacks in order, so their count (completed) is the last ticket
 * completed.  After a device error the callbacks still run, with the error, and count nothing:
 * the eventfd wakes the daemon, done() sees the count lag and asks cuStreamQuery, which
 * reports the failure (sticky).  (A host function, cuLaunchHostFunc, would not run after an
 * error: nothing would wake the daemon, whose held replies would wait for ever.)  wait()
 * synchronizes the stream.
 *
 * A copy list goes inside the launch's parameters (KVPD_INLINE entries, copied by the driver
 * when the launch is queued); a longer one is uploaded from a pinned buffer to device memory
 * ahead of the kernel, and those buffers are the only state an operation leaves behind: see
 * ext_reserve() for when a call waits for one.
 *
 * A move goes through the copy engines (one cuMemcpyAsync per run of adjacent blocks) or
 * through kvpd_copy_blocks writing to or reading from pinned host memory directly; the size
 * of a block picks (small blocks: the kernel, whose one launch beats many copies).  In a build
 * with test hooks (configure --enable-test-hooks), $KVPAGED_TEST_CUDA_SWAP=dma|kernel, read
 * when a pool is created, forces one path, so that the tests cover both on any geometry.
 *
 * The device is the pool's device key, passed to probe() and create().  The module reads no
 * other environment.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cuda/cu.h"
#include "cuda/kernels.h"
#include "daemon/backend/backend.h"

#define EXPORT __attribute__((visibility("default")))

/* kernels-fatbin.c, generated from kernels.cu by nvcc --fatbin and bin2c. */
extern const unsigned char kvpd_cuda_fatbin[];

/* Below this block size a move is one kernel launch rather than a copy per block. */
#define KERNEL_SWAP_BELOW (UINT64_C(1) << 20)
#define THREADS 256

enum swap_mode { SWAP_DMA, SWAP_KERNEL };

/* Upload buffers for long copy lists, used in turn (ext_reserve). */
#define EXT_BUFS 4u

struct cuda_pool {
	CUdevice dev;
	CUcontext ctx; /* the device's primary context: the one engines use too */
	bool ctx_retained;
	CUmemGenericAllocationHandle handle;
	bool have_handle;
	CUdeviceptr base;
	size_t size;
	bool reserved, mapped;
	uint32_t nblocks;
	int sms;
	bool uva;
	enum swap_mode swap;
	CUmodule module;
	CUfunction copy_blocks, copy_slots;
	CUstream stream; /* the pool's one queue */
	uint64_t queued; /* the last ticket issued */
	_Atomic uint64_t completed; /* tickets completed, counted by on_done() on a driver thread */
	_Atomic uint64_t returned;  /* on_done() calls past their last touch of the pool */
	/*
	 * Tickets known complete because the stream was found idle (cuStreamSynchronize or
	 * cuStreamQuery succeeded): the work is done then, whether or not the driver has yet
	 * returned from the callbacks that count it, which the documentation leaves open.
	 */
	uint64_t idle_at;
	int done_fd;
	/*
	 * Long copy lists, uploaded from host to dev: EXT_BUFS of them, used in turn; ext_cur is
	 * the one the operation being built uses.
	 */
	struct ext_buf {
		CUdeviceptr dev;
		void *host;
		size_t bytes;
		uint64_t ticket; /* the last ticket whose work may read it (0: none) */
	} ext[EXT_BUFS];
	unsigned ext_cur;
	int error; /* the device failed: sticky, every later call returns it */
};

static const struct backend_ops cuda_ops;
static char last_error[512];

static const char *cuda_last_error(void)
{
	return last_error;
}

__attribute__((format(printf, 2, 3))) static int fail(int r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	return r;
}

/* A failed driver call: remembered in words, returned as -errno. */
static int cu_fail(CUresult cr, const char *what)
{
	char e[200];

	return fail(cu_errno(cr), "%s: %s", what, cu_error(cr, e, sizeof(e)));
}

#define CU_CHECK(call, what)                                                                       \
	do {                                                                                       \
		CUresult cr_ = (call);                                                             \
		if (cr_ != CUDA_SUCCESS) {                                                         \
			r = cu_fail(cr_, what);                                                    \
			goto out;                                                                  \
		}                                                                                  \
	} while (0)

/*
 * The driver starts threads of its own (at cuInit, at context creation, for host functions),
 * and a thread starts with its creator's signal mask.  The daemon takes its signals through a
 * signalfd, which sees a signal only while every thread blocks it; a driver thread that did
 * not would take SIGTERM's default action and end the daemon.  So every call into the driver
 * runs with all signals blocked (they stay pending, then reach the signalfd).
 */
static sigset_t saved_mask;
static unsigned blocked_depth;

static void block_signals(void)
{
	sigset_t all;

	if (blocked_depth++)
		return;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &saved_mask);
}

static void unblock_signals(void)
{
	if (--blocked_depth == 0)
		pthread_sigmask(SIG_SETMASK, &saved_mask, NULL);
}

/* Every entry point runs with the pool's context current and leaves the thread as it was. */
static int enter(const struct cuda_pool *cp)
{
	CUresult cr;

	block_signals();
	cr = cu.cuCtxPushCurrent(cp->ctx);
	if (cr == CUDA_SUCCESS)
		return 0;
	unblock_signals();
	return cu_fail(cr, "cuCtxPushCurrent");
}

static void leave(void)
{
	CUcontext ignored;

	(void)cu.cuCtxPopCurrent(&ignored);
	unblock_signals();
}

static int attribute(CUdevice dev, CUdevice_attribute a)
{
	int v = 0;

	return cu.cuDeviceGetAttribute(&v, a, dev) == CUDA_SUCCESS ? v : 0;
}

/* The device a pool goes on (its device key, an ordinal), checked for what pools need. */
static int pick_device(uint32_t device, CUdevice *ret, char *why, size_t why_len)
{
	const int ordinal = device > INT_MAX ? INT_MAX : (int)device;
	int count = 0;
	CUdevice dev;
	CUresult cr;
	char e[200];

	cr = cu.cuDeviceGetCount(&count);
	if (cr != CUDA_SUCCESS || count == 0) {
		snprintf(why, why_len, "no CUDA device%s%s", cr != CUDA_SUCCESS ? ": " : "",
			 cr != CUDA_SUCCESS ? cu_error(cr, e, sizeof(e)) : "");
		return -ENODEV;
	}
	if (ordinal >= count || cu.cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS) {
		snprintf(why, why_len, "no CUDA device %d (the pool's device key; there are %d, "
			 "numbered from 0)", ordinal, count);
		return -ENODEV;
	}
	if (!attribute(dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) ||
	    !attribute(dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)) {
		snprintf(why, why_len,
			 "CUDA device %d cannot share its memory with other processes (no virtual "
			 "memory management or POSIX file descriptor handles)", ordinal);
		return -EOPNOTSUPP;
	}
	*ret = dev;
	return 0;
}

static int cuda_probe(uint32_t device, char *why, size_t why_len)
{
	CUdevice dev;
	int r;

	block_signals();
	r = cu_load(why, why_len);
	if (r == 0)
		r = pick_device(device, &dev, why, why_len);
	else if (r == -ENOSYS)
		r = -ENODEV;
	unblock_signals();
	return r;
}

/*
 * The end of a ticket's work, run by a driver thread in stream order, also after a device
 * error (status): then the ticket did not complete, but the daemon must wake to find out.
 */
static void CUDA_CB on_done(CUstream stream, CUresult status, void *arg)
{
	struct cuda_pool *cp = arg;

	/* A stream callback may not call CUDA; counting and a write(2) are fine. */
	if (status == CUDA_SUCCESS)
		atomic_fetch_add_explicit(&cp->completed, 1, memory_order_release);
	(void)eventfd_write(cp->done_fd, 1);
	/* Last: destroy frees the pool (and closes the eventfd) once every call got here. */
	atomic_fetch_add_explicit(&cp->returned, 1, memory_order_release);
}

static uint64_t completed(struct cuda_pool *cp)
{
	uint64_t n = atomic_load_explicit(&cp->completed, memory_order_acquire);

	return n > cp->idle_at ? n : cp->idle_at;
}

static void cuda_destroy(struct backend_pool *p)
{
	struct cuda_pool *cp = p->priv;

	if (cp) {
		bool entered = cp->ctx_retained && enter(cp) == 0, drained = !cp->stream;

		if (entered) {
			/*
			 * Its callbacks too: on_done() must not run on a freed pool or write a
			 * closed (or reused) eventfd.  Whether a synchronization returns only after
			 * the callbacks returned is not documented, nor when those after a device
			 * error run: each counts itself out last, and they are waited for (1 s).
			 */
			if (cp->stream) {
				(void)cu.cuStreamSynchronize(cp->stream);
				for (int i = 0; i < 1000 && atomic_load_explicit(&cp->returned,
						memory_order_acquire) < cp->queued; i++)
					usleep(1000);
				drained = atomic_load_explicit(&cp->returned, memory_order_acquire) >=
					  cp->queued;
				(void)cu.cuStreamDestroy(cp->stream);
			}
			if (cp->module)
				(void)cu.cuModuleUnload(cp->module);
			for (unsigned i = 0; i < EXT_BUFS; i++) {
				if (cp->ext[i].dev)
					(void)cu.cuMemFree(cp->ext[i].dev);
				if (cp->ext[i].host)
					(void)cu.cuMemFreeHost(cp->ext[i].host);
			}
			if (cp->mapped)
				(void)cu.cuMemUnmap(cp->base, cp->size);
			if (cp->reserved)
				(void)cu.cuMemAddressFree(cp->base, cp->size);
			if (cp->have_handle)
				(void)cu.cuMemRelease(cp->handle);
			leave();
		}
		if (cp->ctx_retained) {
			block_signals();
			(void)cu.cuDevicePrimaryCtxRelease(cp->dev);
			unblock_signals();
		}
		/*
		 * A stream not drained (not entered, or callbacks still to run): they may still
		 * touch cp and write its eventfd, so both are left (the daemon is stopping, or the
		 * pool never started).
		 */
		if (drained)
			free(cp);
		else
			p->done_fd = -1;
	}
	if (p->fd >= 0)
		close(p->fd);
	if (p->done_fd >= 0)
		close(p->done_fd);
	p->priv = NULL;
	p->fd = p->done_fd = -1;
	p->device_base = 0;
}

static enum swap_mode swap_mode(uint64_t block_bytes, bool uva)
{
#ifdef KVPAGED_TEST_HOOKS
	const char *s = getenv("KVPAGED_TEST_CUDA_SWAP");
#endif

	if (!uva)
		return SWAP_DMA; /* the kernel needs host memory at the same address */
#ifdef KVPAGED_TEST_HOOKS
	if (s && !strcmp(s, "dma"))
		return SWAP_DMA;
	if (s && !strcmp(s, "kernel"))
		return SWAP_KERNEL;
#endif
	return block_bytes < KERNEL_SWAP_BELOW ? SWAP_KERNEL : SWAP_DMA;
}

static int cuda_create(const char *pool_name, uint64_t bytes, uint64_t block_bytes,
		       uint32_t device, struct backend_pool *ret)
{
	struct backend_pool p = { .ops = NULL, .fd = -1, .done_fd = -1 };
	CUmemAllocationProp prop = { 0 };
	CUmemAccessDesc access = { 0 };
	struct cuda_pool *cp;
	size_t granularity = 0;
	char why[512];
	int r, fd = -1;

	if (bytes == 0 || block_bytes == 0 || bytes % block_bytes || bytes / block_bytes > UINT32_MAX)
		return fail(-EINVAL, "pool %s: bad size", pool_name);
	r = cuda_probe(device, why, sizeof(why));
	if (r < 0)
		return fail(r, "%s", why);
	cp = calloc(1, sizeof(*cp));
	if (!cp)
		return fail(-ENOMEM, "out of memory");
	p.priv = cp;
	cp->done_fd = -1;
	cp->nblocks = (uint32_t)(bytes / block_bytes);
	r = pick_device(device, &cp->dev, why, sizeof(why));
	if (r < 0) {
		fail(r, "%s", why);
		goto fail;
	}
	cp->sms = attribute(cp->dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
	cp->sms = cp->sms > 0 ? cp->sms : 1;
	cp->uva = attribute(cp->dev, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
	cp->swap = swap_mode(block_bytes, cp->uva);
	{
		CUresult cr;

		block_signals();
		cr = cu.cuDevicePrimaryCtxRetain(&cp->ctx, cp->dev);
		unblock_signals();
		if (cr != CUDA_SUCCESS) {
			r = cu_fail(cr, "cuDevicePrimaryCtxRetain");
			goto fail;
		}
	}
	cp->ctx_retained = true;
	r = enter(cp);
	if (r < 0)
		goto fail;

	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = cp->dev;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CU_CHECK(cu.cuMemGetAllocationGranularity(&granularity, &prop,
						   CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
		 "cuMemGetAllocationGranularity");
	cp->size = (size_t)((bytes + granularity - 1) / granularity * granularity);
	CU_CHECK(cu.cuMemCreate(&cp->handle, cp->size, &prop, 0), "cuMemCreate");
	cp->have_handle = true;
	CU_CHECK(cu.cuMemAddressReserve(&cp->base, cp->size, granularity, 0, 0),
		 "cuMemAddressReserve");
	cp->reserved = true;
	CU_CHECK(cu.cuMemMap(cp->base, cp->size, 0, cp->handle, 0), "cuMemMap");
	cp->mapped = true;
	access.location = prop.location;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CU_CHECK(cu.cuMemSetAccess(cp->base, cp->size, &access, 1), "cuMemSetAccess");
	CU_CHECK(cu.cuMemExportToShareableHandle(&fd, cp->handle,
						  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		 "cuMemExportToShareableHandle");
	p.fd = fd;
	/* The driver does not promise close-on-exec; every fd of the daemon's has it. */
	if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		r = fail(-errno, "fcntl(FD_CLOEXEC): %s", strerror(errno));
		goto out;
	}

	CU_CHECK(cu.cuModuleLoadData(&cp->module, kvpd_cuda_fatbin),
		 "loading the kernels (cuModuleLoadData; the driver may be older than the "
		 "toolkit, or the GPU not one the module was built for)");
	CU_CHECK(cu.cuModuleGetFunction(&cp->copy_blocks, cp->module, "kvpd_copy_blocks"),
		 "cuModuleGetFunction(kvpd_copy_blocks)");
	CU_CHECK(cu.cuModuleGetFunction(&cp->copy_slots, cp->module, "kvpd_copy_slots"),
		 "cuModuleGetFunction(kvpd_copy_slots)");
	CU_CHECK(cu.cuStreamCreate(&cp->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
	/* A new pool reads as zeros, like a host pool's memfd.  Not a ticket: waited for here. */
	CU_CHECK(cu.cuMemsetD8Async(cp->base, 0, cp->size, cp->stream), "cuMemsetD8Async");
	CU_CHECK(cu.cuStreamSynchronize(cp->stream), "clearing the pool");

	p.done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (p.done_fd < 0) {
		r = fail(-errno, "eventfd: %s", strerror(errno));
		goto out;
	}
	cp->done_fd = p.done_fd;
	r = 0;
out:
	leave();
	if (r < 0)
		goto fail;
	*ret = (struct backend_pool){ .ops = &cuda_ops, .fd = p.fd,
				      .device_base = (uint64_t)cp->base, .bytes = cp->size,
				      .block_bytes = block_bytes, .done_fd = p.done_fd, .priv = cp };
	return 0;
fail:
	cuda_destroy(&p);
	return r;
}

/* The widest access every address and length allows. */
static uint32_t width_of(uint64_t a)
{
	return a % 16 == 0 ? 16 : a % 4 == 0 ? 4 : 1;
}

/*
 * Blocks until ticket completed, with the pool's context current.  A failure of the stream is
 * the device's: sticky.
 */
static int sync_to(struct cuda_pool *cp, uint64_t ticket, const char *what)
{
	CUresult cr;

	if (completed(cp) >= ticket)
		return 0;
	if (cp->error)
		return cp->error;
	cr = cu.cuStreamSynchronize(cp->stream);
	if (cr != CUDA_SUCCESS)
		return cp->error = cu_fail(cr, what);
	cp->idle_at = cp->queued; /* everything issued so far ran */
	return 0;
}

/*
 * Room for a list too long to pass inline: device memory, and pinned memory to upload from.
 *
 * Calls do not wait for their work, so the last operation that used a buffer (its ticket) may
 * still need it: its upload may not have read the host side yet, nor its kernel the device
 * side.  The EXT_BUFS buffers are used in turn, and a long list takes the next one, waiting for
 * that buffer's last ticket before it writes it (or frees it to grow it).  So a long list waits
 * only when EXT_BUFS of them are still queued, and then for the whole stream
 * (cuStreamSynchronize); short lists and moves never touch the buffers.
 */
static int ext_reserve(struct cuda_pool *cp, size_t bytes)
{
	struct ext_buf *b = &cp->ext[(cp->ext_cur + 1) % EXT_BUFS];
	size_t size = 64 << 10;
	CUresult cr;
	int r;

	r = sync_to(cp, b->ticket, "waiting for a copy list buffer");
	if (r < 0)
		return r;
	cp->ext_cur = (unsigned)(b - cp->ext);
	if (bytes <= b->bytes)
		return 0;
	while (size < bytes)
		size *= 2;
	if (b->dev)
		(void)cu.cuMemFree(b->dev);
	if (b->host)
		(void)cu.cuMemFreeHost(b->host);
	b->dev = 0;
	b->host = NULL;
	b->bytes = 0;
	cr = cu.cuMemAlloc(&b->dev, size);
	if (cr != CUDA_SUCCESS)
		return cu_fail(cr, "cuMemAlloc");
	cr = cu.cuMemHostAlloc(&b->host, size, 0);
	if (cr != CUDA_SUCCESS)
		return cu_fail(cr, "cuMemHostAlloc");
	b->bytes = size;
	return 0;
}

/*
 * Where a list of n entries of size bytes goes: the launch's parameters when it fits, else the
 * next upload buffer's pinned side (queued to the device by ext_upload(); the operation's
 * ticket becomes the buffer's).  0 or -errno, nothing queued.
 */
static int list_at(struct cuda_pool *cp, void *inline_entries, uint32_t n, size_t size,
		   void **ret)
{
	int r;

	if (n <= KVPD_INLINE) {
		*ret = inline_entries;
		return 0;
	}
	r = ext_reserve(cp, (size_t)n * size);
	if (r < 0)
		return r;
	*ret = cp->ext[cp->ext_cur].host;
	return 0;
}

static int ext_upload(struct cuda_pool *cp, uint32_t n, size_t size, uint64_t *ret_ext)
{
	const struct ext_buf *b = &cp->ext[cp->ext_cur];
	CUresult cr;

	*ret_ext = 0;
	if (n <= KVPD_INLINE)
		return 0;
	cr = cu.cuMemcpyHtoDAsync(b->dev, b->host, (size_t)n * size, cp->stream);
	if (cr != CUDA_SUCCESS)
		return cu_fail(cr, "uploading a copy list");
	*ret_ext = (uint64_t)b->dev;
	return 0;
}

/* About as many threads as the device holds at once, split among the copies. */
static unsigned grid_for(const struct cuda_pool *cp, uint64_t units, uint32_t n, unsigned *ret_y)
{
	uint64_t target = (uint64_t)cp->sms * 8, per = (units + THREADS * 4 - 1) / (THREADS * 4);
	uint32_t y = n < 65535 ? n : 65535;
	uint64_t x = target / y;

	x = x < 1 ? 1 : x;
	x = per < x ? per : x;
	*ret_y = y;
	return (unsigned)(x < 1 ? 1 : x);
}

/* Queues the n copies of a (their list in place: inline, or uploaded at a->ext). */
static int launch_copies(struct cuda_pool *cp, struct kvpd_copy_args *a)
{
	void *params[] = { a };
	unsigned gx, gy;
	CUresult cr;

	gx = grid_for(cp, a->bytes / a->width, a->n, &gy);
	cr = cu.cuLaunchKernel(cp->copy_blocks, gx, gy, 1, THREADS, 1, 1, 0, cp->stream, params,
			       NULL);
	return cr == CUDA_SUCCESS ? 0 : cu_fail(cr, "launching kvpd_copy_blocks");
}

/*
 * Ends an operation whose work was queued (r == 0) or failed part way (r < 0).  On success its
 * callback goes last on the stream and its ticket is issued.  On failure the stream is
 * drained before the error returns, since the caller may reuse the memory at once, and no
 * ticket is issued: the callbacks queued stay one per ticket, so their count is the last
 * ticket completed.  (If the callback itself cannot be queued, the copies before it are
 * waited out the same way.)
 */
static int queue_end(struct cuda_pool *cp, int r, bool ext, const char *what,
		     uint64_t *ret_ticket)
{
	CUresult cr;

	if (r == 0) {
		cr = cu.cuStreamAddCallback(cp->stream, on_done, cp, 0);
		if (cr == CUDA_SUCCESS) {
			*ret_ticket = ++cp->queued;
			if (ext)
				cp->ext[cp->ext_cur].ticket = cp->queued;
			return 0;
		}
		r = cu_fail(cr, "cuStreamAddCallback");
	}
	cr = cu.cuStreamSynchronize(cp->stream);
	if (cr != CUDA_SUCCESS)
		r = cp->error = cu_fail(cr, what);
	return r;
}

static int cuda_copy_blocks(struct backend_pool *p, const struct backend_block_copy *c,
			    uint32_t n, uint64_t *ret_ticket)
{
	struct cuda_pool *cp = p->priv;
	struct kvpd_copy_args a;
	struct kvpd_copy *list;
	void *at;
	int r;

	if (cp->error)
		return cp->error;
	for (uint32_t i = 0; i < n; i++)
		if (c[i].dst >= cp->nblocks || c[i].src >= cp->nblocks)
			return fail(-EINVAL, "copy_blocks: no block %u",
				    c[i].dst >= cp->nblocks ? c[i].dst : c[i].src);
	if (n == 0) {
		*ret_ticket = 0;
		return 0;
	}
	r = enter(cp);
	if (r < 0)
		return r;
	r = list_at(cp, a.e, n, sizeof(*list), &at);
	if (r < 0)
		goto out;
	list = at;
	a.bytes = p->block_bytes;
	a.n = n;
	a.width = width_of(p->block_bytes); /* the pool's base is aligned to its granularity */
	for (uint32_t i = 0; i < n; i++)
		list[i] = (struct kvpd_copy){
			.dst = (uint64_t)cp->base + (uint64_t)c[i].dst * p->block_bytes,
			.src = (uint64_t)cp->base + (uint64_t)c[i].src * p->block_bytes
		};
	r = ext_upload(cp, n, sizeof(*list), &a.ext);
	if (r == 0)
		r = launch_copies(cp, &a);
	r = queue_end(cp, r, a.ext != 0, "copy_blocks", ret_ticket);
out:
	leave();
	return r;
}

static int cuda_copy_slots(struct backend_pool *p, const struct backend_slot_copy *c, uint32_t n,
			   uint64_t *ret_ticket)
{
	struct cuda_pool *cp = p->priv;
	struct kvpd_slot_args a;
	struct kvpd_slot *list;
	void *params[] = { &a }, *at;
	uint64_t warps, blocks, most = (uint64_t)cp->sms * 16;
	CUresult cr;
	int r;

	if (cp->error)
		return cp->error;
	for (uint32_t i = 0; i < n; i++) {
		if (c[i].dst >= cp->nblocks || c[i].src >= cp->nblocks)
			return fail(-EINVAL, "copy_slots: no block %u",
				    c[i].dst >= cp->nblocks ? c[i].dst : c[i].src);
		/* A slot past the block would write into the next one (as the host backend checks). */
		if ((uint64_t)c[i].dst_slot * p->slot_stride >= p->kv_stride ||
		    (uint64_t)c[i].src_slot * p->slot_stride >= p->kv_stride)
			return fail(-EINVAL, "copy_slots: no slot %u in a block",
				    c[i].dst_slot > c[i].src_slot ? c[i].dst_slot : c[i].src_slot);
	}
	if (n == 0) {
		*ret_ticket = 0;
		return 0;
	}
	r = enter(cp);
	if (r < 0)
		return r;
	r = list_at(cp, a.e, n, sizeof(*list), &at);
	if (r < 0)
		goto out;
	list = at;
	a.base = (uint64_t)cp->base;
	a.block_bytes = p->block_bytes;
	a.layer_stride = p->layer_stride;
	a.kv_stride = p->kv_stride;
	a.slot_stride = p->slot_stride;
	a.layers = p->layers;
	a.n = n;
	a.width = width_of(p->slot_stride | p->kv_stride | p->layer_stride | p->block_bytes);
	a.pad = 0;
	for (uint32_t i = 0; i < n; i++)
		list[i] = (struct kvpd_slot){ c[i].dst, c[i].dst_slot, c[i].src, c[i].src_slot };
	r = ext_upload(cp, n, sizeof(*list), &a.ext);
	if (r == 0) {
		warps = (uint64_t)n * 2 * p->layers;
		blocks = (warps * 32 + THREADS - 1) / THREADS;
		blocks = blocks > most ? most : blocks;
		cr = cu.cuLaunchKernel(cp->copy_slots, (unsigned)blocks, 1, 1, THREADS, 1, 1, 0,
				       cp->stream, params, NULL);
		if (cr != CUDA_SUCCESS)
			r = cu_fail(cr, "launching kvpd_copy_slots");
	}
	r = queue_end(cp, r, a.ext != 0, "copy_slots", ret_ticket);
out:
	leave();
	return r;
}

static int cuda_host_alloc(struct backend_pool *p, uint64_t bytes, void **ret)
{
	struct cuda_pool *cp = p->priv;
	void *mem = NULL;
	int r;

	if (bytes == 0 || bytes > SIZE_MAX)
		return fail(-EINVAL, "host_alloc: bad size");
	r = enter(cp);
	if (r < 0)
		return r;
	/* Portable: any context may use it; devicemap: kernels can read and write it directly. */
	CU_CHECK(cu.cuMemHostAlloc(&mem, (size_t)bytes,
				   CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
		 "cuMemHostAlloc");
	*ret = mem;
out:
	leave();
	return r;
}

static void cuda_host_free(struct backend_pool *p, void *mem, uint64_t bytes)
{
	struct cuda_pool *cp = p->priv;

	if (!mem || enter(cp) < 0)
		return;
	(void)cu.cuMemFreeHost(mem);
	leave();
}

/* Through the copy engines: one copy per run of blocks adjacent on both sides. */
static int move_dma(struct backend_pool *p, struct cuda_pool *cp, enum backend_dir dir,
		    const struct backend_move *m, uint32_t n)
{
	const uint64_t bb = p->block_bytes;
	CUstream s = cp->stream;
	int r = 0;

	for (uint32_t i = 0, j; i < n; i = j) {
		CUdeviceptr dev = cp->base + (CUdeviceptr)m[i].block * bb;
		uint8_t *host = m[i].host;

		for (j = i + 1; j < n && m[j].block == m[j - 1].block + 1 &&
				(uint8_t *)m[j].host == (uint8_t *)m[j - 1].host + bb;
		     j++)
			;
		if (dir == BACKEND_TO_HOST)
			CU_CHECK(cu.cuMemcpyDtoHAsync(host, dev, (size_t)(bb * (j - i)), s),
				 "cuMemcpyDtoHAsync");
		else
			CU_CHECK(cu.cuMemcpyHtoDAsync(dev, host, (size_t)(bb * (j - i)), s),
				 "cuMemcpyHtoDAsync");
	}
out:
	return r;
}

/*
 * Through kvpd_copy_blocks: the SMs read or write pinned host memory directly.  The lists go
 * inline, KVPD_INLINE blocks a launch, so a move never uses (or waits for) the ext buffers.
 */
static int move_kernel(struct backend_pool *p, struct cuda_pool *cp, enum backend_dir dir,
		       const struct backend_move *m, uint32_t n)
{
	struct kvpd_copy_args a;
	int r = 0;

	a.bytes = p->block_bytes;
	a.ext = 0;
	for (uint32_t first = 0; first < n && r == 0; first += KVPD_INLINE) {
		uint32_t k = n - first < KVPD_INLINE ? n - first : KVPD_INLINE;
		uint64_t align = p->block_bytes;

		a.n = k;
		for (uint32_t i = 0; i < k; i++) {
			uint64_t dev = (uint64_t)cp->base + (uint64_t)m[first + i].block * a.bytes;
			uint64_t host = (uint64_t)(uintptr_t)m[first + i].host; /* unified addressing */

			a.e[i].dst = dir == BACKEND_TO_HOST ? host : dev;
			a.e[i].src = dir == BACKEND_TO_HOST ? dev : host;
			align |= host;
		}
		a.width = width_of(align);
		r = launch_copies(cp, &a);
	}
	return r;
}

static int cuda_move(struct backend_pool *p, enum backend_dir dir, const struct backend_move *m,
		     uint32_t n, uint64_t *ret_ticket)
{
	struct cuda_pool *cp = p->priv;
	int r;

	if (dir != BACKEND_TO_HOST && dir != BACKEND_FROM_HOST)
		return fail(-EINVAL, "move: bad direction");
	if (cp->error)
		return cp->error;
	for (uint32_t i = 0; i < n; i++)
		if (m[i].block >= cp->nblocks || !m[i].host)
			return fail(-EINVAL, "move: no block %u, or no host memory", m[i].block);
	if (n == 0) {
		*ret_ticket = 0;
		return 0;
	}
	r = enter(cp);
	if (r < 0)
		return r;
	r = cp->swap == SWAP_KERNEL ? move_kernel(p, cp, dir, m, n) : move_dma(p, cp, dir, m, n);
	r = queue_end(cp, r, false, "move", ret_ticket);
	leave();
	return r;
}

static int cuda_done(struct backend_pool *p, uint64_t *ret_ticket)
{
	struct cuda_pool *cp = p->priv;
	CUresult cr;
	int r;

	*ret_ticket = completed(cp);
	if (cp->error)
		return cp->error;
	if (*ret_ticket >= cp->queued)
		return 0;
	/* Not yet: or never, if the stream failed (its callbacks then ran with the error). */
	r = enter(cp);
	if (r < 0)
		return r;
	cr = cu.cuStreamQuery(cp->stream);
	leave();
	if (cr != CUDA_SUCCESS && cr != CUDA_ERROR_NOT_READY)
		return cp->error = cu_fail(cr, "the pool's stream failed");
	if (cr == CUDA_SUCCESS)
		cp->idle_at = cp->queued; /* idle: everything issued so far ran */
	*ret_ticket = completed(cp);
	return 0;
}

static int cuda_wait(struct backend_pool *p, uint64_t ticket)
{
	struct cuda_pool *cp = p->priv;
	int r;

	if (ticket > cp->queued)
		return fail(-EINVAL, "wait: no ticket %llu (the last is %llu)",
			    (unsigned long long)ticket, (unsigned long long)cp->queued);
	if (completed(cp) >= ticket)
		return 0;
	if (cp->error)
		return cp->error;
	r = enter(cp);
	if (r < 0)
		return r;
	r = sync_to(cp, ticket, "waiting for a ticket");
	leave();
	return r;
}

static const struct backend_ops cuda_ops = {
	.name = "cuda",
	.create = cuda_create,
	.destroy = cuda_destroy,
	.copy_blocks = cuda_copy_blocks,
	.copy_slots = cuda_copy_slots,
	.move = cuda_move,
	.done = cuda_done,
	.wait = cuda_wait,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
};

EXPORT const struct backend_module kvpaged_backend_module = {
	.abi = BACKEND_MODULE_ABI,
	.ops = &cuda_ops,
	.probe = cuda_probe,
	.last_error = cuda_last_error,
};

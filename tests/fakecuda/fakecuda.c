/* SPDX-License-Identifier: MIT */
/*
 * fakecuda: the CUDA driver API emulated on the host, built as libcuda.so.1 (check only), so
 * that the CUDA module, libkvpaged's import of a GPU pool and the GPU tests run where there is
 * no GPU.  It exports exactly the functions cuda/cu.h and libclient/client.c resolve, under the
 * names they resolve (cuda.h's versioned ones: cuMemcpyHtoD is cuMemcpyHtoD_v2), with cuda.h's
 * prototypes, and implements the two kernels of cuda/kernels.cu as loops over kernels.h's
 * argument structs.  See docs/cuda.md, "The driver emulation".
 *
 * Host memory stands in for device memory, and a CUdeviceptr is a host address.  Device memory
 * (cuMemCreate, cuMemAlloc) sits behind a PROT_NONE reservation at its device address, so that
 * the host faults on it as on a GPU; the fake reaches the bytes through a second mapping of its
 * own.  Every stream is a thread running its queue in order.
 *
 * It exists to find bugs, so it is strict wherever the real driver may be lenient or its
 * behaviour is not documented (each such place says so): work outside a context, CUDA calls
 * from host functions, device addresses that are not device memory, memory used after it was
 * freed, sticky errors.  Every refusal also goes to stderr, prefixed "fakecuda[pid]: ".
 *
 * Environment, read when the library is loaded: FAKECUDA_DEVICES (default 1),
 * FAKECUDA_DELAY_US (each stream operation sleeps first), FAKECUDA_FAIL_OP=N (the Nth device
 * operation queued in this process fails with CUDA_ERROR_LAUNCH_FAILED), FAKECUDA_TRACE=1 (each
 * device operation is logged as it is queued); FAKECUDA_LOG, read at each line, names a file
 * every line goes to as well.
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda/kernels.h"
#include "proto/memfd.h"

#define EXPORT __attribute__((visibility("default")))

/* H200-like.  Granularity: both minimum and recommended are 2 MiB on Hopper. */
#define GRANULARITY (UINT64_C(2) << 20)
#define MAX_DEVICES 16
#define DEVICE_BYTES (UINT64_C(140) << 30)
#define DEVICE_SMS 132
#define CC_MAJOR 9
#define CC_MINOR 0
/* Without cuFuncSetAttribute (not in the table) a launch gets at most the default 48 KiB. */
#define SHARED_PER_BLOCK (48 << 10)
/* New device and pinned memory is not cleared by the driver: it reads as this. */
#define GARBAGE 0xcb
#define GARBAGE_UP_TO (UINT64_C(1) << 30)
#define MEMFD_PREFIX "fakecuda-dev"
#define NOTES_MAX 200

enum kernel { KERNEL_COPY_BLOCKS, KERNEL_COPY_SLOTS, KERNELS };

static const char *const kernel_names[KERNELS] = { "kvpd_copy_blocks", "kvpd_copy_slots" };

struct CUctx_st {
	int device;
	unsigned retained; /* primary context retains; 0: inactive */
	bool started; /* its driver thread was started (once) */
	_Atomic int sticky; /* a CUresult: the first error of its work, returned by every call */
	_Atomic uint64_t generation; /* bumped by a reset: queued work of before is dropped */
	unsigned workers; /* stream threads alive, destroyed streams still draining included */
	pthread_cond_t workers_cv;
};

/* Physical memory: a cuMemCreate allocation, or one imported from its fd. */
struct phys {
	struct phys *next;
	int fd; /* a memfd named MEMFD_PREFIX<device> */
	uint64_t size;
	int device;
	bool imported;
	uint8_t *view; /* the fake's own mapping of the bytes */
	bool handle; /* the handle is not released yet */
	unsigned maps; /* cuMemMap mappings of it: it lives while either remains */
};

struct mapping {
	struct mapping *next;
	uintptr_t addr;
	uint64_t size;
	struct phys *phys;
	int access[MAX_DEVICES]; /* CU_MEM_ACCESS_FLAGS_PROT_*, per device: NONE until cuMemSetAccess */
};

struct reservation {
	struct reservation *next;
	uintptr_t base;
	uint64_t size;
	void *map_base; /* the PROT_NONE mapping holding it, alignment included */
	size_t map_size;
	struct mapping *maps;
};

/* cuMemAlloc: a PROT_NONE range at the device address, the bytes in view. */
struct linear {
	struct linear *next;
	uintptr_t addr;
	uint64_t size;
	size_t map_size;
	uint8_t *view;
	struct CUctx_st *ctx;
};

/* cuMemHostAlloc: plain host memory, reachable from the device (unified addressing). */
struct hostmem {
	struct hostmem *next;
	uintptr_t addr;
	uint64_t size;
	size_t map_size;
	unsigned flags;
	struct CUctx_st *ctx;
};

enum op_kind { OP_MEMSET, OP_COPY, OP_KERNEL, OP_HOST_FN, OP_CALLBACK };

/* Where a copy's side is: device memory, or host memory (pinned or not). */
enum space { SPACE_DEVICE, SPACE_HOST };

struct op {
	struct op *next;
	enum op_kind kind;
	uint64_t number; /* device operations: 1, 2, ... across the process; 0 for host calls */
	const char *what; /* the API call that queued it */
	union {
		struct {
			uintptr_t dst;
			uint64_t n;
			unsigned char value;
		} memset;
		struct {
			uintptr_t dst, src;
			uint64_t n;
			enum space dst_space, src_space;
			bool dst_pinned, src_pinned; /* checked again when it runs: not freed since */
		} copy;
		struct {
			enum kernel kernel;
			union {
				struct kvpd_copy_args blocks;
				struct kvpd_slot_args slots;
			} args;
		} kernel;
		struct {
			CUhostFn fn;
			void *arg;
		} host;
		struct {
			CUstreamCallback fn;
			CUstream stream;
			void *arg;
		} callback;
	};
};

struct CUstream_st {
	struct CUstream_st *next; /* fake.streams: live handles only */
	struct CUctx_st *ctx;
	uint64_t generation;
	unsigned flags;
	pthread_mutex_t m; /* the queue; taken after fake.lock, never before */
	pthread_cond_t cv; /* work queued, an operation done, a waiter gone */
	struct op *head, **tail;
	unsigned waiters; /* threads in cuStreamSynchronize: the stream is freed after them */
	bool destroyed;
};

struct CUfunc_st {
	struct CUmod_st *module;
	enum kernel kernel;
};

struct CUmod_st {
	struct CUmod_st *next;
	struct CUctx_st *ctx;
	uint64_t generation;
	bool has[KERNELS];
	struct CUfunc_st functions[KERNELS];
};

static struct {
	/*
	 * lock guards every table and counter below that is not atomic.  mem is held for reading
	 * while anything touches device or pinned memory (a stream's operation, a synchronous
	 * copy) and for writing while any is freed; it is taken before lock, never after.
	 */
	pthread_mutex_t lock;
	pthread_rwlock_t mem;
	_Atomic bool initialized, forked;
	int devices;
	unsigned delay_us;
	uint64_t fail_op;
	bool trace;
	_Atomic uint64_t ops;
	_Atomic unsigned long no_context, from_host_fn, pageable, notes;
	uint64_t device_used[MAX_DEVICES];
	struct phys *phys;
	struct reservation *reservations;
	struct linear *linear;
	struct hostmem *host;
	struct CUstream_st *streams;
	struct CUmod_st *modules;
} fake = { .lock = PTHREAD_MUTEX_INITIALIZER };

static struct CUctx_st contexts[MAX_DEVICES];

static __thread struct CUctx_st *ctx_stack[64];
static __thread unsigned ctx_depth;
static __thread bool in_host_fn;

/* A line to stderr, and to $FAKECUDA_LOG too (shared by every process: the daemon's stderr is
 * its log, which a test may not read). */
static void say(const char *line)
{
	const char *log = getenv("FAKECUDA_LOG");
	char buf[600];
	int n = snprintf(buf, sizeof(buf), "fakecuda[%d]: %s\n", (int)getpid(), line);

	n = n < (int)sizeof(buf) ? n : (int)sizeof(buf) - 1;
	(void)!write(STDERR_FILENO, buf, (size_t)n);
	if (log && *log) {
		int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);

		if (fd >= 0) {
			(void)!write(fd, buf, (size_t)n);
			close(fd);
		}
	}
}

__attribute__((format(printf, 1, 2))) static void note(const char *fmt, ...)
{
	char line[512];
	va_list ap;

	if (atomic_fetch_add(&fake.notes, 1) >= NOTES_MAX)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	say(line);
}

__attribute__((format(printf, 1, 2))) static void trace(const char *fmt, ...)
{
	char line[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	say(line);
}

static uint64_t env_u64(const char *name, uint64_t fallback)
{
	const char *s = getenv(name);
	char *end;
	unsigned long long v;

	if (!s || !*s)
		return fallback;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end) {
		note("%s=%s is not a number; using %llu", name, s, (unsigned long long)fallback);
		return fallback;
	}
	return v;
}

/* ---- errors ------------------------------------------------------------------------------- */

static const struct error_name {
	CUresult r;
	const char *name, *text;
} errors[] = {
#define E(code, text) { code, #code, text }
	E(CUDA_SUCCESS, "no error"),
	E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
	E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
	E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
	E(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
	E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
	E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
	E(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
	E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
	E(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device"),
	E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
	E(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
	E(CUDA_ERROR_NOT_READY, "device not ready"),
	E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
	E(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
	E(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address"),
	E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
	E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
	E(CUDA_ERROR_UNKNOWN, "unknown error"),
#undef E
};

static const char *error_name(CUresult r)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].r == r)
			return errors[i].name;
	return "CUDA_ERROR_?";
}

/* ---- entry checks ------------------------------------------------------------------------- */

/*
 * Every exported function starts here.  The documentation forbids CUDA calls in a host
 * function and says the driver "may" refuse them: the fake always does, and counts them.  A
 * child forked after the driver started cannot use it (as with the real one).
 */
static CUresult api(const char *fn)
{
	if (in_host_fn) {
		atomic_fetch_add(&fake.from_host_fn, 1);
		note("%s called from a host function or stream callback: not permitted", fn);
		return CUDA_ERROR_NOT_PERMITTED;
	}
	if (atomic_load(&fake.forked)) {
		note("%s called in a child forked after cuInit", fn);
		return CUDA_ERROR_NOT_INITIALIZED;
	}
	if (!atomic_load(&fake.initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	return CUDA_SUCCESS;
}

static struct CUctx_st *current(void)
{
	return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
}

/*
 * For calls that work in the current context (memory, copies, streams, modules, launches,
 * pointer queries: those whose documentation lists CUDA_ERROR_INVALID_CONTEXT).  The virtual
 * memory management calls (cuMem{Create,Release,Map,Unmap,SetAccess,AddressReserve,...}) do
 * not: their documentation lists no context error, and they name the device themselves.  A
 * context whose work failed returns its error from every such call, as the real one does.
 */
static CUresult api_ctx(const char *fn, struct CUctx_st **ret)
{
	CUresult r = api(fn);
	struct CUctx_st *c;
	bool active;

	if (r != CUDA_SUCCESS)
		return r;
	c = current();
	if (!c) {
		atomic_fetch_add(&fake.no_context, 1);
		note("%s called with no current context", fn);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	pthread_mutex_lock(&fake.lock);
	active = c->retained > 0;
	pthread_mutex_unlock(&fake.lock);
	if (!active) {
		note("%s called in the primary context of device %d, released (reset) since it was "
		     "made current", fn, c->device);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	r = (CUresult)atomic_load(&c->sticky);
	if (r != CUDA_SUCCESS)
		return r;
	*ret = c;
	return CUDA_SUCCESS;
}

#define API(fn)                                                                                    \
	do {                                                                                       \
		CUresult r_ = api(fn);                                                             \
		if (r_ != CUDA_SUCCESS)                                                            \
			return r_;                                                                 \
	} while (0)

#define API_CTX(fn, ctx)                                                                           \
	do {                                                                                       \
		CUresult r_ = api_ctx(fn, ctx);                                                    \
		if (r_ != CUDA_SUCCESS)                                                            \
			return r_;                                                                 \
	} while (0)

/* Refuses a call: says why on stderr, returns r. */
__attribute__((format(printf, 3, 4))) static CUresult refuse(CUresult r, const char *fn,
							    const char *fmt, ...)
{
	char why[400];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	note("%s: %s: %s", fn, error_name(r), why);
	return r;
}

/* The first error of a context's work: sticky, as a device error is. */
static void ctx_fail(struct CUctx_st *c, CUresult r, const char *what)
{
	int expected = CUDA_SUCCESS;

	if (atomic_compare_exchange_strong(&c->sticky, &expected, (int)r))
		note("device %d: %s: %s; the context is unusable from now on", c->device, what,
		     error_name(r));
}

/* ---- library setup ------------------------------------------------------------------------ */

static void atfork_prepare(void)
{
	pthread_mutex_lock(&fake.lock);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&fake.lock);
}

static void atfork_child(void)
{
	pthread_mutex_unlock(&fake.lock);
	if (atomic_load(&fake.initialized))
		atomic_store(&fake.forked, true);
	/* The parent reports its own; the child reports only what it does. */
	fake.no_context = fake.from_host_fn = fake.pageable = 0;
}

__attribute__((constructor)) static void fake_setup(void)
{
	pthread_rwlockattr_t a;

	/* Writers (frees) must not starve behind a stream that keeps reading. */
	pthread_rwlockattr_init(&a);
	pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&fake.mem, &a);
	pthread_rwlockattr_destroy(&a);
	for (int i = 0; i < MAX_DEVICES; i++) {
		contexts[i].device = i;
		pthread_cond_init(&contexts[i].workers_cv, NULL);
	}
	fake.devices = (int)env_u64("FAKECUDA_DEVICES", 1);
	if (fake.devices > MAX_DEVICES)
		fake.devices = MAX_DEVICES;
	fake.delay_us = (unsigned)env_u64("FAKECUDA_DELAY_US", 0);
	fake.fail_op = env_u64("FAKECUDA_FAIL_OP", 0);
	fake.trace = env_u64("FAKECUDA_TRACE", 0) != 0;
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/*
 * The bugs the fake exists to catch surface as errors returned to the code under test, which
 * checks every CUresult.  Calls without a context and calls from host functions are also
 * summed up here, since code may ignore a result (cleanup paths do); the exit status is the
 * program's own.
 */
__attribute__((destructor)) static void fake_summary(void)
{
	unsigned long no_ctx = atomic_load(&fake.no_context), host = atomic_load(&fake.from_host_fn);
	unsigned long pageable = atomic_load(&fake.pageable);

	char line[200];

	if (no_ctx || host) {
		snprintf(line, sizeof(line), "%lu calls without a context, %lu calls from host "
			 "functions", no_ctx, host);
		say(line);
	}
	if (pageable) {
		snprintf(line, sizeof(line), "%lu asynchronous copies used pageable host memory "
			 "(the real driver stages those, synchronously)", pageable);
		say(line);
	}
}

/* ---- memory tables (fake.lock held) ------------------------------------------------------- */

static bool overlaps(uintptr_t a, uint64_t an, uintptr_t b, uint64_t bn)
{
	return a < b + bn && b < a + an;
}

/*
 * The fake's view of the bytes at device address addr as device dev reaches them: a pointer,
 * and in *avail how many bytes from there are contiguous in it; NULL if addr is not memory the
 * device may access that way.  host_ok: pinned host memory counts (a kernel reaches it through
 * unified addressing; copies name host memory separately).  write: write access is needed.
 */
static uint8_t *device_view(uintptr_t addr, int dev, bool host_ok, bool write, uint64_t *avail)
{
	for (struct reservation *r = fake.reservations; r; r = r->next) {
		if (addr < r->base || addr >= r->base + r->size)
			continue;
		for (struct mapping *m = r->maps; m; m = m->next) {
			int access;

			if (addr < m->addr || addr >= m->addr + m->size)
				continue;
			access = m->access[dev];
			if (!(access & CU_MEM_ACCESS_FLAGS_PROT_READ) ||
			    (write && access != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
				return NULL;
			*avail = m->addr + m->size - addr;
			return m->phys->view + (addr - m->addr);
		}
		return NULL; /* reserved, not mapped */
	}
	for (struct linear *l = fake.linear; l; l = l->next)
		if (addr >= l->addr && addr < l->addr + l->size) {
			/* Strict: another device's memory would need peer access, not emulated. */
			if (l->ctx->device != dev)
				return NULL;
			*avail = l->addr + l->size - addr;
			return l->view + (addr - l->addr);
		}
	if (host_ok)
		for (struct hostmem *h = fake.host; h; h = h->next)
			if (addr >= h->addr && addr < h->addr + h->size) {
				/* Write-combined memory has a device address of its own. */
				if (h->flags & CU_MEMHOSTALLOC_WRITECOMBINED)
					return NULL;
				*avail = h->addr + h->size - addr;
				return (uint8_t *)addr;
			}
	return NULL;
}

/* Whether all of [addr, addr + n) is reachable by dev as device_view() says. */
static bool device_range(uintptr_t addr, uint64_t n, int dev, bool host_ok, bool write)
{
	if (addr + n < addr)
		return false;
	while (n) {
		uint64_t avail;

		if (!device_view(addr, dev, host_ok, write, &avail))
			return false;
		if (avail >= n)
			break;
		addr += avail;
		n -= avail;
	}
	return true;
}

/* Whether [p, p + n) touches the device's address space: host memory may not. */
static bool in_device_space(uintptr_t p, uint64_t n)
{
	if (p + n < p)
		return true;
	for (struct reservation *r = fake.reservations; r; r = r->next)
		if (overlaps(p, n ? n : 1, r->base, r->size))
			return true;
	for (struct linear *l = fake.linear; l; l = l->next)
		if (overlaps(p, n ? n : 1, l->addr, l->size))
			return true;
	return false;
}

/* Whether [p, p + n) is pinned for ctx: inside one portable allocation, or one of ctx's. */
static bool pinned_for(uintptr_t p, uint64_t n, const struct CUctx_st *ctx)
{
	for (struct hostmem *h = fake.host; h; h = h->next)
		if (p >= h->addr && p + n <= h->addr + h->size && p + n >= p)
			return (h->flags & CU_MEMHOSTALLOC_PORTABLE) || h->ctx == ctx;
	return false;
}

static void phys_put(struct phys *p)
{
	if (p->handle || p->maps)
		return;
	for (struct phys **pp = &fake.phys; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	if (!p->imported)
		fake.device_used[p->device] -= p->size;
	munmap(p->view, p->size);
	close(p->fd);
	free(p);
}

static struct phys *phys_of(CUmemGenericAllocationHandle h)
{
	for (struct phys *p = fake.phys; p; p = p->next)
		if ((CUmemGenericAllocationHandle)(uintptr_t)p == h && p->handle)
			return p;
	return NULL;
}

/* ---- copies (fake.mem held for reading) --------------------------------------------------- */

/*
 * Copies n bytes, each side device memory (as dev reaches it) or host memory, a piece at a
 * time: device memory is contiguous only within one mapping.  The ranges were checked.
 */
static void copy_bytes(uintptr_t dst, bool dst_dev, uintptr_t src, bool src_dev, uint64_t n,
		       int dev, bool host_ok)
{
	while (n) {
		uint64_t da = n, sa = n, k;
		uint8_t *d = (uint8_t *)dst;
		const uint8_t *s = (const uint8_t *)src;

		pthread_mutex_lock(&fake.lock);
		if (dst_dev)
			d = device_view(dst, dev, host_ok, true, &da);
		if (src_dev)
			s = device_view(src, dev, host_ok, false, &sa);
		pthread_mutex_unlock(&fake.lock);
		if (!d || !s)
			abort(); /* checked before: a bug of the fake's */
		k = n < da ? n : da;
		k = k < sa ? k : sa;
		memmove(d, s, k);
		dst += k;
		src += k;
		n -= k;
	}
}

static void set_bytes(uintptr_t dst, unsigned char value, uint64_t n, int dev)
{
	while (n) {
		uint64_t avail = 0, k;
		uint8_t *d;

		pthread_mutex_lock(&fake.lock);
		d = device_view(dst, dev, false, true, &avail);
		pthread_mutex_unlock(&fake.lock);
		if (!d)
			abort();
		k = n < avail ? n : avail;
		memset(d, value, k);
		dst += k;
		n -= k;
	}
}

static bool checked_range(uintptr_t addr, uint64_t n, int dev, bool host_ok, bool write)
{
	bool ok;

	pthread_mutex_lock(&fake.lock);
	ok = device_range(addr, n, dev, host_ok, write);
	pthread_mutex_unlock(&fake.lock);
	return ok;
}

/* ---- the kernels (fake.mem held for reading) ---------------------------------------------- */

static uint64_t element_width(uint32_t width)
{
	/* kernels.cu: 16 and 4 pick those types, anything else bytes. */
	return width == 16 ? 16 : width == 4 ? 4 : 1;
}

/*
 * A kernel's list of n entries of size bytes: inline in the parameters, or read from device
 * memory at ext now, when the kernel runs (as the device reads it).  NULL and *r set if it
 * cannot be read.
 */
static void *kernel_list(const char *kernel, uint64_t ext, const void *inline_list, uint32_t n,
			 size_t size, size_t align, int dev, CUresult *r)
{
	void *list;

	*r = CUDA_SUCCESS;
	if (!ext) {
		/* The list is read from the parameters: past KVPD_INLINE it is past them. */
		if (n > KVPD_INLINE) {
			note("%s: %u entries inline, past the %u the parameters hold", kernel, n,
			     KVPD_INLINE);
			*r = CUDA_ERROR_ILLEGAL_ADDRESS;
			return NULL;
		}
		list = malloc((size_t)n * size + 1);
		if (list)
			memcpy(list, inline_list, (size_t)n * size);
		else
			*r = CUDA_ERROR_OUT_OF_MEMORY;
		return list;
	}
	if (ext % align) {
		note("%s: list at %#llx is not %zu-byte aligned", kernel, (unsigned long long)ext,
		     align);
		*r = CUDA_ERROR_MISALIGNED_ADDRESS;
		return NULL;
	}
	if (!checked_range(ext, (uint64_t)n * size, dev, true, false)) {
		note("%s: list of %u entries at %#llx is not device memory", kernel, n,
		     (unsigned long long)ext);
		*r = CUDA_ERROR_ILLEGAL_ADDRESS;
		return NULL;
	}
	list = malloc((size_t)n * size + 1);
	if (!list) {
		*r = CUDA_ERROR_OUT_OF_MEMORY;
		return NULL;
	}
	copy_bytes((uintptr_t)list, false, ext, true, (uint64_t)n * size, dev, true);
	return list;
}

/* One copy of a kernel: both ranges checked (aligned, device-reachable) before any is done. */
static CUresult kernel_check(const char *kernel, uint32_t e, uint64_t dst, uint64_t src,
			     uint64_t bytes, uint64_t width, int dev)
{
	if ((dst | src) % width) {
		note("%s: entry %u: %#llx <- %#llx not %llu-byte aligned", kernel, e,
		     (unsigned long long)dst, (unsigned long long)src, (unsigned long long)width);
		return CUDA_ERROR_MISALIGNED_ADDRESS;
	}
	if (!checked_range(src, bytes, dev, true, false) ||
	    !checked_range(dst, bytes, dev, true, true)) {
		note("%s: entry %u: %llu bytes %#llx <- %#llx: not device memory (or not "
		     "accessible to device %d)", kernel, e, (unsigned long long)bytes,
		     (unsigned long long)dst, (unsigned long long)src, dev);
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	}
	return CUDA_SUCCESS;
}

/*
 * kvpd_copy_blocks, as kernels.cu computes it: n copies of bytes / width whole elements.  The
 * entries run last first: on a device they run in any order, and the host backend runs them
 * first to last, so a batch whose result depends on the order differs between the two.
 */
static CUresult run_copy_blocks(const struct kvpd_copy_args *a, int dev)
{
	const char *k = kernel_names[KERNEL_COPY_BLOCKS];
	const uint64_t width = element_width(a->width), bytes = a->bytes / width * width;
	struct kvpd_copy *list;
	CUresult r;

	list = kernel_list(k, a->ext, a->e, a->n, sizeof(*list), 8, dev, &r);
	if (!list)
		return r;
	for (uint32_t e = 0; e < a->n && r == CUDA_SUCCESS && bytes; e++)
		r = kernel_check(k, e, list[e].dst, list[e].src, bytes, width, dev);
	for (uint32_t e = a->n; r == CUDA_SUCCESS && bytes && e-- > 0;)
		copy_bytes(list[e].dst, true, list[e].src, true, bytes, dev, true);
	free(list);
	return r;
}

/*
 * kvpd_copy_slots, as kernels.cu computes it: for each entry, 2 * layers runs of slot_stride
 * (whole elements) at block * block_bytes + slot * slot_stride + layer * layer_stride + kv *
 * kv_stride from base, in 64-bit arithmetic as the device does it.
 */
static CUresult run_copy_slots(const struct kvpd_slot_args *a, int dev)
{
	const char *k = kernel_names[KERNEL_COPY_SLOTS];
	const uint64_t width = element_width(a->width), bytes = a->slot_stride / width * width;
	const uint32_t runs = 2 * a->layers;
	struct kvpd_slot *list;
	CUresult r;

	list = kernel_list(k, a->ext, a->e, a->n, sizeof(*list), 4, dev, &r);
	if (!list)
		return r;
	for (int pass = 0; pass < 2 && r == CUDA_SUCCESS && bytes; pass++)
		for (uint32_t i = a->n; i-- > 0 && r == CUDA_SUCCESS;) {
			const struct kvpd_slot s = list[i];

			for (uint32_t run = 0; run < runs; run++) {
				const uint64_t off = (run / 2) * a->layer_stride +
						     (run % 2) * a->kv_stride;
				const uint64_t src = a->base + s.src * a->block_bytes +
						     s.src_slot * a->slot_stride + off;
				const uint64_t dst = a->base + s.dst * a->block_bytes +
						     s.dst_slot * a->slot_stride + off;

				if (pass == 0)
					r = kernel_check(k, i, dst, src, bytes, width, dev);
				else
					copy_bytes(dst, true, src, true, bytes, dev, true);
				if (r != CUDA_SUCCESS)
					break;
			}
		}
	free(list);
	return r;
}

/* ---- streams ------------------------------------------------------------------------------ */

static CUresult run_device_op(const struct op *op, int dev, const struct CUctx_st *ctx)
{
	switch (op->kind) {
	case OP_MEMSET:
		if (!checked_range(op->memset.dst, op->memset.n, dev, false, true)) {
			note("%s: %llu bytes at %#llx are not device memory (freed since queued?)",
			     op->what, (unsigned long long)op->memset.n,
			     (unsigned long long)op->memset.dst);
			return CUDA_ERROR_ILLEGAL_ADDRESS;
		}
		set_bytes(op->memset.dst, op->memset.value, op->memset.n, dev);
		return CUDA_SUCCESS;
	case OP_COPY: {
		const bool dd = op->copy.dst_space == SPACE_DEVICE;
		const bool sd = op->copy.src_space == SPACE_DEVICE;
		bool ok = true;

		pthread_mutex_lock(&fake.lock);
		if (dd)
			ok = device_range(op->copy.dst, op->copy.n, dev, false, true);
		else if (op->copy.dst_pinned)
			ok = pinned_for(op->copy.dst, op->copy.n, ctx);
		if (sd)
			ok = ok && device_range(op->copy.src, op->copy.n, dev, false, false);
		else if (op->copy.src_pinned)
			ok = ok && pinned_for(op->copy.src, op->copy.n, ctx);
		pthread_mutex_unlock(&fake.lock);
		if (!ok) {
			note("%s: %llu bytes %#llx <- %#llx: memory freed or unmapped while the copy "
			     "was queued", op->what, (unsigned long long)op->copy.n,
			     (unsigned long long)op->copy.dst, (unsigned long long)op->copy.src);
			return CUDA_ERROR_ILLEGAL_ADDRESS;
		}
		copy_bytes(op->copy.dst, dd, op->copy.src, sd, op->copy.n, dev, false);
		return CUDA_SUCCESS;
	}
	case OP_KERNEL:
		if (op->kernel.kernel == KERNEL_COPY_BLOCKS)
			return run_copy_blocks(&op->kernel.args.blocks, dev);
		return run_copy_slots(&op->kernel.args.slots, dev);
	case OP_HOST_FN:
	case OP_CALLBACK:
		break;
	}
	return CUDA_ERROR_UNKNOWN;
}

static void run_op(struct CUstream_st *s, struct op *op)
{
	struct CUctx_st *c = s->ctx;
	CUresult r;

	if (fake.delay_us) {
		struct timespec ts = { .tv_sec = fake.delay_us / 1000000,
				       .tv_nsec = (long)(fake.delay_us % 1000000) * 1000 };

		nanosleep(&ts, NULL);
	}
	/* A reset context drops its queues. */
	if (s->generation != atomic_load(&c->generation))
		return;
	/* Stream callbacks run after an error too, given it (cuStreamAddCallback documents it). */
	if (op->kind == OP_CALLBACK) {
		in_host_fn = true;
		op->callback.fn(op->callback.stream, (CUresult)atomic_load(&c->sticky),
				op->callback.arg);
		in_host_fn = false;
		return;
	}
	/* A failed context runs nothing more, host functions included (as documented). */
	if (atomic_load(&c->sticky))
		return;
	if (op->kind == OP_HOST_FN) {
		in_host_fn = true;
		op->host.fn(op->host.arg);
		in_host_fn = false;
		return;
	}
	if (op->number == fake.fail_op) {
		ctx_fail(c, CUDA_ERROR_LAUNCH_FAILED, "FAKECUDA_FAIL_OP: operation failed");
		return;
	}
	pthread_rwlock_rdlock(&fake.mem);
	r = run_device_op(op, c->device, c);
	pthread_rwlock_unlock(&fake.mem);
	if (r != CUDA_SUCCESS)
		ctx_fail(c, r, op->what);
}

static void *stream_worker(void *arg)
{
	struct CUstream_st *s = arg;
	struct CUctx_st *c = s->ctx;

	for (;;) {
		struct op *op;

		pthread_mutex_lock(&s->m);
		while (!s->head && !s->destroyed)
			pthread_cond_wait(&s->cv, &s->m);
		op = s->head;
		pthread_mutex_unlock(&s->m);
		if (!op)
			break; /* destroyed and drained */
		run_op(s, op);
		/* Dequeued only now: the stream is busy until the operation is done. */
		pthread_mutex_lock(&s->m);
		s->head = op->next;
		if (!s->head)
			s->tail = &s->head;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->m);
		free(op);
	}
	pthread_mutex_lock(&s->m);
	while (s->waiters)
		pthread_cond_wait(&s->cv, &s->m);
	pthread_mutex_unlock(&s->m);
	pthread_mutex_destroy(&s->m);
	pthread_cond_destroy(&s->cv);
	free(s);
	pthread_mutex_lock(&fake.lock);
	c->workers--;
	pthread_cond_broadcast(&c->workers_cv);
	pthread_mutex_unlock(&fake.lock);
	return NULL;
}

/* A live stream of ctx (fake.lock held).  The NULL and per-thread streams are not emulated. */
static CUresult stream_of(const char *fn, CUstream h, struct CUctx_st *ctx,
			  struct CUstream_st **ret)
{
	for (struct CUstream_st *s = fake.streams; s; s = s->next)
		if (s == h) {
			/* Strict: the real driver may accept another context's stream. */
			if (s->ctx != ctx)
				return refuse(CUDA_ERROR_INVALID_CONTEXT, fn,
					      "the stream belongs to device %d's context, device "
					      "%d's is current", s->ctx->device, ctx->device);
			*ret = s;
			return CUDA_SUCCESS;
		}
	if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
		return refuse(CUDA_ERROR_INVALID_HANDLE, fn,
			      "the default streams are not emulated (kvpaged uses its own)");
	return refuse(CUDA_ERROR_INVALID_HANDLE, fn, "no such stream (destroyed?)");
}

/* Queues op on stream h (op is taken either way). */
static CUresult enqueue(const char *fn, CUstream h, struct CUctx_st *ctx, struct op *op)
{
	struct CUstream_st *s;
	CUresult r;

	op->what = fn;
	op->next = NULL;
	pthread_mutex_lock(&fake.lock);
	r = stream_of(fn, h, ctx, &s);
	if (r != CUDA_SUCCESS) {
		pthread_mutex_unlock(&fake.lock);
		free(op);
		return r;
	}
	if (op->kind != OP_HOST_FN && op->kind != OP_CALLBACK) {
		op->number = atomic_fetch_add(&fake.ops, 1) + 1;
		if (fake.trace)
			trace("op %llu: %s on stream %p%s", (unsigned long long)op->number, fn,
			     (void *)s, op->number == fake.fail_op ? " (will fail)" : "");
	}
	pthread_mutex_lock(&s->m);
	*s->tail = op;
	s->tail = &op->next;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->m);
	pthread_mutex_unlock(&fake.lock);
	return CUDA_SUCCESS;
}

static struct op *op_new(enum op_kind kind)
{
	struct op *op = calloc(1, sizeof(*op));

	if (op)
		op->kind = kind;
	return op;
}

/* Waits until s ran everything queued (fake.lock held on entry, released). */
static void stream_drain(struct CUstream_st *s)
{
	pthread_mutex_lock(&s->m);
	s->waiters++;
	pthread_mutex_unlock(&fake.lock);
	while (s->head)
		pthread_cond_wait(&s->cv, &s->m);
	s->waiters--;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->m);
}

/*
 * Waits until ctx's streams ran everything queued: all of them (cuCtxSynchronize), or only the
 * blocking ones (CU_STREAM_DEFAULT), which the synchronous copies are ordered behind on the
 * legacy default stream, never the non-blocking ones.
 */
static void wait_streams(struct CUctx_st *ctx, bool blocking_only)
{
	for (;;) {
		struct CUstream_st *busy = NULL;

		pthread_mutex_lock(&fake.lock);
		for (struct CUstream_st *s = fake.streams; s && !busy; s = s->next) {
			if (s->ctx != ctx || (blocking_only && (s->flags & CU_STREAM_NON_BLOCKING)))
				continue;
			pthread_mutex_lock(&s->m);
			if (s->head)
				busy = s;
			pthread_mutex_unlock(&s->m);
		}
		if (!busy) {
			pthread_mutex_unlock(&fake.lock);
			return;
		}
		stream_drain(busy);
	}
}

/*
 * The primary context's last release resets it: its queues are dropped (nothing more of them
 * runs, host functions included), its streams and modules destroyed, its cuMemAlloc and
 * cuMemHostAlloc memory freed.  fake.lock held on entry and on return.
 */
static void ctx_reset(struct CUctx_st *c)
{
	atomic_fetch_add(&c->generation, 1);
	for (struct CUstream_st **ps = &fake.streams; *ps;) {
		struct CUstream_st *s = *ps;

		if (s->ctx != c) {
			ps = &s->next;
			continue;
		}
		*ps = s->next;
		pthread_mutex_lock(&s->m);
		s->destroyed = true;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->m);
	}
	while (c->workers)
		pthread_cond_wait(&c->workers_cv, &fake.lock);
	for (struct CUmod_st **pm = &fake.modules; *pm;) {
		struct CUmod_st *m = *pm;

		if (m->ctx != c) {
			pm = &m->next;
			continue;
		}
		*pm = m->next;
		free(m);
	}
	/* Memory is freed under fake.mem, taken before fake.lock. */
	pthread_mutex_unlock(&fake.lock);
	pthread_rwlock_wrlock(&fake.mem);
	pthread_mutex_lock(&fake.lock);
	for (struct linear **pl = &fake.linear; *pl;) {
		struct linear *l = *pl;

		if (l->ctx != c) {
			pl = &l->next;
			continue;
		}
		*pl = l->next;
		fake.device_used[c->device] -= l->size;
		munmap((void *)l->addr, l->map_size);
		munmap(l->view, l->map_size);
		free(l);
	}
	for (struct hostmem **ph = &fake.host; *ph;) {
		struct hostmem *h = *ph;

		if (h->ctx != c) {
			ph = &h->next;
			continue;
		}
		*ph = h->next;
		munmap((void *)h->addr, h->map_size);
		free(h);
	}
	atomic_store(&c->sticky, CUDA_SUCCESS);
	pthread_rwlock_unlock(&fake.mem);
}

/*
 * The driver starts threads of its own at cuInit and when a context is created, and each
 * starts with its creator's signal mask.  So does the fake: a thread that only waits, but takes
 * what signals that mask let through.  A process that takes its signals through a signalfd
 * (the daemon) blocks them in every thread; if it called the driver without blocking them, a
 * SIGTERM would go to this thread and end the process, as it would with the real driver.
 */
static void *driver_thread(void *arg)
{
	for (;;)
		pause();
	return arg;
}

static void start_driver_thread(void)
{
	pthread_attr_t attr;
	pthread_t thread;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 64 << 10);
	(void)pthread_create(&thread, &attr, driver_thread, NULL);
	pthread_attr_destroy(&attr);
}

/* ---- initialization, devices, errors ------------------------------------------------------ */

EXPORT CUresult CUDAAPI cuInit(unsigned int Flags)
{
	if (in_host_fn || atomic_load(&fake.forked))
		return api(__func__);
	if (Flags != 0)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "flags %u, must be 0", Flags);
	if (fake.devices <= 0)
		return CUDA_ERROR_NO_DEVICE;
	if (!atomic_exchange(&fake.initialized, true))
		start_driver_thread();
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
	if (in_host_fn)
		return api(__func__);
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = 13000;
	return CUDA_SUCCESS;
}

/* The table's entry for error, or NULL. */
static const struct error_name *error_entry(CUresult error)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].r == error)
			return &errors[i];
	return NULL;
}

EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
	if (in_host_fn)
		return api(__func__);
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	const struct error_name *e = error_entry(error);

	*pStr = e ? e->name : NULL;
	return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
	if (in_host_fn)
		return api(__func__);
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	const struct error_name *e = error_entry(error);

	*pStr = e ? e->text : NULL;
	return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static bool valid_device(CUdevice dev)
{
	return dev >= 0 && dev < fake.devices;
}

EXPORT CUresult CUDAAPI cuDeviceGetCount(int *count)
{
	API(__func__);
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = fake.devices;
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
	API(__func__);
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (!valid_device(ordinal))
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
	API(__func__);
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (!valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, (size_t)len, "kvpaged fake CUDA device");
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	int v;

	API(__func__);
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	if (!valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
	case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
		v = 1;
		break;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
		v = DEVICE_SMS;
		break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
		v = CC_MAJOR;
		break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
		v = CC_MINOR;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
		v = 1024;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
		v = 64;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
		v = INT_MAX;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
		v = 65535;
		break;
	case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
		v = 32;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
		v = SHARED_PER_BLOCK;
		break;
	case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
		v = 2;
		break;
	default:
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "attribute %d is not emulated",
			      (int)attrib);
	}
	*pi = v;
	return CUDA_SUCCESS;
}

/* ---- contexts ----------------------------------------------------------------------------- */

static struct CUctx_st *ctx_handle(CUcontext h)
{
	for (int i = 0; i < fake.devices; i++)
		if (h == &contexts[i])
			return &contexts[i];
	return NULL;
}

EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	API(__func__);
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (!valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&fake.lock);
	if (contexts[dev].retained++ == 0 && !contexts[dev].started) {
		contexts[dev].started = true;
		start_driver_thread();
	}
	pthread_mutex_unlock(&fake.lock);
	*pctx = &contexts[dev];
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
	struct CUctx_st *c;

	API(__func__);
	if (!valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	c = &contexts[dev];
	pthread_mutex_lock(&fake.lock);
	if (!c->retained) {
		pthread_mutex_unlock(&fake.lock);
		return refuse(CUDA_ERROR_INVALID_CONTEXT, __func__,
			      "device %d's primary context is not retained", dev);
	}
	if (--c->retained == 0)
		ctx_reset(c);
	pthread_mutex_unlock(&fake.lock);
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx)
{
	struct CUctx_st *c;
	bool active;

	API(__func__);
	c = ctx_handle(ctx);
	if (!c)
		return refuse(CUDA_ERROR_INVALID_CONTEXT, __func__, "not a context");
	pthread_mutex_lock(&fake.lock);
	active = c->retained > 0;
	pthread_mutex_unlock(&fake.lock);
	/* Strict: a primary context nobody retains is inactive; the driver may accept it here. */
	if (!active)
		return refuse(CUDA_ERROR_INVALID_CONTEXT, __func__,
			      "device %d's primary context is not retained", c->device);
	if (ctx_depth == sizeof(ctx_stack) / sizeof(ctx_stack[0]))
		return refuse(CUDA_ERROR_OUT_OF_MEMORY, __func__, "context stack full (a leak?)");
	ctx_stack[ctx_depth++] = c;
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx)
{
	API(__func__);
	if (!ctx_depth)
		return refuse(CUDA_ERROR_INVALID_CONTEXT, __func__, "no current context to pop");
	ctx_depth--;
	if (pctx)
		*pctx = ctx_stack[ctx_depth];
	return CUDA_SUCCESS;
}

/* ---- virtual memory management ------------------------------------------------------------ */

/* The properties the code passes: pinned device memory with a POSIX fd handle. */
static CUresult check_prop(const char *fn, const CUmemAllocationProp *prop)
{
	if (!prop)
		return refuse(CUDA_ERROR_INVALID_VALUE, fn, "no properties");
	if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return refuse(CUDA_ERROR_INVALID_VALUE, fn, "type %d, only PINNED is emulated",
			      (int)prop->type);
	if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return refuse(CUDA_ERROR_INVALID_VALUE, fn, "location type %d, only DEVICE is "
			      "emulated", (int)prop->location.type);
	if (!valid_device(prop->location.id))
		return refuse(CUDA_ERROR_INVALID_DEVICE, fn, "no device %d", prop->location.id);
	/* Strict: 0 (not shareable) is valid too, but the pools are always shared. */
	if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return refuse(CUDA_ERROR_INVALID_VALUE, fn, "handle types %#x, only the POSIX fd "
			      "is emulated", (unsigned)prop->requestedHandleTypes);
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity,
						      const CUmemAllocationProp *prop,
						      CUmemAllocationGranularity_flags option)
{
	CUresult r;

	API(__func__);
	if (!granularity)
		return CUDA_ERROR_INVALID_VALUE;
	r = check_prop(__func__, prop);
	if (r != CUDA_SUCCESS)
		return r;
	if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
	    option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "option %d", (int)option);
	*granularity = GRANULARITY;
	return CUDA_SUCCESS;
}

static void fill_garbage(void *p, uint64_t n)
{
	memset(p, GARBAGE, n < GARBAGE_UP_TO ? n : GARBAGE_UP_TO);
}

EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
				    const CUmemAllocationProp *prop, unsigned long long flags)
{
	char name[32];
	struct phys *p;
	CUresult r;
	int fd;

	API(__func__);
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	r = check_prop(__func__, prop);
	if (r != CUDA_SUCCESS)
		return r;
	if (flags)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "flags %#llx, must be 0", flags);
	if (size == 0 || size % GRANULARITY)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "size %zu is not a multiple of "
			      "the granularity (%llu)", size, (unsigned long long)GRANULARITY);
	pthread_mutex_lock(&fake.lock);
	if (fake.device_used[prop->location.id] + size > DEVICE_BYTES) {
		pthread_mutex_unlock(&fake.lock);
		return refuse(CUDA_ERROR_OUT_OF_MEMORY, __func__, "%zu bytes more do not fit", size);
	}
	fake.device_used[prop->location.id] += size;
	pthread_mutex_unlock(&fake.lock);

	/* The device rides in the name: an importer, maybe another process, reads it back. */
	snprintf(name, sizeof(name), MEMFD_PREFIX "%d", prop->location.id);
	p = calloc(1, sizeof(*p));
	fd = memfd_new_sealable(name);
	if (!p || fd < 0 || ftruncate(fd, (off_t)size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0)
		goto oom;
	p->view = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p->view == MAP_FAILED)
		goto oom;
	fill_garbage(p->view, size);
	p->fd = fd;
	p->size = size;
	p->device = prop->location.id;
	p->handle = true;
	pthread_mutex_lock(&fake.lock);
	p->next = fake.phys;
	fake.phys = p;
	pthread_mutex_unlock(&fake.lock);
	*handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
	return CUDA_SUCCESS;
oom:
	if (fd >= 0)
		close(fd);
	free(p);
	pthread_mutex_lock(&fake.lock);
	fake.device_used[prop->location.id] -= size;
	pthread_mutex_unlock(&fake.lock);
	return refuse(CUDA_ERROR_OUT_OF_MEMORY, __func__, "memfd of %zu bytes: %s", size,
		      strerror(errno));
}

EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
	struct phys *p;

	API(__func__);
	pthread_rwlock_wrlock(&fake.mem);
	pthread_mutex_lock(&fake.lock);
	p = phys_of(handle);
	if (p) {
		p->handle = false;
		phys_put(p);
	}
	pthread_mutex_unlock(&fake.lock);
	pthread_rwlock_unlock(&fake.mem);
	/* The real driver's behaviour is undefined here (a double release, say): refused. */
	if (!p)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "no such handle (released?)");
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
					    CUdeviceptr addr, unsigned long long flags)
{
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct reservation *r;
	uintptr_t base;
	size_t map_size;
	void *m;

	API(__func__);
	if (!ptr || flags || size == 0 || size % page || addr % page ||
	    (alignment & (alignment - 1)))
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__,
			      "size %zu, alignment %zu, address %#llx, flags %#llx", size, alignment,
			      (unsigned long long)addr, flags);
	/*
	 * 0 is "the default alignment": taken as the granularity, which is what the mappings
	 * need.  (A driver that gave less would make cuMemMap of the result fail.)
	 */
	if (alignment < GRANULARITY)
		alignment = GRANULARITY;
	map_size = size + alignment;
	if (map_size < size)
		return CUDA_ERROR_OUT_OF_MEMORY;
	m = mmap(NULL, map_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	r = calloc(1, sizeof(*r));
	if (m == MAP_FAILED || !r) {
		if (m != MAP_FAILED)
			munmap(m, map_size);
		free(r);
		return refuse(CUDA_ERROR_OUT_OF_MEMORY, __func__, "%zu bytes", size);
	}
	base = ((uintptr_t)m + alignment - 1) & ~(uintptr_t)(alignment - 1);
	*r = (struct reservation){ .base = base, .size = size, .map_base = m,
				   .map_size = map_size };
	pthread_mutex_lock(&fake.lock);
	r->next = fake.reservations;
	fake.reservations = r;
	pthread_mutex_unlock(&fake.lock);
	*ptr = (CUdeviceptr)base;
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	struct reservation **pr, *r = NULL;
	const char *why = NULL;

	API(__func__);
	pthread_rwlock_wrlock(&fake.mem);
	pthread_mutex_lock(&fake.lock);
	for (pr = &fake.reservations; *pr; pr = &(*pr)->next)
		if ((*pr)->base == ptr) {
			r = *pr;
			break;
		}
	/* Strict: a range still mapped is refused (unmap first), as is a size that differs. */
	if (!r)
		why = "not the start of a reservation";
	else if (r->size != size)
		why = "not the reserved size";
	else if (r->maps)
		why = "still mapped";
	if (!why) {
		*pr = r->next;
		munmap(r->map_base, r->map_size);
		free(r);
	}
	pthread_mutex_unlock(&fake.lock);
	pthread_rwlock_unlock(&fake.mem);
	if (why)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "%#llx (%zu bytes): %s",
			      (unsigned long long)ptr, size, why);
	return CUDA_SUCCESS;
}

static struct reservation *reservation_of(uintptr_t p, uint64_t n)
{
	for (struct reservation *r = fake.reservations; r; r = r->next)
		if (p >= r->base && p + n <= r->base + r->size && p + n >= p)
			return r;
	return NULL;
}

EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
				 CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	struct reservation *r;
	struct mapping *m;
	struct phys *p;
	const char *why = NULL;

	API(__func__);
	if (flags || offset || ptr % GRANULARITY || size == 0 || size % GRANULARITY)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__,
			      "%#llx, %zu bytes, offset %zu, flags %#llx (offset must be 0, the rest "
			      "granularity multiples)", (unsigned long long)ptr, size, offset, flags);
	m = calloc(1, sizeof(*m));
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&fake.lock);
	p = phys_of(handle);
	r = reservation_of(ptr, size);
	if (!p)
		why = "no such handle (released?)";
	else if (size > p->size)
		why = "larger than the allocation";
	else if (!r)
		why = "not inside one reserved range";
	for (struct mapping *o = r ? r->maps : NULL; o && !why; o = o->next)
		if (overlaps(ptr, size, o->addr, o->size))
			why = "already mapped";
	if (!why) {
		*m = (struct mapping){ .addr = ptr, .size = size, .phys = p, .next = r->maps };
		r->maps = m;
		p->maps++;
	}
	pthread_mutex_unlock(&fake.lock);
	if (why) {
		free(m);
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "%#llx (%zu bytes): %s",
			      (unsigned long long)ptr, size, why);
	}
	return CUDA_SUCCESS;
}

/*
 * The whole mappings [ptr, ptr + size) consists of, contiguous, in *ret (up to max); their
 * count, or 0 if the range is not exactly that.
 */
static size_t whole_mappings(uintptr_t ptr, uint64_t size, struct reservation **ret_r,
			     struct mapping **ret, size_t max)
{
	struct reservation *r = reservation_of(ptr, size);
	uintptr_t at = ptr;
	size_t n = 0;

	if (!r || size == 0)
		return 0;
	while (at < ptr + size) {
		struct mapping *found = NULL;

		for (struct mapping *m = r->maps; m; m = m->next)
			if (m->addr == at)
				found = m;
		if (!found || n == max || found->addr + found->size > ptr + size)
			return 0;
		ret[n++] = found;
		at += found->size;
	}
	*ret_r = r;
	return n;
}

EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	struct mapping *maps[64];
	struct reservation *r;
	size_t n;

	API(__func__);
	pthread_rwlock_wrlock(&fake.mem);
	pthread_mutex_lock(&fake.lock);
	n = whole_mappings(ptr, size, &r, maps, 64);
	for (size_t i = 0; i < n; i++) {
		for (struct mapping **pm = &r->maps; *pm; pm = &(*pm)->next)
			if (*pm == maps[i]) {
				*pm = maps[i]->next;
				break;
			}
		maps[i]->phys->maps--;
		phys_put(maps[i]->phys);
		free(maps[i]);
	}
	pthread_mutex_unlock(&fake.lock);
	pthread_rwlock_unlock(&fake.mem);
	if (!n)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "%#llx (%zu bytes) is not whole "
			      "mappings", (unsigned long long)ptr, size);
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
				       size_t count)
{
	struct mapping *maps[64];
	struct reservation *r;
	size_t n;

	API(__func__);
	if (!desc || count == 0)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "no access descriptors");
	for (size_t i = 0; i < count; i++) {
		if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
		    !valid_device(desc[i].location.id))
			return refuse(CUDA_ERROR_INVALID_DEVICE, __func__, "location %d/%d",
				      (int)desc[i].location.type, desc[i].location.id);
		if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
		    desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
		    desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "flags %d",
				      (int)desc[i].flags);
	}
	pthread_mutex_lock(&fake.lock);
	n = whole_mappings(ptr, size, &r, maps, 64);
	for (size_t i = 0; i < n; i++)
		for (size_t k = 0; k < count; k++)
			maps[i]->access[desc[k].location.id] = (int)desc[k].flags;
	pthread_mutex_unlock(&fake.lock);
	/* Strict: part of a mapping is refused; the driver documents whole mapped ranges. */
	if (!n)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "%#llx (%zu bytes) is not whole "
			      "mappings", (unsigned long long)ptr, size);
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle,
						     CUmemGenericAllocationHandle handle,
						     CUmemAllocationHandleType handleType,
						     unsigned long long flags)
{
	struct phys *p;
	int fd = -1;

	API(__func__);
	if (!shareableHandle || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "handle type %d, flags %#llx",
			      (int)handleType, flags);
	pthread_mutex_lock(&fake.lock);
	p = phys_of(handle);
	/* A new fd the caller owns; like the driver's, not close-on-exec (the caller says so). */
	if (p)
		fd = fcntl(p->fd, F_DUPFD, 0);
	pthread_mutex_unlock(&fake.lock);
	if (!p)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "no such handle (released?)");
	if (fd < 0)
		return refuse(CUDA_ERROR_OUT_OF_MEMORY, __func__, "dup: %s", strerror(errno));
	*(int *)shareableHandle = fd;
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
						       void *osHandle,
						       CUmemAllocationHandleType shHandleType)
{
	const int fd = (int)(intptr_t)osHandle;
	char link[64], target[256];
	struct phys *p;
	struct stat st;
	ssize_t len;
	int device;

	API(__func__);
	if (!handle || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "handle type %d",
			      (int)shHandleType);
	/* Only what cuMemCreate exported is memory of a device: a memfd of the fake's name. */
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	len = readlink(link, target, sizeof(target) - 1);
	if (fd < 0 || fstat(fd, &st) < 0 || len < 0)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "fd %d: %s", fd, strerror(errno));
	target[len] = '\0';
	if (sscanf(target, "/memfd:" MEMFD_PREFIX "%d", &device) != 1 || !S_ISREG(st.st_mode) ||
	    st.st_size <= 0 || (uint64_t)st.st_size % GRANULARITY)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__,
			      "fd %d (%s, %lld bytes) is not a CUDA shareable handle", fd, target,
			      (long long)st.st_size);
	if (!valid_device(device))
		return refuse(CUDA_ERROR_NOT_SUPPORTED, __func__,
			      "the memory is on device %d, this process sees %d", device,
			      fake.devices);
	p = calloc(1, sizeof(*p));
	if (!p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	/* The caller keeps its fd (and may close it): the handle holds a copy of its own. */
	p->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	p->size = (uint64_t)st.st_size;
	p->view = p->fd < 0 ? MAP_FAILED :
			      mmap(NULL, p->size, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0);
	if (p->view == MAP_FAILED) {
		if (p->fd >= 0)
			close(p->fd);
		free(p);
		return refuse(CUDA_ERROR_OUT_OF_MEMORY, __func__, "mapping fd %d: %s", fd,
			      strerror(errno));
	}
	p->device = device;
	p->imported = true;
	p->handle = true;
	pthread_mutex_lock(&fake.lock);
	p->next = fake.phys;
	fake.phys = p;
	pthread_mutex_unlock(&fake.lock);
	*handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
							       CUmemGenericAllocationHandle handle)
{
	struct phys *p;
	int device = 0;

	API(__func__);
	if (!prop)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fake.lock);
	p = phys_of(handle);
	if (p)
		device = p->device;
	pthread_mutex_unlock(&fake.lock);
	if (!p)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "no such handle (released?)");
	memset(prop, 0, sizeof(*prop));
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = device;
	prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	return CUDA_SUCCESS;
}

/* ---- linear and pinned memory ------------------------------------------------------------- */

static size_t page_round(uint64_t n)
{
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);

	return (size_t)((n + page - 1) / page * page);
}

EXPORT CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
	struct CUctx_st *c;
	struct linear *l;
	size_t map_size;
	void *addr, *view;

	API_CTX(__func__, &c);
	if (!dptr || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	map_size = page_round(bytesize);
	pthread_mutex_lock(&fake.lock);
	if (fake.device_used[c->device] + bytesize > DEVICE_BYTES) {
		pthread_mutex_unlock(&fake.lock);
		return refuse(CUDA_ERROR_OUT_OF_MEMORY, __func__, "%zu bytes", bytesize);
	}
	fake.device_used[c->device] += bytesize;
	pthread_mutex_unlock(&fake.lock);
	/* The device address faults on the host, as on a GPU; the bytes are in view. */
	addr = mmap(NULL, map_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	view = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	l = calloc(1, sizeof(*l));
	if (addr == MAP_FAILED || view == MAP_FAILED || !l) {
		if (addr != MAP_FAILED)
			munmap(addr, map_size);
		if (view != MAP_FAILED)
			munmap(view, map_size);
		free(l);
		pthread_mutex_lock(&fake.lock);
		fake.device_used[c->device] -= bytesize;
		pthread_mutex_unlock(&fake.lock);
		return refuse(CUDA_ERROR_OUT_OF_MEMORY, __func__, "%zu bytes", bytesize);
	}
	fill_garbage(view, bytesize);
	*l = (struct linear){ .addr = (uintptr_t)addr, .size = bytesize, .map_size = map_size,
			      .view = view, .ctx = c };
	pthread_mutex_lock(&fake.lock);
	l->next = fake.linear;
	fake.linear = l;
	pthread_mutex_unlock(&fake.lock);
	*dptr = (CUdeviceptr)(uintptr_t)addr;
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemFree(CUdeviceptr dptr)
{
	struct linear **pl, *l = NULL;
	struct CUctx_st *c;

	API_CTX(__func__, &c);
	/*
	 * No implicit synchronization: the driver "may" wait for the device here, so code must
	 * not rely on it; work queued on the memory fails with an illegal address instead.
	 */
	pthread_rwlock_wrlock(&fake.mem);
	pthread_mutex_lock(&fake.lock);
	for (pl = &fake.linear; *pl; pl = &(*pl)->next)
		if ((*pl)->addr == dptr) {
			l = *pl;
			*pl = l->next;
			fake.device_used[l->ctx->device] -= l->size;
			munmap((void *)l->addr, l->map_size);
			munmap(l->view, l->map_size);
			free(l);
			break;
		}
	pthread_mutex_unlock(&fake.lock);
	pthread_rwlock_unlock(&fake.mem);
	if (!l)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "%#llx is not from cuMemAlloc",
			      (unsigned long long)dptr);
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	const unsigned known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
			       CU_MEMHOSTALLOC_WRITECOMBINED;
	struct hostmem *h;
	struct CUctx_st *c;
	size_t map_size;
	void *p;

	API_CTX(__func__, &c);
	if (!pp || bytesize == 0 || (Flags & ~known))
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "%zu bytes, flags %#x", bytesize,
			      Flags);
	map_size = page_round(bytesize);
	p = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	h = calloc(1, sizeof(*h));
	if (p == MAP_FAILED || !h) {
		if (p != MAP_FAILED)
			munmap(p, map_size);
		free(h);
		return refuse(CUDA_ERROR_OUT_OF_MEMORY, __func__, "%zu bytes", bytesize);
	}
	fill_garbage(p, bytesize);
	*h = (struct hostmem){ .addr = (uintptr_t)p, .size = bytesize, .map_size = map_size,
			       .flags = Flags, .ctx = c };
	pthread_mutex_lock(&fake.lock);
	h->next = fake.host;
	fake.host = h;
	pthread_mutex_unlock(&fake.lock);
	*pp = p;
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemFreeHost(void *p)
{
	struct hostmem **ph, *h = NULL;
	struct CUctx_st *c;

	API_CTX(__func__, &c);
	pthread_rwlock_wrlock(&fake.mem);
	pthread_mutex_lock(&fake.lock);
	for (ph = &fake.host; *ph; ph = &(*ph)->next)
		if ((*ph)->addr == (uintptr_t)p) {
			h = *ph;
			*ph = h->next;
			munmap(p, h->map_size);
			free(h);
			break;
		}
	pthread_mutex_unlock(&fake.lock);
	pthread_rwlock_unlock(&fake.mem);
	if (!h)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "%p is not from cuMemHostAlloc", p);
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
					      CUdeviceptr ptr)
{
	struct CUctx_st *c, *owner = NULL;
	uintptr_t start = 0;
	uint64_t size = 0;
	int device = -1;
	bool host = false;

	API_CTX(__func__, &c);
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fake.lock);
	for (struct reservation *r = fake.reservations; r && device < 0; r = r->next)
		for (struct mapping *m = r->maps; m; m = m->next)
			if (ptr >= m->addr && ptr < m->addr + m->size) {
				device = m->phys->device;
				start = m->addr;
				size = m->size;
			}
	for (struct linear *l = fake.linear; l && device < 0; l = l->next)
		if (ptr >= l->addr && ptr < l->addr + l->size) {
			owner = l->ctx;
			device = owner->device;
			start = l->addr;
			size = l->size;
		}
	for (struct hostmem *h = fake.host; h && device < 0; h = h->next)
		if (ptr >= h->addr && ptr < h->addr + h->size) {
			owner = h->ctx;
			device = owner->device;
			start = h->addr;
			size = h->size;
			host = true;
		}
	pthread_mutex_unlock(&fake.lock);
	if (device < 0)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "%#llx is not memory of the "
			      "driver's", (unsigned long long)ptr);
	switch (attribute) {
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = device;
		break;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned *)data = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
		break;
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = owner;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = (CUdeviceptr)start;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = (size_t)size;
		break;
	default:
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "attribute %d is not emulated",
			      (int)attribute);
	}
	return CUDA_SUCCESS;
}

/* ---- copies ------------------------------------------------------------------------------- */

/*
 * A copy's side, checked when it is issued: device memory the context's device may read (or
 * write), or host memory outside the device's address space.  0, or the refusal.
 */
static CUresult check_side(const char *fn, const char *side, struct CUctx_st *c, uintptr_t p,
			   uint64_t n, enum space space, bool write, bool async, bool *ret_pinned)
{
	bool ok, pinned = false;

	pthread_mutex_lock(&fake.lock);
	if (space == SPACE_DEVICE) {
		ok = device_range(p, n, c->device, false, write);
	} else {
		ok = !in_device_space(p, n);
		pinned = ok && pinned_for(p, n, c);
	}
	pthread_mutex_unlock(&fake.lock);
	if (!ok)
		return refuse(CUDA_ERROR_INVALID_VALUE, fn, "%s: %llu bytes at %#llx are not %s",
			      side, (unsigned long long)n, (unsigned long long)p,
			      space == SPACE_DEVICE ? "device memory (mapped, with access, of this "
						      "device)" : "host memory");
	if (space == SPACE_HOST && async && !pinned && n)
		atomic_fetch_add(&fake.pageable, 1);
	if (ret_pinned)
		*ret_pinned = pinned;
	return CUDA_SUCCESS;
}

static CUresult copy_async(const char *fn, uintptr_t dst, enum space ds, uintptr_t src,
			   enum space ss, uint64_t n, CUstream h)
{
	struct CUctx_st *c;
	struct op *op;
	CUresult r;

	API_CTX(fn, &c);
	op = op_new(OP_COPY);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->copy.dst = dst;
	op->copy.src = src;
	op->copy.n = n;
	op->copy.dst_space = ds;
	op->copy.src_space = ss;
	r = check_side(fn, "destination", c, dst, n, ds, true, true, &op->copy.dst_pinned);
	if (r == CUDA_SUCCESS)
		r = check_side(fn, "source", c, src, n, ss, false, true, &op->copy.src_pinned);
	if (r != CUDA_SUCCESS) {
		free(op);
		return r;
	}
	return enqueue(fn, h, c, op);
}

/* Unified addressing: where p is, for cuMemcpyAsync. */
static enum space space_of(uintptr_t p)
{
	bool dev;

	pthread_mutex_lock(&fake.lock);
	dev = in_device_space(p, 1);
	pthread_mutex_unlock(&fake.lock);
	return dev ? SPACE_DEVICE : SPACE_HOST;
}

EXPORT CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
				      CUstream hStream)
{
	return copy_async(__func__, dst, space_of(dst), src, space_of(src), ByteCount, hStream);
}

EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
					  size_t ByteCount, CUstream hStream)
{
	return copy_async(__func__, dstDevice, SPACE_DEVICE, srcDevice, SPACE_DEVICE, ByteCount,
			  hStream);
}

EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
					  CUstream hStream)
{
	return copy_async(__func__, (uintptr_t)dstHost, SPACE_HOST, srcDevice, SPACE_DEVICE,
			  ByteCount, hStream);
}

EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost,
					  size_t ByteCount, CUstream hStream)
{
	return copy_async(__func__, dstDevice, SPACE_DEVICE, (uintptr_t)srcHost, SPACE_HOST,
			  ByteCount, hStream);
}

/*
 * Done in the calling thread, after the context's blocking streams (legacy default stream
 * semantics).  The real driver may return from a copy out of pageable memory before the
 * device has the bytes; here the copy is complete on return.
 */
static CUresult copy_sync(const char *fn, uintptr_t dst, enum space ds, uintptr_t src,
			  enum space ss, uint64_t n)
{
	struct CUctx_st *c;
	CUresult r;

	API_CTX(fn, &c);
	wait_streams(c, true);
	pthread_rwlock_rdlock(&fake.mem);
	r = check_side(fn, "destination", c, dst, n, ds, true, false, NULL);
	if (r == CUDA_SUCCESS)
		r = check_side(fn, "source", c, src, n, ss, false, false, NULL);
	if (r == CUDA_SUCCESS)
		copy_bytes(dst, ds == SPACE_DEVICE, src, ss == SPACE_DEVICE, n, c->device, false);
	pthread_rwlock_unlock(&fake.mem);
	return r;
}

EXPORT CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	return copy_sync(__func__, (uintptr_t)dstHost, SPACE_HOST, srcDevice, SPACE_DEVICE,
			 ByteCount);
}

EXPORT CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	return copy_sync(__func__, dstDevice, SPACE_DEVICE, (uintptr_t)srcHost, SPACE_HOST,
			 ByteCount);
}

EXPORT CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
					CUstream hStream)
{
	struct CUctx_st *c;
	struct op *op;
	CUresult r;

	API_CTX(__func__, &c);
	r = check_side(__func__, "destination", c, dstDevice, N, SPACE_DEVICE, true, true, NULL);
	if (r != CUDA_SUCCESS)
		return r;
	op = op_new(OP_MEMSET);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->memset.dst = dstDevice;
	op->memset.value = uc;
	op->memset.n = N;
	return enqueue(__func__, hStream, c, op);
}

/* ---- streams ------------------------------------------------------------------------------ */

EXPORT CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	struct CUstream_st *s;
	struct CUctx_st *c;
	pthread_attr_t attr;
	pthread_t thread;
	int e;

	API_CTX(__func__, &c);
	if (!phStream || (Flags != CU_STREAM_DEFAULT && Flags != CU_STREAM_NON_BLOCKING))
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "flags %#x", Flags);
	s = calloc(1, sizeof(*s));
	if (!s)
		return CUDA_ERROR_OUT_OF_MEMORY;
	s->ctx = c;
	s->flags = Flags;
	s->generation = atomic_load(&c->generation);
	s->tail = &s->head;
	pthread_mutex_init(&s->m, NULL);
	pthread_cond_init(&s->cv, NULL);
	/*
	 * The thread inherits the caller's signal mask, as the driver's threads do: code that
	 * does not block its signals around driver calls gets threads that take them.
	 */
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_mutex_lock(&fake.lock);
	e = pthread_create(&thread, &attr, stream_worker, s);
	if (e == 0) {
		c->workers++;
		s->next = fake.streams;
		fake.streams = s;
	}
	pthread_mutex_unlock(&fake.lock);
	pthread_attr_destroy(&attr);
	if (e) {
		pthread_mutex_destroy(&s->m);
		pthread_cond_destroy(&s->cv);
		free(s);
		return refuse(CUDA_ERROR_OUT_OF_MEMORY, __func__, "pthread_create: %s", strerror(e));
	}
	*phStream = s;
	return CUDA_SUCCESS;
}

/* As documented: returns at once; the work queued still runs, then the stream goes. */
EXPORT CUresult CUDAAPI cuStreamDestroy(CUstream hStream)
{
	struct CUstream_st *s;
	struct CUctx_st *c;
	CUresult r;

	API_CTX(__func__, &c);
	pthread_mutex_lock(&fake.lock);
	r = stream_of(__func__, hStream, c, &s);
	if (r == CUDA_SUCCESS) {
		for (struct CUstream_st **ps = &fake.streams; *ps; ps = &(*ps)->next)
			if (*ps == s) {
				*ps = s->next;
				break;
			}
		pthread_mutex_lock(&s->m);
		s->destroyed = true;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->m);
	}
	pthread_mutex_unlock(&fake.lock);
	return r;
}

EXPORT CUresult CUDAAPI cuCtxSynchronize(void)
{
	struct CUctx_st *c;

	API_CTX(__func__, &c);
	wait_streams(c, false);
	return (CUresult)atomic_load(&c->sticky);
}

EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
	struct CUstream_st *s;
	struct CUctx_st *c;
	CUresult r;

	API_CTX(__func__, &c);
	pthread_mutex_lock(&fake.lock);
	r = stream_of(__func__, hStream, c, &s);
	if (r != CUDA_SUCCESS) {
		pthread_mutex_unlock(&fake.lock);
		return r;
	}
	stream_drain(s);
	return (CUresult)atomic_load(&c->sticky);
}

EXPORT CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
	struct CUstream_st *s;
	struct CUctx_st *c;
	bool busy;
	CUresult r;

	API_CTX(__func__, &c);
	pthread_mutex_lock(&fake.lock);
	r = stream_of(__func__, hStream, c, &s);
	if (r != CUDA_SUCCESS) {
		pthread_mutex_unlock(&fake.lock);
		return r;
	}
	pthread_mutex_lock(&s->m);
	busy = s->head != NULL;
	pthread_mutex_unlock(&s->m);
	pthread_mutex_unlock(&fake.lock);
	r = (CUresult)atomic_load(&c->sticky);
	if (r != CUDA_SUCCESS)
		return r;
	return busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

/*
 * Runs fn on the stream's thread after everything queued before it, never after an error in
 * the context (documented, unlike cuStreamAddCallback's callbacks).
 */
EXPORT CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
	struct CUctx_st *c;
	struct op *op;

	API_CTX(__func__, &c);
	if (!fn)
		return CUDA_ERROR_INVALID_VALUE;
	op = op_new(OP_HOST_FN);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->host.fn = fn;
	op->host.arg = userData;
	return enqueue(__func__, hStream, c, op);
}

/*
 * Runs callback on the stream's thread after everything queued before it, with CUDA_SUCCESS or
 * the context's error: unlike a host function's, it runs after an error too.  The same rule
 * holds inside it: no CUDA calls.
 */
EXPORT CUresult CUDAAPI cuStreamAddCallback(CUstream hStream, CUstreamCallback callback,
					    void *userData, unsigned int flags)
{
	struct CUctx_st *c;
	struct op *op;

	API_CTX(__func__, &c);
	if (!callback || flags)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "no callback, or flags %#x", flags);
	op = op_new(OP_CALLBACK);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->callback.fn = callback;
	op->callback.stream = hStream;
	op->callback.arg = userData;
	return enqueue(__func__, hStream, c, op);
}

/* ---- modules and launches ----------------------------------------------------------------- */

/* The fatbin container: a header, then entries each with a header of its own. */
struct fatbin_header {
	uint32_t magic;
	uint16_t version, header_size;
	uint64_t size;
};

struct fatbin_entry {
	uint16_t kind; /* 1 PTX, 2 ELF (SASS) */
	uint16_t unknown;
	uint32_t header_size;
	uint64_t size;
	uint32_t compressed_size, unknown2;
	uint16_t minor, major;
	uint32_t arch; /* sm_90: 90 */
};

#define FATBIN_MAGIC 0xba55ed50u
#define FATBIN_PTX 1
#define FATBIN_ELF 2

static bool contains(const uint8_t *image, uint64_t n, const char *s)
{
	return memmem(image, n, s, strlen(s) + 1) != NULL;
}

EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
	const uint8_t *bytes = image;
	struct fatbin_header h;
	struct CUmod_st *m;
	struct CUctx_st *c;
	bool runs = false;
	uint64_t at;

	API_CTX(__func__, &c);
	if (!module || !image)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(&h, image, sizeof(h));
	if (h.magic != FATBIN_MAGIC || h.version != 1 || h.header_size < sizeof(h) ||
	    h.size > (UINT64_C(1) << 30))
		return refuse(CUDA_ERROR_INVALID_IMAGE, __func__,
			      "not a fatbin (magic %#x, version %u)", h.magic, h.version);
	/* Code this device runs: sm_90 machine code, or PTX it can compile (up to compute_90). */
	for (at = h.header_size; at + sizeof(struct fatbin_entry) <= h.header_size + h.size;) {
		struct fatbin_entry e;

		memcpy(&e, bytes + at, sizeof(e));
		if (e.header_size < sizeof(e) || e.size > h.size)
			return refuse(CUDA_ERROR_INVALID_IMAGE, __func__, "a bad entry at %llu",
				      (unsigned long long)at);
		if ((e.kind == FATBIN_ELF && e.arch == CC_MAJOR * 10 + CC_MINOR) ||
		    (e.kind == FATBIN_PTX && e.arch <= CC_MAJOR * 10 + CC_MINOR))
			runs = true;
		at += e.header_size + e.size;
	}
	if (!runs)
		return refuse(CUDA_ERROR_NO_BINARY_FOR_GPU, __func__,
			      "no sm_%d%d code or PTX for it in the fatbin (NVCC_GENCODE)", CC_MAJOR,
			      CC_MINOR);
	m = calloc(1, sizeof(*m));
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	m->ctx = c;
	m->generation = atomic_load(&c->generation);
	for (int k = 0; k < KERNELS; k++) {
		m->has[k] = contains(bytes, h.header_size + h.size, kernel_names[k]);
		m->functions[k] = (struct CUfunc_st){ .module = m, .kernel = (enum kernel)k };
	}
	pthread_mutex_lock(&fake.lock);
	m->next = fake.modules;
	fake.modules = m;
	pthread_mutex_unlock(&fake.lock);
	*module = m;
	return CUDA_SUCCESS;
}

static struct CUmod_st *module_of(CUmodule h, const struct CUctx_st *c)
{
	for (struct CUmod_st *m = fake.modules; m; m = m->next)
		if (m == h && m->ctx == c)
			return m;
	return NULL;
}

EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
	struct CUmod_st **pm, *m = NULL;
	struct CUctx_st *c;

	API_CTX(__func__, &c);
	pthread_mutex_lock(&fake.lock);
	for (pm = &fake.modules; *pm; pm = &(*pm)->next)
		if (*pm == hmod && (*pm)->ctx == c) {
			m = *pm;
			*pm = m->next;
			free(m);
			break;
		}
	pthread_mutex_unlock(&fake.lock);
	if (!m)
		return refuse(CUDA_ERROR_INVALID_HANDLE, __func__, "no such module in the current "
			      "context");
	return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	struct CUmod_st *m;
	struct CUctx_st *c;
	CUresult r = CUDA_ERROR_NOT_FOUND;

	API_CTX(__func__, &c);
	if (!hfunc || !name)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fake.lock);
	m = module_of(hmod, c);
	for (int k = 0; m && k < KERNELS; k++)
		if (m->has[k] && !strcmp(name, kernel_names[k])) {
			*hfunc = &m->functions[k];
			r = CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&fake.lock);
	if (!m)
		return refuse(CUDA_ERROR_INVALID_HANDLE, __func__, "no such module in the current "
			      "context");
	if (r != CUDA_SUCCESS)
		return refuse(r, __func__, "%s: no such kernel emulated in the module", name);
	return r;
}

EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
				       unsigned int gridDimZ, unsigned int blockDimX,
				       unsigned int blockDimY, unsigned int blockDimZ,
				       unsigned int sharedMemBytes, CUstream hStream,
				       void **kernelParams, void **extra)
{
	const uint64_t threads = (uint64_t)blockDimX * blockDimY * blockDimZ;
	enum kernel kernel = KERNELS;
	struct CUctx_st *c;
	struct op *op;

	API_CTX(__func__, &c);
	pthread_mutex_lock(&fake.lock);
	for (struct CUmod_st *m = fake.modules; m; m = m->next)
		for (int k = 0; k < KERNELS; k++)
			if (f == &m->functions[k] && m->has[k] && m->ctx == c)
				kernel = (enum kernel)k;
	pthread_mutex_unlock(&fake.lock);
	if (kernel == KERNELS)
		return refuse(CUDA_ERROR_INVALID_HANDLE, __func__, "no such function in the current "
			      "context (module unloaded?)");
	if (!gridDimX || !gridDimY || !gridDimZ || gridDimX > INT_MAX || gridDimY > 65535 ||
	    gridDimZ > 65535 || !threads || blockDimX > 1024 || blockDimY > 1024 ||
	    blockDimZ > 64 || threads > 1024 || sharedMemBytes > SHARED_PER_BLOCK)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__,
			      "%s: grid %ux%ux%u, block %ux%ux%u, %u bytes shared: out of the "
			      "device's limits", kernel_names[kernel], gridDimX, gridDimY, gridDimZ,
			      blockDimX, blockDimY, blockDimZ, sharedMemBytes);
	/*
	 * The fake's own check of the kernel's index math: kvpd_copy_slots numbers warps from
	 * blockIdx.x * blockDim.x + threadIdx.x and lanes from threadIdx.x % 32, so a block of
	 * other than whole warps skips lanes (or, under 32 threads in all, loops for ever).  A
	 * device would not refuse the launch; it would copy the wrong bytes.
	 */
	if (kernel == KERNEL_COPY_SLOTS && blockDimX % 32)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__,
			      "kvpd_copy_slots with %u threads a block: not whole warps", blockDimX);
	if (!kernelParams || !kernelParams[0] || extra)
		return refuse(CUDA_ERROR_INVALID_VALUE, __func__,
			      "%s takes one parameter in kernelParams (extra is not emulated)",
			      kernel_names[kernel]);
	op = op_new(OP_KERNEL);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->kernel.kernel = kernel;
	/* The driver copies the parameters now: the caller's struct may go once this returns. */
	if (kernel == KERNEL_COPY_BLOCKS)
		memcpy(&op->kernel.args.blocks, kernelParams[0], sizeof(op->kernel.args.blocks));
	else
		memcpy(&op->kernel.args.slots, kernelParams[0], sizeof(op->kernel.args.slots));
	return enqueue(kernel == KERNEL_COPY_BLOCKS ? "kvpd_copy_blocks" : "kvpd_copy_slots",
		       hStream, c, op);
}

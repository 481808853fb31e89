/* SPDX-License-Identifier: MIT */
/* libkvpaged: connection, handshake and the synchronous calls over the socket. */
#include <dlfcn.h>
#include <stdbool.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "libclient/client-internal.h"
#include "proto/cleanup.h"

#define CLIENT_MAX_FRAME (64u << 20)

__attribute__((format(printf, 3, 4))) int client_fail(struct kvp_client *c, int r,
						      const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	return r < 0 ? r : -r;
}

KVP_EXPORT const char *kvp_last_error(const struct kvp_client *c)
{
	return c ? c->err : "no client";
}

KVP_EXPORT void kvp_table_free(struct kvp_table *t)
{
	if (!t)
		return;
	free(t->blocks);
	*t = (struct kvp_table){ 0 };
}

static int table_set(struct kvp_table *t, uint32_t from, const uint32_t *v, size_t n)
{
	if (!t)
		return 0;
	if (from > t->len || from + n > UINT32_MAX)
		return -EPROTO;
	if (n == 0) {
		t->len = from; /* an empty reply carries no array at all */
		return 0;
	}
	if (from + n > t->cap) {
		uint32_t cap = (uint32_t)(from + n) + 16;
		uint32_t *b = realloc(t->blocks, (size_t)cap * sizeof(*b));

		if (!b)
			return -ENOMEM;
		t->blocks = b;
		t->cap = cap;
	}
	memcpy(t->blocks + from, v, n * sizeof(*v));
	t->len = from + (uint32_t)n;
	return 0;
}

/* table_set for a reply's table: a failure says why in kvp_last_error(). */
static int reply_table(struct kvp_client *c, struct kvp_table *t, uint32_t from, const uint32_t *v,
		       size_t n)
{
	int r = table_set(t, from, v, n);

	if (r == -ENOMEM)
		return client_fail(c, r, "no memory for the reply's block table (%zu entries)",
				   (size_t)from + n);
	if (r < 0)
		return client_fail(c, r, "malformed reply from kvpaged: table of %zu entries from %u, "
				   "the caller's holds %u", n, from, t ? t->len : 0);
	return 0;
}

/* A table the library may write: NULL (not wanted), or zeroed / as the library left it. */
static bool table_ok(const struct kvp_table *t)
{
	return !t || (t->len <= t->cap && (t->blocks || !t->cap));
}

/*
 * Makes room for n entries in t without changing what it holds, so that a table_set(t, 0, ...,
 * n) after it cannot fail: the caller's tables are then written only once all of them can be.
 */
static int table_reserve(struct kvp_table *t, size_t n)
{
	uint32_t *b;

	if (!t || n <= t->cap)
		return 0;
	if (n > UINT32_MAX - 16)
		return -EPROTO;
	b = realloc(t->blocks, (n + 16) * sizeof(*b));
	if (!b)
		return -ENOMEM;
	t->blocks = b;
	t->cap = (uint32_t)n + 16;
	return 0;
}

/*
 * The argument checks of the entry points: -EINVAL instead of a NULL dereference.  With a
 * client, kvp_last_error() says which argument.
 */
#define CHECK_CLIENT(c)                                                                        \
	do {                                                                                   \
		if (!(c))                                                                      \
			return -EINVAL;                                                        \
	} while (0)
#define CHECK_ARG(c, cond, what)                                                               \
	do {                                                                                   \
		if (!(cond))                                                                   \
			return client_fail((c), -EINVAL, "%s: %s", __func__, (what));          \
	} while (0)

/*
 * One request/response exchange on the socket.  On success *ret holds the unpacked reply
 * (free it with protobuf_c_message_free_unpacked); an Error reply becomes -code with its
 * message in kvp_last_error().
 */
static int call(struct kvp_client *c, uint16_t type, const ProtobufCMessage *req,
		const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **ret,
		int *fds, unsigned max_fds, unsigned *nfds)
{
	uint32_t seq = ++c->next_seq;
	struct kvp_frame_header h;
	uint8_t *payload;
	unsigned got = 0;
	int r;

	if (c->fd < 0)
		return client_fail(c, -ENOTCONN, "not connected");
	r = kvp_frame_send(c->fd, type, seq, req, NULL, 0);
	if (r < 0 && r != -EPIPE && r != -ECONNRESET)
		return client_fail(c, r, "sending to kvpaged: %s", strerror(-r));
	/* Even when the daemon hung up on us, it may have said why first. */
	r = kvp_frame_recv(c->fd, CLIENT_MAX_FRAME, &h, &payload, fds, max_fds, &got);
	if (r < 0)
		return client_fail(c, r, "receiving from kvpaged: %s",
				   r == -ECONNRESET ? "the daemon closed the connection" : strerror(-r));
	if (h.seq != seq && h.type != KVPAGED__V1__MESSAGE_TYPE__ERROR) {
		r = client_fail(c, -EPROTO, "reply %u to request %u", h.seq, seq);
		goto out;
	}
	if (h.type == KVPAGED__V1__MESSAGE_TYPE__ERROR) {
		Kvpaged__V1__Error *e = kvpaged__v1__error__unpack(NULL, h.len, payload);

		if (!e || e->code <= 0) {
			r = client_fail(c, -EPROTO, "malformed error from kvpaged");
		} else {
			r = client_fail(c, -e->code, "%s", e->message);
		}
		if (e)
			kvpaged__v1__error__free_unpacked(e, NULL);
		goto out;
	}
	if (h.type != type + KVP_REPLY_OFFSET) {
		r = client_fail(c, -EPROTO, "unexpected reply type %u to %u", h.type, type);
		goto out;
	}
	*ret = protobuf_c_message_unpack(reply_desc, NULL, h.len, payload);
	if (!*ret) {
		r = client_fail(c, -EPROTO, "malformed reply from kvpaged");
		goto out;
	}
	if (nfds)
		*nfds = got;
	got = 0;
	c->err[0] = '\0';
	r = 0;
out:
	for (unsigned i = 0; i < got; i++)
		close(fds[i]);
	free(payload);
	return r;
}

#define CALL(c, TYPE, req, reply_type, reply)                                                 \
	call((c), KVPAGED__V1__MESSAGE_TYPE__##TYPE, &(req).base,                             \
	     &kvpaged__v1__##reply_type##__descriptor, (ProtobufCMessage **)&(reply), NULL, 0, NULL)

static void copy_str(char *dst, size_t n, const char *src)
{
	snprintf(dst, n, "%s", src ? src : "");
}

/*
 * The CUDA driver's values this file uses (cuda.h: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
 * CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE); the driver ABI keeps them.
 */
#define CU_HANDLE_POSIX_FD 1
#define CU_LOCATION_DEVICE 1
#define CU_ACCESS_READWRITE 3
#define CU_GRANULARITY_MINIMUM 0

/* CUmemLocation and CUmemAccessDesc. */
struct cu_location {
	int type, id;
};
struct cu_access {
	struct cu_location location;
	int flags;
};

static int cuda_fail(struct kvp_client *c, int cr, const char *what)
{
	const char *text = NULL;

	if (c->cuda.api.error_string)
		c->cuda.api.error_string(cr, &text);
	return client_fail(c, -EIO, "mapping the GPU pool: %s: %s (CUDA error %d)", what,
			   text ? text : "unknown error", cr);
}

static int cuda_resolve(struct kvp_client *c)
{
	static const struct {
		const char *name;
		size_t offset;
	} fns[] = {
#define FN(member, symbol) { symbol, offsetof(struct client_cuda_api, member) }
		FN(init, "cuInit"),
		FN(error_string, "cuGetErrorString"),
		FN(import, "cuMemImportFromShareableHandle"),
		FN(properties, "cuMemGetAllocationPropertiesFromHandle"),
		FN(granularity, "cuMemGetAllocationGranularity"),
		FN(ctx_retain, "cuDevicePrimaryCtxRetain"),
		FN(ctx_release, "cuDevicePrimaryCtxRelease_v2"),
		FN(ctx_push, "cuCtxPushCurrent_v2"),
		FN(ctx_pop, "cuCtxPopCurrent_v2"),
		FN(reserve, "cuMemAddressReserve"),
		FN(map, "cuMemMap"),
		FN(set_access, "cuMemSetAccess"),
		FN(unmap, "cuMemUnmap"),
		FN(address_free, "cuMemAddressFree"),
		FN(release, "cuMemRelease"),
#undef FN
	};

	/* Never closed: unloading a driver library that may have started threads is unsafe. */
	c->cuda.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!c->cuda.lib) {
		const char *e = dlerror();

		return client_fail(c, -ENOENT,
				   "the pool is in GPU memory, but the CUDA driver cannot be "
				   "loaded: %s", e ? e : "libcuda.so.1 not found");
	}
	for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
		void *f = dlsym(c->cuda.lib, fns[i].name);

		if (!f)
			return client_fail(c, -ENOSYS, "the CUDA driver lacks %s", fns[i].name);
		memcpy((char *)&c->cuda.api + fns[i].offset, &f, sizeof(f));
	}
	return 0;
}

/*
 * A pool in GPU memory: the fd is a CUDA shareable handle, imported and mapped into a range
 * of this process's device address space, on the device that holds it, in that device's
 * primary context (the one engines use, so the address is valid there).
 */
static int cuda_map(struct kvp_client *c)
{
	struct client_cuda *cu = &c->cuda;
	/* CUmemAllocationProp: only its location is read; the driver may write more than that. */
	union {
		struct {
			int type, handle_types;
			struct cu_location location;
		} head;
		unsigned char bytes[512];
		uint64_t align;
	} prop;
	struct cu_access access;
	size_t align = 0;
	void *ctx = NULL;
	int cr, r;

	r = cuda_resolve(c);
	if (r < 0)
		return r;
	cr = cu->api.init(0);
	if (cr)
		return cuda_fail(c, cr, "cuInit");
	cr = cu->api.import(&cu->handle, (void *)(intptr_t)c->pool_fd, CU_HANDLE_POSIX_FD);
	if (cr)
		return cuda_fail(c, cr, "cuMemImportFromShareableHandle");
	cu->have_handle = true;
	memset(&prop, 0, sizeof(prop));
	cr = cu->api.properties(&prop, cu->handle);
	if (cr)
		return cuda_fail(c, cr, "cuMemGetAllocationPropertiesFromHandle");
	if (prop.head.location.type != CU_LOCATION_DEVICE)
		return client_fail(c, -EPROTO, "the pool's memory is not on a GPU");
	cu->device = prop.head.location.id;
	cr = cu->api.ctx_retain(&ctx, cu->device);
	if (cr)
		return cuda_fail(c, cr, "cuDevicePrimaryCtxRetain");
	cu->ctx_retained = true;
	cr = cu->api.ctx_push(ctx);
	if (cr)
		return cuda_fail(c, cr, "cuCtxPushCurrent");
	cu->bytes = c->pool.pool_bytes;
	/*
	 * cuMemMap wants the address a multiple of the allocation's granularity; a reservation
	 * "aligned by default" is not documented to be one, so the alignment is asked for.
	 */
	cr = cu->api.granularity(&align, &prop, CU_GRANULARITY_MINIMUM);
	if (cr) {
		r = cuda_fail(c, cr, "cuMemGetAllocationGranularity");
		goto out;
	}
	cr = cu->api.reserve(&cu->ptr, cu->bytes, align, 0, 0);
	if (cr) {
		r = cuda_fail(c, cr, "cuMemAddressReserve");
		goto out;
	}
	cu->reserved = true;
	cr = cu->api.map(cu->ptr, cu->bytes, 0, cu->handle, 0);
	if (cr) {
		r = cuda_fail(c, cr, "cuMemMap");
		goto out;
	}
	cu->mapped = true;
	access = (struct cu_access){ .location = { CU_LOCATION_DEVICE, cu->device },
				     .flags = CU_ACCESS_READWRITE };
	cr = cu->api.set_access(cu->ptr, cu->bytes, &access, 1);
	if (cr)
		r = cuda_fail(c, cr, "cuMemSetAccess");
out:
	cu->api.ctx_pop(&ctx);
	return r;
}

/*
 * Threads the driver starts inherit the caller's signal mask: with every signal blocked, none
 * of them takes a signal the application meant for its own threads (or its signalfd).
 */
static int cuda_map_blocked(struct kvp_client *c)
{
	sigset_t all, old;
	int r;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	r = cuda_map(c);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return r;
}

static void cuda_unmap(struct kvp_client *c)
{
	struct client_cuda *cu = &c->cuda;
	void *ctx = NULL;

	if (!cu->lib)
		return;
	/* The driver may be gone (the process is exiting): then there is nothing to undo. */
	if (cu->ctx_retained && cu->api.ctx_retain(&ctx, cu->device) == 0) {
		cu->api.ctx_push(ctx);
		if (cu->mapped)
			cu->api.unmap(cu->ptr, cu->bytes);
		if (cu->reserved)
			cu->api.address_free(cu->ptr, cu->bytes);
		cu->api.ctx_pop(&ctx);
		cu->api.ctx_release(cu->device);
	}
	if (cu->have_handle)
		cu->api.release(cu->handle);
	if (cu->ctx_retained)
		cu->api.ctx_release(cu->device);
	*cu = (struct client_cuda){ 0 };
}

/* The public feature bits are the wire's (proto/frame.h), under the names engines build with. */
_Static_assert(KVP_FEATURE_RINGS == KVP_PROTO_FEATURE_RINGS, "feature: rings");
_Static_assert(KVP_FEATURE_WAIT == KVP_PROTO_FEATURE_WAIT, "feature: wait");
_Static_assert(KVP_FEATURE_PARK == KVP_PROTO_FEATURE_PARK, "feature: park");
_Static_assert(KVP_FEATURE_SINKS == KVP_PROTO_FEATURE_SINKS, "feature: sinks");
_Static_assert(KVP_FEATURE_H2O == KVP_PROTO_FEATURE_H2O, "feature: h2o");
_Static_assert(KVP_FEATURE_HOST_TIER == KVP_PROTO_FEATURE_HOST_TIER, "feature: host tier");
_Static_assert(KVP_FEATURE_FILE_TIER == KVP_PROTO_FEATURE_FILE_TIER, "feature: file tier");
_Static_assert(KVP_RETAIN_FULL == KVP_PROTO_RETAIN_FULL, "retention: full");
_Static_assert(KVP_RETAIN_SINKS == KVP_PROTO_RETAIN_SINKS, "retention: sinks");
_Static_assert(KVP_RETAIN_H2O == KVP_PROTO_RETAIN_H2O, "retention: h2o");

KVP_EXPORT uint32_t kvp_version(void)
{
	return KVP_VERSION_NUMBER;
}

static void welcome_freep(Kvpaged__V1__Welcome **w)
{
	if (*w)
		kvpaged__v1__welcome__free_unpacked(*w, NULL);
}

static void client_disconnectp(struct kvp_client **c)
{
	kvp_disconnect(*c);
}

/* The client goes away with its kvp_last_error(): hand the reason to the caller. */
static int connect_fail(const struct kvp_connect_options *o, const struct kvp_client *c, int r)
{
	if (o->error_buf && o->error_len)
		snprintf(o->error_buf, o->error_len, "%s", c->err[0] ? c->err : strerror(-r));
	return r;
}

KVP_EXPORT int kvp_connect(const struct kvp_connect_options *opts, struct kvp_client **ret)
{
	struct kvp_connect_options o = { 0 };
	Kvpaged__V1__Hello hello = KVPAGED__V1__HELLO__INIT;
	_cleanup_(welcome_freep) Kvpaged__V1__Welcome *w = NULL;
	_cleanup_(client_disconnectp) struct kvp_client *c = NULL;
	const char *path;
	int fds[4], r;
	unsigned nfds = 0;

	if (opts)
		memcpy(&o, opts, opts->size && opts->size < sizeof(o) ? opts->size : sizeof(o));
	if (!ret) {
		if (o.error_buf && o.error_len)
			snprintf(o.error_buf, o.error_len, "kvp_connect: ret is NULL");
		return -EINVAL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		if (o.error_buf && o.error_len)
			snprintf(o.error_buf, o.error_len, "kvp_connect: no memory for a client");
		return -ENOMEM;
	}
	c->fd = c->pool_fd = c->ring_fd = c->sq_efd = c->cq_efd = c->cq_epfd = -1;
	c->spin_us = o.spin_us;
	/*
	 * secure_getenv: a setuid or setgid program (or one with file capabilities) linking us
	 * must not be pointed at another daemon by whoever runs it.
	 */
	path = o.socket_path ? o.socket_path : secure_getenv("KVPAGED_SOCKET");
	if (!path || !*path)
		path = KVP_DEFAULT_SOCKET;
	c->fd = kvp_unix_connect(path);
	if (c->fd < 0) {
		r = client_fail(c, c->fd, "cannot connect to %s: %s", path, strerror(-c->fd));
		return connect_fail(&o, c, r);
	}
	hello.protocol_version = KVP_PROTOCOL_VERSION;
	hello.min_protocol_version = KVP_PROTOCOL_MIN_VERSION;
	hello.client_name = (char *)(o.client_name ? o.client_name : "");
	hello.pool = (char *)(o.pool ? o.pool : "");
	hello.namespace_ = (char *)(o.ns ? o.ns : "");
	hello.ring_entries = o.ring_entries;
	hello.ring_data_bytes = o.ring_data_bytes;
	r = call(c, KVPAGED__V1__MESSAGE_TYPE__HELLO, &hello.base, &kvpaged__v1__welcome__descriptor,
		 (ProtobufCMessage **)&w, fds, 4, &nfds);
	if (r < 0)
		return connect_fail(&o, c, r);
	if (w->protocol_version < KVP_PROTOCOL_MIN_VERSION ||
	    w->protocol_version > KVP_PROTOCOL_VERSION || !w->pool ||
	    nfds != (w->ring_entries ? 4u : 1u)) {
		for (unsigned i = 0; i < nfds; i++)
			close(fds[i]);
		r = client_fail(c, -EPROTO, "malformed Welcome");
		return connect_fail(&o, c, r);
	}
	c->pool_fd = fds[0];
	if (nfds == 4) {
		c->ring_fd = fds[1];
		c->sq_efd = fds[2];
		c->cq_efd = fds[3];
	}
	c->session_id = w->session_id;
	c->probe = (struct kvp_probe_info){
		.size = sizeof(c->probe),
		.protocol_version = w->protocol_version,
		.min_protocol_version = w->min_protocol_version,
		.max_protocol_version = w->max_protocol_version,
		.features = w->features,
		.opcodes = w->opcodes,
	};
	copy_str(c->ns, sizeof(c->ns), w->namespace_);
	copy_str(c->pool.name, sizeof(c->pool.name), w->pool->name);
	copy_str(c->pool.backend, sizeof(c->pool.backend), w->pool->backend);
	c->pool.layers = w->pool->layers;
	c->pool.kv_heads = w->pool->kv_heads;
	c->pool.head_dim = w->pool->head_dim;
	c->pool.element_bytes = w->pool->element_bytes;
	c->pool.block_tokens = w->pool->block_tokens;
	c->pool.capacity_blocks = w->pool->capacity_blocks;
	c->pool.max_seq_tokens = w->pool->max_seq_tokens;
	c->pool.vocab_size = w->pool->vocab_size;
	c->pool.bytes_per_token = w->pool->bytes_per_token;
	c->pool.block_bytes = w->pool->block_bytes;
	c->pool.pool_bytes = w->pool->pool_bytes;
	c->pool.block_stride = w->pool->block_stride;
	c->pool.layer_stride = w->pool->layer_stride;
	c->pool.kv_stride = w->pool->kv_stride;
	c->pool.slot_stride = w->pool->slot_stride;
	c->pool.head_stride = w->pool->head_stride;
	c->pool.window = w->pool->window;

	if (!strcmp(c->pool.backend, "cuda")) {
		r = cuda_map_blocked(c);
		if (r < 0)
			return connect_fail(&o, c, r);
	} else {
		c->pool_base = mmap(NULL, c->pool.pool_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
				    c->pool_fd, 0);
		if (c->pool_base == MAP_FAILED) {
			c->pool_base = NULL;
			r = client_fail(c, -errno, "cannot map the pool: %s", strerror(errno));
			return connect_fail(&o, c, r);
		}
	}
	if (c->ring_fd >= 0) {
		r = client_ring_init(c, w->ring_entries, w->ring_data_bytes, w->ring_bytes);
		if (r < 0)
			return connect_fail(&o, c, r);
	}
	c->err[0] = '\0';
	*ret = TAKE_PTR(c);
	return 0;
}

KVP_EXPORT struct kvp_client *kvp_disconnect(struct kvp_client *c)
{
	if (!c)
		return NULL;
	client_ring_done(c);
	cuda_unmap(c);
	if (c->pool_base)
		munmap(c->pool_base, c->pool.pool_bytes);
	if (c->pool_fd >= 0)
		close(c->pool_fd);
	if (c->fd >= 0)
		close(c->fd);
	free(c);
	return NULL;
}

KVP_EXPORT int kvp_probe(const struct kvp_client *c, struct kvp_probe_info *ret)
{
	/* 0.2.0's struct, the smallest a caller may pass; later fields are filled if there is room. */
	const uint32_t oldest = offsetof(struct kvp_probe_info, opcodes) + sizeof(ret->opcodes);
	struct kvp_probe_info p;

	if (!c || !ret)
		return -EINVAL;
	p = c->probe;
	if (ret->size < oldest)
		return -EINVAL;
	p.size = ret->size < sizeof(p) ? ret->size : (uint32_t)sizeof(p);
	memcpy(ret, &p, p.size);
	return 0;
}

KVP_EXPORT const struct kvp_pool_info *kvp_pool(const struct kvp_client *c)
{
	return c ? &c->pool : NULL;
}

KVP_EXPORT void *kvp_pool_base(const struct kvp_client *c)
{
	return c ? c->pool_base : NULL;
}

KVP_EXPORT uint64_t kvp_pool_device_ptr(const struct kvp_client *c)
{
	return c ? c->cuda.ptr : 0;
}

KVP_EXPORT int kvp_report_scores(struct kvp_client *c, uint64_t seq, uint32_t first,
				 const float *weights, uint32_t n)
{
	Kvpaged__V1__Scores req = KVPAGED__V1__SCORES__INIT;
	Kvpaged__V1__ScoresReply *rep;
	int r;

	CHECK_CLIENT(c);
	CHECK_ARG(c, weights || !n, "weights is NULL");
	req.seq = seq;
	req.first = first;
	req.weights = (float *)weights;
	req.n_weights = n;
	r = CALL(c, SCORES, req, scores_reply, rep);
	if (r < 0)
		return r;
	kvpaged__v1__scores_reply__free_unpacked(rep, NULL);
	return 0;
}

KVP_EXPORT void kvp_set_wait(struct kvp_client *c, uint32_t ms)
{
	if (c)
		c->wait_ms = ms;
}

KVP_EXPORT const char *kvp_namespace(const struct kvp_client *c)
{
	return c ? c->ns : NULL;
}

KVP_EXPORT int kvp_open(struct kvp_client *c, const uint32_t *tokens, uint32_t n,
			uint64_t extra_key, uint32_t flags, uint64_t *ret_seq, uint32_t *ret_cached,
			struct kvp_table *table)
{
	return kvp_open_retained(c, tokens, n, extra_key, flags, NULL, ret_seq, ret_cached, table);
}

/*
 * The daemon opened (or forked) seq but the caller cannot be told of it, the reply's table
 * having failed: close it, or it would hold its blocks until the client disconnects.  The
 * first failure stays in kvp_last_error().
 */
static void forget_seq(struct kvp_client *c, uint64_t seq)
{
	char why[sizeof(c->err)], closing[sizeof(c->err)];

	memcpy(why, c->err, sizeof(why));
	if (kvp_close(c, seq) == 0) {
		snprintf(c->err, sizeof(c->err), "%.200s (sequence %llu closed)", why,
			 (unsigned long long)seq);
		return;
	}
	memcpy(closing, c->err, sizeof(closing));
	snprintf(c->err, sizeof(c->err), "%.120s; closing sequence %llu: %.100s", why,
		 (unsigned long long)seq, closing);
}

KVP_EXPORT int kvp_open_retained(struct kvp_client *c, const uint32_t *tokens, uint32_t n,
				 uint64_t extra_key, uint32_t flags,
				 const struct kvp_retention *retention, uint64_t *ret_seq,
				 uint32_t *ret_cached, struct kvp_table *table)
{
	Kvpaged__V1__Open req = KVPAGED__V1__OPEN__INIT;
	Kvpaged__V1__OpenReply *rep;
	int r;

	CHECK_CLIENT(c);
	CHECK_ARG(c, tokens || !n, "tokens is NULL");
	CHECK_ARG(c, ret_seq, "ret_seq is NULL");
	CHECK_ARG(c, table_ok(table), "table is not a kvp_table the library filled");
	if (retention) {
		if (retention->size < sizeof(*retention))
			return client_fail(c, -EINVAL, "struct kvp_retention: size not set");
		req.retention = retention->policy;
		req.n_sink = retention->n_sink;
		req.recent = retention->recent;
		req.budget = retention->budget;
		req.granularity = retention->granularity;
		req.decay = retention->decay;
	}
	req.tokens = (uint32_t *)tokens;
	req.n_tokens = n;
	req.extra_key = extra_key;
	req.flags = flags & 0xff;
	req.priority = flags >> 8;
	req.wait_ms = c->wait_ms;
	r = CALL(c, OPEN, req, open_reply, rep);
	if (r < 0)
		return r;
	r = reply_table(c, table, 0, rep->table, rep->n_table);
	if (r == 0) {
		*ret_seq = rep->seq;
		if (ret_cached)
			*ret_cached = rep->cached_tokens;
	} else {
		forget_seq(c, rep->seq);
	}
	kvpaged__v1__open_reply__free_unpacked(rep, NULL);
	return r;
}

KVP_EXPORT int kvp_append(struct kvp_client *c, uint64_t seq, const uint32_t *tokens,
			  uint32_t n, struct kvp_table *table)
{
	Kvpaged__V1__Append req = KVPAGED__V1__APPEND__INIT;
	Kvpaged__V1__AppendReply *rep;
	int r;

	CHECK_CLIENT(c);
	CHECK_ARG(c, tokens || !n, "tokens is NULL");
	CHECK_ARG(c, table_ok(table), "table is not a kvp_table the library filled");
	req.seq = seq;
	req.tokens = (uint32_t *)tokens;
	req.n_tokens = n;
	req.wait_ms = c->wait_ms;
	r = CALL(c, APPEND, req, append_reply, rep);
	if (r < 0)
		return r;
	r = reply_table(c, table, rep->first_changed, rep->table, rep->n_table);
	kvpaged__v1__append_reply__free_unpacked(rep, NULL);
	return r;
}

KVP_EXPORT int kvp_commit(struct kvp_client *c, uint64_t seq, uint32_t ntokens,
			  struct kvp_table *table)
{
	Kvpaged__V1__Commit req = KVPAGED__V1__COMMIT__INIT;
	Kvpaged__V1__CommitReply *rep;
	int r;

	CHECK_CLIENT(c);
	CHECK_ARG(c, table_ok(table), "table is not a kvp_table the library filled");
	req.seq = seq;
	req.tokens = ntokens;
	r = CALL(c, COMMIT, req, commit_reply, rep);
	if (r < 0)
		return r;
	/* Replaced entries, or entries the retention policy released (holes now). */
	if ((rep->replaced || rep->released) && table)
		r = reply_table(c, table, 0, rep->table, rep->n_table);
	if (r == 0)
		r = (int)rep->replaced;
	kvpaged__v1__commit_reply__free_unpacked(rep, NULL);
	return r;
}

KVP_EXPORT int kvp_fork(struct kvp_client *c, uint64_t seq, uint64_t *ret_child,
			struct kvp_table *child_table)
{
	Kvpaged__V1__Fork req = KVPAGED__V1__FORK__INIT;
	Kvpaged__V1__ForkReply *rep;
	int r;

	CHECK_CLIENT(c);
	CHECK_ARG(c, ret_child, "ret_child is NULL");
	CHECK_ARG(c, table_ok(child_table), "child_table is not a kvp_table the library filled");
	req.seq = seq;
	r = CALL(c, FORK, req, fork_reply, rep);
	if (r < 0)
		return r;
	r = reply_table(c, child_table, 0, rep->table, rep->n_table);
	if (r == 0)
		*ret_child = rep->seq;
	else
		forget_seq(c, rep->seq);
	kvpaged__v1__fork_reply__free_unpacked(rep, NULL);
	return r;
}

KVP_EXPORT int kvp_close(struct kvp_client *c, uint64_t seq)
{
	Kvpaged__V1__Close req = KVPAGED__V1__CLOSE__INIT;
	Kvpaged__V1__CloseReply *rep;
	int r;

	CHECK_CLIENT(c);
	req.seq = seq;
	r = CALL(c, CLOSE, req, close_reply, rep);
	if (r < 0)
		return r;
	kvpaged__v1__close_reply__free_unpacked(rep, NULL);
	return 0;
}

KVP_EXPORT int kvp_lookup(struct kvp_client *c, const uint32_t *tokens, uint32_t n,
			  uint64_t extra_key, uint32_t flags, uint32_t *ret_cached)
{
	Kvpaged__V1__Lookup req = KVPAGED__V1__LOOKUP__INIT;
	Kvpaged__V1__LookupReply *rep;
	int r;

	CHECK_CLIENT(c);
	CHECK_ARG(c, tokens || !n, "tokens is NULL");
	CHECK_ARG(c, ret_cached, "ret_cached is NULL");
	req.tokens = (uint32_t *)tokens;
	req.n_tokens = n;
	req.extra_key = extra_key;
	req.flags = flags;
	r = CALL(c, LOOKUP, req, lookup_reply, rep);
	if (r < 0)
		return r;
	*ret_cached = rep->cached_tokens;
	kvpaged__v1__lookup_reply__free_unpacked(rep, NULL);
	return 0;
}

KVP_EXPORT int kvp_seq_info(struct kvp_client *c, uint64_t seq, uint32_t *ret_tokens,
			    uint32_t *ret_committed, struct kvp_table *table)
{
	Kvpaged__V1__SeqInfo req = KVPAGED__V1__SEQ_INFO__INIT;
	Kvpaged__V1__SeqInfoReply *rep;
	int r;

	CHECK_CLIENT(c);
	CHECK_ARG(c, table_ok(table), "table is not a kvp_table the library filled");
	req.seq = seq;
	r = CALL(c, SEQ_INFO, req, seq_info_reply, rep);
	if (r < 0)
		return r;
	r = reply_table(c, table, 0, rep->table, rep->n_table);
	if (r == 0) {
		if (ret_tokens)
			*ret_tokens = rep->tokens;
		if (ret_committed)
			*ret_committed = rep->committed;
	}
	kvpaged__v1__seq_info_reply__free_unpacked(rep, NULL);
	return r;
}

KVP_EXPORT int kvp_seq_packed(struct kvp_client *c, uint64_t seq, struct kvp_table *blocks,
			      struct kvp_table *positions)
{
	Kvpaged__V1__SeqInfo req = KVPAGED__V1__SEQ_INFO__INIT;
	Kvpaged__V1__SeqInfoReply *rep;
	int r;

	CHECK_CLIENT(c);
	CHECK_ARG(c, table_ok(blocks) && table_ok(positions),
		  "a table is not a kvp_table the library filled");
	req.seq = seq;
	r = CALL(c, SEQ_INFO, req, seq_info_reply, rep);
	if (r < 0)
		return r;
	/* Both tables replaced, or neither: room for both first. */
	r = table_reserve(blocks, rep->n_packed_table);
	if (r == 0)
		r = table_reserve(positions, rep->n_packed_positions);
	if (r == 0) {
		(void)table_set(blocks, 0, rep->packed_table, rep->n_packed_table);
		(void)table_set(positions, 0, rep->packed_positions, rep->n_packed_positions);
	}
	if (r < 0)
		client_fail(c, r, "no memory for the packed tables");
	kvpaged__v1__seq_info_reply__free_unpacked(rep, NULL);
	return r;
}

KVP_EXPORT int kvp_park(struct kvp_client *c, uint64_t seq)
{
	Kvpaged__V1__Park req = KVPAGED__V1__PARK__INIT;
	Kvpaged__V1__ParkReply *rep;
	int r;

	CHECK_CLIENT(c);
	req.seq = seq;
	r = CALL(c, PARK, req, park_reply, rep);
	if (r < 0)
		return r;
	kvpaged__v1__park_reply__free_unpacked(rep, NULL);
	return 0;
}

KVP_EXPORT int kvp_resume(struct kvp_client *c, uint64_t seq, uint32_t *ret_recompute,
			  struct kvp_table *table)
{
	Kvpaged__V1__Resume req = KVPAGED__V1__RESUME__INIT;
	Kvpaged__V1__ResumeReply *rep;
	int r;

	CHECK_CLIENT(c);
	CHECK_ARG(c, table_ok(table), "table is not a kvp_table the library filled");
	req.seq = seq;
	req.wait_ms = c->wait_ms;
	r = CALL(c, RESUME, req, resume_reply, rep);
	if (r < 0)
		return r;
	r = reply_table(c, table, 0, rep->table, rep->n_table);
	if (r == 0 && ret_recompute)
		*ret_recompute = rep->recompute_tokens;
	kvpaged__v1__resume_reply__free_unpacked(rep, NULL);
	return r;
}

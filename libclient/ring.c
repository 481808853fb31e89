/* SPDX-License-Identifier: MIT */
/*
 * libkvpaged's side of the shared-memory rings (proto/ring.h): submissions go straight into
 * shared memory and the doorbell is written only when the daemon sleeps; completions are
 * reaped by spinning briefly, then sleeping on the completion eventfd.  The data area is used
 * as a FIFO: each operation holds its input tokens and its output space until it is reaped.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "libclient/client-internal.h"

/*
 * The public names (kvpaged.h, the ABI engines are built against) and the ring's (proto/ring.h,
 * what the daemon reads) are two spellings of one thing: a value changed on one side only
 * does not build.
 */
#define SAME_OPCODE(name) _Static_assert((int)KVP_##name == (int)KVP_OP_##name, "opcode " #name)
SAME_OPCODE(NOP);
SAME_OPCODE(OPEN);
SAME_OPCODE(APPEND);
SAME_OPCODE(COMMIT);
SAME_OPCODE(FORK);
SAME_OPCODE(CLOSE);
SAME_OPCODE(LOOKUP);
SAME_OPCODE(SEQ_INFO);
SAME_OPCODE(PARK);
SAME_OPCODE(RESUME);
SAME_OPCODE(SCORES);
SAME_OPCODE(PACKED);
/* A new ring opcode needs its public name (and the reverse): the last of both must agree. */
_Static_assert((int)KVP_PACKED + 1 == (int)KVP_OP_MAX, "every ring opcode has a public name");
_Static_assert(KVP_OPEN_RECOMPUTE_LAST == KVP_RING_OPEN_RECOMPUTE_LAST, "open flag");
_Static_assert(KVP_OPEN_SINKS == KVP_RING_OPEN_SINKS, "open flag: sinks");
_Static_assert(KVP_OPEN_H2O == KVP_RING_OPEN_H2O, "open flag: h2o");
_Static_assert(KVP_OPEN_PRIORITY(1) == 1u << KVP_RING_OPEN_PRIORITY_SHIFT, "open priority");
_Static_assert(KVP_OPEN_PRIORITY(0xffffff) >> KVP_RING_OPEN_PRIORITY_SHIFT == 0xffffff &&
	       !(KVP_OPEN_PRIORITY(0xffffff) & KVP_RING_OPEN_FLAGS), "priority above the flags");
_Static_assert(KVP_SINKS(1, 2) == ((uint64_t)1 << 32 | 2), "sinks: n_sink << 32 | recent in seq");
_Static_assert(KVP_H2O(3, 4) == ((uint64_t)3 << 32 | 4), "h2o: budget << 32 | recent in seq");

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int client_ring_init(struct kvp_client *c, uint32_t entries, uint32_t data_bytes, uint64_t bytes)
{
	const struct kvp_ring_header *h;

	c->ring_mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->ring_fd, 0);
	if (c->ring_mem == MAP_FAILED) {
		c->ring_mem = NULL;
		return client_fail(c, -errno, "cannot map the rings");
	}
	c->ring_bytes = bytes;
	h = c->ring_mem;
	/* Trust, but check: a bad layout would make us scribble outside the mapping. */
	if (h->magic != KVP_RING_MAGIC || h->abi_version != KVP_RING_ABI_VERSION ||
	    h->sq_entries != entries || h->cq_entries != entries || !entries ||
	    (entries & (entries - 1)) || h->sqe_bytes != sizeof(struct kvp_sqe) ||
	    h->cqe_bytes != sizeof(struct kvp_cqe) || h->data_bytes != data_bytes ||
	    h->sq_off + sizeof(struct kvp_ring_indices) > bytes ||
	    h->cq_off + sizeof(struct kvp_ring_indices) > bytes ||
	    h->sqes_off + (uint64_t)entries * sizeof(struct kvp_sqe) > bytes ||
	    h->cqes_off + (uint64_t)entries * sizeof(struct kvp_cqe) > bytes ||
	    h->data_off + h->data_bytes > bytes)
		return client_fail(c, -EPROTO, "ring layout not understood (ABI %u)", h->abi_version);
	c->sq = (struct kvp_ring_indices *)((uint8_t *)c->ring_mem + h->sq_off);
	c->cq = (struct kvp_ring_indices *)((uint8_t *)c->ring_mem + h->cq_off);
	c->sqes = (struct kvp_sqe *)((uint8_t *)c->ring_mem + h->sqes_off);
	c->cqes = (struct kvp_cqe *)((uint8_t *)c->ring_mem + h->cqes_off);
	c->data = (uint8_t *)c->ring_mem + h->data_off;
	c->data_bytes = h->data_bytes;
	c->entries = entries;
	c->mask = entries - 1;
	c->slots = calloc(entries, sizeof(*c->slots));
	if (!c->slots)
		return client_fail(c, -ENOMEM, "out of memory");
	return 0;
}

void client_ring_done(struct kvp_client *c)
{
	if (c->ring_mem)
		munmap(c->ring_mem, c->ring_bytes);
	if (c->ring_fd >= 0)
		close(c->ring_fd);
	if (c->sq_efd >= 0)
		close(c->sq_efd);
	if (c->cq_efd >= 0)
		close(c->cq_efd);
	if (c->cq_epfd >= 0)
		close(c->cq_epfd);
	free(c->slots);
}

/* Reserves len bytes (a multiple of 4) of the data FIFO; returns the offset or -1 if full. */
static int64_t data_alloc(struct kvp_client *c, uint64_t len, uint32_t *ret_held)
{
	uint64_t pos, waste = 0;

	if (len > c->data_bytes)
		return -1;
	/* Empty: start over at the beginning, so any operation that fits the area fits now. */
	if (c->data_head == c->data_tail)
		c->data_head = c->data_tail = 0;
	if (len == 0) {
		*ret_held = 0;
		return 0;
	}
	pos = c->data_tail % c->data_bytes;
	if (pos + len > c->data_bytes) {
		waste = c->data_bytes - pos; /* never split an operation's bytes across the end */
		pos = 0;
	}
	if (c->data_tail - c->data_head + waste + len > c->data_bytes)
		return -1;
	c->data_tail += waste + len;
	*ret_held = (uint32_t)(waste + len);
	return (int64_t)pos;
}

KVP_EXPORT int kvp_submit(struct kvp_client *c, const struct kvp_op *ops, unsigned n)
{
	unsigned i;

	if (!c)
		return -EINVAL;
	if (!ops && n)
		return client_fail(c, -EINVAL, "kvp_submit: ops is NULL");
	if (!c->ring_mem)
		return client_fail(c, -ENOTSUP, "connected without rings");
	for (i = 0; i < n; i++) {
		const struct kvp_op *op = &ops[i];
		uint64_t in_len = (uint64_t)op->ntokens * sizeof(uint32_t);
		uint64_t out_len = (uint64_t)op->table_cap * sizeof(uint32_t);
		struct ring_slot *slot;
		struct kvp_sqe *e;
		uint32_t held = 0;
		int64_t off;

		/*
		 * A bad entry after good ones ends the batch there: the good ones are published
		 * below (the caller was told they were submitted), the bad one is refused by the
		 * next call, when it comes first.
		 */
		if (op->opcode >= KVP_OP_MAX) {
			if (i)
				break;
			return client_fail(c, -EINVAL, "unknown opcode %u", op->opcode);
		}
		if (!op->tokens && op->ntokens) {
			if (i)
				break;
			return client_fail(c, -EINVAL, "kvp_submit: tokens is NULL");
		}
		/* At most one ring's worth in flight, so the completion ring never overflows. */
		if (c->sq_tail - c->slot_head == c->entries)
			break;
		off = data_alloc(c, in_len + out_len, &held);
		if (off < 0) {
			if (in_len + out_len > c->data_bytes && i == 0)
				return client_fail(c, -E2BIG, "operation larger than the data area");
			break;
		}
		if (in_len)
			memcpy(c->data + off, op->tokens, in_len);
		slot = &c->slots[c->sq_tail & c->mask];
		*slot = (struct ring_slot){ .user_data = op->user_data, .table_out = op->table_out,
					    .table_cap = op->table_out ? op->table_cap : 0,
					    .data_len = held };
		e = &c->sqes[c->sq_tail & c->mask];
		*e = (struct kvp_sqe){
			.opcode = (uint8_t)op->opcode,
			.arg = op->arg,
			.user_data = c->sq_tail, /* our slot; the caller's user_data stays here */
			.seq = op->seq,
			.extra = op->extra_key,
			.in_off = (uint32_t)off,
			.in_len = (uint32_t)in_len,
			.out_off = (uint32_t)(off + (int64_t)in_len),
			.out_len = (uint32_t)out_len,
		};
		c->sq_tail++;
	}
	if (i == 0)
		return 0;
	/* Entries before the tail (release); then see whether the daemon sleeps. */
	kvp_ring_store_release(&c->sq->tail, c->sq_tail);
	kvp_ring_fence();
	if (kvp_ring_load_acquire(&c->sq->flags) & KVP_SQ_NEED_WAKEUP) {
		uint64_t one = 1;

		if (write(c->sq_efd, &one, sizeof(one)) < 0)
			return client_fail(c, -errno, "doorbell");
	}
	return (int)i;
}

/* Moves completions out of the ring; returns how many. */
static unsigned reap(struct kvp_client *c, struct kvp_completion *out, unsigned max)
{
	uint32_t tail = kvp_ring_load_acquire(&c->cq->tail);
	unsigned n = 0;

	while (c->cq_head != tail && n < max) {
		const struct kvp_cqe *e = &c->cqes[c->cq_head & c->mask];
		struct ring_slot *slot = &c->slots[e->user_data & c->mask];
		struct kvp_completion *o = &out[n++];
		uint32_t len = e->out_len / sizeof(uint32_t);

		*o = (struct kvp_completion){ .user_data = slot->user_data, .res = e->res,
					      .flags = e->flags & KVP_CQE_TRUNCATED ? KVP_COMPLETION_TRUNCATED : 0,
					      .value = e->value, .aux = e->aux };
		if (slot->table_out && len && len <= slot->table_cap) {
			/* The daemon wrote the table right after our input in this slot's bytes. */
			const struct kvp_sqe *s = &c->sqes[e->user_data & c->mask];

			memcpy(slot->table_out, c->data + s->out_off, (size_t)len * sizeof(uint32_t));
			o->table_len = len;
		}
		slot->done = true;
		c->cq_head++;
	}
	/* Only when something was reaped: a spinning client must not bounce the daemon's line. */
	if (n)
		kvp_ring_store_release(&c->cq->head, c->cq_head);
	/* Free data in submission order, as far as everything is reaped. */
	while (c->slot_head != c->sq_tail && c->slots[c->slot_head & c->mask].done) {
		struct ring_slot *slot = &c->slots[c->slot_head & c->mask];

		c->data_head += slot->data_len;
		slot->done = false;
		c->slot_head++;
	}
	return n;
}

KVP_EXPORT int kvp_complete(struct kvp_client *c, struct kvp_completion *out, unsigned max,
			    unsigned min, int timeout_ms)
{
	uint64_t start = now_us();
	unsigned got = 0;

	if (!c)
		return -EINVAL;
	if (!out && max)
		return client_fail(c, -EINVAL, "kvp_complete: out is NULL");
	if (!c->ring_mem)
		return client_fail(c, -ENOTSUP, "connected without rings");
	if (min > max)
		min = max;
	if (c->cq_armed) {
		uint64_t v;

		/*
		 * The event loop's wait is over: no more wake-ups until it arms again, and the one
		 * it had is read, so that a descriptor still watched stops polling readable.
		 */
		kvp_ring_store_release(&c->cq->flags, 0);
		c->cq_armed = false;
		(void)!read(c->cq_efd, &v, sizeof(v));
	}
	for (;;) {
		got += reap(c, out + got, max - got);
		if (got >= min)
			return (int)got;
		if (now_us() - start < c->spin_us)
			continue;

		/* Sleep: raise the flag, then look once more so a completion is never missed. */
		kvp_ring_store_release(&c->cq->flags, KVP_CQ_NEED_WAKEUP);
		kvp_ring_fence();
		if (kvp_ring_load_acquire(&c->cq->tail) == c->cq_head) {
			struct pollfd p[2] = { { .fd = c->cq_efd, .events = POLLIN },
					       { .fd = c->fd, .events = POLLIN } };
			int wait = -1, r;

			if (timeout_ms >= 0) {
				uint64_t spent = (now_us() - start) / 1000;

				if (spent >= (uint64_t)timeout_ms) {
					kvp_ring_store_release(&c->cq->flags, 0);
					return got ? (int)got : client_fail(c, -ETIMEDOUT, "timed out");
				}
				wait = timeout_ms - (int)spent;
			}
			r = poll(p, 2, wait);
			if (r < 0 && errno != EINTR) {
				kvp_ring_store_release(&c->cq->flags, 0);
				/* What was reaped is the caller's: a count, not lost to an error. */
				return got ? (int)got : client_fail(c, -errno, "poll");
			}
			if (p[0].revents & POLLIN) {
				uint64_t v;

				(void)!read(c->cq_efd, &v, sizeof(v));
			}
			/* The socket only speaks when the daemon drops us (an error frame or EOF). */
			if ((p[1].revents & (POLLIN | POLLHUP | POLLERR)) &&
			    kvp_ring_load_acquire(&c->cq->tail) == c->cq_head) {
				kvp_ring_store_release(&c->cq->flags, 0);
				return got ? (int)got :
					     client_fail(c, -ECONNRESET, "the daemon closed the session");
			}
		}
		kvp_ring_store_release(&c->cq->flags, 0);
	}
}

/*
 * An epoll set of the completion eventfd and the session's socket, level-triggered: readable
 * while the daemon's wake-up is unread or the daemon has closed the session.  One fd, so an
 * event loop watches one thing.
 */
KVP_EXPORT int kvp_completion_fd(struct kvp_client *c)
{
	struct epoll_event ev = { .events = EPOLLIN };
	int fd;

	if (!c)
		return -EINVAL;
	if (!c->ring_mem)
		return client_fail(c, -ENOTSUP, "connected without rings");
	if (c->cq_epfd >= 0)
		return c->cq_epfd;
	fd = epoll_create1(EPOLL_CLOEXEC);
	if (fd < 0)
		return client_fail(c, -errno, "epoll_create1");
	if (epoll_ctl(fd, EPOLL_CTL_ADD, c->cq_efd, &ev) < 0 ||
	    (ev.events = EPOLLIN | EPOLLRDHUP, epoll_ctl(fd, EPOLL_CTL_ADD, c->fd, &ev) < 0)) {
		int r = -errno;

		close(fd);
		return client_fail(c, r, "epoll_ctl");
	}
	c->cq_epfd = fd;
	return fd;
}

KVP_EXPORT int kvp_complete_arm(struct kvp_client *c)
{
	struct pollfd p;
	uint64_t v;

	if (!c)
		return -EINVAL;
	if (!c->ring_mem)
		return client_fail(c, -ENOTSUP, "connected without rings");
	/* A wake-up already read about (the eventfd is non-blocking): forget it. */
	(void)!read(c->cq_efd, &v, sizeof(v));
	/* As kvp_complete() before it sleeps: raise the flag, then look once more. */
	kvp_ring_store_release(&c->cq->flags, KVP_CQ_NEED_WAKEUP);
	kvp_ring_fence();
	if (kvp_ring_load_acquire(&c->cq->tail) != c->cq_head) {
		kvp_ring_store_release(&c->cq->flags, 0);
		c->cq_armed = false;
		return 1;
	}
	c->cq_armed = true;
	p = (struct pollfd){ .fd = c->fd, .events = POLLIN };
	if (poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)))
		return client_fail(c, -ECONNRESET, "the daemon closed the session");
	return 0;
}

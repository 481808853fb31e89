/* SPDX-License-Identifier: MIT */
/*
 * The daemon's side of the shared-memory rings (proto/ring.h).  Everything read from the
 * mapping is copied before it is looked at and checked after: the daemon keeps its own SQ head
 * and CQ tail, and a client whose tail runs ahead of its head, or whose entry points outside
 * the data area, gets an error frame and loses its session (and nothing else happens).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/server/server.h"
#include "proto/cleanup.h"
#include "proto/memfd.h"

#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

/* Where each part of the ring memory lies (proto/PROTOCOL.md). */
struct ring_layout {
	uint64_t sq_off, cq_off, sqes_off, cqes_off, data_off, bytes;
};

static void layout_of(uint32_t entries, uint32_t data_bytes, struct ring_layout *l)
{
	uint64_t off = ALIGN_UP(sizeof(struct kvp_ring_header), KVP_RING_CACHELINE);

	l->sq_off = off;
	off += sizeof(struct kvp_ring_indices);
	l->cq_off = off;
	off += sizeof(struct kvp_ring_indices);
	l->sqes_off = off;
	off += (uint64_t)entries * sizeof(struct kvp_sqe);
	l->cqes_off = off;
	off += (uint64_t)entries * sizeof(struct kvp_cqe);
	l->data_off = ALIGN_UP(off, KVP_RING_CACHELINE);
	l->bytes = ALIGN_UP(l->data_off + data_bytes, 4096);
}

uint64_t ring_bytes(uint32_t entries, uint32_t data_bytes)
{
	struct ring_layout l;

	layout_of(entries, data_bytes, &l);
	return sizeof(struct session_ring) + l.bytes;
}

/* A mapping ring_setup() unmaps unless it was handed on. */
struct ring_mapping {
	void *mem;
	uint64_t bytes;
};

static void ring_mapping_done(struct ring_mapping *m)
{
	if (m->mem)
		munmap(m->mem, m->bytes);
}

int ring_setup(struct session *s, uint32_t entries, uint32_t data_bytes)
{
	_cleanup_free_ struct session_ring *r = calloc(1, sizeof(*r));
	_cleanup_close_ int mem_fd = -EBADF, sq_event_fd = -EBADF, cq_event_fd = -EBADF;
	_cleanup_(ring_mapping_done) struct ring_mapping map = { 0 };
	uint64_t sq_off, cq_off, sqes_off, cqes_off, data_off;
	struct ring_layout l;
	char name[64];

	if (!r)
		return -ENOMEM;
	layout_of(entries, data_bytes, &l);
	sq_off = l.sq_off;
	cq_off = l.cq_off;
	sqes_off = l.sqes_off;
	cqes_off = l.cqes_off;
	data_off = l.data_off;
	r->bytes = l.bytes;

	snprintf(name, sizeof(name), "kvpaged-ring-%llu", (unsigned long long)s->id);
	mem_fd = memfd_new_sealable(name);
	if (mem_fd < 0)
		return mem_fd;
	if (ftruncate(mem_fd, (off_t)r->bytes) < 0 ||
	    fcntl(mem_fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0)
		return errno ? -errno : -ENOMEM;
	map.mem = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mem_fd, 0);
	if (map.mem == MAP_FAILED) {
		map.mem = NULL;
		return errno ? -errno : -ENOMEM;
	}
	map.bytes = r->bytes;
	sq_event_fd = eventfd(0, EFD_CLOEXEC);
	if (sq_event_fd < 0)
		return errno ? -errno : -ENOMEM;
	cq_event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (cq_event_fd < 0)
		return errno ? -errno : -ENOMEM;

	r->mem = TAKE_PTR(map.mem);
	r->mem_fd = TAKE_FD(mem_fd);
	r->sq_event_fd = TAKE_FD(sq_event_fd);
	r->cq_event_fd = TAKE_FD(cq_event_fd);
	r->hdr = r->mem;
	*r->hdr = (struct kvp_ring_header){
		.magic = KVP_RING_MAGIC,
		.abi_version = KVP_RING_ABI_VERSION,
		.header_bytes = sizeof(struct kvp_ring_header),
		.sq_entries = entries,
		.cq_entries = entries,
		.sqe_bytes = sizeof(struct kvp_sqe),
		.cqe_bytes = sizeof(struct kvp_cqe),
		.sq_off = sq_off,
		.cq_off = cq_off,
		.sqes_off = sqes_off,
		.cqes_off = cqes_off,
		.data_off = data_off,
		.data_bytes = data_bytes,
	};
	r->sq = (struct kvp_ring_indices *)((uint8_t *)r->mem + sq_off);
	r->cq = (struct kvp_ring_indices *)((uint8_t *)r->mem + cq_off);
	r->sqes = (struct kvp_sqe *)((uint8_t *)r->mem + sqes_off);
	r->cqes = (struct kvp_cqe *)((uint8_t *)r->mem + cqes_off);
	r->data = (uint8_t *)r->mem + data_off;
	r->entries = entries;
	r->mask = entries - 1;
	r->data_bytes = data_bytes;
	/* Until the first doorbell, the daemon sleeps: submitters must ring. */
	kvp_ring_store_release(&r->sq->flags, KVP_SQ_NEED_WAKEUP);
	r->doorbell_op = (struct op){ .kind = OP_DOORBELL, .s = s };
	s->ring = TAKE_PTR(r);
	s->nfds += 3;
	s->srv->session_fds += 3;
	account_bytes(s, (int64_t)ring_bytes(entries, data_bytes));
	ring_arm_doorbell(s);
	return 0;
}

/*
 * The doorbell is a multishot poll on the submission eventfd: every write by the client
 * completes it once more, and nothing needs re-arming or reading (the counter just grows;
 * it would take 2^64 doorbells to overflow).
 */
void ring_arm_doorbell(struct session *s)
{
	struct session_ring *r = s->ring;
	struct io_uring_sqe *sqe;

	if (!r || r->doorbell_armed || s->closing)
		return;
	sqe = server_sqe(s->srv);
	io_uring_prep_poll_multishot(sqe, r->sq_event_fd, POLLIN);
	io_uring_sqe_set_data(sqe, &r->doorbell_op);
	r->doorbell_armed = true;
	s->refs++;
}

void ring_destroy(struct session *s)
{
	struct session_ring *r = s->ring;

	if (!r || !r->doorbell_armed || r->doorbell_canceled)
		return;
	/* The pending poll holds the session; cancel it so the session can go. */
	struct io_uring_sqe *sqe = server_sqe(s->srv);

	io_uring_prep_cancel(sqe, &r->doorbell_op, 0);
	io_uring_sqe_set_data(sqe, NULL);
	r->doorbell_canceled = true;
}

/*
 * The ring's memory and fds go with the session's last reference, never before: a handler
 * that closed the session while working on its ring (a device failure, no memory for a
 * reply) still touches the ring on its way out, and the doorbell's poll holds a reference.
 */
void ring_free(struct session *s)
{
	struct session_ring *r = s->ring;

	if (!r)
		return;
	munmap(r->mem, r->bytes);
	close(r->mem_fd);
	close(r->sq_event_fd);
	close(r->cq_event_fd);
	free(r->scratch);
	account_bytes(s, -(int64_t)(sizeof(*r) + r->bytes + r->scratch_bytes));
	s->nfds -= 3;
	s->srv->session_fds -= 3;
	free(r);
	s->ring = NULL;
}

/* Checks that [off, off + len) lies in the data area. */
static bool in_data(const struct session_ring *r, uint32_t off, uint32_t len)
{
	return (uint64_t)off + len <= r->data_bytes;
}

/* Writes table entries to the entry's output space; marks truncation. */
static void put_table(struct session_ring *r, const struct kvp_sqe *e, struct kvp_cqe *c,
		      const uint32_t *table, uint32_t n)
{
	uint32_t fit = e->out_len / sizeof(uint32_t);

	if (fit < n) {
		c->flags |= KVP_CQE_TRUNCATED;
		n = fit;
	}
	memcpy(r->data + e->out_off, table, (size_t)n * sizeof(uint32_t));
	c->out_len = n * sizeof(uint32_t);
}

/*
 * Writes the position map, the packed blocks then their slots' positions, to the entry's
 * output space: all of it, or nothing and truncation marked (half a map is no map).
 */
static void put_packed(struct session_ring *r, const struct kvp_sqe *e, struct kvp_cqe *c,
		       const struct core_seq_info *info, uint32_t block_tokens)
{
	const uint32_t nblocks = (info->npacked + block_tokens - 1) / block_tokens;

	c->aux = nblocks;
	c->value = info->npacked;
	if ((uint64_t)e->out_len / sizeof(uint32_t) < (uint64_t)nblocks + info->npacked) {
		c->flags |= KVP_CQE_TRUNCATED;
		return;
	}
	/* A sequence with nothing packed has no arrays: memcpy from NULL is undefined, even of 0. */
	if (info->npacked) {
		memcpy(r->data + e->out_off, info->packed, (size_t)nblocks * sizeof(uint32_t));
		memcpy(r->data + e->out_off + (size_t)nblocks * sizeof(uint32_t),
		       info->packed_positions, (size_t)info->npacked * sizeof(uint32_t));
	}
	c->out_len = (nblocks + info->npacked) * sizeof(uint32_t);
}

/* Executes one copied, checked entry.  Returns false when the session must be closed. */
/*
 * The ring's copy of an entry's input, in_len bytes: NULL with *ret_err -EDQUOT or -ENOMEM
 * when it cannot grow.  It grows to the largest input seen (at most the data area), charged
 * to the session, and goes with the ring.
 */
static uint32_t *copy_in(struct session *s, const struct kvp_sqe *e, int *ret_err)
{
	struct session_ring *r = s->ring;
	const char *why;
	uint32_t *b;

	if (r->scratch_bytes < e->in_len) {
		if (account_check(s, e->in_len - r->scratch_bytes, 0, 0, &why) < 0) {
			*ret_err = -EDQUOT;
			return NULL;
		}
		b = realloc(r->scratch, e->in_len);
		if (!b) {
			*ret_err = -ENOMEM;
			return NULL;
		}
		account_bytes(s, (int64_t)(e->in_len - r->scratch_bytes));
		r->scratch = b;
		r->scratch_bytes = e->in_len;
	}
	memcpy(r->scratch, r->data + e->in_off, e->in_len);
	return r->scratch;
}

static bool execute(struct session *s, const struct kvp_sqe *e, struct kvp_cqe *c)
{
	struct session_ring *r = s->ring;
	const uint32_t ntok = e->in_len / sizeof(uint32_t);
	struct seq_result res = { 0 };
	const char *why = NULL;
	uint32_t *tokens = NULL;
	int rc = 0;

	if (e->opcode >= KVP_OP_MAX || e->flags || e->in_len % sizeof(uint32_t) ||
	    !in_data(r, e->in_off, e->in_len) || !in_data(r, e->out_off, e->out_len) ||
	    e->out_off % sizeof(uint32_t) || e->in_off % sizeof(uint32_t))
		return false;
	if (e->in_len) {
		/* Copy, then check: the client may rewrite the data area under us. */
		tokens = copy_in(s, e, &rc);
		if (!tokens) {
			c->res = rc;
			return true;
		}
	}
	c->user_data = e->user_data;
	switch (e->opcode) {
	case KVP_OP_NOP:
		break;
	case KVP_OP_OPEN: {
		const uint32_t retention = e->arg & KVP_RING_OPEN_RETENTION;
		/* Sinks: n_sink << 32 | recent in seq; h2o: budget << 32 | recent. */
		const struct core_open keep = {
			.retention = retention == KVP_RING_OPEN_SINKS ? CORE_RETAIN_SINKS
								      : CORE_RETAIN_H2O,
			.n_sink = retention == KVP_RING_OPEN_SINKS ? (uint32_t)(e->seq >> 32) : 0,
			.budget = retention == KVP_RING_OPEN_H2O ? (uint32_t)(e->seq >> 32) : 0,
			.recent = (uint32_t)e->seq,
		};

		if (retention == KVP_RING_OPEN_RETENTION) {
			rc = -EINVAL;
			break;
		}
		/* Ring operations never wait: not for memory, and not for swap-file reads.  The
		 * retention bits are taken here; any other unknown flag is refused by the core. */
		rc = ops_open(s, tokens, ntok, e->extra,
			      e->arg & KVP_RING_OPEN_FLAGS & ~KVP_RING_OPEN_RETENTION,
			      e->arg >> KVP_RING_OPEN_PRIORITY_SHIFT, retention ? &keep : NULL,
			      NULL, &res, &why);
		if (rc == 0) {
			c->value = res.seq;
			c->aux = res.cached;
			put_table(r, e, c, res.table, res.table_len);
		}
		break;
	}
	case KVP_OP_APPEND:
		rc = ops_append(s, e->seq, tokens, ntok, &res, &why);
		if (rc == 0) {
			c->aux = res.first_changed;
			put_table(r, e, c, res.table, res.table_len);
		}
		break;
	case KVP_OP_COMMIT:
		rc = ops_commit(s, e->seq, e->arg, &res, &why);
		if (rc == 0) {
			c->aux = res.replaced;
			c->value = res.released;
			if (res.replaced || res.released)
				put_table(r, e, c, res.table, res.table_len);
		}
		break;
	case KVP_OP_FORK:
		rc = ops_fork(s, e->seq, &res, &why);
		if (rc == 0) {
			c->value = res.seq;
			put_table(r, e, c, res.table, res.table_len);
		}
		break;
	case KVP_OP_CLOSE:
		rc = ops_close(s, e->seq, &why);
		break;
	case KVP_OP_LOOKUP:
		rc = ops_lookup(s, tokens, ntok, e->extra, e->arg, &c->aux, &why);
		break;
	case KVP_OP_PARK:
		rc = ops_park(s, e->seq, &why);
		break;
	case KVP_OP_SCORES:
		/* The weights were copied with the tokens: the same 4-byte words. */
		rc = ops_scores(s, e->seq, e->arg, (const float *)tokens, ntok, &why);
		break;
	case KVP_OP_RESUME:
		rc = ops_resume(s, e->seq, NULL, &res, &why);
		if (rc == 0) {
			c->aux = res.recompute;
			put_table(r, e, c, res.table, res.table_len);
		}
		break;
	case KVP_OP_SEQ_INFO: {
		struct core_seq_info info;

		rc = ops_info(s, e->seq, &info, &res.fence, &why);
		if (rc == 0) {
			c->value = (uint64_t)info.ntokens << 32 | info.ncommitted;
			put_table(r, e, c, info.table, info.nblocks);
		}
		break;
	}
	case KVP_OP_PACKED: {
		struct core_seq_info info;

		rc = ops_info(s, e->seq, &info, &res.fence, &why);
		if (rc == 0)
			put_packed(r, e, c, &info, s->pool->cfg->block_tokens);
		break;
	}
	}
	c->res = rc;
	/*
	 * A completion handing out blocks the pool's queue still works on waits for it, and the
	 * ones after it too (the tail shows entries in order).
	 */
	if (res.fence > r->held_fence)
		r->held_fence = res.fence;
	return true;
}

/*
 * Wakes a client sleeping on its completion eventfd.  The write goes on the io_uring, so it
 * rides on the io_uring_enter the loop makes next anyway (one syscall instead of two); the
 * fuzzer, which has no loop, writes directly.
 */
static void wake_client(struct session *s)
{
	static const uint64_t one = 1;
	struct io_uring_sqe *sqe;

	if (s->srv->ring.ring_fd <= 0) {
		(void)!write(s->ring->cq_event_fd, &one, sizeof(one));
		return;
	}
	sqe = server_sqe(s->srv);
	io_uring_prep_write(sqe, s->ring->cq_event_fd, &one, sizeof(one), 0);
	io_uring_sqe_set_data(sqe, NULL);
}

/* Consumes what the client submitted.  Returns false when the session must be closed. */
bool ring_process(struct session *s, const char **why)
{
	struct session_ring *r = s->ring;
	uint32_t tail, cq_head, posted = 0;

	tail = kvp_ring_load_acquire(&r->sq->tail);
	if (tail - r->sq_head > r->entries) {
		*why = "submission tail is more than the ring size ahead of its head";
		return false;
	}
	while (r->sq_head != tail && !s->closing) {
		struct kvp_sqe e;
		struct kvp_cqe c = { 0 };

		cq_head = kvp_ring_load_acquire(&r->cq->head);
		if (r->cq_tail - cq_head > r->entries) {
			*why = "completion head is not behind the daemon's tail";
			return false;
		}
		if (r->cq_tail - cq_head == r->entries) {
			/* Only a client with more operations in flight than the ring holds gets here. */
			*why = "more operations in flight than the completion ring holds";
			return false;
		}
		memcpy(&e, &r->sqes[r->sq_head & r->mask], sizeof(e));
		r->sq_head++;
		s->requests++;
		s->srv->requests++;
		c.user_data = e.user_data;
		if (!execute(s, &e, &c)) {
			*why = "entry with a bad opcode, flags, offset or length";
			return false;
		}
		r->cqes[r->cq_tail & r->mask] = c;
		r->cq_tail++;
		posted++;
	}
	if (posted)
		session_touch(s);
	kvp_ring_store_release(&r->sq->head, r->sq_head);
	if (posted || r->held_fence)
		ring_release(s);
	return true;
}

void ring_release(struct session *s)
{
	struct session_ring *r = s->ring;

	if (!r)
		return;
	if (r->held_fence) {
		if (!dpool_passed(s->pool, r->held_fence)) {
			if (s->pool->failed)
				session_close(s, "the pool's device failed");
			else
				session_hold(s);
			return;
		}
		r->held_fence = 0;
	}
	if (r->cq_published == r->cq_tail)
		return;
	/* Publish: entries before indices (release), so the client never sees a torn entry. */
	kvp_ring_store_release(&r->cq->tail, r->cq_tail);
	r->cq_published = r->cq_tail;
	/* Pairs with the client's flag store + fence before it sleeps. */
	kvp_ring_fence();
	if (kvp_ring_load_acquire(&r->cq->flags) & KVP_CQ_NEED_WAKEUP)
		wake_client(s);
}

/* Runs a ring until it is empty; closes the session on a protocol violation. */
static bool serve(struct session *s)
{
	const char *why = NULL;

	if (ring_process(s, &why))
		return true;
	session_reply_error(s, 0, EPROTO, "ring: %s", why);
	s->srv->refused[CLOSED_PROTOCOL]++;
	log_debug("session %llu (%s): ring: %s", (unsigned long long)s->id, s->name, why);
	session_close(s, "ring protocol violation");
	return false;
}

/*
 * Going to sleep on a ring: raise the flag, then look once more so that no submission made
 * before the client could see the flag is missed.  Returns false if there was one.
 */
static bool try_sleep(struct session_ring *r)
{
	kvp_ring_store_release(&r->sq->flags, KVP_SQ_NEED_WAKEUP);
	kvp_ring_fence();
	if (kvp_ring_load_acquire(&r->sq->tail) == r->sq_head)
		return true;
	kvp_ring_store_release(&r->sq->flags, 0);
	return false;
}

void ring_on_doorbell(struct session *s, struct io_uring_cqe *cqe)
{
	struct session_ring *r = s->ring;
	struct server *srv = s->srv;
	bool more = cqe->flags & IORING_CQE_F_MORE; /* the poll stays armed */

	if (!more)
		r->doorbell_armed = false;
	if (s->closing || cqe->res < 0) {
		if (!s->closing)
			session_close(s, "doorbell poll failed");
		goto out;
	}
	/* Awake: submitters need not ring while we drain. */
	kvp_ring_store_release(&r->sq->flags, 0);
	do {
		if (!serve(s))
			goto out;
	} while (!srv->cfg->ring_poll_us && !try_sleep(r));
	if (srv->cfg->ring_poll_us) {
		/* Keep the flag down and poll this ring from the loop for a while. */
		r->polled = true;
		srv->poll_until_ns = server_now_ns() + srv->cfg->ring_poll_us * 1000ull;
	}
	if (!more)
		ring_arm_doorbell(s); /* the kernel ended the multishot poll: start a new one */
out:
	if (!more)
		session_unref(s);
}

bool ring_poll_all(struct server *srv, bool expire)
{
	bool busy = false;

	for (struct session *s = srv->sessions, *next; s; s = next) {
		struct session_ring *r = s->ring;

		next = s->next;
		if (!r || !r->polled || s->closing)
			continue;
		if (kvp_ring_load_acquire(&r->sq->tail) != r->sq_head) {
			busy = true;
			s->refs++; /* serve() may close it; keep it alive for the loop */
			serve(s);
			session_unref(s);
		} else if (expire && try_sleep(r)) {
			r->polled = false;
		}
	}
	return busy;
}

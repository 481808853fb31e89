/* SPDX-License-Identifier: MIT */
/*
 * The host backend: a pool is one memfd, sealed so that no client can grow or shrink it under
 * the others (a shrink would SIGBUS every mapper), mapped shared by the daemon and by every
 * client of the pool.  Pages are allocated on first touch.  Copies and moves are memcpy.
 *
 * backend_host does each one inside the call: its ticket is complete when the call returns, and
 * done_fd never needs to wake anyone.  backend_host_threaded queues them to a helper thread of
 * the pool's, which runs them in order, counts them done and writes done_fd: the daemon's loop
 * goes on while a swap of many megabytes is copied.  The thread touches the pool's bytes and
 * its own queue only, never the daemon's state (DESIGN.md: "long host memcpy work may go to a
 * helper thread").
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/backend/backend.h"
#include "proto/cleanup.h"
#include "proto/memfd.h"

enum job_kind { JOB_BLOCKS, JOB_SLOTS, JOB_MOVE };

/*
 * A queued operation of the threaded backend, its list copied in, with a copy of the pool's
 * description (base and layout): the thread never reads the caller's struct.
 */
struct job {
	struct job *next;
	struct backend_pool pool;
	enum job_kind kind;
	enum backend_dir dir;
	uint32_t n;
	union {
		struct backend_block_copy blocks[1];
		struct backend_slot_copy slots[1];
		struct backend_move moves[1];
	} e; /* n entries */
};

struct host_state {
	uint64_t issued; /* the last ticket handed out */
	/* The threaded backend's (threaded false: none of it is used). */
	bool threaded;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t work, progress;
	struct job *head, *tail; /* head: running or next to run; popped once done */
	bool stop;
	_Atomic uint64_t done; /* tickets completed: written by the thread, under mu */
	/*
	 * The test hooks (threaded only, read at create by test_hooks_read(); a build without
	 * --enable-test-hooks has none, and these stay 0).
	 *
	 * $KVPAGED_TEST_COPY_DELAY_MS: the thread sleeps this long before each operation, so
	 * that tests meet the daemon's waits for the queue every time rather than when the
	 * scheduler happens to make them needed.
	 */
	unsigned delay_ms;
	/*
	 * $KVPAGED_TEST_COPY_FAIL_AT=N: the Nth operation fails as a device's stream does.  It
	 * and every later one never run and are never counted done, and done(), wait() and new
	 * operations return -EIO.  done_fd is not written again: the worst a device can do (a
	 * CUDA host function is skipped after an error; the CUDA module's stream callbacks do
	 * run, and the daemon's 100 ms check covers the rest).  For the daemon's handling of a
	 * device error, which no host can otherwise show.
	 */
	uint64_t fail_at, ran;
	int error; /* under mu */
	/*
	 * The pool's mapping, which the operations use.  $KVPAGED_TEST_DEVICE_POOL=1 keeps it
	 * from the caller (base NULL): the daemon then takes the paths of a pool on a device
	 * (staging, moves into a "pinned" host tier), which tests can run on a machine without
	 * one.
	 */
	void *base;
};

#ifdef KVPAGED_TEST_HOOKS
/* The threaded backend's test hooks (see struct host_state); whether to hide the mapping. */
static bool test_hooks_read(struct host_state *st)
{
	const char *delay = getenv("KVPAGED_TEST_COPY_DELAY_MS");
	const char *device = getenv("KVPAGED_TEST_DEVICE_POOL");
	const char *fail = getenv("KVPAGED_TEST_COPY_FAIL_AT");

	st->delay_ms = delay ? (unsigned)strtoul(delay, NULL, 10) : 0;
	st->fail_at = fail ? strtoull(fail, NULL, 10) : 0;
	return device && !strcmp(device, "1");
}
#else
static bool test_hooks_read(struct host_state *st)
{
	return false;
}
#endif

static void *worker(void *arg);

/* Host memory has no devices: device is ignored (the configuration refuses one but 0). */
static int create(const char *pool_name, uint64_t bytes, uint64_t block_bytes, bool threaded,
		  const struct backend_ops *ops, struct backend_pool *ret)
{
	_cleanup_free_ struct host_state *st = NULL;
	_cleanup_close_ int fd = -EBADF, done_fd = -EBADF;
	char name[96];
	bool hide = false;
	void *base;
	int r;

	if (bytes == 0 || block_bytes == 0 || bytes % block_bytes)
		return -EINVAL;
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (done_fd < 0)
		return -errno;
	snprintf(name, sizeof(name), "kvpaged-pool-%s", pool_name);
	fd = memfd_new_sealable(name);
	if (fd < 0)
		return fd;
	if (ftruncate(fd, (off_t)bytes) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0)
		return -errno;
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	if (base == MAP_FAILED)
		return -errno;
	st->base = base;
	if (threaded) {
		sigset_t all, saved;

		hide = test_hooks_read(st);
		st->threaded = true;
		pthread_mutex_init(&st->mu, NULL);
		pthread_cond_init(&st->work, NULL);
		pthread_cond_init(&st->progress, NULL);
		/* The daemon takes its signals through a signalfd: no thread of ours may take one. */
		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, &saved);
		r = -pthread_create(&st->thread, NULL, worker, st);
		pthread_sigmask(SIG_SETMASK, &saved, NULL);
		if (r < 0) {
			pthread_cond_destroy(&st->progress);
			pthread_cond_destroy(&st->work);
			pthread_mutex_destroy(&st->mu);
			munmap(base, bytes);
			return r;
		}
	}
	*ret = (struct backend_pool){ .ops = ops, .fd = TAKE_FD(fd), .base = base, .bytes = bytes,
				      .block_bytes = block_bytes, .done_fd = TAKE_FD(done_fd),
				      .priv = TAKE_PTR(st) };
	if (hide)
		ret->base = NULL;
	return 0;
}

static int host_create(const char *pool_name, uint64_t bytes, uint64_t block_bytes,
		       uint32_t device, struct backend_pool *ret)
{
	return create(pool_name, bytes, block_bytes, false, &backend_host, ret);
}

static int threaded_create(const char *pool_name, uint64_t bytes, uint64_t block_bytes,
			   uint32_t device, struct backend_pool *ret)
{
	return create(pool_name, bytes, block_bytes, true, &backend_host_threaded, ret);
}

static void host_destroy(struct backend_pool *p)
{
	struct host_state *st = p->priv;

	if (st && st->threaded) {
		/* The thread runs what is queued, then ends. */
		pthread_mutex_lock(&st->mu);
		st->stop = true;
		pthread_cond_signal(&st->work);
		pthread_mutex_unlock(&st->mu);
		pthread_join(st->thread, NULL);
		while (st->head) { /* what a failure left unrun */
			struct job *j = st->head;

			st->head = j->next;
			free(j);
		}
		pthread_cond_destroy(&st->progress);
		pthread_cond_destroy(&st->work);
		pthread_mutex_destroy(&st->mu);
	}
	if (st ? st->base : p->base)
		munmap(st ? st->base : p->base, p->bytes);
	if (p->fd >= 0)
		close(p->fd);
	if (p->done_fd >= 0)
		close(p->done_fd);
	free(p->priv);
	p->base = NULL;
	p->priv = NULL;
	p->fd = p->done_fd = -1;
}

static void copy_block(const struct backend_pool *p, uint32_t dst, uint32_t src)
{
	unsigned char *base = p->base;

	memcpy(base + (uint64_t)dst * p->block_bytes, base + (uint64_t)src * p->block_bytes,
	       p->block_bytes);
}

/* Per layer, the slot's K then its V: 2 * layers copies of slot_stride bytes. */
static void copy_slot(const struct backend_pool *p, const struct backend_slot_copy *c)
{
	uint8_t *d = (uint8_t *)p->base + (uint64_t)c->dst * p->block_bytes +
		     c->dst_slot * p->slot_stride;
	const uint8_t *s = (const uint8_t *)p->base + (uint64_t)c->src * p->block_bytes +
			   c->src_slot * p->slot_stride;

	for (uint32_t l = 0; l < p->layers; l++)
		for (uint32_t kv = 0; kv < 2; kv++) {
			uint64_t off = l * p->layer_stride + kv * p->kv_stride;

			memcpy(d + off, s + off, p->slot_stride);
		}
}

static void move_block(const struct backend_pool *p, enum backend_dir dir,
		       const struct backend_move *m)
{
	uint8_t *block = (uint8_t *)p->base + (uint64_t)m->block * p->block_bytes;

	if (dir == BACKEND_TO_HOST)
		memcpy(m->host, block, p->block_bytes);
	else
		memcpy(block, m->host, p->block_bytes);
}

/* Runs an operation's n entries of list (of the kind's type). */
static void run(const struct backend_pool *p, enum job_kind kind, enum backend_dir dir,
		const void *list, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		switch (kind) {
		case JOB_BLOCKS: {
			const struct backend_block_copy *c = list;

			copy_block(p, c[i].dst, c[i].src);
			break;
		}
		case JOB_SLOTS:
			copy_slot(p, (const struct backend_slot_copy *)list + i);
			break;
		case JOB_MOVE:
			move_block(p, dir, (const struct backend_move *)list + i);
			break;
		}
}

static void *worker(void *arg)
{
	struct host_state *st = arg;

	pthread_mutex_lock(&st->mu);
	for (;;) {
		struct job *j;
		int fd;

		while ((!st->head || st->error) && !st->stop)
			pthread_cond_wait(&st->work, &st->mu);
		if (!st->head || st->error)
			break; /* stopping, and nothing is left (or nothing will run again) */
		j = st->head;
		pthread_mutex_unlock(&st->mu);
		if (st->delay_ms)
			usleep(st->delay_ms * 1000u);
		if (st->fail_at && ++st->ran == st->fail_at) {
			pthread_mutex_lock(&st->mu);
			st->error = -EIO; /* the test hook's device error: see fail_at */
			pthread_cond_broadcast(&st->progress);
			continue;
		}
		run(&j->pool, j->kind, j->dir, &j->e, j->n);
		fd = j->pool.done_fd;
		pthread_mutex_lock(&st->mu);
		st->head = j->next;
		if (!st->head)
			st->tail = NULL;
		atomic_store_explicit(&st->done,
				      atomic_load_explicit(&st->done, memory_order_relaxed) + 1,
				      memory_order_release);
		pthread_cond_broadcast(&st->progress);
		free(j);
		/* After the count: a loop woken by it reads the count, never one behind it. */
		(void)eventfd_write(fd, 1);
	}
	pthread_mutex_unlock(&st->mu);
	return NULL;
}

static size_t entry_size(enum job_kind kind)
{
	return kind == JOB_BLOCKS ? sizeof(struct backend_block_copy)
	       : kind == JOB_SLOTS ? sizeof(struct backend_slot_copy)
				   : sizeof(struct backend_move);
}

/* Checks, then runs (backend_host) or queues (backend_host_threaded) one operation. */
static int submit(struct backend_pool *p, enum job_kind kind, enum backend_dir dir,
		  const void *list, uint32_t n, uint64_t *ret_ticket)
{
	struct host_state *st = p->priv;
	const uint64_t nblocks = p->bytes / p->block_bytes;
	struct backend_pool mine = *p; /* with the mapping, which the caller may not have */
	struct job *j;

	mine.base = st->base;
	for (uint32_t i = 0; i < n; i++) {
		bool bad;

		switch (kind) {
		case JOB_BLOCKS: {
			const struct backend_block_copy *c = (const struct backend_block_copy *)list + i;

			bad = c->dst >= nblocks || c->src >= nblocks;
			break;
		}
		case JOB_SLOTS: {
			const struct backend_slot_copy *c = (const struct backend_slot_copy *)list + i;

			bad = c->dst >= nblocks || c->src >= nblocks ||
			      (uint64_t)c->dst_slot * p->slot_stride >= p->kv_stride ||
			      (uint64_t)c->src_slot * p->slot_stride >= p->kv_stride;
			break;
		}
		default: {
			const struct backend_move *m = (const struct backend_move *)list + i;

			bad = m->block >= nblocks || !m->host ||
			      (dir != BACKEND_TO_HOST && dir != BACKEND_FROM_HOST);
			break;
		}
		}
		if (bad)
			return -EINVAL;
	}
	*ret_ticket = 0;
	if (st->threaded && st->fail_at) {
		int error;

		pthread_mutex_lock(&st->mu);
		error = st->error;
		pthread_mutex_unlock(&st->mu);
		if (error)
			return error;
	}
	if (n == 0)
		return 0;
	if (!st->threaded) {
		run(&mine, kind, dir, list, n);
		*ret_ticket = ++st->issued;
		return 0;
	}
	/* At least the whole struct: e's declared entry is part of it. */
	j = malloc(offsetof(struct job, e) + (size_t)n * entry_size(kind) + sizeof(j->e));
	if (!j) {
		/* No memory to queue it: it runs here, in its turn, once the thread is idle. */
		pthread_mutex_lock(&st->mu);
		while (st->head && !st->error)
			pthread_cond_wait(&st->progress, &st->mu);
		if (st->error) {
			int error = st->error;

			pthread_mutex_unlock(&st->mu);
			return error;
		}
		run(&mine, kind, dir, list, n);
		*ret_ticket = ++st->issued;
		atomic_store_explicit(&st->done, st->issued, memory_order_release);
		pthread_cond_broadcast(&st->progress);
		pthread_mutex_unlock(&st->mu);
		return 0;
	}
	j->next = NULL;
	j->pool = mine;
	j->kind = kind;
	j->dir = dir;
	j->n = n;
	memcpy(&j->e, list, (size_t)n * entry_size(kind));
	pthread_mutex_lock(&st->mu);
	if (st->tail)
		st->tail->next = j;
	else
		st->head = j;
	st->tail = j;
	pthread_cond_signal(&st->work);
	pthread_mutex_unlock(&st->mu);
	*ret_ticket = ++st->issued;
	return 0;
}

static int host_copy_blocks(struct backend_pool *p, const struct backend_block_copy *c,
			    uint32_t n, uint64_t *ret_ticket)
{
	return submit(p, JOB_BLOCKS, BACKEND_TO_HOST, c, n, ret_ticket);
}

static int host_copy_slots(struct backend_pool *p, const struct backend_slot_copy *c, uint32_t n,
			   uint64_t *ret_ticket)
{
	return submit(p, JOB_SLOTS, BACKEND_TO_HOST, c, n, ret_ticket);
}

static int host_move(struct backend_pool *p, enum backend_dir dir, const struct backend_move *m,
		     uint32_t n, uint64_t *ret_ticket)
{
	return submit(p, JOB_MOVE, dir, m, n, ret_ticket);
}

static int host_done(struct backend_pool *p, uint64_t *ret_ticket)
{
	struct host_state *st = p->priv;
	int error = 0;

	*ret_ticket = st->threaded ? atomic_load_explicit(&st->done, memory_order_acquire)
				   : st->issued;
	if (st->threaded && st->fail_at && *ret_ticket < st->issued) {
		pthread_mutex_lock(&st->mu);
		error = st->error;
		pthread_mutex_unlock(&st->mu);
	}
	return error;
}

static int host_wait(struct backend_pool *p, uint64_t ticket)
{
	struct host_state *st = p->priv;
	int r;

	if (!st->threaded || atomic_load_explicit(&st->done, memory_order_acquire) >= ticket)
		return ticket <= st->issued ? 0 : -EINVAL;
	if (ticket > st->issued)
		return -EINVAL;
	pthread_mutex_lock(&st->mu);
	while (atomic_load_explicit(&st->done, memory_order_relaxed) < ticket && !st->error)
		pthread_cond_wait(&st->progress, &st->mu);
	r = atomic_load_explicit(&st->done, memory_order_relaxed) < ticket ? st->error : 0;
	pthread_mutex_unlock(&st->mu);
	return r;
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

const struct backend_ops backend_host = {
	.name = "host",
	.create = host_create,
	.destroy = host_destroy,
	.copy_blocks = host_copy_blocks,
	.copy_slots = host_copy_slots,
	.move = host_move,
	.done = host_done,
	.wait = host_wait,
	.host_alloc = host_host_alloc,
	.host_free = host_host_free,
};

const struct backend_ops backend_host_threaded = {
	.name = "host",
	.create = threaded_create,
	.destroy = host_destroy,
	.copy_blocks = host_copy_blocks,
	.copy_slots = host_copy_slots,
	.move = host_move,
	.done = host_done,
	.wait = host_wait,
	.host_alloc = host_host_alloc,
	.host_free = host_host_free,
};

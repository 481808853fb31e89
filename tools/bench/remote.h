/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-bench against a running daemon: a connection that makes each sequence call through
 * the socket or through the rings (one operation submitted, then completed), the admin queries
 * the replay reads evictions with, and forked client processes that start together.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "libclient/include/kvpaged.h"

/* No daemon call of the bench takes this long unless the daemon is stuck. */
#define REMOTE_TIMEOUT_MS 30000

struct remote_options {
	const char *socket;
	const char *ns;           /* narrows the namespace (NULL: none) */
	bool ring;                /* calls go through the rings */
	uint32_t ring_entries;    /* with ring: a power of two */
	uint32_t ring_data_bytes; /* with ring: room for the largest operation, twice */
	uint32_t spin_us;         /* with ring: kvp_complete spins this long before sleeping */
	uint32_t max_blocks;      /* with ring: the longest table a completion may carry */
};

/* One client's connection to the daemon (not the remote tier's struct remote). */
struct remote_conn {
	struct kvp_client *c;
	bool ring;
	struct kvp_table table; /* what the socket calls return */
	uint32_t *ring_table;   /* where ring completions put theirs */
	uint32_t ring_table_cap;
};

/* Connects; on failure prints why (prefixed by who) and returns -errno. */
int remote_connect(struct remote_conn *k, const struct remote_options *o, const char *who);
void remote_disconnect(struct remote_conn *k);

/* Sequence calls, through the socket or the rings as connected.  0 (or >= 0) or -errno. */
int remote_open(struct remote_conn *k, const uint32_t *tokens, uint32_t n, uint64_t *ret_seq,
		uint32_t *ret_cached);
int remote_commit(struct remote_conn *k, uint64_t seq, uint32_t ntokens);
int remote_append(struct remote_conn *k, uint64_t seq, const uint32_t *tokens, uint32_t n);
int remote_close(struct remote_conn *k, uint64_t seq);

/* One operation through the rings: submits it and waits for its completion; returns its res. */
int remote_ring_call(struct kvp_client *c, const struct kvp_op *op, struct kvp_completion *ret);

/* The smallest power of two >= x (x <= 2^31). */
uint32_t pow2_at_least(uint32_t x);

/* A pool's counters as the admin socket reports them. */
struct admin_pool {
	uint64_t query_blocks, hit_blocks, evictions, collisions;
	uint32_t free, cached, in_use, sequences;
	bool value; /* eviction = value */
};

/* ADMIN_STATS and ADMIN_POOLS for one pool; prints why and returns -errno on failure. */
int admin_pool_query(const char *admin_socket, const char *pool, struct admin_pool *ret);

/* A pool's remote tier as the admin socket reports it (docs/remote.md). */
struct admin_remote {
	bool present; /* the pool has a remote tier; the rest is zero otherwise */
	uint32_t inflight;
	uint64_t fetches, fetches_busy, hits, misses; /* misses: every reason */
	uint64_t stores_ok, stores_dropped, stores_failed;
};

/* ADMIN_STATS for one pool's remote tier; prints why and returns -errno on failure. */
int admin_remote_query(const char *admin_socket, const char *pool, struct admin_remote *ret);

/*
 * Client processes.  Each child runs fn(idx, ctx, io): it connects, says it is ready (or why
 * not) with worker_ready(), which returns once every child is ready and the parent said go, then
 * works and sends its result with worker_send().  Children are killed if the parent dies.
 */
struct worker_io {
	int result_fd, go_fd;
};

typedef int (*worker_fn)(uint32_t idx, void *ctx, struct worker_io *io);

struct workers {
	uint32_t n;
	pid_t *pids;
	int *result_fds; /* read ends, one per child */
	int go_fd;       /* write end of the start pipe: closing it says go */
	uint64_t start_ns;
};

int worker_ready(struct worker_io *io, int error);
int worker_send(struct worker_io *io, const void *buf, size_t len);

/* Forks n children running fn; returns 0 or -errno (no child is left running then). */
int workers_spawn(struct workers *ws, uint32_t n, worker_fn fn, void *ctx);
/* Waits until every child is ready, then starts them all (start_ns).  0 or the first error. */
int workers_start(struct workers *ws);
/* Reads child i's result: exactly len bytes.  0 or -errno. */
int workers_collect(struct workers *ws, uint32_t i, void *buf, size_t len);
/* Kills what still runs (kill), reaps every child and frees ws.  0 if all exited with 0. */
int workers_finish(struct workers *ws, bool kill);

/* SPDX-License-Identifier: MIT */
/*
 * The remote tier's thread: a Redis Cluster (redis.h) shared by the nodes of a fleet, values
 * sealed and opened (seal.h) off the event loop.  docs/remote.md describes it; in short:
 *
 * - Threading.  The event-loop thread owns all block state and must never wait; network I/O
 *   and AES-GCM (about 0.6 ms of one core per 2 MiB value) run on a thread of its own, which
 *   owns the struct redis_cluster.  The loop submits jobs (remote_store, remote_fetch) and gets
 *   them back through remote_reap when remote_fd, an eventfd, is readable.  Both sides take
 *   two mutexes, each held only to link or unlink a list or copy counters, never across I/O or
 *   sealing: the loop never waits for the thread's work.  Every function here but remote_new
 *   and remote_free is for the one event-loop thread (one submitter, one reaper); the tier
 *   thread blocks every signal, so the daemon's signalfd and SIGPIPE (hiredis writes with
 *   write(2)) stay as they are.
 * - Ownership of bytes.  A job and everything it points to (its blocks, their tokens, the
 *   namespace, a store's payload, a fetch's destination) stay the caller's and must stay valid
 *   and unchanged from a successful submit until the job comes back through remote_reap
 *   (or remote_free's done).  No copy is made here: a store seals straight from what it is
 *   given, a fetch opens straight into it.  The daemon (daemon/server/remoteio.c) gives a
 *   host pool's committed block, pinned until its store completes, or a copy of an evicted
 *   one, or a GPU pool's staging slot; and to a fetch, blocks (or slots) it has allocated and
 *   nobody can read yet.  A submit that fails (-EBUSY) took nothing: the caller may reuse
 *   everything at once.
 * - Bounds.  At most max_inflight blocks are submitted and not yet reaped (a completed job's
 *   blocks count until remote_reap hands it back: the caller holds them until then, so this
 *   bounds the pool memory pinned for the remote tier, not only the thread's work).  A store
 *   past that is dropped (-EBUSY, counted as stores_dropped); a fetch past it fails at once
 *   (-EBUSY, every block REMOTE_BUSY, counted), so the session falls back to recomputing
 *   instead of waiting.  A job of more than max_inflight blocks can never fit and is answered
 *   the same way (-EBUSY, counted), not as a caller's error: the daemon need not know the
 *   bound to size its jobs.  Neither ever blocks.
 * - Deadlines.  Each job has its own, from its submit, not from when the thread picks it up:
 *   a fetch's is timeout_ms (a block not opened by then is REMOTE_LATE), a store's
 *   store_timeout_ms (nobody waits for stores, but a dead node must not hold the queue).  Jobs
 *   taken together keep their own deadlines: a later job's blocks are not cut short by an
 *   earlier one's.  Between two chunks of stores the thread serves fetches queued meanwhile
 *   and notices remote_free, so a hung node costs a fetch at most one chunk's wait (at most
 *   store_timeout_ms) and remote_free at most that too.
 *
 * Namespaces: values and their Redis keys carry namespace bytes (at most SEAL_MAX_NAMESPACE).
 * They must mean the same on every node, uids do not: the daemon names a namespace
 * ("pool:POOL/shared", or with remote_tier_map_names "pool:POOL/user:NAME" or
 * "pool:POOL/group:NAME"), takes its root salt from remote_namespace_salt (two daemons with
 * the same key and name compute the same chain hashes), and passes that 8-byte salt as the
 * namespace bytes.  A namespace without a name stays node-local: it never reaches the tier.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/tier/redis.h"
#include "daemon/tier/seal.h"

struct remote;

struct remote_config {
	const char *url;	    /* redis://HOST:PORT[,HOST:PORT...]: the seeds */
	const char *key_file;	    /* the current key: it seals (seal_key_load's rules) */
	const char *const *old_key_files; /* retired keys: they only open; may be NULL */
	size_t n_old_key_files;
	struct seal_geometry geometry; /* what every value of this pool is */
	uint32_t timeout_ms;	       /* a fetch's deadline, from its submit (0: 50) */
	uint32_t store_timeout_ms;     /* a store's, from its submit (0: max(20 * timeout_ms, 1000)) */
	uint32_t max_inflight;	       /* blocks submitted and not yet reaped (0: 64) */
	uint64_t ttl_ms;	       /* PX of every value stored; 0: none */
	struct redis_options redis;    /* the cluster client's; zero: its defaults */
};

/* A block's outcome; a fetch's misses are counted by these. */
enum remote_status {
	REMOTE_PENDING = 0,
	REMOTE_OK,	  /* stored; or fetched, verified and opened into dst */
	REMOTE_ABSENT,	  /* fetch: no such value in the cluster */
	REMOTE_LATE,	  /* no answer by the deadline */
	REMOTE_VERIFY,	  /* fetch: the value failed seal_open (reason says why); dst is garbage */
	REMOTE_DOWN,	  /* its node is down (or no node owns its slot) */
	REMOTE_BUSY,	  /* fetch: the queue was full, nothing was asked */
	REMOTE_ERROR,	  /* an error reply or a protocol error (see the node counters) */
	REMOTE_CANCELLED, /* remote_free came first */
	REMOTE_NSTATUS
};

const char *remote_status_name(enum remote_status s);

/* One block of a job.  In: hash, parent, tokens, data; out: status, reason. */
struct remote_block {
	uint8_t hash[16];	/* the block's chain hash */
	uint8_t parent[16];	/* its parent's (zero for a chain's first block) */
	const uint32_t *tokens; /* block_tokens token ids */
	/* store: the payload to seal (read); fetch: where it is opened (written) */
	void *data;		/* geometry.payload_bytes */
	enum remote_status status;
	enum seal_reason reason; /* REMOTE_VERIFY: why */
};

enum remote_kind { REMOTE_STORE, REMOTE_FETCH };

/* A job: the caller's memory, untouched by remote.c except the out fields and link. */
struct remote_job {
	enum remote_kind kind;
	const void *ns; /* the namespace name (see above), ns_len bytes */
	size_t ns_len;
	struct remote_block *blocks;
	size_t nblocks;
	void *user; /* the caller's */

	/* Out. */
	uint64_t latency_ns; /* from submit to completion by the thread */

	/* remote.c's. */
	struct remote_job *next;
	uint64_t submit_ns;
};

/*
 * Loads the keys, parses the seeds and starts the thread.  Connects to nothing: the first job
 * does (Redis absent at start means REMOTE_DOWN until it comes up).  On failure err (errlen
 * bytes) says why, naming the key file or the URL's fault: -EINVAL, -ENOENT and the like from
 * a key file, -ENOMEM, or pthread_create's error.
 */
int remote_new(const struct remote_config *cfg, char *err, size_t errlen, struct remote **ret);

typedef void remote_done_fn(struct remote_job *job, void *arg);

/*
 * Stops the thread and joins it: the batch it is running finishes (within its jobs' deadlines,
 * so at most store_timeout_ms), every job still queued, not yet run or not yet reaped comes
 * back through done(job, arg) (those it never ran with their blocks REMOTE_CANCELLED, counted:
 * a fetch's in misses, a store's in stores_failed), so the caller can release what they point
 * to.  done may call remote_get_stats(r): the counters are final then.  done may be NULL only
 * when no job is live (none submitted, or every one reaped already): the jobs would come back
 * to nobody.  r NULL is fine; returns NULL.
 */
struct remote *remote_free(struct remote *r, remote_done_fn *done, void *arg);

/*
 * Queues a store (job->kind REMOTE_STORE) of nblocks blocks.  0: it comes back through
 * remote_reap with each block's status (stores_ok or stores_failed counts each block).
 * -EBUSY: dropped, counted in stores_dropped (the queue is full, or nblocks > max_inflight:
 * never waits), nothing kept; -EINVAL: no blocks, or a namespace longer than
 * SEAL_MAX_NAMESPACE.
 */
int remote_store(struct remote *r, struct remote_job *job);

/*
 * Queues a fetch (job->kind REMOTE_FETCH): the blocks are asked for in one pipelined batch
 * per node and each opened into its data.  0: it comes back through remote_reap.  -EBUSY: the
 * queue is full (or nblocks > max_inflight), every block is REMOTE_BUSY at once (counted:
 * fetches, fetches_busy, misses) and nothing is kept; -EINVAL as for a store.
 */
int remote_fetch(struct remote *r, struct remote_job *job);

/* The eventfd the loop polls: readable when completed jobs wait for remote_reap. */
int remote_fd(const struct remote *r);

/*
 * Hands every completed job to done(job, arg), in the order they completed, and clears the
 * eventfd.  Never waits for the thread.  Returns how many.
 */
size_t remote_reap(struct remote *r, remote_done_fn *done, void *arg);

/* The root salt of a named namespace (seal_root_salt under the first key): deterministic. */
int remote_namespace_salt(const struct remote *r, const void *name, size_t len, uint64_t *ret);

#define REMOTE_MAX_NODES 64

struct remote_stats {
	uint64_t stores_ok, stores_dropped, stores_failed; /* blocks (failed: cancelled too) */
	uint64_t fetches, fetches_busy;			   /* jobs */
	uint64_t hits;					   /* blocks */
	uint64_t misses[REMOTE_NSTATUS];		   /* blocks, by status (not OK) */
	uint64_t verify[SEAL_NREASONS];			   /* REMOTE_VERIFY blocks, by reason */
	uint64_t bytes_in, bytes_out;			   /* sealed values */
	uint64_t latency_p50_ns, latency_p99_ns;	   /* of the last 1024 fetches */
	uint32_t inflight;				   /* blocks submitted, not reaped */
	size_t nnodes;
	struct redis_node_info nodes[REMOTE_MAX_NODES]; /* as of the last batch (the seeds before) */
};

/* Copies the counters (under a short lock the thread holds only to update them). */
void remote_get_stats(struct remote *r, struct remote_stats *out);

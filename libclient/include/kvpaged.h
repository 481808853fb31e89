/* SPDX-License-Identifier: MIT */
/*
 * libkvpaged: the client library of kvpaged, the KV-cache manager for LLM inference engines.
 *
 * A client connects to the daemon, learns its pool's geometry and maps the pool's memory, then
 * opens sequences (one per request), appends tokens, commits what it has written and closes
 * them.  Each call returns the block table the engine's attention kernels index the pool with.
 *
 * Conventions: functions that can fail return a negative errno (and 0 or a count on success);
 * results go out through ret_ parameters, untouched on failure, and so are the caller's
 * struct kvp_table arguments (a table may have grown room it does not use).  After a failure
 * kvp_last_error() says why, in the daemon's words when the daemon refused.  Untouched on
 * failure is a promise about this process's outputs only: a call that fails once the daemon
 * has replied (no memory for the reply's table, -ENOMEM, or a reply the caller's table cannot
 * take, -EPROTO) leaves them as they were, yet the daemon carried the request out.  After
 * kvp_open() or kvp_fork() the library closes the new sequence the caller cannot be told of
 * (kvp_last_error() says so); after kvp_append(), kvp_commit() or kvp_resume() the caller's
 * table is stale: kvp_seq_info() gives it again.
 *
 * Arguments are checked first: a NULL client, a NULL pointer where a call needs one (tokens
 * or weights with a nonzero count, ret_seq, ret_child, ret_cached, ops or out with a nonzero
 * count; other ret_ pointers and tables may be NULL: not wanted), or a struct kvp_table whose
 * blocks is NULL with a nonzero cap (or len above cap) make the call return -EINVAL, and
 * kvp_last_error() names the argument.  The calls that return no int say below what they
 * return for a NULL client.
 *
 * Threads: a struct kvp_client is not thread-safe.  Use it from one thread at a time (or one
 * client per thread); different clients are independent.
 */
#ifndef KVPAGED_H
#define KVPAGED_H

#include <stddef.h>
#include <stdint.h>

#include "kvpaged-version.h" /* KVP_VERSION_*, KVP_CHECK_VERSION(): installed beside this one */

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KVP_BUILDING_LIBRARY)
#define KVP_EXPORT __attribute__((visibility("default")))
#else
#define KVP_EXPORT
#endif

#define KVP_DEFAULT_SOCKET "/run/kvpaged/kvpaged.sock"

/*
 * The release of the library loaded at run time, KVP_VERSION_ENCODE(major, minor, patch): at
 * least the KVP_VERSION_NUMBER the caller was built with.  Thread-safe; needs no client.
 * Since 0.2.0 (check for it with KVP_CHECK_VERSION(0, 2, 0)).
 */
KVP_EXPORT uint32_t kvp_version(void);

/* Open flag: leave the last prompt token uncached, so its logits can be computed. */
#define KVP_OPEN_RECOMPUTE_LAST (1u << 0)
/* Open flag bits 8..31: the sequence's priority (pools with policy = priority; higher is more
 * important, so dropped later and never for a less important request). */
#define KVP_OPEN_PRIORITY(p) ((uint32_t)(p) << 8)
/*
 * Rings only: open with sinks retention; the op's seq carries KVP_SINKS(n_sink, recent).  (The
 * socket call is kvp_open_retained().)
 */
#define KVP_OPEN_SINKS (1u << 1)
#define KVP_SINKS(n_sink, recent) ((uint64_t)(n_sink) << 32 | (uint32_t)(recent))
/* Rings only: open with h2o retention (no decay); the op's seq carries KVP_H2O(budget, recent). */
#define KVP_OPEN_H2O (1u << 2)
#define KVP_H2O(budget, recent) ((uint64_t)(budget) << 32 | (uint32_t)(recent))

/* A table entry whose block the sequence's retention policy released. */
#define KVP_TABLE_HOLE UINT32_MAX

/*
 * What a sequence keeps (docs/retention.md).  KVP_RETAIN_SINKS keeps the first n_sink tokens
 * and the last recent ones (recent >= 1): once tokens are committed, every block wholly
 * between them is released and its table entry becomes KVP_TABLE_HOLE, so entry i still holds
 * tokens [i * block_tokens, (i + 1) * block_tokens).  Such a sequence cannot be parked.
 *
 * KVP_RETAIN_H2O keeps the first n_sink tokens (optional; at granularity 0 the blocks
 * holding them) and the last recent tokens plus, up to budget tokens in all, the blocks
 * (granularity 0) or tokens (granularity 1) whose tokens received the most attention, as
 * reported with kvp_report_scores(): the lowest scores go first, the earliest among equals,
 * and n_sink + recent must not exceed budget.  At token
 * granularity the survivors of a block are packed into the sequence's packed blocks, whose
 * slots' positions kvp_seq_packed() gives.
 */
struct kvp_retention {
	uint32_t size;   /* sizeof(struct kvp_retention) */
	uint32_t policy; /* KVP_RETAIN_* */
	uint32_t n_sink; /* sinks; h2o: 0 or more, n_sink + recent <= budget */
	uint32_t recent; /* sinks, h2o: >= 1 */
	uint32_t budget; /* h2o: >= recent */
	uint32_t granularity; /* h2o: 0 blocks, 1 tokens */
	float decay;     /* h2o: scores are multiplied by this at each report, (0, 1]; 0: 1 */
};
#define KVP_RETAIN_FULL 0
#define KVP_RETAIN_SINKS 1
#define KVP_RETAIN_H2O 2

struct kvp_client;

struct kvp_connect_options {
	uint32_t size;           /* sizeof(struct kvp_connect_options): lets the struct grow */
	const char *socket_path; /* NULL: $KVPAGED_SOCKET, then KVP_DEFAULT_SOCKET */
	const char *pool;        /* NULL or "": the daemon's first pool */
	const char *ns;          /* NULL or "": narrow nothing; else narrows the namespace */
	const char *client_name; /* shown by `kvpagedctl sessions` */
	uint32_t ring_entries;   /* 0: no rings (socket only); else a power of two */
	uint32_t ring_data_bytes; /* with rings: at least 4096 */
	uint32_t spin_us;        /* kvp_complete spins this long before it sleeps */
	char *error_buf;         /* if kvp_connect fails, why (the daemon's words when it refused) */
	uint32_t error_len;      /* bytes at error_buf */
};

/* The pool's geometry and in-block layout.  Byte offset of (block b, layer l, kv k (0 K,
 * 1 V), slot s, head h) = b*block_stride + l*layer_stride + k*kv_stride + s*slot_stride +
 * h*head_stride, then head_dim elements of element_bytes each. */
struct kvp_pool_info {
	char name[64];
	char backend[16];
	uint32_t layers, kv_heads, head_dim, element_bytes, block_tokens, capacity_blocks;
	uint32_t max_seq_tokens, vocab_size;
	uint64_t bytes_per_token, block_bytes, pool_bytes;
	uint64_t block_stride, layer_stride, kv_stride, slot_stride, head_stride;
	uint32_t window; /* a sliding-window pool: tokens each sequence keeps; 0: none */
};

/* A block table.  Zero-initialize it; the library grows blocks as needed. */
struct kvp_table {
	uint32_t *blocks;
	uint32_t len;
	uint32_t cap;
};

/*
 * Connects, says Hello, maps the pool (and the rings when asked for).  opts may be NULL (all
 * defaults); ret may not (-EINVAL).  Returns 0, or -errno:
 * -ENOENT no such socket or pool, -EACCES refused by the pool's ACL, -EUSERS too many sessions,
 * -EPROTO the daemon spoke something else; the reason goes to opts->error_buf if given (there
 * is no client to ask kvp_last_error()).  *ret is set only on success; a failure writes
 * nothing but error_buf.  The client owns its fds and mappings until kvp_disconnect().
 */
KVP_EXPORT int kvp_connect(const struct kvp_connect_options *opts, struct kvp_client **ret);

/* Closes the session (the daemon closes every sequence it still has).  Accepts NULL;
 * returns NULL. */
KVP_EXPORT struct kvp_client *kvp_disconnect(struct kvp_client *c);

/* The pool's description, owned by the client.  NULL for a NULL client. */
KVP_EXPORT const struct kvp_pool_info *kvp_pool(const struct kvp_client *c);

/*
 * The pool memory mapped read-write in this process (pool_bytes long); NULL when the pool is
 * in GPU memory (kvp_pool()->backend is "cuda"): see kvp_pool_device_ptr().  NULL for a
 * NULL client.
 */
KVP_EXPORT void *kvp_pool_base(const struct kvp_client *c);

/*
 * A pool in GPU memory (backend "cuda"): its device address in this process, a CUdeviceptr
 * valid in the primary context of the GPU that holds the pool (the context the CUDA runtime
 * uses), read-write, pool_bytes long, with the layout kvp_pool() describes.  0 for a host pool
 * (and for a NULL client).
 * The mapping belongs to the client until kvp_disconnect().  Thread-safe (it only reads).
 * Ordering: the daemon copies and moves blocks on a stream of its own, which nothing orders
 * against the engine's.  The engine's GPU writes to a block must have completed (its stream
 * synchronized, or an event waited for) before the call that lets the daemon copy or move it:
 * kvp_commit, kvp_fork, kvp_append into a shared block, kvp_park, kvp_close, and their ring
 * ops.  The other way round needs nothing: a reply (or completion) that returns a table is
 * sent only once the daemon's copies into its blocks are done.
 */
KVP_EXPORT uint64_t kvp_pool_device_ptr(const struct kvp_client *c);

/* The namespace the daemon assigned, e.g. "uid:1000/tenant-a".  NULL for a NULL client. */
KVP_EXPORT const char *kvp_namespace(const struct kvp_client *c);

/* Why the last call on this client failed ("" after a success); "no client" for NULL. */
KVP_EXPORT const char *kvp_last_error(const struct kvp_client *c);

/* Frees a table's entries; the struct can be reused.  Accepts NULL. */
KVP_EXPORT void kvp_table_free(struct kvp_table *t);

/*
 * Opens a sequence for a prompt.  *ret_cached gets how many leading tokens already have their
 * K/V in the pool (skip their prefill); table gets the whole block table.  On failure
 * *ret_seq, *ret_cached and table are untouched.
 */
KVP_EXPORT int kvp_open(struct kvp_client *c, const uint32_t *tokens, uint32_t n,
			uint64_t extra_key, uint32_t flags, uint64_t *ret_seq, uint32_t *ret_cached,
			struct kvp_table *table);

/* kvp_open() with a retention policy (NULL: full); outputs as kvp_open()'s. */
KVP_EXPORT int kvp_open_retained(struct kvp_client *c, const uint32_t *tokens, uint32_t n,
				 uint64_t extra_key, uint32_t flags,
				 const struct kvp_retention *retention, uint64_t *ret_seq,
				 uint32_t *ret_cached, struct kvp_table *table);

/*
 * h2o: adds one decode step's attention to positions [first, first + n) (weights summed over
 * heads and layers; every position must be one the sequence holds).  Over the rings: KVP_SCORES
 * with arg = first and the weights as the op's tokens (n 32-bit floats).
 */
KVP_EXPORT int kvp_report_scores(struct kvp_client *c, uint64_t seq, uint32_t first,
				 const float *weights, uint32_t n);
/* first for kvp_report_scores(): the weights are for the packed slots, in order, all of them. */
#define KVP_SCORES_PACKED UINT32_MAX

/*
 * h2o at token granularity: the packed blocks (blocks) and the original position each packed
 * slot holds (positions, one entry per slot; slot k is slot k % block_tokens of block
 * blocks[k / block_tokens]).  Both tables are replaced, or neither: on failure both keep their
 * entries and length (one may have grown room it does not use).
 */
KVP_EXPORT int kvp_seq_packed(struct kvp_client *c, uint64_t seq, struct kvp_table *blocks,
			      struct kvp_table *positions);

/*
 * Gives n more tokens slots; table (the sequence's, as last returned) is updated in place,
 * from the first entry that changed.  On failure table is untouched.
 */
KVP_EXPORT int kvp_append(struct kvp_client *c, uint64_t seq, const uint32_t *tokens,
			  uint32_t n, struct kvp_table *table);

/*
 * Marks the first ntokens tokens as written; full blocks become findable by others.  Returns
 * the number of table entries the daemon replaced with an equal block committed first (the
 * table, if given, is updated; the K/V there is the same).  Under a retention policy the
 * commit may release entries: the table is updated then too (KVP_TABLE_HOLE there), and the
 * client must stop using those blocks.  Over the rings: the completion's value counts them
 * and the table is written.  On failure table is untouched.
 */
KVP_EXPORT int kvp_commit(struct kvp_client *c, uint64_t seq, uint32_t ntokens,
			  struct kvp_table *table);

/*
 * A new sequence sharing every block of seq; writes into a shared block copy it first.
 * *ret_child gets its id and child_table its table; on failure both are untouched.
 */
KVP_EXPORT int kvp_fork(struct kvp_client *c, uint64_t seq, uint64_t *ret_child,
			struct kvp_table *child_table);

KVP_EXPORT int kvp_close(struct kvp_client *c, uint64_t seq);

/*
 * How many leading tokens of a prompt are cached, without opening anything (*ret_cached;
 * untouched on failure).
 */
KVP_EXPORT int kvp_lookup(struct kvp_client *c, const uint32_t *tokens, uint32_t n,
			  uint64_t extra_key, uint32_t flags, uint32_t *ret_cached);

/*
 * A sequence's tokens with a slot (*ret_tokens), leading tokens committed (*ret_committed) and
 * whole block table; each may be NULL.  On failure all three are untouched.
 */
KVP_EXPORT int kvp_seq_info(struct kvp_client *c, uint64_t seq, uint32_t *ret_tokens,
			    uint32_t *ret_committed, struct kvp_table *table);

/*
 * How long kvp_open(), kvp_append() and kvp_resume() on the socket wait for memory when the
 * pool has none (no free, cached or preemptible blocks): 0 (the default) fails at once with
 * -ENOSPC; otherwise the daemon retries the request as blocks come free and fails it with
 * -ENOSPC after ms milliseconds.  At most the daemon's max_wait_ms (more: -EINVAL from the
 * call).  Operations on the rings never wait.  Not thread-safe with calls on the same client.
 * Does nothing for a NULL client.
 */
KVP_EXPORT void kvp_set_wait(struct kvp_client *c, uint32_t ms);

/*
 * Parks an idle sequence (between turns of a conversation, say).  Its blocks stay, but when
 * memory runs out the daemon may drop it, by the pool's policy; its token history is kept.
 * Until kvp_resume() only kvp_seq_info() and kvp_close() apply to it (others: -EBUSY).
 */
KVP_EXPORT int kvp_park(struct kvp_client *c, uint64_t seq);

/*
 * Makes a parked sequence active again.  *ret_recompute gets how many trailing tokens' K/V
 * must be computed again (0 if it kept its blocks; after a drop, what is no longer cached,
 * at least the last token); table gets the whole new block table.  On failure both are
 * untouched.
 */
KVP_EXPORT int kvp_resume(struct kvp_client *c, uint64_t seq, uint32_t *ret_recompute,
			  struct kvp_table *table);

/*
 * What the daemon offers this session (struct kvp_probe_info.features).  A daemon announces
 * them from protocol version 2 on (kvpaged 0.2.0); bits this header does not name may be set
 * and are to be ignored.
 */
#define KVP_FEATURE_RINGS (UINT64_C(1) << 0)     /* rings: ring_entries in kvp_connect_options */
#define KVP_FEATURE_WAIT (UINT64_C(1) << 1)      /* kvp_set_wait() (the daemon's max_wait_ms > 0) */
#define KVP_FEATURE_PARK (UINT64_C(1) << 2)      /* kvp_park(), kvp_resume() */
#define KVP_FEATURE_SINKS (UINT64_C(1) << 3)     /* KVP_RETAIN_SINKS */
#define KVP_FEATURE_H2O (UINT64_C(1) << 4)       /* KVP_RETAIN_H2O, kvp_report_scores(), packed */
#define KVP_FEATURE_HOST_TIER (UINT64_C(1) << 5) /* the pool swaps to host RAM */
#define KVP_FEATURE_FILE_TIER (UINT64_C(1) << 6) /* the pool swaps to files */

/* What the daemon told this client at connect time (kvp_probe()). */
struct kvp_probe_info {
	uint32_t size;             /* in: sizeof(struct kvp_probe_info); out: the bytes filled */
	uint32_t protocol_version; /* the wire protocol version agreed for this session */
	/* The versions the daemon speaks; both 0 from a version 1 daemon (it announces nothing). */
	uint32_t min_protocol_version;
	uint32_t max_protocol_version;
	uint64_t features;         /* KVP_FEATURE_*; 0 from a version 1 daemon */
	uint64_t opcodes;          /* bit 1 << op for each enum kvp_opcode the daemon's rings
				      execute; 0 from a version 1 daemon */
};

/*
 * What the daemon announced in its Welcome: the protocol version, the daemon's range, its
 * feature bits and ring opcodes, so a client learns what it may use instead of assuming.
 * Asks the daemon nothing (the Welcome is kept).  Fills at most ret->size bytes and sets
 * ret->size to how many it filled (the struct may grow).  Returns 0, or -EINVAL when
 * ret->size is smaller than the 0.2.0 struct (*ret untouched).  Thread-safe (it only reads).
 * Since 0.2.0.
 */
KVP_EXPORT int kvp_probe(const struct kvp_client *c, struct kvp_probe_info *ret);

/* ------------------------------------------------------------------ asynchronous rings */

enum kvp_opcode {
	KVP_NOP = 0,
	KVP_OPEN = 1,
	KVP_APPEND = 2,
	KVP_COMMIT = 3,
	KVP_FORK = 4,
	KVP_CLOSE = 5,
	KVP_LOOKUP = 6,
	KVP_SEQ_INFO = 7,
	KVP_PARK = 8,
	KVP_RESUME = 9, /* aux: tokens to recompute */
	KVP_SCORES = 10, /* arg: first position; tokens: the float weights, ntokens of them */
	/*
	 * The position map (kvp_seq_packed()): table_out gets the aux packed blocks, then the
	 * value positions their slots hold.  Give it room for both; when it is short the
	 * completion is KVP_COMPLETION_TRUNCATED and the map is to be had with kvp_seq_packed().
	 */
	KVP_PACKED = 11,
};

/* One operation for kvp_submit().  tokens are copied at submission. */
struct kvp_op {
	uint32_t opcode;   /* enum kvp_opcode */
	uint32_t arg;      /* COMMIT: tokens written; OPEN/LOOKUP: flags (KVP_OPEN_*) */
	uint64_t user_data;
	uint64_t seq;
	uint64_t extra_key;
	const uint32_t *tokens;
	uint32_t ntokens;
	uint32_t table_cap; /* entries table_out can take */
	uint32_t *table_out; /* where the completion's table entries go (may be NULL) */
};

struct kvp_completion {
	uint64_t user_data;
	int32_t res;      /* 0 or a negative errno */
	uint32_t flags;   /* KVP_COMPLETION_TRUNCATED */
	uint64_t value;   /* OPEN/FORK: the sequence; SEQ_INFO: tokens << 32 | committed;
			     COMMIT: entries the retention policy released */
	uint32_t aux;     /* OPEN: cached tokens; APPEND: first changed entry; COMMIT: replaced;
			     LOOKUP: cached tokens */
	uint32_t table_len; /* entries written to the op's table_out */
};

#define KVP_COMPLETION_TRUNCATED (1u << 0) /* table_cap was too small */

/*
 * Queues up to n operations on the submission ring and rings the doorbell only if the daemon
 * sleeps.  Returns how many were queued (fewer when the ring or its data area is full: reap
 * completions first), -ENOTSUP without rings, or -errno.  An op the library refuses
 * (-EINVAL, -E2BIG) is refused before anything is queued, or ends the batch there when ops
 * before it were queued: those are published to the daemon and their count is returned (the
 * refused op, first in the next call, gets its -errno then).  One exception: -errno from the doorbell's
 * write(2) comes after the batch was published; its ops stay queued and run once the daemon
 * is woken (by a later kvp_submit()).
 */
KVP_EXPORT int kvp_submit(struct kvp_client *c, const struct kvp_op *ops, unsigned n);

/*
 * Reaps up to max completions, waiting until at least min are there: it spins for spin_us,
 * then sleeps on the completion eventfd.  timeout_ms < 0 waits forever.  Returns the number
 * reaped (>= 0), -ETIMEDOUT, -ECONNRESET if the daemon went away, or -errno; completions
 * already reaped into out are never lost to an error: the call returns their count.  Only the
 * returned count of out is written (and the table_out of those ops); on failure nothing is.
 */
KVP_EXPORT int kvp_complete(struct kvp_client *c, struct kvp_completion *out, unsigned max,
			    unsigned min, int timeout_ms);

/*
 * Completions in an event loop (epoll, asyncio, libuv) instead of a blocking kvp_complete():
 *
 *	fd = kvp_completion_fd(c);          once; watch it for reading
 *	loop:
 *		n = kvp_complete(c, out, max, 0, 0);   reap what is there
 *		if (more wanted && kvp_complete_arm(c) == 0)
 *			wait until fd is readable, then loop
 *
 * kvp_completion_fd() returns a descriptor (the client's, closed by kvp_disconnect(); never
 * read from it) that polls readable once the daemon has posted a completion after
 * kvp_complete_arm(), or when the daemon has closed the session; it may also wake for
 * nothing, which the next kvp_complete() finds.  -ENOTSUP without rings.
 *
 * kvp_complete_arm() asks the daemon to signal the descriptor at its next completion, as
 * kvp_complete() does before it sleeps.  Returns 0 (armed: wait), 1 (completions are there
 * already: reap them, nothing armed), -ECONNRESET (the daemon closed the session and nothing
 * is left to reap), -ENOTSUP or -EINVAL.  The next kvp_complete() disarms (and reads the
 * descriptor's wake-up, so a descriptor still watched turns quiet).  Neither is
 * thread-safe with other calls on c.  Since 0.3.0.
 */
KVP_EXPORT int kvp_completion_fd(struct kvp_client *c);
KVP_EXPORT int kvp_complete_arm(struct kvp_client *c);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGED_H */

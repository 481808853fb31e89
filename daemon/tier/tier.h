/* SPDX-License-Identifier: MIT */
/*
 * Storage for the tiers below the pool: bounded host RAM (host.c) and swap files driven by
 * io_uring (file.c).  These modules move bytes and check them; which block goes where is
 * decided by daemon/core (tiers in core.h), which never does I/O itself.
 *
 * Every stored block carries its identity (struct tier_key).  A load is given the identity the
 * caller expects and fails with -EBADMSG unless the stored one (hashes, salt, extra key, every
 * token id) and, for files, the checksums match: a tier never hands back wrong data.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* A full block's identity: its chain hash, its parent's chain hash, namespace and tokens. */
struct tier_key {
	uint64_t hash_lo, hash_hi;
	uint64_t parent_lo, parent_hi; /* both 0 for the first block of a chain */
	uint64_t salt;
	uint64_t extra;
	const uint32_t *tokens; /* block_tokens token ids */
};

/* ---- host tier: slots of host memory ------------------------------------------------------ */

struct host_tier;

/*
 * Where the arena (the slots' bytes) comes from when not from an anonymous mapping: for a pool
 * on a device, the backend's pinned, device-visible host memory (host_alloc), so that moves run
 * straight between the pool and a slot.  Such an arena is committed, and pinned, whole when it
 * is allocated, not page by page as slots fill.  alloc: 0 or -errno; free gets what it gave.
 */
struct host_tier_arena {
	int (*alloc)(void *ctx, uint64_t bytes, void **ret);
	void (*free)(void *ctx, void *mem, uint64_t bytes);
	void *ctx;
};

/*
 * nslots slots of block_bytes each (plus the tokens), the bytes from arena (copied; NULL: an
 * anonymous mapping, committed as slots are first written).  0, -EINVAL, -ENOMEM, or what
 * arena->alloc returned.
 */
int host_tier_new(uint32_t nslots, uint64_t block_bytes, uint32_t block_tokens,
		  const struct host_tier_arena *arena, struct host_tier **ret);
struct host_tier *host_tier_free(struct host_tier *t);

/*
 * Copies a block's bytes and identity into a slot (slot < nslots).  Not thread-safe: one owner
 * stores and loads.
 */
void host_tier_store(struct host_tier *t, uint32_t slot, const struct tier_key *key,
		     const void *data);
/* Copies a slot's bytes to dst if its identity is key's: 0, else -EBADMSG (nothing copied). */
int host_tier_load(struct host_tier *t, uint32_t slot, const struct tier_key *key, void *dst);

/*
 * A store whose bytes someone else writes (a device's move into a pinned arena), in two steps.
 * host_tier_slot_for_write() forgets what the slot held and returns its block_bytes of memory;
 * once the bytes are in, host_tier_commit() records the identity.  In between the slot matches
 * no key, so a write that fails half way leaves nothing that could be loaded as a block.
 */
void *host_tier_slot_for_write(struct host_tier *t, uint32_t slot);
void host_tier_commit(struct host_tier *t, uint32_t slot, const struct tier_key *key);
/*
 * A load whose bytes someone else reads: the slot's memory if its identity is key's (as
 * host_tier_load() checks it), else NULL.  Valid until the slot is next written.
 */
const void *host_tier_lookup(const struct host_tier *t, uint32_t slot, const struct tier_key *key);
/* The slot's stored identity (tokens point into the tier) and bytes. */
void host_tier_key(const struct host_tier *t, uint32_t slot, struct tier_key *ret);
const void *host_tier_data(const struct host_tier *t, uint32_t slot);

/* ---- file tier: slots in swap files, O_DIRECT through io_uring ---------------------------- */

struct file_tier;

struct file_tier_config {
	const char *const *paths; /* one or more files; slots are striped across them */
	uint32_t npaths;
	uint32_t nslots;          /* slots in all */
	uint64_t block_bytes;
	uint32_t block_tokens;
	uint64_t geometry;        /* fingerprint of the pool's layout; a slot written under
				     another geometry is never used */
	bool persist;             /* keep what the files hold across restarts (see scan), and
				     the checksums' key in <paths[0]>.key */
	uint32_t queue_depth;     /* staging buffers = I/Os in flight at most; >= 1 */
	/*
	 * One file with no name, in the directory of paths[0] (npaths 1, no persist): O_TMPFILE,
	 * or a random name unlinked at once.  For a scratch tier that must leave nothing behind
	 * and open nothing another user could have put there.
	 */
	bool scratch;
	/*
	 * Told about each queued write that failed after store returned (slot unusable; err is
	 * -errno, -EIO for a short write), unless the slot was stored again since.  Called from
	 * within store, load, poll, flush, scan or close (never load_start): it must not call
	 * into the tier.
	 */
	void (*lost)(void *ctx, uint32_t slot, int err);
	void *lost_ctx;
};

/* I/O counts are of the files: a load served from a staging buffer reads nothing. */
struct file_tier_stats {
	uint64_t writes, write_bytes, write_errors; /* errors: every failed write, lost or not */
	uint64_t reads, read_bytes, read_errors;
	uint64_t checksum_errors; /* header or data checksum wrong, or a torn slot */
	uint64_t identity_errors; /* checksums right, but another block than expected */
};

/*
 * Opens (creating when missing) and sizes the files, registers them and the staging buffers
 * with a private io_uring, and registers an eventfd with the ring (file_tier_event_fd; failing
 * that, open fails).  A file is never opened through a symbolic link (-ELOOP) and must be a
 * regular file (-EINVAL) of the caller's effective uid that group and others cannot write
 * (-EPERM), with one name (-EMLINK); refusals are logged.  Each file is locked (flock): -EBUSY
 * when another tier holds it.  The checksums are keyed: with persist the key is read from
 * <paths[0]>.key (held to the same rules; made when missing), else it is the tier's own.
 * Without persist, or when the key had to be made anew (logged), whatever the files held is
 * forgotten.  Files on a file system without O_DIRECT are opened buffered (logged); staging
 * buffers that RLIMIT_MEMLOCK does not let the ring register are used unregistered (logged).
 * 0, -EINVAL or another -errno.
 *
 * A tier is not thread-safe: one owner calls everything below.
 */
int file_tier_open(const struct file_tier_config *cfg, struct file_tier **ret);
/*
 * Waits for queued writes (with persist, fdatasyncs), then closes.  Accepts NULL; returns NULL.
 * No asynchronous load may be in flight (asserted): poll until file_tier_loading() is false
 * first.  (Built without asserts, close waits for the batch's reads and drops it, logged;
 * its done never runs.)
 */
struct file_tier *file_tier_close(struct file_tier *t);

/*
 * Queues the write of one slot: header (identity, checksums) and data are copied into a
 * staging buffer before it returns, so data may be reused at once.  Waits only when every
 * staging buffer is in flight, or when this slot's previous write is (two writes of one slot
 * in flight could land in either order).  0, -EINVAL (slot out of range), or -errno when the
 * write could not be submitted.  A load of a slot whose write is still in flight is served
 * from the staging buffer.
 */
int file_tier_store(struct file_tier *t, uint32_t slot, const struct tier_key *key,
		    const void *data);

/*
 * Reads n slots in one batch (up to queue_depth in flight), verifies each (header checksum,
 * identity against keys[i], data checksum) and copies its data to dsts[i].  results[i]: 0,
 * -EBADMSG (corrupt, never written, or another block: counted, nothing copied), -EIO (read
 * failed or short) or -EINVAL (slot out of range).  Returns when all are done.  With an
 * asynchronous load in flight, first waits until all its reads are done (its done still runs
 * only at the next file_tier_poll()).
 */
void file_tier_load(struct file_tier *t, uint32_t n, const uint32_t *slots,
		    const struct tier_key *keys, void *const *dsts, int *results);

/*
 * Starts reading n slots as file_tier_load() does, without waiting.  Reads go out as staging
 * buffers allow; file_tier_poll() moves the batch on.  When every results[i] is in, done(ctx)
 * is called -- ONLY from within file_tier_poll() (never from load_start, store, load, flush,
 * scan or close), so done may call into the tier and into its caller's code freely.  slots,
 * keys (and the tokens they point to), dsts and results must stay valid until done runs.
 * One batch at a time: -EBUSY while one is in flight.  0, or -errno (nothing started).
 *
 * results[i] are as file_tier_load()'s, verified the same way; dsts[i] and results[i] may be
 * written from within any tier call until done runs, so read them from done on.  Entries are
 * taken in order, each when a buffer frees up for it; a slot whose write is still in a staging
 * buffer then is served from it at once (as is a slot out of range), yet done still waits for
 * the next poll.
 * The batch also moves on wherever the tier reaps completions (store, load, flush, scan), but
 * a store waiting for a buffer gets the next one freed before the batch does.  A slot stored
 * again while the batch is in flight gives whichever block its entry finds, checked against
 * keys[i] as always.  Errors: -EINVAL (done NULL, or n > 0 with a NULL array), -EBUSY (a batch
 * in flight, or called from within a load or a scan), -ENOMEM.  A submit the kernel refuses is
 * retried at the next poll (the eventfd is made readable for it).
 */
int file_tier_load_start(struct file_tier *t, uint32_t n, const uint32_t *slots,
			 const struct tier_key *keys, void *const *dsts, int *results,
			 void (*done)(void *ctx), void *ctx);
/* Whether a batch started by file_tier_load_start() is in flight (done not yet called). */
bool file_tier_loading(const struct file_tier *t);

/*
 * An eventfd (non-blocking, close-on-exec) registered with the tier's io_uring
 * (io_uring_register_eventfd): readable when completions were posted.  The event loop polls
 * it, drains it (read 8 bytes; EAGAIN is fine) and calls file_tier_poll(), in that order: a
 * completion posted after the drain makes it readable again.  The tier makes it readable
 * itself when an asynchronous load finishes without a completion of its own (all served from
 * staging, or n == 0), so that batch's done also comes at the next wake.  Owned by the tier,
 * closed by file_tier_close().
 */
int file_tier_event_fd(const struct file_tier *t);

/*
 * Reaps finished writes and reads without waiting (calling lost for failed writes), moves the
 * asynchronous load on, and calls its done once every result is in (the batch is gone by
 * then: done may start the next).  Returns how many completions were reaped.
 */
int file_tier_poll(struct file_tier *t);
/* Waits until no write is in flight. */
void file_tier_flush(struct file_tier *t);

/*
 * With persist: reads every slot header (after waiting for the reads of an asynchronous load,
 * whose done runs at the next poll, and for queued writes) and calls found for each one that
 * is intact (version, keyed header checksum, magic, sizes, geometry, and the slot it was
 * written as).  key->tokens points into a buffer valid only during the call; found must
 * not call into the tier.  The data checksum is checked when the slot is loaded.  Returns the
 * number found or -errno (a read failed; found may have been called for some slots).
 */
int file_tier_scan(struct file_tier *t,
		   void (*found)(void *ctx, uint32_t slot, const struct tier_key *key), void *ctx);

void file_tier_get_stats(const struct file_tier *t, struct file_tier_stats *ret);
/* Bytes one slot takes in a file (header and data, each rounded up for O_DIRECT). */
uint64_t file_tier_slot_bytes(const struct file_tier *t);
/*
 * Whether file `file` (an index into cfg.paths) is read and written with O_DIRECT; false when
 * its file system refused O_DIRECT and it is buffered (or there is no such file).
 */
bool file_tier_direct(const struct file_tier *t, uint32_t file);

/* SPDX-License-Identifier: MIT */
/*
 * A pool's remote tier: the glue between the core's probed level (CORE_TIER_PROBED, the last
 * one) and the tier's thread (daemon/tier/remote.h), which owns the Redis Cluster client and
 * does the sealing.  docs/remote.md has the whole picture; here:
 *
 * - Publishing.  A block a named-namespace sequence commits is offered to the level (the
 *   core's store callback): it becomes one store job, sealed by the thread straight from the
 *   pool block, which the core keeps (not reused, not written) until the job comes back and
 *   core_tier_stored lets it go.  A full queue drops the store (the thread counts it).
 * - Fetching.  An open whose local chain ends asks the level for the prompt's next blocks: the
 *   core allocates their pool blocks and the sequence waits LOADING (its session waits, the
 *   loop and every other session do not).  They go out as one fetch job, opened by the thread
 *   straight into those blocks; when it comes back the results go to the core, which takes the
 *   leading hits (verified: the seal's tag, geometry, identity and tokens) and recomputes the
 *   rest.  A late or failed block is a miss.
 * - Namespaces.  A value's namespace is the sequence's salt, which for a named namespace is
 *   derived from the name and the key (dpool_remote_salt): the same on every node.
 * - Bytes.  For a pool in host memory nothing is copied on the loop: jobs point at the pool's
 *   memory.  A pool on a device goes through a pinned staging of its own (remote_stage): a
 *   store is a queued move out into a slot, sealed once the move is done; a fetch is opened
 *   into slots and moved in at its reap (replies that hand out the blocks wait for the move,
 *   as for any move).  A full staging drops the store, or fails the fetch (recomputed).
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

#include "daemon/log.h"
#include "daemon/server/pool-internal.h"
#include "daemon/server/server.h"
#include "daemon/tier/remote.h"

/*
 * One block published: its job, and the pool block the core keeps for it (at commit), or
 * CORE_NONE and a copy of the block following the struct (an evicted block: its memory is
 * reused at once).
 */
struct rstore {
	struct remote_job job;
	struct remote_block block;
	uint32_t pool_block;
	uint8_t ns[8];
	uint32_t *tokens; /* a copy's */
	/* A device pool's: its staging slot (else UINT32_MAX), the move out, the queue's link. */
	uint32_t stage;
	uint64_t ticket;
	struct rstore *next;
};

/* One sequence's fetch: the loads it answers (their index in the sequence's loads). */
struct rfetch {
	struct remote_job job;
	struct load_wait *wait;
	uint8_t ns[8];
	uint32_t *which;
	/* A device pool's: each block's staging slot, the moves in, the link on remote_in. */
	uint32_t *stage;
	uint64_t ticket;
	struct rfetch *next;
	struct remote_block blocks[];
};

#define NO_SLOT UINT32_MAX

static void *stage_at(const struct dpool *p, uint32_t slot)
{
	return (char *)p->remote_stage + (uint64_t)slot * p->block_bytes;
}

static uint32_t stage_take(struct dpool *p)
{
	return p->remote_stage_nfree ? p->remote_stage_free[--p->remote_stage_nfree] : NO_SLOT;
}

static void stage_put(struct dpool *p, uint32_t slot)
{
	if (slot != NO_SLOT)
		p->remote_stage_free[p->remote_stage_nfree++] = slot;
}

/* Hashes and salts travel little-endian: the same bytes on every node. */
static void le64(uint8_t *d, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		d[i] = (uint8_t)(v >> (8 * i));
}

static void hash_bytes(uint8_t d[16], struct core_hash h)
{
	le64(d, h.lo);
	le64(d + 8, h.hi);
}

static uint64_t from_le64(const uint8_t *s)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | s[i];
	return v;
}

/* A store that came back OK: its block announced on the remote tier (its tokens still valid). */
static void announce_store(struct dpool *p, const struct rstore *st)
{
	static const uint8_t none[16];

	if (st->block.status != REMOTE_OK || !p->core)
		return;
	dpool_events_remote_stored(p, from_le64(st->ns), from_le64(st->block.hash),
				   from_le64(st->block.parent),
				   memcmp(st->block.parent, none, sizeof(none)) != 0, st->block.tokens);
}

/* A fetched block's outcome as a load result (docs/remote.md: misses by reason). */
static int load_result(const struct remote_block *b)
{
	switch (b->status) {
	case REMOTE_OK:
		return 0;
	case REMOTE_ABSENT:
		return -ENOENT;
	case REMOTE_VERIFY:
		return -EBADMSG;
	case REMOTE_LATE:
		return -ETIMEDOUT;
	case REMOTE_DOWN:
		return -EHOSTDOWN;
	case REMOTE_BUSY:
		return -EBUSY;
	case REMOTE_CANCELLED:
		return -ECANCELED;
	default:
		return -EIO;
	}
}

/*
 * The level's store: a block just made findable by a named-namespace sequence.  1: the store
 * went out and reads the block until it comes back; 0: dropped (queue full, or the block's
 * bytes still on their way in).
 */
/*
 * remote_tier_write = evict: a block leaving the last level in memory (the pool, or the host
 * tier: the file tier is CORE_TIER_COLD, its slots are never read back) is copied and
 * published from the copy, whether it goes on into the swap files or not, since its memory is
 * reused as soon as this returns.
 * One memcpy on the loop per block, bounded by remote_tier_max_inflight; 0 always (dropped
 * when the queue is full, or the slot no longer holds it).
 */
/*
 * A device pool's block to the tier: moved out into a staging slot (queued), sealed from there
 * once the move is done (dpool_remote_settle).  0 always: nothing of the pool is kept.
 */
static int store_staged(struct dpool *p, uint32_t from, const struct core_key *key)
{
	const uint32_t B = p->cfg->block_tokens;
	uint32_t slot = stage_take(p);
	struct backend_move m;
	struct rstore *st;

	if (slot == NO_SLOT) {
		p->remote_stage_full++;
		return 0;
	}
	st = malloc(sizeof(*st) + (size_t)B * sizeof(uint32_t));
	m = (struct backend_move){ .block = from, .host = stage_at(p, slot) };
	if (!st || dpool_move(p, BACKEND_TO_HOST, &m, 1, &st->ticket) < 0) {
		stage_put(p, slot);
		free(st);
		return 0;
	}
	st->tokens = (uint32_t *)(st + 1);
	memcpy(st->tokens, key->tokens, (size_t)B * sizeof(uint32_t));
	le64(st->ns, key->salt);
	st->pool_block = CORE_NONE;
	st->stage = slot;
	st->next = NULL;
	st->block = (struct remote_block){ .tokens = st->tokens, .data = m.host };
	hash_bytes(st->block.hash, key->hash);
	hash_bytes(st->block.parent, key->parent);
	st->job = (struct remote_job){ .kind = REMOTE_STORE, .ns = st->ns, .ns_len = sizeof(st->ns),
				       .blocks = &st->block, .nblocks = 1, .user = st };
	if (p->remote_out_tail)
		p->remote_out_tail->next = st;
	else
		p->remote_out = st;
	p->remote_out_tail = st;
	dpool_remote_settle(p); /* a backend that moved it already */
	return 0;
}

void dpool_remote_settle(struct dpool *p)
{
	while (p->remote_out && dpool_passed(p, p->remote_out->ticket)) {
		struct rstore *st = p->remote_out;

		p->remote_out = st->next;
		if (!p->remote_out)
			p->remote_out_tail = NULL;
		if (p->failed || remote_store(p->remote, &st->job) < 0) {
			stage_put(p, st->stage);
			free(st);
		}
	}
	for (struct rfetch **fp = &p->remote_in, *f; (f = *fp);) {
		if (!dpool_passed(p, f->ticket)) {
			fp = &f->next;
			continue;
		}
		*fp = f->next;
		for (size_t i = 0; i < f->job.nblocks; i++)
			stage_put(p, f->stage[i]);
		free(f);
	}
}

void dpool_remote_stage_free(struct dpool *p)
{
	while (p->remote_out) {
		struct rstore *st = p->remote_out;

		p->remote_out = st->next;
		free(st);
	}
	p->remote_out_tail = NULL;
	while (p->remote_in) {
		struct rfetch *f = p->remote_in;

		p->remote_in = f->next;
		free(f);
	}
	if (p->remote_stage)
		p->mem.ops->host_free(&p->mem, p->remote_stage,
				      (uint64_t)p->remote_stage_slots * p->block_bytes);
	p->remote_stage = NULL;
	free(p->remote_stage_free);
	p->remote_stage_free = NULL;
}

static int store_evicted(struct dpool *p, uint32_t from_tier, uint32_t from,
			 const struct core_key *key)
{
	const uint32_t B = p->cfg->block_tokens;
	struct tier_key tk = { .hash_lo = key->hash.lo, .hash_hi = key->hash.hi,
			       .parent_lo = key->parent.lo, .parent_hi = key->parent.hi,
			       .salt = key->salt, .extra = key->extra, .tokens = key->tokens };
	const void *data;
	struct rstore *st;

	if (from_tier == CORE_TIER_POOL && !p->mem.base) {
		return store_staged(p, from, key);
	} else if (from_tier == CORE_TIER_POOL) {
		data = block_at(p, from);
	} else if (from_tier == p->host_level) {
		struct tier_key stored;

		/* The slot's tokens are the tier's; a move into it may still be coming. */
		host_tier_key(p->host, from, &stored);
		tk.tokens = stored.tokens;
		if (p->host_direct)
			dpool_wait(p, &p->slot_ticket[from]);
		data = p->failed ? NULL : host_tier_lookup(p->host, from, &tk);
		if (!data)
			return 0;
	} else {
		return 0; /* a cold level (the swap files): published as it left memory */
	}
	st = malloc(sizeof(*st) + (size_t)B * sizeof(uint32_t) + p->block_bytes);
	if (!st)
		return 0;
	st->tokens = (uint32_t *)(st + 1);
	memcpy(st->tokens, tk.tokens, (size_t)B * sizeof(uint32_t));
	memcpy(st->tokens + B, data, p->block_bytes);
	le64(st->ns, key->salt);
	st->pool_block = CORE_NONE;
	st->stage = NO_SLOT;
	st->block = (struct remote_block){ .tokens = st->tokens, .data = st->tokens + B };
	hash_bytes(st->block.hash, key->hash);
	hash_bytes(st->block.parent, key->parent);
	st->job = (struct remote_job){ .kind = REMOTE_STORE, .ns = st->ns, .ns_len = sizeof(st->ns),
				       .blocks = &st->block, .nblocks = 1, .user = st };
	if (remote_store(p->remote, &st->job) < 0)
		free(st);
	return 0;
}

static int remote_store_op(void *ctx, uint32_t from_tier, uint32_t from, uint32_t to_tier,
			   uint32_t to, const struct core_key *key)
{
	struct dpool *p = ctx;
	struct rstore *st;
	int r;

	(void)to_tier;
	(void)to;
	if (!p->remote)
		return 0;
	if (p->cfg->remote_tier_write == KVPD_REMOTE_EVICT)
		return store_evicted(p, from_tier, from, key);
	if (from_tier != CORE_TIER_POOL)
		return 0;
	if (!p->mem.base)
		return store_staged(p, from, key);
	/* A queued copy into it (copy_thread) would race the seal: not published. */
	if (!dpool_passed(p, p->block_ticket[from]))
		return 0;
	st = malloc(sizeof(*st));
	if (!st)
		return -ENOMEM;
	le64(st->ns, key->salt);
	st->pool_block = from;
	st->stage = NO_SLOT;
	st->block = (struct remote_block){ .tokens = key->tokens, .data = block_at(p, from) };
	hash_bytes(st->block.hash, key->hash);
	hash_bytes(st->block.parent, key->parent);
	st->job = (struct remote_job){ .kind = REMOTE_STORE, .ns = st->ns, .ns_len = sizeof(st->ns),
				       .blocks = &st->block, .nblocks = 1, .user = st };
	r = remote_store(p->remote, &st->job);
	if (r < 0) {
		free(st);
		return r == -EBUSY ? 0 : r;
	}
	return 1;
}

/* Never asked: the core probes the level only for deferred loads (dpool_remote_load). */
static void remote_load_op(void *ctx, struct core_load *loads, uint32_t n)
{
	(void)ctx;
	for (uint32_t i = 0; i < n; i++)
		loads[i].result = -ENOENT;
}

const struct core_tier_ops dpool_remote_tier_ops = { .store = remote_store_op,
						     .load = remote_load_op };

int dpool_remote_load(struct dpool *p, struct load_wait *w, struct core_load *loads, uint32_t n)
{
	struct rfetch *f;
	uint32_t m = 0, first = UINT32_MAX;
	uint64_t fence = 0;
	int r;

	for (uint32_t i = 0; i < n; i++)
		if (loads[i].tier == p->remote_level) {
			m++;
			if (first == UINT32_MAX)
				first = i;
		}
	if (!m)
		return 0;
	f = calloc(1, sizeof(*f) + m * (sizeof(struct remote_block) + 2 * sizeof(uint32_t)));
	if (!f) {
		r = -ENOMEM;
		goto fail;
	}
	f->which = (uint32_t *)(f->blocks + m);
	f->stage = f->which + m;
	f->wait = w;
	/* A device pool's fetch lands in staging slots, one per block, or is not made. */
	for (uint32_t k = 0; k < m; k++)
		f->stage[k] = NO_SLOT;
	if (!p->mem.base) {
		if (p->remote_stage_nfree < m) {
			p->remote_stage_full++;
			free(f);
			r = -EBUSY;
			goto fail;
		}
		for (uint32_t k = 0; k < m; k++)
			f->stage[k] = stage_take(p);
	}
	dpool_flush(p); /* gathered demotions set the tickets read below */
	le64(f->ns, loads[first].key.salt);
	m = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct remote_block *b = &f->blocks[m];

		if (loads[i].tier != p->remote_level)
			continue;
		/* The key's tokens are the block's own in the core: they stay until loaded. */
		*b = (struct remote_block){ .tokens = loads[i].key.tokens,
					    .data = p->mem.base ? block_at(p, loads[i].block)
								: stage_at(p, f->stage[m]) };
		hash_bytes(b->hash, loads[i].key.hash);
		hash_bytes(b->parent, loads[i].key.parent);
		if (p->block_ticket[loads[i].block] > fence)
			fence = p->block_ticket[loads[i].block];
		f->which[m++] = i;
	}
	/*
	 * A block the allocation evicted may still be on its way out (a demotion, queued with
	 * copy_thread): the thread writes into it only after.  Instant for plain host memory; with
	 * copy_thread the loop waits for those moves (counted in cpu_waits).  A device pool's
	 * fetch writes its staging only: its moves in queue behind whatever touches the blocks.
	 */
	if (p->mem.base)
		dpool_wait(p, &fence);
	f->job = (struct remote_job){ .kind = REMOTE_FETCH, .ns = f->ns, .ns_len = sizeof(f->ns),
				      .blocks = f->blocks, .nblocks = m, .user = f };
	r = p->failed ? p->failed : remote_fetch(p->remote, &f->job);
	if (r < 0) {
		for (uint32_t k = 0; k < m; k++)
			stage_put(p, f->stage[k]);
		free(f);
		goto fail;
	}
	p->remote_fetching++;
	w->parts++;
	log_debug("pool %s: sequence %llu: fetching %u blocks from the remote tier, the loop going "
		  "on", p->cfg->name, (unsigned long long)w->seq, m);
	return 1;
fail:
	/* Recomputed, as any failed load; the tier counted a busy queue. */
	for (uint32_t i = 0; i < n; i++)
		if (loads[i].tier == p->remote_level)
			loads[i].result = r;
	return r;
}

/* With remote_tier_bandwidth = auto: what the fetches move, folded into the cost model. */
static void bandwidth_sample(struct dpool *p, const struct remote_job *job)
{
	uint64_t bytes = 0;

	for (size_t i = 0; i < job->nblocks; i++) {
		/* A late block's wait is the deadline's, not the network's: no figure. */
		if (job->blocks[i].status == REMOTE_LATE)
			return;
		bytes += job->blocks[i].status == REMOTE_OK ? p->block_bytes : 0;
	}
	if (!bytes || p->cfg->remote_tier_bandwidth != KVPD_MEASURE)
		return;
	p->remote_sample_bytes += bytes;
	p->remote_sample_ns += job->latency_ns ? job->latency_ns : 1;
	/* A figure from at least 16 blocks' worth, then weighed with the last one. */
	if (p->remote_sample_bytes < 16 * p->block_bytes)
		return;
	double bw = (double)p->remote_sample_bytes * 1e9 / (double)p->remote_sample_ns;

	p->remote_bandwidth = p->remote_bandwidth > 0 ? 0.75 * p->remote_bandwidth + 0.25 * bw : bw;
	p->remote_sample_bytes = p->remote_sample_ns = 0;
	(void)core_tier_set_bandwidth(p->core, p->remote_level, p->remote_bandwidth);
	/*
	 * A rate at which fetching loses stops the fetches, and with them the samples that could
	 * say the network got better: it is forgotten after a while, and measured afresh.
	 */
	if (!core_tier_promotes(p->core, p->remote_level))
		p->remote_retry_ns = server_now_ns() + REMOTE_RETRY_NS;
}

void dpool_remote_recheck(struct dpool *p)
{
	if (!p->remote_retry_ns || server_now_ns() < p->remote_retry_ns)
		return;
	p->remote_retry_ns = 0;
	p->remote_bandwidth = 0;
	(void)core_tier_set_bandwidth(p->core, p->remote_level, 0);
	log_info("pool %s: remote tier: measuring its bandwidth again (fetching lost to "
		 "recomputing)", p->cfg->name);
}

/*
 * Queues the moves of a device pool's fetched blocks from their staging into the pool: false
 * when some went (the staging waits for them, f->ticket), true when none did.  A move that
 * fails is a failed load.
 */
static bool moves_in(struct dpool *p, struct rfetch *f, struct core_load *loads, uint32_t n)
{
	struct backend_move *mv = malloc(f->job.nblocks * sizeof(*mv));
	uint32_t nm = 0;
	int r;

	for (size_t i = 0; i < f->job.nblocks; i++) {
		if (f->which[i] >= n || loads[f->which[i]].result != 0)
			continue;
		if (!mv) {
			loads[f->which[i]].result = -ENOMEM;
			continue;
		}
		mv[nm++] = (struct backend_move){ .block = loads[f->which[i]].block,
						  .host = stage_at(p, f->stage[i]) };
	}
	r = nm ? dpool_move(p, BACKEND_FROM_HOST, mv, nm, &f->ticket) : 0;
	if (r < 0)
		for (size_t i = 0; i < f->job.nblocks; i++)
			if (f->which[i] < n && loads[f->which[i]].result == 0)
				loads[f->which[i]].result = r;
	free(mv);
	return !nm || r < 0;
}

static void job_back(struct remote_job *job, void *arg)
{
	struct dpool *p = arg;

	if (job->kind == REMOTE_STORE) {
		struct rstore *st = job->user;

		announce_store(p, st);
		stage_put(p, st->stage);
		/* A block kept for the store may be reused now: waiters for memory may go on. */
		if (p->core && st->pool_block != CORE_NONE &&
		    core_tier_stored(p->core, p->remote_level, st->pool_block) == 0)
			p->epoch++;
		free(st);
		return;
	}
	struct rfetch *f = job->user;
	struct core_load *loads;
	uint32_t n;

	p->remote_fetching--;
	if (!p->core) {
		/* The pool is going (remote_free's done): the sessions are gone already. */
		if (--f->wait->parts == 0)
			free(f->wait);
		for (size_t i = 0; i < job->nblocks; i++)
			stage_put(p, f->stage[i]);
		free(f);
		return;
	}
	core_seq_pending_loads(p->core, f->wait->seq, &loads, &n);
	for (size_t i = 0; i < job->nblocks; i++) {
		const enum remote_status st = job->blocks[i].status;

		if (f->which[i] >= n)
			continue;
		loads[f->which[i]].result = load_result(&job->blocks[i]);
		/* Not there, or not ours to read: gone from the tier as far as a router knows. */
		if (st == REMOTE_ABSENT || st == REMOTE_VERIFY)
			dpool_events_remote_gone(p, loads[f->which[i]].key.hash.lo);
	}
	bandwidth_sample(p, job);
	/* A device pool's hits move in from the staging (before the load ends: replies wait). */
	if (!p->mem.base && !moves_in(p, f, loads, n)) {
		dpool_load_part_done(p, f->wait);
		f->next = p->remote_in; /* its slots wait for the moves */
		p->remote_in = f;
		return;
	}
	dpool_load_part_done(p, f->wait);
	for (size_t i = 0; i < job->nblocks; i++)
		stage_put(p, f->stage[i]);
	free(f);
}

void dpool_remote_poll(struct dpool *p)
{
	if (p->remote)
		(void)remote_reap(p->remote, job_back, p);
}

void dpool_arm_remote_poll(struct server *srv, struct dpool *p)
{
	struct io_uring_sqe *sqe;

	if (!p->remote || p->remote_armed)
		return;
	sqe = server_sqe(srv);
	p->remote_op = (struct op){ .kind = OP_REMOTE, .pool = p };
	io_uring_prep_poll_multishot(sqe, remote_fd(p->remote), POLLIN);
	io_uring_sqe_set_data(sqe, &p->remote_op);
	p->remote_armed = true;
}

int dpool_remote_open(struct dpool *p, uint32_t *ret_probe)
{
	const struct kvpd_pool_config *c = p->cfg;
	const struct remote_config rc = {
		.url = c->remote_tier,
		.key_file = c->remote_tier_key_file,
		.old_key_files = (const char *const *)c->remote_tier_old_key_files,
		.n_old_key_files = c->n_remote_tier_old_key_files,
		.geometry = { .layers = c->layers, .kv_heads = c->kv_heads,
			      .head_dim = c->head_dim, .elem_bytes = c->element_bytes,
			      .block_tokens = c->block_tokens, .payload_bytes = p->block_bytes },
		.timeout_ms = c->remote_tier_timeout_ms,
		.max_inflight = c->remote_tier_max_inflight,
		.ttl_ms = c->remote_tier_ttl_ms,
	};
	char err[512] = "";
	int r;

	if (!c->remote_tier)
		return 0;
	*ret_probe = c->remote_tier_max_inflight / 2 ? c->remote_tier_max_inflight / 2 : 1;
	if (!p->mem.base) {
		/*
		 * A pool on a device: values are sealed from and opened into a pinned staging, as
		 * many blocks as may be in flight, at most 256 MiB; a lookup asks for half of it.
		 */
		uint64_t n = (UINT64_C(256) << 20) / p->block_bytes;

		n = n < 2 ? 2 : n > c->remote_tier_max_inflight ? c->remote_tier_max_inflight : n;
		r = p->mem.ops->host_alloc(&p->mem, n * p->block_bytes, &p->remote_stage);
		p->remote_stage_free = r == 0 ? malloc(n * sizeof(uint32_t)) : NULL;
		if (r < 0 || !p->remote_stage_free)
			return log_error_errno(r < 0 ? r : -ENOMEM, "pool %s: cannot allocate %llu "
					       "bytes of pinned staging for the remote tier: %m",
					       c->name, (unsigned long long)(n * p->block_bytes));
		p->remote_stage_slots = (uint32_t)n;
		for (uint32_t i = 0; i < n; i++)
			p->remote_stage_free[p->remote_stage_nfree++] = (uint32_t)(n - 1 - i);
		*ret_probe = (uint32_t)(n / 2 ? n / 2 : 1);
		log_info("pool %s: the remote tier goes through a pinned staging of %llu blocks",
			 c->name, (unsigned long long)n);
	}
	r = remote_new(&rc, err, sizeof(err), &p->remote);
	if (r < 0)
		return log_error_errno(r, "pool %s: remote_tier: %s", c->name, err);
	p->remote_bandwidth = c->remote_tier_bandwidth == KVPD_MEASURE
				      ? 0 /* unknown: fetched until measured */
				      : (double)c->remote_tier_bandwidth;
	log_info("pool %s: remote tier %s (writes at %s, %u ms deadline, %u blocks in flight)",
		 c->name, c->remote_tier, c->remote_tier_write == KVPD_REMOTE_COMMIT ? "commit" : "evict",
		 c->remote_tier_timeout_ms, c->remote_tier_max_inflight);
	return 0;
}

void dpool_remote_close(struct dpool *p)
{
	struct core *core = p->core;

	/* What the thread still has comes back cancelled; the core goes with the pool anyway. */
	p->core = NULL;
	p->remote = remote_free(p->remote, job_back, p);
	p->core = core;
}

int dpool_remote_salt(const struct dpool *p, const char *name, uint64_t *ret)
{
	return remote_namespace_salt(p->remote, name, strlen(name), ret);
}

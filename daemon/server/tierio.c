/* SPDX-License-Identifier: MIT */
/*
 * The host tier's bytes move between the pool and its slots through the backend's moves:
 * memcpy for a pool in host memory, the bus for a pool on a device when the tier's arena is
 * pinned (host_direct; else a device pool's host tier is reached through the staging).  The
 * file tier reads and writes a host pool's blocks itself, and a device pool's through the
 * pinned staging, stage_blocks blocks at a time.  Only these CPU paths wait for the queue.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

#include "daemon/log.h"
#include "daemon/server/pool-internal.h"
#include "daemon/server/server.h"
#include "proto/cleanup.h"

static struct tier_key tier_key_of(const struct core_key *k)
{
	return (struct tier_key){ .hash_lo = k->hash.lo, .hash_hi = k->hash.hi,
				  .parent_lo = k->parent.lo, .parent_hi = k->parent.hi,
				  .salt = k->salt, .extra = k->extra, .tokens = k->tokens };
}

/* Block k of a staging. */
static void *stage_at(const struct dpool *p, void *stage, uint32_t k)
{
	return (char *)stage + (uint64_t)k * p->block_bytes;
}

/* A device pool's block into the staging, waited for: the CPU reads it next. */
static int move_to_stage(struct dpool *p, uint32_t block)
{
	struct backend_move m = { .block = block, .host = p->stage };
	int r = dpool_move(p, BACKEND_TO_HOST, &m, 1, &p->stage_ticket);

	if (r == 0)
		dpool_wait(p, &p->stage_ticket);
	return r < 0 ? r : p->failed;
}

/* A queued write failed: remember the slot; dpool_tier_poll tells the core between calls. */
void dpool_on_file_lost(void *ctx, uint32_t slot, int err)
{
	struct dpool *p = ctx;

	log_warning("pool %s: file tier write of slot %u failed: %s; the block is dropped",
		    p->cfg->name, slot, strerror(-err));
	if (p->nlost == p->lost_cap) {
		uint32_t cap = p->lost_cap ? p->lost_cap * 2 : 64;
		uint32_t *grown = realloc(p->lost, cap * sizeof(*grown));

		if (!grown) {
			p->lost_overflow = true;
			return;
		}
		p->lost = grown;
		p->lost_cap = cap;
	}
	p->lost[p->nlost++] = slot;
}

/*
 * A device pool's demotions straight to the swap files (no pinned host tier in between): the
 * block is moved out into a slot of the store staging, queued, and handed to the file tier once
 * the move is done, oldest first (the file tier copies it at once, which frees the slot).  The
 * core has the file slot from the start; anything that reads or writes that file slot first
 * settles its pending store.
 */
/* The file tier never got the block: the core forgets the slot at the next tier poll. */
static void store_lost(struct dpool *p, uint32_t file_slot, int err)
{
	dpool_on_file_lost(p, file_slot, err);
	(void)eventfd_write(file_tier_event_fd(p->file), 1);
}

/*
 * Hands the pending stores whose moves are done to the file tier, oldest first; the first
 * `wait` of them are waited for if need be (the loop blocks, counted).
 */
void dpool_stores_settle(struct dpool *p, uint32_t wait)
{
	while (p->nstores) {
		struct pending_store *e = &p->stores[p->store_head];

		if (p->failed) {
			/* Their moves will never be known done: none goes to the files. */
		} else if (wait) {
			dpool_wait(p, &e->ticket);
			wait--;
		} else if (!dpool_passed(p, e->ticket)) {
			break;
		}
		if (p->failed) {
			store_lost(p, e->file_slot, p->failed); /* its bytes may never have arrived */
		} else {
			int r = file_tier_store(p->file, e->file_slot, &e->key,
						stage_at(p, p->store_stage, p->store_head));

			if (r < 0)
				store_lost(p, e->file_slot, r);
		}
		p->store_head = (p->store_head + 1) % p->stage_blocks;
		p->nstores--;
	}
}

/* How many pending stores, oldest first, reach the last one of any of these file slots. */
static uint32_t stores_reaching(const struct dpool *p, const uint32_t *slots, uint32_t n)
{
	uint32_t upto = 0;

	for (uint32_t k = 0; k < p->nstores; k++)
		for (uint32_t i = 0; i < n; i++)
			if (p->stores[(p->store_head + k) % p->stage_blocks].file_slot == slots[i])
				upto = k + 1;
	return upto;
}

/* Settles the pending stores up to the last one of any of these file slots, waiting. */
static void stores_settle_slots(struct dpool *p, const uint32_t *slots, uint32_t n)
{
	uint32_t upto = stores_reaching(p, slots, n);

	if (upto)
		dpool_stores_settle(p, upto);
}

/* Queues a device pool's block for file slot `to` through the store staging. */
static int store_queued(struct dpool *p, uint32_t from, uint32_t to, const struct core_key *ck)
{
	const uint32_t B = p->cfg->block_tokens;
	struct pending_store *e;
	struct backend_move m;
	uint64_t ticket;
	uint32_t k;
	int r;

	dpool_stores_settle(p, 0); /* those done free their slots */
	if (p->nstores == p->stage_blocks)
		dpool_stores_settle(p, 1); /* full: the oldest is waited for */
	k = (p->store_head + p->nstores) % p->stage_blocks;
	m = (struct backend_move){ .block = from, .host = stage_at(p, p->store_stage, k) };
	r = dpool_move(p, BACKEND_TO_HOST, &m, 1, &ticket);
	if (r < 0)
		return r;
	e = &p->stores[k];
	e->ticket = ticket;
	e->file_slot = to;
	e->key = tier_key_of(ck);
	memcpy(&p->store_tokens[(size_t)k * B], ck->tokens, (size_t)B * sizeof(uint32_t));
	e->key.tokens = &p->store_tokens[(size_t)k * B];
	p->nstores++;
	return 0;
}

/*
 * The bytes of pool block `from` for the CPU to copy: a device pool's through the staging,
 * a host pool's once no queued promotion into it is left.
 */
static int pool_bytes(struct dpool *p, uint32_t from, const void **ret)
{
	int r;

	if (!p->mem.base) {
		r = move_to_stage(p, from);
		if (r < 0)
			return r;
		*ret = p->stage;
		return 0;
	}
	dpool_wait(p, &p->block_ticket[from]); /* a promotion into it may be queued */
	if (p->failed)
		return p->failed;
	*ret = block_at(p, from);
	return 0;
}

/* The host tier's core_tier_ops.store: a pool block into a host slot (it is the first level). */
static int host_store(void *ctx, uint32_t from_tier, uint32_t from, uint32_t to_tier,
		      uint32_t to, const struct core_key *ck)
{
	struct dpool *p = ctx;
	struct tier_key key = tier_key_of(ck);
	const void *data;
	int r;

	if (from_tier != CORE_TIER_POOL)
		return -EINVAL; /* tiers_open lists it first: nothing is above it but the pool */
	if (p->host_direct) {
		/*
		 * Gathered into the batch (flush_demotions), committed now: every later use of the
		 * slot either queues behind the batch or waits for it.
		 */
		for (uint32_t i = 0; i < p->nout; i++)
			if (p->out[i].block == from || p->out_slots[i] == to) {
				dpool_flush(p);
				break;
			}
		p->out[p->nout] = (struct backend_move){
			.block = from, .host = host_tier_slot_for_write(p->host, to) };
		p->out_slots[p->nout++] = to;
		host_tier_commit(p->host, to, &key);
		if (p->nout == OUT_MAX_BLOCKS)
			dpool_flush(p);
		return 0;
	}
	r = pool_bytes(p, from, &data);
	if (r < 0)
		return r;
	host_tier_store(p->host, to, &key, data);
	return 0;
}

/* The file tier's core_tier_ops.store: a pool block or a host slot into a file slot. */
static int file_store(void *ctx, uint32_t from_tier, uint32_t from, uint32_t to_tier,
		      uint32_t to, const struct core_key *ck)
{
	struct dpool *p = ctx;
	struct tier_key key = tier_key_of(ck);
	const void *data;
	int r;

	if (from_tier == CORE_TIER_POOL && p->store_stage)
		return store_queued(p, from, to, ck);
	if (from_tier == CORE_TIER_POOL) {
		r = pool_bytes(p, from, &data);
		if (r < 0)
			return r;
	} else {
		struct tier_key stored;

		if (from_tier != p->host_level)
			return -EINVAL;
		/* Host to file: the host slot has the tokens, and maybe a move still coming. */
		host_tier_key(p->host, from, &stored);
		key.tokens = stored.tokens;
		if (p->host_direct)
			dpool_wait(p, &p->slot_ticket[from]);
		if (p->failed)
			return p->failed; /* the slot's bytes may never have arrived */
		/* A slot whose move failed matches nothing: its stale bytes must not go down. */
		data = host_tier_lookup(p->host, from, &key);
		if (!data)
			return -EBADMSG;
	}
	stores_settle_slots(p, &to, 1); /* an older store of this slot must not land after it */
	return file_tier_store(p->file, to, &key, data);
}

static void warn_file_load(const struct dpool *p, uint32_t slot, int r)
{
	log_warning("pool %s: file tier slot %u: %s; its tokens will be recomputed", p->cfg->name,
		    slot, r == -EBADMSG ? "checksum or identity mismatch" : strerror(-r));
}

/* Whether a load goes through the staging (else straight from its slot, or into the block). */
static bool load_is_staged(const struct dpool *p, const struct core_load *l)
{
	return !p->mem.base && (l->tier == p->file_level || !p->host_direct);
}

/* Whether a load is a host-tier hit that moves straight from its slot. */
static bool load_is_direct(const struct dpool *p, const struct core_load *l)
{
	return l->tier == p->host_level && p->host_direct;
}

/*
 * The hits in a host tier reached by moves: checked against their slots' identities, then
 * moved from the slots into the pool in one queued move.
 */
static void load_host_direct(struct dpool *p, struct core_load *loads, uint32_t n)
{
	_cleanup_free_ struct backend_move *moves = NULL;
	_cleanup_free_ uint32_t *which = NULL;
	uint32_t ndirect = 0, nmoves = 0;
	int r;

	dpool_flush(p); /* a slot looked up below may be in the batch, its move to fail */
	for (uint32_t i = 0; i < n; i++)
		ndirect += load_is_direct(p, &loads[i]);
	if (!ndirect)
		return;
	moves = malloc(ndirect * sizeof(*moves));
	which = malloc(ndirect * sizeof(*which));
	if (!moves || !which) {
		/* No memory for the batch: every such hit is a miss, recomputed. */
		for (uint32_t i = 0; i < n; i++)
			if (load_is_direct(p, &loads[i]))
				loads[i].result = -ENOMEM;
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct tier_key key = tier_key_of(&loads[i].key);
		const void *data;

		if (!load_is_direct(p, &loads[i]))
			continue;
		data = host_tier_lookup(p->host, loads[i].slot, &key);
		if (!data) {
			loads[i].result = -EBADMSG;
			continue;
		}
		/* A move into the pool only reads its host side. */
		moves[nmoves] = (struct backend_move){ .block = loads[i].block, .host = (void *)data };
		which[nmoves++] = i;
	}
	r = nmoves ? dpool_move(p, BACKEND_FROM_HOST, moves, nmoves, NULL) : 0;
	for (uint32_t k = 0; k < nmoves; k++)
		loads[which[k]].result = r;
}

/*
 * A device pool's other hits: each chunk is read into the staging, then moved in.  Without
 * files, only the host tier's (the file tier's are a deferred job's).
 */
static void load_staged(struct dpool *p, struct core_load *loads, uint32_t n, bool files)
{
	const uint32_t cap = p->stage_blocks;
	struct core_load *chunk[STAGE_MAX_BLOCKS];
	struct backend_move moves[STAGE_MAX_BLOCKS];
	uint32_t fslots[STAGE_MAX_BLOCKS], fwhich[STAGE_MAX_BLOCKS];
	struct tier_key fkeys[STAGE_MAX_BLOCKS];
	void *fdsts[STAGE_MAX_BLOCKS];
	int results[STAGE_MAX_BLOCKS], fresults[STAGE_MAX_BLOCKS];
	uint32_t next = 0;

	for (;;) {
		uint32_t k, count = 0, nfile = 0, nmoves = 0;
		int r;

		/* No staging was allocated when nothing needs it (cap 0): nothing is taken then. */
		for (; next < n && count < cap; next++)
			if (load_is_staged(p, &loads[next]) &&
			    (files || loads[next].tier != p->file_level))
				chunk[count++] = &loads[next];
		if (!count)
			break;
		/* The staging is the CPU's again once the last move reading it is done. */
		dpool_wait(p, &p->stage_ticket);
		for (k = 0; k < count; k++) {
			struct tier_key key = tier_key_of(&chunk[k]->key);

			if (chunk[k]->tier == p->host_level) {
				results[k] = host_tier_load(p->host, chunk[k]->slot, &key,
							    stage_at(p, p->stage, k));
				continue;
			}
			fslots[nfile] = chunk[k]->slot;
			fkeys[nfile] = key;
			fdsts[nfile] = stage_at(p, p->stage, k);
			fwhich[nfile++] = k;
		}
		if (nfile) {
			stores_settle_slots(p, fslots, nfile); /* their blocks may be on the way */
			file_tier_load(p->file, nfile, fslots, fkeys, fdsts, fresults);
			for (uint32_t f = 0; f < nfile; f++) {
				results[fwhich[f]] = fresults[f];
				if (fresults[f] < 0)
					warn_file_load(p, fslots[f], fresults[f]);
			}
		}
		for (k = 0; k < count; k++)
			if (results[k] == 0)
				moves[nmoves++] = (struct backend_move){ .block = chunk[k]->block,
									 .host = stage_at(p, p->stage, k) };
		r = nmoves ? dpool_move(p, BACKEND_FROM_HOST, moves, nmoves, &p->stage_ticket) : 0;
		for (k = 0; k < count; k++)
			chunk[k]->result = results[k] == 0 ? r : results[k];
	}
	/* Only if the staging is missing where it is needed, which dpool_init() rules out. */
	for (; next < n; next++)
		if (load_is_staged(p, &loads[next]) && (files || loads[next].tier != p->file_level))
			loads[next].result = -ENOMEM;
}

/*
 * The latest ticket touching any of the loads' blocks that the file tier writes itself (the
 * demotions gathered so far go out first: one of them may read such a block).
 */
static uint64_t file_loads_fence(struct dpool *p, const struct core_load *loads, uint32_t n)
{
	uint64_t fence = 0;

	dpool_flush(p);
	for (uint32_t i = 0; i < n; i++)
		if (loads[i].tier == p->file_level && p->block_ticket[loads[i].block] > fence)
			fence = p->block_ticket[loads[i].block];
	return fence;
}

/*
 * The host tier's core_tier_ops.load: its hits are queued moves, straight from their slots, or
 * (an unpinned tier of a device pool) through the staging.
 */
static void host_load(void *ctx, struct core_load *loads, uint32_t n)
{
	struct dpool *p = ctx;

	load_host_direct(p, loads, n);
	if (!p->mem.base)
		load_staged(p, loads, n, false);
}

/*
 * The file tier's core_tier_ops.load: its hits are read in one batch, into a host pool's
 * blocks once nothing queued touches them, a device pool's through the staging.
 */
static void file_load(void *ctx, struct core_load *loads, uint32_t n)
{
	struct dpool *p = ctx;
	_cleanup_free_ uint32_t *slots = NULL;
	_cleanup_free_ struct tier_key *keys = NULL;
	_cleanup_free_ void **dsts = NULL;
	_cleanup_free_ int *results = NULL;
	uint64_t fence;

	if (!p->mem.base) {
		load_staged(p, loads, n, true);
		return;
	}
	slots = malloc(n * sizeof(*slots));
	keys = malloc(n * sizeof(*keys));
	dsts = malloc(n * sizeof(*dsts));
	results = malloc(n * sizeof(*results));
	if (!slots || !keys || !dsts || !results) {
		/* No memory for the batch: every file hit is a miss, recomputed. */
		for (uint32_t i = 0; i < n; i++)
			loads[i].result = -ENOMEM;
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		slots[i] = loads[i].slot;
		keys[i] = tier_key_of(&loads[i].key);
		dsts[i] = block_at(p, loads[i].block);
	}
	fence = file_loads_fence(p, loads, n);
	dpool_wait(p, &fence);
	if (p->failed) {
		for (uint32_t i = 0; i < n; i++)
			loads[i].result = p->failed;
		return;
	}
	file_tier_load(p->file, n, slots, keys, dsts, results);
	for (uint32_t i = 0; i < n; i++) {
		loads[i].result = results[i];
		if (results[i] < 0)
			warn_file_load(p, slots[i], results[i]);
	}
}

const struct core_tier_ops dpool_host_tier_ops = { .store = host_store, .load = host_load };
const struct core_tier_ops dpool_file_tier_ops = { .store = file_store, .load = file_load };

/* file_tier_load_start's done: the head job's reads are in (finished in dpool_tier_poll). */
static void job_done(void *ctx)
{
	struct dpool *p = ctx;

	p->jobs->finished = true;
}

/* A pool on a device reads into its load staging, then moves the blocks in. */
static bool job_staged(const struct dpool *p)
{
	return !p->mem.base;
}

/*
 * Starts the head job's reads once the backend's queue is past every operation on their
 * destination: for a pool in host memory its blocks (an eviction that freed one may still be
 * moving it out), for a pool on a device the load staging (the last chunk's move in may still
 * be reading it).  Else dpool_backend_poll starts them.
 */
static void job_start(struct dpool *p, struct load_job *job)
{
	int r;

	if (job->started || !dpool_passed(p, job_staged(p) ? p->load_stage_ticket : job->fence))
		return;
	job->started = true;
	job->count = job->n - job->first;
	if (job_staged(p)) {
		if (job->count > p->stage_blocks)
			job->count = p->stage_blocks;
		/* A slot whose block is still on its way to the files: after its store. */
		if (stores_reaching(p, job->slots + job->first, job->count)) {
			job->started = false;
			return;
		}
		for (uint32_t k = 0; k < job->count; k++)
			job->dsts[job->first + k] = stage_at(p, p->load_stage, k);
	}
	r = file_tier_load_start(p->file, job->count, job->slots + job->first,
				 job->keys + job->first, job->dsts + job->first,
				 job->results + job->first, job_done, p);
	if (r < 0) {
		log_warning("pool %s: cannot start reading %u blocks from the file tier: %s; "
			    "they are recomputed", p->cfg->name, job->count, strerror(-r));
		for (uint32_t k = job->first; k < job->first + job->count; k++)
			job->results[k] = r;
		/* The next dpool_tier_poll finishes it: the eventfd brings the loop round. */
		job->finished = true;
		(void)eventfd_write(file_tier_event_fd(p->file), 1);
	}
}

/*
 * The head job's chunk is read.  A pool on a device moves what was read in from the load
 * staging (one queued move), and goes on with the next chunk.  True when the job is done.
 */
static bool job_chunk_done(struct dpool *p, struct load_job *job)
{
	struct backend_move moves[STAGE_MAX_BLOCKS];
	uint32_t idx[STAGE_MAX_BLOCKS], m = 0;
	struct core_load *loads;
	uint32_t n;
	int r;

	if (!job_staged(p)) {
		job->first = job->n;
		return true;
	}
	core_seq_pending_loads(p->core, job->seq, &loads, &n);
	for (uint32_t k = job->first; k < job->first + job->count; k++)
		if (job->results[k] == 0) {
			moves[m] = (struct backend_move){ .block = loads[job->which[k]].block,
							  .host = job->dsts[k] };
			idx[m++] = k;
		}
	r = m ? dpool_move(p, BACKEND_FROM_HOST, moves, m, &p->load_stage_ticket) : 0;
	for (uint32_t i = 0; i < m; i++)
		job->results[idx[i]] = r;
	job->first += job->count;
	job->count = 0;
	if (job->first == job->n)
		return true;
	job->started = job->finished = false;
	return false;
}

static void job_finish(struct dpool *p, struct load_job *job)
{
	struct core_load *loads;
	uint32_t n;

	core_seq_pending_loads(p->core, job->seq, &loads, &n);
	for (uint32_t k = 0; k < job->n; k++) {
		loads[job->which[k]].result = job->results[k];
		if (job->results[k] < 0)
			warn_file_load(p, job->slots[k], job->results[k]);
	}
	dpool_load_part_done(p, job->wait);
	free(job);
}

void dpool_load_part_done(struct dpool *p, struct load_wait *w)
{
	if (--w->parts > 0)
		return;
	core_seq_loaded(p->core, w->seq);
	p->epoch++; /* failed loads may have freed tier slots; waiters may go on */
	session_loaded(w->s, w->seq);
	session_unref(w->s);
	free(w);
}

int dpool_load(struct dpool *p, struct session *s, uint64_t seq)
{
	struct load_job *job;
	struct load_wait *w;
	struct core_load *loads;
	uint32_t n, nfile = 0, nremote = 0;
	size_t size;
	char *mem;

	core_seq_pending_loads(p->core, seq, &loads, &n);
	for (uint32_t i = 0; i < n; i++) {
		nfile += loads[i].tier == p->file_level;
		nremote += p->remote_level && loads[i].tier == p->remote_level;
	}
	size = sizeof(*job) + (size_t)nfile * (2 * sizeof(uint32_t) + sizeof(struct tier_key) +
					       sizeof(void *) + sizeof(int));
	job = nfile ? calloc(1, size) : NULL;
	w = nfile || nremote ? calloc(1, sizeof(*w)) : NULL;
	if ((nfile && !job) || ((nfile || nremote) && !w)) {
		free(job);
		free(w);
		return -ENOMEM;
	}
	/* Host RAM: queued now (or, from an unpinned tier, staged and queued). */
	load_host_direct(p, loads, n);
	if (!p->mem.base)
		load_staged(p, loads, n, false);
	/*
	 * The parts it waits for: the swap files' reads and the remote tier's fetch, at once.  A
	 * part counts from here to its end; the one held now keeps the last from ending first.
	 */
	if (w) {
		*w = (struct load_wait){ .s = s, .seq = seq, .parts = 1 };
		if (nremote)
			(void)dpool_remote_load(p, w, loads, n); /* a failure set their results */
	}
	if (!nfile) {
		free(job);
		if (w && w->parts > 1) {
			w->parts--;
			s->refs++;
			return 1;
		}
		free(w);
		core_seq_loaded(p->core, seq);
		return 0;
	}
	s->refs++;
	job->wait = w; /* its part is the one held */
	mem = (char *)(job + 1);
	job->keys = (struct tier_key *)mem;
	mem += nfile * sizeof(struct tier_key);
	job->dsts = (void **)mem;
	mem += nfile * sizeof(void *);
	job->which = (uint32_t *)mem;
	mem += nfile * sizeof(uint32_t);
	job->slots = (uint32_t *)mem;
	mem += nfile * sizeof(uint32_t);
	job->results = (int *)mem;
	for (uint32_t i = 0; i < n; i++) {
		if (loads[i].tier != p->file_level)
			continue;
		/* The key's tokens are the block's own in the core: they stay until loaded. */
		job->keys[job->n] = tier_key_of(&loads[i].key);
		job->dsts[job->n] = p->mem.base ? block_at(p, loads[i].block) : NULL; /* staged */
		job->slots[job->n] = loads[i].slot;
		job->which[job->n++] = i;
	}
	job->seq = seq;
	job->fence = file_loads_fence(p, loads, n);
	log_debug("pool %s: sequence %llu: reading %u blocks from the swap files, the loop going "
		  "on", p->cfg->name, (unsigned long long)seq, nfile);
	if (p->jobs_tail)
		p->jobs_tail->next = job;
	else
		p->jobs = job;
	p->jobs_tail = job;
	if (p->jobs == job)
		job_start(p, job);
	return 1;
}

void dpool_arm_tier_poll(struct server *srv, struct dpool *p)
{
	struct io_uring_sqe *sqe;

	if (!p->file || p->tier_armed)
		return;
	sqe = server_sqe(srv);
	p->tier_op = (struct op){ .kind = OP_TIER, .pool = p };
	io_uring_prep_poll_multishot(sqe, file_tier_event_fd(p->file), POLLIN);
	io_uring_sqe_set_data(sqe, &p->tier_op);
	p->tier_armed = true;
}

void dpool_tier_poll(struct dpool *p)
{
	if (!p->file)
		return;
	file_tier_poll(p->file);
	for (uint32_t i = 0; i < p->nlost; i++)
		core_tier_lost(p->core, p->file_level, p->lost[i]);
	p->nlost = 0;
	if (p->lost_overflow) {
		/* Could not remember which: forget the whole tier rather than risk a stale hit. */
		file_tier_flush(p->file);
		log_warning("pool %s: lost track of failed writes; emptying the file tier",
			    p->cfg->name);
		for (uint32_t s = 0; s < p->cfg->file_tier_blocks; s++)
			core_tier_lost(p->core, p->file_level, s);
		p->lost_overflow = false;
	}
	/* Deferred loads whose reads are in: the next batch goes out before replies do. */
	while (p->jobs && p->jobs->finished) {
		struct load_job *job = p->jobs;

		if (!job_chunk_done(p, job)) {
			job_start(p, job); /* its next chunk, once the staging is free */
			break;
		}
		p->jobs = job->next;
		if (!p->jobs)
			p->jobs_tail = NULL;
		else
			job_start(p, p->jobs);
		job_finish(p, job);
	}
}

void dpool_arm_backend_poll(struct server *srv, struct dpool *p)
{
	struct io_uring_sqe *sqe;

	if (p->backend_armed || p->mem.done_fd < 0)
		return;
	sqe = server_sqe(srv);
	p->backend_op = (struct op){ .kind = OP_BACKEND, .pool = p };
	io_uring_prep_poll_multishot(sqe, p->mem.done_fd, POLLIN);
	io_uring_sqe_set_data(sqe, &p->backend_op);
	p->backend_armed = true;
}

void dpool_backend_poll(struct dpool *p)
{
	(void)dpool_passed(p, p->issued); /* learns how far the queue got */
	/* Replies first: handing stores to the file tier may wait for its buffers. */
	for (struct session *s = p->srv->sessions, *next; p->nheld && s; s = next) {
		next = s->next;
		if (s->pool == p && s->held)
			session_release(s);
	}
	dpool_stores_settle(p, 0);
	if (p->jobs && !p->jobs->started)
		job_start(p, p->jobs); /* after the stores: its slots may have been among them */
	dpool_remote_settle(p);
}

/* SPDX-License-Identifier: MIT */
/*
 * A daemon pool: one configured pool's core, memory and bookkeeping.  The in-block layout is
 * block-major: each block holds, per layer, K then V, each a [slot][head][dim] tile, so one
 * layer's K (or V) of a block is contiguous for attention kernels.
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "daemon/log.h"
#include "daemon/server/pool-internal.h"
#include "daemon/server/server.h"
#include "proto/cleanup.h"

/*
 * The core dropped a parked sequence for someone else's request: its owner holds less now.
 * Noted only: the quota is settled once the core's call has returned (ops.c: settle_drops),
 * not from inside it.
 */
static void on_drop(void *ctx, uint64_t seq, uint32_t nblocks)
{
	struct dpool *p = ctx;
	struct seq_owner *ow = &p->owners[(uint32_t)seq];

	if (ow->s) {
		/* Dropped once until resumed: a slot is listed once per call. */
		if (!ow->dropped)
			p->drops[p->ndrops++] = seq;
		ow->dropped += nblocks;
	}
	log_debug("pool %s: parked sequence %llu dropped, %u blocks released", p->cfg->name,
		  (unsigned long long)seq, nblocks);
}

static void on_restored(void *ctx, uint32_t slot, const struct tier_key *k)
{
	struct dpool *p = ctx;
	struct core_key key = { .hash = { k->hash_lo, k->hash_hi },
				.parent = { k->parent_lo, k->parent_hi },
				.salt = k->salt, .extra = k->extra,
				/* For the event stream: the slot's own, during the call. */
				.tokens = k->tokens };

	core_tier_restore(p->core, p->file_level, slot, &key);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * bandwidth = auto for the host tier: the path a swap takes, through the backend's moves.  For
 * a pool in host memory that is memcpy; for a pool on a device, the bus (pinned host memory).
 * The best of a few moves of up to 32 MiB of the (still unused) pool's first blocks out to
 * host memory and back, each waited for.  0 (unknown) when it fails.
 */
static double measure_move_bandwidth(struct dpool *p)
{
	const uint32_t cap = p->cfg->capacity_blocks;
	uint64_t n = (UINT64_C(32) << 20) / p->block_bytes;
	struct backend_move *m;
	double best = 0;
	void *host = NULL;

	n = n < 1 ? 1 : n > cap ? cap : n;
	m = calloc(n, sizeof(*m));
	if (!m || p->mem.ops->host_alloc(&p->mem, n * p->block_bytes, &host) < 0) {
		free(m);
		return 0;
	}
	for (uint32_t i = 0; i < n; i++)
		m[i] = (struct backend_move){ .block = i,
					      .host = (char *)host + (uint64_t)i * p->block_bytes };
	for (int k = 0; k < 6; k++) {
		double t = now_s();

		uint64_t ticket;

		if (dpool_move(p, k % 2 ? BACKEND_FROM_HOST : BACKEND_TO_HOST, m, (uint32_t)n,
			       &ticket) < 0 || (dpool_wait(p, &ticket), p->failed)) {
			best = 0;
			break;
		}
		t = now_s() - t;
		if (t > 0 && (double)(n * p->block_bytes) / t > best)
			best = (double)(n * p->block_bytes) / t;
	}
	p->mem.ops->host_free(&p->mem, host, n * p->block_bytes);
	free(m);
	return best;
}

/*
 * bandwidth = auto for the file tier: reads through a scratch file tier of up to 64 MiB next
 * to the first swap file, so the real slots are never touched.  Its file has no name (the
 * tier's scratch): nobody can plant a link where it would be, and a crash leaves nothing.
 */
static double measure_file_bandwidth(struct dpool *p)
{
	const struct kvpd_pool_config *c = p->cfg;
	const char *paths[1] = { c->swap_files[0] };
	struct file_tier_config fc = { .paths = paths, .npaths = 1, .block_bytes = p->block_bytes,
				       .block_tokens = c->block_tokens, .geometry = 1,
				       .queue_depth = c->file_tier_queue_depth, .scratch = true };
	struct file_tier *ft = NULL;
	_cleanup_free_ uint32_t *slots = NULL, *tokens = NULL;
	_cleanup_free_ struct tier_key *keys = NULL;
	_cleanup_free_ void **dsts = NULL;
	_cleanup_free_ int *results = NULL;
	double bw = 0, t;
	uint8_t *scratch = NULL; /* a device pool has no mapping of its own to read into */
	uint32_t n;

	n = (uint32_t)((64u << 20) / (p->block_bytes + 4096));
	n = n < 4 ? 4 : n > 1024 ? 1024 : n;
	fc.nslots = n;
	if (!p->mem.base) {
		scratch = mmap(NULL, (size_t)n * p->block_bytes, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (scratch == MAP_FAILED)
			return 0;
	}
	slots = calloc(n, sizeof(*slots));
	keys = calloc(n, sizeof(*keys));
	dsts = calloc(n, sizeof(*dsts));
	results = calloc(n, sizeof(*results));
	tokens = calloc(c->block_tokens, sizeof(*tokens));
	if (!slots || !keys || !dsts || !results || !tokens || file_tier_open(&fc, &ft) < 0)
		goto out;
	for (uint32_t i = 0; i < n; i++) {
		slots[i] = i;
		keys[i] = (struct tier_key){ .hash_lo = i + 1, .tokens = tokens };
		dsts[i] = scratch ? scratch + (size_t)i * p->block_bytes
				  : block_at(p, i % c->capacity_blocks);
		if (file_tier_store(ft, i, &keys[i], dsts[i]) < 0)
			goto out;
	}
	file_tier_flush(ft);
	t = now_s();
	file_tier_load(ft, n, slots, keys, dsts, results);
	t = now_s() - t;
	for (uint32_t i = 0; i < n; i++)
		if (results[i] < 0)
			goto out; /* a figure from failed reads would flatter the tier */
	if (t > 0)
		bw = (double)n * (double)p->block_bytes / t;
out:
	file_tier_close(ft);
	if (scratch)
		munmap(scratch, (size_t)n * p->block_bytes);
	return bw;
}

/* The pool's layout: a file slot written under another layout is never read back. */
static uint64_t geometry_of(const struct dpool *p)
{
	const struct kvpd_pool_config *c = p->cfg;
	const uint64_t g[] = { 1 /* slot format */, c->layers, c->kv_heads, c->head_dim,
			       c->element_bytes, c->block_tokens, p->block_bytes };

	return XXH3_64bits(g, sizeof(g));
}

/* The host tier's arena from the pool's backend: pinned, device-visible host memory. */
static int pinned_arena_alloc(void *ctx, uint64_t bytes, void **ret)
{
	struct backend_pool *mem = ctx;

	return mem->ops->host_alloc(mem, bytes, ret);
}

static void pinned_arena_free(void *ctx, void *arena, uint64_t bytes)
{
	struct backend_pool *mem = ctx;

	mem->ops->host_free(mem, arena, bytes);
}

static int host_tier_open(struct dpool *p, const struct backend_module *module)
{
	const struct kvpd_pool_config *c = p->cfg;
	const struct host_tier_arena pinned = { .alloc = pinned_arena_alloc,
						.free = pinned_arena_free, .ctx = &p->mem };
	const unsigned long long bytes = (unsigned long long)c->host_tier_blocks * p->block_bytes;
	int r;

	/*
	 * A pool on a device: with the arena pinned, swaps move between the pool and a slot at
	 * bus speed with no CPU copy.  Pinning commits the whole arena now, where plain memory is
	 * committed as slots fill.  Where it cannot be had (not enough memory, a limit), the tier
	 * is plain memory reached through the staging, as a host tier was before.
	 */
	p->slot_ticket = calloc(c->host_tier_blocks, sizeof(*p->slot_ticket));
	if (!p->slot_ticket)
		return log_error_errno(ENOMEM, "pool %s: out of memory", c->name);
	if (!p->mem.base && c->host_tier_plain)
		log_info("pool %s: host tier of %llu bytes in plain memory, committed as it fills "
			 "(host_tier_plain = yes); its moves go through the pool's staging", c->name,
			 bytes);
	if (!p->mem.base && !c->host_tier_plain) {
		r = host_tier_new(c->host_tier_blocks, p->block_bytes, c->block_tokens, &pinned,
				  &p->host);
		if (r == 0) {
			p->host_direct = true;
			log_info("pool %s: host tier of %llu bytes pinned for direct moves (committed "
				 "now, not as it fills)", c->name, bytes);
			return 0;
		}
		log_warning("pool %s: cannot pin the host tier's %llu bytes: %s%s%s%s; it uses plain "
			    "memory, and its moves go through the pool's staging", c->name, bytes,
			    strerror(-r), module ? " (" : "", module ? module->last_error() : "",
			    module ? ")" : "");
	}
	r = host_tier_new(c->host_tier_blocks, p->block_bytes, c->block_tokens, NULL, &p->host);
	if (r < 0)
		return log_error_errno(r, "pool %s: cannot allocate the host tier (%u blocks of %llu "
				       "bytes): %m", c->name, c->host_tier_blocks,
				       (unsigned long long)p->block_bytes);
	/* A pool in host memory moves to and from any memory: its slots are reached directly. */
	p->host_direct = p->mem.base != NULL;
	return 0;
}

/*
 * Appends a level to the pool's list and the core's (they stay in step: the core's level t is
 * p->tiers[t - 1]).  Returns its level.  Every level's callbacks get the pool: they reach the
 * storage of the level above through it (a host-tier slot going down to the files).
 */
static uint32_t tier_add(struct dpool *p, struct core_config *cc, const char *name,
			 uint32_t blocks, double bandwidth, const struct core_tier_ops *ops)
{
	p->tiers[p->ntiers] = (struct dpool_tier){ .name = name };
	cc->tiers[cc->ntiers++] = (struct core_tier_config){ .slots = blocks,
							     .bandwidth = bandwidth, .ops = ops,
							     .ctx = p };
	return ++p->ntiers;
}

static int tiers_open(struct dpool *p, const struct backend_module *module, struct core_config *cc)
{
	const struct kvpd_pool_config *c = p->cfg;
	uint32_t probe = 0;
	int r;

	if (c->host_tier_blocks) {
		r = host_tier_open(p, module);
		if (r < 0)
			return r;
	}
	if (c->file_tier_blocks) {
		struct file_tier_config fc = {
			.paths = (const char *const *)c->swap_files,
			.npaths = (uint32_t)c->n_swap_files,
			.nslots = c->file_tier_blocks,
			.block_bytes = p->block_bytes,
			.block_tokens = c->block_tokens,
			.geometry = geometry_of(p),
			.persist = c->file_tier_persist,
			.queue_depth = c->file_tier_queue_depth,
			.lost = dpool_on_file_lost,
			.lost_ctx = p,
		};

		r = file_tier_open(&fc, &p->file);
		if (r < 0)
			return log_error_errno(r, "pool %s: cannot open the swap files (%s%s): %m",
					       c->name, c->swap_files[0],
					       c->n_swap_files > 1 ? ", ..." : "");
	}
	p->host_bandwidth = c->host_tier_bandwidth == KVPD_MEASURE ? measure_move_bandwidth(p)
								   : (double)c->host_tier_bandwidth;
	if (c->file_tier_bandwidth != KVPD_MEASURE)
		p->file_bandwidth = (double)c->file_tier_bandwidth;
	else
		p->file_bandwidth = p->file ? measure_file_bandwidth(p) : 0;
	/* The stats count what clients cause, not the measurements. */
	p->queued_ops = 0;
	p->cpu_waits = 0;
	if (c->host_tier_bandwidth == KVPD_MEASURE || c->file_tier_bandwidth == KVPD_MEASURE)
		log_info("pool %s: measured tier bandwidth: host %.2f GB/s, file %.2f GB/s", c->name,
			 p->host_bandwidth / 1e9, p->file_bandwidth / 1e9);
	/* Fastest first: what the pool evicts goes to host RAM, what that evicts to the files. */
	if (c->host_tier_blocks)
		p->host_level = tier_add(p, cc, "host", c->host_tier_blocks, p->host_bandwidth,
					 &dpool_host_tier_ops);
	if (c->file_tier_blocks) {
		p->file_level = tier_add(p, cc, "file", c->file_tier_blocks, p->file_bandwidth,
					 &dpool_file_tier_ops);
		/* Its slots are not read back to publish them (remote_tier_write = evict). */
		cc->tiers[p->file_level - 1].flags |= CORE_TIER_COLD;
	}
	/*
	 * Last, the remote tier: a level nobody here can see into (CORE_TIER_PROBED).  One lookup
	 * asks it for half of what may be in flight, so a fetch never shuts out every store.
	 */
	r = dpool_remote_open(p, &probe);
	if (r < 0)
		return r;
	if (p->remote) {
		p->remote_level = tier_add(p, cc, "remote", probe, p->remote_bandwidth,
					   &dpool_remote_tier_ops);
		cc->tiers[cc->ntiers - 1].flags =
			CORE_TIER_PROBED |
			(c->remote_tier_write == KVPD_REMOTE_EVICT ? CORE_TIER_STORE_EVICTED : 0);
	}
	cc->cost = (struct core_cost_config){
		.block_bytes = (double)p->block_bytes,
		.params = c->model_params,
		.flops = c->engine_flops,
	};
	return 0;
}

/*
 * The pool's backend: host memory, or the CUDA module (backend = cuda must get it; auto falls
 * back to host memory).  The module is the pool's backend_module, and nothing else: what the
 * daemon loads into itself comes from the configuration it checked, never the environment.
 */
static int backend_select(const struct kvpd_pool_config *cfg, const struct backend_ops **ret,
			  const struct backend_module **ret_module)
{
	const struct backend_module *m;
	char why[512] = "";
	int r;

	*ret_module = NULL;
	if (cfg->backend == KVPD_BACKEND_HOST) {
		*ret = cfg->copy_thread ? &backend_host_threaded : &backend_host;
		return 0;
	}
	r = backend_module_load(cfg->backend_module, cfg->device, &m, why, sizeof(why));
	if (r == 0) {
		*ret = m->ops;
		*ret_module = m;
		return 0;
	}
	if (cfg->backend == KVPD_BACKEND_AUTO) {
		log_info("pool %s: backend = auto: using host memory (%s)", cfg->name, why);
		*ret = cfg->copy_thread ? &backend_host_threaded : &backend_host;
		return 0;
	}
	return log_error_errno(r, "pool %s: backend = cuda, but the CUDA backend is not available "
			       "here: %s (backend = auto would use host memory instead)",
			       cfg->name, why);
}

int dpool_init(struct dpool *p, const struct kvpd_pool_config *cfg)
{
	const struct backend_module *module;
	const struct backend_ops *ops = NULL;
	struct core_config cc = {
		.capacity_blocks = cfg->capacity_blocks,
		.block_tokens = cfg->block_tokens,
		.max_sequences = cfg->max_sequences,
		.max_seq_tokens = cfg->max_seq_tokens,
		.vocab_size = cfg->vocab_size,
		.copy_block = dpool_copy_block,
		.copy_slots = dpool_copy_slots,
		.copy_ctx = p,
		.policy = (enum core_policy)cfg->policy,
		.eviction = (uint32_t)cfg->eviction,
		.value_records = cfg->value_records,
		.on_drop = on_drop,
		.drop_ctx = p,
		.window = cfg->window,
	};
	int r;

	*p = (struct dpool){ .cfg = cfg, .mem = { .fd = -1, .done_fd = -1 } };
	p->head_stride = (uint64_t)cfg->head_dim * cfg->element_bytes;
	p->slot_stride = p->head_stride * cfg->kv_heads;
	p->kv_stride = p->slot_stride * cfg->block_tokens;
	p->layer_stride = 2 * p->kv_stride;
	p->block_bytes = p->layer_stride * cfg->layers;
	p->bytes_per_token = 2ull * cfg->layers * cfg->kv_heads * cfg->head_dim * cfg->element_bytes;

	r = backend_select(cfg, &ops, &module);
	if (r < 0)
		return r;
	r = ops->create(cfg->name, p->block_bytes * cfg->capacity_blocks, p->block_bytes,
			cfg->device, &p->mem);
	if (r < 0)
		return log_error_errno(r, "pool %s: cannot allocate %llu bytes of %s memory: %m%s%s%s",
				       cfg->name,
				       (unsigned long long)(p->block_bytes * cfg->capacity_blocks),
				       ops->name, module ? " (" : "",
				       module ? module->last_error() : "", module ? ")" : "");
	p->module = module;
	if (ops == &backend_host_threaded)
		log_info("pool %s: copies and moves run on a helper thread (copy_thread = yes)",
			 cfg->name);
	p->mem.layers = cfg->layers;
	p->mem.layer_stride = p->layer_stride;
	p->mem.kv_stride = p->kv_stride;
	p->mem.slot_stride = p->slot_stride;
	p->block_ticket = calloc(cfg->capacity_blocks, sizeof(*p->block_ticket));
	if (!p->block_ticket)
		return log_error_errno(ENOMEM, "pool %s: out of memory", cfg->name);
	r = tiers_open(p, module, &cc);
	if (r < 0)
		return r;
	/* A device pool's file tier, or a host tier that could not be pinned, needs the staging. */
	if (!p->mem.base && (p->file || (p->host && !p->host_direct))) {
		uint64_t n = (UINT64_C(32) << 20) / p->block_bytes;

		n = n < 1 ? 1 : n > STAGE_MAX_BLOCKS ? STAGE_MAX_BLOCKS : n;
		r = ops->host_alloc(&p->mem, n * p->block_bytes, &p->stage);
		if (r < 0)
			return log_error_errno(r, "pool %s: cannot allocate %llu bytes of pinned "
					       "staging for the tiers: %m", cfg->name,
					       (unsigned long long)(n * p->block_bytes));
		p->stage_blocks = (uint32_t)n;
		/*
		 * Deferred swap-file reads get their own, so that requests never wait for them, and
		 * so do demotions straight to the files.  Without them (pinned memory short) the
		 * reads and writes go through the staging within the request, as they could.
		 */
		if (p->file && ops->host_alloc(&p->mem, n * p->block_bytes, &p->load_stage) < 0) {
			log_warning("pool %s: no pinned memory for the swap-file reads' staging: opens "
				    "read the swap files within the request", cfg->name);
			p->load_stage = NULL;
		}
		if (p->file && ops->host_alloc(&p->mem, n * p->block_bytes, &p->store_stage) < 0) {
			log_warning("pool %s: no pinned memory for the swap-file writes' staging: "
				    "demotions to the files are waited for", cfg->name);
			p->store_stage = NULL;
		}
		if (p->store_stage) {
			p->stores = calloc(n, sizeof(*p->stores));
			p->store_tokens = calloc(n * cfg->block_tokens, sizeof(*p->store_tokens));
			if (!p->stores || !p->store_tokens)
				return log_error_errno(ENOMEM, "pool %s: out of memory", cfg->name);
		}
	}
	r = dpool_events_open(p, &cc);
	if (r < 0)
		return r;
	r = core_new(&cc, &p->core);
	if (r < 0)
		return log_error_errno(r, "pool %s: cannot create the block manager: %m", cfg->name);
	if (p->file && cfg->file_tier_persist) {
		dpool_events_hold(p);
		r = file_tier_scan(p->file, on_restored, p);
		dpool_events_release(p);
		if (r < 0)
			return log_error_errno(r, "pool %s: cannot read the swap files back: %m",
					       cfg->name);
		log_info("pool %s: %d cached blocks found in the swap files", cfg->name, r);
	}
	p->owners = calloc(cfg->max_sequences, sizeof(*p->owners));
	p->drops = calloc(cfg->max_sequences, sizeof(*p->drops));
	if (!p->owners || !p->drops)
		return log_error_errno(ENOMEM, "pool %s: out of memory", cfg->name);
	snprintf(p->ns_other.name, sizeof(p->ns_other.name), "(other)");
	return 0;
}

void dpool_persist_at_stop(struct dpool *p)
{
	const struct kvpd_pool_config *c = p->cfg;
	struct core_persist_pass pass = { 0 };
	struct core_tier_stats host = { 0 };
	struct file_tier_stats before, after;
	uint64_t start = server_now_ns(), deadline;
	struct core_usage u;
	char left[160] = "nothing left behind";
	int n;

	if (!p->file || !c->file_tier_persist || !c->file_tier_persist_stop_ms)
		return;
	if (p->failed) {
		log_warning("pool %s: stopping: nothing written to the swap files, the pool's memory "
			    "cannot be trusted", c->name);
		return;
	}
	deadline = start + (uint64_t)c->file_tier_persist_stop_ms * 1000000u;
	file_tier_get_stats(p->file, &before);
	/*
	 * A batch is what the file tier has staging buffers for; the time is checked between
	 * batches, so the stop overruns its bound by one batch's writes at most.
	 */
	do {
		n = core_tier_persist(p->core, p->file_level, c->file_tier_queue_depth, &pass);
		dpool_tier_poll(p); /* failed writes: their slots are forgotten */
	} while (n > 0 && server_now_ns() < deadline);
	dpool_stores_settle(p, p->nstores);
	file_tier_flush(p->file);
	dpool_tier_poll(p);
	file_tier_get_stats(p->file, &after);
	core_get_usage(p->core, &u);
	if (p->host)
		(void)core_get_tier_stats(p->core, p->host_level, &host);
	if (u.cached || host.used)
		snprintf(left, sizeof(left), "left %u cached blocks in the pool and %u in the host "
			 "tier (%s)", u.cached, host.used,
			 pass.full ? "the file tier is full" : "file_tier_persist_stop_ms ran out");
	log_info("pool %s: stopping: wrote %u cached blocks to the swap files (%u from the pool, "
		 "%u from the host tier; %llu writes failed, %u dropped) in %llu ms; %s", c->name,
		 pass.moved, pass.from_pool, pass.from_tiers,
		 (unsigned long long)(after.write_errors - before.write_errors), pass.dropped,
		 (unsigned long long)((server_now_ns() - start) / 1000000u), left);
}

void dpool_done(struct dpool *p)
{
	/*
	 * Reads still in flight (a forced stop) land first: they write into the pool, and the
	 * tier is closed only without a batch in flight.
	 */
	for (unsigned waited_s = 0; p->file && file_tier_loading(p->file);) {
		struct pollfd pfd = { .fd = file_tier_event_fd(p->file), .events = POLLIN };
		int r = poll(&pfd, 1, 1000);

		if (r == 0 && ++waited_s == 60) {
			/* The kernel still writes into the pool: exiting now is all that is safe. */
			log_error("pool %s: swap-file reads still in flight after 60 s; giving up",
				  p->cfg->name);
			abort();
		}
		if (r > 0 && read(pfd.fd, &p->tier_event, sizeof(p->tier_event)) < 0 &&
		    errno != EAGAIN)
			log_warning_errno(errno, "pool %s: reading the file tier's eventfd: %m",
					  p->cfg->name);
		file_tier_poll(p->file);
	}
	/* Writes still queued finish first: with persistence they are what comes back. */
	if (p->file && p->nstores)
		dpool_stores_settle(p, p->nstores);
	p->file = file_tier_close(p->file);
	/* The remote tier's thread stops before the memory it reads and writes goes. */
	dpool_remote_close(p);
	/* What is queued is sent; nothing more is announced. */
	dpool_events_close(p);
	/* Loads still queued at exit (a forced stop): their sessions are gone already. */
	while (p->jobs) {
		struct load_job *job = p->jobs;

		p->jobs = job->next;
		if (--job->wait->parts == 0)
			free(job->wait);
		free(job);
	}
	/* Nothing may still move into the host tier's arena or out of the pool when freed. */
	if (p->mem.ops)
		dpool_flush(p);
	if (p->mem.ops && p->issued && p->mem.ops->wait(&p->mem, p->issued) < 0)
		log_error("pool %s: the backend failed while its last operations completed",
			  p->cfg->name);
	p->host = host_tier_free(p->host);
	free(p->lost);
	free(p->block_ticket);
	free(p->slot_ticket);
	core_free(p->core);
	{
		void **stages[] = { &p->stage, &p->load_stage, &p->store_stage };

		for (size_t i = 0; i < sizeof(stages) / sizeof(stages[0]); i++) {
			if (*stages[i])
				p->mem.ops->host_free(&p->mem, *stages[i],
						      (uint64_t)p->stage_blocks * p->block_bytes);
			*stages[i] = NULL;
		}
	}
	dpool_remote_stage_free(p);
	free(p->stores);
	free(p->store_tokens);
	if (p->mem.ops)
		p->mem.ops->destroy(&p->mem);
	free(p->owners);
	free(p->drops);
	for (uint32_t i = 0; i < p->nns; i++)
		free(p->ns[i]);
	free(p->ns);
}

/* Adds a folded entry's statistics to "(other)" and frees it. */
static void ns_fold(struct dpool *p, uint32_t i)
{
	struct ns_stats *e = p->ns[i];

	p->ns_other.lookups += e->lookups;
	p->ns_other.query_blocks += e->query_blocks;
	p->ns_other.hit_blocks += e->hit_blocks;
	p->ns_other.hit_tokens += e->hit_tokens;
	p->ns_folded++;
	free(e);
	p->ns[i] = p->ns[--p->nns];
}

/* The unused entry (of uid, or anyone's with uid UINT32_MAX) left unused the longest. */
static int ns_oldest_unused(const struct dpool *p, uint32_t uid, uint32_t *ret_count)
{
	uint32_t count = 0;
	int oldest = -1;

	for (uint32_t i = 0; i < p->nns; i++) {
		const struct ns_stats *e = p->ns[i];

		if (uid != UINT32_MAX && e->uid != uid)
			continue;
		count++;
		if (!e->use.sessions && (oldest < 0 || e->last_used < p->ns[oldest]->last_used))
			oldest = (int)i;
	}
	if (ret_count)
		*ret_count = count;
	return oldest;
}

struct ns_stats *dpool_ns_stats(struct dpool *p, uint64_t salt, const char *name, uint32_t uid)
{
	const uint32_t per_uid = p->srv->cfg->limits.max_namespaces_per_uid;
	uint32_t mine = 0, unused = 0;
	struct ns_stats *e;
	int oldest;

	/* Linear: entries are a few hundred at most, and looked up once per session. */
	for (uint32_t i = 0; i < p->nns; i++)
		if (p->ns[i]->salt == salt && strcmp(p->ns[i]->name, name) == 0) {
			p->ns[i]->last_used = server_now_ns();
			return p->ns[i];
		}
	/*
	 * A new one.  A uid that makes namespace after namespace (a junk string per connection)
	 * only pushes its own old ones out, never another tenant's: entries in use stay, those
	 * unused beyond its allowance go to "(other)" first.  Then the pool's allowance of
	 * unused entries in all.
	 */
	oldest = ns_oldest_unused(p, uid, &mine);
	if (mine >= per_uid && oldest >= 0)
		ns_fold(p, (uint32_t)oldest);
	for (uint32_t i = 0; i < p->nns; i++)
		unused += !p->ns[i]->use.sessions;
	if (unused >= POOL_NS_RETAINED && (oldest = ns_oldest_unused(p, UINT32_MAX, NULL)) >= 0)
		ns_fold(p, (uint32_t)oldest);
	if (p->nns == p->ns_cap) {
		uint32_t cap = p->ns_cap ? 2 * p->ns_cap : 16;
		struct ns_stats **grown = realloc(p->ns, cap * sizeof(*grown));

		if (!grown)
			return NULL;
		p->ns = grown;
		p->ns_cap = cap;
	}
	e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->salt = salt;
	e->uid = uid;
	e->last_used = server_now_ns();
	snprintf(e->name, sizeof(e->name), "%s", name);
	p->ns[p->nns++] = e;
	return e;
}

int dpool_verify(struct dpool *p, char *why, size_t why_len)
{
	int r = core_verify(p->core, why, why_len);
	struct core_usage u;
	uint32_t owned = 0;

	if (r < 0)
		return r;
	/* Every open sequence has exactly one owning session and vice versa. */
	core_get_usage(p->core, &u);
	for (uint32_t i = 0; i < p->cfg->max_sequences; i++)
		if (p->owners[i].s) {
			struct session *s = p->owners[i].s;

			owned++;
			if (p->owners[i].idx >= s->nseqs || (uint32_t)s->seqs[p->owners[i].idx] != i) {
				snprintf(why, why_len, "sequence slot %u: owner table disagrees with "
					 "session %llu", i, (unsigned long long)s->id);
				return -EUCLEAN;
			}
		}
	/* Orphans: still loading after their session closed; their load job closes them. */
	if (owned + p->orphans != u.sequences) {
		snprintf(why, why_len, "%u sequences open, %u owned by sessions, %u orphans loading",
			 u.sequences, owned, p->orphans);
		return -EUCLEAN;
	}
	return 0;
}

void dpool_describe(const struct dpool *p, Kvpaged__V1__PoolDescription *d)
{
	const struct kvpd_pool_config *c = p->cfg;

	d->name = (char *)c->name;
	d->layers = c->layers;
	d->kv_heads = c->kv_heads;
	d->head_dim = c->head_dim;
	d->element_bytes = c->element_bytes;
	d->block_tokens = c->block_tokens;
	d->capacity_blocks = c->capacity_blocks;
	d->bytes_per_token = p->bytes_per_token;
	d->block_bytes = p->block_bytes;
	d->pool_bytes = p->mem.bytes;
	d->block_stride = p->block_bytes;
	d->layer_stride = p->layer_stride;
	d->kv_stride = p->kv_stride;
	d->slot_stride = p->slot_stride;
	d->head_stride = p->head_stride;
	d->backend = (char *)p->mem.ops->name;
	d->max_seq_tokens = c->max_seq_tokens;
	d->vocab_size = c->vocab_size;
	d->host_tier_blocks = c->host_tier_blocks;
	d->file_tier_blocks = c->file_tier_blocks;
	d->model_params = c->model_params;
	d->engine_flops = c->engine_flops;
	d->host_tier_bandwidth = p->host_bandwidth;
	d->file_tier_bandwidth = p->file_bandwidth;
	d->host_tier_promotes = core_tier_promotes(p->core, p->host_level);
	d->file_tier_promotes = core_tier_promotes(p->core, p->file_level);
	d->file_tier_persist = c->file_tier_persist;
	d->window = c->window;
}

void dpool_retry_waiters(struct dpool *p, uint64_t now)
{
	struct session *list, *s, *next;
	bool due = false;

	for (s = p->waiters; s && !due; s = s->wait_next)
		due = now >= s->req.deadline_ns;
	if (!p->waiters || (p->epoch == p->waiters_epoch && !due))
		return;
	p->waiters_epoch = p->epoch;
	/* Take the whole list; those that still cannot go queue up again in the same order. */
	list = p->waiters;
	p->waiters = p->waiters_tail = NULL;
	for (s = list; s; s = next) {
		next = s->wait_next;
		s->wait_prev = s->wait_next = NULL;
		s->req.state = REQUEST_RUNNING; /* off the list: a close must not unlink it */
		session_retry(s);
	}
}

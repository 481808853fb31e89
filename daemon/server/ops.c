/* SPDX-License-Identifier: MIT */
/*
 * Sequence operations on behalf of a session, shared by the socket and the rings.  A session
 * may only touch sequences it opened or forked (anything else is -ENOENT, as if it did not
 * exist), and its limits are checked before the core is called (-EDQUOT, -EMFILE, -E2BIG).
 * The core itself guarantees that a failed call changes nothing.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "daemon/server/server.h"

static uint32_t blocks_for(const struct session *s, uint64_t tokens)
{
	uint32_t B = s->pool->cfg->block_tokens;

	return (uint32_t)((tokens + B - 1) / B);
}

/* Makes room for one more owned sequence, so that recording it later cannot fail. */
static int reserve_seq(struct session *s)
{
	uint32_t cap = s->cap_seqs ? 2 * s->cap_seqs : 16;
	uint64_t *v;

	if (s->nseqs < s->cap_seqs)
		return 0;
	v = realloc(s->seqs, cap * sizeof(*v));
	if (!v)
		return -ENOMEM;
	s->seqs = v;
	s->cap_seqs = cap;
	return 0;
}

/* The bytes a sequence of this kind is charged at ntokens tokens in state (core_seq_bytes). */
static uint64_t seq_bytes(const struct session *s, uint32_t retention, uint32_t granularity,
			  uint32_t ntokens, uint32_t state)
{
	return core_seq_bytes(s->pool->core, retention, granularity, ntokens, state);
}

/* What it takes to charge info's sequence for ntokens in state, beyond its charge now. */
static uint64_t more_bytes(const struct session *s, uint64_t seq, const struct core_seq_info *info,
			   uint32_t ntokens, uint32_t state)
{
	uint64_t now = s->pool->owners[(uint32_t)seq].bytes;
	uint64_t then = seq_bytes(s, info->retention, info->granularity, ntokens, state);

	return then > now ? then - now : 0;
}

/* Charges s for seq as info, its size and state now, calls for. */
static void charge(struct session *s, uint64_t seq, const struct core_seq_info *info)
{
	struct seq_owner *ow = &s->pool->owners[(uint32_t)seq];
	uint64_t bytes = seq_bytes(s, info->retention, info->granularity, info->ntokens,
				   info->state);

	account_bytes(s, (int64_t)bytes - (int64_t)ow->bytes);
	ow->bytes = bytes;
}

void ops_recharge(struct session *s, uint64_t seq)
{
	struct core_seq_info info;

	if (core_seq_info(s->pool->core, seq, &info) == 0)
		charge(s, seq, &info);
}

/*
 * The core call just made may have dropped parked sequences (the pool's on_drop noted them):
 * their owners hold those blocks no more, and are charged for a history instead of a table.
 */
static void settle_drops(struct dpool *p)
{
	for (uint32_t i = 0; i < p->ndrops; i++) {
		struct seq_owner *ow = &p->owners[(uint32_t)p->drops[i]];
		struct session *owner = ow->s;

		account_blocks(owner, -(int64_t)ow->dropped);
		ow->dropped = 0;
		ops_recharge(owner, p->drops[i]);
	}
	p->ndrops = 0;
}

/* Records seq, of info, as s's: charged for its size and state, not yet for its blocks. */
static void own(struct session *s, uint64_t seq, const struct core_seq_info *info)
{
	struct dpool *p = s->pool;
	uint32_t slot = (uint32_t)seq;

	s->seqs[s->nseqs] = seq;
	p->owners[slot] = (struct seq_owner){ .s = s, .idx = s->nseqs };
	s->nseqs++;
	account_sequences(s, 1);
	charge(s, seq, info);
}

static void disown(struct session *s, uint64_t seq)
{
	struct dpool *p = s->pool;
	uint32_t slot = (uint32_t)seq, idx = p->owners[slot].idx;

	account_bytes(s, -(int64_t)p->owners[slot].bytes);
	account_sequences(s, -1);
	s->seqs[idx] = s->seqs[--s->nseqs];
	p->owners[(uint32_t)s->seqs[idx]].idx = idx;
	p->owners[slot] = (struct seq_owner){ 0 };
}

/* The session's view of a sequence id: 0 when it owns it, -ENOENT otherwise. */
static int check_owner(struct session *s, uint64_t seq, struct core_seq_info *info)
{
	uint32_t slot = (uint32_t)seq;

	if (slot >= s->pool->cfg->max_sequences || s->pool->owners[slot].s != s)
		return -ENOENT;
	return core_seq_info(s->pool->core, seq, info);
}

static int check_tokens(struct session *s, uint32_t n, const char **why)
{
	if (n > s->srv->cfg->limits.max_tokens_per_request) {
		*why = "more tokens than max_tokens_per_request";
		return -E2BIG;
	}
	return 0;
}

/*
 * The reply hands out the sequence's blocks, its table and its packed blocks (h2o's gather
 * writes those): it waits for what the pool's queue still does to any of them.
 */
static uint64_t fence_of(struct session *s, const struct core_seq_info *info)
{
	const uint32_t B = s->pool->cfg->block_tokens;
	uint64_t f = dpool_fence(s->pool, info->table, info->nblocks);
	uint64_t g = dpool_fence(s->pool, info->packed, (info->npacked + B - 1) / B);

	return g > f ? g : f;
}

/* The reply's table from entry from on, as info has it, and what the reply waits for. */
static void fill_table_of(struct session *s, const struct core_seq_info *info, uint32_t from,
			  struct seq_result *res)
{
	res->table = info->table + from;
	res->table_len = info->nblocks - from;
	res->fence = fence_of(s, info);
}

static void fill_table(struct session *s, uint64_t seq, uint32_t from, struct seq_result *res)
{
	struct core_seq_info info;

	core_seq_info(s->pool->core, seq, &info);
	fill_table_of(s, &info, from, res);
}

/*
 * Defers the tier loads of a LOADING sequence: 0 when they were all in at once (ACTIVE now),
 * -EINPROGRESS when the request waits for them (session_loaded() follows).  A failure to start
 * them fails the loads: the blocks are then recomputed, as for any failed load.
 */
static int defer_loads(struct session *s, uint64_t seq)
{
	int r = dpool_load(s->pool, s, seq);

	if (r < 0) {
		struct core_load *loads;
		uint32_t n;

		log_warning("pool %s: cannot start reading from the file tier: %s; the tokens are "
			    "recomputed", s->pool->cfg->name, strerror(-r));
		core_seq_pending_loads(s->pool->core, seq, &loads, &n);
		for (uint32_t k = 0; k < n; k++)
			loads[k].result = r;
		core_seq_loaded(s->pool->core, seq);
		return 0;
	}
	return r == 0 ? 0 : -EINPROGRESS;
}

/*
 * Whether the pool's opens and resumes read its swap files without holding the loop: a pool in
 * host memory (the reads land in it) or on a device (they land in its load staging, then move
 * in), unless configured to block.
 */
static bool may_defer(const struct dpool *p)
{
	return p->file && (p->mem.base || p->load_stage) && p->tier_armed &&
	       !p->cfg->file_tier_blocking_reads;
}

/*
 * The flags an open or resume of this session's takes: deferred loads when the swap files may
 * be read without the loop, or when the remote tier may be asked (only ever deferred: a
 * network round trip never holds the loop); the remote tier for a named namespace.
 */
static uint32_t load_flags(struct session *s)
{
	struct dpool *p = s->pool;
	bool remote = p->remote && p->remote_armed && s->remote_ns;

	if (remote)
		dpool_remote_recheck(p);
	return (may_defer(p) || remote ? CORE_OPEN_DEFER_LOADS : 0) |
	       (remote ? CORE_OPEN_PROBED : 0);
}

/* An open's figures, once its cached tokens are known. */
static void open_counted(struct session *s, uint32_t nblocks, uint32_t cached)
{
	s->stats->lookups++;
	s->stats->query_blocks += nblocks;
	s->stats->hit_blocks += cached / s->pool->cfg->block_tokens;
	s->stats->hit_tokens += cached;
}

int ops_loaded_result(struct session *s, const struct deferred_load *d, bool resume,
		      struct seq_result *res)
{
	struct core_seq_info info;
	uint64_t seq = d->seq;

	if (core_seq_info(s->pool->core, seq, &info) < 0)
		return -EIO; /* cannot happen: the sequence is the session's */
	/* The quota took d->charged blocks; a retention policy may have released some since. */
	account_blocks(s, (int64_t)info.held_blocks - (int64_t)d->charged);
	charge(s, seq, &info);
	res->seq = seq;
	if (resume)
		res->recompute = info.ntokens - info.ncommitted;
	else
		open_counted(s, info.nblocks, res->cached = info.ncommitted);
	fill_table_of(s, &info, 0, res);
	return 0;
}

int ops_open(struct session *s, const uint32_t *tokens, uint32_t n, uint64_t extra,
	     uint32_t flags, uint32_t priority, const struct core_open *retention,
	     struct deferred_load *defer, struct seq_result *res, const char **why)
{
	struct core_open o = { .salt = s->salt, .extra = extra, .tokens = tokens, .ntokens = n,
			       .flags = flags, .priority = priority };
	struct core_seq_info info;
	uint32_t nblocks = blocks_for(s, n);
	int r;

	if (retention) {
		o.retention = retention->retention;
		o.n_sink = retention->n_sink;
		o.recent = retention->recent;
		o.budget = retention->budget;
		o.decay = retention->decay;
		o.granularity = retention->granularity;
	}
	/* Arguments first (the core's checks): a bad request is refused whatever the usage. */
	r = core_open_check(s->pool->core, &o, why);
	if (r < 0)
		return r;
	r = check_tokens(s, n, why);
	if (r < 0)
		return r;
	r = account_check(s, seq_bytes(s, o.retention, o.granularity, n, CORE_SEQ_ACTIVE), nblocks,
			  1, why);
	if (r < 0)
		return r;
	/* Reserve the owner entry first so that nothing can fail after the core call. */
	r = reserve_seq(s);
	if (r < 0)
		return r;
	/*
	 * Reads from the swap files and fetches from the remote tier go on without the loop;
	 * host RAM is copied at once.  A ring's open is answered within its batch: it neither
	 * waits for the files nor asks the remote tier, but its blocks are published.
	 */
	if (defer)
		o.flags |= load_flags(s);
	else if (s->pool->remote && s->remote_ns)
		o.flags |= CORE_OPEN_PROBED;
	r = core_seq_open(s->pool->core, &o, &res->seq, &info);
	settle_drops(s->pool);
	if (r < 0)
		return r;
	own(s, res->seq, &info);
	/* The quota counts blocks held: a window or sinks may have released some already. */
	account_blocks(s, info.held_blocks);
	if (info.state == CORE_SEQ_LOADING) {
		const struct deferred_load d = { .seq = res->seq, .charged = info.held_blocks };

		r = defer_loads(s, d.seq);
		if (r < 0) {
			*defer = d; /* only a deferring caller gets a LOADING sequence */
			return r;
		}
		return ops_loaded_result(s, &d, false, res);
	}
	res->cached = info.ncommitted;
	open_counted(s, nblocks, res->cached);
	fill_table_of(s, &info, 0, res);
	return 0;
}

int ops_append(struct session *s, uint64_t seq, const uint32_t *tokens, uint32_t n,
	       struct seq_result *res, const char **why)
{
	struct core_seq_info info;
	uint32_t grow;
	int r;

	r = check_owner(s, seq, &info);
	if (r < 0)
		return r;
	r = check_tokens(s, n, why);
	if (r < 0)
		return r;
	if ((uint64_t)info.ntokens + n > s->pool->cfg->max_seq_tokens)
		return -E2BIG; /* as the core would say, before a quota speaks of it */
	/*
	 * Within its last block an append changes neither the sequence's blocks nor its charge
	 * (an active sequence's core_seq_bytes counts blocks): the decode step's common case.
	 */
	grow = blocks_for(s, (uint64_t)info.ntokens + n) - info.nblocks;
	if (grow) {
		r = account_check(s, more_bytes(s, seq, &info, info.ntokens + n, CORE_SEQ_ACTIVE),
				  grow, 0, why);
		if (r < 0)
			return r;
	}
	r = core_seq_append(s->pool->core, seq, tokens, n);
	settle_drops(s->pool);
	if (r < 0)
		return r;
	if (grow) {
		account_blocks(s, grow);
		ops_recharge(s, seq);
	}
	res->seq = seq;
	res->first_changed = (uint32_t)r;
	fill_table(s, seq, (uint32_t)r, res);
	return 0;
}

int ops_commit(struct session *s, uint64_t seq, uint32_t ntokens, struct seq_result *res,
	       const char **why)
{
	struct core_seq_info info;
	int r;

	r = check_owner(s, seq, &info);
	if (r < 0)
		return r;
	r = core_seq_commit(s->pool->core, seq, ntokens);
	if (r < 0)
		return r;
	res->released = 0;
	if (info.retention != CORE_RETAIN_FULL) {
		struct core_seq_info after;

		/* The retention policy may have released blocks (and h2o packed some). */
		core_seq_info(s->pool->core, seq, &after);
		account_blocks(s, (int64_t)after.held_blocks - (int64_t)info.held_blocks);
		res->released = after.freed_blocks - info.freed_blocks;
		if (after.held_blocks < info.held_blocks)
			s->pool->epoch++;
	}
	res->seq = seq;
	res->replaced = (uint32_t)r;
	res->table_len = 0;
	if (r == 0 && res->released)
		fill_table(s, seq, 0, res); /* the client must stop using what was released */
	if (r > 0) {
		s->pool->epoch++; /* the copies it replaced went back to the pool */
		fill_table(s, seq, 0, res);
	}
	return 0;
}

int ops_fork(struct session *s, uint64_t seq, struct seq_result *res, const char **why)
{
	struct core_seq_info info;
	uint32_t held;
	int r;

	r = check_owner(s, seq, &info);
	if (r < 0)
		return r;
	r = account_check(s, seq_bytes(s, info.retention, info.granularity, info.ntokens,
				       CORE_SEQ_ACTIVE),
			  info.held_blocks, 1, why);
	if (r < 0)
		return r;
	r = reserve_seq(s);
	if (r < 0)
		return r;
	held = info.held_blocks; /* the parent's, which the fork shares */
	r = core_seq_fork(s->pool->core, seq, &res->seq);
	if (r < 0)
		return r;
	core_seq_info(s->pool->core, res->seq, &info);
	own(s, res->seq, &info);
	account_blocks(s, held);
	fill_table_of(s, &info, 0, res);
	return 0;
}

int ops_close(struct session *s, uint64_t seq, const char **why)
{
	struct core_seq_info info;
	int r;

	r = check_owner(s, seq, &info);
	if (r < 0)
		return r;
	r = core_seq_close(s->pool->core, seq);
	if (r < 0)
		return r;
	disown(s, seq);
	account_blocks(s, -(int64_t)info.held_blocks); /* 0 for a dropped sequence */
	s->pool->epoch++;
	return 0;
}

int ops_park(struct session *s, uint64_t seq, const char **why)
{
	struct core_seq_info info;
	int r;

	r = check_owner(s, seq, &info);
	if (r < 0)
		return r;
	/* A parked sequence keeps its token history as well as its blocks. */
	if (info.state == CORE_SEQ_ACTIVE && info.retention == CORE_RETAIN_FULL) {
		r = account_check(s, more_bytes(s, seq, &info, info.ntokens, CORE_SEQ_PARKED), 0, 0,
				  why);
		if (r < 0)
			return r;
	}
	r = core_seq_park(s->pool->core, seq);
	if (r == -EBUSY)
		*why = info.state == CORE_SEQ_LOADING ? "the sequence is loading"
						      : "the sequence is already parked";
	if (r == -EINVAL)
		*why = "a sequence with a retention policy cannot be parked";
	if (r == 0) {
		ops_recharge(s, seq);
		s->pool->epoch++; /* its blocks may be preempted now */
	}
	return r;
}

int ops_resume(struct session *s, uint64_t seq, struct deferred_load *defer,
	       struct seq_result *res, const char **why)
{
	struct core_seq_info info;
	int r;

	r = check_owner(s, seq, &info);
	if (r < 0)
		return r;
	if (info.state == CORE_SEQ_ACTIVE) {
		*why = "the sequence is not parked";
		return -EINVAL;
	}
	/* A dropped sequence takes its blocks (and a table) again: they count against quotas. */
	r = account_check(s, more_bytes(s, seq, &info, info.ntokens, CORE_SEQ_ACTIVE),
			  info.state == CORE_SEQ_DROPPED ? blocks_for(s, info.ntokens) : 0, 0, why);
	if (r < 0)
		return r;
	r = core_seq_resume_flags(s->pool->core, seq,
				  defer ? load_flags(s) & CORE_OPEN_DEFER_LOADS : 0, &res->recompute);
	settle_drops(s->pool);
	if (r < 0)
		return r;
	if (info.state == CORE_SEQ_DROPPED)
		account_blocks(s, blocks_for(s, info.ntokens));
	ops_recharge(s, seq);
	core_seq_info(s->pool->core, seq, &info);
	if (info.state == CORE_SEQ_LOADING) {
		/* Only a dropped sequence loads: it was charged its whole table above. */
		const struct deferred_load d = { .seq = seq, .charged = info.nblocks };

		r = defer_loads(s, seq);
		if (r < 0) {
			*defer = d;
			return r;
		}
		return ops_loaded_result(s, &d, true, res);
	}
	res->seq = seq;
	fill_table(s, seq, 0, res);
	return 0;
}

int ops_scores(struct session *s, uint64_t seq, uint32_t first, const float *weights,
	       uint32_t n, const char **why)
{
	struct core_seq_info info;
	int r;

	r = check_owner(s, seq, &info);
	if (r < 0)
		return r;
	if (n > s->srv->cfg->limits.max_tokens_per_request) {
		*why = "more weights than max_tokens_per_request";
		return -E2BIG;
	}
	r = first == UINT32_MAX ? core_seq_scores_packed(s->pool->core, seq, weights, n)
				: core_seq_scores(s->pool->core, seq, first, weights, n);
	if (r == -EINVAL)
		*why = info.retention != CORE_RETAIN_H2O
			       ? "scores apply to h2o sequences only"
			       : "scores for tokens the sequence does not hold (packed ones by "
				 "slot, all of them), none, or a weight that is negative or not "
				 "finite";
	return r;
}

int ops_lookup(struct session *s, const uint32_t *tokens, uint32_t n, uint64_t extra,
	       uint32_t flags, uint32_t *cached, const char **why)
{
	struct core_open o = { .salt = s->salt, .extra = extra, .tokens = tokens, .ntokens = n,
			       .flags = flags };
	int r = check_tokens(s, n, why);

	if (r < 0)
		return r;
	r = core_open_check(s->pool->core, &o, why);
	if (r < 0)
		return r;
	*cached = core_lookup(s->pool->core, &o);
	return 0;
}

int ops_info(struct session *s, uint64_t seq, struct core_seq_info *info, uint64_t *ret_fence,
	     const char **why)
{
	int r = check_owner(s, seq, info);

	if (r == 0)
		*ret_fence = fence_of(s, info);
	return r;
}

void ops_close_all(struct session *s)
{
	if (!s->pool)
		return;
	while (s->nseqs > 0) {
		uint64_t seq = s->seqs[s->nseqs - 1];

		/* A LOADING one is closed by its load job once its reads are in (an orphan). */
		if (core_seq_close(s->pool->core, seq) == -EBUSY)
			s->pool->orphans++;
		disown(s, seq);
	}
	account_blocks(s, -(int64_t)s->blocks);
	s->pool->epoch++;
}

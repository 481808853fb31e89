/* SPDX-License-Identifier: MIT */
/*
 * A probed level (CORE_TIER_PROBED): a store without an index that several cores share, as
 * machines share a remote tier.  Here it is a map from block hash to the block's identity,
 * tokens and "K/V" words that two cores, each with its own pool memory, use as their last
 * level.  One core publishes what it commits and keeps the blocks until the test says the
 * store is done; the other finds them by probing, byte for byte.  Misses, load errors, the
 * probe's bound, local levels before it, who may probe or publish, the list's rules and
 * freeing with blocks still kept are checked, with core_verify after every step.
 */
#include <errno.h>

#include "daemon/core/core-internal.h"
#include "tests/unit/testutil.h"

#define B 4
#define MAX_ENTRIES 64
#define MAX_HOST 16

/* What the remote store holds of one block: enough to check a probe against it. */
struct entry {
	struct core_hash hash, parent;
	uint64_t salt, extra;
	uint32_t tokens[B];
	uint64_t words[B];
};

/* The store both cores probe; nothing in it is seen by the core but through loads. */
struct remote {
	struct entry e[MAX_ENTRIES];
	uint32_t n;
};

/* A store the callback kept reading (returned 1 for): the test finishes it later. */
struct pending {
	uint32_t block;
	struct core_key key;
	uint32_t tokens[B];
};

/* One core's side: its pool memory, its view of the remote, and a host-like local level. */
struct side {
	struct fake_mem mem;
	struct remote *remote;
	uint32_t probe;     /* the probed level */
	int store_ret;      /* what a publish returns: 1 keep, 0 copied now, < 0 refused */
	struct pending pend[MAX_ENTRIES];
	uint32_t npend;
	uint32_t probe_stores, probe_load_calls;
	/* The local level (level 1 when there is one), which keeps what it is given. */
	uint32_t host_slots;
	uint64_t hwords[MAX_HOST * B];
	uint32_t htokens[MAX_HOST * B];
	struct core_hash hhash[MAX_HOST];
	uint32_t host_stores, host_load_calls;
	uint32_t evicted_pool, evicted_host; /* STORE_EVICTED offers, by the level left */
};

static struct remote remote;

static const struct entry *remote_find(const struct remote *r, struct core_hash h)
{
	for (uint32_t i = 0; i < r->n; i++)
		if (core_hash_eq(r->e[i].hash, h))
			return &r->e[i];
	return NULL;
}

/* What a finished store leaves in the remote: a block already there stays as it is. */
static void remote_put(struct remote *r, const struct core_key *key, const uint32_t *tokens,
		       const uint64_t *words)
{
	struct entry *e;

	if (remote_find(r, key->hash))
		return;
	ck_assert_uint_lt(r->n, MAX_ENTRIES);
	e = &r->e[r->n++];
	e->hash = key->hash;
	e->parent = key->parent;
	e->salt = key->salt;
	e->extra = key->extra;
	memcpy(e->tokens, tokens, sizeof(e->tokens));
	memcpy(e->words, words, sizeof(e->words));
}

static int probe_store(void *ctx, uint32_t from_tier, uint32_t from, uint32_t to_tier,
		       uint32_t to, const struct core_key *key)
{
	struct side *sd = ctx;

	/* Only publishing reaches a probed level: from the pool, into no slot, with tokens. */
	ck_assert_uint_eq(from_tier, CORE_TIER_POOL);
	ck_assert_uint_lt(from, sd->mem.capacity);
	ck_assert_uint_eq(to_tier, sd->probe);
	ck_assert_uint_eq(to, CORE_NONE);
	ck_assert_ptr_nonnull(key->tokens);
	sd->probe_stores++;
	if (sd->store_ret == 0)
		remote_put(sd->remote, key, key->tokens, sd->mem.slots + (size_t)from * B);
	if (sd->store_ret == 1) {
		struct pending *p = &sd->pend[sd->npend++];

		ck_assert_uint_le(sd->npend, MAX_ENTRIES);
		p->block = from;
		p->key = *key;
		memcpy(p->tokens, key->tokens, sizeof(p->tokens));
		p->key.tokens = p->tokens; /* the core's pointer is only good during the call */
	}
	return sd->store_ret;
}

/* Deferred loads only: the core never calls a probed level's load itself. */
static void probe_load(void *ctx, struct core_load *loads, uint32_t n)
{
	struct side *sd = ctx;

	(void)loads;
	(void)n;
	sd->probe_load_calls++;
}

static const struct core_tier_ops probe_ops = { .store = probe_store, .load = probe_load };

/*
 * CORE_TIER_STORE_EVICTED's store: a block leaving the last local level, from the pool (with
 * its tokens) or from the local level's storage (without: that storage has them), copied into
 * the remote within the call.  Returns 1, which must keep nothing.
 */
static int evict_store(void *ctx, uint32_t from_tier, uint32_t from, uint32_t to_tier,
		       uint32_t to, const struct core_key *key)
{
	struct side *sd = ctx;

	ck_assert_uint_eq(to_tier, sd->probe);
	ck_assert_uint_eq(to, CORE_NONE);
	if (from_tier == CORE_TIER_POOL) {
		ck_assert_uint_lt(from, sd->mem.capacity);
		ck_assert_ptr_nonnull(key->tokens);
		remote_put(sd->remote, key, key->tokens, sd->mem.slots + (size_t)from * B);
		sd->evicted_pool++;
	} else {
		ck_assert_uint_eq(from_tier, 1);
		ck_assert_uint_lt(from, sd->host_slots);
		ck_assert_ptr_null(key->tokens);
		ck_assert(core_hash_eq(sd->hhash[from], key->hash));
		remote_put(sd->remote, key, sd->htokens + (size_t)from * B,
			   sd->hwords + (size_t)from * B);
		sd->evicted_host++;
	}
	sd->probe_stores++;
	return 1;
}

static const struct core_tier_ops evict_ops = { .store = evict_store, .load = probe_load };
/* What mk gives its probed level: the ops and flags (tests of STORE_EVICTED change them). */
static const struct core_tier_ops *mk_probe_ops = &probe_ops;
static uint32_t mk_probe_flags = CORE_TIER_PROBED;
static uint32_t mk_host_flags; /* the local level's (CORE_TIER_COLD: like swap files) */

/* What an observer (core_config.observe) was told, and what it makes of each level. */
#define MAX_SEEN 64
struct seen {
	uint32_t stored[MAX_HOST], removed[MAX_HOST]; /* by level */
	struct core_hash at[MAX_HOST][MAX_SEEN];     /* findable per level, as told */
	uint32_t nat[MAX_HOST];
	uint32_t tokens_checked;
	struct side *sd;
	struct core *c;
};
static struct seen *mk_seen;

static void observe(void *ctx, const struct core_event *ev)
{
	struct seen *w = ctx;
	uint32_t l = ev->level, i;

	ck_assert_uint_lt(l, 3);
	for (i = 0; i < w->nat[l] && !core_hash_eq(w->at[l][i], ev->hash); i++)
		;
	if (ev->kind == CORE_EVENT_REMOVED) {
		/* Only what was announced there leaves it, once. */
		ck_assert_msg(i < w->nat[l], "REMOVED at level %u of a block never STORED there", l);
		w->at[l][i] = w->at[l][--w->nat[l]];
		w->removed[l]++;
		return;
	}
	ck_assert_msg(i == w->nat[l], "STORED twice at level %u", l);
	ck_assert_uint_lt(w->nat[l], MAX_SEEN);
	w->at[l][w->nat[l]++] = ev->hash;
	w->stored[l]++;
	/* The tokens: given, or in the level it came from (the host-like level's storage). */
	if (ev->tokens) {
		ck_assert(core_hash_eq(ev->hash, core_chain_hash(w->c, ev->parent, ev->salt,
								 ev->extra, ev->tokens)));
		w->tokens_checked++;
	} else {
		ck_assert_uint_eq(ev->from_level, 1);
		ck_assert(core_hash_eq(w->sd->hhash[ev->from_slot], ev->hash));
	}
}

static int host_store(void *ctx, uint32_t from_tier, uint32_t from, uint32_t to_tier, uint32_t to,
		      const struct core_key *key)
{
	struct side *sd = ctx;

	ck_assert_uint_eq(from_tier, CORE_TIER_POOL);
	ck_assert_uint_eq(to_tier, 1);
	ck_assert_uint_lt(to, sd->host_slots);
	memcpy(sd->hwords + (size_t)to * B, sd->mem.slots + (size_t)from * B, B * sizeof(uint64_t));
	memcpy(sd->htokens + (size_t)to * B, key->tokens, B * sizeof(uint32_t));
	sd->hhash[to] = key->hash;
	sd->host_stores++;
	return 0;
}

static void host_load(void *ctx, struct core_load *loads, uint32_t n)
{
	struct side *sd = ctx;

	sd->host_load_calls++;
	for (uint32_t i = 0; i < n; i++) {
		struct core_load *l = &loads[i];

		ck_assert_uint_eq(l->tier, 1);
		if (!core_hash_eq(sd->hhash[l->slot], l->key.hash) ||
		    memcmp(sd->htokens + (size_t)l->slot * B, l->key.tokens,
			   B * sizeof(uint32_t))) {
			l->result = -EBADMSG;
			continue;
		}
		memcpy(sd->mem.slots + (size_t)l->block * B, sd->hwords + (size_t)l->slot * B,
		       B * sizeof(uint64_t));
		l->result = 0;
	}
}

static const struct core_tier_ops host_ops = { .store = host_store, .load = host_load };

/*
 * A core of capacity blocks over the shared remote (probe_slots blocks a lookup may ask it
 * for), with a local level of host_slots slots before it when host_slots > 0.
 */
static struct core *mk(struct side *sd, uint32_t capacity, uint32_t host_slots,
		       uint32_t probe_slots)
{
	struct core_config cfg = {
		.capacity_blocks = capacity,
		.block_tokens = B,
		.max_sequences = 8,
		.max_seq_tokens = 64,
		.copy_block = fake_copy,
		.copy_ctx = &sd->mem,
	};
	struct core *c = NULL;

	if (mk_seen) {
		cfg.observe = observe;
		cfg.observe_ctx = mk_seen;
		mk_seen->sd = sd;
	}
	ck_assert_uint_le(host_slots, MAX_HOST);
	memset(sd, 0, sizeof(*sd));
	fake_mem_init(&sd->mem, capacity, B);
	sd->remote = &remote;
	sd->store_ret = 1;
	sd->host_slots = host_slots;
	if (host_slots)
		cfg.tiers[cfg.ntiers++] = (struct core_tier_config){
			.slots = host_slots, .ops = &host_ops, .ctx = sd, .flags = mk_host_flags };
	cfg.tiers[cfg.ntiers++] = (struct core_tier_config){
		.slots = probe_slots, .ops = mk_probe_ops, .ctx = sd, .flags = mk_probe_flags };
	sd->probe = cfg.ntiers;
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	assert_verified(c);
	return c;
}

static void done(struct core *c, struct side *sd)
{
	assert_verified(c);
	core_free(c);
	free(sd->mem.slots);
}

static struct core_tier_stats tstats(const struct core *c, uint32_t t)
{
	struct core_tier_stats st;

	ck_assert_int_eq(core_get_tier_stats(c, t, &st), 0);
	return st;
}

static struct core_usage usage(const struct core *c)
{
	struct core_usage u;

	core_get_usage(c, &u);
	return u;
}

static struct core_seq_info info(const struct core *c, uint64_t s)
{
	struct core_seq_info si;

	ck_assert_int_eq(core_seq_info(c, s, &si), 0);
	return si;
}

/* The "K/V" the engine computes for token position i of the prompt starting with token base. */
static uint64_t kv_word(uint32_t base, uint32_t i)
{
	return (uint64_t)base << 32 | (i * 2654435761u);
}

/* "Prefills" seq's tokens [from, to) into its pool blocks, as the engine would. */
static void prefill(struct side *sd, const struct core *c, uint64_t s, const uint32_t *t,
		    uint32_t from, uint32_t to)
{
	struct core_seq_info si = info(c, s);

	for (uint32_t i = from; i < to; i++)
		sd->mem.slots[(size_t)si.table[i / B] * B + i % B] = kv_word(t[0], i);
}

/* Whether seq's first n tokens read the K/V their prompt (starting with token base) had. */
static void assert_kv(const struct side *sd, const struct core *c, uint64_t s, uint32_t base,
		      uint32_t n)
{
	struct core_seq_info si = info(c, s);

	for (uint32_t i = 0; i < n; i++)
		ck_assert_uint_eq(sd->mem.slots[(size_t)si.table[i / B] * B + i % B],
				  kv_word(base, i));
}

static uint64_t open_seq(struct core *c, const uint32_t *t, uint32_t n, uint32_t flags)
{
	uint64_t s;

	ck_assert_int_eq(core_seq_open(c,
				       &(struct core_open){ .tokens = t, .ntokens = n,
							    .flags = flags },
				       &s, NULL),
			 0);
	assert_verified(c);
	return s;
}

/* Finishes every store the callback kept: into the remote, then core_tier_stored. */
static void finish_stores(struct core *c, struct side *sd)
{
	for (uint32_t i = 0; i < sd->npend; i++) {
		const struct pending *p = &sd->pend[i];

		remote_put(sd->remote, &p->key, p->tokens, sd->mem.slots + (size_t)p->block * B);
		ck_assert_int_eq(core_tier_stored(c, sd->probe, p->block), 0);
		assert_verified(c);
	}
	sd->npend = 0;
	ck_assert_uint_eq(core_tier_storing(c), 0);
}

/*
 * Serves a LOADING sequence's loads as the daemon would: the local level's from its storage,
 * the probe's from the remote (-ENOENT when it lacks the block).  force[k], when nonzero,
 * is load k's result instead (nothing copied).  Checks that the probe's loads are numbered
 * 0, 1, ... and carry the prompt's chain.  Returns how many loads there were.
 */
static uint32_t serve(struct core *c, struct side *sd, uint64_t s, const int *force,
		      uint32_t nforce)
{
	struct core_load *loads;
	uint32_t n, nprobe = 0;

	ck_assert_int_eq(core_seq_pending_loads(c, s, &loads, &n), 0);
	for (uint32_t k = 0; k < n; k++) {
		struct core_load *l = &loads[k];
		const struct entry *e;

		if (k > 0)
			ck_assert(core_hash_eq(l->key.parent, loads[k - 1].key.hash));
		if (l->tier != sd->probe) {
			ck_assert_uint_eq(nprobe, 0); /* the local chain comes first */
			if (k < nforce && force[k])
				l->result = force[k];
			else
				host_load(sd, l, 1);
			continue;
		}
		ck_assert_uint_eq(l->slot, nprobe++);
		if (k < nforce && force[k]) {
			l->result = force[k];
			continue;
		}
		e = remote_find(sd->remote, l->key.hash);
		if (!e) {
			l->result = -ENOENT;
			continue;
		}
		/* The remote checks identity as a real store would. */
		ck_assert(core_hash_eq(e->parent, l->key.parent));
		ck_assert_uint_eq(e->salt, l->key.salt);
		ck_assert_uint_eq(e->extra, l->key.extra);
		ck_assert_int_eq(memcmp(e->tokens, l->key.tokens, sizeof(e->tokens)), 0);
		memcpy(sd->mem.slots + (size_t)l->block * B, e->words, sizeof(e->words));
		l->result = 0;
	}
	assert_verified(c); /* the loads' blocks are the sequence's meanwhile */
	ck_assert_int_eq(core_seq_loaded(c, s), 0);
	assert_verified(c);
	ck_assert_uint_eq(sd->probe_load_calls, 0);
	return n;
}

/* Has core a (over side sa) compute and publish prompt t, new to the remote: it holds it then. */
static void publish_prompt(struct core *a, struct side *sa, const uint32_t *t, uint32_t n)
{
	uint32_t before = remote.n;
	uint64_t s = open_seq(a, t, n, CORE_OPEN_PROBED);

	prefill(sa, a, s, t, 0, n);
	ck_assert_int_eq(core_seq_commit(a, s, n), 0);
	assert_verified(a);
	ck_assert_uint_eq(sa->npend, n / B);
	finish_stores(a, sa);
	ck_assert_int_eq(core_seq_close(a, s), 0);
	assert_verified(a);
	ck_assert_uint_eq(remote.n, before + n / B);
}

/*
 * Two machines, one remote.  A probes first and misses (the first miss is counted), computes
 * the prompt and publishes its three full blocks, keeping them while its store reads them.
 * B then probes the same prompt: three loads of the probe, slots 0, 1, 2, with A's hashes and
 * the prompt's tokens, and A's bytes in B's blocks once served.
 */
START_TEST(test_one_core_publishes_another_probes)
{
	static struct side sa, sb;
	uint32_t t[14];
	struct core_hash hashes[3];
	struct core_load *loads;
	struct core *a = mk(&sa, 8, 0, 8), *b = mk(&sb, 8, 0, 8);
	uint64_t s;
	uint32_t n;

	fill_tokens(t, 14, 100);
	s = open_seq(a, t, 14, CORE_OPEN_PROBED | CORE_OPEN_DEFER_LOADS);
	ck_assert_uint_eq(info(a, s).state, CORE_SEQ_LOADING);
	ck_assert_uint_eq(serve(a, &sa, s, NULL, 0), 3);
	ck_assert_uint_eq(info(a, s).ncommitted, 0);
	ck_assert_uint_eq(tstats(a, sa.probe).probes, 3);
	ck_assert_uint_eq(tstats(a, sa.probe).misses, 1);
	ck_assert_uint_eq(tstats(a, sa.probe).load_errors, 0);
	ck_assert_uint_eq(tstats(a, sa.probe).promotions, 0);

	prefill(&sa, a, s, t, 0, 14);
	ck_assert_int_eq(core_seq_commit(a, s, 14), 0);
	assert_verified(a);
	/* Each full block, in chain order, with its tokens; the partial tail is not offered. */
	ck_assert_uint_eq(sa.probe_stores, 3);
	ck_assert_uint_eq(tstats(a, sa.probe).published, 3);
	ck_assert_uint_eq(tstats(a, sa.probe).store_errors, 0);
	ck_assert_uint_eq(core_tier_storing(a), 3);
	for (uint32_t k = 0; k < 3; k++) {
		const struct core_block *blk = &a->pool.blocks[sa.pend[k].block];

		ck_assert_uint_eq(sa.pend[k].block, info(a, s).table[k]);
		ck_assert_int_eq(memcmp(sa.pend[k].tokens, t + k * B, B * sizeof(uint32_t)), 0);
		ck_assert(core_hash_eq(sa.pend[k].key.hash, blk->hash));
		ck_assert(k ? core_hash_eq(sa.pend[k].key.parent, sa.pend[k - 1].key.hash)
			    : core_hash_eq(sa.pend[k].key.parent, (struct core_hash){ 0, 0 }));
		/* Held once by the table, once by the store. */
		ck_assert_uint_eq(blk->refcount, 2);
		ck_assert(blk->flags & CORE_BLOCK_STORING);
		hashes[k] = sa.pend[k].key.hash;
	}
	finish_stores(a, &sa);
	for (uint32_t k = 0; k < 3; k++)
		ck_assert_uint_eq(a->pool.blocks[info(a, s).table[k]].refcount, 1);
	ck_assert_int_eq(core_seq_close(a, s), 0);
	assert_verified(a);
	ck_assert_uint_eq(remote.n, 3);

	s = open_seq(b, t, 14, CORE_OPEN_PROBED | CORE_OPEN_DEFER_LOADS);
	ck_assert_uint_eq(info(b, s).state, CORE_SEQ_LOADING);
	ck_assert_int_eq(core_seq_pending_loads(b, s, &loads, &n), 0);
	ck_assert_uint_eq(n, 3);
	for (uint32_t k = 0; k < n; k++) {
		ck_assert_uint_eq(loads[k].tier, sb.probe);
		ck_assert_uint_eq(loads[k].slot, k);
		ck_assert_uint_eq(loads[k].block, info(b, s).table[k]);
		ck_assert(core_hash_eq(loads[k].key.hash, hashes[k]));
		ck_assert(k ? core_hash_eq(loads[k].key.parent, hashes[k - 1])
			    : core_hash_eq(loads[k].key.parent, (struct core_hash){ 0, 0 }));
		ck_assert_int_eq(memcmp(loads[k].key.tokens, t + k * B, B * sizeof(uint32_t)), 0);
	}
	ck_assert_uint_eq(serve(b, &sb, s, NULL, 0), 3);
	ck_assert_uint_eq(info(b, s).state, CORE_SEQ_ACTIVE);
	ck_assert_uint_eq(info(b, s).ncommitted, 12);
	assert_kv(&sb, b, s, t[0], 12);
	for (uint32_t k = 0; k < 3; k++) {
		const struct core_block *blk = &b->pool.blocks[info(b, s).table[k]];

		ck_assert_uint_eq(blk->state, CORE_BLOCK_READY);
		ck_assert(blk->flags & CORE_BLOCK_INDEXED);
	}
	ck_assert_uint_eq(tstats(b, sb.probe).probes, 3);
	ck_assert_uint_eq(tstats(b, sb.probe).promotions, 3);
	ck_assert_uint_eq(tstats(b, sb.probe).misses, 0);
	ck_assert_uint_eq(core_lookup(b, &(struct core_open){ .tokens = t, .ntokens = 14 }), 12);

	/* What came from the probe is not offered back to it; only the recomputed tail could. */
	prefill(&sb, b, s, t, 12, 14);
	ck_assert_int_eq(core_seq_commit(b, s, 14), 0);
	assert_verified(b);
	ck_assert_uint_eq(tstats(b, sb.probe).published, 0);
	ck_assert_uint_eq(sb.probe_stores, 0);
	ck_assert_int_eq(core_seq_close(b, s), 0);
	done(a, &sa);
	done(b, &sb);
}
END_TEST

/*
 * A kept block is the store's until core_tier_stored: memory pressure does not reuse it,
 * its sequence's close does not free it.  Then it is cached like any block, and a chain whose
 * stores finish root first after the close still goes leaf first.
 */
START_TEST(test_a_kept_block_is_not_reused)
{
	static struct side sd;
	struct core *c = mk(&sd, 4, 0, 8);
	uint32_t p[8], q[16], r[12], kept[2];
	struct core_stats st;
	uint64_t s;

	fill_tokens(p, 8, 100);
	fill_tokens(q, 16, 200);
	fill_tokens(r, 12, 300);
	s = open_seq(c, p, 8, CORE_OPEN_PROBED);
	prefill(&sd, c, s, p, 0, 8);
	ck_assert_int_eq(core_seq_commit(c, s, 8), 0);
	assert_verified(c);
	ck_assert_uint_eq(core_tier_storing(c), 2);
	kept[0] = sd.pend[0].block;
	kept[1] = sd.pend[1].block;
	ck_assert_int_eq(core_seq_close(c, s), 0);
	assert_verified(c);
	ck_assert_uint_eq(usage(c).in_use, 2);
	ck_assert_uint_eq(usage(c).cached, 0);
	ck_assert_uint_eq(usage(c).free, 2);
	/* Still findable: the store only reads it. */
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = p, .ntokens = 8 }), 8);

	/* Four blocks are not there: two are kept. */
	ck_assert_int_eq(core_seq_open(c, &(struct core_open){ .tokens = q, .ntokens = 16 }, &s,
				       NULL),
			 -ENOSPC);
	assert_verified(c);
	s = open_seq(c, q, 8, 0);
	for (uint32_t i = 0; i < 2; i++)
		ck_assert(info(c, s).table[i] != kept[0] && info(c, s).table[i] != kept[1]);
	prefill(&sd, c, s, q, 0, 8);
	ck_assert_int_eq(core_seq_close(c, s), 0); /* uncommitted: back to the free list */
	assert_verified(c);
	core_get_stats(c, &st);
	ck_assert_uint_eq(st.evictions, 0);
	for (uint32_t k = 0; k < 2; k++)
		for (uint32_t i = 0; i < B; i++)
			ck_assert_uint_eq(sd.mem.slots[(size_t)kept[k] * B + i],
					  kv_word(p[0], k * B + i));

	/* Bad completions change nothing. */
	ck_assert_int_eq(core_tier_stored(c, sd.probe + 1, kept[0]), -EINVAL);
	ck_assert_int_eq(core_tier_stored(c, CORE_TIER_POOL, kept[0]), -EINVAL);
	ck_assert_int_eq(core_tier_stored(c, sd.probe, 4), -EINVAL);
	ck_assert_int_eq(core_tier_stored(c, sd.probe, CORE_NONE), -EINVAL);
	for (uint32_t b = 0; b < 4; b++)
		if (b != kept[0] && b != kept[1])
			ck_assert_int_eq(core_tier_stored(c, sd.probe, b), -EINVAL);
	ck_assert_uint_eq(core_tier_storing(c), 2);
	assert_verified(c);

	/* The store finishes root first, as a remote naturally would. */
	finish_stores(c, &sd);
	ck_assert_int_eq(core_tier_stored(c, sd.probe, kept[0]), -EINVAL); /* twice */
	ck_assert_int_eq(core_tier_stored(c, sd.probe, kept[1]), -EINVAL);
	assert_verified(c);
	ck_assert_uint_eq(usage(c).in_use, 0);
	ck_assert_uint_eq(usage(c).cached, 2);
	ck_assert_uint_eq(usage(c).free, 2);

	/* One block more than is free: the leaf goes, the root stays findable. */
	s = open_seq(c, r, 12, 0);
	core_get_stats(c, &st);
	ck_assert_uint_eq(st.evictions, 1);
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = p, .ntokens = 8 }), B);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	/* And all of it, when needed: nothing is kept any more. */
	s = open_seq(c, q, 16, 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c, &sd);
}
END_TEST

/*
 * Stores finish in any order after their sequence closed: leaf, root, then middle.  Each block
 * let go of still goes in older than its cached ancestors, so eviction stays leaf first.
 */
START_TEST(test_stores_finish_in_any_order)
{
	static const uint32_t order[3] = { 2, 0, 1 };
	static struct side sd;
	struct core *c = mk(&sd, 4, 0, 8);
	uint32_t p[12], q[8];
	struct core_stats st;
	uint64_t s;

	fill_tokens(p, 12, 100);
	fill_tokens(q, 8, 200);
	s = open_seq(c, p, 12, CORE_OPEN_PROBED);
	prefill(&sd, c, s, p, 0, 12);
	ck_assert_int_eq(core_seq_commit(c, s, 12), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	assert_verified(c);
	ck_assert_uint_eq(sd.npend, 3);
	for (uint32_t i = 0; i < 3; i++) {
		ck_assert_int_eq(core_tier_stored(c, sd.probe, sd.pend[order[i]].block), 0);
		assert_verified(c);
	}
	sd.npend = 0;
	ck_assert_uint_eq(usage(c).cached, 3);
	/* Two blocks needed, one free: the leaf goes, the rest of the chain stays findable. */
	s = open_seq(c, q, 8, 0);
	core_get_stats(c, &st);
	ck_assert_uint_eq(st.evictions, 1);
	ck_assert_uint_eq(core_lookup(c, &(struct core_open){ .tokens = p, .ntokens = 12 }), 8);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c, &sd);
}
END_TEST

/*
 * The probe has the first and third blocks but not the second: only the first comes up (the
 * third has no parent without the second), the miss is counted as a miss, and the rest is
 * recomputed, its blocks the sequence's own.
 */
START_TEST(test_a_miss_in_the_middle)
{
	static struct side sa, sb;
	static const int force[3] = { 0, -ENOENT, 0 };
	struct core *a = mk(&sa, 8, 0, 8), *b = mk(&sb, 8, 0, 8);
	uint32_t t[13];
	uint64_t s;

	fill_tokens(t, 13, 100);
	publish_prompt(a, &sa, t, 12);
	s = open_seq(b, t, 13, CORE_OPEN_PROBED | CORE_OPEN_DEFER_LOADS);
	ck_assert_uint_eq(usage(b).in_use, 4);
	ck_assert_uint_eq(serve(b, &sb, s, force, 3), 3);
	ck_assert_uint_eq(info(b, s).ncommitted, B);
	assert_kv(&sb, b, s, t[0], B);
	ck_assert_uint_eq(tstats(b, sb.probe).probes, 3);
	ck_assert_uint_eq(tstats(b, sb.probe).promotions, 1);
	ck_assert_uint_eq(tstats(b, sb.probe).misses, 1);
	ck_assert_uint_eq(tstats(b, sb.probe).load_errors, 0);
	ck_assert_uint_eq(usage(b).in_use, 4);
	ck_assert_uint_eq(usage(b).indexed, 1);
	ck_assert_uint_eq(usage(b).free, 4);
	ck_assert_uint_eq(usage(b).cached, 0);
	ck_assert_uint_eq(core_lookup(b, &(struct core_open){ .tokens = t, .ntokens = 13 }), B);

	/* Recomputed and committed: the two blocks are offered (the core cannot know). */
	sb.store_ret = 0;
	prefill(&sb, b, s, t, B, 13);
	ck_assert_int_eq(core_seq_commit(b, s, 13), 0);
	assert_verified(b);
	ck_assert_uint_eq(tstats(b, sb.probe).published, 2);
	ck_assert_uint_eq(core_tier_storing(b), 0);
	assert_kv(&sb, b, s, t[0], 13);
	ck_assert_int_eq(core_seq_close(b, s), 0);
	ck_assert_uint_eq(usage(b).cached, 3);
	ck_assert_uint_eq(usage(b).free, 5);
	done(a, &sa);
	done(b, &sb);
}
END_TEST

/* A block the probe gives back damaged is a load error, not a miss. */
START_TEST(test_a_damaged_block_is_a_load_error)
{
	static struct side sa, sb;
	static const int force[1] = { -EBADMSG };
	struct core *a = mk(&sa, 8, 0, 8), *b = mk(&sb, 8, 0, 8);
	uint32_t t[12];
	uint64_t s;

	fill_tokens(t, 12, 100);
	publish_prompt(a, &sa, t, 12);
	s = open_seq(b, t, 12, CORE_OPEN_PROBED | CORE_OPEN_DEFER_LOADS);
	ck_assert_uint_eq(serve(b, &sb, s, force, 1), 3);
	ck_assert_uint_eq(info(b, s).ncommitted, 0);
	ck_assert_uint_eq(tstats(b, sb.probe).load_errors, 1);
	ck_assert_uint_eq(tstats(b, sb.probe).misses, 0);
	ck_assert_uint_eq(tstats(b, sb.probe).promotions, 0);
	ck_assert_uint_eq(tstats(b, sb.probe).probes, 3);
	ck_assert_uint_eq(usage(b).indexed, 0);
	ck_assert_int_eq(core_seq_close(b, s), 0);
	ck_assert_uint_eq(usage(b).free, 8);
	done(a, &sa);
	done(b, &sb);
}
END_TEST

/*
 * One lookup asks the probe for slots blocks at most, counted from where the pool's chain
 * ends: two here, for a prompt of five blocks whose first is cached.
 */
START_TEST(test_the_probe_asks_for_slots_blocks_at_most)
{
	static struct side sd;
	struct core *c = mk(&sd, 8, 0, 2);
	struct core_hash root;
	struct core_load *loads;
	uint32_t t[20], n;
	uint64_t s;

	fill_tokens(t, 20, 100);
	s = open_seq(c, t, 20, CORE_OPEN_PROBED | CORE_OPEN_DEFER_LOADS);
	ck_assert_int_eq(core_seq_pending_loads(c, s, &loads, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_uint_eq(serve(c, &sd, s, NULL, 0), 2);
	ck_assert_uint_eq(tstats(c, sd.probe).probes, 2);
	ck_assert_int_eq(core_seq_close(c, s), 0);

	/* The first block cached in the pool (not published: not a probed sequence). */
	s = open_seq(c, t, 4, 0);
	prefill(&sd, c, s, t, 0, 4);
	ck_assert_int_eq(core_seq_commit(c, s, 4), 0);
	root = c->pool.blocks[info(c, s).table[0]].hash;
	ck_assert_int_eq(core_seq_close(c, s), 0);
	assert_verified(c);

	s = open_seq(c, t, 20, CORE_OPEN_PROBED | CORE_OPEN_DEFER_LOADS);
	ck_assert_int_eq(core_seq_pending_loads(c, s, &loads, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert(core_hash_eq(loads[0].key.parent, root));
	ck_assert_int_eq(memcmp(loads[0].key.tokens, t + B, B * sizeof(uint32_t)), 0);
	ck_assert_int_eq(memcmp(loads[1].key.tokens, t + 2 * B, B * sizeof(uint32_t)), 0);
	ck_assert_uint_eq(loads[0].block, info(c, s).table[1]);
	ck_assert_uint_eq(serve(c, &sd, s, NULL, 0), 2);
	ck_assert_uint_eq(info(c, s).ncommitted, B);
	ck_assert_uint_eq(tstats(c, sd.probe).probes, 4);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(c, &sd);
}
END_TEST

/*
 * A local level before the probe: what it holds comes from it, and the probe is asked for
 * what follows.  A's remote holds the whole prompt; C's host level holds its first three
 * blocks (pushed out of C's pool by another prompt).
 */
START_TEST(test_local_levels_come_first)
{
	static struct side sa, sc;
	struct core *a = mk(&sa, 8, 0, 8), *c = mk(&sc, 6, 8, 4);
	uint32_t p[20], q[24];
	uint64_t s;

	fill_tokens(p, 20, 100);
	fill_tokens(q, 24, 200);
	publish_prompt(a, &sa, p, 20);
	s = open_seq(c, p, 12, 0);
	prefill(&sc, c, s, p, 0, 12);
	ck_assert_int_eq(core_seq_commit(c, s, 12), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	s = open_seq(c, q, 24, 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	assert_verified(c);
	ck_assert_uint_eq(tstats(c, 1).used, 3);
	ck_assert_uint_eq(sc.probe_stores, 0);

	s = open_seq(c, p, 20, CORE_OPEN_PROBED | CORE_OPEN_DEFER_LOADS);
	{
		struct core_load *loads;
		uint32_t n;

		ck_assert_int_eq(core_seq_pending_loads(c, s, &loads, &n), 0);
		ck_assert_uint_eq(n, 5);
		for (uint32_t k = 0; k < 5; k++) {
			ck_assert_uint_eq(loads[k].tier, k < 3 ? 1 : sc.probe);
			if (k >= 3)
				ck_assert_uint_eq(loads[k].slot, k - 3);
			ck_assert_uint_eq(loads[k].block, info(c, s).table[k]);
		}
	}
	ck_assert_uint_eq(serve(c, &sc, s, NULL, 0), 5);
	ck_assert_uint_eq(info(c, s).ncommitted, 20);
	assert_kv(&sc, c, s, p[0], 20);
	ck_assert_uint_eq(tstats(c, 1).promotions, 3);
	ck_assert_uint_eq(tstats(c, 1).used, 0);
	ck_assert_uint_eq(tstats(c, sc.probe).promotions, 2);
	ck_assert_uint_eq(tstats(c, sc.probe).probes, 2);
	ck_assert_uint_eq(sc.host_load_calls, 3); /* by serve, one per load: the core loaded none */
	ck_assert_int_eq(core_seq_close(c, s), 0);
	done(a, &sa);
	done(c, &sc);
}
END_TEST

/*
 * Evictions from the last local level are gone: nothing is demoted into the probe, however
 * much goes through the host level.
 */
START_TEST(test_nothing_is_demoted_into_the_probe)
{
	static struct side sd;
	struct core *c = mk(&sd, 2, 1, 4);
	uint32_t t[8];

	for (uint32_t i = 0; i < 4; i++) {
		uint64_t s;

		fill_tokens(t, 8, 100 * (i + 1));
		s = open_seq(c, t, 8, CORE_OPEN_PROBED | CORE_OPEN_DEFER_LOADS);
		if (info(c, s).state == CORE_SEQ_LOADING)
			serve(c, &sd, s, NULL, 0);
		prefill(&sd, c, s, t, 0, 8);
		sd.store_ret = 0;
		ck_assert_int_eq(core_seq_commit(c, s, 8), 0);
		ck_assert_int_eq(core_seq_close(c, s), 0);
		assert_verified(c);
	}
	ck_assert_uint_ge(tstats(c, 1).evictions, 1);
	/* Only the commits' offers reached the probe: two per prompt. */
	ck_assert_uint_eq(sd.probe_stores, 8);
	ck_assert_uint_eq(tstats(c, sd.probe).published, 8);
	ck_assert_uint_eq(tstats(c, sd.probe).demotions, 0);
	done(c, &sd);
}
END_TEST

/*
 * Who probes and who publishes: only a deferred open (or resume) of a probed sequence probes;
 * core_lookup never does; only a probed sequence's commits publish, and a block that another
 * sequence made findable first (dedup) is not offered again.
 */
START_TEST(test_only_deferred_probed_sequences_probe_and_publish)
{
	static struct side sa, sb;
	struct core *a = mk(&sa, 8, 0, 8), *b = mk(&sb, 8, 0, 8);
	struct core_load *loads;
	struct core_stats st;
	uint32_t t[12], n;
	uint64_t s, s2;

	fill_tokens(t, 12, 100);
	publish_prompt(a, &sa, t, 12);

	s = open_seq(b, t, 12, CORE_OPEN_PROBED); /* synchronous */
	ck_assert_uint_eq(info(b, s).state, CORE_SEQ_ACTIVE);
	ck_assert_uint_eq(info(b, s).ncommitted, 0);
	ck_assert_int_eq(core_seq_pending_loads(b, s, &loads, &n), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_int_eq(core_seq_close(b, s), 0);
	s = open_seq(b, t, 12, CORE_OPEN_DEFER_LOADS); /* not probed */
	ck_assert_uint_eq(info(b, s).state, CORE_SEQ_ACTIVE);
	ck_assert_uint_eq(info(b, s).ncommitted, 0);
	ck_assert_int_eq(core_seq_close(b, s), 0);
	ck_assert_uint_eq(core_lookup(b, &(struct core_open){ .tokens = t, .ntokens = 12,
							      .flags = CORE_OPEN_PROBED |
								       CORE_OPEN_DEFER_LOADS }),
			  0);
	ck_assert_uint_eq(tstats(b, sb.probe).probes, 0);
	ck_assert_uint_eq(sb.probe_load_calls, 0);

	/* A sequence that is not probed commits: nothing offered. */
	s = open_seq(b, t, 12, 0);
	prefill(&sb, b, s, t, 0, 12);
	ck_assert_int_eq(core_seq_commit(b, s, 12), 0);
	assert_verified(b);
	ck_assert_uint_eq(tstats(b, sb.probe).published, 0);
	ck_assert_uint_eq(sb.probe_stores, 0);
	ck_assert_int_eq(core_seq_close(b, s), 0);
	ck_assert_uint_eq(core_drop_cache(b), 3);
	assert_verified(b);

	/* Two probed sequences compute the same prompt at once: the second one's copies dedup. */
	sb.store_ret = 0;
	s = open_seq(b, t, 12, CORE_OPEN_PROBED);
	s2 = open_seq(b, t, 12, CORE_OPEN_PROBED);
	prefill(&sb, b, s, t, 0, 12);
	prefill(&sb, b, s2, t, 0, 12);
	ck_assert_int_eq(core_seq_commit(b, s, 12), 0);
	assert_verified(b);
	ck_assert_uint_eq(tstats(b, sb.probe).published, 3);
	ck_assert_int_eq(core_seq_commit(b, s2, 12), 3);
	assert_verified(b);
	core_get_stats(b, &st);
	ck_assert_uint_eq(st.dedup_blocks, 3);
	ck_assert_uint_eq(tstats(b, sb.probe).published, 3);
	ck_assert_uint_eq(sb.probe_stores, 3);
	ck_assert_int_eq(core_seq_close(b, s), 0);
	ck_assert_int_eq(core_seq_close(b, s2), 0);
	done(a, &sa);
	done(b, &sb);
}
END_TEST

/*
 * A fork shares its parent's namespace: a probed sequence's children offer what they commit,
 * an unprobed one's do not (a closed probed sequence's slot leaves nothing behind).
 */
START_TEST(test_a_fork_publishes_as_its_parent)
{
	static struct side sd;
	struct core *c = mk(&sd, 8, 0, 8);
	uint32_t t[8], u[4];
	uint64_t s, child;

	fill_tokens(t, 8, 100);
	fill_tokens(u, 4, 500);
	sd.store_ret = 0;
	s = open_seq(c, t, 4, CORE_OPEN_PROBED);
	prefill(&sd, c, s, t, 0, 4);
	ck_assert_int_eq(core_seq_commit(c, s, 4), 0);
	ck_assert_uint_eq(tstats(c, sd.probe).published, 1);
	ck_assert_int_eq(core_seq_fork(c, s, &child), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	ck_assert_int_ge(core_seq_append(c, child, t + 4, 4), 0);
	prefill(&sd, c, child, t, 4, 8);
	ck_assert_int_eq(core_seq_commit(c, child, 8), 0);
	assert_verified(c);
	ck_assert_uint_eq(tstats(c, sd.probe).published, 2);
	ck_assert_int_eq(core_seq_close(c, child), 0);

	s = open_seq(c, u, 4, 0);
	ck_assert_int_eq(core_seq_fork(c, s, &child), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	prefill(&sd, c, child, u, 0, 4);
	ck_assert_int_eq(core_seq_commit(c, child, 4), 0);
	assert_verified(c);
	ck_assert_uint_eq(tstats(c, sd.probe).published, 2);
	ck_assert_int_eq(core_seq_close(c, child), 0);
	done(c, &sd);
}
END_TEST

/* A refused offer is counted and keeps nothing; a 0 keeps nothing either. */
START_TEST(test_a_refused_publish_keeps_nothing)
{
	static struct side sd;
	struct core *c = mk(&sd, 4, 0, 8);
	uint32_t t[8];
	uint64_t s;

	fill_tokens(t, 8, 100);
	sd.store_ret = -EIO;
	s = open_seq(c, t, 8, CORE_OPEN_PROBED);
	ck_assert_int_eq(core_seq_commit(c, s, 8), 0);
	assert_verified(c);
	ck_assert_uint_eq(tstats(c, sd.probe).published, 2);
	ck_assert_uint_eq(tstats(c, sd.probe).store_errors, 2);
	ck_assert_uint_eq(core_tier_storing(c), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	ck_assert_uint_eq(usage(c).cached, 2);
	assert_verified(c);
	done(c, &sd);
}
END_TEST

/* A probed sequence dropped while parked probes again when resumed with deferred loads. */
START_TEST(test_a_dropped_probed_sequence_probes_on_resume)
{
	static struct side sa, sb;
	struct core *a = mk(&sa, 8, 0, 8), *b = mk(&sb, 4, 0, 8);
	uint32_t t[13], q[16], recompute;
	struct core_stats st;
	uint64_t s, o;

	fill_tokens(t, 13, 100);
	fill_tokens(q, 16, 200);
	publish_prompt(a, &sa, t, 12);
	s = open_seq(b, t, 13, CORE_OPEN_PROBED); /* synchronous: nothing probed */
	ck_assert_uint_eq(info(b, s).ncommitted, 0);
	ck_assert_int_eq(core_seq_park(b, s), 0);
	o = open_seq(b, q, 16, 0);
	core_get_stats(b, &st);
	ck_assert_uint_eq(st.preemptions, 1);
	ck_assert_uint_eq(info(b, s).state, CORE_SEQ_DROPPED);
	ck_assert_int_eq(core_seq_close(b, o), 0);
	assert_verified(b);

	ck_assert_int_eq(core_seq_resume_flags(b, s, CORE_OPEN_DEFER_LOADS, &recompute), 0);
	assert_verified(b);
	ck_assert_uint_eq(info(b, s).state, CORE_SEQ_LOADING);
	ck_assert_uint_eq(serve(b, &sb, s, NULL, 0), 3);
	ck_assert_uint_eq(info(b, s).ncommitted, 12);
	assert_kv(&sb, b, s, t[0], 12);
	ck_assert_uint_eq(tstats(b, sb.probe).promotions, 3);
	ck_assert_int_eq(core_seq_close(b, s), 0);
	done(a, &sa);
	done(b, &sb);
}
END_TEST

/* The list's rules: a probed level ends it, and no flag but the CORE_TIER_* ones is known. */
START_TEST(test_a_probed_level_must_be_last)
{
	static struct side sd;
	struct core_config cfg = { .capacity_blocks = 4, .block_tokens = B, .max_sequences = 1,
				   .max_seq_tokens = 16, .copy_block = fake_copy,
				   .copy_ctx = &sd.mem };
	const struct core_tier_config host = { .slots = 2, .ops = &host_ops, .ctx = &sd };
	const struct core_tier_config probed = { .slots = 2, .ops = &probe_ops, .ctx = &sd,
						 .flags = CORE_TIER_PROBED };
	struct core_tier_stats st;
	struct core *c = NULL;

	cfg.ntiers = 2;
	cfg.tiers[0] = probed;
	cfg.tiers[1] = host;
	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
	cfg.tiers[1] = probed; /* two of them: the first is not last */
	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
	cfg.tiers[0] = host;
	cfg.tiers[1].flags = 1u << 7;
	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
	cfg.tiers[1].flags = CORE_TIER_PROBED | 1u << 7;
	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
	cfg.tiers[1] = probed;
	cfg.tiers[1].slots = 0; /* asks for nothing: not a level */
	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
	ck_assert_ptr_null(c);

	cfg.tiers[1] = probed;
	fake_mem_init(&sd.mem, 4, B);
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	assert_verified(c);
	ck_assert_int_eq(core_get_tier_stats(c, 2, &st), 0);
	ck_assert_uint_eq(st.used, 0);
	ck_assert(core_tier_promotes(c, 2));
	c = core_free(c);
	cfg.ntiers = 1;
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	ck_assert_int_eq(core_tier_stored(c, 1, 0), -EINVAL);
	c = core_free(c);
	cfg.tiers[0] = probed;
	ck_assert_int_eq(core_new(&cfg, &c), 0); /* alone, it is the last */
	assert_verified(c);
	c = core_free(c);
	free(sd.mem.slots);
}
END_TEST

/*
 * Blocks still kept at the end: a close leaves them held, core_drop_cache leaves them alone,
 * and core_free frees everything (ASan builds check for leaks).
 */
START_TEST(test_freeing_with_blocks_kept)
{
	static struct side sd;
	struct core *c = mk(&sd, 4, 0, 8);
	uint32_t t[12];
	uint64_t s, s2;

	fill_tokens(t, 12, 100);
	s = open_seq(c, t, 8, CORE_OPEN_PROBED);
	prefill(&sd, c, s, t, 0, 8);
	ck_assert_int_eq(core_seq_commit(c, s, 8), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	ck_assert_uint_eq(core_drop_cache(c), 0);
	assert_verified(c);
	ck_assert_uint_eq(core_tier_storing(c), 2);
	ck_assert_uint_eq(usage(c).indexed, 2);
	/* Another sequence still hits them, and holds them open at the end too. */
	s2 = open_seq(c, t, 12, CORE_OPEN_PROBED);
	ck_assert_uint_eq(info(c, s2).ncommitted, 8);
	prefill(&sd, c, s2, t, 8, 12);
	ck_assert_int_eq(core_seq_commit(c, s2, 12), 0);
	ck_assert_uint_eq(core_tier_storing(c), 3);
	done(c, &sd);
}
END_TEST

/* Opens, "prefills" and commits prompt t (flags: CORE_OPEN_PROBED or 0), then closes it. */
static void commit_closed(struct core *c, struct side *sd, const uint32_t *t, uint32_t n,
			  uint32_t flags)
{
	uint64_t s = open_seq(c, t, n, flags);

	prefill(sd, c, s, t, 0, n);
	ck_assert_int_eq(core_seq_commit(c, s, n), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	assert_verified(c);
}

/*
 * CORE_TIER_STORE_EVICTED with the pool as the last local level: nothing is offered at commit;
 * a probed sequence's block is offered, with its tokens and bytes, when its memory is reused
 * (once), and kept by nobody; an unprobed sequence's never; another core then probes it.
 */
START_TEST(test_store_evicted_from_the_pool)
{
	static struct side sa, sb;
	struct core *a, *b;
	uint32_t t[8], u[16];
	uint64_t s;

	mk_probe_ops = &evict_ops;
	mk_probe_flags = CORE_TIER_PROBED | CORE_TIER_STORE_EVICTED;
	a = mk(&sa, 4, 0, 4);
	mk_probe_ops = &probe_ops;
	mk_probe_flags = CORE_TIER_PROBED;
	b = mk(&sb, 8, 0, 8);

	fill_tokens(t, 8, 100);
	commit_closed(a, &sa, t, 8, CORE_OPEN_PROBED);
	ck_assert_uint_eq(sa.probe_stores, 0);
	ck_assert_uint_eq(tstats(a, sa.probe).published, 0);
	/* Reusing all four blocks pushes both cached ones out of the pool: offered. */
	fill_tokens(u, 16, 500);
	commit_closed(a, &sa, u, 16, 0);
	ck_assert_uint_eq(sa.evicted_pool, 2);
	ck_assert_uint_eq(tstats(a, sa.probe).published, 2);
	ck_assert_uint_eq(core_tier_storing(a), 0);
	ck_assert_uint_eq(remote.n, 2);
	/* u came from an unprobed sequence: pushed out, it is not offered. */
	commit_closed(a, &sa, t, 8, CORE_OPEN_PROBED);
	ck_assert_uint_eq(sa.evicted_pool, 2);
	ck_assert_uint_eq(remote.n, 2);

	s = open_seq(b, t, 8, CORE_OPEN_PROBED | CORE_OPEN_DEFER_LOADS);
	ck_assert_uint_eq(serve(b, &sb, s, NULL, 0), 2);
	ck_assert_uint_eq(info(b, s).ncommitted, 8);
	assert_kv(&sb, b, s, t[0], 8);
	ck_assert_int_eq(core_seq_close(b, s), 0);
	done(a, &sa);
	done(b, &sb);
}
END_TEST

/*
 * With a local level below the pool, a block goes there first (nothing offered) and is offered
 * when it leaves that level, from its storage; its mark comes back up with a promotion, so it
 * is offered again when it leaves once more.
 */
START_TEST(test_store_evicted_from_the_last_local_level)
{
	static struct side sd;
	struct core *c;
	uint32_t t[8], u[8], v[8];
	uint64_t s;

	mk_probe_ops = &evict_ops;
	mk_probe_flags = CORE_TIER_PROBED | CORE_TIER_STORE_EVICTED;
	c = mk(&sd, 2, 2, 4);
	mk_probe_ops = &probe_ops;
	mk_probe_flags = CORE_TIER_PROBED;

	fill_tokens(t, 8, 100);
	fill_tokens(u, 8, 300);
	fill_tokens(v, 8, 700);
	commit_closed(c, &sd, t, 8, CORE_OPEN_PROBED);
	commit_closed(c, &sd, u, 8, 0); /* t's two blocks into the local level */
	ck_assert_uint_eq(sd.host_stores, 2);
	ck_assert_uint_eq(sd.probe_stores, 0);
	commit_closed(c, &sd, v, 8, 0); /* u's into it: t's leave it */
	ck_assert_uint_eq(sd.evicted_host, 2);
	ck_assert_uint_eq(sd.evicted_pool, 0);
	ck_assert_uint_eq(remote.n, 2);
	/* t again (recomputed): v down, u out (unprobed: not offered); then t down. */
	commit_closed(c, &sd, t, 8, CORE_OPEN_PROBED);
	commit_closed(c, &sd, u, 8, 0);
	ck_assert_uint_eq(sd.evicted_host, 2);

	/* Back up from the local level (promoted), then out of both again: offered again. */
	s = open_seq(c, t, 8, CORE_OPEN_PROBED);
	ck_assert_uint_eq(info(c, s).ncommitted, 8);
	ck_assert_uint_eq(tstats(c, 1).promotions, 2);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	commit_closed(c, &sd, v, 8, 0);
	commit_closed(c, &sd, u, 8, 0);
	ck_assert_uint_eq(sd.evicted_host, 4);
	done(c, &sd);
}
END_TEST

/*
 * Above a cold level (swap files, which cannot be read back to publish): a block is offered as
 * it leaves the pool, from the pool, and goes on into the cold level too; leaving the cold
 * level it is not offered again.  The cold level still serves it locally.
 */
START_TEST(test_store_evicted_above_a_cold_level)
{
	static struct side sd;
	struct core *c;
	uint32_t t[8], u[8], v[8], w[8];
	uint64_t s;

	mk_probe_ops = &evict_ops;
	mk_probe_flags = CORE_TIER_PROBED | CORE_TIER_STORE_EVICTED;
	mk_host_flags = CORE_TIER_COLD;
	c = mk(&sd, 2, 4, 4);
	mk_probe_ops = &probe_ops;
	mk_probe_flags = CORE_TIER_PROBED;
	mk_host_flags = 0;

	fill_tokens(t, 8, 100);
	fill_tokens(u, 8, 300);
	fill_tokens(v, 8, 700);
	fill_tokens(w, 8, 900);
	commit_closed(c, &sd, t, 8, CORE_OPEN_PROBED);
	ck_assert_uint_eq(sd.probe_stores, 0);
	commit_closed(c, &sd, u, 8, 0); /* t's two blocks out of the pool: offered, and down */
	ck_assert_uint_eq(sd.evicted_pool, 2);
	ck_assert_uint_eq(sd.host_stores, 2);
	ck_assert_uint_eq(remote.n, 2);
	/* A local hit from the cold level (promoted), the same bytes; then out again: again. */
	s = open_seq(c, t, 8, CORE_OPEN_PROBED);
	ck_assert_uint_eq(info(c, s).ncommitted, 8);
	ck_assert_uint_eq(tstats(c, 1).promotions, 2);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	commit_closed(c, &sd, u, 8, 0);
	ck_assert_uint_eq(sd.evicted_pool, 4);
	/* Out of the cold level (v and w push t's past its four slots): not offered. */
	commit_closed(c, &sd, v, 8, 0);
	commit_closed(c, &sd, w, 8, 0);
	commit_closed(c, &sd, u, 8, 0);
	ck_assert_uint_eq(sd.evicted_host, 0);
	ck_assert_uint_eq(sd.evicted_pool, 4);
	ck_assert_uint_eq(remote.n, 2);
	done(c, &sd);
}
END_TEST

/* Cold levels: local ones, after every warm one. */
START_TEST(test_cold_levels_come_last)
{
	static struct side sd;
	struct core_config cfg = {
		.capacity_blocks = 4, .block_tokens = B, .max_sequences = 2, .max_seq_tokens = 16,
		.copy_block = fake_copy, .copy_ctx = &sd.mem,
	};
	struct core *c = NULL;

	cfg.tiers[0] = (struct core_tier_config){ .slots = 2, .ops = &host_ops, .ctx = &sd,
						  .flags = CORE_TIER_COLD };
	cfg.tiers[1] = (struct core_tier_config){ .slots = 2, .ops = &host_ops, .ctx = &sd };
	cfg.ntiers = 2;
	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
	cfg.tiers[1] = (struct core_tier_config){ .slots = 2, .ops = &probe_ops, .ctx = &sd,
						  .flags = CORE_TIER_PROBED | CORE_TIER_COLD };
	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
	cfg.tiers[1].flags = CORE_TIER_PROBED | CORE_TIER_STORE_EVICTED;
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	core_free(c);
}
END_TEST

/*
 * The observer hears of every block that becomes findable and stops being, at each level:
 * commits, demotions (the level below first, with the tokens from the pool), a level's
 * evictions, promotions, drop_cache; what it builds from the events alone is what the core
 * holds, and the tokens it is given hash to the block's hash.
 */
START_TEST(test_the_observer_hears_every_level)
{
	static struct side sd;
	static struct seen w;
	struct core *c;
	uint32_t t[8], u[8], v[8];
	struct core_usage use;
	uint64_t s;

	memset(&w, 0, sizeof(w));
	mk_seen = &w;
	c = mk(&sd, 2, 2, 4);
	mk_seen = NULL;
	w.c = c;
	fill_tokens(t, 8, 100);
	fill_tokens(u, 8, 300);
	fill_tokens(v, 8, 700);
	commit_closed(c, &sd, t, 8, 0);
	ck_assert_uint_eq(w.stored[0], 2);
	ck_assert_uint_eq(w.nat[0], 2);
	commit_closed(c, &sd, u, 8, 0); /* t down to the local level */
	ck_assert_uint_eq(w.stored[1], 2);
	ck_assert_uint_eq(w.removed[0], 2);
	ck_assert_uint_eq(w.nat[0], 2);
	ck_assert_uint_eq(w.nat[1], 2);
	commit_closed(c, &sd, v, 8, 0); /* u down, t out of the local level */
	ck_assert_uint_eq(w.removed[1], 2);
	ck_assert_uint_eq(w.nat[1], 2);
	/* u back up (promoted): in the pool again; v down. */
	s = open_seq(c, u, 8, 0);
	ck_assert_uint_eq(info(c, s).ncommitted, 8);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	core_get_usage(c, &use);
	ck_assert_uint_eq(w.nat[0], use.indexed);
	ck_assert_uint_eq(w.nat[1], tstats(c, 1).used);
	ck_assert_uint_eq(w.tokens_checked, w.stored[0] + w.stored[1]);
	/* Everything dropped: every level told, nothing left. */
	core_drop_cache(c);
	ck_assert_uint_eq(w.nat[0], 0);
	ck_assert_uint_eq(w.nat[1], 0);
	done(c, &sd);
}
END_TEST

/* STORE_EVICTED needs PROBED. */
START_TEST(test_store_evicted_needs_a_probed_level)
{
	static struct side sd;
	struct core_config cfg = {
		.capacity_blocks = 4, .block_tokens = B, .max_sequences = 2, .max_seq_tokens = 16,
		.copy_block = fake_copy, .copy_ctx = &sd.mem,
	};
	struct core *c = NULL;

	cfg.tiers[cfg.ntiers++] = (struct core_tier_config){
		.slots = 2, .ops = &host_ops, .ctx = &sd, .flags = CORE_TIER_STORE_EVICTED };
	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
}
END_TEST

/* Each test starts with an empty remote, forked or not (CK_FORK=no, as under a debugger). */
static void remote_empty(void)
{
	memset(&remote, 0, sizeof(remote));
}

int main(void)
{
	Suite *s = suite_create("core-probe");
	TCase *tc = tcase_create("probe");

	tcase_add_checked_fixture(tc, remote_empty, NULL);

	tcase_add_test(tc, test_one_core_publishes_another_probes);
	tcase_add_test(tc, test_a_kept_block_is_not_reused);
	tcase_add_test(tc, test_stores_finish_in_any_order);
	tcase_add_test(tc, test_a_miss_in_the_middle);
	tcase_add_test(tc, test_a_damaged_block_is_a_load_error);
	tcase_add_test(tc, test_the_probe_asks_for_slots_blocks_at_most);
	tcase_add_test(tc, test_local_levels_come_first);
	tcase_add_test(tc, test_nothing_is_demoted_into_the_probe);
	tcase_add_test(tc, test_only_deferred_probed_sequences_probe_and_publish);
	tcase_add_test(tc, test_a_fork_publishes_as_its_parent);
	tcase_add_test(tc, test_a_refused_publish_keeps_nothing);
	tcase_add_test(tc, test_a_dropped_probed_sequence_probes_on_resume);
	tcase_add_test(tc, test_a_probed_level_must_be_last);
	tcase_add_test(tc, test_freeing_with_blocks_kept);
	tcase_add_test(tc, test_store_evicted_from_the_pool);
	tcase_add_test(tc, test_store_evicted_from_the_last_local_level);
	tcase_add_test(tc, test_store_evicted_needs_a_probed_level);
	tcase_add_test(tc, test_store_evicted_above_a_cold_level);
	tcase_add_test(tc, test_cold_levels_come_last);
	tcase_add_test(tc, test_the_observer_hears_every_level);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

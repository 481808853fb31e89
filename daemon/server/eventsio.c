/* SPDX-License-Identifier: MIT */
/*
 * A pool's event stream (docs/events.md): the core's observer turned into vLLM's events.  Each
 * block that becomes findable at a level is a BlockStored of that level's medium (the pool: GPU
 * on a device, CPU in host memory; the host tier: CPU; the swap files: STORAGE), each that
 * stops being one a BlockRemoved, and a drop of everything an AllBlocksCleared.  Only blocks of
 * the namespaces events_namespaces lists are announced: token ids show prompts.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "daemon/log.h"
#include "daemon/server/events.h"
#include "daemon/server/pool-internal.h"
#include "daemon/server/server.h"

static bool routed(const struct dpool *p, uint64_t salt)
{
	for (size_t i = 0; i < p->n_events_salts; i++)
		if (p->events_salts[i] == salt)
			return true;
	return false;
}

static enum events_medium medium_of(const struct dpool *p, uint32_t level)
{
	if (level == CORE_TIER_POOL)
		return p->mem.base ? EVENTS_CPU : EVENTS_GPU;
	return level == p->host_level ? EVENTS_CPU : EVENTS_STORAGE;
}

/*
 * What the subscribers were told (docs/events.md, levels and media): for each block announced
 * and not removed, the levels that hold it (a bit per level: the pool, the tiers, the remote
 * tier) and, if this node's store put it in the remote tier, its stamp in the remote ring.  A
 * BlockStored goes out when the first level of a medium takes the block, a BlockRemoved when
 * the last one lets it go: so the pool and the host tier (both CPU in host memory), or the
 * swap files and the remote tier (both STORAGE), never announce one block twice or remove it
 * while it is still there, and a level that lets go of a block it was never counted for (its
 * store dropped, or made before its namespace was routed) takes nothing from the others.
 * Open addressing keyed by the announced hash, linear probing, deletion by backward shift; a
 * slot with no level is free.
 */
struct known_block {
	uint64_t hash;
	uint32_t remote; /* its stamp in the ring, 0: none; set iff the remote level's bit is */
	uint8_t levels;	 /* bit L: level L holds it */
};

/* A block this node stored in the remote tier, in the order they were stored. */
struct remote_seen {
	uint64_t hash, at_ns;
	uint32_t stamp;
};

struct events_known {
	struct known_block *t;
	size_t size, used; /* size: 0 or a power of two */
	unsigned shift;
	uint64_t mul;	       /* odd: a block's home is (hash * mul) >> shift */
	uint8_t media[EVENTS_NMEDIA]; /* each medium's levels, as bits */
	/*
	 * The table could not take a block (out of memory): since then a level that lets go of
	 * a block the table does not know is announced anyway, as before the table.
	 */
	bool lossy;
	struct remote_seen *ring;
	uint32_t cap, head, len, stamp;
	uint32_t remote_live; /* entries with a stamp: the remote tier's blocks announced */
};

static size_t known_home(const struct events_known *k, uint64_t hash)
{
	return (size_t)((hash * k->mul) >> k->shift);
}

static struct events_known *known_of(struct dpool *p)
{
	struct events_known *k = p->events_known;

	if (k)
		return k;
	k = calloc(1, sizeof(*k));
	if (!k)
		return NULL;
	/* The hashes are a tenant's to choose; a home they cannot aim at. */
	k->mul = (XXH3_64bits(&k, sizeof(k)) ^ server_now_ns()) | 1;
	for (uint32_t l = 0; l <= p->ntiers && l < 8; l++)
		k->media[medium_of(p, l)] |= (uint8_t)(1u << l);
	p->events_known = k;
	return k;
}

static struct known_block *known_find(const struct events_known *k, uint64_t hash, size_t *at)
{
	if (!k || !k->size)
		return NULL;
	for (size_t i = known_home(k, hash);; i = (i + 1) & (k->size - 1)) {
		if (!k->t[i].levels)
			return NULL;
		if (k->t[i].hash == hash) {
			*at = i;
			return &k->t[i];
		}
	}
}

static bool known_grow(struct events_known *k)
{
	const size_t size = k->size ? 2 * k->size : 1024;
	struct known_block *t = calloc(size, sizeof(*t)), *old = k->t;
	const size_t oldsize = k->size;

	if (!t)
		return false;
	k->t = t;
	k->size = size;
	k->shift = 64 - (unsigned)__builtin_ctzll(size);
	for (size_t i = 0; i < oldsize; i++) {
		size_t j;

		if (!old[i].levels)
			continue;
		for (j = known_home(k, old[i].hash); t[j].levels; j = (j + 1) & (size - 1))
			;
		t[j] = old[i];
	}
	free(old);
	return true;
}

/* The block's entry, a new one (no level) if it has none; NULL: out of memory. */
static struct known_block *known_get(struct dpool *p, uint64_t hash)
{
	struct events_known *k = known_of(p);
	struct known_block *b;
	size_t i;

	b = known_find(k, hash, &i);
	if (b)
		return b;
	if (!k || (2 * (k->used + 1) > k->size && !known_grow(k))) {
		if (k && !k->lossy)
			log_warning("pool %s: out of memory: the event stream may announce a block "
				    "twice at one medium, or remove it while a level holds it",
				    p->cfg->name);
		if (k)
			k->lossy = true;
		return NULL;
	}
	for (i = known_home(k, hash); k->t[i].levels; i = (i + 1) & (k->size - 1))
		;
	k->used++;
	k->t[i] = (struct known_block){ .hash = hash };
	return &k->t[i];
}

/* Frees entry i, moving back the entries after it that would not be found past the hole. */
static void known_del(struct events_known *k, size_t i)
{
	const size_t mask = k->size - 1;

	for (size_t j = (i + 1) & mask; k->t[j].levels; j = (j + 1) & mask) {
		const size_t h = known_home(k, k->t[j].hash);

		/* j stays when its home lies cyclically in (i, j]. */
		if (i < j ? h > i && h <= j : h > i || h <= j)
			continue;
		k->t[i] = k->t[j];
		i = j;
	}
	k->t[i] = (struct known_block){ 0 };
	k->used--;
}

/* Level l holds the block of entry b now (a new one for its medium: announced). */
static void known_take(struct dpool *p, struct known_block *b, uint32_t l, uint64_t hash,
		       uint64_t parent, bool has_parent, const uint32_t *tokens)
{
	const enum events_medium m = medium_of(p, l);
	const uint8_t had = b ? b->levels & p->events_known->media[m] : 0;

	if (b)
		b->levels |= (uint8_t)(1u << l);
	if (!had)
		events_add(p->events, EVENTS_STORED, m, hash, parent, has_parent, tokens);
}

/* Level l no longer holds the block of entry i (if it did). */
static void known_let_go(struct dpool *p, size_t i, uint32_t l)
{
	struct events_known *k = p->events_known;
	struct known_block *b = &k->t[i];
	const enum events_medium m = medium_of(p, l);

	if (!(b->levels & (1u << l)))
		return;
	b->levels &= (uint8_t)~(1u << l);
	if (!(b->levels & k->media[m]))
		events_add(p->events, EVENTS_REMOVED, m, b->hash, 0, false, NULL);
	if (!b->levels)
		known_del(k, i);
}

static void announce_stored(struct dpool *p, uint32_t l, uint64_t hash, uint64_t parent,
			    bool has_parent, const uint32_t *tokens)
{
	known_take(p, known_get(p, hash), l, hash, parent, has_parent, tokens);
}

static void announce_removed(struct dpool *p, uint32_t l, uint64_t hash)
{
	struct events_known *k = p->events_known;
	size_t i;

	if (known_find(k, hash, &i))
		known_let_go(p, i, l);
	else if (k && k->lossy)
		events_add(p->events, EVENTS_REMOVED, medium_of(p, l), hash, 0, false, NULL);
}

/* Everything forgotten: after an AllBlocksCleared, nothing is known to be anywhere. */
static void known_clear(struct dpool *p)
{
	struct events_known *k = p->events_known;

	if (!k)
		return;
	free(k->t);
	k->t = NULL;
	k->size = k->used = 0;
	k->head = k->len = k->remote_live = 0;
	k->lossy = false;
}

/* The block of entry i is gone from the remote tier as far as this node knows. */
static void remote_forget(struct dpool *p, size_t i)
{
	p->events_known->t[i].remote = 0;
	p->events_known->remote_live--;
	known_let_go(p, i, p->remote_level);
}

/* The oldest block this node stored in the remote tier is taken as gone from it. */
static void remote_pop(struct dpool *p)
{
	struct events_known *k = p->events_known;
	const struct remote_seen r = k->ring[k->head];
	struct known_block *b;
	size_t i;

	k->head = (k->head + 1) % k->cap;
	k->len--;
	b = known_find(k, r.hash, &i);
	if (b && b->remote == r.stamp) /* not stored again since, nor found gone */
		remote_forget(p, i);
}

/* remote_tier_ttl_ms: the blocks stored longer ago than that are gone from Redis. */
static void remote_expire(struct dpool *p, uint64_t now)
{
	const uint64_t ttl = (uint64_t)p->cfg->remote_tier_ttl_ms * 1000000;
	struct events_known *k = p->events_known;

	while (ttl && k && k->len && k->ring[k->head].at_ns + ttl <= now)
		remote_pop(p);
}

void dpool_events_remote_stored(struct dpool *p, uint64_t salt, uint64_t hash, uint64_t parent,
				bool has_parent, const uint32_t *tokens)
{
	const uint64_t now = server_now_ns();
	struct events_known *k;
	struct known_block *b;

	if (!p->events || !p->cfg->events_remote_blocks || !routed(p, salt) || !(k = known_of(p)))
		return;
	if (!k->ring) {
		k->ring = calloc(p->cfg->events_remote_blocks, sizeof(*k->ring));
		if (!k->ring) {
			log_warning("pool %s: out of memory: the remote tier's blocks are not "
				    "announced", p->cfg->name);
			return;
		}
		k->cap = p->cfg->events_remote_blocks;
	}
	remote_expire(p, now);
	/*
	 * events_remote_blocks: the oldest is forgotten, as gone.  (A block stored again leaves
	 * its older entry in the ring, stale: it takes room until it comes out, ignored.)
	 */
	if (k->len == k->cap)
		remote_pop(p);
	b = known_get(p, hash);
	if (!b)
		return; /* not announced: nothing could take it back */
	if (!++k->stamp)
		k->stamp = 1;
	k->ring[(k->head + k->len++) % k->cap] =
		(struct remote_seen){ .hash = hash, .at_ns = now, .stamp = k->stamp };
	k->remote_live += !b->remote;
	b->remote = k->stamp;
	known_take(p, b, p->remote_level, hash, parent, has_parent, tokens);
}

void dpool_events_remote_gone(struct dpool *p, uint64_t hash)
{
	size_t i;
	struct known_block *b = p->events ? known_find(p->events_known, hash, &i) : NULL;

	if (b && b->remote)
		remote_forget(p, i);
}

void dpool_events_tick(struct dpool *p)
{
	if (!p->events)
		return;
	remote_expire(p, server_now_ns());
	events_tick(p->events);
}

void dpool_events_stats(const struct dpool *p, struct events_stats *out)
{
	events_get_stats(p->events, out);
	out->remote_blocks = p->events_known ? p->events_known->remote_live : 0;
}

struct held_event {
	uint64_t hash, parent;
	bool has_parent, sent;
	uint8_t level;
};

/*
 * Room for one more held block: the arrays grow by doubling up to events_queue blocks (each
 * block_tokens token ids), so a scan that finds little holds little.  false: no room.
 */
static bool hold_room(struct dpool *p)
{
	const size_t bt = p->cfg->block_tokens, max = p->cfg->events_queue;
	size_t cap = p->events_held_cap ? 2 * p->events_held_cap : 64;
	struct held_event *h;
	uint32_t *t;

	if (p->n_events_held < p->events_held_cap)
		return true;
	if (p->events_held_cap == max)
		return false;
	if (cap > max)
		cap = max;
	h = realloc(p->events_held, cap * sizeof(*h));
	if (!h)
		return false;
	p->events_held = h;
	t = realloc(p->events_held_tokens, cap * bt * sizeof(*t));
	if (!t)
		return false;
	p->events_held_tokens = t;
	p->events_held_cap = cap;
	return true;
}

/* One block stored while holding: kept, tokens and all, up to events_queue of them. */
static void hold(struct dpool *p, uint32_t l, uint64_t hash, uint64_t parent,
		 bool has_parent, const uint32_t *tokens)
{
	const size_t bt = p->cfg->block_tokens;

	if (!hold_room(p)) {
		events_drop(p->events); /* as a queue this long would, or memory ran out */
		return;
	}
	p->events_held[p->n_events_held] = (struct held_event){
		.hash = hash, .parent = parent, .has_parent = has_parent, .level = (uint8_t)l
	};
	memcpy(p->events_held_tokens + p->n_events_held * bt, tokens, bt * sizeof(*tokens));
	p->n_events_held++;
}

void dpool_events_hold(struct dpool *p)
{
	if (p->events)
		p->events_holding = true;
}

struct by_hash {
	uint64_t hash;
	size_t at;
};

static int cmp_hash(const void *a, const void *b)
{
	const struct by_hash *x = a, *y = b;

	return x->hash < y->hash ? -1 : x->hash > y->hash;
}

/* The held block with this hash, or -1. */
static ptrdiff_t held_find(const struct by_hash *idx, size_t n, uint64_t hash)
{
	struct by_hash k = { .hash = hash };
	const struct by_hash *f = bsearch(&k, idx, n, sizeof(*idx), cmp_hash);

	return f ? (ptrdiff_t)f->at : -1;
}

/*
 * Sends what was held, each block after its parent: for each block, the chain of its held
 * ancestors not sent yet is walked up, then sent from the top down.
 */
void dpool_events_release(struct dpool *p)
{
	const size_t n = p->n_events_held, bt = p->cfg->block_tokens;
	struct held_event *h = p->events_held;
	struct by_hash *idx = n ? calloc(n, sizeof(*idx)) : NULL;
	size_t *chain = n ? calloc(n, sizeof(*chain)) : NULL;

	p->events_holding = false;
	if (!n)
		goto out; /* qsort and bsearch take no NULL array, even empty */
	if (!idx || !chain) {
		log_warning("pool %s: out of memory: the swap files' blocks are not announced",
			    p->cfg->name);
		for (size_t i = 0; i < n; i++)
			events_drop(p->events);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		idx[i] = (struct by_hash){ .hash = h[i].hash, .at = i };
	qsort(idx, n, sizeof(*idx), cmp_hash);
	for (size_t i = 0; i < n; i++) {
		size_t len = 0;

		for (ptrdiff_t at = (ptrdiff_t)i; at >= 0 && !h[at].sent && len < n;
		     at = h[at].has_parent ? held_find(idx, n, h[at].parent) : -1) {
			h[at].sent = true;
			chain[len++] = (size_t)at;
		}
		while (len--) {
			const struct held_event *e = &h[chain[len]];

			announce_stored(p, e->level, e->hash, e->parent, e->has_parent,
					p->events_held_tokens + chain[len] * bt);
		}
	}
out:
	free(idx);
	free(chain);
	free(p->events_held);
	free(p->events_held_tokens);
	p->events_held = NULL;
	p->events_held_tokens = NULL;
	p->n_events_held = p->events_held_cap = 0;
}

static void observe(void *ctx, const struct core_event *ev)
{
	struct dpool *p = ctx;
	const uint32_t *tokens = ev->tokens;
	struct tier_key stored;
	const bool has_parent = ev->parent.lo || ev->parent.hi;

	if (!p->events || !routed(p, ev->salt))
		return;
	if (ev->kind == CORE_EVENT_REMOVED) {
		announce_removed(p, ev->level, ev->hash.lo);
		return;
	}
	/* Demoted from the host tier: its slot, still intact, has the tokens. */
	if (!tokens && ev->from_level == p->host_level && p->host) {
		host_tier_key(p->host, ev->from_slot, &stored);
		tokens = stored.tokens;
	}
	if (!tokens)
		return; /* nowhere to read them: not announced (cannot happen with these levels) */
	if (p->events_holding) {
		hold(p, ev->level, ev->hash.lo, ev->parent.lo, has_parent, tokens);
		return;
	}
	announce_stored(p, ev->level, ev->hash.lo, ev->parent.lo, has_parent, tokens);
}

static void add_salt(struct dpool *p, uint64_t salt);

/*
 * The salts of the listed names that need no session to know (every name but a wildcard, and
 * on the remote tier only the shared ones: a user's or group's name comes from NSS at attach),
 * as client.c's assign_namespace computes them: so that the blocks found in the swap files at
 * start are announced before anyone attaches.
 */
static void route_listed(struct dpool *p)
{
	const struct kvpd_pool_config *c = p->cfg;

	for (const char *s = c->events_namespaces; s && *s;) {
		size_t n = strcspn(s, ","), lead = strspn(s, " \t"), end = n;
		char name[256], key[600];
		uint64_t salt;
		int len;

		while (end > lead && (s[end - 1] == ' ' || s[end - 1] == '\t'))
			end--;
		if (end - lead < sizeof(name) && (end - lead < 2 || memcmp(s + end - 2, "/*", 2))) {
			memcpy(name, s + lead, end - lead);
			name[end - lead] = '\0';
			len = snprintf(key, sizeof(key), "%s%c%s", c->name, 0, name);
			if (len > 0 && (size_t)len < sizeof(key))
				add_salt(p, XXH3_64bits_withSeed(key, (size_t)len, c->namespace_seed));
			if (p->remote && c->namespace_mode == KVPD_NS_SHARED &&
			    !strncmp(name, "shared", 6) && (!name[6] || name[6] == '/') &&
			    snprintf(key, sizeof(key), "pool:%s/%s", c->name, name) <
				    (int)sizeof(key) &&
			    dpool_remote_salt(p, key, &salt) == 0)
				add_salt(p, salt);
		}
		s += n;
		if (*s == ',')
			s++;
	}
}

/* events_sched's value (the configuration checked it; unset is the default, idle). */
static enum events_sched events_sched_of(const char *v)
{
	return v && !strcmp(v, "normal") ? EVENTS_SCHED_NORMAL : EVENTS_SCHED_IDLE;
}

int dpool_events_open(struct dpool *p, struct core_config *cc)
{
	const struct kvpd_pool_config *c = p->cfg;
	struct events_config ec = {
		.endpoint = c->events_endpoint,
		.replay_endpoint = c->events_replay_endpoint,
		.topic = c->events_topic,
		.array = c->events_format && !strcmp(c->events_format, "array"),
		.sched = events_sched_of(c->events_sched),
		.block_tokens = c->block_tokens,
		.batch_ms = c->events_batch_ms,
		.buffer_batches = c->events_buffer_batches,
		.queue = c->events_queue,
		.hwm = c->events_hwm,
	};
	char err[512] = "";
	int r;

	uint8_t (*allowed)[EVENTS_CURVE_KEY_BYTES] = NULL;
	char pub[EVENTS_CURVE_Z85_LEN + 1] = "";

	if (!c->events_endpoint)
		return 0;
	/* Loaded again: the configuration checked them, but files change. */
	if (c->events_curve_secret_key_file) {
		ec.curve = true;
		r = events_curve_secret_load(c->events_curve_secret_key_file, ec.curve_secret, err,
					     sizeof(err));
		if (r >= 0)
			r = events_curve_allowed_load(c->events_curve_allowed_keys_file, &allowed,
						      &ec.curve_nallowed, err, sizeof(err));
		if (r >= 0)
			r = events_curve_public(ec.curve_secret, pub);
		if (r < 0) {
			explicit_bzero(ec.curve_secret, sizeof(ec.curve_secret));
			return log_error_errno(r, "pool %s: the event stream's CURVE keys: %s",
					       c->name, err);
		}
		ec.curve_allowed = (const uint8_t (*)[EVENTS_CURVE_KEY_BYTES])allowed;
	}
	r = events_new(&ec, err, sizeof(err), &p->events);
	explicit_bzero(ec.curve_secret, sizeof(ec.curve_secret));
	free(allowed);
	if (r < 0)
		return log_error_errno(r, "pool %s: the event stream: %s", c->name, err);
	memcpy(p->events_curve_public, pub, sizeof(pub));
	cc->observe = observe;
	cc->observe_ctx = p;
	route_listed(p);
	log_info("pool %s: KV events on %s%s%s (%s), namespaces: %s", c->name, c->events_endpoint,
		 c->events_replay_endpoint ? ", replay on " : "",
		 c->events_replay_endpoint ? c->events_replay_endpoint : "", ec.array ? "array" : "map",
		 c->events_namespaces ? c->events_namespaces : "none");
	if (ec.curve)
		log_info("pool %s: KV events by CURVE only, server key %s, %zu subscriber keys "
			 "allowed", c->name, pub, ec.curve_nallowed);
	return 0;
}

void dpool_events_close(struct dpool *p)
{
	p->events = events_free(p->events);
	if (p->events_known) {
		free(p->events_known->t);
		free(p->events_known->ring);
		free(p->events_known);
		p->events_known = NULL;
	}
	free(p->events_salts);
	p->events_salts = NULL;
	p->n_events_salts = 0;
}

/*
 * Whether name is one of the comma-separated list's (spaces around each ignored); an
 * entry that ends in a slash and a star is the name before them and every narrowing of it.
 */
static bool listed(const char *list, const char *name)
{
	size_t want = strlen(name);

	for (const char *s = list; s && *s;) {
		size_t n = strcspn(s, ","), lead = strspn(s, " \t"), end = n, len;

		while (end > lead && (s[end - 1] == ' ' || s[end - 1] == '\t'))
			end--;
		len = end - lead;
		if (len == want && !memcmp(s + lead, name, want))
			return true;
		if (len >= 2 && !memcmp(s + lead + len - 2, "/*", 2) &&
		    !memcmp(s + lead, name, len - 2 < want ? len - 2 : want) &&
		    (want == len - 2 || (want > len - 2 && name[len - 2] == '/')))
			return true;
		s += n;
		if (*s == ',')
			s++;
	}
	return false;
}

static void add_salt(struct dpool *p, uint64_t salt)
{
	uint64_t *grown;

	if (routed(p, salt))
		return;
	grown = realloc(p->events_salts, (p->n_events_salts + 1) * sizeof(*grown));
	if (!grown) {
		log_warning("pool %s: out of memory: a namespace's blocks are not announced",
			    p->cfg->name);
		return;
	}
	p->events_salts = grown;
	p->events_salts[p->n_events_salts++] = salt;
}

void dpool_events_route(struct dpool *p, const char *name, uint64_t salt)
{
	if (p->events && listed(p->cfg->events_namespaces, name))
		add_salt(p, salt);
}

void dpool_events_dropped(struct dpool *p)
{
	struct core_usage use;

	if (!p->events)
		return;
	core_get_usage(p->core, &use);
	if (use.indexed)
		return;
	for (uint32_t t = 1; t <= p->ntiers; t++) {
		struct core_tier_stats ts;

		if (t == p->remote_level)
			continue;
		core_get_tier_stats(p->core, t, &ts);
		if (ts.used)
			return;
	}
	/* The remote tier's blocks too: a router forgets them, and so do we. */
	known_clear(p);
	events_add(p->events, EVENTS_CLEARED, EVENTS_CPU, 0, 0, false, NULL);
}

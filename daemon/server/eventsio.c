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

struct held_event {
	uint64_t hash, parent;
	bool has_parent, sent;
	uint8_t medium;
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
static void hold(struct dpool *p, enum events_medium m, uint64_t hash, uint64_t parent,
		 bool has_parent, const uint32_t *tokens)
{
	const size_t bt = p->cfg->block_tokens;

	if (!hold_room(p)) {
		events_drop(p->events); /* as a queue this long would, or memory ran out */
		return;
	}
	p->events_held[p->n_events_held] = (struct held_event){
		.hash = hash, .parent = parent, .has_parent = has_parent, .medium = (uint8_t)m
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

			events_add(p->events, EVENTS_STORED, (enum events_medium)e->medium, e->hash,
				   e->parent, e->has_parent, p->events_held_tokens + chain[len] * bt);
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
		events_add(p->events, EVENTS_REMOVED, medium_of(p, ev->level), ev->hash.lo, 0,
			   false, NULL);
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
		hold(p, medium_of(p, ev->level), ev->hash.lo, ev->parent.lo, has_parent, tokens);
		return;
	}
	events_add(p->events, EVENTS_STORED, medium_of(p, ev->level), ev->hash.lo,
		   ev->parent.lo, has_parent, tokens);
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
	events_add(p->events, EVENTS_CLEARED, EVENTS_CPU, 0, 0, false, NULL);
}

void dpool_events_tick(struct dpool *p)
{
	if (p->events)
		events_tick(p->events);
}

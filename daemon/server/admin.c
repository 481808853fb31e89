/* SPDX-License-Identifier: MIT */
/*
 * The admin socket: status, pools, sessions, sequences, statistics, Prometheus metrics, the
 * full invariant check and cache drops.  Only root and members of admin_group get answers.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/server/events.h"
#include "daemon/server/server.h"

bool admin_peer_allowed(const struct server *srv, int fd, const struct ucred *cred)
{
	const struct kvpd_config *cfg = srv->cfg;
	gid_t groups[256];
	socklen_t len = sizeof(groups);

	if (cred->uid == 0 || cred->uid == geteuid())
		return true;
	if (!cfg->has_admin_gid)
		return false;
	if (cred->gid == cfg->admin_gid)
		return true;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
		for (size_t i = 0; i < len / sizeof(gid_t); i++)
			if (groups[i] == cfg->admin_gid)
				return true;
	return false;
}

/* The pools a request names: all of them for an empty name. */
static bool pool_selected(const struct dpool *p, const char *name)
{
	return !name || !*name || !strcmp(name, p->cfg->name);
}

struct text {
	char *buf;
	size_t len, cap;
	bool failed;
};

__attribute__((format(printf, 2, 3))) static void text_printf(struct text *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->failed = true;
			return;
		}
		if (t->buf && t->len + (size_t)n < t->cap) {
			t->len += (size_t)n;
			return;
		}
		size_t cap = t->cap ? t->cap * 2 : 4096;
		while (cap < t->len + (size_t)n + 1)
			cap *= 2;
		char *b = realloc(t->buf, cap);
		if (!b) {
			t->failed = true;
			return;
		}
		t->buf = b;
		t->cap = cap;
	}
}

/* A Prometheus label value, written as the text format says. */
const char *admin_label_value(const char *s, char *out, size_t n)
{
	size_t j = 0;

	/* The text format's three escapes; a raw newline would end the sample's line. */
	for (; *s && j + 3 < n; s++) {
		if (*s == '\\' || *s == '"' || *s == '\n')
			out[j++] = '\\';
		out[j++] = *s == '\n' ? 'n' : *s;
	}
	out[j] = '\0';
	return out;
}

/* Short for the sample lines below. */
static const char *label(const char *s, char *out, size_t n)
{
	return admin_label_value(s, out, n);
}

/*
 * The remote tier's reasons as label values and JSON keys: one word each, stable (the tier's
 * own names, remote_status_name and seal_reason_name, are for log lines).
 */
static const char *const remote_miss_keys[REMOTE_NSTATUS] = {
	[REMOTE_ABSENT] = "absent", [REMOTE_LATE] = "late",   [REMOTE_VERIFY] = "verify",
	[REMOTE_DOWN] = "down",	    [REMOTE_BUSY] = "busy",   [REMOTE_ERROR] = "error",
	[REMOTE_CANCELLED] = "cancelled",
};
static const char *const remote_verify_keys[SEAL_NREASONS] = {
	[SEAL_TRUNCATED] = "truncated",	    [SEAL_BAD_MAGIC] = "bad_magic",
	[SEAL_BAD_VERSION] = "bad_version", [SEAL_UNKNOWN_KEY] = "unknown_key",
	[SEAL_GEOMETRY] = "geometry",	    [SEAL_TAG] = "tag",
	[SEAL_IDENTITY] = "identity",	    [SEAL_TOKENS] = "tokens",
};
/* A status or a reason added to the tier needs its key above. */
_Static_assert(REMOTE_NSTATUS == 9 && SEAL_NREASONS == 9, "remote tier keys out of date");

bool admin_eviction_fill(struct dpool *p, struct admin_eviction *ret)
{
	struct core_value_stats *vs = &ret->stats;

	if (core_get_value_stats(p->core, vs) < 0)
		return false;
	kvpaged__v1__eviction_policy__init(&ret->policy);
	ret->policy.policy = (char *)"value";
	ret->policy.horizon_s = vs->horizon;
	ret->policy.records = vs->records;
	ret->policy.extensions = vs->extensions;
	ret->policy.shares = vs->shares;
	ret->policy.decisions = vs->decisions;
	ret->policy.passed_over = vs->passed_over;
	ret->policy.lru_fallbacks = vs->lru_fallbacks;
	ret->policy.parent_first = vs->parent_first;
	for (uint32_t c = 0; c < vs->nclasses && c < CORE_VALUE_CLASSES; c++) {
		Kvpaged__V1__EvictionClass *e = &ret->classes[c];

		kvpaged__v1__eviction_class__init(e);
		e->name = vs->cls[c].name;
		e->cached_blocks = vs->cls[c].cached;
		e->samples = vs->cls[c].samples;
		e->reuses = vs->cls[c].events;
		e->p_reuse = vs->cls[c].p_reuse;
		e->median_reuse_s = vs->cls[c].median_reuse;
		e->density = vs->cls[c].density0;
		ret->classp[c] = e;
	}
	ret->policy.n_classes = vs->nclasses < CORE_VALUE_CLASSES ? vs->nclasses : CORE_VALUE_CLASSES;
	ret->policy.classes = ret->classp;
	return true;
}

bool admin_remote_fill(struct dpool *p, struct admin_remote *ret)
{
	Kvpaged__V1__RemoteTier *x = &ret->tier;
	struct remote_stats *st = &ret->stats;
	struct core_tier_stats ts = { 0 };

	if (!p->remote)
		return false;
	remote_get_stats(p->remote, st);
	(void)core_get_tier_stats(p->core, p->remote_level, &ts);
	kvpaged__v1__remote_tier__init(x);
	for (size_t i = 0; i < st->nnodes && i < REMOTE_MAX_NODES; i++) {
		Kvpaged__V1__RemoteNode *n = &ret->nodes[i];
		const struct redis_node_info *ni = &st->nodes[i];

		kvpaged__v1__remote_node__init(n);
		n->addr = (char *)ni->addr;
		n->state = (char *)redis_node_state_name(ni->state);
		n->slots = ni->slots;
		n->commands = ni->commands;
		n->errors = ni->errors;
		n->bytes_in = ni->bytes_in;
		n->bytes_out = ni->bytes_out;
		n->connects = ni->connects;
		n->failures = ni->failures;
		ret->nodep[x->n_nodes++] = n;
	}
	x->nodes = ret->nodep;
	x->bandwidth = p->remote_bandwidth;
	x->promotes = core_tier_promotes(p->core, p->remote_level);
	x->inflight = st->inflight;
	x->local_sessions = p->remote_unlocal;
	x->fetches = st->fetches;
	x->fetches_busy = st->fetches_busy;
	x->hits = st->hits;
	for (int r = 0; r < REMOTE_NSTATUS; r++) {
		Kvpaged__V1__RemoteCount *c = &ret->misses[x->n_misses];

		if (!remote_miss_keys[r])
			continue;
		kvpaged__v1__remote_count__init(c);
		c->reason = (char *)remote_miss_keys[r];
		c->count = st->misses[r];
		ret->missp[x->n_misses++] = c;
	}
	x->misses = ret->missp;
	for (int r = 0; r < SEAL_NREASONS; r++) {
		Kvpaged__V1__RemoteCount *c = &ret->verify[x->n_verify_failures];

		if (!remote_verify_keys[r])
			continue;
		kvpaged__v1__remote_count__init(c);
		c->reason = (char *)remote_verify_keys[r];
		c->count = st->verify[r];
		ret->verifyp[x->n_verify_failures++] = c;
	}
	x->verify_failures = ret->verifyp;
	x->stores_ok = st->stores_ok;
	x->stores_dropped = st->stores_dropped;
	x->stores_failed = st->stores_failed;
	x->bytes_in = st->bytes_in;
	x->bytes_out = st->bytes_out;
	x->latency_p50_ns = st->latency_p50_ns;
	x->latency_p99_ns = st->latency_p99_ns;
	x->probes = ts.probes;
	x->published = ts.published;
	return true;
}

/* The remote tiers' metrics, when a pool has one: nothing at all otherwise. */
static void remote_metrics_text(struct server *srv, struct text *t)
{
	static const struct {
		const char *name, *type, *help;
		size_t off;
	} per_pool[] = {
		{ "fetches_total", "counter", "Fetch jobs sent to the remote tier.",
		  offsetof(Kvpaged__V1__RemoteTier, fetches) },
		{ "fetches_busy_total", "counter",
		  "Fetch jobs refused at once: the remote tier's queue was full.",
		  offsetof(Kvpaged__V1__RemoteTier, fetches_busy) },
		{ "hits_total", "counter",
		  "Blocks fetched from the remote tier, verified and opened.", offsetof(Kvpaged__V1__RemoteTier, hits) },
		{ "bytes_in_total", "counter", "Sealed values fetched from the remote tier.",
		  offsetof(Kvpaged__V1__RemoteTier, bytes_in) },
		{ "bytes_out_total", "counter", "Sealed values stored to the remote tier.",
		  offsetof(Kvpaged__V1__RemoteTier, bytes_out) },
		{ "probes_total", "counter", "Blocks lookups asked the remote tier for.",
		  offsetof(Kvpaged__V1__RemoteTier, probes) },
		{ "published_total", "counter", "Committed blocks offered to the remote tier.",
		  offsetof(Kvpaged__V1__RemoteTier, published) },
		{ "local_sessions_total", "counter",
		  "Sessions whose namespace has no name: kept on this node, not in the remote tier.",
		  offsetof(Kvpaged__V1__RemoteTier, local_sessions) },
	};
	struct admin_remote *ar;
	char pl[160], nl[160];
	bool any = false;

	for (size_t i = 0; i < srv->npools; i++)
		any |= srv->pools[i].remote != NULL;
	if (!any)
		return;
	ar = calloc(srv->npools, sizeof(*ar));
	if (!ar) {
		t->failed = true;
		return;
	}
	for (size_t i = 0; i < srv->npools; i++)
		(void)admin_remote_fill(&srv->pools[i], &ar[i]);
	/* Each pool with a remote tier, x its numbers. */
#define FOR_REMOTE(i, x)                                                                   \
	for (size_t i = 0; i < srv->npools; i++)                                           \
		for (const Kvpaged__V1__RemoteTier *x = srv->pools[i].remote ? &ar[i].tier : NULL; \
		     x; x = NULL)
	text_printf(t, "# HELP kvpaged_remote_node_state Each remote tier node's state: 1 for "
		       "the one it is in.\n# TYPE kvpaged_remote_node_state gauge\n");
	FOR_REMOTE(i, x)
		for (size_t n = 0; n < x->n_nodes; n++)
			for (int state = REDIS_NODE_DOWN; state <= REDIS_NODE_IDLE; state++) {
				const char *name = redis_node_state_name(state);

				text_printf(t, "kvpaged_remote_node_state{pool=\"%s\",node=\"%s\","
					       "state=\"%s\"} %d\n",
					    label(srv->pools[i].cfg->name, pl, sizeof(pl)),
					    label(x->nodes[n]->addr, nl, sizeof(nl)), name,
					    !strcmp(x->nodes[n]->state, name));
			}
	text_printf(t, "# HELP kvpaged_remote_node_errors_total Failed commands, per remote tier "
		       "node.\n# TYPE kvpaged_remote_node_errors_total counter\n");
	FOR_REMOTE(i, x)
		for (size_t n = 0; n < x->n_nodes; n++)
			text_printf(t, "kvpaged_remote_node_errors_total{pool=\"%s\",node=\"%s\"} "
				       "%llu\n", label(srv->pools[i].cfg->name, pl, sizeof(pl)),
				    label(x->nodes[n]->addr, nl, sizeof(nl)),
				    (unsigned long long)x->nodes[n]->errors);
	text_printf(t, "# HELP kvpaged_remote_node_failures_total Connections that failed or "
		       "broke, per remote tier node.\n"
		       "# TYPE kvpaged_remote_node_failures_total counter\n");
	FOR_REMOTE(i, x)
		for (size_t n = 0; n < x->n_nodes; n++)
			text_printf(t, "kvpaged_remote_node_failures_total{pool=\"%s\",node=\"%s\"} "
				       "%llu\n", label(srv->pools[i].cfg->name, pl, sizeof(pl)),
				    label(x->nodes[n]->addr, nl, sizeof(nl)),
				    (unsigned long long)x->nodes[n]->failures);
	for (size_t k = 0; k < sizeof(per_pool) / sizeof(per_pool[0]); k++) {
		text_printf(t, "# HELP kvpaged_remote_%s %s\n# TYPE kvpaged_remote_%s %s\n",
			    per_pool[k].name, per_pool[k].help, per_pool[k].name, per_pool[k].type);
		FOR_REMOTE(i, x) {
			uint64_t v;

			memcpy(&v, (const char *)x + per_pool[k].off, sizeof(v));
			text_printf(t, "kvpaged_remote_%s{pool=\"%s\"} %llu\n", per_pool[k].name,
				    label(srv->pools[i].cfg->name, pl, sizeof(pl)),
				    (unsigned long long)v);
		}
	}
	text_printf(t, "# HELP kvpaged_remote_misses_total Blocks not fetched from the remote tier, "
		       "by reason.\n# TYPE kvpaged_remote_misses_total counter\n");
	FOR_REMOTE(i, x)
		for (size_t r = 0; r < x->n_misses; r++)
			text_printf(t, "kvpaged_remote_misses_total{pool=\"%s\",reason=\"%s\"} "
				       "%llu\n", label(srv->pools[i].cfg->name, pl, sizeof(pl)),
				    x->misses[r]->reason, (unsigned long long)x->misses[r]->count);
	text_printf(t, "# HELP kvpaged_remote_verify_failures_total Remote tier values that did "
		       "not open (the misses with reason verify), by why.\n"
		       "# TYPE kvpaged_remote_verify_failures_total counter\n");
	FOR_REMOTE(i, x)
		for (size_t r = 0; r < x->n_verify_failures; r++)
			text_printf(t, "kvpaged_remote_verify_failures_total{pool=\"%s\","
				       "reason=\"%s\"} %llu\n", label(srv->pools[i].cfg->name, pl, sizeof(pl)),
				    x->verify_failures[r]->reason,
				    (unsigned long long)x->verify_failures[r]->count);
	text_printf(t, "# HELP kvpaged_remote_stores_total Blocks stored to the remote tier, by "
		       "result (dropped: the queue was full).\n"
		       "# TYPE kvpaged_remote_stores_total counter\n");
	FOR_REMOTE(i, x) {
		label(srv->pools[i].cfg->name, pl, sizeof(pl));
		text_printf(t, "kvpaged_remote_stores_total{pool=\"%s\",result=\"ok\"} %llu\n"
			       "kvpaged_remote_stores_total{pool=\"%s\",result=\"dropped\"} %llu\n"
			       "kvpaged_remote_stores_total{pool=\"%s\",result=\"failed\"} %llu\n",
			    pl, (unsigned long long)x->stores_ok, pl,
			    (unsigned long long)x->stores_dropped, pl,
			    (unsigned long long)x->stores_failed);
	}
	/* Two gauges, not a summary's quantile label: the tier keeps no sum or count of them. */
	for (int q = 0; q < 2; q++) {
		const char *name = q ? "p99" : "p50";

		text_printf(t, "# HELP kvpaged_remote_fetch_latency_%s_seconds Remote tier fetch "
			       "latency, submit to completion: the %s of the last 1024 fetches.\n"
			       "# TYPE kvpaged_remote_fetch_latency_%s_seconds gauge\n", name,
			    q ? "99th percentile" : "median", name);
		FOR_REMOTE(i, x)
			text_printf(t, "kvpaged_remote_fetch_latency_%s_seconds{pool=\"%s\"} %.9f\n",
				    name, label(srv->pools[i].cfg->name, pl, sizeof(pl)),
				    (q ? x->latency_p99_ns : x->latency_p50_ns) / 1e9);
	}
	text_printf(t, "# HELP kvpaged_remote_inflight_blocks Blocks submitted to the remote tier's "
		       "thread and not reaped yet.\n# TYPE kvpaged_remote_inflight_blocks gauge\n");
	FOR_REMOTE(i, x)
		text_printf(t, "kvpaged_remote_inflight_blocks{pool=\"%s\"} %u\n",
			    label(srv->pools[i].cfg->name, pl, sizeof(pl)), x->inflight);
	text_printf(t, "# HELP kvpaged_remote_bandwidth_bytes_per_second The remote tier's "
		       "bandwidth as the cost model uses it (0: not known yet).\n"
		       "# TYPE kvpaged_remote_bandwidth_bytes_per_second gauge\n");
	FOR_REMOTE(i, x)
		text_printf(t, "kvpaged_remote_bandwidth_bytes_per_second{pool=\"%s\"} %.0f\n",
			    label(srv->pools[i].cfg->name, pl, sizeof(pl)), x->bandwidth);
#undef FOR_REMOTE
	free(ar);
}

/* Each pool's event stream: what it sent, dropped and replayed, its queue and subscribers now. */
#define EVENTS_FIELD(f) offsetof(struct events_stats, f), sizeof(((struct events_stats *)0)->f)
static void events_metrics_text(struct server *srv, struct text *t)
{
	static const struct {
		const char *name, *help, *type;
		size_t off, size; /* a uint64_t or a uint32_t */
	} per_pool[] = {
		{ "batches_total", "KV event batches sent.", "counter", EVENTS_FIELD(batches) },
		{ "events_total", "KV events sent (a chain's blocks stored at once are one).",
		  "counter", EVENTS_FIELD(events) },
		{ "dropped_total", "KV events dropped, the publisher's queue full.", "counter",
		  EVENTS_FIELD(dropped) },
		{ "replays_total", "KV event replay requests answered.", "counter",
		  EVENTS_FIELD(replays) },
		{ "slow_total", "KV event batches a subscriber at its high-water mark missed.",
		  "counter", EVENTS_FIELD(slow) },
		{ "refused_total", "KV event subscribers refused: a CURVE key not allowed.",
		  "counter", EVENTS_FIELD(refused) },
		{ "raised_total", "Times the idle KV event publisher fell behind and was raised.",
		  "counter", EVENTS_FIELD(raised) },
		{ "queued", "Events waiting for the publisher thread.", "gauge",
		  EVENTS_FIELD(queued) },
		{ "remote_blocks", "Remote tier blocks this node stored, announced now.", "gauge",
		  EVENTS_FIELD(remote_blocks) },
		{ "subscribers", "Connections to the KV event stream.", "gauge",
		  EVENTS_FIELD(subscribers) },
	};
	char pl[256];
	bool any = false;

	for (size_t i = 0; i < srv->npools; i++)
		any |= srv->pools[i].events != NULL;
	if (!any)
		return;
	for (size_t k = 0; k < sizeof(per_pool) / sizeof(per_pool[0]); k++) {
		text_printf(t, "# HELP kvpaged_events_%s %s\n# TYPE kvpaged_events_%s %s\n",
			    per_pool[k].name, per_pool[k].help, per_pool[k].name, per_pool[k].type);
		for (size_t i = 0; i < srv->npools; i++) {
			const char *f;
			struct events_stats es;
			uint64_t v;

			if (!srv->pools[i].events)
				continue;
			dpool_events_stats(&srv->pools[i], &es);
			f = (const char *)&es + per_pool[k].off;
			if (per_pool[k].size == sizeof(uint32_t)) {
				uint32_t v32;

				memcpy(&v32, f, sizeof(v32));
				v = v32;
			} else {
				memcpy(&v, f, sizeof(v));
			}
			text_printf(t, "kvpaged_events_%s{pool=\"%s\"} %llu\n", per_pool[k].name,
				    label(srv->pools[i].cfg->name, pl, sizeof(pl)),
				    (unsigned long long)v);
		}
	}
}
#undef EVENTS_FIELD

/* Pools that evict by value: how decisions split, the time scale, and each class's state. */
static void eviction_metrics_text(struct server *srv, struct text *t)
{
	static const struct {
		const char *name, *help;
		size_t off; /* a uint64_t of struct core_value_stats */
	} counters[] = {
		{ "decisions_total", "Victims the value eviction policy chose.",
		  offsetof(struct core_value_stats, decisions) },
		{ "passed_over_total", "Segment heads passed over for having cached children.",
		  offsetof(struct core_value_stats, passed_over) },
		{ "lru_fallbacks_total", "Evictions with no leaf among the heads: the oldest went.",
		  offsetof(struct core_value_stats, lru_fallbacks) },
		{ "records_total", "Closed chains the value eviction policy recorded.",
		  offsetof(struct core_value_stats, records) },
		{ "extensions_total", "Recorded chains that extended or repeated an earlier one.",
		  offsetof(struct core_value_stats, extensions) },
	};
	static const struct {
		const char *name, *help;
	} per_class[] = {
		{ "class_cached_blocks", "Cached blocks in the class's segment." },
		{ "class_p_reuse", "Predicted chance a chain of the class is reused before 16 H." },
		{ "class_median_reuse_seconds", "Predicted median reuse age of the class's chains." },
	};
	struct admin_eviction *ev = calloc(srv->npools + 1, sizeof(*ev));
	bool *has = calloc(srv->npools + 1, sizeof(*has)), any = false;
	char pl[256], cl[64];

	if (!ev || !has)
		goto out;
	for (size_t i = 0; i < srv->npools; i++)
		any |= has[i] = admin_eviction_fill(&srv->pools[i], &ev[i]);
	if (!any)
		goto out;
	for (size_t k = 0; k < sizeof(counters) / sizeof(counters[0]); k++) {
		text_printf(t, "# HELP kvpaged_eviction_%s %s\n# TYPE kvpaged_eviction_%s counter\n",
			    counters[k].name, counters[k].help, counters[k].name);
		for (size_t i = 0; i < srv->npools; i++) {
			uint64_t v;

			if (!has[i])
				continue;
			memcpy(&v, (const char *)&ev[i].stats + counters[k].off, sizeof(v));
			text_printf(t, "kvpaged_eviction_%s{pool=\"%s\"} %llu\n", counters[k].name,
				    label(srv->pools[i].cfg->name, pl, sizeof(pl)),
				    (unsigned long long)v);
		}
	}
	text_printf(t, "# HELP kvpaged_eviction_horizon_seconds The value eviction policy's time "
		       "scale H: the mean age of evicted blocks.\n"
		       "# TYPE kvpaged_eviction_horizon_seconds gauge\n");
	for (size_t i = 0; i < srv->npools; i++)
		if (has[i])
			text_printf(t, "kvpaged_eviction_horizon_seconds{pool=\"%s\"} %.6g\n",
				    label(srv->pools[i].cfg->name, pl, sizeof(pl)),
				    ev[i].stats.horizon);
	for (size_t k = 0; k < sizeof(per_class) / sizeof(per_class[0]); k++) {
		text_printf(t, "# HELP kvpaged_eviction_%s %s\n# TYPE kvpaged_eviction_%s gauge\n",
			    per_class[k].name, per_class[k].help, per_class[k].name);
		for (size_t i = 0; i < srv->npools; i++)
			for (uint32_t c = 0; has[i] && c < ev[i].stats.nclasses; c++) {
				const struct core_value_class *x = &ev[i].stats.cls[c];
				double v = k == 0 ? x->cached : k == 1 ? x->p_reuse : x->median_reuse;

				text_printf(t, "kvpaged_eviction_%s{pool=\"%s\",class=\"%s\"} %.6g\n",
					    per_class[k].name,
					    label(srv->pools[i].cfg->name, pl, sizeof(pl)),
					    label(x->name, cl, sizeof(cl)), v);
			}
	}
out:
	free(ev);
	free(has);
}

static void metrics_text(struct server *srv, struct text *t)
{
	struct http_stats hs;
	char pl[160], nl[160];

	text_printf(t, "# HELP kvpaged_sessions Client and admin sessions connected.\n"
		       "# TYPE kvpaged_sessions gauge\nkvpaged_sessions %u\n", srv->nsessions);
	text_printf(t, "# HELP kvpaged_admin_sessions Admin sessions connected (of kvpaged_sessions).\n"
		       "# TYPE kvpaged_admin_sessions gauge\nkvpaged_admin_sessions %u\n",
		    srv->nadmin);
	text_printf(t, "# HELP kvpaged_requests_total Requests received on both sockets.\n"
		       "# TYPE kvpaged_requests_total counter\nkvpaged_requests_total %llu\n",
		    (unsigned long long)srv->requests);
	text_printf(t, "# HELP kvpaged_client_bytes Memory clients make the daemon hold: buffers, "
		       "rings, sequences' tables and histories.\n"
		       "# TYPE kvpaged_client_bytes gauge\nkvpaged_client_bytes %llu\n",
		    (unsigned long long)srv->use.bytes);
	text_printf(t, "# HELP kvpaged_refusals_total Connections refused, or sessions closed, by "
		       "a limit.\n# TYPE kvpaged_refusals_total counter\n");
	for (int r = 0; r < SERVER_NREFUSALS; r++)
		text_printf(t, "kvpaged_refusals_total{reason=\"%s\"} %llu\n",
			    label(server_refusal_name(r), pl, sizeof(pl)),
			    (unsigned long long)srv->refused[r]);
	text_printf(t, "# HELP kvpaged_log_lines_dropped_total Log lines dropped by the rate "
		       "limit.\n# TYPE kvpaged_log_lines_dropped_total counter\n"
		       "kvpaged_log_lines_dropped_total %llu\n",
		    (unsigned long long)log_suppressed_total());
	http_stats(srv, &hs);
	text_printf(t, "# HELP kvpaged_http_connections Connections open to the metrics endpoint "
		       "(metrics_listen).\n# TYPE kvpaged_http_connections gauge\n"
		       "kvpaged_http_connections %u\n", hs.connections);
	text_printf(t, "# HELP kvpaged_http_requests_total Requests the metrics endpoint "
		       "answered.\n# TYPE kvpaged_http_requests_total counter\n"
		       "kvpaged_http_requests_total %llu\n", (unsigned long long)hs.requests);
	text_printf(t, "# HELP kvpaged_http_refusals_total Metrics endpoint connections closed by "
		       "a limit.\n# TYPE kvpaged_http_refusals_total counter\n"
		       "kvpaged_http_refusals_total{reason=\"metrics_max_connections\"} %llu\n"
		       "kvpaged_http_refusals_total{reason=\"metrics_timeout_ms\"} %llu\n",
		    (unsigned long long)hs.refused_connections, (unsigned long long)hs.timed_out);
	text_printf(t, "# HELP kvpaged_pool_blocks Blocks of each pool by state.\n"
		       "# TYPE kvpaged_pool_blocks gauge\n");
	for (size_t i = 0; i < srv->npools; i++) {
		struct core_usage u;

		core_get_usage(srv->pools[i].core, &u);
		label(srv->pools[i].cfg->name, pl, sizeof(pl));
		text_printf(t, "kvpaged_pool_blocks{pool=\"%s\",state=\"free\"} %u\n", pl, u.free);
		text_printf(t, "kvpaged_pool_blocks{pool=\"%s\",state=\"cached\"} %u\n", pl, u.cached);
		text_printf(t, "kvpaged_pool_blocks{pool=\"%s\",state=\"in_use\"} %u\n", pl, u.in_use);
	}
	text_printf(t, "# HELP kvpaged_pool_sequences Open sequences.\n"
		       "# TYPE kvpaged_pool_sequences gauge\n");
	for (size_t i = 0; i < srv->npools; i++) {
		struct core_usage u;

		core_get_usage(srv->pools[i].core, &u);
		text_printf(t, "kvpaged_pool_sequences{pool=\"%s\"} %u\n",
			    label(srv->pools[i].cfg->name, pl, sizeof(pl)), u.sequences);
	}
	static const struct {
		const char *name, *help;
		size_t off;
	} counters[] = {
		{ "lookups", "Prefix lookups (sequence opens).", offsetof(struct core_stats, lookups) },
		{ "query_blocks", "Prompt blocks looked up (the hit rate's denominator).",
		  offsetof(struct core_stats, query_blocks) },
		{ "hit_blocks", "Prompt blocks found cached (the hit rate's numerator).",
		  offsetof(struct core_stats, hit_blocks) },
		{ "hit_tokens", "Prompt tokens found cached.", offsetof(struct core_stats, hit_tokens) },
		{ "collisions", "Hash matches with other content, counted as misses.",
		  offsetof(struct core_stats, collisions) },
		{ "evictions", "Cached blocks whose memory was reused.",
		  offsetof(struct core_stats, evictions) },
		{ "cow_copies", "Blocks copied on write.", offsetof(struct core_stats, cow_copies) },
		{ "dedup_blocks", "Committed blocks replaced by an equal cached block.",
		  offsetof(struct core_stats, dedup_blocks) },
		{ "preemptions", "Parked sequences dropped to make room.",
		  offsetof(struct core_stats, preemptions) },
		{ "swaps", "Preempted sequences whose blocks go to the tiers below the pool.",
		  offsetof(struct core_stats, swaps) },
		{ "pruned_tokens", "Tokens released by retention policies and sliding windows.",
		  offsetof(struct core_stats, pruned_tokens) },
		{ "compactions", "Tokens moved into packed blocks (H2O at token granularity).",
		  offsetof(struct core_stats, compactions) },
	};
	for (size_t k = 0; k < sizeof(counters) / sizeof(counters[0]); k++) {
		text_printf(t, "# HELP kvpaged_%s_total %s\n# TYPE kvpaged_%s_total counter\n",
			    counters[k].name, counters[k].help, counters[k].name);
		for (size_t i = 0; i < srv->npools; i++) {
			struct core_stats st;
			uint64_t v;

			core_get_stats(srv->pools[i].core, &st);
			memcpy(&v, (const char *)&st + counters[k].off, sizeof(v));
			text_printf(t, "kvpaged_%s_total{pool=\"%s\"} %llu\n", counters[k].name,
				    label(srv->pools[i].cfg->name, pl, sizeof(pl)),
				    (unsigned long long)v);
		}
	}
	static const struct {
		const char *name, *help;
		size_t off;
	} tier_counters[] = {
		{ "demotions", "Blocks moved into the tier from the level above.",
		  offsetof(struct core_tier_stats, demotions) },
		{ "promotions", "Blocks brought back from the tier into the pool.",
		  offsetof(struct core_tier_stats, promotions) },
		{ "evictions", "Blocks pushed out of the tier.",
		  offsetof(struct core_tier_stats, evictions) },
		{ "load_errors", "Loads that failed (I/O, checksum, identity): recomputed.",
		  offsetof(struct core_tier_stats, load_errors) },
	};
	text_printf(t, "# HELP kvpaged_tier_blocks Blocks each tier below the pool holds.\n"
		       "# TYPE kvpaged_tier_blocks gauge\n");
	for (size_t i = 0; i < srv->npools; i++)
		for (uint32_t tier = 1; tier <= srv->pools[i].ntiers; tier++) {
			struct core_tier_stats ts;

			if (core_get_tier_stats(srv->pools[i].core, tier, &ts) == 0)
				text_printf(t, "kvpaged_tier_blocks{pool=\"%s\",tier=\"%s\"} %u\n",
					    label(srv->pools[i].cfg->name, pl, sizeof(pl)),
					    srv->pools[i].tiers[tier - 1].name, ts.used);
		}
	for (size_t k = 0; k < sizeof(tier_counters) / sizeof(tier_counters[0]); k++) {
		text_printf(t, "# HELP kvpaged_tier_%s_total %s\n# TYPE kvpaged_tier_%s_total counter\n",
			    tier_counters[k].name, tier_counters[k].help, tier_counters[k].name);
		for (size_t i = 0; i < srv->npools; i++)
			for (uint32_t tier = 1; tier <= srv->pools[i].ntiers; tier++) {
				struct core_tier_stats ts;
				uint64_t v;

				if (core_get_tier_stats(srv->pools[i].core, tier, &ts) < 0)
					continue;
				memcpy(&v, (const char *)&ts + tier_counters[k].off, sizeof(v));
				text_printf(t, "kvpaged_tier_%s_total{pool=\"%s\",tier=\"%s\"} %llu\n",
					    tier_counters[k].name,
					    label(srv->pools[i].cfg->name, pl, sizeof(pl)),
					    srv->pools[i].tiers[tier - 1].name,
					    (unsigned long long)v);
			}
	}
	static const struct {
		const char *name, *help;
		size_t off;
	} queue_counters[] = {
		{ "backend_queued_ops", "Copies and moves queued on the pool's backend.",
		  offsetof(struct dpool, queued_ops) },
		{ "backend_held_replies", "Replies and ring batches that waited for the backend.",
		  offsetof(struct dpool, held_replies) },
		{ "backend_loop_waits", "Times the event loop waited for the backend's queue.",
		  offsetof(struct dpool, cpu_waits) },
	};
	for (size_t k = 0; k < sizeof(queue_counters) / sizeof(queue_counters[0]); k++) {
		text_printf(t, "# HELP kvpaged_%s_total %s\n# TYPE kvpaged_%s_total counter\n",
			    queue_counters[k].name, queue_counters[k].help, queue_counters[k].name);
		for (size_t i = 0; i < srv->npools; i++) {
			uint64_t v;

			memcpy(&v, (const char *)&srv->pools[i] + queue_counters[k].off, sizeof(v));
			text_printf(t, "kvpaged_%s_total{pool=\"%s\"} %llu\n", queue_counters[k].name,
				    label(srv->pools[i].cfg->name, pl, sizeof(pl)),
				    (unsigned long long)v);
		}
	}
	text_printf(t, "# HELP kvpaged_namespaces_folded_total Namespace entries no session used, "
		       "folded into \"(other)\".\n# TYPE kvpaged_namespaces_folded_total counter\n");
	for (size_t i = 0; i < srv->npools; i++)
		text_printf(t, "kvpaged_namespaces_folded_total{pool=\"%s\"} %llu\n",
			    label(srv->pools[i].cfg->name, pl, sizeof(pl)),
			    (unsigned long long)srv->pools[i].ns_folded);
	static const struct {
		const char *name, *help;
		size_t off;
	} ns_counters[] = {
		{ "query_blocks", "Prompt blocks looked up, per namespace.",
		  offsetof(struct ns_stats, query_blocks) },
		{ "hit_blocks", "Prompt blocks found cached, per namespace.",
		  offsetof(struct ns_stats, hit_blocks) },
	};
	for (size_t k = 0; k < sizeof(ns_counters) / sizeof(ns_counters[0]); k++) {
		text_printf(t, "# HELP kvpaged_namespace_%s_total %s\n"
			       "# TYPE kvpaged_namespace_%s_total counter\n",
			    ns_counters[k].name, ns_counters[k].help, ns_counters[k].name);
		for (size_t i = 0; i < srv->npools; i++) {
			const struct dpool *p = &srv->pools[i];

			for (uint32_t j = 0; j <= p->nns; j++) {
				const struct ns_stats *e = j < p->nns ? p->ns[j] : &p->ns_other;
				uint64_t v;

				if (j == p->nns && !p->ns_folded)
					continue;
				memcpy(&v, (const char *)e + ns_counters[k].off, sizeof(v));
				text_printf(t, "kvpaged_namespace_%s_total{pool=\"%s\",namespace=\"%s\"} "
					       "%llu\n",
					    ns_counters[k].name, label(p->cfg->name, pl, sizeof(pl)),
					    label(e->name, nl, sizeof(nl)), (unsigned long long)v);
			}
		}
	}
	remote_metrics_text(srv, t);
	events_metrics_text(srv, t);
	eviction_metrics_text(srv, t);
}

int admin_metrics_text(struct server *srv, char **ret_text, size_t *ret_len)
{
	struct text t = { 0 };

	metrics_text(srv, &t);
	if (t.failed || !t.buf) {
		free(t.buf);
		return -ENOMEM;
	}
	*ret_text = t.buf;
	*ret_len = t.len;
	return 0;
}

/* A level's name: the pool's, or its list's entry (a level the pool does not have: "pool"). */
static const char *level_name(const struct dpool *p, uint32_t level)
{
	return level >= 1 && level <= p->ntiers ? p->tiers[level - 1].name : "pool";
}

static const char *decision_name(uint32_t d)
{
	return d == CORE_DECISION_SWAP ? "swap" : "drop";
}

static const char *reason_name(uint32_t r)
{
	switch (r) {
	case CORE_REASON_NO_TIER:
		return "no tier below the pool";
	case CORE_REASON_NOTHING_TO_SWAP:
		return "no committed block of its own";
	case CORE_REASON_NO_COST_MODEL:
		return "no cost model (model_params, engine_flops, bandwidth): swapping loses no work";
	case CORE_REASON_SWAP_CHEAPER:
		return "transfer back is cheaper than recompute";
	case CORE_REASON_RECOMPUTE_CHEAPER:
		return "recompute is cheaper than transfer back";
	}
	return "unknown";
}

/* Per-tier statistics and the recent preemption decisions; freed by tier_stats_free. */
static void tier_stats_fill(struct dpool *p, Kvpaged__V1__PoolStats *x)
{
	struct core_preemption log[CORE_PREEMPTION_LOG];
	Kvpaged__V1__TierStats *ts = calloc(CORE_MAX_TIERS, sizeof(*ts));
	Kvpaged__V1__TierStats **tp = calloc(CORE_MAX_TIERS, sizeof(*tp));
	Kvpaged__V1__Preemption *pe = calloc(CORE_PREEMPTION_LOG, sizeof(*pe));
	Kvpaged__V1__Preemption **pep = calloc(CORE_PREEMPTION_LOG, sizeof(*pep));
	uint32_t n;

	if (!ts || !tp || !pe || !pep) {
		free(ts);
		free(tp);
		free(pe);
		free(pep);
		return;
	}
	for (uint32_t t = 1; t <= p->ntiers; t++) {
		Kvpaged__V1__TierStats *y = &ts[x->n_tiers];
		struct core_tier_stats st;

		if (core_get_tier_stats(p->core, t, &st) < 0)
			continue;
		kvpaged__v1__tier_stats__init(y);
		y->tier = (char *)level_name(p, t);
		y->capacity_blocks = st.capacity;
		y->used_blocks = st.used;
		y->demotions = st.demotions;
		y->promotions = st.promotions;
		y->evictions = st.evictions;
		y->load_errors = st.load_errors;
		y->store_errors = st.store_errors;
		y->lost = st.lost;
		y->skipped = st.skipped;
		y->bytes_in = st.demotions * p->block_bytes;
		y->bytes_out = st.promotions * p->block_bytes;
		y->probes = st.probes;
		y->misses = st.misses;
		y->published = st.published;
		if (t == p->file_level && p->file) {
			struct file_tier_stats fs;

			file_tier_get_stats(p->file, &fs);
			y->checksum_errors = fs.checksum_errors + fs.identity_errors;
		}
		tp[x->n_tiers++] = y;
	}
	x->tiers = tp;
	if (!x->n_tiers)
		free(ts); /* tp[0] is NULL: tier_stats_free finds nothing to free */
	n = core_get_preemptions(p->core, log, CORE_PREEMPTION_LOG);
	for (uint32_t i = 0; i < n; i++) {
		Kvpaged__V1__Preemption *y = &pe[i];

		kvpaged__v1__preemption__init(y);
		y->seq = log[i].seq;
		y->priority = log[i].priority;
		y->tokens = log[i].tokens;
		y->blocks = log[i].blocks;
		y->swap_blocks = log[i].swap_blocks;
		y->decision = (char *)decision_name(log[i].decision);
		y->reason = (char *)reason_name(log[i].reason);
		y->tier = (char *)level_name(p, log[i].tier);
		y->swap_ms = log[i].swap_s * 1e3;
		y->recompute_ms = log[i].recompute_s * 1e3;
		y->tick = log[i].tick;
		pep[i] = y;
	}
	x->n_recent_preemptions = n;
	x->recent_preemptions = pep;
	if (!n)
		free(pe); /* pep[0] is NULL: tier_stats_free finds nothing to free */
}

static void tier_stats_free(Kvpaged__V1__PoolStats *x)
{
	/* The first entries point at the starts of the arrays tier_stats_fill allocated. */
	if (x->tiers && x->n_tiers)
		free(x->tiers[0]);
	free(x->tiers);
	if (x->recent_preemptions && x->n_recent_preemptions)
		free(x->recent_preemptions[0]);
	free(x->recent_preemptions);
}

#define REPLY(TYPE, msg) session_reply(s, KVPAGED__V1__MESSAGE_TYPE__##TYPE, h->seq, &(msg).base, NULL, 0)

static void on_status(struct session *s, const struct kvp_frame_header *h, const char *pool)
{
	struct server *srv = s->srv;
	Kvpaged__V1__Status st = KVPAGED__V1__STATUS__INIT;

	st.version = PACKAGE_VERSION;
	st.uptime_ms = (server_now_ns() - srv->started_ns) / 1000000;
	st.sessions = srv->nsessions;
	st.pools = (uint32_t)srv->npools;
	st.requests = srv->requests;
	st.pid = (uint32_t)getpid();
	st.admin_sessions = srv->nadmin;
	st.client_bytes = srv->use.bytes;
	st.log_lines_dropped = log_suppressed_total();
	st.fd_limit = srv->fd_limit;
	st.fds = srv->fd_base + srv->session_fds;
	Kvpaged__V1__Refusal refusals[SERVER_NREFUSALS], *rp[SERVER_NREFUSALS];

	for (int r = 0; r < SERVER_NREFUSALS; r++) {
		kvpaged__v1__refusal__init(&refusals[r]);
		refusals[r].reason = (char *)server_refusal_name(r);
		refusals[r].count = srv->refused[r];
		rp[r] = &refusals[r];
	}
	st.n_refusals = SERVER_NREFUSALS;
	st.refusals = rp;
	REPLY(ADMIN_STATUS_REPLY, st);
}

static void on_pools(struct session *s, const struct kvp_frame_header *h, const char *pool)
{
	struct server *srv = s->srv;
	Kvpaged__V1__Pools rep = KVPAGED__V1__POOLS__INIT;
	Kvpaged__V1__PoolUsage *use = calloc(srv->npools, sizeof(*use));
	Kvpaged__V1__PoolUsage **usep = calloc(srv->npools, sizeof(*usep));
	Kvpaged__V1__PoolDescription *desc = calloc(srv->npools, sizeof(*desc));
	struct admin_remote *remotes = calloc(srv->npools, sizeof(*remotes));
	Kvpaged__V1__SwapFile *files, **filep;
	size_t nfiles = 0;

	for (size_t i = 0; i < srv->npools; i++)
		nfiles += srv->pools[i].file ? srv->pools[i].cfg->n_swap_files : 0;
	files = calloc(nfiles + 1, sizeof(*files));
	filep = calloc(nfiles + 1, sizeof(*filep));
	if (!use || !usep || !desc || !remotes || !files || !filep) {
		free(use);
		free(usep);
		free(desc);
		free(remotes);
		free(files);
		free(filep);
		session_reply_error(s, h->seq, ENOMEM, "out of memory");
		return;
	}
	nfiles = 0;
	for (size_t i = 0; i < srv->npools; i++) {
		struct core_usage u;

		if (!pool_selected(&srv->pools[i], pool))
			continue;
		core_get_usage(srv->pools[i].core, &u);
		kvpaged__v1__pool_usage__init(&use[rep.n_pools]);
		kvpaged__v1__pool_description__init(&desc[rep.n_pools]);
		dpool_describe(&srv->pools[i], &desc[rep.n_pools]);
		use[rep.n_pools].description = &desc[rep.n_pools];
		use[rep.n_pools].free = u.free;
		use[rep.n_pools].cached = u.cached;
		use[rep.n_pools].in_use = u.in_use;
		use[rep.n_pools].indexed = u.indexed;
		use[rep.n_pools].sequences = u.sequences;
		use[rep.n_pools].sessions = srv->pools[i].sessions;
		use[rep.n_pools].n_allow_uids = srv->pools[i].cfg->n_allow_uids;
		use[rep.n_pools].allow_uids = srv->pools[i].cfg->allow_uids;
		use[rep.n_pools].n_allow_gids = srv->pools[i].cfg->n_allow_gids;
		use[rep.n_pools].allow_gids = srv->pools[i].cfg->allow_gids;
		use[rep.n_pools].swap_files = &filep[nfiles];
		for (uint32_t f = 0; srv->pools[i].file && f < srv->pools[i].cfg->n_swap_files;
		     f++) {
			kvpaged__v1__swap_file__init(&files[nfiles]);
			files[nfiles].path = srv->pools[i].cfg->swap_files[f];
			files[nfiles].direct = file_tier_direct(srv->pools[i].file, f);
			filep[nfiles] = &files[nfiles];
			nfiles++;
			use[rep.n_pools].n_swap_files++;
		}
		if (admin_remote_fill(&srv->pools[i], &remotes[i]))
			use[rep.n_pools].remote = &remotes[i].tier;
		usep[rep.n_pools] = &use[rep.n_pools];
		rep.n_pools++;
	}
	rep.pools = usep;
	REPLY(ADMIN_POOLS_REPLY, rep);
	free(use);
	free(usep);
	free(desc);
	free(remotes);
	free(files);
	free(filep);
}

static void on_sessions(struct session *s, const struct kvp_frame_header *h, const char *pool)
{
	struct server *srv = s->srv;
	Kvpaged__V1__Sessions rep = KVPAGED__V1__SESSIONS__INIT;
	Kvpaged__V1__SessionInfo *infos = calloc(srv->nsessions + 1, sizeof(*infos));
	Kvpaged__V1__SessionInfo **ptrs = calloc(srv->nsessions + 1, sizeof(*ptrs));

	if (!infos || !ptrs) {
		free(infos);
		free(ptrs);
		session_reply_error(s, h->seq, ENOMEM, "out of memory");
		return;
	}
	for (struct session *o = srv->sessions; o; o = o->next) {
		Kvpaged__V1__SessionInfo *si = &infos[rep.n_sessions];

		if (o->admin || !o->welcomed || o->closing || !pool_selected(o->pool, pool))
			continue;
		kvpaged__v1__session_info__init(si);
		si->id = o->id;
		si->client_name = o->name;
		si->pool = (char *)o->pool->cfg->name;
		si->namespace_ = o->ns_name;
		si->pid = (uint32_t)o->cred.pid;
		si->uid = o->cred.uid;
		si->gid = o->cred.gid;
		si->sequences = o->nseqs;
		si->blocks = (uint32_t)o->blocks;
		si->requests = o->requests;
		si->rings = o->ring != NULL;
		si->bytes = o->bytes;
		si->idle_ms = (server_now_ns() - o->active_ns) / 1000000u;
		ptrs[rep.n_sessions++] = si;
	}
	rep.sessions = ptrs;
	REPLY(ADMIN_SESSIONS_REPLY, rep);
	free(infos);
	free(ptrs);
}

static void on_sequences(struct session *s, const struct kvp_frame_header *h, const char *pool)
{
	struct server *srv = s->srv;
	Kvpaged__V1__Sequences rep = KVPAGED__V1__SEQUENCES__INIT;
	size_t total = 0, n = 0;

	for (size_t i = 0; i < srv->npools; i++) {
		struct core_usage u;

		core_get_usage(srv->pools[i].core, &u);
		total += u.sequences;
	}
	Kvpaged__V1__SequenceInfo *infos = calloc(total + 1, sizeof(*infos));
	Kvpaged__V1__SequenceInfo **ptrs = calloc(total + 1, sizeof(*ptrs));
	if (!infos || !ptrs) {
		free(infos);
		free(ptrs);
		session_reply_error(s, h->seq, ENOMEM, "out of memory");
		return;
	}
	for (size_t i = 0; i < srv->npools; i++) {
		struct dpool *p = &srv->pools[i];

		if (!pool_selected(p, pool))
			continue;
		for (uint32_t slot = 0; slot < p->cfg->max_sequences && n < total; slot++) {
			struct seq_owner *ow = &p->owners[slot];
			struct core_seq_info info;
			uint64_t id;

			if (!ow->s)
				continue;
			id = ow->s->seqs[ow->idx];
			if (core_seq_info(p->core, id, &info) < 0)
				continue;
			kvpaged__v1__sequence_info__init(&infos[n]);
			infos[n].seq = id;
			infos[n].session = ow->s->id;
			infos[n].pool = (char *)p->cfg->name;
			infos[n].tokens = info.ntokens;
			infos[n].committed = info.ncommitted;
			infos[n].blocks = info.nblocks;
			infos[n].retention = (char *)(info.retention == CORE_RETAIN_FULL ? "full"
						      : p->cfg->window		     ? "window"
						      : info.retention == CORE_RETAIN_H2O ? "h2o"
										     : "sinks");
			infos[n].held_blocks = info.held_blocks;
			infos[n].freed_blocks = info.freed_blocks;
			infos[n].n_sink = info.n_sink;
			infos[n].recent = info.recent;
			infos[n].retained_tokens = info.retained_tokens;
			infos[n].budget = info.budget;
			infos[n].granularity = info.granularity;
			ptrs[n] = &infos[n];
			n++;
		}
	}
	rep.n_sequences = n;
	rep.sequences = ptrs;
	REPLY(ADMIN_SEQUENCES_REPLY, rep);
	free(infos);
	free(ptrs);
}

static void on_stats(struct session *s, const struct kvp_frame_header *h, const char *pool)
{
	struct server *srv = s->srv;
	Kvpaged__V1__Stats rep = KVPAGED__V1__STATS__INIT;
	size_t np = srv->npools, nns = 0;

	for (size_t i = 0; i < np; i++)
		nns += srv->pools[i].nns + 1; /* and "(other)" */
	Kvpaged__V1__PoolStats *ps = calloc(np + 1, sizeof(*ps)), **pp = calloc(np + 1, sizeof(*pp));
	Kvpaged__V1__NamespaceStats *ns = calloc(nns + 1, sizeof(*ns)), **nsp = calloc(nns + 1, sizeof(*nsp));
	struct admin_remote *remotes = calloc(np + 1, sizeof(*remotes));
	Kvpaged__V1__EventStream *evs = calloc(np + 1, sizeof(*evs));
	struct admin_eviction *evp = calloc(np + 1, sizeof(*evp));
	if (!ps || !pp || !ns || !nsp || !remotes || !evs || !evp) {
		session_reply_error(s, h->seq, ENOMEM, "out of memory");
	} else {
		for (size_t i = 0; i < np; i++) {
			struct dpool *p = &srv->pools[i];
			struct core_stats st;

			if (!pool_selected(p, pool))
				continue;
			core_get_stats(p->core, &st);
			Kvpaged__V1__PoolStats *x = &ps[rep.n_pools];
			kvpaged__v1__pool_stats__init(x);
			x->pool = (char *)p->cfg->name;
			x->lookups = st.lookups;
			x->query_blocks = st.query_blocks;
			x->hit_blocks = st.hit_blocks;
			x->hit_tokens = st.hit_tokens;
			x->miss_blocks = st.miss_blocks;
			x->collisions = st.collisions;
			x->evictions = st.evictions;
			x->cow_copies = st.cow_copies;
			x->dedup_blocks = st.dedup_blocks;
			x->commits = st.commits;
			x->preemptions = st.preemptions;
			x->dropped_tokens = st.dropped_tokens;
			x->swaps = st.swaps;
			x->pruned_blocks = st.pruned_blocks;
			x->pruned_tokens = st.pruned_tokens;
			x->compactions = st.compactions;
			x->queued_ops = p->queued_ops;
			x->held_replies = p->held_replies;
			x->loop_waits = p->cpu_waits;
			x->namespaces_folded = p->ns_folded;
			tier_stats_fill(p, x);
			if (admin_remote_fill(p, &remotes[i]))
				x->remote = &remotes[i].tier;
			if (p->events) {
				Kvpaged__V1__EventStream *e = &evs[i];
				struct events_stats es;

				dpool_events_stats(p, &es);
				kvpaged__v1__event_stream__init(e);
				e->endpoint = p->cfg->events_endpoint;
				e->replay_endpoint = p->cfg->events_replay_endpoint
							     ? p->cfg->events_replay_endpoint
							     : (char *)"";
				e->topic = p->cfg->events_topic ? p->cfg->events_topic : (char *)"";
				e->format = p->cfg->events_format;
				e->batches = es.batches;
				e->events = es.events;
				e->dropped = es.dropped;
				e->replays = es.replays;
				e->next_seq = es.seq;
				e->queued = es.queued;
				e->namespaces = (uint32_t)p->n_events_salts;
				e->slow = es.slow;
				e->refused = es.refused;
				e->raised = es.raised;
				e->remote_blocks = es.remote_blocks;
				e->subscribers = es.subscribers;
				e->curve_public_key = p->events_curve_public;
				x->events = e;
			}
			if (admin_eviction_fill(p, &evp[i]))
				x->eviction = &evp[i].policy;
			pp[rep.n_pools++] = x;
			for (uint32_t j = 0; j <= p->nns; j++) {
				const struct ns_stats *e = j < p->nns ? p->ns[j] : &p->ns_other;
				Kvpaged__V1__NamespaceStats *y = &ns[rep.n_namespaces];

				if (j == p->nns && !p->ns_folded)
					continue; /* nothing was folded: no "(other)" */
				kvpaged__v1__namespace_stats__init(y);
				y->pool = (char *)p->cfg->name;
				y->namespace_ = (char *)e->name;
				y->lookups = e->lookups;
				y->query_blocks = e->query_blocks;
				y->hit_blocks = e->hit_blocks;
				y->hit_tokens = e->hit_tokens;
				y->sessions = e->use.sessions;
				y->sequences = e->use.sequences;
				y->blocks = e->use.blocks;
				y->bytes = e->use.bytes;
				nsp[rep.n_namespaces++] = y;
			}
		}
		rep.pools = pp;
		rep.namespaces = nsp;
		REPLY(ADMIN_STATS_REPLY, rep);
	}
	for (size_t i = 0; ps && i < rep.n_pools; i++)
		tier_stats_free(&ps[i]);
	free(ps);
	free(pp);
	free(ns);
	free(nsp);
	free(remotes);
	free(evs);
	free(evp);
}

static void on_metrics(struct session *s, const struct kvp_frame_header *h, const char *pool)
{
	struct server *srv = s->srv;
	Kvpaged__V1__Metrics rep = KVPAGED__V1__METRICS__INIT;
	char *text;
	size_t len;

	if (admin_metrics_text(srv, &text, &len) < 0) {
		session_reply_error(s, h->seq, ENOMEM, "out of memory");
	} else {
		rep.text = text;
		REPLY(ADMIN_METRICS_REPLY, rep);
		free(text);
	}
}

static void on_verify(struct session *s, const struct kvp_frame_header *h, const char *pool)
{
	struct server *srv = s->srv;
	Kvpaged__V1__VerifyReply rep = KVPAGED__V1__VERIFY_REPLY__INIT;
	char (*why)[400] = calloc(srv->npools + 1, sizeof(*why));
	char **problems = calloc(srv->npools + 1, sizeof(*problems));

	if (!why || !problems) {
		free(why);
		free(problems);
		session_reply_error(s, h->seq, ENOMEM, "out of memory");
		return;
	}
	for (size_t i = 0; i < srv->npools; i++) {
		char detail[256];

		if (!pool_selected(&srv->pools[i], pool))
			continue;
		if (dpool_verify(&srv->pools[i], detail, sizeof(detail)) < 0) {
			snprintf(why[rep.n_problems], sizeof(why[0]), "pool %s: %s",
				 srv->pools[i].cfg->name, detail);
			log_error("verify: %s", why[rep.n_problems]);
			problems[rep.n_problems] = why[rep.n_problems];
			rep.n_problems++;
		}
	}
	if (!*pool) {
		char detail[256];

		if (account_verify(srv, detail, sizeof(detail)) < 0) {
			snprintf(why[rep.n_problems], sizeof(why[0]), "accounting: %s", detail);
			log_error("verify: %s", why[rep.n_problems]);
			problems[rep.n_problems] = why[rep.n_problems];
			rep.n_problems++;
		}
	}
	rep.problems = problems;
	REPLY(ADMIN_VERIFY_REPLY, rep);
	free(why);
	free(problems);
}

static void on_drop_cache(struct session *s, const struct kvp_frame_header *h, const char *pool)
{
	struct server *srv = s->srv;
	Kvpaged__V1__DropCacheReply rep = KVPAGED__V1__DROP_CACHE_REPLY__INIT;

	for (size_t i = 0; i < srv->npools; i++)
		if (pool_selected(&srv->pools[i], pool)) {
			rep.freed_blocks += core_drop_cache(srv->pools[i].core);
			dpool_events_dropped(&srv->pools[i]);
		}
	log_info("drop-cache: %u cached blocks freed", rep.freed_blocks);
	REPLY(ADMIN_DROP_CACHE_REPLY, rep);
}

static void on_reload(struct session *s, const struct kvp_frame_header *h, const char *pool)
{
	struct server *srv = s->srv;
	Kvpaged__V1__ReloadReply rep = KVPAGED__V1__RELOAD_REPLY__INIT;
	struct server_reload_report r = { .keep = true };
	int err = server_reload(srv, "kvpagedctl reload", &r);

	if (err < 0) {
		session_reply_error(s, h->seq, err == -ESHUTDOWN || err == -ENOENT ? -err : EINVAL,
				    "%s", r.error);
	} else {
		rep.applied = r.applied;
		rep.n_applied = r.napplied;
		rep.refused = r.refused;
		rep.n_refused = r.nrefused;
		REPLY(ADMIN_RELOAD_REPLY, rep);
	}
	server_reload_report_free(&r);
}

void admin_dispatch(struct session *s, const struct kvp_frame_header *h, const uint8_t *payload)
{
	struct server *srv = s->srv;
	Kvpaged__V1__AdminRequest *req;
	const char *pool;

	/* Who may ask was settled at accept (admin_peer_allowed); the first request ends the
	 * handshake's deadline. */
	s->welcomed = true;
	req = kvpaged__v1__admin_request__unpack(NULL, h->len, payload);
	if (!req) {
		session_reply_error(s, h->seq, EPROTO, "malformed AdminRequest");
		session_close(s, "malformed admin request");
		return;
	}
	pool = req->pool;
	if (*pool) {
		bool found = false;

		for (size_t i = 0; i < srv->npools; i++)
			found |= pool_selected(&srv->pools[i], pool);
		if (!found) {
			session_reply_error(s, h->seq, ENOENT, "no pool named '%s'", pool);
			goto out;
		}
	}

	switch (h->type) {
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_STATUS:
		on_status(s, h, pool);
		break;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_POOLS:
		on_pools(s, h, pool);
		break;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_SESSIONS:
		on_sessions(s, h, pool);
		break;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_SEQUENCES:
		on_sequences(s, h, pool);
		break;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_STATS:
		on_stats(s, h, pool);
		break;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_METRICS:
		on_metrics(s, h, pool);
		break;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_VERIFY:
		on_verify(s, h, pool);
		break;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_DROP_CACHE:
		on_drop_cache(s, h, pool);
		break;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_RELOAD:
		on_reload(s, h, pool);
		break;
	default:
		session_reply_error(s, h->seq, EPROTO, "unknown admin message type %u", h->type);
		session_close(s, "unknown admin message type");
	}
out:
	kvpaged__v1__admin_request__free_unpacked(req, NULL);
}

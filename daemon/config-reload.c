/* SPDX-License-Identifier: MIT */
/*
 * Reloading (SIGHUP, kvpagedctl reload): a freshly loaded configuration compared with the
 * running one key by key through the schema table; the keys listed live are moved in, every
 * other difference is reported and refused.
 */
#include <stdio.h>
#include <string.h>

#include "daemon/config-internal.h"

/*
 * Keys the running daemon reads afresh wherever it uses them, so a reload can change them in
 * place.  Everything else was turned into memory, files, sockets or core state at start.  A
 * key added to the schema needs a restart until it is listed here.
 */
static const struct {
	enum config_section section;
	const char *name;
} live_keys[] = {
	{ SECTION_DAEMON, "max_sessions" },
	{ SECTION_DAEMON, "max_sessions_per_uid" },
	{ SECTION_DAEMON, "max_admin_sessions" },
	{ SECTION_DAEMON, "log_rate_limit_interval_ms" }, /* the server sets them after a reload */
	{ SECTION_DAEMON, "log_rate_limit_burst" },
	{ SECTION_DAEMON, "ring_poll_us" },
	{ SECTION_DAEMON, "max_frame_bytes" },
	{ SECTION_DAEMON, "metrics_max_connections" }, /* read at each accept */
	{ SECTION_DAEMON, "metrics_timeout_ms" },      /* read at each accept */
	{ SECTION_LIMITS, "max_sequences" },
	{ SECTION_LIMITS, "max_blocks" },
	{ SECTION_LIMITS, "max_inflight" },
	{ SECTION_LIMITS, "max_tokens_per_request" },
	{ SECTION_LIMITS, "max_ring_entries" },
	{ SECTION_LIMITS, "max_ring_data_bytes" },
	{ SECTION_LIMITS, "max_queued_bytes" },
	{ SECTION_LIMITS, "max_wait_ms" },
	{ SECTION_LIMITS, "hello_timeout_ms" },
	{ SECTION_LIMITS, "idle_timeout_ms" },
	{ SECTION_LIMITS, "idle_timeout_with_sequences" },
	{ SECTION_LIMITS, "max_session_bytes" },
	{ SECTION_LIMITS, "max_bytes_per_uid" },
	{ SECTION_LIMITS, "max_bytes_per_namespace" },
	{ SECTION_LIMITS, "max_total_bytes" },
	{ SECTION_LIMITS, "max_sequences_per_uid" },
	{ SECTION_LIMITS, "max_blocks_per_uid" },
	{ SECTION_LIMITS, "max_sequences_per_namespace" },
	{ SECTION_LIMITS, "max_blocks_per_namespace" },
	{ SECTION_LIMITS, "max_namespaces_per_uid" },
	{ SECTION_POOL, "allow_users" },  /* checked at each Hello */
	{ SECTION_POOL, "allow_groups" },
	{ SECTION_POOL, "file_tier_blocking_reads" }, /* read at each open and resume */
	{ SECTION_POOL, "file_tier_persist_stop_ms" }, /* read at the stop */
};

static bool key_is_live(const struct config_key *key)
{
	for (size_t i = 0; i < sizeof(live_keys) / sizeof(live_keys[0]); i++)
		if (live_keys[i].section == key->section && !strcmp(live_keys[i].name, key->name))
			return true;
	return false;
}

static bool key_equal(const struct config_key *key, const void *a, const void *b)
{
	const void *fa = cfield_at(a, key->offset), *fb = cfield_at(b, key->offset);

	switch (key->type) {
	case TYPE_U32:
		return *(const uint32_t *)fa == *(const uint32_t *)fb;
	case TYPE_U64:
	case TYPE_SIZE:
		return *(const uint64_t *)fa == *(const uint64_t *)fb;
	case TYPE_BOOL:
		return *(const bool *)fa == *(const bool *)fb;
	case TYPE_NUMBER:
		return *(const double *)fa == *(const double *)fb;
	case TYPE_NAMESPACE:
		return *(const enum kvpd_namespace_mode *)fa == *(const enum kvpd_namespace_mode *)fb;
	case TYPE_POLICY:
		return *(const enum kvpd_policy *)fa == *(const enum kvpd_policy *)fb;
	case TYPE_EVICTION:
		return *(const enum kvpd_eviction *)fa == *(const enum kvpd_eviction *)fb;
	case TYPE_BACKEND:
		return *(const enum kvpd_backend *)fa == *(const enum kvpd_backend *)fb;
	case TYPE_REMOTE_WRITE:
		return *(const enum kvpd_remote_write *)fa == *(const enum kvpd_remote_write *)fb;
	case TYPE_PATH:
	case TYPE_LISTEN:
	case TYPE_REDIS_URL:
	case TYPE_STRING: {
		const char *pa = *(char *const *)fa, *pb = *(char *const *)fb;

		return (!pa && !pb) || (pa && pb && !strcmp(pa, pb));
	}
	case TYPE_GROUP: {
		bool sa = *(const bool *)cfield_at(a, key->aux_offset);
		bool sb = *(const bool *)cfield_at(b, key->aux_offset);

		return sa == sb && (!sa || *(const uint32_t *)fa == *(const uint32_t *)fb);
	}
	case TYPE_UIDS:
	case TYPE_GIDS: {
		size_t na = *(const size_t *)cfield_at(a, key->aux_offset);
		size_t nb = *(const size_t *)cfield_at(b, key->aux_offset);

		return na == nb &&
		       (!na || !memcmp(*(uint32_t *const *)fa, *(uint32_t *const *)fb,
				       na * sizeof(uint32_t)));
	}
	case TYPE_FILES: {
		size_t na = *(const size_t *)cfield_at(a, key->aux_offset);
		size_t nb = *(const size_t *)cfield_at(b, key->aux_offset);
		char *const *la = *(char **const *)fa, *const *lb = *(char **const *)fb;

		if (na != nb)
			return false;
		for (size_t i = 0; i < na; i++)
			if (strcmp(la[i], lb[i]))
				return false;
		return true;
	}
	}
	return false;
}

/* Moves one key's value from next into live; lists swap, so next frees the old one. */
static void take_value(const struct config_key *key, void *live, void *next)
{
	void *fl = field_at(live, key->offset), *fn = field_at(next, key->offset);

	switch (key->type) {
	case TYPE_U32:
		*(uint32_t *)fl = *(const uint32_t *)fn;
		break;
	case TYPE_U64:
	case TYPE_SIZE:
		*(uint64_t *)fl = *(const uint64_t *)fn;
		break;
	case TYPE_BOOL:
		*(bool *)fl = *(const bool *)fn;
		break;
	case TYPE_NUMBER:
		*(double *)fl = *(const double *)fn;
		break;
	case TYPE_NAMESPACE:
		*(enum kvpd_namespace_mode *)fl = *(const enum kvpd_namespace_mode *)fn;
		break;
	case TYPE_POLICY:
		*(enum kvpd_policy *)fl = *(const enum kvpd_policy *)fn;
		break;
	case TYPE_EVICTION:
		*(enum kvpd_eviction *)fl = *(const enum kvpd_eviction *)fn;
		break;
	case TYPE_BACKEND:
		*(enum kvpd_backend *)fl = *(const enum kvpd_backend *)fn;
		break;
	case TYPE_GROUP:
		*(uint32_t *)fl = *(const uint32_t *)fn;
		*(bool *)field_at(live, key->aux_offset) =
			*(const bool *)field_at(next, key->aux_offset);
		break;
	case TYPE_REMOTE_WRITE:
		*(enum kvpd_remote_write *)fl = *(const enum kvpd_remote_write *)fn;
		break;
	case TYPE_PATH:
	case TYPE_LISTEN:
	case TYPE_REDIS_URL:
	case TYPE_STRING: {
		char *t = *(char **)fl;

		*(char **)fl = *(char **)fn;
		*(char **)fn = t;
		break;
	}
	case TYPE_UIDS:
	case TYPE_GIDS: {
		uint32_t *t = *(uint32_t **)fl;
		size_t *nl = field_at(live, key->aux_offset), *nn = field_at(next, key->aux_offset);
		size_t tn = *nl;

		*(uint32_t **)fl = *(uint32_t **)fn;
		*(uint32_t **)fn = t;
		*nl = *nn;
		*nn = tn;
		break;
	}
	case TYPE_FILES: {
		char **t = *(char ***)fl;
		size_t *nl = field_at(live, key->aux_offset), *nn = field_at(next, key->aux_offset);
		size_t tn = *nl;

		*(char ***)fl = *(char ***)fn;
		*(char ***)fn = t;
		*nl = *nn;
		*nn = tn;
		break;
	}
	}
}

struct apply_state {
	void (*report)(void *ctx, bool applied, const char *what);
	void *ctx;
	int applied;
};

static void apply_section(struct apply_state *st, enum config_section section, const char *label,
			  void *live, void *next)
{
	char what[512], old[160], new[160];

	for (size_t k = 0; k < config_nkeys; k++) {
		const struct config_key *key = &config_schema[k];
		bool live_key;

		if (key->section != section || key_equal(key, live, next))
			continue;
		live_key = key_is_live(key);
		snprintf(what, sizeof(what), "[%s] %s: %s -> %s", label, key->name,
			 config_format_value(key, live, old, sizeof(old)),
			 config_format_value(key, next, new, sizeof(new)));
		if (live_key) {
			take_value(key, live, next);
			st->applied++;
		}
		if (st->report)
			st->report(st->ctx, live_key, what);
	}
}

int config_apply_live(struct kvpd_config *live, struct kvpd_config *next,
		      void (*report)(void *ctx, bool applied, const char *what), void *ctx)
{
	struct apply_state st = { .report = report, .ctx = ctx };
	char what[256];

	apply_section(&st, SECTION_DAEMON, "daemon", live, next);
	apply_section(&st, SECTION_LIMITS, "limits", live, next);
	for (size_t i = 0; i < live->npools; i++) {
		struct kvpd_pool_config *lp = &live->pools[i];
		size_t j = 0;

		while (j < next->npools && strcmp(next->pools[j].name, lp->name))
			j++;
		if (j == next->npools) {
			snprintf(what, sizeof(what), "[pool %s]: no longer in the file", lp->name);
			if (report)
				report(ctx, false, what);
			continue;
		}
		if (j != i) {
			snprintf(what, sizeof(what), "[pool %s]: moved from position %zu to %zu (the "
				 "first pool is the default)", lp->name, i + 1, j + 1);
			if (report)
				report(ctx, false, what);
		}
		snprintf(what, sizeof(what), "pool %s", lp->name);
		apply_section(&st, SECTION_POOL, what, lp, &next->pools[j]);
	}
	for (size_t j = 0; j < next->npools; j++)
		if (!config_find_pool(live, next->pools[j].name)) {
			snprintf(what, sizeof(what), "[pool %s]: a new pool", next->pools[j].name);
			if (report)
				report(ctx, false, what);
		}
	return st.applied;
}

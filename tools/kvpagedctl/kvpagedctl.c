/* SPDX-License-Identifier: MIT */
/*
 * kvpagedctl: the operator's tool.  Talks to kvpaged's admin socket (same framing as the client
 * socket, admin messages); prints human tables, or JSON with --json for scripts.
 */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <json-c/json.h>

#include "proto/frame.h"
#include "proto/kvpaged.pb-c.h"
#include "daemon/core/cost.h"
#include "tools/kvpagedctl/plan.h"
#include "tools/kvpagedctl/tail.h"

#define DEFAULT_ADMIN_SOCKET "/run/kvpaged/admin.sock"

static bool json;

static void usage(FILE *f)
{
	fputs("usage: kvpagedctl [--socket PATH] [--pool NAME] [--json] COMMAND\n"
	      "\n"
	      "commands:\n"
	      "  status       daemon version, uptime, sessions, requests\n"
	      "  pools        each pool's geometry and block usage\n"
	      "  sessions     connected clients\n"
	      "  sequences    open sequences\n"
	      "  stats        prefix-cache hit rates, per pool and per namespace\n"
	      "  metrics      Prometheus text exposition\n"
	      "  metrics --textfile DIR  write it to DIR/kvpaged.prom, atomically (for\n"
	      "               node_exporter's textfile collector)\n"
	      "  verify       run the full invariant check (exit 1 if anything is wrong)\n"
	      "  drop-cache   free every cached block\n"
	      "  reload       read the configuration file again (as SIGHUP), wait for it, show\n"
	      "               what changed and what needs a restart (exit 1 if it did not load)\n"
	      "  plan ...     the cost model's arithmetic (prefix, swa, swap); needs no daemon\n"
	      "  plan pool NAME  the cost model with a running pool's parameters and decisions\n"
	      "  events [--curve-key FILE] [--count N]\n"
	      "               a live tail of a pool's KV event stream (--pool: which, when\n"
	      "               more than one has one), decoded; --json: a batch a line;\n"
	      "               --curve-key: this client's CURVE secret key for a tcp:// stream\n"
	      "\n"
	      "The admin socket is $KVPAGED_ADMIN_SOCKET or " DEFAULT_ADMIN_SOCKET ".\n",
	      f);
}

static int connect_admin(const char *path)
{
	int fd = kvp_unix_connect(path);

	if (fd < 0) {
		fprintf(stderr, "kvpagedctl: cannot connect to %s: %s\n", path, strerror(-fd));
		return -1;
	}
	return fd;
}

/* The value eviction policy's learned state (docs/policy.md). */
static json_object *eviction_json(const Kvpaged__V1__EvictionPolicy *e)
{
	json_object *y = json_object_new_object(), *ca = json_object_new_array();

	json_object_object_add(y, "horizon_s", json_object_new_double(e->horizon_s));
	json_object_object_add(y, "records", json_object_new_int64((int64_t)e->records));
	json_object_object_add(y, "extensions", json_object_new_int64((int64_t)e->extensions));
	json_object_object_add(y, "shares", json_object_new_int64((int64_t)e->shares));
	json_object_object_add(y, "decisions", json_object_new_int64((int64_t)e->decisions));
	json_object_object_add(y, "passed_over", json_object_new_int64((int64_t)e->passed_over));
	json_object_object_add(y, "lru_fallbacks",
			       json_object_new_int64((int64_t)e->lru_fallbacks));
	json_object_object_add(y, "parent_first", json_object_new_int64((int64_t)e->parent_first));
	for (size_t i = 0; i < e->n_classes; i++) {
		const Kvpaged__V1__EvictionClass *c = e->classes[i];
		json_object *z = json_object_new_object();

		json_object_object_add(z, "class", json_object_new_string(c->name));
		json_object_object_add(z, "cached_blocks", json_object_new_int64(c->cached_blocks));
		json_object_object_add(z, "samples", json_object_new_double(c->samples));
		json_object_object_add(z, "reuses", json_object_new_double(c->reuses));
		json_object_object_add(z, "p_reuse", json_object_new_double(c->p_reuse));
		json_object_object_add(z, "median_reuse_s", json_object_new_double(c->median_reuse_s));
		json_object_object_add(z, "density", json_object_new_double(c->density));
		json_object_array_add(ca, z);
	}
	json_object_object_add(y, "classes", ca);
	return y;
}

/* The classes that hold blocks or have been seen, one line each. */
static void print_eviction(const char *pool, const Kvpaged__V1__EvictionPolicy *e)
{
	printf("\n%s: eviction by value: horizon %.3g s; %" PRIu64 " records (%" PRIu64
	       " extended an earlier chain, %" PRIu64 " shared one); %" PRIu64 " victims, %" PRIu64
	       " heads passed over (cached children), %" PRIu64 " LRU fallbacks\n",
	       pool, e->horizon_s, e->records, e->extensions, e->shares, e->decisions,
	       e->passed_over, e->lru_fallbacks);
	printf("  %-14s %8s %9s %8s %8s %12s %10s\n", "class", "cached", "samples", "reuses",
	       "p_reuse", "median_reuse", "density");
	for (size_t i = 0; i < e->n_classes; i++) {
		const Kvpaged__V1__EvictionClass *c = e->classes[i];

		if (!c->cached_blocks && c->samples < 0.5)
			continue;
		printf("  %-14s %8u %9.1f %8.1f %8.3f %10.3g s %10.3g\n", c->name, c->cached_blocks,
		       c->samples, c->reuses, c->p_reuse, c->median_reuse_s, c->density);
	}
}

/*
 * kvpagedctl events: the endpoint (and CURVE server key) from the pool's stats, then a tail
 * until interrupted or count batches.
 */
static int cmd_events(int fd, const char *pool, const char *key_file, unsigned long count);

/* Sends one admin request and returns the unpacked reply, or NULL after printing why. */
static ProtobufCMessage *request(int fd, uint16_t type, const char *pool,
				 const ProtobufCMessageDescriptor *desc)
{
	Kvpaged__V1__AdminRequest req = KVPAGED__V1__ADMIN_REQUEST__INIT;
	struct kvp_frame_header h;
	ProtobufCMessage *m = NULL;
	uint8_t *payload;
	unsigned nfds;
	int r;

	req.pool = (char *)(pool ? pool : "");
	r = kvp_frame_send(fd, type, 1, &req.base, NULL, 0);
	/* A daemon that refused us (EACCES, its admin slots full) said why before hanging up. */
	if (r == 0 || r == -EPIPE || r == -ECONNRESET)
		r = kvp_frame_recv(fd, 256u << 20, &h, &payload, NULL, 0, &nfds);
	if (r < 0) {
		fprintf(stderr, "kvpagedctl: %s\n",
			r == -ECONNRESET ? "the daemon closed the connection" : strerror(-r));
		return NULL;
	}
	if (h.type == KVPAGED__V1__MESSAGE_TYPE__ERROR) {
		Kvpaged__V1__Error *e = kvpaged__v1__error__unpack(NULL, h.len, payload);

		fprintf(stderr, "kvpagedctl: %s\n", e ? e->message : "malformed error");
		if (e)
			kvpaged__v1__error__free_unpacked(e, NULL);
	} else if (h.type != type + KVP_REPLY_OFFSET ||
		   !(m = protobuf_c_message_unpack(desc, NULL, h.len, payload))) {
		fprintf(stderr, "kvpagedctl: unexpected reply from the daemon\n");
	}
	free(payload);
	return m;
}

static void jadd_u(json_object *o, const char *k, uint64_t v)
{
	json_object_object_add(o, k, json_object_new_int64((int64_t)v));
}

static void jadd_s(json_object *o, const char *k, const char *v)
{
	json_object_object_add(o, k, json_object_new_string(v ? v : ""));
}

static void print_json(json_object *o)
{
	puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
					    JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(o);
}

static double ratio(uint64_t num, uint64_t den)
{
	return den ? (double)num / (double)den : 0.0;
}

/* A count by reason as an object: {"absent": 3, "late": 0, ...}. */
static json_object *counts_json(Kvpaged__V1__RemoteCount **c, size_t n)
{
	json_object *o = json_object_new_object();

	for (size_t i = 0; i < n; i++)
		jadd_u(o, c[i]->reason, c[i]->count);
	return o;
}

static uint64_t counts_sum(Kvpaged__V1__RemoteCount **c, size_t n)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < n; i++)
		sum += c[i]->count;
	return sum;
}

/* The remote tier as both pools and stats show it with --json. */
static json_object *remote_json(const Kvpaged__V1__RemoteTier *r)
{
	json_object *o = json_object_new_object(), *nodes = json_object_new_array();

	for (size_t i = 0; i < r->n_nodes; i++) {
		const Kvpaged__V1__RemoteNode *n = r->nodes[i];
		json_object *y = json_object_new_object();

		jadd_s(y, "addr", n->addr);
		jadd_s(y, "state", n->state);
		jadd_u(y, "slots", n->slots);
		jadd_u(y, "commands", n->commands);
		jadd_u(y, "errors", n->errors);
		jadd_u(y, "bytes_in", n->bytes_in);
		jadd_u(y, "bytes_out", n->bytes_out);
		jadd_u(y, "connects", n->connects);
		jadd_u(y, "failures", n->failures);
		json_object_array_add(nodes, y);
	}
	json_object_object_add(o, "nodes", nodes);
	json_object_object_add(o, "bandwidth", json_object_new_double(r->bandwidth));
	json_object_object_add(o, "promotes", json_object_new_boolean(r->promotes));
	jadd_u(o, "inflight", r->inflight);
	jadd_u(o, "local_sessions", r->local_sessions);
	jadd_u(o, "fetches", r->fetches);
	jadd_u(o, "fetches_busy", r->fetches_busy);
	jadd_u(o, "hits", r->hits);
	json_object_object_add(o, "misses", counts_json(r->misses, r->n_misses));
	json_object_object_add(o, "verify_failures",
			       counts_json(r->verify_failures, r->n_verify_failures));
	jadd_u(o, "stores_ok", r->stores_ok);
	jadd_u(o, "stores_dropped", r->stores_dropped);
	jadd_u(o, "stores_failed", r->stores_failed);
	jadd_u(o, "bytes_in", r->bytes_in);
	jadd_u(o, "bytes_out", r->bytes_out);
	jadd_u(o, "latency_p50_ns", r->latency_p50_ns);
	jadd_u(o, "latency_p99_ns", r->latency_p99_ns);
	jadd_u(o, "probes", r->probes);
	jadd_u(o, "published", r->published);
	return o;
}

/* "absent 3, verify 1 (tag 1)": the reasons that counted something; "none" otherwise. */
static void print_counts(Kvpaged__V1__RemoteCount **c, size_t n,
			 Kvpaged__V1__RemoteCount **verify, size_t nverify)
{
	bool first = true;

	for (size_t i = 0; i < n; i++) {
		if (!c[i]->count)
			continue;
		printf("%s%s %" PRIu64, first ? "" : ", ", c[i]->reason, c[i]->count);
		first = false;
		if (!verify || strcmp(c[i]->reason, "verify"))
			continue;
		printf(" (");
		for (size_t k = 0, shown = 0; k < nverify; k++)
			if (verify[k]->count)
				printf("%s%s %" PRIu64, shown++ ? ", " : "", verify[k]->reason,
				       verify[k]->count);
		printf(")");
	}
	if (first)
		printf("none");
}

static void print_remote_nodes(const Kvpaged__V1__RemoteTier *r, const char *indent)
{
	if (!r->n_nodes)
		printf("%sremote node   none known yet\n", indent);
	for (size_t i = 0; i < r->n_nodes; i++) {
		const Kvpaged__V1__RemoteNode *n = r->nodes[i];

		printf("%sremote node   %s: %s, %u slots, %" PRIu64 " commands, %" PRIu64
		       " errors, %" PRIu64 " connects, %" PRIu64 " failures\n", indent, n->addr,
		       n->state, n->slots, n->commands, n->errors, n->connects, n->failures);
	}
}

/* The cost model's bandwidth in words. */
static void print_bandwidth(double bw)
{
	if (bw > 0)
		printf("%.3f GB/s", bw / 1e9);
	else
		printf("not known yet");
}

static int cmd_status(int fd, const char *pool)
{
	Kvpaged__V1__Status *st = (Kvpaged__V1__Status *)request(
		fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_STATUS, pool, &kvpaged__v1__status__descriptor);
	Kvpaged__V1__Pools *ps;

	if (!st)
		return 1;
	ps = (Kvpaged__V1__Pools *)request(fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_POOLS, pool,
					   &kvpaged__v1__pools__descriptor);
	if (!ps) {
		kvpaged__v1__status__free_unpacked(st, NULL);
		return 1;
	}
	if (json) {
		json_object *o = json_object_new_object(), *arr = json_object_new_array();

		jadd_s(o, "version", st->version);
		jadd_u(o, "pid", st->pid);
		jadd_u(o, "uptime_ms", st->uptime_ms);
		jadd_u(o, "sessions", st->sessions);
		jadd_u(o, "admin_sessions", st->admin_sessions);
		jadd_u(o, "requests", st->requests);
		jadd_u(o, "client_bytes", st->client_bytes);
		jadd_u(o, "fds", st->fds);
		jadd_u(o, "fd_limit", st->fd_limit);
		jadd_u(o, "log_lines_dropped", st->log_lines_dropped);
		json_object *ro = json_object_new_object();
		for (size_t i = 0; i < st->n_refusals; i++)
			jadd_u(ro, st->refusals[i]->reason, st->refusals[i]->count);
		json_object_object_add(o, "refusals", ro);
		for (size_t i = 0; i < ps->n_pools; i++) {
			json_object *p = json_object_new_object();
			Kvpaged__V1__PoolUsage *u = ps->pools[i];

			jadd_s(p, "name", u->description->name);
			jadd_u(p, "capacity_blocks", u->description->capacity_blocks);
			jadd_u(p, "free", u->free);
			jadd_u(p, "cached", u->cached);
			jadd_u(p, "in_use", u->in_use);
			jadd_u(p, "sequences", u->sequences);
			jadd_u(p, "sessions", u->sessions);
			json_object_array_add(arr, p);
		}
		json_object_object_add(o, "pools", arr);
		print_json(o);
	} else {
		char refused[512] = "";
		size_t used = 0;

		printf("kvpaged %s, pid %u, up %.1f s, %u sessions (%u admin), %" PRIu64
		       " requests\n", st->version, st->pid, st->uptime_ms / 1000.0, st->sessions,
		       st->admin_sessions, st->requests);
		printf("clients hold %.1f MiB of daemon memory; %" PRIu64 " of %" PRIu64
		       " file descriptors in use\n", st->client_bytes / 1048576.0, st->fds,
		       st->fd_limit);
		for (size_t i = 0; i < st->n_refusals && used < sizeof(refused); i++) {
			int w;

			if (!st->refusals[i]->count)
				continue;
			w = snprintf(refused + used, sizeof(refused) - used, "%s%" PRIu64 " (%s)",
				     used ? ", " : "", st->refusals[i]->count, st->refusals[i]->reason);
			used += w > 0 ? (size_t)w : 0;
		}
		if (used)
			printf("refused or closed by limits: %s\n", refused);
		if (st->log_lines_dropped)
			printf("log lines dropped by the rate limit: %" PRIu64 "\n",
			       st->log_lines_dropped);
		printf("%-16s %10s %10s %10s %10s %8s %9s\n", "POOL", "CAPACITY", "IN_USE", "CACHED",
		       "FREE", "SEQS", "SESSIONS");
		for (size_t i = 0; i < ps->n_pools; i++) {
			Kvpaged__V1__PoolUsage *u = ps->pools[i];

			printf("%-16s %10u %10u %10u %10u %8u %9u\n", u->description->name,
			       u->description->capacity_blocks, u->in_use, u->cached, u->free,
			       u->sequences, u->sessions);
		}
	}
	kvpaged__v1__status__free_unpacked(st, NULL);
	kvpaged__v1__pools__free_unpacked(ps, NULL);
	return 0;
}

/*
 * How a pool's file tier does its I/O: "direct" (O_DIRECT on every swap file), "buffered"
 * (the file system refused O_DIRECT), "mixed", or NULL without a file tier.
 */
static const char *file_tier_io(const Kvpaged__V1__PoolUsage *u)
{
	size_t direct = 0;

	for (size_t f = 0; f < u->n_swap_files; f++)
		direct += u->swap_files[f]->direct;
	if (!u->n_swap_files)
		return NULL;
	return direct == u->n_swap_files ? "direct" : direct ? "mixed" : "buffered";
}

/* A pool's ACL in words: "users alice (1000); groups kvpaged (998)", or who may use it. */
static void print_access(const Kvpaged__V1__PoolUsage *u)
{
	printf("  access        ");
	if (!u->n_allow_uids && !u->n_allow_gids) {
		printf("anyone who can connect to the socket\n");
		return;
	}
	if (u->n_allow_uids) {
		printf("users");
		for (size_t i = 0; i < u->n_allow_uids; i++) {
			const struct passwd *pw = getpwuid(u->allow_uids[i]);

			printf("%s %s%s%u%s", i ? "," : "", pw ? pw->pw_name : "", pw ? " (" : "",
			       u->allow_uids[i], pw ? ")" : "");
		}
	}
	if (u->n_allow_gids) {
		printf("%sgroups", u->n_allow_uids ? "; " : "");
		for (size_t i = 0; i < u->n_allow_gids; i++) {
			const struct group *gr = getgrgid(u->allow_gids[i]);

			printf("%s %s%s%u%s", i ? "," : "", gr ? gr->gr_name : "", gr ? " (" : "",
			       u->allow_gids[i], gr ? ")" : "");
		}
	}
	printf(" (and root)\n");
}

static json_object *id_array(const uint32_t *ids, size_t n)
{
	json_object *a = json_object_new_array();

	for (size_t i = 0; i < n; i++)
		json_object_array_add(a, json_object_new_int64(ids[i]));
	return a;
}

static int cmd_pools(int fd, const char *pool)
{
	Kvpaged__V1__Pools *ps = (Kvpaged__V1__Pools *)request(
		fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_POOLS, pool, &kvpaged__v1__pools__descriptor);

	if (!ps)
		return 1;
	if (json) {
		json_object *arr = json_object_new_array();

		for (size_t i = 0; i < ps->n_pools; i++) {
			Kvpaged__V1__PoolUsage *u = ps->pools[i];
			Kvpaged__V1__PoolDescription *d = u->description;
			json_object *p = json_object_new_object();

			jadd_s(p, "name", d->name);
			jadd_s(p, "backend", d->backend);
			jadd_u(p, "layers", d->layers);
			jadd_u(p, "kv_heads", d->kv_heads);
			jadd_u(p, "head_dim", d->head_dim);
			jadd_u(p, "element_bytes", d->element_bytes);
			jadd_u(p, "block_tokens", d->block_tokens);
			jadd_u(p, "capacity_blocks", d->capacity_blocks);
			jadd_u(p, "bytes_per_token", d->bytes_per_token);
			jadd_u(p, "block_bytes", d->block_bytes);
			jadd_u(p, "pool_bytes", d->pool_bytes);
			jadd_u(p, "free", u->free);
			jadd_u(p, "cached", u->cached);
			jadd_u(p, "in_use", u->in_use);
			jadd_u(p, "indexed", u->indexed);
			jadd_u(p, "sequences", u->sequences);
			jadd_u(p, "sessions", u->sessions);
			json_object_object_add(p, "allow_uids", id_array(u->allow_uids, u->n_allow_uids));
			json_object_object_add(p, "allow_gids", id_array(u->allow_gids, u->n_allow_gids));
			if (u->n_swap_files) {
				json_object *files = json_object_new_array();

				jadd_s(p, "file_tier_io", file_tier_io(u));
				for (size_t f = 0; f < u->n_swap_files; f++) {
					json_object *file = json_object_new_object();

					jadd_s(file, "path", u->swap_files[f]->path);
					jadd_s(file, "io", u->swap_files[f]->direct ? "direct" : "buffered");
					json_object_array_add(files, file);
				}
				json_object_object_add(p, "swap_files", files);
			}
			if (u->remote)
				json_object_object_add(p, "remote", remote_json(u->remote));
			json_object_array_add(arr, p);
		}
		print_json(arr);
	} else {
		for (size_t i = 0; i < ps->n_pools; i++) {
			Kvpaged__V1__PoolUsage *u = ps->pools[i];
			Kvpaged__V1__PoolDescription *d = u->description;

			printf("pool %s (%s memory)\n", d->name, d->backend);
			printf("  geometry      %u layers x %u kv heads x %u dims x %u bytes = %" PRIu64
			       " bytes/token\n", d->layers, d->kv_heads, d->head_dim, d->element_bytes,
			       d->bytes_per_token);
			printf("  blocks        %u of %u tokens, %" PRIu64 " bytes each, %" PRIu64
			       " bytes in all\n", d->capacity_blocks, d->block_tokens, d->block_bytes,
			       d->pool_bytes);
			printf("  usage         %u in use, %u cached, %u free (%u findable)\n", u->in_use,
			       u->cached, u->free, u->indexed);
			printf("  clients       %u sessions, %u sequences\n", u->sessions, u->sequences);
			print_access(u);
			for (size_t f = 0; f < u->n_swap_files; f++)
				printf("  swap file     %s: %s\n", u->swap_files[f]->path,
				       u->swap_files[f]->direct
					       ? "direct I/O"
					       : "buffered I/O (the file system refused O_DIRECT)");
			if (u->remote) {
				const Kvpaged__V1__RemoteTier *r = u->remote;

				printf("  remote tier   bandwidth ");
				print_bandwidth(r->bandwidth);
				printf(" (cost model), hits %s; %u blocks in flight, %" PRIu64
				       " sessions kept on this node\n",
				       r->promotes ? "fetched" : "recomputed", r->inflight,
				       r->local_sessions);
				print_remote_nodes(r, "  ");
			}
		}
	}
	kvpaged__v1__pools__free_unpacked(ps, NULL);
	return 0;
}

static int cmd_sessions(int fd, const char *pool)
{
	Kvpaged__V1__Sessions *ss = (Kvpaged__V1__Sessions *)request(
		fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_SESSIONS, pool, &kvpaged__v1__sessions__descriptor);

	if (!ss)
		return 1;
	if (json) {
		json_object *arr = json_object_new_array();

		for (size_t i = 0; i < ss->n_sessions; i++) {
			Kvpaged__V1__SessionInfo *s = ss->sessions[i];
			json_object *o = json_object_new_object();

			jadd_u(o, "id", s->id);
			jadd_s(o, "name", s->client_name);
			jadd_s(o, "pool", s->pool);
			jadd_s(o, "namespace", s->namespace_);
			jadd_u(o, "pid", s->pid);
			jadd_u(o, "uid", s->uid);
			jadd_u(o, "gid", s->gid);
			jadd_u(o, "sequences", s->sequences);
			jadd_u(o, "blocks", s->blocks);
			jadd_u(o, "requests", s->requests);
			json_object_object_add(o, "rings", json_object_new_boolean(s->rings));
			jadd_u(o, "bytes", s->bytes);
			jadd_u(o, "idle_ms", s->idle_ms);
			json_object_array_add(arr, o);
		}
		print_json(arr);
	} else {
		printf("%6s %-20s %-12s %-20s %8s %6s %6s %8s %10s %5s %9s %8s\n", "ID", "NAME",
		       "POOL", "NAMESPACE", "PID", "UID", "SEQS", "BLOCKS", "REQUESTS", "RINGS",
		       "MEMORY", "IDLE");
		for (size_t i = 0; i < ss->n_sessions; i++) {
			Kvpaged__V1__SessionInfo *s = ss->sessions[i];

			printf("%6" PRIu64 " %-20s %-12s %-20s %8u %6u %6u %8u %10" PRIu64
			       " %5s %7.1fMi %7.1fs\n", s->id, s->client_name, s->pool, s->namespace_,
			       s->pid, s->uid, s->sequences, s->blocks, s->requests,
			       s->rings ? "yes" : "no", s->bytes / 1048576.0, s->idle_ms / 1000.0);
		}
	}
	kvpaged__v1__sessions__free_unpacked(ss, NULL);
	return 0;
}

static int cmd_sequences(int fd, const char *pool)
{
	Kvpaged__V1__Sequences *ss = (Kvpaged__V1__Sequences *)request(
		fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_SEQUENCES, pool, &kvpaged__v1__sequences__descriptor);

	if (!ss)
		return 1;
	if (json) {
		json_object *arr = json_object_new_array();

		for (size_t i = 0; i < ss->n_sequences; i++) {
			Kvpaged__V1__SequenceInfo *q = ss->sequences[i];
			json_object *o = json_object_new_object();

			jadd_u(o, "seq", q->seq);
			jadd_u(o, "session", q->session);
			jadd_s(o, "pool", q->pool);
			jadd_u(o, "tokens", q->tokens);
			jadd_u(o, "committed", q->committed);
			jadd_u(o, "blocks", q->blocks);
			jadd_s(o, "retention", q->retention);
			jadd_u(o, "n_sink", q->n_sink);
			jadd_u(o, "recent", q->recent);
			jadd_u(o, "held_blocks", q->held_blocks);
			jadd_u(o, "freed_blocks", q->freed_blocks);
			jadd_u(o, "retained_tokens", q->retained_tokens);
			jadd_u(o, "budget", q->budget);
			jadd_u(o, "granularity", q->granularity);
			json_object_array_add(arr, o);
		}
		print_json(arr);
	} else {
		printf("%20s %8s %-12s %10s %10s %8s %-22s %9s %8s %8s\n", "SEQ", "SESSION",
		       "POOL", "TOKENS", "COMMITTED", "BLOCKS", "RETENTION", "RETAINED", "HELD",
		       "FREED");
		for (size_t i = 0; i < ss->n_sequences; i++) {
			Kvpaged__V1__SequenceInfo *q = ss->sequences[i];
			char ret[40];

			if (!strcmp(q->retention, "sinks"))
				snprintf(ret, sizeof(ret), "sinks %u+%u", q->n_sink, q->recent);
			else if (!strcmp(q->retention, "window"))
				snprintf(ret, sizeof(ret), "window %u", q->recent);
			else if (!strcmp(q->retention, "h2o"))
				snprintf(ret, sizeof(ret), "h2o %u/%u %s", q->recent, q->budget,
					 q->granularity ? "tokens" : "blocks");
			else
				snprintf(ret, sizeof(ret), "%s", q->retention);
			printf("%20" PRIu64 " %8" PRIu64 " %-12s %10u %10u %8u %-22s %9u %8u %8u\n",
			       q->seq, q->session, q->pool, q->tokens, q->committed, q->blocks, ret,
			       q->retained_tokens, q->held_blocks, q->freed_blocks);
		}
	}
	kvpaged__v1__sequences__free_unpacked(ss, NULL);
	return 0;
}

static int cmd_stats(int fd, const char *pool)
{
	Kvpaged__V1__Stats *st = (Kvpaged__V1__Stats *)request(
		fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_STATS, pool, &kvpaged__v1__stats__descriptor);

	if (!st)
		return 1;
	if (json) {
		json_object *o = json_object_new_object(), *pa = json_object_new_array(),
			    *na = json_object_new_array();

		for (size_t i = 0; i < st->n_pools; i++) {
			Kvpaged__V1__PoolStats *p = st->pools[i];
			json_object *x = json_object_new_object();

			jadd_s(x, "pool", p->pool);
			jadd_u(x, "lookups", p->lookups);
			jadd_u(x, "query_blocks", p->query_blocks);
			jadd_u(x, "hit_blocks", p->hit_blocks);
			jadd_u(x, "hit_tokens", p->hit_tokens);
			json_object_object_add(x, "hit_rate",
					       json_object_new_double(ratio(p->hit_blocks, p->query_blocks)));
			jadd_u(x, "miss_blocks", p->miss_blocks);
			jadd_u(x, "collisions", p->collisions);
			jadd_u(x, "evictions", p->evictions);
			jadd_u(x, "cow_copies", p->cow_copies);
			jadd_u(x, "dedup_blocks", p->dedup_blocks);
			jadd_u(x, "commits", p->commits);
			jadd_u(x, "preemptions", p->preemptions);
			jadd_u(x, "dropped_tokens", p->dropped_tokens);
			jadd_u(x, "swaps", p->swaps);
			jadd_u(x, "pruned_blocks", p->pruned_blocks);
			jadd_u(x, "pruned_tokens", p->pruned_tokens);
			jadd_u(x, "compactions", p->compactions);
			jadd_u(x, "queued_ops", p->queued_ops);
			jadd_u(x, "held_replies", p->held_replies);
			jadd_u(x, "loop_waits", p->loop_waits);
			jadd_u(x, "namespaces_folded", p->namespaces_folded);
			json_object *ta = json_object_new_array(), *ra = json_object_new_array();
			for (size_t k = 0; k < p->n_tiers; k++) {
				Kvpaged__V1__TierStats *t = p->tiers[k];
				json_object *y = json_object_new_object();

				jadd_s(y, "tier", t->tier);
				jadd_u(y, "capacity_blocks", t->capacity_blocks);
				jadd_u(y, "used_blocks", t->used_blocks);
				jadd_u(y, "demotions", t->demotions);
				jadd_u(y, "promotions", t->promotions);
				jadd_u(y, "evictions", t->evictions);
				jadd_u(y, "load_errors", t->load_errors);
				jadd_u(y, "store_errors", t->store_errors);
				jadd_u(y, "lost", t->lost);
				jadd_u(y, "skipped", t->skipped);
				jadd_u(y, "bytes_in", t->bytes_in);
				jadd_u(y, "bytes_out", t->bytes_out);
				jadd_u(y, "checksum_errors", t->checksum_errors);
				jadd_u(y, "probes", t->probes);
				jadd_u(y, "misses", t->misses);
				jadd_u(y, "published", t->published);
				json_object_array_add(ta, y);
			}
			for (size_t k = 0; k < p->n_recent_preemptions; k++) {
				Kvpaged__V1__Preemption *e = p->recent_preemptions[k];
				json_object *y = json_object_new_object();

				jadd_u(y, "seq", e->seq);
				jadd_u(y, "priority", e->priority);
				jadd_u(y, "tokens", e->tokens);
				jadd_u(y, "blocks", e->blocks);
				jadd_u(y, "swap_blocks", e->swap_blocks);
				jadd_s(y, "decision", e->decision);
				jadd_s(y, "reason", e->reason);
				jadd_s(y, "tier", e->tier);
				json_object_object_add(y, "swap_ms", json_object_new_double(e->swap_ms));
				json_object_object_add(y, "recompute_ms",
						       json_object_new_double(e->recompute_ms));
				jadd_u(y, "tick", e->tick);
				json_object_array_add(ra, y);
			}
			json_object_object_add(x, "tiers", ta);
			json_object_object_add(x, "recent_preemptions", ra);
			if (p->remote)
				json_object_object_add(x, "remote", remote_json(p->remote));
			if (p->events) {
				const Kvpaged__V1__EventStream *e = p->events;
				json_object *y = json_object_new_object();

				jadd_s(y, "endpoint", e->endpoint);
				jadd_s(y, "replay_endpoint", e->replay_endpoint);
				jadd_s(y, "topic", e->topic);
				jadd_s(y, "format", e->format);
				jadd_u(y, "batches", e->batches);
				jadd_u(y, "events", e->events);
				jadd_u(y, "dropped", e->dropped);
				jadd_u(y, "replays", e->replays);
				jadd_u(y, "next_seq", e->next_seq);
				jadd_u(y, "queued", e->queued);
				jadd_u(y, "namespaces_announced", e->namespaces);
				jadd_u(y, "slow", e->slow);
				jadd_u(y, "refused", e->refused);
				jadd_u(y, "raised", e->raised);
				jadd_u(y, "remote_blocks", e->remote_blocks);
				jadd_u(y, "subscribers", e->subscribers);
				jadd_s(y, "curve_public_key", e->curve_public_key);
				json_object_object_add(x, "events", y);
			}
			jadd_s(x, "eviction", p->eviction ? p->eviction->policy : "lru");
			if (p->eviction)
				json_object_object_add(x, "value_policy", eviction_json(p->eviction));
			json_object_array_add(pa, x);
		}
		for (size_t i = 0; i < st->n_namespaces; i++) {
			Kvpaged__V1__NamespaceStats *n = st->namespaces[i];
			json_object *x = json_object_new_object();

			jadd_s(x, "pool", n->pool);
			jadd_s(x, "namespace", n->namespace_);
			jadd_u(x, "lookups", n->lookups);
			jadd_u(x, "query_blocks", n->query_blocks);
			jadd_u(x, "hit_blocks", n->hit_blocks);
			jadd_u(x, "hit_tokens", n->hit_tokens);
			json_object_object_add(x, "hit_rate",
					       json_object_new_double(ratio(n->hit_blocks, n->query_blocks)));
			jadd_u(x, "sessions", n->sessions);
			jadd_u(x, "sequences", n->sequences);
			jadd_u(x, "blocks", n->blocks);
			jadd_u(x, "bytes", n->bytes);
			json_object_array_add(na, x);
		}
		json_object_object_add(o, "pools", pa);
		json_object_object_add(o, "namespaces", na);
		print_json(o);
	} else {
		printf("%-16s %-24s %9s %24s %12s %10s %10s %8s\n", "POOL", "NAMESPACE", "LOOKUPS",
		       "HIT RATE (hits/blocks)", "HIT_TOKENS", "EVICTIONS", "COLLISIONS", "COW");
		for (size_t i = 0; i < st->n_pools; i++) {
			Kvpaged__V1__PoolStats *p = st->pools[i];
			char hr[64];

			snprintf(hr, sizeof(hr), "%.4f (%" PRIu64 "/%" PRIu64 ")",
				 ratio(p->hit_blocks, p->query_blocks), p->hit_blocks, p->query_blocks);
			printf("%-16s %-24s %9" PRIu64 " %24s %12" PRIu64 " %10" PRIu64 " %10" PRIu64
			       " %8" PRIu64 "\n", p->pool, "(all)", p->lookups, hr, p->hit_tokens,
			       p->evictions, p->collisions, p->cow_copies);
			for (size_t j = 0; j < st->n_namespaces; j++) {
				Kvpaged__V1__NamespaceStats *n = st->namespaces[j];

				if (strcmp(n->pool, p->pool))
					continue;
				snprintf(hr, sizeof(hr), "%.4f (%" PRIu64 "/%" PRIu64 ")",
					 ratio(n->hit_blocks, n->query_blocks), n->hit_blocks,
					 n->query_blocks);
				printf("%-16s %-24s %9" PRIu64 " %24s %12" PRIu64 "\n", "", n->namespace_,
				       n->lookups, hr, n->hit_tokens);
			}
		}
		for (size_t i = 0; i < st->n_pools; i++) {
			Kvpaged__V1__PoolStats *p = st->pools[i];

			if (p->n_tiers)
				printf("\n%-16s %-6s %18s %10s %10s %10s %8s %8s %8s\n", "POOL", "TIER",
				       "USED/CAPACITY", "DEMOTED", "PROMOTED", "EVICTED", "ERRORS",
				       "LOST", "SKIPPED");
			for (size_t k = 0; k < p->n_tiers; k++) {
				Kvpaged__V1__TierStats *t = p->tiers[k];
				char uc[40];

				snprintf(uc, sizeof(uc), "%u/%u", t->used_blocks, t->capacity_blocks);
				printf("%-16s %-6s %18s %10" PRIu64 " %10" PRIu64 " %10" PRIu64
				       " %8" PRIu64 " %8" PRIu64 " %8" PRIu64 "\n", p->pool, t->tier, uc,
				       t->demotions, t->promotions, t->evictions,
				       t->load_errors + t->store_errors, t->lost, t->skipped);
			}
			if (p->remote) {
				const Kvpaged__V1__RemoteTier *r = p->remote;

				printf("\n%s: remote tier: %" PRIu64 " blocks probed, %" PRIu64
				       " hits, %" PRIu64 " misses (", p->pool, r->probes, r->hits,
				       counts_sum(r->misses, r->n_misses));
				print_counts(r->misses, r->n_misses, r->verify_failures,
					     r->n_verify_failures);
				printf(")\n  fetches       %" PRIu64 " (%" PRIu64 " busy), latency p50 "
				       "%.3f ms, p99 %.3f ms, %" PRIu64 " bytes in\n", r->fetches,
				       r->fetches_busy, r->latency_p50_ns / 1e6, r->latency_p99_ns / 1e6,
				       r->bytes_in);
				printf("  stores        %" PRIu64 " published, %" PRIu64 " ok, %" PRIu64
				       " dropped, %" PRIu64 " failed, %" PRIu64 " bytes out\n",
				       r->published, r->stores_ok, r->stores_dropped, r->stores_failed,
				       r->bytes_out);
				printf("  in flight     %u blocks; bandwidth ", r->inflight);
				print_bandwidth(r->bandwidth);
				printf(" (cost model)\n");
				print_remote_nodes(r, "  ");
			}
			if (p->events) {
				const Kvpaged__V1__EventStream *e = p->events;

				printf("\n%s: KV events on %s (%s%s%s): %" PRIu64 " batches, %" PRIu64
				       " events, %" PRIu64 " dropped, %u queued, %" PRIu64
				       " replays; %u namespaces announced; next seq %#" PRIx64 "\n",
				       p->pool, e->endpoint, e->format, *e->topic ? ", topic " : "",
				       e->topic, e->batches, e->events, e->dropped, e->queued,
				       e->replays, e->namespaces, e->next_seq);
				printf("%s: %u subscribers; %" PRIu64 " batches missed by slow ones"
				       "%s%s; %" PRIu64 " refused\n", p->pool, e->subscribers, e->slow,
				       *e->curve_public_key ? "; CURVE, server key " : "",
				       e->curve_public_key, e->refused);
				printf("%s: %u remote tier blocks announced; the publisher raised %" PRIu64
				       " times (behind)\n", p->pool, e->remote_blocks, e->raised);
			}
			if (p->eviction)
				print_eviction(p->pool, p->eviction);
			if (p->namespaces_folded)
				printf("\n%s: %" PRIu64 " namespaces no session used any more are "
				       "counted together as (other) (max_namespaces_per_uid)\n", p->pool,
				       p->namespaces_folded);
			if (p->held_replies || p->loop_waits)
				printf("\n%s: %" PRIu64 " copies and moves queued on the backend; %" PRIu64
				       " replies waited for them, the loop %" PRIu64 " times\n", p->pool,
				       p->queued_ops, p->held_replies, p->loop_waits);
			if (p->pruned_tokens)
				printf("\n%s: %" PRIu64 " tokens released by retention policies (%" PRIu64
				       " blocks), %" PRIu64 " tokens compacted\n", p->pool,
				       p->pruned_tokens, p->pruned_blocks, p->compactions);
			if (p->preemptions)
				printf("\n%s: %" PRIu64 " preemptions (%" PRIu64 " swapped, %" PRIu64
				       " dropped); the latest:\n", p->pool, p->preemptions, p->swaps,
				       p->preemptions - p->swaps);
			for (size_t k = 0; k < p->n_recent_preemptions && k < 8; k++) {
				Kvpaged__V1__Preemption *e = p->recent_preemptions[k];

				printf("  seq %" PRIu64 " (priority %u, %u tokens, %u blocks): %s",
				       e->seq, e->priority, e->tokens, e->blocks, e->decision);
				if (!strcmp(e->decision, "swap"))
					printf(" %u blocks to %s", e->swap_blocks, e->tier);
				printf(": %s", e->reason);
				if (e->swap_ms > 0 || e->recompute_ms > 0)
					printf(" (%.3f ms vs %.3f ms)", e->swap_ms, e->recompute_ms);
				putchar('\n');
			}
		}
	}
	kvpaged__v1__stats__free_unpacked(st, NULL);
	return 0;
}

/* The file node_exporter's textfile collector reads: it reads only names ending in .prom. */
#define TEXTFILE_NAME "kvpaged.prom"

/* --textfile DIR: DIR must be a directory we can write in, checked before asking the daemon. */
static int check_textfile_dir(const char *dir)
{
	struct stat st;

	if (stat(dir, &st) < 0) {
		fprintf(stderr, "kvpagedctl: --textfile %s: %s\n", dir, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		fprintf(stderr, "kvpagedctl: --textfile %s: not a directory\n", dir);
		return -1;
	}
	if (access(dir, W_OK | X_OK) < 0) {
		fprintf(stderr, "kvpagedctl: --textfile %s: cannot write there: %s\n", dir,
			strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * Writes text to DIR/kvpaged.prom so that a reader sees the old file or the new one, never
 * half of one: a temporary file in DIR (a name without .prom, which the collector skips),
 * synced, then renamed over it, and the directory synced so the rename lasts a crash.
 */
static int write_textfile(const char *dir, const char *text)
{
	size_t len = strlen(text), off = 0;
	char tmp[PATH_MAX], final[PATH_MAX];
	int fd, dfd, saved;

	if ((size_t)snprintf(final, sizeof(final), "%s/%s", dir, TEXTFILE_NAME) >= sizeof(final) ||
	    (size_t)snprintf(tmp, sizeof(tmp), "%s/.%s.XXXXXX", dir, TEXTFILE_NAME) >= sizeof(tmp)) {
		fprintf(stderr, "kvpagedctl: --textfile %s: path too long\n", dir);
		return -1;
	}
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "kvpagedctl: cannot create a file in %s: %s\n", dir, strerror(errno));
		return -1;
	}
	/* mkostemp makes it 0600; node_exporter runs as a user of its own. */
	if (fchmod(fd, 0644) < 0)
		goto fail;
	while (off < len) {
		ssize_t n = write(fd, text + off, len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			goto fail;
		off += (size_t)n;
	}
	if (fsync(fd) < 0 || close(fd) < 0) {
		fd = -1;
		goto fail;
	}
	fd = -1;
	if (rename(tmp, final) < 0)
		goto fail;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		(void)fsync(dfd); /* the new file is in place either way; this makes it last */
		close(dfd);
	}
	return 0;
fail:
	saved = errno;
	fprintf(stderr, "kvpagedctl: cannot write %s: %s\n", final, strerror(saved));
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	return -1;
}

static const char *textfile_dir; /* metrics --textfile DIR */

static int cmd_metrics(int fd, const char *pool)
{
	Kvpaged__V1__Metrics *m = (Kvpaged__V1__Metrics *)request(
		fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_METRICS, pool, &kvpaged__v1__metrics__descriptor);

	if (!m)
		return 1;
	if (textfile_dir) {
		int r = write_textfile(textfile_dir, m->text);

		kvpaged__v1__metrics__free_unpacked(m, NULL);
		return r < 0 ? 1 : 0;
	}
	if (json) {
		json_object *o = json_object_new_object();

		jadd_s(o, "text", m->text);
		print_json(o);
	} else {
		fputs(m->text, stdout);
	}
	kvpaged__v1__metrics__free_unpacked(m, NULL);
	return 0;
}

static int cmd_verify(int fd, const char *pool)
{
	Kvpaged__V1__VerifyReply *v = (Kvpaged__V1__VerifyReply *)request(
		fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_VERIFY, pool, &kvpaged__v1__verify_reply__descriptor);
	int r;

	if (!v)
		return 1;
	r = v->n_problems ? 1 : 0;
	if (json) {
		json_object *o = json_object_new_object(), *arr = json_object_new_array();

		for (size_t i = 0; i < v->n_problems; i++)
			json_object_array_add(arr, json_object_new_string(v->problems[i]));
		json_object_object_add(o, "ok", json_object_new_boolean(!r));
		json_object_object_add(o, "problems", arr);
		print_json(o);
	} else if (r) {
		for (size_t i = 0; i < v->n_problems; i++)
			printf("FAILED: %s\n", v->problems[i]);
	} else {
		puts("ok: every invariant holds");
	}
	kvpaged__v1__verify_reply__free_unpacked(v, NULL);
	return r;
}

static int cmd_drop_cache(int fd, const char *pool)
{
	Kvpaged__V1__DropCacheReply *d = (Kvpaged__V1__DropCacheReply *)request(
		fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_DROP_CACHE, pool,
		&kvpaged__v1__drop_cache_reply__descriptor);

	if (!d)
		return 1;
	if (json) {
		json_object *o = json_object_new_object();

		jadd_u(o, "freed_blocks", d->freed_blocks);
		print_json(o);
	} else {
		printf("freed %u cached blocks\n", d->freed_blocks);
	}
	kvpaged__v1__drop_cache_reply__free_unpacked(d, NULL);
	return 0;
}

static int cmd_reload(int fd, const char *pool)
{
	Kvpaged__V1__ReloadReply *r = (Kvpaged__V1__ReloadReply *)request(
		fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_RELOAD, pool,
		&kvpaged__v1__reload_reply__descriptor);

	/* request() said why: the file did not load (nothing changed), or no daemon. */
	if (!r)
		return 1;
	if (json) {
		json_object *o = json_object_new_object(), *a = json_object_new_array(),
			    *f = json_object_new_array();

		for (size_t i = 0; i < r->n_applied; i++)
			json_object_array_add(a, json_object_new_string(r->applied[i]));
		for (size_t i = 0; i < r->n_refused; i++)
			json_object_array_add(f, json_object_new_string(r->refused[i]));
		json_object_object_add(o, "applied", a);
		json_object_object_add(o, "needs_restart", f);
		print_json(o);
	} else {
		for (size_t i = 0; i < r->n_applied; i++)
			printf("applied: %s\n", r->applied[i]);
		for (size_t i = 0; i < r->n_refused; i++)
			printf("needs a restart: %s (the running value stays)\n", r->refused[i]);
		printf("reloaded: %zu changes applied, %zu need a restart\n", r->n_applied,
		       r->n_refused);
	}
	kvpaged__v1__reload_reply__free_unpacked(r, NULL);
	return 0;
}

static void plan_tier_line(const char *tier, uint32_t blocks, double bw, bool promotes,
			   double block_bytes, double recompute_ms)
{
	if (!blocks) {
		printf("  %-5s tier: none\n", tier);
		return;
	}
	if (bw <= 0) {
		printf("  %-5s tier: %u blocks; bandwidth unknown: hits are promoted, victims "
		       "swapped (a transfer loses no work)\n", tier, blocks);
		return;
	}
	if (recompute_ms < 0) {
		/* The daemon promotes and swaps then: a transfer loses no work. */
		printf("  %-5s tier: %u blocks at %.2f GB/s: %.3f ms per block back, recompute "
		       "unknown: %s\n", tier, blocks, bw / 1e9, block_bytes / bw * 1e3,
		       promotes ? "promote hits, swap victims" : "recompute hits, drop victims");
		return;
	}
	printf("  %-5s tier: %u blocks at %.2f GB/s: %.3f ms per block back, %s recompute (%.3f "
	       "ms): %s\n", tier, blocks, bw / 1e9, block_bytes / bw * 1e3,
	       block_bytes / bw * 1e3 <= recompute_ms ? "<=" : ">", recompute_ms,
	       promotes ? "promote hits, swap victims" : "recompute hits, drop victims");
}

/* kvpagedctl plan pool NAME: the cost model with a running pool's parameters. */
static int cmd_plan_pool(int fd, const char *name)
{
	Kvpaged__V1__Pools *ps = (Kvpaged__V1__Pools *)request(
		fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_POOLS, name, &kvpaged__v1__pools__descriptor);
	Kvpaged__V1__PoolDescription *d;
	double recompute_ms = -1;

	if (!ps)
		return 1;
	if (ps->n_pools != 1) {
		fprintf(stderr, "kvpagedctl: no pool named '%s'\n", name);
		kvpaged__v1__pools__free_unpacked(ps, NULL);
		return 1;
	}
	d = ps->pools[0]->description;
	if (d->model_params > 0 && d->engine_flops > 0)
		recompute_ms = cost_recompute_s(d->model_params, d->block_tokens, d->engine_flops) * 1e3;
	if (json) {
		json_object *o = json_object_new_object();

		jadd_s(o, "pool", d->name);
		jadd_u(o, "bytes_per_token", d->bytes_per_token);
		jadd_u(o, "block_tokens", d->block_tokens);
		jadd_u(o, "block_bytes", d->block_bytes);
		jadd_u(o, "capacity_blocks", d->capacity_blocks);
		json_object_object_add(o, "model_params", json_object_new_double(d->model_params));
		json_object_object_add(o, "engine_flops", json_object_new_double(d->engine_flops));
		if (recompute_ms >= 0)
			json_object_object_add(o, "recompute_ms_per_block",
					       json_object_new_double(recompute_ms));
		for (int t = 0; t < 2; t++) {
			json_object *y = json_object_new_object();
			uint32_t blocks = t ? d->file_tier_blocks : d->host_tier_blocks;
			double bw = t ? d->file_tier_bandwidth : d->host_tier_bandwidth;

			jadd_u(y, "blocks", blocks);
			json_object_object_add(y, "bandwidth", json_object_new_double(bw));
			if (bw > 0)
				json_object_object_add(y, "transfer_ms_per_block",
						       json_object_new_double((double)d->block_bytes / bw * 1e3));
			json_object_object_add(y, "promotes",
					       json_object_new_boolean(t ? d->file_tier_promotes
									 : d->host_tier_promotes));
			json_object_object_add(o, t ? "file_tier" : "host_tier", y);
		}
		json_object_object_add(o, "file_tier_persist",
				       json_object_new_boolean(d->file_tier_persist));
		print_json(o);
	} else {
		printf("pool %s: %" PRIu64 " bytes per token, %u tokens per block, %" PRIu64
		       " bytes per block, %u blocks (%.3f GiB)\n", d->name, d->bytes_per_token,
		       d->block_tokens, d->block_bytes, d->capacity_blocks,
		       (double)d->pool_bytes / (1u << 30));
		if (recompute_ms >= 0)
			printf("  recompute: 2 * %.4g params * %u tokens / %.4g FLOP/s = %.3f ms per "
			       "block\n", d->model_params, d->block_tokens, d->engine_flops,
			       recompute_ms);
		else
			printf("  recompute: unknown (set model_params and engine_flops)\n");
		plan_tier_line("host", d->host_tier_blocks, d->host_tier_bandwidth,
			       d->host_tier_promotes, (double)d->block_bytes, recompute_ms);
		plan_tier_line("file", d->file_tier_blocks, d->file_tier_bandwidth,
			       d->file_tier_promotes, (double)d->block_bytes, recompute_ms);
		if (d->file_tier_blocks)
			printf("  file tier persistence: %s\n", d->file_tier_persist ? "on" : "off");
	}
	kvpaged__v1__pools__free_unpacked(ps, NULL);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "pool", required_argument, NULL, 'p' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	static const struct {
		const char *name;
		int (*fn)(int fd, const char *pool);
	} cmds[] = {
		{ "status", cmd_status },	  { "pools", cmd_pools },     { "sessions", cmd_sessions },
		{ "sequences", cmd_sequences }, { "stats", cmd_stats },     { "metrics", cmd_metrics },
		{ "verify", cmd_verify },	  { "drop-cache", cmd_drop_cache },
		{ "reload", cmd_reload },
	};
	const char *path = getenv("KVPAGED_ADMIN_SOCKET"), *pool = NULL;
	int opt, fd, r;

	if (!path || !*path)
		path = DEFAULT_ADMIN_SOCKET;
	/* "+": stop at the command, whose own options follow it. */
	while ((opt = getopt_long(argc, argv, "+s:p:jh", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			path = optarg;
			break;
		case 'p':
			pool = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind + 4 == argc && !strcmp(argv[argc - 1], "--json")) {
		json = true;
		argc--;
	}
	if (optind + 3 == argc && !strcmp(argv[optind], "plan") && !strcmp(argv[optind + 1], "pool")) {
		fd = connect_admin(path);
		if (fd < 0)
			return 1;
		r = cmd_plan_pool(fd, argv[optind + 2]);
		close(fd);
		return r;
	}
	if (optind < argc && !strcmp(argv[optind], "plan"))
		return cmd_plan(argc - optind, argv + optind);
	if (optind < argc && !strcmp(argv[optind], "events")) {
		static const struct option eopts[] = {
			{ "curve-key", required_argument, NULL, 'k' },
			{ "count", required_argument, NULL, 'n' },
			{ "json", no_argument, NULL, 'j' },
			{}
		};
		const char *key_file = NULL;
		unsigned long count = 0;
		char *end;

		optind++;
		while ((opt = getopt_long(argc, argv, "k:n:j", eopts, NULL)) != -1) {
			if (opt == 'k') {
				key_file = optarg;
			} else if (opt == 'j') {
				json = true;
			} else if (opt == 'n') {
				errno = 0;
				count = strtoul(optarg, &end, 10);
				if (errno || !*optarg || *end || *optarg == '-') {
					fprintf(stderr, "kvpagedctl: events --count: '%s' is not a "
							"number of batches\n",
						optarg);
					return 2;
				}
			} else {
				usage(stderr);
				return 2;
			}
		}
		if (optind != argc) {
			usage(stderr);
			return 2;
		}
		fd = connect_admin(path);
		if (fd < 0)
			return 1;
		return cmd_events(fd, pool, key_file, count);
	}
	if (optind + 1 < argc && !strcmp(argv[optind], "metrics") &&
	    !strncmp(argv[optind + 1], "--textfile", 10)) {
		const char *arg = argv[optind + 1] + 10;

		if (*arg == '=' && optind + 2 == argc)
			textfile_dir = arg + 1;
		else if (!*arg && optind + 3 == argc)
			textfile_dir = argv[optind + 2];
		if (!textfile_dir || !*textfile_dir) {
			fprintf(stderr, "kvpagedctl: metrics --textfile needs a directory\n");
			return 2;
		}
		if (check_textfile_dir(textfile_dir) < 0)
			return 1;
		argc = optind + 1;
	}
	if (optind + 1 != argc) {
		usage(stderr);
		return 2;
	}
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		if (strcmp(argv[optind], cmds[i].name))
			continue;
		fd = connect_admin(path);
		if (fd < 0)
			return 1;
		r = cmds[i].fn(fd, pool);
		close(fd);
		return r;
	}
	fprintf(stderr, "kvpagedctl: unknown command '%s'\n", argv[optind]);
	usage(stderr);
	return 2;
}

static int cmd_events(int fd, const char *pool, const char *key_file, unsigned long count)
{
	Kvpaged__V1__Stats *st = (Kvpaged__V1__Stats *)request(
		fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_STATS, pool, &kvpaged__v1__stats__descriptor);
	const Kvpaged__V1__EventStream *es = NULL;
	char endpoint[1024], server_key[64];
	size_t with = 0;

	close(fd);
	if (!st)
		return 1;
	for (size_t i = 0; i < st->n_pools; i++) {
		if (!st->pools[i]->events)
			continue;
		with++;
		if (!es)
			es = st->pools[i]->events;
	}
	if (!with || (with > 1 && !pool)) {
		fprintf(stderr, "kvpagedctl: %s\n",
			!with ? (pool ? "that pool has no event stream (events_endpoint)"
				      : "no pool has an event stream (events_endpoint)")
			      : "more than one pool has an event stream: say which with --pool");
		kvpaged__v1__stats__free_unpacked(st, NULL);
		return 1;
	}
	snprintf(endpoint, sizeof(endpoint), "%s", es->endpoint);
	snprintf(server_key, sizeof(server_key), "%s", es->curve_public_key);
	kvpaged__v1__stats__free_unpacked(st, NULL);
	return events_tail(endpoint, server_key, key_file, count, json);
}

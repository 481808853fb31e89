/* SPDX-License-Identifier: MIT */
/*
 * The client socket's messages: the Hello/Welcome handshake (credentials, pool ACL,
 * namespace, rings), then every sequence operation.  A malformed message closes the session
 * after an error reply; a refused operation only gets the error.
 */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "daemon/log.h"
#include "daemon/server/server.h"
#include "proto/kvpaged.pb-c.h"

/* Open.retention is handed to the core as it comes. */
_Static_assert(CORE_RETAIN_FULL == KVP_PROTO_RETAIN_FULL, "retention: full");
_Static_assert(CORE_RETAIN_SINKS == KVP_PROTO_RETAIN_SINKS, "retention: sinks");
_Static_assert(CORE_RETAIN_H2O == KVP_PROTO_RETAIN_H2O, "retention: h2o");

#define NAMESPACE_MAX 64
#define CLIENT_NAME_MAX 63
#define POOL_NAME_MAX 63 /* as the configuration allows */
/* A ring's data area holds at least one page of token ids and tables. */
#define RING_MIN_DATA_BYTES 4096u

static bool printable(const char *s, size_t max)
{
	size_t n = 0;

	for (; *s; s++, n++)
		if (n >= max || *s < 0x20 || *s > 0x7e)
			return false;
	return true;
}

static bool id_in(uint32_t id, const uint32_t *list, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (list[i] == id)
			return true;
	return false;
}

/* The pool's ACL against the peer's credentials, supplementary groups included. */
static bool acl_allows(struct session *s, const struct kvpd_pool_config *pc)
{
	gid_t groups[256];
	socklen_t len = sizeof(groups);

	if (pc->n_allow_uids == 0 && pc->n_allow_gids == 0)
		return true;
	if (s->cred.uid == 0 || id_in(s->cred.uid, pc->allow_uids, pc->n_allow_uids) ||
	    id_in(s->cred.gid, pc->allow_gids, pc->n_allow_gids))
		return true;
	if (getsockopt(s->fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
		for (size_t i = 0; i < len / sizeof(gid_t); i++)
			if (id_in(groups[i], pc->allow_gids, pc->n_allow_gids))
				return true;
	return false;
}

/*
 * The namespace comes from the peer's credentials (per the pool's `namespace` mode); the
 * client's string can only narrow it.  The salt is a keyed hash of both, so no string a client
 * sends can produce another credential's salt.
 */
/*
 * The user's (gid false) or group's name of id, when it maps back to id (two local ids with one
 * name would otherwise share a namespace): false when there is none, or it is too long.  From
 * NSS, on the loop: with a directory service, a cache (nscd, sssd) keeps attaches fast.
 */
static bool id_name(uint32_t id, bool gid, char *out, size_t len)
{
	char stack[4096], *buf = stack, *big = NULL;
	size_t size = sizeof(stack);
	bool ok = false;
	int r;

	for (;;) {
		if (gid) {
			struct group gr, *found = NULL, gr2, *back = NULL;

			r = getgrgid_r(id, &gr, buf, size, &found);
			if (r == 0 && found && strlen(found->gr_name) < len) {
				snprintf(out, len, "%s", found->gr_name);
				ok = getgrnam_r(out, &gr2, buf, size, &back) == 0 && back &&
				     back->gr_gid == id;
			}
		} else {
			struct passwd pw, *found = NULL, pw2, *back = NULL;

			r = getpwuid_r(id, &pw, buf, size, &found);
			if (r == 0 && found && strlen(found->pw_name) < len) {
				snprintf(out, len, "%s", found->pw_name);
				ok = getpwnam_r(out, &pw2, buf, size, &back) == 0 && back &&
				     back->pw_uid == id;
			}
		}
		/* A group with many members needs more room: grow, up to 1 MiB. */
		if (r != ERANGE || size >= (1u << 20))
			break;
		size *= 4;
		free(big);
		big = buf = malloc(size);
		if (!buf)
			break;
	}
	free(big);
	return ok;
}

/*
 * The name of a session's namespace on the remote tier, which every node computes alike
 * (docs/remote.md): the pool's name and, for namespace = shared, "shared"; for a uid or gid
 * namespace, the user's or group's name when remote_tier_map_names says so.  Numbers mean
 * nothing on another machine: without a name the namespace stays on this node (false).
 */
static bool remote_name(const struct session *s, const struct kvpd_pool_config *pc,
			const char *narrow, char *out, size_t len)
{
	char name[256];
	int n;

	switch (pc->namespace_mode) {
	case KVPD_NS_SHARED:
		n = snprintf(out, len, "pool:%s/shared%s%s", pc->name, *narrow ? "/" : "", narrow);
		break;
	case KVPD_NS_UID:
	case KVPD_NS_GID:
		if (!pc->remote_tier_map_names ||
		    !id_name(pc->namespace_mode == KVPD_NS_UID ? s->cred.uid : s->cred.gid,
			     pc->namespace_mode == KVPD_NS_GID, name, sizeof(name)))
			return false;
		n = snprintf(out, len, "pool:%s/%s:%s%s%s", pc->name,
			     pc->namespace_mode == KVPD_NS_UID ? "user" : "group", name,
			     *narrow ? "/" : "", narrow);
		break;
	default:
		return false;
	}
	/* Never a name cut short: two long ones would be one. */
	return n > 0 && (size_t)n < len;
}

static void assign_namespace(struct session *s, const struct kvpd_pool_config *pc,
			     const char *narrow)
{
	char key[512];
	int len;

	switch (pc->namespace_mode) {
	case KVPD_NS_UID:
		snprintf(s->ns_name, sizeof(s->ns_name), "uid:%u%s%s", (unsigned)s->cred.uid,
			 *narrow ? "/" : "", narrow);
		break;
	case KVPD_NS_GID:
		snprintf(s->ns_name, sizeof(s->ns_name), "gid:%u%s%s", (unsigned)s->cred.gid,
			 *narrow ? "/" : "", narrow);
		break;
	case KVPD_NS_SHARED:
		snprintf(s->ns_name, sizeof(s->ns_name), "shared%s%s", *narrow ? "/" : "", narrow);
		break;
	}
	len = snprintf(key, sizeof(key), "%s%c%s", pc->name, 0, s->ns_name);
	s->salt = XXH3_64bits_withSeed(key, (size_t)len, pc->namespace_seed);
	/*
	 * A named namespace of the remote tier: its salt from the name and the tier's key, so two
	 * daemons with the same configuration compute the same chain hashes.
	 */
	s->remote_ns = false;
	if (s->pool->remote && remote_name(s, pc, narrow, key, sizeof(key)) &&
	    dpool_remote_salt(s->pool, key, &s->salt) == 0)
		s->remote_ns = true;
	else if (s->pool->remote)
		s->pool->remote_unlocal++;
	/* By its local name, whatever salt it ended with (the remote tier's, for a named one). */
	dpool_events_route(s->pool, s->ns_name, s->salt);
}

/*
 * The newest version both sides speak: the client speaks [min_protocol_version or
 * protocol_version, protocol_version], this daemon [KVP_PROTOCOL_MIN_VERSION,
 * KVP_PROTOCOL_VERSION].  0 when they do not meet (a version 0 Hello, one with no version, never
 * does).
 */
static uint32_t agree_version(const Kvpaged__V1__Hello *hello)
{
	uint32_t newest = hello->protocol_version, oldest = hello->min_protocol_version;

	if (!oldest)
		oldest = newest;
	if (oldest > newest)
		return 0;
	if (newest > KVP_PROTOCOL_VERSION)
		newest = KVP_PROTOCOL_VERSION;
	return newest >= oldest && newest >= KVP_PROTOCOL_MIN_VERSION ? newest : 0;
}

/* Welcome.features: what this daemon, and the pool the session joins, offer. */
static uint64_t session_features(const struct server *srv, const struct dpool *pool)
{
	uint64_t f = KVP_PROTO_FEATURE_RINGS | KVP_PROTO_FEATURE_PARK | KVP_PROTO_FEATURE_SINKS |
		     KVP_PROTO_FEATURE_H2O;

	if (srv->cfg->limits.max_wait_ms)
		f |= KVP_PROTO_FEATURE_WAIT;
	if (pool->cfg->host_tier_blocks)
		f |= KVP_PROTO_FEATURE_HOST_TIER;
	if (pool->cfg->file_tier_blocks)
		f |= KVP_PROTO_FEATURE_FILE_TIER;
	return f;
}

static void on_hello(struct session *s, const struct kvp_frame_header *h, const uint8_t *payload)
{
	const struct kvpd_config *cfg = s->srv->cfg;
	Kvpaged__V1__PoolDescription desc = KVPAGED__V1__POOL_DESCRIPTION__INIT;
	Kvpaged__V1__SessionLimits lim = KVPAGED__V1__SESSION_LIMITS__INIT;
	Kvpaged__V1__Welcome w = KVPAGED__V1__WELCOME__INIT;
	Kvpaged__V1__Hello *hello;
	struct dpool *pool = NULL;
	const char *why = NULL;
	struct ns_stats *ns;
	uint32_t version;
	int fds[4];
	unsigned nfds = 0;
	int r;

	hello = kvpaged__v1__hello__unpack(NULL, h->len, payload);
	if (!hello) {
		session_reply_error(s, h->seq, EPROTO, "malformed Hello");
		session_close(s, "malformed Hello");
		return;
	}
	version = agree_version(hello);
	if (!version) {
		/* Names both ranges, so whoever reads it knows which side to upgrade. */
		session_reply_error(s, h->seq, EPROTONOSUPPORT,
				    "protocol version %u..%u not supported (this daemon speaks %u..%u)",
				    hello->min_protocol_version ? hello->min_protocol_version
								: hello->protocol_version,
				    hello->protocol_version, KVP_PROTOCOL_MIN_VERSION,
				    KVP_PROTOCOL_VERSION);
		session_close(s, "protocol version mismatch");
		goto out;
	}
	/* Strings from the peer are checked before anything repeats them, in a reply or a log. */
	if (!printable(hello->pool, POOL_NAME_MAX) ||
	    !printable(hello->namespace_, NAMESPACE_MAX) ||
	    !printable(hello->client_name, CLIENT_NAME_MAX)) {
		session_reply_error(s, h->seq, EINVAL,
				    "pool (<= %d), namespace (<= %d) and client name (<= %d) must be "
				    "printable ASCII",
				    POOL_NAME_MAX, NAMESPACE_MAX, CLIENT_NAME_MAX);
		session_close(s, "bad pool, namespace or name");
		goto out;
	}
	for (size_t i = 0; i < s->srv->npools; i++)
		if (!*hello->pool || !strcmp(hello->pool, s->srv->pools[i].cfg->name)) {
			pool = &s->srv->pools[i];
			break;
		}
	if (!pool) {
		session_reply_error(s, h->seq, ENOENT, "no pool named '%s'", hello->pool);
		session_close(s, "unknown pool");
		goto out;
	}
	if (!acl_allows(s, pool->cfg)) {
		session_reply_error(s, h->seq, EACCES, "uid %u gid %u may not use pool %s",
				    (unsigned)s->cred.uid, (unsigned)s->cred.gid, pool->cfg->name);
		s->srv->refused[REFUSED_ACL]++;
		log_debug("refused pid %d uid %u: not in pool %s's ACL", (int)s->cred.pid,
			  (unsigned)s->cred.uid, pool->cfg->name);
		session_close(s, "refused by the pool's ACL");
		goto out;
	}
	if (hello->ring_entries > cfg->limits.max_ring_entries ||
	    hello->ring_data_bytes > cfg->limits.max_ring_data_bytes ||
	    (hello->ring_entries & (hello->ring_entries - 1)) ||
	    (hello->ring_entries && hello->ring_data_bytes < RING_MIN_DATA_BYTES)) {
		session_reply_error(s, h->seq, EINVAL,
				    "ring entries must be a power of two <= %u and data %u..%llu bytes",
				    cfg->limits.max_ring_entries, RING_MIN_DATA_BYTES,
				    (unsigned long long)cfg->limits.max_ring_data_bytes);
		session_close(s, "bad ring size");
		goto out;
	}
	s->pool = pool;
	if (*hello->client_name)
		snprintf(s->name, sizeof(s->name), "%s", hello->client_name);
	assign_namespace(s, pool->cfg, hello->namespace_);
	ns = dpool_ns_stats(pool, s->salt, s->ns_name, s->cred.uid);
	if (!ns) {
		session_reply_error(s, h->seq, ENOMEM, "out of memory");
		session_close(s, "out of memory");
		goto out;
	}
	/* Joined past its cap, the session would be held back for good (account_over). */
	if (cfg->limits.max_bytes_per_namespace &&
	    ns->use.bytes + s->bytes > cfg->limits.max_bytes_per_namespace) {
		session_reply_error(s, h->seq, EDQUOT, "namespace %s holds its most memory "
				    "(max_bytes_per_namespace)", s->ns_name);
		session_close(s, "namespace memory cap");
		goto out;
	}
	account_join_ns(s, ns);

	fds[nfds++] = pool->mem.fd;
	if (hello->ring_entries &&
	    account_check(s, ring_bytes(hello->ring_entries, hello->ring_data_bytes), 0, 0, &why) <
		    0) {
		session_reply_error(s, h->seq, EDQUOT, "no memory for rings of that size: %s", why);
		session_close(s, "no memory for rings");
		goto out;
	}
	if (hello->ring_entries) {
		r = ring_setup(s, hello->ring_entries, hello->ring_data_bytes);
		if (r < 0) {
			session_reply_error(s, h->seq, -r, "cannot set up rings");
			session_close(s, "ring setup failed");
			goto out;
		}
		fds[nfds++] = s->ring->mem_fd;
		fds[nfds++] = s->ring->sq_event_fd;
		fds[nfds++] = s->ring->cq_event_fd;
		w.ring_entries = s->ring->entries;
		w.ring_data_bytes = (uint32_t)s->ring->data_bytes;
		w.ring_bytes = s->ring->bytes;
	}
	dpool_describe(pool, &desc);
	lim.max_sequences = cfg->limits.max_sequences;
	lim.max_blocks = cfg->limits.max_blocks ? cfg->limits.max_blocks : pool->cfg->capacity_blocks;
	lim.max_inflight = cfg->limits.max_inflight;
	lim.max_tokens_per_request = cfg->limits.max_tokens_per_request;
	w.protocol_version = version;
	w.min_protocol_version = KVP_PROTOCOL_MIN_VERSION;
	w.max_protocol_version = KVP_PROTOCOL_VERSION;
	w.features = session_features(s->srv, pool);
	w.opcodes = (UINT64_C(1) << KVP_OP_MAX) - 1; /* every opcode of proto/ring.h */
	w.session_id = s->id;
	w.pool = &desc;
	w.limits = &lim;
	w.namespace_ = s->ns_name;
	s->welcomed = true;
	pool->sessions++;
	log_debug("session %llu: %s (pid %d uid %u) joined pool %s as %s%s",
		 (unsigned long long)s->id, s->name, (int)s->cred.pid, (unsigned)s->cred.uid,
		 pool->cfg->name, s->ns_name, s->ring ? " with rings" : "");
	session_reply(s, KVPAGED__V1__MESSAGE_TYPE__WELCOME, h->seq, &w.base, fds, nfds);
out:
	kvpaged__v1__hello__free_unpacked(hello, NULL);
}

/* Replies with the errno of a refused operation and, when there is one, the reason. */
static void reply_refused(struct session *s, uint32_t seq, int r, const char *why, const char *op)
{
	session_reply_error(s, seq, -r, "%s: %s", op, why ? why : strerror(-r));
}

/*
 * What a request's reply needs, whatever its type: the sequence operation's result (lookup's
 * cached tokens too), a sequence's info (seq_info).
 */
struct request_result {
	struct seq_result seq;
	struct core_seq_info info;
};

/*
 * One request type of the client socket.  run does the operation from the unpacked message
 * (a waiting request runs it again, from the same message); a deferred one is completed by
 * loaded instead; reply answers a success.  Refusals are answered alike for every type.
 */
struct request_kind {
	const char *name; /* "malformed <name> message", "<name>: <why>" */
	const ProtobufCMessageDescriptor *descriptor;
	/* 0, or -errno (why may say more); -EINPROGRESS: its loads are deferred (req->load). */
	int (*run)(struct session *s, struct request *req, struct request_result *res,
		   const char **why);
	/* The result of a deferred run once its loads are in (NULL: it never defers). */
	int (*loaded)(struct session *s, struct request *req, struct request_result *res);
	void (*reply)(struct session *s, const struct request *req, struct request_result *res);
	/* The message's wait_ms (NULL: it never waits for memory). */
	uint32_t (*wait_ms)(const ProtobufCMessage *m);
	/* What the unpacked message holds, charged while the request outlives its dispatch. */
	size_t (*bytes)(const ProtobufCMessage *m);
};

#define REPLY(TYPE, msg)                                                                      \
	session_reply_fenced(s, req->fence, KVPAGED__V1__MESSAGE_TYPE__##TYPE, req->seq,      \
			     &(msg).base)

static int run_open(struct session *s, struct request *req, struct request_result *res,
		    const char **why)
{
	const Kvpaged__V1__Open *m = (const Kvpaged__V1__Open *)req->msg;

	if (m->n_tokens > UINT32_MAX)
		return -E2BIG;
	return ops_open(s, m->tokens, (uint32_t)m->n_tokens, m->extra_key, m->flags, m->priority,
			&(struct core_open){ .retention = m->retention, .n_sink = m->n_sink,
					     .recent = m->recent, .budget = m->budget,
					     .decay = m->decay, .granularity = m->granularity },
			&req->load, &res->seq, why);
}

static int loaded_open(struct session *s, struct request *req, struct request_result *res)
{
	return ops_loaded_result(s, &req->load, false, &res->seq);
}

static void reply_open(struct session *s, const struct request *req, struct request_result *res)
{
	Kvpaged__V1__OpenReply rep = KVPAGED__V1__OPEN_REPLY__INIT;

	rep.seq = res->seq.seq;
	rep.cached_tokens = res->seq.cached;
	rep.n_table = res->seq.table_len;
	rep.table = (uint32_t *)res->seq.table;
	REPLY(OPEN_REPLY, rep);
}

static uint32_t wait_ms_open(const ProtobufCMessage *m)
{
	return ((const Kvpaged__V1__Open *)m)->wait_ms;
}

static size_t bytes_open(const ProtobufCMessage *m)
{
	return sizeof(Kvpaged__V1__Open) +
	       ((const Kvpaged__V1__Open *)m)->n_tokens * sizeof(uint32_t);
}

static int run_append(struct session *s, struct request *req, struct request_result *res,
		      const char **why)
{
	const Kvpaged__V1__Append *m = (const Kvpaged__V1__Append *)req->msg;

	if (m->n_tokens > UINT32_MAX)
		return -E2BIG;
	return ops_append(s, m->seq, m->tokens, (uint32_t)m->n_tokens, &res->seq, why);
}

static void reply_append(struct session *s, const struct request *req,
			 struct request_result *res)
{
	Kvpaged__V1__AppendReply rep = KVPAGED__V1__APPEND_REPLY__INIT;

	rep.first_changed = res->seq.first_changed;
	rep.n_table = res->seq.table_len;
	rep.table = (uint32_t *)res->seq.table;
	REPLY(APPEND_REPLY, rep);
}

static uint32_t wait_ms_append(const ProtobufCMessage *m)
{
	return ((const Kvpaged__V1__Append *)m)->wait_ms;
}

static size_t bytes_append(const ProtobufCMessage *m)
{
	return sizeof(Kvpaged__V1__Append) +
	       ((const Kvpaged__V1__Append *)m)->n_tokens * sizeof(uint32_t);
}

static int run_commit(struct session *s, struct request *req, struct request_result *res,
		      const char **why)
{
	const Kvpaged__V1__Commit *m = (const Kvpaged__V1__Commit *)req->msg;

	return ops_commit(s, m->seq, m->tokens, &res->seq, why);
}

static void reply_commit(struct session *s, const struct request *req,
			 struct request_result *res)
{
	Kvpaged__V1__CommitReply rep = KVPAGED__V1__COMMIT_REPLY__INIT;

	rep.replaced = res->seq.replaced;
	rep.released = res->seq.released;
	rep.n_table = res->seq.table_len;
	rep.table = (uint32_t *)res->seq.table;
	REPLY(COMMIT_REPLY, rep);
}

static int run_fork(struct session *s, struct request *req, struct request_result *res,
		    const char **why)
{
	return ops_fork(s, ((const Kvpaged__V1__Fork *)req->msg)->seq, &res->seq, why);
}

static void reply_fork(struct session *s, const struct request *req, struct request_result *res)
{
	Kvpaged__V1__ForkReply rep = KVPAGED__V1__FORK_REPLY__INIT;

	rep.seq = res->seq.seq;
	rep.n_table = res->seq.table_len;
	rep.table = (uint32_t *)res->seq.table;
	REPLY(FORK_REPLY, rep);
}

static int run_close(struct session *s, struct request *req, struct request_result *res,
		     const char **why)
{
	return ops_close(s, ((const Kvpaged__V1__Close *)req->msg)->seq, why);
}

static void reply_close(struct session *s, const struct request *req, struct request_result *res)
{
	Kvpaged__V1__CloseReply rep = KVPAGED__V1__CLOSE_REPLY__INIT;

	REPLY(CLOSE_REPLY, rep);
}

static int run_lookup(struct session *s, struct request *req, struct request_result *res,
		      const char **why)
{
	const Kvpaged__V1__Lookup *m = (const Kvpaged__V1__Lookup *)req->msg;

	if (m->n_tokens > UINT32_MAX)
		return -E2BIG;
	return ops_lookup(s, m->tokens, (uint32_t)m->n_tokens, m->extra_key, m->flags,
			  &res->seq.cached, why);
}

static void reply_lookup(struct session *s, const struct request *req,
			 struct request_result *res)
{
	Kvpaged__V1__LookupReply rep = KVPAGED__V1__LOOKUP_REPLY__INIT;

	rep.cached_tokens = res->seq.cached;
	REPLY(LOOKUP_REPLY, rep);
}

static int run_seq_info(struct session *s, struct request *req, struct request_result *res,
			const char **why)
{
	return ops_info(s, ((const Kvpaged__V1__SeqInfo *)req->msg)->seq, &res->info,
			&res->seq.fence, why);
}

static void reply_seq_info(struct session *s, const struct request *req,
			   struct request_result *res)
{
	Kvpaged__V1__SeqInfoReply rep = KVPAGED__V1__SEQ_INFO_REPLY__INIT;
	const struct core_seq_info *info = &res->info;

	rep.tokens = info->ntokens;
	rep.committed = info->ncommitted;
	rep.state = info->state;
	rep.n_table = info->nblocks;
	rep.table = (uint32_t *)info->table;
	rep.retention = info->retention;
	rep.n_sink = info->n_sink;
	rep.recent = info->recent;
	rep.held_blocks = info->held_blocks;
	rep.freed_blocks = info->freed_blocks;
	rep.budget = info->budget;
	rep.granularity = info->granularity;
	rep.n_packed_table = (info->npacked + s->pool->cfg->block_tokens - 1) /
			     s->pool->cfg->block_tokens;
	rep.packed_table = (uint32_t *)info->packed;
	rep.n_packed_positions = info->npacked;
	rep.packed_positions = (uint32_t *)info->packed_positions;
	REPLY(SEQ_INFO_REPLY, rep);
}

static int run_park(struct session *s, struct request *req, struct request_result *res,
		    const char **why)
{
	return ops_park(s, ((const Kvpaged__V1__Park *)req->msg)->seq, why);
}

static void reply_park(struct session *s, const struct request *req, struct request_result *res)
{
	Kvpaged__V1__ParkReply rep = KVPAGED__V1__PARK_REPLY__INIT;

	REPLY(PARK_REPLY, rep);
}

static int run_scores(struct session *s, struct request *req, struct request_result *res,
		      const char **why)
{
	const Kvpaged__V1__Scores *m = (const Kvpaged__V1__Scores *)req->msg;

	if (m->n_weights > UINT32_MAX)
		return -E2BIG;
	return ops_scores(s, m->seq, m->first, m->weights, (uint32_t)m->n_weights, why);
}

static void reply_scores(struct session *s, const struct request *req,
			 struct request_result *res)
{
	Kvpaged__V1__ScoresReply rep = KVPAGED__V1__SCORES_REPLY__INIT;

	REPLY(SCORES_REPLY, rep);
}

static int run_resume(struct session *s, struct request *req, struct request_result *res,
		      const char **why)
{
	return ops_resume(s, ((const Kvpaged__V1__Resume *)req->msg)->seq, &req->load, &res->seq,
			  why);
}

static int loaded_resume(struct session *s, struct request *req, struct request_result *res)
{
	return ops_loaded_result(s, &req->load, true, &res->seq);
}

static void reply_resume(struct session *s, const struct request *req,
			 struct request_result *res)
{
	Kvpaged__V1__ResumeReply rep = KVPAGED__V1__RESUME_REPLY__INIT;

	rep.recompute_tokens = res->seq.recompute;
	rep.n_table = res->seq.table_len;
	rep.table = (uint32_t *)res->seq.table;
	REPLY(RESUME_REPLY, rep);
}

static uint32_t wait_ms_resume(const ProtobufCMessage *m)
{
	return ((const Kvpaged__V1__Resume *)m)->wait_ms;
}

static size_t bytes_resume(const ProtobufCMessage *m)
{
	return sizeof(Kvpaged__V1__Resume);
}

#define KIND(type, desc, ...)                                                                 \
	{ .name = #type, .descriptor = &kvpaged__v1__##desc##__descriptor, .run = run_##type,  \
	  .reply = reply_##type, __VA_ARGS__ }

/* Those that may outlive their dispatch (they wait, or load) say what their message holds. */
static const struct request_kind kind_open =
	KIND(open, open, .loaded = loaded_open, .wait_ms = wait_ms_open, .bytes = bytes_open);
static const struct request_kind kind_append =
	KIND(append, append, .wait_ms = wait_ms_append, .bytes = bytes_append);
static const struct request_kind kind_commit = KIND(commit, commit);
static const struct request_kind kind_fork = KIND(fork, fork);
static const struct request_kind kind_close = KIND(close, close);
static const struct request_kind kind_lookup = KIND(lookup, lookup);
static const struct request_kind kind_seq_info = KIND(seq_info, seq_info);
static const struct request_kind kind_park = KIND(park, park);
static const struct request_kind kind_scores = KIND(scores, scores);
static const struct request_kind kind_resume =
	KIND(resume, resume, .loaded = loaded_resume, .wait_ms = wait_ms_resume,
	     .bytes = bytes_resume);

static const struct request_kind *kind_of(uint16_t type)
{
	switch (type) {
	case KVPAGED__V1__MESSAGE_TYPE__OPEN:
		return &kind_open;
	case KVPAGED__V1__MESSAGE_TYPE__APPEND:
		return &kind_append;
	case KVPAGED__V1__MESSAGE_TYPE__COMMIT:
		return &kind_commit;
	case KVPAGED__V1__MESSAGE_TYPE__FORK:
		return &kind_fork;
	case KVPAGED__V1__MESSAGE_TYPE__CLOSE:
		return &kind_close;
	case KVPAGED__V1__MESSAGE_TYPE__LOOKUP:
		return &kind_lookup;
	case KVPAGED__V1__MESSAGE_TYPE__SEQ_INFO:
		return &kind_seq_info;
	case KVPAGED__V1__MESSAGE_TYPE__PARK:
		return &kind_park;
	case KVPAGED__V1__MESSAGE_TYPE__RESUME:
		return &kind_resume;
	case KVPAGED__V1__MESSAGE_TYPE__SCORES:
		return &kind_scores;
	}
	return NULL;
}

void client_request_end(struct session *s)
{
	account_bytes(s, -(int64_t)s->req.bytes);
	if (s->req.msg)
		protobuf_c_message_free_unpacked(s->req.msg, NULL);
	s->req = (struct request){ .state = REQUEST_NONE };
}

/* Answers s's request with r (and res, or why) and ends it. */
static void request_finish(struct session *s, int r, struct request_result *res,
			   const char *why)
{
	struct request *req = &s->req;

	/*
	 * One that waited or loaded: the idle timeout counts from its answer (and the sweep is
	 * armed for it: while it waited, the session had no deadline).
	 */
	if (req->bytes || req->deadline_ns)
		session_touch(s);
	if (r < 0) {
		reply_refused(s, req->seq, r, why, req->kind->name);
	} else {
		req->fence = res->seq.fence; /* what its reply hands out */
		req->kind->reply(s, req, res);
	}
	client_request_end(s);
}

/*
 * A request kept past its dispatch holds its message (its frame has left the receive buffer):
 * charged like the buffer was, once.
 */
static void request_keep(struct session *s)
{
	struct request *req = &s->req;

	if (req->bytes || !req->kind->bytes)
		return;
	req->bytes = req->kind->bytes(req->msg);
	account_bytes(s, (int64_t)req->bytes);
}

/*
 * Runs s's request: it ends with its reply, or waits (-ENOSPC with time left: the pool
 * retries it, client_retry) or loads (-EINPROGRESS: client_loaded completes it).
 */
static void request_run(struct session *s)
{
	struct request *req = &s->req;
	struct request_result res = { 0 };
	const char *why = NULL;
	int r = req->kind->run(s, req, &res, &why);

	if (s->closing) {
		/* No operation closes the session today; if one did, there is none to answer. */
		client_request_end(s);
		return;
	}
	if (r == -EINPROGRESS) {
		req->state = REQUEST_LOADING;
		request_keep(s);
		return;
	}
	if (r == -ENOSPC && req->wait_ms) {
		if (session_wait(s)) {
			request_keep(s);
			return;
		}
		why = "no memory came free within wait_ms";
	}
	request_finish(s, r, &res, why);
}

void client_retry(struct session *s)
{
	if (!s->req.msg)
		return;
	s->req.state = REQUEST_RUNNING;
	request_run(s);
}

void client_loaded(struct session *s)
{
	struct request_result res = { 0 };
	int r;

	if (!s->req.msg)
		return;
	s->req.state = REQUEST_RUNNING;
	r = s->req.kind->loaded(s, &s->req, &res);
	request_finish(s, r, &res, NULL);
}

void client_dispatch(struct session *s, const struct kvp_frame_header *h, const uint8_t *payload)
{
	const struct request_kind *kind;
	ProtobufCMessage *msg;

	if (!s->welcomed) {
		if (h->type != KVPAGED__V1__MESSAGE_TYPE__HELLO) {
			session_reply_error(s, h->seq, EPROTO, "the first message must be Hello");
			session_close(s, "no Hello");
			return;
		}
		on_hello(s, h, payload);
		return;
	}
	kind = kind_of(h->type);
	if (!kind) {
		s->srv->refused[CLOSED_PROTOCOL]++;
		session_reply_error(s, h->seq, EPROTO, "unknown message type %u", h->type);
		session_close(s, "unknown message type");
		return;
	}
	msg = protobuf_c_message_unpack(kind->descriptor, NULL, h->len, payload);
	if (!msg) {
		s->srv->refused[CLOSED_PROTOCOL]++;
		session_reply_error(s, h->seq, EPROTO, "malformed %s message", kind->name);
		session_close(s, "malformed message");
		return;
	}
	s->req = (struct request){ .state = REQUEST_RUNNING, .kind = kind, .msg = msg,
				   .seq = h->seq, .wait_ms = kind->wait_ms ? kind->wait_ms(msg) : 0 };
	/* A wait_ms the daemon does not allow: refused before the operation runs. */
	if (s->req.wait_ms > s->srv->cfg->limits.max_wait_ms) {
		reply_refused(s, h->seq, -EINVAL, "wait_ms is above the daemon's max_wait_ms",
			      kind->name);
		client_request_end(s);
		return;
	}
	request_run(s);
}

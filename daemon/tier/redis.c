/* SPDX-License-Identifier: MIT */
/* A small Redis Cluster client on hiredis: design in redis.h and docs/remote.md. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <hiredis/sds.h>

#include "daemon/tier/redis.h"

/* Commands are appended to a node's output buffer while it holds less than this. */
#define OBUF_LOW (1u << 20)
/*
 * GETs whose replies a node owes at most: the rest wait their turn.  A server answers a
 * pipeline of 64 GETs of 2 MiB by queueing 128 MiB for the client, and both ends run slower
 * for it (measured: half the GB/s of a window of 8); a window keeps the link as full.
 */
#define GET_WINDOW 8
/* A node's read buffer, and reads per node per wake-up (fairness). */
#define READ_CHUNK (1u << 20)
#define READS_PER_WAKE 8
/* Reads inside a value: pieces that stay in the cache between the read and the sink. */
#define VALUE_READ (256u << 10)
/* The longest "$<length>\r\n" a value's header may take; longer is left to hiredis. */
#define VALUE_HEADER_MAX 24
/* A value longer than Redis's own proto-max-bulk-len default is left to hiredis (it errs). */
#define VALUE_MAX (512ull << 20)
/* Replies still owed for commands that timed out: past this the connection is closed instead. */
#define MAX_ORPHANS 4096
#define MAX_NODES 1024
/* The slot map's own commands (CLUSTER SHARDS, SLOTS): any reply is kept as it is. */
#define OP_RAW ((enum redis_op)0x7f)

enum pending_kind { P_CMD, P_ASKING, P_ORPHAN };

struct pending {
	struct redis_cmd *cmd;
	enum pending_kind kind;
	bool get; /* a GET's reply (an orphan's too): counted in gets_owed */
};

struct node {
	struct redis_addr addr;
	char name[REDIS_HOST_MAX + 8];
	redisContext *ctx;
	enum redis_node_state state;
	uint64_t retry_at_ns;
	uint64_t connect_until_ns; /* CONNECTING: given up on after this */
	uint32_t backoff_ms;
	/* Replies awaited, in the order the commands went out (a ring). */
	struct pending *q;
	size_t qhead, qlen, qcap;
	size_t orphans;
	/* Commands of this run not yet appended to the output buffer (a ring). */
	struct redis_cmd **wait;
	size_t whead, wlen, wcap;
	size_t gets_owed; /* entries of q that are GETs' replies (GET_WINDOW) */
	uint32_t slots;
	uint64_t commands, errors, bytes_in, bytes_out, connects, failures;
	/*
	 * What was read and not yet parsed: in[in_pos, in_len) of READ_CHUNK bytes.  A GET's value
	 * is framed here and handed on piece by piece as it arrives (in_value: value_off of its
	 * value_len bytes had, then value_crlf of its closing "\r\n"); any other reply is fed to
	 * hiredis's reader (in_hiredis while it holds part of one).
	 */
	char *in;
	size_t in_pos, in_len, value_len, value_off;
	uint8_t value_crlf;
	bool in_value, in_hiredis;
};

struct redis_cluster {
	struct node **nodes;
	size_t nnodes, nodes_cap;
	size_t nseeds; /* nodes[0..nseeds) are the seeds */
	int16_t owner[REDIS_SLOTS];
	bool need_refresh;
	uint64_t refresh_after_ns;
	struct redis_options o;
	size_t active; /* commands of the current run without a status */
	redis_done_fn *done; /* the current run's callback, or NULL */
	void *done_arg;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- names --------------------------------------------------------------------------------- */

static const char *const status_names[REDIS_CMD_NSTATUS] = {
	[REDIS_CMD_PENDING] = "pending",
	[REDIS_CMD_OK] = "ok",
	[REDIS_CMD_NIL] = "nil",
	[REDIS_CMD_TIMEOUT] = "timeout",
	[REDIS_CMD_DOWN] = "down",
	[REDIS_CMD_PROTOCOL] = "protocol",
	[REDIS_CMD_SERVER] = "error",
};

const char *redis_status_name(enum redis_status s)
{
	return (unsigned)s < REDIS_CMD_NSTATUS ? status_names[s] : "?";
}

const char *redis_node_state_name(enum redis_node_state s)
{
	switch (s) {
	case REDIS_NODE_DOWN:
		return "down";
	case REDIS_NODE_CONNECTING:
		return "connecting";
	case REDIS_NODE_UP:
		return "up";
	case REDIS_NODE_IDLE:
		return "idle";
	}
	return "?";
}

/* ---- seeds --------------------------------------------------------------------------------- */

static int url_error(char *err, size_t errlen, const char *url, const char *at, const char *what)
{
	snprintf(err, errlen, "%s at offset %zu of \"%s\"", what, (size_t)(at - url), url);
	return -EINVAL;
}

int redis_parse_url(const char *url, struct redis_addr *addrs, size_t max, size_t *ret_n,
		    char *err, size_t errlen)
{
	const char *p = url;
	size_t n = 0;

	if (strncmp(p, "redis://", 8))
		return url_error(err, errlen, url, p, "expected redis://");
	p += 8;
	for (;;) {
		const char *host = p, *host_end;
		unsigned long port = 0;
		size_t digits = 0;

		if (*p == '[') {
			host = ++p;
			while (*p && *p != ']')
				p++;
			if (*p != ']')
				return url_error(err, errlen, url, host - 1, "unclosed [ in address");
			host_end = p++;
		} else {
			while (*p && *p != ':' && *p != ',' && *p != '/' && !isspace((unsigned char)*p))
				p++;
			host_end = p;
		}
		if (host_end == host)
			return url_error(err, errlen, url, host, "empty host");
		if ((size_t)(host_end - host) >= REDIS_HOST_MAX)
			return url_error(err, errlen, url, host, "host name too long");
		if (*p != ':')
			return url_error(err, errlen, url, p, "expected :PORT after the host");
		p++;
		while (isdigit((unsigned char)*p) && digits < 6) {
			port = port * 10 + (unsigned long)(*p++ - '0');
			digits++;
		}
		if (!digits || port == 0 || port > 65535 || isdigit((unsigned char)*p))
			return url_error(err, errlen, url, p - digits, "port must be 1 to 65535");
		if (n == max) {
			snprintf(err, errlen, "more than %zu seeds in \"%s\"", max, url);
			return -E2BIG;
		}
		memcpy(addrs[n].host, host, (size_t)(host_end - host));
		addrs[n].host[host_end - host] = '\0';
		addrs[n].port = (uint16_t)port;
		n++;
		if (*p == '\0')
			break;
		if (*p != ',')
			return url_error(err, errlen, url, p, "expected , or the end after a port");
		p++;
		while (*p == ' ' || *p == '\t')
			p++;
	}
	*ret_n = n;
	return 0;
}

/* ---- slots --------------------------------------------------------------------------------- */

uint16_t redis_crc16(const void *data, size_t len)
{
	const uint8_t *p = data;
	uint16_t crc = 0;

	while (len--) {
		crc ^= (uint16_t)(*p++ << 8);
		for (int i = 0; i < 8; i++)
			crc = crc & 0x8000 ? (uint16_t)(crc << 1 ^ 0x1021) : (uint16_t)(crc << 1);
	}
	return crc;
}

uint16_t redis_key_slot(const void *key, size_t len)
{
	const char *k = key, *open = memchr(k, '{', len);

	/* Only the first '{' counts, and only if a '}' follows it with something between. */
	if (open) {
		size_t from = (size_t)(open - k) + 1;
		const char *close = memchr(k + from, '}', len - from);

		if (close && close > k + from)
			return redis_crc16(k + from, (size_t)(close - (k + from))) & (REDIS_SLOTS - 1);
	}
	return redis_crc16(k, len) & (REDIS_SLOTS - 1);
}

/* ---- nodes --------------------------------------------------------------------------------- */

static int node_find(struct redis_cluster *c, const char *host, size_t hlen, uint16_t port)
{
	struct node *n;

	if (hlen >= REDIS_HOST_MAX || hlen == 0)
		return -EINVAL;
	for (size_t i = 0; i < c->nnodes; i++)
		if (c->nodes[i]->addr.port == port && strlen(c->nodes[i]->addr.host) == hlen &&
		    !memcmp(c->nodes[i]->addr.host, host, hlen))
			return (int)i;
	if (c->nnodes == MAX_NODES)
		return -E2BIG;
	if (c->nnodes == c->nodes_cap) {
		size_t cap = c->nodes_cap ? c->nodes_cap * 2 : 8;
		struct node **nodes = realloc(c->nodes, cap * sizeof(*nodes));

		if (!nodes)
			return -ENOMEM;
		c->nodes = nodes;
		c->nodes_cap = cap;
	}
	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	memcpy(n->addr.host, host, hlen);
	n->addr.port = port;
	snprintf(n->name, sizeof(n->name), strchr(n->addr.host, ':') ? "[%s]:%u" : "%s:%u",
		 n->addr.host, port);
	n->state = REDIS_NODE_IDLE;
	n->backoff_ms = c->o.backoff_min_ms;
	c->nodes[c->nnodes] = n;
	return (int)c->nnodes++;
}

int redis_cluster_new(const struct redis_addr *seeds, size_t nseeds,
		      const struct redis_options *o, struct redis_cluster **ret)
{
	struct redis_cluster *c;

	if (!nseeds || nseeds > REDIS_MAX_SEEDS)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	if (o)
		c->o = *o;
	if (!c->o.backoff_min_ms)
		c->o.backoff_min_ms = 100;
	if (!c->o.backoff_max_ms)
		c->o.backoff_max_ms = 5000;
	if (c->o.backoff_max_ms < c->o.backoff_min_ms)
		c->o.backoff_max_ms = c->o.backoff_min_ms;
	if (!c->o.refresh_min_ms)
		c->o.refresh_min_ms = 100;
	if (!c->o.connect_timeout_ms)
		c->o.connect_timeout_ms = 1000;
	for (size_t i = 0; i < REDIS_SLOTS; i++)
		c->owner[i] = -1;
	for (size_t i = 0; i < nseeds; i++)
		if (node_find(c, seeds[i].host, strlen(seeds[i].host), seeds[i].port) < 0)
			goto fail;
	c->nseeds = c->nnodes;
	c->need_refresh = true;
	*ret = c;
	return 0;
fail:
	redis_cluster_free(c);
	return -ENOMEM;
}

static void node_close(struct node *n)
{
	if (n->ctx)
		redisFree(n->ctx);
	n->ctx = NULL;
	/* What was read belongs to the connection: none of it means anything on the next. */
	free(n->in);
	n->in = NULL;
	n->in_pos = n->in_len = 0;
	n->in_value = n->in_hiredis = false;
}

struct redis_cluster *redis_cluster_free(struct redis_cluster *c)
{
	if (!c)
		return NULL;
	for (size_t i = 0; i < c->nnodes; i++) {
		struct node *n = c->nodes[i];

		/* Replies still owed are orphans: their runs are over. */
		node_close(n);
		free(n->q);
		free(n->wait);
		free(n);
	}
	free(c->nodes);
	free(c);
	return NULL;
}

/* ---- commands ------------------------------------------------------------------------------ */

void redis_cmd_release(struct redis_cmd *cmd)
{
	if (cmd->reply)
		freeReplyObject(cmd->reply);
	free(cmd->owned);
	cmd->reply = NULL;
	cmd->owned = NULL;
	cmd->data = NULL;
	cmd->data_len = 0;
}

static void finish(struct redis_cluster *c, struct redis_cmd *cmd, enum redis_status s)
{
	if (cmd->finished)
		return;
	cmd->finished = 1;
	cmd->status = s;
	/* A value cut short (the deadline, the node lost) is nobody's. */
	if (s != REDIS_CMD_OK && cmd->owned) {
		free(cmd->owned);
		cmd->owned = NULL;
	}
	c->active--;
	if (c->done && cmd->op != OP_RAW)
		c->done(cmd, c->done_arg);
}

static int ring_grow(void **ring, size_t *cap, size_t head, size_t len, size_t elem)
{
	size_t ncap = *cap ? *cap * 2 : 16;
	char *nr = malloc(ncap * elem);

	if (!nr)
		return -ENOMEM;
	/* Unwrapped into the new ring from 0. */
	for (size_t i = 0; i < len; i++)
		memcpy(nr + i * elem, (char *)*ring + ((head + i) % *cap) * elem, elem);
	free(*ring);
	*ring = nr;
	*cap = ncap;
	return 0;
}

static int q_push(struct node *n, struct redis_cmd *cmd, enum pending_kind kind)
{
	if (n->qlen == n->qcap) {
		int r = ring_grow((void **)&n->q, &n->qcap, n->qhead, n->qlen, sizeof(*n->q));

		if (r < 0)
			return r;
		n->qhead = 0;
	}
	n->q[(n->qhead + n->qlen++) % n->qcap] =
		(struct pending){ cmd, kind, kind == P_CMD && cmd->op == REDIS_GET };
	n->gets_owed += kind == P_CMD && cmd->op == REDIS_GET;
	return 0;
}

/* The reply awaited first, taken off the ring. */
static struct pending q_pop(struct node *n)
{
	struct pending e = n->q[n->qhead];

	n->qhead = (n->qhead + 1) % n->qcap;
	n->qlen--;
	n->gets_owed -= e.get;
	return e;
}

static int wait_push(struct node *n, struct redis_cmd *cmd)
{
	if (n->wlen == n->wcap) {
		int r = ring_grow((void **)&n->wait, &n->wcap, n->whead, n->wlen, sizeof(*n->wait));

		if (r < 0)
			return r;
		n->whead = 0;
	}
	n->wait[(n->whead + n->wlen++) % n->wcap] = cmd;
	return 0;
}

/*
 * The node is gone (refused, reset, EOF, a stream hiredis cannot parse): what it owed fails
 * with s, what waited for it fails as down, and it is not tried again before its backoff.
 */
static void node_fail(struct redis_cluster *c, struct node *n, enum redis_status s)
{
	uint64_t now = now_ns();

	node_close(n);
	while (n->qlen) {
		struct pending e = q_pop(n);

		if (e.kind != P_ORPHAN) {
			n->errors += !e.cmd->finished;
			finish(c, e.cmd, s);
		}
	}
	n->orphans = 0;
	while (n->wlen) {
		struct redis_cmd *cmd = n->wait[n->whead];

		n->whead = (n->whead + 1) % n->wcap;
		n->wlen--;
		n->errors += !cmd->finished;
		finish(c, cmd, REDIS_CMD_DOWN);
	}
	n->state = REDIS_NODE_DOWN;
	n->failures++;
	n->retry_at_ns = now + (uint64_t)n->backoff_ms * 1000000u;
	n->backoff_ms = n->backoff_ms >= c->o.backoff_max_ms / 2 ? c->o.backoff_max_ms
							       : n->backoff_ms * 2;
	/* Its slots may have moved to a replica: ask the cluster before the next batch. */
	c->need_refresh = true;
}

/* Starts a connection if the node has none; false when it is down (in backoff, or refused). */
static bool node_ready(struct redis_cluster *c, struct node *n)
{
	/*
	 * A connect that neither succeeds nor fails (a host that drops SYNs) would cost every
	 * batch its whole deadline: past connect_timeout_ms the node is down instead.
	 */
	if (n->ctx && n->state == REDIS_NODE_CONNECTING && now_ns() >= n->connect_until_ns)
		node_fail(c, n, REDIS_CMD_DOWN);
	if (n->ctx)
		return true;
	if (n->state == REDIS_NODE_DOWN && now_ns() < n->retry_at_ns)
		return false;
	n->connects++;
	n->ctx = redisConnectNonBlock(n->addr.host, n->addr.port);
	if (!n->ctx || n->ctx->err) {
		node_fail(c, n, REDIS_CMD_DOWN);
		return false;
	}
	/* hiredis 0.14 does not ask for close-on-exec: the daemon's fds never leak into children. */
	(void)fcntl(n->ctx->fd, F_SETFD, FD_CLOEXEC);
	/*
	 * hiredis frees its read buffer whenever it empties with more than 16 KiB unused, and
	 * regrows it for the next 2 MiB value: keep it instead (at most a value and a read).
	 */
	n->ctx->reader->maxbuf = 0;
	n->state = REDIS_NODE_CONNECTING;
	n->connect_until_ns = now_ns() + (uint64_t)c->o.connect_timeout_ms * 1000000u;
	return true;
}

/* Sends cmd to its node: the ASK target if it was asked to, else the slot's owner. */
static void route(struct redis_cluster *c, struct redis_cmd *cmd)
{
	int idx = cmd->ask_node >= 0 ? cmd->ask_node : c->owner[cmd->slot];
	struct node *n;

	if (idx < 0) {
		c->need_refresh = true;
		finish(c, cmd, REDIS_CMD_DOWN);
		return;
	}
	n = c->nodes[idx];
	cmd->node = idx;
	if (!node_ready(c, n)) {
		n->errors++;
		finish(c, cmd, REDIS_CMD_DOWN);
		return;
	}
	if (wait_push(n, cmd) < 0)
		finish(c, cmd, REDIS_CMD_DOWN);
}

/* Formats cmd with hiredis and appends it (after an ASKING when redirected by ASK). */
static int append(struct node *n, struct redis_cmd *cmd)
{
	const char *argv[5];
	size_t argvlen[5];
	char ttl[24], *out = NULL;
	int argc = 0, len, r;

	if (cmd->ask_node >= 0) {
		static const char asking[] = "*1\r\n$6\r\nASKING\r\n";

		if (redisAppendFormattedCommand(n->ctx, asking, sizeof(asking) - 1) != REDIS_OK ||
		    q_push(n, cmd, P_ASKING) < 0)
			return -ENOMEM;
		n->bytes_out += sizeof(asking) - 1;
	}
	argv[argc] = cmd->op == REDIS_GET ? "GET" : "SET";
	argvlen[argc++] = 3;
	argv[argc] = cmd->key;
	argvlen[argc++] = cmd->key_len;
	if (cmd->op == REDIS_SET) {
		argv[argc] = cmd->value;
		argvlen[argc++] = cmd->value_len;
		if (cmd->ttl_ms) {
			argv[argc] = "PX";
			argvlen[argc++] = 2;
			argv[argc] = ttl;
			argvlen[argc++] = (size_t)snprintf(ttl, sizeof(ttl), "%llu",
							   (unsigned long long)cmd->ttl_ms);
		}
	}
	len = redisFormatCommandArgv(&out, argc, argv, argvlen);
	if (len < 0)
		return -ENOMEM;
	r = redisAppendFormattedCommand(n->ctx, out, (size_t)len);
	redisFreeCommand(out);
	if (r != REDIS_OK || q_push(n, cmd, P_CMD) < 0)
		return -ENOMEM;
	n->bytes_out += (size_t)len;
	return 0;
}

/* Moves waiting commands into the output buffer while it is short. */
static void fill(struct redis_cluster *c, struct node *n)
{
	while (n->wlen && sdslen(n->ctx->obuf) < OBUF_LOW) {
		struct redis_cmd *cmd = n->wait[n->whead];

		if (cmd->op == REDIS_GET && !cmd->finished && n->gets_owed >= GET_WINDOW)
			break;
		n->whead = (n->whead + 1) % n->wcap;
		n->wlen--;
		if (cmd->finished)
			continue;
		if (append(n, cmd) < 0) {
			n->errors++;
			finish(c, cmd, REDIS_CMD_DOWN);
		}
	}
}

/*
 * "MOVED 3999 127.0.0.1:6381": the node named, found or added; -EPROTO if unreadable.  An empty
 * host (":6381", a server that does not know its endpoint) means the host of the node asked.
 */
static int redirect_target(struct redis_cluster *c, const struct node *asked, const char *s,
			   size_t len)
{
	const char *sp = memchr(s, ' ', len), *addr, *colon;
	unsigned long port;
	char *end;

	if (!sp || !(sp = memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s))))
		return -EPROTO;
	addr = sp + 1;
	colon = memrchr(addr, ':', len - (size_t)(addr - s));
	if (!colon)
		return -EPROTO;
	port = strtoul(colon + 1, &end, 10);
	if (end == colon + 1 || port == 0 || port > 65535)
		return -EPROTO;
	/* An IPv6 address comes without brackets: everything before the last colon. */
	if (colon == addr)
		return node_find(c, asked->addr.host, strlen(asked->addr.host), (uint16_t)port);
	return node_find(c, addr, (size_t)(colon - addr), (uint16_t)port);
}

static void on_reply(struct redis_cluster *c, struct node *n, redisReply *reply)
{
	struct pending e;
	struct redis_cmd *cmd;

	if (!n->qlen) {
		/* A reply nobody asked for: the stream is out of step. */
		freeReplyObject(reply);
		node_fail(c, n, REDIS_CMD_PROTOCOL);
		return;
	}
	e = q_pop(n);
	n->commands++;
	n->backoff_ms = c->o.backoff_min_ms; /* it answers: the next failure starts afresh */
	if (e.kind == P_ORPHAN) {
		n->orphans--;
		freeReplyObject(reply);
		return;
	}
	if (e.kind == P_ASKING) {
		/* The command after it gets its own answer (an error if ASKING failed). */
		freeReplyObject(reply);
		return;
	}
	cmd = e.cmd;
	if (cmd->op == OP_RAW) {
		cmd->reply = reply;
		finish(c, cmd, REDIS_CMD_OK);
		return;
	}
	if (reply->type == REDIS_REPLY_ERROR) {
		bool moved = reply->len > 6 && !strncmp(reply->str, "MOVED ", 6);
		bool ask = reply->len > 4 && !strncmp(reply->str, "ASK ", 4);

		if ((moved && !cmd->moved) || (ask && !cmd->asked)) {
			int target = redirect_target(c, n, reply->str, reply->len);

			freeReplyObject(reply);
			if (target < 0) {
				n->errors++;
				finish(c, cmd, REDIS_CMD_PROTOCOL);
				return;
			}
			if (moved) {
				/* The slot lives there now; the rest of the map is fetched next. */
				cmd->moved = 1;
				cmd->flags |= REDIS_F_MOVED;
				cmd->ask_node = -1;
				c->owner[cmd->slot] = (int16_t)target;
				c->need_refresh = true;
			} else {
				cmd->asked = 1;
				cmd->flags |= REDIS_F_ASK;
				cmd->ask_node = target;
			}
			route(c, cmd);
			return;
		}
		n->errors++;
		cmd->reply = reply;
		cmd->data = reply->str;
		cmd->data_len = reply->len;
		/* A slot nobody serves (a failover in progress) is a node down, not a bug. */
		if (!strncmp(reply->str, "CLUSTERDOWN", 11)) {
			c->need_refresh = true;
			finish(c, cmd, REDIS_CMD_DOWN);
		} else {
			finish(c, cmd, REDIS_CMD_SERVER);
		}
		return;
	}
	if (cmd->op == REDIS_GET && reply->type == REDIS_REPLY_STRING) {
		cmd->reply = reply;
		cmd->data = reply->str;
		cmd->data_len = reply->len;
		finish(c, cmd, REDIS_CMD_OK);
	} else if (cmd->op == REDIS_GET && reply->type == REDIS_REPLY_NIL) {
		freeReplyObject(reply);
		finish(c, cmd, REDIS_CMD_NIL);
	} else if (cmd->op == REDIS_SET && reply->type == REDIS_REPLY_STATUS &&
		   !strcmp(reply->str, "OK")) {
		freeReplyObject(reply);
		finish(c, cmd, REDIS_CMD_OK);
	} else {
		freeReplyObject(reply);
		n->errors++;
		finish(c, cmd, REDIS_CMD_PROTOCOL);
	}
}

/* The reply at the head of the node's queue is owed to a GET, or to nobody (an orphan). */
static bool value_owed(const struct node *n)
{
	const struct pending *e;

	if (!n->qlen)
		return false;
	e = &n->q[n->qhead];
	return e->kind == P_ORPHAN || (e->kind == P_CMD && e->cmd->op == REDIS_GET);
}

/*
 * At a reply's first byte: 1 if it is a value for a GET (or an orphan) that this file receives
 * itself, its length in *len and its header's bytes in *hdr; 0 if the header is not all here
 * yet; -1 for anything else, which hiredis parses (a nil, an error, a status, an array, a
 * malformed header).
 */
static int value_header(const struct node *n, const char *p, size_t avail, uint64_t *len,
			size_t *hdr)
{
	const char *cr;
	uint64_t v = 0;

	if (p[0] != '$' || !value_owed(n))
		return -1;
	cr = memchr(p, '\r', avail < VALUE_HEADER_MAX ? avail : VALUE_HEADER_MAX);
	if (!cr)
		return avail < VALUE_HEADER_MAX ? 0 : -1;
	if ((size_t)(cr - p) + 1 >= avail)
		return 0;
	if (cr[1] != '\n' || cr == p + 1)
		return -1;
	for (const char *d = p + 1; d < cr; d++) {
		if (*d < '0' || *d > '9')
			return -1; /* "$-1": a nil */
		v = v * 10 + (uint64_t)(*d - '0');
	}
	if (v > VALUE_MAX)
		return -1;
	*len = v;
	*hdr = (size_t)(cr - p) + 2;
	return 1;
}

/* A value's header was read: its bytes go to the GET's sink, or into a buffer of its own. */
static int value_start(struct node *n, uint64_t len)
{
	const struct pending *e = &n->q[n->qhead];

	n->in_value = true;
	n->value_len = (size_t)len;
	n->value_off = 0;
	n->value_crlf = 0;
	if (e->kind == P_CMD && !e->cmd->sink) {
		e->cmd->owned = malloc(len ? (size_t)len : 1);
		if (!e->cmd->owned)
			return -ENOMEM;
	}
	return 0;
}

/*
 * A piece of the value being received.  Its GET is looked up at each piece: a deadline that
 * passed mid-value made the reply an orphan, its command finished and maybe reused since.
 */
static void value_piece(struct node *n, const char *p, size_t len)
{
	const struct pending *e = &n->q[n->qhead];
	struct redis_cmd *cmd = e->cmd;

	if (e->kind != P_CMD)
		return;
	if (cmd->sink)
		cmd->sink(cmd, n->value_off, p, len, n->value_len, cmd->sink_arg);
	else
		memcpy((char *)cmd->owned + n->value_off, p, len);
}

/* The value is all in: its GET has it (in data, or all through its sink). */
static void value_done(struct redis_cluster *c, struct node *n)
{
	struct pending e = q_pop(n);
	struct redis_cmd *cmd = e.cmd;

	n->in_value = false;
	n->commands++;
	n->backoff_ms = c->o.backoff_min_ms;
	if (e.kind == P_ORPHAN) {
		n->orphans--;
		return;
	}
	cmd->data = cmd->owned;
	cmd->data_len = n->value_len;
	finish(c, cmd, REDIS_CMD_OK);
}

/*
 * Parses what was read.  A value owed to a GET is framed here and handed on as it arrives, so
 * that the caller opens it while the rest is still on the way and it is copied once at most
 * (through hiredis it would be copied twice, into the reader and into a reply object, each a
 * pass over 2 MiB); every other reply goes through hiredis's reader, and what hiredis was given
 * past the end of that one reply is taken back and parsed here again.
 */
static void frame(struct redis_cluster *c, struct node *n)
{
	while (n->ctx && n->in_pos < n->in_len) {
		char *p = n->in + n->in_pos;
		size_t avail = n->in_len - n->in_pos, hdr = 0, left;
		redisReader *rd = n->ctx->reader;
		uint64_t len = 0;
		void *reply = NULL;

		if (n->in_value) {
			size_t rest = n->value_len - n->value_off;

			if (rest) {
				size_t k = avail < rest ? avail : rest;

				value_piece(n, p, k);
				n->value_off += k;
				n->in_pos += k;
				continue;
			}
			if (*p != "\r\n"[n->value_crlf]) {
				node_fail(c, n, REDIS_CMD_PROTOCOL);
				return;
			}
			n->in_pos++;
			if (++n->value_crlf == 2)
				value_done(c, n);
			continue;
		}
		if (!n->in_hiredis) {
			int k = value_header(n, p, avail, &len, &hdr);

			if (k == 0)
				break;
			if (k > 0) {
				if (value_start(n, len) < 0) {
					node_fail(c, n, REDIS_CMD_DOWN);
					return;
				}
				n->in_pos += hdr;
				continue;
			}
			n->in_hiredis = true;
		}
		if (redisReaderFeed(rd, p, avail) != REDIS_OK) {
			node_fail(c, n, REDIS_CMD_PROTOCOL);
			return;
		}
		n->in_pos = n->in_len;
		if (redisGetReplyFromReader(n->ctx, &reply) != REDIS_OK) {
			node_fail(c, n, REDIS_CMD_PROTOCOL);
			return;
		}
		if (!reply)
			break;
		/*
		 * One whole reply: hiredis holds nothing of another.  What it was given past it lies
		 * at the end of this buffer still (the reply ended in the last feed): parsed here.
		 */
		left = rd->len - rd->pos;
		rd->pos = rd->len;
		if (left > n->in_len) {
			freeReplyObject(reply);
			node_fail(c, n, REDIS_CMD_PROTOCOL);
			return;
		}
		n->in_pos = n->in_len - left;
		n->in_hiredis = false;
		on_reply(c, n, reply);
	}
	if (!n->ctx)
		return;
	if (n->in_pos == n->in_len) {
		n->in_pos = n->in_len = 0;
	} else if (n->in_pos) {
		/* A header cut by the read's end (a few bytes): to the front, for the next read. */
		memmove(n->in, n->in + n->in_pos, n->in_len - n->in_pos);
		n->in_len -= n->in_pos;
		n->in_pos = 0;
	}
}

static void node_read(struct redis_cluster *c, struct node *n)
{
	for (int i = 0; i < READS_PER_WAKE && n->ctx; i++) {
		size_t want;
		ssize_t got;

		if (!n->in) {
			n->in = malloc(READ_CHUNK);
			if (!n->in) {
				node_fail(c, n, REDIS_CMD_DOWN);
				return;
			}
		}
		want = READ_CHUNK - n->in_len;
		/* Inside a value: not past its end (the next reply starts a read of its own). */
		if (n->in_value) {
			size_t rest = n->value_len - n->value_off + 2u - n->value_crlf;

			want = rest < VALUE_READ ? rest : VALUE_READ;
		}
		got = read(n->ctx->fd, n->in + n->in_len, want);
		if (got < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (got <= 0) {
			node_fail(c, n, REDIS_CMD_DOWN);
			return;
		}
		n->bytes_in += (uint64_t)got;
		n->in_len += (size_t)got;
		frame(c, n);
		if ((size_t)got < want)
			return;
	}
}

static bool node_busy(const struct node *n)
{
	return n->ctx && (n->qlen > n->orphans || n->wlen);
}

/* Drives every node until the run's commands all have a status or the deadline passes. */
static int drive(struct redis_cluster *c, struct redis_cmd *cmds, size_t ncmds, uint64_t deadline)
{
	struct pollfd *pfd = NULL;
	size_t *which = NULL, cap = 0;
	int ret = 0;

	while (c->active) {
		uint64_t now = now_ns();
		size_t np = 0;
		int timeout, r;

		if (now >= deadline)
			break;
		/* A redirect may have added a node since the last round. */
		if (cap < c->nnodes) {
			struct pollfd *p = realloc(pfd, c->nnodes * sizeof(*pfd));
			size_t *w = p ? realloc(which, c->nnodes * sizeof(*which)) : NULL;

			if (p)
				pfd = p;
			if (!w) {
				ret = -ENOMEM;
				break;
			}
			which = w;
			cap = c->nnodes;
		}
		for (size_t i = 0; i < c->nnodes; i++) {
			struct node *n = c->nodes[i];
			short ev = POLLIN;

			if (!node_busy(n))
				continue;
			if (n->state == REDIS_NODE_UP)
				fill(c, n);
			/* Commands still waiting after fill wait for replies (GET_WINDOW), not this. */
			if (n->state == REDIS_NODE_CONNECTING || sdslen(n->ctx->obuf))
				ev |= POLLOUT;
			pfd[np] = (struct pollfd){ .fd = n->ctx->fd, .events = ev };
			which[np++] = i;
		}
		if (!np)
			break; /* only nodes that failed are left: their commands have statuses */
		timeout = (int)((deadline - now + 999999) / 1000000);
		for (size_t j = 0; j < np; j++) {
			struct node *n = c->nodes[which[j]];

			if (n->state == REDIS_NODE_CONNECTING && n->connect_until_ns < deadline) {
				int t = n->connect_until_ns > now
						? (int)((n->connect_until_ns - now + 999999) / 1000000)
						: 0;

				if (t < timeout)
					timeout = t;
			}
		}
		r = poll(pfd, np, timeout);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			break;
		for (size_t j = 0; j < np; j++) {
			struct node *n = c->nodes[which[j]];
			short re = pfd[j].revents;

			if (n->ctx && n->state == REDIS_NODE_CONNECTING && !re &&
			    now_ns() >= n->connect_until_ns) {
				node_fail(c, n, REDIS_CMD_DOWN);
				continue;
			}
			if (!re || !n->ctx)
				continue;
			if (n->state == REDIS_NODE_CONNECTING) {
				int err = 0;
				socklen_t len = sizeof(err);

				if (!(re & (POLLOUT | POLLERR | POLLHUP)))
					continue;
				if (getsockopt(n->ctx->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
					node_fail(c, n, REDIS_CMD_DOWN);
					continue;
				}
				n->state = REDIS_NODE_UP;
				fill(c, n);
			}
			if (re & (POLLIN | POLLHUP | POLLERR))
				node_read(c, n);
			if (n->ctx && (re & POLLOUT) && sdslen(n->ctx->obuf)) {
				int done = 0;

				if (redisBufferWrite(n->ctx, &done) != REDIS_OK)
					node_fail(c, n, REDIS_CMD_DOWN);
			}
		}
	}
	free(pfd);
	free(which);
	if (!c->active)
		return ret;
	/*
	 * The deadline: what is still owed becomes an orphan (its reply read and dropped later,
	 * keeping the pipeline in step); what was never sent is simply not sent.
	 */
	for (size_t i = 0; i < c->nnodes; i++) {
		struct node *n = c->nodes[i];

		for (size_t j = 0; j < n->qlen; j++) {
			struct pending *e = &n->q[(n->qhead + j) % n->qcap];

			if (e->kind != P_ORPHAN) {
				e->kind = P_ORPHAN;
				n->orphans++;
			}
		}
		n->wlen = 0;
		if (n->orphans > MAX_ORPHANS) {
			node_close(n);
			n->qlen = n->orphans = n->gets_owed = 0;
			n->state = REDIS_NODE_IDLE;
		}
	}
	for (size_t i = 0; i < ncmds; i++)
		if (!cmds[i].finished) {
			if (cmds[i].node >= 0)
				c->nodes[cmds[i].node]->errors++;
			finish(c, &cmds[i], ret < 0 ? REDIS_CMD_DOWN : REDIS_CMD_TIMEOUT);
		}
	return ret;
}

/* ---- the slot map -------------------------------------------------------------------------- */

static redisReply *field(const redisReply *map, const char *name)
{
	if (map->type != REDIS_REPLY_ARRAY)
		return NULL;
	for (size_t i = 0; i + 1 < map->elements; i += 2)
		if (map->element[i]->type == REDIS_REPLY_STRING && !strcmp(map->element[i]->str, name))
			return map->element[i + 1];
	return NULL;
}

static bool is_str(const redisReply *r, const char *s)
{
	return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) &&
	       !strcmp(r->str, s);
}

/* An address in a map: IP and port, the asked node's IP when the server leaves it empty. */
static int map_node(struct redis_cluster *c, const struct node *asked, const redisReply *ip,
		    long long port)
{
	const char *h = asked->addr.host;

	if (ip && ip->type == REDIS_REPLY_STRING && ip->len && strcmp(ip->str, "?"))
		h = ip->str;
	if (port <= 0 || port > 65535)
		return -EPROTO;
	return node_find(c, h, strlen(h), (uint16_t)port);
}

/* CLUSTER SHARDS: [ {slots: [a, b, ...], nodes: [ {ip, port, role, health, ...}, ...]}, ...] */
static int parse_shards(struct redis_cluster *c, const struct node *asked, const redisReply *r,
			int16_t *owner)
{
	if (r->type != REDIS_REPLY_ARRAY)
		return -EPROTO;
	for (size_t s = 0; s < r->elements; s++) {
		redisReply *slots = field(r->element[s], "slots"), *nodes = field(r->element[s], "nodes");
		int best = -1;
		bool best_online = false;

		if (!slots || !nodes || slots->type != REDIS_REPLY_ARRAY ||
		    nodes->type != REDIS_REPLY_ARRAY)
			return -EPROTO;
		for (size_t i = 0; i < nodes->elements; i++) {
			redisReply *nd = nodes->element[i], *port = field(nd, "port");
			bool online = is_str(field(nd, "health"), "online");
			int idx;

			if (!is_str(field(nd, "role"), "master") || !port ||
			    port->type != REDIS_REPLY_INTEGER)
				continue;
			if (best >= 0 && (best_online || !online))
				continue;
			idx = map_node(c, asked, field(nd, "ip"), port->integer);
			if (idx < 0)
				return idx;
			best = idx;
			best_online = online;
		}
		for (size_t i = 0; i + 1 < slots->elements; i += 2) {
			long long a = slots->element[i]->integer, b = slots->element[i + 1]->integer;

			if (slots->element[i]->type != REDIS_REPLY_INTEGER ||
			    slots->element[i + 1]->type != REDIS_REPLY_INTEGER || a < 0 || b < a ||
			    b >= REDIS_SLOTS)
				return -EPROTO;
			for (long long k = a; k <= b; k++)
				owner[k] = (int16_t)best;
		}
	}
	return 0;
}

/* CLUSTER SLOTS: [ [start, end, [ip, port, id], replicas...], ... ] */
static int parse_slots(struct redis_cluster *c, const struct node *asked, const redisReply *r,
		       int16_t *owner)
{
	if (r->type != REDIS_REPLY_ARRAY)
		return -EPROTO;
	for (size_t s = 0; s < r->elements; s++) {
		const redisReply *e = r->element[s], *m;
		long long a, b;
		int idx;

		if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
		    e->element[0]->type != REDIS_REPLY_INTEGER ||
		    e->element[1]->type != REDIS_REPLY_INTEGER)
			return -EPROTO;
		a = e->element[0]->integer;
		b = e->element[1]->integer;
		m = e->element[2];
		if (a < 0 || b < a || b >= REDIS_SLOTS || m->type != REDIS_REPLY_ARRAY ||
		    m->elements < 2 || m->element[1]->type != REDIS_REPLY_INTEGER)
			return -EPROTO;
		idx = map_node(c, asked, m->element[0], m->element[1]->integer);
		if (idx < 0)
			return idx;
		for (long long k = a; k <= b; k++)
			owner[k] = (int16_t)idx;
	}
	return 0;
}

/* One internal command to one node, through the same pipeline: its reply, or NULL. */
static redisReply *ask_node(struct redis_cluster *c, int idx, const char *cmdline,
			    uint64_t deadline)
{
	struct redis_cmd cmd = { .node = idx, .ask_node = -1, .status = REDIS_CMD_PENDING };
	struct node *n = c->nodes[idx];
	char *out = NULL;
	int len;
	redisReply *reply;

	if (!node_ready(c, n))
		return NULL;
	/* Not a GET or a SET: formatted here and queued as a command whose reply is kept. */
	len = redisFormatCommand(&out, cmdline);
	if (len < 0)
		return NULL;
	cmd.op = OP_RAW;
	if (redisAppendFormattedCommand(n->ctx, out, (size_t)len) != REDIS_OK ||
	    q_push(n, &cmd, P_CMD) < 0) {
		redisFreeCommand(out);
		node_fail(c, n, REDIS_CMD_DOWN);
		return NULL;
	}
	redisFreeCommand(out);
	n->bytes_out += (size_t)len;
	c->active = 1;
	(void)drive(c, &cmd, 1, deadline);
	c->active = 0;
	reply = cmd.reply;
	return reply;
}

static int refresh(struct redis_cluster *c, uint64_t deadline)
{
	_Static_assert(sizeof(int16_t) * REDIS_SLOTS <= 32768, "owner map on the stack");
	int16_t owner[REDIS_SLOTS];
	bool tried_any = false;
	int r = -EHOSTUNREACH;

	c->refresh_after_ns = now_ns() + (uint64_t)c->o.refresh_min_ms * 1000000u;
	/* Ask nodes that answered before first: they need no connect; then the others. */
	for (int pass = 0; pass < 2 && r < 0; pass++)
		for (size_t i = 0; i < c->nnodes && r < 0 && now_ns() < deadline; i++) {
			struct node *n = c->nodes[i];
			redisReply *reply;

			if ((pass == 0) != (n->state == REDIS_NODE_UP))
				continue;
			if (n->state == REDIS_NODE_DOWN && now_ns() < n->retry_at_ns)
				continue;
			tried_any = true;
			for (size_t k = 0; k < REDIS_SLOTS; k++)
				owner[k] = -1;
			reply = ask_node(c, (int)i, "CLUSTER SHARDS", deadline);
			if (reply && reply->type == REDIS_REPLY_ERROR) {
				bool disabled = strstr(reply->str, "cluster support disabled");

				freeReplyObject(reply);
				if (disabled) {
					/* A standalone server: a cluster of one. */
					for (size_t k = 0; k < REDIS_SLOTS; k++)
						owner[k] = (int16_t)i;
					r = 0;
					break;
				}
				/* Before Redis 7: no SHARDS. */
				reply = ask_node(c, (int)i, "CLUSTER SLOTS", deadline);
				if (reply)
					r = reply->type == REDIS_REPLY_ARRAY ?
						    parse_slots(c, n, reply, owner) : -EPROTO;
			} else if (reply) {
				r = parse_shards(c, n, reply, owner);
			}
			if (reply)
				freeReplyObject(reply);
			/* A node with an empty map (a cluster still forming) is no answer. */
			if (r == 0) {
				size_t covered = 0;

				for (size_t k = 0; k < REDIS_SLOTS; k++)
					covered += owner[k] >= 0;
				if (!covered)
					r = -EPROTO;
			}
		}
	if (r < 0)
		return tried_any ? r : -EHOSTUNREACH;
	memcpy(c->owner, owner, sizeof(owner));
	for (size_t i = 0; i < c->nnodes; i++)
		c->nodes[i]->slots = 0;
	for (size_t k = 0; k < REDIS_SLOTS; k++)
		if (owner[k] >= 0)
			c->nodes[owner[k]]->slots++;
	c->need_refresh = false;
	return 0;
}

int redis_cluster_refresh(struct redis_cluster *c, uint32_t timeout_ms)
{
	return refresh(c, now_ns() + (uint64_t)timeout_ms * 1000000u);
}

int redis_cluster_run_cb(struct redis_cluster *c, struct redis_cmd *cmds, size_t n,
			 uint32_t timeout_ms, redis_done_fn *done, void *arg)
{
	uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000u;
	int r;

	if (c->need_refresh && now_ns() >= c->refresh_after_ns)
		(void)refresh(c, deadline);
	c->active = n;
	c->done = done;
	c->done_arg = arg;
	for (size_t i = 0; i < n; i++) {
		struct redis_cmd *cmd = &cmds[i];

		cmd->status = REDIS_CMD_PENDING;
		cmd->finished = 0;
		cmd->flags = 0;
		cmd->data = NULL;
		cmd->data_len = 0;
		cmd->reply = NULL;
		cmd->node = cmd->ask_node = -1;
		cmd->moved = cmd->asked = 0;
		cmd->slot = redis_key_slot(cmd->key, cmd->key_len);
	}
	for (size_t i = 0; i < n; i++)
		route(c, &cmds[i]);
	r = drive(c, cmds, n, deadline);
	c->done = NULL;
	return r;
}

int redis_cluster_run(struct redis_cluster *c, struct redis_cmd *cmds, size_t n,
		      uint32_t timeout_ms)
{
	return redis_cluster_run_cb(c, cmds, n, timeout_ms, NULL, NULL);
}

size_t redis_cluster_nodes(const struct redis_cluster *c, struct redis_node_info *out,
			   size_t max)
{
	for (size_t i = 0; i < c->nnodes && i < max; i++) {
		const struct node *n = c->nodes[i];
		struct redis_node_info *o = &out[i];

		snprintf(o->addr, sizeof(o->addr), "%s", n->name);
		o->state = n->state;
		o->slots = n->slots;
		o->commands = n->commands;
		o->errors = n->errors;
		o->bytes_in = n->bytes_in;
		o->bytes_out = n->bytes_out;
		o->connects = n->connects;
		o->failures = n->failures;
	}
	return c->nnodes;
}

const char *redis_cluster_slot_addr(const struct redis_cluster *c, uint16_t slot)
{
	if (slot >= REDIS_SLOTS || c->owner[slot] < 0)
		return NULL;
	return c->nodes[c->owner[slot]]->name;
}

/* SPDX-License-Identifier: MIT */
/*
 * A small Redis Cluster client on hiredis 0.14 (Debian 12 has no hiredis-cluster or libvalkey):
 * the remote tier's transport.  docs/remote.md describes it; in short:
 *
 * - Threading: the remote tier runs in a thread of its own, because network I/O and the
 *   AES-GCM of 2 MiB values must never run on the event-loop thread that owns all block state.
 *   A struct redis_cluster belongs to that one thread: it is not thread-safe and takes no
 *   locks.
 * - I/O: one hiredis redisContext per node, connected non-blocking (redisConnectNonBlock),
 *   commands formatted by hiredis and appended to the node's output buffer, the socket written
 *   and read here, all nodes driven by one poll() bounded by the batch's deadline.  A GET's
 *   value ("$<length>\r\n" and its bytes) is framed here and handed on in pieces as they
 *   arrive (to the command's sink, or into one buffer of its own); every other reply goes
 *   through hiredis's reply reader.  That gives one pipeline per node, every node in
 *   flight at once, and a deadline no node can stretch; hiredis's async API would need an
 *   event library adapter and still has no per-batch deadline.  Commands are appended lazily
 *   (while the output buffer holds under a megabyte), so 64 pipelined 2 MiB SETs do not make
 *   hiredis shift a 128 MiB buffer after each partial write; and at most 8 GETs' replies are
 *   owed by a node at once, so that it never queues 128 MiB of values for one client.
 * - Slots: CRC16 (XMODEM) of the key or of its first non-empty {hashtag}, mod 16384; the map
 *   comes from CLUSTER SHARDS (Redis 7), else CLUSTER SLOTS; a server with cluster support
 *   disabled is a one-node cluster owning every slot.  MOVED points the slot at the node named,
 *   marks the map for a refresh before the next batch, and the command is retried there once;
 *   ASK sends ASKING and the command to the node named, once.
 * - Failures: a node is connected when first needed.  A failed connect, one not done within
 *   connect_timeout_ms (it may span batches), a reset or EOF makes it down: its commands in
 *   flight fail (REDIS_CMD_DOWN) and so does every command for it, at once, until its backoff
 *   (doubling from backoff_min_ms to backoff_max_ms) allows another connect; a down node also
 *   asks for a map refresh (a failover moves its slots).  Nothing waits past the deadline:
 *   commands still unanswered then are REDIS_CMD_TIMEOUT, and their replies, when they come,
 *   are read and dropped (the connection stays in step).
 *
 * Host names are resolved by hiredis with getaddrinfo, which blocks: seeds and cluster
 * addresses should be IP addresses (Redis announces IPs unless told otherwise).  hiredis
 * writes with write(2), not send(MSG_NOSIGNAL): the process must ignore SIGPIPE (the daemon
 * does, in server.c), or a write to a node that just died kills it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REDIS_SLOTS 16384
#define REDIS_MAX_SEEDS 64
#define REDIS_HOST_MAX 256

struct redis_cluster;

struct redis_addr {
	char host[REDIS_HOST_MAX]; /* an IPv6 address without its brackets */
	uint16_t port;
};

/*
 * Parses "redis://HOST:PORT[,HOST:PORT...]" (HOST an IPv4 address, a name, or an IPv6 address
 * in brackets; spaces after commas allowed) into addrs (max entries).  ret_n: the count.
 * 0, or -EINVAL with err (errlen bytes) saying what is wrong and where; -E2BIG past max.
 */
int redis_parse_url(const char *url, struct redis_addr *addrs, size_t max, size_t *ret_n,
		    char *err, size_t errlen);

/* The cluster slot of a key: CRC16-XMODEM of the key or its {hashtag}, mod 16384. */
uint16_t redis_key_slot(const void *key, size_t len);
/* CRC16-XMODEM (polynomial 0x1021, initial 0, no reflection), as Redis Cluster uses it. */
uint16_t redis_crc16(const void *data, size_t len);

struct redis_options {
	uint32_t backoff_min_ms; /* the first wait after a node fails (0: 100) */
	uint32_t backoff_max_ms; /* the cap of its doubling (0: 5000) */
	uint32_t refresh_min_ms; /* refreshes of the slot map at most this often (0: 100) */
	uint32_t connect_timeout_ms; /* a connect not done by then makes the node down (0: 1000) */
};

/*
 * A client for the cluster the seeds belong to.  Connects to nothing yet: the first batch
 * does.  o may be NULL (defaults).  0, -EINVAL (no seeds), -ENOMEM.
 */
int redis_cluster_new(const struct redis_addr *seeds, size_t nseeds,
		      const struct redis_options *o, struct redis_cluster **ret);
/* Closes every connection and frees the client.  NULL is fine; returns NULL. */
struct redis_cluster *redis_cluster_free(struct redis_cluster *c);

enum redis_op { REDIS_GET, REDIS_SET };

/* A command's outcome (REDIS_CMD_: hiredis has the REDIS_OK and REDIS_ERR names). */
enum redis_status {
	REDIS_CMD_PENDING = 0, /* not run yet */
	REDIS_CMD_OK,          /* GET: the value is in data; SET: stored */
	REDIS_CMD_NIL,         /* GET: no such key */
	REDIS_CMD_TIMEOUT,     /* no answer by the deadline */
	REDIS_CMD_DOWN,        /* its node is down (or no node owns its slot) */
	REDIS_CMD_PROTOCOL,    /* an answer of the wrong type, or a stream hiredis could not parse */
	REDIS_CMD_SERVER,      /* an error reply (the text in data), or redirected once too often */
	REDIS_CMD_NSTATUS
};

const char *redis_status_name(enum redis_status s);

/* What happened on the way (flags). */
#define REDIS_F_MOVED 1u /* followed a MOVED */
#define REDIS_F_ASK 2u   /* followed an ASK */

struct redis_cmd;

/*
 * A GET's sink: each piece of the value as it arrives, in order, without gaps (off: where the
 * piece starts in the value; total: the value's length, from the reply's header), so that the
 * caller can open it while the rest is on the way, from a buffer still in the cache, and no
 * buffer holds it whole.  The command then ends REDIS_CMD_OK with data NULL and data_len the
 * value's length; a value cut short (the deadline, the node lost) ends with that status
 * instead, after some pieces or none.  A sink must not call the client.
 */
typedef void redis_sink_fn(struct redis_cmd *cmd, size_t off, const void *piece, size_t n,
			   size_t total, void *arg);

struct redis_cmd {
	/* In: what to do.  key and value stay the caller's and must live through the batch. */
	enum redis_op op;
	const void *key;
	size_t key_len;
	const void *value; /* SET */
	size_t value_len;
	uint64_t ttl_ms; /* SET: PX ttl_ms when not 0 */
	redis_sink_fn *sink; /* GET: the value in pieces (above), or NULL: whole, in data */
	void *sink_arg;

	/* Out (set by redis_cluster_run). */
	enum redis_status status;
	unsigned flags;
	const char *data; /* GET's value, or an error reply's text; owned by the command */
	size_t data_len;

	/* The client's. */
	void *reply;
	void *owned; /* a GET's value without a sink (data points here) */
	int node, ask_node;
	uint16_t slot;
	uint8_t moved, asked, finished;
};

/*
 * Runs n commands: one pipeline per node, all nodes at once, until every command has its
 * status or timeout_ms has passed.  Commands may be reused after redis_cmd_release.  0 when each
 * command has a status (some may have failed); -ENOMEM (commands not run are REDIS_CMD_DOWN).
 */
int redis_cluster_run(struct redis_cluster *c, struct redis_cmd *cmds, size_t n,
		      uint32_t timeout_ms);
/*
 * The same, calling done(cmd, arg) as each command gets its status, in the order they finish:
 * the caller can open and release a GET's value as it arrives (redis_cmd_release in done is
 * fine), so a batch of 2 MiB values holds one at a time instead of all.  done must not call
 * the client.
 */
typedef void redis_done_fn(struct redis_cmd *cmd, void *arg);
int redis_cluster_run_cb(struct redis_cluster *c, struct redis_cmd *cmds, size_t n,
			 uint32_t timeout_ms, redis_done_fn *done, void *arg);
/* Frees what a run left in cmd (GET's value or an error's text): data is NULL after it. */
void redis_cmd_release(struct redis_cmd *cmd);

/* Refreshes the slot map now: 0, -EHOSTUNREACH (no node answered), -EPROTO. */
int redis_cluster_refresh(struct redis_cluster *c, uint32_t timeout_ms);

enum redis_node_state { REDIS_NODE_DOWN, REDIS_NODE_CONNECTING, REDIS_NODE_UP, REDIS_NODE_IDLE };

/* One node's state and counters, for kvpagedctl and the metrics. */
struct redis_node_info {
	char addr[REDIS_HOST_MAX + 8]; /* "host:port" */
	enum redis_node_state state;   /* IDLE: never needed yet, or closed */
	uint32_t slots;                /* how many slots the map gives it */
	uint64_t commands, errors;     /* replies and failed commands */
	uint64_t bytes_in, bytes_out;
	uint64_t connects, failures;
};

const char *redis_node_state_name(enum redis_node_state s);

/* The number of nodes known; copies up to max of them into out. */
size_t redis_cluster_nodes(const struct redis_cluster *c, struct redis_node_info *out,
			   size_t max);
/* The "host:port" the map gives slot to, or NULL. */
const char *redis_cluster_slot_addr(const struct redis_cluster *c, uint16_t slot);

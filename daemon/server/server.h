/* SPDX-License-Identifier: MIT */
/*
 * The daemon's server: one thread, one io_uring, all state.  Accepts, socket reads and writes,
 * ring doorbells and signals all complete on the same ring; handlers run to completion.
 */
#pragma once

#include <liburing.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "daemon/backend/backend.h"
#include "daemon/config.h"
#include "daemon/core/core.h"
#include "daemon/tier/remote.h"
#include "daemon/tier/tier.h"
#include "proto/frame.h"
#include "proto/kvpaged.pb-c.h"
#include "proto/ring.h"

struct session;
struct server;

/* What a completion is about: every in-flight io_uring operation points at one of these. */
enum op_kind {
	OP_ACCEPT_CLIENT,
	OP_ACCEPT_ADMIN,
	OP_SIGNAL,
	OP_RECV,
	OP_SEND,
	OP_DOORBELL,
	OP_TIMER, /* the server's timeouts: watchdog and status, drain deadline */
	OP_TIER,  /* a pool's file tier posted completions (its eventfd) */
	OP_BACKEND, /* a pool's backend completed queued copies or moves (its done_fd) */
	OP_SWEEP,   /* the timer that closes silent and idle sessions */
	OP_ACCEPT_RETRY, /* a listener's pause after failed accepts is over */
	OP_HTTP,         /* the metrics endpoint's epoll fd is readable (http.c) */
	OP_REMOTE,       /* a pool's remote tier thread completed jobs (its eventfd) */
};

struct op {
	enum op_kind kind;
	struct session *s; /* NULL for the server's own operations */
	struct dpool *pool; /* OP_TIER, OP_BACKEND */
};

struct load_job;
struct rstore;
struct rfetch;
struct events_stats;

/* A device pool's block on its way to a file slot: in the store staging once ticket is done. */
struct pending_store {
	uint64_t ticket;
	uint32_t file_slot;
	struct tier_key key; /* tokens point into the pool's store_tokens */
};

/*
 * What clients make the daemon hold, at each level a limit applies to: a session, a uid, a
 * namespace of a pool, the whole daemon (account.c).
 */
struct usage {
	uint64_t bytes;     /* receive buffers, queued replies, rings, sequences' tables,
			       histories and scores (core_seq_bytes) */
	uint64_t blocks;    /* block-table entries held */
	uint32_t sequences; /* open sequences */
	uint32_t sessions;  /* client sessions */
};

/* One uid's sessions over every pool, and what they hold: the per-uid limits. */
struct uid_account {
	struct uid_account *next; /* in its hash bucket */
	uint32_t uid;
	uint32_t refs;            /* sessions, client and admin, pointing at it */
	uint32_t admin_sessions;
	struct usage use;
};
#define SERVER_UID_BUCKETS 256

/*
 * One namespace of a pool: what its sessions hold (the per-namespace limits) and its hit
 * statistics (the admin's per-tenant view).  An entry no session uses any more is kept for
 * its statistics until its uid has max_namespaces_per_uid of them, or the pool
 * POOL_NS_RETAINED; then the one unused the longest is folded into the pool's "(other)".
 */
struct ns_stats {
	uint64_t salt;
	char name[80];
	uint32_t uid;          /* the uid that made it: whose max_namespaces_per_uid it counts in */
	uint64_t last_used;    /* server_now_ns() when its last session left or joined */
	struct usage use;      /* its sessions': an entry with sessions is never folded */
	uint64_t lookups, query_blocks, hit_blocks, hit_tokens;
};

/* Unused namespace entries a pool keeps in all (entries in use are never folded). */
#define POOL_NS_RETAINED 1024

struct seq_owner {
	struct session *s; /* NULL: slot free */
	uint32_t idx;      /* position in s->seqs */
	uint64_t bytes;    /* what it is charged (core_seq_bytes of its size and state) */
	uint32_t dropped;  /* blocks the core dropped in the current call, not yet settled */
};

/* Demotions gathered into one move at most. */
#define OUT_MAX_BLOCKS 64u
/* How often the loop asks a backend with outstanding tickets how far it got (100 ms). */
#define BACKEND_CHECK_NS 100000000ull

/*
 * One level below a pool, as the daemon lists them for the core (pool.c: tier_add): the
 * core numbers them 1 .. ntiers in this order and knows nothing else of them.
 */
struct dpool_tier {
	const char *name; /* "host", "file": the tier label of the metrics and stats */
};

struct dpool {
	struct server *srv;
	const struct kvpd_pool_config *cfg;
	struct core *core;
	struct backend_pool mem;
	const struct backend_module *module; /* the backend's module (its words for errors), or NULL */
	/*
	 * The backend's queue (queue.c): the last ticket issued and the last known complete; per
	 * block, the last ticket touching it; per host-tier slot, the last move writing it; the
	 * last touching the staging.  Replies that hand out blocks wait for theirs (dpool_fence).
	 */
	uint64_t issued, completed;
	uint64_t *block_ticket, *slot_ticket, stage_ticket;
	/*
	 * A device pool's pinned stagings (tierio.c), stage_blocks blocks each: the requests' own;
	 * the deferred swap-file reads', a chunk at a time (NULL: reads within the request); the
	 * demotions straight to the files', on their way (NULL: waited for).
	 */
	void *stage, *load_stage, *store_stage;
	uint32_t stage_blocks;
	uint64_t load_stage_ticket; /* the last move in reading the load staging */
	struct pending_store *stores; /* a ring over the store staging: store_head, nstores */
	uint32_t *store_tokens;       /* block_tokens per store staging slot */
	uint32_t store_head, nstores;
	uint64_t queued_ops; /* operations queued (after the start-up measurements) */
	uint64_t cpu_waits; /* times the loop itself waited for the queue */
	/* Demotions to the host tier gathered into one move (queue.c: flush_demotions). */
	struct backend_move out[OUT_MAX_BLOCKS];
	uint32_t out_slots[OUT_MAX_BLOCKS];
	uint32_t nout;
	uint64_t held_replies; /* replies and ring batches that waited for the queue */
	uint32_t nheld;     /* sessions whose replies wait for the queue */
	int failed;         /* the backend failed (-errno): the daemon stops */
	struct op backend_op; /* the poll on the backend's done_fd */
	uint64_t backend_event;
	bool backend_armed;
	/*
	 * When the loop last asked the backend how far its queue got without an event.  While
	 * tickets are outstanding it asks every BACKEND_CHECK_NS anyway (server.c): a backend
	 * whose device failed may never signal again, and asking finds the error.
	 */
	uint64_t backend_checked_ns;
	uint64_t bytes_per_token, block_bytes;
	uint64_t layer_stride, kv_stride, slot_stride, head_stride;
	struct seq_owner *owners; /* by the core's sequence slot (low 32 bits of an id) */
	uint64_t *drops;          /* sequences with dropped blocks to settle (max_sequences) */
	uint32_t ndrops;
	struct ns_stats **ns;     /* its namespaces (pool.c: dpool_ns_join) */
	uint32_t nns, ns_cap;
	struct ns_stats ns_other; /* what folded entries counted */
	uint64_t ns_folded;       /* entries folded into it */
	uint32_t sessions;
	/* Tiers below the pool (NULL when not configured). */
	struct host_tier *host;
	struct file_tier *file;
	bool host_direct; /* a device pool's host tier is pinned: moves reach its slots directly */
	/*
	 * The core's levels below the pool: tiers[i] is level i + 1.  Dense: a pool with a file
	 * tier only has it at level 1.  host_level, file_level: theirs (0: not configured).
	 */
	struct dpool_tier tiers[CORE_MAX_TIERS];
	uint32_t ntiers, host_level, file_level;
	/* bytes/s the cost model uses (configured or measured), shown even without the tier */
	double host_bandwidth, file_bandwidth;
	uint32_t *lost;                /* file slots whose write failed, for core_tier_lost */
	uint32_t nlost, lost_cap;
	bool lost_overflow;
	/* Sessions waiting for memory (a request with wait_ms got ENOSPC), oldest first. */
	struct session *waiters, *waiters_tail;
	uint64_t epoch;        /* bumped whenever blocks may have become available */
	uint64_t waiters_epoch; /* the epoch the waiters were last retried at */
	/*
	 * Deferred tier loads (opens and resumes whose prompt the file tier holds), in order:
	 * the head's reads are in flight, the others wait for the file tier.
	 */
	struct load_job *jobs, *jobs_tail;
	uint32_t orphans;      /* LOADING sequences whose session closed (their job closes them) */
	struct op tier_op;     /* the poll on the file tier's eventfd */
	uint64_t tier_event;   /* what reading the eventfd returns */
	bool tier_armed;
	/*
	 * The remote tier (remoteio.c, docs/remote.md): its thread, its level in the core (the
	 * last, CORE_TIER_PROBED), the bytes/s the cost model uses (configured, or measured from
	 * the fetches with remote_tier_bandwidth = auto), and the poll on its eventfd.
	 */
	struct remote *remote;
	uint32_t remote_level;
	/*
	 * The KV event stream (eventsio.c, docs/events.md): its publisher, and the salts of the
	 * namespaces whose blocks it announces (events_namespaces, learnt as sessions attach).
	 */
	struct events *events;
	uint64_t *events_salts;
	size_t n_events_salts;
	struct events_known *events_known; /* what subscribers were told is where (eventsio.c) */
	char events_curve_public[41]; /* the CURVE server key subscribers need, Z85; "" if none */
	/*
	 * While the swap files are read back (dpool_events_hold): the blocks found, announced
	 * parents first once the scan is done, whatever order the reads completed in.
	 */
	bool events_holding;
	struct held_event *events_held;
	uint32_t *events_held_tokens;
	size_t n_events_held, events_held_cap;
	double remote_bandwidth;
	uint64_t remote_sample_bytes, remote_sample_ns; /* auto: fetched since the last update */
	uint32_t remote_fetching; /* fetch jobs submitted, not reaped */
	uint64_t remote_unlocal;  /* sessions whose namespace stays on this node (not named) */
	uint64_t remote_retry_ns; /* auto: when a rate that stopped the fetches is forgotten */
	struct op remote_op;
	bool remote_armed;
	/*
	 * A pool on a device: the remote tier's pinned staging, remote_stage_slots blocks.  A
	 * store is moved out into a slot, then sealed from it (remote_out: moves still queued,
	 * oldest first); a fetch is opened into slots, then moved in (remote_in: fetches whose
	 * moves in are still queued keep their slots).
	 */
	void *remote_stage;
	uint32_t *remote_stage_free;
	uint32_t remote_stage_nfree, remote_stage_slots;
	struct rstore *remote_out, *remote_out_tail;
	struct rfetch *remote_in;
	uint64_t remote_stage_full; /* stores and fetches refused for want of staging */
};

struct outbuf {
	struct outbuf *next;
	uint64_t fence; /* sent once the pool's queue passed this ticket (0: at once) */
	uint8_t *data;
	size_t len, off;
	int fds[KVP_FRAME_MAX_FDS];
	unsigned nfds;
};

struct session_ring {
	int mem_fd, sq_event_fd, cq_event_fd;
	void *mem;
	uint64_t bytes;
	struct kvp_ring_header *hdr; /* daemon-written at setup; never read back */
	struct kvp_ring_indices *sq, *cq;
	struct kvp_sqe *sqes;
	struct kvp_cqe *cqes;
	uint8_t *data;
	uint32_t entries, mask;
	uint64_t data_bytes;
	uint32_t sq_head; /* the daemon's own copies: shared memory is never trusted */
	uint32_t cq_tail;
	uint32_t cq_published; /* the tail the client was shown */
	uint64_t held_fence;   /* entries past cq_published wait for this ticket */
	uint32_t *scratch;     /* the daemon's copy of an entry's input (ring.c: copy_in) */
	uint32_t scratch_bytes; /* its size, charged to the session */
	struct op doorbell_op;
	bool doorbell_armed;
	bool doorbell_canceled; /* the session closed: a cancel of the poll is on its way */
	bool polled; /* the daemon polls this ring (ring_poll_us) instead of sleeping on it */
};

/*
 * A deferred open or resume (ops.c): its sequence is LOADING while its swap-file reads are in
 * flight, and the quota took charged blocks for it.
 */
struct deferred_load {
	uint64_t seq;
	uint32_t charged;
};

enum request_state {
	REQUEST_NONE,    /* no request in progress */
	REQUEST_RUNNING, /* being run: dispatched, retried or completed just now */
	REQUEST_WAITING, /* got -ENOSPC with wait_ms: on the pool's waiters until its deadline */
	REQUEST_LOADING, /* its sequence's tier loads are deferred: completed by session_loaded */
};

struct request_kind;

/*
 * A socket request that did not end where it was dispatched (client.c): the message, unpacked
 * once, and what its retries and its completion need.  Its frame has left the receive buffer.
 */
struct request {
	enum request_state state;
	const struct request_kind *kind; /* its type's run, reply and completion */
	ProtobufCMessage *msg;            /* the unpacked message; freed when the request ends */
	uint32_t seq;                     /* the frame's sequence: the reply's */
	uint32_t wait_ms;                 /* how long it may wait for memory (0: it does not) */
	uint64_t deadline_ns;             /* set when it first waits: it fails once this passes */
	uint64_t fence;                   /* its reply waits for this ticket of the pool's queue */
	struct deferred_load load;        /* REQUEST_LOADING */
	size_t bytes;                     /* charged for msg while it waits or loads */
};

struct session {
	struct server *srv;
	struct session *prev, *next;
	uint64_t id;
	int fd;
	bool admin;
	bool welcomed;
	bool closing;
	bool drained; /* stopping: shut for reading, so its peer can send nothing new */
	unsigned refs; /* in-flight operations + 1 while open */
	struct ucred cred;
	struct uid_account *acct; /* its uid's */
	uint64_t bytes;           /* what it holds (struct usage's bytes), charged up the levels */
	uint64_t accepted_ns;     /* the handshake must end by accepted_ns + hello_timeout_ms */
	uint64_t active_ns;       /* its last request: the idle timeout counts from here */
	bool paused; /* not read: its uid or the daemon holds more bytes than allowed (account.c) */
	unsigned nfds; /* fds the daemon holds for it: its socket, and its rings' three */
	char name[64];
	char ns_name[80];
	uint64_t salt;
	bool remote_ns; /* its namespace has a name every node of the remote tier shares */
	struct dpool *pool;
	struct ns_stats *stats;

	/* receiving */
	struct op recv_op;
	bool recv_armed;
	uint8_t *rbuf;
	size_t rlen, rcap;
	size_t skip; /* bytes of a frame refused for its size still to drop as they come */
	struct msghdr rmsg;
	struct iovec riov;
	union {
		char buf[KVP_FRAME_CMSG_BYTES];
		size_t align; /* cmsghdr alignment */
	} rcontrol;

	/* sending */
	struct op send_op;
	bool send_armed;
	struct outbuf *outq, *outq_tail;
	size_t queued_bytes;
	unsigned queued_frames;
	struct msghdr smsg;
	struct iovec siov;
	union {
		char buf[KVP_FRAME_CMSG_BYTES];
		size_t align; /* cmsghdr alignment */
	} scontrol;

	/* sequences this session owns, for quotas and for closing them on disconnect */
	uint64_t *seqs;
	uint32_t nseqs, cap_seqs;
	uint64_t blocks; /* block-table entries over its sequences */
	uint64_t requests;

	struct session_ring *ring;

	/* held: a reply or ring completion waits for the pool's queue (session_release). */
	bool held;

	/* The socket request in progress (at most one: the session is not read meanwhile). */
	struct request req;
	/* On the pool's waiters while req waits for memory. */
	struct session *wait_prev, *wait_next;
};

/* A session's receive buffer at first, and what a new session is charged. */
#define SESSION_RBUF_BYTES 65536
#define SESSION_FIRST_BYTES ((int64_t)(sizeof(struct session) + SESSION_RBUF_BYTES))

/* How long a stop waits for sessions to finish by default (kvpaged --drain-timeout). */
#define SERVER_DRAIN_TIMEOUT_MS 10000u

/* What main() tells the server beyond the configuration. */
struct server_options {
	const char *config_path;   /* re-read on SIGHUP */
	uint32_t drain_timeout_ms; /* SIGTERM: how long sessions may take to finish */
};

/* Why connections were refused at accept, or sessions closed by the daemon (counted). */
enum server_refusal {
	REFUSED_SESSIONS,     /* max_sessions client sessions open */
	REFUSED_UID_SESSIONS, /* the peer's uid has max_sessions_per_uid */
	REFUSED_ADMIN,        /* max_admin_sessions open */
	REFUSED_ADMIN_PEER,   /* not root, the daemon's user nor in admin_group */
	REFUSED_FDS,          /* too few file descriptors left (RLIMIT_NOFILE) */
	REFUSED_MEMORY,       /* the uid's or the daemon's byte cap is reached */
	CLOSED_HELLO_TIMEOUT, /* said nothing, or no Hello, within hello_timeout_ms */
	CLOSED_IDLE_TIMEOUT,  /* idle for idle_timeout_ms */
	REFUSED_ACL,          /* Hello for a pool whose ACL leaves the peer out */
	CLOSED_PROTOCOL,      /* broke the protocol (bad frames, bad ring entries) */
	ACCEPT_ERRORS,        /* accept failed (EMFILE, ENFILE, ENOMEM...): accepting paused */
	SERVER_NREFUSALS,
};

/* A listening socket's accept, paused for a while when accepting fails (EMFILE). */
struct listener {
	struct op op;       /* the multishot accept */
	struct op retry_op; /* the timer that ends a pause */
	struct __kernel_timespec retry_ts;
	bool armed, paused;
	uint32_t backoff_ms; /* the next pause; doubles while accepting keeps failing */
	uint64_t paused_ns;  /* when the current pause began */
	uint64_t failures;   /* failed accepts in the current episode */
};

struct http_endpoint;

struct server {
	struct kvpd_config *cfg;
	struct server_options opts;
	struct io_uring ring;
	int client_fd, admin_fd, signal_fd;
	bool client_activated, admin_activated; /* passed by systemd: its files, not ours */
	struct listener client_listener, admin_listener;
	struct op signal_op;
	/* Timers (io_uring timeouts): the periodic tick (watchdog, status) and the drain deadline. */
	struct op tick_op, drain_op;
	struct __kernel_timespec tick_ts, drain_ts;
	uint64_t watchdog_ns;      /* WATCHDOG=1 this often (half of WATCHDOG_USEC); 0: none */
	uint64_t next_watchdog_ns, next_status_ns;
	char status[256];          /* the last STATUS= sent */
	char reload_note[160];     /* how the last reload went, shown in STATUS= */
	bool drain_forced;         /* the drain deadline passed: every session was shut down */
	bool abandoned;            /* sessions outlived the deadline's grace: stop waiting */
	struct signalfd_siginfo siginfo;
	struct dpool *pools;
	size_t npools;
	struct session *sessions;
	uint32_t nsessions; /* client and admin */
	uint32_t nadmin;
	uint32_t npaused;   /* sessions with paused set */
	struct usage use;   /* every client session's */
	struct uid_account *uids[SERVER_UID_BUCKETS];
	uint64_t refused[SERVER_NREFUSALS];
	uint64_t refused_reported[SERVER_NREFUSALS]; /* as of the last summary line */
	uint64_t next_refusal_report_ns;
	/* File descriptors: RLIMIT_NOFILE, what the daemon holds beyond its sessions, theirs. */
	uint64_t fd_limit, fd_base, session_fds;
	/* The timer that closes silent and idle sessions: armed for sweep_at_ns (0: not armed). */
	struct op sweep_op;
	struct __kernel_timespec sweep_ts;
	uint64_t sweep_at_ns;
	uint64_t next_session_id;
	uint64_t requests;
	uint64_t started_ns;
	uint64_t poll_until_ns; /* busy-poll the polled rings until then */
	struct http_endpoint *http; /* the metrics endpoint (metrics_listen), or NULL */
	bool stopping;
	int exit_status;
};

/* server.c */
/*
 * Allocates every pool, then takes the sockets systemd passed or binds them.  On failure the
 * caller still calls server_done().  opts may be NULL (defaults).
 */
int server_init(struct server *srv, struct kvpd_config *cfg, const struct server_options *opts);
/*
 * The loop; tells systemd READY=1 first.  SIGHUP reloads the configuration; SIGTERM/SIGINT
 * drain: stop accepting, answer what each session already sent, close it, then return.
 * Returns 0 after a clean stop.
 */
int server_run(struct server *srv);
void server_done(struct server *srv);
/* What a reload found: the differences it applied and refused (kept when keep is set). */
struct server_reload_report {
	bool keep;
	bool truncated; /* out of memory: some differences are only in the log */
	char **applied;
	size_t napplied;
	char **refused;
	size_t nrefused;
	unsigned refused_count; /* every refused difference, kept or not */
	char error[512];        /* why the file did not load, or why nothing was reloaded */
};
/*
 * Reads the configuration file again and applies what can change live (SIGHUP, kvpagedctl
 * reload; trigger names which in the log).  0 when the file loaded, whatever was refused;
 * -errno with rep->error set when nothing changed.  server_reload_report_free() after.
 */
int server_reload(struct server *srv, const char *trigger, struct server_reload_report *rep);
void server_reload_report_free(struct server_reload_report *rep);
/* The sweep (hello and idle timeouts) runs by when at the latest. */
void server_schedule_sweep(struct server *srv, uint64_t when);
struct io_uring_sqe *server_sqe(struct server *srv);
uint64_t server_now_ns(void);
/* The earliest deadline of any waiting request, 0 when none waits. */
uint64_t server_next_deadline(const struct server *srv);

/* pool.c */
int dpool_init(struct dpool *p, const struct kvpd_pool_config *cfg);
/*
 * A clean stop, once every session is gone: with file_tier_persist, writes the pool's cached
 * blocks and the host tier's down to the swap files (the core chooses, core_tier_persist) for
 * at most file_tier_persist_stop_ms, so that a restart finds them; logs one line.
 */
void dpool_persist_at_stop(struct dpool *p);
void dpool_done(struct dpool *p);
/*
 * The entry of namespace (salt, name) for a session of uid joining it (made, or taken back,
 * on the way); NULL only when out of memory.  Unused entries beyond the uid's
 * max_namespaces_per_uid, or the pool's POOL_NS_RETAINED, are folded into "(other)".
 */
struct ns_stats *dpool_ns_stats(struct dpool *p, uint64_t salt, const char *name, uint32_t uid);
int dpool_verify(struct dpool *p, char *why, size_t why_len);
void dpool_describe(const struct dpool *p, Kvpaged__V1__PoolDescription *d);
/* Retries a pool's waiting requests when blocks may have become available or time is up. */
void dpool_retry_waiters(struct dpool *p, uint64_t now);

/* queue.c: the backend's queue */
/* Queues the demotions gathered so far (also done before anything else is queued or fenced). */
void dpool_flush(struct dpool *p);
/* Whether the pool's queue completed ticket t (0 always has). */
bool dpool_passed(struct dpool *p, uint64_t t);
/*
 * The ticket a reply handing out table[0..n) must wait for: the latest queued operation on any
 * of those blocks that is not done yet, else 0.
 */
uint64_t dpool_fence(struct dpool *p, const uint32_t *table, uint32_t n);

/* tierio.c: the tiers' stores, loads and deferred load jobs */
/*
 * Reaps the file tier's finished writes and forgets what they lost, and finishes the deferred
 * loads whose reads are in.  When the file tier's eventfd fires (OP_TIER), or after every
 * pass of the loop if that poll failed.
 */
void dpool_tier_poll(struct dpool *p);
/*
 * Reads in a LOADING sequence's tier loads for session s: host-tier ones at once, file-tier
 * ones without waiting.  0: all were in at once and the sequence is ACTIVE; 1: deferred, and
 * session_loaded(s) is called once it is ACTIVE (from dpool_tier_poll); -errno: nothing is
 * started (the sequence stays LOADING: the caller fails its loads with core_seq_loaded).
 */
int dpool_load(struct dpool *p, struct session *s, uint64_t seq);
/* Arms the poll on the file tier's eventfd (once, at start; again when it ends). */
void dpool_arm_tier_poll(struct server *srv, struct dpool *p);
/*
 * The remote tier (remoteio.c).  dpool_remote_open starts it for a pool that sets remote_tier
 * (pool.c appends its level); dpool_arm_remote_poll polls its eventfd; dpool_remote_poll reaps
 * what it completed (OP_REMOTE); dpool_remote_close stops it (before the pool's memory goes).
 */
int dpool_remote_open(struct dpool *p, uint32_t *ret_probe);
/* A device pool's staged stores whose moves out are done go to the tier; moves in free slots. */
void dpool_remote_settle(struct dpool *p);
void dpool_remote_stage_free(struct dpool *p);
void dpool_arm_remote_poll(struct server *srv, struct dpool *p);
void dpool_remote_poll(struct dpool *p);
void dpool_remote_close(struct dpool *p);
/* remote_tier_bandwidth = auto: forgets a rate that stopped the fetches, once it is old. */
void dpool_remote_recheck(struct dpool *p);
#define REMOTE_RETRY_NS (10ull * 1000000000u)
/* The root salt of a named namespace of the pool's remote tier (docs/remote.md). */
int dpool_remote_salt(const struct dpool *p, const char *name, uint64_t *ret);

/* eventsio.c: the pool's event stream. */
struct core_config;
int dpool_events_open(struct dpool *p, struct core_config *cc);
void dpool_events_close(struct dpool *p);
/* A session in namespace name (salt) attached: its blocks are announced if name is listed. */
void dpool_events_route(struct dpool *p, const char *name, uint64_t salt);
/* After core_drop_cache: AllBlocksCleared when nothing is left at any level. */
void dpool_events_dropped(struct dpool *p);
/* Holds the announcements of blocks stored until release, which sends them parents first. */
void dpool_events_hold(struct dpool *p);
void dpool_events_release(struct dpool *p);
/*
 * The remote tier's blocks, as far as this node knows: one it stored (the store came back
 * OK; tokens its block_tokens token ids), one a fetch found absent or failing its seal, and,
 * every tick, those older than remote_tier_ttl_ms.
 */
void dpool_events_remote_stored(struct dpool *p, uint64_t salt, uint64_t hash, uint64_t parent,
				bool has_parent, const uint32_t *tokens);
void dpool_events_remote_gone(struct dpool *p, uint64_t hash);
void dpool_events_tick(struct dpool *p);
/* events_get_stats, and what eventsio.c knows: the remote tier's blocks announced. */
void dpool_events_stats(const struct dpool *p, struct events_stats *out);
/* Arms the poll on the backend's done_fd (once, at start; again when it ends). */
void dpool_arm_backend_poll(struct server *srv, struct dpool *p);
/*
 * The backend completed queued work (done_fd fired, or after every pass of the loop if that
 * poll failed): releases held replies and starts deferred reads that waited for it.
 */
void dpool_backend_poll(struct dpool *p);

/* session.c */
/* Dispatches the whole frames in the receive buffer (after a wait, too). */
void session_dispatch(struct session *s);
/*
 * s's request got -ENOSPC and may wait: true when it waits (on the pool's waiters, the session
 * not read, until dpool_retry_waiters calls session_retry), false when its deadline passed.
 */
bool session_wait(struct session *s);
/* s's waiting request may go on (memory may have come free, or its time is up). */
void session_retry(struct session *s);
/*
 * A deferred load of s's request finished (its sequence is ACTIVE): completes the request,
 * then reads on; or, if s closed meanwhile, closes the sequence.
 */
void session_loaded(struct session *s, uint64_t seq);
/* s's reply or ring completions wait for its pool's queue (counted in the pool's nheld). */
void session_hold(struct session *s);
/* The pool's queue moved on: sends or publishes what of s's no longer waits. */
void session_release(struct session *s);
/* A new session on fd for a peer with credentials cred, holding a reference to acct. */
struct session *session_new(struct server *srv, int fd, bool admin, const struct ucred *cred,
			    struct uid_account *acct);
/* Reads s again if shared memory pressure held it (srv->npaused); the loop calls it. */
void server_resume_paused(struct server *srv);
void session_close(struct session *s, const char *why);
void session_unref(struct session *s);
void session_on_recv(struct session *s, struct io_uring_cqe *cqe);
void session_on_send(struct session *s, struct io_uring_cqe *cqe);
void session_arm_recv(struct session *s);
/* s made a request: its idle timeout starts again. */
void session_touch(struct session *s);
/* Queues a reply frame (msg NULL: empty payload).  Returns 0 or -ENOMEM (session closed). */
int session_reply(struct session *s, uint16_t type, uint32_t seq, const ProtobufCMessage *msg,
		  const int *fds, unsigned nfds);
/* The same, for a reply handing out blocks: it goes out once the pool's queue passed fence. */
int session_reply_fenced(struct session *s, uint64_t fence, uint16_t type, uint32_t seq,
			 const ProtobufCMessage *msg);
int session_reply_error(struct session *s, uint32_t seq, int error, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* account.c: what clients hold, against the limits of each level */
/* The account of uid, made on first use; NULL when out of memory.  Each get takes a reference. */
struct uid_account *account_uid_get(struct server *srv, uint32_t uid);
/* The account of uid if it has one (no reference taken). */
struct uid_account *account_uid_find(struct server *srv, uint32_t uid);
void account_uid_put(struct server *srv, struct uid_account *a);
/* Charges (or, negative, releases) what s holds, at every level above it too. */
void account_bytes(struct session *s, int64_t delta);
void account_blocks(struct session *s, int64_t delta);
void account_sequences(struct session *s, int32_t delta);
/* s's usage starts (stops) counting in namespace ns too: at Hello, at the session's end. */
void account_join_ns(struct session *s, struct ns_stats *ns);
void account_leave_ns(struct session *s);
/*
 * Whether s may take that many more bytes, blocks and sequences at every level: 0, or -EMFILE
 * (sequences) or -EDQUOT with the limit in words in *why.  Admin sessions always may.
 */
int account_check(const struct session *s, uint64_t bytes, uint64_t blocks, uint32_t sequences,
		  const char **why);
/* Whether a level above s holds more bytes than its cap (queued replies did it): s waits. */
bool account_over(const struct session *s);
/*
 * Recomputes every level's usage from what the sessions hold and compares (kvpagedctl verify):
 * 0, or -EUCLEAN with the first difference in why.
 */
int account_verify(const struct server *srv, char *why, size_t len);

/* ops.c: sequence operations shared by the socket and the rings */
struct seq_result {
	uint64_t seq;
	uint32_t cached, first_changed, replaced;
	uint32_t released; /* commit: entries the retention policy released */
	uint32_t recompute; /* resume: trailing tokens whose K/V must be computed again */
	const uint32_t *table; /* valid until the next core call */
	uint32_t table_len;
	/* The reply hands out blocks: it waits for this ticket of the pool's queue (0: none). */
	uint64_t fence;
};
/* retention: NULL is full; else policy, n_sink and recent as in core_open. */
/*
 * defer (the socket; NULL on the rings): when the file tier holds some of the prompt, its reads
 * go on without the event loop waiting: -EINPROGRESS with *defer filled, and session_loaded()
 * is called once they are in (ops_loaded_result gives the result then).
 */
int ops_open(struct session *s, const uint32_t *tokens, uint32_t n, uint64_t extra,
	     uint32_t flags, uint32_t priority, const struct core_open *retention,
	     struct deferred_load *defer, struct seq_result *res, const char **why);
/* The result of the open or resume whose loads were deferred, now that they are in. */
int ops_loaded_result(struct session *s, const struct deferred_load *d, bool resume,
		      struct seq_result *res);
int ops_park(struct session *s, uint64_t seq, const char **why);
/* res->recompute gets the tokens to recompute; res->table the whole table. */
int ops_resume(struct session *s, uint64_t seq, struct deferred_load *defer,
	       struct seq_result *res, const char **why);
int ops_append(struct session *s, uint64_t seq, const uint32_t *tokens, uint32_t n,
	       struct seq_result *res, const char **why);
int ops_commit(struct session *s, uint64_t seq, uint32_t ntokens, struct seq_result *res,
	       const char **why);
int ops_fork(struct session *s, uint64_t seq, struct seq_result *res, const char **why);
int ops_close(struct session *s, uint64_t seq, const char **why);
/* h2o: adds a decode step's attention to the running scores (core_seq_scores). */
int ops_scores(struct session *s, uint64_t seq, uint32_t first, const float *weights,
	       uint32_t n, const char **why);
int ops_lookup(struct session *s, const uint32_t *tokens, uint32_t n, uint64_t extra,
	       uint32_t flags, uint32_t *cached, const char **why);
/* *ret_fence: what a reply handing out info's blocks waits for. */
int ops_info(struct session *s, uint64_t seq, struct core_seq_info *info, uint64_t *ret_fence,
	     const char **why);
void ops_close_all(struct session *s);
/* Charges s for seq as its size and state now call for (core_seq_bytes). */
void ops_recharge(struct session *s, uint64_t seq);

/* client.c / admin.c: message dispatch */
/*
 * Starts the request in frame h (payload is its protobuf).  It either ends there (replied to,
 * or the session closed) or stays in s->req: waiting for memory (client_retry runs it again)
 * or for its deferred loads (client_loaded completes it).  The frame is not needed after.
 */
void client_dispatch(struct session *s, const struct kvp_frame_header *h, const uint8_t *payload);
/* Runs s's waiting request again, from its unpacked message. */
void client_retry(struct session *s);
/* s's request's deferred loads are in: completes it (its reply). */
void client_loaded(struct session *s);
/* Ends s's request, whatever its state: frees its message. */
void client_request_end(struct session *s);
void admin_dispatch(struct session *s, const struct kvp_frame_header *h, const uint8_t *payload);
/* Whether the peer on fd may use the admin socket: root, the daemon's user, admin_group. */
bool admin_peer_allowed(const struct server *srv, int fd, const struct ucred *cred);
/* What a refusal or a close by the daemon is counted as, in words (a limit's name). */
const char *server_refusal_name(enum server_refusal r);
/*
 * A Prometheus label value for the metrics text: s with backslash, double quote and newline
 * escaped (\\ \" \n), cut short before an escape that would not fit in n bytes (n >= 1).
 * Returns out, always terminated.
 */
const char *admin_label_value(const char *s, char *out, size_t n);

/*
 * The Prometheus text of every metric (kvpagedctl metrics, GET /metrics): 0 and a malloc'ed
 * *ret_text of *ret_len bytes (the caller frees it), or -ENOMEM.
 */
int admin_metrics_text(struct server *srv, char **ret_text, size_t *ret_len);

/*
 * A pool's remote tier for the Pools and Stats replies and the metrics: tier points into the
 * rest (the counters copied from the tier thread, the nodes' names), so it is valid as long
 * as the struct is.  Large (the nodes): allocate it.
 */
struct admin_remote {
	Kvpaged__V1__RemoteTier tier;
	Kvpaged__V1__RemoteNode nodes[REMOTE_MAX_NODES], *nodep[REMOTE_MAX_NODES];
	Kvpaged__V1__RemoteCount misses[REMOTE_NSTATUS], *missp[REMOTE_NSTATUS];
	Kvpaged__V1__RemoteCount verify[SEAL_NREASONS], *verifyp[SEAL_NREASONS];
	struct remote_stats stats;
};

/* Fills *ret from p's remote tier: false (and *ret untouched) when p has none. */
bool admin_remote_fill(struct dpool *p, struct admin_remote *ret);

/* The value eviction policy's learned state, for the Stats reply and the metrics. */
struct admin_eviction {
	Kvpaged__V1__EvictionPolicy policy;
	Kvpaged__V1__EvictionClass classes[CORE_VALUE_CLASSES], *classp[CORE_VALUE_CLASSES];
	struct core_value_stats stats;
};

/* Fills *ret from p's value policy: false (and *ret untouched) for an LRU pool. */
bool admin_eviction_fill(struct dpool *p, struct admin_eviction *ret);

/* http.c: the HTTP metrics endpoint, driven by the loop (no thread of its own) */
/*
 * Binds metrics_listen and starts the endpoint when it is set (else does nothing): 0, or a
 * logged -errno, and the daemon does not start.  http_done() undoes it, also after a failure.
 */
int http_start(struct server *srv);
void http_done(struct server *srv);
/* Its epoll fd polled readable (OP_HTTP). */
void http_on_poll(struct server *srv, struct io_uring_cqe *cqe);
/* The sweep timer fired: its connections' deadlines and libmicrohttpd's own. */
void http_sweep(struct server *srv);
struct http_stats {
	uint32_t connections;
	uint64_t requests, refused_connections, timed_out;
};
/* What the endpoint did since start (zeros when there is none). */
void http_stats(const struct server *srv, struct http_stats *ret);

/* ring.c: shared-memory rings */
int ring_setup(struct session *s, uint32_t entries, uint32_t data_bytes);
/* The bytes ring_setup charges for rings of that size. */
uint64_t ring_bytes(uint32_t entries, uint32_t data_bytes);
/* The session closes: stops the doorbell (the ring itself stays until ring_free). */
void ring_destroy(struct session *s);
/* Unmaps and closes the ring, with the session's last reference. */
void ring_free(struct session *s);
void ring_arm_doorbell(struct session *s);
void ring_on_doorbell(struct session *s, struct io_uring_cqe *cqe);
/* Executes every pending submission; false (with why) when the session must be closed. */
bool ring_process(struct session *s, const char **why);
/* One pass over the polled rings; returns whether any had work.  With expire, rings with
 * nothing to do go back to sleeping on their doorbell. */
bool ring_poll_all(struct server *srv, bool expire);
/* Shows the client the completions that waited for the pool's queue, once they may be. */
void ring_release(struct session *s);

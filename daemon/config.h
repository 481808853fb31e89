/* SPDX-License-Identifier: MIT */
/*
 * kvpaged.conf(5): the daemon's configuration, an INI file read with libinih.  One schema table
 * in config.c drives parsing, defaults and range checks; everything is checked at load, so a
 * loaded struct kvpd_config is always valid.  See docs/configuration.md.
 *
 * Nothing here is thread-safe; the daemon loads its configuration on its one thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

#define KVPD_CONFIG_PATH "/etc/kvpaged/kvpaged.conf"

/* How a client's namespace (the salt of its prefix cache) follows from its credentials. */
/* The same order as daemon/core's enum core_policy. */
enum kvpd_policy { KVPD_POLICY_LRU, KVPD_POLICY_PRIORITY, KVPD_POLICY_COST };
/* The same order as daemon/core's enum core_eviction (docs/policy.md). */
enum kvpd_eviction { KVPD_EVICT_LRU, KVPD_EVICT_VALUE };

/* Where a pool's memory lives (docs/cuda.md). */
enum kvpd_backend {
	KVPD_BACKEND_HOST, /* a memfd in host memory */
	KVPD_BACKEND_CUDA, /* GPU memory through the CUDA module; the pool fails without it */
	KVPD_BACKEND_AUTO, /* cuda if the module loads and finds a GPU, else host */
};

/* When the remote tier publishes a block (docs/remote.md). */
enum kvpd_remote_write {
	KVPD_REMOTE_COMMIT, /* when it is committed: other nodes can hit it at once */
	KVPD_REMOTE_EVICT,  /* only when it leaves the node's memory (the swap files keep it too) */
};

enum kvpd_namespace_mode {
	KVPD_NS_UID,    /* one namespace per peer uid */
	KVPD_NS_GID,    /* one namespace per peer primary gid */
	KVPD_NS_SHARED, /* one namespace for every client of the pool */
};

/* One [pool NAME] section. */
struct kvpd_pool_config {
	char name[64]; /* 1..63 characters of [A-Za-z0-9_.-] */
	uint32_t layers, kv_heads, head_dim, element_bytes, block_tokens, capacity_blocks;
	uint32_t max_sequences;  /* open sequences in the whole pool */
	uint32_t max_seq_tokens; /* tokens in one sequence */
	uint32_t vocab_size;     /* token ids must be below this; 0 accepts any id */
	enum kvpd_namespace_mode namespace_mode;
	enum kvpd_policy policy; /* which parked sequences are dropped first */
	enum kvpd_eviction eviction; /* which cached block is reused first */
	uint32_t value_records;      /* eviction = value: closed chains remembered (0: capacity) */
	enum kvpd_backend backend;
	char *backend_module; /* the shared object backend = cuda or auto loads */
	uint32_t device;      /* the GPU (an ordinal) of a cuda or auto pool; 0 for host pools */
	bool copy_thread;     /* host memory: copies and moves run on a helper thread */
	uint64_t namespace_seed;
	/* Tiers below the pool (see docs/tiers.md); 0 blocks: no such tier. */
	uint32_t host_tier_blocks;
	bool host_tier_plain; /* a GPU pool's host tier not pinned: committed as it fills */
	uint32_t file_tier_blocks;
	char **swap_files; /* the file tier's files, slots striped across them */
	size_t n_swap_files;
	bool file_tier_persist; /* keep cached blocks in the files across restarts */
	/* with persist: how long a clean stop may spend writing cached blocks to the files */
	uint32_t file_tier_persist_stop_ms;
	bool file_tier_blocking_reads; /* opens and resumes read the files within the request */
	uint32_t file_tier_queue_depth;
	/* The cost model: 0 is unknown; a bandwidth of KVPD_MEASURE is measured at start. */
	double model_params;
	double engine_flops;
	uint64_t host_tier_bandwidth; /* bytes per second */
	uint32_t window;              /* sliding-window pool: tokens each sequence keeps; 0: none */
	uint64_t file_tier_bandwidth;
	/*
	 * The remote tier (docs/remote.md): remote_tier NULL means none, and then every other
	 * remote_tier_* key is refused.  The key files were checked at load (seal_key_load);
	 * the daemon reads them again at start, since they may have changed in between.
	 */
	char *remote_tier;	      /* redis://HOST:PORT[,HOST:PORT...], checked at load */
	char *remote_tier_key_file;   /* the current key: seals, names and opens */
	char **remote_tier_old_key_files; /* retired keys during a rotation: they only open */
	size_t n_remote_tier_old_key_files;
	enum kvpd_remote_write remote_tier_write;
	uint32_t remote_tier_timeout_ms;   /* a fetch's deadline */
	uint32_t remote_tier_max_inflight; /* blocks queued or in flight to the tier thread */
	uint64_t remote_tier_ttl_ms;	   /* PX of every value stored; 0: none */
	uint64_t remote_tier_bandwidth;    /* bytes per second; 0 unknown, KVPD_MEASURE */
	bool remote_tier_map_names;	   /* uid/gid namespaces named by user/group name */
	/*
	 * The KV event stream (docs/events.md): events_endpoint NULL means none, and then every
	 * other events_* key is refused.
	 */
	char *events_endpoint;	      /* ipc://PATH or tcp://HOST:PORT (CURVE): the PUB socket */
	char *events_replay_endpoint; /* the same: the ROUTER that replays; NULL: none */
	char *events_curve_secret_key_file;  /* CURVE: the daemon's secret key; NULL: none */
	char *events_curve_allowed_keys_file; /* CURVE: the subscribers' public keys */
	char *events_topic;	      /* the first frame of every message */
	char *events_format;	      /* "map" or "array" */
	char *events_sched;	      /* "idle": the publisher's threads SCHED_IDLE; or "normal" */
	char *events_namespaces;      /* the namespaces whose blocks are announced, comma separated */
	uint32_t events_batch_ms;     /* a batch at most this often */
	uint32_t events_buffer_batches; /* batches kept for replay */
	uint32_t events_queue;	      /* events waiting for the publisher; past it dropped */
	uint32_t events_hwm;	      /* the PUB socket's high-water mark, in messages */
	uint32_t events_remote_blocks; /* the remote tier's blocks announced at once; 0: none */
	/* The ACL; both empty lets in any peer that can connect to the socket. */
	uint32_t *allow_uids;
	size_t n_allow_uids;
	uint32_t *allow_gids;
	size_t n_allow_gids;
};

#define KVPD_MEASURE UINT64_MAX

/*
 * [limits]: what clients may make the daemon hold, per session, per uid, per namespace and in
 * all (docs/daemon.md, Limits), and how long a connection may say nothing.
 */
struct kvpd_limits {
	uint32_t max_sequences;
	uint32_t max_blocks; /* 0: the pool's capacity */
	uint32_t max_inflight;
	uint32_t max_tokens_per_request;
	uint32_t max_ring_entries; /* a power of two */
	uint64_t max_ring_data_bytes;
	uint64_t max_queued_bytes;
	uint32_t max_wait_ms; /* the longest a request may wait for memory */
	uint32_t hello_timeout_ms; /* a connection that has not said Hello (or asked) is closed */
	uint32_t idle_timeout_ms;  /* a session holding nothing this long is closed; 0: never */
	bool idle_timeout_with_sequences; /* ... and one holding sequences too */
	/* Bytes: receive buffers, queued replies, rings, sequences' tables, histories, scores. */
	uint64_t max_session_bytes;
	uint64_t max_bytes_per_uid;
	uint64_t max_bytes_per_namespace; /* 0: no cap of its own */
	uint64_t max_total_bytes;         /* every client session together */
	uint32_t max_sequences_per_uid;
	uint32_t max_blocks_per_uid;        /* 0: no cap beyond each pool's capacity */
	uint32_t max_sequences_per_namespace; /* 0: no cap of its own */
	uint32_t max_blocks_per_namespace;    /* 0: no cap of its own */
	uint32_t max_namespaces_per_uid; /* statistics entries a uid's namespaces keep, per pool */
};

struct kvpd_config {
	char *socket_path;
	char *admin_socket_path;
	bool has_admin_gid; /* false: only root may use the admin socket */
	uint32_t admin_gid;
	uint32_t max_sessions;       /* client sessions */
	uint32_t max_sessions_per_uid; /* client sessions of one uid */
	uint32_t max_admin_sessions; /* admin sessions, apart from the clients' */
	uint32_t log_rate_limit_interval_ms;
	uint32_t log_rate_limit_burst; /* lines per call site per interval; 0: no limit */
	uint32_t ring_poll_us; /* busy-poll active rings this long before sleeping; 0: never */
	uint64_t max_frame_bytes;
	/* The HTTP metrics endpoint (daemon/server/http.c); NULL: none. */
	char *metrics_listen;		   /* IPV4:PORT or [IPV6]:PORT, checked at load */
	uint32_t metrics_max_connections;  /* connections at once; more are closed at accept */
	uint64_t metrics_max_request_bytes; /* request line and headers */
	uint32_t metrics_timeout_ms;	   /* from accept to the last byte of the reply */
	struct kvpd_limits limits;
	struct kvpd_pool_config *pools; /* in file order; at least one */
	size_t npools;
};

/*
 * Loads and checks the file at path.  Returns 0 and fills *ret (free it with config_free());
 * -EINVAL when the configuration is wrong (or the file is over 1 MiB); -errno when the file
 * cannot be read or a user or group name cannot be looked up (NSS failing, not an unknown
 * name: that is -EINVAL); -ENOMEM.  On failure *ret is untouched and, when err_len > 0, err
 * holds one line naming the file, the line, the section and the key
 * ("kvpaged.conf:12: [pool main] layers: 0 is out of range 1..1024").
 */
int config_load_file(const char *path, struct kvpd_config *ret, char *err, size_t err_len);

/* As config_load_file(), from text in memory; name_for_messages stands for the file name. */
int config_load_string(const char *text, const char *name_for_messages, struct kvpd_config *ret,
		       char *err, size_t err_len);

/* Frees what a load allocated and zeroes *c.  Accepts NULL and a zeroed struct. */
void config_free(struct kvpd_config *c);

/*
 * The pool named name, or the first pool when name is NULL or empty.  NULL when there is no
 * such pool.  The pointer is valid until config_free().
 */
const struct kvpd_pool_config *config_find_pool(const struct kvpd_config *c, const char *name);

/*
 * Parses a byte count: decimal digits, optionally followed (no space) by one suffix that means
 * it exactly: K or k, KiB, M, MiB, G, GiB, T, TiB (powers of 1024) or KB or kB, MB, GB, TB
 * (powers of 1000).  Returns 0, -EINVAL (not a size) or -ERANGE (more than 2^64 - 1 bytes);
 * *ret is untouched on failure.
 */
int config_parse_size(const char *s, uint64_t *ret);

/*
 * Parses a TCP address to listen on: IPV4:PORT or [IPV6]:PORT, numeric (no name is looked
 * up), port 1 to 65535.  Returns 0 and fills *ret and *ret_len, or -EINVAL (untouched).
 */
int config_parse_listen(const char *s, struct sockaddr_storage *ret, socklen_t *ret_len);

/*
 * Reloading (SIGHUP): applies next, a freshly loaded configuration, to the running one in place,
 * so that pointers into live (a pool's config, the limits) stay valid.  Keys the daemon reads
 * afresh wherever it uses them take next's values: [daemon] max_sessions, ring_poll_us,
 * max_frame_bytes, metrics_max_connections and metrics_timeout_ms, every [limits] key, a pool's allow_users, allow_groups,
 * file_tier_blocking_reads and file_tier_persist_stop_ms.  Every other key
 * whose value differs keeps its running value.  Pools are matched by name; a pool added,
 * removed or moved changes nothing.  report (may be NULL) is called once per difference, with
 * applied telling which kind it is and what a line like "[pool main] capacity_blocks: 4096 ->
 * 8192".  next keeps what live no longer uses: config_free() it afterwards.  Returns how many
 * keys were applied.
 */
int config_apply_live(struct kvpd_config *live, struct kvpd_config *next,
		      void (*report)(void *ctx, bool applied, const char *what), void *ctx);

/*
 * Writes the configuration in kvpaged.conf syntax, every key with its effective value, for
 * `kvpaged --check-config`.  Loading the output gives the same configuration back.
 */
void config_print(const struct kvpd_config *c, FILE *f);

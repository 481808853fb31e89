/* SPDX-License-Identifier: MIT */
/*
 * kvpaged.conf.  libinih splits the text into sections and key = value pairs; one schema table
 * drives everything after that: which keys exist in which section, their types, defaults,
 * ranges, where they land in struct kvpd_config, and how config_print() writes them back.
 *
 * libinih as Debian builds it calls the handler without a line number, cuts section names to
 * 49 characters, splits a line longer than its buffer into several "lines" (so a long value
 * would be silently cut short) and never tells the handler about a section with no keys.  So
 * it reads through our own line reader, which counts lines, refuses over-long ones, and notes
 * a line that looks like a section header; a header line is one libinih did not call the
 * handler for (an indented "[x]" after a key is a continuation line to libinih, and then the
 * handler is called for it).  The section name is taken from that line, which lets pool names
 * have up to 63 characters, and is cross-checked against libinih's own.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <ini.h>
#include <inttypes.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/config-internal.h"
#include "daemon/server/events.h"
#include "daemon/tier/redis.h"
#include "daemon/tier/seal.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)

/* A file bigger than this is a mistake (a log file named by accident), not a configuration. */
#define CONFIG_MAX_FILE_BYTES (1024 * 1024)

/* libinih's MAX_SECTION: it keeps at most this many characters minus one of a section name. */
#define INIH_MAX_SECTION 50

#define POOL_NAME_MAX 63

/* Bigger pools are surely a typo; the bound also keeps every size product far from overflow. */
#define POOL_MAX_BYTES (UINT64_C(1) << 48)

#define KEY_REQUIRED (1u << 0)
#define KEY_POW2 (1u << 1)
#define KEY_AUTO (1u << 2) /* a size that may be 'auto': measured at start (KVPD_MEASURE) */
#define KEY_FILE (1u << 3) /* a path that names a file, not a socket: up to PATH_MAX */

/* Where backend modules are installed ($(pkglibdir)); the build passes it. */
#ifndef KVPD_MODULEDIR
#define KVPD_MODULEDIR "/usr/local/lib/kvpaged"
#endif

#define NUMBER(sec, st, key, t, member, d, lo, hi, fl)                                             \
	{                                                                                          \
		.name = key, .section = sec, .type = t, .flags = fl, .def = d, .min = lo,          \
		.max = hi, .offset = offsetof(st, member)                                          \
	}
#define DAEMON_NUMBER(t, member, d, lo, hi)                                                        \
	NUMBER(SECTION_DAEMON, struct kvpd_config, #member, t, member, d, lo, hi, 0)
#define LIMIT(t, member, d, lo, hi, fl)                                                            \
	NUMBER(SECTION_LIMITS, struct kvpd_config, #member, t, limits.member, d, lo, hi, fl)
#define POOL_NUMBER(t, member, d, lo, hi, fl)                                                      \
	NUMBER(SECTION_POOL, struct kvpd_pool_config, #member, t, member, d, lo, hi, fl)

/* ipc://ABSOLUTE-PATH (a Unix socket's), or tcp://HOST:PORT (check_events: with CURVE only). */
static int events_endpoint_check(const char *v, char *why, size_t len)
{
	if (!strncmp(v, "tcp://", 6)) {
		const char *colon = strrchr(v + 6, ':');

		if (!colon || colon == v + 6 || !colon[1] || strspn(colon + 1, "0123456789") !=
		    strlen(colon + 1)) {
			snprintf(why, len, "'%s' is not tcp://HOST:PORT", v);
			return -EINVAL;
		}
		return 0;
	}
	if (strncmp(v, "ipc://", 6) || v[6] != '/') {
		snprintf(why, len, "'%s' is neither ipc:///ABSOLUTE/PATH nor tcp://HOST:PORT", v);
		return -EINVAL;
	}
	if (strlen(v + 6) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
		snprintf(why, len, "'%s': the path is longer than a Unix socket's", v);
		return -EINVAL;
	}
	return 0;
}

static int events_topic_check(const char *v, char *why, size_t len)
{
	if (strlen(v) > 255) {
		snprintf(why, len, "longer than 255 bytes");
		return -EINVAL;
	}
	for (const char *c = v; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f) {
			snprintf(why, len, "a control character in the topic");
			return -EINVAL;
		}
	return 0;
}

static int events_format_check(const char *v, char *why, size_t len)
{
	if (strcmp(v, "map") && strcmp(v, "array")) {
		snprintf(why, len, "'%s' is not one of map, array", v);
		return -EINVAL;
	}
	return 0;
}

static int events_sched_check(const char *v, char *why, size_t len)
{
	if (strcmp(v, "idle") && strcmp(v, "normal")) {
		snprintf(why, len, "'%s' is not one of idle, normal", v);
		return -EINVAL;
	}
	return 0;
}

/* Namespace names as the daemon names them: shared, uid:N, gid:N, each with /NARROW. */
static int events_namespaces_check(const char *v, char *why, size_t len)
{
	for (const char *s = v; *s;) {
		size_t n = strcspn(s, ","), lead = strspn(s, " \t"), end = n;

		while (end > lead && (s[end - 1] == ' ' || s[end - 1] == '\t'))
			end--;
		if (end == lead) {
			snprintf(why, len, "an empty name in the list");
			return -EINVAL;
		}
		if (strncmp(s + lead, "shared", 6) && strncmp(s + lead, "uid:", 4) &&
		    strncmp(s + lead, "gid:", 4)) {
			snprintf(why, len, "'%.*s' is not a namespace (shared, uid:N or gid:N, "
				 "each maybe with /NAME)", (int)(end - lead), s + lead);
			return -EINVAL;
		}
		s += n;
		if (*s == ',')
			s++;
	}
	return 0;
}

static const struct config_key schema[] = {
	{ .name = "socket", .section = SECTION_DAEMON, .type = TYPE_PATH,
	  .def_path = "/run/kvpaged/kvpaged.sock",
	  .offset = offsetof(struct kvpd_config, socket_path) },
	{ .name = "admin_socket", .section = SECTION_DAEMON, .type = TYPE_PATH,
	  .def_path = "/run/kvpaged/admin.sock",
	  .offset = offsetof(struct kvpd_config, admin_socket_path) },
	{ .name = "admin_group", .section = SECTION_DAEMON, .type = TYPE_GROUP,
	  .offset = offsetof(struct kvpd_config, admin_gid),
	  .aux_offset = offsetof(struct kvpd_config, has_admin_gid) },
	DAEMON_NUMBER(TYPE_U32, max_sessions, 256, 1, 65536),
	DAEMON_NUMBER(TYPE_U32, max_sessions_per_uid, 64, 1, 65536),
	DAEMON_NUMBER(TYPE_U32, max_admin_sessions, 16, 1, 1024),
	DAEMON_NUMBER(TYPE_U32, log_rate_limit_interval_ms, 30000, 1, 3600000),
	DAEMON_NUMBER(TYPE_U32, log_rate_limit_burst, 200, 0, 1000000),
	DAEMON_NUMBER(TYPE_SIZE, max_frame_bytes, 8 * MiB, 4 * KiB, 256 * MiB),
	DAEMON_NUMBER(TYPE_U32, ring_poll_us, 0, 0, 1000000),
	{ .name = "metrics_listen", .section = SECTION_DAEMON, .type = TYPE_LISTEN,
	  .offset = offsetof(struct kvpd_config, metrics_listen) },
	DAEMON_NUMBER(TYPE_U32, metrics_max_connections, 8, 1, 1024),
	DAEMON_NUMBER(TYPE_SIZE, metrics_max_request_bytes, 8 * KiB, 4 * KiB, 1 * MiB),
	DAEMON_NUMBER(TYPE_U32, metrics_timeout_ms, 10000, 100, 600000),

	LIMIT(TYPE_U32, max_sequences, 1024, 1, 1048576, 0),
	LIMIT(TYPE_U32, max_blocks, 0, 0, UINT64_C(1) << 31, 0),
	LIMIT(TYPE_U32, max_inflight, 256, 1, 65536, 0),
	LIMIT(TYPE_U32, max_tokens_per_request, 1048576, 1, 16777216, 0),
	LIMIT(TYPE_U32, max_ring_entries, 4096, 1, 65536, KEY_POW2),
	LIMIT(TYPE_SIZE, max_ring_data_bytes, 16 * MiB, 4 * KiB, 1 * GiB, 0),
	LIMIT(TYPE_SIZE, max_queued_bytes, 16 * MiB, 64 * KiB, 1 * GiB, 0),
	LIMIT(TYPE_U32, max_wait_ms, 60000, 0, 3600000, 0),
	LIMIT(TYPE_U32, hello_timeout_ms, 3000, 10, 600000, 0),
	LIMIT(TYPE_U32, idle_timeout_ms, 600000, 0, 86400000, 0),
	{ .name = "idle_timeout_with_sequences", .section = SECTION_LIMITS, .type = TYPE_BOOL,
	  .offset = offsetof(struct kvpd_config, limits.idle_timeout_with_sequences) },
	LIMIT(TYPE_SIZE, max_session_bytes, 256 * MiB, 1 * MiB, UINT64_C(1) << 40, 0),
	LIMIT(TYPE_SIZE, max_bytes_per_uid, 1 * GiB, 1 * MiB, UINT64_C(1) << 40, 0),
	LIMIT(TYPE_SIZE, max_bytes_per_namespace, 0, 0, UINT64_C(1) << 40, 0),
	LIMIT(TYPE_SIZE, max_total_bytes, 4 * GiB, 1 * MiB, UINT64_C(1) << 44, 0),
	LIMIT(TYPE_U32, max_sequences_per_uid, 1024, 1, 16777216, 0),
	LIMIT(TYPE_U32, max_blocks_per_uid, 0, 0, UINT64_C(1) << 31, 0),
	LIMIT(TYPE_U32, max_sequences_per_namespace, 0, 0, 16777216, 0),
	LIMIT(TYPE_U32, max_blocks_per_namespace, 0, 0, UINT64_C(1) << 31, 0),
	LIMIT(TYPE_U32, max_namespaces_per_uid, 64, 1, 65536, 0),

	POOL_NUMBER(TYPE_U32, layers, 0, 1, 1024, KEY_REQUIRED),
	POOL_NUMBER(TYPE_U32, kv_heads, 0, 1, 1024, KEY_REQUIRED),
	POOL_NUMBER(TYPE_U32, head_dim, 0, 1, 16384, KEY_REQUIRED),
	POOL_NUMBER(TYPE_U32, element_bytes, 0, 1, 8, KEY_REQUIRED),
	POOL_NUMBER(TYPE_U32, block_tokens, 0, 1, 65536, KEY_REQUIRED),
	POOL_NUMBER(TYPE_U32, capacity_blocks, 0, 1, UINT64_C(1) << 30, KEY_REQUIRED),
	POOL_NUMBER(TYPE_U32, max_sequences, 4096, 1, 16777216, 0),
	POOL_NUMBER(TYPE_U32, max_seq_tokens, 1048576, 1, UINT64_C(1) << 31, 0),
	POOL_NUMBER(TYPE_U32, vocab_size, 0, 0, UINT32_MAX, 0),
	{ .name = "namespace", .section = SECTION_POOL, .type = TYPE_NAMESPACE, .def = KVPD_NS_UID,
	  .offset = offsetof(struct kvpd_pool_config, namespace_mode) },
	{ .name = "policy", .section = SECTION_POOL, .type = TYPE_POLICY, .def = KVPD_POLICY_LRU,
	  .offset = offsetof(struct kvpd_pool_config, policy) },
	{ .name = "eviction", .section = SECTION_POOL, .type = TYPE_EVICTION,
	  .def = KVPD_EVICT_LRU, .offset = offsetof(struct kvpd_pool_config, eviction) },
	POOL_NUMBER(TYPE_U32, value_records, 0, 64, 1u << 24, 0),
	POOL_NUMBER(TYPE_U64, namespace_seed, 0, 0, UINT64_MAX, 0),
	{ .name = "backend", .section = SECTION_POOL, .type = TYPE_BACKEND, .def = KVPD_BACKEND_HOST,
	  .offset = offsetof(struct kvpd_pool_config, backend) },
	{ .name = "backend_module", .section = SECTION_POOL, .type = TYPE_PATH, .flags = KEY_FILE,
	  .def_path = KVPD_MODULEDIR "/kvpaged-cuda.so",
	  .offset = offsetof(struct kvpd_pool_config, backend_module) },
	POOL_NUMBER(TYPE_U32, device, 0, 0, 1023, 0),
	{ .name = "copy_thread", .section = SECTION_POOL, .type = TYPE_BOOL,
	  .offset = offsetof(struct kvpd_pool_config, copy_thread) },
	POOL_NUMBER(TYPE_U32, window, 0, 1, UINT64_C(1) << 31, 0),
	POOL_NUMBER(TYPE_U32, host_tier_blocks, 0, 0, UINT64_C(1) << 30, 0),
	{ .name = "host_tier_plain", .section = SECTION_POOL, .type = TYPE_BOOL,
	  .offset = offsetof(struct kvpd_pool_config, host_tier_plain) },
	POOL_NUMBER(TYPE_U32, file_tier_blocks, 0, 0, UINT64_C(1) << 30, 0),
	{ .name = "swap_files", .section = SECTION_POOL, .type = TYPE_FILES,
	  .offset = offsetof(struct kvpd_pool_config, swap_files),
	  .aux_offset = offsetof(struct kvpd_pool_config, n_swap_files) },
	{ .name = "file_tier_persist", .section = SECTION_POOL, .type = TYPE_BOOL,
	  .offset = offsetof(struct kvpd_pool_config, file_tier_persist) },
	POOL_NUMBER(TYPE_U32, file_tier_persist_stop_ms, 3000, 0, 600000, 0),
	POOL_NUMBER(TYPE_U32, file_tier_queue_depth, 32, 1, 4096, 0),
	{ .name = "file_tier_blocking_reads", .section = SECTION_POOL, .type = TYPE_BOOL,
	  .offset = offsetof(struct kvpd_pool_config, file_tier_blocking_reads) },
	{ .name = "model_params", .section = SECTION_POOL, .type = TYPE_NUMBER,
	  .offset = offsetof(struct kvpd_pool_config, model_params) },
	{ .name = "engine_flops", .section = SECTION_POOL, .type = TYPE_NUMBER,
	  .offset = offsetof(struct kvpd_pool_config, engine_flops) },
	POOL_NUMBER(TYPE_SIZE, host_tier_bandwidth, 0, 0, UINT64_C(1) << 50, KEY_AUTO),
	POOL_NUMBER(TYPE_SIZE, file_tier_bandwidth, 0, 0, UINT64_C(1) << 50, KEY_AUTO),
	{ .name = "remote_tier", .section = SECTION_POOL, .type = TYPE_REDIS_URL,
	  .offset = offsetof(struct kvpd_pool_config, remote_tier) },
	{ .name = "remote_tier_key_file", .section = SECTION_POOL, .type = TYPE_PATH,
	  .flags = KEY_FILE, .offset = offsetof(struct kvpd_pool_config, remote_tier_key_file) },
	{ .name = "remote_tier_old_key_files", .section = SECTION_POOL, .type = TYPE_FILES,
	  .offset = offsetof(struct kvpd_pool_config, remote_tier_old_key_files),
	  .aux_offset = offsetof(struct kvpd_pool_config, n_remote_tier_old_key_files) },
	{ .name = "remote_tier_write", .section = SECTION_POOL, .type = TYPE_REMOTE_WRITE,
	  .def = KVPD_REMOTE_COMMIT, .offset = offsetof(struct kvpd_pool_config, remote_tier_write) },
	POOL_NUMBER(TYPE_U32, remote_tier_timeout_ms, 50, 1, 60000, 0),
	/*
	 * 64 blocks: a 2 MiB block is about 1 ms of sealing on the tier thread, so 64 queued
	 * is a deadline's worth (50 ms) of work and, stores holding their pool blocks until
	 * they complete, 128 MiB kept from reuse at most.
	 */
	POOL_NUMBER(TYPE_U32, remote_tier_max_inflight, 64, 1, 65536, 0),
	POOL_NUMBER(TYPE_U64, remote_tier_ttl_ms, 0, 0, UINT64_C(31536000000), 0),
	POOL_NUMBER(TYPE_SIZE, remote_tier_bandwidth, 0, 0, UINT64_C(1) << 50, KEY_AUTO),
	{ .name = "remote_tier_map_names", .section = SECTION_POOL, .type = TYPE_BOOL,
	  .offset = offsetof(struct kvpd_pool_config, remote_tier_map_names) },
	{ .name = "events_endpoint", .section = SECTION_POOL, .type = TYPE_STRING,
	  .check = events_endpoint_check, .offset = offsetof(struct kvpd_pool_config, events_endpoint) },
	{ .name = "events_replay_endpoint", .section = SECTION_POOL, .type = TYPE_STRING,
	  .check = events_endpoint_check,
	  .offset = offsetof(struct kvpd_pool_config, events_replay_endpoint) },
	{ .name = "events_curve_secret_key_file", .section = SECTION_POOL, .type = TYPE_PATH,
	  .flags = KEY_FILE,
	  .offset = offsetof(struct kvpd_pool_config, events_curve_secret_key_file) },
	{ .name = "events_curve_allowed_keys_file", .section = SECTION_POOL, .type = TYPE_PATH,
	  .flags = KEY_FILE,
	  .offset = offsetof(struct kvpd_pool_config, events_curve_allowed_keys_file) },
	{ .name = "events_topic", .section = SECTION_POOL, .type = TYPE_STRING, .def_path = "",
	  .check = events_topic_check, .offset = offsetof(struct kvpd_pool_config, events_topic) },
	{ .name = "events_format", .section = SECTION_POOL, .type = TYPE_STRING, .def_path = "map",
	  .check = events_format_check, .offset = offsetof(struct kvpd_pool_config, events_format) },
	{ .name = "events_sched", .section = SECTION_POOL, .type = TYPE_STRING, .def_path = "idle",
	  .check = events_sched_check, .offset = offsetof(struct kvpd_pool_config, events_sched) },
	{ .name = "events_namespaces", .section = SECTION_POOL, .type = TYPE_STRING,
	  .check = events_namespaces_check,
	  .offset = offsetof(struct kvpd_pool_config, events_namespaces) },
	POOL_NUMBER(TYPE_U32, events_batch_ms, 10, 1, 10000, 0),
	POOL_NUMBER(TYPE_U32, events_buffer_batches, 10000, 0, 1000000, 0),
	POOL_NUMBER(TYPE_U32, events_queue, 65536, 16, 16777216, 0),
	POOL_NUMBER(TYPE_U32, events_hwm, 100000, 1, 100000000, 0),
	POOL_NUMBER(TYPE_U32, events_remote_blocks, 65536, 0, 16777216, 0),
	{ .name = "allow_users", .section = SECTION_POOL, .type = TYPE_UIDS,
	  .offset = offsetof(struct kvpd_pool_config, allow_uids),
	  .aux_offset = offsetof(struct kvpd_pool_config, n_allow_uids) },
	{ .name = "allow_groups", .section = SECTION_POOL, .type = TYPE_GIDS,
	  .offset = offsetof(struct kvpd_pool_config, allow_gids),
	  .aux_offset = offsetof(struct kvpd_pool_config, n_allow_gids) },
};

#define NKEYS (sizeof(schema) / sizeof(schema[0]))

/* For config-reload.c, which walks the same table. */
const struct config_key *const config_schema = schema;
const size_t config_nkeys = NKEYS;

static const char *const namespace_names[] = {
	[KVPD_NS_UID] = "uid",
	[KVPD_NS_GID] = "gid",
	[KVPD_NS_SHARED] = "shared",
};

static const char *const eviction_names[] = { "lru", "value" };

static const char *const policy_names[] = {
	[KVPD_POLICY_LRU] = "lru",
	[KVPD_POLICY_PRIORITY] = "priority",
	[KVPD_POLICY_COST] = "cost",
};

static const char *const backend_names[] = {
	[KVPD_BACKEND_HOST] = "host",
	[KVPD_BACKEND_CUDA] = "cuda",
	[KVPD_BACKEND_AUTO] = "auto",
};

static const char *const remote_write_names[] = {
	[KVPD_REMOTE_COMMIT] = "commit",
	[KVPD_REMOTE_EVICT] = "evict",
};

static const struct {
	const char *suffix;
	uint64_t factor;
} size_suffixes[] = {
	{ "", 1 },
	{ "K", KiB },
	{ "k", KiB },
	{ "KiB", KiB },
	{ "M", MiB },
	{ "MiB", MiB },
	{ "G", GiB },
	{ "GiB", GiB },
	{ "T", UINT64_C(1) << 40 },
	{ "TiB", UINT64_C(1) << 40 },
	{ "KB", 1000 },
	{ "kB", 1000 },
	{ "MB", 1000000 },
	{ "GB", 1000000000 },
	{ "TB", UINT64_C(1000000000000) },
};

/* Per-section-instance bookkeeping while parsing. */
struct section_state {
	unsigned header_line;
	unsigned key_line[NKEYS]; /* where each key was set; 0: not set */
};

struct parse {
	const char *name; /* the file, for messages */
	const char *pos;  /* the text not read yet */
	struct kvpd_config cfg;
	struct section_state global; /* [daemon] and [limits]: their keys are disjoint */
	unsigned daemon_line, limits_line;
	struct section_state *pool_state; /* parallel to cfg.pools */
	size_t pools_cap;

	/* The section being read. */
	bool in_section;
	enum config_section section;
	size_t pool_index;
	char label[8 + POOL_NAME_MAX + 1]; /* "pool main", for messages */
	char section_raw[256];             /* between the brackets, as written */
	int prev_key;                      /* the last key set in it: a continuation continues it */

	/* The line being read. */
	unsigned lineno;
	bool indented;
	bool handled; /* libinih called the handler for it */
	bool header;  /* it looks like "[...]" */
	bool header_too_long;
	char header_text[256];

	int error; /* 0 or a negative errno; the first error wins */
	unsigned error_line;
	bool error_in_handler;
	char msg[512];
};

__attribute__((format(printf, 4, 5))) static int fail_at(struct parse *p, int error,
							  unsigned line, const char *fmt, ...)
{
	va_list ap;

	if (p->error)
		return p->error;
	p->error = error;
	p->error_line = line;
	va_start(ap, fmt);
	vsnprintf(p->msg, sizeof(p->msg), fmt, ap);
	va_end(ap);
	return error;
}

/* An error about a key on the current line: "[pool main] layers: ...". */
__attribute__((format(printf, 3, 4))) static int fail_key(struct parse *p, const char *key,
							  const char *fmt, ...)
{
	char what[384];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return fail_at(p, -EINVAL, p->lineno, "[%s] %s: %s", p->label, key, what);
}

static int oom(struct parse *p)
{
	return fail_at(p, -ENOMEM, p->lineno, "out of memory");
}

__attribute__((format(printf, 3, 4))) static void set_err(char *err, size_t err_len,
							  const char *fmt, ...)
{
	va_list ap;

	if (!err || err_len == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, err_len, fmt, ap);
	va_end(ap);
}

/* Decimal digits only: no sign, no space, no base prefix.  0, -EINVAL or -ERANGE. */
static int parse_digits(const char *s, size_t n, uint64_t *ret)
{
	uint64_t v = 0;

	if (n == 0)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		unsigned d = (unsigned)(s[i] - '0');

		if (v > (UINT64_MAX - d) / 10)
			return -ERANGE;
		v = v * 10 + d;
	}
	*ret = v;
	return 0;
}

static int parse_u64(const char *s, uint64_t *ret)
{
	return parse_digits(s, strlen(s), ret);
}

int config_parse_size(const char *s, uint64_t *ret)
{
	uint64_t v, bytes;
	size_t n;
	int r;

	if (!s)
		return -EINVAL;
	n = strspn(s, "0123456789");
	for (size_t i = 0; i < sizeof(size_suffixes) / sizeof(size_suffixes[0]); i++) {
		if (strcmp(s + n, size_suffixes[i].suffix) != 0)
			continue;
		r = parse_digits(s, n, &v);
		if (r < 0)
			return r;
		if (__builtin_mul_overflow(v, size_suffixes[i].factor, &bytes))
			return -ERANGE;
		*ret = bytes;
		return 0;
	}
	return -EINVAL;
}

/* The shortest exact spelling: "4MiB", "800MB", "1000". */
/* The shortest decimal that reads back as v (printed configurations load back exactly). */
static const char *format_number(double v, char *buf, size_t len)
{
	for (int digits = 6; digits <= 17; digits++) {
		snprintf(buf, len, "%.*g", digits, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	return buf;
}

static const char *format_size(uint64_t v, char *buf, size_t len)
{
	static const char *const spellings[] = {
		"TiB", "GiB", "MiB", "KiB", "TB", "GB", "MB", "KB",
	};

	for (size_t i = 0; v && i < sizeof(spellings) / sizeof(spellings[0]); i++) {
		uint64_t factor = 0;

		for (size_t j = 0; j < sizeof(size_suffixes) / sizeof(size_suffixes[0]); j++)
			if (!strcmp(size_suffixes[j].suffix, spellings[i]))
				factor = size_suffixes[j].factor;
		if (v % factor == 0) {
			snprintf(buf, len, "%" PRIu64 "%s", v / factor, spellings[i]);
			return buf;
		}
	}
	snprintf(buf, len, "%" PRIu64, v);
	return buf;
}

/*
 * A numeric id, or a name looked up through NSS.  0, -EINVAL (a number that is no id), -ESRCH
 * (no such name) or another -errno from the lookup.
 */
static int resolve_id(const char *s, bool group, uint32_t *ret)
{
	size_t size = 1024;
	bool found = false;
	char *buf = NULL;
	uint32_t id = 0;
	uint64_t v;
	int r;

	if (s[strspn(s, "0123456789")] == '\0') {
		/* (uid_t)-1 means "no change" to chown() and setresuid(): never a real id. */
		if (parse_u64(s, &v) < 0 || v >= UINT32_MAX)
			return -EINVAL;
		*ret = (uint32_t)v;
		return 0;
	}
	for (;;) {
		struct passwd pw, *pwp = NULL;
		struct group gr, *grp = NULL;
		char *nbuf = realloc(buf, size);

		if (!nbuf) {
			free(buf);
			return -ENOMEM;
		}
		buf = nbuf;
		if (group) {
			r = getgrnam_r(s, &gr, buf, size, &grp);
			if (r == 0 && grp)
				found = true, id = (uint32_t)grp->gr_gid;
		} else {
			r = getpwnam_r(s, &pw, buf, size, &pwp);
			if (r == 0 && pwp)
				found = true, id = (uint32_t)pwp->pw_uid;
		}
		if (r != ERANGE || size >= 1024 * 1024)
			break;
		size *= 2;
	}
	free(buf);
	if (found) {
		*ret = id;
		return 0;
	}
	/* getpwnam_r(3): these errors also mean that the name is unknown. */
	if (r == 0 || r == ENOENT || r == ESRCH || r == EBADF || r == EPERM)
		return -ESRCH;
	return -r;
}

static int find_key(enum config_section section, const char *name)
{
	for (size_t k = 0; k < NKEYS; k++)
		if (schema[k].section == section && !strcmp(schema[k].name, name))
			return (int)k;
	return -1;
}

static struct section_state *current_state(struct parse *p)
{
	return p->section == SECTION_POOL ? &p->pool_state[p->pool_index] : &p->global;
}

static void *current_base(struct parse *p)
{
	return p->section == SECTION_POOL ? (void *)&p->cfg.pools[p->pool_index] : (void *)&p->cfg;
}

static int apply_defaults(enum config_section section, void *base)
{
	for (size_t k = 0; k < NKEYS; k++) {
		const struct config_key *key = &schema[k];
		void *field = field_at(base, key->offset);

		if (key->section != section)
			continue;
		switch (key->type) {
		case TYPE_U32:
			*(uint32_t *)field = (uint32_t)key->def;
			break;
		case TYPE_U64:
		case TYPE_SIZE:
			*(uint64_t *)field = key->def;
			break;
		case TYPE_NAMESPACE:
			*(enum kvpd_namespace_mode *)field = (enum kvpd_namespace_mode)key->def;
			break;
		case TYPE_POLICY:
			*(enum kvpd_policy *)field = (enum kvpd_policy)key->def;
			break;
		case TYPE_EVICTION:
			*(enum kvpd_eviction *)field = (enum kvpd_eviction)key->def;
			break;
		case TYPE_BACKEND:
			*(enum kvpd_backend *)field = (enum kvpd_backend)key->def;
			break;
		case TYPE_REMOTE_WRITE:
			*(enum kvpd_remote_write *)field = (enum kvpd_remote_write)key->def;
			break;
		case TYPE_PATH:
		case TYPE_STRING:
			if (!key->def_path)
				break; /* unset: NULL */
			*(char **)field = strdup(key->def_path);
			if (!*(char **)field)
				return -ENOMEM;
			break;
		case TYPE_GROUP:
		case TYPE_UIDS:
		case TYPE_GIDS:
		case TYPE_BOOL:
		case TYPE_FILES:
		case TYPE_NUMBER:
		case TYPE_LISTEN:
		case TYPE_REDIS_URL:
			break; /* unset, false, empty, 0: zeroed already */
		}
	}
	return 0;
}

static bool pool_name_ok(const char *name)
{
	size_t n = strlen(name);

	static const char allowed[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
				      "0123456789_.-";

	return n >= 1 && n <= POOL_NAME_MAX && strspn(name, allowed) == n;
}

static int open_pool(struct parse *p, const char *name, unsigned line)
{
	struct kvpd_pool_config *pc;

	if (!*name)
		return fail_at(p, -EINVAL, line, "[pool]: missing pool name: write [pool NAME]");
	if (!pool_name_ok(name))
		return fail_at(p, -EINVAL, line,
			       "[pool %s]: bad pool name '%s': 1 to %d characters of "
			       "A-Z a-z 0-9 _ . -",
			       name, name, POOL_NAME_MAX);
	for (size_t i = 0; i < p->cfg.npools; i++)
		if (!strcmp(p->cfg.pools[i].name, name))
			return fail_at(p, -EINVAL, line,
				       "[pool %s]: duplicate pool (first defined on line %u)", name,
				       p->pool_state[i].header_line);
	if (p->cfg.npools == p->pools_cap) {
		size_t cap = p->pools_cap ? 2 * p->pools_cap : 4;
		struct kvpd_pool_config *pools;
		struct section_state *states;

		pools = realloc(p->cfg.pools, cap * sizeof(*pools));
		if (!pools)
			return oom(p);
		p->cfg.pools = pools;
		states = realloc(p->pool_state, cap * sizeof(*states));
		if (!states)
			return oom(p);
		p->pool_state = states;
		p->pools_cap = cap;
	}
	pc = &p->cfg.pools[p->cfg.npools];
	*pc = (struct kvpd_pool_config){ 0 };
	snprintf(pc->name, sizeof(pc->name), "%s", name);
	if (apply_defaults(SECTION_POOL, pc) < 0)
		return oom(p);
	p->pool_state[p->cfg.npools] = (struct section_state){ .header_line = line };
	p->pool_index = p->cfg.npools++;
	p->section = SECTION_POOL;
	snprintf(p->label, sizeof(p->label), "pool %s", name);
	return 0;
}

/* Called for a line that starts with '[' and that libinih did not call the handler for. */
static int open_section(struct parse *p)
{
	const unsigned line = p->lineno;
	char *s = p->header_text, *end;

	p->in_section = true;
	p->prev_key = -1;
	snprintf(p->section_raw, sizeof(p->section_raw), "%s", p->header_text);
	if (p->header_too_long)
		return fail_at(p, -EINVAL, line, "section name is longer than %zu characters",
			       sizeof(p->header_text) - 1);
	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';

	if (!strcmp(s, "daemon") || !strcmp(s, "limits")) {
		bool daemon = s[0] == 'd';
		unsigned *seen = daemon ? &p->daemon_line : &p->limits_line;

		if (*seen)
			return fail_at(p, -EINVAL, line,
				       "[%s]: section appears twice (first on line %u)", s, *seen);
		*seen = line;
		p->section = daemon ? SECTION_DAEMON : SECTION_LIMITS;
		strcpy(p->label, daemon ? "daemon" : "limits");
		return 0;
	}
	if (!strncmp(s, "pool", 4) && (s[4] == '\0' || isspace((unsigned char)s[4]))) {
		s += 4;
		while (isspace((unsigned char)*s))
			s++;
		return open_pool(p, s, line);
	}
	return fail_at(p, -EINVAL, line,
		       "[%s]: unknown section (expected [daemon], [limits] or [pool NAME])", s);
}

/* Runs once the handler had its chance at the line just read. */
static void end_line(struct parse *p)
{
	if (p->header && !p->handled && !p->error)
		(void)open_section(p);
	p->header = false;
}

static void classify_line(struct parse *p, const char *line)
{
	const char *s = line, *close;
	size_t n;

	/* libinih skips a UTF-8 byte order mark on the first line. */
	if (p->lineno == 1 && !strncmp(s, "\xEF\xBB\xBF", 3))
		s += 3;
	p->handled = false;
	p->indented = *s && isspace((unsigned char)*s);
	while (isspace((unsigned char)*s))
		s++;
	if (*s != '[')
		return;
	close = strchr(s + 1, ']');
	if (!close)
		return; /* libinih reports it */
	n = (size_t)(close - s - 1);
	p->header = true;
	p->header_too_long = n >= sizeof(p->header_text);
	if (p->header_too_long)
		n = sizeof(p->header_text) - 1;
	memcpy(p->header_text, s + 1, n);
	p->header_text[n] = '\0';
}

/* libinih's ini_reader: one whole line per call, like fgets(). */
static char *read_line(char *str, int num, void *stream)
{
	struct parse *p = stream;
	const char *nl;
	size_t len, content;

	end_line(p);
	if (p->error || !*p->pos)
		return NULL;
	nl = strchr(p->pos, '\n');
	len = nl ? (size_t)(nl - p->pos) + 1 : strlen(p->pos);
	content = nl ? len - 1 : len;
	if (content && p->pos[content - 1] == '\r')
		content--;
	p->lineno++;
	/* libinih needs room for "\r\n\0" after the longest line. */
	if (num < 4 || content > (size_t)num - 3) {
		fail_at(p, -EINVAL, p->lineno, "line is longer than %d characters", num - 3);
		return NULL;
	}
	memcpy(str, p->pos, len);
	str[len] = '\0';
	p->pos += len;
	classify_line(p, str);
	return str;
}

static int set_number(struct parse *p, const struct config_key *key, void *field,
		      const char *value)
{
	char lo[32], hi[32];
	uint64_t v = 0;
	int r;

	if ((key->flags & KEY_AUTO) && !strcmp(value, "auto")) {
		*(uint64_t *)field = KVPD_MEASURE;
		return 0;
	}
	r = key->type == TYPE_SIZE ? config_parse_size(value, &v) : parse_u64(value, &v);
	if (r == -EINVAL && key->type == TYPE_SIZE)
		return fail_key(p, key->name,
				"'%s' is not a size (a number of bytes, or a number followed by K, "
				"KiB, KB, M, MiB, MB, G, GiB, GB, T, TiB or TB)",
				value);
	if (r == -EINVAL)
		return fail_key(p, key->name, "'%s' is not a decimal number", value);
	if (r < 0 || v < key->min || v > key->max) {
		if (key->type == TYPE_SIZE) {
			format_size(key->min, lo, sizeof(lo));
			format_size(key->max, hi, sizeof(hi));
		} else {
			snprintf(lo, sizeof(lo), "%" PRIu64, key->min);
			snprintf(hi, sizeof(hi), "%" PRIu64, key->max);
		}
		return fail_key(p, key->name, "%s is out of range %s..%s", value, lo, hi);
	}
	if ((key->flags & KEY_POW2) && (v & (v - 1)))
		return fail_key(p, key->name, "%s is not a power of two", value);
	if (key->type == TYPE_U32)
		*(uint32_t *)field = (uint32_t)v;
	else
		*(uint64_t *)field = v;
	return 0;
}

static int set_path(struct parse *p, const struct config_key *key, char **field,
		    const char *value)
{
	const size_t max = sizeof(((struct sockaddr_un *)NULL)->sun_path) - 1;
	char *copy;

	if (value[0] != '/')
		return fail_key(p, key->name, "'%s' is not an absolute path", value);
	if ((key->flags & KEY_FILE) && strlen(value) >= PATH_MAX)
		return fail_key(p, key->name, "the path is longer than %d bytes", PATH_MAX - 1);
	if (!(key->flags & KEY_FILE) && strlen(value) > max)
		return fail_key(p, key->name,
				"'%s' is longer than %zu bytes, the most a Unix socket address "
				"holds",
				value, max);
	for (const char *c = value; *c; c++)
		if (iscntrl((unsigned char)*c))
			return fail_key(p, key->name, "the path contains a control character");
	copy = strdup(value);
	if (!copy)
		return oom(p);
	free(*field);
	*field = copy;
	return 0;
}

static int id_error(struct parse *p, const struct config_key *key, const char *item, bool group,
		    int r)
{
	const char *what = group ? "group" : "user";

	if (r == -ENOMEM)
		return oom(p);
	if (r == -EINVAL)
		return fail_key(p, key->name, "'%s' is not a valid %s id", item, what);
	if (r == -ESRCH)
		return fail_key(p, key->name, "unknown %s '%s'", what, item);
	fail_key(p, key->name, "cannot look up %s '%s': %s", what, item, strerror(-r));
	p->error = r; /* the file may be right; the name service is not */
	return r;
}

/* Appends the ids in a comma or space separated list (a continuation line adds to it). */
static int add_ids(struct parse *p, const struct config_key *key, void *base, const char *value)
{
	const bool group = key->type == TYPE_GIDS;
	uint32_t **ids = field_at(base, key->offset);
	size_t *n = field_at(base, key->aux_offset);
	const char *sep = ", \t";

	for (const char *s = value + strspn(value, sep); *s; s += strspn(s, sep)) {
		size_t len = strcspn(s, sep), i;
		char *item = strndup(s, len);
		uint32_t id = 0, *grown;
		int r;

		if (!item)
			return oom(p);
		r = resolve_id(item, group, &id);
		if (r < 0) {
			r = id_error(p, key, item, group, r);
			free(item);
			return r;
		}
		free(item);
		s += len;
		for (i = 0; i < *n && (*ids)[i] != id; i++)
			;
		if (i < *n)
			continue;
		grown = realloc(*ids, (*n + 1) * sizeof(**ids));
		if (!grown)
			return oom(p);
		*ids = grown;
		(*ids)[(*n)++] = id;
	}
	return 0;
}

static int set_bool(struct parse *p, const struct config_key *key, bool *field,
		    const char *value)
{
	static const char *const yes[] = { "yes", "true", "on", "1" };
	static const char *const no[] = { "no", "false", "off", "0" };

	for (size_t i = 0; i < 4; i++) {
		if (!strcmp(value, yes[i])) {
			*field = true;
			return 0;
		}
		if (!strcmp(value, no[i])) {
			*field = false;
			return 0;
		}
	}
	return fail_key(p, key->name, "'%s' is not yes, no, true, false, on, off, 1 or 0", value);
}

static int set_real(struct parse *p, const struct config_key *key, double *field,
		    const char *value)
{
	static const char suffixes[] = "KMGTP";
	const char *s;
	char *end;
	double v;

	errno = 0;
	v = strtod(value, &end);
	if (end == value || errno || !(v >= 0) || v > 1e30)
		return fail_key(p, key->name, "'%s' is not a non-negative number", value);
	if (*end && (s = strchr(suffixes, *end)) && !end[1])
		for (long i = 0; i <= s - suffixes; i++)
			v *= 1000;
	else if (*end)
		return fail_key(p, key->name,
				"'%s' is not a number (such as 7e9 or 7G; suffixes K, M, G, T, P are "
				"powers of 1000)", value);
	/* The bound holds for the value the suffix makes, or it would not load back printed. */
	if (v > 1e30)
		return fail_key(p, key->name, "'%s' is more than 1e30", value);
	*field = v;
	return 0;
}

/* Appends absolute paths from a comma separated list (spaces around them are dropped). */
static int add_files(struct parse *p, const struct config_key *key, void *base,
		     const char *value)
{
	char ***files = field_at(base, key->offset);
	size_t *n = field_at(base, key->aux_offset);

	for (const char *s = value; *s;) {
		size_t len = strcspn(s, ","), lead = strspn(s, " \t"), end = len;
		char *item, **grown;

		while (end > lead && (s[end - 1] == ' ' || s[end - 1] == '\t'))
			end--;
		if (end == lead)
			return fail_key(p, key->name, "an empty path in the list");
		if (s[lead] != '/')
			return fail_key(p, key->name, "'%.*s' is not an absolute path",
					(int)(end - lead), s + lead);
		if (*n == 64)
			return fail_key(p, key->name, "more than 64 files");
		item = strndup(s + lead, end - lead);
		if (!item)
			return oom(p);
		for (size_t i = 0; i < *n; i++)
			if (!strcmp((*files)[i], item)) {
				free(item);
				return fail_key(p, key->name, "'%s' is named twice", (*files)[i]);
			}
		grown = realloc(*files, (*n + 1) * sizeof(**files));
		if (!grown) {
			free(item);
			return oom(p);
		}
		*files = grown;
		(*files)[(*n)++] = item;
		s += len;
		if (*s == ',')
			s++;
	}
	return 0;
}

int config_parse_listen(const char *s, struct sockaddr_storage *ret, socklen_t *ret_len)
{
	struct sockaddr_storage ss = { 0 };
	char host[INET6_ADDRSTRLEN + 1];
	const char *colon, *h = s;
	size_t hlen;
	uint64_t port;

	if (*s == '[') {
		const char *end = strchr(s, ']');

		if (!end || end[1] != ':')
			return -EINVAL;
		h = s + 1;
		hlen = (size_t)(end - h);
		colon = end + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon || memchr(s, ':', (size_t)(colon - s)))
			return -EINVAL; /* an IPv6 address needs its brackets */
		hlen = (size_t)(colon - s);
	}
	if (hlen == 0 || hlen >= sizeof(host) || parse_u64(colon + 1, &port) < 0 || port == 0 ||
	    port > 65535)
		return -EINVAL;
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	if (*s == '[') {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;

		if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1)
			return -EINVAL;
		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t)port);
		*ret_len = sizeof(*a);
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;

		if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
			return -EINVAL;
		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)port);
		*ret_len = sizeof(*a);
	}
	*ret = ss;
	return 0;
}

/* Checked at load, so that a start fails only when the address cannot be bound. */
static int set_listen(struct parse *p, const struct config_key *key, char **field,
		      const char *value)
{
	struct sockaddr_storage ss;
	socklen_t len;
	char *copy;

	if (!*value) {
		free(*field);
		*field = NULL;
		return 0;
	}
	if (config_parse_listen(value, &ss, &len) < 0)
		return fail_key(p, key->name,
				"'%s' is not an address to listen on: write IPV4:PORT "
				"(127.0.0.1:9464) or [IPV6]:PORT ([::1]:9464), a numeric address "
				"and a port from 1 to 65535, or nothing for no endpoint",
				value);
	copy = strdup(value);
	if (!copy)
		return oom(p);
	free(*field);
	*field = copy;
	return 0;
}

/* The seeds are parsed at load so that a start fails only when no node can be reached. */
static int set_string(struct parse *p, const struct config_key *key, char **field,
		      const char *value)
{
	char why[256] = "";
	char *copy;

	if (key->check && key->check(value, why, sizeof(why)) < 0)
		return fail_key(p, key->name, "%s", why[0] ? why : "not a valid value");
	copy = strdup(value);
	if (!copy)
		return oom(p);
	free(*field);
	*field = copy;
	return 0;
}

static int set_redis_url(struct parse *p, const struct config_key *key, char **field,
			 const char *value)
{
	struct redis_addr *addrs;
	char why[256] = "";
	size_t n;
	char *copy;
	int r;

	addrs = calloc(REDIS_MAX_SEEDS, sizeof(*addrs));
	if (!addrs)
		return oom(p);
	r = redis_parse_url(value, addrs, REDIS_MAX_SEEDS, &n, why, sizeof(why));
	free(addrs);
	if (r == -E2BIG)
		return fail_key(p, key->name, "more than %d seeds", REDIS_MAX_SEEDS);
	if (r < 0)
		return fail_key(p, key->name, "%s", why[0] ? why : "not a redis:// URL");
	copy = strdup(value);
	if (!copy)
		return oom(p);
	free(*field);
	*field = copy;
	return 0;
}

static int set_value(struct parse *p, const struct config_key *key, const char *value)
{
	void *base = current_base(p);
	void *field = field_at(base, key->offset);
	uint32_t id = 0;
	int r;

	switch (key->type) {
	case TYPE_U32:
	case TYPE_U64:
	case TYPE_SIZE:
		return set_number(p, key, field, value);
	case TYPE_PATH:
		return set_path(p, key, field, value);
	case TYPE_GROUP:
		if (!*value)
			return fail_key(p, key->name,
					"empty value; leave the key out to allow only root");
		r = resolve_id(value, true, &id);
		if (r < 0)
			return id_error(p, key, value, true, r);
		*(uint32_t *)field = id;
		*(bool *)field_at(base, key->aux_offset) = true;
		return 0;
	case TYPE_NAMESPACE:
		for (size_t i = 0; i < sizeof(namespace_names) / sizeof(namespace_names[0]); i++)
			if (!strcmp(value, namespace_names[i])) {
				*(enum kvpd_namespace_mode *)field = (enum kvpd_namespace_mode)i;
				return 0;
			}
		return fail_key(p, key->name, "'%s' is not one of uid, gid, shared", value);
	case TYPE_POLICY:
		for (size_t i = 0; i < sizeof(policy_names) / sizeof(policy_names[0]); i++)
			if (!strcmp(value, policy_names[i])) {
				*(enum kvpd_policy *)field = (enum kvpd_policy)i;
				return 0;
			}
		return fail_key(p, key->name, "'%s' is not one of lru, priority, cost", value);
	case TYPE_EVICTION:
		for (size_t i = 0; i < sizeof(eviction_names) / sizeof(eviction_names[0]); i++)
			if (!strcmp(value, eviction_names[i])) {
				*(enum kvpd_eviction *)field = (enum kvpd_eviction)i;
				return 0;
			}
		return fail_key(p, key->name, "'%s' is not one of lru, value", value);
	case TYPE_BACKEND:
		for (size_t i = 0; i < sizeof(backend_names) / sizeof(backend_names[0]); i++)
			if (!strcmp(value, backend_names[i])) {
				*(enum kvpd_backend *)field = (enum kvpd_backend)i;
				return 0;
			}
		return fail_key(p, key->name, "'%s' is not one of host, cuda, auto", value);
	case TYPE_UIDS:
	case TYPE_GIDS:
		return add_ids(p, key, base, value);
	case TYPE_BOOL:
		return set_bool(p, key, field, value);
	case TYPE_NUMBER:
		return set_real(p, key, field, value);
	case TYPE_FILES:
		return add_files(p, key, base, value);
	case TYPE_LISTEN:
		return set_listen(p, key, field, value);
	case TYPE_REDIS_URL:
		return set_redis_url(p, key, field, value);
	case TYPE_STRING:
		return set_string(p, key, field, value);
	case TYPE_REMOTE_WRITE:
		for (size_t i = 0; i < sizeof(remote_write_names) / sizeof(remote_write_names[0]); i++)
			if (!strcmp(value, remote_write_names[i])) {
				*(enum kvpd_remote_write *)field = (enum kvpd_remote_write)i;
				return 0;
			}
		return fail_key(p, key->name, "'%s' is not one of commit, evict", value);
	}
	return fail_key(p, key->name, "internal error: no parser for this type");
}

/* libinih cuts section names short; ours is the whole name. */
static bool same_section(const char *ours, const char *libinih)
{
	size_t n = strlen(libinih);

	return !strncmp(ours, libinih, n) && (ours[n] == '\0' || n + 1 == INIH_MAX_SECTION);
}

/* libinih's handler: nonzero to go on. */
static int on_key(void *user, const char *section, const char *name, const char *value)
{
	struct parse *p = user;
	struct section_state *st;
	int k;

	p->handled = true;
	if (p->error)
		return 0;
	if (!p->in_section) {
		fail_at(p, -EINVAL, p->lineno, "%s: key before the first [section]", name);
		goto fail;
	}
	if (!same_section(p->section_raw, section)) {
		fail_at(p, -EINVAL, p->lineno,
			"[%s] %s: cannot tell which section this line belongs to", p->label, name);
		goto fail;
	}
	if (!*name) {
		fail_at(p, -EINVAL, p->lineno, "[%s]: missing key name before '='", p->label);
		goto fail;
	}
	/* To libinih, an indented line right after a key continues that key's value. */
	if (p->indented && p->prev_key >= 0 && !strcmp(name, schema[p->prev_key].name)) {
		const struct config_key *key = &schema[p->prev_key];

		if (key->type != TYPE_UIDS && key->type != TYPE_GIDS && key->type != TYPE_FILES) {
			fail_key(p, name,
				 "an indented line continues this value, and only allow_users, "
				 "allow_groups and swap_files may continue on indented lines");
			goto fail;
		}
		/*
		 * libinih cuts an inline comment (" ;") from a key's first line only; cut it here
		 * too, or "/b ; old disk" would become a path, one that --check-config prints on
		 * the first line, where it then loads as "/b".
		 */
		char item[256];
		size_t len = 0;

		while (value[len] && !(value[len] == ';' &&
				       (len == 0 || isspace((unsigned char)value[len - 1]))))
			len++;
		while (len && isspace((unsigned char)value[len - 1]))
			len--;
		if (len >= sizeof(item)) {
			fail_key(p, name, "a continuation line longer than %zu characters",
				 sizeof(item) - 1);
			goto fail;
		}
		memcpy(item, value, len);
		item[len] = '\0';
		if ((key->type == TYPE_FILES ? add_files(p, key, current_base(p), item)
					     : add_ids(p, key, current_base(p), item)) < 0)
			goto fail;
		return 1;
	}
	k = find_key(p->section, name);
	if (k < 0) {
		fail_key(p, name, "unknown key");
		goto fail;
	}
	st = current_state(p);
	if (st->key_line[k]) {
		fail_key(p, name, "set twice (first on line %u)", st->key_line[k]);
		goto fail;
	}
	st->key_line[k] = p->lineno;
	p->prev_key = k;
	if (set_value(p, &schema[k], value) < 0)
		goto fail;
	return 1;
fail:
	p->error_in_handler = true;
	return 0;
}

/*
 * CURVE: both key files or neither; a tcp:// endpoint only with them (token ids are prompts);
 * the files must load as the daemon will load them.
 */
static int check_events_curve(struct parse *p, size_t i)
{
	const struct kvpd_pool_config *pc = &p->cfg.pools[i];
	const struct section_state *st = &p->pool_state[i];
	const int secret = find_key(SECTION_POOL, "events_curve_secret_key_file");
	const int allowed = find_key(SECTION_POOL, "events_curve_allowed_keys_file");
	const int ep = find_key(SECTION_POOL, "events_endpoint");
	const int replay = find_key(SECTION_POOL, "events_replay_endpoint");
	uint8_t key[EVENTS_CURVE_KEY_BYTES], (*keys)[EVENTS_CURVE_KEY_BYTES];
	const bool curve = pc->events_curve_secret_key_file || pc->events_curve_allowed_keys_file;
	char why[512];
	size_t n;
	int r;

	if (!curve) {
		const bool tcp_ep = !strncmp(pc->events_endpoint, "tcp://", 6);

		if (tcp_ep || (pc->events_replay_endpoint &&
			       !strncmp(pc->events_replay_endpoint, "tcp://", 6)))
			return fail_at(p, -EINVAL, st->key_line[tcp_ep ? ep : replay],
				       "[pool %s] %s: a tcp:// endpoint shows prompts' token ids to "
				       "whoever connects: it needs CURVE keys "
				       "(events_curve_secret_key_file and "
				       "events_curve_allowed_keys_file, docs/events.md), or use "
				       "ipc://PATH",
				       pc->name, schema[tcp_ep ? ep : replay].name);
		return 0;
	}
	if (!pc->events_curve_secret_key_file || !pc->events_curve_allowed_keys_file)
		return fail_at(p, -EINVAL,
			       st->key_line[pc->events_curve_secret_key_file ? secret : allowed],
			       "[pool %s] %s: CURVE needs %s too", pc->name,
			       schema[pc->events_curve_secret_key_file ? secret : allowed].name,
			       schema[pc->events_curve_secret_key_file ? allowed : secret].name);
	r = events_curve_secret_load(pc->events_curve_secret_key_file, key, why, sizeof(why));
	explicit_bzero(key, sizeof(key));
	if (r < 0)
		return fail_at(p, r, st->key_line[secret], "[pool %s] %s: %s", pc->name,
			       schema[secret].name, why);
	r = events_curve_allowed_load(pc->events_curve_allowed_keys_file, &keys, &n, why,
				      sizeof(why));
	if (r < 0)
		return fail_at(p, r, st->key_line[allowed], "[pool %s] %s: %s", pc->name,
			       schema[allowed].name, why);
	free(keys);
	return 0;
}

/* An events_* key written without events_endpoint is a mistake: say which, at its line. */
static int check_events(struct parse *p, size_t i)
{
	const struct kvpd_pool_config *pc = &p->cfg.pools[i];
	const struct section_state *st = &p->pool_state[i];
	const int ep = find_key(SECTION_POOL, "events_endpoint");
	const int replay = find_key(SECTION_POOL, "events_replay_endpoint");
	int r;

	if (!pc->events_endpoint) {
		/* Defaults pass (a printed configuration loads again), as for the remote tier. */
		for (size_t k = 0; k < NKEYS; k++) {
			const struct config_key *key = &schema[k];
			const void *field = cfield_at(pc, key->offset);
			bool set;

			if (key->section != SECTION_POOL || (int)k == ep ||
			    strncmp(key->name, "events_", 7) || !st->key_line[k])
				continue;
			if (key->type == TYPE_U32) {
				set = *(const uint32_t *)field != key->def;
			} else {
				const char *v = *(char *const *)field;

				set = v && (!key->def_path || strcmp(v, key->def_path));
			}
			if (set)
				return fail_at(p, -EINVAL, st->key_line[k],
					       "[pool %s] %s: there is no event stream (set "
					       "events_endpoint = ipc:///PATH)",
					       pc->name, key->name);
		}
		return 0;
	}
	r = check_events_curve(p, i);
	if (r < 0)
		return r;
	if (pc->events_replay_endpoint && !strcmp(pc->events_replay_endpoint, pc->events_endpoint))
		return fail_at(p, -EINVAL, st->key_line[replay],
			       "[pool %s] events_replay_endpoint: the same as events_endpoint",
			       pc->name);
	for (size_t j = 0; j < i; j++) {
		const struct kvpd_pool_config *o = &p->cfg.pools[j];
		const char *mine[2] = { pc->events_endpoint, pc->events_replay_endpoint };
		const char *theirs[2] = { o->events_endpoint, o->events_replay_endpoint };

		for (int a = 0; a < 2; a++)
			for (int b = 0; b < 2; b++)
				if (mine[a] && theirs[b] && !strcmp(mine[a], theirs[b]))
					return fail_at(p, -EINVAL, st->key_line[a ? replay : ep],
						       "[pool %s] %s: pool %s publishes there",
						       pc->name, schema[a ? replay : ep].name,
						       o->name);
	}
	return 0;
}

/*
 * The remote tier's keys: each key file is read now (seal_key_load: its length, mode, owner),
 * so that a wrong one is an error naming the line, not a daemon that starts and then cannot
 * open anything; the daemon reads them again at start.
 */
static int check_remote(struct parse *p, size_t i)
{
	const struct kvpd_pool_config *pc = &p->cfg.pools[i];
	const struct section_state *st = &p->pool_state[i];
	const int url = find_key(SECTION_POOL, "remote_tier");
	const int key_file = find_key(SECTION_POOL, "remote_tier_key_file");
	const int old = find_key(SECTION_POOL, "remote_tier_old_key_files");
	uint8_t secret[SEAL_KEY_BYTES];
	char why[384];
	int r;

	if (!pc->remote_tier) {
		/*
		 * A remote_tier_* key set to anything but its default without the tier is a
		 * mistake (a commented-out remote_tier): say which.  Defaults pass, as for the
		 * file tier's keys, so that config_print's output loads back.
		 */
		for (size_t k = 0; k < NKEYS; k++) {
			const struct config_key *key = &schema[k];
			const void *field = cfield_at(pc, key->offset);
			bool set = false;

			if (key->section != SECTION_POOL || (int)k == url ||
			    strncmp(key->name, "remote_tier_", 12) || !st->key_line[k])
				continue;
			switch (key->type) {
			case TYPE_U32:
				set = *(const uint32_t *)field != key->def;
				break;
			case TYPE_U64:
			case TYPE_SIZE:
				set = *(const uint64_t *)field != key->def;
				break;
			case TYPE_REMOTE_WRITE:
				set = *(const enum kvpd_remote_write *)field != key->def;
				break;
			case TYPE_BOOL:
				set = *(const bool *)field != (key->def != 0);
				break;
			case TYPE_PATH:
				set = *(char *const *)field != NULL;
				break;
			case TYPE_FILES:
				set = *(const size_t *)cfield_at(pc, key->aux_offset) != 0;
				break;
			default:
				set = true;
				break;
			}
			if (set)
				return fail_at(p, -EINVAL, st->key_line[k],
					       "[pool %s] %s: there is no remote tier (set "
					       "remote_tier = redis://HOST:PORT)",
					       pc->name, key->name);
		}
		return 0;
	}
	if (!pc->remote_tier_key_file)
		return fail_at(p, -EINVAL, st->key_line[url],
			       "[pool %s] remote_tier: the remote tier needs remote_tier_key_file "
			       "(32 random bytes, the same on every node: head -c 32 /dev/urandom)",
			       pc->name);
	if (pc->n_remote_tier_old_key_files + 1 > SEAL_MAX_KEYS)
		return fail_at(p, -EINVAL, st->key_line[old],
			       "[pool %s] remote_tier_old_key_files: more than %d keys in all",
			       pc->name, SEAL_MAX_KEYS);
	r = seal_key_load(pc->remote_tier_key_file, secret, why, sizeof(why));
	if (r < 0)
		return fail_at(p, -EINVAL, st->key_line[key_file], "[pool %s] %s: %s", pc->name,
			       schema[key_file].name, why);
	for (size_t f = 0; f < pc->n_remote_tier_old_key_files; f++) {
		if (!strcmp(pc->remote_tier_old_key_files[f], pc->remote_tier_key_file)) {
			explicit_bzero(secret, sizeof(secret));
			return fail_at(p, -EINVAL, st->key_line[old],
				       "[pool %s] %s: %s is remote_tier_key_file too", pc->name,
				       schema[old].name, pc->remote_tier_key_file);
		}
		r = seal_key_load(pc->remote_tier_old_key_files[f], secret, why, sizeof(why));
		if (r < 0) {
			explicit_bzero(secret, sizeof(secret)); /* the current key, read above */
			return fail_at(p, -EINVAL, st->key_line[old], "[pool %s] %s: %s",
				       pc->name, schema[old].name, why);
		}
	}
	explicit_bzero(secret, sizeof(secret));
	return 0;
}

/* The tiers' keys agree with each other, and the tiers' memory and files stay bounded. */
static int check_tiers(struct parse *p, size_t i, uint64_t block_bytes)
{
	const struct kvpd_pool_config *pc = &p->cfg.pools[i];
	const struct section_state *st = &p->pool_state[i];
	const int files = find_key(SECTION_POOL, "swap_files");
	const int blocks = find_key(SECTION_POOL, "file_tier_blocks");
	const int host = find_key(SECTION_POOL, "host_tier_blocks");
	const int persist = find_key(SECTION_POOL, "file_tier_persist");
	const int blocking = find_key(SECTION_POOL, "file_tier_blocking_reads");
	int r;

	if (pc->file_tier_blocks && !pc->n_swap_files)
		return fail_at(p, -EINVAL, st->key_line[blocks],
			       "[pool %s] file_tier_blocks: the file tier needs swap_files", pc->name);
	if (pc->n_swap_files && !pc->file_tier_blocks)
		return fail_at(p, -EINVAL, st->key_line[files],
			       "[pool %s] swap_files: set file_tier_blocks to use them", pc->name);
	if (pc->host_tier_plain && !pc->host_tier_blocks)
		return fail_at(p, -EINVAL, st->key_line[find_key(SECTION_POOL, "host_tier_plain")],
			       "[pool %s] host_tier_plain: there is no host tier", pc->name);
	if (pc->host_tier_plain && pc->backend == KVPD_BACKEND_HOST)
		return fail_at(p, -EINVAL, st->key_line[find_key(SECTION_POOL, "host_tier_plain")],
			       "[pool %s] host_tier_plain: a host pool's tier is plain memory "
			       "already (the key is for a pool on a GPU)", pc->name);
	if (pc->file_tier_persist && !pc->file_tier_blocks)
		return fail_at(p, -EINVAL, st->key_line[persist],
			       "[pool %s] file_tier_persist: there is no file tier", pc->name);
	if (pc->file_tier_blocking_reads && !pc->file_tier_blocks)
		return fail_at(p, -EINVAL, st->key_line[blocking],
			       "[pool %s] file_tier_blocking_reads: there is no file tier",
			       pc->name);
	if (pc->value_records && pc->eviction != KVPD_EVICT_VALUE)
		return fail_at(p, -EINVAL, st->key_line[find_key(SECTION_POOL, "value_records")],
			       "[pool %s] value_records: only the value policy keeps records (set "
			       "eviction = value)", pc->name);
	r = check_remote(p, i);
	if (r < 0)
		return r;
	r = check_events(p, i);
	if (r < 0)
		return r;
	if ((uint64_t)pc->host_tier_blocks * block_bytes > POOL_MAX_BYTES)
		return fail_at(p, -EINVAL, st->key_line[host],
			       "[pool %s] host_tier_blocks: more than 2^48 bytes of host memory",
			       pc->name);
	if ((uint64_t)pc->file_tier_blocks * (block_bytes + 65536) > (UINT64_C(1) << 56))
		return fail_at(p, -EINVAL, st->key_line[blocks],
			       "[pool %s] file_tier_blocks: more than 2^56 bytes of files", pc->name);
	return 0;
}

static int check_pool(struct parse *p, size_t i)
{
	const struct kvpd_pool_config *pc = &p->cfg.pools[i];
	const struct section_state *st = &p->pool_state[i];
	const uint32_t factors[] = { pc->layers,	pc->kv_heads,	  pc->head_dim,
				     pc->element_bytes, pc->block_tokens, pc->capacity_blocks };
	const int capacity = find_key(SECTION_POOL, "capacity_blocks");
	uint64_t bytes = 2;

	for (size_t k = 0; k < NKEYS; k++)
		if (schema[k].section == SECTION_POOL && (schema[k].flags & KEY_REQUIRED) &&
		    !st->key_line[k])
			return fail_at(p, -EINVAL, st->header_line,
				       "[pool %s]: missing required key %s", pc->name,
				       schema[k].name);
	for (size_t f = 0; f < sizeof(factors) / sizeof(factors[0]); f++)
		if (__builtin_mul_overflow(bytes, factors[f], &bytes))
			return fail_at(p, -EINVAL, st->key_line[capacity],
				       "[pool %s] capacity_blocks: the pool's memory, 2 * layers * "
				       "kv_heads * head_dim * element_bytes * block_tokens * "
				       "capacity_blocks bytes, overflows 64 bits",
				       pc->name);
	if (bytes > POOL_MAX_BYTES)
		return fail_at(p, -EINVAL, st->key_line[capacity],
			       "[pool %s] capacity_blocks: the pool's memory, %" PRIu64
			       " bytes (2 * layers * kv_heads * head_dim * element_bytes * "
			       "block_tokens * capacity_blocks), is more than 2^48 bytes (256TiB)",
			       pc->name, bytes);
	/*
	 * A device on a host pool is a mistake: most likely backend = cuda was meant.  0, the
	 * default, is let through so that every printed configuration loads back.
	 */
	if (pc->backend == KVPD_BACKEND_HOST && pc->device != 0)
		return fail_at(p, -EINVAL, st->key_line[find_key(SECTION_POOL, "device")],
			       "[pool %s] device: a host pool has no device (backend = host); set "
			       "backend = cuda or auto to put the pool on GPU %" PRIu32,
			       pc->name, pc->device);
	/* A GPU's copies are queued on the device already; auto may still fall back to host. */
	if (pc->backend == KVPD_BACKEND_CUDA && pc->copy_thread)
		return fail_at(p, -EINVAL, st->key_line[find_key(SECTION_POOL, "copy_thread")],
			       "[pool %s] copy_thread: a pool on a GPU (backend = cuda) copies on "
			       "the device, never on a thread; the key is for host memory",
			       pc->name);
	return check_tiers(p, i, bytes / pc->capacity_blocks);
}

/*
 * The memory caps nest: one session can hold its largest frame and its largest ring, a uid at
 * least one session, the daemon at least one uid.  Otherwise the smaller cap silently decides.
 */
static int check_bytes(struct parse *p)
{
	const struct kvpd_limits *l = &p->cfg.limits;
	const struct {
		const char *key;
		uint64_t value, floor;
		const char *what;
	} rules[] = {
		{ "max_session_bytes", l->max_session_bytes,
		  p->cfg.max_frame_bytes + l->max_ring_data_bytes,
		  "max_frame_bytes + max_ring_data_bytes (one session's largest frame and ring)" },
		{ "max_bytes_per_uid", l->max_bytes_per_uid, l->max_session_bytes,
		  "max_session_bytes" },
		{ "max_total_bytes", l->max_total_bytes, l->max_bytes_per_uid, "max_bytes_per_uid" },
	};
	char have[32], need[32];

	for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++)
		if (rules[i].value < rules[i].floor)
			return fail_at(p, -EINVAL,
				       p->global.key_line[find_key(SECTION_LIMITS, rules[i].key)],
				       "[limits] %s: %s is below %s, %s", rules[i].key,
				       format_size(rules[i].value, have, sizeof(have)),
				       format_size(rules[i].floor, need, sizeof(need)), rules[i].what);
	return 0;
}

/* What only the whole file can tell. */
static int check_all(struct parse *p)
{
	int r;

	for (size_t i = 0; i < p->cfg.npools; i++) {
		r = check_pool(p, i);
		if (r < 0)
			return r;
	}
	if (p->cfg.npools == 0)
		return fail_at(p, -EINVAL, 0,
			       "no [pool NAME] section: at least one pool is required");
	/* Two pools writing one swap file would overwrite each other's slots. */
	for (size_t i = 0; i < p->cfg.npools; i++)
		for (size_t j = 0; j < i; j++)
			for (size_t a = 0; a < p->cfg.pools[i].n_swap_files; a++)
				for (size_t b = 0; b < p->cfg.pools[j].n_swap_files; b++)
					if (!strcmp(p->cfg.pools[i].swap_files[a],
						    p->cfg.pools[j].swap_files[b]))
						return fail_at(
							p, -EINVAL,
							p->pool_state[i].key_line[find_key(
								SECTION_POOL, "swap_files")],
							"[pool %s] swap_files: %s is pool %s's "
							"swap file too",
							p->cfg.pools[i].name,
							p->cfg.pools[i].swap_files[a],
							p->cfg.pools[j].name);
	r = check_bytes(p);
	if (r < 0)
		return r;
	if (!strcmp(p->cfg.socket_path, p->cfg.admin_socket_path)) {
		const int sock = find_key(SECTION_DAEMON, "socket");
		const int admin = find_key(SECTION_DAEMON, "admin_socket");
		const int k = p->global.key_line[admin] ? admin : sock;

		return fail_at(p, -EINVAL, p->global.key_line[k],
			       "[daemon] %s: socket and admin_socket must differ (both are %s)",
			       schema[k].name, p->cfg.socket_path);
	}
	return 0;
}

int config_load_string(const char *text, const char *name_for_messages, struct kvpd_config *ret,
		       char *err, size_t err_len)
{
	struct parse p = { .name = name_for_messages ? name_for_messages : "(string)",
			   .pos = text,
			   .prev_key = -1 };
	int r;

	if (!text || !ret) {
		set_err(err, err_len, "%s: no text to parse", p.name);
		return -EINVAL;
	}
	r = apply_defaults(SECTION_DAEMON, &p.cfg);
	if (r == 0)
		r = apply_defaults(SECTION_LIMITS, &p.cfg);
	if (r < 0) {
		oom(&p);
		goto fail;
	}
	r = ini_parse_stream(read_line, &p, on_key, &p);
	if (r < 0)
		oom(&p); /* -2: libinih could not allocate its line buffer */
	else if (r > 0 && (!p.error || r < (int)p.error_line ||
			   (r == (int)p.error_line && !p.error_in_handler))) {
		/* libinih found a line it cannot parse before our first error. */
		p.error = 0;
		fail_at(&p, -EINVAL, (unsigned)r, "expected '[section]' or 'key = value'");
	}
	if (!p.error)
		check_all(&p);
	if (p.error)
		goto fail;
	free(p.pool_state);
	*ret = p.cfg;
	return 0;
fail:
	if (p.error_line)
		set_err(err, err_len, "%s:%u: %s", p.name, p.error_line, p.msg);
	else
		set_err(err, err_len, "%s: %s", p.name, p.msg);
	free(p.pool_state);
	config_free(&p.cfg);
	return p.error;
}

/* Reads a whole (small) file.  0 or -errno; *ret_len excludes the terminating NUL. */
static int read_file(const char *path, char **ret, size_t *ret_len)
{
	size_t len = 0, cap = 4096;
	char *buf = NULL;
	int fd, r;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return -errno;
	for (;;) {
		ssize_t n;

		if (!buf || len + 1 == cap) {
			char *grown;

			if (buf)
				cap *= 2;
			grown = realloc(buf, cap);
			if (!grown) {
				r = -ENOMEM;
				goto fail;
			}
			buf = grown;
		}
		n = read(fd, buf + len, cap - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			goto fail;
		}
		if (n == 0)
			break;
		len += (size_t)n;
		if (len > CONFIG_MAX_FILE_BYTES) {
			r = -EFBIG;
			goto fail;
		}
	}
	close(fd);
	buf[len] = '\0';
	*ret = buf;
	*ret_len = len;
	return 0;
fail:
	free(buf);
	close(fd);
	return r;
}

int config_load_file(const char *path, struct kvpd_config *ret, char *err, size_t err_len)
{
	const char *nul;
	size_t len = 0;
	char *text = NULL;
	int r;

	if (!path || !ret) {
		set_err(err, err_len, "no configuration file named");
		return -EINVAL;
	}
	r = read_file(path, &text, &len);
	if (r == -EFBIG) {
		set_err(err, err_len, "%s: larger than %d bytes; not a configuration file", path,
			CONFIG_MAX_FILE_BYTES);
		return -EINVAL;
	}
	if (r < 0) {
		set_err(err, err_len, "%s: cannot read: %s", path, strerror(-r));
		return r;
	}
	/* The parser sees a C string: a NUL byte would silently end the file early. */
	nul = memchr(text, '\0', len);
	if (nul) {
		unsigned line = 1;

		for (const char *c = text; c < nul; c++)
			line += *c == '\n';
		set_err(err, err_len, "%s:%u: the line contains a NUL byte", path, line);
		free(text);
		return -EINVAL;
	}
	r = config_load_string(text, path, ret, err, err_len);
	free(text);
	return r;
}

void config_free(struct kvpd_config *c)
{
	if (!c)
		return;
	free(c->socket_path);
	free(c->admin_socket_path);
	free(c->metrics_listen);
	for (size_t i = 0; i < c->npools; i++) {
		for (size_t k = 0; k < c->pools[i].n_swap_files; k++)
			free(c->pools[i].swap_files[k]);
		free(c->pools[i].swap_files);
		free(c->pools[i].allow_uids);
		free(c->pools[i].allow_gids);
		free(c->pools[i].backend_module);
		free(c->pools[i].remote_tier);
		free(c->pools[i].remote_tier_key_file);
		for (size_t k = 0; k < c->pools[i].n_remote_tier_old_key_files; k++)
			free(c->pools[i].remote_tier_old_key_files[k]);
		free(c->pools[i].remote_tier_old_key_files);
		free(c->pools[i].events_endpoint);
		free(c->pools[i].events_replay_endpoint);
		free(c->pools[i].events_curve_secret_key_file);
		free(c->pools[i].events_curve_allowed_keys_file);
		free(c->pools[i].events_topic);
		free(c->pools[i].events_format);
		free(c->pools[i].events_sched);
		free(c->pools[i].events_namespaces);
	}
	free(c->pools);
	*c = (struct kvpd_config){ 0 };
}

const struct kvpd_pool_config *config_find_pool(const struct kvpd_config *c, const char *name)
{
	if (!c || c->npools == 0)
		return NULL;
	if (!name || !*name)
		return &c->pools[0];
	for (size_t i = 0; i < c->npools; i++)
		if (!strcmp(c->pools[i].name, name))
			return &c->pools[i];
	return NULL;
}

static void print_ids(FILE *f, const char *name, const uint32_t *ids, size_t n)
{
	fprintf(f, "%s =", name);
	for (size_t i = 0; i < n; i++) {
		/* Continuation lines keep every line well under libinih's line length. */
		if (i > 0)
			fputs(i % 8 == 0 ? ",\n\t" : ", ", f);
		else
			fputc(' ', f);
		fprintf(f, "%" PRIu32, ids[i]);
	}
	fputc('\n', f);
}

static void print_section(FILE *f, enum config_section section, const void *base)
{
	char buf[32];

	for (size_t k = 0; k < NKEYS; k++) {
		const struct config_key *key = &schema[k];
		const void *field = cfield_at(base, key->offset);

		if (key->section != section)
			continue;
		switch (key->type) {
		case TYPE_U32:
			/* 0 below the key's range is the default "not set" (window). */
			if (*(const uint32_t *)field == 0 && key->min > 0)
				fprintf(f, "# %s is not set\n", key->name);
			else
				fprintf(f, "%s = %" PRIu32 "\n", key->name, *(const uint32_t *)field);
			break;
		case TYPE_U64:
			fprintf(f, "%s = %" PRIu64 "\n", key->name, *(const uint64_t *)field);
			break;
		case TYPE_SIZE:
			fprintf(f, "%s = %s\n", key->name,
				(key->flags & KEY_AUTO) && *(const uint64_t *)field == KVPD_MEASURE
					? "auto"
					: format_size(*(const uint64_t *)field, buf, sizeof(buf)));
			break;
		case TYPE_BOOL:
			fprintf(f, "%s = %s\n", key->name, *(const bool *)field ? "yes" : "no");
			break;
		case TYPE_NUMBER:
			fprintf(f, "%s = %s\n", key->name,
				format_number(*(const double *)field, buf, sizeof(buf)));
			break;
		case TYPE_FILES: {
			char *const *files = *(char **const *)field;
			size_t n = *(const size_t *)cfield_at(base, key->aux_offset);

			if (!n) {
				fprintf(f, "# %s is not set\n", key->name);
				break;
			}
			/* Continuation lines keep each line under libinih's line length. */
			size_t width = (size_t)fprintf(f, "%s = %s", key->name, files[0]);

			for (size_t i = 1; i < n; i++) {
				if (width + strlen(files[i]) + 2 > 150) {
					fprintf(f, ",\n\t%s", files[i]);
					width = 8 + strlen(files[i]);
				} else {
					width += (size_t)fprintf(f, ", %s", files[i]);
				}
			}
			fputc('\n', f);
			break;
		}
		case TYPE_PATH:
			if (*(char *const *)field)
				fprintf(f, "%s = %s\n", key->name, *(char *const *)field);
			else
				fprintf(f, "# %s is not set\n", key->name);
			break;
		case TYPE_LISTEN:
			if (*(char *const *)field)
				fprintf(f, "%s = %s\n", key->name, *(char *const *)field);
			else
				fprintf(f, "# %s is not set: no HTTP endpoint\n", key->name);
			break;
		case TYPE_REDIS_URL:
			if (*(char *const *)field)
				fprintf(f, "%s = %s\n", key->name, *(char *const *)field);
			else
				fprintf(f, "# %s is not set: no remote tier\n", key->name);
			break;
		case TYPE_STRING:
			if (*(char *const *)field)
				fprintf(f, "%s = %s\n", key->name, *(char *const *)field);
			else
				fprintf(f, "# %s is not set\n", key->name);
			break;
		case TYPE_REMOTE_WRITE:
			fprintf(f, "%s = %s\n", key->name,
				remote_write_names[*(const enum kvpd_remote_write *)field]);
			break;
		case TYPE_GROUP:
			if (*(const bool *)cfield_at(base, key->aux_offset))
				fprintf(f, "%s = %" PRIu32 "\n", key->name,
					*(const uint32_t *)field);
			else
				fprintf(f, "# %s is not set: only root may use the admin socket\n",
					key->name);
			break;
		case TYPE_NAMESPACE:
			fprintf(f, "%s = %s\n", key->name,
				namespace_names[*(const enum kvpd_namespace_mode *)field]);
			break;
		case TYPE_POLICY:
			fprintf(f, "%s = %s\n", key->name,
				policy_names[*(const enum kvpd_policy *)field]);
			break;
		case TYPE_EVICTION:
			fprintf(f, "%s = %s\n", key->name,
				eviction_names[*(const enum kvpd_eviction *)field]);
			break;
		case TYPE_BACKEND:
			fprintf(f, "%s = %s\n", key->name,
				backend_names[*(const enum kvpd_backend *)field]);
			break;
		case TYPE_UIDS:
		case TYPE_GIDS:
			print_ids(f, key->name, *(uint32_t *const *)field,
				  *(const size_t *)cfield_at(base, key->aux_offset));
			break;
		}
	}
}

void config_print(const struct kvpd_config *c, FILE *f)
{
	fputs("[daemon]\n", f);
	print_section(f, SECTION_DAEMON, c);
	fputs("\n[limits]\n", f);
	print_section(f, SECTION_LIMITS, c);
	for (size_t i = 0; i < c->npools; i++) {
		fprintf(f, "\n[pool %s]\n", c->pools[i].name);
		print_section(f, SECTION_POOL, &c->pools[i]);
	}
}

/* A key's value as config_print() spells it, cut to fit buf. */
const char *config_format_value(const struct config_key *key, const void *base, char *buf,
				size_t len)
{
	const void *field = cfield_at(base, key->offset);
	size_t used = 0;

	buf[0] = '\0';
	switch (key->type) {
	case TYPE_U32:
		snprintf(buf, len, "%" PRIu32, *(const uint32_t *)field);
		break;
	case TYPE_U64:
		snprintf(buf, len, "%" PRIu64, *(const uint64_t *)field);
		break;
	case TYPE_SIZE:
		if ((key->flags & KEY_AUTO) && *(const uint64_t *)field == KVPD_MEASURE)
			snprintf(buf, len, "auto");
		else
			format_size(*(const uint64_t *)field, buf, len);
		break;
	case TYPE_BOOL:
		snprintf(buf, len, "%s", *(const bool *)field ? "yes" : "no");
		break;
	case TYPE_NUMBER:
		format_number(*(const double *)field, buf, len);
		break;
	case TYPE_NAMESPACE:
		snprintf(buf, len, "%s", namespace_names[*(const enum kvpd_namespace_mode *)field]);
		break;
	case TYPE_POLICY:
		snprintf(buf, len, "%s", policy_names[*(const enum kvpd_policy *)field]);
		break;
	case TYPE_EVICTION:
		snprintf(buf, len, "%s", eviction_names[*(const enum kvpd_eviction *)field]);
		break;
	case TYPE_BACKEND:
		snprintf(buf, len, "%s", backend_names[*(const enum kvpd_backend *)field]);
		break;
	case TYPE_PATH:
		snprintf(buf, len, "%s", *(char *const *)field ? *(char *const *)field : "(not set)");
		break;
	case TYPE_REDIS_URL:
	case TYPE_STRING:
		snprintf(buf, len, "%s", *(char *const *)field ? *(char *const *)field : "(not set)");
		break;
	case TYPE_REMOTE_WRITE:
		snprintf(buf, len, "%s", remote_write_names[*(const enum kvpd_remote_write *)field]);
		break;
	case TYPE_LISTEN:
		snprintf(buf, len, "%s", *(char *const *)field ? *(char *const *)field : "(not set)");
		break;
	case TYPE_GROUP:
		if (*(const bool *)cfield_at(base, key->aux_offset))
			snprintf(buf, len, "%" PRIu32, *(const uint32_t *)field);
		else
			snprintf(buf, len, "(not set)");
		break;
	case TYPE_UIDS:
	case TYPE_GIDS: {
		size_t n = *(const size_t *)cfield_at(base, key->aux_offset);
		const uint32_t *ids = *(uint32_t *const *)field;

		for (size_t i = 0; i < n && used + 1 < len; i++)
			used += (size_t)snprintf(buf + used, len - used, "%s%" PRIu32, i ? ", " : "",
						 ids[i]);
		if (!n)
			snprintf(buf, len, "(empty)");
		break;
	}
	case TYPE_FILES: {
		size_t n = *(const size_t *)cfield_at(base, key->aux_offset);
		char *const *files = *(char **const *)field;

		for (size_t i = 0; i < n && used + 1 < len; i++)
			used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "",
						 files[i]);
		if (!n)
			snprintf(buf, len, "(empty)");
		break;
	}
	}
	return buf;
}

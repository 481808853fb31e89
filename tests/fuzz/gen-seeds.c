/* SPDX-License-Identifier: MIT */
/*
 * Writes the hand-made seeds of the fuzz targets: meaningful inputs, not random bytes, so that
 * a fuzzing run starts from every message type and every ring opcode instead of having to
 * discover the protobuf encoding and the sequence ids by chance.
 *
 *   make tests/fuzz/gen-seeds
 *   tests/fuzz/gen-seeds frame DIR   # fuzz-frame: one valid frame of every message type,
 *                                    # a session's stream of frames, and broken headers
 *   tests/fuzz/gen-seeds ring DIR    # fuzz-ring: every opcode in a meaningful order, and
 *                                    # entries the daemon must refuse
 *
 * The committed corpora (tests/fuzz/corpus/TARGET) are these seeds plus what libFuzzer found
 * from them, minimized with -merge=1 (tests/fuzz/README.md says how).  fuzz-config's seeds are
 * configuration files, committed as they are.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/frame.h"
#include "proto/kvpaged.pb-c.h"
#include "proto/ring.h"

static const char *out_dir;
static int status;

static void write_seed(const char *name, const void *data, size_t len)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", out_dir, name);
	f = fopen(path, "we");
	if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
		fprintf(stderr, "gen-seeds: %s: %s\n", path, strerror(errno));
		status = EXIT_FAILURE;
	}
}

/* ------------------------------------------------------------------------------- frames */

/* Frames appended one after the other, as a peer sends them. */
struct stream {
	uint8_t buf[8192];
	size_t len;
};

static void put_frame_raw(struct stream *st, const struct kvp_frame_header *h, const void *payload,
			  size_t len)
{
	if (st->len + KVP_FRAME_HEADER_BYTES + len > sizeof(st->buf))
		abort();
	kvp_frame_header_encode(h, st->buf + st->len);
	if (len)
		memcpy(st->buf + st->len + KVP_FRAME_HEADER_BYTES, payload, len);
	st->len += KVP_FRAME_HEADER_BYTES + len;
}

static void put_frame(struct stream *st, uint16_t type, uint32_t seq, const ProtobufCMessage *m)
{
	uint8_t payload[4096];
	size_t len = m ? protobuf_c_message_get_packed_size(m) : 0;
	struct kvp_frame_header h = { .len = (uint32_t)len, .seq = seq, .type = type };

	if (len > sizeof(payload))
		abort();
	if (m)
		protobuf_c_message_pack(m, payload);
	put_frame_raw(st, &h, payload, len);
}

/* One seed: one frame of this type. */
static void frame_seed(const char *name, uint16_t type, const ProtobufCMessage *m)
{
	struct stream st = { .len = 0 };

	put_frame(&st, type, 7, m);
	write_seed(name, st.buf, st.len);
}

#define T(x) KVPAGED__V1__MESSAGE_TYPE__##x

static uint32_t tokens[] = { 101, 102, 103, 104, 105, 106, 107, 108,
			      109, 110, 111, 112, 113, 114, 115, 116 };
static uint32_t table[] = { 0, 1, 0xffffffff, 3 };

static void gen_frames(void)
{
	/* Client requests. */
	Kvpaged__V1__Hello hello = KVPAGED__V1__HELLO__INIT;
	hello.protocol_version = KVP_PROTOCOL_VERSION;
	hello.client_name = "engine-0";
	hello.pool = "main";
	hello.namespace_ = "tenant-a";
	hello.ring_entries = 16;
	hello.ring_data_bytes = 4096;
	frame_seed("req-hello", T(HELLO), &hello.base);

	Kvpaged__V1__Open open = KVPAGED__V1__OPEN__INIT;
	open.n_tokens = 10;
	open.tokens = tokens;
	open.extra_key = 42;
	open.flags = 1;
	open.priority = 3;
	open.wait_ms = 100;
	frame_seed("req-open", T(OPEN), &open.base);

	Kvpaged__V1__Open open_h2o = KVPAGED__V1__OPEN__INIT;
	open_h2o.n_tokens = 10;
	open_h2o.tokens = tokens;
	open_h2o.retention = 2;
	open_h2o.n_sink = 2;
	open_h2o.recent = 4;
	open_h2o.budget = 8;
	open_h2o.decay = 0.9f;
	open_h2o.granularity = 1;
	frame_seed("req-open-h2o", T(OPEN), &open_h2o.base);

	Kvpaged__V1__Append append = KVPAGED__V1__APPEND__INIT;
	append.seq = UINT64_C(1) << 32;
	append.n_tokens = 3;
	append.tokens = tokens;
	append.wait_ms = 5;
	frame_seed("req-append", T(APPEND), &append.base);

	Kvpaged__V1__Commit commit = KVPAGED__V1__COMMIT__INIT;
	commit.seq = UINT64_C(1) << 32;
	commit.tokens = 8;
	frame_seed("req-commit", T(COMMIT), &commit.base);

	Kvpaged__V1__Fork fork = KVPAGED__V1__FORK__INIT;
	fork.seq = UINT64_C(1) << 32;
	frame_seed("req-fork", T(FORK), &fork.base);

	Kvpaged__V1__Close close = KVPAGED__V1__CLOSE__INIT;
	close.seq = UINT64_C(1) << 32 | 1;
	frame_seed("req-close", T(CLOSE), &close.base);

	Kvpaged__V1__Lookup lookup = KVPAGED__V1__LOOKUP__INIT;
	lookup.n_tokens = 8;
	lookup.tokens = tokens;
	lookup.extra_key = 42;
	lookup.flags = 1;
	frame_seed("req-lookup", T(LOOKUP), &lookup.base);

	Kvpaged__V1__SeqInfo info = KVPAGED__V1__SEQ_INFO__INIT;
	info.seq = UINT64_C(1) << 32;
	frame_seed("req-seq-info", T(SEQ_INFO), &info.base);

	Kvpaged__V1__Park park = KVPAGED__V1__PARK__INIT;
	park.seq = UINT64_C(1) << 32;
	frame_seed("req-park", T(PARK), &park.base);

	Kvpaged__V1__Resume resume = KVPAGED__V1__RESUME__INIT;
	resume.seq = UINT64_C(1) << 32;
	resume.wait_ms = 50;
	frame_seed("req-resume", T(RESUME), &resume.base);

	float weights[] = { 0.5f, 0.25f, 0.125f, 0.0f, 1e-30f, 3.0f };
	Kvpaged__V1__Scores scores = KVPAGED__V1__SCORES__INIT;
	scores.seq = UINT64_C(1) << 32;
	scores.first = 2;
	scores.n_weights = 6;
	scores.weights = weights;
	frame_seed("req-scores", T(SCORES), &scores.base);

	Kvpaged__V1__Scores scores_packed = KVPAGED__V1__SCORES__INIT;
	scores_packed.seq = UINT64_C(1) << 32;
	scores_packed.first = 0xffffffff;
	scores_packed.n_weights = 3;
	scores_packed.weights = weights;
	frame_seed("req-scores-packed", T(SCORES), &scores_packed.base);

	/* Admin requests: all an AdminRequest, with and without a pool. */
	static const struct {
		const char *name;
		uint16_t type;
	} admin[] = {
		{ "admin-status", T(ADMIN_STATUS) },	   { "admin-pools", T(ADMIN_POOLS) },
		{ "admin-sessions", T(ADMIN_SESSIONS) },   { "admin-sequences", T(ADMIN_SEQUENCES) },
		{ "admin-stats", T(ADMIN_STATS) },	   { "admin-metrics", T(ADMIN_METRICS) },
		{ "admin-verify", T(ADMIN_VERIFY) },	   { "admin-drop-cache", T(ADMIN_DROP_CACHE) },
		{ "admin-reload", T(ADMIN_RELOAD) },
	};
	Kvpaged__V1__AdminRequest areq = KVPAGED__V1__ADMIN_REQUEST__INIT;
	areq.pool = "main";
	for (size_t i = 0; i < sizeof(admin) / sizeof(admin[0]); i++)
		frame_seed(admin[i].name, admin[i].type, i % 2 ? &areq.base : NULL);

	/* Replies, as libkvpaged and kvpagedctl unpack them. */
	Kvpaged__V1__Error error = KVPAGED__V1__ERROR__INIT;
	error.code = ENOSPC;
	error.message = "pool main: no free or cached block";
	frame_seed("rep-error", T(ERROR), &error.base);

	Kvpaged__V1__PoolDescription desc = KVPAGED__V1__POOL_DESCRIPTION__INIT;
	desc.name = "main";
	desc.layers = 2;
	desc.kv_heads = 2;
	desc.head_dim = 8;
	desc.element_bytes = 2;
	desc.block_tokens = 4;
	desc.capacity_blocks = 64;
	desc.bytes_per_token = 128;
	desc.block_bytes = 512;
	desc.pool_bytes = 32768;
	desc.block_stride = 512;
	desc.layer_stride = 256;
	desc.kv_stride = 128;
	desc.slot_stride = 32;
	desc.head_stride = 16;
	desc.backend = "host";
	desc.max_seq_tokens = 1024;
	desc.host_tier_blocks = 128;
	desc.model_params = 7e9;
	desc.engine_flops = 1e14;
	desc.host_tier_bandwidth = 2.5e10;
	desc.host_tier_promotes = 1;
	desc.window = 16;
	Kvpaged__V1__SessionLimits limits = KVPAGED__V1__SESSION_LIMITS__INIT;
	limits.max_sequences = 16;
	limits.max_blocks = 48;
	limits.max_inflight = 64;
	limits.max_tokens_per_request = 512;
	Kvpaged__V1__Welcome welcome = KVPAGED__V1__WELCOME__INIT;
	welcome.protocol_version = KVP_PROTOCOL_VERSION;
	welcome.session_id = 1;
	welcome.pool = &desc;
	welcome.limits = &limits;
	welcome.ring_entries = 16;
	welcome.ring_data_bytes = 4096;
	welcome.ring_bytes = 8192;
	welcome.namespace_ = "uid:1000/tenant-a";
	frame_seed("rep-welcome", T(WELCOME), &welcome.base);

	Kvpaged__V1__OpenReply open_rep = KVPAGED__V1__OPEN_REPLY__INIT;
	open_rep.seq = UINT64_C(1) << 32;
	open_rep.cached_tokens = 4;
	open_rep.n_table = 4;
	open_rep.table = table;
	frame_seed("rep-open", T(OPEN_REPLY), &open_rep.base);

	Kvpaged__V1__AppendReply append_rep = KVPAGED__V1__APPEND_REPLY__INIT;
	append_rep.first_changed = 2;
	append_rep.n_table = 2;
	append_rep.table = table + 2;
	frame_seed("rep-append", T(APPEND_REPLY), &append_rep.base);

	Kvpaged__V1__CommitReply commit_rep = KVPAGED__V1__COMMIT_REPLY__INIT;
	commit_rep.replaced = 1;
	commit_rep.released = 1;
	commit_rep.n_table = 4;
	commit_rep.table = table;
	frame_seed("rep-commit", T(COMMIT_REPLY), &commit_rep.base);

	Kvpaged__V1__ForkReply fork_rep = KVPAGED__V1__FORK_REPLY__INIT;
	fork_rep.seq = UINT64_C(1) << 32 | 1;
	fork_rep.n_table = 4;
	fork_rep.table = table;
	frame_seed("rep-fork", T(FORK_REPLY), &fork_rep.base);

	Kvpaged__V1__CloseReply close_rep = KVPAGED__V1__CLOSE_REPLY__INIT;
	frame_seed("rep-close", T(CLOSE_REPLY), &close_rep.base);

	Kvpaged__V1__LookupReply lookup_rep = KVPAGED__V1__LOOKUP_REPLY__INIT;
	lookup_rep.cached_tokens = 8;
	frame_seed("rep-lookup", T(LOOKUP_REPLY), &lookup_rep.base);

	uint32_t positions[] = { 0, 1, 5, 9 };
	Kvpaged__V1__SeqInfoReply info_rep = KVPAGED__V1__SEQ_INFO_REPLY__INIT;
	info_rep.tokens = 10;
	info_rep.committed = 8;
	info_rep.n_table = 4;
	info_rep.table = table;
	info_rep.state = 1;
	info_rep.retention = 2;
	info_rep.n_sink = 2;
	info_rep.recent = 4;
	info_rep.held_blocks = 3;
	info_rep.freed_blocks = 1;
	info_rep.budget = 8;
	info_rep.granularity = 1;
	info_rep.n_packed_table = 1;
	info_rep.packed_table = table + 3;
	info_rep.n_packed_positions = 4;
	info_rep.packed_positions = positions;
	frame_seed("rep-seq-info", T(SEQ_INFO_REPLY), &info_rep.base);

	Kvpaged__V1__ParkReply park_rep = KVPAGED__V1__PARK_REPLY__INIT;
	frame_seed("rep-park", T(PARK_REPLY), &park_rep.base);

	Kvpaged__V1__ResumeReply resume_rep = KVPAGED__V1__RESUME_REPLY__INIT;
	resume_rep.recompute_tokens = 2;
	resume_rep.n_table = 4;
	resume_rep.table = table;
	frame_seed("rep-resume", T(RESUME_REPLY), &resume_rep.base);

	Kvpaged__V1__ScoresReply scores_rep = KVPAGED__V1__SCORES_REPLY__INIT;
	frame_seed("rep-scores", T(SCORES_REPLY), &scores_rep.base);

	Kvpaged__V1__Refusal refusal = KVPAGED__V1__REFUSAL__INIT, *refusals[] = { &refusal };
	refusal.reason = "max_sessions_per_uid";
	refusal.count = 3;
	Kvpaged__V1__Status status_rep = KVPAGED__V1__STATUS__INIT;
	status_rep.version = "1.0";
	status_rep.uptime_ms = 12345;
	status_rep.sessions = 2;
	status_rep.pools = 1;
	status_rep.requests = 99;
	status_rep.pid = 4321;
	status_rep.admin_sessions = 1;
	status_rep.client_bytes = 65536;
	status_rep.n_refusals = 1;
	status_rep.refusals = refusals;
	status_rep.log_lines_dropped = 1;
	status_rep.fd_limit = 1024;
	status_rep.fds = 17;
	frame_seed("rep-admin-status", T(ADMIN_STATUS_REPLY), &status_rep.base);

	Kvpaged__V1__SwapFile swap = KVPAGED__V1__SWAP_FILE__INIT, *swaps[] = { &swap };
	swap.path = "/var/lib/kvpaged/swap0";
	swap.direct = 1;
	uint32_t ids[] = { 0, 1000 };
	Kvpaged__V1__PoolUsage usage = KVPAGED__V1__POOL_USAGE__INIT, *usages[] = { &usage };
	usage.description = &desc;
	usage.free = 60;
	usage.cached = 2;
	usage.in_use = 2;
	usage.indexed = 2;
	usage.sequences = 1;
	usage.sessions = 1;
	usage.n_swap_files = 1;
	usage.swap_files = swaps;
	usage.n_allow_uids = 2;
	usage.allow_uids = ids;
	usage.n_allow_gids = 1;
	usage.allow_gids = ids + 1;
	Kvpaged__V1__Pools pools = KVPAGED__V1__POOLS__INIT;
	pools.n_pools = 1;
	pools.pools = usages;
	frame_seed("rep-admin-pools", T(ADMIN_POOLS_REPLY), &pools.base);

	Kvpaged__V1__SessionInfo si = KVPAGED__V1__SESSION_INFO__INIT, *sis[] = { &si };
	si.id = 1;
	si.client_name = "engine-0";
	si.pool = "main";
	si.namespace_ = "uid:1000";
	si.pid = 4000;
	si.uid = 1000;
	si.gid = 1000;
	si.sequences = 1;
	si.blocks = 3;
	si.requests = 7;
	si.rings = 1;
	si.bytes = 4096;
	si.idle_ms = 20;
	Kvpaged__V1__Sessions sessions = KVPAGED__V1__SESSIONS__INIT;
	sessions.n_sessions = 1;
	sessions.sessions = sis;
	frame_seed("rep-admin-sessions", T(ADMIN_SESSIONS_REPLY), &sessions.base);

	Kvpaged__V1__SequenceInfo sqi = KVPAGED__V1__SEQUENCE_INFO__INIT, *sqis[] = { &sqi };
	sqi.seq = UINT64_C(1) << 32;
	sqi.session = 1;
	sqi.pool = "main";
	sqi.tokens = 10;
	sqi.committed = 8;
	sqi.blocks = 3;
	sqi.retention = "h2o";
	sqi.held_blocks = 2;
	sqi.freed_blocks = 1;
	sqi.n_sink = 2;
	sqi.recent = 4;
	sqi.retained_tokens = 8;
	sqi.budget = 8;
	sqi.granularity = 1;
	Kvpaged__V1__Sequences sequences = KVPAGED__V1__SEQUENCES__INIT;
	sequences.n_sequences = 1;
	sequences.sequences = sqis;
	frame_seed("rep-admin-sequences", T(ADMIN_SEQUENCES_REPLY), &sequences.base);

	Kvpaged__V1__TierStats tier = KVPAGED__V1__TIER_STATS__INIT, *tiers[] = { &tier };
	tier.tier = "host";
	tier.capacity_blocks = 128;
	tier.used_blocks = 5;
	tier.demotions = 5;
	tier.promotions = 2;
	tier.bytes_in = 2560;
	tier.checksum_errors = 1;
	Kvpaged__V1__Preemption pre = KVPAGED__V1__PREEMPTION__INIT, *pres[] = { &pre };
	pre.seq = UINT64_C(1) << 32;
	pre.priority = 1;
	pre.tokens = 10;
	pre.blocks = 3;
	pre.swap_blocks = 2;
	pre.decision = "swap";
	pre.reason = "cheaper to swap";
	pre.tier = "host";
	pre.swap_ms = 0.5;
	pre.recompute_ms = 3.25;
	pre.tick = 77;
	Kvpaged__V1__PoolStats ps = KVPAGED__V1__POOL_STATS__INIT, *pss[] = { &ps };
	ps.pool = "main";
	ps.lookups = 4;
	ps.query_blocks = 8;
	ps.hit_blocks = 4;
	ps.hit_tokens = 16;
	ps.n_tiers = 1;
	ps.tiers = tiers;
	ps.n_recent_preemptions = 1;
	ps.recent_preemptions = pres;
	ps.namespaces_folded = 1;
	Kvpaged__V1__NamespaceStats ns = KVPAGED__V1__NAMESPACE_STATS__INIT, *nss[] = { &ns };
	ns.pool = "main";
	ns.namespace_ = "(other)";
	ns.lookups = 4;
	ns.sessions = 1;
	ns.bytes = 4096;
	Kvpaged__V1__Stats stats = KVPAGED__V1__STATS__INIT;
	stats.n_pools = 1;
	stats.pools = pss;
	stats.n_namespaces = 1;
	stats.namespaces = nss;
	frame_seed("rep-admin-stats", T(ADMIN_STATS_REPLY), &stats.base);

	Kvpaged__V1__Metrics metrics = KVPAGED__V1__METRICS__INIT;
	metrics.text = "# TYPE kvpaged_blocks gauge\nkvpaged_blocks{pool=\"main\",state=\"free\"} 60\n";
	frame_seed("rep-admin-metrics", T(ADMIN_METRICS_REPLY), &metrics.base);

	char *problems[] = { "pool main: block 3: refcount 2, 1 reference found" };
	Kvpaged__V1__VerifyReply verify = KVPAGED__V1__VERIFY_REPLY__INIT;
	verify.n_problems = 1;
	verify.problems = problems;
	frame_seed("rep-admin-verify", T(ADMIN_VERIFY_REPLY), &verify.base);

	Kvpaged__V1__DropCacheReply drop = KVPAGED__V1__DROP_CACHE_REPLY__INIT;
	drop.freed_blocks = 2;
	frame_seed("rep-admin-drop-cache", T(ADMIN_DROP_CACHE_REPLY), &drop.base);

	char *applied[] = { "[limits] max_sequences: 16 -> 32" };
	char *refused[] = { "[pool main] capacity_blocks: 64 -> 128 (needs a restart)" };
	Kvpaged__V1__ReloadReply reload = KVPAGED__V1__RELOAD_REPLY__INIT;
	reload.n_applied = 1;
	reload.applied = applied;
	reload.n_refused = 1;
	reload.refused = refused;
	frame_seed("rep-admin-reload", T(ADMIN_RELOAD_REPLY), &reload.base);

	/* A session's stream: Hello, then a sequence's life, several frames in one input. */
	struct stream st_session = { .len = 0 };
	put_frame(&st_session, T(HELLO), 1, &hello.base);
	put_frame(&st_session, T(OPEN), 2, &open.base);
	put_frame(&st_session, T(APPEND), 3, &append.base);
	put_frame(&st_session, T(COMMIT), 4, &commit.base);
	put_frame(&st_session, T(FORK), 5, &fork.base);
	put_frame(&st_session, T(SCORES), 6, &scores.base);
	put_frame(&st_session, T(PARK), 7, &park.base);
	put_frame(&st_session, T(RESUME), 8, &resume.base);
	put_frame(&st_session, T(CLOSE), 9, &close.base);
	write_seed("stream-session", st_session.buf, st_session.len);

	/* Broken frames: each must be refused by its header, or fail to unpack, and no more. */
	struct kvp_frame_header h = { .len = 0, .seq = 1, .type = T(HELLO) };
	struct stream st = { .len = 0 };
	uint8_t junk[] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01 };

	put_frame_raw(&st, &h, junk, sizeof(junk));
	write_seed("bad-payload", st.buf, st.len);

	st.len = 0;
	h.flags = 1;
	put_frame_raw(&st, &h, NULL, 0);
	write_seed("bad-flags", st.buf, st.len);

	st.len = 0;
	h.flags = 0;
	h.nfds = KVP_FRAME_MAX_FDS + 1;
	put_frame_raw(&st, &h, NULL, 0);
	write_seed("bad-nfds", st.buf, st.len);

	st.len = 0;
	h.nfds = 0;
	h.len = (1u << 20) + 1; /* above the target's cap */
	put_frame_raw(&st, &h, NULL, 0);
	write_seed("bad-len-above-cap", st.buf, st.len);

	st.len = 0;
	h.len = 100; /* more than the input holds */
	put_frame_raw(&st, &h, junk, sizeof(junk));
	write_seed("bad-truncated", st.buf, st.len);

	st.len = 0;
	h.len = 0;
	h.type = 999;
	put_frame_raw(&st, &h, NULL, 0);
	write_seed("bad-unknown-type", st.buf, st.len);

	st.len = 0;
	put_frame(&st, T(HELLO), 1, &hello.base);
	st.buf[0] = 'G'; /* "GET / HTTP/1.1" would be refused here, at the magic */
	write_seed("bad-magic", st.buf, st.len);

	write_seed("bad-short-header", "KVP1\0\0\0\0", 8);
}

/* --------------------------------------------------------------------------------- rings */

/* fuzz-ring's input: the submission tail, then 16 entries, then the data area. */
#define RING_ENTRIES 16
#define RING_DATA_BYTES 4096
/* The sequence ids a fresh pool hands out (tests/fuzz/fuzz-ring.c). */
#define SEQ0 (UINT64_C(1) << 32 | 0)
#define SEQ1 (UINT64_C(1) << 32 | 1)

struct ring_seed {
	uint32_t tail;
	struct kvp_sqe sqes[RING_ENTRIES];
	uint8_t data[RING_DATA_BYTES];
	uint32_t data_used;
};

/* Copies words into the data area; returns their offset. */
static uint32_t ring_put(struct ring_seed *rs, const void *words, uint32_t bytes)
{
	uint32_t off = rs->data_used;

	if (off + bytes > RING_DATA_BYTES)
		abort();
	memcpy(rs->data + off, words, bytes);
	rs->data_used += bytes;
	return off;
}

/* Room for output in the data area; returns its offset. */
static uint32_t ring_room(struct ring_seed *rs, uint32_t bytes)
{
	static const uint8_t zero[256];

	if (bytes > sizeof(zero))
		abort();
	return ring_put(rs, zero, bytes);
}

static struct kvp_sqe *ring_add(struct ring_seed *rs, uint8_t opcode, uint64_t seq)
{
	struct kvp_sqe *e;

	if (rs->tail == RING_ENTRIES)
		abort();
	e = &rs->sqes[rs->tail];
	*e = (struct kvp_sqe){ .opcode = opcode, .seq = seq, .user_data = 1000 + rs->tail };
	rs->tail++;
	return e;
}

static void ring_tokens(struct ring_seed *rs, struct kvp_sqe *e, const uint32_t *t, uint32_t n)
{
	e->in_off = ring_put(rs, t, n * sizeof(uint32_t));
	e->in_len = n * sizeof(uint32_t);
}

static void ring_out(struct ring_seed *rs, struct kvp_sqe *e, uint32_t bytes)
{
	e->out_off = ring_room(rs, bytes);
	e->out_len = bytes;
}

static void ring_write(const char *name, const struct ring_seed *rs)
{
	uint8_t buf[sizeof(uint32_t) + sizeof(rs->sqes) + RING_DATA_BYTES];
	size_t len = sizeof(uint32_t) + sizeof(rs->sqes) + rs->data_used;

	memcpy(buf, &rs->tail, sizeof(uint32_t));
	memcpy(buf + sizeof(uint32_t), rs->sqes, sizeof(rs->sqes));
	memcpy(buf + sizeof(uint32_t) + sizeof(rs->sqes), rs->data, rs->data_used);
	/* Without a data area the entries can be cut after the last one used. */
	if (!rs->data_used)
		len = sizeof(uint32_t) +
		      (rs->tail < RING_ENTRIES ? rs->tail : RING_ENTRIES) * sizeof(struct kvp_sqe);
	write_seed(name, buf, len);
}

/* An OPEN of n tokens with room for its table. */
static struct kvp_sqe *ring_open(struct ring_seed *rs, uint32_t n, uint32_t arg, uint64_t seq)
{
	struct kvp_sqe *e = ring_add(rs, KVP_OP_OPEN, seq);

	e->arg = arg;
	e->extra = 42;
	ring_tokens(rs, e, tokens, n);
	ring_out(rs, e, 64);
	return e;
}

static void gen_rings(void)
{
	struct ring_seed rs;
	struct kvp_sqe *e;

	rs = (struct ring_seed){ .tail = 0 };
	ring_add(&rs, KVP_OP_NOP, 0);
	ring_write("op-nop", &rs);

	/* A sequence's whole life: every operation on the sequence OPEN made. */
	rs = (struct ring_seed){ .tail = 0 };
	ring_open(&rs, 10, 3 << 8, 0);
	e = ring_add(&rs, KVP_OP_APPEND, SEQ0);
	ring_tokens(&rs, e, tokens, 6);
	ring_out(&rs, e, 64);
	e = ring_add(&rs, KVP_OP_COMMIT, SEQ0);
	e->arg = 16;
	ring_out(&rs, e, 64);
	e = ring_add(&rs, KVP_OP_SEQ_INFO, SEQ0);
	ring_out(&rs, e, 64);
	e = ring_add(&rs, KVP_OP_FORK, SEQ0);
	ring_out(&rs, e, 64);
	e = ring_add(&rs, KVP_OP_LOOKUP, 0);
	e->extra = 42;
	ring_tokens(&rs, e, tokens, 8);
	ring_add(&rs, KVP_OP_CLOSE, SEQ1);
	ring_add(&rs, KVP_OP_PARK, SEQ0);
	e = ring_add(&rs, KVP_OP_SEQ_INFO, SEQ0);
	ring_out(&rs, e, 64);
	e = ring_add(&rs, KVP_OP_RESUME, SEQ0);
	ring_out(&rs, e, 64);
	ring_add(&rs, KVP_OP_CLOSE, SEQ0);
	ring_write("life-full", &rs);

	/* Prefix reuse: commit full blocks, close, open the same prompt, look it up. */
	rs = (struct ring_seed){ .tail = 0 };
	ring_open(&rs, 8, 0, 0);
	e = ring_add(&rs, KVP_OP_COMMIT, SEQ0);
	e->arg = 8;
	ring_add(&rs, KVP_OP_CLOSE, SEQ0);
	ring_open(&rs, 10, 1, 0); /* flag 1: the last token stays uncached */
	e = ring_add(&rs, KVP_OP_LOOKUP, 0);
	e->extra = 42;
	ring_tokens(&rs, e, tokens, 10);
	ring_write("prefix-reuse", &rs);

	/* Sinks retention (flag 2): n_sink 2, recent 4 in seq; commit past them releases blocks. */
	rs = (struct ring_seed){ .tail = 0 };
	ring_open(&rs, 10, 2, UINT64_C(2) << 32 | 4);
	for (int i = 0; i < 2; i++) {
		e = ring_add(&rs, KVP_OP_APPEND, SEQ0);
		ring_tokens(&rs, e, tokens, 10);
		ring_out(&rs, e, 64);
	}
	e = ring_add(&rs, KVP_OP_COMMIT, SEQ0);
	e->arg = 30;
	ring_out(&rs, e, 64);
	e = ring_add(&rs, KVP_OP_SEQ_INFO, SEQ0);
	ring_out(&rs, e, 64);
	ring_write("retention-sinks", &rs);

	/* H2O (flag 4): budget 8, recent 4 in seq; scores, commits, the packed map. */
	float weights[] = { 0.5f, 4.0f, 0.25f, 2.0f, 0.125f, 1.0f, 0.0f, 3.0f, 0.75f, 0.5f };
	rs = (struct ring_seed){ .tail = 0 };
	ring_open(&rs, 10, 4, UINT64_C(8) << 32 | 4);
	e = ring_add(&rs, KVP_OP_SCORES, SEQ0);
	e->arg = 0;
	e->in_off = ring_put(&rs, weights, sizeof(weights));
	e->in_len = sizeof(weights);
	e = ring_add(&rs, KVP_OP_COMMIT, SEQ0);
	e->arg = 10;
	ring_out(&rs, e, 64);
	e = ring_add(&rs, KVP_OP_APPEND, SEQ0);
	ring_tokens(&rs, e, tokens, 6);
	ring_out(&rs, e, 64);
	e = ring_add(&rs, KVP_OP_SCORES, SEQ0);
	e->arg = 0xffffffff; /* the packed slots, in order */
	e->in_off = ring_put(&rs, weights, 4 * sizeof(float));
	e->in_len = 4 * sizeof(float);
	e = ring_add(&rs, KVP_OP_COMMIT, SEQ0);
	e->arg = 16;
	ring_out(&rs, e, 64);
	e = ring_add(&rs, KVP_OP_PACKED, SEQ0);
	ring_out(&rs, e, 128);
	e = ring_add(&rs, KVP_OP_SEQ_INFO, SEQ0);
	ring_out(&rs, e, 64);
	ring_write("retention-h2o", &rs);

	/* Output that does not fit: the operation happens, the completion says truncated. */
	rs = (struct ring_seed){ .tail = 0 };
	e = ring_open(&rs, 10, 0, 0);
	e->out_len = 4;
	e = ring_add(&rs, KVP_OP_PACKED, SEQ0);
	ring_out(&rs, e, 4);
	ring_write("out-truncated", &rs);

	/* Refused without closing the session: unknown ids, a parked sequence, bad arguments. */
	rs = (struct ring_seed){ .tail = 0 };
	ring_add(&rs, KVP_OP_CLOSE, SEQ1);
	ring_add(&rs, KVP_OP_APPEND, UINT64_C(7) << 32 | 3);
	ring_open(&rs, 4, 6, 0); /* sinks and h2o at once: EINVAL */
	ring_open(&rs, 4, 0, 0);
	ring_add(&rs, KVP_OP_PARK, SEQ0);
	e = ring_add(&rs, KVP_OP_APPEND, SEQ0); /* parked: EBUSY */
	ring_tokens(&rs, e, tokens, 2);
	e = ring_add(&rs, KVP_OP_RESUME, SEQ0);
	ring_out(&rs, e, 64);
	e = ring_add(&rs, KVP_OP_COMMIT, SEQ0);
	e->arg = 1000; /* more than it holds */
	e = ring_add(&rs, KVP_OP_SCORES, SEQ0); /* not h2o */
	e->in_off = ring_put(&rs, weights, sizeof(weights));
	e->in_len = sizeof(weights);
	ring_write("refused-ops", &rs);

	/* More than the session may hold: 4 blocks each, the 13th is over max_blocks (48). */
	rs = (struct ring_seed){ .tail = 0 };
	for (int i = 0; i < RING_ENTRIES; i++)
		ring_open(&rs, 13, 0, 0);
	ring_write("full-ring-opens", &rs);

	/* More tokens in one request than max_tokens_per_request (512): E2BIG. */
	static uint32_t many[600];
	for (uint32_t i = 0; i < 600; i++)
		many[i] = i;
	rs = (struct ring_seed){ .tail = 0 };
	e = ring_add(&rs, KVP_OP_LOOKUP, 0);
	ring_tokens(&rs, e, many, 600);
	ring_write("too-many-tokens", &rs);

	/* Entries the daemon refuses by closing the session. */
	static const struct {
		const char *name;
		struct kvp_sqe sqe;
	} bad[] = {
		{ "bad-opcode", { .opcode = KVP_OP_MAX } },
		{ "bad-flags", { .opcode = KVP_OP_NOP, .flags = 1 } },
		{ "bad-in-len-unaligned", { .opcode = KVP_OP_LOOKUP, .in_len = 6 } },
		{ "bad-in-off-unaligned", { .opcode = KVP_OP_LOOKUP, .in_off = 2, .in_len = 4 } },
		{ "bad-in-out-of-area", { .opcode = KVP_OP_LOOKUP, .in_off = 4092, .in_len = 8 } },
		{ "bad-out-wraps", { .opcode = KVP_OP_OPEN, .out_off = 0xfffffffc, .out_len = 8 } },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		rs = (struct ring_seed){ .tail = 0 };
		ring_add(&rs, KVP_OP_NOP, 0);
		rs.sqes[rs.tail++] = bad[i].sqe;
		ring_add(&rs, KVP_OP_NOP, 0); /* never reached */
		ring_write(bad[i].name, &rs);
	}

	/* Indices the daemon refuses: a tail more than the ring ahead of the head. */
	rs = (struct ring_seed){ .tail = 0 };
	ring_add(&rs, KVP_OP_NOP, 0);
	rs.tail = RING_ENTRIES + 1;
	ring_write("bad-tail-ahead", &rs);
	rs.tail = 0xffffffff;
	ring_write("bad-tail-behind", &rs);
}

int main(int argc, char **argv)
{
	if (argc != 3 || (strcmp(argv[1], "frame") && strcmp(argv[1], "ring"))) {
		fprintf(stderr, "usage: %s frame|ring DIRECTORY\n", argv[0]);
		return 2;
	}
	out_dir = argv[2];
	if (!strcmp(argv[1], "frame"))
		gen_frames();
	else
		gen_rings();
	return status;
}

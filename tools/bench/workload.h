/* SPDX-License-Identifier: MIT */
/*
 * A workload is a list of requests; a request's prompt is a list of segments.  A segment's
 * stream id names the whole prefix up to the segment's end (as Mooncake's hash ids do), so
 * equal streams mean equal tokens and equal prefixes.  Streams are materialized once.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include <json-c/json.h>

#include "daemon/core/core.h"
#include "tools/bench/u64map.h"

#define STREAM_OUTPUT (UINT64_C(3) << 56) /* | request index: generated tokens */

struct wseg {
	uint64_t stream;
	uint32_t len;
	uint32_t arena_off; /* where the stream's tokens start in the arena */
};

struct wreq {
	uint32_t seg_off, nseg;
	uint32_t input_len, output_len;
	double t; /* arrival, seconds (a trace's timestamp; else its index) */
};

struct workload {
	struct wreq *reqs;
	uint32_t nreqs, cap_reqs;
	struct wseg *segs;
	uint32_t nsegs, cap_segs;
	uint32_t *arena; /* tokens of every distinct stream */
	size_t arena_len, arena_cap;
	struct u64map streams; /* stream -> arena offset */
	uint32_t max_tokens;   /* longest input + output */
};

int workload_init(struct workload *w);
/*
 * Loads a Mooncake-format trace (JSON lines: input_length, output_length, hash_ids), at most
 * max_requests of it (0: all); on a bad line prints file, line and reason and returns -EINVAL.
 */
int workload_load_trace(const char *path, struct workload *w, uint32_t max_requests);
void workload_free(struct workload *w);

/* Adds a request; segment lengths add up to its prompt.  0 or -ENOMEM. */
int workload_add(struct workload *w, const struct wseg *segs, uint32_t nseg, uint32_t output_len);

/* Writes request r's prompt (input_len tokens) into out. */
void workload_prompt(const struct workload *w, uint32_t r, uint32_t *out);

/* Identity of request r's prefix up to and including token pos. */
uint64_t workload_prefix_key(const struct workload *w, uint32_t r, uint32_t pos);

/* The levels a replay reports, each shown even when it has no capacity. */
enum replay_level { REPLAY_POOL, REPLAY_HOST, REPLAY_FILE, REPLAY_LEVELS };

struct replay_result {
	uint32_t capacity;
	uint32_t block_tokens;
	uint32_t requests;
	uint32_t rejected; /* did not fit in the pool at all */
	uint64_t blocks;   /* prompt blocks, partial ones included */
	uint64_t hit_blocks; /* from the pool and every tier */
	uint64_t hit_tokens;
	uint32_t tier_capacity[REPLAY_LEVELS];   /* by enum replay_level */
	uint64_t tier_hit_blocks[REPLAY_LEVELS]; /* where the hits came from */
	uint64_t evictions;
	uint64_t collisions;
	uint64_t ops;     /* core calls */
	uint64_t core_ns; /* time inside core calls */
	uint64_t wall_ns; /* whole replay, prompts built included */
	const char *policy; /* the pool's eviction policy's name, printed when set */
	/* The offline optimum at the same capacity (replay_belady). */
	double belady_hit_fraction; /* < 0: not computed */
	uint64_t belady_blocks, belady_hit_blocks;
	uint32_t belady_rejected;
};

/* Replays w through a fresh core (in-process). */
int replay_core(const struct workload *w, uint32_t block_tokens, uint32_t capacity,
		bool prompt_only, struct replay_result *res);
/* The same with host and file tiers below the pool (bookkeeping only: no bytes move). */
int replay_core_tiers(const struct workload *w, uint32_t block_tokens, uint32_t capacity,
		      uint32_t host_blocks, uint32_t file_blocks, bool prompt_only,
		      struct replay_result *res);
/*
 * The same with the pool's eviction policy (enum core_eviction); the core's clock is each
 * request's arrival time (struct wreq t), so the replay is deterministic.
 */
int replay_core_policy(const struct workload *w, uint32_t block_tokens, uint32_t capacity,
		       uint32_t host_blocks, uint32_t file_blocks, bool prompt_only,
		       uint32_t eviction, struct replay_result *res);
/*
 * The infinite cache's hits: every leading full prompt block whose prefix an earlier prompt
 * had (outputs are never in a later prompt of a trace), nothing rejected.  Fills blocks and
 * hit_blocks: the bound of every policy at any capacity.
 */
void replay_infinite(const struct workload *w, uint32_t block_tokens, struct replay_result *res);

/*
 * The offline-optimal policy (Belady's MIN: evict the cached block used farthest in the future;
 * deeper blocks first on ties, so never a parent before its child) on the replay's requests,
 * admitted and rejected as the live pool does them (see workload.c): fills res's belady_*
 * fields.  With the same requests counted, its hit fraction bounds the live one from above.
 */
int replay_belady(const struct workload *w, uint32_t block_tokens, uint32_t capacity,
		  bool prompt_only, struct replay_result *res);

/* Daemons one replay may deal its requests across (--daemon given this many times). */
#define REPLAY_MAX_NODES 16

struct replay_daemon_options {
	const char *sockets[REPLAY_MAX_NODES]; /* the daemons' client sockets, one per node */
	uint32_t nodes;     /* sockets given; request i goes to node i % nodes */
	const char *admin;  /* with one node: its admin socket, for evictions (NULL: not reported) */
	uint32_t clients;   /* client processes per node; request i goes to client i % (clients ·
			     * nodes), which is one of node i % nodes's */
	uint32_t spin_us;   /* with ring: kvp_complete spins this long before sleeping */
	bool ring;          /* the async ring API instead of the socket calls */
	bool ordered;       /* requests open in trace order across the clients */
	bool prompt_only;
	bool belady;
	bool json;
	uint32_t eviction; /* the pools' policy (enum core_eviction), for the in-process replay */
	double speed;      /* > 0: requests open at their timestamps, this many times faster */
};

/*
 * Replays w through running daemons (o->nodes of them) from o->clients processes each, after
 * replaying it in-process at the pools' capacity summed for comparison; prints both, and with
 * more than one node each node's hit fraction.  block_tokens must be every pool's.
 * Returns 0 or -errno (after printing why).
 */
int replay_daemon(const struct workload *w, uint32_t block_tokens,
		  const struct replay_daemon_options *o);

void replay_print_header(bool with_belady);
void replay_print(const struct replay_result *res, bool json);
/* Adds the belady_* keys to a replay's JSON object, when they were computed. */
void replay_json_belady(json_object *o, const struct replay_result *res);

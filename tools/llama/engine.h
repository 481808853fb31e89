/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-llama: sequences over either K/V cache, and the two things the engine does with them
 * (generate text, measure perplexity).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "libclient/include/kvpaged.h"
#include "tools/llama/kv.h"
#include "tools/llama/model.h"
#include "tools/llama/tokenizer.h"

/*
 * The most positions a bounded sequence (or a --stream) may reach, past the model's context:
 * the ring data area (64 KiB) then still holds a step's three tables of 4,098 entries.
 */
#define LLAMA_MAX_POSITIONS 65536u

struct engine {
	struct llama_model model;
	struct tokenizer tok;
	struct llama_state st;
	struct kvp_client *client; /* NULL: the private contiguous cache (--contiguous) */
	uint64_t model_key;        /* llama_model_fingerprint() */
	uint64_t prefix_key;       /* the extra key of every prefix: model_key, and the mask */
	struct llama_mask mask;    /* what each token attends to (window 0: everything) */
	bool pool_window;          /* the pool has a sliding window, which decides what it keeps */
	bool rings;                /* decode steps go over the shared-memory rings */
	bool defer;                /* and need not wait when the table cannot change */
	bool no_defer;             /* --no-defer: every step waits */
	uint32_t max_tokens;       /* positions a sequence of this run may reach */
	uint32_t ring_table_cap;   /* entries each of ring_tables holds */
	uint32_t *ring_tables[3];  /* where a step's commit, append and seq info put tables */
	uint32_t *ring_packed;     /* where a step's KVP_PACKED puts the position map (h2o
				      tokens): ring_packed_cap entries */
	uint32_t ring_packed_cap;
	uint64_t replaced;         /* table entries kvp_commit switched to an equal block */
	uint32_t max_held;         /* bounded: most blocks the daemon's table held at a refresh */
	/*
	 * Heavy hitters (--h2o): each token attends to what the H2O policy kept
	 * (docs/retention.md), and reports the attention it gave.  block_tokens is the pool's,
	 * or --block-tokens with the contiguous cache, which runs the policy itself.
	 */
	bool h2o;
	struct kv_h2o_config h2o_cfg;
	uint64_t h2o_evicted, h2o_compactions; /* what the policy did, over this run's sequences */
	struct kvp_op *ring_ops;               /* a step's operations (score reports included) */
	struct kvp_completion *ring_done;
	uint32_t ring_ops_cap;
};

/* Sets what tokens attend to, and the prefix key that goes with it. */
void engine_set_mask(struct engine *e, const struct llama_mask *mask);
/* Whether attention is bounded (a window, and maybe sinks). */
static inline bool engine_bounded(const struct engine *e)
{
	return e->mask.window != 0;
}

/* Whether the daemon releases what tokens no longer attend to: a mask, or H2O. */
static inline bool engine_retains(const struct engine *e)
{
	return engine_bounded(e) || e->h2o;
}

/* An H2O report of one run of held positions: weights[off, off + n) for [first, first + n). */
struct h2o_run {
	uint32_t first, n, off;
};

/* One sequence: its cache and, when paged, its id in the daemon. */
struct seq {
	struct kv_contig contig;
	struct kv_paged paged;
	struct kv_cache *kv;
	uint64_t id;
	bool open;
	unsigned inflight;     /* ring operations of a deferred step, not reaped yet */
	uint32_t inflight_len; /* the table's length when they were submitted */
	/* H2O: the policy, the last forward pass's spans, and its report until it is sent. */
	struct kv_h2o h2o;
	struct llama_span *spans;
	uint32_t nspans;
	struct h2o_run *runs;
	uint32_t nruns;
	float *run_weights;    /* the runs' weights, one after another */
	float *packed_weights; /* by packed slot (paged) */
	uint32_t *packed_order; /* the packed positions in increasing order, and their weights */
	float *packed_order_weights;
	uint32_t npacked_weights, weights_cap; /* weights_cap: entries each of the above holds */
	bool report_pending;   /* paged: the report goes to the daemon before the next commit */
	struct kvp_table next_packed_blocks, next_packed_positions; /* kvp_seq_packed() fills */
	bool packed_fetched;   /* a step's KVP_PACKED filled them: no kvp_seq_packed() needed */
};

struct generate_options {
	const char *prompt;
	uint32_t steps;
	float temperature;
	uint64_t seed;
	uint32_t forks;
	const char *dump_logits;
	bool json;
	bool quiet; /* print nothing (--bench) */
	bool park;             /* --park-at: park and resume the sequence once */
	uint32_t park_at;      /* after this many generated tokens have been run */
	const char *park_wait; /* resume once this file exists (NULL: at once) */
};

/* What a generation measured. */
struct generate_result {
	uint32_t prompt_tokens, cached, forwards;
	double prefill_tok_s, decode_tok_s, ttft_ms;
};

struct perplexity_options {
	const char *path;
	const char *dump_logits;
	bool json;
	bool stream; /* score the file as one sequence: BOS, then every story's tokens */
};

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * Each returns 0 or -errno, having said why on stderr.
 *
 * seq_open opens a sequence that may grow to e->max_tokens positions.  With bounded attention
 * a paged sequence is opened with sinks retention (n_sink, recent = window), so the daemon
 * releases what no later token attends to; in a pool with a sliding window, which refuses
 * per-sequence retention, it is opened plainly and the pool's window decides.  With H2O it is
 * opened with h2o retention and one token (n must be 1): every token is then run a step at a
 * time, its attention reported, so the policy sees the prompt's tokens as it sees the rest.
 */
int seq_open(struct engine *e, struct seq *s, const uint32_t *tokens, uint32_t n, uint32_t flags,
	     uint32_t *ret_cached);
/*
 * Runs token at pos over the sequence's cache with the engine's mask; *ret_logits gets the
 * logits.  A paged sequence is first checked to hold every position the token attends to
 * (-EPROTO, said why, if the daemon released one).  With H2O the token attends to every
 * position the sequence holds (the daemon's table and packed slots, or the policy's own with
 * the contiguous cache), and the attention each received is reported: to the policy at once,
 * and to the daemon with the next step or commit.
 */
int seq_forward(struct engine *e, struct seq *s, uint32_t token, uint32_t pos,
		const float **ret_logits);
/*
 * Replaces a paged sequence's table with the daemon's (holes included), which must hold
 * ntokens, and counts the blocks it holds into e->max_held.
 */
int seq_refresh(struct engine *e, struct seq *s, uint32_t ntokens);
/*
 * One decode step's calls: commits the first commit_ntokens tokens (none if 0), then appends
 * token after the ntokens the sequence holds.  Over the rings both go in one submission, and
 * with e->defer the step does not wait for them when token's slot is in a block the sequence
 * already holds alone: they are reaped, and checked to have changed nothing, at the next call.
 *
 * A bounded sequence's commits release blocks, which a deferred step does not see: its table
 * is refreshed from the daemon (a SEQ_INFO in the same submission) whenever token starts a
 * block, and at every step in a pool with a sliding window, whose size the engine cannot see.
 * A full-attention sequence is refreshed at block starts too, and fails (-EPROTO) if the
 * daemon released any of its blocks: the pool has a sliding window.
 *
 * With H2O the last forward pass's report goes first (the commit's evictions count it); a
 * step whose commit may evict waits, takes the table from the commit's reply (and at token
 * granularity the packed slots from kvp_seq_packed()), and fails (-EPROTO, said where) unless
 * the daemon holds exactly what the engine's own run of the policy holds.  seq_commit() does
 * the same.  With the contiguous cache the policy alone decides.
 */
int seq_step(struct engine *e, struct seq *s, uint32_t commit_ntokens, uint32_t token,
	     uint32_t ntokens);
int seq_commit(struct engine *e, struct seq *s, uint32_t ntokens);
int seq_fork(struct engine *e, struct seq *parent, uint32_t ntokens, struct seq *child);
/*
 * Parks a paged sequence whose every token is committed (over the rings when the engine uses
 * them), so that the daemon may swap or drop its blocks while it waits.
 */
int seq_park(struct engine *e, struct seq *s);
/*
 * Resumes a parked sequence of ntokens tokens: s's table becomes the daemon's new one, and
 * *ret_recompute gets how many trailing tokens' K/V the caller must compute again and commit
 * (their blocks came back empty).  Positions before those are committed and never written.
 */
int seq_resume(struct engine *e, struct seq *s, uint32_t ntokens, uint32_t *ret_recompute);
void seq_close(struct engine *e, struct seq *s);

/* ret (may be NULL) gets the timings. */
int engine_generate(struct engine *e, const struct generate_options *o,
		    struct generate_result *ret);
int engine_perplexity(struct engine *e, const struct perplexity_options *o);

/* output.c: what generation and perplexity both print or write. */
/* Writes s as a JSON string literal. */
void json_string(FILE *f, const char *s, size_t len);
/*
 * Opens --dump-logits' file for run i of n (path itself when n is 1, else path.i) into *ret;
 * nothing when path is NULL.  Returns 0 or -errno, having said why on stderr.
 */
int dump_open(const char *path, uint32_t i, uint32_t n, FILE **ret);
/* Writes n logits to f (nothing when f is NULL); 0 or -EIO, having said why on stderr. */
int dump_logits(FILE *f, const float *logits, uint32_t n);
/* The mask, and what the daemon held, as keys of a JSON summary (each followed by a comma). */
void print_mask_json(const struct engine *e);
/* The same, as the end of a line of text. */
void print_mask_text(const struct engine *e);
/* n per second over ns nanoseconds (0 when ns is 0). */
double rate(uint64_t n, uint64_t ns);

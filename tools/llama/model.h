/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-llama: a Llama model in the llama2.c checkpoint format, and its forward pass for one
 * token.  The forward pass reaches the K/V cache only through struct kv_cache, so that every
 * cache (a private array, the kvpaged pool) shares the same arithmetic: the logits of two
 * caches holding the same K/V are bitwise identical.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct llama_config {
	uint32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
	uint32_t head_size, kv_dim, kv_mul;
	bool shared_classifier;
};

/* Pointers into the mapped checkpoint; matrices are row-major [out][in]. */
struct llama_weights {
	const float *token_embedding; /* [vocab][dim] */
	const float *rms_att;         /* [layer][dim] */
	const float *wq;              /* [layer][dim][dim] */
	const float *wk, *wv;         /* [layer][kv_dim][dim] */
	const float *wo;              /* [layer][dim][dim] */
	const float *rms_ffn;         /* [layer][dim] */
	const float *w1, *w3;         /* [layer][hidden][dim] */
	const float *w2;              /* [layer][dim][hidden] */
	const float *rms_final;       /* [dim] */
	const float *wcls;            /* [vocab][dim] */
};

struct llama_model {
	struct llama_config cfg;
	struct llama_weights w;
	void *map;
	size_t map_bytes;
};

/*
 * Maps a llama2.c legacy checkpoint read-only and checks that its size matches its header.
 * Returns 0 or -errno (-EINVAL for a malformed file, with a message on stderr).
 */
int llama_model_load(const char *path, struct llama_model *ret);
void llama_model_unload(struct llama_model *m);

/*
 * A 64-bit fingerprint of the whole checkpoint.  K/V depends on the weights as much as on the
 * tokens, so the engine gives it to the daemon as the prefix key's extra part: two models of
 * the same shape sharing a pool never see each other's blocks.
 */
uint64_t llama_model_fingerprint(const struct llama_model *m);

/*
 * The K/V cache of one sequence, as the forward pass sees it.  A row is the K (or V) of one
 * position in one layer: kv_dim floats, every kv head's head_size floats one after another.
 */
struct kv_cache;

struct kv_cache_ops {
	/* Keeps the K and V rows of position pos in layer. */
	void (*store)(struct kv_cache *kv, uint32_t layer, uint32_t pos, const float *k,
		      const float *v);
	/*
	 * The rows of K (which 0) or V (1) of layer from position pos on, as far as they lie at
	 * a fixed distance from each other and stay below end.  Returns how many (>= 1 when
	 * pos < end), the first row in *ret_row and the distance in floats in *ret_stride.
	 */
	uint32_t (*rows)(const struct kv_cache *kv, uint32_t layer, unsigned which, uint32_t pos,
			 uint32_t end, const float **ret_row, size_t *ret_stride);
};

struct kv_cache {
	const struct kv_cache_ops *ops;
};

/*
 * Bounded attention: the token at position t attends to positions [0, n_sink) and
 * [t - window + 1, t] (the last window positions, its own included).  window 0 is full
 * attention, [0, t].  Positions are the original ones throughout (RoPE included), so they keep
 * growing past the window.
 */
/* A range of positions [begin, end). */
struct llama_span {
	uint32_t begin, end;
};

/*
 * spans, when not NULL, replaces the sinks and the window: the token attends to exactly those
 * positions, nspans increasing disjoint ranges whose last one ends with the token's own
 * position (heavy hitters: what the H2O policy kept).
 */
struct llama_mask {
	uint32_t n_sink;
	uint32_t window;
	const struct llama_span *spans;
	uint32_t nspans;
};

/*
 * The positions the token at pos attends to, as at most two increasing disjoint ranges in
 * span[].  Returns how many (1 or 2).  mask may be NULL (full attention).
 */
static inline unsigned llama_mask_spans(const struct llama_mask *mask, uint32_t pos,
					struct llama_span span[2])
{
	uint32_t lo = mask && mask->window && pos >= mask->window ? pos + 1 - mask->window : 0;
	unsigned n = 0;

	if (lo <= (mask ? mask->n_sink : 0))
		lo = 0; /* the sinks and the window meet */
	else if (mask->n_sink)
		span[n++] = (struct llama_span){ 0, mask->n_sink };
	span[n++] = (struct llama_span){ lo, pos + 1 };
	return n;
}

/*
 * e^x for the forward pass and sampling, made of IEEE basic operations only (products, sums,
 * rintf and ldexpf, each rounded to nearest; the build turns FMA contraction off), so that an
 * engine in another language computes it bit for bit: python/examples/llama.py does, with
 * NumPy, and the two engines' K/V and logits agree bitwise.  libm's expf would not allow that
 * (its rounding is its own, and differs between implementations).  x = k ln 2 + r with k the
 * nearest integer to x / ln 2 (ln 2 in two parts, Cody and Waite), |r| <= ln 2 / 2, then
 * e^r by its Taylor polynomial of degree 7 (truncation below 6e-9 relative) and 2^k exactly:
 * within 2 ulp of e^x.  Below -104 it is 0 (e^-104 is under half the least subnormal), above
 * 89 infinity, and NaN stays NaN.
 */
float llama_expf(float x);

/* Scratch buffers of the forward pass; one set serves any number of sequences in turn. */
struct llama_state {
	float *x, *xb, *xb2, *hb, *hb2, *q, *k, *v, *att, *logits;
	uint32_t att_cap; /* scores each head's row of att holds: the most positions attended */
	/*
	 * With keep_received, llama_forward() leaves in received[j] the attention the j-th
	 * attended position (in increasing position order) received from the token: its softmax
	 * weights summed over heads, then over layers (H2O's score).
	 */
	bool keep_received;
	float *received;
};

/* Scores for up to the model's seq_len positions; llama_state_reserve() grows them. */
int llama_state_init(struct llama_state *s, const struct llama_config *cfg);
/* Makes room for attending to span positions.  Returns 0 or -ENOMEM. */
int llama_state_reserve(struct llama_state *s, const struct llama_config *cfg, uint32_t span);
void llama_state_free(struct llama_state *s);

/*
 * Runs token at position pos: stores its K/V in kv and attends over the positions mask gives
 * (NULL: [0, pos]), which kv must hold and s must have room for.  Returns the logits
 * (vocab_size floats in s, valid until the next call).
 */
const float *llama_forward(const struct llama_model *m, struct llama_state *s,
			   struct kv_cache *kv, const struct llama_mask *mask, uint32_t token,
			   uint32_t pos);

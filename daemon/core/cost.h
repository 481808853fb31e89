/* SPDX-License-Identifier: MIT */
/*
 * The cost model: the lesson's arithmetic, used to decide between swapping a victim out and
 * recomputing it later, and printed by `kvpagedctl plan` for operators.  Pure functions.
 *
 *   bytes per token   = 2 * layers * kv_heads * head_dim * element_bytes
 *   recompute time    = 2 * params * tokens / flops          (prefill FLOPs / throughput)
 *   transfer time     = bytes / bandwidth
 */
#pragma once

#include <stdint.h>

/* K and V of one token over every layer.  0 on overflow. */
uint64_t cost_bytes_per_token(uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
			      uint32_t element_bytes);

/* Seconds to recompute tokens of a model with params parameters at flops FLOP/s. */
double cost_recompute_s(double params, double tokens, double flops);

/* Seconds to move bytes over a link of bandwidth bytes/s. */
double cost_transfer_s(double bytes, double bandwidth);

/* Which undoes a preemption sooner: swapping (out now, back in later) or recomputing. */
enum cost_choice { COST_SWAP, COST_RECOMPUTE };

/*
 * Compares what a resuming request waits for: the swap-in transfer (the swap-out overlaps
 * other work) against recomputing its tokens.  Ties go to swapping, which loses no work.
 */
enum cost_choice cost_choose(double transfer_one_way_s, double recompute_s);

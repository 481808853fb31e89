/* SPDX-License-Identifier: MIT */
/*
 * A log-linear latency histogram: 64 buckets per power of two of nanoseconds, so a percentile
 * read from it is off by less than 1/64 (1.6 %) at any scale.  A replay makes millions of calls,
 * too many samples to keep; the histogram has a fixed size, so a client process writes it down a
 * pipe as it is and the parent adds them up.
 */
#pragma once

#include <stdint.h>

#define HIST_SUB_BITS 6
#define HIST_SUB (1u << HIST_SUB_BITS)
#define HIST_MAX_BITS 40 /* 2^40 ns, 18 minutes; longer calls are counted there */
#define HIST_BUCKETS ((HIST_MAX_BITS - HIST_SUB_BITS + 1) * HIST_SUB)

struct hist {
	uint64_t count, sum_ns, max_ns;
	uint64_t bucket[HIST_BUCKETS];
};

static inline uint32_t hist_index(uint64_t ns)
{
	uint32_t e;

	if (ns < HIST_SUB)
		return (uint32_t)ns; /* exact below 64 ns */
	if (ns >> HIST_MAX_BITS)
		ns = (UINT64_C(1) << HIST_MAX_BITS) - 1;
	e = 63 - (uint32_t)__builtin_clzll(ns);
	/* group e - 5 (1 for 64..127 ns), then the 6 bits below the leading one */
	return (e - HIST_SUB_BITS + 1) * HIST_SUB + (uint32_t)(ns >> (e - HIST_SUB_BITS)) -
	       HIST_SUB;
}

/* The middle of bucket i. */
static inline double hist_value(uint32_t i)
{
	uint32_t group = i / HIST_SUB, sub = i % HIST_SUB;
	double width;

	if (group == 0)
		return sub;
	width = (double)(UINT64_C(1) << (group - 1));
	return (double)(HIST_SUB + sub) * width + (width - 1) / 2;
}

static inline void hist_add(struct hist *h, uint64_t ns)
{
	h->count++;
	h->sum_ns += ns;
	if (ns > h->max_ns)
		h->max_ns = ns;
	h->bucket[hist_index(ns)]++;
}

static inline void hist_merge(struct hist *dst, const struct hist *src)
{
	dst->count += src->count;
	dst->sum_ns += src->sum_ns;
	if (src->max_ns > dst->max_ns)
		dst->max_ns = src->max_ns;
	for (uint32_t i = 0; i < HIST_BUCKETS; i++)
		dst->bucket[i] += src->bucket[i];
}

/* The nearest-rank p-quantile (0 < p <= 1) in nanoseconds; 0 when empty. */
static inline double hist_quantile(const struct hist *h, double p)
{
	double x = p * (double)h->count;
	uint64_t rank = (uint64_t)x, seen = 0;

	if (h->count == 0)
		return 0;
	if ((double)rank < x || rank == 0)
		rank++;
	for (uint32_t i = 0; i < HIST_BUCKETS; i++) {
		seen += h->bucket[i];
		if (seen >= rank)
			return hist_value(i);
	}
	return (double)h->max_ns;
}

/* SPDX-License-Identifier: MIT */
/* Inline block hashing for the core's hot paths (see hash.h for the definition). */
#pragma once

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "daemon/core/hash.h"

static inline struct core_hash hash_seeded(core_hash_fn fn, const void *data, size_t len,
					   uint64_t seed)
{
	XXH128_hash_t h;

	if (__builtin_expect(fn != NULL, 0))
		return fn(data, len, seed);
	h = XXH3_128bits_withSeed(data, len, seed);
	return (struct core_hash){ .lo = h.low64, .hi = h.high64 };
}

static inline struct core_hash hash_tokens(core_hash_fn fn, const uint32_t *tokens, uint32_t n)
{
	return hash_seeded(fn, tokens, (size_t)n * sizeof(uint32_t), 0);
}

static inline struct core_hash hash_link(core_hash_fn fn, struct core_hash parent, uint64_t ns,
					 struct core_hash t)
{
	/* configure refuses big-endian hosts, so this in-memory layout is the defined one. */
	const uint64_t bytes[2] = { t.lo, t.hi };

	return hash_seeded(fn, bytes, sizeof(bytes), parent.lo ^ XXH_rotl64(parent.hi, 29) ^ ns);
}

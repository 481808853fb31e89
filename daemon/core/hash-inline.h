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

/*
 * Multiplying by an odd constant is a bijection on 64-bit words, so for a given token hash the
 * link maps distinct (parent, namespace) pairs to distinct hashes: it adds no collisions of its
 * own, and costs two multiplies on the serial path instead of a hash call.
 */
#define HASH_LINK_K1 UINT64_C(0x9e3779b97f4a7c15)
#define HASH_LINK_K2 UINT64_C(0xc2b2ae3d27d4eb4f)

static inline struct core_hash hash_link(core_hash_fn fn, struct core_hash parent, uint64_t ns,
					 struct core_hash t)
{
	if (__builtin_expect(fn != NULL, 0)) {
		/* Tests: the replacement hashes the link too, so it can force every collision. */
		const uint64_t bytes[2] = { t.lo, t.hi };

		return fn(bytes, sizeof(bytes), parent.lo ^ parent.hi ^ ns);
	}
	return (struct core_hash){ .lo = t.lo ^ ((parent.lo ^ ns) * HASH_LINK_K1),
				   .hi = t.hi ^ ((parent.hi + ns) * HASH_LINK_K2) };
}

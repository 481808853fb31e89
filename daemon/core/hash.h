/* SPDX-License-Identifier: MIT */
/*
 * Block hashes.  One block's hash names its whole prefix:
 *
 *   ns   = XXH3_64bits(salt, extra)                                once per chain, 16 bytes
 *   t    = XXH3_128bits(token ids)                                 4 bytes a token
 *   seed = parent.lo ^ rotl64(parent.hi, 29) ^ ns
 *   hash = XXH3_128bits_withSeed(t.lo, t.hi, seed)                 16 bytes
 *
 * All integers little-endian; the root's parent hash is zero.  The token hash t does not
 * depend on the chain, so the CPU overlaps the blocks of a prompt as it does for raw XXH3 over
 * the same bytes; only the 16-byte step is serial.  The chain passes through a 64-bit seed;
 * that is fine because a hash only finds candidates and every hit is verified (parent, salt,
 * extra key, tokens).  This definition is stable: persisted tier indexes depend on it.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "daemon/core/block.h"

/*
 * A replacement for XXH3-128 with a seed, for tests that force collisions.  NULL (the
 * default everywhere else) means XXH3 itself, inlined.
 */
typedef struct core_hash (*core_hash_fn)(const void *data, size_t len, uint64_t seed);

/* The namespace seed of chains with this salt and extra key. */
uint64_t core_hash_ns(uint64_t salt, uint64_t extra);

/* The hash of a block with this parent hash, namespace seed and tokens (fn may be NULL). */
struct core_hash core_hash_block(core_hash_fn fn, struct core_hash parent, uint64_t ns,
				 const uint32_t *tokens, uint32_t ntokens);

static inline int core_hash_eq(struct core_hash a, struct core_hash b)
{
	return a.lo == b.lo && a.hi == b.hi;
}

/* SPDX-License-Identifier: MIT */
/*
 * Block hashes.  One block's hash names its whole prefix:
 *
 *   ns   = XXH3_64bits(salt, extra)                       once per chain, 16 bytes
 *   t    = XXH3_128bits(token ids)                        4 bytes a token
 *   hash = (t.lo ^ (parent.lo ^ ns) * K1,  t.hi ^ (parent.hi + ns) * K2)     mod 2^64
 *
 * with K1 = 0x9e3779b97f4a7c15 and K2 = 0xc2b2ae3d27d4eb4f (odd, so the multiplies are
 * bijections), all integers little-endian, and a zero parent hash for the first block.  The
 * token hash does not depend on the chain, so the CPU overlaps the blocks of a prompt as it
 * does for raw XXH3 over the same bytes; the serial link is two multiplies.  For a given token
 * hash the link maps distinct parents to distinct hashes, so chaining adds no collisions; and
 * a hash only finds candidates anyway: every hit is verified (parent, salt, extra key,
 * tokens).  This definition is stable: persisted tier indexes depend on it.
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

/* SPDX-License-Identifier: MIT */
/*
 * Block hashes: XXH3-128 over (parent hash, namespace salt, extra key, token ids), all
 * little-endian, so one hash names a whole prefix.  The root's parent hash is zero.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "daemon/core/block.h"

#define CORE_HASH_HEADER_BYTES 32

/* A hash function over a byte string; tests replace XXH3-128 to force collisions. */
typedef struct core_hash (*core_hash_fn)(const void *data, size_t len);

struct core_hash core_hash_xxh3(const void *data, size_t len);

/*
 * Hashes one block.  scratch must hold CORE_HASH_HEADER_BYTES + 4 * ntokens bytes: the input
 * is laid out there contiguously so one XXH3 call covers it (cheaper than streaming).
 */
struct core_hash core_hash_block(core_hash_fn fn, void *scratch, struct core_hash parent,
				 uint64_t salt, uint64_t extra, const uint32_t *tokens,
				 uint32_t ntokens);

static inline int core_hash_eq(struct core_hash a, struct core_hash b)
{
	return a.lo == b.lo && a.hi == b.hi;
}

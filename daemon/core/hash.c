/* SPDX-License-Identifier: MIT */
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "daemon/core/hash.h"

struct core_hash core_hash_xxh3(const void *data, size_t len)
{
	XXH128_hash_t h = XXH3_128bits(data, len);

	return (struct core_hash){ .lo = h.low64, .hi = h.high64 };
}

struct core_hash core_hash_block(core_hash_fn fn, void *scratch, struct core_hash parent,
				 uint64_t salt, uint64_t extra, const uint32_t *tokens,
				 uint32_t ntokens)
{
	uint64_t header[4] = { parent.lo, parent.hi, salt, extra };
	size_t len = CORE_HASH_HEADER_BYTES + (size_t)ntokens * sizeof(uint32_t);
	unsigned char *buf = scratch;

	/* configure refuses big-endian hosts, so the in-memory layout is the defined one. */
	memcpy(buf, header, sizeof(header));
	memcpy(buf + CORE_HASH_HEADER_BYTES, tokens, (size_t)ntokens * sizeof(uint32_t));
	return fn(buf, len);
}

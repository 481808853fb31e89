/* SPDX-License-Identifier: MIT */
#include "daemon/core/hash-inline.h"

uint64_t core_hash_ns(uint64_t salt, uint64_t extra)
{
	const uint64_t bytes[2] = { salt, extra };

	return XXH3_64bits(bytes, sizeof(bytes));
}

struct core_hash core_hash_block(core_hash_fn fn, struct core_hash parent, uint64_t ns,
				 const uint32_t *tokens, uint32_t ntokens)
{
	return hash_link(fn, parent, ns, hash_tokens(fn, tokens, ntokens));
}

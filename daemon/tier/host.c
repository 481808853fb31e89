/* SPDX-License-Identifier: MIT */
/*
 * The host tier: one arena of nslots x block_bytes, and beside it each slot's stored identity.
 * The identity lives apart from the bytes so that a load compares a few cache lines before it
 * copies, and so that the data of consecutive slots stays contiguous for memcpy (and for a
 * device's copy engines, when the arena is a backend's pinned memory).
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "daemon/tier/tier.h"

/* Above this the arena asks for transparent huge pages: fewer faults and TLB misses per copy. */
#define HOST_TIER_HUGE_BYTES (UINT64_C(64) << 20)

struct host_slot_id {
	uint64_t hash_lo, hash_hi;
	uint64_t parent_lo, parent_hi;
	uint64_t salt;
	uint64_t extra;
	/* A never-stored slot must not match an all-zero key with all-zero tokens. */
	bool stored;
};

struct host_tier {
	uint8_t *arena;
	size_t arena_bytes;
	struct host_tier_arena from; /* from.alloc NULL: an anonymous mapping */
	struct host_slot_id *ids;
	uint32_t *tokens; /* nslots x block_tokens */
	uint64_t block_bytes;
	uint32_t nslots;
	uint32_t block_tokens;
};

int host_tier_new(uint32_t nslots, uint64_t block_bytes, uint32_t block_tokens,
		  const struct host_tier_arena *arena, struct host_tier **ret)
{
	struct host_tier *t;
	void *mem;
	int r;

	if (!ret || nslots == 0 || block_bytes == 0 || block_tokens == 0 ||
	    (arena && (!arena->alloc || !arena->free)))
		return -EINVAL;
	if (block_bytes > SIZE_MAX / nslots)
		return -ENOMEM;

	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->nslots = nslots;
	t->block_bytes = block_bytes;
	t->block_tokens = block_tokens;
	t->arena_bytes = (size_t)nslots * block_bytes;
	t->ids = calloc(nslots, sizeof(*t->ids));
	t->tokens = calloc((size_t)nslots * block_tokens, sizeof(*t->tokens));
	if (!t->ids || !t->tokens) {
		host_tier_free(t);
		return -ENOMEM;
	}
	if (arena) {
		r = arena->alloc(arena->ctx, t->arena_bytes, &mem);
		if (r < 0) {
			host_tier_free(t);
			return r;
		}
		t->from = *arena;
		t->arena = mem;
		*ret = t;
		return 0;
	}
	/* Anonymous memory is committed page by page as slots fill, not all at start-up. */
	mem = mmap(NULL, t->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		   0);
	if (mem == MAP_FAILED) {
		host_tier_free(t);
		return -ENOMEM;
	}
	t->arena = mem;
	if (t->arena_bytes >= HOST_TIER_HUGE_BYTES)
		(void)madvise(t->arena, t->arena_bytes, MADV_HUGEPAGE); /* a hint; fine to refuse */
	*ret = t;
	return 0;
}

struct host_tier *host_tier_free(struct host_tier *t)
{
	if (!t)
		return NULL;
	if (t->arena && t->from.alloc)
		t->from.free(t->from.ctx, t->arena, t->arena_bytes);
	else if (t->arena)
		munmap(t->arena, t->arena_bytes);
	free(t->tokens);
	free(t->ids);
	free(t);
	return NULL;
}

static inline uint8_t *slot_data(const struct host_tier *t, uint32_t slot)
{
	return t->arena + (size_t)slot * t->block_bytes;
}

static inline uint32_t *slot_tokens(const struct host_tier *t, uint32_t slot)
{
	return t->tokens + (size_t)slot * t->block_tokens;
}

void *host_tier_slot_for_write(struct host_tier *t, uint32_t slot)
{
	assert(slot < t->nslots);
	t->ids[slot].stored = false;
	return slot_data(t, slot);
}

void host_tier_commit(struct host_tier *t, uint32_t slot, const struct tier_key *key)
{
	struct host_slot_id *id;

	assert(slot < t->nslots);
	id = &t->ids[slot];
	*id = (struct host_slot_id){
		.hash_lo = key->hash_lo,
		.hash_hi = key->hash_hi,
		.parent_lo = key->parent_lo,
		.parent_hi = key->parent_hi,
		.salt = key->salt,
		.extra = key->extra,
		.stored = true,
	};
	memcpy(slot_tokens(t, slot), key->tokens, (size_t)t->block_tokens * sizeof(uint32_t));
}

void host_tier_store(struct host_tier *t, uint32_t slot, const struct tier_key *key,
		     const void *data)
{
	assert(slot < t->nslots);
	memcpy(slot_data(t, slot), data, t->block_bytes);
	host_tier_commit(t, slot, key);
}

const void *host_tier_lookup(const struct host_tier *t, uint32_t slot, const struct tier_key *key)
{
	const struct host_slot_id *id;

	assert(slot < t->nslots);
	id = &t->ids[slot];
	/* Cheapest and most selective first: another block's chain hash nearly always differs. */
	if (!id->stored || id->hash_lo != key->hash_lo || id->hash_hi != key->hash_hi ||
	    id->parent_lo != key->parent_lo || id->parent_hi != key->parent_hi ||
	    id->salt != key->salt || id->extra != key->extra)
		return NULL;
	/* The hash is only a hash: equal tokens are what make this the same block. */
	if (memcmp(slot_tokens(t, slot), key->tokens, (size_t)t->block_tokens * sizeof(uint32_t)))
		return NULL;
	return slot_data(t, slot);
}

int host_tier_load(struct host_tier *t, uint32_t slot, const struct tier_key *key, void *dst)
{
	const void *data = host_tier_lookup(t, slot, key);

	if (!data)
		return -EBADMSG;
	memcpy(dst, data, t->block_bytes);
	return 0;
}

void host_tier_key(const struct host_tier *t, uint32_t slot, struct tier_key *ret)
{
	const struct host_slot_id *id;

	assert(slot < t->nslots);
	id = &t->ids[slot];
	*ret = (struct tier_key){
		.hash_lo = id->hash_lo,
		.hash_hi = id->hash_hi,
		.parent_lo = id->parent_lo,
		.parent_hi = id->parent_hi,
		.salt = id->salt,
		.extra = id->extra,
		.tokens = slot_tokens(t, slot),
	};
}

const void *host_tier_data(const struct host_tier *t, uint32_t slot)
{
	assert(slot < t->nslots);
	return slot_data(t, slot);
}

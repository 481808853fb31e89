/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "daemon/core/index.h"

int index_init(struct prefix_index *ix, uint32_t max_entries)
{
	uint64_t nslots = 16;

	if (max_entries == 0 || max_entries > (UINT32_C(1) << 30))
		return -EINVAL;
	/* Load factor at most 1/2 keeps linear probing short without resizing. */
	while (nslots < 2 * (uint64_t)max_entries)
		nslots <<= 1;
	ix->slots = malloc(nslots * sizeof(*ix->slots));
	if (!ix->slots)
		return -ENOMEM;
	for (uint64_t i = 0; i < nslots; i++)
		ix->slots[i] = (struct index_slot){ .block = CORE_NONE };
	ix->mask = (uint32_t)(nslots - 1);
	ix->count = 0;
	return 0;
}

void index_done(struct prefix_index *ix)
{
	free(ix->slots);
	ix->slots = NULL;
}

static inline uint32_t home_slot(const struct prefix_index *ix, struct core_hash h)
{
	return (uint32_t)h.lo & ix->mask;
}

uint32_t index_find(const struct prefix_index *ix, const struct core_block *blocks,
		    struct core_hash h)
{
	for (uint32_t i = home_slot(ix, h);; i = (i + 1) & ix->mask) {
		const struct index_slot *s = &ix->slots[i];

		if (s->block == CORE_NONE)
			return CORE_NONE;
		if (s->key_lo == h.lo && s->key_hi32 == (uint32_t)h.hi &&
		    blocks[s->block].hash.hi == h.hi)
			return s->block;
	}
}

void index_insert(struct prefix_index *ix, struct core_hash h, uint32_t b)
{
	uint32_t i = home_slot(ix, h);

	while (ix->slots[i].block != CORE_NONE)
		i = (i + 1) & ix->mask;
	ix->slots[i] = (struct index_slot){ .key_lo = h.lo, .key_hi32 = (uint32_t)h.hi, .block = b };
	ix->count++;
}

int index_remove(struct prefix_index *ix, struct core_hash h, uint32_t b)
{
	uint32_t i = home_slot(ix, h);

	for (;; i = (i + 1) & ix->mask) {
		if (ix->slots[i].block == CORE_NONE)
			return -ENOENT;
		if (ix->slots[i].block == b)
			break;
	}
	/*
	 * Backward-shift deletion: move later entries of the probe run into the hole when their
	 * home slot does not lie cyclically in (hole, j], so every entry stays reachable.
	 */
	for (uint32_t j = i;;) {
		uint32_t home;

		j = (j + 1) & ix->mask;
		if (ix->slots[j].block == CORE_NONE)
			break;
		home = (uint32_t)ix->slots[j].key_lo & ix->mask;
		if (((j - home) & ix->mask) >= ((j - i) & ix->mask)) {
			ix->slots[i] = ix->slots[j];
			i = j;
		}
	}
	ix->slots[i].block = CORE_NONE;
	ix->count--;
	return 0;
}

/* SPDX-License-Identifier: MIT */
/* A growable open-addressing map from nonzero-mixed u64 keys to u32 values (bench only). */
#pragma once

#include <stdint.h>
#include <stdlib.h>

#include "tools/bench/bench.h"

struct u64map {
	uint64_t *keys;
	uint32_t *vals;
	uint8_t *used;
	size_t mask, count;
};

static inline int u64map_init(struct u64map *m, size_t expect)
{
	size_t n = 64;

	while (n < 2 * expect)
		n <<= 1;
	m->keys = malloc(n * sizeof(*m->keys));
	m->vals = malloc(n * sizeof(*m->vals));
	m->used = calloc(n, 1);
	m->mask = n - 1;
	m->count = 0;
	return m->keys && m->vals && m->used ? 0 : -1;
}

static inline void u64map_free(struct u64map *m)
{
	free(m->keys);
	free(m->vals);
	free(m->used);
}

/* Returns the value slot for key, inserting it with *inserted = 1 when absent. */
static inline uint32_t *u64map_get(struct u64map *m, uint64_t key, int *inserted)
{
	size_t i;

	if (2 * (m->count + 1) > m->mask + 1) {
		struct u64map bigger;

		if (u64map_init(&bigger, 2 * (m->mask + 1)) < 0)
			abort();
		for (size_t j = 0; j <= m->mask; j++) {
			int dummy;

			if (m->used[j])
				*u64map_get(&bigger, m->keys[j], &dummy) = m->vals[j];
		}
		u64map_free(m);
		*m = bigger;
	}
	for (i = mix64(key) & m->mask; m->used[i]; i = (i + 1) & m->mask)
		if (m->keys[i] == key) {
			*inserted = 0;
			return &m->vals[i];
		}
	m->used[i] = 1;
	m->keys[i] = key;
	m->count++;
	*inserted = 1;
	return &m->vals[i];
}

static inline const uint32_t *u64map_find(const struct u64map *m, uint64_t key)
{
	for (size_t i = mix64(key) & m->mask; m->used[i]; i = (i + 1) & m->mask)
		if (m->keys[i] == key)
			return &m->vals[i];
	return NULL;
}

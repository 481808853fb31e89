/* SPDX-License-Identifier: MIT */
/*
 * Helpers for the core's unit tests: a host "pool memory" whose copy callback really copies,
 * so tests can check what a sequence would read through its block table.
 */
#pragma once

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/core/core.h"
#include "tests/check-runner.h"

struct fake_mem {
	uint64_t *slots; /* one 64-bit "K/V" word per token slot */
	uint32_t block_tokens;
	uint32_t capacity;
	uint32_t copies;
	uint32_t gathers; /* copy_slots calls */
	uint32_t last_dst, last_src;
	int fail_copy; /* next copy returns this error when negative */
};

static inline int fake_copy(void *ctx, uint32_t dst, uint32_t src)
{
	struct fake_mem *m = ctx;

	if (m->fail_copy < 0) {
		int r = m->fail_copy;

		m->fail_copy = 0;
		return r;
	}
	ck_assert_uint_lt(dst, m->capacity);
	ck_assert_uint_lt(src, m->capacity);
	ck_assert_uint_ne(dst, src);
	memcpy(m->slots + (size_t)dst * m->block_tokens, m->slots + (size_t)src * m->block_tokens,
	       m->block_tokens * sizeof(uint64_t));
	m->copies++;
	m->last_dst = dst;
	m->last_src = src;
	return 0;
}

static inline void fake_mem_init(struct fake_mem *m, uint32_t capacity, uint32_t block_tokens)
{
	*m = (struct fake_mem){ .block_tokens = block_tokens, .capacity = capacity };
	m->slots = calloc((size_t)capacity * block_tokens, sizeof(uint64_t));
	ck_assert_ptr_nonnull(m->slots);
}

static inline struct core *new_core(struct fake_mem *m, uint32_t capacity, uint32_t block_tokens,
				    uint32_t max_sequences, uint32_t max_seq_tokens)
{
	struct core_config cfg = {
		.capacity_blocks = capacity,
		.block_tokens = block_tokens,
		.max_sequences = max_sequences,
		.max_seq_tokens = max_seq_tokens,
		.copy_block = fake_copy,
		.copy_ctx = m,
	};
	struct core *c = NULL;

	fake_mem_init(m, capacity, block_tokens);
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	return c;
}

#define assert_verified(c)                                                                   \
	do {                                                                                 \
		char why_[256];                                                              \
		int r_ = core_verify((c), why_, sizeof(why_));                               \
		ck_assert_msg(r_ == 0, "core_verify: %s", why_);                             \
	} while (0)

/* Token ids 'base, base+1, ...' */
static inline void fill_tokens(uint32_t *t, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i;
}

/*
 * core_seq_open, checking that what it says of the new sequence is what core_seq_info says;
 * *ret_cached (may be NULL) gets its cached tokens.  Outputs untouched on failure.
 */
static inline int seq_open_cached(struct core *c, const struct core_open *o, uint64_t *ret_seq,
				  uint32_t *ret_cached)
{
	struct core_seq_info got = { .state = 0xdead }, want;
	uint64_t seq = 0;
	int r = core_seq_open(c, o, &seq, &got);

	if (r < 0) {
		ck_assert_uint_eq(got.state, 0xdead); /* untouched */
		return r;
	}
	ck_assert_int_eq(core_seq_info(c, seq, &want), 0);
	ck_assert_uint_eq(got.state, want.state);
	ck_assert_uint_eq(got.ntokens, want.ntokens);
	ck_assert_uint_eq(got.ncommitted, want.ncommitted);
	ck_assert_uint_eq(got.nblocks, want.nblocks);
	ck_assert_ptr_eq(got.table, want.table);
	ck_assert_uint_eq(got.retention, want.retention);
	ck_assert_uint_eq(got.held_blocks, want.held_blocks);
	ck_assert_uint_eq(got.freed_blocks, want.freed_blocks);
	ck_assert_uint_eq(got.retained_tokens, want.retained_tokens);
	ck_assert_uint_eq(got.npacked, want.npacked);
	*ret_seq = seq;
	if (ret_cached)
		*ret_cached = got.ncommitted;
	return 0;
}

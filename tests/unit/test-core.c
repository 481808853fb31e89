/* SPDX-License-Identifier: MIT */
/* The block manager: prefix hits, commit, fork and copy-on-write, eviction, bad input. */
#include <errno.h>

#include "daemon/core/core-internal.h"
#include "tests/unit/testutil.h"

#define B 4 /* tokens per block in these tests */

static struct fake_mem mem;

static uint64_t open_seq(struct core *c, const uint32_t *t, uint32_t n, uint64_t salt,
			 uint32_t *cached)
{
	struct core_open o = { .salt = salt, .tokens = t, .ntokens = n };
	uint64_t id = 0;

	ck_assert_int_eq(seq_open_cached(c, &o, &id, cached), 0);
	return id;
}

static struct core_seq_info info(struct core *c, uint64_t id)
{
	struct core_seq_info si;

	ck_assert_int_eq(core_seq_info(c, id, &si), 0);
	return si;
}

START_TEST(test_config_rejected)
{
	struct core_config ok = { .capacity_blocks = 4, .block_tokens = 4, .max_sequences = 4,
				  .max_seq_tokens = 16, .copy_block = fake_copy };
	struct core_config bad;
	struct core *c = NULL;

	bad = ok, bad.capacity_blocks = 0;
	ck_assert_int_eq(core_new(&bad, &c), -EINVAL);
	bad = ok, bad.block_tokens = 0;
	ck_assert_int_eq(core_new(&bad, &c), -EINVAL);
	bad = ok, bad.block_tokens = CORE_MAX_BLOCK_TOKENS + 1;
	ck_assert_int_eq(core_new(&bad, &c), -EINVAL);
	bad = ok, bad.max_sequences = 0;
	ck_assert_int_eq(core_new(&bad, &c), -EINVAL);
	bad = ok, bad.max_seq_tokens = 0;
	ck_assert_int_eq(core_new(&bad, &c), -EINVAL);
	bad = ok, bad.copy_block = NULL;
	ck_assert_int_eq(core_new(&bad, &c), -EINVAL);
	ck_assert_ptr_null(c);
	ck_assert_int_eq(core_new(&ok, &c), 0);
	ck_assert_ptr_null(core_free(c));
	ck_assert_ptr_null(core_free(NULL));
}
END_TEST

START_TEST(test_prefix_hit_across_sequences)
{
	struct core *c = new_core(&mem, 16, B, 8, 64);
	uint32_t t[10], cached = 99;
	struct core_seq_info a, b;
	struct core_stats st;
	uint64_t sa, sb;

	fill_tokens(t, 10, 100);
	sa = open_seq(c, t, 10, 0, &cached);
	ck_assert_uint_eq(cached, 0);
	a = info(c, sa);
	ck_assert_uint_eq(a.nblocks, 3);
	ck_assert_uint_eq(a.ntokens, 10);
	ck_assert_uint_eq(a.ncommitted, 0);

	/* Nothing is findable before it is committed. */
	struct core_open probe = { .tokens = t, .ntokens = 10 };
	ck_assert_uint_eq(core_lookup(c, &probe), 0);
	ck_assert_int_eq(core_seq_commit(c, sa, 10), 0);
	ck_assert_uint_eq(core_lookup(c, &probe), 8); /* two full blocks; the partial one never */

	sb = open_seq(c, t, 10, 0, &cached);
	ck_assert_uint_eq(cached, 8);
	a = info(c, sa);
	b = info(c, sb);
	ck_assert_uint_eq(b.ncommitted, 8);
	ck_assert_uint_eq(b.table[0], a.table[0]);
	ck_assert_uint_eq(b.table[1], a.table[1]);
	ck_assert_uint_ne(b.table[2], a.table[2]);
	ck_assert_uint_eq(c->pool.blocks[a.table[0]].refcount, 2);
	ck_assert_uint_eq(c->pool.blocks[a.table[2]].refcount, 1);

	core_get_stats(c, &st);
	ck_assert_uint_eq(st.lookups, 2);
	ck_assert_uint_eq(st.query_blocks, 6);
	ck_assert_uint_eq(st.hit_blocks, 2);
	ck_assert_uint_eq(st.hit_tokens, 8);
	ck_assert_uint_eq(st.miss_blocks, 4);
	assert_verified(c);

	/* After both close, the two full blocks stay cached and the next open hits them. */
	ck_assert_int_eq(core_seq_close(c, sa), 0);
	ck_assert_int_eq(core_seq_close(c, sb), 0);
	struct core_usage u;
	core_get_usage(c, &u);
	ck_assert_uint_eq(u.cached, 2);
	ck_assert_uint_eq(u.in_use, 0);
	ck_assert_uint_eq(u.free, 14);
	sa = open_seq(c, t, 9, 0, &cached);
	ck_assert_uint_eq(cached, 8);
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_shorter_and_diverging_prompts)
{
	struct core *c = new_core(&mem, 32, B, 8, 64);
	uint32_t t[16], u[16], cached;
	uint64_t s;

	fill_tokens(t, 16, 1);
	s = open_seq(c, t, 16, 0, &cached);
	ck_assert_int_eq(core_seq_commit(c, s, 16), 0);

	memcpy(u, t, sizeof(u));
	u[9] = 999; /* diverges inside the third block */
	s = open_seq(c, u, 16, 0, &cached);
	ck_assert_uint_eq(cached, 8);
	s = open_seq(c, t, 3, 0, &cached); /* shorter than one block */
	ck_assert_uint_eq(cached, 0);
	s = open_seq(c, t, 12, 0, &cached);
	ck_assert_uint_eq(cached, 12);
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_recompute_last_flag)
{
	struct core *c = new_core(&mem, 16, B, 8, 64);
	uint32_t t[8], cached;
	uint64_t s;

	fill_tokens(t, 8, 7);
	s = open_seq(c, t, 8, 0, &cached);
	ck_assert_int_eq(core_seq_commit(c, s, 8), 0);

	struct core_open o = { .tokens = t, .ntokens = 8, .flags = CORE_OPEN_RECOMPUTE_LAST };
	ck_assert_uint_eq(core_lookup(c, &o), 4);
	ck_assert_int_eq(seq_open_cached(c, &o, &s, &cached), 0);
	ck_assert_uint_eq(cached, 4);
	o.ntokens = 7; /* the last block is partial anyway */
	ck_assert_uint_eq(core_lookup(c, &o), 4);
	o.flags = 1u << 7;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, &cached), -EINVAL);
	core_free(c);
}
END_TEST

START_TEST(test_append_and_commit_in_steps)
{
	struct core *c = new_core(&mem, 16, B, 8, 64);
	uint32_t t[11], cached;
	struct core_open probe = { .tokens = t, .ntokens = 11 };
	uint64_t s;

	fill_tokens(t, 11, 40);
	s = open_seq(c, t, 1, 0, &cached);
	for (uint32_t i = 1; i < 11; i++) {
		int first = core_seq_append(c, s, &t[i], 1);

		ck_assert_int_ge(first, 0);
		ck_assert_int_eq(core_seq_commit(c, s, i), 0);
		ck_assert_uint_eq(core_lookup(c, &probe), (i / B) * B);
	}
	ck_assert_uint_eq(info(c, s).nblocks, 3);
	/* The block table's slots hold exactly the tokens appended. */
	struct core_seq_info si = info(c, s);
	for (uint32_t i = 0; i < 11; i++)
		ck_assert_uint_eq(core_block_tokens(c, si.table[i / B])[i % B], t[i]);
	ck_assert_int_eq(core_seq_commit(c, s, 3), 0); /* at or below committed: no-op */
	ck_assert_uint_eq(info(c, s).ncommitted, 10);
	ck_assert_int_eq(core_seq_commit(c, s, 12), -EINVAL);
	ck_assert_uint_eq(info(c, s).ncommitted, 10);
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_fork_and_copy_on_write)
{
	struct core *c = new_core(&mem, 16, B, 8, 64);
	uint32_t t[6], x = 500, y = 600, cached;
	struct core_seq_info p, k;
	uint64_t parent, child;
	int first;

	fill_tokens(t, 6, 10);
	parent = open_seq(c, t, 6, 0, &cached);
	p = info(c, parent);
	/* "Compute" the prompt: write a K/V word into each slot, then commit. */
	for (uint32_t i = 0; i < 6; i++)
		mem.slots[(size_t)p.table[i / B] * B + i % B] = 0xa000 + i;
	ck_assert_int_eq(core_seq_commit(c, parent, 6), 0);

	ck_assert_int_eq(core_seq_fork(c, parent, &child), 0);
	k = info(c, child);
	ck_assert_uint_eq(k.ntokens, 6);
	ck_assert_uint_eq(k.ncommitted, 6);
	ck_assert_mem_eq(k.table, p.table, 2 * sizeof(uint32_t));
	ck_assert_uint_eq(c->pool.blocks[p.table[1]].refcount, 2);
	assert_verified(c);

	/* The child writes slot 6, inside the shared partial block: it gets a private copy. */
	first = core_seq_append(c, child, &x, 1);
	ck_assert_int_eq(first, 1);
	ck_assert_uint_eq(mem.copies, 1);
	k = info(c, child);
	p = info(c, parent);
	ck_assert_uint_eq(k.table[0], p.table[0]);
	ck_assert_uint_ne(k.table[1], p.table[1]);
	ck_assert_uint_eq(mem.last_src, p.table[1]);
	ck_assert_uint_eq(mem.last_dst, k.table[1]);
	ck_assert_uint_eq(mem.slots[(size_t)k.table[1] * B + 1], 0xa005); /* copied content */
	ck_assert_uint_eq(core_block_tokens(c, k.table[1])[1], t[5]);
	ck_assert_uint_eq(core_block_tokens(c, k.table[1])[2], x);
	mem.slots[(size_t)k.table[1] * B + 2] = 0xb006;

	/* The parent is now the only holder of its block: no copy. */
	first = core_seq_append(c, parent, &y, 1);
	ck_assert_int_eq(first, 2);
	ck_assert_uint_eq(mem.copies, 1);
	ck_assert_uint_eq(core_block_tokens(c, p.table[1])[2], y);
	ck_assert_uint_ne(mem.slots[(size_t)p.table[1] * B + 2], 0xb006);

	struct core_stats st;
	core_get_stats(c, &st);
	ck_assert_uint_eq(st.cow_copies, 1);
	assert_verified(c);
	ck_assert_int_eq(core_seq_close(c, parent), 0);
	ck_assert_int_eq(core_seq_close(c, child), 0);
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_fork_full_last_block_needs_no_copy)
{
	struct core *c = new_core(&mem, 16, B, 8, 64);
	uint32_t t[8], x = 1, cached;
	uint64_t parent, child;

	fill_tokens(t, 8, 10);
	parent = open_seq(c, t, 8, 0, &cached);
	ck_assert_int_eq(core_seq_fork(c, parent, &child), 0);
	ck_assert_int_eq(core_seq_append(c, child, &x, 1), 2);
	ck_assert_int_eq(core_seq_append(c, parent, &x, 1), 2);
	ck_assert_uint_eq(mem.copies, 0);
	/* Either sibling may commit the shared blocks; the other's commit finds them READY. */
	ck_assert_int_eq(core_seq_commit(c, child, 8), 0);
	ck_assert_int_eq(core_seq_commit(c, parent, 9), 0);
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_cow_copy_failure_changes_no_table)
{
	struct core *c = new_core(&mem, 16, B, 8, 64);
	uint32_t t[6], x = 1, cached;
	uint64_t parent, child;
	struct core_seq_info before, after;

	fill_tokens(t, 6, 10);
	parent = open_seq(c, t, 6, 0, &cached);
	ck_assert_int_eq(core_seq_fork(c, parent, &child), 0);
	before = info(c, child);
	uint32_t last = before.table[1];
	mem.fail_copy = -EIO;
	ck_assert_int_eq(core_seq_append(c, child, &x, 1), -EIO);
	after = info(c, child);
	ck_assert_uint_eq(after.ntokens, 6);
	ck_assert_uint_eq(after.table[1], last);
	ck_assert_uint_eq(c->pool.blocks[last].refcount, 2);
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_leaf_first_eviction)
{
	/* 6 blocks: a 3-block chain cached, then a 4-block request must evict one block. */
	struct core *c = new_core(&mem, 6, B, 8, 64);
	uint32_t t[12], u[16], cached;
	uint64_t s;

	fill_tokens(t, 12, 1);
	fill_tokens(u, 16, 1000);
	s = open_seq(c, t, 12, 0, &cached);
	ck_assert_int_eq(core_seq_commit(c, s, 12), 0);
	ck_assert_int_eq(core_seq_close(c, s), 0);

	s = open_seq(c, u, 16, 0, &cached);
	ck_assert_uint_eq(cached, 0);
	struct core_stats st;
	core_get_stats(c, &st);
	ck_assert_uint_eq(st.evictions, 1);
	/* The leaf went; the first two blocks of the chain still hit. */
	struct core_open probe = { .tokens = t, .ntokens = 12 };
	ck_assert_uint_eq(core_lookup(c, &probe), 8);
	assert_verified(c);
	ck_assert_int_eq(core_seq_close(c, s), 0);
	core_free(c);
}
END_TEST

START_TEST(test_lru_prefers_older_chain)
{
	struct core *c = new_core(&mem, 4, B, 8, 64);
	uint32_t a[4], b[4], d[8], cached;
	uint64_t s;

	fill_tokens(a, 4, 100);
	fill_tokens(b, 4, 200);
	fill_tokens(d, 8, 300);
	s = open_seq(c, a, 4, 0, &cached);
	core_seq_commit(c, s, 4);
	core_seq_close(c, s);
	s = open_seq(c, b, 4, 0, &cached);
	core_seq_commit(c, s, 4);
	core_seq_close(c, s);
	/* Touch a again: b becomes the least recently used. */
	s = open_seq(c, a, 4, 0, &cached);
	ck_assert_uint_eq(cached, 4);
	core_seq_close(c, s);
	s = open_seq(c, d, 8, 0, &cached); /* two free blocks: nothing evicted */
	core_seq_close(c, s);
	s = open_seq(c, d, 8, 0, &cached); /* still none: d was never committed, so freed */
	core_seq_close(c, s);
	struct core_stats st;
	core_get_stats(c, &st);
	ck_assert_uint_eq(st.evictions, 0);
	uint32_t e[12];
	fill_tokens(e, 12, 400);
	s = open_seq(c, e, 12, 0, &cached); /* needs 3: evicts b */
	struct core_open pa = { .tokens = a, .ntokens = 4 }, pb = { .tokens = b, .ntokens = 4 };
	ck_assert_uint_eq(core_lookup(c, &pa), 4);
	ck_assert_uint_eq(core_lookup(c, &pb), 0);
	assert_verified(c);
	core_free(c);
}
END_TEST

/* Every block hashes alike: every lookup finds a candidate that verification must refuse. */
static struct core_hash constant_hash(const void *data, size_t len, uint64_t seed)
{
	(void)data;
	(void)len;
	(void)seed;
	return (struct core_hash){ .lo = 42, .hi = 42 };
}

START_TEST(test_forced_collision_is_a_miss)
{
	struct core_config cfg = { .capacity_blocks = 16, .block_tokens = B, .max_sequences = 8,
				   .max_seq_tokens = 64, .copy_block = fake_copy, .copy_ctx = &mem,
				   .hash_fn = constant_hash };
	uint32_t t[4], u[4], cached;
	struct core *c;
	struct core_stats st;
	uint64_t s1, s2;

	fake_mem_init(&mem, 16, B);
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	fill_tokens(t, 4, 1);
	fill_tokens(u, 4, 2);
	s1 = open_seq(c, t, 4, 0, &cached);
	ck_assert_int_eq(core_seq_commit(c, s1, 4), 0);

	/* Same hash, other tokens: a counted miss, never the other block. */
	s2 = open_seq(c, u, 4, 0, &cached);
	ck_assert_uint_eq(cached, 0);
	ck_assert_uint_ne(info(c, s2).table[0], info(c, s1).table[0]);
	core_get_stats(c, &st);
	ck_assert_uint_eq(st.collisions, 1);
	ck_assert_uint_eq(st.hit_blocks, 0);

	/* Committing it finds the slot taken by other content: counted, left unfindable. */
	ck_assert_int_eq(core_seq_commit(c, s2, 4), 0);
	core_get_stats(c, &st);
	ck_assert_uint_eq(st.collisions, 2);
	struct core_usage us;
	core_get_usage(c, &us);
	ck_assert_uint_eq(us.indexed, 1);

	/* The real owner of the hash still hits. */
	uint64_t s3 = open_seq(c, t, 4, 0, &cached);
	ck_assert_uint_eq(cached, 4);
	ck_assert_uint_eq(info(c, s3).table[0], info(c, s1).table[0]);

	/* Same tokens under another namespace or extra key: the hash matches, the chain not. */
	struct core_open o = { .salt = 9, .tokens = t, .ntokens = 4 };
	ck_assert_uint_eq(core_lookup(c, &o), 0);
	o.salt = 0, o.extra = 1;
	ck_assert_uint_eq(core_lookup(c, &o), 0);

	/* The same tokens again as a second block: the candidate is the root, the wrong parent. */
	uint32_t tt[8];
	memcpy(tt, t, sizeof(t));
	memcpy(tt + 4, t, sizeof(t));
	o = (struct core_open){ .tokens = tt, .ntokens = 8 };
	ck_assert_uint_eq(core_lookup(c, &o), 4);
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_namespaces_and_extra_keys_never_share)
{
	struct core *c = new_core(&mem, 32, B, 8, 64);
	uint32_t t[8], cached;
	uint64_t s;
	struct core_open o = { .salt = 1, .tokens = t, .ntokens = 8 };

	fill_tokens(t, 8, 5);
	ck_assert_int_eq(seq_open_cached(c, &o, &s, &cached), 0);
	ck_assert_int_eq(core_seq_commit(c, s, 8), 0);
	ck_assert_uint_eq(core_lookup(c, &o), 8);
	o.salt = 2;
	ck_assert_uint_eq(core_lookup(c, &o), 0);
	ck_assert_int_eq(seq_open_cached(c, &o, &s, &cached), 0);
	ck_assert_uint_eq(cached, 0);
	ck_assert_int_eq(core_seq_commit(c, s, 8), 0);
	o.salt = 1;
	o.extra = 77; /* e.g. another adapter */
	ck_assert_uint_eq(core_lookup(c, &o), 0);
	o.extra = 0;
	ck_assert_uint_eq(core_lookup(c, &o), 8);
	struct core_usage u;
	core_get_usage(c, &u);
	ck_assert_uint_eq(u.indexed, 4); /* two chains of two blocks, nothing shared */
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_concurrent_equal_commits_deduplicate)
{
	struct core *c = new_core(&mem, 16, B, 8, 64);
	uint32_t t[9], cached;
	uint64_t a, b;
	uint32_t b_first;

	fill_tokens(t, 9, 3);
	a = open_seq(c, t, 9, 0, &cached);
	b = open_seq(c, t, 9, 0, &cached); /* before a committed: no hit, own blocks */
	b_first = info(c, b).table[0];
	ck_assert_uint_ne(b_first, info(c, a).table[0]);
	ck_assert_int_eq(core_seq_commit(c, a, 9), 0);
	ck_assert_int_eq(core_seq_commit(c, b, 9), 2);
	ck_assert_mem_eq(info(c, b).table, info(c, a).table, 2 * sizeof(uint32_t));
	ck_assert_uint_eq(c->pool.blocks[b_first].state, CORE_BLOCK_FREE);
	struct core_stats st;
	core_get_stats(c, &st);
	ck_assert_uint_eq(st.dedup_blocks, 2);
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_bad_input_changes_nothing)
{
	struct core *c = new_core(&mem, 4, B, 2, 32);
	uint32_t t[40], cached = 7;
	struct core_usage u0, u1;
	struct core_stats s0, s1;
	struct core_open o = { .tokens = t, .ntokens = 8 };
	uint64_t s, fake;

	fill_tokens(t, 40, 1);
	s = open_seq(c, t, 8, 0, &cached);
	ck_assert_int_eq(core_seq_commit(c, s, 8), 0);
	core_get_usage(c, &u0);
	core_get_stats(c, &s0);

	/* Unknown ids: never issued, out of range, stale generation. */
	ck_assert_int_eq(core_seq_append(c, 0, t, 1), -ENOENT);
	ck_assert_int_eq(core_seq_append(c, UINT64_MAX, t, 1), -ENOENT);
	ck_assert_int_eq(core_seq_commit(c, (uint64_t)1 << 40, 1), -ENOENT);
	ck_assert_int_eq(core_seq_fork(c, s + (1ull << 32), &fake), -ENOENT);
	ck_assert_int_eq(core_seq_close(c, 1), -ENOENT);
	struct core_seq_info si;
	ck_assert_int_eq(core_seq_info(c, 12345, &si), -ENOENT);

	/* Zero and huge lengths, null tokens, commit beyond the end. */
	o.ntokens = 0;
	ck_assert_int_eq(seq_open_cached(c, &o, &fake, &cached), -EINVAL);
	o.ntokens = 33;
	ck_assert_int_eq(seq_open_cached(c, &o, &fake, &cached), -E2BIG);
	o.tokens = NULL, o.ntokens = 4;
	ck_assert_int_eq(seq_open_cached(c, &o, &fake, &cached), -EINVAL);
	o.tokens = t;
	ck_assert_int_eq(core_seq_append(c, s, t, 0), -EINVAL);
	ck_assert_int_eq(core_seq_append(c, s, NULL, 1), -EINVAL);
	ck_assert_int_eq(core_seq_append(c, s, t, 25), -E2BIG);
	ck_assert_int_eq(core_seq_append(c, s, t, UINT32_MAX), -E2BIG);
	ck_assert_int_eq(core_seq_commit(c, s, 9), -EINVAL);

	/* Out of blocks: 2 held, 2 free; a 3-block prompt of other tokens cannot fit. */
	o.tokens = t + 20, o.ntokens = 12;
	ck_assert_int_eq(seq_open_cached(c, &o, &fake, &cached), -ENOSPC);
	ck_assert_int_eq(core_seq_append(c, s, t, 12), -ENOSPC);

	/* Out of sequence slots. */
	uint64_t s2;
	o.tokens = t, o.ntokens = 1;
	ck_assert_int_eq(seq_open_cached(c, &o, &s2, &cached), 0);
	ck_assert_int_eq(seq_open_cached(c, &o, &fake, &cached), -EMFILE);
	ck_assert_int_eq(core_seq_fork(c, s, &fake), -EMFILE);
	ck_assert_int_eq(core_seq_close(c, s2), 0);
	ck_assert_int_eq(core_seq_close(c, s2), -ENOENT); /* double close */

	core_get_usage(c, &u1);
	core_get_stats(c, &s1);
	ck_assert_mem_eq(&u0, &u1, sizeof(u0));
	s1.lookups -= 1, s1.query_blocks -= 1, s1.miss_blocks -= 1; /* the one good open */
	ck_assert_mem_eq(&s0, &s1, sizeof(s0));
	ck_assert_uint_eq(info(c, s).ntokens, 8);
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_vocabulary_limit)
{
	struct core_config cfg = { .capacity_blocks = 8, .block_tokens = B, .max_sequences = 4,
				   .max_seq_tokens = 32, .vocab_size = 512,
				   .copy_block = fake_copy, .copy_ctx = &mem };
	uint32_t t[3] = { 1, 511, 512 }, cached;
	struct core_open o = { .tokens = t, .ntokens = 3 };
	struct core *c;
	uint64_t s;

	fake_mem_init(&mem, 8, B);
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	ck_assert_int_eq(seq_open_cached(c, &o, &s, &cached), -EINVAL);
	o.ntokens = 2;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, &cached), 0);
	ck_assert_int_eq(core_seq_append(c, s, &t[2], 1), -EINVAL);
	ck_assert_uint_eq(info(c, s).ntokens, 2);
	core_free(c);
}
END_TEST

/* The checks of a request's arguments, and their reasons, are the open's own. */
START_TEST(test_open_check)
{
	struct core_config cfg = { .capacity_blocks = 8, .block_tokens = B, .max_sequences = 4,
				   .max_seq_tokens = 32, .vocab_size = 512,
				   .copy_block = fake_copy, .copy_ctx = &mem };
	uint32_t t[3] = { 1, 511, 512 };
	struct core_open o = { .tokens = t, .ntokens = 2 };
	const char *why = "untouched";
	struct core *c;
	uint64_t s;

	fake_mem_init(&mem, 8, B);
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	ck_assert_int_eq(core_open_check(c, &o, &why), 0);
	ck_assert_str_eq(why, "untouched");
	o.ntokens = 0;
	ck_assert_int_eq(core_open_check(c, &o, &why), -EINVAL);
	ck_assert_str_eq(why, "empty prompt");
	o.ntokens = 3;
	ck_assert_int_eq(core_open_check(c, &o, &why), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "vocab_size"));
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), -EINVAL);
	o.ntokens = 2;
	o.flags = 1u << 3;
	ck_assert_int_eq(core_open_check(c, &o, &why), -EINVAL);
	ck_assert_str_eq(why, "unknown flags");
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), -EINVAL);
	/* Deferring loads is the caller's to ask, not a request's. */
	o.flags = CORE_OPEN_DEFER_LOADS;
	why = NULL;
	ck_assert_int_eq(core_open_check(c, &o, &why), -EINVAL);
	ck_assert_str_eq(why, "unknown flags");
	o.flags = CORE_OPEN_RECOMPUTE_LAST;
	o.retention = CORE_RETAIN_SINKS; /* recent 0 */
	ck_assert_int_eq(core_open_check(c, &o, &why), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "bad retention: recent 0"));
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), -EINVAL);
	o.recent = 4;
	ck_assert_int_eq(core_open_check(c, &o, &why), 0);
	o.flags |= CORE_OPEN_DEFER_LOADS;
	ck_assert_int_eq(seq_open_cached(c, &o, &s, NULL), 0);
	core_free(c);
}
END_TEST

START_TEST(test_drop_cache)
{
	struct core *c = new_core(&mem, 16, B, 4, 64);
	uint32_t t[12], cached;
	uint64_t s;

	fill_tokens(t, 12, 9);
	s = open_seq(c, t, 12, 0, &cached);
	core_seq_commit(c, s, 12);
	core_seq_close(c, s);
	s = open_seq(c, t, 4, 0, &cached); /* holds the root: it stays */
	ck_assert_uint_eq(core_drop_cache(c), 2);
	struct core_usage u;
	core_get_usage(c, &u);
	ck_assert_uint_eq(u.cached, 0);
	ck_assert_uint_eq(u.indexed, 1);
	assert_verified(c);
	core_seq_close(c, s);
	ck_assert_uint_eq(core_drop_cache(c), 1);
	core_get_usage(c, &u);
	ck_assert_uint_eq(u.free, 16);
	assert_verified(c);
	core_free(c);
}
END_TEST

/* The checker must be able to fail: corrupt state behind the core's back. */
START_TEST(test_verify_detects_corruption)
{
	struct core *c = new_core(&mem, 8, B, 4, 64);
	uint32_t t[8], cached;
	char why[256];
	uint64_t s;

	fill_tokens(t, 8, 1);
	s = open_seq(c, t, 8, 0, &cached);
	core_seq_commit(c, s, 8);
	uint32_t b0 = info(c, s).table[0];

	c->pool.blocks[b0].refcount++;
	ck_assert_int_eq(core_verify(c, why, sizeof(why)), -EUCLEAN);
	ck_assert_ptr_nonnull(strstr(why, "refcount"));
	c->pool.blocks[b0].refcount--;
	assert_verified(c);

	core_block_tokens(c, b0);
	c->tokens[(size_t)b0 * B] ^= 1;
	ck_assert_int_eq(core_verify(c, why, sizeof(why)), -EUCLEAN);
	ck_assert_ptr_nonnull(strstr(why, "hash"));
	c->tokens[(size_t)b0 * B] ^= 1;

	c->pool.nfree++;
	ck_assert_int_eq(core_verify(c, why, sizeof(why)), -EUCLEAN);
	c->pool.nfree--;

	core_seq_close(c, s);
	/* Reverse the LRU so the parent is older than its child. */
	uint32_t h = c->pool.lru_head, tl = c->pool.lru_tail;
	c->pool.lru_head = tl, c->pool.lru_tail = h;
	c->pool.blocks[tl].prev = CORE_NONE, c->pool.blocks[tl].next = h;
	c->pool.blocks[h].prev = tl, c->pool.blocks[h].next = CORE_NONE;
	ck_assert_int_eq(core_verify(c, why, sizeof(why)), -EUCLEAN);
	ck_assert_ptr_nonnull(strstr(why, "older on the LRU"));
	core_free(c);
}
END_TEST


/* A core with a given policy, 8 blocks of 4 tokens. */
static struct core *policy_core(enum core_policy policy)
{
	struct core_config cfg = { .capacity_blocks = 8, .block_tokens = B, .max_sequences = 8,
				   .max_seq_tokens = 64, .copy_block = fake_copy, .copy_ctx = &mem,
				   .policy = policy };
	struct core *c;

	fake_mem_init(&mem, 8, B);
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	return c;
}

static uint64_t open_prio(struct core *c, uint32_t n, uint32_t base, uint32_t prio)
{
	uint32_t t[64], cached;
	struct core_open o = { .tokens = t, .ntokens = n, .priority = prio };
	uint64_t id;

	fill_tokens(t, n, base);
	ck_assert_int_eq(seq_open_cached(c, &o, &id, &cached), 0);
	return id;
}

START_TEST(test_park_and_resume_keeps_blocks)
{
	struct core *c = policy_core(CORE_POLICY_LRU);
	uint64_t a = open_prio(c, 10, 1, 0), b;
	uint32_t x = 5, rec = 99, before[3];

	memcpy(before, info(c, a).table, sizeof(before));
	ck_assert_int_eq(core_seq_park(c, a), 0);
	ck_assert_uint_eq(info(c, a).state, CORE_SEQ_PARKED);
	/* Only info, resume and close apply to a parked sequence. */
	ck_assert_int_eq(core_seq_append(c, a, &x, 1), -EBUSY);
	ck_assert_int_eq(core_seq_commit(c, a, 1), -EBUSY);
	ck_assert_int_eq(core_seq_fork(c, a, &b), -EBUSY);
	ck_assert_int_eq(core_seq_park(c, a), -EBUSY);
	assert_verified(c);
	ck_assert_int_eq(core_seq_resume(c, a, &rec), 0);
	ck_assert_uint_eq(rec, 0);
	ck_assert_mem_eq(info(c, a).table, before, sizeof(before));
	ck_assert_int_eq(core_seq_resume(c, a, &rec), -EINVAL); /* already active */
	ck_assert_int_ge(core_seq_append(c, a, &x, 1), 0);
	ck_assert_int_eq(core_seq_park(c, a), 0);
	ck_assert_int_eq(core_seq_close(c, a), 0); /* a parked sequence can be closed */
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_lru_drops_the_oldest_parked)
{
	struct core *c = policy_core(CORE_POLICY_LRU);
	uint64_t a = open_prio(c, 12, 100, 0), b = open_prio(c, 12, 200, 0), d;
	struct core_stats st;

	ck_assert_int_eq(core_seq_park(c, a), 0);
	ck_assert_int_eq(core_seq_park(c, b), 0);
	/* 6 blocks held, 2 free: a 3-block request drops a (the older), which frees 3. */
	d = open_prio(c, 12, 300, 0);
	ck_assert_uint_eq(info(c, a).state, CORE_SEQ_DROPPED);
	ck_assert_uint_eq(info(c, b).state, CORE_SEQ_PARKED);
	core_get_stats(c, &st);
	ck_assert_uint_eq(st.preemptions, 1);
	ck_assert_uint_eq(st.dropped_tokens, 12);
	assert_verified(c);
	(void)d;
	core_free(c);
}
END_TEST

START_TEST(test_priority_never_preempts_a_more_important_sequence)
{
	struct core *c = policy_core(CORE_POLICY_PRIORITY);
	uint64_t lo = open_prio(c, 12, 100, 1), hi = open_prio(c, 12, 200, 5), d;
	uint32_t t[12], cached;
	struct core_open o = { .tokens = t, .ntokens = 12, .priority = 0 };
	struct core_usage u0, u1;

	/* hi parked first (older): LRU would pick it, priority picks lo. */
	ck_assert_int_eq(core_seq_park(c, hi), 0);
	ck_assert_int_eq(core_seq_park(c, lo), 0);
	d = open_prio(c, 12, 300, 3);
	ck_assert_uint_eq(info(c, lo).state, CORE_SEQ_DROPPED);
	ck_assert_uint_eq(info(c, hi).state, CORE_SEQ_PARKED);
	ck_assert_int_eq(core_seq_close(c, d), 0);
	/* Leave one free block; then a priority-0 request may not take priority 5's blocks. */
	open_prio(c, 16, 600, 5);
	fill_tokens(t, 12, 500);
	core_get_usage(c, &u0);
	ck_assert_int_eq(seq_open_cached(c, &o, &d, &cached), -ENOSPC);
	core_get_usage(c, &u1);
	ck_assert_mem_eq(&u0, &u1, sizeof(u0));
	ck_assert_uint_eq(info(c, hi).state, CORE_SEQ_PARKED);
	/* The same request at priority 5 may. */
	o.priority = 5;
	ck_assert_int_eq(seq_open_cached(c, &o, &d, &cached), 0);
	ck_assert_uint_eq(info(c, hi).state, CORE_SEQ_DROPPED);
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_cost_drops_the_cheapest_to_recompute_per_block)
{
	struct core *c = policy_core(CORE_POLICY_COST);
	/* a: 12 tokens in 3 blocks (4 a block); b: 9 tokens in 3 blocks (3 a block). */
	uint64_t b = open_prio(c, 9, 100, 0), a = open_prio(c, 12, 200, 0);

	ck_assert_int_eq(core_seq_park(c, b), 0);
	ck_assert_int_eq(core_seq_park(c, a), 0);
	open_prio(c, 12, 300, 0);
	ck_assert_uint_eq(info(c, b).state, CORE_SEQ_DROPPED); /* 3 tokens a block < 4 */
	ck_assert_uint_eq(info(c, a).state, CORE_SEQ_PARKED);
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_cost_prefers_cheap_over_old)
{
	struct core *c = policy_core(CORE_POLICY_COST);
	/* The expensive one is the older: LRU would drop it, cost drops the cheap, newer one. */
	uint64_t a = open_prio(c, 12, 200, 0), b = open_prio(c, 9, 100, 0);

	ck_assert_int_eq(core_seq_park(c, a), 0);
	ck_assert_int_eq(core_seq_park(c, b), 0);
	open_prio(c, 12, 300, 0);
	ck_assert_uint_eq(info(c, b).state, CORE_SEQ_DROPPED);
	ck_assert_uint_eq(info(c, a).state, CORE_SEQ_PARKED);
	core_free(c);
}
END_TEST

START_TEST(test_failed_request_drops_nothing)
{
	struct core *c = policy_core(CORE_POLICY_LRU);
	uint64_t a = open_prio(c, 8, 100, 0), d;
	uint32_t t[40], cached;
	struct core_open o = { .tokens = t, .ntokens = 40 };
	struct core_stats s0, s1;

	ck_assert_int_eq(core_seq_park(c, a), 0);
	core_get_stats(c, &s0);
	/* 10 blocks needed; 6 free + 2 from dropping a = 8: refused, a stays parked. */
	fill_tokens(t, 40, 7);
	ck_assert_int_eq(seq_open_cached(c, &o, &d, &cached), -ENOSPC);
	ck_assert_uint_eq(info(c, a).state, CORE_SEQ_PARKED);
	core_get_stats(c, &s1);
	ck_assert_mem_eq(&s0, &s1, sizeof(s0));
	assert_verified(c);
	core_free(c);
}
END_TEST

START_TEST(test_dropped_resume_recomputes_what_is_not_cached)
{
	struct core *c = policy_core(CORE_POLICY_LRU);
	uint32_t t[10], rec = 0;
	uint64_t a, d;

	fill_tokens(t, 10, 40);
	a = open_prio(c, 10, 40, 0);
	ck_assert_int_eq(core_seq_commit(c, a, 10), 0); /* 2 full blocks findable + 2 tokens */
	ck_assert_int_eq(core_seq_park(c, a), 0);
	/* 5 free blocks; a 6-block request drops a: its 3 blocks become available (2 cached). */
	d = open_prio(c, 24, 900, 0);
	ck_assert_uint_eq(info(c, a).state, CORE_SEQ_DROPPED);
	ck_assert_int_eq(core_seq_resume(c, a, &rec), -ENOSPC); /* no room yet: stays dropped */
	ck_assert_uint_eq(info(c, a).state, CORE_SEQ_DROPPED);
	ck_assert_int_eq(core_seq_close(c, d), 0);
	/* d took free blocks before cached ones, so a's two committed blocks are still cached. */
	ck_assert_int_eq(core_seq_resume(c, a, &rec), 0);
	struct core_seq_info si = info(c, a);
	ck_assert_uint_eq(si.state, CORE_SEQ_ACTIVE);
	ck_assert_uint_eq(si.ntokens, 10);
	ck_assert_uint_eq(rec, si.ntokens - si.ncommitted);
	ck_assert_uint_eq(rec, 2); /* only the partial block's 2 tokens */
	for (uint32_t i = 0; i < 10; i++)
		ck_assert_uint_eq(core_block_tokens(c, si.table[i / B])[i % B], t[i]);
	assert_verified(c);
	core_free(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("core");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_config_rejected);
	tcase_add_test(tc, test_prefix_hit_across_sequences);
	tcase_add_test(tc, test_shorter_and_diverging_prompts);
	tcase_add_test(tc, test_recompute_last_flag);
	tcase_add_test(tc, test_append_and_commit_in_steps);
	tcase_add_test(tc, test_fork_and_copy_on_write);
	tcase_add_test(tc, test_fork_full_last_block_needs_no_copy);
	tcase_add_test(tc, test_cow_copy_failure_changes_no_table);
	tcase_add_test(tc, test_leaf_first_eviction);
	tcase_add_test(tc, test_lru_prefers_older_chain);
	tcase_add_test(tc, test_forced_collision_is_a_miss);
	tcase_add_test(tc, test_namespaces_and_extra_keys_never_share);
	tcase_add_test(tc, test_concurrent_equal_commits_deduplicate);
	tcase_add_test(tc, test_bad_input_changes_nothing);
	tcase_add_test(tc, test_vocabulary_limit);
	tcase_add_test(tc, test_open_check);
	tcase_add_test(tc, test_drop_cache);
	tcase_add_test(tc, test_verify_detects_corruption);
	tcase_add_test(tc, test_park_and_resume_keeps_blocks);
	tcase_add_test(tc, test_lru_drops_the_oldest_parked);
	tcase_add_test(tc, test_priority_never_preempts_a_more_important_sequence);
	tcase_add_test(tc, test_cost_drops_the_cheapest_to_recompute_per_block);
	tcase_add_test(tc, test_cost_prefers_cheap_over_old);
	tcase_add_test(tc, test_failed_request_drops_nothing);
	tcase_add_test(tc, test_dropped_resume_recomputes_what_is_not_cached);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

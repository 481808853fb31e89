/* SPDX-License-Identifier: MIT */
/*
 * Retention through the real daemon: a sequence with attention sinks and a sliding-window pool
 * stream tokens with memory held flat, tables show holes, kvpagedctl shows the policy, and bad
 * policies are refused with a reason.
 */
#include "tests/integration/harness.h"

static struct daemon d;

#define POOL(extra)                                                                            \
	"[pool main]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 4\n"             \
	"block_tokens = 16\ncapacity_blocks = 64\n" extra

/*
 * Appends and commits tokens one at a time up to total, keeping the client's table up to date
 * from the replies alone (commits report what they release); returns the most blocks ever
 * held.  Every 100 tokens the client's table must equal the daemon's.
 */
static uint32_t stream(struct kvp_client *c, uint64_t s, uint32_t from, uint32_t total)
{
	struct kvp_table t = { 0 }, mine = { 0 };
	uint32_t most = 0, ntok, ncom;

	ck_assert_int_eq(kvp_seq_info(c, s, NULL, NULL, &mine), 0);
	for (uint32_t k = from; k < total; k++) {
		uint32_t tok = (k * 7919u) % 512, held = 0;

		ck_assert_int_ge(kvp_append(c, s, &tok, 1, &mine), 0);
		ck_assert_int_eq(kvp_commit(c, s, k + 1, &mine), 0);
		if ((k + 1) % 100)
			continue;
		ck_assert_int_eq(kvp_seq_info(c, s, &ntok, &ncom, &t), 0);
		ck_assert_uint_eq(mine.len, t.len);
		ck_assert_mem_eq(mine.blocks, t.blocks, t.len * sizeof(uint32_t));
		ck_assert_uint_eq(ntok, k + 1);
		ck_assert_uint_eq(t.len, (k + 1 + 15) / 16);
		for (uint32_t i = 0; i < t.len; i++)
			held += t.blocks[i] != KVP_TABLE_HOLE;
		if (held > most)
			most = held;
	}
	kvp_table_free(&t);
	kvp_table_free(&mine);
	return most;
}

START_TEST(test_sinks_over_the_socket)
{
	struct kvp_retention keep = { .size = sizeof(keep), .policy = KVP_RETAIN_SINKS,
				      .n_sink = 16, .recent = 32 };
	uint32_t p[20], cached;
	struct kvp_table t = { 0 };
	struct kvp_client *c;
	uint64_t s;
	char out[16384];

	daemon_start(&d, POOL(""));
	prompt(p, 20, 1);
	c = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_open_retained(c, p, 20, 0, 0, &keep, &s, &cached, &t), 0);
	ck_assert_int_eq(kvp_commit(c, s, 20, NULL), 0);
	/* A sink block, the blocks over the last 32 tokens, the one being filled. */
	ck_assert_uint_le(stream(c, s, 20, 3000), 1 + 2 + 1);
	ck_assert_int_eq(kvp_seq_info(c, s, NULL, NULL, &t), 0);
	ck_assert_uint_ne(t.blocks[0], KVP_TABLE_HOLE);
	ck_assert_uint_eq(t.blocks[1], KVP_TABLE_HOLE);
	ck_assert_int_eq(ctl(&d, "sequences", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "\"sinks\""));
	ck_assert_int_ge(json_int(out, "freed_blocks"), 3000 / 16 - 4);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_ge(json_int(out, "pruned_tokens"), (3000 / 16 - 4) * 16);
	/* Its history is gone: it cannot be parked. */
	ck_assert_int_eq(kvp_park(c, s), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "retention"));
	assert_verified(&d);

	/* Bad policies: a clear error, nothing opened. */
	keep.recent = 0;
	ck_assert_int_eq(kvp_open_retained(c, p, 20, 0, 0, &keep, &s, NULL, NULL), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "recent 0"));
	keep = (struct kvp_retention){ .size = sizeof(keep), .policy = 9, .recent = 4 };
	ck_assert_int_eq(kvp_open_retained(c, p, 20, 0, 0, &keep, &s, NULL, NULL), -EINVAL);
	kvp_table_free(&t);
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

START_TEST(test_window_pool)
{
	struct kvp_retention keep = { .size = sizeof(keep), .policy = KVP_RETAIN_SINKS,
				      .recent = 8 };
	struct kvp_client *c, *r;
	uint32_t p[1] = { 5 }, cached, table[64];
	struct kvp_completion comp[2];
	uint64_t s;
	char out[16384];

	daemon_start(&d, POOL("window = 64\n"));
	c = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_open(c, p, 1, 0, 0, &s, &cached, NULL), 0);
	/* ceil(64 / 16) + 1 */
	ck_assert_uint_le(stream(c, s, 1, 2000), 5);
	ck_assert_int_eq(ctl(&d, "sequences", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "\"window\""));
	ck_assert_int_eq(kvp_open_retained(c, p, 1, 0, 0, &keep, &s, NULL, NULL), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "window"));

	/* Sinks over the rings: flag and parameters in the entry. */
	daemon_stop(&d);
	daemon_start(&d, POOL(""));
	r = connect_ns(NULL, 64);
	struct kvp_op op = { .opcode = KVP_OPEN, .arg = KVP_OPEN_SINKS, .user_data = 1,
			     .seq = KVP_SINKS(0, 16), .tokens = p, .ntokens = 1, .table_cap = 64,
			     .table_out = table };
	ck_assert_int_eq(kvp_submit(r, &op, 1), 1);
	ck_assert_int_eq(kvp_complete(r, comp, 2, 1, 5000), 1);
	ck_assert_int_eq(comp[0].res, 0);
	ck_assert_uint_le(stream(r, comp[0].value, 1, 500), 1 + 1 + 1);
	ck_assert_int_eq(ctl(&d, "sequences", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "\"sinks\""));
	assert_verified(&d);
	kvp_disconnect(r);
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

/* Which table entries are holes, as a bit mask. */
static uint32_t holes(struct kvp_client *c, uint64_t s)
{
	struct kvp_table t = { 0 };
	uint32_t m = 0;

	ck_assert_int_eq(kvp_seq_info(c, s, NULL, NULL, &t), 0);
	for (uint32_t i = 0; i < t.len; i++)
		m |= (uint32_t)(t.blocks[i] == KVP_TABLE_HOLE) << i;
	kvp_table_free(&t);
	return m;
}

/*
 * Heavy hitters: block 1 received the attention, so with a budget of 32 tokens (the last 16
 * always kept) blocks 0 and 2 go.  Over the socket and over the rings.
 */
START_TEST(test_h2o)
{
	struct kvp_retention keep = { .size = sizeof(keep), .policy = KVP_RETAIN_H2O,
				      .recent = 16, .budget = 32 };
	float w[16], nan1 = __builtin_nanf("");
	uint32_t p[64], table[8];
	struct kvp_completion comp[4];
	struct kvp_client *c, *r;
	uint64_t s;
	char out[16384];

	daemon_start(&d, POOL(""));
	prompt(p, 64, 1);
	c = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_open_retained(c, p, 64, 0, 0, &keep, &s, NULL, NULL), 0);
	for (uint32_t b = 0; b < 4; b++) {
		for (int i = 0; i < 16; i++)
			w[i] = b == 1 ? 1.0f : 0.01f;
		ck_assert_int_eq(kvp_report_scores(c, s, b * 16, w, 16), 0);
	}
	ck_assert_int_eq(kvp_commit(c, s, 64, NULL), 0);
	ck_assert_uint_eq(holes(c, s), 1u << 0 | 1u << 2);
	ck_assert_int_eq(ctl(&d, "sequences", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "\"h2o\""));

	/* Scores for what it no longer holds, or beyond it, or not a number: refused. */
	ck_assert_int_eq(kvp_report_scores(c, s, 0, w, 4), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "does not hold"));
	ck_assert_int_eq(kvp_report_scores(c, s, 60, w, 8), -EINVAL);
	ck_assert_int_eq(kvp_report_scores(c, s, 16, &nan1, 1), -EINVAL);
	keep.budget = 8;
	ck_assert_int_eq(kvp_open_retained(c, p, 64, 0, 0, &keep, &s, NULL, NULL), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "budget below recent"));
	keep.budget = 32;
	keep.n_sink = 32;
	ck_assert_int_eq(kvp_open_retained(c, p, 64, 0, 0, &keep, &s, NULL, NULL), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "n_sink + recent exceed the budget"));
	keep.n_sink = 0;
	keep.decay = 2;
	ck_assert_int_eq(kvp_open_retained(c, p, 64, 0, 0, &keep, &s, NULL, NULL), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "decay outside"));
	keep.decay = 0;
	keep.granularity = 2;
	ck_assert_int_eq(kvp_open_retained(c, p, 64, 0, 0, &keep, &s, NULL, NULL), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "unknown granularity"));

	/* The rings: open with KVP_OPEN_H2O, scores as a bulk entry in the data area. */
	r = connect_ns(NULL, 64);
	struct kvp_op op = { .opcode = KVP_OPEN, .arg = KVP_OPEN_H2O, .user_data = 1,
			     .seq = KVP_H2O(32, 16), .tokens = p, .ntokens = 64, .table_cap = 8,
			     .table_out = table };
	ck_assert_int_eq(kvp_submit(r, &op, 1), 1);
	ck_assert_int_eq(kvp_complete(r, comp, 4, 1, 5000), 1);
	ck_assert_int_eq(comp[0].res, 0);
	s = comp[0].value;
	for (int i = 0; i < 16; i++)
		w[i] = 1.0f;
	struct kvp_op ops[2] = {
		{ .opcode = KVP_SCORES, .user_data = 2, .seq = s, .arg = 32,
		  .tokens = (const uint32_t *)w, .ntokens = 16 },
		{ .opcode = KVP_COMMIT, .user_data = 3, .seq = s, .arg = 64 },
	};
	ck_assert_int_eq(kvp_submit(r, ops, 2), 2);
	ck_assert_int_eq(kvp_complete(r, comp, 4, 2, 5000), 2);
	ck_assert_int_eq(comp[0].res, 0);
	ck_assert_int_eq(comp[1].res, 0);
	/* Block 2 is the heavy hitter now; 0 and 1 (no scores) go, the earliest first. */
	ck_assert_uint_eq(holes(r, s), 1u << 0 | 1u << 1);
	assert_verified(&d);
	kvp_disconnect(r);
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

/* The byte at offset i of position pos's K (kv 0) or V (kv 1) in layer l. */
static uint8_t kv_byte(uint32_t pos, uint32_t l, uint32_t kv, uint64_t i)
{
	return (uint8_t)(pos * 31 + l * 7 + kv * 101 + i * 3 + 1);
}

/* Writes (or checks) a slot's K and V in every layer of the mapped pool. */
static bool slot_kv(struct kvp_client *c, uint32_t block, uint32_t slot, uint32_t pos, bool write)
{
	const struct kvp_pool_info *p = kvp_pool(c);
	uint8_t *base = (uint8_t *)kvp_pool_base(c) + (uint64_t)block * p->block_stride +
			slot * p->slot_stride;

	for (uint32_t l = 0; l < p->layers; l++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint64_t i = 0; i < p->slot_stride; i++) {
				uint8_t *b = base + l * p->layer_stride + kv * p->kv_stride + i;

				if (write)
					*b = kv_byte(pos, l, kv, i);
				else if (*b != kv_byte(pos, l, kv, i))
					return false;
			}
	return true;
}

/*
 * Token granularity through the daemon: 64 tokens, budget 32, the last 16 kept.  Every 7th
 * position received the attention; among the rest (equal scores) the earliest go first.  The
 * 16 survivors of positions 0..47 are packed, and each packed slot holds exactly the K/V its
 * position had (checked in the mapped pool).
 */
START_TEST(test_h2o_tokens)
{
	struct kvp_retention keep = { .size = sizeof(keep), .policy = KVP_RETAIN_H2O,
				      .recent = 16, .budget = 32, .granularity = 1 };
	struct kvp_table t = { 0 }, packed = { 0 }, pos = { 0 };
	uint32_t p[64], want = 0, got = 0;
	uint64_t want_hi = 0, got_hi = 0;
	struct kvp_client *c;
	float w[16];
	uint64_t s;
	char out[16384];

	daemon_start(&d, POOL(""));
	prompt(p, 64, 1);
	c = connect_ns(NULL, 64);
	ck_assert_int_eq(kvp_open_retained(c, p, 64, 0, 0, &keep, &s, NULL, &t), 0);
	for (uint32_t q = 0; q < 64; q++)
		slot_kv(c, t.blocks[q / 16], q % 16, q, true);
	for (uint32_t b = 0; b < 4; b++) {
		for (uint32_t i = 0; i < 16; i++)
			w[i] = b * 16 + i >= 48 ? 1.0f : (b * 16 + i) % 7 == 0 ? 10.0f : 0.01f;
		ck_assert_int_eq(kvp_report_scores(c, s, b * 16, w, 16), 0);
	}
	ck_assert_int_eq(kvp_commit(c, s, 64, NULL), 0);

	ck_assert_int_eq(kvp_seq_packed(c, s, &packed, &pos), 0);
	ck_assert_uint_eq(pos.len, 16);
	ck_assert_uint_eq(packed.len, 1);
	for (uint32_t k = 0; k < pos.len; k++) {
		uint32_t q = pos.blocks[k];

		ck_assert_uint_lt(q, 48);
		if (q < 32)
			got |= 1u << q;
		else
			got_hi |= 1ull << q;
		ck_assert_msg(slot_kv(c, packed.blocks[k / 16], k % 16, q, false),
			      "packed slot %u does not hold position %u's K/V", k, q);
	}
	for (uint32_t q = 0; q < 48; q += 7)
		if (q < 32)
			want |= 1u << q;
		else
			want_hi |= 1ull << q;
	for (uint32_t q = 38; q < 48; q++)
		if (q != 42)
			want_hi |= 1ull << q;
	ck_assert_uint_eq(got, want);
	ck_assert_uint_eq(got_hi, want_hi);

	/* The same map over the rings: the packed blocks, then the positions. */
	uint32_t map[40];
	struct kvp_completion comp[2];
	struct kvp_op ops[2] = {
		{ .opcode = KVP_PACKED, .user_data = 1, .seq = s, .table_cap = 40,
		  .table_out = map },
		{ .opcode = KVP_PACKED, .user_data = 2, .seq = s, .table_cap = 16,
		  .table_out = map + 20 }, /* one short of 1 + 16 */
	};
	ck_assert_int_eq(kvp_submit(c, ops, 2), 2);
	ck_assert_int_eq(kvp_complete(c, comp, 2, 2, 5000), 2);
	ck_assert_int_eq(comp[0].res, 0);
	ck_assert_uint_eq(comp[0].aux, 1);
	ck_assert_uint_eq(comp[0].value, 16);
	ck_assert_uint_eq(comp[0].table_len, 17);
	ck_assert_uint_eq(comp[0].flags & KVP_COMPLETION_TRUNCATED, 0);
	ck_assert_uint_eq(map[0], packed.blocks[0]);
	for (uint32_t k = 0; k < 16; k++)
		ck_assert_uint_eq(map[1 + k], pos.blocks[k]);
	ck_assert_int_eq(comp[1].res, 0);
	ck_assert_uint_eq(comp[1].value, 16);
	ck_assert_uint_eq(comp[1].table_len, 0);
	ck_assert_uint_ne(comp[1].flags & KVP_COMPLETION_TRUNCATED, 0);
	ops[0].seq = s + 1000; /* not ours */
	ck_assert_int_eq(kvp_submit(c, ops, 1), 1);
	ck_assert_int_eq(kvp_complete(c, comp, 1, 1, 5000), 1);
	ck_assert_int_eq(comp[0].res, -ENOENT);

	ck_assert_int_eq(kvp_seq_info(c, s, NULL, NULL, &t), 0);
	for (uint32_t i = 0; i < 3; i++)
		ck_assert_uint_eq(t.blocks[i], KVP_TABLE_HOLE);

	/* The packed slots take scores by slot; a wrong count is refused. */
	for (uint32_t k = 0; k < 16; k++)
		w[k] = 1.0f;
	ck_assert_int_eq(kvp_report_scores(c, s, KVP_SCORES_PACKED, w, 16), 0);
	ck_assert_int_eq(kvp_report_scores(c, s, KVP_SCORES_PACKED, w, 15), -EINVAL);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(json_int(out, "pruned_tokens"), 32);
	ck_assert_int_ge(json_int(out, "compactions"), 16);
	ck_assert_int_eq(ctl(&d, "sequences", out, sizeof(out)), 0);
	ck_assert_int_eq(json_int(out, "retained_tokens"), 32);
	ck_assert_int_eq(json_int(out, "granularity"), 1);
	assert_verified(&d);
	kvp_table_free(&t);
	kvp_table_free(&packed);
	kvp_table_free(&pos);
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("retention");
	TCase *tc = tcase_create("retention");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_sinks_over_the_socket);
	tcase_add_test(tc, test_window_pool);
	tcase_add_test(tc, test_h2o);
	tcase_add_test(tc, test_h2o_tokens);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

/* SPDX-License-Identifier: MIT */
/*
 * The value eviction policy on constructed histories: after a pool has seen conversations
 * that come back turn after turn, documents asked about once, and a system prompt that every
 * other request starts with, does it keep what will be reused?  Each case runs the same
 * history under LRU too, where it must come out the other way (or the case proves nothing).
 */
#include <errno.h>
#include <stdio.h>

#include "daemon/core/value.h"
#include "tests/unit/testutil.h"

#define B 4u
#define CAPACITY 64u
#define MAX_TOKENS (64u * B)
#define TURNS 6u   /* a conversation's turns; each adds one block to its chain */
#define GAP 3.0    /* time between a conversation's turns */
#define SYS_BLOCKS 2u

struct hist {
	struct core *c;
	struct fake_mem mem;
	double now;
	uint64_t rng;
	uint32_t convs; /* conversations started */
	uint32_t docs;  /* one-shot documents */
};

/* Block i of stream id: distinct tokens for every (id, i). */
static void block_tokens(uint32_t *t, uint32_t id, uint32_t i)
{
	for (uint32_t k = 0; k < B; k++)
		t[k] = (id * 64u + i) * B + k + 1;
}

/* A prompt of n blocks of stream id, optionally after the system prompt (stream 1). */
static uint32_t build(uint32_t *t, uint32_t id, uint32_t n, bool sys)
{
	uint32_t off = 0;

	if (sys)
		for (uint32_t i = 0; i < SYS_BLOCKS; i++, off += B)
			block_tokens(t + off, 1, i);
	for (uint32_t i = 0; i < n; i++, off += B)
		block_tokens(t + off, id, i);
	return off;
}

/* One request: open, prefill (commit), close, at the history's time. */
static void request(struct hist *h, const uint32_t *t, uint32_t n)
{
	struct core_open o = { .tokens = t, .ntokens = n };
	uint64_t seq;

	core_set_now(h->c, h->now);
	ck_assert_int_eq(core_seq_open(h->c, &o, &seq, NULL), 0);
	ck_assert_int_ge(core_seq_commit(h->c, seq, n), 0);
	ck_assert_int_eq(core_seq_close(h->c, seq), 0);
}

static uint32_t rnd(struct hist *h, uint32_t n)
{
	h->rng = h->rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(h->rng >> 33) % n;
}

/*
 * A history of `steps` requests, one per time unit: every GAP units each live conversation
 * takes its next turn (its chain plus a block) until its TURNS are done; the rest are new
 * conversations (1 in 4), documents of 2 blocks asked once, and with sys, requests that start
 * with the system prompt (1 in 3).
 */
static void history(struct hist *h, uint32_t steps, bool sys)
{
	enum { LIVE = 4 };
	uint32_t id[LIVE] = { 0 }, turn[LIVE] = { 0 };
	double next[LIVE] = { 0 };
	uint32_t t[MAX_TOKENS];

	for (uint32_t s = 0; s < steps; s++, h->now += 1) {
		uint32_t k = 0;

		while (k < LIVE && !(turn[k] && next[k] <= h->now))
			k++;
		if (k < LIVE) {
			request(h, t, build(t, id[k], 1 + turn[k], false));
			next[k] = h->now + GAP;
			if (++turn[k] == TURNS)
				turn[k] = 0;
			continue;
		}
		for (k = 0; k < LIVE && turn[k]; k++)
			;
		if (k < LIVE && rnd(h, 4) == 0) {
			id[k] = 1000 + h->convs++;
			turn[k] = 1;
			next[k] = h->now + GAP;
			request(h, t, build(t, id[k], 1, false));
		} else if (sys && rnd(h, 3) == 0) {
			request(h, t, build(t, 100000 + h->docs++, 2, true));
		} else {
			request(h, t, build(t, 100000 + h->docs++, 2, false));
		}
	}
}

static void hist_init(struct hist *h, uint32_t eviction, uint32_t capacity)
{
	struct core_config cfg = {
		.capacity_blocks = capacity,
		.block_tokens = B,
		.max_sequences = 8,
		.max_seq_tokens = MAX_TOKENS,
		.copy_block = fake_copy,
		.copy_ctx = &h->mem,
		.eviction = eviction,
	};

	*h = (struct hist){ .rng = 7 };
	fake_mem_init(&h->mem, capacity, B);
	ck_assert_int_eq(core_new(&cfg, &h->c), 0);
}

static void hist_done(struct hist *h)
{
	assert_verified(h->c);
	core_free(h->c);
	free(h->mem.slots);
}

static uint32_t cached(struct hist *h, const uint32_t *t, uint32_t n)
{
	struct core_open o = { .tokens = t, .ntokens = n };

	return core_lookup(h->c, &o);
}

/* Fills the pool's free blocks with a fresh prompt that stays open: what is cached must go. */
static uint64_t squeeze(struct hist *h, uint32_t blocks)
{
	uint32_t t[MAX_TOKENS], n = build(t, 999999, blocks, false);
	struct core_open o = { .tokens = t, .ntokens = n };
	uint64_t seq;

	core_set_now(h->c, h->now);
	ck_assert_int_eq(core_seq_open(h->c, &o, &seq, NULL), 0);
	return seq;
}

/*
 * A conversation at its third turn and a document asked once, released at the same moment:
 * the policy has seen conversations come back and documents not, so the document goes first.
 * LRU evicts the conversation (released first, so older).
 */
static void continued_vs_finished(uint32_t eviction, bool *conv_kept, bool *doc_kept)
{
	struct hist h;
	uint32_t conv[MAX_TOKENS], doc[MAX_TOKENS], t[MAX_TOKENS];
	uint32_t nc, nd;

	hist_init(&h, eviction, CAPACITY);
	history(&h, 3000, false);
	/* The conversation's first two turns, then nothing cached but what the case needs. */
	request(&h, t, build(t, 77, 1, false));
	h.now += GAP;
	request(&h, t, build(t, 77, 2, false));
	h.now += GAP;
	core_drop_cache(h.c);
	nc = build(conv, 77, 3, false);
	nd = build(doc, 88, 3, false);
	request(&h, conv, nc);
	request(&h, doc, nd);
	ck_assert_uint_eq(cached(&h, conv, nc), nc);
	ck_assert_uint_eq(cached(&h, doc, nd), nd);
	/* Room for everything but three blocks: three cached blocks must go. */
	uint64_t seq = squeeze(&h, CAPACITY - 3);

	*conv_kept = cached(&h, conv, nc) == nc;
	*doc_kept = cached(&h, doc, nd) == nd;
	ck_assert_int_eq(core_seq_close(h.c, seq), 0);
	hist_done(&h);
}

START_TEST(test_continued_kept_over_finished)
{
	bool conv, doc;

	continued_vs_finished(CORE_EVICT_VALUE, &conv, &doc);
	ck_assert_msg(conv && !doc, "value: conversation %s, document %s", conv ? "kept" : "gone",
		      doc ? "kept" : "gone");
	continued_vs_finished(CORE_EVICT_LRU, &conv, &doc);
	ck_assert_msg(!conv && doc, "lru: conversation %s, document %s (the case shows nothing)",
		      conv ? "kept" : "gone", doc ? "kept" : "gone");
}
END_TEST

/*
 * The system prompt that a third of the requests start with outlives both a continued
 * conversation and a finished document released when it was, while requests go on: neither
 * of them may still be cached once it is gone.
 */
START_TEST(test_shared_prefix_outlives_both)
{
	struct hist h;
	uint32_t conv[MAX_TOKENS], doc[MAX_TOKENS], sys[MAX_TOKENS], t[MAX_TOKENS];
	uint32_t nc, nd, ns = SYS_BLOCKS * B, k;

	hist_init(&h, CORE_EVICT_VALUE, CAPACITY);
	history(&h, 3000, true);
	request(&h, t, build(t, 77, 1, false));
	h.now += GAP;
	request(&h, t, build(t, 77, 2, false));
	h.now += GAP;
	core_drop_cache(h.c);
	nc = build(conv, 77, 3, false);
	nd = build(doc, 88, 2, false);
	build(sys, 0, 0, true);
	request(&h, conv, nc);
	request(&h, doc, nd);
	request(&h, t, build(t, 200000, 2, true));
	/* New documents, every other one after the system prompt, until both are gone. */
	for (k = 0; k < 200 && (cached(&h, conv, nc) || cached(&h, doc, nd)); k++) {
		h.now += 1;
		request(&h, t, build(t, 300000 + k, 6, k % 2 == 0));
		ck_assert_msg(cached(&h, sys, ns) == ns || (!cached(&h, conv, nc) &&
							    !cached(&h, doc, nd)),
			      "system prompt evicted while others stayed (request %u)", k);
	}
	ck_assert_msg(k < 200, "the conversation and the document were never evicted");
	ck_assert_uint_eq(cached(&h, sys, ns), ns);
	hist_done(&h);
}
END_TEST

/* The statistics name the classes and learned that turns continue and documents do not. */
START_TEST(test_learned_state)
{
	struct hist h;
	struct core_value_stats st;
	double p_fresh = -1, p_deep = -1;

	hist_init(&h, CORE_EVICT_VALUE, CAPACITY);
	ck_assert_int_eq(core_get_value_stats(h.c, &st), 0);
	ck_assert_uint_eq(st.records, 0);
	history(&h, 3000, false);
	ck_assert_int_eq(core_get_value_stats(h.c, &st), 0);
	ck_assert_uint_eq(st.nclasses, VALUE_CLASSES);
	ck_assert_uint_gt(st.records, 2900);
	ck_assert_uint_gt(st.extensions, 500);
	ck_assert_uint_gt(st.decisions, 1000);
	ck_assert_uint_eq(st.parent_first, 0);
	/* A time scale was learned: ages are measured against it, not seconds. */
	ck_assert(st.horizon > 1 && st.horizon < 3000);
	for (uint32_t c = 0; c < st.nclasses; c++) {
		ck_assert(st.cls[c].name[0]);
		if (!strcmp(st.cls[c].name, "fresh:0"))
			p_fresh = st.cls[c].p_reuse;
		if (!strcmp(st.cls[c].name, "depth2:near") || !strcmp(st.cls[c].name, "depth2:mid"))
			p_deep = p_deep > st.cls[c].p_reuse ? p_deep : st.cls[c].p_reuse;
	}
	ck_assert_msg(p_fresh >= 0 && p_deep >= 0, "classes not found");
	/* A quarter of fresh chains continue; nearly every second turn does. */
	ck_assert_msg(p_deep > 0.8 && p_fresh < 0.5, "p(fresh) %.3f p(depth 2) %.3f", p_fresh,
		      p_deep);
	hist_done(&h);

	/* An LRU pool has no such state. */
	hist_init(&h, CORE_EVICT_LRU, CAPACITY);
	ck_assert_int_eq(core_get_value_stats(h.c, &st), -ENOENT);
	hist_done(&h);
}
END_TEST

/* The same history twice gives the same hits, evictions and decisions. */
START_TEST(test_deterministic)
{
	struct core_stats a, b;
	struct core_value_stats va, vb;
	struct hist h;

	hist_init(&h, CORE_EVICT_VALUE, CAPACITY / 2);
	history(&h, 4000, true);
	core_get_stats(h.c, &a);
	core_get_value_stats(h.c, &va);
	hist_done(&h);
	hist_init(&h, CORE_EVICT_VALUE, CAPACITY / 2);
	history(&h, 4000, true);
	core_get_stats(h.c, &b);
	core_get_value_stats(h.c, &vb);
	hist_done(&h);
	ck_assert_uint_eq(a.hit_blocks, b.hit_blocks);
	ck_assert_uint_eq(a.evictions, b.evictions);
	ck_assert_uint_eq(va.decisions, vb.decisions);
	ck_assert_uint_eq(va.passed_over, vb.passed_over);
	ck_assert(va.horizon == vb.horizon);
	ck_assert_uint_gt(a.evictions, 1000);
}
END_TEST

/* A request closed with a hint (enum core_reuse), at the history's time. */
static void request_reuse(struct hist *h, const uint32_t *t, uint32_t n, uint32_t reuse)
{
	struct core_open o = { .tokens = t, .ntokens = n };
	uint64_t seq;

	core_set_now(h->c, h->now);
	ck_assert_int_eq(core_seq_open(h->c, &o, &seq, NULL), 0);
	ck_assert_int_ge(core_seq_commit(h->c, seq, n), 0);
	ck_assert_int_eq(core_seq_close_reuse(h->c, seq, reuse), 0);
}

/*
 * Hints override the prediction.  The conversation the policy would keep goes first when its
 * client says it is finished (reuse = none), under either policy; and of two documents of one
 * class released together, the one said to come back (likely) stays, where without the hint
 * the first released goes first.
 */
static void hinted(uint32_t eviction, uint32_t conv_reuse, uint32_t doc1_reuse, uint32_t evict,
		   bool *conv_kept, bool *doc1_kept, bool *doc2_kept)
{
	struct hist h;
	uint32_t conv[MAX_TOKENS], d1[MAX_TOKENS], d2[MAX_TOKENS], t[MAX_TOKENS];
	uint32_t nc, n1, n2;

	hist_init(&h, eviction, CAPACITY);
	history(&h, 3000, false);
	request(&h, t, build(t, 77, 1, false));
	h.now += GAP;
	request(&h, t, build(t, 77, 2, false));
	h.now += GAP;
	core_drop_cache(h.c);
	nc = build(conv, 77, 3, false);
	n1 = build(d1, 88, 3, false);
	n2 = build(d2, 89, 3, false);
	request(&h, d1, n1);
	core_drop_cache(h.c); /* d1 recorded: its second asking is a repeat (depth 1) */
	request_reuse(&h, d1, n1, doc1_reuse);
	request_reuse(&h, conv, nc, conv_reuse);
	request(&h, d2, n2);
	/* evict blocks must go. */
	uint64_t seq = squeeze(&h, CAPACITY - 9 + evict);

	*conv_kept = cached(&h, conv, nc) == nc;
	*doc1_kept = cached(&h, d1, n1) == n1;
	*doc2_kept = cached(&h, d2, n2) == n2;
	ck_assert_int_eq(core_seq_close(h.c, seq), 0);
	hist_done(&h);
}

START_TEST(test_hint_none_goes_first)
{
	bool conv, d1, d2;

	/* Unhinted, the value pool lets the fresh document go (d1 is a repeat: depth 1). */
	hinted(CORE_EVICT_VALUE, CORE_REUSE_DEFAULT, CORE_REUSE_DEFAULT, 6, &conv, &d1, &d2);
	ck_assert_msg(conv && !d2, "value, no hints: conversation %d d1 %d d2 %d", conv, d1, d2);
	/* The conversation said finished: it goes, however deep it is, then the fresh document. */
	hinted(CORE_EVICT_VALUE, CORE_REUSE_NONE, CORE_REUSE_DEFAULT, 6, &conv, &d1, &d2);
	ck_assert_msg(!conv && d1 && !d2, "value, conversation none: conversation %d d1 %d d2 %d",
		      conv, d1, d2);
	/* An LRU pool takes no hint: the same with and without. */
	for (uint32_t reuse = CORE_REUSE_DEFAULT; reuse <= CORE_REUSE_NONE; reuse++) {
		hinted(CORE_EVICT_LRU, reuse, CORE_REUSE_DEFAULT, 3, &conv, &d1, &d2);
		ck_assert_msg(conv && !d1 && d2, "lru, hint %u: conversation %d d1 %d d2 %d", reuse,
			      conv, d1, d2);
	}
}
END_TEST

START_TEST(test_hint_likely_kept)
{
	struct hist h;
	uint32_t a[MAX_TOKENS], b[MAX_TOKENS], t[MAX_TOKENS];
	uint32_t na, nb;
	bool ka, kb;

	for (int hint = 0; hint < 2; hint++) {
		hist_init(&h, CORE_EVICT_VALUE, CAPACITY);
		history(&h, 3000, false);
		core_drop_cache(h.c);
		na = build(a, 66, 3, false);
		nb = build(b, 67, 3, false);
		/* Two fresh documents of one class, a released first: a is its segment's head. */
		request_reuse(&h, a, na, hint ? CORE_REUSE_LIKELY : CORE_REUSE_DEFAULT);
		request(&h, b, nb);
		(void)t;
		uint64_t seq = squeeze(&h, CAPACITY - 3);

		ka = cached(&h, a, na) == na;
		kb = cached(&h, b, nb) == nb;
		ck_assert_int_eq(core_seq_close(h.c, seq), 0);
		hist_done(&h);
		if (hint)
			ck_assert_msg(ka && !kb, "likely: a %d b %d", ka, kb);
		else
			ck_assert_msg(!ka && kb, "no hint: a %d b %d (the case shows nothing)", ka, kb);
	}
}
END_TEST

/* A hint that is not one is refused, and the sequence stays open. */
START_TEST(test_hint_refused)
{
	struct hist h;
	uint32_t t[MAX_TOKENS], n;
	uint64_t seq;
	struct core_seq_info info;

	hist_init(&h, CORE_EVICT_VALUE, CAPACITY);
	n = build(t, 5, 2, false);
	struct core_open o = { .tokens = t, .ntokens = n };

	ck_assert_int_eq(core_seq_open(h.c, &o, &seq, NULL), 0);
	ck_assert_int_eq(core_seq_close_reuse(h.c, seq, CORE_REUSE_MAX + 1), -EINVAL);
	ck_assert_int_eq(core_seq_info(h.c, seq, &info), 0);
	ck_assert_int_eq(core_seq_close_reuse(h.c, seq, CORE_REUSE_LIKELY), 0);
	ck_assert_int_eq(core_seq_close_reuse(h.c, seq, CORE_REUSE_LIKELY), -ENOENT);
	hist_done(&h);
}
END_TEST

/* A bad policy is refused; a value pool without a clock still works (everything at age 0). */
START_TEST(test_config)
{
	struct fake_mem m;
	struct core_config cfg = { .capacity_blocks = 8, .block_tokens = B, .max_sequences = 2,
				   .max_seq_tokens = 32, .copy_block = fake_copy, .copy_ctx = &m,
				   .eviction = 2 };
	struct core *c = NULL;
	uint32_t t[32];
	uint64_t seq;

	fake_mem_init(&m, 8, B);
	ck_assert_int_eq(core_new(&cfg, &c), -EINVAL);
	cfg.eviction = CORE_EVICT_VALUE;
	ck_assert_int_eq(core_new(&cfg, &c), 0);
	for (uint32_t i = 0; i < 20; i++) {
		struct core_open o = { .tokens = t, .ntokens = build(t, 500 + i, 5, false) };

		ck_assert_int_eq(core_seq_open(c, &o, &seq, NULL), 0);
		ck_assert_int_ge(core_seq_commit(c, seq, o.ntokens), 0);
		ck_assert_int_eq(core_seq_close(c, seq), 0);
		assert_verified(c);
	}
	core_free(c);
	free(m.slots);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("core-value");
	TCase *tc = tcase_create("value");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_continued_kept_over_finished);
	tcase_add_test(tc, test_shared_prefix_outlives_both);
	tcase_add_test(tc, test_learned_state);
	tcase_add_test(tc, test_deterministic);
	tcase_add_test(tc, test_config);
	tcase_add_test(tc, test_hint_none_goes_first);
	tcase_add_test(tc, test_hint_likely_kept);
	tcase_add_test(tc, test_hint_refused);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

/* SPDX-License-Identifier: MIT */
/*
 * The value eviction policy: see value.h for what it does and docs/policy.md for the model and
 * why each of its parameters has its value.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/core/hash.h"
#include "daemon/core/index.h"
#include "daemon/core/value.h"

/*
 * Parameters (docs/policy.md, "Parameters").  None is a time: ages are in units of H.
 */
#define PRIOR_N 4.0        /* shrinkage: pseudo-records per age bin toward the group's hazard */
#define PRIOR_H 0.05       /* the pool's hazard per bin before any data */
#define DECAY_N 1000.0     /* statistics forget by 1 - 1/DECAY_N per record */
#define REFRESH 16u        /* the curves are recomputed every REFRESH releases */
#define MAX_RECORDS 65536u /* records kept at most (the default is the capacity) */
#define CP_WAYS 4u         /* the checkpoint table: sets of this many entries, */
#define CP_PER_RECORD 8u   /* this many entries per record */
#define MAX_CHECKPOINTS 33u /* positions n-1, n-2, n-4, ... of a chain below 2^32 */
/* The clock's resolution, seconds: H never gets smaller (a pool whose evictions are all at
 * age 0 would otherwise divide by 0). */
#define MIN_HORIZON 1e-9

/*
 * The age grid of the curves, in units of H: 0, then 8 points per octave, x = 2^e (1 + m/8) for
 * e in [-7, 6], so that an age's grid point is read off its float's bits (grid_index).
 */
#define GRID 113u
/* Grid point of 16 H: e = 4, m = 0. */
#define GRID_16H (1u + (4u + 7u) * 8u)

/* Classes: 0 unclassified, 1..16 fresh chains by half-octave length, then depth 1, 2, 3+ each
 * with no gap known and with its last gap near (< H/2), mid (< 2H) or far. */
#define CLASS_OTHER 0u
#define CLASS_FRESH 1u
#define FRESH_BANDS 16u
/* The first band ends at 2^9.5 tokens (724: half-octaves counted from 512 tokens). */
#define FRESH_FROM_HALF_OCTAVES 18
#define CLASS_DEEP (CLASS_FRESH + FRESH_BANDS)
#define DEPTHS 3u
#define GAPS 4u
/* Chains closed with reuse = none: their density is 0, so their heads go first. */
#define CLASS_NONE (CLASS_DEEP + DEPTHS * GAPS)
#define NGROUPS (3u + DEPTHS) /* other, fresh, depth 1, 2, 3+, none */

static_assert(CLASS_NONE + 1 == VALUE_CLASSES, "class count");
static_assert(VALUE_CLASSES <= 32, "segments are a 32-bit mask");

/* Age bins, in units of H: [0, 1/8), [1/8, 1/4), ... [8, 16), [16, inf). */
static const double bin_edge[VALUE_BINS] = { 0, 0.125, 0.25, 0.5, 1, 2, 4, 8, 16 };

struct vblock {
	uint32_t prev, next; /* the segment: towards older, newer */
	uint32_t parent;     /* the cached parent counted, or CORE_NONE */
	uint32_t pgen;       /* its generation then */
	uint32_t gen;        /* bumped each time the block is freed */
	uint32_t ncc;        /* cached children */
	double t;            /* when it became cached */
	float mc_rank;       /* the highest rank among its cached children (-1: none) */
	uint8_t cls;         /* its segment */
	uint8_t mc_cls;
	uint8_t on;          /* in a segment */
};

struct record {
	double t;
	uint64_t seq; /* 0: the slot is empty */
	uint32_t nf;  /* full blocks of the chain */
	uint8_t cls, depth;
	bool pending; /* no reuse seen yet */
};

struct cp_entry {
	uint64_t lo, hi, seq;
};

struct segment {
	uint32_t head, tail, n;
};

struct value {
	const struct core_block *blocks;
	const struct prefix_index *ix;
	uint32_t capacity;
	uint32_t block_tokens;
	struct vblock *vb;
	struct segment seg[VALUE_CLASSES];
	double head_t[VALUE_CLASSES]; /* each segment's head's time (the scan reads only this) */
	uint32_t mask;                /* non-empty segments */
	double now, t0;
	bool started;
	double H;
	bool h_learned;

	struct record *rec;
	uint32_t nrec;    /* ring size */
	uint64_t next_seq; /* the next record's */
	struct cp_entry *cp;
	uint32_t cp_sets; /* a power of 2 */
	/*
	 * A bit per two entries' worth of hashes, set for every checkpoint inserted: most of a
	 * chain's blocks are no record's checkpoint, and this answers for them from the cache.
	 * Rebuilt from the live entries once as many inserts as entries have set bits.
	 */
	uint64_t *cp_bits;
	uint32_t cp_bits_mask;
	uint32_t cp_inserts;
	uint64_t cursor[VALUE_BINS];

	/* Statistics, kept divided by scale (the decays so far). */
	double X[VALUE_CLASSES][VALUE_BINS], E[VALUE_CLASSES][VALUE_BINS];
	double scale;
	float G[VALUE_CLASSES][GRID]; /* hit density per grid age, nonincreasing */
	double gh[NGROUPS][VALUE_BINS]; /* each group's hazard, at the last refresh */
	uint32_t stale;                 /* classes whose G is older than the last refresh */
	double p_reuse[VALUE_CLASSES], median[VALUE_CLASSES];
	double grid[GRID];
	uint8_t grid_bin[GRID];   /* the age bin of each grid age */
	double grid_frac[GRID];   /* the share of that bin's hazard reached there */
	uint64_t releases;

	/* The release in progress. */
	uint32_t hint; /* value_release_hint */
	uint8_t cur;
	bool releasing;
	struct record pend;
	uint32_t npend_cp;
	struct core_hash pend_cp[MAX_CHECKPOINTS];

	struct core_value_stats st;
};

static uint32_t bin_of(double a);

static uint32_t grid_index(float a)
{
	uint32_t bits;

	if (!(a >= 0x1p-7f))
		return 0;
	if (a >= 0x1p7f)
		return GRID - 1;
	memcpy(&bits, &a, sizeof(bits));
	return 1 + (bits >> 20) - (120u << 3);
}

static uint32_t group_of(uint32_t cls)
{
	if (cls == CLASS_OTHER)
		return 0;
	if (cls < CLASS_DEEP)
		return 1;
	if (cls == CLASS_NONE)
		return NGROUPS - 1;
	return 2 + (cls - CLASS_DEEP) / GAPS;
}

static double horizon(const struct value *v)
{
	double h = v->h_learned ? v->H : v->now - v->t0;

	return h > MIN_HORIZON ? h : MIN_HORIZON;
}

/* Class c's curve from its counts and its group's hazard (v->gh, of the last refresh). */
static void curve_one(struct value *v, uint32_t c)
{
	const uint32_t g = group_of(c);
	const double sc = v->scale;
	double rate[VALUE_BINS], below[VALUE_BINS], S[GRID], I[GRID], row[GRID], hx[GRID], hy[GRID];
	uint32_t m = 0;

	for (uint32_t j = 0; j < VALUE_BINS; j++) {
		double hz = (v->X[c][j] * sc + PRIOR_N * v->gh[g][j]) / (v->E[c][j] * sc + PRIOR_N);

		rate[j] = -log1p(-(hz < 0.999 ? hz : 0.999));
	}
	/* The cumulative hazard at each grid age: the full bins below it, and its own bin's
	 * share; then the survival S and its integral I. */
	below[0] = 0;
	for (uint32_t j = 1; j < VALUE_BINS; j++)
		below[j] = below[j - 1] + rate[j - 1];
	for (uint32_t k = 0; k < GRID; k++) {
		const uint32_t j = v->grid_bin[k];

		S[k] = expf((float)-(below[j] + rate[j] * v->grid_frac[k]));
		I[k] = k ? I[k - 1] + 0.5 * (S[k] + S[k - 1]) * (v->grid[k] - v->grid[k - 1]) : 0;
	}
	/*
	 * G(a) = max over T > a of P(reused in (a, T] | pending at a) / E[cache time in (a, T]]:
	 * the steepest descent from point i of the curve (I, S) to a later point.  That is the
	 * first edge from i of the later points' lower convex hull, built from the right: O(GRID)
	 * in all.
	 */
	for (uint32_t i = GRID; i-- > 0;) {
		while (m >= 2 && (hx[m - 1] - I[i]) * (hy[m - 2] - hy[m - 1]) -
					 (hy[m - 1] - S[i]) * (hx[m - 2] - hx[m - 1]) <=
				 0)
			m--;
		row[i] = m && hx[m - 1] > I[i] && S[i] > hy[m - 1]
				 ? (S[i] - hy[m - 1]) / (hx[m - 1] - I[i])
				 : 0;
		hx[m] = I[i];
		hy[m++] = S[i];
	}
	row[GRID - 1] = row[GRID - 2];
	/* Nonincreasing in age, so a segment's head (its oldest) is its cheapest. */
	for (uint32_t i = 0; i < GRID; i++) {
		double gi = i && row[i] > v->G[c][i - 1] ? v->G[c][i - 1] : row[i];

		v->G[c][i] = (float)(gi > 1e-9 ? gi : 1e-9);
	}
	/* The client said so: below every learned class (which never falls under 1e-9). */
	if (c == CLASS_NONE)
		for (uint32_t i = 0; i < GRID; i++)
			v->G[c][i] = 0;
	v->p_reuse[c] = 1.0 - S[GRID_16H];
	v->median[c] = 0;
	for (uint32_t k = 0; k < GRID && v->p_reuse[c] > 0; k++)
		if (1.0 - S[k] >= 0.5 * v->p_reuse[c]) {
			v->median[c] = v->grid[k];
			break;
		}
	v->stale &= ~(1u << c);
}

/*
 * The hazards shrunk toward each group, the group toward the pool of all classes; then the
 * curves of the classes with cached blocks.  The others are computed when a block joins them.
 */
static void curves(struct value *v, uint32_t also)
{
	double pool_x[VALUE_BINS] = { 0 }, pool_e[VALUE_BINS] = { 0 }, pool_h[VALUE_BINS];
	double gx[NGROUPS][VALUE_BINS] = { { 0 } }, ge[NGROUPS][VALUE_BINS] = { { 0 } };
	const double sc = v->scale;
	uint32_t live;

	for (uint32_t c = 0; c < VALUE_CLASSES; c++)
		for (uint32_t j = 0; j < VALUE_BINS; j++) {
			pool_x[j] += v->X[c][j] * sc;
			pool_e[j] += v->E[c][j] * sc;
			gx[group_of(c)][j] += v->X[c][j] * sc;
			ge[group_of(c)][j] += v->E[c][j] * sc;
		}
	for (uint32_t j = 0; j < VALUE_BINS; j++)
		pool_h[j] = (pool_x[j] + PRIOR_H) / (pool_e[j] + 1.0);
	for (uint32_t g = 0; g < NGROUPS; g++)
		for (uint32_t j = 0; j < VALUE_BINS; j++)
			v->gh[g][j] = (gx[g][j] + PRIOR_N * pool_h[j]) / (ge[g][j] + PRIOR_N);
	v->stale = (uint32_t)((1ull << VALUE_CLASSES) - 1);
	live = v->mask | also;
	while (live) {
		curve_one(v, (uint32_t)__builtin_ctz(live));
		live &= live - 1;
	}
}

int value_new(uint32_t capacity, uint32_t block_tokens, uint32_t records,
	      const struct core_block *blocks,
	      const struct prefix_index *ix, struct value **ret)
{
	struct value *v;
	uint32_t entries;

	if (!capacity || !blocks || !ix)
		return -EINVAL;
	if (!records)
		records = capacity < MAX_RECORDS ? capacity : MAX_RECORDS;
	if (records < 64)
		records = 64;
	v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	v->blocks = blocks;
	v->ix = ix;
	v->capacity = capacity;
	v->block_tokens = block_tokens ? block_tokens : 1;
	v->nrec = records;
	for (entries = CP_WAYS; entries < (uint64_t)records * CP_PER_RECORD && entries < (1u << 30);)
		entries <<= 1;
	v->cp_sets = entries / CP_WAYS;
	v->vb = malloc((size_t)capacity * sizeof(*v->vb));
	v->rec = calloc(records, sizeof(*v->rec));
	v->cp = calloc(entries, sizeof(*v->cp));
	v->cp_bits_mask = 2 * entries - 1;
	v->cp_bits = calloc(2 * (size_t)entries / 64, sizeof(uint64_t));
	if (!v->vb || !v->rec || !v->cp || !v->cp_bits) {
		value_free(v);
		return -ENOMEM;
	}
	for (uint32_t b = 0; b < capacity; b++)
		v->vb[b] = (struct vblock){ .prev = CORE_NONE, .next = CORE_NONE,
					    .parent = CORE_NONE, .mc_rank = -1 };
	for (uint32_t s = 0; s < VALUE_CLASSES; s++)
		v->seg[s] = (struct segment){ CORE_NONE, CORE_NONE, 0 };
	v->next_seq = 1;
	v->hint = CORE_NONE;
	for (uint32_t j = 0; j < VALUE_BINS; j++)
		v->cursor[j] = 1;
	v->scale = 1.0;
	for (uint32_t k = 1; k < GRID; k++)
		v->grid[k] = ldexp(1.0 + ((k - 1) % 8) / 8.0, (int)((k - 1) / 8) - 7);
	/* A bin's hazard accrues linearly in age in the first bin, per octave in the others
	 * (the last one open). */
	for (uint32_t k = 0; k < GRID; k++) {
		const uint32_t j = bin_of(v->grid[k]);

		v->grid_bin[k] = (uint8_t)j;
		v->grid_frac[k] = j == 0 ? v->grid[k] / bin_edge[1] : log2(v->grid[k] / bin_edge[j]);
	}
	curves(v, (uint32_t)((1ull << VALUE_CLASSES) - 1));
	*ret = v;
	return 0;
}

void value_free(struct value *v)
{
	if (!v)
		return;
	free(v->vb);
	free(v->rec);
	free(v->cp);
	free(v->cp_bits);
	free(v);
}

void value_set_now(struct value *v, double now)
{
	v->now = now;
}

double value_now(const struct value *v)
{
	return v->now;
}

/* A rank: a class's density at age 0, ties to the higher class id. */
static bool rank_above(float ra, uint32_t ca, float rb, uint32_t cb)
{
	return ra > rb || (ra == rb && ca > cb);
}

void value_cached(struct value *v, uint32_t b)
{
	struct vblock *x = &v->vb[b];
	const struct core_block *blk = &v->blocks[b];
	uint32_t s = v->releasing ? v->cur : CLASS_OTHER;
	float rank;
	struct segment *sg;

	if (v->stale & (1u << s))
		curve_one(v, s);
	rank = v->G[s][0];

	/* A parent keeps up with its most valuable cached child (a shared prefix). */
	if (x->ncc && rank_above(x->mc_rank, x->mc_cls, rank, s)) {
		s = x->mc_cls;
		rank = x->mc_rank;
	}
	x->cls = (uint8_t)s;
	x->t = v->now;
	x->on = 1;
	sg = &v->seg[s];
	x->prev = sg->tail;
	x->next = CORE_NONE;
	if (sg->tail != CORE_NONE)
		v->vb[sg->tail].next = b;
	else {
		sg->head = b;
		v->head_t[s] = x->t;
		v->mask |= 1u << s;
	}
	sg->tail = b;
	sg->n++;

	x->parent = CORE_NONE;
	if (blk->parent.lo | blk->parent.hi) {
		/* The releasing table's block before this one, when it is the parent: no lookup. */
		uint32_t p = v->hint;

		if (p == CORE_NONE || !core_hash_eq(v->blocks[p].hash, blk->parent) ||
		    !(v->blocks[p].flags & CORE_BLOCK_INDEXED))
			p = index_find(v->ix, v->blocks, blk->parent);

		if (p != CORE_NONE && p != b) {
			struct vblock *y = &v->vb[p];

			x->parent = p;
			x->pgen = y->gen;
			if (!y->ncc++ || rank_above(rank, s, y->mc_rank, y->mc_cls)) {
				y->mc_rank = rank;
				y->mc_cls = (uint8_t)s;
			}
		}
	}
}

void value_uncached(struct value *v, uint32_t b)
{
	struct vblock *x = &v->vb[b];
	struct segment *sg = &v->seg[x->cls];

	if (!x->on)
		return;
	if (x->prev != CORE_NONE)
		v->vb[x->prev].next = x->next;
	else {
		sg->head = x->next;
		if (x->next != CORE_NONE)
			v->head_t[x->cls] = v->vb[x->next].t;
		else
			v->mask &= ~(1u << x->cls);
	}
	if (x->next != CORE_NONE)
		v->vb[x->next].prev = x->prev;
	else
		sg->tail = x->prev;
	sg->n--;
	x->prev = x->next = CORE_NONE;
	x->on = 0;
	if (x->parent != CORE_NONE) {
		struct vblock *y = &v->vb[x->parent];

		if (y->gen == x->pgen && y->ncc && !--y->ncc)
			y->mc_rank = -1;
		x->parent = CORE_NONE;
	}
}

void value_freed(struct value *v, uint32_t b)
{
	struct vblock *x = &v->vb[b];

	x->gen++;
	x->ncc = 0;
	x->mc_rank = -1;
}

uint32_t value_victim(struct value *v, uint32_t fallback)
{
	const double H = horizon(v), inv = 1.0 / H, now = v->now;
	uint32_t left = v->mask, b = CORE_NONE;
	double age;

	if (!left)
		return fallback;
	while (left) {
		uint32_t best = VALUE_CLASSES, m = left;
		float bg = INFINITY;

		while (m) {
			uint32_t s = (uint32_t)__builtin_ctz(m);
			float g = v->G[s][grid_index((float)((now - v->head_t[s]) * inv))];

			m &= m - 1;
			if (g < bg) {
				bg = g;
				best = s;
			}
		}
		b = v->seg[best].head;
		if (!v->vb[b].ncc)
			break;
		/* Its children go first; the oldest cached block, a leaf, heads some segment. */
		v->st.passed_over++;
		left &= ~(1u << best);
		b = CORE_NONE;
	}
	if (b == CORE_NONE) {
		v->st.lru_fallbacks++;
		b = fallback;
	}
	if (b == CORE_NONE)
		return b;
	v->st.decisions++;
	if (v->vb[b].ncc)
		v->st.parent_first++;
	age = now - v->vb[b].t;
	if (age < 0)
		age = 0;
	if (!v->h_learned) {
		v->H = age;
		v->h_learned = true;
	} else {
		v->H += (age - v->H) / v->capacity;
	}
	return b;
}

/* ---- records ------------------------------------------------------------------------------ */

static uint32_t cp_bit(const struct value *v, struct core_hash h)
{
	return (uint32_t)(h.hi >> 7) & v->cp_bits_mask;
}

static struct record *cp_find(struct value *v, struct core_hash h)
{
	const uint32_t bit = cp_bit(v, h);

	if (!(v->cp_bits[bit / 64] & (UINT64_C(1) << (bit % 64))))
		return NULL;
	struct cp_entry *set = &v->cp[(size_t)(h.lo & (v->cp_sets - 1)) * CP_WAYS];

	for (uint32_t w = 0; w < CP_WAYS; w++)
		if (set[w].seq && set[w].lo == h.lo && set[w].hi == h.hi) {
			struct record *r = &v->rec[set[w].seq % v->nrec];

			return r->seq == set[w].seq ? r : NULL;
		}
	return NULL;
}

static void cp_insert(struct value *v, struct core_hash h, uint64_t seq)
{
	struct cp_entry *set = &v->cp[(size_t)(h.lo & (v->cp_sets - 1)) * CP_WAYS];
	uint32_t pick = 0;
	uint64_t oldest = UINT64_MAX;

	for (uint32_t w = 0; w < CP_WAYS; w++) {
		uint64_t s = set[w].seq;

		if (s && set[w].lo == h.lo && set[w].hi == h.hi) {
			pick = w;
			break;
		}
		/* A dead entry (its record left the ring) counts as the oldest. */
		if (s && v->rec[s % v->nrec].seq != s)
			s = 0;
		if (s < oldest) {
			oldest = s;
			pick = w;
		}
	}
	set[pick] = (struct cp_entry){ h.lo, h.hi, seq };
	if (++v->cp_inserts > v->cp_bits_mask / 2) {
		const size_t n = (size_t)v->cp_sets * CP_WAYS;

		memset(v->cp_bits, 0, ((size_t)v->cp_bits_mask + 1) / 8);
		for (size_t i = 0; i < n; i++)
			if (v->cp[i].seq && v->rec[v->cp[i].seq % v->nrec].seq == v->cp[i].seq) {
				const uint32_t b = cp_bit(v, (struct core_hash){ v->cp[i].lo,
										 v->cp[i].hi });

				v->cp_bits[b / 64] |= UINT64_C(1) << (b % 64);
			}
		v->cp_inserts = 0;
	}
	{
		const uint32_t b = cp_bit(v, h);

		v->cp_bits[b / 64] |= UINT64_C(1) << (b % 64);
	}
}

static uint32_t bin_of(double a)
{
	uint32_t j = 0;

	while (j + 1 < VALUE_BINS && a >= bin_edge[j + 1])
		j++;
	return j;
}

static void event(struct value *v, struct record *r, double at, double w)
{
	double age = (at - r->t) / horizon(v);

	r->pending = false;
	v->X[r->cls][bin_of(age > 0 ? age : 0)] += w / v->scale;
}

/* Credits exposure to each pending record whose age crossed a bin's lower edge. */
static void advance(struct value *v)
{
	const double H = horizon(v);
	const uint64_t oldest = v->next_seq > v->nrec ? v->next_seq - v->nrec : 1;

	for (uint32_t j = 0; j < VALUE_BINS; j++) {
		const double lim = v->now - H * bin_edge[j];
		uint64_t c = v->cursor[j] < oldest ? oldest : v->cursor[j];

		for (; c < v->next_seq; c++) {
			const struct record *r = &v->rec[c % v->nrec];

			if (r->t > lim)
				break;
			if (r->pending)
				v->E[r->cls][j] += 1.0 / v->scale;
		}
		v->cursor[j] = c;
	}
}

static uint32_t classify(const struct value *v, uint32_t depth, uint32_t nf, double gap)
{
	if (depth == 0) {
		/*
		 * The half-octave band of the chain's tokens, floor(2 log2 tokens), counted from
		 * 512 tokens: the same bands at any block size.
		 */
		const double tok = (double)(nf ? nf : 1) * v->block_tokens;
		const int z = (int)floor(2.0 * log2(tok)) - FRESH_FROM_HALF_OCTAVES;

		return CLASS_FRESH + (z < 0 ? 0 : z >= (int)FRESH_BANDS ? FRESH_BANDS - 1 : (uint32_t)z);
	}
	uint32_t d = depth < DEPTHS ? depth : DEPTHS, g = 0;

	if (gap >= 0)
		g = gap < 0.5 ? 1 : gap < 2.0 ? 2 : 3;
	return CLASS_DEEP + (d - 1) * GAPS + g;
}

void value_release_begin(struct value *v, const uint32_t *chain, uint32_t n, double opened,
			 uint32_t reuse)
{
	uint32_t depth = 0;
	double gap = -1;

	if (!v->started) {
		v->t0 = v->now;
		v->started = true;
	}
	advance(v);
	for (uint32_t j = n; j-- > 0;) {
		struct record *r = cp_find(v, v->blocks[chain[j]].hash);

		/* Only what was released before this sequence began is something it reused. */
		if (!r || r->t > opened)
			continue;
		if (j + 1 == r->nf) {
			depth = r->depth + 1u;
			gap = (opened - r->t) / horizon(v);
			if (gap < 0)
				gap = 0;
			if (r->pending)
				event(v, r, opened, 1.0);
			v->st.extensions++;
		} else {
			depth = r->depth;
			if (r->pending)
				event(v, r, opened, (j + 1.0) / r->nf);
			v->st.shares++;
		}
		break;
	}
	/* What it learns is the chain's own class; where its blocks go, the hint's. */
	const uint32_t learned = classify(v, depth, n, gap);

	v->cur = (uint8_t)(reuse == CORE_REUSE_NONE     ? CLASS_NONE
			   : reuse == CORE_REUSE_LIKELY ? classify(v, depth + 1, n, gap)
							: learned);
	if (v->releases++ % REFRESH == 0)
		curves(v, 1u << v->cur);
	v->releasing = true;
	v->pend = (struct record){ .nf = n, .cls = (uint8_t)learned,
				   .depth = (uint8_t)(depth < 255 ? depth : 255), .pending = true };
	v->npend_cp = 0;
	for (uint64_t m = 1; n && m <= n && v->npend_cp < MAX_CHECKPOINTS; m <<= 1)
		v->pend_cp[v->npend_cp++] = v->blocks[chain[n - m]].hash;
}

void value_release_hint(struct value *v, uint32_t parent)
{
	v->hint = parent;
}

void value_release_end(struct value *v)
{
	struct record *r;

	v->releasing = false;
	v->hint = CORE_NONE;
	v->cur = CLASS_OTHER;
	if (!v->pend.nf)
		return;
	v->scale *= 1.0 - 1.0 / DECAY_N;
	if (v->scale < 1e-150) {
		for (uint32_t c = 0; c < VALUE_CLASSES; c++)
			for (uint32_t j = 0; j < VALUE_BINS; j++) {
				v->X[c][j] *= v->scale;
				v->E[c][j] *= v->scale;
			}
		v->scale = 1.0;
	}
	r = &v->rec[v->next_seq % v->nrec];
	*r = v->pend;
	r->t = v->now;
	r->seq = v->next_seq++;
	for (uint32_t i = 0; i < v->npend_cp; i++)
		cp_insert(v, v->pend_cp[i], r->seq);
	v->st.records++;
	v->pend.nf = 0;
}

static void class_name(uint32_t c, char *buf, size_t len)
{
	static const char *const gap[GAPS] = { "", ":near", ":mid", ":far" };

	if (c == CLASS_OTHER)
		snprintf(buf, len, "other");
	else if (c == CLASS_NONE)
		snprintf(buf, len, "hint:none");
	else if (c < CLASS_DEEP)
		snprintf(buf, len, "fresh:%u", c - CLASS_FRESH);
	/* fresh:z holds chains of 2^((z + 18) / 2) tokens and more (z = 0: any fewer). */
	else
		snprintf(buf, len, "depth%u%s%s", (c - CLASS_DEEP) / GAPS + 1,
			 (c - CLASS_DEEP) / GAPS + 1 == DEPTHS ? "+" : "", gap[(c - CLASS_DEEP) % GAPS]);
}

void value_get_stats(const struct value *v, struct core_value_stats *ret)
{
	const double H = horizon(v);

	*ret = v->st;
	ret->horizon = v->started ? H : 0;
	ret->nclasses = VALUE_CLASSES;
	for (uint32_t c = 0; c < VALUE_CLASSES; c++) {
		struct core_value_class *cs = &ret->cls[c];
		double ev = 0;

		for (uint32_t j = 0; j < VALUE_BINS; j++)
			ev += v->X[c][j] * v->scale;
		class_name(c, cs->name, sizeof(cs->name));
		cs->cached = v->seg[c].n;
		cs->samples = v->E[c][0] * v->scale;
		cs->events = ev;
		cs->p_reuse = v->p_reuse[c];
		cs->median_reuse = v->median[c] * H;
		cs->density0 = v->G[c][0];
	}
}

__attribute__((format(printf, 3, 4))) static int vfail(char *why, size_t len, const char *fmt,
							  ...)
{
	va_list ap;

	if (why && len) {
		va_start(ap, fmt);
		vsnprintf(why, len, fmt, ap);
		va_end(ap);
	}
	return -EUCLEAN;
}

int value_verify(const struct value *v, uint32_t capacity, char *why, size_t len)
{
	uint32_t *ncc, total = 0, on = 0;
	int r = 0;

	if (capacity != v->capacity)
		return vfail(why, len, "value policy sized for %u blocks, pool has %u", v->capacity,
			     capacity);
	ncc = calloc(capacity, sizeof(*ncc));
	if (!ncc)
		return -ENOMEM;
	for (uint32_t s = 0; s < VALUE_CLASSES && !r; s++) {
		const struct segment *sg = &v->seg[s];
		uint32_t n = 0, prev = CORE_NONE;

		if (!!(v->mask & (1u << s)) != (sg->n > 0))
			r = vfail(why, len, "segment %u: mask and count %u disagree", s, sg->n);
		for (uint32_t b = sg->head; b != CORE_NONE && !r; prev = b, b = v->vb[b].next) {
			const struct vblock *x = &v->vb[b];

			if (b >= capacity || ++n > sg->n)
				r = vfail(why, len, "segment %u: bad link or cycle at %u", s, b);
			else if (x->prev != prev || x->cls != s || !x->on)
				r = vfail(why, len, "segment %u: block %u linked wrong", s, b);
			else if (!(v->blocks[b].flags & CORE_BLOCK_ON_LRU))
				r = vfail(why, len, "segment %u holds block %u, which is not cached",
					  s, b);
			else if (prev != CORE_NONE && v->vb[prev].t > x->t)
				r = vfail(why, len, "segment %u: block %u older than the one before",
					  s, b);
			else if (prev == CORE_NONE && v->head_t[s] != x->t)
				r = vfail(why, len, "segment %u: head time stale", s);
			if (!r && x->parent != CORE_NONE && v->vb[x->parent].gen == x->pgen)
				ncc[x->parent]++;
		}
		if (!r && (n != sg->n || prev != sg->tail))
			r = vfail(why, len, "segment %u: holds %u blocks, count %u", s, n, sg->n);
		total += n;
	}
	for (uint32_t b = 0; b < capacity && !r; b++) {
		on += !!(v->blocks[b].flags & CORE_BLOCK_ON_LRU);
		if (v->vb[b].ncc != ncc[b])
			r = vfail(why, len, "block %u counts %u cached children, %u are", b,
				  v->vb[b].ncc, ncc[b]);
	}
	if (!r && on != total)
		r = vfail(why, len, "segments hold %u blocks, %u are cached", total, on);
	free(ncc);
	return r;
}

/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-llama: checkpoint loading and the forward pass.  The arithmetic follows llama2.c's
 * run.c operation for operation (the same sums in the same order, float throughout), so its
 * published outputs are reproduced; the build turns off FMA contraction for the same reason.
 * One exception: e^x is llama_expf(), not libm's expf, so that another engine can compute it
 * bit for bit (model.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/llama/model.h"

#define LLAMA_HEADER_BYTES (7 * sizeof(int32_t))
#define LLAMA_MAX_DIM 65536

int llama_model_load(const char *path, struct llama_model *ret)
{
	struct llama_config cfg = { 0 };
	struct llama_weights w;
	int32_t hdr[7];
	uint64_t floats;
	struct stat st;
	const float *p;
	void *map;
	int fd, r;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		fprintf(stderr, "kvpaged-llama: %s: %s\n", path, strerror(errno));
		return r;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	if ((size_t)st.st_size < LLAMA_HEADER_BYTES ||
	    pread(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr)) {
		fprintf(stderr, "kvpaged-llama: %s: too short for a checkpoint header\n", path);
		close(fd);
		return -EINVAL;
	}
	for (int i = 0; i < 7; i++) {
		/* A negative vocab says the classifier is stored separately. */
		int32_t v = i == 5 && hdr[i] < 0 ? -hdr[i] : hdr[i];

		if (v <= 0 || v > LLAMA_MAX_DIM) {
			fprintf(stderr, "kvpaged-llama: %s: header field %d is %d\n", path, i,
				hdr[i]);
			close(fd);
			return -EINVAL;
		}
	}
	cfg.dim = (uint32_t)hdr[0];
	cfg.hidden_dim = (uint32_t)hdr[1];
	cfg.n_layers = (uint32_t)hdr[2];
	cfg.n_heads = (uint32_t)hdr[3];
	cfg.n_kv_heads = (uint32_t)hdr[4];
	cfg.shared_classifier = hdr[5] > 0;
	cfg.vocab_size = (uint32_t)(hdr[5] > 0 ? hdr[5] : -hdr[5]);
	cfg.seq_len = (uint32_t)hdr[6];
	if (cfg.dim % cfg.n_heads || cfg.n_heads % cfg.n_kv_heads || (cfg.dim / cfg.n_heads) % 2) {
		fprintf(stderr, "kvpaged-llama: %s: dim %u, %u heads, %u kv heads do not fit\n",
			path, cfg.dim, cfg.n_heads, cfg.n_kv_heads);
		close(fd);
		return -EINVAL;
	}
	cfg.head_size = cfg.dim / cfg.n_heads;
	cfg.kv_dim = cfg.head_size * cfg.n_kv_heads;
	cfg.kv_mul = cfg.n_heads / cfg.n_kv_heads;

	/* Every field is below 2^16, so none of these products overflows 64 bits. */
	const uint64_t D = cfg.dim, H = cfg.hidden_dim, L = cfg.n_layers, KV = cfg.kv_dim;
	const uint64_t V = cfg.vocab_size;
	floats = V * D + L * D + L * D * D + 2 * L * D * KV + L * D * D + L * D + 3 * L * D * H +
		 D + (uint64_t)cfg.seq_len * cfg.head_size + (cfg.shared_classifier ? 0 : V * D);
	if ((uint64_t)st.st_size != LLAMA_HEADER_BYTES + floats * sizeof(float)) {
		fprintf(stderr, "kvpaged-llama: %s: %lld bytes, but its header asks for %llu\n",
			path, (long long)st.st_size,
			(unsigned long long)(LLAMA_HEADER_BYTES + floats * sizeof(float)));
		close(fd);
		return -EINVAL;
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	r = -errno;
	close(fd);
	if (map == MAP_FAILED) {
		fprintf(stderr, "kvpaged-llama: %s: cannot map: %s\n", path, strerror(-r));
		return r;
	}

	p = (const float *)((const char *)map + LLAMA_HEADER_BYTES);
	w.token_embedding = p;
	p += V * D;
	w.rms_att = p;
	p += L * D;
	w.wq = p;
	p += L * D * D;
	w.wk = p;
	p += L * D * KV;
	w.wv = p;
	p += L * D * KV;
	w.wo = p;
	p += L * D * D;
	w.rms_ffn = p;
	p += L * D;
	w.w1 = p;
	p += L * D * H;
	w.w2 = p;
	p += L * H * D;
	w.w3 = p;
	p += L * D * H;
	w.rms_final = p;
	p += D;
	/* freq_cis_real and freq_cis_imag: RoPE is computed instead, as run.c does. */
	p += (uint64_t)cfg.seq_len * cfg.head_size;
	w.wcls = cfg.shared_classifier ? w.token_embedding : p;

	*ret = (struct llama_model){ .cfg = cfg, .w = w, .map = map,
				     .map_bytes = (size_t)st.st_size };
	return 0;
}

void llama_model_unload(struct llama_model *m)
{
	if (m && m->map) {
		munmap(m->map, m->map_bytes);
		m->map = NULL;
	}
}

uint64_t llama_model_fingerprint(const struct llama_model *m)
{
	const unsigned char *p = m->map;
	uint64_t h = 0xcbf29ce484222325ull ^ m->map_bytes;
	size_t i = 0;

	/* FNV-1a over 8-byte words, then a final avalanche; not cryptographic, just distinct. */
	for (; i + 8 <= m->map_bytes; i += 8) {
		uint64_t w;

		memcpy(&w, p + i, 8);
		h = (h ^ w) * 0x100000001b3ull;
	}
	for (; i < m->map_bytes; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	return h;
}

int llama_state_init(struct llama_state *s, const struct llama_config *c)
{
	*s = (struct llama_state){
		.x = calloc(c->dim, sizeof(float)),
		.xb = calloc(c->dim, sizeof(float)),
		.xb2 = calloc(c->dim, sizeof(float)),
		.hb = calloc(c->hidden_dim, sizeof(float)),
		.hb2 = calloc(c->hidden_dim, sizeof(float)),
		.q = calloc(c->dim, sizeof(float)),
		.k = calloc(c->kv_dim, sizeof(float)),
		.v = calloc(c->kv_dim, sizeof(float)),
		.att = calloc((size_t)c->n_heads * c->seq_len, sizeof(float)),
		.received = calloc(c->seq_len, sizeof(float)),
		.logits = calloc(c->vocab_size, sizeof(float)),
		.att_cap = c->seq_len,
	};
	if (!s->x || !s->xb || !s->xb2 || !s->hb || !s->hb2 || !s->q || !s->k || !s->v || !s->att ||
	    !s->received || !s->logits) {
		llama_state_free(s);
		return -ENOMEM;
	}
	return 0;
}

int llama_state_reserve(struct llama_state *s, const struct llama_config *c, uint32_t span)
{
	float *att, *received;

	if (span <= s->att_cap)
		return 0;
	att = calloc((size_t)c->n_heads * span, sizeof(float));
	received = calloc(span, sizeof(float));
	if (!att || !received) {
		free(att);
		free(received);
		return -ENOMEM;
	}
	free(s->att);
	free(s->received);
	s->att = att;
	s->received = received;
	s->att_cap = span;
	return 0;
}

void llama_state_free(struct llama_state *s)
{
	free(s->x);
	free(s->xb);
	free(s->xb2);
	free(s->hb);
	free(s->hb2);
	free(s->q);
	free(s->k);
	free(s->v);
	free(s->att);
	free(s->received);
	free(s->logits);
	*s = (struct llama_state){ 0 };
}

float llama_expf(float x)
{
	/* log2(e); ln 2 = ln2_hi + ln2_lo, 9 significant bits in ln2_hi: k * ln2_hi is exact. */
	const float log2e = 0x1.715476p+0f, ln2_hi = 0x1.63p-1f, ln2_lo = -0x1.bd0106p-13f;
	float k, r, p;

	if (x != x)
		return x;
	if (x < -104.0f)
		return 0.0f;
	if (x > 89.0f)
		return INFINITY;
	k = rintf(x * log2e);
	r = x - k * ln2_hi;
	r = r - k * ln2_lo;
	p = 1.0f / 5040.0f;
	p = p * r + 1.0f / 720.0f;
	p = p * r + 1.0f / 120.0f;
	p = p * r + 1.0f / 24.0f;
	p = p * r + 1.0f / 6.0f;
	p = p * r + 0.5f;
	p = p * r + 1.0f;
	p = p * r + 1.0f;
	return ldexpf(p, (int)k);
}

static void rmsnorm(float *o, const float *x, const float *weight, uint32_t size)
{
	float ss = 0.0f;

	for (uint32_t j = 0; j < size; j++)
		ss += x[j] * x[j];
	ss /= size;
	ss += 1e-5f;
	ss = 1.0f / sqrtf(ss);
	for (uint32_t j = 0; j < size; j++)
		o[j] = weight[j] * (ss * x[j]);
}

static void softmax(float *x, uint32_t size)
{
	float max_val = x[0], sum = 0.0f;

	for (uint32_t i = 1; i < size; i++)
		if (x[i] > max_val)
			max_val = x[i];
	for (uint32_t i = 0; i < size; i++) {
		x[i] = llama_expf(x[i] - max_val);
		sum += x[i];
	}
	for (uint32_t i = 0; i < size; i++)
		x[i] /= sum;
}

/*
 * xout[d] = w[d][n] . x[n].  Each output is one sum in order j = 0..n-1, as in run.c; four
 * rows at a time only overlap independent sums, which hides the add latency without
 * reassociating anything.
 */
static void matmul(float *xout, const float *x, const float *w, uint32_t n, uint32_t d)
{
	uint32_t i = 0;

	for (; i + 4 <= d; i += 4) {
		const float *w0 = w + (size_t)i * n, *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n;
		float v0 = 0.0f, v1 = 0.0f, v2 = 0.0f, v3 = 0.0f;

		for (uint32_t j = 0; j < n; j++) {
			v0 += w0[j] * x[j];
			v1 += w1[j] * x[j];
			v2 += w2[j] * x[j];
			v3 += w3[j] * x[j];
		}
		xout[i] = v0;
		xout[i + 1] = v1;
		xout[i + 2] = v2;
		xout[i + 3] = v3;
	}
	for (; i < d; i++) {
		const float *wi = w + (size_t)i * n;
		float val = 0.0f;

		for (uint32_t j = 0; j < n; j++)
			val += wi[j] * x[j];
		xout[i] = val;
	}
}

/*
 * Multi-head attention for one layer over the positions the mask gives, reading K/V through
 * the cache.  run.c loops heads outside positions; here positions are outside so that a row of
 * K or V is found once for all heads, but every score is the same dot product and every output
 * element accumulates over positions in the same increasing order.  Scores are kept one after
 * another for the attended positions only, so a masked position is never read.
 */
static void attention(const struct llama_config *c, struct llama_state *s,
		      const struct kv_cache *kv, const struct llama_mask *mask, uint32_t layer,
		      uint32_t pos)
{
	const uint32_t hs = c->head_size;
	const float scale = sqrtf((float)hs);
	struct llama_span two[2];
	const struct llama_span *span = mask && mask->spans ? mask->spans : two;
	const uint32_t nspan =
		mask && mask->spans ? mask->nspans : llama_mask_spans(mask, pos, two);
	uint32_t natt = 0, j;
	const float *row;
	size_t stride;

	for (uint32_t r = 0; r < nspan; r++)
		natt += span[r].end - span[r].begin;
	if (natt > s->att_cap)
		abort(); /* the caller did not reserve the scores (llama_state_reserve) */
	natt = 0;
	for (uint32_t r = 0; r < nspan; r++) {
		for (uint32_t t = span[r].begin; t < span[r].end;) {
			uint32_t n = kv->ops->rows(kv, layer, 0, t, span[r].end, &row, &stride);

			for (uint32_t i = 0; i < n; i++, t++, natt++, row += stride) {
				for (uint32_t h = 0; h < c->n_heads; h++) {
					const float *q = s->q + h * hs;
					const float *k = row + (h / c->kv_mul) * hs;
					float score = 0.0f;

					for (uint32_t d = 0; d < hs; d++)
						score += q[d] * k[d];
					score /= scale;
					s->att[(size_t)h * s->att_cap + natt] = score;
				}
			}
		}
	}
	for (uint32_t h = 0; h < c->n_heads; h++)
		softmax(s->att + (size_t)h * s->att_cap, natt);
	if (s->keep_received) {
		/* Over heads first, then layers: the same sums in every cache. */
		for (j = 0; j < natt; j++) {
			float w = 0.0f;

			for (uint32_t h = 0; h < c->n_heads; h++)
				w += s->att[(size_t)h * s->att_cap + j];
			s->received[j] = layer ? s->received[j] + w : w;
		}
	}

	memset(s->xb, 0, c->dim * sizeof(float));
	j = 0;
	for (uint32_t r = 0; r < nspan; r++) {
		for (uint32_t t = span[r].begin; t < span[r].end;) {
			uint32_t n = kv->ops->rows(kv, layer, 1, t, span[r].end, &row, &stride);

			for (uint32_t i = 0; i < n; i++, t++, j++, row += stride) {
				for (uint32_t h = 0; h < c->n_heads; h++) {
					const float *v = row + (h / c->kv_mul) * hs;
					const float a = s->att[(size_t)h * s->att_cap + j];
					float *xb = s->xb + h * hs;

					for (uint32_t d = 0; d < hs; d++)
						xb[d] += a * v[d];
				}
			}
		}
	}
}

const float *llama_forward(const struct llama_model *m, struct llama_state *s,
			   struct kv_cache *kv, const struct llama_mask *mask, uint32_t token,
			   uint32_t pos)
{
	const struct llama_config *c = &m->cfg;
	const struct llama_weights *w = &m->w;
	const uint32_t dim = c->dim, kv_dim = c->kv_dim, hidden = c->hidden_dim;

	memcpy(s->x, w->token_embedding + (size_t)token * dim, dim * sizeof(float));

	for (uint32_t l = 0; l < c->n_layers; l++) {
		rmsnorm(s->xb, s->x, w->rms_att + (size_t)l * dim, dim);
		matmul(s->q, s->xb, w->wq + (size_t)l * dim * dim, dim, dim);
		matmul(s->k, s->xb, w->wk + (size_t)l * dim * kv_dim, dim, kv_dim);
		matmul(s->v, s->xb, w->wv + (size_t)l * dim * kv_dim, dim, kv_dim);

		/* RoPE, theta 10000, rotating pairs within each head. */
		for (uint32_t i = 0; i < dim; i += 2) {
			uint32_t head_dim = i % c->head_size;
			float freq = 1.0f / powf(10000.0f, (float)head_dim / (float)c->head_size);
			float val = (float)pos * freq;
			float fcr = cosf(val), fci = sinf(val);
			int rotn = i < kv_dim ? 2 : 1; /* q always, k only within kv_dim */

			for (int r = 0; r < rotn; r++) {
				float *vec = r == 0 ? s->q : s->k;
				float v0 = vec[i], v1 = vec[i + 1];

				vec[i] = v0 * fcr - v1 * fci;
				vec[i + 1] = v0 * fci + v1 * fcr;
			}
		}
		kv->ops->store(kv, l, pos, s->k, s->v);

		attention(c, s, kv, mask, l, pos);

		matmul(s->xb2, s->xb, w->wo + (size_t)l * dim * dim, dim, dim);
		for (uint32_t i = 0; i < dim; i++)
			s->x[i] += s->xb2[i];

		rmsnorm(s->xb, s->x, w->rms_ffn + (size_t)l * dim, dim);
		matmul(s->hb, s->xb, w->w1 + (size_t)l * dim * hidden, dim, hidden);
		matmul(s->hb2, s->xb, w->w3 + (size_t)l * dim * hidden, dim, hidden);
		for (uint32_t i = 0; i < hidden; i++) {
			float val = s->hb[i];

			/* SwiGLU: silu(w1 x) * (w3 x) */
			val *= (1.0f / (1.0f + llama_expf(-val)));
			val *= s->hb2[i];
			s->hb[i] = val;
		}
		matmul(s->xb, s->hb, w->w2 + (size_t)l * dim * hidden, hidden, dim);
		for (uint32_t i = 0; i < dim; i++)
			s->x[i] += s->xb[i];
	}

	rmsnorm(s->x, s->x, w->rms_final, dim);
	matmul(s->logits, s->x, w->wcls, dim, c->vocab_size);
	return s->logits;
}

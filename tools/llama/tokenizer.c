/* SPDX-License-Identifier: MIT */
/* kvpaged-llama: loading, encoding and decoding with a llama2.c tokenizer file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/llama/tokenizer.h"

#define TOKENIZER_MAX_PIECE 4096 /* no real vocabulary comes close; a bound for bad files */
#define BYTE_TOKEN_BASE 3        /* <0x00> follows <unk>, <s> and </s> */

/* qsort has no context argument; the vocabulary being sorted is kept here meanwhile. */
static char **sort_vocab;

static int cmp_ids(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	int r = strcmp(sort_vocab[x], sort_vocab[y]);

	/* Equal strings keep id order, so a lookup finds the lowest id. */
	return r ? r : (x > y) - (x < y);
}

void tokenizer_free(struct tokenizer *t)
{
	if (!t)
		return;
	if (t->vocab)
		for (uint32_t i = 0; i < t->vocab_size; i++)
			free(t->vocab[i]);
	free(t->vocab);
	free(t->scores);
	free(t->sorted);
	free(t->merge_buf);
	*t = (struct tokenizer){ 0 };
}

int tokenizer_load(const char *path, uint32_t vocab_size, struct tokenizer *ret)
{
	struct tokenizer t = { .vocab_size = vocab_size };
	uint32_t longest = 0;
	int32_t max_len;
	FILE *f;
	int r = -EINVAL;

	f = fopen(path, "rbe");
	if (!f) {
		r = -errno;
		fprintf(stderr, "kvpaged-llama: %s: %s\n", path, strerror(errno));
		return r;
	}
	t.vocab = calloc(vocab_size, sizeof(*t.vocab));
	t.scores = calloc(vocab_size, sizeof(*t.scores));
	t.sorted = calloc(vocab_size, sizeof(*t.sorted));
	if (!t.vocab || !t.scores || !t.sorted) {
		r = -ENOMEM;
		goto fail;
	}
	if (fread(&max_len, sizeof(max_len), 1, f) != 1 || max_len <= 0 ||
	    max_len > TOKENIZER_MAX_PIECE) {
		fprintf(stderr, "kvpaged-llama: %s: bad header\n", path);
		goto fail;
	}
	t.max_token_length = (uint32_t)max_len;
	for (uint32_t i = 0; i < vocab_size; i++) {
		int32_t len;

		if (fread(&t.scores[i], sizeof(float), 1, f) != 1 ||
		    fread(&len, sizeof(len), 1, f) != 1 || len < 0 || len > TOKENIZER_MAX_PIECE) {
			fprintf(stderr, "kvpaged-llama: %s: token %u: truncated or bad length\n",
				path, i);
			goto fail;
		}
		t.vocab[i] = malloc((size_t)len + 1);
		if (!t.vocab[i]) {
			r = -ENOMEM;
			goto fail;
		}
		if (fread(t.vocab[i], 1, (size_t)len, f) != (size_t)len) {
			fprintf(stderr, "kvpaged-llama: %s: token %u: truncated\n", path, i);
			goto fail;
		}
		t.vocab[i][len] = '\0';
		if ((uint32_t)len > longest)
			longest = (uint32_t)len;
		t.sorted[i] = i;
	}
	if (fgetc(f) != EOF) {
		fprintf(stderr, "kvpaged-llama: %s: more than the model's %u tokens\n", path,
			vocab_size);
		goto fail;
	}
	t.merge_buf = malloc(2 * (size_t)longest + 1);
	if (!t.merge_buf) {
		r = -ENOMEM;
		goto fail;
	}
	sort_vocab = t.vocab;
	qsort(t.sorted, vocab_size, sizeof(*t.sorted), cmp_ids);
	sort_vocab = NULL;
	for (unsigned b = 0; b < 256; b++)
		t.bytes[b] = (unsigned char)b;
	fclose(f);
	*ret = t;
	return 0;
fail:
	fclose(f);
	tokenizer_free(&t);
	return r;
}

/* The lowest id whose string is s, or -1. */
static int lookup(const struct tokenizer *t, const char *s)
{
	uint32_t lo = 0, hi = t->vocab_size;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (strcmp(t->vocab[t->sorted[mid]], s) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < t->vocab_size && strcmp(t->vocab[t->sorted[lo]], s) == 0 ? (int)t->sorted[lo]
										 : -1;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, int bos, uint32_t *tokens)
{
	char chr[5];
	size_t chr_len = 0;
	int n = 0;

	if (bos)
		tokens[n++] = TOKEN_BOS;
	/* SentencePiece's add_dummy_prefix: the text is read as if it started with a space. */
	if (text[0] != '\0') {
		int space = lookup(t, " ");

		if (space >= 0)
			tokens[n++] = (uint32_t)space;
	}

	/* One token per UTF-8 character when the vocabulary has it, else one per byte. */
	for (const char *c = text; *c; c++) {
		if ((*c & 0xC0) != 0x80)
			chr_len = 0;
		chr[chr_len++] = *c;
		chr[chr_len] = '\0';
		if ((c[1] & 0xC0) == 0x80 && chr_len < 4)
			continue;
		int id = lookup(t, chr);

		if (id >= 0) {
			tokens[n++] = (uint32_t)id;
		} else {
			for (size_t i = 0; i < chr_len; i++)
				tokens[n++] = (unsigned char)chr[i] + BYTE_TOKEN_BASE;
		}
		chr_len = 0;
	}

	/* Merge the best-scoring adjacent pair (the first on ties) until no pair merges. */
	for (;;) {
		float best_score = -1e10f;
		int best_id = -1, best_idx = -1;

		for (int i = 0; i + 1 < n; i++) {
			int id;

			strcpy(t->merge_buf, t->vocab[tokens[i]]);
			strcat(t->merge_buf, t->vocab[tokens[i + 1]]);
			id = lookup(t, t->merge_buf);
			if (id >= 0 && t->scores[id] > best_score) {
				best_score = t->scores[id];
				best_id = id;
				best_idx = i;
			}
		}
		if (best_idx < 0)
			break;
		tokens[best_idx] = (uint32_t)best_id;
		memmove(tokens + best_idx + 1, tokens + best_idx + 2,
			(size_t)(n - best_idx - 2) * sizeof(*tokens));
		n--;
	}
	return n;
}

const char *tokenizer_decode(const struct tokenizer *t, uint32_t prev, uint32_t token,
			     size_t *ret_len)
{
	const char *piece = token < t->vocab_size ? t->vocab[token] : "";
	unsigned byte;
	char end;

	/* SentencePiece drops the dummy prefix's space after BOS. */
	if (prev == TOKEN_BOS && piece[0] == ' ')
		piece++;
	if (sscanf(piece, "<0x%02X>%c", &byte, &end) == 1 && strlen(piece) == 6) {
		*ret_len = 1;
		return (const char *)&t->bytes[byte];
	}
	*ret_len = strlen(piece);
	return piece;
}

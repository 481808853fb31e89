/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-llama: the llama2.c tokenizer (a SentencePiece BPE vocabulary with scores).  Encoding
 * looks up each UTF-8 character, falls back to byte tokens (byte + 3) and then merges the
 * adjacent pair with the best score until none is in the vocabulary.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define TOKEN_BOS 1
#define TOKEN_EOS 2

struct tokenizer {
	char **vocab;
	float *scores;
	uint32_t *sorted; /* token ids ordered by their strings, for lookups */
	uint32_t vocab_size;
	uint32_t max_token_length;
	char *merge_buf;        /* two tokens' strings side by side */
	unsigned char bytes[256]; /* what byte tokens decode to */
};

/* Reads a llama2.c tokenizer file of vocab_size tokens.  Returns 0 or -errno. */
int tokenizer_load(const char *path, uint32_t vocab_size, struct tokenizer *ret);
void tokenizer_free(struct tokenizer *t);

/*
 * Encodes text (NUL-terminated): BOS first when bos, then a leading-space token when text is
 * not empty, as llama2.c does.  tokens must hold strlen(text) + 2 entries.  Returns the count.
 */
int tokenizer_encode(const struct tokenizer *t, const char *text, int bos, uint32_t *tokens);

/*
 * The bytes token stands for, following prev: the space after BOS is dropped and byte tokens
 * give their byte.  Sets *ret_len; the result is owned by the tokenizer.
 */
const char *tokenizer_decode(const struct tokenizer *t, uint32_t prev, uint32_t token,
			     size_t *ret_len);

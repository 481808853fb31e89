/* SPDX-License-Identifier: MIT */
/* kvpaged-llama: what generation and perplexity both print or write. */
#include <errno.h>
#include <string.h>

#include "tools/llama/engine.h"

void json_string(FILE *f, const char *s, size_t len)
{
	fputc('"', f);
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)s[i];

		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch == '\n')
			fputs("\\n", f);
		else if (ch < 0x20 || ch == 0x7f)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

int dump_open(const char *path, uint32_t i, uint32_t n, FILE **ret)
{
	char name[4096];

	if (!path)
		return 0;
	if (n == 1)
		snprintf(name, sizeof(name), "%s", path);
	else
		snprintf(name, sizeof(name), "%s.%u", path, i);
	*ret = fopen(name, "wbe");
	if (!*ret) {
		int r = -errno;

		fprintf(stderr, "kvpaged-llama: %s: %s\n", name, strerror(errno));
		return r;
	}
	return 0;
}

int dump_logits(FILE *f, const float *logits, uint32_t n)
{
	if (f && fwrite(logits, sizeof(float), n, f) != n) {
		fprintf(stderr, "kvpaged-llama: writing logits: %s\n", strerror(errno));
		return -EIO;
	}
	return 0;
}

/* The mask, and what the daemon held, as keys of a JSON summary (each followed by a comma). */
void print_mask_json(const struct engine *e)
{
	if (e->h2o) {
		printf("\"h2o_budget\":%u,\"h2o_recent\":%u,\"h2o_sinks\":%u,\"h2o_decay\":%g,"
		       "\"h2o_granularity\":\"%s\",\"block_tokens\":%u,\"evicted_tokens\":%llu,"
		       "\"compactions\":%llu,",
		       e->h2o_cfg.budget, e->h2o_cfg.recent, e->h2o_cfg.n_sink, (double)e->h2o_cfg.decay,
		       e->h2o_cfg.tokens ? "tokens" : "blocks", e->h2o_cfg.block_tokens,
		       (unsigned long long)e->h2o_evicted, (unsigned long long)e->h2o_compactions);
		if (e->client)
			printf("\"max_held_blocks\":%u,", e->max_held);
		return;
	}
	if (!engine_bounded(e))
		return;
	printf("\"sinks\":%u,\"window\":%u,", e->mask.n_sink, e->mask.window);
	if (e->client)
		printf("\"pool_window\":%s,\"max_held_blocks\":%u,",
		       e->pool_window ? "true" : "false", e->max_held);
}

void print_mask_text(const struct engine *e)
{
	if (e->h2o) {
		printf("; h2o (%s) keeping %u tokens, the last %u and the heaviest hitters, decay "
		       "%g: %llu evicted", e->h2o_cfg.tokens ? "tokens" : "blocks",
		       e->h2o_cfg.budget, e->h2o_cfg.recent, (double)e->h2o_cfg.decay,
		       (unsigned long long)e->h2o_evicted);
		if (e->client)
			printf(", at most %u blocks held", e->max_held);
		return;
	}
	if (!engine_bounded(e))
		return;
	printf("; attending to %u sinks and a window of %u", e->mask.n_sink, e->mask.window);
	if (e->client)
		printf(" (%s), at most %u blocks held", e->pool_window ? "the pool's window"
								      : "sinks retention",
		       e->max_held);
}

double rate(uint64_t n, uint64_t ns)
{
	return ns ? (double)n * 1e9 / (double)ns : 0.0;
}

/* SPDX-License-Identifier: MIT */
/* kvpaged-llama: perplexity over a file of stories, as the model's README measures it. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tools/llama/engine.h"

#define STORY_SEPARATOR "<|endoftext|>"

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rbe");
	char *buf = NULL;
	size_t len = 0, cap = 0, got;

	if (!f) {
		fprintf(stderr, "kvpaged-llama: %s: %s\n", path, strerror(errno));
		return NULL;
	}
	do {
		if (len + 4096 + 1 > cap) {
			cap = (len + 4096 + 1) * 2;
			buf = realloc(buf, cap);
			if (!buf)
				abort();
		}
		got = fread(buf + len, 1, 4096, f);
		len += got;
	} while (got > 0);
	if (ferror(f)) {
		fprintf(stderr, "kvpaged-llama: %s: read error\n", path);
		free(buf);
		buf = NULL;
	} else {
		buf[len] = '\0';
	}
	fclose(f);
	return buf;
}

/* -log softmax(logits)[target], in double so that 1,804 terms add up without drift. */
static double nll(const float *logits, uint32_t n, uint32_t target)
{
	double max_val = logits[0], sum = 0.0;

	for (uint32_t i = 1; i < n; i++)
		if (logits[i] > max_val)
			max_val = logits[i];
	for (uint32_t i = 0; i < n; i++)
		sum += exp((double)logits[i] - max_val);
	return log(sum) + max_val - (double)logits[target];
}

/* What scoring found, over every story. */
struct score {
	double total; /* sum of -log p(next token) */
	uint64_t reused, checked;
	uint32_t sequence; /* the one being scored, from 1 */
};

/* Counts a scored paged sequence's reuse, and fails if a cached K/V row was not ours. */
static int score_check(struct engine *e, const struct seq *s, uint32_t cached,
		       struct score *sc)
{
	if (!e->client)
		return 0;
	if (s->paged.mismatched) {
		fprintf(stderr, "kvpaged-llama: sequence %u: %llu of %llu cached K/V rows differ "
				"from ours\n", sc->sequence,
			(unsigned long long)s->paged.mismatched,
			(unsigned long long)s->paged.compared);
		return -EBADMSG;
	}
	sc->reused += cached;
	sc->checked += s->paged.compared;
	return 0;
}

/*
 * Scores tokens[0..n).  Opened whole (steps false), as the README's procedure does for each
 * story: with the pool, its cached prefix is recomputed all the same (its logits are needed),
 * but its K/V is compared bitwise with the pool's instead of written, so a second run proves
 * that the blocks the first one committed hold exactly what this process computes.  Run a
 * token at a time (steps), as a generation is: opened with the first, then each step commits
 * what has been run and appends the next, so a bounded sequence's commits release what no
 * later token attends to and the pool holds a bounded number of its blocks however long it
 * gets.
 */
static int score_run(struct engine *e, const uint32_t *tokens, uint32_t n, bool steps,
		     FILE *dump, struct score *sc)
{
	const struct llama_config *cfg = &e->model.cfg;
	const float *logits;
	struct seq s = { 0 };
	uint32_t cached;
	int r;

	/* Flags 0: every cached block counts, since all of it is recomputed. */
	r = seq_open(e, &s, tokens, steps ? 1 : n, 0, &cached);
	for (uint32_t pos = 0; r == 0 && pos + 1 < n; pos++) {
		if (steps && pos > 0)
			r = seq_step(e, &s, pos, tokens[pos], pos);
		if (r == 0)
			r = seq_forward(e, &s, tokens[pos], pos, &logits);
		if (r == 0) {
			sc->total += nll(logits, cfg->vocab_size, tokens[pos + 1]);
			r = dump_logits(dump, logits, cfg->vocab_size);
		}
	}
	/* The last token was never run: only the ones before it hold K/V. */
	if (r == 0)
		r = seq_commit(e, &s, n - 1);
	if (r == 0)
		r = score_check(e, &s, cached, sc);
	if (s.kv)
		seq_close(e, &s);
	return r;
}

/*
 * The README's procedure: the file is split into stories on <|endoftext|>, each stripped of
 * the white space around it (empty ones skipped) and encoded as BOS plus the text with the
 * leading-space prefix; every token after BOS is predicted from those before it.  A story is
 * opened whole, or with bounded attention run a token at a time.
 *
 * --stream scores the file as one sequence instead: BOS, then every story's tokens (each with
 * its leading space, no BOS between them), run a token at a time past the model's context.
 * The same tokens are predicted.
 */
int engine_perplexity(struct engine *e, const struct perplexity_options *o)
{
	const struct llama_config *cfg = &e->model.cfg;
	const uint32_t context = o->stream ? LLAMA_MAX_POSITIONS : cfg->seq_len;
	uint64_t predicted = 0, t_start, t_end;
	uint32_t *tokens = NULL, stories = 0, len = 0;
	const bool steps = engine_retains(e);
	struct score sc = { 0 };
	FILE *dump = NULL;
	char *text, *p;
	int r = 0;

	text = read_file(o->path);
	if (!text)
		return -EIO;
	/* Each story's encoding takes at most its length + 2 entries, and a story is >= 1 byte. */
	tokens = malloc((strlen(text) * 3 + 3) * sizeof(*tokens));
	if (!tokens) {
		free(text);
		return -ENOMEM;
	}
	r = dump_open(o->dump_logits, 0, 1, &dump);
	if (r < 0)
		goto out;
	e->defer = e->rings && !e->no_defer;
	e->max_held = 0;
	e->h2o_evicted = e->h2o_compactions = 0;

	t_start = now_ns();
	if (o->stream)
		tokens[len++] = TOKEN_BOS;
	for (p = text; p;) {
		char *sep = strstr(p, STORY_SEPARATOR), *end = sep ? sep : p + strlen(p);
		uint32_t n;

		while (p < end && isspace((unsigned char)*p))
			p++;
		while (end > p && isspace((unsigned char)end[-1]))
			end--;
		if (end > p) {
			*end = '\0';
			n = (uint32_t)tokenizer_encode(&e->tok, p, !o->stream, tokens + len);
			if (len + n > context) {
				fprintf(stderr, "kvpaged-llama: %s %u tokens; the model takes %u\n",
					o->stream ? "the stream reaches" : "a story is",
					len + n, context);
				r = -E2BIG;
				goto out;
			}
			stories++;
			sc.sequence = stories;
			if (o->stream) {
				len += n;
			} else {
				e->max_tokens = steps ? n : cfg->seq_len;
				r = score_run(e, tokens, n, steps, dump, &sc);
				if (r < 0)
					goto out;
				predicted += n - 1;
			}
		}
		p = sep ? sep + strlen(STORY_SEPARATOR) : NULL;
	}
	if (o->stream && len > 1) {
		e->max_tokens = len;
		sc.sequence = 1;
		r = score_run(e, tokens, len, true, dump, &sc);
		if (r < 0)
			goto out;
		predicted = len - 1;
	}
	t_end = now_ns();
	if (predicted == 0) {
		fprintf(stderr, "kvpaged-llama: %s: no text to score\n", o->path);
		r = -EINVAL;
		goto out;
	}

	const double per_token = sc.total / (double)predicted;
	const char *mode = e->client ? "paged" : "contiguous";

	if (o->json) {
		printf("{\"mode\":\"%s\",\"nats_per_token\":%.6f,\"perplexity\":%.6f,"
		       "\"tokens\":%llu,\"stories\":%u,\"stream\":%s,\"reused\":%llu,"
		       "\"checked_rows\":%llu,",
		       mode, per_token, exp(per_token), (unsigned long long)predicted, stories,
		       o->stream ? "true" : "false", (unsigned long long)sc.reused,
		       (unsigned long long)sc.checked);
		print_mask_json(e);
		printf("\"tok_s\":%.1f}\n", rate(predicted, t_end - t_start));
	} else {
		printf("[%s] %.6f nats/token (perplexity %.4f) over %llu tokens in %u stories%s; "
		       "reused %llu (cached; %llu K/V rows equal to the pool's); %.1f tok/s",
		       mode, per_token, exp(per_token), (unsigned long long)predicted, stories,
		       o->stream ? " streamed as one sequence" : "", (unsigned long long)sc.reused,
		       (unsigned long long)sc.checked, rate(predicted, t_end - t_start));
		print_mask_text(e);
		putchar('\n');
	}
out:
	if (dump && fclose(dump) != 0 && r == 0) {
		fprintf(stderr, "kvpaged-llama: writing logits: %s\n", strerror(errno));
		r = -EIO;
	}
	free(tokens);
	free(text);
	return r;
}

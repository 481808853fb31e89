/* SPDX-License-Identifier: MIT */
/* kvpaged-llama: generation, a prompt and its continuations (--forks), sampled token by token. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tools/llama/engine.h"

/* Text that grows; allocation failure aborts (the engine cannot go on without its output). */
struct text {
	char *s;
	size_t len, cap;
};

static void text_add(struct text *t, const char *s, size_t n)
{
	if (t->len + n + 1 > t->cap) {
		t->cap = (t->len + n + 1) * 2;
		t->s = realloc(t->s, t->cap);
		if (!t->s)
			abort();
	}
	memcpy(t->s + t->len, s, n);
	t->len += n;
	t->s[t->len] = '\0';
}

/* Appends a token's text, dropping lone bytes that are neither printable nor space. */
static void text_add_token(struct text *t, const struct tokenizer *tok, uint32_t prev,
			   uint32_t token)
{
	size_t n;
	const char *piece = tokenizer_decode(tok, prev, token, &n);

	if (n == 1 && !isprint((unsigned char)piece[0]) && !isspace((unsigned char)piece[0]))
		return;
	text_add(t, piece, n);
}

/* xorshift64*: a small generator whose stream depends only on the seed. */
static uint32_t rng_u32(uint64_t *state)
{
	*state ^= *state >> 12;
	*state ^= *state << 25;
	*state ^= *state >> 27;
	return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

static uint64_t rng_seed(uint64_t seed)
{
	/* splitmix64 of the seed: any seed, 0 included, gives a non-zero state. */
	uint64_t z = seed + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return z ? z : 1;
}

static uint32_t sample(const float *logits, float *probs, uint32_t n, float temperature,
		       uint64_t *rng)
{
	uint32_t best = 0;
	float coin, cdf = 0.0f, max_val, sum = 0.0f;

	if (temperature == 0.0f) {
		for (uint32_t i = 1; i < n; i++)
			if (logits[i] > logits[best])
				best = i;
		return best;
	}
	max_val = logits[0] / temperature;
	for (uint32_t i = 0; i < n; i++) {
		probs[i] = logits[i] / temperature;
		if (probs[i] > max_val)
			max_val = probs[i];
	}
	for (uint32_t i = 0; i < n; i++) {
		probs[i] = llama_expf(probs[i] - max_val);
		sum += probs[i];
	}
	coin = (float)(rng_u32(rng) >> 8) / 16777216.0f;
	for (uint32_t i = 0; i < n; i++) {
		cdf += probs[i] / sum;
		if (coin < cdf)
			return i;
	}
	return n - 1;
}

struct continuation {
	struct seq seq;
	float *logits;
	uint64_t rng;
	struct text text;
	uint32_t ntokens; /* tokens in the sequence; K/V is written for every one */
	uint32_t uncommitted; /* the count to commit with the next step (0: none) */
	uint32_t prev;
	uint32_t generated;
	bool done;
	FILE *dump;
};

#define PARK_WAIT_TIMEOUT_MS 60000
#define PARK_POLL_MS 10

/* Waits for path to exist, polling: the go-ahead is a file a test or a script creates. */
static int wait_for_file(const char *path)
{
	const struct timespec poll = { .tv_nsec = PARK_POLL_MS * 1000000L };

	for (uint32_t waited = 0;; waited += PARK_POLL_MS) {
		if (access(path, F_OK) == 0)
			return 0;
		if (errno != ENOENT) {
			int r = -errno;

			fprintf(stderr, "kvpaged-llama: --park-wait: %s: %s\n", path, strerror(errno));
			return r;
		}
		if (waited >= PARK_WAIT_TIMEOUT_MS) {
			fprintf(stderr, "kvpaged-llama: --park-wait: %s did not appear within %d s\n",
				path, PARK_WAIT_TIMEOUT_MS / 1000);
			return -ETIMEDOUT;
		}
		nanosleep(&poll, NULL);
	}
}

/*
 * --park-at: parks the sequence with every token committed, says so on stdout (whoever waits
 * for the line may now make the daemon preempt it), waits for the go-ahead and resumes.  The
 * tokens whose K/V did not come back are run again from the history into the new table; the
 * last of them is the token whose logits the next step samples from, so they must come out
 * bitwise as they were before the park.  Returns 0 or -errno.
 */
static int park_and_resume(struct engine *e, const struct generate_options *o,
			   struct continuation *c, const uint32_t *history,
			   uint32_t *ret_recompute, uint64_t *ret_resume_ns)
{
	const struct llama_config *cfg = &e->model.cfg;
	const float *logits = NULL;
	uint32_t recompute;
	uint64_t t_go;
	int r;

	/*
	 * Only committed full blocks go down the tiers on a swap, or stay findable after a drop;
	 * the partial last block is recomputed either way.
	 */
	if (c->uncommitted) {
		r = seq_commit(e, &c->seq, c->uncommitted);
		if (r < 0)
			return r;
		c->uncommitted = 0;
	}
	r = seq_park(e, &c->seq);
	if (r < 0)
		return r;
	printf("parked: %u tokens, %u generated\n", c->ntokens, c->generated);
	if (fflush(stdout) != 0) {
		fprintf(stderr, "kvpaged-llama: writing output: %s\n", strerror(errno));
		return -EIO;
	}
	if (o->park_wait) {
		r = wait_for_file(o->park_wait);
		if (r < 0)
			return r;
	}
	t_go = now_ns();
	r = seq_resume(e, &c->seq, c->ntokens, &recompute);
	if (r < 0)
		return r;
	for (uint32_t pos = c->ntokens - recompute; pos < c->ntokens; pos++) {
		r = seq_forward(e, &c->seq, history[pos], pos, &logits);
		if (r < 0)
			return r;
	}
	if (logits && memcmp(logits, c->logits, cfg->vocab_size * sizeof(float)) != 0) {
		fprintf(stderr, "kvpaged-llama: resume: the last token's logits, recomputed over "
				"the blocks that came back, differ from before the park\n");
		return -EBADMSG;
	}
	if (recompute) {
		r = seq_commit(e, &c->seq, c->ntokens);
		if (r < 0)
			return r;
	}
	*ret_resume_ns = now_ns() - t_go;
	printf("resumed: %u of %u tokens recomputed\n", recompute, c->ntokens);
	*ret_recompute = recompute;
	return 0;
}

int engine_generate(struct engine *e, const struct generate_options *o,
		    struct generate_result *ret)
{
	const struct llama_config *cfg = &e->model.cfg;
	struct continuation *conts = NULL;
	uint32_t *tokens = NULL, *history = NULL, n, cached = 0, steps = o->steps, forwards = 0;
	uint64_t t_start, t_prefilled, t_first = 0, t_end, t_parked = 0, resume_ns = 0;
	uint32_t recompute = 0;
	bool parked = false;
	const float *logits = NULL;
	float *probs = NULL;
	int r;

	tokens = malloc((strlen(o->prompt) + 2) * sizeof(*tokens));
	conts = calloc(o->forks, sizeof(*conts));
	probs = malloc(cfg->vocab_size * sizeof(*probs));
	if (!tokens || !conts || !probs) {
		r = -ENOMEM;
		goto out;
	}
	n = (uint32_t)tokenizer_encode(&e->tok, o->prompt, 1, tokens);
	/*
	 * Bounded attention runs past the model's context: positions keep growing, and each
	 * token attends to its sinks and window only.
	 */
	const uint32_t context = engine_retains(e) ? LLAMA_MAX_POSITIONS : cfg->seq_len;

	if (n > context) {
		fprintf(stderr, "kvpaged-llama: the prompt is %u tokens; the model takes %u\n", n,
			context);
		r = -E2BIG;
		goto out;
	}
	/* Generated token i sits at position n + i and is run only if another one follows. */
	if (steps > context - n + 1)
		steps = context - n + 1;
	e->max_tokens = engine_retains(e) ? n + steps : cfg->seq_len;
	if (o->park) {
		if (o->forks != 1 || !e->client) {
			fprintf(stderr, "kvpaged-llama: --park-at parks one paged sequence\n");
			r = -EINVAL;
			goto out;
		}
		/* The tokens to run again on resume: the prompt's, then every one run after it. */
		history = malloc((size_t)(n + steps) * sizeof(*history));
		if (!history) {
			r = -ENOMEM;
			goto out;
		}
		memcpy(history, tokens, (size_t)n * sizeof(*history));
	}

	/* Forks share their last block until copy-on-write: their steps always wait. */
	e->defer = e->rings && !e->no_defer && o->forks == 1;
	e->max_held = 0;
	e->h2o_evicted = e->h2o_compactions = 0;
	t_start = now_ns();
	/* H2O opens with BOS alone and runs the prompt a step at a time, reporting as it goes. */
	r = seq_open(e, &conts[0].seq, tokens, e->h2o ? 1 : n, KVP_OPEN_RECOMPUTE_LAST, &cached);
	if (r < 0)
		goto out;
	if (cached >= n) {
		fprintf(stderr, "kvpaged-llama: the daemon says all %u prompt tokens are cached, "
				"though the last one was to be left to recompute\n", n);
		r = -EPROTO;
		goto out;
	}
	/* The cached prefix's K/V is in the pool already: start right after it. */
	for (uint32_t pos = cached; pos < n; pos++) {
		if (e->h2o && pos > 0) {
			r = seq_step(e, &conts[0].seq, pos, tokens[pos], pos);
			if (r < 0)
				goto out;
		}
		r = seq_forward(e, &conts[0].seq, tokens[pos], pos, &logits);
		if (r < 0)
			goto out;
	}
	r = seq_commit(e, &conts[0].seq, n);
	/* The commit released what no later token attends to: see which blocks are left. */
	if (r == 0 && engine_bounded(e))
		r = seq_refresh(e, &conts[0].seq, n);
	if (r < 0)
		goto out;
	t_prefilled = now_ns();

	for (uint32_t i = 0; i < o->forks; i++) {
		struct continuation *c = &conts[i];

		if (i > 0) {
			r = seq_fork(e, &conts[0].seq, n, &c->seq);
			if (r < 0)
				goto out;
		}
		c->logits = malloc(cfg->vocab_size * sizeof(float));
		if (!c->logits) {
			r = -ENOMEM;
			goto out;
		}
		memcpy(c->logits, logits, cfg->vocab_size * sizeof(float));
		c->rng = rng_seed(o->seed + i);
		c->ntokens = n;
		c->prev = tokens[n - 1];
		text_add(&c->text, "", 0);
		for (uint32_t p = 1; p < n; p++)
			text_add_token(&c->text, &e->tok, tokens[p - 1], tokens[p]);
		r = dump_open(o->dump_logits, i, o->forks, &c->dump);
		if (r < 0)
			goto out;
	}

	/* Round robin, so that the forks' first writes into the shared last block interleave. */
	for (uint32_t step = 0; step < steps; step++) {
		for (uint32_t i = 0; i < o->forks; i++) {
			struct continuation *c = &conts[i];
			uint32_t next;

			if (c->done)
				continue;
			/* Every generated token so far has been run: its K/V is in the pool. */
			if (o->park && !parked && c->generated == o->park_at) {
				uint64_t t_park = now_ns();

				r = park_and_resume(e, o, c, history, &recompute, &resume_ns);
				if (r < 0)
					goto out;
				parked = true;
				t_parked = now_ns() - t_park;
			}
			r = dump_logits(c->dump, c->logits, cfg->vocab_size);
			if (r < 0)
				goto out;
			next = sample(c->logits, probs, cfg->vocab_size, o->temperature, &c->rng);
			if (!t_first)
				t_first = now_ns();
			/* BOS starts the next story: this one is over (as in llama2.c). */
			if (next == TOKEN_BOS) {
				c->done = true;
				continue;
			}
			text_add_token(&c->text, &e->tok, c->prev, next);
			c->prev = next;
			c->generated++;
			if (step + 1 == steps)
				continue;
			/* The last token's K/V is written: commit it as this one gets a slot. */
			r = seq_step(e, &c->seq, c->uncommitted, next, c->ntokens);
			if (r < 0)
				goto out;
			if (history)
				history[c->ntokens] = next;
			r = seq_forward(e, &c->seq, next, c->ntokens, &logits);
			if (r < 0)
				goto out;
			c->ntokens++;
			c->uncommitted = c->ntokens;
			forwards++;
			memcpy(c->logits, logits, cfg->vocab_size * sizeof(float));
		}
	}
	for (uint32_t i = 0; i < o->forks; i++) {
		if (conts[i].uncommitted) {
			r = seq_commit(e, &conts[i].seq, conts[i].uncommitted);
			if (r < 0)
				goto out;
		}
	}
	t_end = now_ns();

	uint64_t generated = 0;
	for (uint32_t i = 0; i < o->forks; i++)
		generated += conts[i].generated;
	const double prefill_rate = rate(n - cached, t_prefilled - t_start);
	/* A park's wait and recompute are not decoding. */
	const double decode_rate = rate(forwards, t_end - t_prefilled - t_parked);
	/* Nor is a park before the first token (--park-at 0) part of the time to it. */
	const double ttft_ms =
		(double)((t_first ? t_first : t_end) - t_start - (o->park_at ? 0 : t_parked)) / 1e6;
	const char *mode = e->client ? "paged" : "contiguous";

	if (ret)
		*ret = (struct generate_result){
			.prompt_tokens = n,
			.cached = cached,
			.forwards = forwards,
			.prefill_tok_s = prefill_rate,
			.decode_tok_s = decode_rate,
			.ttft_ms = ttft_ms,
		};
	for (uint32_t i = 0; i < o->forks && !o->quiet; i++) {
		if (o->forks > 1)
			printf("--- continuation %u/%u ---\n", i + 1, o->forks);
		printf("%s\n", conts[i].text.s);
	}
	if (o->json && !o->quiet) {
		printf("{\"mode\":\"%s\",\"prompt_tokens\":%u,\"prefilled\":%u,\"reused\":%u,"
		       "\"generated\":%llu,\"continuations\":%u,\"decode_forwards\":%u,"
		       "\"prefill_tok_s\":%.1f,\"decode_tok_s\":%.1f,\"ttft_ms\":%.3f,"
		       "\"replaced_blocks\":%llu,",
		       mode, n, n - cached, cached, (unsigned long long)generated, o->forks,
		       forwards, prefill_rate, decode_rate, ttft_ms,
		       (unsigned long long)e->replaced);
		if (o->park)
			printf("\"parked\":%s,\"resumed_recompute\":%u,\"resume_ms\":%.3f,",
			       parked ? "true" : "false", recompute, (double)resume_ns / 1e6);
		print_mask_json(e);
		printf("\"texts\":[");
		for (uint32_t i = 0; i < o->forks; i++) {
			if (i)
				putchar(',');
			json_string(stdout, conts[i].text.s, conts[i].text.len);
		}
		printf("]}\n");
	} else if (!o->quiet) {
		printf("[%s] prefilled %u tokens, reused %u (cached); prefill %.1f tok/s, "
		       "decode %.1f tok/s (%llu tokens), first token %.3f ms",
		       mode, n - cached, cached, prefill_rate, decode_rate,
		       (unsigned long long)generated, ttft_ms);
		if (o->park && parked)
			printf("; parked after %u tokens, resumed recomputing %u in %.3f ms",
			       o->park_at, recompute, (double)resume_ns / 1e6);
		else if (o->park)
			printf("; not parked (ended before %u tokens)", o->park_at);
		print_mask_text(e);
		putchar('\n');
	}
	r = 0;
out:
	if (conts) {
		for (uint32_t i = 0; i < o->forks; i++) {
			if (conts[i].dump && fclose(conts[i].dump) != 0 && r == 0) {
				fprintf(stderr, "kvpaged-llama: writing logits: %s\n",
					strerror(errno));
				r = -EIO;
			}
			if (conts[i].seq.kv)
				seq_close(e, &conts[i].seq);
			free(conts[i].logits);
			free(conts[i].text.s);
		}
	}
	free(conts);
	free(probs);
	free(history);
	free(tokens);
	return r;
}

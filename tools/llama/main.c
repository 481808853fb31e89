/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-llama: a small real inference engine (llama2.c checkpoints) whose KV cache lives in
 * a kvpaged pool.  It proves the pool on real K/V: the logits it computes through the pool are
 * bitwise those of a private contiguous cache, with and without a prefix another process
 * committed, and across forks.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/llama/engine.h"

#ifdef LLAMA_DATADIR
#define DEFAULT_MODEL LLAMA_DATADIR "/stories260K.bin"
#define DEFAULT_TOKENIZER LLAMA_DATADIR "/tok512.bin"
#else
#define DEFAULT_MODEL NULL
#define DEFAULT_TOKENIZER NULL
#endif

#define MAX_FORKS 64
#define RING_ENTRIES 16
#define RING_DATA_BYTES 65536
/* H2O: a step also carries a score report per run of held positions, and their weights. */
#define H2O_RING_ENTRIES 64
#define H2O_RING_DATA_BYTES (256 * 1024)
/* The block size the contiguous cache's H2O policy assumes, the test pools' (--block-tokens). */
#define DEFAULT_BLOCK_TOKENS 16
/*
 * A decode step's completions come back within tens of microseconds: spinning that long
 * saves a sleep and a wake-up per token, and costs nothing when the daemon is slower.
 */
#define RING_SPIN_US 50

static void usage(FILE *f)
{
	fputs("usage: kvpaged-llama [OPTIONS]\n"
	      "\n"
	      "Generates text (or scores a file) with a llama2.c checkpoint, keeping its KV cache\n"
	      "in a kvpaged pool (or, with --contiguous, in a private array).\n"
	      "\n"
	      "  --model PATH          llama2.c checkpoint"
#ifdef LLAMA_DATADIR
	      " (default: " DEFAULT_MODEL ")"
#endif
	      "\n"
	      "  --tokenizer PATH      llama2.c tokenizer"
#ifdef LLAMA_DATADIR
	      " (default: " DEFAULT_TOKENIZER ")"
#endif
	      "\n"
	      "  --prompt TEXT         start of the text (default: empty, BOS alone)\n"
	      "  --steps N             tokens to generate (default 256; stops at BOS)\n"
	      "  --temperature T       0 (default) is greedy; else sample softmax(logits / T)\n"
	      "  --seed N              seed of the sampler (default 1; continuation i uses N + i)\n"
	      "  --fork N              after the prompt, fork the sequence into N continuations\n"
	      "  --perplexity FILE     score FILE's stories (split on <|endoftext|>) instead\n"
	      "  --stream              with --perplexity: score the file as one sequence (BOS,\n"
	      "                        then every story's tokens), past the model's context\n"
	      "  --window W            bounded attention: the token at t attends to [t-W+1, t]\n"
	      "                        (and the sinks); paged, the daemon keeps only those blocks\n"
	      "  --sinks N             with --window: also attend to positions [0, N); with\n"
	      "                        --h2o: never evict them (N + R <= B)\n"
	      "  --h2o B[:R[:D]]       heavy hitters: keep B tokens, the last R (default B/4) and\n"
	      "                        those with the most attention, decayed by D (default 1)\n"
	      "  --h2o-tokens          with --h2o: evict single tokens, not whole blocks\n"
	      "  --block-tokens N      with --h2o --contiguous: the pool's block size the policy\n"
	      "                        assumes (default 16; paged, the pool's)\n"
	      "  --dump-logits FILE    write every step's float32 logits (FILE.i per fork)\n"
	      "  --contiguous          keep K/V in a private array, not in the pool\n"
	      "  --socket PATH         the daemon's socket (default: $KVPAGED_SOCKET, then "
	      KVP_DEFAULT_SOCKET ")\n"
	      "  --pool NAME           the pool (default: the daemon's first)\n"
	      "  --no-rings            decode with socket calls, not the shared-memory rings\n"
	      "  --no-defer            wait for every decode step's ring operations\n"
	      "  --park-at N           after N generated tokens, park the sequence, print\n"
	      "                        'parked', resume and recompute what the daemon dropped\n"
	      "  --park-wait FILE      with --park-at: resume once FILE exists (within 60 s)\n"
	      "  --bench N             generate N times with each cache, alternating, and compare\n"
	      "                        (with --window or --h2o, also with full attention)\n"
	      "  --json                end with one JSON summary line\n",
	      f);
}

static int parse_u32(const char *s, uint32_t *out)
{
	unsigned long long v;
	char *end;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || v > UINT32_MAX || s[0] == '-')
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
	unsigned long long v;
	char *end;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-')
		return -1;
	*out = v;
	return 0;
}

/* BUDGET[:RECENT[:DECAY]]; RECENT defaults to BUDGET / 4 (at least 1), DECAY to 1. */
static int parse_h2o(const char *s, struct kv_h2o_config *cfg)
{
	char buf[64], *recent, *decay = NULL, *end;

	if (strlen(s) >= sizeof(buf))
		return -1;
	strcpy(buf, s);
	recent = strchr(buf, ':');
	if (recent) {
		*recent++ = '\0';
		decay = strchr(recent, ':');
		if (decay)
			*decay++ = '\0';
	}
	if (parse_u32(buf, &cfg->budget) < 0 || cfg->budget < 1)
		return -1;
	cfg->recent = cfg->budget / 4 ? cfg->budget / 4 : 1;
	if (recent && (parse_u32(recent, &cfg->recent) < 0 || cfg->recent < 1 ||
		       cfg->recent > cfg->budget))
		return -1;
	cfg->decay = 1.0f;
	if (decay) {
		errno = 0;
		cfg->decay = strtof(decay, &end);
		if (errno || end == decay || *end || !(cfg->decay > 0.0f && cfg->decay <= 1.0f))
			return -1;
	}
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, uint32_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * The same generation with the contiguous cache and with the pool, alternating, so that both
 * see the same machine: medians of reps runs each.  The first paged run finds the pool as it
 * is (cold after `kvpagedctl drop-cache`); the later ones find the prompt's blocks cached.
 * With bounded attention, runs with full attention (contiguous, then paged) join each round,
 * so that the two masks are compared in one process too (not in a pool with a sliding window,
 * which cannot hold full attention).
 */
static int bench(struct engine *e, struct generate_options *g, uint32_t reps)
{
	struct kvp_client *client = e->client;
	const struct llama_mask mask = e->mask;
	const bool h2o = e->h2o;
	bool with_full = engine_retains(e); /* compare with full attention */
	double *v = calloc((size_t)reps * 6, sizeof(*v));
	double *cdec = v, *pdec = v + reps, *cttft = v + 2 * reps, *pttft = v + 3 * reps;
	double *fdec = v + 4 * reps, *cfdec = v + 5 * reps;
	struct generate_result c = { 0 }, p = { 0 }, f = { 0 }, cf = { 0 }, first = { 0 };
	double cd, pd, fd = 0, cfd = 0, ct, ratio, warm_ttft;
	int r = 0;

	if (!v)
		return -ENOMEM;
	g->quiet = true;
	for (uint32_t i = 0; i < reps && r == 0; i++) {
		e->client = NULL;
		r = engine_generate(e, g, &c);
		e->client = client;
		if (r == 0)
			r = engine_generate(e, g, &p);
		/* A pool with a sliding window keeps too little for full attention. */
		if (e->pool_window)
			with_full = false;
		if (r == 0 && with_full) {
			engine_set_mask(e, NULL);
			e->h2o = false;
			e->client = NULL;
			r = engine_generate(e, g, &cf);
			e->client = client;
			if (r == 0)
				r = engine_generate(e, g, &f);
			engine_set_mask(e, &mask);
			e->h2o = h2o;
		}
		if (i == 0)
			first = p;
		cdec[i] = c.decode_tok_s;
		pdec[i] = p.decode_tok_s;
		cttft[i] = c.ttft_ms;
		pttft[i] = p.ttft_ms;
		fdec[i] = f.decode_tok_s;
		cfdec[i] = cf.decode_tok_s;
	}
	if (r < 0)
		goto out;
	/* Decode rates and first-token times of every run; warm first tokens leave out run 0. */
	cd = median(cdec, reps);
	pd = median(pdec, reps);
	if (with_full) {
		fd = median(fdec, reps);
		cfd = median(cfdec, reps);
	}
	ct = median(cttft, reps);
	warm_ttft = reps > 1 ? median(pttft + 1, reps - 1) : pttft[0];
	ratio = cd > 0 ? pd / cd : 0;
	if (g->json) {
		printf("{\"reps\":%u,\"prompt_tokens\":%u,\"steps\":%u,\"decode_forwards\":%u,"
		       "\"contiguous_decode_tok_s\":%.1f,\"paged_decode_tok_s\":%.1f,"
		       "\"paged_vs_contiguous\":%.3f,\"contiguous_ttft_ms\":%.3f,"
		       "\"paged_first_ttft_ms\":%.3f,\"paged_first_reused\":%u,"
		       "\"paged_warm_ttft_ms\":%.3f,\"paged_warm_reused\":%u,",
		       reps, p.prompt_tokens, g->steps, p.forwards, cd, pd, ratio, ct,
		       first.ttft_ms, first.cached, warm_ttft, p.cached);
		if (engine_bounded(e))
			printf("\"sinks\":%u,\"window\":%u,\"pool_window\":%s,", mask.n_sink,
			       mask.window, e->pool_window ? "true" : "false");
		if (h2o)
			printf("\"h2o_budget\":%u,\"h2o_recent\":%u,\"h2o_sinks\":%u,"
			       "\"h2o_decay\":%g,\"h2o_granularity\":\"%s\",", e->h2o_cfg.budget,
			       e->h2o_cfg.recent, e->h2o_cfg.n_sink, (double)e->h2o_cfg.decay,
			       e->h2o_cfg.tokens ? "tokens" : "blocks");
		if (with_full)
			printf("\"contiguous_full_decode_tok_s\":%.1f,"
			       "\"paged_full_decode_tok_s\":%.1f,\"full_decode_forwards\":%u,"
			       "\"paged_bounded_vs_full\":%.3f,",
			       cfd, fd, f.forwards, fd > 0 ? pd / fd : 0);
		printf("\"steps_over\":\"%s\"}\n",
		       !e->rings ? "socket" : e->no_defer ? "rings" : "rings_deferred");
	} else {
		printf("bench: prompt %u tokens, %u decode steps, median of %u runs each (%s)\n"
		       "contiguous: decode %.1f tok/s, first token %.3f ms\n"
		       "paged:      decode %.1f tok/s (%.3fx contiguous)\n"
		       "paged first token: first run %.3f ms (reused %u), later runs %.3f ms "
		       "(reused %u)\n",
		       p.prompt_tokens, p.forwards, reps,
		       !e->rings ? "socket calls" : e->no_defer ? "rings, waiting"
								: "rings, deferred",
		       cd, ct, pd, ratio, first.ttft_ms, first.cached, warm_ttft, p.cached);
		if (with_full && h2o)
			printf("full attention (%u decode steps): contiguous %.1f tok/s, paged "
			       "%.1f tok/s; paged with h2o (%s) %u:%u: %.3fx paged full\n",
			       f.forwards, cfd, fd, e->h2o_cfg.tokens ? "tokens" : "blocks",
			       e->h2o_cfg.budget, e->h2o_cfg.recent, fd > 0 ? pd / fd : 0);
		else if (with_full)
			printf("full attention (%u decode steps): contiguous %.1f tok/s, paged "
			       "%.1f tok/s; paged with sinks %u + window %u: %.3fx paged full\n",
			       f.forwards, cfd, fd, mask.n_sink, mask.window, fd > 0 ? pd / fd : 0);
	}
out:
	free(v);
	return r;
}

/* Connects and checks that the pool can hold this model's K/V.  Returns 0 or -errno. */
static int connect_pool(struct engine *e, const char *socket_path, const char *pool)
{
	struct kvp_connect_options o = { .size = sizeof(o), .socket_path = socket_path,
					 .pool = pool, .client_name = "kvpaged-llama" };
	char msg[512];
	int r;

	if (e->rings) {
		o.ring_entries = e->h2o ? H2O_RING_ENTRIES : RING_ENTRIES;
		o.ring_data_bytes = e->h2o ? H2O_RING_DATA_BYTES : RING_DATA_BYTES;
		o.spin_us = RING_SPIN_US;
	}

	r = kvp_connect(&o, &e->client);
	if (r < 0) {
		const char *env = getenv("KVPAGED_SOCKET");

		/* kvp_connect keeps no client on failure, so the daemon's reason is lost. */
		fprintf(stderr, "kvpaged-llama: cannot connect to kvpaged (%s%s%s): %s\n",
			socket_path ? socket_path : env && *env ? env : KVP_DEFAULT_SOCKET,
			pool ? ", pool " : "", pool ? pool : "", strerror(-r));
		e->client = NULL;
		return r;
	}
	r = kv_paged_check_pool(kvp_pool(e->client), &e->model.cfg, msg, sizeof(msg));
	if (r < 0) {
		fprintf(stderr, "kvpaged-llama: %s\n", msg);
		return r;
	}
	/* The ring tables are sized for each run's sequences when they are opened. */
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "tokenizer", required_argument, NULL, 'z' },
		{ "prompt", required_argument, NULL, 'p' },
		{ "steps", required_argument, NULL, 'n' },
		{ "temperature", required_argument, NULL, 't' },
		{ "seed", required_argument, NULL, 's' },
		{ "fork", required_argument, NULL, 'f' },
		{ "perplexity", required_argument, NULL, 'P' },
		{ "dump-logits", required_argument, NULL, 'd' },
		{ "contiguous", no_argument, NULL, 'c' },
		{ "socket", required_argument, NULL, 'S' },
		{ "pool", required_argument, NULL, 'o' },
		{ "json", no_argument, NULL, 'j' },
		{ "no-rings", no_argument, NULL, 'R' },
		{ "no-defer", no_argument, NULL, 'D' },
		{ "bench", required_argument, NULL, 'B' },
		{ "park-at", required_argument, NULL, 'A' },
		{ "park-wait", required_argument, NULL, 'W' },
		{ "window", required_argument, NULL, 'w' },
		{ "sinks", required_argument, NULL, 'k' },
		{ "stream", no_argument, NULL, 'T' },
		{ "h2o", required_argument, NULL, 'H' },
		{ "h2o-tokens", no_argument, NULL, 'K' },
		{ "block-tokens", required_argument, NULL, 'b' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	struct generate_options g = { .prompt = "", .steps = 256, .seed = 1, .forks = 1 };
	const char *model = DEFAULT_MODEL, *tokenizer = DEFAULT_TOKENIZER, *socket_path = NULL;
	const char *pool = NULL, *perplexity = NULL;
	uint32_t bench_reps = 0;
	struct llama_mask mask = { 0 };
	bool contiguous = false, sinks = false, stream = false, h2o_tokens = false;
	uint32_t block_tokens = 0;
	struct engine e = { .rings = true };
	int opt, r;
	char *end;

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'm': model = optarg; break;
		case 'z': tokenizer = optarg; break;
		case 'p': g.prompt = optarg; break;
		case 'n':
			if (parse_u32(optarg, &g.steps) < 0) {
				fprintf(stderr, "kvpaged-llama: --steps: not a count: %s\n",
					optarg);
				return 2;
			}
			break;
		case 't':
			errno = 0;
			g.temperature = strtof(optarg, &end);
			if (errno || end == optarg || *end || !isfinite(g.temperature) ||
			    g.temperature < 0.0f) {
				fprintf(stderr, "kvpaged-llama: --temperature: not >= 0: %s\n",
					optarg);
				return 2;
			}
			break;
		case 's':
			if (parse_u64(optarg, &g.seed) < 0) {
				fprintf(stderr, "kvpaged-llama: --seed: not a number: %s\n",
					optarg);
				return 2;
			}
			break;
		case 'f':
			if (parse_u32(optarg, &g.forks) < 0 || g.forks < 1 || g.forks > MAX_FORKS) {
				fprintf(stderr, "kvpaged-llama: --fork: 1 to %d: %s\n", MAX_FORKS,
					optarg);
				return 2;
			}
			break;
		case 'P': perplexity = optarg; break;
		case 'd': g.dump_logits = optarg; break;
		case 'c': contiguous = true; break;
		case 'S': socket_path = optarg; break;
		case 'o': pool = optarg; break;
		case 'j': g.json = true; break;
		case 'R': e.rings = false; break;
		case 'D': e.no_defer = true; break;
		case 'B':
			if (parse_u32(optarg, &bench_reps) < 0 || bench_reps < 1 ||
			    bench_reps > 1000) {
				fprintf(stderr, "kvpaged-llama: --bench: 1 to 1000 runs: %s\n",
					optarg);
				return 2;
			}
			break;
		case 'A':
			if (parse_u32(optarg, &g.park_at) < 0) {
				fprintf(stderr, "kvpaged-llama: --park-at: not a count: %s\n",
					optarg);
				return 2;
			}
			g.park = true;
			break;
		case 'W': g.park_wait = optarg; break;
		case 'w':
			if (parse_u32(optarg, &mask.window) < 0 || mask.window < 1) {
				fprintf(stderr, "kvpaged-llama: --window: not a count >= 1: "
						"%s\n", optarg);
				return 2;
			}
			break;
		case 'k':
			if (parse_u32(optarg, &mask.n_sink) < 0) {
				fprintf(stderr, "kvpaged-llama: --sinks: not a count: %s\n",
					optarg);
				return 2;
			}
			sinks = true;
			break;
		case 'T': stream = true; break;
		case 'H':
			if (parse_h2o(optarg, &e.h2o_cfg) < 0) {
				fprintf(stderr, "kvpaged-llama: --h2o: BUDGET[:RECENT[:DECAY]], "
						"1 <= RECENT <= BUDGET, 0 < DECAY <= 1: %s\n",
					optarg);
				return 2;
			}
			e.h2o = true;
			break;
		case 'K': h2o_tokens = true; break;
		case 'b':
			if (parse_u32(optarg, &block_tokens) < 0 || block_tokens < 1 ||
			    block_tokens > 65536) {
				fprintf(stderr, "kvpaged-llama: --block-tokens: 1 to 65536: %s\n",
					optarg);
				return 2;
			}
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "kvpaged-llama: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (!model || !tokenizer) {
		fprintf(stderr, "kvpaged-llama: --model and --tokenizer are required\n");
		return 2;
	}
	if (perplexity && g.forks > 1) {
		fprintf(stderr, "kvpaged-llama: --fork applies to generation, not --perplexity\n");
		return 2;
	}
	if (bench_reps && (perplexity || contiguous || g.forks > 1 || g.dump_logits)) {
		fprintf(stderr, "kvpaged-llama: --bench runs both caches itself, one continuation, "
				"no dumps, no --perplexity\n");
		return 2;
	}

	if (sinks && e.h2o) {
		/* H2O's sinks: positions its policy never evicts, not a mask. */
		e.h2o_cfg.n_sink = mask.n_sink;
		mask.n_sink = 0;
		if (e.h2o_cfg.n_sink > e.h2o_cfg.budget - e.h2o_cfg.recent) {
			fprintf(stderr, "kvpaged-llama: --sinks with --h2o: the sinks and the "
					"recent tokens must fit in the budget\n");
			return 2;
		}
	} else if (sinks && !mask.window) {
		fprintf(stderr, "kvpaged-llama: --sinks goes with --window or --h2o (without "
				"either, every position is attended to)\n");
		return 2;
	}
	if (h2o_tokens && !e.h2o) {
		fprintf(stderr, "kvpaged-llama: --h2o-tokens goes with --h2o\n");
		return 2;
	}
	if (block_tokens && !e.h2o) {
		fprintf(stderr, "kvpaged-llama: --block-tokens goes with --h2o\n");
		return 2;
	}
	e.h2o_cfg.tokens = h2o_tokens;
	e.h2o_cfg.block_tokens = block_tokens ? block_tokens : DEFAULT_BLOCK_TOKENS;
	if (e.h2o && (mask.window || g.forks > 1 || g.park)) {
		fprintf(stderr, "kvpaged-llama: --h2o decides alone what tokens attend to: not "
				"with --window, --fork or --park-at\n");
		return 2;
	}
	if (stream && !perplexity) {
		fprintf(stderr, "kvpaged-llama: --stream goes with --perplexity\n");
		return 2;
	}
	if (mask.window && g.park) {
		fprintf(stderr, "kvpaged-llama: --park-at: a sequence with bounded attention "
				"cannot be parked (the daemon could not recompute what it "
				"released)\n");
		return 2;
	}
	if (g.park_wait && !g.park) {
		fprintf(stderr, "kvpaged-llama: --park-wait needs --park-at\n");
		return 2;
	}
	if (g.park && (contiguous || g.forks > 1 || perplexity || bench_reps)) {
		fprintf(stderr, "kvpaged-llama: --park-at parks one paged generation: not with "
				"--contiguous, --fork, --perplexity or --bench\n");
		return 2;
	}

	r = llama_model_load(model, &e.model);
	if (r < 0)
		return 1;
	e.model_key = llama_model_fingerprint(&e.model);
	e.max_tokens = e.model.cfg.seq_len;
	engine_set_mask(&e, &mask);
	r = tokenizer_load(tokenizer, e.model.cfg.vocab_size, &e.tok);
	if (r < 0)
		goto out;
	r = llama_state_init(&e.st, &e.model.cfg);
	if (r < 0) {
		fprintf(stderr, "kvpaged-llama: %s\n", strerror(-r));
		goto out;
	}
	if (!contiguous) {
		r = connect_pool(&e, socket_path, pool);
		if (r < 0)
			goto out;
		/* The daemon's policy works on the pool's blocks. */
		if (e.h2o && block_tokens && block_tokens != kvp_pool(e.client)->block_tokens) {
			fprintf(stderr, "kvpaged-llama: --block-tokens %u: pool '%s' has %u-token "
					"blocks\n", block_tokens, kvp_pool(e.client)->name,
				kvp_pool(e.client)->block_tokens);
			r = -EINVAL;
			goto out;
		}
		e.h2o_cfg.block_tokens = kvp_pool(e.client)->block_tokens;
	}
	if (perplexity) {
		struct perplexity_options p = { .path = perplexity, .dump_logits = g.dump_logits,
						.json = g.json, .stream = stream };

		r = engine_perplexity(&e, &p);
	} else if (bench_reps) {
		r = bench(&e, &g, bench_reps);
	} else {
		r = engine_generate(&e, &g, NULL);
	}
	if (fflush(stdout) != 0 && r == 0) {
		fprintf(stderr, "kvpaged-llama: writing output: %s\n", strerror(errno));
		r = -EIO;
	}
out:
	kvp_disconnect(e.client);
	for (int i = 0; i < 3; i++)
		free(e.ring_tables[i]);
	free(e.ring_packed);
	free(e.ring_ops);
	free(e.ring_done);
	llama_state_free(&e.st);
	tokenizer_free(&e.tok);
	llama_model_unload(&e.model);
	return r < 0 ? 1 : 0;
}

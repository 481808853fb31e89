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
	      "  --sinks N             with --window: also attend to positions [0, N)\n"
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
	      "                        (with --window, also paged with full attention)\n"
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
	bool with_full = engine_bounded(e); /* compare with full attention */
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
			e->client = NULL;
			r = engine_generate(e, g, &cf);
			e->client = client;
			if (r == 0)
				r = engine_generate(e, g, &f);
			engine_set_mask(e, &mask);
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
		if (with_full)
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
		o.ring_entries = RING_ENTRIES;
		o.ring_data_bytes = RING_DATA_BYTES;
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
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	struct generate_options g = { .prompt = "", .steps = 256, .seed = 1, .forks = 1 };
	const char *model = DEFAULT_MODEL, *tokenizer = DEFAULT_TOKENIZER, *socket_path = NULL;
	const char *pool = NULL, *perplexity = NULL;
	uint32_t bench_reps = 0;
	struct llama_mask mask = { 0 };
	bool contiguous = false, sinks = false, stream = false;
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

	if (sinks && !mask.window) {
		fprintf(stderr, "kvpaged-llama: --sinks goes with --window (without one, every "
				"position is attended to)\n");
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
	llama_state_free(&e.st);
	tokenizer_free(&e.tok);
	llama_model_unload(&e.model);
	return r < 0 ? 1 : 0;
}

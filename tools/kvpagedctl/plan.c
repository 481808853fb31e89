/* SPDX-License-Identifier: MIT */
/*
 * kvpagedctl plan: the lesson's arithmetic for operators (the same cost model the daemon
 * uses), with no daemon involved.  Sizes take SI (kB, MB, GB: powers of 1000) and IEC (KiB,
 * MiB, GiB: powers of 1024) suffixes and mean them exactly; bandwidths end in /s.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "daemon/config.h"
#include "daemon/core/cost.h"
#include "tools/kvpagedctl/plan.h"

#define GIB 1073741824.0

/* "1,493.3": fixed decimals with thousands separators, as the lesson prints its answers. */
static const char *num(char *buf, size_t len, double v, int decimals)
{
	char raw[64], *dot;
	size_t n, lead, j = 0, i;

	snprintf(raw, sizeof(raw), "%.*f", decimals, v);
	dot = strchr(raw, '.');
	n = dot ? (size_t)(dot - raw) : strlen(raw);
	lead = raw[0] == '-';
	for (i = 0; raw[i] && j + 2 < len; i++) {
		if (i > lead && i < n && (n - i) % 3 == 0)
			buf[j++] = ',';
		buf[j++] = raw[i];
	}
	buf[j] = '\0';
	return buf;
}

static int bad(const char *opt, const char *value, const char *what)
{
	fprintf(stderr, "kvpagedctl plan: --%s: %s: %s\n", opt, value, what);
	return -EINVAL;
}

static int get_double(const char *opt, const char *s, double *ret)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v <= 0)
		return bad(opt, s, "expected a positive number");
	*ret = v;
	return 0;
}

static int get_size(const char *opt, const char *s, double *ret)
{
	uint64_t v;

	if (config_parse_size(s, &v) < 0 || v == 0)
		return bad(opt, s, "expected a positive size (bytes, or with kB/MB/GB/TB or KiB/MiB/GiB/TiB)");
	*ret = (double)v;
	return 0;
}

static int get_bandwidth(const char *opt, const char *s, double *ret)
{
	char buf[64];
	size_t n = strlen(s);

	if (n < 3 || n >= sizeof(buf) || strcmp(s + n - 2, "/s"))
		return bad(opt, s, "expected a size per second, such as 25GB/s");
	memcpy(buf, s, n - 2);
	buf[n - 2] = '\0';
	return get_size(opt, buf, ret);
}

struct param {
	const char *name;
	int (*parse)(const char *opt, const char *s, double *ret);
	double value;
	bool given;
};

/* Parses --name VALUE pairs against params; every param is required.  0, or -EINVAL. */
static int parse_params(int argc, char **argv, struct param *params, size_t n, bool *json)
{
	struct option opts[16];
	int opt;

	if (n + 2 > sizeof(opts) / sizeof(opts[0]))
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		opts[i] = (struct option){ params[i].name, required_argument, NULL, (int)i };
	opts[n] = (struct option){ "json", no_argument, NULL, 'j' };
	opts[n + 1] = (struct option){ 0 };
	optind = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (opt == 'j') {
			*json = true;
			continue;
		}
		if (opt < 0 || (size_t)opt >= n)
			return -EINVAL;
		if (params[opt].parse(params[opt].name, optarg, &params[opt].value) < 0)
			return -EINVAL;
		params[opt].given = true;
	}
	if (optind != argc) {
		fprintf(stderr, "kvpagedctl plan: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++)
		if (!params[i].given) {
			fprintf(stderr, "kvpagedctl plan: --%s is required\n", params[i].name);
			return -EINVAL;
		}
	return 0;
}

static void jd(json_object *o, const char *k, double v)
{
	json_object_object_add(o, k, json_object_new_double(v));
}

static int plan_prefix(int argc, char **argv)
{
	struct param p[] = {
		{ "requests", get_double },	       { "shared-tokens", get_double },
		{ "unique-tokens", get_double },       { "kv-bytes-per-token", get_size },
		{ "tflops-per-1k-tokens", get_double }, { "gpu-tflops", get_double },
	};
	bool json = false;
	char a[64], b[64], c[64];

	if (parse_params(argc, argv, p, 6, &json) < 0)
		return 2;
	double R = p[0].value, S = p[1].value, U = p[2].value, kv = p[3].value;
	double per_token_s = p[4].value / 1000.0 / p[5].value; /* TFLOPs / (TFLOP/s) */
	double tokens_plain = R * (S + U), time_plain = tokens_plain * per_token_s;
	double mem_plain = R * S * kv;
	double time_shared = S * per_token_s, time_unique = R * U * per_token_s;
	double time_cached = time_shared + time_unique, mem_cached = S * kv;

	if (json) {
		json_object *o = json_object_new_object();

		jd(o, "prefill_tokens_without_cache", tokens_plain);
		jd(o, "prefill_ms_without_cache", time_plain * 1e3);
		jd(o, "shared_kv_bytes_without_cache", mem_plain);
		jd(o, "shared_prefill_ms", time_shared * 1e3);
		jd(o, "unique_prefill_ms", time_unique * 1e3);
		jd(o, "prefill_ms_with_cache", time_cached * 1e3);
		jd(o, "speedup", time_plain / time_cached);
		jd(o, "shared_kv_bytes_with_cache", mem_cached);
		jd(o, "memory_reduction", mem_plain / mem_cached);
		puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY));
		json_object_put(o);
		return 0;
	}
	printf("Prefix caching: %s requests share %s tokens, %s unique tokens each\n",
	       num(a, sizeof(a), R, 0), num(b, sizeof(b), S, 0), num(c, sizeof(c), U, 0));
	printf("  without caching: %s prefill tokens, %s ms; shared prompt KV %s GiB (%s copies)\n",
	       num(a, sizeof(a), tokens_plain, 0), num(b, sizeof(b), time_plain * 1e3, 1),
	       num(c, sizeof(c), mem_plain / GIB, 3), num(c + 32, 32, R, 0));
	printf("  with caching:    shared prompt once %s ms + unique %s ms = %s ms\n",
	       num(a, sizeof(a), time_shared * 1e3, 1), num(b, sizeof(b), time_unique * 1e3, 1),
	       num(c, sizeof(c), time_cached * 1e3, 1));
	printf("                   shared prompt KV %s GiB (one copy)\n",
	       num(a, sizeof(a), mem_cached / GIB, 3));
	printf("  prefill %.2f× faster, shared prompt memory %.1f× smaller\n",
	       time_plain / time_cached, mem_plain / mem_cached);
	return 0;
}

static int plan_swa(int argc, char **argv)
{
	struct param p[] = {
		{ "layers", get_double },  { "kv-heads", get_double }, { "head-dim", get_double },
		{ "dtype-bytes", get_double }, { "window", get_double },  { "tokens", get_double },
	};
	bool json = false;
	char a[64], b[64], c[64];

	if (parse_params(argc, argv, p, 6, &json) < 0)
		return 2;
	for (int i = 0; i < 4; i++)
		if (p[i].value != floor(p[i].value) || p[i].value > UINT32_MAX) {
			fprintf(stderr, "kvpagedctl plan: --%s must be a whole number\n", p[i].name);
			return 2;
		}
	double bpt = (double)cost_bytes_per_token((uint32_t)p[0].value, (uint32_t)p[1].value,
						  (uint32_t)p[2].value, (uint32_t)p[3].value);
	double W = p[4].value, T = p[5].value;
	double full = T * bpt, swa = (T < W ? T : W) * bpt;

	if (json) {
		json_object *o = json_object_new_object();

		jd(o, "bytes_per_token", bpt);
		jd(o, "full_cache_bytes", full);
		jd(o, "swa_cache_bytes", swa);
		jd(o, "saved_bytes", full - swa);
		jd(o, "saved_fraction", (full - swa) / full);
		jd(o, "reduction", full / swa);
		puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY));
		json_object_put(o);
		return 0;
	}
	printf("Sliding-window attention: window %s tokens, stream of %s tokens\n",
	       num(a, sizeof(a), W, 0), num(b, sizeof(b), T, 0));
	printf("  bytes per token: 2 x %s x %s x %s x %s = %s bytes (%s KiB)\n",
	       num(a, 16, p[0].value, 0), num(a + 16, 16, p[1].value, 0),
	       num(a + 32, 16, p[2].value, 0), num(a + 48, 16, p[3].value, 0),
	       num(b, sizeof(b), bpt, 0), num(c, sizeof(c), bpt / 1024, bpt / 1024 == floor(bpt / 1024) ? 0 : 2));
	printf("  full attention:  %s GiB\n", num(a, sizeof(a), full / GIB, 1));
	printf("  sliding window:  %s GiB (flat once the stream passes the window)\n",
	       num(a, sizeof(a), swa / GIB, 1));
	printf("  saved %s GiB: %.1f%% less, %.1f× smaller\n", num(a, sizeof(a), (full - swa) / GIB, 1),
	       100 * (full - swa) / full, full / swa);
	return 0;
}

static int plan_swap(int argc, char **argv)
{
	struct param p[] = {
		{ "kv-bytes", get_size },	 { "tokens", get_double },
		{ "params", get_double },	 { "gpu-tflops", get_double },
		{ "link-bandwidth", get_bandwidth },
	};
	bool json = false;
	char a[64], b[64];

	if (parse_params(argc, argv, p, 5, &json) < 0)
		return 2;
	double bytes = p[0].value, tokens = p[1].value, params = p[2].value;
	double flops = p[3].value * 1e12, bw = p[4].value;
	double swap_s = cost_transfer_s(bytes, bw), flop = 2.0 * params * tokens;
	double recompute_s = cost_recompute_s(params, tokens, flops);
	enum cost_choice choice = cost_choose(swap_s, recompute_s);

	if (json) {
		json_object *o = json_object_new_object();

		jd(o, "kv_bytes", bytes);
		jd(o, "transfer_ms", swap_s * 1e3);
		jd(o, "recompute_flops", flop);
		jd(o, "recompute_ms", recompute_s * 1e3);
		jd(o, "factor", choice == COST_SWAP ? recompute_s / swap_s : swap_s / recompute_s);
		json_object_object_add(o, "decision",
				       json_object_new_string(choice == COST_SWAP ? "swap" : "recompute"));
		puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY));
		json_object_put(o);
		return 0;
	}
	printf("Preemption of %s bytes (%s tokens): swap or recompute?\n", num(a, sizeof(a), bytes, 0),
	       num(b, sizeof(b), tokens, 0));
	printf("  swap over the link:  %s ms each way\n", num(a, sizeof(a), swap_s * 1e3, 1));
	printf("  recompute:           2 x %s tokens x %g parameters = %s TFLOPs, %s ms\n",
	       num(b, sizeof(b), tokens, 0), params, num(a, sizeof(a), flop / 1e12, 1),
	       num(a + 32, 32, recompute_s * 1e3, 1));
	if (choice == COST_SWAP)
		printf("  decision: swap, %.1f× faster than recomputing\n", recompute_s / swap_s);
	else
		printf("  decision: recompute, %.1f× faster than swapping\n", swap_s / recompute_s);
	return 0;
}

static void plan_usage(FILE *f)
{
	fputs("usage: kvpagedctl plan prefix --requests N --shared-tokens N --unique-tokens N\n"
	      "                              --kv-bytes-per-token SIZE --tflops-per-1k-tokens X\n"
	      "                              --gpu-tflops X [--json]\n"
	      "       kvpagedctl plan swa --layers N --kv-heads N --head-dim N --dtype-bytes N\n"
	      "                           --window N --tokens N [--json]\n"
	      "       kvpagedctl plan swap --kv-bytes SIZE --tokens N --params X --gpu-tflops X\n"
	      "                            --link-bandwidth SIZE/s [--json]\n"
	      "       kvpagedctl [--socket PATH] plan pool NAME [--json]   (asks the daemon)\n"
	      "SIZE: bytes, or with kB MB GB TB (powers of 1000) or KiB MiB GiB TiB (powers of 1024).\n",
	      f);
}

int cmd_plan(int argc, char **argv)
{
	if (argc < 2) {
		plan_usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "prefix"))
		return plan_prefix(argc - 1, argv + 1);
	if (!strcmp(argv[1], "swa"))
		return plan_swa(argc - 1, argv + 1);
	if (!strcmp(argv[1], "swap"))
		return plan_swap(argc - 1, argv + 1);
	if (!strcmp(argv[1], "--help")) {
		plan_usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "pool")) {
		fprintf(stderr, "kvpagedctl plan pool: expected exactly one pool name\n");
		return 2;
	}
	fprintf(stderr, "kvpagedctl plan: unknown plan '%s' (prefix, swa, swap)\n", argv[1]);
	plan_usage(stderr);
	return 2;
}

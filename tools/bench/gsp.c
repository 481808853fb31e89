/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-bench gsp: the generated-shared-prefix workload.  G groups each share a system
 * prompt; every group sends P prompts (system prompt + a private question), in round-robin
 * order across groups.  With a pool that holds every system prompt, the ideal hit fraction is
 *   G * (P - 1) * floor(S / B)  /  (G * P * ceil((S + Q) / B)),
 * printed beside the measured one.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/bench/bench.h"
#include "tools/bench/workload.h"

#define STREAM_SYSTEM (UINT64_C(1) << 56)
#define STREAM_QUESTION (UINT64_C(2) << 56)
#define MAX_CAPACITIES 32

static void gsp_usage(FILE *f)
{
	fputs("usage: kvpaged-bench gsp [--groups G] [--prompts-per-group P] [--system-tokens S]\n"
	      "                         [--question-tokens Q] [--output-tokens O] [--block-tokens B]\n"
	      "                         [--capacity-blocks N[,N...]] [--grouped] [--prompt-only] [--json]\n"
	      "defaults: G=16 P=32 S=2048 Q=128 O=64 B=16, capacity: every block the workload uses\n",
	      f);
}

int cmd_gsp(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "groups", required_argument, NULL, 'g' },
		{ "prompts-per-group", required_argument, NULL, 'p' },
		{ "system-tokens", required_argument, NULL, 's' },
		{ "question-tokens", required_argument, NULL, 'q' },
		{ "output-tokens", required_argument, NULL, 'o' },
		{ "block-tokens", required_argument, NULL, 'b' },
		{ "capacity-blocks", required_argument, NULL, 'c' },
		{ "grouped", no_argument, NULL, 'G' },
		{ "prompt-only", no_argument, NULL, 'P' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	uint32_t G = 16, P = 32, S = 2048, Q = 128, O = 64, B = 16, caps[MAX_CAPACITIES];
	bool grouped = false, prompt_only = false, json = false;
	int ncaps = 0, opt, r = 0;
	uint32_t *target;
	struct workload w;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		target = NULL;
		switch (opt) {
		case 'g': target = &G; break;
		case 'p': target = &P; break;
		case 's': target = &S; break;
		case 'q': target = &Q; break;
		case 'o': target = &O; break;
		case 'b': target = &B; break;
		case 'c':
			ncaps = parse_u32_list(optarg, caps, MAX_CAPACITIES);
			if (ncaps < 0) {
				fprintf(stderr, "kvpaged-bench: --capacity-blocks: expected N[,N...]: %s\n", optarg);
				return 2;
			}
			break;
		case 'G': grouped = true; break;
		case 'P': prompt_only = true; break;
		case 'j': json = true; break;
		case 'h': gsp_usage(stdout); return 0;
		default: gsp_usage(stderr); return 2;
		}
		if (target && parse_u32(optarg, target) < 0) {
			fprintf(stderr, "kvpaged-bench: %s: not a non-negative integer\n", optarg);
			return 2;
		}
	}
	if (optind != argc || !G || !P || !B || S + Q == 0 || (uint64_t)G * P > 10000000) {
		gsp_usage(stderr);
		return 2;
	}
	if (workload_init(&w) < 0)
		return 1;
	for (uint32_t i = 0; i < G * P; i++) {
		uint32_t g = grouped ? i / P : i % G, p = grouped ? i % P : i / G;
		struct wseg segs[2];
		uint32_t n = 0;

		if (S)
			segs[n++] = (struct wseg){ .stream = STREAM_SYSTEM | g, .len = S };
		if (Q)
			segs[n++] = (struct wseg){ .stream = STREAM_QUESTION | ((uint64_t)g * P + p), .len = Q };
		if (workload_add(&w, segs, n, O) < 0) {
			workload_free(&w);
			return 1;
		}
	}
	if (ncaps == 0) {
		caps[0] = G * P * ((S + Q + O + B - 1) / B);
		ncaps = 1;
	}
	uint64_t prompt_blocks = (uint64_t)G * P * ((S + Q + B - 1) / B);
	double ideal = (double)G * (P - 1) * (S / B) / (double)prompt_blocks;

	if (!json) {
		printf("gsp: %u groups x %u prompts, system %u + question %u tokens, output %u, block %u, %s\n",
		       G, P, S, Q, prompt_only ? 0 : O, B, grouped ? "grouped" : "round-robin");
		printf("ideal hit fraction (infinite pool): %.4f\n", ideal);
		replay_print_header(false);
	}
	for (int i = 0; i < ncaps && r == 0; i++) {
		struct replay_result res;

		r = replay_core(&w, B, caps[i], prompt_only, &res);
		if (r < 0) {
			fprintf(stderr, "kvpaged-bench: gsp at capacity %u failed: %d\n", caps[i], r);
			break;
		}
		if (json) {
			/* The same keys as replay, plus the analytic bound. */
			double frac = res.blocks ? (double)res.hit_blocks / (double)res.blocks : 0;
			json_object *o = json_object_new_object();

			json_object_object_add(o, "capacity_blocks", json_object_new_int64(res.capacity));
			json_object_object_add(o, "block_tokens", json_object_new_int64(B));
			json_object_object_add(o, "requests", json_object_new_int64(res.requests));
			json_object_object_add(o, "blocks", json_object_new_int64((int64_t)res.blocks));
			json_object_object_add(o, "hit_blocks", json_object_new_int64((int64_t)res.hit_blocks));
			json_object_object_add(o, "hit_fraction", json_object_new_double(frac));
			json_object_object_add(o, "ideal_hit_fraction", json_object_new_double(ideal));
			json_object_object_add(o, "evictions", json_object_new_int64((int64_t)res.evictions));
			json_object_object_add(o, "ns_per_op",
					       json_object_new_double(res.ops ? (double)res.core_ns / res.ops : 0));
			json_print(o);
		} else {
			replay_print(&res, false);
		}
	}
	workload_free(&w);
	return r < 0 ? 1 : 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-bench replay: a Mooncake-format trace (JSON lines with timestamp, input_length,
 * output_length, hash_ids) replayed in file order.  hash_ids name 512-token prefix blocks;
 * each id becomes a stream of 512 deterministic token ids, so equal ids give equal tokens
 * whatever --block-tokens is.
 */
#include <errno.h>
#include <inttypes.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/bench/bench.h"
#include "tools/bench/workload.h"

#define TRACE_ID_TOKENS 512 /* Mooncake: one hash id per 512 prompt tokens */
#define MAX_CAPACITIES 32
#define TRACE_MAX_LINE_IDS 1000000
#define MAX_CLIENTS 1024

static int get_uint(json_object *obj, const char *key, uint32_t *out)
{
	json_object *v;
	int64_t x;

	if (!json_object_object_get_ex(obj, key, &v) || !json_object_is_type(v, json_type_int))
		return -1;
	x = json_object_get_int64(v);
	if (x < 0 || x > UINT32_MAX)
		return -1;
	*out = (uint32_t)x;
	return 0;
}

int workload_load_trace(const char *path, struct workload *w, uint32_t max_requests)
{
	FILE *f = fopen(path, "re");
	struct wseg *segs = NULL;
	size_t cap = 0, lineno = 0;
	char *line = NULL;
	int r = 0;

	if (!f) {
		r = -errno;
		fprintf(stderr, "kvpaged-bench: %s: %s\n", path, strerror(errno));
		return r;
	}
	while (getline(&line, &cap, f) > 0 && (!max_requests || w->nreqs < max_requests)) {
		uint32_t input, output, nids;
		json_object *obj, *ids;
		const char *why = NULL;

		lineno++;
		if (line[strspn(line, " \t\r\n")] == '\0')
			continue;
		obj = json_tokener_parse(line);
		if (!obj || !json_object_is_type(obj, json_type_object))
			why = "not a JSON object";
		else if (get_uint(obj, "input_length", &input) < 0 || input == 0)
			why = "input_length missing, not a positive integer";
		else if (get_uint(obj, "output_length", &output) < 0)
			why = "output_length missing or not a non-negative integer";
		else if (!json_object_object_get_ex(obj, "hash_ids", &ids) ||
			 !json_object_is_type(ids, json_type_array))
			why = "hash_ids missing or not an array";
		else if ((nids = (uint32_t)json_object_array_length(ids)) !=
			 (input + TRACE_ID_TOKENS - 1) / TRACE_ID_TOKENS)
			why = "hash_ids must hold ceil(input_length / 512) ids";
		if (!why) {
			segs = realloc(segs, nids * sizeof(*segs));
			if (!segs)
				abort();
			for (uint32_t i = 0; i < nids && !why; i++) {
				json_object *id = json_object_array_get_idx(ids, i);

				if (!json_object_is_type(id, json_type_int) ||
				    json_object_get_int64(id) < 0)
					why = "a hash id is not a non-negative integer";
				else
					segs[i] = (struct wseg){
						.stream = (uint64_t)json_object_get_int64(id),
						.len = i + 1 < nids ? TRACE_ID_TOKENS
								    : input - i * TRACE_ID_TOKENS,
					};
			}
		}
		if (!why && workload_add(w, segs, nids, output) < 0)
			why = "out of memory";
		/* The arrival in milliseconds (Mooncake), optional: else the request's index. */
		if (!why && json_object_object_get_ex(obj, "timestamp", &ids)) {
			double ms = json_object_get_double(ids);

			if (!(json_object_is_type(ids, json_type_int) ||
			      json_object_is_type(ids, json_type_double)) || !(ms >= 0) ||
			    (w->nreqs > 1 && ms / 1000.0 < w->reqs[w->nreqs - 2].t))
				why = "timestamp must be a number of milliseconds, never going back";
			else
				w->reqs[w->nreqs - 1].t = ms / 1000.0;
		}
		json_object_put(obj);
		if (why) {
			fprintf(stderr, "kvpaged-bench: %s:%zu: %s\n", path, lineno, why);
			r = -EINVAL;
			break;
		}
	}
	if (!r && w->nreqs == 0) {
		fprintf(stderr, "kvpaged-bench: %s: no requests\n", path);
		r = -EINVAL;
	}
	free(segs);
	free(line);
	fclose(f);
	return r;
}

static const char *const policy_name[] = { "lru", "value" };

/* Every policy at every capacity, one row each, then Belady's, then the infinite cache. */
static int replay_policies(const struct workload *w, uint32_t B, const uint32_t *caps,
			   uint32_t ncaps, uint32_t host, uint32_t file, bool prompt_only,
			   bool belady, const uint32_t *policies, uint32_t npolicies, bool json,
			   const char *trace)
{
	struct replay_result res, inf = { 0 };
	int r = 0;

	if (!json) {
		printf("trace %s: %u requests, block %u tokens%s\n", trace, w->nreqs, B,
		       prompt_only ? ", prompts only" : "");
		printf("%-8s", "policy");
		replay_print_header(false);
	}
	for (uint32_t i = 0; i < ncaps && r == 0; i++) {
		if (caps[i] == 0) {
			fprintf(stderr, "kvpaged-bench: capacity 0 is not a pool\n");
			return -EINVAL;
		}
		for (uint32_t p = 0; p < npolicies + belady && r == 0; p++) {
			if (p < npolicies) {
				r = replay_core_policy(w, B, caps[i], host, file, prompt_only,
						       policies[p], &res);
				res.policy = policy_name[policies[p]];
			} else {
				/* The same admissions; its own hits in the hit columns. */
				r = replay_core_policy(w, B, caps[i], 0, 0, prompt_only,
						       CORE_EVICT_LRU, &res);
				if (r == 0)
					r = replay_belady(w, B, caps[i], prompt_only, &res);
				res.policy = "belady";
				res.blocks = res.belady_blocks;
				res.hit_blocks = res.belady_hit_blocks;
				res.rejected = res.belady_rejected;
				res.evictions = 0;
				res.core_ns = res.ops = res.wall_ns = 0;
				res.tier_capacity[REPLAY_HOST] = res.tier_capacity[REPLAY_FILE] = 0;
				res.belady_hit_fraction = -1;
			}
			if (r < 0) {
				fprintf(stderr, "kvpaged-bench: replay at capacity %u: %s\n",
					caps[i], strerror(-r));
				break;
			}
			if (!json)
				printf("%-8s", res.policy);
			replay_print(&res, json);
			fflush(stdout);
		}
	}
	if (r == 0) {
		replay_infinite(w, B, &inf);
		inf.policy = "infinite";
		inf.block_tokens = B;
		inf.requests = w->nreqs;
		inf.belady_hit_fraction = -1;
		if (!json) {
			printf("%-8s%10s %6u %9u %8" PRIu64 " %8" PRIu64 " %9.4f\n", inf.policy, "inf",
			       B, inf.requests, inf.blocks, inf.hit_blocks,
			       inf.blocks ? (double)inf.hit_blocks / (double)inf.blocks : 0);
		} else {
			replay_print(&inf, true);
		}
	}
	return r;
}

static void replay_usage(FILE *f)
{
	fputs("usage: kvpaged-bench replay --trace FILE --block-tokens N --capacity-blocks N[,N...]\n"
	      "                            [--host-tier-blocks N] [--file-tier-blocks N]\n"
	      "                            [--prompt-only] [--reference belady] [--requests N] [--json]\n"
	      "                            [--policy lru,value]\n"
	      "       kvpaged-bench replay --trace FILE --block-tokens N --daemon SOCKET\n"
	      "                            [--daemon SOCKET...]\n"
	      "                            [--clients N] [--ring [--spin-us US]] [--ordered]\n"
	      "                            [--admin SOCKET] [--policy lru|value] [--speed X]\n"
	      "                            [--prompt-only] [--reference belady] [--requests N] [--json]\n"
	      "\n"
	      "Replays the trace in file order through the block manager: each request opens a\n"
	      "sequence with its prompt, commits it, appends output_length tokens one at a time\n"
	      "(unless --prompt-only) and closes.  One line (or JSON object) per capacity.\n"
	      "--host-tier-blocks and --file-tier-blocks put tiers below the pool (bookkeeping\n"
	      "only): blocks evicted from the pool are demoted there and promoted on a hit; the\n"
	      "hit fraction counts hits from every tier, and the split by tier follows.\n"
	      "--policy runs each eviction policy listed on the same trace, one row each per\n"
	      "capacity (the core's clock is the trace's timestamps), then the Belady row with\n"
	      "--reference belady, and once the infinite cache's bound.\n"
	      "\n"
	      "With --daemon, N client processes replay it through a running kvpaged (request i\n"
	      "goes to client i % N), over the socket or the rings; the capacity is the pool's,\n"
	      "and the in-process replay at that capacity is printed beside it.  --ordered opens\n"
	      "the requests in trace order across the clients.  --admin reads the pool's\n"
	      "evictions from the admin socket.  --daemon given more than once deals the requests\n"
	      "round-robin across the daemons (request i to node i % nodes), N clients each; the\n"
	      "in-process replay then runs at their capacities summed, and each node's hit\n"
	      "fraction follows the total.  --policy names the pools' eviction policy, which the\n"
	      "in-process replay then uses (checked against the pool with --admin); --speed X\n"
	      "opens each request at its timestamp divided by X from the start, so that the\n"
	      "daemon's clock keeps the trace's gaps (the value policy learns from them).\n",
	      f);
}

int cmd_replay(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "trace", required_argument, NULL, 't' },
		{ "block-tokens", required_argument, NULL, 'b' },
		{ "capacity-blocks", required_argument, NULL, 'c' },
		{ "prompt-only", no_argument, NULL, 'p' },
		{ "reference", required_argument, NULL, 'r' },
		{ "requests", required_argument, NULL, 'n' },
		{ "json", no_argument, NULL, 'j' },
		{ "daemon", required_argument, NULL, 'd' },
		{ "clients", required_argument, NULL, 'C' },
		{ "ring", no_argument, NULL, 'R' },
		{ "spin-us", required_argument, NULL, 'S' },
		{ "admin", required_argument, NULL, 'a' },
		{ "ordered", no_argument, NULL, 'o' },
		{ "host-tier-blocks", required_argument, NULL, 'H' },
		{ "file-tier-blocks", required_argument, NULL, 'F' },
		{ "policy", required_argument, NULL, 'P' },
		{ "speed", required_argument, NULL, 'X' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	uint32_t caps[MAX_CAPACITIES], B = 0, max_requests = 0, host = 0, file = 0;
	struct replay_daemon_options remote = { .clients = 1 };
	bool clients_given = false, spin_given = false;
	const char *trace = NULL;
	bool prompt_only = false, json = false, belady = false;
	uint32_t policies[4], npolicies = 0;
	double speed = 0;
	int ncaps = 0, opt, r;
	struct workload w;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 't':
			trace = optarg;
			break;
		case 'b':
			if (parse_u32(optarg, &B) < 0 || B == 0) {
				fprintf(stderr, "kvpaged-bench: --block-tokens: not a positive integer: %s\n", optarg);
				return 2;
			}
			break;
		case 'c':
			ncaps = parse_u32_list(optarg, caps, MAX_CAPACITIES);
			if (ncaps < 0) {
				fprintf(stderr, "kvpaged-bench: --capacity-blocks: expected N[,N...]: %s\n", optarg);
				return 2;
			}
			break;
		case 'p':
			prompt_only = true;
			break;
		case 'r':
			if (strcmp(optarg, "belady")) {
				fprintf(stderr, "kvpaged-bench: --reference: only 'belady' is known\n");
				return 2;
			}
			belady = true;
			break;
		case 'n':
			if (parse_u32(optarg, &max_requests) < 0) {
				fprintf(stderr, "kvpaged-bench: --requests: not an integer: %s\n", optarg);
				return 2;
			}
			break;
		case 'j':
			json = true;
			break;
		case 'd':
			if (remote.nodes == REPLAY_MAX_NODES) {
				fprintf(stderr, "kvpaged-bench: --daemon: at most %u\n",
					REPLAY_MAX_NODES);
				return 2;
			}
			remote.sockets[remote.nodes++] = optarg;
			break;
		case 'C':
			if (parse_u32(optarg, &remote.clients) < 0 || remote.clients == 0 ||
			    remote.clients > MAX_CLIENTS) {
				fprintf(stderr, "kvpaged-bench: --clients: 1..%u\n", MAX_CLIENTS);
				return 2;
			}
			clients_given = true;
			break;
		case 'R':
			remote.ring = true;
			break;
		case 'S':
			if (parse_u32(optarg, &remote.spin_us) < 0) {
				fprintf(stderr, "kvpaged-bench: --spin-us: not an integer: %s\n",
					optarg);
				return 2;
			}
			spin_given = true;
			break;
		case 'a':
			remote.admin = optarg;
			break;
		case 'o':
			remote.ordered = true;
			break;
		case 'H':
		case 'F':
			if (parse_u32(optarg, opt == 'H' ? &host : &file) < 0) {
				fprintf(stderr, "kvpaged-bench: --%s-tier-blocks: not an integer: %s\n",
					opt == 'H' ? "host" : "file", optarg);
				return 2;
			}
			break;
		case 'P': {
			char *list = strdup(optarg), *save = NULL;

			npolicies = 0;
			for (char *tok = strtok_r(list, ",", &save); tok;
			     tok = strtok_r(NULL, ",", &save)) {
				uint32_t e = !strcmp(tok, "lru")     ? CORE_EVICT_LRU
					     : !strcmp(tok, "value") ? CORE_EVICT_VALUE
								     : UINT32_MAX;

				if (e == UINT32_MAX || npolicies == 4) {
					fprintf(stderr, "kvpaged-bench: --policy: expected lru and "
						"value, comma-separated: %s\n", optarg);
					free(list);
					return 2;
				}
				policies[npolicies++] = e;
			}
			free(list);
			if (!npolicies) {
				fprintf(stderr, "kvpaged-bench: --policy: no policy named\n");
				return 2;
			}
			break;
		}
		case 'X': {
			char *end;

			speed = strtod(optarg, &end);
			if (*end || end == optarg || !(speed > 0) || speed > 1e9) {
				fprintf(stderr, "kvpaged-bench: --speed: a positive number: %s\n",
					optarg);
				return 2;
			}
			break;
		}
		case 'h':
			replay_usage(stdout);
			return 0;
		default:
			replay_usage(stderr);
			return 2;
		}
	}
	if (remote.nodes && (host || file)) {
		fprintf(stderr, "kvpaged-bench: --host-tier-blocks and --file-tier-blocks are the "
			"daemon's pool settings with --daemon\n");
		return 2;
	}
	if (!trace || !B || optind != argc || (remote.nodes ? ncaps != 0 : ncaps <= 0)) {
		if (remote.nodes && ncaps)
			fprintf(stderr, "kvpaged-bench: --capacity-blocks: with --daemon the "
				"capacity is the pool's\n");
		replay_usage(stderr);
		return 2;
	}
	if (!remote.nodes &&
	    (clients_given || remote.ring || remote.admin || spin_given || remote.ordered)) {
		fprintf(stderr, "kvpaged-bench: --clients, --ring, --spin-us, --ordered and "
			"--admin need --daemon\n");
		return 2;
	}
	if (remote.nodes > 1 && remote.admin) {
		fprintf(stderr, "kvpaged-bench: --admin needs a single --daemon\n");
		return 2;
	}
	if (remote.clients * remote.nodes > MAX_CLIENTS) {
		fprintf(stderr, "kvpaged-bench: --clients times the daemons: at most %u\n",
			MAX_CLIENTS);
		return 2;
	}
	if (speed > 0 && !remote.nodes) {
		fprintf(stderr, "kvpaged-bench: --speed needs --daemon (in-process, the clock is "
			"the trace's)\n");
		return 2;
	}
	if (spin_given && !remote.ring) {
		fprintf(stderr, "kvpaged-bench: --spin-us needs --ring\n");
		return 2;
	}
	if (workload_init(&w) < 0)
		return 1;
	r = workload_load_trace(trace, &w, max_requests);
	if (r < 0) {
		workload_free(&w);
		return 1;
	}
	if (remote.nodes && npolicies > 1) {
		fprintf(stderr, "kvpaged-bench: --policy with --daemon names the pools' one policy "
			"(eviction), for the in-process replay beside them\n");
		workload_free(&w);
		return 2;
	}
	if (!remote.nodes && npolicies) {
		r = replay_policies(&w, B, caps, (uint32_t)ncaps, host, file, prompt_only, belady,
				    policies, npolicies, json, trace);
		workload_free(&w);
		return r < 0 ? 1 : 0;
	}
	if (remote.nodes) {
		remote.eviction = npolicies ? policies[0] : CORE_EVICT_LRU;
		remote.speed = speed;
		remote.prompt_only = prompt_only;
		remote.belady = belady;
		remote.json = json;
		if (!json)
			printf("trace %s: %u requests, block %u tokens%s\n", trace, w.nreqs, B,
			       prompt_only ? ", prompts only" : "");
		r = replay_daemon(&w, B, &remote);
		workload_free(&w);
		return r < 0 ? 1 : 0;
	}
	if (!json) {
		printf("trace %s: %u requests, block %u tokens%s\n", trace, w.nreqs, B,
		       prompt_only ? ", prompts only" : "");
		replay_print_header(belady);
	}
	for (int i = 0; i < ncaps; i++) {
		struct replay_result res;

		if (caps[i] == 0) {
			fprintf(stderr, "kvpaged-bench: capacity 0 is not a pool\n");
			r = -EINVAL;
			break;
		}
		r = replay_core_tiers(&w, B, caps[i], host, file, prompt_only, &res);
		if (r == 0 && belady)
			r = replay_belady(&w, B, caps[i], prompt_only, &res);
		if (r < 0) {
			fprintf(stderr, "kvpaged-bench: replay at capacity %u: %s\n", caps[i], strerror(-r));
			break;
		}
		replay_print(&res, json);
		fflush(stdout);
	}
	workload_free(&w);
	return r < 0 ? 1 : 0;
}

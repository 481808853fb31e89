/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-bench: benchmarks of kvpaged.  Speed is measured here, never asserted in tests.
 * Every figure that is compared with a limit (raw XXH3, the offline optimum, an ideal hit
 * fraction) is measured or computed in the same run.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/bench/bench.h"

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

double median_u64(uint64_t *v, size_t n)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), cmp_u64);
	return n % 2 ? (double)v[n / 2] : ((double)v[n / 2 - 1] + (double)v[n / 2]) / 2;
}

int parse_u32(const char *s, uint32_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || v > UINT32_MAX || s[0] == '-')
		return -1;
	*out = (uint32_t)v;
	return 0;
}

int parse_u32_list(const char *s, uint32_t *out, int max)
{
	char buf[256], *save = NULL, *tok;
	int n = 0;

	if (strlen(s) >= sizeof(buf))
		return -1;
	strcpy(buf, s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n == max || parse_u32(tok, &out[n]) < 0)
			return -1;
		n++;
	}
	return n ? n : -1;
}

void json_print(json_object *o)
{
	puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	json_object_put(o);
}

static void usage(FILE *f)
{
	fputs("usage: kvpaged-bench COMMAND [OPTIONS]\n"
	      "\n"
	      "  replay      replay a Mooncake-format trace through the block manager or a daemon\n"
	      "  route       a trace across several daemons by prefix, round-robin, ... routers\n"
	      "  gsp         generated shared-prefix workload against its ideal hit fraction\n"
	      "  micro       ns per operation of the core, beside raw XXH3-128\n"
	      "  latency     one-token append round trips through a daemon, beside bare limits\n"
	      "  throughput  batched ring appends per second from several client processes\n"
	      "  swap        file tier GB/s beside fio, host tier beside memcpy\n"
	      "  stall       round trips while another client brings blocks back from the tiers\n"
	      "  seal        remote-tier AES-256-GCM seal and open GB/s beside memcpy\n"
	      "  redis       remote-tier cluster client GET/SET GB/s beside plain hiredis\n"
	      "  remote      remote-tier thread store/fetch GB/s (sealed) beside plain hiredis\n"
	      "\n"
	      "Run 'kvpaged-bench COMMAND --help' for a command's options.\n",
	      f);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "replay"))
		return cmd_replay(argc - 1, argv + 1);
	if (!strcmp(argv[1], "route"))
		return cmd_route(argc - 1, argv + 1);
	if (!strcmp(argv[1], "gsp"))
		return cmd_gsp(argc - 1, argv + 1);
	if (!strcmp(argv[1], "micro"))
		return cmd_micro(argc - 1, argv + 1);
	if (!strcmp(argv[1], "latency"))
		return cmd_latency(argc - 1, argv + 1);
	if (!strcmp(argv[1], "throughput"))
		return cmd_throughput(argc - 1, argv + 1);
	if (!strcmp(argv[1], "swap"))
		return cmd_swap(argc - 1, argv + 1);
	if (!strcmp(argv[1], "stall"))
		return cmd_stall(argc - 1, argv + 1);
	if (!strcmp(argv[1], "seal"))
		return cmd_seal(argc - 1, argv + 1);
	if (!strcmp(argv[1], "redis"))
		return cmd_redis(argc - 1, argv + 1);
	if (!strcmp(argv[1], "remote"))
		return cmd_remote(argc - 1, argv + 1);
	fprintf(stderr, "kvpaged-bench: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}

/* SPDX-License-Identifier: MIT */
/* kvpaged-bench: shared helpers of the subcommands. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <json-c/json.h>

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* splitmix64: the bench's deterministic token and workload generator. */
static inline uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Token ids drawn from a Llama-sized vocabulary. */
#define BENCH_VOCAB 32000u

static inline uint32_t token_of(uint64_t stream, uint64_t pos)
{
	return (uint32_t)(mix64(stream * 0x100000001b3ull ^ mix64(pos)) % BENCH_VOCAB);
}

double median_u64(uint64_t *v, size_t n);

/* Parses "1,2,3" into up to max values; returns the count or -1. */
int parse_u32_list(const char *s, uint32_t *out, int max);
int parse_u32(const char *s, uint32_t *out);

/* Prints one JSON object per line and frees it. */
void json_print(json_object *o);

int cmd_replay(int argc, char **argv);
int cmd_gsp(int argc, char **argv);
int cmd_micro(int argc, char **argv);
int cmd_latency(int argc, char **argv);
int cmd_throughput(int argc, char **argv);
int cmd_swap(int argc, char **argv);
int cmd_stall(int argc, char **argv);
int cmd_seal(int argc, char **argv);
int cmd_route(int argc, char **argv);
int cmd_redis(int argc, char **argv);
int cmd_remote(int argc, char **argv);

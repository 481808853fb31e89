/* SPDX-License-Identifier: MIT */
/*
 * The load and the attacks of tests/stress/stress.sh, one process each:
 *
 *   stress-client work SOCKET SECONDS [--rings] [--seed N]
 *       An engine at work until killed or out of time: prompts sharing a few prefixes are
 *       opened, appended to, committed, forked, parked, resumed and closed; with --rings the
 *       lookups and opens also go through the shared-memory rings.  Refusals a busy pool
 *       gives (ENOSPC, EDQUOT, EMFILE, EUSERS) are expected; any other error exits 1.
 *
 *   stress-client flood SOCKET N SECONDS [--as USER]
 *       An attacker: N connections that never say Hello, each made again as soon as the
 *       daemon drops it.  With --as, switches to USER first (needs root).  Prints how many
 *       connections it made.
 */
#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "libclient/include/kvpaged.h"

static uint64_t rng = 88172645463325252ull;

static uint32_t rnd(uint32_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng % n);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A refusal a pool under load may give: not a bug. */
static bool expected(int r)
{
	return r == -ENOSPC || r == -EDQUOT || r == -EMFILE || r == -EUSERS;
}

#define CHECK(call)                                                                           \
	do {                                                                                  \
		int r_ = (call);                                                              \
		if (r_ < 0 && !expected(r_)) {                                                \
			fprintf(stderr, "stress-client: %s: %d (%s)\n", #call, r_,            \
				kvp_last_error(c));                                           \
			return 1;                                                             \
		}                                                                             \
	} while (0)

/* A prompt: one of eight prefixes of 256 tokens, then a random tail. */
static uint32_t make_prompt(uint32_t *t, uint32_t max)
{
	uint32_t prefix = rnd(8), n = 256 + rnd(max - 256);

	for (uint32_t i = 0; i < n; i++)
		t[i] = i < 256 ? prefix * 1000 + i : rnd(30000);
	return n;
}

static int work(const char *socket, double seconds, bool rings)
{
	struct kvp_connect_options o = { .size = sizeof(o), .socket_path = socket,
					 .ns = "stress", .client_name = "stress-work",
					 .ring_entries = rings ? 64 : 0,
					 .ring_data_bytes = rings ? 1u << 18 : 0 };
	static uint32_t t[1024], table[128];
	struct kvp_client *c = NULL;
	double end = now_s() + seconds;
	int r = kvp_connect(&o, &c);

	if (r < 0) {
		/* Refused under load (the per-uid cap, the fds): a real engine would retry. */
		return expected(r) ? 0 : 1;
	}
	while (now_s() < end) {
		uint32_t n = make_prompt(t, 1024), cached = 0;
		uint64_t seq, child;

		if (rings) {
			struct kvp_op op = { .opcode = KVP_LOOKUP, .tokens = t, .ntokens = n };
			struct kvp_completion comp;

			if (kvp_submit(c, &op, 1) == 1 && kvp_complete(c, &comp, 1, 1, 5000) < 0) {
				fprintf(stderr, "stress-client: ring lookup: %s\n", kvp_last_error(c));
				return 1;
			}
			op = (struct kvp_op){ .opcode = KVP_OPEN, .tokens = t, .ntokens = n,
					      .table_cap = 128, .table_out = table };
			if (kvp_submit(c, &op, 1) == 1) {
				if (kvp_complete(c, &comp, 1, 1, 5000) < 1)
					return 1;
				if (comp.res == 0) {
					op = (struct kvp_op){ .opcode = KVP_CLOSE, .seq = comp.value };
					if (kvp_submit(c, &op, 1) == 1)
						kvp_complete(c, &comp, 1, 1, 5000);
				} else if (!expected(comp.res)) {
					fprintf(stderr, "stress-client: ring open: %d\n", comp.res);
					return 1;
				}
			}
		}
		r = kvp_open(c, t, n, 0, 0, &seq, &cached, NULL);
		if (r < 0) {
			CHECK(r);
			continue;
		}
		CHECK(kvp_commit(c, seq, n, NULL));
		if (rnd(2)) {
			r = kvp_append(c, seq, t, 16, NULL);
			CHECK(r);
			if (r >= 0)
				CHECK(kvp_commit(c, seq, n + 16, NULL));
		}
		if (rnd(3) == 0 && kvp_fork(c, seq, &child, NULL) == 0) {
			CHECK(kvp_append(c, child, t, 5, NULL));
			CHECK(kvp_close(c, child));
		}
		if (rnd(3) == 0 && kvp_park(c, seq) == 0) {
			uint32_t recompute;

			CHECK(kvp_lookup(c, t, n, 0, 0, &cached));
			r = kvp_resume(c, seq, &recompute, NULL);
			if (r == -ENOSPC || r == -EDQUOT) {
				CHECK(kvp_close(c, seq));
				continue;
			}
			CHECK(r);
		}
		/* Some are left open: a kill then finds sequences to clean up. */
		if (rnd(4))
			CHECK(kvp_close(c, seq));
	}
	kvp_disconnect(c);
	return 0;
}

static int connect_silently(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	if (fd < 0 || strlen(path) >= sizeof(sa.sun_path))
		return -1;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EAGAIN) {
		close(fd);
		return -1;
	}
	return fd;
}

static int flood(const char *socket, int n, double seconds, const char *user)
{
	struct pollfd *pfd = calloc((size_t)n, sizeof(*pfd));
	double end = now_s() + seconds;
	unsigned long made = 0;

	if (!pfd)
		return 1;
	if (user) {
		struct passwd *pw = getpwnam(user);

		if (!pw || setgroups(0, NULL) < 0 || setgid(pw->pw_gid) < 0 ||
		    setuid(pw->pw_uid) < 0) {
			fprintf(stderr, "stress-client: cannot become %s\n", user);
			free(pfd);
			return 77;
		}
	}
	for (int i = 0; i < n; i++) {
		pfd[i].fd = connect_silently(socket);
		pfd[i].events = POLLIN;
		made += pfd[i].fd >= 0;
	}
	while (now_s() < end) {
		if (poll(pfd, (nfds_t)n, 50) < 0) {
			free(pfd);
			return 1;
		}
		for (int i = 0; i < n; i++) {
			char buf[512];

			if (pfd[i].fd >= 0 && !pfd[i].revents)
				continue;
			if (pfd[i].fd >= 0 && read(pfd[i].fd, buf, sizeof(buf)) > 0)
				continue;
			if (pfd[i].fd >= 0)
				close(pfd[i].fd);
			pfd[i].fd = connect_silently(socket);
			made += pfd[i].fd >= 0;
		}
	}
	printf("%lu\n", made);
	for (int i = 0; i < n; i++)
		if (pfd[i].fd >= 0)
			close(pfd[i].fd);
	free(pfd);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 4 && !strcmp(argv[1], "work")) {
		bool rings = false;

		for (int i = 4; i < argc; i++) {
			if (!strcmp(argv[i], "--rings"))
				rings = true;
			else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
				rng ^= strtoull(argv[++i], NULL, 10) * 0x9e3779b97f4a7c15ull;
		}
		return work(argv[2], atof(argv[3]), rings);
	}
	if (argc >= 5 && !strcmp(argv[1], "flood"))
		return flood(argv[2], atoi(argv[3]), atof(argv[4]),
			     argc >= 7 && !strcmp(argv[5], "--as") ? argv[6] : NULL);
	fprintf(stderr, "usage: stress-client work SOCKET SECONDS [--rings] [--seed N]\n"
			"       stress-client flood SOCKET N SECONDS [--as USER]\n");
	return 2;
}

/* SPDX-License-Identifier: MIT */
/*
 * ops-client: the client side of the operations tests (tests/ops/).  Each mode prints one line
 * per step on stdout, flushed, so a test can wait for it:
 *
 *   ops-client open SOCKET TOKENS [TIMES [FIRST [POOL [NAMESPACE]]]]
 *                                           open, commit and close a TOKENS-token prompt
 *                                           (FIRST, FIRST + 1, ...; default 1) TIMES times,
 *                                           in POOL (default: the first) and NAMESPACE;
 *                                           prints "cached=N" for the last one
 *   ops-client hold SOCKET TOKENS           keep a committed sequence open until stdin ends
 *   ops-client loop SOCKET                  open/commit/close until the daemon goes away; a
 *                                           clean end (the connection closed) exits 0
 *   ops-client wait SOCKET TOKENS WAIT_MS   one open that waits for memory; prints its result
 *   ops-client flood ADMIN_SOCKET           send admin requests and never read a reply
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "libclient/include/kvpaged.h"
#include "proto/frame.h"
#include "proto/kvpaged.pb-c.h"

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static struct kvp_client *connect_in(const char *path, const char *pool, const char *ns)
{
	struct kvp_connect_options o = { .size = sizeof(o), .socket_path = path,
					 .client_name = "ops-client", .pool = pool, .ns = ns };
	struct kvp_client *c = NULL;
	char err[256] = "";
	int r;

	o.error_buf = err;
	o.error_len = sizeof(err);
	r = kvp_connect(&o, &c);
	if (r < 0) {
		printf("connect failed: %s (%s)\n", strerror(-r), err);
		exit(1);
	}
	return c;
}

static struct kvp_client *connect_to(const char *path)
{
	return connect_in(path, NULL, NULL);
}

static uint32_t *prompt(uint32_t n, uint32_t first)
{
	uint32_t *t = calloc(n ? n : 1, sizeof(*t));

	if (!t)
		exit(1);
	for (uint32_t i = 0; i < n; i++)
		t[i] = first + i % 500;
	return t;
}

/* One request cycle; 0 or the first error. */
static int cycle(struct kvp_client *c, const uint32_t *tokens, uint32_t n, uint32_t *ret_cached)
{
	struct kvp_table table = { 0 };
	uint64_t seq;
	int r;

	r = kvp_open(c, tokens, n, 0, 0, &seq, ret_cached, &table);
	if (r < 0)
		goto out;
	r = kvp_commit(c, seq, n, &table);
	if (r >= 0)
		r = kvp_close(c, seq);
out:
	kvp_table_free(&table);
	return r < 0 ? r : 0;
}

static int mode_open(const char *path, uint32_t n, unsigned times, uint32_t first,
		     const char *pool, const char *ns)
{
	struct kvp_client *c = connect_in(path, pool, ns);
	uint32_t *tokens = prompt(n, first), cached = 0;
	int r = 0;

	for (unsigned i = 0; i < times && r == 0; i++)
		r = cycle(c, tokens, n, &cached);
	if (r < 0)
		printf("error: %s (%s)\n", strerror(-r), kvp_last_error(c));
	else
		printf("cached=%u\n", cached);
	kvp_disconnect(c);
	free(tokens);
	return r < 0;
}

static int mode_hold(const char *path, uint32_t n)
{
	struct kvp_client *c = connect_to(path);
	struct kvp_table table = { 0 };
	uint32_t *tokens = prompt(n, 1), cached;
	uint64_t seq;
	char buf[64];
	int r;

	r = kvp_open(c, tokens, n, 0, 0, &seq, &cached, &table);
	if (r == 0)
		r = kvp_commit(c, seq, n, &table);
	if (r < 0) {
		printf("error: %s (%s)\n", strerror(-r), kvp_last_error(c));
		return 1;
	}
	printf("held\n");
	fflush(stdout);
	while (read(0, buf, sizeof(buf)) > 0)
		;
	kvp_table_free(&table);
	kvp_disconnect(c);
	free(tokens);
	return 0;
}

static int mode_loop(const char *path)
{
	struct kvp_client *c = connect_to(path);
	uint32_t *tokens = prompt(64, 1), cached;
	unsigned long done = 0;
	int r;

	printf("connected\n");
	fflush(stdout);
	while ((r = cycle(c, tokens, 64, &cached)) == 0)
		done++;
	printf("stopped after %lu cycles: %s (%s)\n", done, strerror(-r), kvp_last_error(c));
	kvp_disconnect(c);
	free(tokens);
	/* The daemon closing the connection is a clean end; any other error is not. */
	return r == -ECONNRESET || r == -EPIPE || r == -ENOTCONN ? 0 : 1;
}

static int mode_wait(const char *path, uint32_t n, uint32_t wait_ms)
{
	struct kvp_client *c = connect_to(path);
	struct kvp_table table = { 0 };
	uint32_t *tokens = prompt(n, 100000), cached; /* shares nothing with hold */
	uint64_t seq;
	double t;
	int r;

	kvp_set_wait(c, wait_ms);
	printf("waiting\n");
	fflush(stdout);
	t = now_ms();
	r = kvp_open(c, tokens, n, 0, 0, &seq, &cached, &table);
	printf("result=%s after %.0f ms\n", r < 0 ? strerror(-r) : "ok", now_ms() - t);
	kvp_table_free(&table);
	kvp_disconnect(c);
	free(tokens);
	return 0;
}

static int mode_flood(const char *path)
{
	Kvpaged__V1__AdminRequest req = KVPAGED__V1__ADMIN_REQUEST__INIT;
	unsigned long sent = 0;
	int fd = kvp_unix_connect(path), r;

	if (fd < 0) {
		printf("connect failed: %s\n", strerror(-fd));
		return 1;
	}
	req.pool = (char *)"";
	/* Until the socket is full: the daemon then holds replies this client never reads. */
	while ((r = kvp_frame_send_nonblocking(fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_METRICS, 1,
					       &req.base)) == 0 &&
	       sent < 1000000)
		sent++;
	printf("stuck after %lu requests (%s)\n", sent, strerror(-r));
	fflush(stdout);
	for (;;)
		pause();
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 4 && !strcmp(argv[1], "open"))
		return mode_open(argv[2], (uint32_t)atoi(argv[3]),
				 argc > 4 ? (unsigned)atoi(argv[4]) : 1,
				 argc > 5 ? (uint32_t)atoi(argv[5]) : 1, argc > 6 ? argv[6] : NULL,
				 argc > 7 ? argv[7] : NULL);
	if (argc == 4 && !strcmp(argv[1], "hold"))
		return mode_hold(argv[2], (uint32_t)atoi(argv[3]));
	if (argc == 3 && !strcmp(argv[1], "loop"))
		return mode_loop(argv[2]);
	if (argc == 5 && !strcmp(argv[1], "wait"))
		return mode_wait(argv[2], (uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]));
	if (argc == 3 && !strcmp(argv[1], "flood"))
		return mode_flood(argv[2]);
	fprintf(stderr, "usage: ops-client open|hold|loop|wait|flood SOCKET [ARGS]\n");
	return 2;
}

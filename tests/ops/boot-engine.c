/* SPDX-License-Identifier: MIT */
/*
 * boot-engine: the engine of tests/ops/boot.test.  It is built inside the booted container
 * against the installed libkvpaged-dev (cc boot-engine.c $(pkg-config --cflags --libs
 * libkvpaged)), so it uses only the public header, as an engine would.
 *
 *   boot-engine open SOCKET TOKENS FIRST   open, commit and close a TOKENS-token prompt
 *                                           (token ids FIRST, FIRST + 1, ...); prints
 *                                           "cached=N", the tokens the prefix cache served
 *   boot-engine loop SOCKET                 prints "connected", then opens, commits and
 *                                           closes until the daemon closes the connection:
 *                                           exits 0 on a clean close, 1 on any other error
 *
 * A failure prints "error: ..." and exits 1.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvpaged.h>

static struct kvp_client *attach(const char *path)
{
	struct kvp_connect_options o = { .size = sizeof(o), .socket_path = path,
					 .client_name = "boot-engine",
					 /* shared-memory rings: memfd, eventfds, fds passed */
					 .ring_entries = 16, .ring_data_bytes = 16384 };
	struct kvp_client *c = NULL;
	char err[256] = "";
	int r;

	o.error_buf = err;
	o.error_len = sizeof(err);
	r = kvp_connect(&o, &c);
	if (r < 0) {
		printf("error: connect: %s (%s)\n", strerror(-r), err);
		exit(1);
	}
	return c;
}

static int cycle(struct kvp_client *c, const uint32_t *tokens, uint32_t n, uint32_t *cached)
{
	struct kvp_table table = { 0 };
	uint64_t seq;
	int r;

	r = kvp_open(c, tokens, n, 0, 0, &seq, cached, &table);
	if (r == 0)
		r = kvp_commit(c, seq, n, &table);
	if (r == 0)
		r = kvp_close(c, seq);
	kvp_table_free(&table);
	return r;
}

int main(int argc, char **argv)
{
	uint32_t n = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 10) : 64;
	uint32_t first = argc > 4 ? (uint32_t)strtoul(argv[4], NULL, 10) : 1;
	uint32_t *tokens, cached = 0;
	struct kvp_client *c;
	unsigned long done = 0;
	int r;

	if (argc < 3 || (strcmp(argv[1], "open") && strcmp(argv[1], "loop")) || n == 0) {
		fprintf(stderr, "usage: boot-engine open SOCKET TOKENS FIRST | loop SOCKET\n");
		return 2;
	}
	tokens = calloc(n, sizeof(*tokens));
	if (!tokens)
		return 1;
	for (uint32_t i = 0; i < n; i++)
		tokens[i] = first + i;
	c = attach(argv[2]);
	if (!strcmp(argv[1], "open")) {
		r = cycle(c, tokens, n, &cached);
		if (r < 0)
			printf("error: %s (%s)\n", strerror(-r), kvp_last_error(c));
		else
			printf("cached=%u\n", cached);
		kvp_disconnect(c);
		free(tokens);
		return r < 0;
	}
	printf("connected\n");
	fflush(stdout);
	while ((r = cycle(c, tokens, n, &cached)) == 0)
		done++;
	printf("stopped after %lu cycles: %s (%s)\n", done, strerror(-r), kvp_last_error(c));
	kvp_disconnect(c);
	free(tokens);
	return r == -ECONNRESET || r == -EPIPE || r == -ENOTCONN ? 0 : 1;
}

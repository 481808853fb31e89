/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the configuration parser (daemon/config.c), on text in memory as
 * config_load_file() hands it over once the file is read.  A file is written by an operator,
 * not a peer, but it is parsed by a daemon that starts as root, and by every SIGHUP and
 * `kvpagedctl reload`.  Whatever the text:
 *
 * - a refusal is a negative errno with a one-line message, and leaves *ret untouched;
 * - what a load accepts, printed as `kvpaged --check-config` prints it, loads again, is the
 *   same configuration (config_apply_live() finds no difference, not even a refused one), and
 *   prints the same text again (config.h promises the round trip);
 * - every pool can be found by its name, and config_free() frees everything (leaks are
 *   AddressSanitizer's to find, in libFuzzer and in the replay build under the sanitizers).
 *
 * User and group names (allow_users, allow_groups, admin_group) are looked up through NSS, as
 * the daemon does: on a build machine that reads /etc/passwd and /etc/group, and nothing else
 * is read.  The printed form names ids, so the round trip looks nothing up.
 *
 * Built twice: with libFuzzer (configure --enable-fuzzers) and, with any compiler, as a replay
 * program over the committed seeds (tests/fuzz/replay.c, tests/fuzz/replay.test).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/config.h"

static char *print_config(const struct kvpd_config *c)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		abort();
	config_print(c, f);
	if (fclose(f) != 0)
		abort();
	return text;
}

static void on_difference(void *ctx, bool applied, const char *what)
{
	fprintf(stderr, "fuzz-config: the printed configuration loads differently: %s (%s)\n",
		what, applied ? "applied" : "refused");
	fprintf(stderr, "--- printed:\n%s---\n", (const char *)ctx);
	abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvpd_config cfg, again, untouched;
	char err[512], *text, *printed, *reprinted;
	int r;

	/* What config_load_file() refuses before parsing: a NUL byte, more than 1 MiB. */
	if (size > (1u << 20) || memchr(data, '\0', size))
		return 0;
	text = malloc(size + 1);
	if (!text)
		abort();
	memcpy(text, data, size);
	text[size] = '\0';

	memset(&cfg, 0xa5, sizeof(cfg));
	untouched = cfg;
	err[0] = '\0';
	r = config_load_string(text, "fuzz.conf", &cfg, err, sizeof(err));
	free(text);
	if (r < 0) {
		/* -EINVAL for the text; an NSS failure may bring any errno (config.h). */
		if (r < -4095) {
			fprintf(stderr, "fuzz-config: unexpected error %d: %s\n", r, err);
			abort();
		}
		if (!err[0] || strlen(err) >= sizeof(err) || strchr(err, '\n')) {
			fprintf(stderr, "fuzz-config: error %d without a one-line message\n", r);
			abort();
		}
		if (memcmp(&cfg, &untouched, sizeof(cfg))) {
			fprintf(stderr, "fuzz-config: a failed load changed *ret: %s\n", err);
			abort();
		}
		return 0;
	}
	if (r != 0 || cfg.npools < 1) {
		fprintf(stderr, "fuzz-config: load returned %d with %zu pools\n", r, cfg.npools);
		abort();
	}
	for (size_t i = 0; i < cfg.npools; i++)
		if (config_find_pool(&cfg, cfg.pools[i].name) != &cfg.pools[i])
			abort(); /* names are unique, so each finds its own pool */
	if (config_find_pool(&cfg, NULL) != &cfg.pools[0])
		abort();

	printed = print_config(&cfg);
	if (config_load_string(printed, "printed.conf", &again, err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz-config: the printed configuration does not load: %s\n", err);
		fprintf(stderr, "--- printed:\n%s---\n", printed);
		abort();
	}
	reprinted = print_config(&again);
	if (strcmp(printed, reprinted)) {
		fprintf(stderr, "fuzz-config: printed twice, two texts:\n%s---\n%s---\n", printed,
			reprinted);
		abort();
	}
	if (config_apply_live(&cfg, &again, on_difference, printed) != 0)
		abort(); /* (on_difference aborts first) */
	free(printed);
	free(reprinted);
	config_free(&again);
	config_free(&cfg);
	/* Frees a freed (zeroed) configuration too. */
	config_free(&cfg);
	config_free(NULL);
	return 0;
}

/* SPDX-License-Identifier: MIT */
/* kvpaged: the daemon's thin main(); everything else lives in libkvpd. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/server/server.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: kvpaged [--config FILE] [--foreground] [--check-config] [--verbose]\n"
		   "               [--drain-timeout SECONDS]\n"
		   "\n"
		   "  -c, --config FILE        configuration (default " KVPD_CONFIG_PATH ")\n"
		   "  -f, --foreground         accepted for compatibility: kvpaged never forks\n"
		   "      --check-config       check the configuration, print it as effective,\n"
		   "                           and exit\n"
		   "      --drain-timeout SEC  on SIGTERM, how long sessions may take to finish\n"
		   "                           what they sent before they are closed (default 10)\n"
		   "  -v, --verbose            log debug messages\n"
		   "      --version            print the version and exit\n"
		   "\n"
		   "Under systemd: Type=notify, the watchdog, and the sockets named 'client' and\n"
		   "'admin' by socket activation; see kvpaged(8).\n");
#ifdef KVPAGED_TEST_HOOKS
	fprintf(f, "\n"
		   "This is a test build (configure --enable-test-hooks), never for production:\n"
		   "a pool with copy_thread = yes reads $KVPAGED_TEST_COPY_DELAY_MS,\n"
		   "$KVPAGED_TEST_COPY_FAIL_AT and $KVPAGED_TEST_DEVICE_POOL, the CUDA module\n"
		   "$KVPAGED_TEST_CUDA_SWAP, and SIGUSR2 corrupts the first pool's state.\n");
#endif
}

#ifdef KVPAGED_TEST_HOOKS
#define VERSION_NOTE " (test hooks: not for production)"
#else
#define VERSION_NOTE ""
#endif

int main(int argc, char **argv)
{
	static const struct option long_opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "foreground", no_argument, NULL, 'f' },
		{ "check-config", no_argument, NULL, 'C' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "version", no_argument, NULL, 'V' },
		{ "drain-timeout", required_argument, NULL, 'D' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	const char *path = KVPD_CONFIG_PATH;
	struct server_options opts = { .drain_timeout_ms = SERVER_DRAIN_TIMEOUT_MS };
	struct kvpd_config cfg = { 0 };
	struct server srv;
	char *end;
	double seconds;
	bool check = false;
	char err[512];
	int opt, r;

	while ((opt = getopt_long(argc, argv, "c:fvh", long_opts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			path = optarg;
			break;
		case 'f':
			break;
		case 'C':
			check = true;
			break;
		case 'v':
			log_set_max_level(LOG_DEBUG);
			break;
		case 'V':
			puts("kvpaged " PACKAGE_VERSION VERSION_NOTE);
			return 0;
		case 'D':
			errno = 0;
			seconds = strtod(optarg, &end);
			if (errno || end == optarg || *end || !isfinite(seconds) || seconds < 0 ||
			    seconds > 3600) {
				fprintf(stderr, "kvpaged: --drain-timeout: '%s' is not a number of "
					"seconds in 0..3600\n", optarg);
				return 2;
			}
			opts.drain_timeout_ms = (uint32_t)(seconds * 1000 + 0.5);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	r = config_load_file(path, &cfg, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "%s%s\n", check ? "" : "<3>", err);
		return 1;
	}
	if (check) {
		config_print(&cfg, stdout);
		config_free(&cfg);
		return 0;
	}
	opts.config_path = path;
	r = server_init(&srv, &cfg, &opts);
	if (r == 0)
		r = server_run(&srv);
	server_done(&srv);
	config_free(&cfg);
	return r == 0 ? 0 : 1;
}

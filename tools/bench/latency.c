/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-bench latency and throughput: one-token appends through a running daemon.
 *
 * latency: round trips as p50/p99, each transport beside its bare limit measured in the same
 * run: the rings busy-polling beside two processes spinning on a shared counter, the rings
 * sleeping beside two processes ping-ponging on eventfds; then the socket, and the core called
 * in-process.
 *
 * throughput: client processes that each submit a batch of appends with one kvp_submit (one
 * doorbell at most) and complete them all, over and over; operations per second.
 */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/core/core.h"
#include "tools/bench/bench.h"
#include "tools/bench/remote.h"

#define STREAM_LATENCY (UINT64_C(4) << 56) /* | client: the appended tokens */
#define SEQ_MAX_TOKENS 4096 /* appends per sequence before it is closed and reopened, untimed */
#define WATCHDOG_S 120      /* one latency row never takes this long unless something hangs */
#define BUSY_SPIN_US 1000000
#define MAX_BATCH 4096      /* the daemon's default max_ring_entries */
#define MAX_CLIENTS 1024

/* Sequences stay short (SEQ_MAX_TOKENS), and never take more than a quarter of the pool. */
static uint32_t seq_max_tokens(const struct kvp_pool_info *pool)
{
	uint64_t blocks = pool->capacity_blocks / 4 ? pool->capacity_blocks / 4 : 1;
	uint64_t n = blocks * pool->block_tokens;

	return n < SEQ_MAX_TOKENS ? (uint32_t)n : SEQ_MAX_TOKENS;
}

/* ------------------------------------------------------------------ latency */

/*
 * A sleeping round trip costs very different amounts depending on where the two processes run:
 * on one CPU a wake-up is a context switch, across CPUs it wakes an idle CPU (tens of µs on a
 * virtual machine).  The scheduler places the bare eventfd pair and the daemon with its client
 * independently, so the eventfd ping-pong is also measured pinned to one CPU and to two, and the
 * sleeping ring is compared with the placement it was seen to run in.
 */
enum {
	ROW_SPIN,
	ROW_RING_BUSY,
	ROW_EVENTFD,
	ROW_EVENTFD_ONE_CPU,
	ROW_EVENTFD_TWO_CPUS,
	ROW_RING_SLEEP,
	ROW_RING_SPIN_SLEEP,
	ROW_SOCKET,
	ROW_INPROCESS,
	NROWS
};

struct lat_row {
	const char *key;  /* JSON: KEY_p50_us, KEY_p99_us */
	const char *what;
	double p50_us, p99_us;
	bool measured;
	/* Daemon rows: how often the daemon was last seen on our CPU (< 0: not known). */
	double same_cpu;
};

/* The client's spin before it sleeps in the spin-then-sleep row. */
#define SPIN_THEN_SLEEP_US 50

static struct lat_row rows[NROWS] = {
	[ROW_SPIN] = { "shm_spin", "bare shared-memory spin round trip" },
	[ROW_RING_BUSY] = { "ring_busy_poll", "ring, busy-poll (spin_us 1000000)" },
	[ROW_EVENTFD] = { "eventfd", "bare eventfd ping-pong" },
	[ROW_EVENTFD_ONE_CPU] = { "eventfd_one_cpu", "bare eventfd ping-pong, one CPU" },
	[ROW_EVENTFD_TWO_CPUS] = { "eventfd_two_cpus", "bare eventfd ping-pong, two CPUs" },
	[ROW_RING_SLEEP] = { "ring_sleep", "ring, sleeping (spin_us 0)" },
	[ROW_RING_SPIN_SLEEP] = { "ring_spin_sleep", "ring, spin 50 us, then sleep" },
	[ROW_SOCKET] = { "socket", "socket: kvp_append" },
	[ROW_INPROCESS] = { "inprocess", "in-process: core_seq_append" },
};

struct lat_run {
	const char *socket;
	struct kvp_pool_info pool;
	uint32_t iters, warm, seq_tokens;
	uint64_t *samples; /* iters of them */
	pid_t daemon_pid;  /* 0: not known */
	int cpus[2];       /* two CPUs we may run on (-1: none) */
};

static void on_watchdog(int sig)
{
	static const char msg[] = "kvpaged-bench: latency: a round trip hung; giving up\n";

	(void)sig;
	(void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
	_exit(1); /* the ping-pong children die with us (PR_SET_PDEATHSIG) */
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Nearest-rank quantile of sorted samples, in µs. */
static double quantile_us(const uint64_t *sorted, uint32_t n, double p)
{
	double x = p * n;
	uint32_t rank = (uint32_t)x;

	if ((double)rank < x || rank == 0)
		rank++;
	return (double)sorted[rank - 1] / 1e3;
}

static void finish_row(struct lat_row *row, const struct lat_run *run)
{
	qsort(run->samples, run->iters, sizeof(*run->samples), cmp_u64);
	row->p50_us = quantile_us(run->samples, run->iters, 0.50);
	row->p99_us = quantile_us(run->samples, run->iters, 0.99);
}

/* Forks the other end of a bare ping-pong; it dies with us. */
static pid_t fork_peer(void)
{
	pid_t parent = getpid(), pid;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid == 0 && (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent))
		_exit(1);
	return pid;
}

static int reap_peer(pid_t pid)
{
	int status = 0;

	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -ECHILD;
}

/*
 * The floor of any shared-memory round trip: two processes, both spinning, pass a counter
 * back and forth on one page (the same acquire/release pair the rings use, no pause).
 */
static int bare_spin(const struct lat_run *run)
{
	uint32_t total = run->warm + run->iters;
	uint32_t *counter = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
				 -1, 0);
	pid_t pid;
	int r;

	if (counter == MAP_FAILED)
		return -errno;
	pid = fork_peer();
	if (pid < 0) {
		r = -errno;
		munmap(counter, 4096);
		return r;
	}
	if (pid == 0) {
		for (uint32_t i = 0; i < total; i++) {
			while (__atomic_load_n(counter, __ATOMIC_ACQUIRE) != 2 * i + 1)
				;
			__atomic_store_n(counter, 2 * i + 2, __ATOMIC_RELEASE);
		}
		_exit(0);
	}
	for (uint32_t i = 0; i < total; i++) {
		uint64_t t = now_ns();

		__atomic_store_n(counter, 2 * i + 1, __ATOMIC_RELEASE);
		while (__atomic_load_n(counter, __ATOMIC_ACQUIRE) != 2 * i + 2)
			;
		if (i >= run->warm)
			run->samples[i - run->warm] = now_ns() - t;
	}
	r = reap_peer(pid);
	munmap(counter, 4096);
	return r;
}

static int pin(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return sched_setaffinity(0, sizeof(set), &set) < 0 ? -errno : 0;
}

/*
 * The floor of a sleeping round trip: each side blocks in read, then writes the other's.  With
 * cpu_self >= 0 we run on that CPU and the peer on cpu_peer; else where the kernel puts us.
 */
static int bare_eventfd(const struct lat_run *run, int cpu_self, int cpu_peer)
{
	uint32_t total = run->warm + run->iters;
	int ping = eventfd(0, EFD_CLOEXEC), pong = eventfd(0, EFD_CLOEXEC), r = 0;
	uint64_t one = 1, v;
	cpu_set_t saved;
	pid_t pid;

	if (ping < 0 || pong < 0) {
		r = -errno;
		goto out;
	}
	if (sched_getaffinity(0, sizeof(saved), &saved) < 0) {
		r = -errno;
		goto out;
	}
	pid = fork_peer();
	if (pid < 0) {
		r = -errno;
		goto out;
	}
	if (pid == 0) {
		if (cpu_self >= 0 && pin(cpu_peer) < 0)
			_exit(1);
		for (uint32_t i = 0; i < total; i++)
			if (read(ping, &v, sizeof(v)) != sizeof(v) ||
			    write(pong, &one, sizeof(one)) != sizeof(one))
				_exit(1);
		_exit(0);
	}
	if (cpu_self >= 0)
		r = pin(cpu_self);
	for (uint32_t i = 0; i < total && r == 0; i++) {
		uint64_t t = now_ns();

		if (write(ping, &one, sizeof(one)) != sizeof(one) ||
		    read(pong, &v, sizeof(v)) != sizeof(v))
			r = -errno;
		else if (i >= run->warm)
			run->samples[i - run->warm] = now_ns() - t;
	}
	if (r < 0)
		kill(pid, SIGKILL);
	if (reap_peer(pid) < 0 && r == 0)
		r = -ECHILD;
	if (cpu_self >= 0)
		sched_setaffinity(0, sizeof(saved), &saved);
out:
	if (ping >= 0)
		close(ping);
	if (pong >= 0)
		close(pong);
	return r;
}

/*
 * The daemon's pid, from the credentials of its listening socket; 0 unless that process is a
 * kvpaged we can see in /proc (with socket activation it is the service manager).
 */
static pid_t daemon_pid(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct ucred cred = { 0 };
	socklen_t len = sizeof(cred);
	char proc[64], comm[32] = "";
	int fd;
	FILE *f;

	if (strlen(path) >= sizeof(sa.sun_path))
		return 0;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		cred.pid = 0;
	close(fd);
	snprintf(proc, sizeof(proc), "/proc/%d/comm", (int)cred.pid);
	f = cred.pid > 0 ? fopen(proc, "re") : NULL;
	if (!f)
		return 0;
	if (!fgets(comm, sizeof(comm), f))
		comm[0] = '\0';
	fclose(f);
	return strncmp(comm, "kvpaged", 7) ? 0 : cred.pid;
}

/* The CPU process pid last ran on (field 39 of /proc/PID/stat), or -1. */
static int last_cpu(pid_t pid)
{
	char path[64], buf[1024], *p;
	int cpu = -1, field = 3;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* The command name may hold spaces and parentheses: count fields after the last ')'. */
	p = strrchr(buf, ')');
	for (p = p ? strtok(p + 1, " ") : NULL; p; p = strtok(NULL, " "), field++)
		if (field == 39) {
			cpu = atoi(p);
			break;
		}
	return cpu;
}

static void print_call_error(struct kvp_client *c, const char *what, int r)
{
	const char *why = c ? kvp_last_error(c) : "";

	fprintf(stderr, "kvpaged-bench: latency: %s: %s\n", what, *why ? why : strerror(-r));
}

/*
 * Appends through the daemon, one token per round trip: over the rings (a submission and its
 * completion) when ring, else with kvp_append on the socket.  The sequence is closed and
 * reopened, untimed, every seq_tokens appends.
 */
static int daemon_appends(const struct lat_run *run, bool ring, uint32_t spin_us,
			  struct lat_row *row)
{
	uint32_t seen = 0, same = 0;
	const struct remote_options o = { .socket = run->socket, .ring = ring, .ring_entries = 64,
					  .ring_data_bytes = 65536, .spin_us = spin_us,
					  .max_blocks = 2 };
	uint32_t total = run->warm + run->iters, first = 1, cached, len = 1;
	struct kvp_completion cqe;
	struct remote_conn k;
	uint64_t seq;
	int r;

	r = remote_connect(&k, &o, "latency");
	if (r < 0)
		return r;
	r = kvp_open(k.c, &first, 1, 0, 0, &seq, &cached, &k.table);
	for (uint32_t i = 0; r >= 0 && i < total; i++) {
		uint32_t tok = token_of(STREAM_LATENCY, i);
		struct kvp_op op = { .opcode = KVP_APPEND, .seq = seq, .tokens = &tok, .ntokens = 1,
				     .table_cap = k.ring_table_cap, .table_out = k.ring_table };
		uint64_t t;

		if (len == run->seq_tokens) {
			r = kvp_close(k.c, seq);
			if (r == 0)
				r = kvp_open(k.c, &first, 1, 0, 0, &seq, &cached, &k.table);
			if (r < 0)
				break;
			op.seq = seq;
			len = 1;
		}
		t = now_ns();
		if (ring)
			r = remote_ring_call(k.c, &op, &cqe);
		else
			r = kvp_append(k.c, seq, &tok, 1, &k.table);
		if (r >= 0 && i >= run->warm)
			run->samples[i - run->warm] = now_ns() - t;
		len++;
		if (run->daemon_pid && i % 256 == 255) {
			/* Untimed, and rarely: reading /proc costs more than a round trip. */
			int cpu = last_cpu(run->daemon_pid);

			seen += cpu >= 0;
			same += cpu >= 0 && cpu == sched_getcpu();
		}
	}
	row->same_cpu = seen ? (double)same / seen : -1;
	if (r < 0)
		print_call_error(ring ? NULL : k.c, ring ? "ring append" : "kvp_append", r);
	else
		r = kvp_close(k.c, seq);
	remote_disconnect(&k);
	return r < 0 ? r : 0;
}

static int no_copy(void *ctx, uint32_t dst, uint32_t src)
{
	return 0; /* bookkeeping only: there is no KV memory behind this core */
}

/* core_seq_append on a core of the pool's block size, timed the same way. */
static int inprocess_appends(const struct lat_run *run)
{
	const uint32_t B = run->pool.block_tokens;
	struct core_config cfg = { .capacity_blocks = run->seq_tokens / B + 4, .block_tokens = B,
				   .max_sequences = 4, .max_seq_tokens = run->seq_tokens + 1,
				   .copy_block = no_copy };
	uint32_t total = run->warm + run->iters, first = 1, len = 1;
	struct core_open o = { .tokens = &first, .ntokens = 1 };
	struct core *c;
	uint64_t seq;
	int r;

	r = core_new(&cfg, &c);
	if (r < 0)
		return r;
	r = core_seq_open(c, &o, &seq, NULL);
	for (uint32_t i = 0; r >= 0 && i < total; i++) {
		uint32_t tok = token_of(STREAM_LATENCY, i);
		uint64_t t;

		if (len == run->seq_tokens) {
			core_seq_close(c, seq);
			r = core_seq_open(c, &o, &seq, NULL);
			if (r < 0)
				break;
			len = 1;
		}
		t = now_ns();
		r = core_seq_append(c, seq, &tok, 1);
		if (i >= run->warm)
			run->samples[i - run->warm] = now_ns() - t;
		len++;
	}
	core_free(c);
	return r < 0 ? r : 0;
}

static int measure(int row, const struct lat_run *run)
{
	int r;

	alarm(WATCHDOG_S);
	switch (row) {
	case ROW_SPIN:
		r = bare_spin(run);
		break;
	case ROW_EVENTFD:
		r = bare_eventfd(run, -1, -1);
		break;
	case ROW_EVENTFD_ONE_CPU:
		r = bare_eventfd(run, run->cpus[0], run->cpus[0]);
		break;
	case ROW_EVENTFD_TWO_CPUS:
		if (run->cpus[1] < 0)
			return 0; /* one CPU only: no such placement */
		r = bare_eventfd(run, run->cpus[0], run->cpus[1]);
		break;
	case ROW_RING_BUSY:
		r = daemon_appends(run, true, BUSY_SPIN_US, &rows[row]);
		break;
	case ROW_RING_SLEEP:
		r = daemon_appends(run, true, 0, &rows[row]);
		break;
	case ROW_RING_SPIN_SLEEP:
		/* Spinning briefly catches the completion before paying for a wake-up. */
		r = daemon_appends(run, true, SPIN_THEN_SLEEP_US, &rows[row]);
		break;
	case ROW_SOCKET:
		r = daemon_appends(run, false, 0, &rows[row]);
		break;
	default:
		r = inprocess_appends(run);
		break;
	}
	alarm(0);
	if (r < 0) {
		fprintf(stderr, "kvpaged-bench: latency: %s: %s\n", rows[row].what, strerror(-r));
		return r;
	}
	finish_row(&rows[row], run);
	rows[row].measured = true;
	return 0;
}

/* The first two CPUs we may run on. */
static void pick_cpus(int cpus[2])
{
	cpu_set_t set;
	int n = 0;

	cpus[0] = cpus[1] = -1;
	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return;
	for (int i = 0; i < CPU_SETSIZE && n < 2; i++)
		if (CPU_ISSET(i, &set))
			cpus[n++] = i;
}

/* The eventfd row to compare the sleeping ring with: the one pinned as the ring was seen. */
static int sleep_baseline(const char **placement)
{
	double same = rows[ROW_RING_SLEEP].same_cpu;

	if (same >= 0.5) {
		*placement = "one CPU";
		return ROW_EVENTFD_ONE_CPU;
	}
	if (same >= 0 && rows[ROW_EVENTFD_TWO_CPUS].measured) {
		*placement = "two CPUs";
		return ROW_EVENTFD_TWO_CPUS;
	}
	*placement = "not known";
	return ROW_EVENTFD;
}

static void latency_usage(FILE *f)
{
	fputs("usage: kvpaged-bench latency --daemon SOCKET [--iterations N] [--json]\n"
	      "\n"
	      "One-token append round trips, p50/p99 in µs over N iterations (default 20000)\n"
	      "after a warm-up: the rings busy-polling and sleeping, the socket and the core\n"
	      "in-process, beside a bare shared-memory spin and bare eventfd ping-pongs measured\n"
	      "in the same run.  The busy-poll row polls on the daemon's side only if kvpaged\n"
	      "runs with ring_poll_us > 0.\n",
	      f);
}

int cmd_latency(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "daemon", required_argument, NULL, 'd' },
		{ "iterations", required_argument, NULL, 'n' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	struct lat_run run = { .iters = 20000 };
	double busy_ratio, sleep_ratio, nospin_ratio;
	const char *placement;
	bool json = false;
	struct remote_conn probe;
	int opt, r = 0, base;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'd':
			run.socket = optarg;
			break;
		case 'n':
			if (parse_u32(optarg, &run.iters) < 0 || run.iters == 0 ||
			    run.iters > 100000000) {
				fprintf(stderr, "kvpaged-bench: --iterations: 1..100000000\n");
				return 2;
			}
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			latency_usage(stdout);
			return 0;
		default:
			latency_usage(stderr);
			return 2;
		}
	}
	if (!run.socket || optind != argc) {
		latency_usage(stderr);
		return 2;
	}
	if (remote_connect(&probe, &(struct remote_options){ .socket = run.socket }, "latency") < 0)
		return 1;
	run.pool = *kvp_pool(probe.c);
	remote_disconnect(&probe);
	run.seq_tokens = seq_max_tokens(&run.pool);
	run.daemon_pid = daemon_pid(run.socket);
	pick_cpus(run.cpus);
	/* Warm caches, page tables and the daemon's buffers first: a tenth, 10 to 2000. */
	run.warm = run.iters / 10 < 10 ? 10 : run.iters / 10 > 2000 ? 2000 : run.iters / 10;
	run.samples = malloc((size_t)run.iters * sizeof(*run.samples));
	if (!run.samples)
		return 1;
	signal(SIGALRM, on_watchdog);
	for (int i = 0; i < NROWS; i++)
		rows[i].same_cpu = -1;
	for (int i = 0; i < NROWS && r == 0; i++)
		r = measure(i, &run);
	free(run.samples);
	if (r < 0)
		return 1;

	base = sleep_baseline(&placement);
	busy_ratio = rows[ROW_RING_BUSY].p50_us / rows[ROW_SPIN].p50_us;
	sleep_ratio = rows[ROW_RING_SPIN_SLEEP].p50_us / rows[base].p50_us;
	nospin_ratio = rows[ROW_RING_SLEEP].p50_us / rows[base].p50_us;
	if (json) {
		double same = rows[ROW_RING_SLEEP].same_cpu;
		json_object *o = json_object_new_object();
		char key[64];

		json_object_object_add(o, "iterations", json_object_new_int64(run.iters));
		json_object_object_add(o, "block_tokens",
				       json_object_new_int64(run.pool.block_tokens));
		for (int i = 0; i < NROWS; i++) {
			/* null: a placement this machine does not have (one CPU) */
			snprintf(key, sizeof(key), "%s_p50_us", rows[i].key);
			json_object_object_add(o, key, rows[i].measured ?
					       json_object_new_double(rows[i].p50_us) : NULL);
			snprintf(key, sizeof(key), "%s_p99_us", rows[i].key);
			json_object_object_add(o, key, rows[i].measured ?
					       json_object_new_double(rows[i].p99_us) : NULL);
		}
		json_object_object_add(o, "ring_busy_poll_vs_shm_spin_p50",
				       json_object_new_double(busy_ratio));
		json_object_object_add(o, "ring_spin_sleep_vs_eventfd_p50",
				       json_object_new_double(sleep_ratio));
		json_object_object_add(o, "ring_sleep_vs_eventfd_p50",
				       json_object_new_double(nospin_ratio));
		json_object_object_add(o, "ring_sleep_baseline",
				       json_object_new_string(rows[base].key));
		json_object_object_add(o, "ring_sleep_same_cpu", same >= 0 ?
				       json_object_new_double(same) : NULL);
		json_print(o);
		return 0;
	}
	printf("one-token append round trips: %u iterations after %u warm-up; pool %s, blocks of %u"
	       " tokens\n", run.iters, run.warm, run.pool.name, run.pool.block_tokens);
	printf("%-36s %9s %9s\n", "path", "p50_us", "p99_us");
	for (int i = 0; i < NROWS; i++) {
		if (!rows[i].measured) {
			printf("%-36s %9s %9s\n", rows[i].what, "-", "-");
			continue;
		}
		printf("%-36s %9.2f %9.2f", rows[i].what, rows[i].p50_us, rows[i].p99_us);
		if (rows[i].same_cpu >= 0)
			printf("   daemon seen on our CPU %.0f%% of the time",
			       100 * rows[i].same_cpu);
		putchar('\n');
	}
	printf("ring busy-poll p50 / bare spin p50:    %6.2f  (target <= 2)\n", busy_ratio);
	printf("ring spin-then-sleep p50 / bare eventfd p50: %6.2f  (target <= 1.3; eventfd: %s)\n",
	       sleep_ratio, placement);
	printf("ring sleeping, no spin p50 / bare eventfd p50: %6.2f\n", nospin_ratio);
	/*
	 * Timings cannot tell the modes apart either: a daemon at ring_poll_us = 0 still serves a
	 * client that resubmits before it goes back to sleep without sleeping.
	 */
	puts("note: the busy-poll row has the daemon polling only when kvpaged runs with\n"
	     "      ring_poll_us > 0 ([daemon] section); the daemon does not say which mode it\n"
	     "      is in.");
	return 0;
}

/* ------------------------------------------------------------------ throughput */

struct tput_ctx {
	const char *socket;
	uint32_t batch, spin_us;
	uint64_t duration_ns;
};

struct tput_part {
	int32_t error;
	char why[160];
	uint64_t ops, ns;
};

static int tput_batches(const struct tput_ctx *x, uint32_t idx, struct remote_conn *k,
			struct tput_part *part, const char **what)
{
	const uint32_t per_seq = seq_max_tokens(kvp_pool(k->c));
	struct kvp_completion *cqes = calloc(x->batch, sizeof(*cqes));
	struct kvp_op *ops = calloc(x->batch, sizeof(*ops));
	uint32_t *toks = calloc(x->batch, sizeof(*toks));
	uint32_t *tables = calloc((size_t)x->batch * 2, sizeof(*tables));
	uint32_t first = 1, cached, len = 1;
	uint64_t seq, start, n = 0;
	int r = -ENOMEM;

	if (!cqes || !ops || !toks || !tables)
		goto out;
	*what = "open";
	r = kvp_open(k->c, &first, 1, 0, 0, &seq, &cached, &k->table);
	start = now_ns();
	while (r >= 0 && now_ns() - start < x->duration_ns) {
		uint32_t done = 0;

		if (len + x->batch > per_seq) {
			/* Kept short, outside the count. */
			*what = "close and reopen";
			r = kvp_close(k->c, seq);
			if (r == 0)
				r = kvp_open(k->c, &first, 1, 0, 0, &seq, &cached, &k->table);
			if (r < 0)
				break;
			len = 1;
		}
		for (uint32_t j = 0; j < x->batch; j++) {
			toks[j] = token_of(STREAM_LATENCY | idx, n++);
			ops[j] = (struct kvp_op){ .opcode = KVP_APPEND, .user_data = j, .seq = seq,
						  .tokens = &toks[j], .ntokens = 1, .table_cap = 2,
						  .table_out = &tables[2 * j] };
		}
		/* The ring holds the whole batch: one kvp_submit, at most one doorbell. */
		*what = "submit";
		r = kvp_submit(k->c, ops, x->batch);
		if (r >= 0 && r != (int)x->batch)
			r = -ENOBUFS;
		*what = "complete";
		while (r >= 0 && done < x->batch) {
			r = kvp_complete(k->c, cqes + done, x->batch - done, x->batch - done,
					 REMOTE_TIMEOUT_MS);
			for (int j = 0; r > 0 && j < r; j++)
				if (cqes[done + j].res < 0)
					r = cqes[done + j].res;
			if (r > 0)
				done += (uint32_t)r;
		}
		if (r < 0)
			break;
		part->ops += x->batch;
		len += x->batch;
	}
	part->ns = now_ns() - start;
	if (r >= 0) {
		*what = "close";
		r = kvp_close(k->c, seq);
	}
out:
	free(cqes);
	free(ops);
	free(toks);
	free(tables);
	return r < 0 ? r : 0;
}

static int tput_client(uint32_t idx, void *arg, struct worker_io *io)
{
	const struct tput_ctx *x = arg;
	/* Room for the batch twice over: the data area is a FIFO of (token, 2 table entries). */
	const struct remote_options o = {
		.socket = x->socket, .ring = true,
		.ring_entries = x->batch < 64 ? 64 : pow2_at_least(x->batch),
		.ring_data_bytes = x->batch * 24 < 65536 ? 65536 : pow2_at_least(x->batch * 24),
		.spin_us = x->spin_us, .max_blocks = 2,
	};
	struct tput_part part = { 0 };
	const char *what = "connect";
	struct remote_conn k = { 0 };
	char who[32];
	int r;

	snprintf(who, sizeof(who), "client %u", idx);
	r = worker_ready(io, remote_connect(&k, &o, who));
	if (r < 0)
		return r;
	r = tput_batches(x, idx, &k, &part, &what);
	if (r < 0) {
		part.error = r;
		snprintf(part.why, sizeof(part.why), "%s: %s", what,
			 *kvp_last_error(k.c) ? kvp_last_error(k.c) : strerror(-r));
	}
	remote_disconnect(&k);
	return worker_send(io, &part, sizeof(part));
}

static double client_rate(const struct tput_part *part)
{
	return part->ns ? (double)part->ops * 1e9 / (double)part->ns : 0;
}

static void throughput_usage(FILE *f)
{
	fputs("usage: kvpaged-bench throughput --daemon SOCKET [--clients N] [--batch N]\n"
	      "                                [--seconds S] [--spin-us US] [--json]\n"
	      "\n"
	      "N client processes (default 4) each submit batches of one-token appends (default\n"
	      "64) with one kvp_submit and complete them all, for S seconds (default 3); prints\n"
	      "the operations per second of all clients together and of each.\n",
	      f);
}

int cmd_throughput(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "daemon", required_argument, NULL, 'd' },
		{ "clients", required_argument, NULL, 'C' },
		{ "batch", required_argument, NULL, 'b' },
		{ "seconds", required_argument, NULL, 's' },
		{ "spin-us", required_argument, NULL, 'S' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	struct tput_ctx x = { .batch = 64, .duration_ns = 3000000000ull };
	uint32_t clients = 4;
	struct tput_part *parts;
	struct workers ws;
	uint64_t total = 0, wall;
	bool json = false;
	int opt, r;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'd':
			x.socket = optarg;
			break;
		case 'C':
			if (parse_u32(optarg, &clients) < 0 || clients == 0 ||
			    clients > MAX_CLIENTS) {
				fprintf(stderr, "kvpaged-bench: --clients: 1..%u\n", MAX_CLIENTS);
				return 2;
			}
			break;
		case 'b':
			if (parse_u32(optarg, &x.batch) < 0 || x.batch == 0 ||
			    x.batch > MAX_BATCH) {
				fprintf(stderr, "kvpaged-bench: --batch: 1..%u\n", MAX_BATCH);
				return 2;
			}
			break;
		case 's': {
			char *end;
			double s;

			errno = 0;
			s = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(s > 0 && s <= 3600)) {
				fprintf(stderr, "kvpaged-bench: --seconds: 0 < S <= 3600\n");
				return 2;
			}
			x.duration_ns = (uint64_t)(s * 1e9);
			break;
		}
		case 'S':
			if (parse_u32(optarg, &x.spin_us) < 0) {
				fprintf(stderr, "kvpaged-bench: --spin-us: not an integer: %s\n",
					optarg);
				return 2;
			}
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			throughput_usage(stdout);
			return 0;
		default:
			throughput_usage(stderr);
			return 2;
		}
	}
	if (!x.socket || optind != argc) {
		throughput_usage(stderr);
		return 2;
	}
	parts = calloc(clients, sizeof(*parts));
	if (!parts)
		return 1;
	r = workers_spawn(&ws, clients, tput_client, &x);
	if (r < 0) {
		fprintf(stderr, "kvpaged-bench: cannot start clients: %s\n", strerror(-r));
		free(parts);
		return 1;
	}
	r = workers_start(&ws);
	for (uint32_t i = 0; r == 0 && i < clients; i++) {
		r = workers_collect(&ws, i, &parts[i], sizeof(parts[i]));
		if (r < 0)
			fprintf(stderr, "kvpaged-bench: client %u died\n", i);
		else if (parts[i].error < 0) {
			parts[i].why[sizeof(parts[i].why) - 1] = '\0';
			fprintf(stderr, "kvpaged-bench: client %u: %s\n", i, parts[i].why);
			r = parts[i].error;
		}
		total += parts[i].ops;
	}
	wall = now_ns() - ws.start_ns;
	if (workers_finish(&ws, r < 0) < 0 && r == 0)
		r = -ECHILD;
	if (r < 0) {
		free(parts);
		return 1;
	}
	if (json) {
		json_object *o = json_object_new_object(), *per = json_object_new_array();

		for (uint32_t i = 0; i < clients; i++)
			json_object_array_add(per, json_object_new_double(client_rate(&parts[i])));
		json_object_object_add(o, "clients", json_object_new_int64(clients));
		json_object_object_add(o, "batch", json_object_new_int64(x.batch));
		json_object_object_add(o, "seconds", json_object_new_double(x.duration_ns / 1e9));
		json_object_object_add(o, "ops", json_object_new_int64((int64_t)total));
		json_object_object_add(o, "wall_s", json_object_new_double(wall / 1e9));
		json_object_object_add(o, "ops_per_s", json_object_new_double(total * 1e9 / wall));
		json_object_object_add(o, "per_client_ops_per_s", per);
		json_print(o);
	} else {
		printf("throughput: %u client%s, batches of %u one-token appends (one kvp_submit "
		       "each), %.1f s, spin_us %u\n", clients, clients == 1 ? "" : "s", x.batch,
		       x.duration_ns / 1e9, x.spin_us);
		for (uint32_t i = 0; i < clients; i++)
			printf("  client %-4u %12.0f ops/s\n", i, client_rate(&parts[i]));
		printf("  total       %12.0f ops/s  (%" PRIu64 " ops in %.2f s; target >= 1000000 "
		       "with batch 64 and 4 clients)\n", total * 1e9 / wall, total, wall / 1e9);
	}
	free(parts);
	return 0;
}

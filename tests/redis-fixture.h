/* SPDX-License-Identifier: MIT */
/*
 * Tests' own Redis servers: a standalone server or a cluster of masters with a replica each,
 * on free loopback ports (cluster bus ports, port + 10000, free too), in a temporary directory,
 * never a system redis.  Each server dies with the process that started it (PR_SET_PDEATHSIG),
 * and redis_fixture_stop kills and reaps them, so no exit path leaves one behind.
 *
 * Servers are started with fork and exec of redis-server (redis-cli --cluster create joins a
 * cluster), administered with blocking hiredis connections.
 */
#pragma once

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "tests/check-runner.h"

#define FIXTURE_MAX 8

struct redis_server {
	pid_t pid;
	uint16_t port;
	char id[48]; /* CLUSTER MYID */
};

struct redis_fixture {
	char dir[64];
	unsigned n;
	bool cluster;
	struct redis_server s[FIXTURE_MAX];
};

static inline void fixture_msleep(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

static inline uint64_t fixture_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* redis-server and redis-cli, from PATH. */
static inline bool redis_installed(void)
{
	return !system("command -v redis-server >/dev/null 2>&1 && "
		       "command -v redis-cli >/dev/null 2>&1");
}

static inline bool port_free(uint16_t port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	bool ok;

	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

/* A port the kernel hands out (bind to 0) whose bus port, +10000, is free as well. */
static inline uint16_t free_port(void)
{
	for (int tries = 0; tries < 200; tries++) {
		struct sockaddr_in sa = { .sin_family = AF_INET,
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		socklen_t len = sizeof(sa);
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		uint16_t p;

		ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
		ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
		close(fd);
		p = ntohs(sa.sin_port);
		if (p < 55535 && port_free(p) && port_free((uint16_t)(p + 10000)))
			return p;
	}
	ck_abort_msg("no free port pair");
	return 0;
}

static inline redisReply *redis_direct(uint16_t port, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* One command on a fresh blocking connection: the reply (freeReplyObject it), or NULL. */
static inline redisReply *redis_direct(uint16_t port, const char *fmt, ...)
{
	struct timeval tv = { .tv_sec = 5 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
	redisReply *r = NULL;
	va_list ap;

	if (c && !c->err) {
		redisSetTimeout(c, tv);
		va_start(ap, fmt);
		r = redisvCommand(c, fmt, ap);
		va_end(ap);
	}
	if (c)
		redisFree(c);
	return r;
}

static inline bool redis_pings(uint16_t port)
{
	redisReply *r = redis_direct(port, "PING");
	bool ok = r && r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "PONG");

	if (r)
		freeReplyObject(r);
	return ok;
}

/* Starts redis-server on port in f->dir; waits until it answers (10 s). */
static inline pid_t redis_spawn(struct redis_fixture *f, uint16_t port, bool cluster)
{
	char portbuf[8], conf[128], log[128];
	pid_t parent = getpid(), pid;

	snprintf(portbuf, sizeof(portbuf), "%u", port);
	snprintf(conf, sizeof(conf), "nodes-%u.conf", port);
	snprintf(log, sizeof(log), "%s/redis-%u.log", f->dir, port);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		/* Dies with the test, whatever way it ends. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		if (cluster)
			execlp("redis-server", "redis-server", "--port", portbuf, "--bind", "127.0.0.1",
			       "--dir", f->dir, "--save", "", "--appendonly", "no", "--logfile", log,
			       "--cluster-enabled", "yes", "--cluster-config-file", conf,
			       "--cluster-node-timeout", "1000", "--cluster-replica-validity-factor",
			       "0", "--proto-max-bulk-len", "64mb", (char *)NULL);
		else
			execlp("redis-server", "redis-server", "--port", portbuf, "--bind", "127.0.0.1",
			       "--dir", f->dir, "--save", "", "--appendonly", "no", "--logfile", log,
			       (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 1000 && !redis_pings(port); i++) {
		int st;

		ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "redis-server on %u exited (%s)",
			      port, log);
		fixture_msleep(10);
	}
	ck_assert_msg(redis_pings(port), "redis-server on %u does not answer", port);
	return pid;
}

static inline void redis_fixture_dir(struct redis_fixture *f)
{
	snprintf(f->dir, sizeof(f->dir), "/tmp/kvp-redis-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(f->dir));
}

static inline void redis_fixture_standalone(struct redis_fixture *f)
{
	memset(f, 0, sizeof(*f));
	redis_fixture_dir(f);
	f->n = 1;
	f->s[0].port = free_port();
	f->s[0].pid = redis_spawn(f, f->s[0].port, false);
}

/* A standalone server's directory and free port, the server not started: redis_spawn starts it. */
static inline void redis_fixture_absent(struct redis_fixture *f)
{
	memset(f, 0, sizeof(*f));
	redis_fixture_dir(f);
	f->n = 1;
	f->s[0].port = free_port();
}

static inline bool cluster_ok(uint16_t port)
{
	redisReply *r = redis_direct(port, "CLUSTER INFO");
	bool ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");

	if (r)
		freeReplyObject(r);
	return ok;
}

static inline void redis_fixture_ids(struct redis_fixture *f)
{
	for (unsigned i = 0; i < f->n; i++) {
		redisReply *r = redis_direct(f->s[i].port, "CLUSTER MYID");

		ck_assert(r && r->type == REDIS_REPLY_STRING);
		snprintf(f->s[i].id, sizeof(f->s[i].id), "%s", r->str);
		freeReplyObject(r);
	}
}

/* masters masters with a replica each, joined by redis-cli; waits for cluster_state:ok. */
static inline void redis_fixture_cluster(struct redis_fixture *f, unsigned masters)
{
	char cmd[1024];
	size_t len;
	uint64_t until;

	memset(f, 0, sizeof(*f));
	redis_fixture_dir(f);
	f->cluster = true;
	f->n = masters * 2;
	ck_assert_uint_le(f->n, FIXTURE_MAX);
	for (unsigned i = 0; i < f->n; i++) {
		do
			f->s[i].port = free_port();
		while (i && f->s[i].port == f->s[i - 1].port);
		f->s[i].pid = redis_spawn(f, f->s[i].port, true);
	}
	/* timeout(1): redis-cli waits for the nodes to agree, with no limit of its own. */
	len = (size_t)snprintf(cmd, sizeof(cmd), "timeout 60 redis-cli --cluster create");
	for (unsigned i = 0; i < f->n; i++)
		len += (size_t)snprintf(cmd + len, sizeof(cmd) - len, " 127.0.0.1:%u", f->s[i].port);
	snprintf(cmd + len, sizeof(cmd) - len,
		 " --cluster-replicas 1 --cluster-yes >%s/create.log 2>&1 </dev/null", f->dir);
	ck_assert_msg(system(cmd) == 0, "%s failed (see %s/create.log)", cmd, f->dir);
	until = fixture_now_ms() + 30000;
	for (;;) {
		bool ok = true;

		for (unsigned i = 0; i < f->n && ok; i++)
			ok = cluster_ok(f->s[i].port);
		if (ok)
			break;
		ck_assert_msg(fixture_now_ms() < until, "cluster not ok after 30 s");
		fixture_msleep(50);
	}
	redis_fixture_ids(f);
}

/* The server whose CLUSTER MYID is id, or -1. */
static inline int redis_fixture_find(const struct redis_fixture *f, const char *id, size_t len)
{
	for (unsigned i = 0; i < f->n; i++)
		if (strlen(f->s[i].id) == len && !memcmp(f->s[i].id, id, len))
			return (int)i;
	return -1;
}

/* The index of the master serving slot now (asked of server via CLUSTER SHARDS/SLOTS). */
static inline int redis_fixture_owner(const struct redis_fixture *f, unsigned via, uint16_t slot)
{
	redisReply *r = redis_direct(f->s[via].port, "CLUSTER SLOTS");
	int who = -1;

	ck_assert(r && r->type == REDIS_REPLY_ARRAY);
	for (size_t i = 0; i < r->elements; i++) {
		redisReply *e = r->element[i];

		if (e->element[0]->integer <= slot && slot <= e->element[1]->integer)
			who = redis_fixture_find(f, e->element[2]->element[2]->str,
						 e->element[2]->element[2]->len);
	}
	freeReplyObject(r);
	return who;
}

static inline void redis_server_kill(struct redis_server *s)
{
	if (s->pid > 0) {
		kill(s->pid, SIGKILL);
		waitpid(s->pid, NULL, 0);
	}
	s->pid = 0;
}

static inline void redis_fixture_stop(struct redis_fixture *f)
{
	char cmd[128];

	for (unsigned i = 0; i < f->n; i++) {
		if (f->s[i].pid > 0)
			kill(f->s[i].pid, SIGCONT);
		redis_server_kill(&f->s[i]);
	}
	if (f->dir[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
		if (system(cmd)) {
			/* Nothing to undo: a leftover temporary directory only. */
		}
	}
	f->dir[0] = '\0';
	f->n = 0;
}

/*
 * For main(), once s holds the cases that need no server.  Ignores SIGPIPE first, as the daemon
 * does: a write to a master just killed must fail, not kill the test.  Without redis-server or
 * redis-cli it runs s alone, says the rest is skipped and returns false, *ret_status the exit
 * status (77 if those cases passed); otherwise it returns true, nothing run, for the caller to
 * add the cases that need Redis.
 */
static inline bool redis_fixture_suite_ready(Suite *s, int *ret_status)
{
	int r;

	signal(SIGPIPE, SIG_IGN);
	if (redis_installed())
		return true;
	r = run_suite(s);
	fprintf(stderr, "redis-server or redis-cli not installed: the rest is skipped\n");
	*ret_status = r == EXIT_SUCCESS ? 77 : r;
	return false;
}

/* A case of the tests that need Redis, added to s; each test has timeout_s. */
static inline TCase *redis_fixture_case(Suite *s, const char *name, unsigned timeout_s)
{
	TCase *tc = tcase_create(name);

	tcase_set_timeout(tc, timeout_s);
	suite_add_tcase(s, tc);
	return tc;
}

/*
 * A case on one cluster that up starts and down stops, in this process (an unchecked fixture),
 * so that every test of it sees the same servers.
 */
static inline TCase *redis_fixture_cluster_case(Suite *s, const char *name, void (*up)(void),
						void (*down)(void))
{
	TCase *tc = redis_fixture_case(s, name, 120);

	tcase_add_unchecked_fixture(tc, up, down);
	return tc;
}

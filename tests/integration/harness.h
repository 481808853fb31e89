/* SPDX-License-Identifier: MIT */
/*
 * Integration-test harness: starts the real kvpaged on a temporary directory with a generated
 * configuration, waits until it listens, runs the real kvpagedctl, and stops it checking for
 * a clean exit.  Every wait has a timeout; Check kills a test that hangs.
 */
#pragma once

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "libclient/include/kvpaged.h"
#include "tests/check-runner.h"

struct daemon {
	pid_t pid;
	char dir[64];
	char sock[128];
	char admin[128];
	char conf[128];
	char log[128];
	char ctl[128]; /* kvpagedctl copied into dir (daemon_copy_ctl), else "" */
};

static inline void msleep(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

static inline const char *bin(const char *env, const char *fallback)
{
	const char *p = getenv(env);

	return p && *p ? p : fallback;
}

static inline bool can_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		close(fd);
		return false;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

/*
 * Makes d's directory (reachable by every user: tests run clients as others) and writes its
 * configuration: a [daemon] section with the sockets and daemon_extra, then rest.  Every
 * [pool] section in rest also gets what the test's environment asks of all pools, unless rest
 * sets the key itself:
 * - copy_thread = yes, with $KVPAGED_TEST_COPY_THREAD (threaded.test): the same tests run with
 *   replies held for the backend's queue;
 * - backend_module = $KVPAGED_TEST_CUDA_MODULE (the CUDA build's module, which make check and
 *   tests/gpu/run.sh name): the daemon loads only what its configuration names.
 */
static inline void daemon_prepare(struct daemon *d, const char *daemon_extra, const char *rest)
{
	const char *module = getenv("KVPAGED_TEST_CUDA_MODULE");
	FILE *f;

	*d = (struct daemon){ .pid = -1 };
	snprintf(d->dir, sizeof(d->dir), "/tmp/kvpaged-test-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(d->dir));
	chmod(d->dir, 0755);
	snprintf(d->sock, sizeof(d->sock), "%s/kvpaged.sock", d->dir);
	snprintf(d->admin, sizeof(d->admin), "%s/admin.sock", d->dir);
	snprintf(d->conf, sizeof(d->conf), "%s/kvpaged.conf", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/kvpaged.log", d->dir);
	f = fopen(d->conf, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "[daemon]\nsocket = %s\nadmin_socket = %s\n%s\n", d->sock, d->admin,
		daemon_extra ? daemon_extra : "");
	for (const char *line = rest, *end; *line; line = end) {
		end = strchr(line, '\n');
		end = end ? end + 1 : line + strlen(line);
		fwrite(line, 1, (size_t)(end - line), f);
		if (end[-1] != '\n')
			fputc('\n', f);
		if (strncmp(line, "[pool ", 6))
			continue;
		if (getenv("KVPAGED_TEST_COPY_THREAD") && !strstr(rest, "copy_thread"))
			fputs("copy_thread = yes\n", f);
		if (module && *module && !strstr(rest, "backend_module"))
			fprintf(f, "backend_module = %s\n", module);
	}
	fclose(f);
}

/* Whether the running daemon's log (stderr) holds text. */
static inline bool daemon_log_has(const struct daemon *d, const char *text)
{
	char buf[65536];
	FILE *f = fopen(d->log, "r");
	size_t n;

	if (!f)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return strstr(buf, text) != NULL;
}

/*
 * Starts kvpaged.  limits and pools are configuration text appended after the [daemon]
 * section (NULL: a [limits] default and one pool "main" of 512 blocks of 16 tokens).
 */
static inline void daemon_start_with(struct daemon *d, const char *daemon_extra, const char *rest)
{
	static const char *default_rest = "[pool main]\nlayers = 2\nkv_heads = 2\nhead_dim = 4\n"
					  "element_bytes = 4\nblock_tokens = 16\ncapacity_blocks = 512\n";

	daemon_prepare(d, daemon_extra, rest ? rest : default_rest);
	setenv("KVPAGED_SOCKET", d->sock, 1);

	d->pid = fork();
	ck_assert_int_ge(d->pid, 0);
	if (d->pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

		dup2(fd, 2);
		execl(bin("KVPAGED_BIN", "./kvpaged"), "kvpaged", "--config", d->conf, "--verbose",
		      (char *)NULL);
		_exit(127);
	}
	/*
	 * 5 s, or $KVPAGED_TEST_START_S: a GPU pool's start (driver, context, pinning and timing
	 * the host tier) on a machine just booted may take longer (tests/gpu/run.sh sets 30).
	 */
	const char *start_s = getenv("KVPAGED_TEST_START_S");
	const int start_ms = start_s && atoi(start_s) > 0 ? atoi(start_s) * 1000 : 5000;

	for (int i = 0; i < start_ms / 10 && !can_connect(d->sock); i++) {
		int status;

		ck_assert_msg(waitpid(d->pid, &status, WNOHANG) == 0, "kvpaged exited at start");
		msleep(10);
	}
	ck_assert_msg(can_connect(d->sock), "kvpaged did not listen within %d s", start_ms / 1000);
	/*
	 * The client socket listens before the start is over: the admin socket comes next, and
	 * its line in the log is the start's last.  A test that runs kvpagedctl or counts the
	 * daemon's fds at once would race it.
	 */
	for (int i = 0; i < start_ms / 10 && !daemon_log_has(d, " (admin"); i++)
		msleep(10);
	ck_assert_msg(daemon_log_has(d, " (admin"), "kvpaged did not start within %d s",
		      start_ms / 1000);
}

static inline void daemon_start(struct daemon *d, const char *rest)
{
	daemon_start_with(d, NULL, rest);
}

static inline void daemon_remove_files(struct daemon *d)
{
	if (d->ctl[0])
		unlink(d->ctl);
	unlink(d->conf);
	unlink(d->log);
	rmdir(d->dir);
}

/*
 * Runs kvpaged on a configuration (appended to a [daemon] section) that it must refuse at start:
 * its exit status, and its log in log.
 */
static inline int daemon_refuses(const char *rest, char *log, size_t log_len)
{
	struct daemon d;
	int status = 0, fd;
	pid_t r = 0;
	ssize_t n;

	daemon_prepare(&d, NULL, rest);
	d.pid = fork();
	ck_assert_int_ge(d.pid, 0);
	if (d.pid == 0) {
		fd = open(d.log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		dup2(fd, 2);
		execl(bin("KVPAGED_BIN", "./kvpaged"), "kvpaged", "--config", d.conf, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 1000 && (r = waitpid(d.pid, &status, WNOHANG)) == 0; i++)
		msleep(10);
	if (r == 0) {
		kill(d.pid, SIGKILL);
		waitpid(d.pid, &status, 0);
		ck_abort_msg("kvpaged did not exit within 10 s on a pool it cannot serve");
	}
	fd = open(d.log, O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	n = read(fd, log, log_len - 1);
	log[n > 0 ? n : 0] = '\0';
	close(fd);
	daemon_remove_files(&d);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/*
 * Copies kvpagedctl into the daemon's directory and makes ctl() run the copy: a test that runs
 * it as another user must not depend on that user reaching the build tree, which a checkout in
 * a private directory (a home of mode 0700) is not.  The copy is the program itself.
 */
static inline void daemon_copy_ctl(struct daemon *d)
{
	const char *src = bin("KVPAGEDCTL_BIN", "./kvpagedctl");
	char buf[65536], magic[4];
	int in, out;
	ssize_t n;

	in = open(src, O_RDONLY | O_CLOEXEC);
	ck_assert_msg(in >= 0, "%s: %s", src, strerror(errno));
	/* A libtool wrapper script would still run the program in the build tree. */
	ck_assert_msg(pread(in, magic, sizeof(magic), 0) == 4 && !memcmp(magic, "\177ELF", 4),
		      "%s is not a program (a libtool wrapper?)", src);
	snprintf(d->ctl, sizeof(d->ctl), "%s/kvpagedctl", d->dir);
	out = open(d->ctl, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
	ck_assert_msg(out >= 0, "%s: %s", d->ctl, strerror(errno));
	while ((n = read(in, buf, sizeof(buf))) > 0)
		ck_assert_int_eq(write(out, buf, (size_t)n), n);
	ck_assert_int_eq(n, 0);
	ck_assert_int_eq(fchmod(out, 0755), 0); /* whatever the umask */
	ck_assert_int_eq(close(out), 0);
	close(in);
}

/*
 * Runs the program at path with argv; returns its exit status (128 if a signal ended it), its
 * stdout in out (if given, cut to out_len - 1 bytes).
 */
static inline int run_output(const char *path, char *const argv[], char *out, size_t out_len)
{
	int pipefd[2], status;
	size_t got = 0;
	pid_t pid;

	ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		dup2(pipefd[1], 1);
		execv(path, argv);
		_exit(127);
	}
	close(pipefd[1]);
	for (;;) {
		char buf[4096];
		ssize_t n = read(pipefd[0], buf, sizeof(buf));

		if (n <= 0)
			break;
		if (out && got + (size_t)n < out_len) {
			memcpy(out + got, buf, (size_t)n);
			got += (size_t)n;
		}
	}
	close(pipefd[0]);
	if (out)
		out[got] = '\0';
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* Runs kvpagedctl with one command; returns its exit status, its stdout in out (if given). */
static inline int ctl(const struct daemon *d, const char *cmd, char *out, size_t out_len)
{
	char *argv[] = { "kvpagedctl", "--socket", (char *)d->admin, "--json", (char *)cmd, NULL };

	return run_output(d->ctl[0] ? d->ctl : bin("KVPAGEDCTL_BIN", "./kvpagedctl"), argv, out,
			  out_len);
}

/* The value of an integer field of kvpagedctl --json output (first occurrence). */
static inline long long json_int(const char *text, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(text, pat);
	ck_assert_msg(p != NULL, "no %s in %s", key, text);
	return strtoll(p + strlen(pat), NULL, 10);
}

/* A child's exit status, 128 + the signal that killed it. */
static inline int wait_child(pid_t pid)
{
	int status;

	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static inline void assert_verified(const struct daemon *d)
{
	char out[4096];

	ck_assert_msg(ctl(d, "verify", out, sizeof(out)) == 0, "kvpagedctl verify: %s", out);
}

/* Waits up to 5 s for kvpaged to exit: its exit status (-1: killed by a signal). */
static inline int daemon_wait_exit(struct daemon *d)
{
	int status = 0;
	pid_t r = 0;

	for (int i = 0; i < 500 && (r = waitpid(d->pid, &status, WNOHANG)) == 0; i++)
		msleep(10);
	if (r == 0) {
		kill(d->pid, SIGKILL);
		waitpid(d->pid, &status, 0);
		ck_abort_msg("kvpaged did not exit within 5 s");
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Waits up to 5 s for a daemon that was told to stop; it must exit 0.  Removes its files. */
static inline void daemon_wait_stopped(struct daemon *d)
{
	int status = daemon_wait_exit(d);

	ck_assert_msg(status == 0, "kvpaged exited with status %d", status);
	daemon_remove_files(d);
}

/* Stops kvpaged with SIGTERM and checks that it exits 0 within 5 s. */
static inline void daemon_stop(struct daemon *d)
{
	kill(d->pid, SIGTERM);
	daemon_wait_stopped(d);
}

static inline struct kvp_client *connect_ns(const char *ns, uint32_t ring_entries)
{
	struct kvp_connect_options o = { .size = sizeof(o), .ns = ns, .client_name = "test",
					 .ring_entries = ring_entries,
					 .ring_data_bytes = ring_entries ? 1u << 20 : 0 };
	struct kvp_client *c = NULL;
	int r = kvp_connect(&o, &c);

	ck_assert_msg(r == 0, "kvp_connect: %d %s", r, c ? kvp_last_error(c) : "");
	return c;
}

/* A remote tier key file: 32 bytes made from seed, mode 0600 (as remote_tier_key_file wants). */
static inline void write_remote_key(const char *path, uint8_t seed)
{
	uint8_t k[32];
	int fd;

	for (size_t i = 0; i < sizeof(k); i++)
		k[i] = (uint8_t)(seed * 37 + i * 11);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, k, sizeof(k)), (ssize_t)sizeof(k));
	close(fd);
}

static inline void prompt(uint32_t *t, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i * 7;
}

/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/sd.h"
#include "daemon/server/server.h"

#define RING_DEPTH 1024
#define NSEC_PER_SEC 1000000000ull
/* STATUS= is refreshed this often when it changed (it is cheap: one datagram). */
#define STATUS_INTERVAL_NS (2 * NSEC_PER_SEC)
/* After the drain deadline every session is shut down; their last operations get this long. */
#define DRAIN_GRACE_NS (2 * NSEC_PER_SEC)
/* Hello and idle deadlines are checked together, rounded up to this: a few sweeps a second. */
#define SWEEP_GRAIN_NS (100 * 1000000ull)
/* Refusals are summed up in one line at most this often (each is a debug line). */
#define REFUSAL_REPORT_NS (30 * NSEC_PER_SEC)
/* Accepting that fails for want of fds or memory pauses this long at first, then longer. */
#define ACCEPT_BACKOFF_FIRST_MS 10u
#define ACCEPT_BACKOFF_MAX_MS 1000u
/*
 * File descriptors: a client session with rings holds four (socket, ring memory, two
 * eventfds), an admin session one; a few are kept for what comes and goes (a connection being
 * refused, the bandwidth probe, journald's stream).
 */
#define FDS_PER_CLIENT 4u
#define FDS_SPARE 16u

static void report_refusals(struct server *srv, uint64_t now);

uint64_t server_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * The block managers take time as an input (docs/policy.md): the loop's clock, once a pass,
 * for the pools whose eviction policy ages blocks.
 */
static void set_clocks(struct server *srv, uint64_t now)
{
	for (size_t i = 0; i < srv->npools; i++)
		if (srv->pools[i].cfg->eviction == KVPD_EVICT_VALUE)
			core_set_now(srv->pools[i].core, (double)now / 1e9);
}

/* An SQE, submitting what is queued when the submission ring is full. */
struct io_uring_sqe *server_sqe(struct server *srv)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&srv->ring);

	if (!sqe) {
		io_uring_submit(&srv->ring);
		sqe = io_uring_get_sqe(&srv->ring);
	}
	if (!sqe)
		abort(); /* cannot happen after a submit: the ring was just emptied */
	return sqe;
}

/* Binds a listening Unix socket, replacing a stale socket file but never a live daemon's. */
static int listen_unix(const char *path, mode_t mode)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return log_error_errno(ENAMETOOLONG, "socket path too long: %s", path);
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return log_error_errno(errno, "socket: %m");
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		close(fd);
		return log_error_errno(EADDRINUSE, "%s: another kvpaged is serving it", path);
	}
	close(fd);
	(void)unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return log_error_errno(errno, "socket: %m");
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(path, mode) < 0 ||
	    listen(fd, SOMAXCONN) < 0) {
		r = log_error_errno(errno, "cannot listen on %s: %m", path);
		close(fd);
		return r;
	}
	return fd;
}

/*
 * One accept at a time, armed again after each: the kernel takes RLIMIT_NOFILE when an accept
 * is armed, and a multishot accept would keep the limit of its start for good, whatever an
 * operator changes with prlimit(1) meanwhile.  Connections are rare next to requests.
 */
static void arm_accept(struct server *srv, struct listener *l)
{
	struct io_uring_sqe *sqe;

	if (l->armed || l->paused || srv->stopping)
		return;
	sqe = server_sqe(srv);
	io_uring_prep_accept(sqe, l == &srv->admin_listener ? srv->admin_fd : srv->client_fd, NULL,
			     NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data(sqe, &l->op);
	l->armed = true;
}

static void arm_signal(struct server *srv)
{
	struct io_uring_sqe *sqe = server_sqe(srv);

	io_uring_prep_read(sqe, srv->signal_fd, &srv->siginfo, sizeof(srv->siginfo), 0);
	io_uring_sqe_set_data(sqe, &srv->signal_op);
}

/* A relative io_uring timeout; ts must stay put until it is submitted. */
static void arm_timer(struct server *srv, struct op *op, struct __kernel_timespec *ts,
		      uint64_t delay_ns)
{
	struct io_uring_sqe *sqe = server_sqe(srv);

	ts->tv_sec = (long long)(delay_ns / NSEC_PER_SEC);
	ts->tv_nsec = (long long)(delay_ns % NSEC_PER_SEC);
	io_uring_prep_timeout(sqe, ts, 0, 0);
	io_uring_sqe_set_data(sqe, op);
}

/* The path a passed socket is bound to, for the log ("?" when it has none). */
static const char *socket_path_of(int fd, struct sockaddr_un *sa)
{
	socklen_t len = sizeof(*sa);

	memset(sa, 0, sizeof(*sa));
	if (getsockname(fd, (struct sockaddr *)sa, &len) < 0 ||
	    len <= offsetof(struct sockaddr_un, sun_path) || !sa->sun_path[0])
		return "?";
	return sa->sun_path;
}

/*
 * Binds the configured path unless systemd passed this socket.  A passed socket's file belongs
 * to its socket unit: its owner and mode come from there, and the daemon never removes it.
 */
static int open_socket(int *fd, bool activated, const char *path, mode_t mode, const char *what)
{
	struct sockaddr_un sa;
	const char *bound;

	if (!activated) {
		*fd = listen_unix(path, mode);
		return *fd < 0 ? *fd : 0;
	}
	bound = socket_path_of(*fd, &sa);
	if (strcmp(bound, path))
		log_notice("%s socket: using %s from systemd; the configured %s is not bound", what,
			   bound, path);
	return 0;
}

/*
 * The soft limit on open files goes up to the hard one: 256 sessions with rings need more than
 * the 1024 a shell or an old unit gives, and nothing here uses select(2).
 */
static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
		return;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		log_warning_errno(errno, "cannot raise the open file limit to %llu: %m",
				  (unsigned long long)rl.rlim_max);
}

/* The fds open now (pools, tiers, rings, sockets): what the daemon holds beyond its sessions. */
static uint64_t count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	uint64_t n = 0;
	struct dirent *e;

	if (!d)
		return 64; /* no /proc: a generous guess */
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n > 0 ? n - 1 : 0; /* the directory's own */
}

/* What max_sessions and max_admin_sessions need in fds, against RLIMIT_NOFILE. */
static void check_fd_budget(struct server *srv)
{
	const struct kvpd_config *c = srv->cfg;
	uint64_t need = srv->fd_base + FDS_SPARE + (uint64_t)c->max_sessions * FDS_PER_CLIENT +
			c->max_admin_sessions + (srv->http ? c->metrics_max_connections : 0);
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
		rl.rlim_cur = UINT32_MAX;
	srv->fd_limit = rl.rlim_cur;
	if (need <= srv->fd_limit)
		return;
	log_warning("max_sessions = %u and max_admin_sessions = %u need %llu file descriptors "
		    "(%u per client session with rings, %llu for the daemon), but the limit is "
		    "%llu: clients past the fds left are refused; raise LimitNOFILE= (the hard "
		    "limit) or lower max_sessions",
		    c->max_sessions, c->max_admin_sessions, (unsigned long long)need,
		    FDS_PER_CLIENT, (unsigned long long)(srv->fd_base + FDS_SPARE),
		    (unsigned long long)srv->fd_limit);
}

int server_init(struct server *srv, struct kvpd_config *cfg, const struct server_options *opts)
{
	int passed_client = -EBADF, passed_admin = -EBADF;
	struct sockaddr_un sa;
	sigset_t mask;
	int r;

	*srv = (struct server){
		.cfg = cfg,
		.opts = { .drain_timeout_ms = SERVER_DRAIN_TIMEOUT_MS },
		.client_fd = -1,
		.admin_fd = -1,
		.signal_fd = -1,
		.client_listener = { .op = { .kind = OP_ACCEPT_CLIENT },
				     .retry_op = { .kind = OP_ACCEPT_RETRY } },
		.admin_listener = { .op = { .kind = OP_ACCEPT_ADMIN },
				    .retry_op = { .kind = OP_ACCEPT_RETRY } },
		.signal_op = { .kind = OP_SIGNAL },
		.tick_op = { .kind = OP_TIMER },
		.drain_op = { .kind = OP_TIMER },
		.sweep_op = { .kind = OP_SWEEP },
		.next_session_id = 1,
		.started_ns = server_now_ns(),
	};
	if (opts)
		srv->opts = *opts;
	log_set_rate_limit(cfg->log_rate_limit_interval_ms, cfg->log_rate_limit_burst);
	raise_fd_limit();

	/* First, so that the passed fds are marked close-on-exec and LISTEN_* unset at once. */
	r = systemd_take_sockets(&passed_client, &passed_admin);
	if (r < 0)
		return r;
	if (passed_client >= 0) {
		srv->client_fd = passed_client;
		srv->client_activated = true;
	}
	if (passed_admin >= 0) {
		srv->admin_fd = passed_admin;
		srv->admin_activated = true;
	}

	/*
	 * Before the pools: allocating them can take a while (a large pool, a swap file to size,
	 * a bandwidth to measure), and a SIGTERM meanwhile must wait in the signalfd and start a
	 * graceful stop once the loop runs, not kill the process.
	 */
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
#ifdef KVPAGED_TEST_HOOKS
	sigaddset(&mask, SIGUSR2); /* the test hook that corrupts a pool: see on_signal() */
#endif
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	srv->signal_fd = signalfd(-1, &mask, SFD_CLOEXEC);
	if (srv->signal_fd < 0)
		return log_error_errno(errno, "signalfd: %m");

	srv->pools = calloc(cfg->npools, sizeof(*srv->pools));
	if (!srv->pools)
		return log_error_errno(ENOMEM, "out of memory");
	for (size_t i = 0; i < cfg->npools; i++) {
		r = dpool_init(&srv->pools[i], &cfg->pools[i]);
		srv->pools[i].srv = srv;
		if (r < 0)
			return r;
		srv->npools++;
	}

	/*
	 * One thread submits and reaps (SINGLE_ISSUER), and completion work runs only when we
	 * wait (DEFER_TASKRUN) instead of interrupting us: fewer context switches per wake-up.
	 * TASKRUN_FLAG makes the kernel say in the ring when such work waits, which the
	 * busy-poll loop checks so it enters the kernel only then.  Kernels before 6.1 lack
	 * these; fall back to a plain ring, whose completions need no entering.
	 */
	r = io_uring_queue_init(RING_DEPTH, &srv->ring,
				IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
					IORING_SETUP_TASKRUN_FLAG);
	if (r == -EINVAL)
		r = io_uring_queue_init(RING_DEPTH, &srv->ring, 0);
	if (r < 0)
		return log_error_errno(r, "io_uring_queue_init: %m");

	/*
	 * The pool ACLs guard the client socket; the admin socket is for root and the admin group.
	 * Sockets systemd passed are taken as they are (the socket units set their modes).
	 */
	r = open_socket(&srv->client_fd, srv->client_activated, cfg->socket_path, 0666, "client");
	if (r < 0)
		return r;
	r = open_socket(&srv->admin_fd, srv->admin_activated, cfg->admin_socket_path,
			cfg->has_admin_gid ? 0660 : 0600, "admin");
	if (r < 0)
		return r;
	if (cfg->has_admin_gid && !srv->admin_activated &&
	    chown(cfg->admin_socket_path, (uid_t)-1, cfg->admin_gid) < 0)
		return log_error_errno(errno, "cannot give %s to group %u: %m",
				       cfg->admin_socket_path, cfg->admin_gid);

	/* Before READY=1: an address that cannot be bound stops the start, with the reason. */
	r = http_start(srv);
	if (r < 0)
		return r;

	arm_accept(srv, &srv->client_listener);
	arm_accept(srv, &srv->admin_listener);
	arm_signal(srv);
	srv->fd_base = count_fds();
	check_fd_budget(srv);
#ifdef KVPAGED_TEST_HOOKS
	log_warning("a test build (configure --enable-test-hooks): KVPAGED_TEST_* variables and "
		    "SIGUSR2 inject faults; not for production");
#endif
	for (size_t i = 0; i < srv->npools; i++)
		log_info("pool %s: %u blocks of %u tokens, %llu bytes each (%s memory)",
			 srv->pools[i].cfg->name, srv->pools[i].cfg->capacity_blocks,
			 srv->pools[i].cfg->block_tokens,
			 (unsigned long long)srv->pools[i].block_bytes, srv->pools[i].mem.ops->name);
	log_info("listening on %s (clients%s)", srv->client_activated ?
		 socket_path_of(srv->client_fd, &sa) : cfg->socket_path,
		 srv->client_activated ? ", from systemd" : "");
	log_info("listening on %s (admin%s)", srv->admin_activated ?
		 socket_path_of(srv->admin_fd, &sa) : cfg->admin_socket_path,
		 srv->admin_activated ? ", from systemd" : "");
	return 0;
}

static void cancel_op(struct server *srv, struct op *op)
{
	struct io_uring_sqe *sqe = server_sqe(srv);

	io_uring_prep_cancel(sqe, op, 0);
	io_uring_sqe_set_data(sqe, NULL);
}

/* The STATUS= line: sessions, and per pool its occupancy and prefix-cache hit rate. */
static void status_text(const struct server *srv, char *buf, size_t len)
{
	size_t used;
	int n;

	n = snprintf(buf, len, "%s%u sessions", srv->stopping ? "draining: " : "", srv->nsessions);
	used = n < 0 ? 0 : (size_t)n;
	for (size_t i = 0; i < srv->npools && used < len; i++) {
		const struct dpool *p = &srv->pools[i];
		struct core_usage u;
		struct core_stats st;

		core_get_usage(p->core, &u);
		core_get_stats(p->core, &st);
		n = snprintf(buf + used, len - used,
			     "; pool %s: %.1f%% in use, %.1f%% cached, hit rate %.1f%% (%llu/%llu)",
			     p->cfg->name, u.capacity ? 100.0 * u.in_use / u.capacity : 0.0,
			     u.capacity ? 100.0 * u.cached / u.capacity : 0.0,
			     st.query_blocks ? 100.0 * (double)st.hit_blocks / (double)st.query_blocks
					     : 0.0,
			     (unsigned long long)st.hit_blocks, (unsigned long long)st.query_blocks);
		used += n < 0 ? 0 : (size_t)n;
	}
	if (srv->reload_note[0] && used < len)
		snprintf(buf + used, len - used, "; %s", srv->reload_note);
}

/* Sends STATUS= when it changed. */
static void update_status(struct server *srv)
{
	char text[sizeof(srv->status)];

	status_text(srv, text, sizeof(text));
	if (!strcmp(text, srv->status))
		return;
	memcpy(srv->status, text, sizeof(text));
	systemd_notify_status(srv->status);
}

/* The periodic tick: at the next watchdog ping or status refresh, whichever comes first. */
static void arm_tick(struct server *srv, uint64_t now)
{
	uint64_t next = srv->next_status_ns;

	if (srv->watchdog_ns && srv->next_watchdog_ns < next)
		next = srv->next_watchdog_ns;
	arm_timer(srv, &srv->tick_op, &srv->tick_ts, next > now ? next - now : 0);
}

static void on_tick(struct server *srv)
{
	uint64_t now = server_now_ns();

	if (srv->watchdog_ns && now >= srv->next_watchdog_ns) {
		systemd_notify_watchdog();
		srv->next_watchdog_ns = now + srv->watchdog_ns;
	}
	if (now >= srv->next_status_ns) {
		update_status(srv);
		srv->next_status_ns = now + STATUS_INTERVAL_NS;
		report_refusals(srv, now);
		log_flush_suppressed();
		/*
		 * A publisher behind, with nothing added since, raised (events.c); the remote
		 * tier's blocks past remote_tier_ttl_ms removed (eventsio.c).
		 */
		for (size_t i = 0; i < srv->npools; i++)
			dpool_events_tick(&srv->pools[i]);
	}
	arm_tick(srv, now);
}

/*
 * The drain deadline passed: shut every session down.  Shutting both directions also ends a
 * send that waits on a peer which stopped reading, so each session's last operations complete.
 */
static void force_close(struct server *srv, const char *why)
{
	if (srv->sessions)
		log_warning("stopping: %u sessions still open (%s); closing them", srv->nsessions,
			    why);
	srv->drain_forced = true;
	for (struct session *s = srv->sessions, *next; s; s = next) {
		next = s->next;
		s->refs++; /* session_close may drop the last reference */
		session_close(s, why);
		shutdown(s->fd, SHUT_RDWR);
		session_unref(s);
	}
}

static void on_drain_timer(struct server *srv)
{
	if (!srv->sessions)
		return;
	if (!srv->drain_forced) {
		force_close(srv, "drain deadline passed");
		arm_timer(srv, &srv->drain_op, &srv->drain_ts, DRAIN_GRACE_NS);
		return;
	}
	/* Cannot happen unless an operation never completes; do not hang the stop on it. */
	log_error("stopping: %u sessions did not go away; exiting without them", srv->nsessions);
	srv->abandoned = true;
	srv->exit_status = 1;
}

/*
 * One step of the drain, run until every session is gone.  A request waiting for memory fails
 * now (ENOSPC, as when its wait runs out) instead of holding the stop.  Then each session that
 * is not waiting is shut for reading: its peer can send nothing new (EPIPE), while everything
 * it already sent is still read and answered; at the end of that the session closes, and
 * flushes its replies first.  A waiting session is shut only once its request is answered,
 * since a waiter whose socket reads end-of-file is closed without an answer.
 */
static void drain_sessions(struct server *srv)
{
	uint64_t now = server_now_ns();

	for (size_t i = 0; i < srv->npools; i++) {
		if (!srv->pools[i].waiters)
			continue;
		for (struct session *s = srv->pools[i].waiters; s; s = s->wait_next)
			s->req.deadline_ns = 1;
		dpool_retry_waiters(&srv->pools[i], now);
	}
	for (struct session *s = srv->sessions; s; s = s->next) {
		if (s->closing || s->req.state != REQUEST_NONE || s->drained)
			continue;
		s->drained = true;
		shutdown(s->fd, SHUT_RD);
	}
}

/*
 * SIGTERM/SIGINT: a graceful drain.  Stop accepting, run every ring's pending submissions,
 * then drain the sessions (drain_sessions(), again after each pass of the loop).  Sessions
 * still open at the drain deadline are closed by force.  Once none is left the loop ends and
 * the pools are torn down (the file tier writes out what it has queued).
 */
static void begin_stop(struct server *srv)
{
	char text[sizeof(srv->status)];

	if (srv->stopping) {
		if (!srv->drain_forced)
			force_close(srv, "second stop signal");
		return;
	}
	srv->stopping = true;
	status_text(srv, text, sizeof(text));
	systemd_notify_stopping(text);
	log_info("stopping: draining %u sessions (at most %u ms)", srv->nsessions,
		 srv->opts.drain_timeout_ms);
	if (srv->client_listener.armed)
		cancel_op(srv, &srv->client_listener.op);
	if (srv->admin_listener.armed)
		cancel_op(srv, &srv->admin_listener.op);
	for (struct session *s = srv->sessions, *next; s; s = next) {
		const char *why = NULL;

		next = s->next;
		if (s->closing || !s->ring || !s->welcomed)
			continue;
		s->refs++; /* a ring violation closes the session */
		if (!ring_process(s, &why)) {
			session_reply_error(s, 0, EPROTO, "ring: %s", why);
			session_close(s, "ring protocol violation");
		}
		session_unref(s);
	}
	drain_sessions(srv);
	arm_timer(srv, &srv->drain_op, &srv->drain_ts, srv->opts.drain_timeout_ms * 1000000ull);
}

/* Counts one difference the reload found, and keeps it if the caller asked for them. */
static void report_add(struct server_reload_report *rep, bool applied, const char *what)
{
	char ***list = applied ? &rep->applied : &rep->refused;
	size_t *n = applied ? &rep->napplied : &rep->nrefused;
	char **grown, *copy;

	if (!applied)
		rep->refused_count++;
	if (!rep->keep)
		return;
	copy = strdup(what);
	grown = copy ? realloc(*list, (*n + 1) * sizeof(**list)) : NULL;
	if (!grown) {
		free(copy);
		rep->truncated = true; /* the log has them all */
		return;
	}
	grown[(*n)++] = copy;
	*list = grown;
}

static void on_reload_difference(void *ctx, bool applied, const char *what)
{
	if (applied)
		log_notice("reload: %s", what);
	else
		log_warning("reload: %s: cannot change while kvpaged runs; restart to apply (the "
			    "running value stays)", what);
	report_add(ctx, applied, what);
}

void server_reload_report_free(struct server_reload_report *rep)
{
	for (size_t i = 0; i < rep->napplied; i++)
		free(rep->applied[i]);
	for (size_t i = 0; i < rep->nrefused; i++)
		free(rep->refused[i]);
	free(rep->applied);
	free(rep->refused);
	rep->applied = rep->refused = NULL;
	rep->napplied = rep->nrefused = 0;
}

/*
 * SIGHUP and kvpagedctl reload: read the configuration file again and apply, in place, what
 * can change live (see config_apply_live()); everything else keeps its running value, each
 * with a logged reason.  A file that does not load changes nothing.
 */
int server_reload(struct server *srv, const char *trigger, struct server_reload_report *rep)
{
	struct kvpd_config next = { 0 };
	int applied, r;

	rep->error[0] = '\0';
	rep->refused_count = 0;
	if (srv->stopping) {
		log_notice("%s while stopping: nothing reloaded", trigger);
		snprintf(rep->error, sizeof(rep->error), "kvpaged is stopping: nothing reloaded");
		return -ESHUTDOWN;
	}
	if (!srv->opts.config_path) {
		log_notice("%s: no configuration file to reload", trigger);
		snprintf(rep->error, sizeof(rep->error), "kvpaged runs without a configuration file");
		return -ENOENT;
	}
	systemd_notify_reloading("reloading the configuration");
	log_info("%s: reloading %s", trigger, srv->opts.config_path);
	r = config_load_file(srv->opts.config_path, &next, rep->error, sizeof(rep->error));
	if (r < 0) {
		log_error("reload failed, the running configuration stays: %s", rep->error);
		snprintf(srv->reload_note, sizeof(srv->reload_note), "last reload failed: %.130s",
			 rep->error);
	} else {
		applied = config_apply_live(srv->cfg, &next, on_reload_difference, rep);
		config_free(&next);
		/* What the daemon keeps from the configuration rather than reading it afresh. */
		log_set_rate_limit(srv->cfg->log_rate_limit_interval_ms,
				   srv->cfg->log_rate_limit_burst);
		check_fd_budget(srv);
		server_schedule_sweep(srv, server_now_ns()); /* the timeouts may have changed */
		log_info("reload: %d changes applied, %u need a restart", applied,
			 rep->refused_count);
		if (rep->refused_count)
			snprintf(srv->reload_note, sizeof(srv->reload_note),
				 "last reload: %u changes need a restart", rep->refused_count);
		else
			srv->reload_note[0] = '\0';
	}
	status_text(srv, srv->status, sizeof(srv->status));
	systemd_notify_ready(srv->status);
	return r < 0 ? r : 0;
}

static const char *const refusal_names[SERVER_NREFUSALS] = {
	[REFUSED_SESSIONS] = "max_sessions",
	[REFUSED_UID_SESSIONS] = "max_sessions_per_uid",
	[REFUSED_ADMIN] = "max_admin_sessions",
	[REFUSED_ADMIN_PEER] = "admin peer not allowed",
	[REFUSED_FDS] = "out of file descriptors",
	[REFUSED_MEMORY] = "memory caps",
	[CLOSED_HELLO_TIMEOUT] = "hello_timeout_ms",
	[CLOSED_IDLE_TIMEOUT] = "idle_timeout_ms",
	[REFUSED_ACL] = "pool ACL",
	[CLOSED_PROTOCOL] = "protocol violations",
	[ACCEPT_ERRORS] = "accept errors",
};

const char *server_refusal_name(enum server_refusal r)
{
	return refusal_names[r];
}

/*
 * Tells a refused peer why, without ever blocking the loop, and hangs up.  What it sent
 * already is read first, so that closing does not turn into a reset that could reach the peer
 * before the error does.
 */
static void refuse(struct server *srv, int fd, const struct ucred *cred, bool admin,
		   enum server_refusal why, int code, const char *message)
{
	Kvpaged__V1__Error err = KVPAGED__V1__ERROR__INIT;
	char sink[4096];

	srv->refused[why]++;
	log_debug("refusing a%s connection from pid %d uid %u: %s", admin ? "n admin" : "",
		  (int)cred->pid, (unsigned)cred->uid, message);
	err.code = code;
	err.message = (char *)message;
	(void)kvp_frame_send_nonblocking(fd, KVPAGED__V1__MESSAGE_TYPE__ERROR, 0, &err.base);
	for (int i = 0; i < 16 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; i++)
		;
	close(fd);
}

/*
 * Admission, before a session exists: the peer's uid is known at once (SO_PEERCRED), so the
 * per-uid caps need no handshake, and the admin socket has slots of its own that no client
 * can take.  Returns the refusal, or SERVER_NREFUSALS to admit.
 */
static enum server_refusal admission(struct server *srv, int fd, bool admin,
				     const struct ucred *cred, const struct uid_account *a,
				     int *code, char *msg, size_t len)
{
	const struct kvpd_config *c = srv->cfg;
	const uint64_t fds = srv->fd_base + FDS_SPARE + srv->session_fds;
	struct rlimit rl;

	/* Read afresh: an operator may change it at run time (prlimit). */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		srv->fd_limit = rl.rlim_cur == RLIM_INFINITY ? UINT32_MAX : rl.rlim_cur;

	*code = EUSERS;
	if (admin) {
		if (!admin_peer_allowed(srv, fd, cred)) {
			*code = EACCES;
			snprintf(msg, len, "uid %u is neither root nor in the admin group",
				 (unsigned)cred->uid);
			return REFUSED_ADMIN_PEER;
		}
		if (srv->nadmin >= c->max_admin_sessions) {
			snprintf(msg, len, "too many admin sessions (max_admin_sessions = %u)",
				 c->max_admin_sessions);
			return REFUSED_ADMIN;
		}
		if (fds + 1 > srv->fd_limit) {
			*code = EMFILE;
			snprintf(msg, len, "the daemon is out of file descriptors");
			return REFUSED_FDS;
		}
		return SERVER_NREFUSALS;
	}
	if (srv->use.sessions >= c->max_sessions) {
		snprintf(msg, len, "too many sessions (max_sessions = %u)", c->max_sessions);
		return REFUSED_SESSIONS;
	}
	if (a->use.sessions >= c->max_sessions_per_uid) {
		snprintf(msg, len, "uid %u has too many sessions (max_sessions_per_uid = %u)",
			 (unsigned)cred->uid, c->max_sessions_per_uid);
		return REFUSED_UID_SESSIONS;
	}
	/* The admin slots' fds stay free, so the operator can always get in. */
	if (fds + FDS_PER_CLIENT +
		    (srv->nadmin < c->max_admin_sessions ? c->max_admin_sessions - srv->nadmin : 0) >
	    srv->fd_limit) {
		*code = EMFILE;
		snprintf(msg, len, "the daemon is out of file descriptors");
		return REFUSED_FDS;
	}
	/*
	 * A session's first buffers must fit: admitted past a cap it would be held back at once
	 * (account_over) with nothing of its own to free, and never read.
	 */
	if (a->use.bytes + SESSION_FIRST_BYTES > c->limits.max_bytes_per_uid ||
	    srv->use.bytes + SESSION_FIRST_BYTES > c->limits.max_total_bytes) {
		bool uid = a->use.bytes + SESSION_FIRST_BYTES > c->limits.max_bytes_per_uid;

		*code = EDQUOT;
		snprintf(msg, len, "%s holds its most memory (%s)", uid ? "the uid" : "the daemon",
			 uid ? "max_bytes_per_uid" : "max_total_bytes");
		return REFUSED_MEMORY;
	}
	return SERVER_NREFUSALS;
}

static void admit(struct server *srv, int fd, bool admin)
{
	struct ucred cred = { .pid = 0 };
	socklen_t len = sizeof(cred);
	enum server_refusal why;
	struct uid_account *a;
	char msg[160];
	int code;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		log_warning_errno(errno, "SO_PEERCRED: %m");
		close(fd);
		return;
	}
	a = account_uid_get(srv, cred.uid);
	if (!a) {
		refuse(srv, fd, &cred, admin, REFUSED_MEMORY, ENOMEM, "the daemon is out of memory");
		return;
	}
	why = admission(srv, fd, admin, &cred, a, &code, msg, sizeof(msg));
	if (why != SERVER_NREFUSALS) {
		refuse(srv, fd, &cred, admin, why, code, msg);
		account_uid_put(srv, a);
		return;
	}
	if (!session_new(srv, fd, admin, &cred, a)) {
		close(fd);
		account_uid_put(srv, a);
	}
}

/* An accept failed: pause this socket's accepting when the cause takes time to go away. */
static void accept_failed(struct server *srv, struct listener *l, int error)
{
	const char *what = l == &srv->admin_listener ? "admin" : "client";

	srv->refused[ACCEPT_ERRORS]++;
	if (error != -EMFILE && error != -ENFILE && error != -ENOBUFS && error != -ENOMEM) {
		log_warning_errno(error, "%s socket: accept: %m", what);
		arm_accept(srv, l);
		return;
	}
	/*
	 * The connection waits in the backlog and the very next accept would fail the same way:
	 * re-arming at once spins the loop and floods the log.  Wait instead, longer each time,
	 * while sessions close and give their fds back.
	 */
	l->backoff_ms = l->backoff_ms ? l->backoff_ms * 2 : ACCEPT_BACKOFF_FIRST_MS;
	if (l->backoff_ms > ACCEPT_BACKOFF_MAX_MS)
		l->backoff_ms = ACCEPT_BACKOFF_MAX_MS;
	if (!l->failures++) {
		l->paused_ns = server_now_ns();
		log_warning_errno(error, "%s socket: accept: %m; accepting is paused and retried "
				  "every %u ms at most until it works again", what,
				  ACCEPT_BACKOFF_MAX_MS);
	}
	l->paused = true;
	if (l->armed)
		cancel_op(srv, &l->op);
	arm_timer(srv, &l->retry_op, &l->retry_ts, (uint64_t)l->backoff_ms * 1000000u);
}

static void on_accept(struct server *srv, struct io_uring_cqe *cqe, bool admin)
{
	struct listener *l = admin ? &srv->admin_listener : &srv->client_listener;

	if (!(cqe->flags & IORING_CQE_F_MORE))
		l->armed = false;
	if (cqe->res < 0) {
		if (cqe->res != -ECANCELED)
			accept_failed(srv, l, cqe->res);
		return;
	}
	if (l->failures) {
		log_notice("%s socket: accepting again after %.1f s (%llu accepts failed)",
			   admin ? "admin" : "client", (server_now_ns() - l->paused_ns) / 1e9,
			   (unsigned long long)l->failures);
		l->failures = 0;
		l->backoff_ms = 0;
	}
	arm_accept(srv, l);
	if (srv->stopping) {
		close(cqe->res);
		return;
	}
	admit(srv, cqe->res, admin);
}

/* A pause of a listener is over: try accepting again. */
static void on_accept_retry(struct server *srv, struct listener *l)
{
	l->paused = false;
	arm_accept(srv, l);
}

/* One line now and then about connections refused (each one is only a debug line). */
static void report_refusals(struct server *srv, uint64_t now)
{
	char line[512];
	size_t used = 0;

	if (now < srv->next_refusal_report_ns)
		return;
	srv->next_refusal_report_ns = now + REFUSAL_REPORT_NS;
	for (int r = 0; r < SERVER_NREFUSALS; r++) {
		uint64_t n = srv->refused[r] - srv->refused_reported[r];
		int w;

		if (!n || r == ACCEPT_ERRORS)
			continue;
		w = snprintf(line + used, sizeof(line) - used, "%s%llu (%s)", used ? ", " : "",
			     (unsigned long long)n, refusal_names[r]);
		if (w > 0 && (size_t)w < sizeof(line) - used)
			used += (size_t)w;
	}
	memcpy(srv->refused_reported, srv->refused, sizeof(srv->refused));
	if (used)
		log_notice("in the last %u s, connections refused or closed by limits: %s",
			   (unsigned)(REFUSAL_REPORT_NS / NSEC_PER_SEC), line);
}

/* ---- hello and idle timeouts --------------------------------------------------------------- */

/* When s is to be closed for saying nothing, 0 if never. */
static uint64_t session_deadline(const struct session *s)
{
	const struct kvpd_limits *l = &s->srv->cfg->limits;

	if (s->closing)
		return 0;
	if (!s->welcomed)
		return s->accepted_ns + (uint64_t)l->hello_timeout_ms * 1000000u;
	/*
	 * Idle: no request for idle_timeout_ms, and nothing in progress for it (a reply waiting
	 * for its copies or its peer, a request waiting for memory or loads).  A session holding
	 * sequences is closed only when the configuration says so: closing frees them.
	 */
	if (!l->idle_timeout_ms || s->req.state != REQUEST_NONE || s->held || s->outq ||
	    (s->nseqs && !l->idle_timeout_with_sequences))
		return 0;
	return s->active_ns + (uint64_t)l->idle_timeout_ms * 1000000u;
}

void server_schedule_sweep(struct server *srv, uint64_t when)
{
	struct io_uring_sqe *sqe;
	uint64_t now;

	when = (when + SWEEP_GRAIN_NS - 1) / SWEEP_GRAIN_NS * SWEEP_GRAIN_NS;
	if (srv->sweep_at_ns && srv->sweep_at_ns <= when)
		return;
	if (srv->ring.ring_fd <= 0)
		return; /* no loop (the fuzzer): nothing is ever swept */
	now = server_now_ns();
	srv->sweep_ts.tv_sec = when > now ? (long long)((when - now) / NSEC_PER_SEC) : 0;
	srv->sweep_ts.tv_nsec = when > now ? (long long)((when - now) % NSEC_PER_SEC) : 0;
	sqe = server_sqe(srv);
	if (srv->sweep_at_ns) {
		/* Sooner than it is armed for: move it (-ENOENT if it fired already: harmless). */
		io_uring_prep_timeout_update(sqe, &srv->sweep_ts, (uint64_t)(uintptr_t)&srv->sweep_op,
					     0);
		io_uring_sqe_set_data(sqe, NULL);
	} else {
		io_uring_prep_timeout(sqe, &srv->sweep_ts, 0, 0);
		io_uring_sqe_set_data(sqe, &srv->sweep_op);
	}
	srv->sweep_at_ns = when;
}

/* Closes the sessions whose deadline passed, and arms the sweep for the next one. */
static void on_sweep(struct server *srv)
{
	const struct kvpd_limits *l = &srv->cfg->limits;
	uint64_t now = server_now_ns(), next = 0;

	srv->sweep_at_ns = 0;
	for (struct session *s = srv->sessions, *nexts; s; s = nexts) {
		uint64_t deadline = session_deadline(s);

		nexts = s->next;
		if (!deadline)
			continue;
		if (deadline > now) {
			if (!next || deadline < next)
				next = deadline;
			continue;
		}
		s->refs++; /* closing drops a reference; the list link must stay valid */
		if (!s->welcomed) {
			srv->refused[CLOSED_HELLO_TIMEOUT]++;
			session_reply_error(s, 0, ETIMEDOUT,
					    s->admin ? "no request within %u ms (hello_timeout_ms)"
						     : "no Hello within %u ms (hello_timeout_ms)",
					    l->hello_timeout_ms);
			session_close(s, "handshake timed out");
		} else {
			srv->refused[CLOSED_IDLE_TIMEOUT]++;
			session_reply_error(s, 0, ETIMEDOUT, "idle for %u ms (idle_timeout_ms)",
					    l->idle_timeout_ms);
			session_close(s, "idle timeout");
		}
		nexts = s->next;
		session_unref(s);
	}
	if (next)
		server_schedule_sweep(srv, next);
	http_sweep(srv); /* the metrics endpoint's deadlines share this timer */
}

static void on_signal(struct server *srv, struct io_uring_cqe *cqe)
{
	if (cqe->res != sizeof(srv->siginfo)) {
		log_error_errno(cqe->res < 0 ? cqe->res : EIO, "reading signals: %m");
		begin_stop(srv);
		srv->exit_status = 1;
		return;
	}
	switch (srv->siginfo.ssi_signo) {
	case SIGHUP: {
		struct server_reload_report rep = { 0 };

		server_reload(srv, "SIGHUP", &rep);
		break;
	}
#ifdef KVPAGED_TEST_HOOKS
	case SIGUSR2:
		/* For tests of verify: the first pool's state, broken on purpose. */
		if (srv->npools)
			log_warning("test hook: SIGUSR2: pool %s: block %u now has a reference no "
				    "block table holds", srv->pools[0].cfg->name,
				    core_test_corrupt(srv->pools[0].core));
		break;
#endif
	default:
		log_info("signal %u received", srv->siginfo.ssi_signo);
		begin_stop(srv);
		break;
	}
	/* Still read while stopping: a second SIGTERM ends the drain at once. */
	arm_signal(srv);
}

static void handle(struct server *srv, struct io_uring_cqe *cqe)
{
	struct op *op = io_uring_cqe_get_data(cqe);

	if (!op)
		return; /* a cancel request's own completion */
	switch (op->kind) {
	case OP_ACCEPT_CLIENT:
		on_accept(srv, cqe, false);
		break;
	case OP_ACCEPT_ADMIN:
		on_accept(srv, cqe, true);
		break;
	case OP_SIGNAL:
		if (cqe->res != -ECANCELED)
			on_signal(srv, cqe);
		break;
	case OP_RECV:
		session_on_recv(op->s, cqe);
		break;
	case OP_SEND:
		session_on_send(op->s, cqe);
		break;
	case OP_DOORBELL:
		ring_on_doorbell(op->s, cqe);
		break;
	case OP_TIER:
		/* The file tier's ring posted completions: reap them (loads finish there). */
		if (read(file_tier_event_fd(op->pool->file), &op->pool->tier_event,
			 sizeof(op->pool->tier_event)) < 0 &&
		    errno != EAGAIN)
			log_warning_errno(errno, "pool %s: reading the file tier's eventfd: %m",
					  op->pool->cfg->name);
		if (!(cqe->flags & IORING_CQE_F_MORE)) {
			op->pool->tier_armed = false;
			/*
			 * A multishot poll may end (overflow): arm it again.  After an error the
			 * pool's opens read within the request (may_defer sees it unarmed).
			 */
			if (cqe->res >= 0)
				dpool_arm_tier_poll(srv, op->pool);
			else if (cqe->res != -ECANCELED)
				log_error("pool %s: polling the file tier's eventfd: %s; swap-file "
					  "reads hold the loop from now on", op->pool->cfg->name,
					  strerror(-cqe->res));
		}
		dpool_tier_poll(op->pool);
		break;
	case OP_REMOTE:
		/* The remote tier's thread completed jobs: stores let their blocks go, fetches
		 * finish their loads. */
		if (!(cqe->flags & IORING_CQE_F_MORE)) {
			op->pool->remote_armed = false;
			if (cqe->res >= 0)
				dpool_arm_remote_poll(srv, op->pool);
			else if (cqe->res != -ECANCELED)
				log_error("pool %s: polling the remote tier's eventfd: %s; it is reaped "
					  "between requests from now on, and opens no longer ask it",
					  op->pool->cfg->name, strerror(-cqe->res));
		}
		dpool_remote_poll(op->pool);
		break;
	case OP_BACKEND:
		/* Queued copies or moves completed: replies and reads that waited may go on. */
		if (read(op->pool->mem.done_fd, &op->pool->backend_event,
			 sizeof(op->pool->backend_event)) < 0 &&
		    errno != EAGAIN)
			log_warning_errno(errno, "pool %s: reading the backend's eventfd: %m",
					  op->pool->cfg->name);
		if (!(cqe->flags & IORING_CQE_F_MORE)) {
			op->pool->backend_armed = false;
			if (cqe->res >= 0)
				dpool_arm_backend_poll(srv, op->pool);
			else if (cqe->res != -ECANCELED)
				log_error("pool %s: polling the backend's eventfd: %s; its queue is "
					  "checked after every pass of the loop from now on",
					  op->pool->cfg->name, strerror(-cqe->res));
		}
		dpool_backend_poll(op->pool);
		break;
	case OP_SWEEP:
		if (cqe->res != -ECANCELED)
			on_sweep(srv);
		break;
	case OP_HTTP:
		http_on_poll(srv, cqe);
		break;
	case OP_ACCEPT_RETRY:
		if (cqe->res != -ECANCELED)
			on_accept_retry(srv, op == &srv->admin_listener.retry_op ? &srv->admin_listener
										 : &srv->client_listener);
		break;
	case OP_TIMER:
		if (cqe->res == -ECANCELED)
			break;
		if (op == &srv->tick_op)
			on_tick(srv);
		else
			on_drain_timer(srv);
		break;
	}
}

uint64_t server_next_deadline(const struct server *srv)
{
	uint64_t first = 0;

	for (size_t i = 0; i < srv->npools; i++) {
		const struct dpool *p = &srv->pools[i];

		for (const struct session *s = p->waiters; s; s = s->wait_next)
			if (!first || s->req.deadline_ns < first)
				first = s->req.deadline_ns;
		/*
		 * A pool whose eventfd poll failed is looked at after every pass of the loop
		 * instead; while replies or reads wait on it, a pass comes every millisecond.
		 */
		if (((!p->backend_armed &&
		      (p->nheld || p->jobs || p->nstores || p->remote_out || p->remote_in)) ||
		     (p->file && !p->tier_armed && p->jobs) ||
		     (p->remote && !p->remote_armed && p->remote_fetching)) &&
		    (!first || first > server_now_ns() + 1000000u))
			first = server_now_ns() + 1000000u;
		/* Outstanding tickets: the backend is asked now and then (a device error). */
		if (p->issued > p->completed &&
		    (!first || first > p->backend_checked_ns + BACKEND_CHECK_NS))
			first = p->backend_checked_ns + BACKEND_CHECK_NS;
	}
	return first;
}

int server_run(struct server *srv)
{
	uint64_t start = server_now_ns();

	/* Every pool is allocated and both sockets listen: ready. */
	srv->watchdog_ns = systemd_watchdog_interval_ns();
	srv->next_watchdog_ns = start + srv->watchdog_ns;
	srv->next_status_ns = start + STATUS_INTERVAL_NS;
	if (srv->watchdog_ns)
		log_debug("watchdog: pinging every %llu ms",
			  (unsigned long long)(srv->watchdog_ns / 1000000u));
	status_text(srv, srv->status, sizeof(srv->status));
	systemd_notify_ready(srv->status);
	arm_tick(srv, start);
	for (size_t i = 0; i < srv->npools; i++) {
		dpool_arm_tier_poll(srv, &srv->pools[i]);
		dpool_arm_remote_poll(srv, &srv->pools[i]);
		dpool_arm_backend_poll(srv, &srv->pools[i]);
	}

	while ((!srv->stopping || srv->sessions) && !srv->abandoned) {
		struct io_uring_cqe *cqe;
		unsigned head, n = 0;
		int r;

		if (srv->poll_until_ns) {
			/*
			 * Busy-polling rings (ring_poll_us): submit without waiting, serve rings
			 * and completions as they come, and sleep only once nothing has happened
			 * for ring_poll_us.
			 */
			uint64_t now = server_now_ns();
			bool expired = now >= srv->poll_until_ns;

			/*
			 * Deferred completion work runs only when asked for.  Ask (a syscall) only
			 * when the kernel flags some as pending or there is something to submit,
			 * so an idle pass over the rings stays in user space.
			 */
			if (io_uring_sq_ready(&srv->ring) ||
			    (IO_URING_READ_ONCE(*srv->ring.sq.kflags) & IORING_SQ_TASKRUN))
				io_uring_submit_and_get_events(&srv->ring);
			set_clocks(srv, now);
			if (ring_poll_all(srv, expired))
				srv->poll_until_ns = now + srv->cfg->ring_poll_us * 1000ull;
			else if (expired)
				srv->poll_until_ns = 0;
		} else {
			uint64_t deadline = server_next_deadline(srv), now;

			if (deadline && deadline > (now = server_now_ns())) {
				/* A request waits for memory: wake up by its deadline at the latest. */
				struct __kernel_timespec ts = {
					.tv_sec = (long long)((deadline - now) / 1000000000u),
					.tv_nsec = (long long)((deadline - now) % 1000000000u),
				};
				struct io_uring_cqe *first;

				r = io_uring_submit_and_wait_timeout(&srv->ring, &first, 1, &ts, NULL);
				if (r < 0 && r != -EINTR && r != -ETIME)
					return log_error_errno(r, "io_uring: %m");
			} else if (!deadline) {
				r = io_uring_submit_and_wait(&srv->ring, 1);
				if (r < 0 && r != -EINTR)
					return log_error_errno(r, "io_uring: %m");
			} else {
				io_uring_submit(&srv->ring);
			}
		}
		set_clocks(srv, server_now_ns());
		io_uring_for_each_cqe(&srv->ring, head, cqe) {
			handle(srv, cqe);
			n++;
		}
		io_uring_cq_advance(&srv->ring, n);
		if (srv->stopping && !srv->drain_forced)
			drain_sessions(srv);
		if (srv->npaused)
			server_resume_paused(srv);
		/*
		 * Swap-file I/O finishes on the tier's own ring, whose eventfd the loop polls
		 * (OP_TIER); a pool whose poll failed is reaped here, between requests.
		 */
		for (size_t i = 0; i < srv->npools; i++) {
			dpool_flush(&srv->pools[i]); /* what this pass's requests demoted goes out */
			if (!srv->pools[i].tier_armed)
				dpool_tier_poll(&srv->pools[i]);
			if (!srv->pools[i].remote_armed)
				dpool_remote_poll(&srv->pools[i]);
			if (!srv->pools[i].backend_armed ||
			    (srv->pools[i].issued > srv->pools[i].completed &&
			     server_now_ns() >= srv->pools[i].backend_checked_ns + BACKEND_CHECK_NS)) {
				/*
				 * Unarmed, or a while without an event though tickets are
				 * outstanding: after a device error none will come, and only
				 * asking finds the error.
				 */
				srv->pools[i].backend_checked_ns = server_now_ns();
				dpool_backend_poll(&srv->pools[i]);
			}
			if (srv->pools[i].failed && !srv->stopping) {
				/* A device error is sticky: nothing of the pool can be trusted. */
				begin_stop(srv);
				srv->exit_status = 1;
			}
			if (srv->pools[i].failed && srv->pools[i].nheld)
				dpool_backend_poll(&srv->pools[i]); /* its held replies are dropped */
			if (srv->pools[i].waiters)
				dpool_retry_waiters(&srv->pools[i], server_now_ns());
		}
	}
	/* Every session is gone: what is cached now stays so, and may go down to the files. */
	for (size_t i = 0; i < srv->npools && !srv->abandoned; i++)
		dpool_persist_at_stop(&srv->pools[i]);
	log_info("stopped");
	return srv->exit_status;
}

void server_done(struct server *srv)
{
	/* A socket systemd passed stays where it is: the next start gets it again. */
	if (srv->client_fd >= 0) {
		close(srv->client_fd);
		if (!srv->client_activated)
			(void)unlink(srv->cfg->socket_path);
	}
	if (srv->admin_fd >= 0) {
		close(srv->admin_fd);
		if (!srv->admin_activated)
			(void)unlink(srv->cfg->admin_socket_path);
	}
	if (srv->signal_fd >= 0)
		close(srv->signal_fd);
	if (srv->ring.ring_fd > 0)
		io_uring_queue_exit(&srv->ring);
	http_done(srv);
	for (size_t i = 0; i < srv->npools; i++)
		dpool_done(&srv->pools[i]);
	free(srv->pools);
}

/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
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

uint64_t server_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
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

static void arm_accept(struct server *srv, int fd, struct op *op)
{
	struct io_uring_sqe *sqe = server_sqe(srv);

	io_uring_prep_multishot_accept(sqe, fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data(sqe, op);
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
		.accept_client_op = { .kind = OP_ACCEPT_CLIENT },
		.accept_admin_op = { .kind = OP_ACCEPT_ADMIN },
		.signal_op = { .kind = OP_SIGNAL },
		.tick_op = { .kind = OP_TIMER },
		.drain_op = { .kind = OP_TIMER },
		.next_session_id = 1,
		.started_ns = server_now_ns(),
	};
	if (opts)
		srv->opts = *opts;

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

	arm_accept(srv, srv->client_fd, &srv->accept_client_op);
	arm_accept(srv, srv->admin_fd, &srv->accept_admin_op);
	arm_signal(srv);
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
			s->wait_deadline_ns = 1;
		dpool_retry_waiters(&srv->pools[i], now);
	}
	for (struct session *s = srv->sessions; s; s = s->next) {
		if (s->closing || s->waiting || s->loading || s->drained)
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
	cancel_op(srv, &srv->accept_client_op);
	cancel_op(srv, &srv->accept_admin_op);
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

static void on_reload_difference(void *ctx, bool applied, const char *what)
{
	unsigned *refused = ctx;

	if (applied) {
		log_notice("reload: %s", what);
		return;
	}
	log_warning("reload: %s: cannot change while kvpaged runs; restart to apply (the running "
		    "value stays)", what);
	(*refused)++;
}

/*
 * SIGHUP: read the configuration file again and apply, in place, what can change live (see
 * config_apply_live()); everything else keeps its running value, each with a logged reason.  A
 * file that does not load changes nothing.
 */
static void reload(struct server *srv)
{
	struct kvpd_config next = { 0 };
	unsigned refused = 0;
	char err[512];
	int applied, r;

	if (srv->stopping) {
		log_notice("SIGHUP while stopping: nothing reloaded");
		return;
	}
	if (!srv->opts.config_path) {
		log_notice("SIGHUP: no configuration file to reload");
		return;
	}
	systemd_notify_reloading("reloading the configuration");
	log_info("SIGHUP: reloading %s", srv->opts.config_path);
	r = config_load_file(srv->opts.config_path, &next, err, sizeof(err));
	if (r < 0) {
		log_error("reload failed, the running configuration stays: %s", err);
		snprintf(srv->reload_note, sizeof(srv->reload_note), "last reload failed: %.130s",
			 err);
	} else {
		applied = config_apply_live(srv->cfg, &next, on_reload_difference, &refused);
		config_free(&next);
		log_info("reload: %d changes applied, %u need a restart", applied, refused);
		if (refused)
			snprintf(srv->reload_note, sizeof(srv->reload_note),
				 "last reload: %u changes need a restart", refused);
		else
			srv->reload_note[0] = '\0';
	}
	status_text(srv, srv->status, sizeof(srv->status));
	systemd_notify_ready(srv->status);
}

static void on_accept(struct server *srv, struct io_uring_cqe *cqe, bool admin)
{
	int listen_fd = admin ? srv->admin_fd : srv->client_fd;
	struct op *op = admin ? &srv->accept_admin_op : &srv->accept_client_op;

	if (!(cqe->flags & IORING_CQE_F_MORE) && !srv->stopping)
		arm_accept(srv, listen_fd, op);
	if (cqe->res < 0) {
		if (cqe->res != -ECANCELED)
			log_warning_errno(cqe->res, "accept: %m");
		return;
	}
	if (srv->stopping) {
		close(cqe->res);
		return;
	}
	if (srv->nsessions >= srv->cfg->max_sessions) {
		/* Best effort: tell the peer why, without ever blocking the loop. */
		Kvpaged__V1__Error err = KVPAGED__V1__ERROR__INIT;
		err.code = EUSERS;
		err.message = "too many sessions (max_sessions)";
		log_warning("refusing a connection: %u sessions open (max_sessions)", srv->nsessions);
		(void)kvp_frame_send_nonblocking(cqe->res, KVPAGED__V1__MESSAGE_TYPE__ERROR, 0,
						 &err.base);
		close(cqe->res);
		return;
	}
	if (!session_new(srv, cqe->res, admin))
		close(cqe->res);
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
	case SIGHUP:
		reload(srv);
		break;
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
			log_warning("pool %s: reading the file tier's eventfd: %m",
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
	case OP_BACKEND:
		/* Queued copies or moves completed: replies and reads that waited may go on. */
		if (read(op->pool->mem.done_fd, &op->pool->backend_event,
			 sizeof(op->pool->backend_event)) < 0 &&
		    errno != EAGAIN)
			log_warning("pool %s: reading the backend's eventfd: %m",
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
		io_uring_for_each_cqe(&srv->ring, head, cqe) {
			handle(srv, cqe);
			n++;
		}
		io_uring_cq_advance(&srv->ring, n);
		if (srv->stopping && !srv->drain_forced)
			drain_sessions(srv);
		/*
		 * Swap-file I/O finishes on the tier's own ring, whose eventfd the loop polls
		 * (OP_TIER); a pool whose poll failed is reaped here, between requests.
		 */
		for (size_t i = 0; i < srv->npools; i++) {
			dpool_flush(&srv->pools[i]); /* what this pass's requests demoted goes out */
			if (!srv->pools[i].tier_armed)
				dpool_tier_poll(&srv->pools[i]);
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
	for (size_t i = 0; i < srv->npools; i++)
		dpool_done(&srv->pools[i]);
	free(srv->pools);
}

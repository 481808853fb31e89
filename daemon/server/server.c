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
#include "daemon/server/server.h"

#define RING_DEPTH 1024

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

int server_init(struct server *srv, struct kvpd_config *cfg)
{
	sigset_t mask;
	int r;

	*srv = (struct server){
		.cfg = cfg,
		.client_fd = -1,
		.admin_fd = -1,
		.signal_fd = -1,
		.accept_client_op = { .kind = OP_ACCEPT_CLIENT },
		.accept_admin_op = { .kind = OP_ACCEPT_ADMIN },
		.signal_op = { .kind = OP_SIGNAL },
		.next_session_id = 1,
		.started_ns = server_now_ns(),
	};

	srv->pools = calloc(cfg->npools, sizeof(*srv->pools));
	if (!srv->pools)
		return log_error_errno(ENOMEM, "out of memory");
	for (size_t i = 0; i < cfg->npools; i++) {
		r = dpool_init(&srv->pools[i], &cfg->pools[i]);
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

	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	srv->signal_fd = signalfd(-1, &mask, SFD_CLOEXEC);
	if (srv->signal_fd < 0)
		return log_error_errno(errno, "signalfd: %m");

	/* The pool ACLs guard the client socket; the admin socket is for root and the admin group. */
	srv->client_fd = listen_unix(cfg->socket_path, 0666);
	if (srv->client_fd < 0)
		return srv->client_fd;
	srv->admin_fd = listen_unix(cfg->admin_socket_path, cfg->has_admin_gid ? 0660 : 0600);
	if (srv->admin_fd < 0)
		return srv->admin_fd;
	if (cfg->has_admin_gid && chown(cfg->admin_socket_path, (uid_t)-1, cfg->admin_gid) < 0)
		return log_error_errno(errno, "cannot give %s to group %u: %m",
				       cfg->admin_socket_path, cfg->admin_gid);

	arm_accept(srv, srv->client_fd, &srv->accept_client_op);
	arm_accept(srv, srv->admin_fd, &srv->accept_admin_op);
	arm_signal(srv);
	for (size_t i = 0; i < srv->npools; i++)
		log_info("pool %s: %u blocks of %u tokens, %llu bytes each (%s memory)",
			 srv->pools[i].cfg->name, srv->pools[i].cfg->capacity_blocks,
			 srv->pools[i].cfg->block_tokens,
			 (unsigned long long)srv->pools[i].block_bytes, srv->pools[i].mem.ops->name);
	log_info("listening on %s (clients) and %s (admin)", cfg->socket_path,
		 cfg->admin_socket_path);
	return 0;
}

static void cancel_op(struct server *srv, struct op *op)
{
	struct io_uring_sqe *sqe = server_sqe(srv);

	io_uring_prep_cancel(sqe, op, 0);
	io_uring_sqe_set_data(sqe, NULL);
}

/* SIGTERM/SIGINT: stop accepting, close every session (releasing its blocks), then exit. */
static void begin_stop(struct server *srv)
{
	if (srv->stopping)
		return;
	srv->stopping = true;
	log_info("stopping: %u sessions to close", srv->nsessions);
	cancel_op(srv, &srv->accept_client_op);
	cancel_op(srv, &srv->accept_admin_op);
	for (struct session *s = srv->sessions, *next; s; s = next) {
		next = s->next;
		session_close(s, "daemon stopping");
	}
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
		log_notice("SIGHUP: nothing in this configuration can change live; restart to apply");
		break;
	default:
		log_info("signal %u received", srv->siginfo.ssi_signo);
		begin_stop(srv);
		return;
	}
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
	}
}

int server_run(struct server *srv)
{
	while (!srv->stopping || srv->sessions) {
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
		/* Swap-file writes finish on their own ring: reap them between requests. */
		for (size_t i = 0; i < srv->npools; i++) {
			dpool_tier_poll(&srv->pools[i]);
			if (srv->pools[i].waiters)
				dpool_retry_waiters(&srv->pools[i], server_now_ns());
		}
	}
	log_info("stopped");
	return srv->exit_status;
}

void server_done(struct server *srv)
{
	if (srv->client_fd >= 0) {
		close(srv->client_fd);
		(void)unlink(srv->cfg->socket_path);
	}
	if (srv->admin_fd >= 0) {
		close(srv->admin_fd);
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

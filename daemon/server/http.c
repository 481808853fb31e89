/* SPDX-License-Identifier: MIT */
/*
 * The HTTP metrics endpoint ([daemon] metrics_listen): GET /metrics answers what
 * `kvpagedctl metrics` prints, for a Prometheus server to scrape.
 *
 * libmicrohttpd parses HTTP; the daemon's loop drives it.  It runs with no thread of its own
 * (metrics_text() reads the daemon's state, which has no locks) in its "external epoll"
 * mode: its sockets sit in an epoll set of its own, the loop polls that epoll fd with a
 * one-shot POLL_ADD on the io_uring, and calls MHD_run() when it is readable.  MHD_run() never
 * blocks: every socket is non-blocking and it waits on its epoll set with a timeout of 0.
 *
 * The limits are ours, not the library's, so that they say what they do: at
 * metrics_max_connections open connections a new one is closed at accept (the accept policy
 * callback; libmicrohttpd's own limit would leave it waiting in the backlog), and a connection
 * still open metrics_timeout_ms after its accept is shut down, however slowly its peer
 * trickles bytes (libmicrohttpd's timeout only counts silence).  Each response carries
 * "Connection: close", so a connection is one request and the timeout bounds the request.
 * metrics_max_request_bytes is libmicrohttpd's memory pool per connection: a request line and
 * headers that do not fit are answered with an error status (431, or 414 for a long URI) and
 * the connection is closed.
 */
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/server/server.h"

/* libmicrohttpd's own connection limit, never reached: ours (live, up to 1024) comes first. */
#define HTTP_LIBRARY_CONNECTION_LIMIT 1025u
/* How many times one wake-up runs libmicrohttpd while it says it has more to do at once. */
#define HTTP_RUNS_PER_WAKEUP 8
#define HTTP_BACKLOG 16

struct http_conn {
	struct http_conn *prev, *next;
	int fd;
	uint64_t deadline_ns;
	bool shut; /* its deadline passed: shut down, libmicrohttpd is closing it */
};

struct http_endpoint {
	struct server *srv;
	struct MHD_Daemon *mhd;
	int listen_fd; /* owned by libmicrohttpd once it started */
	int epoll_fd;
	struct op poll_op;
	bool poll_armed;
	bool pending; /* libmicrohttpd has work it can do at once (MHD_get_timeout said 0) */
	struct http_conn *conns;
	uint32_t nconns;
	uint64_t requests, refused_connections, timed_out;
	char address[80];
};

/*
 * libmicrohttpd's messages are about one peer's connection (or our setup): debug lines.  (The
 * attribute tells clang's -Wformat-nonliteral that fmt is the library's printf format.)
 */
__attribute__((format(printf, 2, 0)))
static void on_library_log(void *cls, const char *fmt, va_list ap)
{
	char line[256];
	size_t n;

	(void)cls;
	vsnprintf(line, sizeof(line), fmt, ap);
	n = strlen(line);
	while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
		line[--n] = '\0';
	log_debug("metrics endpoint: libmicrohttpd: %s", line);
}

static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
	struct http_endpoint *h = cls;

	(void)addr;
	(void)addrlen;
	if (h->nconns < h->srv->cfg->metrics_max_connections)
		return MHD_YES;
	h->refused_connections++;
	log_debug("metrics endpoint: %u connections open (metrics_max_connections): closing a new "
		  "one", h->nconns);
	return MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *connection, void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	struct http_endpoint *h = cls;
	struct http_conn *c = *socket_context;

	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *info =
			MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);

		h->nconns++;
		c = calloc(1, sizeof(*c));
		if (!c || !info) {
			/* Counted, but without a deadline: shut it at once rather than keep it. */
			if (info)
				shutdown(info->connect_fd, SHUT_RDWR);
			free(c);
			return;
		}
		c->fd = info->connect_fd;
		c->deadline_ns =
			server_now_ns() + (uint64_t)h->srv->cfg->metrics_timeout_ms * 1000000u;
		c->next = h->conns;
		if (h->conns)
			h->conns->prev = c;
		h->conns = c;
		*socket_context = c;
		return;
	}
	/* MHD_CONNECTION_NOTIFY_CLOSED */
	h->nconns--;
	if (!c)
		return;
	if (c->prev)
		c->prev->next = c->next;
	else
		h->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	free(c);
	*socket_context = NULL;
}

/* A fixed response (its text is static), closing the connection after it. */
static enum MHD_Result reply_static(struct MHD_Connection *connection, unsigned status,
				    const char *text, const char *allow)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
	if (allow)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
	ret = MHD_queue_response(connection, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *connection, const char *url,
				  const char *method, const char *version, const char *upload_data,
				  size_t *upload_data_size, void **req_cls)
{
	struct http_endpoint *h = cls;
	struct MHD_Response *r;
	enum MHD_Result ret;
	char *text;
	size_t len;

	(void)version;
	(void)upload_data;
	(void)upload_data_size;
	(void)req_cls;
	h->requests++;
	/* Answered at the first call, before any body: none is wanted, and it is not read. */
	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
		return reply_static(connection, MHD_HTTP_METHOD_NOT_ALLOWED,
				    "only GET and HEAD are allowed\n", "GET, HEAD");
	if (strcmp(url, "/metrics"))
		return reply_static(connection, MHD_HTTP_NOT_FOUND,
				    "not found: the metrics are at /metrics\n", NULL);
	if (admin_metrics_text(h->srv, &text, &len) < 0)
		return reply_static(connection, MHD_HTTP_INTERNAL_SERVER_ERROR,
				    "the daemon is out of memory\n", NULL);
	r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
				"text/plain; version=0.0.4; charset=utf-8");
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
	ret = MHD_queue_response(connection, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

static void arm_poll(struct http_endpoint *h)
{
	struct io_uring_sqe *sqe;

	if (h->poll_armed)
		return;
	/*
	 * One-shot, armed again after each run: a poll checks readiness when it is armed, so
	 * events libmicrohttpd left in its epoll set are seen again at once (level-triggered).
	 */
	sqe = server_sqe(h->srv);
	io_uring_prep_poll_add(sqe, h->epoll_fd, POLLIN);
	io_uring_sqe_set_data(sqe, &h->poll_op);
	h->poll_armed = true;
}

/* Shuts down the connections past their deadline; returns the next deadline (0: none). */
static uint64_t expire(struct http_endpoint *h, uint64_t now)
{
	uint64_t next = 0;

	for (struct http_conn *c = h->conns; c; c = c->next) {
		if (c->shut)
			continue;
		if (c->deadline_ns <= now) {
			/* libmicrohttpd sees the end of the stream at its next run, and closes. */
			shutdown(c->fd, SHUT_RDWR);
			c->shut = true;
			h->timed_out++;
			log_debug("metrics endpoint: a connection open for %u ms "
				  "(metrics_timeout_ms): closing it",
				  h->srv->cfg->metrics_timeout_ms);
			continue;
		}
		if (!next || c->deadline_ns < next)
			next = c->deadline_ns;
	}
	return next;
}

/* Runs libmicrohttpd, then arms the poll and the sweep for what it waits for next. */
static void run(struct http_endpoint *h)
{
	MHD_UNSIGNED_LONG_LONG ms = 0;
	uint64_t now, next;

	for (int i = 0; i < HTTP_RUNS_PER_WAKEUP; i++) {
		if (MHD_run(h->mhd) != MHD_YES) {
			log_warning("metrics endpoint: libmicrohttpd failed to run");
			break;
		}
		if (MHD_get_timeout(h->mhd, &ms) != MHD_YES || ms > 0)
			break;
	}
	now = server_now_ns();
	next = expire(h, now);
	h->pending = MHD_get_timeout(h->mhd, &ms) == MHD_YES;
	if (h->pending && (!next || now + ms * 1000000u < next))
		next = now + ms * 1000000u;
	if (next)
		server_schedule_sweep(h->srv, next);
	arm_poll(h);
}

void http_on_poll(struct server *srv, struct io_uring_cqe *cqe)
{
	struct http_endpoint *h = srv->http;

	h->poll_armed = false;
	if (cqe->res < 0 && cqe->res != -ECANCELED)
		log_warning("metrics endpoint: polling libmicrohttpd's epoll fd: %s",
			    strerror(-cqe->res));
	if (cqe->res == -ECANCELED)
		return;
	run(h);
}

void http_sweep(struct server *srv)
{
	if (srv->http)
		run(srv->http);
}

/* Binds and listens on addr: the daemon refuses to start when this fails. */
static int listen_tcp(const char *address)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fd, one = 1, r;

	r = config_parse_listen(address, &ss, &len);
	if (r < 0)
		return log_error_errno(r, "metrics_listen = %s: not an address: %m", address);
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return log_error_errno(errno, "metrics_listen = %s: socket: %m (a unit with "
				       "RestrictAddressFamilies=AF_UNIX needs a drop-in: see "
				       "kvpaged.conf(5))", address);
	/* A restart must not wait for the previous run's connections in TIME_WAIT. */
	(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, HTTP_BACKLOG) < 0) {
		r = log_error_errno(errno, "metrics_listen = %s: cannot listen: %m", address);
		close(fd);
		return r;
	}
	return fd;
}

int http_start(struct server *srv)
{
	const struct kvpd_config *cfg = srv->cfg;
	const union MHD_DaemonInfo *info;
	struct http_endpoint *h;
	int fd;

	if (!cfg->metrics_listen)
		return 0;
	h = calloc(1, sizeof(*h));
	if (!h)
		return log_error_errno(ENOMEM, "out of memory");
	*h = (struct http_endpoint){
		.srv = srv,
		.listen_fd = -1,
		.epoll_fd = -1,
		.poll_op = { .kind = OP_HTTP },
	};
	snprintf(h->address, sizeof(h->address), "%s", cfg->metrics_listen);
	srv->http = h;
	fd = listen_tcp(cfg->metrics_listen);
	if (fd < 0)
		return fd;
	h->listen_fd = fd;
	h->mhd = MHD_start_daemon(
		MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, on_accept, h, on_request, h,
		MHD_OPTION_LISTEN_SOCKET, fd,
		MHD_OPTION_CONNECTION_LIMIT, HTTP_LIBRARY_CONNECTION_LIMIT,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)cfg->metrics_max_request_bytes,
		MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
		MHD_OPTION_EXTERNAL_LOGGER, on_library_log, h,
		MHD_OPTION_END);
	if (!h->mhd)
		return log_error_errno(EIO, "metrics_listen = %s: libmicrohttpd does not start "
				       "(run with --verbose for its reason)", cfg->metrics_listen);
	info = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_EPOLL_FD);
	if (!info || info->epoll_fd < 0)
		return log_error_errno(EIO, "metrics_listen = %s: libmicrohttpd has no epoll fd",
				       cfg->metrics_listen);
	h->epoll_fd = info->epoll_fd;
	arm_poll(h);
	log_info("listening on http://%s/metrics (metrics)", h->address);
	return 0;
}

void http_done(struct server *srv)
{
	struct http_endpoint *h = srv->http;

	if (!h)
		return;
	if (h->mhd)
		MHD_stop_daemon(h->mhd); /* closes its connections and the listening socket */
	else if (h->listen_fd >= 0)
		close(h->listen_fd);
	while (h->conns) { /* not notified of a close by a stop: nothing left to free */
		struct http_conn *c = h->conns;

		h->conns = c->next;
		free(c);
	}
	free(h);
	srv->http = NULL;
}

void http_stats(const struct server *srv, struct http_stats *ret)
{
	const struct http_endpoint *h = srv->http;

	*ret = (struct http_stats){ 0 };
	if (!h)
		return;
	ret->connections = h->nconns;
	ret->requests = h->requests;
	ret->refused_connections = h->refused_connections;
	ret->timed_out = h->timed_out;
}

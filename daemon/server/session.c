/* SPDX-License-Identifier: MIT */
/*
 * Sessions: one per connection on the client or admin socket.  Frames are read with RECVMSG
 * (so fds a peer should not send are seen and closed) into a per-session buffer and dispatched
 * when whole; replies are queued and written with SENDMSG, one in flight at a time.  A session
 * that does not read its replies stops being read once it has max_queued_bytes or max_inflight
 * replies queued.  Bad input gets an error frame and closes that session only.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/server/server.h"


struct session *session_new(struct server *srv, int fd, bool admin, const struct ucred *cred,
			    struct uid_account *acct)
{
	struct session *s = calloc(1, sizeof(*s));

	if (!s) {
		log_error("out of memory for a new session");
		return NULL;
	}
	s->rbuf = malloc(SESSION_RBUF_BYTES);
	if (!s->rbuf) {
		free(s);
		return NULL;
	}
	s->rcap = SESSION_RBUF_BYTES;
	s->srv = srv;
	s->fd = fd;
	s->admin = admin;
	s->cred = *cred;
	s->acct = acct;
	s->id = srv->next_session_id++;
	s->refs = 1;
	s->nfds = 1;
	s->accepted_ns = s->active_ns = server_now_ns();
	s->recv_op = (struct op){ .kind = OP_RECV, .s = s };
	s->send_op = (struct op){ .kind = OP_SEND, .s = s };
	snprintf(s->name, sizeof(s->name), "pid %d", (int)s->cred.pid);
	s->next = srv->sessions;
	if (srv->sessions)
		srv->sessions->prev = s;
	srv->sessions = s;
	srv->nsessions++;
	srv->session_fds += s->nfds;
	if (admin) {
		srv->nadmin++;
		acct->admin_sessions++;
	} else {
		srv->use.sessions++;
		acct->use.sessions++;
	}
	account_bytes(s, SESSION_FIRST_BYTES);
	log_debug("session %llu: %s connection from pid %d uid %d", (unsigned long long)s->id,
		  admin ? "admin" : "client", (int)s->cred.pid, (int)s->cred.uid);
	server_schedule_sweep(srv, s->accepted_ns +
					   (uint64_t)srv->cfg->limits.hello_timeout_ms * 1000000u);
	session_arm_recv(s);
	return s;
}

/* What a queued reply costs the session: its bytes and its bookkeeping. */
static int64_t outbuf_bytes(const struct outbuf *o)
{
	return (int64_t)(sizeof(*o) + o->len);
}

static void free_outq(struct session *s)
{
	for (struct outbuf *o = s->outq, *next; o; o = next) {
		next = o->next;
		account_bytes(s, -outbuf_bytes(o));
		free(o->data);
		free(o);
	}
	s->outq = s->outq_tail = NULL;
	s->queued_bytes = 0;
	s->queued_frames = 0;
}

void session_unref(struct session *s)
{
	struct server *srv = s->srv;

	if (--s->refs > 0)
		return;
	if (s->prev)
		s->prev->next = s->next;
	else
		srv->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	srv->nsessions--;
	if (s->paused)
		srv->npaused--;
	ring_free(s);
	close(s->fd);
	srv->session_fds -= s->nfds;
	free_outq(s);
	free(s->rbuf);
	free(s->seqs);
	/* Its sequences went at the close: what is left are its buffers, now freed too. */
	account_leave_ns(s);
	account_bytes(s, -(int64_t)s->bytes);
	if (s->admin) {
		srv->nadmin--;
		s->acct->admin_sessions--;
	} else {
		srv->use.sessions--;
		s->acct->use.sessions--;
	}
	account_uid_put(srv, s->acct);
	free(s);
}

static void wait_unlink(struct session *s)
{
	struct dpool *p = s->pool;

	if (s->wait_prev)
		s->wait_prev->wait_next = s->wait_next;
	else
		p->waiters = s->wait_next;
	if (s->wait_next)
		s->wait_next->wait_prev = s->wait_prev;
	else
		p->waiters_tail = s->wait_prev;
	s->wait_prev = s->wait_next = NULL;
}

/*
 * Closes a session: releases every sequence it owns at once (its blocks go back to the pool
 * now), stops reading, sends what is queued (the error that explains the close, typically),
 * each send bounded by a timeout, then shuts the socket down; the session is freed when its
 * last in-flight operation completes.
 */
void session_close(struct session *s, const char *why)
{
	if (s->closing)
		return;
	s->closing = true;
	if (why)
		log_debug("session %llu (%s): closing: %s", (unsigned long long)s->id, s->name, why);
	if (s->req.state == REQUEST_WAITING)
		wait_unlink(s);
	/* Nothing will answer it.  A LOADING one's sequence stays for its load job (an orphan). */
	client_request_end(s);
	ops_close_all(s);
	if (s->pool && s->welcomed)
		s->pool->sessions--;
	ring_destroy(s);
	/* Completes the pending recv; a pending send finishes (or times out) on its own. */
	shutdown(s->fd, s->outq ? SHUT_RD : SHUT_RDWR);
	session_unref(s);
}

/* What stops s from being read now, in words, or NULL: its replies, its uid's memory... */
static const char *session_backpressure(const struct session *s)
{
	const struct kvpd_limits *l = &s->srv->cfg->limits;

	/* A peer that does not read its replies is not read either. */
	if (s->queued_bytes > l->max_queued_bytes)
		return "max_queued_bytes";
	if (s->queued_frames >= l->max_inflight)
		return "max_inflight";
	/* Nor one whose uid's (or everyone's) replies and buffers are over their caps. */
	if (account_over(s))
		return "memory";
	return NULL;
}

/*
 * Stops reading s while backpressure says so.  Its own replies going out read it again
 * (session_on_send); a memory cap of its uid or of the daemon is waited out by the loop
 * (server_resume_paused), since other sessions' replies may be what frees it.
 */
static bool held_back(struct session *s)
{
	const char *why = session_backpressure(s);

	if (!why)
		return false;
	if (!strcmp(why, "memory") && !s->paused) {
		s->paused = true;
		s->srv->npaused++;
	}
	return true;
}

void server_resume_paused(struct server *srv)
{
	for (struct session *s = srv->sessions, *next; s && srv->npaused; s = next) {
		next = s->next;
		if (!s->paused || account_over(s))
			continue;
		s->paused = false;
		srv->npaused--;
		s->refs++; /* dispatching may close it */
		if (!s->recv_armed)
			session_dispatch(s);
		next = s->next;
		session_unref(s);
	}
}

/*
 * Makes room for a whole frame of want bytes at the head of the buffer: charged, and refused
 * past the memory caps.  Refused, the frame is answered with the reason and its bytes are
 * read and dropped as they come (skip): the session goes on, nothing else is lost.
 */
static void grow_rbuf(struct session *s, size_t want, uint32_t seq)
{
	const size_t cap = (want + 4095) & ~(size_t)4095;
	const char *why = NULL;
	uint8_t *b;

	if (account_check(s, cap - s->rcap, 0, 0, &why) < 0) {
		session_reply_error(s, seq, EDQUOT, "no memory to receive a frame of this size: %s",
				    why);
		s->skip = want - s->rlen;
		s->rlen = 0;
		return;
	}
	b = realloc(s->rbuf, cap);
	if (!b) {
		session_reply_error(s, seq, ENOMEM, "out of memory for a frame of this size");
		session_close(s, "out of memory");
		return;
	}
	account_bytes(s, (int64_t)(cap - s->rcap));
	s->rbuf = b;
	s->rcap = cap;
}

/*
 * After a large frame, the buffer goes back to its first size, so memory a session took once
 * is not kept for good.  Never with a receive in flight: it points into the buffer.
 */
static void shrink_rbuf(struct session *s)
{
	uint8_t *b;

	if (s->recv_armed || s->rcap <= SESSION_RBUF_BYTES || s->rlen > SESSION_RBUF_BYTES / 2)
		return;
	b = realloc(s->rbuf, SESSION_RBUF_BYTES);
	if (!b)
		return; /* the larger one still works */
	account_bytes(s, -(int64_t)(s->rcap - SESSION_RBUF_BYTES));
	s->rbuf = b;
	s->rcap = SESSION_RBUF_BYTES;
}

void session_touch(struct session *s)
{
	const uint32_t idle_ms = s->srv->cfg->limits.idle_timeout_ms;

	s->active_ns = server_now_ns();
	if (idle_ms)
		server_schedule_sweep(s->srv, s->active_ns + (uint64_t)idle_ms * 1000000u);
}

void session_arm_recv(struct session *s)
{
	struct io_uring_sqe *sqe;

	/*
	 * A session with a request in progress (waiting for memory or loads) is not read: the
	 * frames after it wait in the buffer and the socket, answered in order once it ends.
	 */
	if (s->closing || s->recv_armed || s->req.state != REQUEST_NONE)
		return;
	if (held_back(s))
		return;
	if (s->rlen == s->rcap) {
		/* Cannot happen: session_dispatch makes room for the frame it waits for. */
		session_close(s, "receive buffer full");
		return;
	}
	s->riov = (struct iovec){ .iov_base = s->rbuf + s->rlen, .iov_len = s->rcap - s->rlen };
	s->rmsg = (struct msghdr){ .msg_iov = &s->riov, .msg_iovlen = 1,
				   .msg_control = s->rcontrol.buf,
				   .msg_controllen = sizeof(s->rcontrol.buf) };
	sqe = server_sqe(s->srv);
	io_uring_prep_recvmsg(sqe, s->fd, &s->rmsg, MSG_CMSG_CLOEXEC);
	io_uring_sqe_set_data(sqe, &s->recv_op);
	s->recv_armed = true;
	s->refs++;
}

/* Closes fds that arrived with a message; returns how many there were. */
static unsigned drop_fds(struct msghdr *mh)
{
	unsigned n = 0;

	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			close(fd);
			n++;
		}
	}
	return n;
}

bool session_wait(struct session *s)
{
	struct dpool *p = s->pool;
	uint64_t now = server_now_ns();

	if (!s->req.deadline_ns)
		s->req.deadline_ns = now + (uint64_t)s->req.wait_ms * 1000000u;
	if (now >= s->req.deadline_ns || s->closing)
		return false;
	s->req.state = REQUEST_WAITING;
	s->wait_prev = p->waiters_tail;
	s->wait_next = NULL;
	if (p->waiters_tail)
		p->waiters_tail->wait_next = s;
	else
		p->waiters = s;
	p->waiters_tail = s;
	return true;
}

void session_dispatch(struct session *s)
{
	size_t off = 0, want = 0;
	uint32_t want_seq = 0;

	/*
	 * Backpressure applies between frames, not only between receives: one receive may bring
	 * thousands of small requests, and their replies must not pile up past the limits.  The
	 * rest stays in the buffer until replies drain.
	 */
	while (!s->closing && s->req.state == REQUEST_NONE &&
	       s->rlen - off >= KVP_FRAME_HEADER_BYTES && !held_back(s)) {
		struct kvp_frame_header h;
		int r = kvp_frame_header_decode(s->rbuf + off, (uint32_t)s->srv->cfg->max_frame_bytes,
						&h);

		if (r < 0 || h.nfds != 0) {
			/* h is meaningful only when the header decoded. */
			session_reply_error(s, 0, r == -EMSGSIZE ? EMSGSIZE : EPROTO,
					    r == -EMSGSIZE ? "frame larger than max_frame_bytes"
					    : r < 0	   ? "bad frame header"
							   : "frame header announces file descriptors");
			s->srv->refused[CLOSED_PROTOCOL]++;
			session_close(s, "bad frame header");
			break;
		}
		if (s->rlen - off < KVP_FRAME_HEADER_BYTES + (size_t)h.len) {
			want = KVP_FRAME_HEADER_BYTES + (size_t)h.len;
			want_seq = h.seq;
			break;
		}
		/* Dispatched once: a request that waits is retried from s->req, not from here. */
		s->requests++;
		s->srv->requests++;
		session_touch(s);
		if (s->admin)
			admin_dispatch(s, &h, s->rbuf + off + KVP_FRAME_HEADER_BYTES);
		else
			client_dispatch(s, &h, s->rbuf + off + KVP_FRAME_HEADER_BYTES);
		off += KVP_FRAME_HEADER_BYTES + h.len;
	}
	if (off > 0 && !s->closing) {
		memmove(s->rbuf, s->rbuf + off, s->rlen - off);
		s->rlen -= off;
	}
	/* (Never with a receive in flight: no caller dispatches then, and it reads into rbuf.) */
	if (!s->closing && !s->recv_armed && want > s->rcap)
		grow_rbuf(s, want, want_seq);
	else if (!s->closing && off > 0)
		shrink_rbuf(s);
	session_arm_recv(s);
}

void session_on_recv(struct session *s, struct io_uring_cqe *cqe)
{
	s->recv_armed = false;
	if (s->closing)
		goto out;
	if (cqe->res <= 0) {
		session_close(s, cqe->res == 0 ? "peer closed the connection" : "receive failed");
		goto out;
	}
	if (drop_fds(&s->rmsg) > 0 || (s->rmsg.msg_flags & MSG_CTRUNC)) {
		s->srv->refused[CLOSED_PROTOCOL]++;
		session_reply_error(s, 0, EPROTO, "file descriptors are not accepted from clients");
		session_close(s, "peer sent file descriptors");
		goto out;
	}
	s->rlen += (size_t)cqe->res;
	if (s->skip) {
		/* The rest of a frame refused for its size: dropped as it comes. */
		size_t n = s->skip < s->rlen ? s->skip : s->rlen;

		memmove(s->rbuf, s->rbuf + n, s->rlen - n);
		s->rlen -= n;
		s->skip -= n;
	}
	session_dispatch(s);
out:
	session_unref(s);
}

void session_loaded(struct session *s, uint64_t seq)
{
	if (s->closing) {
		/* Its owner went while it loaded: ops_close_all left it to us. */
		log_debug("session %llu (%s): sequence %llu loaded after the session closed: "
			  "closing it", (unsigned long long)s->id, s->name, (unsigned long long)seq);
		core_seq_close(s->pool->core, seq);
		s->pool->orphans--;
		s->pool->epoch++;
		return;
	}
	s->refs++; /* replying may close it */
	client_loaded(s);
	if (!s->closing)
		session_dispatch(s); /* the frames that came after it */
	session_unref(s);
}

void session_retry(struct session *s)
{
	char byte;

	if (s->closing)
		return;
	s->refs++; /* retrying may close it */
	/*
	 * Not read while it waited: a peer that hung up must not be given memory.  A drained
	 * session reads end-of-file from the daemon's own shutdown: it is answered (the drain's
	 * deadline fails it with ENOSPC), not closed.
	 */
	if (!s->drained && recv(s->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
		session_close(s, "peer closed the connection while waiting");
	} else {
		client_retry(s);
		if (!s->closing)
			session_dispatch(s);
	}
	session_unref(s);
}

static void arm_send(struct session *s)
{
	struct outbuf *o = s->outq;
	struct io_uring_sqe *sqe;

	if (!o || s->send_armed)
		return;
	if (o->fence) {
		/* It hands out blocks the pool's queue still writes or reads: not yet. */
		if (!dpool_passed(s->pool, o->fence)) {
			if (!s->pool->failed) {
				session_hold(s);
				return;
			}
			/* The device failed: those blocks will never be right.  Nothing more. */
			free_outq(s);
			if (s->closing)
				shutdown(s->fd, SHUT_RDWR);
			else
				session_close(s, "the pool's device failed");
			return;
		}
		o->fence = 0;
	}
	s->siov = (struct iovec){ .iov_base = o->data + o->off, .iov_len = o->len - o->off };
	s->smsg = (struct msghdr){ .msg_iov = &s->siov, .msg_iovlen = 1 };
	if (o->off == 0 && o->nfds > 0) {
		struct cmsghdr *cm;

		memset(&s->scontrol, 0, sizeof(s->scontrol));
		s->smsg.msg_control = s->scontrol.buf;
		s->smsg.msg_controllen = CMSG_SPACE(sizeof(int) * o->nfds);
		cm = CMSG_FIRSTHDR(&s->smsg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * o->nfds);
		memcpy(CMSG_DATA(cm), o->fds, sizeof(int) * o->nfds);
	}
	sqe = server_sqe(s->srv);
	io_uring_prep_sendmsg(sqe, s->fd, &s->smsg, MSG_NOSIGNAL);
	io_uring_sqe_set_data(sqe, &s->send_op);
	if (s->closing) {
		/* A peer that stopped reading cannot hold a closed session: 1 s per send. */
		static struct __kernel_timespec limit = { .tv_sec = 1 };

		sqe->flags |= IOSQE_IO_LINK;
		sqe = server_sqe(s->srv);
		io_uring_prep_link_timeout(sqe, &limit, 0);
		io_uring_sqe_set_data(sqe, NULL);
	}
	s->send_armed = true;
	s->refs++;
}

void session_on_send(struct session *s, struct io_uring_cqe *cqe)
{
	struct outbuf *o = s->outq;

	s->send_armed = false;
	if (cqe->res < 0) {
		if (s->closing) {
			free_outq(s);
			shutdown(s->fd, SHUT_RDWR);
		} else {
			session_close(s, "send failed");
		}
		goto out;
	}
	o->off += (size_t)cqe->res;
	if (o->off == o->len) {
		s->outq = o->next;
		if (!s->outq)
			s->outq_tail = NULL;
		s->queued_bytes -= o->len;
		s->queued_frames--;
		account_bytes(s, -outbuf_bytes(o));
		free(o->data);
		free(o);
	}
	arm_send(s);
	if (s->closing && !s->outq)
		shutdown(s->fd, SHUT_RDWR); /* everything said: done */
	/* Backpressure may have left whole frames unread in the buffer: dispatch them. */
	if (!s->closing && !s->recv_armed)
		session_dispatch(s);
out:
	session_unref(s);
}

/*
 * A held session keeps a reference, so that its replies still go out if it closes meanwhile
 * (a drain, or a peer that half-closed after its last request).
 */
void session_hold(struct session *s)
{
	if (s->held)
		return;
	s->held = true;
	s->refs++;
	s->pool->nheld++;
	s->pool->held_replies++;
}

void session_release(struct session *s)
{
	const uint64_t held = s->pool->held_replies;

	s->held = false;
	s->pool->nheld--;
	if (s->ring)
		ring_release(s);
	arm_send(s); /* each holds the session again if it must still wait */
	/* Counted when its replies first waited, not again for each wake-up. */
	s->pool->held_replies = held;
	session_unref(s);
}

static int queue_reply(struct session *s, uint64_t fence, uint16_t type, uint32_t seq,
		       const ProtobufCMessage *msg, const int *fds, unsigned nfds)
{
	size_t len = msg ? protobuf_c_message_get_packed_size(msg) : 0;
	struct kvp_frame_header h = { .len = (uint32_t)len, .seq = seq, .type = type,
				      .nfds = (uint8_t)nfds };
	struct outbuf *o;

	if (s->closing)
		return 0;
	o = calloc(1, sizeof(*o));
	if (o)
		o->data = malloc(KVP_FRAME_HEADER_BYTES + len);
	if (!o || !o->data) {
		free(o);
		session_close(s, "out of memory for a reply");
		return -ENOMEM;
	}
	kvp_frame_header_encode(&h, o->data);
	if (msg)
		protobuf_c_message_pack(msg, o->data + KVP_FRAME_HEADER_BYTES);
	o->len = KVP_FRAME_HEADER_BYTES + len;
	o->fence = fence;
	o->nfds = nfds;
	if (nfds)
		memcpy(o->fds, fds, nfds * sizeof(int));
	if (s->outq_tail)
		s->outq_tail->next = o;
	else
		s->outq = o;
	s->outq_tail = o;
	s->queued_bytes += o->len;
	s->queued_frames++;
	account_bytes(s, outbuf_bytes(o));
	arm_send(s);
	return 0;
}

int session_reply(struct session *s, uint16_t type, uint32_t seq, const ProtobufCMessage *msg,
		  const int *fds, unsigned nfds)
{
	return queue_reply(s, 0, type, seq, msg, fds, nfds);
}

int session_reply_fenced(struct session *s, uint64_t fence, uint16_t type, uint32_t seq,
			 const ProtobufCMessage *msg)
{
	return queue_reply(s, fence, type, seq, msg, NULL, 0);
}

int session_reply_error(struct session *s, uint32_t seq, int error, const char *fmt, ...)
{
	Kvpaged__V1__Error err = KVPAGED__V1__ERROR__INIT;
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	err.code = error;
	err.message = msg;
	log_debug("session %llu (%s): error %d: %s", (unsigned long long)s->id, s->name, error, msg);
	return session_reply(s, KVPAGED__V1__MESSAGE_TYPE__ERROR, seq, &err.base, NULL, 0);
}

/* SPDX-License-Identifier: MIT */
/*
 * proto/frame.c over real sockets (socketpairs, a listening socket), what proto/frame.h
 * promises and nothing more (PipeWire's test-connection is the model):
 *
 *   - the header: every field round-trips; bad magic, flags or an fd count above
 *     KVP_FRAME_MAX_FDS are -EPROTO, a length above the cap -EMSGSIZE, and *ret is untouched;
 *   - frames back to back, and frames that arrive a few bytes at a time (several send calls,
 *     the fds on the first byte alone), are received whole and one at a time;
 *   - fds (SCM_RIGHTS): 0 to KVP_FRAME_MAX_FDS arrive as the same files, close-on-exec; more
 *     than the receiver takes, fds the header does not announce, and a header that announces
 *     fds that did not come are -EPROTO, and every fd that came is closed;
 *   - a frame above the receiver's cap is -EMSGSIZE; end of stream before, inside the header
 *     or inside the payload is -ECONNRESET; no payload or fd leaks on any failure;
 *   - send: too many fds is -EINVAL and sends nothing; a closed peer is -EPIPE, not SIGPIPE;
 *     the non-blocking send refuses a payload it cannot hold (-EMSGSIZE) and a full socket
 *     (-EAGAIN);
 *   - kvp_unix_connect: a close-on-exec connection, -ENOENT, -ENAMETOOLONG.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto/frame.h"
#include "proto/kvpaged.pb-c.h"
#include "tests/check-runner.h"

#define CAP (64u << 10)

static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static void pair(int sv[2])
{
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

/* A Hello whose fields say which frame it is. */
static void hello_init(Kvpaged__V1__Hello *h, const char *name, uint32_t entries)
{
	kvpaged__v1__hello__init(h);
	h->protocol_version = KVP_PROTOCOL_VERSION;
	h->client_name = (char *)name;
	h->pool = "main";
	h->ring_entries = entries;
}

/* Receives one frame and checks it is the Hello hello_init(name, entries) made. */
static void recv_hello(int fd, uint32_t seq, const char *name, uint32_t entries)
{
	struct kvp_frame_header h;
	uint8_t *payload = NULL;
	unsigned nfds = 99;
	int fds[KVP_FRAME_MAX_FDS];
	Kvpaged__V1__Hello *m;

	ck_assert_int_eq(kvp_frame_recv(fd, CAP, &h, &payload, fds, KVP_FRAME_MAX_FDS, &nfds), 0);
	ck_assert_uint_eq(h.type, KVPAGED__V1__MESSAGE_TYPE__HELLO);
	ck_assert_uint_eq(h.seq, seq);
	ck_assert_uint_eq(h.nfds, 0);
	ck_assert_uint_eq(nfds, 0);
	m = kvpaged__v1__hello__unpack(NULL, h.len, payload);
	ck_assert_ptr_nonnull(m);
	ck_assert_str_eq(m->client_name, name);
	ck_assert_str_eq(m->pool, "main");
	ck_assert_uint_eq(m->ring_entries, entries);
	kvpaged__v1__hello__free_unpacked(m, NULL);
	free(payload);
}

/* Writes a raw header (and payload bytes) with sendmsg, fds on its first byte. */
static void send_raw(int fd, const struct kvp_frame_header *h, const void *payload, size_t len,
		     const int *fds, unsigned nfds)
{
	uint8_t buf[KVP_FRAME_HEADER_BYTES + 256];
	union {
		char buf[CMSG_SPACE(sizeof(int) * 16)];
		struct cmsghdr align;
	} control;
	struct iovec iov = { .iov_base = buf, .iov_len = KVP_FRAME_HEADER_BYTES + len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	ck_assert_uint_le(len, 256);
	ck_assert_uint_le(nfds, 16);
	kvp_frame_header_encode(h, buf);
	if (len)
		memcpy(buf + KVP_FRAME_HEADER_BYTES, payload, len);
	if (nfds) {
		struct cmsghdr *cm;

		memset(&control, 0, sizeof(control));
		mh.msg_control = control.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
	}
	ck_assert_int_eq(sendmsg(fd, &mh, MSG_NOSIGNAL), (ssize_t)iov.iov_len);
}

/*
 * Forks a writer that sends buf in pieces, one send call each (pieces[] ends with 0; the rest
 * goes a byte per call), passing fd on the first piece when fd >= 0, then exits.  Returns its
 * pid; writer_done() checks it exited 0.
 */
static pid_t spawn_writer(int sock, const uint8_t *buf, size_t len, const size_t *pieces,
			  int fd)
{
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid > 0)
		return pid;
	for (size_t off = 0, k = 0; off < len; k++) {
		size_t n = pieces[k] ? pieces[k] : 1;
		union {
			char buf[CMSG_SPACE(sizeof(int))];
			struct cmsghdr align;
		} control;
		struct iovec iov = { .iov_base = (void *)(buf + off), .iov_len = n };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

		if (!pieces[k])
			k--; /* stay on the terminating 0 */
		if (off + n > len)
			_exit(2);
		if (off == 0 && fd >= 0) {
			struct cmsghdr *cm;

			memset(&control, 0, sizeof(control));
			mh.msg_control = control.buf;
			mh.msg_controllen = sizeof(control.buf);
			cm = CMSG_FIRSTHDR(&mh);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(cm), &fd, sizeof(int));
		}
		if (sendmsg(sock, &mh, MSG_NOSIGNAL) != (ssize_t)n)
			_exit(1);
		off += n;
		usleep(500); /* the reader then sees a short read, most of the time */
	}
	_exit(0);
}

static void writer_done(pid_t pid)
{
	int status;

	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status));
	ck_assert_int_eq(WEXITSTATUS(status), 0);
}

/* A Hello frame, encoded by hand (the receiver is what is tested). */
static size_t hello_frame(uint8_t *buf, size_t cap, uint32_t seq, uint16_t type, uint8_t nfds)
{
	Kvpaged__V1__Hello hello;
	size_t len;

	hello_init(&hello, "pieces", 64);
	len = protobuf_c_message_get_packed_size(&hello.base);
	ck_assert_uint_le(KVP_FRAME_HEADER_BYTES + len, cap);
	kvp_frame_header_encode(&(struct kvp_frame_header){ .len = (uint32_t)len, .seq = seq,
							    .type = type, .nfds = nfds },
				buf);
	protobuf_c_message_pack(&hello.base, buf + KVP_FRAME_HEADER_BYTES);
	return KVP_FRAME_HEADER_BYTES + len;
}

/* ------------------------------------------------------------------------------ header */

START_TEST(test_header_round_trip)
{
	const struct kvp_frame_header in = { .len = 0x01020304, .seq = 0xfffffffe, .type = 0x0148,
					     .nfds = KVP_FRAME_MAX_FDS, .flags = 0 };
	uint8_t b[KVP_FRAME_HEADER_BYTES];
	struct kvp_frame_header out;

	kvp_frame_header_encode(&in, b);
	/* Little-endian, at the offsets proto/frame.h draws. */
	ck_assert_mem_eq(b, "KVP1", 4);
	ck_assert_mem_eq(b + 4, "\x04\x03\x02\x01", 4);
	ck_assert_mem_eq(b + 8, "\xfe\xff\xff\xff", 4);
	ck_assert_mem_eq(b + 12, "\x48\x01", 2);
	ck_assert_uint_eq(b[14], KVP_FRAME_MAX_FDS);
	ck_assert_uint_eq(b[15], 0);
	ck_assert_int_eq(kvp_frame_header_decode(b, UINT32_MAX, &out), 0);
	ck_assert_uint_eq(out.len, in.len);
	ck_assert_uint_eq(out.seq, in.seq);
	ck_assert_uint_eq(out.type, in.type);
	ck_assert_uint_eq(out.nfds, in.nfds);
	ck_assert_uint_eq(out.flags, 0);
	/* The cap is inclusive. */
	ck_assert_int_eq(kvp_frame_header_decode(b, in.len, &out), 0);
}
END_TEST

START_TEST(test_header_refusals)
{
	const struct kvp_frame_header good = { .len = 100, .seq = 1, .type = 1 };
	const struct kvp_frame_header keep = { .len = 7, .seq = 7, .type = 7, .nfds = 7, .flags = 7 };
	struct kvp_frame_header h, out;
	uint8_t b[KVP_FRAME_HEADER_BYTES];

	kvp_frame_header_encode(&good, b);
	b[0] = 'G'; /* "GET / HTTP/1.1" */
	out = keep;
	ck_assert_int_eq(kvp_frame_header_decode(b, CAP, &out), -EPROTO);
	ck_assert_mem_eq(&out, &keep, sizeof(out));

	h = good;
	h.flags = 0x80;
	kvp_frame_header_encode(&h, b);
	ck_assert_int_eq(kvp_frame_header_decode(b, CAP, &out), -EPROTO);

	h = good;
	h.nfds = KVP_FRAME_MAX_FDS + 1;
	kvp_frame_header_encode(&h, b);
	ck_assert_int_eq(kvp_frame_header_decode(b, CAP, &out), -EPROTO);

	h = good;
	h.len = 101;
	kvp_frame_header_encode(&h, b);
	ck_assert_int_eq(kvp_frame_header_decode(b, 100, &out), -EMSGSIZE);
	ck_assert_mem_eq(&out, &keep, sizeof(out));
}
END_TEST

/* ------------------------------------------------------------------------------ frames */

START_TEST(test_frames_back_to_back)
{
	Kvpaged__V1__Hello a, b;
	struct kvp_frame_header h;
	uint8_t *payload = NULL;
	unsigned nfds;
	int sv[2], fds[1];

	pair(sv);
	hello_init(&a, "first", 16);
	hello_init(&b, "second", 32);
	ck_assert_int_eq(kvp_frame_send(sv[0], KVPAGED__V1__MESSAGE_TYPE__HELLO, 1, &a.base, NULL, 0), 0);
	/* An empty payload (NULL message) is a frame too. */
	ck_assert_int_eq(kvp_frame_send(sv[0], KVPAGED__V1__MESSAGE_TYPE__CLOSE_REPLY, 2, NULL, NULL, 0), 0);
	ck_assert_int_eq(kvp_frame_send(sv[0], KVPAGED__V1__MESSAGE_TYPE__HELLO, 3, &b.base, NULL, 0), 0);
	close(sv[0]);

	/* Each receive takes one frame and leaves the next one whole. */
	recv_hello(sv[1], 1, "first", 16);
	ck_assert_int_eq(kvp_frame_recv(sv[1], CAP, &h, &payload, fds, 1, &nfds), 0);
	ck_assert_uint_eq(h.type, KVPAGED__V1__MESSAGE_TYPE__CLOSE_REPLY);
	ck_assert_uint_eq(h.seq, 2);
	ck_assert_uint_eq(h.len, 0);
	ck_assert_ptr_nonnull(payload);
	free(payload);
	recv_hello(sv[1], 3, "second", 32);
	payload = NULL;
	ck_assert_int_eq(kvp_frame_recv(sv[1], CAP, &h, &payload, fds, 1, &nfds), -ECONNRESET);
	ck_assert_ptr_null(payload);
	close(sv[1]);
}
END_TEST

/* A frame that comes in pieces, each its own send call: received whole, whatever the cuts. */
START_TEST(test_split_writes)
{
	static const size_t cuts[][5] = { { 1, 15, 1, 0 }, { 8, 8, 0 }, { 15, 2, 3, 0 },
					  { 16, 0 }, { 3, 5, 7, 11, 0 }, { 0 } };
	uint8_t frame[256];
	size_t len = hello_frame(frame, sizeof(frame), 9, KVPAGED__V1__MESSAGE_TYPE__HELLO, 0);
	int sv[2];

	pair(sv);
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		pid_t pid = spawn_writer(sv[0], frame, len, cuts[i], -1);

		recv_hello(sv[1], 9, "pieces", 64);
		writer_done(pid);
	}
	close(sv[0]);
	close(sv[1]);
}
END_TEST

/* The fd rides on a first byte sent alone; the rest of the header and the payload follow. */
START_TEST(test_split_writes_with_fd)
{
	static const size_t cuts[] = { 1, 4, 11, 2, 0 };
	uint8_t frame[256];
	size_t len = hello_frame(frame, sizeof(frame), 10, KVPAGED__V1__MESSAGE_TYPE__WELCOME, 1);
	struct kvp_frame_header h;
	uint8_t *payload;
	unsigned nfds = 0;
	int sv[2], fds[KVP_FRAME_MAX_FDS] = { -1 }, memfd;
	struct stat a, b;
	pid_t pid;

	memfd = memfd_create("test-frame", MFD_CLOEXEC);
	ck_assert_int_ge(memfd, 0);
	pair(sv);
	pid = spawn_writer(sv[0], frame, len, cuts, memfd);
	ck_assert_int_eq(kvp_frame_recv(sv[1], CAP, &h, &payload, fds, KVP_FRAME_MAX_FDS, &nfds), 0);
	writer_done(pid);
	ck_assert_uint_eq(h.seq, 10);
	ck_assert_uint_eq(h.len, len - KVP_FRAME_HEADER_BYTES);
	ck_assert_mem_eq(payload, frame + KVP_FRAME_HEADER_BYTES, h.len);
	ck_assert_uint_eq(nfds, 1);
	ck_assert_int_eq(fstat(memfd, &a), 0);
	ck_assert_int_eq(fstat(fds[0], &b), 0);
	ck_assert_uint_eq(a.st_ino, b.st_ino);
	ck_assert_int_eq(fcntl(fds[0], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	free(payload);
	close(fds[0]);
	close(memfd);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

/* A frame larger than the socket buffer, read as it is written. */
START_TEST(test_large_frame)
{
	Kvpaged__V1__Metrics m = KVPAGED__V1__METRICS__INIT, *got;
	const size_t n = 4u << 20;
	struct kvp_frame_header h;
	uint8_t *payload;
	unsigned nfds;
	int sv[2], sndbuf = 4096, fds[1], status;
	char *text = malloc(n + 1);
	pid_t pid;

	ck_assert_ptr_nonnull(text);
	for (size_t i = 0; i < n; i++)
		text[i] = (char)('a' + i % 26);
	text[n] = '\0';
	m.text = text;
	pair(sv);
	ck_assert_int_eq(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(kvp_frame_send(sv[0], KVPAGED__V1__MESSAGE_TYPE__ADMIN_METRICS_REPLY, 5,
				     &m.base, NULL, 0) == 0 ? 0 : 1);
	ck_assert_int_eq(kvp_frame_recv(sv[1], 8u << 20, &h, &payload, fds, 1, &nfds), 0);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	got = kvpaged__v1__metrics__unpack(NULL, h.len, payload);
	ck_assert_ptr_nonnull(got);
	ck_assert_uint_eq(strlen(got->text), n);
	ck_assert(memcmp(got->text, text, n) == 0);
	kvpaged__v1__metrics__free_unpacked(got, NULL);
	free(payload);
	free(text);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

/* ------------------------------------------------------------------------------ fds */

/* 0 to KVP_FRAME_MAX_FDS fds: the same files, in order, close-on-exec. */
START_TEST(test_fds_counts)
{
	int sv[2], sent[KVP_FRAME_MAX_FDS];
	const int before = open_fds();

	pair(sv);
	for (int i = 0; i < KVP_FRAME_MAX_FDS; i++) {
		sent[i] = i % 2 ? eventfd(0, EFD_CLOEXEC) : memfd_create("fd", MFD_CLOEXEC);
		ck_assert_int_ge(sent[i], 0);
	}
	for (unsigned n = 0; n <= KVP_FRAME_MAX_FDS; n++) {
		struct kvp_frame_header h;
		uint8_t *payload;
		unsigned nfds = 99;
		int got[KVP_FRAME_MAX_FDS];

		ck_assert_int_eq(kvp_frame_send(sv[0], KVPAGED__V1__MESSAGE_TYPE__WELCOME, n, NULL,
						sent, n), 0);
		ck_assert_int_eq(kvp_frame_recv(sv[1], CAP, &h, &payload, got, KVP_FRAME_MAX_FDS,
						&nfds), 0);
		ck_assert_uint_eq(h.seq, n);
		ck_assert_uint_eq(h.nfds, n);
		ck_assert_uint_eq(nfds, n);
		for (unsigned i = 0; i < n; i++) {
			struct stat a, b;

			ck_assert_int_eq(fstat(sent[i], &a), 0);
			ck_assert_int_eq(fstat(got[i], &b), 0);
			ck_assert_uint_eq(a.st_ino, b.st_ino);
			ck_assert_uint_eq(a.st_dev, b.st_dev);
			ck_assert_int_eq(fcntl(got[i], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
			close(got[i]);
		}
		free(payload);
	}
	for (int i = 0; i < KVP_FRAME_MAX_FDS; i++)
		close(sent[i]);
	close(sv[0]);
	close(sv[1]);
	ck_assert_int_eq(open_fds(), before);
}
END_TEST

/* Each way fds can break the frame: -EPROTO, every fd that came closed, no payload. */
START_TEST(test_fds_refused)
{
	const struct kvp_frame_header none = { .len = 3, .seq = 1, .type = 1 };
	const struct kvp_frame_header two = { .len = 3, .seq = 1, .type = 1, .nfds = 2 };
	int sv[2], sent[16];
	int before;

	pair(sv);
	for (int i = 0; i < 16; i++) {
		sent[i] = eventfd(0, EFD_CLOEXEC);
		ck_assert_int_ge(sent[i], 0);
	}
	before = open_fds();

	/* More fds than the receiver takes (3 for 2 places). */
	{
		struct kvp_frame_header h = two;
		struct kvp_frame_header out;
		uint8_t *payload = NULL;
		unsigned nfds;
		int got[2] = { -1, -1 };

		h.nfds = 3;
		send_raw(sv[0], &h, "abc", 3, sent, 3);
		ck_assert_int_eq(kvp_frame_recv(sv[1], CAP, &out, &payload, got, 2, &nfds), -EPROTO);
		ck_assert_ptr_null(payload);
		ck_assert_int_eq(open_fds(), before);
	}
	close(sv[1]);
	close(sv[0]);
	pair(sv);
	before = open_fds();

	/* fds with a frame that announces none. */
	{
		struct kvp_frame_header out;
		uint8_t *payload = NULL;
		unsigned nfds;
		int got[KVP_FRAME_MAX_FDS];

		send_raw(sv[0], &none, "abc", 3, sent, 1);
		ck_assert_int_eq(kvp_frame_recv(sv[1], CAP, &out, &payload, got, KVP_FRAME_MAX_FDS,
						&nfds), -EPROTO);
		ck_assert_ptr_null(payload);
		ck_assert_int_eq(open_fds(), before);
	}
	close(sv[1]);
	close(sv[0]);
	pair(sv);
	before = open_fds();

	/* A frame that announces fds that did not come. */
	{
		struct kvp_frame_header out;
		uint8_t *payload = NULL;
		unsigned nfds;
		int got[KVP_FRAME_MAX_FDS];

		send_raw(sv[0], &two, "abc", 3, NULL, 0);
		ck_assert_int_eq(kvp_frame_recv(sv[1], CAP, &out, &payload, got, KVP_FRAME_MAX_FDS,
						&nfds), -EPROTO);
		ck_assert_ptr_null(payload);
		ck_assert_int_eq(open_fds(), before);
	}
	close(sv[1]);
	close(sv[0]);
	pair(sv);
	before = open_fds();

	/*
	 * More fds than the control buffer (KVP_FRAME_CMSG_BYTES) holds: the kernel truncates, and
	 * closes what did not fit; what did is closed by the receiver.
	 */
	{
		struct kvp_frame_header h = two;
		struct kvp_frame_header out;
		uint8_t *payload = NULL;
		unsigned nfds;
		int got[KVP_FRAME_MAX_FDS];

		h.nfds = KVP_FRAME_MAX_FDS;
		send_raw(sv[0], &h, "abc", 3, sent, 16);
		ck_assert_int_eq(kvp_frame_recv(sv[1], CAP, &out, &payload, got, KVP_FRAME_MAX_FDS,
						&nfds), -EPROTO);
		ck_assert_ptr_null(payload);
		ck_assert_int_eq(open_fds(), before);
	}
	for (int i = 0; i < 16; i++)
		close(sent[i]);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

/* ------------------------------------------------------------------ caps, headers, EOF */

START_TEST(test_frame_above_cap)
{
	const struct kvp_frame_header h = { .len = 101, .seq = 1, .type = 2 };
	struct kvp_frame_header out = { .seq = 77 };
	uint8_t *payload = NULL;
	unsigned nfds = 5;
	int sv[2], fds[1], memfd = memfd_create("cap", MFD_CLOEXEC), before;

	ck_assert_int_ge(memfd, 0);
	pair(sv);
	before = open_fds();
	/* Refused from the header alone: the payload was never sent. */
	send_raw(sv[0], &h, NULL, 0, NULL, 0);
	ck_assert_int_eq(kvp_frame_recv(sv[1], 100, &out, &payload, fds, 1, &nfds), -EMSGSIZE);
	ck_assert_ptr_null(payload);
	ck_assert_uint_eq(out.seq, 77);
	ck_assert_uint_eq(nfds, 5);
	/* With an fd: closed too. */
	struct kvp_frame_header hf = h;
	hf.nfds = 1;
	send_raw(sv[0], &hf, NULL, 0, &memfd, 1);
	ck_assert_int_eq(kvp_frame_recv(sv[1], 100, &out, &payload, fds, 1, &nfds), -EMSGSIZE);
	ck_assert_int_eq(open_fds(), before);
	/* At the cap: received. */
	{
		uint8_t body[100] = { 0 };
		struct kvp_frame_header at = { .len = 100, .seq = 2, .type = 2 };

		send_raw(sv[0], &at, body, sizeof(body), NULL, 0);
		ck_assert_int_eq(kvp_frame_recv(sv[1], 100, &out, &payload, fds, 1, &nfds), 0);
		ck_assert_uint_eq(out.len, 100);
		ck_assert_uint_eq(out.seq, 2);
		free(payload);
	}
	close(memfd);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

START_TEST(test_malformed_header)
{
	static const struct {
		struct kvp_frame_header h;
		uint8_t byte0;
	} bad[] = {
		{ { .len = 3, .seq = 1, .type = 1, .flags = 1 }, 'K' },
		{ { .len = 3, .seq = 1, .type = 1, .nfds = KVP_FRAME_MAX_FDS + 1 }, 'K' },
		{ { .len = 3, .seq = 1, .type = 1 }, 'G' },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct kvp_frame_header out;
		uint8_t raw[KVP_FRAME_HEADER_BYTES + 3];
		uint8_t *payload = NULL;
		unsigned nfds;
		int sv[2], fds[1];

		pair(sv);
		kvp_frame_header_encode(&bad[i].h, raw);
		raw[0] = bad[i].byte0;
		memcpy(raw + KVP_FRAME_HEADER_BYTES, "abc", 3);
		ck_assert_int_eq(send(sv[0], raw, sizeof(raw), 0), (ssize_t)sizeof(raw));
		ck_assert_int_eq(kvp_frame_recv(sv[1], CAP, &out, &payload, fds, 1, &nfds), -EPROTO);
		ck_assert_ptr_null(payload);
		close(sv[0]);
		close(sv[1]);
	}
}
END_TEST

/* End of stream before a frame, inside its header, inside its payload. */
START_TEST(test_eof)
{
	static const size_t cut_at[] = { 0, 1, 15, 16, 17, 33 };
	uint8_t frame[256];
	size_t len = hello_frame(frame, sizeof(frame), 3, KVPAGED__V1__MESSAGE_TYPE__HELLO, 0);

	ck_assert_uint_eq(len, 34); /* the last cut leaves one byte out */
	for (size_t i = 0; i < sizeof(cut_at) / sizeof(cut_at[0]); i++) {
		struct kvp_frame_header out;
		uint8_t *payload = NULL;
		unsigned nfds;
		int sv[2], fds[1];

		pair(sv);
		if (cut_at[i])
			ck_assert_int_eq(send(sv[0], frame, cut_at[i], 0), (ssize_t)cut_at[i]);
		close(sv[0]);
		ck_assert_int_eq(kvp_frame_recv(sv[1], CAP, &out, &payload, fds, 1, &nfds),
				 -ECONNRESET);
		ck_assert_ptr_null(payload);
		close(sv[1]);
	}
	/* The first byte came with an fd, then the stream ended: the fd is closed. */
	{
		static const size_t first_byte[] = { 1, 0 };
		struct kvp_frame_header out;
		uint8_t *payload = NULL;
		unsigned nfds;
		int sv[2], fds[1], memfd = memfd_create("eof", MFD_CLOEXEC), before;
		pid_t pid;

		ck_assert_int_ge(memfd, 0);
		pair(sv);
		before = open_fds();
		pid = spawn_writer(sv[0], frame, 1, first_byte, memfd);
		writer_done(pid);
		close(sv[0]);
		ck_assert_int_eq(kvp_frame_recv(sv[1], CAP, &out, &payload, fds, 1, &nfds),
				 -ECONNRESET);
		ck_assert_ptr_null(payload);
		ck_assert_int_eq(open_fds(), before - 1); /* sv[0] */
		close(sv[1]);
		close(memfd);
	}
}
END_TEST

/* ------------------------------------------------------------------------------ send */

START_TEST(test_send_refusals)
{
	int sv[2], fds[KVP_FRAME_MAX_FDS + 1];
	uint8_t b;

	pair(sv);
	for (int i = 0; i <= KVP_FRAME_MAX_FDS; i++)
		fds[i] = sv[0];
	ck_assert_int_eq(kvp_frame_send(sv[0], 1, 1, NULL, fds, KVP_FRAME_MAX_FDS + 1), -EINVAL);
	/* Nothing was sent. */
	ck_assert_int_eq(recv(sv[1], &b, 1, MSG_DONTWAIT), -1);
	ck_assert_int_eq(errno, EAGAIN);
	/* A peer gone: -EPIPE, and no SIGPIPE (the default action would end this test). */
	close(sv[1]);
	ck_assert_int_eq(kvp_frame_send(sv[0], 1, 2, NULL, NULL, 0), -EPIPE);
	ck_assert_int_eq(kvp_frame_send_nonblocking(sv[0], 1, 3, NULL), -EPIPE);
	close(sv[0]);
}
END_TEST

START_TEST(test_send_nonblocking)
{
	Kvpaged__V1__Error small = KVPAGED__V1__ERROR__INIT, big = KVPAGED__V1__ERROR__INIT;
	struct kvp_frame_header h;
	Kvpaged__V1__Error *got;
	uint8_t *payload;
	unsigned nfds;
	char msg[600];
	int sv[2], fds[1], sent = 0, r;

	pair(sv);
	small.code = EUSERS;
	small.message = "max_sessions";
	ck_assert_int_eq(kvp_frame_send_nonblocking(sv[0], KVPAGED__V1__MESSAGE_TYPE__ERROR, 0,
						    &small.base), 0);
	ck_assert_int_eq(kvp_frame_recv(sv[1], CAP, &h, &payload, fds, 1, &nfds), 0);
	ck_assert_uint_eq(h.type, KVPAGED__V1__MESSAGE_TYPE__ERROR);
	got = kvpaged__v1__error__unpack(NULL, h.len, payload);
	ck_assert_ptr_nonnull(got);
	ck_assert_int_eq(got->code, EUSERS);
	ck_assert_str_eq(got->message, "max_sessions");
	kvpaged__v1__error__free_unpacked(got, NULL);
	free(payload);

	/* A payload its 512-byte buffer cannot hold. */
	memset(msg, 'x', sizeof(msg) - 1);
	msg[sizeof(msg) - 1] = '\0';
	big.message = msg;
	ck_assert_int_eq(kvp_frame_send_nonblocking(sv[0], KVPAGED__V1__MESSAGE_TYPE__ERROR, 0,
						    &big.base), -EMSGSIZE);
	/* A full socket: -EAGAIN, never a block. */
	while ((r = kvp_frame_send_nonblocking(sv[0], KVPAGED__V1__MESSAGE_TYPE__ERROR, 0,
					       &small.base)) == 0)
		ck_assert_int_lt(++sent, 1 << 20);
	ck_assert_int_eq(r, -EAGAIN);
	ck_assert_int_gt(sent, 0);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

/* ------------------------------------------------------------------------------ connect */

START_TEST(test_unix_connect)
{
	char dir[] = "/tmp/test-frame-XXXXXX", path[128], longpath[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int lfd, fd, afd;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/s.sock", dir);
	ck_assert_int_eq(kvp_unix_connect(path), -ENOENT);
	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[0] = '/';
	longpath[sizeof(longpath) - 1] = '\0';
	ck_assert_int_eq(kvp_unix_connect(longpath), -ENAMETOOLONG);

	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(lfd, 0);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(lfd, 1), 0);
	fd = kvp_unix_connect(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	afd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	ck_assert_int_ge(afd, 0);
	/* A frame across it, both ways. */
	{
		Kvpaged__V1__Hello hello;

		hello_init(&hello, "connected", 8);
		ck_assert_int_eq(kvp_frame_send(fd, KVPAGED__V1__MESSAGE_TYPE__HELLO, 4, &hello.base,
						NULL, 0), 0);
		recv_hello(afd, 4, "connected", 8);
		ck_assert_int_eq(kvp_frame_send(afd, KVPAGED__V1__MESSAGE_TYPE__HELLO, 5, &hello.base,
						NULL, 0), 0);
		recv_hello(fd, 5, "connected", 8);
	}
	close(afd);
	close(fd);
	close(lfd);
	unlink(path);
	rmdir(dir);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("frame");
	TCase *tc = tcase_create("frame");

	tcase_add_test(tc, test_header_round_trip);
	tcase_add_test(tc, test_header_refusals);
	tcase_add_test(tc, test_frames_back_to_back);
	tcase_add_test(tc, test_split_writes);
	tcase_add_test(tc, test_split_writes_with_fd);
	tcase_add_test(tc, test_large_frame);
	tcase_add_test(tc, test_fds_counts);
	tcase_add_test(tc, test_fds_refused);
	tcase_add_test(tc, test_frame_above_cap);
	tcase_add_test(tc, test_malformed_header);
	tcase_add_test(tc, test_eof);
	tcase_add_test(tc, test_send_refusals);
	tcase_add_test(tc, test_send_nonblocking);
	tcase_add_test(tc, test_unix_connect);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

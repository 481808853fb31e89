/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto/frame.h"

_Static_assert(KVP_FRAME_CMSG_BYTES >= sizeof(struct cmsghdr) + KVP_FRAME_MAX_FDS * sizeof(int) + 8,
	       "control buffer too small for KVP_FRAME_MAX_FDS descriptors");

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void kvp_frame_header_encode(const struct kvp_frame_header *h, uint8_t out[KVP_FRAME_HEADER_BYTES])
{
	put32(out, KVP_FRAME_MAGIC);
	put32(out + 4, h->len);
	put32(out + 8, h->seq);
	out[12] = (uint8_t)h->type;
	out[13] = (uint8_t)(h->type >> 8);
	out[14] = h->nfds;
	out[15] = h->flags;
}

int kvp_frame_header_decode(const uint8_t in[KVP_FRAME_HEADER_BYTES], uint32_t max_len,
			    struct kvp_frame_header *ret)
{
	struct kvp_frame_header h = {
		.len = get32(in + 4),
		.seq = get32(in + 8),
		.type = (uint16_t)(in[12] | in[13] << 8),
		.nfds = in[14],
		.flags = in[15],
	};

	if (get32(in) != KVP_FRAME_MAGIC || h.flags != 0 || h.nfds > KVP_FRAME_MAX_FDS)
		return -EPROTO;
	if (h.len > max_len)
		return -EMSGSIZE;
	*ret = h;
	return 0;
}

int kvp_frame_send(int fd, uint16_t type, uint32_t seq, const ProtobufCMessage *msg,
		   const int *fds, unsigned nfds)
{
	size_t len = msg ? protobuf_c_message_get_packed_size(msg) : 0;
	union {
		char buf[KVP_FRAME_CMSG_BYTES];
		size_t align; /* cmsghdr alignment */
	} control;
	struct kvp_frame_header h = { .len = (uint32_t)len, .seq = seq, .type = type,
				      .nfds = (uint8_t)nfds };
	uint8_t *buf;
	size_t off = 0;
	int r = 0;

	if (nfds > KVP_FRAME_MAX_FDS || len > UINT32_MAX - KVP_FRAME_HEADER_BYTES)
		return -EINVAL;
	buf = malloc(KVP_FRAME_HEADER_BYTES + len);
	if (!buf)
		return -ENOMEM;
	kvp_frame_header_encode(&h, buf);
	if (msg)
		protobuf_c_message_pack(msg, buf + KVP_FRAME_HEADER_BYTES);

	while (off < KVP_FRAME_HEADER_BYTES + len) {
		struct iovec iov = { .iov_base = buf + off, .iov_len = KVP_FRAME_HEADER_BYTES + len - off };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (off == 0 && nfds > 0) {
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
		n = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			break;
		}
		off += (size_t)n;
	}
	free(buf);
	return r;
}

int kvp_unix_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

int kvp_frame_send_nonblocking(int fd, uint16_t type, uint32_t seq, const ProtobufCMessage *msg)
{
	uint8_t buf[512];
	size_t len = msg ? protobuf_c_message_get_packed_size(msg) : 0;
	struct kvp_frame_header h = { .len = (uint32_t)len, .seq = seq, .type = type };

	if (len > sizeof(buf) - KVP_FRAME_HEADER_BYTES)
		return -EMSGSIZE;
	kvp_frame_header_encode(&h, buf);
	if (msg)
		protobuf_c_message_pack(msg, buf + KVP_FRAME_HEADER_BYTES);
	if (send(fd, buf, KVP_FRAME_HEADER_BYTES + len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
		return -errno;
	return 0;
}

/* Closes every fd a control message brought in. */
static void close_cmsg_fds(struct msghdr *mh)
{
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			close(fd);
		}
	}
}

static int read_full(int fd, uint8_t *buf, size_t len)
{
	size_t off = 0;

	while (off < len) {
		ssize_t n = recv(fd, buf + off, len - off, 0);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -ECONNRESET;
		off += (size_t)n;
	}
	return 0;
}

int kvp_frame_recv(int fd, uint32_t max_len, struct kvp_frame_header *ret_header,
		   uint8_t **ret_payload, int *fds, unsigned max_fds, unsigned *ret_nfds)
{
	union {
		char buf[KVP_FRAME_CMSG_BYTES];
		size_t align; /* cmsghdr alignment */
	} control;
	uint8_t hdr[KVP_FRAME_HEADER_BYTES];
	struct iovec iov = { .iov_base = hdr, .iov_len = sizeof(hdr) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
			     .msg_controllen = sizeof(control.buf) };
	struct kvp_frame_header h;
	unsigned nfds = 0;
	uint8_t *payload = NULL;
	ssize_t n;
	int r;

	do
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	if (n == 0)
		return -ECONNRESET;
	if (mh.msg_flags & MSG_CTRUNC) {
		close_cmsg_fds(&mh);
		return -EPROTO;
	}
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int f;

			memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (nfds < max_fds)
				fds[nfds++] = f;
			else
				close(f), nfds = max_fds + 1;
		}
	}
	r = -EPROTO;
	if (nfds > max_fds)
		goto fail;
	if ((size_t)n < sizeof(hdr)) {
		r = read_full(fd, hdr + n, sizeof(hdr) - (size_t)n);
		if (r < 0)
			goto fail;
	}
	r = kvp_frame_header_decode(hdr, max_len, &h);
	if (r < 0)
		goto fail;
	r = -EPROTO;
	if (h.nfds != nfds)
		goto fail;
	payload = malloc(h.len ? h.len : 1);
	r = -ENOMEM;
	if (!payload)
		goto fail;
	r = read_full(fd, payload, h.len);
	if (r < 0)
		goto fail;
	*ret_header = h;
	*ret_payload = payload;
	*ret_nfds = nfds;
	return 0;
fail:
	free(payload);
	for (unsigned i = 0; i < nfds && i < max_fds; i++)
		close(fds[i]);
	return r;
}

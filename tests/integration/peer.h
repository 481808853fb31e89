/* SPDX-License-Identifier: MIT */
/*
 * A raw peer for the integration tests: frames written and read by hand on the daemon's
 * sockets, for what libkvpaged never does (garbage, silence, requests without reading).
 */
#pragma once

#include <sys/time.h>

#include "proto/frame.h"
#include "proto/kvpaged.pb-c.h"
#include "tests/integration/harness.h"

/* Connects to a socket of the daemon; reads time out after 5 s. */
static inline int raw_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = 5 };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_uint_lt(strlen(path), sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static inline void send_bytes(int fd, const void *buf, size_t len)
{
	ck_assert_int_eq(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
}

static inline void send_header(int fd, uint32_t len, uint16_t type, uint8_t nfds)
{
	struct kvp_frame_header h = { .len = len, .seq = 1, .type = type, .nfds = nfds };
	uint8_t buf[KVP_FRAME_HEADER_BYTES];

	kvp_frame_header_encode(&h, buf);
	send_bytes(fd, buf, sizeof(buf));
}

/* The handshake, with rings of ring_entries (0: none); fds receives what Welcome carries. */
static inline void hello(int fd, uint32_t ring_entries, int *fds, unsigned *nfds)
{
	Kvpaged__V1__Hello h = KVPAGED__V1__HELLO__INIT;
	struct kvp_frame_header rh;
	uint8_t *payload;

	h.protocol_version = KVP_PROTOCOL_VERSION;
	h.ring_entries = ring_entries;
	h.ring_data_bytes = ring_entries ? 4096 : 0;
	ck_assert_int_eq(kvp_frame_send(fd, KVPAGED__V1__MESSAGE_TYPE__HELLO, 1, &h.base, NULL, 0), 0);
	ck_assert_int_eq(kvp_frame_recv(fd, 1 << 20, &rh, &payload, fds, 4, nfds), 0);
	ck_assert_uint_eq(rh.type, KVPAGED__V1__MESSAGE_TYPE__WELCOME);
	free(payload);
}

/* The next frame must be an error of this code whose message holds needle (NULL: any). */
static inline void expect_error(int fd, int code, const char *needle)
{
	struct kvp_frame_header h;
	Kvpaged__V1__Error *e;
	uint8_t *payload;
	unsigned nfds;

	ck_assert_int_eq(kvp_frame_recv(fd, 1 << 20, &h, &payload, NULL, 0, &nfds), 0);
	ck_assert_uint_eq(h.type, KVPAGED__V1__MESSAGE_TYPE__ERROR);
	e = kvpaged__v1__error__unpack(NULL, h.len, payload);
	ck_assert_ptr_nonnull(e);
	ck_assert_msg(e->code == code, "error %d (%s), expected %d", e->code, e->message, code);
	if (needle)
		ck_assert_msg(strstr(e->message, needle), "message '%s' lacks '%s'", e->message, needle);
	kvpaged__v1__error__free_unpacked(e, NULL);
	free(payload);
}

/* The session must answer with an error of this code, then hang up. */
static inline void expect_error_and_close(int fd, int code, const char *needle)
{
	uint8_t b;

	expect_error(fd, code, needle);
	ck_assert_int_eq(recv(fd, &b, 1, 0), 0); /* closed */
	close(fd);
}

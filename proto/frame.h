/* SPDX-License-Identifier: MIT */
/*
 * Frames on kvpaged's Unix sockets: a 16-byte little-endian header, then a protobuf payload
 * (proto/kvpaged.proto), file descriptors riding on the header's bytes (SCM_RIGHTS).
 *
 *   0       4        8        12     14    15
 *   +-------+--------+--------+------+-----+-----+---------------------+
 *   | magic |  len   |  seq   | type |nfds |flags| payload (len bytes) |
 *   +-------+--------+--------+------+-----+-----+---------------------+
 *
 * magic is "KVP1"; seq is chosen by the requester and echoed in the reply; flags are 0.
 * Both ends check magic, flags, len against their cap and nfds against what the type may
 * carry before reading or unpacking anything.  See proto/PROTOCOL.md.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/*
 * The protocol versions this tree speaks (proto/PROTOCOL.md, "Compatibility"): the daemon
 * accepts a Hello of any version in [KVP_PROTOCOL_MIN_VERSION, KVP_PROTOCOL_VERSION]; libkvpaged
 * says KVP_PROTOCOL_VERSION and accepts the same range.  2: the Hello's min_protocol_version,
 * the Welcome's agreed version, range, features and opcodes.
 */
#define KVP_PROTOCOL_VERSION 2
#define KVP_PROTOCOL_MIN_VERSION 1

/*
 * Welcome.features: what the daemon offers this session, beyond what every version-1 daemon
 * did.  libkvpaged's public KVP_FEATURE_* (kvpaged.h) are asserted equal to these.  A bit is
 * never reused; an unknown one is to be ignored.
 */
#define KVP_PROTO_FEATURE_RINGS (UINT64_C(1) << 0)     /* shared-memory rings (Hello.ring_*) */
#define KVP_PROTO_FEATURE_WAIT (UINT64_C(1) << 1)      /* wait_ms: max_wait_ms > 0 */
#define KVP_PROTO_FEATURE_PARK (UINT64_C(1) << 2)      /* PARK and RESUME */
#define KVP_PROTO_FEATURE_SINKS (UINT64_C(1) << 3)     /* retention 1, sinks */
#define KVP_PROTO_FEATURE_H2O (UINT64_C(1) << 4)       /* retention 2, SCORES, packed tables */
#define KVP_PROTO_FEATURE_HOST_TIER (UINT64_C(1) << 5) /* the pool keeps blocks in host RAM */
#define KVP_PROTO_FEATURE_FILE_TIER (UINT64_C(1) << 6) /* ... and in swap files */
/*
 * Open.retention, SeqInfoReply.retention and the ring's open flags: what a sequence keeps.
 * libkvpaged's KVP_RETAIN_* and the core's CORE_RETAIN_* are asserted equal to these.
 */
#define KVP_PROTO_RETAIN_FULL 0
#define KVP_PROTO_RETAIN_SINKS 1
#define KVP_PROTO_RETAIN_H2O 2

#define KVP_FRAME_MAGIC UINT32_C(0x3150564b) /* "KVP1" */
#define KVP_FRAME_HEADER_BYTES 16
#define KVP_FRAME_MAX_FDS 4
/* Control-message buffer for KVP_FRAME_MAX_FDS fds: a constant (CMSG_SPACE() is not one for
 * every compiler); frame.c checks it is large enough. */
#define KVP_FRAME_CMSG_BYTES 64
#define KVP_FRAME_DEFAULT_MAX_BYTES (4u << 20)

/* Replies carry the request's type + 0x100; ERROR answers any request. */
#define KVP_REPLY_OFFSET 0x100

struct kvp_frame_header {
	uint32_t len;
	uint32_t seq;
	uint16_t type;
	uint8_t nfds;
	uint8_t flags;
};

void kvp_frame_header_encode(const struct kvp_frame_header *h, uint8_t out[KVP_FRAME_HEADER_BYTES]);

/*
 * Decodes and checks a header.  Returns 0, -EPROTO (bad magic or flags, or more than
 * KVP_FRAME_MAX_FDS fds) or -EMSGSIZE (len above max_len).
 */
int kvp_frame_header_decode(const uint8_t in[KVP_FRAME_HEADER_BYTES], uint32_t max_len,
			    struct kvp_frame_header *ret);

/*
 * Blocking helpers for clients and tools (the daemon reads through io_uring).  Send packs msg
 * (NULL: empty payload) and sends the whole frame with its fds.  Returns 0 or -errno.
 */
int kvp_frame_send(int fd, uint16_t type, uint32_t seq, const ProtobufCMessage *msg,
		   const int *fds, unsigned nfds);

/* Connects a close-on-exec stream socket to the Unix socket at path.  Returns the fd or -errno. */
int kvp_unix_connect(const char *path);

/* One non-blocking attempt to send a small frame (no fds); for refusals.  0 or -errno. */
int kvp_frame_send_nonblocking(int fd, uint16_t type, uint32_t seq, const ProtobufCMessage *msg);

/*
 * Receives one whole frame.  *ret_payload is malloc'd (free it); fds that came with it are
 * stored in fds (up to max_fds, close-on-exec), their number in *ret_nfds; extra fds are
 * closed and the call fails with -EPROTO.  Returns 0, -ECONNRESET at end of stream, or -errno.
 */
int kvp_frame_recv(int fd, uint32_t max_len, struct kvp_frame_header *ret_header,
		   uint8_t **ret_payload, int *fds, unsigned max_fds, unsigned *ret_nfds);

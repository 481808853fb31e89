/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: everything a peer's bytes reach before a handler runs -- the frame header
 * decoder and the protobuf-c unpacking of every message type in proto/kvpaged.proto: the
 * requests the daemon unpacks (client and admin socket) and the replies libkvpaged and
 * kvpagedctl unpack.  It runs no handler, so nothing here does I/O (ADMIN_RELOAD is unpacked
 * as the AdminRequest it is; no configuration file is read).
 *
 * Built twice: with libFuzzer (configure --enable-fuzzers) and, with any compiler, as a replay
 * program over the committed seeds (tests/fuzz/replay.c, tests/fuzz/replay.test).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "proto/frame.h"
#include "proto/kvpaged.pb-c.h"

/* The message a frame of this type carries; NULL for a type the protocol does not define. */
static const ProtobufCMessageDescriptor *descriptor_for(uint16_t type)
{
	switch (type) {
	case KVPAGED__V1__MESSAGE_TYPE__HELLO: return &kvpaged__v1__hello__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__OPEN: return &kvpaged__v1__open__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__APPEND: return &kvpaged__v1__append__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__COMMIT: return &kvpaged__v1__commit__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__FORK: return &kvpaged__v1__fork__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__CLOSE: return &kvpaged__v1__close__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__LOOKUP: return &kvpaged__v1__lookup__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__SEQ_INFO: return &kvpaged__v1__seq_info__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__PARK: return &kvpaged__v1__park__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__RESUME: return &kvpaged__v1__resume__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__SCORES: return &kvpaged__v1__scores__descriptor;
	/* Every admin request is an AdminRequest; the type says what is asked. */
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_STATUS:
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_POOLS:
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_SESSIONS:
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_SEQUENCES:
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_STATS:
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_METRICS:
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_VERIFY:
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_DROP_CACHE:
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_RELOAD: return &kvpaged__v1__admin_request__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__ERROR: return &kvpaged__v1__error__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__WELCOME: return &kvpaged__v1__welcome__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__OPEN_REPLY: return &kvpaged__v1__open_reply__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__APPEND_REPLY: return &kvpaged__v1__append_reply__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__COMMIT_REPLY: return &kvpaged__v1__commit_reply__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__FORK_REPLY: return &kvpaged__v1__fork_reply__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__CLOSE_REPLY: return &kvpaged__v1__close_reply__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__LOOKUP_REPLY: return &kvpaged__v1__lookup_reply__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__SEQ_INFO_REPLY:
		return &kvpaged__v1__seq_info_reply__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__PARK_REPLY: return &kvpaged__v1__park_reply__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__RESUME_REPLY: return &kvpaged__v1__resume_reply__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__SCORES_REPLY: return &kvpaged__v1__scores_reply__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_STATUS_REPLY: return &kvpaged__v1__status__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_POOLS_REPLY: return &kvpaged__v1__pools__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_SESSIONS_REPLY: return &kvpaged__v1__sessions__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_SEQUENCES_REPLY:
		return &kvpaged__v1__sequences__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_STATS_REPLY: return &kvpaged__v1__stats__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_METRICS_REPLY: return &kvpaged__v1__metrics__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_VERIFY_REPLY:
		return &kvpaged__v1__verify_reply__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_DROP_CACHE_REPLY:
		return &kvpaged__v1__drop_cache_reply__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__ADMIN_RELOAD_REPLY:
		return &kvpaged__v1__reload_reply__descriptor;
	default: return NULL;
	}
}

/*
 * A message type added to kvpaged.proto without a line above would go unfuzzed (and its
 * replayed seeds would stop at it): refuse to run instead.
 */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const ProtobufCEnumDescriptor *types = &kvpaged__v1__message_type__descriptor;

	for (unsigned i = 0; i < types->n_values; i++) {
		if (types->values[i].value == KVPAGED__V1__MESSAGE_TYPE__MESSAGE_TYPE_UNSPECIFIED)
			continue;
		if (!descriptor_for((uint16_t)types->values[i].value)) {
			fprintf(stderr, "fuzz-frame: message type %s (%d) has no message here\n",
				types->values[i].name, types->values[i].value);
			abort();
		}
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* A stream of frames, as the daemon's receive loop walks its buffer. */
	while (size >= KVP_FRAME_HEADER_BYTES) {
		const ProtobufCMessageDescriptor *desc;
		struct kvp_frame_header h;
		ProtobufCMessage *m;

		if (kvp_frame_header_decode(data, 1u << 20, &h) < 0)
			return 0;
		if (h.len > size - KVP_FRAME_HEADER_BYTES)
			return 0;
		/* An unknown type ends the session before its payload is looked at. */
		desc = descriptor_for(h.type);
		if (!desc)
			return 0;
		m = protobuf_c_message_unpack(desc, NULL, h.len, data + KVP_FRAME_HEADER_BYTES);
		if (m) {
			/*
			 * Packing what was unpacked must stay within the computed size.  (A round
			 * trip is not asserted: protobuf-c keeps unknown fields numbered 0, which it
			 * then cannot unpack again; the daemon never re-packs peer input.)
			 */
			size_t n = protobuf_c_message_get_packed_size(m);
			uint8_t *buf = malloc(n ? n : 1);

			if (!buf || protobuf_c_message_pack(m, buf) != n)
				abort();
			protobuf_c_message_free_unpacked(m, NULL);
			free(buf);
		}
		data += KVP_FRAME_HEADER_BYTES + h.len;
		size -= KVP_FRAME_HEADER_BYTES + h.len;
	}
	return 0;
}

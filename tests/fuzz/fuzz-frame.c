/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: everything a peer's bytes reach before a handler runs -- the frame header
 * decoder and the protobuf-c unpacking of every message type the daemon accepts.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "proto/frame.h"
#include "proto/kvpaged.pb-c.h"

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
	case KVPAGED__V1__MESSAGE_TYPE__ERROR: return &kvpaged__v1__error__descriptor;
	case KVPAGED__V1__MESSAGE_TYPE__WELCOME: return &kvpaged__v1__welcome__descriptor;
	default: return &kvpaged__v1__admin_request__descriptor;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* A stream of frames, as the daemon's receive loop walks its buffer. */
	while (size >= KVP_FRAME_HEADER_BYTES) {
		struct kvp_frame_header h;
		ProtobufCMessage *m;

		if (kvp_frame_header_decode(data, 1u << 20, &h) < 0)
			return 0;
		if (h.len > size - KVP_FRAME_HEADER_BYTES)
			return 0;
		m = protobuf_c_message_unpack(descriptor_for(h.type), NULL, h.len,
					      data + KVP_FRAME_HEADER_BYTES);
		if (m) {
			/*
			 * Packing what was unpacked must stay within the computed size.  (A round
			 * trip is not asserted: protobuf-c keeps unknown fields numbered 0, which it
			 * then cannot unpack again; the daemon never re-packs peer input.)
			 */
			size_t n = protobuf_c_message_get_packed_size(m);
			uint8_t *buf = malloc(n ? n : 1);

			if (protobuf_c_message_pack(m, buf) != n)
				abort();
			protobuf_c_message_free_unpacked(m, NULL);
			free(buf);
		}
		data += KVP_FRAME_HEADER_BYTES + h.len;
		size -= KVP_FRAME_HEADER_BYTES + h.len;
	}
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * Reading vLLM's KV events (docs/events.md) out of a decoded msgpack batch, whichever format
 * they came in: a map with a "type" key, or a positional array ["BlockStored", ...].  For the
 * tools that subscribe to a stream (kvpagedctl events, kvpaged-bench route).
 */
#pragma once

#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static inline bool evd_is_str(const msgpack_object *o, const char *s)
{
	return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
	       !memcmp(o->via.str.ptr, s, o->via.str.size);
}

/* An event's type (a string object), or NULL when it is neither form. */
static inline const msgpack_object *evd_type(const msgpack_object *ev)
{
	if (ev->type == MSGPACK_OBJECT_MAP) {
		for (uint32_t i = 0; i < ev->via.map.size; i++)
			if (evd_is_str(&ev->via.map.ptr[i].key, "type") &&
			    ev->via.map.ptr[i].val.type == MSGPACK_OBJECT_STR)
				return &ev->via.map.ptr[i].val;
		return NULL;
	}
	if (ev->type == MSGPACK_OBJECT_ARRAY && ev->via.array.size &&
	    ev->via.array.ptr[0].type == MSGPACK_OBJECT_STR)
		return &ev->via.array.ptr[0];
	return NULL;
}

/* A field of an event by its name in vLLM's schema, whichever form; NULL when absent. */
static inline const msgpack_object *evd_field(const msgpack_object *ev, const msgpack_object *type,
					      const char *name)
{
	static const char *const stored[] = { "block_hashes", "parent_block_hash", "token_ids",
					      "block_size",   "lora_id",	   "medium" };
	static const char *const removed[] = { "block_hashes", "medium" };
	const bool is_stored = evd_is_str(type, "BlockStored");
	const char *const *names = is_stored ? stored : removed;
	const uint32_t n = is_stored ? 6 : 2;

	if (ev->type == MSGPACK_OBJECT_MAP) {
		for (uint32_t i = 0; i < ev->via.map.size; i++)
			if (evd_is_str(&ev->via.map.ptr[i].key, name))
				return &ev->via.map.ptr[i].val;
		return NULL;
	}
	for (uint32_t i = 0; i < n; i++)
		if (!strcmp(names[i], name))
			return i + 1 < ev->via.array.size ? &ev->via.array.ptr[i + 1] : NULL;
	return NULL;
}

/* The events of a batch's payload [ts, [event...], rank], or NULL when it is not one. */
static inline const msgpack_object *evd_events(const msgpack_object *batch)
{
	if (batch->type != MSGPACK_OBJECT_ARRAY || batch->via.array.size < 2 ||
	    batch->via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY)
		return NULL;
	for (uint32_t i = 0; i < batch->via.array.ptr[1].via.array.size; i++)
		if (!evd_type(&batch->via.array.ptr[1].via.array.ptr[i]))
			return NULL;
	return &batch->via.array.ptr[1];
}

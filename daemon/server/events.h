/* SPDX-License-Identifier: MIT */
/*
 * A pool's KV event stream (docs/events.md): vLLM's wire format (vllm/distributed/kv_events.py)
 * on a ZMQ PUB socket, so that the routers that read vLLM's events (llm-d's KV cache indexer,
 * Dynamo's KV router) read kvpaged's.
 *
 * The loop only appends: events_add copies an event (its token ids included) into a bounded
 * queue under a short lock and returns; past the queue's size the event is dropped and counted,
 * and the next batch's seq skips one so that a subscriber sees the gap.  A publisher thread takes
 * the whole queue every events_batch_ms, encodes it as one msgpack batch, sends it as three
 * frames (topic, seq as 8 bytes big-endian, payload; the PUB socket drops at its high-water
 * mark, never blocks), keeps it for replay, and answers replay requests on a ROUTER socket.
 *
 * seq is (the start's Unix time in seconds << 32) + the batch's number, so it grows across
 * restarts too, and a subscriber tells a restart (seq >> 32 changed; the batch starts with
 * AllBlocksCleared) from a gap (the same epoch, a seq skipped).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct events;

enum events_kind { EVENTS_STORED, EVENTS_REMOVED, EVENTS_CLEARED };
enum events_medium { EVENTS_GPU, EVENTS_CPU, EVENTS_STORAGE, EVENTS_NMEDIA };

struct events_config {
	const char *endpoint;	     /* ipc://PATH, bound here */
	const char *replay_endpoint; /* ipc://PATH or NULL */
	const char *topic;
	bool array;		     /* events as positional arrays, not maps */
	uint32_t block_tokens;
	uint32_t batch_ms, buffer_batches, queue, hwm;
};

struct events_stats {
	uint64_t batches, events, dropped, replays;
	uint64_t seq; /* the next batch's */
	uint32_t queued;
};

/* Binds the sockets and starts the thread.  0, or -errno with err (errlen bytes) saying why. */
int events_new(const struct events_config *cfg, char *err, size_t errlen, struct events **ret);
/* Sends what is queued, stops the thread, closes the sockets.  NULL is fine; returns NULL. */
struct events *events_free(struct events *e);

/*
 * The loop's side.  STORED: hash and parent (has_parent false for a chain's first block) and
 * block_tokens token ids; REMOVED: hash; CLEARED: nothing else.  Never blocks on the thread.
 */
void events_add(struct events *e, enum events_kind kind, enum events_medium medium,
		uint64_t hash, uint64_t parent, bool has_parent, const uint32_t *tokens);

void events_get_stats(struct events *e, struct events_stats *out);

/* The medium's name in the stream: "GPU", "CPU", "STORAGE". */
const char *events_medium_name(enum events_medium m);

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

/*
 * events_sched (events.c, start_publisher): the publisher runs SCHED_IDLE and is raised to the
 * daemon's priority while it falls behind (idle), or runs as the daemon does (normal).  Behind:
 * the oldest event queued has waited EVENTS_LATE_BATCHES batch intervals, or the queue is half
 * full; raised, it stays so for EVENTS_RAISED_BATCHES intervals at least.
 */
enum events_sched { EVENTS_SCHED_IDLE, EVENTS_SCHED_NORMAL };
#define EVENTS_LATE_BATCHES 4
#define EVENTS_RAISED_BATCHES 100

#define EVENTS_CURVE_KEY_BYTES 32
#define EVENTS_CURVE_Z85_LEN 40 /* a key as Z85 text, as curve_keygen prints it */

struct events_config {
	const char *endpoint;	     /* ipc://PATH or tcp://HOST:PORT (CURVE only), bound here */
	const char *replay_endpoint; /* the same, or NULL */
	const char *topic;
	bool array;		     /* events as positional arrays, not maps */
	enum events_sched sched;     /* how the publisher shares the CPU (events.c) */
	uint32_t block_tokens;
	uint32_t batch_ms, buffer_batches, queue, hwm;
	/*
	 * CURVE (both sockets): the daemon's secret key, and the subscribers' public keys it lets
	 * in (every other handshake is refused, by a ZAP handler on the publisher thread).
	 */
	bool curve;
	uint8_t curve_secret[EVENTS_CURVE_KEY_BYTES];
	const uint8_t (*curve_allowed)[EVENTS_CURVE_KEY_BYTES];
	size_t curve_nallowed;
};

struct events_stats {
	uint64_t batches, events, dropped, replays;
	uint64_t seq; /* the next batch's */
	uint32_t queued;
	uint64_t slow;	      /* batches a subscriber at its high-water mark missed */
	uint64_t refused;     /* CURVE handshakes refused (a key not allowed) */
	uint64_t raised;      /* times the idle publisher fell behind and was raised */
	uint32_t remote_blocks; /* the remote tier's blocks announced now (dpool_events_stats) */
	uint32_t subscribers; /* connected now */
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

/* An event the caller could not queue: counted as dropped, and the next seq skips one. */
void events_drop(struct events *e);

/* Every tick of the loop (2 s): the publisher raised if behind, with nothing added since. */
void events_tick(struct events *e);
void events_get_stats(struct events *e, struct events_stats *out);

/*
 * The CURVE key files (docs/events.md).  The secret: 40 characters of Z85 (a newline may
 * follow) or 32 raw bytes, under seal_key_load's rules for a secret file.  The allowed keys:
 * a public key in Z85 per line (anything after it and a blank ignored), blank lines and lines
 * starting with # skipped (Z85 itself has #); neither group nor others may write the file.  0, or -errno with err naming the file (and the line).  *keys is the
 * caller's to free.
 */
int events_curve_secret_load(const char *path, uint8_t key[EVENTS_CURVE_KEY_BYTES], char *err,
			     size_t errlen);
int events_curve_allowed_load(const char *path, uint8_t (**keys)[EVENTS_CURVE_KEY_BYTES],
			      size_t *n, char *err, size_t errlen);
/* The public key of a secret, as Z85 text (EVENTS_CURVE_Z85_LEN characters and a NUL). */
int events_curve_public(const uint8_t secret[EVENTS_CURVE_KEY_BYTES],
			char z85[EVENTS_CURVE_Z85_LEN + 1]);

/* The medium's name in the stream: "GPU", "CPU", "STORAGE". */
const char *events_medium_name(enum events_medium m);

/* SPDX-License-Identifier: MIT */
/* A pool's KV event stream: the queue, the publisher thread, the wire format (events.h). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>
#include <zmq.h>

#include "daemon/server/events.h"

struct rec {
	uint8_t kind, medium;
	bool has_parent;
	uint64_t hash, parent;
};

/* A batch kept for replay: its seq and its payload as sent. */
struct kept {
	uint64_t seq;
	char *payload;
	size_t len;
};

struct events {
	struct events_config cfg;
	char *topic;
	size_t topic_len;
	void *zctx, *pub, *replay;
	pthread_t thread;
	bool started;

	/* The loop's queue and the thread's spare, swapped under lock; tokens beside. */
	pthread_mutex_t lock;
	bool stop;
	struct rec *q, *spare;
	uint32_t *qtok, *sparetok;
	uint32_t qlen;
	bool gap; /* events dropped since the last batch: the next seq skips one */
	uint64_t dropped;

	/* The thread's. */
	uint64_t seq;
	struct kept *ring;
	uint32_t rhead, rlen;
	msgpack_sbuffer sbuf;

	/* Under lock: what events_get_stats reports. */
	uint64_t batches, events, replays, next_seq;
};

static const char *const media[EVENTS_NMEDIA] = {
	[EVENTS_GPU] = "GPU", [EVENTS_CPU] = "CPU", [EVENTS_STORAGE] = "STORAGE",
};

const char *events_medium_name(enum events_medium m)
{
	return (unsigned)m < EVENTS_NMEDIA ? media[m] : "?";
}

void events_add(struct events *e, enum events_kind kind, enum events_medium medium,
		uint64_t hash, uint64_t parent, bool has_parent, const uint32_t *tokens)
{
	struct rec *r;

	pthread_mutex_lock(&e->lock);
	if (e->qlen == e->cfg.queue) {
		e->dropped++;
		e->gap = true;
		pthread_mutex_unlock(&e->lock);
		return;
	}
	r = &e->q[e->qlen];
	*r = (struct rec){ .kind = (uint8_t)kind, .medium = (uint8_t)medium,
			   .has_parent = has_parent, .hash = hash, .parent = parent };
	if (kind == EVENTS_STORED)
		memcpy(e->qtok + (size_t)e->qlen * e->cfg.block_tokens, tokens,
		       e->cfg.block_tokens * sizeof(uint32_t));
	e->qlen++;
	pthread_mutex_unlock(&e->lock);
}

/* ---- the wire format ---------------------------------------------------------------------- */

static void pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);

	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

/*
 * A block's token ids as msgpack integers, each in its shortest form (as msgpack_pack_uint32
 * writes them), a block at a time: one write instead of one call per token.
 */
static void pack_tokens(msgpack_packer *pk, const uint32_t *t, uint32_t n)
{
	uint8_t buf[256 * 5];
	size_t len = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint32_t v = t[i];

		if (len + 5 > sizeof(buf)) {
			pk->callback(pk->data, (const char *)buf, len);
			len = 0;
		}
		if (v < 0x80) {
			buf[len++] = (uint8_t)v;
		} else if (v < 0x100) {
			buf[len++] = 0xcc;
			buf[len++] = (uint8_t)v;
		} else if (v < 0x10000) {
			buf[len++] = 0xcd;
			buf[len++] = (uint8_t)(v >> 8);
			buf[len++] = (uint8_t)v;
		} else {
			buf[len++] = 0xce;
			buf[len++] = (uint8_t)(v >> 24);
			buf[len++] = (uint8_t)(v >> 16);
			buf[len++] = (uint8_t)(v >> 8);
			buf[len++] = (uint8_t)v;
		}
	}
	if (len)
		pk->callback(pk->data, (const char *)buf, len);
}

/* A field's name, in the map format only. */
static void key(msgpack_packer *pk, bool array, const char *name)
{
	if (!array)
		pack_str(pk, name);
}

/* An event's start: n fields (the tag first), the tag, the hashes of records [i, j). */
static void begin(msgpack_packer *pk, bool array, size_t n, const char *type,
		  const struct rec *q, uint32_t i, uint32_t j)
{
	array ? msgpack_pack_array(pk, n) : msgpack_pack_map(pk, n);
	key(pk, array, "type");
	pack_str(pk, type);
	key(pk, array, "block_hashes");
	msgpack_pack_array(pk, j - i);
	for (uint32_t k = i; k < j; k++)
		msgpack_pack_uint64(pk, q[k].hash);
}

/*
 * Records [i, j) of one kind and medium as one event: BlockStored of a chain (each block the
 * parent of the next), or BlockRemoved of any blocks; AllBlocksCleared alone.
 */
static void pack_event(const struct events *e, msgpack_packer *pk, const struct rec *q,
		       const uint32_t *tok, uint32_t i, uint32_t j)
{
	const bool array = e->cfg.array;
	const uint32_t B = e->cfg.block_tokens;
	const struct rec *r = &q[i];

	switch (r->kind) {
	case EVENTS_CLEARED:
		array ? msgpack_pack_array(pk, 1) : msgpack_pack_map(pk, 1);
		key(pk, array, "type");
		pack_str(pk, "AllBlocksCleared");
		return;
	case EVENTS_REMOVED:
		begin(pk, array, 3, "BlockRemoved", q, i, j);
		key(pk, array, "medium");
		pack_str(pk, media[r->medium]);
		return;
	case EVENTS_STORED:
		begin(pk, array, 7, "BlockStored", q, i, j);
		key(pk, array, "parent_block_hash");
		if (r->has_parent)
			msgpack_pack_uint64(pk, r->parent);
		else
			msgpack_pack_nil(pk);
		key(pk, array, "token_ids");
		msgpack_pack_array(pk, (j - i) * B);
		for (uint32_t k = i; k < j; k++)
			pack_tokens(pk, tok + (size_t)k * B, B);
		key(pk, array, "block_size");
		msgpack_pack_uint32(pk, B);
		key(pk, array, "lora_id");
		msgpack_pack_nil(pk);
		key(pk, array, "medium");
		pack_str(pk, media[r->medium]);
		return;
	}
}

/* Where the event that starts at i ends: a run of one kind and medium (a chain, if stored). */
static uint32_t run_end(const struct rec *q, uint32_t i, uint32_t n)
{
	uint32_t j = i + 1;

	if (q[i].kind == EVENTS_CLEARED)
		return j;
	while (j < n && q[j].kind == q[i].kind && q[j].medium == q[i].medium &&
	       (q[i].kind != EVENTS_STORED || (q[j].has_parent && q[j].parent == q[j - 1].hash)))
		j++;
	return j;
}

/* The payload of one batch: [timestamp, [event, ...], data_parallel_rank (nil)]. */
static void encode(struct events *e, const struct rec *q, const uint32_t *tok, uint32_t n,
		   uint32_t *ret_events)
{
	msgpack_packer pk;
	struct timespec ts;
	uint32_t nev = 0;

	for (uint32_t i = 0; i < n; i = run_end(q, i, n))
		nev++;
	msgpack_sbuffer_clear(&e->sbuf);
	msgpack_packer_init(&pk, &e->sbuf, msgpack_sbuffer_write);
	clock_gettime(CLOCK_REALTIME, &ts);
	msgpack_pack_array(&pk, 3);
	msgpack_pack_double(&pk, (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
	msgpack_pack_array(&pk, nev);
	for (uint32_t i = 0, j; i < n; i = j) {
		j = run_end(q, i, n);
		pack_event(e, &pk, q, tok, i, j);
	}
	msgpack_pack_nil(&pk);
	*ret_events = nev;
}

static void be64(uint8_t out[8], uint64_t v)
{
	for (int i = 7; i >= 0; i--, v >>= 8)
		out[i] = (uint8_t)v;
}

/* Sends the encoded batch as seq and keeps it for replay (the oldest goes when full). */
static void send_batch(struct events *e)
{
	uint8_t seq[8];
	struct kept *k;

	be64(seq, e->seq);
	/* PUB never blocks: past the high-water mark a subscriber's copy is dropped. */
	zmq_send(e->pub, e->topic, e->topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(e->pub, seq, sizeof(seq), ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(e->pub, e->sbuf.data, e->sbuf.size, ZMQ_DONTWAIT);
	if (e->cfg.buffer_batches) {
		if (e->rlen == e->cfg.buffer_batches) {
			k = &e->ring[e->rhead];
			free(k->payload);
			e->rhead = (e->rhead + 1) % e->cfg.buffer_batches;
			e->rlen--;
		}
		/* The encoded batch itself, no copy: the next one gets a buffer of its own. */
		k = &e->ring[(e->rhead + e->rlen) % e->cfg.buffer_batches];
		k->len = e->sbuf.size;
		k->payload = msgpack_sbuffer_release(&e->sbuf);
		k->seq = e->seq;
		if (k->payload)
			e->rlen++;
	}
	e->seq++;
}

/*
 * A replay request: [identity, "", start seq] from a REQ or DEALER socket (or without the empty
 * frame): every kept batch from that seq on as [identity, "", seq, payload], then the end
 * marker, seq -1 and an empty payload, as vLLM's publisher answers.
 */
static void serve_replay(struct events *e)
{
	for (;;) {
		zmq_msg_t part[4];
		int n = 0, more = 1;
		bool delim;
		uint64_t from = 0;
		uint8_t seq[8];

		while (more && n < 4) {
			zmq_msg_init(&part[n]);
			if (zmq_msg_recv(&part[n], e->replay, n ? 0 : ZMQ_DONTWAIT) < 0) {
				zmq_msg_close(&part[n]);
				if (!n)
					return; /* nothing (more) asked */
				more = 0;
				break;
			}
			more = zmq_msg_more(&part[n]);
			n++;
		}
		/* What does not fit is read and dropped: the socket stays in step. */
		while (more) {
			zmq_msg_t junk;

			zmq_msg_init(&junk);
			if (zmq_msg_recv(&junk, e->replay, 0) < 0) {
				zmq_msg_close(&junk);
				break;
			}
			more = zmq_msg_more(&junk);
			zmq_msg_close(&junk);
			for (int i = 0; i < n; i++)
				zmq_msg_close(&part[i]);
			n = 0; /* too many frames: not a request */
		}
		delim = n == 3 && zmq_msg_size(&part[1]) == 0;
		if ((n == 3 && delim) || n == 2) {
			zmq_msg_t *s = &part[n - 1];

			if (zmq_msg_size(s) == 8) {
				const uint8_t *b = zmq_msg_data(s);

				for (int i = 0; i < 8; i++)
					from = from << 8 | b[i];
				for (uint32_t i = 0; i < e->rlen; i++) {
					const struct kept *k =
						&e->ring[(e->rhead + i) % e->cfg.buffer_batches];

					if (k->seq < from)
						continue;
					be64(seq, k->seq);
					zmq_send(e->replay, zmq_msg_data(&part[0]),
						 zmq_msg_size(&part[0]), ZMQ_SNDMORE | ZMQ_DONTWAIT);
					if (delim)
						zmq_send(e->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
					zmq_send(e->replay, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
					zmq_send(e->replay, k->payload, k->len, ZMQ_DONTWAIT);
				}
				memset(seq, 0xff, sizeof(seq)); /* -1 */
				zmq_send(e->replay, zmq_msg_data(&part[0]), zmq_msg_size(&part[0]),
					 ZMQ_SNDMORE | ZMQ_DONTWAIT);
				if (delim)
					zmq_send(e->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
				zmq_send(e->replay, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
				zmq_send(e->replay, "", 0, ZMQ_DONTWAIT);
				pthread_mutex_lock(&e->lock);
				e->replays++;
				pthread_mutex_unlock(&e->lock);
			}
		}
		for (int i = 0; i < n; i++)
			zmq_msg_close(&part[i]);
	}
}

/* Takes the queue and publishes it as one batch, if anything (or a gap) is there. */
static void flush(struct events *e)
{
	struct rec *q;
	uint32_t *tok, n, nev = 0;
	bool gap;

	pthread_mutex_lock(&e->lock);
	n = e->qlen;
	gap = e->gap;
	q = e->q;
	tok = e->qtok;
	e->q = e->spare;
	e->qtok = e->sparetok;
	e->spare = q;
	e->sparetok = tok;
	e->qlen = 0;
	e->gap = false;
	pthread_mutex_unlock(&e->lock);
	if (gap)
		e->seq++; /* what was dropped had a batch: a subscriber sees it missing */
	if (n) {
		encode(e, q, tok, n, &nev);
		send_batch(e);
	}
	pthread_mutex_lock(&e->lock);
	e->batches += n != 0;
	e->events += nev;
	e->next_seq = e->seq;
	pthread_mutex_unlock(&e->lock);
}

static void *publisher(void *arg)
{
	struct events *e = arg;
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (;;) {
		bool stop;

		if (e->replay) {
			zmq_pollitem_t it = { .socket = e->replay, .events = ZMQ_POLLIN };

			if (zmq_poll(&it, 1, (long)e->cfg.batch_ms) > 0)
				serve_replay(e);
		} else {
			struct timespec ts = { .tv_sec = e->cfg.batch_ms / 1000,
					       .tv_nsec = (long)(e->cfg.batch_ms % 1000) * 1000000 };

			nanosleep(&ts, NULL);
		}
		pthread_mutex_lock(&e->lock);
		stop = e->stop;
		pthread_mutex_unlock(&e->lock);
		flush(e);
		if (stop)
			break;
	}
	return NULL;
}

/* ---- setup -------------------------------------------------------------------------------- */

/* The socket file of an ipc:// endpoint: the daemon's user's only (docs/events.md). */
static int bind_ipc(void *sock, const char *endpoint, char *err, size_t errlen)
{
	const char *path = endpoint + 6;

	/* A stale file from a daemon that died is taken over, as zmq_bind does for ipc. */
	if (zmq_bind(sock, endpoint) < 0) {
		int r = -errno;

		snprintf(err, errlen, "cannot bind %s: %s", endpoint, zmq_strerror(errno));
		return r;
	}
	if (chmod(path, 0600) < 0) {
		int r = -errno;

		snprintf(err, errlen, "%s: cannot make it the daemon's only: %m", path);
		return r;
	}
	return 0;
}

int events_new(const struct events_config *cfg, char *err, size_t errlen, struct events **ret)
{
	struct events *e = calloc(1, sizeof(*e));
	const size_t B = cfg->block_tokens;
	struct timespec now;
	int hwm = (int)cfg->hwm, zero = 0, r;

	if (!e)
		return -ENOMEM;
	e->cfg = *cfg;
	pthread_mutex_init(&e->lock, NULL);
	msgpack_sbuffer_init(&e->sbuf);
	e->topic = strdup(cfg->topic ? cfg->topic : "");
	e->q = calloc(cfg->queue, sizeof(*e->q));
	e->spare = calloc(cfg->queue, sizeof(*e->spare));
	e->qtok = calloc((size_t)cfg->queue * B, sizeof(uint32_t));
	e->sparetok = calloc((size_t)cfg->queue * B, sizeof(uint32_t));
	e->ring = cfg->buffer_batches ? calloc(cfg->buffer_batches, sizeof(*e->ring)) : NULL;
	if (!e->topic || !e->q || !e->spare || !e->qtok || !e->sparetok ||
	    (cfg->buffer_batches && !e->ring)) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	e->topic_len = strlen(e->topic);
	clock_gettime(CLOCK_REALTIME, &now);
	e->seq = e->next_seq = (uint64_t)now.tv_sec << 32;
	e->zctx = zmq_ctx_new();
	if (!e->zctx) {
		r = -errno;
		snprintf(err, errlen, "cannot start ZMQ: %s", zmq_strerror(errno));
		goto fail;
	}
	e->pub = zmq_socket(e->zctx, ZMQ_PUB);
	if (!e->pub || zmq_setsockopt(e->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm)) < 0 ||
	    zmq_setsockopt(e->pub, ZMQ_LINGER, &zero, sizeof(zero)) < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot make the PUB socket: %s", zmq_strerror(errno));
		goto fail;
	}
	r = bind_ipc(e->pub, cfg->endpoint, err, errlen);
	if (r < 0)
		goto fail;
	if (cfg->replay_endpoint) {
		e->replay = zmq_socket(e->zctx, ZMQ_ROUTER);
		if (!e->replay ||
		    zmq_setsockopt(e->replay, ZMQ_LINGER, &zero, sizeof(zero)) < 0) {
			r = -errno;
			snprintf(err, errlen, "cannot make the replay socket: %s",
				 zmq_strerror(errno));
			goto fail;
		}
		r = bind_ipc(e->replay, cfg->replay_endpoint, err, errlen);
		if (r < 0)
			goto fail;
	}
	/* The first batch says: whatever a subscriber knew of this node is gone (docs). */
	events_add(e, EVENTS_CLEARED, EVENTS_CPU, 0, 0, false, NULL);
	r = -pthread_create(&e->thread, NULL, publisher, e);
	if (r < 0) {
		snprintf(err, errlen, "cannot start the event publisher: %s", strerror(-r));
		goto fail;
	}
	e->started = true;
	*ret = e;
	return 0;
fail:
	events_free(e);
	return r;
}

struct events *events_free(struct events *e)
{
	if (!e)
		return NULL;
	if (e->started) {
		pthread_mutex_lock(&e->lock);
		e->stop = true;
		pthread_mutex_unlock(&e->lock);
		pthread_join(e->thread, NULL);
	}
	if (e->pub)
		zmq_close(e->pub);
	if (e->replay)
		zmq_close(e->replay);
	if (e->zctx)
		zmq_ctx_term(e->zctx);
	for (uint32_t i = 0; e->ring && i < e->rlen; i++)
		free(e->ring[(e->rhead + i) % e->cfg.buffer_batches].payload);
	free(e->ring);
	free(e->q);
	free(e->spare);
	free(e->qtok);
	free(e->sparetok);
	free(e->topic);
	msgpack_sbuffer_destroy(&e->sbuf);
	pthread_mutex_destroy(&e->lock);
	free(e);
	return NULL;
}

void events_get_stats(struct events *e, struct events_stats *out)
{
	pthread_mutex_lock(&e->lock);
	*out = (struct events_stats){ .batches = e->batches, .events = e->events,
				      .dropped = e->dropped, .replays = e->replays,
				      .seq = e->next_seq, .queued = e->qlen };
	pthread_mutex_unlock(&e->lock);
}

/* SPDX-License-Identifier: MIT */
/* A pool's KV event stream: the queue, the publisher thread, the wire format (events.h). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>
#include <zmq.h>

#include "daemon/log.h"
#include "daemon/server/events.h"
#include "daemon/tier/seal.h"

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
	void *zctx, *pub, *replay, *zap, *monitor;
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
	/*
	 * idle: when the oldest event queued came; whether the publisher is raised, since when;
	 * after a raise that failed, no other before retry_ms.
	 */
	uint64_t first_ms, raised_ms, retry_ms;
	bool raised;

	/* The thread's. */
	uint64_t seq;
	struct kept *ring;
	uint32_t rhead, rlen;
	msgpack_sbuffer sbuf;

	/* Under lock: what events_get_stats reports. */
	uint64_t batches, events, replays, next_seq, slow, refused, raises;
	uint32_t subscribers;
};

static const char *const media[EVENTS_NMEDIA] = {
	[EVENTS_GPU] = "GPU", [EVENTS_CPU] = "CPU", [EVENTS_STORAGE] = "STORAGE",
};

const char *events_medium_name(enum events_medium m)
{
	return (unsigned)m < EVENTS_NMEDIA ? media[m] : "?";
}

static uint64_t coarse_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int set_policy(pthread_t t, int policy)
{
	return pthread_setschedparam(t, policy, &(struct sched_param){ 0 });
}

/*
 * idle: the publisher is behind (the oldest event queued waited EVENTS_LATE_BATCHES intervals,
 * or the queue is half full): it runs at the daemon's priority for a while (start_publisher).
 * Under the lock, as the publisher's lowering itself again is.
 */
static void raise_if_behind(struct events *e)
{
	uint64_t now;

	if (e->cfg.sched != EVENTS_SCHED_IDLE || e->raised || !e->started || !e->qlen)
		return;
	now = coarse_ms();
	if ((now - e->first_ms < (uint64_t)EVENTS_LATE_BATCHES * e->cfg.batch_ms &&
	     e->qlen < e->cfg.queue / 2) ||
	    now < e->retry_ms)
		return;
	/* start_publisher found it allowed; should that change, retried at most every 2 s. */
	if (set_policy(e->thread, SCHED_OTHER)) {
		e->retry_ms = now + 2000;
		return;
	}
	e->raised = true;
	e->raised_ms = now;
	e->raises++;
}

/*
 * The loop's side of the lock.  An idle publisher that holds it may have been preempted there
 * and get no CPU for a long while: the loop would wait behind it.  So when the lock is taken,
 * the publisher runs at the daemon's priority until the loop has it (priority inheritance by
 * hand; a PTHREAD_PRIO_INHERIT mutex raises no SCHED_IDLE thread), then is idle again unless
 * it was raised meanwhile.
 */
static void loop_lock(struct events *e)
{
	if (!pthread_mutex_trylock(&e->lock))
		return;
	if (e->started && e->cfg.sched == EVENTS_SCHED_IDLE) {
		(void)set_policy(e->thread, SCHED_OTHER);
		pthread_mutex_lock(&e->lock);
		if (!e->raised)
			(void)set_policy(e->thread, SCHED_IDLE);
		return;
	}
	pthread_mutex_lock(&e->lock);
}

void events_add(struct events *e, enum events_kind kind, enum events_medium medium,
		uint64_t hash, uint64_t parent, bool has_parent, const uint32_t *tokens)
{
	struct rec *r;

	loop_lock(e);
	if (e->qlen == e->cfg.queue) {
		e->dropped++;
		e->gap = true;
		raise_if_behind(e);
		pthread_mutex_unlock(&e->lock);
		return;
	}
	if (!e->qlen)
		e->first_ms = coarse_ms();
	r = &e->q[e->qlen];
	*r = (struct rec){ .kind = (uint8_t)kind, .medium = (uint8_t)medium,
			   .has_parent = has_parent, .hash = hash, .parent = parent };
	if (kind == EVENTS_STORED)
		memcpy(e->qtok + (size_t)e->qlen * e->cfg.block_tokens, tokens,
		       e->cfg.block_tokens * sizeof(uint32_t));
	e->qlen++;
	raise_if_behind(e);
	pthread_mutex_unlock(&e->lock);
}

void events_drop(struct events *e)
{
	loop_lock(e);
	e->dropped++;
	e->gap = true;
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

/* One more of a counter events_get_stats reports. */
static void count(struct events *e, uint64_t *counter)
{
	pthread_mutex_lock(&e->lock);
	(*counter)++;
	pthread_mutex_unlock(&e->lock);
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
	/*
	 * Never blocks.  The XPUB refuses (EAGAIN, nothing sent) while a subscriber sits at its
	 * high-water mark (ZMQ_XPUB_NODROP): counted, then sent as a PUB would, to everyone with
	 * room, the full ones missing it (their next seq shows the gap).
	 */
	if (zmq_send(e->pub, e->topic, e->topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 &&
	    errno == EAGAIN) {
		int lossy = 0, nodrop = 1;

		count(e, &e->slow);
		zmq_setsockopt(e->pub, ZMQ_XPUB_NODROP, &lossy, sizeof(lossy));
		zmq_send(e->pub, e->topic, e->topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
		zmq_send(e->pub, seq, sizeof(seq), ZMQ_SNDMORE | ZMQ_DONTWAIT);
		zmq_send(e->pub, e->sbuf.data, e->sbuf.size, ZMQ_DONTWAIT);
		zmq_setsockopt(e->pub, ZMQ_XPUB_NODROP, &nodrop, sizeof(nodrop));
	} else {
		zmq_send(e->pub, seq, sizeof(seq), ZMQ_SNDMORE | ZMQ_DONTWAIT);
		zmq_send(e->pub, e->sbuf.data, e->sbuf.size, ZMQ_DONTWAIT);
	}
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
 * One whole message into part (n of at most max, *n set; each to be closed).  A message of
 * more frames is read to its end and dropped, *n 0: the socket stays in step.  false: nothing
 * waits.
 */
static bool recv_parts(void *sock, zmq_msg_t *part, int max, int *n)
{
	int more = 1;

	*n = 0;
	while (more && *n < max) {
		zmq_msg_init(&part[*n]);
		if (zmq_msg_recv(&part[*n], sock, *n ? 0 : ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&part[*n]);
			return *n > 0;
		}
		more = zmq_msg_more(&part[*n]);
		(*n)++;
	}
	while (more) {
		zmq_msg_t junk;

		zmq_msg_init(&junk);
		if (zmq_msg_recv(&junk, sock, 0) < 0) {
			zmq_msg_close(&junk);
			break;
		}
		more = zmq_msg_more(&junk);
		zmq_msg_close(&junk);
		for (int i = 0; i < *n; i++)
			zmq_msg_close(&part[i]);
		*n = 0;
	}
	return true;
}

static void close_parts(zmq_msg_t *part, int n)
{
	for (int i = 0; i < n; i++)
		zmq_msg_close(&part[i]);
}

/* Sends frames, the last without SNDMORE; never blocks (ROUTER and REP drop what cannot go). */
static void send_parts(void *sock, const void *const *data, const size_t *len, int n)
{
	for (int i = 0; i < n; i++)
		zmq_send(sock, data[i], len[i], (i + 1 < n ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT);
}

/*
 * A replay request: [identity, "", start seq] from a REQ or DEALER socket (or without the empty
 * frame): every kept batch from that seq on as [identity, "", seq, payload], then the end
 * marker, seq -1 and an empty payload, as vLLM's publisher answers.
 */
static void serve_replay(struct events *e)
{
	zmq_msg_t part[3];
	int n;

	while (recv_parts(e->replay, part, 3, &n)) {
		const bool delim = n == 3 && zmq_msg_size(&part[1]) == 0;
		const void *d[4] = { zmq_msg_data(&part[0]), "" };
		size_t l[4] = { n ? zmq_msg_size(&part[0]) : 0, 0 };
		const int at = delim ? 2 : 1;
		uint64_t from = 0;
		uint8_t seq[8];

		if (!(n == 2 || delim) || zmq_msg_size(&part[n - 1]) != 8) {
			close_parts(part, n);
			continue;
		}
		for (int i = 0; i < 8; i++)
			from = from << 8 | ((const uint8_t *)zmq_msg_data(&part[n - 1]))[i];
		d[at] = seq;
		l[at] = sizeof(seq);
		for (uint32_t i = 0; i < e->rlen; i++) {
			const struct kept *k = &e->ring[(e->rhead + i) % e->cfg.buffer_batches];

			if (k->seq < from)
				continue;
			be64(seq, k->seq);
			d[at + 1] = k->payload;
			l[at + 1] = k->len;
			send_parts(e->replay, d, l, at + 2);
		}
		memset(seq, 0xff, sizeof(seq)); /* -1 */
		d[at + 1] = "";
		l[at + 1] = 0;
		send_parts(e->replay, d, l, at + 2);
		count(e, &e->replays);
		close_parts(part, n);
	}
}

/*
 * ZAP (ZMQ RFC 27), which libzmq asks before it lets a CURVE handshake through: [version,
 * request id, domain, address, identity, mechanism, client key] in, [version, request id,
 * status, text, user id, metadata] out.  Only the allowed keys get "200".
 */
static void serve_zap(struct events *e)
{
	zmq_msg_t part[7];
	int n;

	while (recv_parts(e->zap, part, 7, &n)) {
		bool ok = false;

		if (n < 2) {
			close_parts(part, n);
			continue;
		}
		if (n == 7 && zmq_msg_size(&part[5]) == 5 && !memcmp(zmq_msg_data(&part[5]), "CURVE", 5) &&
		    zmq_msg_size(&part[6]) == EVENTS_CURVE_KEY_BYTES)
			for (size_t i = 0; i < e->cfg.curve_nallowed && !ok; i++)
				ok = !memcmp(zmq_msg_data(&part[6]), e->cfg.curve_allowed[i],
					     EVENTS_CURVE_KEY_BYTES);
		{
			const void *d[6] = { "1.0", zmq_msg_data(&part[1]), ok ? "200" : "400",
					     ok ? "OK" : "key not allowed", "", "" };
			const size_t l[6] = { 3, zmq_msg_size(&part[1]), 3, ok ? 2 : 15, 0, 0 };

			send_parts(e->zap, d, l, 6);
		}
		if (!ok) {
			count(e, &e->refused);
		}
		close_parts(part, n);
	}
}

/* The XPUB's subscription messages (the socket must be read) and its monitor's connections. */
static void serve_subscribers(struct events *e)
{
	zmq_msg_t part[2];
	int n;

	while (recv_parts(e->pub, part, 1, &n))
		close_parts(part, n);
	while (e->monitor && recv_parts(e->monitor, part, 2, &n)) {
		if (n >= 1 && zmq_msg_size(&part[0]) >= 2) {
			uint16_t ev; /* the host's byte order (zmq_socket_monitor(3)) */

			memcpy(&ev, zmq_msg_data(&part[0]), sizeof(ev));
			pthread_mutex_lock(&e->lock);
			if (ev == ZMQ_EVENT_ACCEPTED)
				e->subscribers++;
			else if (ev == ZMQ_EVENT_DISCONNECTED && e->subscribers)
				e->subscribers--;
			pthread_mutex_unlock(&e->lock);
		}
		close_parts(part, n);
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

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
 * idle: raised EVENTS_RAISED_BATCHES intervals ago (raise_if_behind), the publisher goes back
 * to SCHED_IDLE; if the CPUs are still too busy for it, the loop raises it again.  Preempted
 * between the change and the unlock, it is lifted by the loop's loop_lock.
 */
static void lower_if_due(struct events *e)
{
	pthread_mutex_lock(&e->lock);
	if (e->raised &&
	    coarse_ms() - e->raised_ms >= (uint64_t)EVENTS_RAISED_BATCHES * e->cfg.batch_ms &&
	    set_policy(pthread_self(), SCHED_IDLE) == 0)
		e->raised = false;
	pthread_mutex_unlock(&e->lock);
}

static void *publisher(void *arg)
{
	struct events *e = arg;
	uint64_t next = now_ms() + e->cfg.batch_ms;
	zmq_pollitem_t it[4];
	int n = 0;
	sigset_t all;
#ifdef KVPAGED_TEST_HOOKS
	/*
	 * $KVPAGED_TEST_EVENTS_STARVE=1: while SCHED_IDLE, the publisher takes nothing, as one
	 * that gets no CPU would (test-events, raised); raised, it publishes.
	 */
	const char *starve_env = getenv("KVPAGED_TEST_EVENTS_STARVE");
	const bool starve = starve_env && !strcmp(starve_env, "1");
#endif

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	/* Answered between batches: replay requests, handshakes, subscriptions. */
	it[n++] = (zmq_pollitem_t){ .socket = e->pub, .events = ZMQ_POLLIN };
	if (e->monitor)
		it[n++] = (zmq_pollitem_t){ .socket = e->monitor, .events = ZMQ_POLLIN };
	if (e->replay)
		it[n++] = (zmq_pollitem_t){ .socket = e->replay, .events = ZMQ_POLLIN };
	if (e->zap)
		it[n++] = (zmq_pollitem_t){ .socket = e->zap, .events = ZMQ_POLLIN };
	for (;;) {
		uint64_t now = now_ms();
		bool stop;

		if (now < next && zmq_poll(it, n, (long)(next - now)) > 0) {
			if (e->zap)
				serve_zap(e);
			if (e->replay)
				serve_replay(e);
			serve_subscribers(e);
			if (now_ms() < next)
				continue;
		}
		next = now_ms() + e->cfg.batch_ms;
		pthread_mutex_lock(&e->lock);
		stop = e->stop;
		pthread_mutex_unlock(&e->lock);
#ifdef KVPAGED_TEST_HOOKS
		if (starve && !stop && sched_getscheduler(0) == SCHED_IDLE)
			continue;
#endif
		flush(e);
		if (stop)
			break;
		lower_if_due(e);
	}
	return NULL;
}

/* ---- setup -------------------------------------------------------------------------------- */

/*
 * Binds an endpoint.  An ipc:// socket file is made the daemon's user's only (docs/events.md);
 * a tcp:// one is served only with CURVE (config.c refuses it otherwise).
 */
static int bind_endpoint(void *sock, const char *endpoint, char *err, size_t errlen)
{
	/* A stale file from a daemon that died is taken over, as zmq_bind does for ipc. */
	if (zmq_bind(sock, endpoint) < 0) {
		int r = -errno;

		snprintf(err, errlen, "cannot bind %s: %s", endpoint, zmq_strerror(errno));
		return r;
	}
	if (!strncmp(endpoint, "ipc://", 6) && chmod(endpoint + 6, 0600) < 0) {
		int r = -errno;

		snprintf(err, errlen, "%s: cannot make it the daemon's only: %m", endpoint + 6);
		return r;
	}
	return 0;
}

/* A socket with the options both share: no linger, and CURVE as the server when asked. */
static void *make_socket(struct events *e, int type, const char *what, char *err, size_t errlen)
{
	static const char domain[] = "kvpaged";
	void *sock = zmq_socket(e->zctx, type);
	int zero = 0, one = 1;

	if (!sock || zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
	    (e->cfg.curve &&
	     (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) < 0 ||
	      zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, e->cfg.curve_secret,
			     EVENTS_CURVE_KEY_BYTES) < 0 ||
	      zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, domain, sizeof(domain) - 1) < 0))) {
		snprintf(err, errlen, "cannot make the %s socket: %s", what, zmq_strerror(errno));
		if (sock)
			zmq_close(sock);
		return NULL;
	}
	return sock;
}

/*
 * The CURVE pieces, before any socket binds: the ZAP handler (without one libzmq lets every
 * CURVE client in) and a copy of the allowed keys.
 */
static int start_curve(struct events *e, const uint8_t (*allowed)[EVENTS_CURVE_KEY_BYTES],
		       char *err, size_t errlen)
{
	size_t bytes = e->cfg.curve_nallowed * EVENTS_CURVE_KEY_BYTES;
	uint8_t (*keys)[EVENTS_CURVE_KEY_BYTES] = malloc(bytes ? bytes : 1);
	int zero = 0;

	if (!keys) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (bytes)
		memcpy(keys, allowed, bytes);
	e->cfg.curve_allowed = (const uint8_t (*)[EVENTS_CURVE_KEY_BYTES])keys;
	e->zap = zmq_socket(e->zctx, ZMQ_REP);
	if (!e->zap || zmq_setsockopt(e->zap, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
	    zmq_bind(e->zap, "inproc://zeromq.zap.01") < 0) {
		int r = -errno;

		snprintf(err, errlen, "cannot start the CURVE key check: %s", zmq_strerror(errno));
		return r;
	}
	return 0;
}

/* Connections to the PUB socket, counted from its monitor (subscribers in the stats). */
static int start_monitor(struct events *e, char *err, size_t errlen)
{
	char name[64];

	snprintf(name, sizeof(name), "inproc://kvpaged-events-monitor-%p", (void *)e);
	if (zmq_socket_monitor(e->pub, name, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) < 0 ||
	    !(e->monitor = zmq_socket(e->zctx, ZMQ_PAIR)) || zmq_connect(e->monitor, name) < 0) {
		int r = -errno;

		snprintf(err, errlen, "cannot watch the PUB socket: %s", zmq_strerror(errno));
		return r;
	}
	return 0;
}

/*
 * The publisher thread, named kvpaged-events, and how it shares a CPU with the loop's thread
 * (events_sched).  A busy second's batch holds a few hundred thousand token ids, and encoding
 * them takes a while; at the daemon's priority (normal), a request whose thread wakes on the
 * CPU the publisher holds waits out the publisher's slice (1.4 ms here, under EEVDF): on the
 * 2-vCPU VM, +7 to +23 % on the replay's p99 (docs/bench.md).
 *
 * idle (the default) runs it SCHED_IDLE: any other thread that wants the CPU gets it at once,
 * and the stream costs the replay nothing measurable.  But a CPU that is never idle would
 * starve it (a replay with a Python subscriber on 2 vCPUs: 13 batches in a run, 39758 events
 * dropped), so the loop raises it to the daemon's priority when it falls behind
 * (raise_if_behind), and it lowers itself again a second later (lower_if_due): under
 * saturation a batch is at most a few intervals late, once a second, and nothing is dropped
 * for it.  glibc's thread attributes take no SCHED_IDLE, so it is set once the thread runs.
 * Leaving SCHED_IDLE takes CAP_SYS_NICE or an RLIMIT_NICE of 20 (systemd's LimitNICE=+0, which
 * kvpaged.service sets): without either, the publisher is left at the daemon's priority, as
 * with normal, and the daemon says so.  ZMQ's I/O thread stays at the daemon's priority: it
 * only writes what was encoded, and the publisher has no say over it once it is starved.
 */
struct idle_probe {
	int idle, back; /* what set_policy said, SCHED_IDLE and back */
};

static void *probe_idle(void *arg)
{
	struct idle_probe *pr = arg;

	pr->idle = set_policy(pthread_self(), SCHED_IDLE);
	if (!pr->idle)
		pr->back = set_policy(pthread_self(), SCHED_OTHER);
	return NULL;
}

static int start_publisher(struct events *e)
{
	struct idle_probe pr = { 0 };
	pthread_t probe;
	int r = pthread_create(&e->thread, NULL, publisher, e);

	if (r)
		return -r;
	pthread_setname_np(e->thread, "kvpaged-events");
	if (e->cfg.sched != EVENTS_SCHED_IDLE)
		return 0;
	/* A thread that goes idle and back first: whether raise_if_behind will be able to. */
	r = pthread_create(&probe, NULL, probe_idle, &pr);
	if (!r)
		r = pthread_join(probe, NULL);
	if (!r && !pr.idle && !pr.back)
		r = set_policy(e->thread, SCHED_IDLE);
	if (r || pr.idle)
		log_warning("events_sched = idle: the event publisher runs as the daemon does: "
			    "cannot make it SCHED_IDLE: %s", strerror(r ? r : pr.idle));
	else if (pr.back)
		log_warning("events_sched = idle: the event publisher runs as the daemon does: once "
			    "SCHED_IDLE it could not be raised when it falls behind (%s: that takes "
			    "CAP_SYS_NICE or an RLIMIT_NICE of 20, systemd's LimitNICE=+0)",
			    strerror(pr.back));
	if (r || pr.idle || pr.back)
		e->cfg.sched = EVENTS_SCHED_NORMAL;
	return 0;
}

int events_new(const struct events_config *cfg, char *err, size_t errlen, struct events **ret)
{
	struct events *e = calloc(1, sizeof(*e));
	const size_t B = cfg->block_tokens;
	struct timespec now;
	int hwm = (int)cfg->hwm, one = 1, r;

	if (!e)
		return -ENOMEM;
	e->cfg = *cfg;
	e->cfg.curve_allowed = NULL; /* the copy start_curve makes, or none */
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
	if (cfg->curve) {
		r = start_curve(e, cfg->curve_allowed, err, errlen);
		if (r < 0)
			goto fail;
	}
	/* An XPUB, so that a subscriber at its high-water mark is seen (send_batch). */
	e->pub = make_socket(e, ZMQ_XPUB, "PUB", err, errlen);
	r = -EIO;
	if (!e->pub)
		goto fail;
	if (zmq_setsockopt(e->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm)) < 0 ||
	    zmq_setsockopt(e->pub, ZMQ_XPUB_NODROP, &one, sizeof(one)) < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot make the PUB socket: %s", zmq_strerror(errno));
		goto fail;
	}
	r = start_monitor(e, err, errlen);
	if (r < 0)
		goto fail;
	r = bind_endpoint(e->pub, cfg->endpoint, err, errlen);
	if (r < 0)
		goto fail;
	if (cfg->replay_endpoint) {
		e->replay = make_socket(e, ZMQ_ROUTER, "replay", err, errlen);
		r = -EIO;
		if (!e->replay)
			goto fail;
		r = bind_endpoint(e->replay, cfg->replay_endpoint, err, errlen);
		if (r < 0)
			goto fail;
	}
	/* The first batch says: whatever a subscriber knew of this node is gone (docs). */
	events_add(e, EVENTS_CLEARED, EVENTS_CPU, 0, 0, false, NULL);
	r = start_publisher(e);
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
		loop_lock(e);
		e->stop = true;
		pthread_mutex_unlock(&e->lock);
		/* Its last batch, and the join, wait for no idle CPU. */
		if (e->cfg.sched == EVENTS_SCHED_IDLE)
			(void)set_policy(e->thread, SCHED_OTHER);
		pthread_join(e->thread, NULL);
	}
	if (e->pub)
		zmq_close(e->pub);
	if (e->replay)
		zmq_close(e->replay);
	if (e->monitor)
		zmq_close(e->monitor);
	if (e->zap)
		zmq_close(e->zap);
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
	free((void *)e->cfg.curve_allowed);
	explicit_bzero(e->cfg.curve_secret, sizeof(e->cfg.curve_secret));
	msgpack_sbuffer_destroy(&e->sbuf);
	pthread_mutex_destroy(&e->lock);
	free(e);
	return NULL;
}

void events_tick(struct events *e)
{
	loop_lock(e);
	raise_if_behind(e);
	pthread_mutex_unlock(&e->lock);
}

void events_get_stats(struct events *e, struct events_stats *out)
{
	loop_lock(e);
	*out = (struct events_stats){ .batches = e->batches, .events = e->events,
				      .dropped = e->dropped, .replays = e->replays,
				      .seq = e->next_seq, .queued = e->qlen,
				      .slow = e->slow, .refused = e->refused, .raised = e->raises,
				      .subscribers = e->subscribers };
	pthread_mutex_unlock(&e->lock);
}

/* ---- CURVE key files ----------------------------------------------------------------------- */

int events_curve_secret_load(const char *path, uint8_t key[EVENTS_CURVE_KEY_BYTES], char *err,
			     size_t errlen)
{
	uint8_t buf[EVENTS_CURVE_Z85_LEN + 3];
	char text[EVENTS_CURVE_Z85_LEN + 1];
	size_t got;
	int r = seal_secret_read(path, buf, sizeof(buf), &got, err, errlen);

	if (r < 0)
		return r;
	if (got == EVENTS_CURVE_KEY_BYTES) {
		memcpy(key, buf, EVENTS_CURVE_KEY_BYTES);
		explicit_bzero(buf, sizeof(buf));
		return 0;
	}
	while (got > EVENTS_CURVE_Z85_LEN && (buf[got - 1] == '\n' || buf[got - 1] == '\r'))
		got--;
	r = -EINVAL;
	if (got == EVENTS_CURVE_Z85_LEN) {
		memcpy(text, buf, EVENTS_CURVE_Z85_LEN);
		text[EVENTS_CURVE_Z85_LEN] = '\0';
		if (zmq_z85_decode(key, text))
			r = 0;
		explicit_bzero(text, sizeof(text));
	}
	explicit_bzero(buf, sizeof(buf));
	if (r < 0)
		snprintf(err, errlen, "%s: not a CURVE secret key (40 characters of Z85, as "
			 "curve_keygen prints, or 32 raw bytes)", path);
	return r;
}

int events_curve_allowed_load(const char *path, uint8_t (**keys)[EVENTS_CURVE_KEY_BYTES],
			      size_t *n, char *err, size_t errlen)
{
	uint8_t (*k)[EVENTS_CURVE_KEY_BYTES] = NULL;
	size_t cap = 0, used = 0, len = 0;
	char *line = NULL;
	unsigned lineno = 0;
	struct stat st;
	int r = 0;
	FILE *f = fopen(path, "re");

	if (!f) {
		r = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return r;
	}
	/* Whoever may write the file may let themselves in: its owner only (or root). */
	if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
		r = -EINVAL;
		snprintf(err, errlen, "%s: not a regular file", path);
	} else if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		r = -EPERM;
		snprintf(err, errlen, "%s: mode %04o lets group or others add keys (chmod 644)",
			 path, (unsigned)(st.st_mode & 07777));
	} else if (st.st_uid != geteuid() && st.st_uid != 0) {
		r = -EPERM;
		snprintf(err, errlen, "%s: owned by uid %u, neither this user nor root", path,
			 (unsigned)st.st_uid);
	}
	while (!r && getline(&line, &len, f) >= 0) {
		char *s = line, *end;

		lineno++;
		/* # starts a comment only at a line's start: Z85 has # among its characters. */
		s += strspn(s, " \t");
		end = s + strcspn(s, " \t\r\n");
		if (end == s || *s == '#')
			continue;
		*end = '\0';
		if (used == cap) {
			size_t want = cap ? cap * 2 : 16;
			void *grown = want <= 1u << 20 ? realloc(k, want * sizeof(*k)) : NULL;

			if (!grown) {
				r = -ENOMEM;
				snprintf(err, errlen, "%s:%u: too many keys", path, lineno);
				break;
			}
			k = grown;
			cap = want;
		}
		if (strlen(s) != EVENTS_CURVE_Z85_LEN || !zmq_z85_decode(k[used], s)) {
			r = -EINVAL;
			snprintf(err, errlen, "%s:%u: not a CURVE public key (40 characters of Z85)",
				 path, lineno);
			break;
		}
		used++;
	}
	if (!r && ferror(f)) {
		r = -EIO;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
	}
	if (!r && !used) {
		r = -EINVAL;
		snprintf(err, errlen, "%s: no keys: no subscriber could get in", path);
	}
	free(line);
	fclose(f);
	if (r < 0) {
		free(k);
		return r;
	}
	*keys = k;
	*n = used;
	return 0;
}

int events_curve_public(const uint8_t secret[EVENTS_CURVE_KEY_BYTES],
			char z85[EVENTS_CURVE_Z85_LEN + 1])
{
	char s[EVENTS_CURVE_Z85_LEN + 1];
	int r = zmq_z85_encode(s, secret, EVENTS_CURVE_KEY_BYTES) &&
			zmq_curve_public(z85, s) == 0
		? 0
		: -EINVAL;

	explicit_bzero(s, sizeof(s));
	return r;
}

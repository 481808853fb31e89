/* SPDX-License-Identifier: MIT */
/*
 * kvpagedctl events: subscribes to the stream (a SUB socket, every topic) and decodes each
 * batch, [topic, seq, msgpack [ts, [event...], rank]], in either format (maps with a type key,
 * or positional arrays), printing what a router would see.  seq gaps and epoch changes are
 * said as they happen: an operator tailing a stream sees what a router misses.
 */
#include <errno.h>
#include <inttypes.h>
#include <msgpack.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include <json-c/json.h>

#include "daemon/server/events.h"
#include "tools/evdecode.h"
#include "tools/kvpagedctl/tail.h"

static volatile sig_atomic_t stopping;

static void on_signal(int sig)
{
	(void)sig;
	stopping = 1;
}

static const char *str(const msgpack_object *o, char *buf, size_t cap)
{
	if (!o || o->type != MSGPACK_OBJECT_STR)
		return "?";
	snprintf(buf, cap, "%.*s", (int)o->via.str.size, o->via.str.ptr);
	return buf;
}

static json_object *hex(uint64_t v)
{
	char h[17];

	snprintf(h, sizeof(h), "%016" PRIx64, v);
	return json_object_new_string(h);
}

/* One event as a JSON object (hashes in hex: JSON numbers lose 64-bit integers). */
static json_object *event_json(const msgpack_object *ev, const msgpack_object *type)
{
	json_object *o = json_object_new_object();
	const msgpack_object *hs = evd_field(ev, type, "block_hashes"), *f;
	char buf[64];

	json_object_object_add(o, "type", json_object_new_string(str(type, buf, sizeof(buf))));
	if (evd_is_str(type, "AllBlocksCleared"))
		return o;
	if (hs && hs->type == MSGPACK_OBJECT_ARRAY) {
		json_object *a = json_object_new_array();

		for (uint32_t i = 0; i < hs->via.array.size; i++)
			json_object_array_add(a, hex(hs->via.array.ptr[i].via.u64));
		json_object_object_add(o, "block_hashes", a);
	}
	json_object_object_add(o, "medium",
			       json_object_new_string(str(evd_field(ev, type, "medium"), buf,
							  sizeof(buf))));
	if (!evd_is_str(type, "BlockStored"))
		return o;
	f = evd_field(ev, type, "parent_block_hash");
	json_object_object_add(o, "parent_block_hash",
			       f && f->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? hex(f->via.u64)
									: NULL);
	f = evd_field(ev, type, "block_size");
	json_object_object_add(o, "block_size",
			       json_object_new_int64(f && f->type == MSGPACK_OBJECT_POSITIVE_INTEGER
							     ? (int64_t)f->via.u64
							     : 0));
	f = evd_field(ev, type, "token_ids");
	if (f && f->type == MSGPACK_OBJECT_ARRAY) {
		json_object *a = json_object_new_array();

		for (uint32_t i = 0; i < f->via.array.size; i++)
			json_object_array_add(a, json_object_new_int64((int64_t)f->via.array.ptr[i].via.u64));
		json_object_object_add(o, "token_ids", a);
	}
	return o;
}

/* One event as a line: its type, medium, blocks (the first and last hash) and tokens. */
static void event_text(uint64_t seq, const msgpack_object *ev, const msgpack_object *type)
{
	const msgpack_object *hs = evd_field(ev, type, "block_hashes"), *f;
	char t[64], m[16];
	uint32_t n = hs && hs->type == MSGPACK_OBJECT_ARRAY ? hs->via.array.size : 0;

	printf("%016" PRIx64 " %s", seq, str(type, t, sizeof(t)));
	if (!evd_is_str(type, "AllBlocksCleared")) {
		printf(" %s %u block%s", str(evd_field(ev, type, "medium"), m, sizeof(m)), n,
		       n == 1 ? "" : "s");
		if (n)
			printf(" %016" PRIx64, hs->via.array.ptr[0].via.u64);
		if (n > 1)
			printf("..%016" PRIx64, hs->via.array.ptr[n - 1].via.u64);
	}
	if (evd_is_str(type, "BlockStored")) {
		f = evd_field(ev, type, "parent_block_hash");
		if (f && f->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
			printf(" parent %016" PRIx64, f->via.u64);
		f = evd_field(ev, type, "token_ids");
		if (f && f->type == MSGPACK_OBJECT_ARRAY)
			printf(" (%u tokens)", f->via.array.size);
	}
	putchar('\n');
}

/* Decodes and prints one batch; false when it is not vLLM's batch. */
static bool print_batch(const zmq_msg_t *topic, uint64_t seq, const zmq_msg_t *payload,
			bool json)
{
	msgpack_unpacked u;
	const msgpack_object *b, *evs;
	bool ok = false;

	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, zmq_msg_data((zmq_msg_t *)payload),
				zmq_msg_size((zmq_msg_t *)payload), NULL) != MSGPACK_UNPACK_SUCCESS)
		goto out;
	b = &u.data;
	evs = evd_events(b);
	if (!evs)
		goto out;
	if (json) {
		json_object *o = json_object_new_object(), *a = json_object_new_array();
		const msgpack_object *ts = &b->via.array.ptr[0];

		json_object_object_add(o, "topic",
				       json_object_new_string_len(zmq_msg_data((zmq_msg_t *)topic),
								  (int)zmq_msg_size((zmq_msg_t *)topic)));
		json_object_object_add(o, "seq", json_object_new_uint64(seq));
		json_object_object_add(o, "ts",
				       json_object_new_double(ts->type == MSGPACK_OBJECT_FLOAT64 ||
								      ts->type == MSGPACK_OBJECT_FLOAT32
							      ? ts->via.f64
							      : 0));
		for (uint32_t i = 0; i < evs->via.array.size; i++)
			json_object_array_add(a, event_json(&evs->via.array.ptr[i],
							    evd_type(&evs->via.array.ptr[i])));
		json_object_object_add(o, "events", a);
		printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
		json_object_put(o);
	} else {
		for (uint32_t i = 0; i < evs->via.array.size; i++)
			event_text(seq, &evs->via.array.ptr[i], evd_type(&evs->via.array.ptr[i]));
	}
	fflush(stdout);
	ok = true;
out:
	msgpack_unpacked_destroy(&u);
	return ok;
}

static int setup_curve(void *sub, const char *server_key, const char *key_file)
{
	uint8_t secret[EVENTS_CURVE_KEY_BYTES], server[EVENTS_CURVE_KEY_BYTES];
	char public[EVENTS_CURVE_Z85_LEN + 1], err[512];

	if (!key_file) {
		fprintf(stderr, "kvpagedctl: the stream speaks CURVE (server key %s): give this "
				"client's secret key with --curve-key FILE, its public key in the "
				"pool's events_curve_allowed_keys_file\n",
			server_key);
		return -1;
	}
	if (events_curve_secret_load(key_file, secret, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvpagedctl: --curve-key: %s\n", err);
		return -1;
	}
	if (strlen(server_key) != EVENTS_CURVE_Z85_LEN || !zmq_z85_decode(server, server_key) ||
	    events_curve_public(secret, public) < 0 ||
	    zmq_setsockopt(sub, ZMQ_CURVE_SERVERKEY, server, sizeof(server)) < 0 ||
	    zmq_setsockopt(sub, ZMQ_CURVE_PUBLICKEY, public, EVENTS_CURVE_Z85_LEN) < 0 ||
	    zmq_setsockopt(sub, ZMQ_CURVE_SECRETKEY, secret, sizeof(secret)) < 0) {
		fprintf(stderr, "kvpagedctl: CURVE: %s\n", zmq_strerror(errno));
		return -1;
	}
	return 0;
}

int events_tail(const char *endpoint, const char *server_key, const char *key_file,
		unsigned long count, bool json)
{
	struct sigaction sa = { .sa_handler = on_signal };
	void *ctx = zmq_ctx_new(), *sub = ctx ? zmq_socket(ctx, ZMQ_SUB) : NULL;
	unsigned long seen = 0;
	uint64_t prev = 0;
	int linger = 0, rc = 1;

	if (!sub) {
		fprintf(stderr, "kvpagedctl: zmq: %s\n", zmq_strerror(errno));
		goto out;
	}
	zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof(linger));
	if (zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0) < 0)
		goto out;
	if (server_key && *server_key && setup_curve(sub, server_key, key_file) < 0)
		goto out;
	if (zmq_connect(sub, endpoint) < 0) {
		fprintf(stderr, "kvpagedctl: %s: %s\n", endpoint, zmq_strerror(errno));
		goto out;
	}
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (!json && isatty(STDERR_FILENO))
		fprintf(stderr, "kvpagedctl: tailing %s (seq, event, medium, blocks)\n", endpoint);
	rc = 0;
	while (!stopping && (!count || seen < count)) {
		zmq_msg_t part[3];
		uint64_t seq = 0;
		int n = 0, more = 1;

		while (more && n < 3) {
			size_t len = sizeof(more);

			zmq_msg_init(&part[n]);
			if (zmq_msg_recv(&part[n], sub, 0) < 0) {
				zmq_msg_close(&part[n]);
				break;
			}
			zmq_getsockopt(sub, ZMQ_RCVMORE, &more, &len);
			n++;
		}
		if (n < 3 || more || zmq_msg_size(&part[1]) != 8) {
			/* interrupted, or not a batch (counted below): nothing to print */
			if (n && !stopping)
				fprintf(stderr, "kvpagedctl: a message that is not a batch (%d frames)\n",
					n);
			for (int i = 0; i < n; i++)
				zmq_msg_close(&part[i]);
			continue;
		}
		for (int i = 0; i < 8; i++)
			seq = seq << 8 | ((const uint8_t *)zmq_msg_data(&part[1]))[i];
		if (!json && prev && seq >> 32 != prev >> 32)
			printf("-- a new epoch: the daemon restarted; what was announced before is gone\n");
		else if (!json && prev && seq != prev + 1)
			printf("-- %" PRIu64 " batches missed (replay from %016" PRIx64 ")\n",
			       seq - prev - 1, prev + 1);
		prev = seq;
		if (!print_batch(&part[0], seq, &part[2], json))
			fprintf(stderr, "kvpagedctl: batch %016" PRIx64 " is not vLLM's format\n", seq);
		seen++;
		for (int i = 0; i < 3; i++)
			zmq_msg_close(&part[i]);
	}
out:
	if (sub)
		zmq_close(sub);
	if (ctx)
		zmq_ctx_term(ctx);
	return rc;
}

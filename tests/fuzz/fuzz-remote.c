/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: what the remote tier reads from others.  The first byte picks the part:
 *
 * - 0: a value as Redis might hand it back (anyone who can write to the cluster chooses it),
 *   opened by seal_open with a keyring of two keys: it is refused with -EBADMSG and a reason,
 *   or, only when it is a value this keyring sealed for this block, opened; never a crash or
 *   a read past its end;
 * - 1: a seal, open, alter, open round: the input gives the tokens and payload of a block and
 *   which byte to alter; the sealed value opens to the same bytes, and with any one byte
 *   changed it is refused, never opened;
 * - 2: a seed list (the remote_tier value in a configuration) for redis_parse_url: refused
 *   with a message naming the input, or every address a non-empty host and a port 1..65535;
 * - 3: a key for redis_key_slot: below 16384, and a key's hashtag decides its slot.
 *
 * Built twice: with libFuzzer (configure --enable-fuzzers) and, with any compiler, as a replay
 * program over the committed seeds (tests/fuzz/replay.c, tests/fuzz/replay.test).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tier/redis.h"
#include "daemon/tier/seal.h"

#define TOKENS 4
#define PAYLOAD 64

static struct seal_keyring *ring;
static const struct seal_geometry geo = {
	.layers = 2, .kv_heads = 1, .head_dim = 8, .elem_bytes = 2,
	.block_tokens = TOKENS, .payload_bytes = PAYLOAD,
};
static uint32_t tokens[TOKENS] = { 11, 22, 33, 44 };
static struct seal_identity ident = {
	.hash = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 },
	.ns = "fuzz", .ns_len = 4, .tokens = tokens,
};
static char rkey[SEAL_REDIS_KEY_LEN + 1];

static void setup(void)
{
	uint8_t k1[SEAL_KEY_BYTES], k2[SEAL_KEY_BYTES];

	for (int i = 0; i < SEAL_KEY_BYTES; i++) {
		k1[i] = (uint8_t)(i + 1);
		k2[i] = (uint8_t)(0x80 + i);
	}
	if (seal_keyring_new(&ring) < 0 || seal_keyring_add(ring, k1, 0, NULL) < 0 ||
	    seal_keyring_add(ring, k2, 1, NULL) < 0 ||
	    seal_redis_key(ring, ident.ns, ident.ns_len, ident.hash, rkey) < 0)
		abort();
}

static void open_hostile(const uint8_t *data, size_t size)
{
	uint8_t dst[PAYLOAD];
	enum seal_reason why = SEAL_NREASONS;
	int r = seal_open(ring, &geo, &ident, data, size, rkey, dst, &why);

	if (r == 0 ? why != SEAL_OK : r != -EBADMSG || why == SEAL_OK || why >= SEAL_NREASONS)
		abort();
}

static void round_trip(const uint8_t *data, size_t size)
{
	struct seal_identity id = ident;
	uint32_t t[TOKENS] = { 0 };
	uint8_t payload[PAYLOAD] = { 0 }, dst[PAYLOAD], *v;
	size_t vlen = seal_size(&geo, ident.ns_len), at = 0;
	enum seal_reason why;

	if (size >= 4) {
		at = ((size_t)data[0] << 8 | data[1]) % vlen;
		memcpy(t, data + 2, size - 2 < sizeof(t) ? size - 2 : sizeof(t));
	}
	if (size > 2 + sizeof(t))
		memcpy(payload, data + 2 + sizeof(t),
		       size - 2 - sizeof(t) < PAYLOAD ? size - 2 - sizeof(t) : PAYLOAD);
	id.tokens = t;
	v = malloc(vlen);
	if (!v || seal_seal(ring, &geo, &id, payload, rkey, v) < 0)
		abort();
	if (seal_open(ring, &geo, &id, v, vlen, rkey, dst, &why) < 0 || why != SEAL_OK ||
	    memcmp(dst, payload, PAYLOAD))
		abort();
	v[at] ^= (uint8_t)(size > 2 ? data[2] | 1 : 1);
	if (seal_open(ring, &geo, &id, v, vlen, rkey, dst, &why) != -EBADMSG || why == SEAL_OK)
		abort();
	free(v);
}

static void parse_seeds(const uint8_t *data, size_t size)
{
	struct redis_addr addrs[4];
	char *url = malloc(size + 1), err[512] = "";
	size_t n = 0;
	int r;

	if (!url)
		abort();
	memcpy(url, data, size);
	url[size] = '\0';
	r = redis_parse_url(url, addrs, 4, &n, err, sizeof(err));
	if (r == 0) {
		if (n < 1 || n > 4)
			abort();
		for (size_t i = 0; i < n; i++)
			if (!addrs[i].host[0] || strlen(addrs[i].host) >= REDIS_HOST_MAX ||
			    addrs[i].port == 0)
				abort();
	} else if ((r != -EINVAL && r != -E2BIG) || !err[0]) {
		abort();
	}
	free(url);
}

static void key_slot(const uint8_t *data, size_t size)
{
	uint16_t slot = redis_key_slot(data, size);
	const uint8_t *open = memchr(data, '{', size), *close;

	if (slot >= REDIS_SLOTS)
		abort();
	if (open && (close = memchr(open + 1, '}', size - (size_t)(open + 1 - data))) &&
	    close > open + 1) {
		size_t tag = (size_t)(close - open - 1);

		if (slot != (redis_crc16(open + 1, tag) & (REDIS_SLOTS - 1)))
			abort();
	} else if (slot != (redis_crc16(data, size) & (REDIS_SLOTS - 1))) {
		abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!ring)
		setup();
	if (size < 1)
		return 0;
	switch (data[0] & 3) {
	case 0:
		open_hostile(data + 1, size - 1);
		break;
	case 1:
		round_trip(data + 1, size - 1);
		break;
	case 2:
		parse_seeds(data + 1, size - 1);
		break;
	default:
		key_slot(data + 1, size - 1);
	}
	return 0;
}

/* SPDX-License-Identifier: MIT */
/* The remote tier's sealed values (layout and key derivation in seal.h and docs/remote.md). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include "daemon/tier/seal.h"
#include "proto/cleanup.h"

struct seal_key {
	uint32_t id;
	uint8_t aead[SEAL_KEY_BYTES];
};

struct seal_keyring {
	struct seal_key keys[SEAL_MAX_KEYS];
	unsigned nkeys;
	int current; /* index into keys, -1: none (open only) */
	/* From the first key: stable across rotation (seal.h). */
	uint8_t naming[SEAL_KEY_BYTES];
	uint8_t salting[SEAL_KEY_BYTES];
};

static const char *const reason_names[SEAL_NREASONS] = {
	[SEAL_OK] = "ok",
	[SEAL_TRUNCATED] = "truncated",
	[SEAL_BAD_MAGIC] = "bad magic",
	[SEAL_BAD_VERSION] = "bad version",
	[SEAL_UNKNOWN_KEY] = "unknown key",
	[SEAL_GEOMETRY] = "geometry mismatch",
	[SEAL_TAG] = "tag mismatch",
	[SEAL_IDENTITY] = "hash, parent or namespace mismatch",
	[SEAL_TOKENS] = "token mismatch",
};

const char *seal_reason_name(enum seal_reason r)
{
	return (unsigned)r < SEAL_NREASONS ? reason_names[r] : "?";
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* HKDF-SHA256(key, info) into out: the subkeys, each bound to its purpose by info. */
static int hkdf(const uint8_t key[SEAL_KEY_BYTES], const char *info, uint8_t *out, size_t n)
{
	EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
	EVP_KDF_CTX *ctx = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
		OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)key, SEAL_KEY_BYTES),
		OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)"kvpaged remote", 14),
		OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)info, strlen(info)),
		OSSL_PARAM_construct_end(),
	};
	int r = ctx && EVP_KDF_derive(ctx, out, n, params) > 0 ? 0 : -EIO;

	EVP_KDF_CTX_free(ctx);
	EVP_KDF_free(kdf);
	return r;
}

int seal_keyring_new(struct seal_keyring **ret)
{
	struct seal_keyring *k = calloc(1, sizeof(*k));

	if (!k)
		return -ENOMEM;
	k->current = -1;
	*ret = k;
	return 0;
}

struct seal_keyring *seal_keyring_free(struct seal_keyring *k)
{
	if (k) {
		OPENSSL_cleanse(k, sizeof(*k));
		free(k);
	}
	return NULL;
}

int seal_keyring_add(struct seal_keyring *k, const uint8_t key[SEAL_KEY_BYTES], int current,
		     uint32_t *ret_id)
{
	struct seal_key e;
	uint8_t idb[4];
	int r;

	if (k->nkeys == SEAL_MAX_KEYS)
		return -E2BIG;
	r = hkdf(key, "kvpaged remote v1 key id", idb, sizeof(idb));
	if (r < 0)
		return r;
	e.id = get32(idb);
	for (unsigned i = 0; i < k->nkeys; i++)
		if (k->keys[i].id == e.id)
			return -EEXIST;
	r = hkdf(key, "kvpaged remote v1 aead", e.aead, sizeof(e.aead));
	if (r < 0)
		return r;
	if (k->nkeys == 0) {
		r = hkdf(key, "kvpaged remote v1 naming", k->naming, sizeof(k->naming));
		if (r >= 0)
			r = hkdf(key, "kvpaged remote v1 salting", k->salting, sizeof(k->salting));
		if (r < 0)
			return r;
	}
	k->keys[k->nkeys] = e;
	OPENSSL_cleanse(&e, sizeof(e));
	if (current)
		k->current = (int)k->nkeys;
	k->nkeys++;
	if (ret_id)
		*ret_id = k->keys[k->nkeys - 1].id;
	return 0;
}

int seal_secret_read(const char *path, uint8_t *buf, size_t cap, size_t *len, char *err,
		     size_t errlen)
{
	_cleanup_close_ int fd = -EBADF;
	struct stat st;
	ssize_t n;
	size_t got = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
	if (fd < 0) {
		int e = errno;

		snprintf(err, errlen, "%s: %s", path,
			 e == ELOOP ? "is a symbolic link (refused)" : strerror(e));
		return -e;
	}
	if (fstat(fd, &st) < 0) {
		int e = errno;

		snprintf(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s: not a regular file", path);
		return -EINVAL;
	}
	/* A key opens what it guards: nobody but its owner may read it. */
	if (st.st_mode & (S_IRWXG | S_IRWXO)) {
		snprintf(err, errlen, "%s: mode %04o lets group or others at the key (chmod 600)",
			 path, (unsigned)(st.st_mode & 07777));
		return -EPERM;
	}
	if (st.st_uid != geteuid() && st.st_uid != 0) {
		snprintf(err, errlen, "%s: owned by uid %u, neither this user nor root", path,
			 (unsigned)st.st_uid);
		return -EPERM;
	}
	while (got < cap) {
		n = read(fd, buf + got, cap - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;

			snprintf(err, errlen, "%s: %s", path, strerror(e));
			OPENSSL_cleanse(buf, got);
			return -e;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	*len = got;
	return 0;
}

int seal_key_load(const char *path, uint8_t key[SEAL_KEY_BYTES], char *err, size_t errlen)
{
	uint8_t buf[SEAL_KEY_BYTES + 1]; /* a byte more than a key, to tell a long file */
	size_t got;
	int r = seal_secret_read(path, buf, sizeof(buf), &got, err, errlen);

	if (r < 0)
		return r;
	if (got != SEAL_KEY_BYTES) {
		snprintf(err, errlen, "%s: %s than the %d raw bytes a key is (head -c %d /dev/urandom)",
			 path, got < SEAL_KEY_BYTES ? "shorter" : "longer", SEAL_KEY_BYTES,
			 SEAL_KEY_BYTES);
		OPENSSL_cleanse(buf, sizeof(buf));
		return -EINVAL;
	}
	memcpy(key, buf, SEAL_KEY_BYTES);
	OPENSSL_cleanse(buf, sizeof(buf));
	return 0;
}

static size_t identity_bytes(uint32_t block_tokens, size_t ns_len)
{
	return 32 + ns_len + (size_t)block_tokens * 4;
}

size_t seal_size(const struct seal_geometry *g, size_t ns_len)
{
	return SEAL_HEADER_BYTES + identity_bytes(g->block_tokens, ns_len) + g->payload_bytes +
	       SEAL_TAG_BYTES;
}

static int hmac(const uint8_t key[SEAL_KEY_BYTES], const uint8_t *a, size_t alen,
		const uint8_t *b, size_t blen, const uint8_t *c, size_t clen, uint8_t out[32])
{
	uint8_t buf[4 + SEAL_MAX_NAMESPACE + 16 + 16];
	unsigned outlen = 0;

	if (alen + blen + clen > sizeof(buf))
		return -EINVAL;
	memcpy(buf, a, alen);
	memcpy(buf + alen, b, blen);
	if (clen)
		memcpy(buf + alen + blen, c, clen);
	if (!HMAC(EVP_sha256(), key, SEAL_KEY_BYTES, buf, alen + blen + clen, out, &outlen) ||
	    outlen != 32)
		return -EIO;
	return 0;
}

int seal_redis_key(const struct seal_keyring *k, const void *ns, size_t ns_len,
		   const uint8_t hash[16], char out[SEAL_REDIS_KEY_LEN + 1])
{
	static const char hex[] = "0123456789abcdef";
	uint8_t len[4], mac[32];
	int r;

	if (!k->nkeys || ns_len > SEAL_MAX_NAMESPACE)
		return -EINVAL;
	/* The length first: ("ab", hash) and ("a", "b"||hash) must not collide. */
	put32(len, (uint32_t)ns_len);
	r = hmac(k->naming, len, 4, ns, ns_len, hash, 16, mac);
	if (r < 0)
		return r;
	memcpy(out, "kvp:", 4);
	for (int i = 0; i < 16; i++) {
		out[4 + 2 * i] = hex[mac[i] >> 4];
		out[5 + 2 * i] = hex[mac[i] & 15];
	}
	out[SEAL_REDIS_KEY_LEN] = '\0';
	return 0;
}

int seal_root_salt(const struct seal_keyring *k, const void *ns, size_t ns_len, uint64_t *ret)
{
	uint8_t mac[32];
	int r;

	if (!k->nkeys || ns_len > SEAL_MAX_NAMESPACE)
		return -EINVAL;
	r = hmac(k->salting, (const uint8_t *)"root-salt", 9, ns, ns_len, NULL, 0, mac);
	if (r < 0)
		return r;
	*ret = get64(mac);
	return 0;
}

static void header_encode(uint8_t h[SEAL_HEADER_BYTES], uint32_t key_id, const uint8_t *nonce,
			  const struct seal_geometry *g, size_t ns_len)
{
	memcpy(h, SEAL_MAGIC, 4);
	h[4] = SEAL_VERSION & 0xff;
	h[5] = SEAL_VERSION >> 8;
	h[6] = h[7] = 0;
	put32(h + 8, key_id);
	memcpy(h + 12, nonce, SEAL_NONCE_BYTES);
	put32(h + 24, g->layers);
	put32(h + 28, g->kv_heads);
	put32(h + 32, g->head_dim);
	put32(h + 36, g->elem_bytes);
	put32(h + 40, g->block_tokens);
	put32(h + 44, (uint32_t)ns_len);
	put64(h + 48, g->payload_bytes);
}

/* EVP takes int lengths: feed big payloads in pieces. */
static int cipher_update(EVP_CIPHER_CTX *ctx, uint8_t *out, const uint8_t *in, size_t n)
{
	while (n) {
		int piece = n > (1u << 30) ? 1 << 30 : (int)n, outl = 0;

		if (EVP_CipherUpdate(ctx, out, &outl, in, piece) <= 0 || outl != piece)
			return -EIO;
		if (out)
			out += piece;
		in += piece;
		n -= (size_t)piece;
	}
	return 0;
}

/* Sets up ctx for one value: cipher, key, nonce, then the AAD (the Redis key and the header). */
static int cipher_begin(EVP_CIPHER_CTX *ctx, int enc, const uint8_t *key, const uint8_t *nonce,
			const char *redis_key, const uint8_t *header)
{
	if (EVP_CipherInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL, enc) <= 0 ||
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, SEAL_NONCE_BYTES, NULL) <= 0 ||
	    EVP_CipherInit_ex(ctx, NULL, NULL, key, nonce, enc) <= 0)
		return -EIO;
	if (cipher_update(ctx, NULL, (const uint8_t *)redis_key, strlen(redis_key)) < 0)
		return -EIO;
	return cipher_update(ctx, NULL, header, SEAL_HEADER_BYTES);
}

static int geometry_ok(const struct seal_geometry *g)
{
	return g->block_tokens && g->payload_bytes && g->block_tokens <= (1u << 20);
}

int seal_seal(const struct seal_keyring *k, const struct seal_geometry *g,
	      const struct seal_identity *id, const void *payload, const char *redis_key,
	      void *out)
{
	uint8_t *o = out, nonce[SEAL_NONCE_BYTES];
	const struct seal_key *key;
	EVP_CIPHER_CTX *ctx;
	uint8_t *p;
	int r = -EIO, outl;

	if (k->current < 0 || !geometry_ok(g) || id->ns_len > SEAL_MAX_NAMESPACE)
		return -EINVAL;
	key = &k->keys[k->current];
	/* A random nonce per value: nodes share the key and no counter, so nothing else is safe. */
	if (RAND_bytes(nonce, sizeof(nonce)) != 1)
		return -EIO;
	header_encode(o, key->id, nonce, g, id->ns_len);
	ctx = EVP_CIPHER_CTX_new();
	if (!ctx)
		return -ENOMEM;
	if (cipher_begin(ctx, 1, key->aead, nonce, redis_key, o) < 0)
		goto out;
	p = o + SEAL_HEADER_BYTES;
	if (cipher_update(ctx, p, id->hash, 16) < 0 || cipher_update(ctx, p + 16, id->parent, 16) < 0)
		goto out;
	p += 32;
	if (id->ns_len && cipher_update(ctx, p, id->ns, id->ns_len) < 0)
		goto out;
	p += id->ns_len;
	/* Token ids little-endian like the rest; on the hosts kvpaged runs on, as they lie. */
	for (uint32_t i = 0; i < g->block_tokens; i++) {
		uint8_t t[4];

		put32(t, id->tokens[i]);
		if (cipher_update(ctx, p, t, 4) < 0)
			goto out;
		p += 4;
	}
	if (cipher_update(ctx, p, payload, g->payload_bytes) < 0)
		goto out;
	p += g->payload_bytes;
	if (EVP_CipherFinal_ex(ctx, p, &outl) <= 0 ||
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, SEAL_TAG_BYTES, p) <= 0)
		goto out;
	r = 0;
out:
	EVP_CIPHER_CTX_free(ctx);
	return r;
}

void seal_stream_begin(struct seal_stream *s, const struct seal_keyring *k,
		       const struct seal_geometry *g, const struct seal_identity *id,
		       const char *redis_key, size_t len, void *dst)
{
	*s = (struct seal_stream){ .k = k, .g = *g, .id = *id, .redis_key = redis_key,
				   .len = len, .dst = dst };
	if (len < SEAL_HEADER_BYTES + SEAL_TAG_BYTES)
		s->reason = SEAL_TRUNCATED;
}

/* The header is all here: is it a value this open can take?  Then the cipher starts. */
static void stream_header(struct seal_stream *s)
{
	const struct seal_geometry *g = &s->g;
	const uint8_t *v = s->header, *key = NULL;
	size_t ns_len;

	if (memcmp(v, SEAL_MAGIC, 4)) {
		s->reason = SEAL_BAD_MAGIC;
		return;
	}
	if ((v[4] | v[5] << 8) != SEAL_VERSION) {
		s->reason = SEAL_BAD_VERSION;
		return;
	}
	for (unsigned i = 0; i < s->k->nkeys; i++)
		if (s->k->keys[i].id == get32(v + 8))
			key = s->k->keys[i].aead;
	if (!key) {
		s->reason = SEAL_UNKNOWN_KEY;
		return;
	}
	if (get32(v + 24) != g->layers || get32(v + 28) != g->kv_heads ||
	    get32(v + 32) != g->head_dim || get32(v + 36) != g->elem_bytes ||
	    get32(v + 40) != g->block_tokens || get64(v + 48) != g->payload_bytes) {
		s->reason = SEAL_GEOMETRY;
		return;
	}
	ns_len = get32(v + 44);
	if (ns_len > SEAL_MAX_NAMESPACE || s->len != seal_size(g, ns_len)) {
		s->reason = SEAL_TRUNCATED;
		return;
	}
	s->ns_len = ns_len;
	s->idn = identity_bytes(g->block_tokens, ns_len);
	s->ident = malloc(s->idn);
	s->ctx = EVP_CIPHER_CTX_new();
	if (!s->ident || !s->ctx)
		s->err = -ENOMEM;
	else if (cipher_begin(s->ctx, 0, key, v + 12, s->redis_key, v) < 0)
		s->err = -EIO;
}

void seal_stream_feed(struct seal_stream *s, const void *data, size_t n)
{
	const uint8_t *p = data;
	const size_t body_end = s->len - SEAL_TAG_BYTES;

	if (s->off + n > s->len && !s->reason)
		s->reason = SEAL_TRUNCATED; /* longer than the caller said: nothing to trust */
	while (n && !s->reason && !s->err) {
		size_t take;

		if (s->off < SEAL_HEADER_BYTES) {
			take = n < SEAL_HEADER_BYTES - s->off ? n : SEAL_HEADER_BYTES - s->off;
			memcpy(s->header + s->off, p, take);
			if (s->off + take == SEAL_HEADER_BYTES)
				stream_header(s);
		} else if (s->off < body_end) {
			/* The identity, then the payload: decrypted as they come, into their places. */
			size_t body = s->off - SEAL_HEADER_BYTES;
			uint8_t *out;

			take = n < body_end - s->off ? n : body_end - s->off;
			if (body < s->idn) {
				if (take > s->idn - body)
					take = s->idn - body;
				out = s->ident + body;
			} else {
				out = s->dst + (body - s->idn);
				s->wrote = true;
			}
			if (cipher_update(s->ctx, out, p, take) < 0)
				s->err = -EIO;
		} else {
			take = n < s->len - s->off ? n : s->len - s->off;
			memcpy(s->tag + (s->off - body_end), p, take);
		}
		s->off += take;
		p += take;
		n -= take;
	}
}

int seal_stream_end(struct seal_stream *s, enum seal_reason *ret_reason)
{
	const uint8_t *q = s->ident;
	uint8_t fin[SEAL_TAG_BYTES];
	int outl;

	if (!s->reason && !s->err && s->off != s->len)
		s->reason = SEAL_TRUNCATED;
	if (!s->reason && !s->err) {
		if (EVP_CIPHER_CTX_ctrl(s->ctx, EVP_CTRL_GCM_SET_TAG, SEAL_TAG_BYTES, s->tag) <= 0)
			s->err = -EIO;
		else if (EVP_CipherFinal_ex(s->ctx, fin, &outl) <= 0)
			s->reason = SEAL_TAG;
	}
	/* Authentic: now is it the block the prompt asks for? */
	if (!s->reason && !s->err) {
		if (memcmp(q, s->id.hash, 16) || memcmp(q + 16, s->id.parent, 16) ||
		    s->ns_len != s->id.ns_len || (s->ns_len && memcmp(q + 32, s->id.ns, s->ns_len)))
			s->reason = SEAL_IDENTITY;
		q += 32 + s->ns_len;
		for (uint32_t i = 0; !s->reason && i < s->g.block_tokens; i++)
			if (get32(q + 4 * i) != s->id.tokens[i])
				s->reason = SEAL_TOKENS;
	}
	/*
	 * What was decrypted into dst is unauthenticated (a bad tag, a value cut short) or another
	 * block's (an authentic value for other tokens): nothing of it may reach a pool block.
	 */
	if ((s->reason || s->err) && s->wrote)
		memset(s->dst, 0, s->g.payload_bytes);
	free(s->ident);
	EVP_CIPHER_CTX_free(s->ctx);
	s->ident = NULL;
	s->ctx = NULL;
	*ret_reason = s->reason;
	return s->err ? s->err : s->reason ? -EBADMSG : 0;
}

int seal_open(const struct seal_keyring *k, const struct seal_geometry *g,
	      const struct seal_identity *id, const void *value, size_t len,
	      const char *redis_key, void *dst, enum seal_reason *ret_reason)
{
	struct seal_stream s;

	/* In place works: the header is copied, and the payload's bytes are read before written. */
	seal_stream_begin(&s, k, g, id, redis_key, len, dst);
	seal_stream_feed(&s, value, len);
	return seal_stream_end(&s, ret_reason);
}

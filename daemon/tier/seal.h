/* SPDX-License-Identifier: MIT */
/*
 * The remote tier's value: one self-describing, sealed (AES-256-GCM, OpenSSL EVP) record per
 * block, and the names and salts derived from the cluster key.  Anyone who can read the Redis
 * cluster learns nothing of prompts or K/V (token ids, hashes, namespace and payload are
 * encrypted; the Redis key is a keyed hash); anyone who can write to it can only cause misses:
 * seal_open verifies the tag, the geometry, the identity and every token before it says yes.
 *
 *   0      4  magic "KVPR"
 *   4      2  format version (1), little-endian like every integer here
 *   6      2  reserved, 0 (authenticated)
 *   8      4  key id (which key sealed it: the first 4 bytes of a hash of the key)
 *   12    12  nonce: 96 random bits from the OS (RAND_bytes) per value, never a counter
 *   24    32  geometry, in the clear but authenticated: layers, kv_heads, head_dim,
 *             elem_bytes, block_tokens, namespace length (u32 each), payload bytes (u64)
 *   56     .  encrypted: chain hash (16), parent hash (16), namespace, token ids (u32 each),
 *             the K/V payload
 *   end-16 16 GCM tag
 *
 * The AAD is the Redis key the value is stored under followed by bytes 0..55, so a value copied
 * under another key fails its tag.  Geometry is in the clear so that a reader of another
 * model's values is refused before any decryption of 2 MiB.
 *
 * Keys: a keyring of 32-byte keys, one of them current (seals); every one opens.  Subkeys come
 * from HKDF-SHA256: the AEAD key from each key, the naming and salt keys from the keyring's
 * *first* key only, so that adding a new current key (rotation) keeps every Redis key and root
 * salt: values sealed under the old key stay findable and readable.  Retiring the first key
 * moves the whole keyspace (a cold remote cache, by design of that step).
 *
 * Not thread-safe: a keyring is set up once, then used by one thread (or read-only: seal_seal
 * and seal_open do not modify it).  Functions return 0 or a negative errno.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SEAL_KEY_BYTES 32
#define SEAL_MAX_KEYS 8
#define SEAL_MAGIC "KVPR"
#define SEAL_VERSION 1
#define SEAL_HEADER_BYTES 56
#define SEAL_TAG_BYTES 16
#define SEAL_NONCE_BYTES 12
/* "kvp:" and 32 hex digits (128 bits of HMAC-SHA256), no terminating NUL counted. */
#define SEAL_REDIS_KEY_LEN 36
#define SEAL_MAX_NAMESPACE 255

struct seal_keyring;

/* What a block must be: the caller's expectation on open, the record's contents on seal. */
struct seal_geometry {
	uint32_t layers, kv_heads, head_dim, elem_bytes, block_tokens;
	uint64_t payload_bytes; /* the K/V bytes of one block */
};

struct seal_identity {
	uint8_t hash[16];   /* the block's chain hash */
	uint8_t parent[16]; /* its parent's (zero for a chain's first block) */
	const void *ns;     /* namespace name, ns_len bytes (at most SEAL_MAX_NAMESPACE) */
	size_t ns_len;
	const uint32_t *tokens; /* block_tokens token ids */
};

/* Why an open failed: the caller counts misses by these. */
enum seal_reason {
	SEAL_OK = 0,
	SEAL_TRUNCATED,      /* shorter than a header, or not the length its header says */
	SEAL_BAD_MAGIC,
	SEAL_BAD_VERSION,
	SEAL_UNKNOWN_KEY,    /* sealed under a key id the keyring does not have */
	SEAL_GEOMETRY,       /* another model's or another block size's value */
	SEAL_TAG,            /* altered, or stored under another Redis key, or a wrong key */
	SEAL_IDENTITY,       /* chain hash, parent or namespace not the expected */
	SEAL_TOKENS,         /* a token id differs */
	SEAL_NREASONS
};

const char *seal_reason_name(enum seal_reason r);

/* An empty keyring: 0 or -ENOMEM. */
int seal_keyring_new(struct seal_keyring **ret);
struct seal_keyring *seal_keyring_free(struct seal_keyring *k);

/*
 * Adds a key; the first added also names and salts (above).  current: it seals from now on.
 * ret_id (may be NULL): its key id.  0, -E2BIG (SEAL_MAX_KEYS), -EEXIST (the same key id
 * twice), -EIO (OpenSSL failed).
 */
int seal_keyring_add(struct seal_keyring *k, const uint8_t key[SEAL_KEY_BYTES], int current,
		     uint32_t *ret_id);

/*
 * Reads a key file: exactly 32 raw bytes (head -c 32 /dev/urandom), a regular file not
 * readable or writable by group or others, not a symbolic link.  On failure err (errlen bytes)
 * says why, naming the file: -ENOENT and the like from open, -EPERM (mode or owner), -EINVAL
 * (not a regular file, or not 32 bytes).  key is untouched on failure.
 */
int seal_key_load(const char *path, uint8_t key[SEAL_KEY_BYTES], char *err, size_t errlen);

/*
 * Reads at most cap bytes of a secret file (*len: how many) under seal_key_load's rules: a
 * regular file, not a symbolic link, owned by this user or root, no access for group or
 * others.  0, or -errno with err saying why, naming the file.
 */
int seal_secret_read(const char *path, uint8_t *buf, size_t cap, size_t *len, char *err,
		     size_t errlen);

/* The sealed length of a value of geometry g and namespace length ns_len. */
size_t seal_size(const struct seal_geometry *g, size_t ns_len);

/*
 * The Redis key of a block: "kvp:" + hex(HMAC-SHA256(naming key, len(ns) || ns || hash))[0:32],
 * written to out (SEAL_REDIS_KEY_LEN bytes and a NUL).  0, -EINVAL (no key), -EIO.
 */
int seal_redis_key(const struct seal_keyring *k, const void *ns, size_t ns_len,
		   const uint8_t hash[16], char out[SEAL_REDIS_KEY_LEN + 1]);

/*
 * The root salt of a named namespace: HMAC-SHA256(salt key, "root-salt" || ns), first 8 bytes.
 * Deterministic: two daemons with the same key and namespace name compute the same.
 */
int seal_root_salt(const struct seal_keyring *k, const void *ns, size_t ns_len, uint64_t *ret);

/*
 * Seals a block into out (seal_size bytes) under the current key, with redis_key (the key it
 * will be stored under) in the AAD.  The payload is encrypted straight from payload into out:
 * no other copy.  0, -EINVAL (no current key, bad geometry or namespace), -EIO (OpenSSL).
 */
int seal_seal(const struct seal_keyring *k, const struct seal_geometry *g,
	      const struct seal_identity *id, const void *payload, const char *redis_key,
	      void *out);

/*
 * Opens a value fetched from redis_key, expecting geometry g and identity id (its tokens
 * included), decrypting the payload straight into dst (g->payload_bytes).  dst may be the
 * payload's own place in value (value + len - 16 - payload_bytes: in place), no other overlap.
 * 0 with *ret_reason SEAL_OK; -EBADMSG with *ret_reason saying why; -ENOMEM, -EIO (OpenSSL).
 * On any failure dst is untouched or zeroed: nothing unauthenticated, nor another block's
 * bytes, is left there.
 */
int seal_open(const struct seal_keyring *k, const struct seal_geometry *g,
	      const struct seal_identity *id, const void *value, size_t len,
	      const char *redis_key, void *dst, enum seal_reason *ret_reason);

/*
 * seal_open in pieces, as a value arrives from the network, so that it never lies whole in
 * memory and its decryption overlaps its receipt: begin with the value's length (from the
 * reply's header), feed every byte in order in pieces of any size, end.  The checks are
 * seal_open's, in the same order (the header's as soon as it is in, before anything is
 * decrypted; the tag, identity and tokens at the end); a value cut short fails SEAL_TRUNCATED.
 * id, its namespace and tokens, redis_key and dst must live until the end.  end must be
 * called once for every begin (it frees what the stream holds); it returns what seal_open
 * would, and on any failure dst is untouched or zeroed.
 */
struct seal_stream {
	/* Private. */
	const struct seal_keyring *k;
	struct seal_geometry g;
	struct seal_identity id;
	const char *redis_key;
	size_t len, off, ns_len, idn;
	uint8_t *dst, *ident;
	void *ctx;
	uint8_t header[SEAL_HEADER_BYTES], tag[SEAL_TAG_BYTES];
	enum seal_reason reason;
	int err;
	bool wrote;
};

void seal_stream_begin(struct seal_stream *s, const struct seal_keyring *k,
		       const struct seal_geometry *g, const struct seal_identity *id,
		       const char *redis_key, size_t len, void *dst);
void seal_stream_feed(struct seal_stream *s, const void *data, size_t n);
int seal_stream_end(struct seal_stream *s, enum seal_reason *ret_reason);

/* SPDX-License-Identifier: MIT */
/*
 * The remote tier's sealed values: round trips (in place too), every region of a value altered
 * gives its reason and never success, a value under another Redis key or from another keyring
 * fails, old keys open and unknown ones are refused, names and salts are deterministic and
 * survive rotation, a value opened in pieces of any size (seal_stream) is opened exactly as
 * whole, cut short it opens to nothing, and key files that are not safely a key are refused with the file's name.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/tier/seal.h"
#include "tests/check-runner.h"

#define TOKENS 16
#define PAYLOAD (64 * 1024 + 12)

static const struct seal_geometry geo = {
	.layers = 32, .kv_heads = 8, .head_dim = 128, .elem_bytes = 2,
	.block_tokens = TOKENS, .payload_bytes = PAYLOAD,
};

static uint32_t tokens[TOKENS];
static uint8_t *payload, *value, *out;
static struct seal_identity ident;
static struct seal_keyring *ring;
static char rkey[SEAL_REDIS_KEY_LEN + 1];
static size_t vlen;

static void key_of(uint8_t key[SEAL_KEY_BYTES], uint8_t seed)
{
	for (int i = 0; i < SEAL_KEY_BYTES; i++)
		key[i] = (uint8_t)(seed * 31 + i * 7 + 1);
}

static void setup(void)
{
	uint8_t key[SEAL_KEY_BYTES];

	for (int i = 0; i < TOKENS; i++)
		tokens[i] = 1000 + (uint32_t)i * 17;
	payload = malloc(PAYLOAD);
	out = malloc(PAYLOAD);
	ck_assert_ptr_nonnull(payload);
	for (size_t i = 0; i < PAYLOAD; i++)
		payload[i] = (uint8_t)(i * 131 + (i >> 8));
	memset(&ident, 0, sizeof(ident));
	for (int i = 0; i < 16; i++) {
		ident.hash[i] = (uint8_t)(0xa0 + i);
		ident.parent[i] = (uint8_t)(0x10 + i);
	}
	ident.ns = "tenant-a";
	ident.ns_len = 8;
	ident.tokens = tokens;
	ck_assert_int_eq(seal_keyring_new(&ring), 0);
	key_of(key, 1);
	ck_assert_int_eq(seal_keyring_add(ring, key, 1, NULL), 0);
	ck_assert_int_eq(seal_redis_key(ring, ident.ns, ident.ns_len, ident.hash, rkey), 0);
	vlen = seal_size(&geo, ident.ns_len);
	value = malloc(vlen);
	ck_assert_int_eq(seal_seal(ring, &geo, &ident, payload, rkey, value), 0);
}

static void teardown(void)
{
	free(payload);
	free(out);
	free(value);
	ring = seal_keyring_free(ring);
}

/*
 * An open's result (r, why) as open_reason and stream_reason return it, checked: 0 exactly when
 * SEAL_OK, and a refused value leaves nothing of what it decrypted in out: untouched (the 0xa5
 * it was filled with), or wiped.
 */
static enum seal_reason checked(int r, enum seal_reason why)
{
	ck_assert(r == 0 || r == -EBADMSG);
	ck_assert_int_eq(r == 0, why == SEAL_OK);
	if (r < 0)
		for (size_t i = 0; i < PAYLOAD; i++)
			ck_assert_msg(out[i] == 0xa5 || out[i] == 0, "%s: byte %zu of dst is %#x",
				      seal_reason_name(why), i, out[i]);
	return why;
}

/* Opens value (len bytes) as the block ident, returning the reason (SEAL_OK on success). */
static enum seal_reason open_reason(const uint8_t *v, size_t len, const char *key)
{
	enum seal_reason why = SEAL_NREASONS;
	int r;

	memset(out, 0xa5, PAYLOAD);
	r = seal_open(ring, &geo, &ident, v, len, key, out, &why);
	return checked(r, why);
}

START_TEST(round_trip)
{
	ck_assert_uint_eq(vlen, SEAL_HEADER_BYTES + 32 + 8 + 4 * TOKENS + PAYLOAD + 16);
	ck_assert_mem_eq(value, "KVPR", 4);
	ck_assert_int_eq(open_reason(value, vlen, rkey), SEAL_OK);
	ck_assert_mem_eq(out, payload, PAYLOAD);
	/* Nothing of the payload or the tokens in the clear. */
	ck_assert(memmem(value, vlen, payload + 1000, 32) == NULL);
	ck_assert(memmem(value, vlen, "tenant-a", 8) == NULL);
	ck_assert(memmem(value, vlen, tokens, sizeof(tokens)) == NULL);
}
END_TEST

START_TEST(in_place)
{
	uint8_t *at = value + vlen - SEAL_TAG_BYTES - PAYLOAD;
	enum seal_reason why;

	ck_assert_int_eq(seal_open(ring, &geo, &ident, value, vlen, rkey, at, &why), 0);
	ck_assert_mem_eq(at, payload, PAYLOAD);
}
END_TEST

START_TEST(nonce_per_value)
{
	uint8_t *again = malloc(vlen);

	ck_assert_int_eq(seal_seal(ring, &geo, &ident, payload, rkey, again), 0);
	/* Same block, same key: a fresh nonce, so another ciphertext. */
	ck_assert(memcmp(again + 12, value + 12, SEAL_NONCE_BYTES) != 0);
	ck_assert(memcmp(again + SEAL_HEADER_BYTES, value + SEAL_HEADER_BYTES, 64) != 0);
	free(again);
}
END_TEST

/* Each region of the value, one byte flipped, and the reason it must give. */
static const struct {
	const char *what;
	long off; /* from the start; negative: from the end */
	enum seal_reason why;
} tampers[] = {
	{ "magic", 0, SEAL_BAD_MAGIC },
	{ "version", 4, SEAL_BAD_VERSION },
	{ "reserved", 6, SEAL_TAG },
	{ "key id", 9, SEAL_UNKNOWN_KEY },
	{ "nonce", 12 + 5, SEAL_TAG },
	{ "layers", 24, SEAL_GEOMETRY },
	{ "block_tokens", 40, SEAL_GEOMETRY },
	{ "namespace length", 44, SEAL_TRUNCATED },
	{ "payload bytes", 48, SEAL_GEOMETRY },
	{ "chain hash", SEAL_HEADER_BYTES + 3, SEAL_TAG },
	{ "parent hash", SEAL_HEADER_BYTES + 16 + 3, SEAL_TAG },
	{ "namespace", SEAL_HEADER_BYTES + 32 + 2, SEAL_TAG },
	{ "token", SEAL_HEADER_BYTES + 40 + 4 * 5 + 1, SEAL_TAG },
	{ "payload first", SEAL_HEADER_BYTES + 40 + 4 * TOKENS, SEAL_TAG },
	{ "payload middle", SEAL_HEADER_BYTES + 40 + 4 * TOKENS + PAYLOAD / 2, SEAL_TAG },
	{ "payload last", -SEAL_TAG_BYTES - 1, SEAL_TAG },
	{ "tag", -3, SEAL_TAG },
};

START_TEST(tamper)
{
	size_t off = tampers[_i].off >= 0 ? (size_t)tampers[_i].off
					   : vlen - (size_t)-tampers[_i].off;
	enum seal_reason why;

	value[off] ^= 0x40;
	why = open_reason(value, vlen, rkey);
	ck_assert_msg(why == tampers[_i].why, "%s: %s, expected %s", tampers[_i].what,
		      seal_reason_name(why), seal_reason_name(tampers[_i].why));
}
END_TEST

/*
 * Opens value as the block ident in pieces (seal_stream): pieces of 1 to maxpiece bytes from
 * seed, so that their ends fall inside the header, the identity, the payload and the tag;
 * the first cut bytes only when cut is not 0 (a value cut short).  The reason, checked.
 */
static enum seal_reason stream_reason(const uint8_t *v, size_t len, unsigned seed,
				      size_t maxpiece, size_t cut)
{
	enum seal_reason why = SEAL_NREASONS;
	struct seal_stream st;
	size_t off = 0, end = cut ? cut : len;
	int r;

	memset(out, 0xa5, PAYLOAD);
	seal_stream_begin(&st, ring, &geo, &ident, rkey, len, out);
	while (off < end) {
		size_t n = 1 + (size_t)rand_r(&seed) % maxpiece;

		if (n > end - off)
			n = end - off;
		seal_stream_feed(&st, v + off, n);
		off += n;
	}
	r = seal_stream_end(&st, &why);
	return checked(r, why);
}

START_TEST(streamed)
{
	static const size_t pieces[] = { 1, 7, 61, 4096, 70000 };

	for (size_t k = 0; k < sizeof(pieces) / sizeof(pieces[0]); k++)
		for (unsigned seed = 1; seed <= 3; seed++) {
			ck_assert_int_eq(stream_reason(value, vlen, seed, pieces[k], 0), SEAL_OK);
			ck_assert_mem_eq(out, payload, PAYLOAD);
		}
}
END_TEST

/* Every altered region gives seal_open's reason, in pieces too. */
START_TEST(streamed_tamper)
{
	size_t off = tampers[_i].off >= 0 ? (size_t)tampers[_i].off
					   : vlen - (size_t)-tampers[_i].off;
	enum seal_reason why;

	value[off] ^= 0x40;
	why = stream_reason(value, vlen, 7, 997, 0);
	ck_assert_msg(why == tampers[_i].why, "%s: %s, expected %s", tampers[_i].what,
		      seal_reason_name(why), seal_reason_name(tampers[_i].why));
}
END_TEST

/* A value cut short anywhere (the connection lost, a deadline mid-value) opens to nothing. */
START_TEST(streamed_cut)
{
	const size_t cuts[] = { 1, SEAL_HEADER_BYTES - 1, SEAL_HEADER_BYTES, SEAL_HEADER_BYTES + 50,
				vlen / 2, vlen - SEAL_TAG_BYTES, vlen - 1 };

	for (size_t k = 0; k < sizeof(cuts) / sizeof(cuts[0]); k++)
		ck_assert_int_eq(stream_reason(value, vlen, 3, 5000, cuts[k]), SEAL_TRUNCATED);
	/* More bytes than the length it was begun with: refused too. */
	{
		enum seal_reason why;
		struct seal_stream st;

		seal_stream_begin(&st, ring, &geo, &ident, rkey, vlen - 1, out);
		seal_stream_feed(&st, value, vlen);
		ck_assert_int_eq(seal_stream_end(&st, &why), -EBADMSG);
		ck_assert_int_eq(why, SEAL_TRUNCATED);
	}
}
END_TEST

START_TEST(truncated)
{
	ck_assert_int_eq(open_reason(value, 10, rkey), SEAL_TRUNCATED);
	ck_assert_int_eq(open_reason(value, vlen - 1, rkey), SEAL_TRUNCATED);
	ck_assert_int_eq(open_reason(value, SEAL_HEADER_BYTES + SEAL_TAG_BYTES, rkey),
			 SEAL_TRUNCATED);
}
END_TEST

START_TEST(other_redis_key)
{
	uint8_t other[16];
	char okey[SEAL_REDIS_KEY_LEN + 1];

	memcpy(other, ident.hash, 16);
	other[0] ^= 1;
	ck_assert_int_eq(seal_redis_key(ring, ident.ns, ident.ns_len, other, okey), 0);
	ck_assert_str_ne(okey, rkey);
	/* The value copied under another block's key: its tag no longer holds. */
	ck_assert_int_eq(open_reason(value, vlen, okey), SEAL_TAG);
}
END_TEST

START_TEST(expectations)
{
	/* An authentic value that is not the block the prompt asks for. */
	tokens[7]++;
	ck_assert_int_eq(open_reason(value, vlen, rkey), SEAL_TOKENS);
	tokens[7]--;
	ident.parent[15] ^= 1;
	ck_assert_int_eq(open_reason(value, vlen, rkey), SEAL_IDENTITY);
	ident.parent[15] ^= 1;
	ident.ns = "tenant-b";
	ck_assert_int_eq(open_reason(value, vlen, rkey), SEAL_IDENTITY);
	ident.ns = "tenant-a";
	ck_assert_int_eq(open_reason(value, vlen, rkey), SEAL_OK);

	struct seal_geometry g = geo;
	enum seal_reason why;

	g.head_dim = 64;
	ck_assert_int_eq(seal_open(ring, &g, &ident, value, vlen, rkey, out, &why), -EBADMSG);
	ck_assert_int_eq(why, SEAL_GEOMETRY);
}
END_TEST

START_TEST(rotation)
{
	struct seal_keyring *newer, *stranger;
	uint8_t k1[SEAL_KEY_BYTES], k2[SEAL_KEY_BYTES];
	char rkey2[SEAL_REDIS_KEY_LEN + 1];
	uint32_t id1, id2;
	uint64_t s1, s2;
	uint8_t *v2 = malloc(vlen);
	enum seal_reason why;

	key_of(k1, 1);
	key_of(k2, 2);
	/* The old key first (it names), the new one current. */
	ck_assert_int_eq(seal_keyring_new(&newer), 0);
	ck_assert_int_eq(seal_keyring_add(newer, k1, 0, &id1), 0);
	ck_assert_int_eq(seal_keyring_add(newer, k2, 1, &id2), 0);
	ck_assert_uint_ne(id1, id2);
	ck_assert_int_eq(seal_keyring_add(newer, k2, 0, NULL), -EEXIST);
	ck_assert_int_eq(seal_redis_key(newer, ident.ns, ident.ns_len, ident.hash, rkey2), 0);
	ck_assert_str_eq(rkey2, rkey);
	ck_assert_int_eq(seal_root_salt(ring, "shared", 6, &s1), 0);
	ck_assert_int_eq(seal_root_salt(newer, "shared", 6, &s2), 0);
	ck_assert_uint_eq(s1, s2);
	ck_assert_int_eq(seal_root_salt(newer, "other", 5, &s2), 0);
	ck_assert_uint_ne(s1, s2);

	/* What the old ring sealed, the new one opens. */
	ck_assert_int_eq(seal_open(newer, &geo, &ident, value, vlen, rkey, out, &why), 0);
	ck_assert_mem_eq(out, payload, PAYLOAD);
	/* What the new one seals carries the new key id; the old ring does not know it. */
	ck_assert_int_eq(seal_seal(newer, &geo, &ident, payload, rkey, v2), 0);
	ck_assert_int_eq(v2[8] | v2[9] << 8 | v2[10] << 16 | (uint32_t)v2[11] << 24, id2);
	ck_assert_int_eq(open_reason(v2, vlen, rkey), SEAL_UNKNOWN_KEY);
	ck_assert_int_eq(seal_open(newer, &geo, &ident, v2, vlen, rkey, out, &why), 0);

	/* Another cluster's key: other names, other salts, and its values do not open. */
	ck_assert_int_eq(seal_keyring_new(&stranger), 0);
	ck_assert_int_eq(seal_keyring_add(stranger, k2, 1, NULL), 0);
	ck_assert_int_eq(seal_redis_key(stranger, ident.ns, ident.ns_len, ident.hash, rkey2), 0);
	ck_assert_str_ne(rkey2, rkey);
	ck_assert_int_eq(seal_root_salt(stranger, "shared", 6, &s2), 0);
	ck_assert_uint_ne(s1, s2);
	ck_assert_int_eq(seal_open(stranger, &geo, &ident, value, vlen, rkey, out, &why), -EBADMSG);
	ck_assert_int_eq(why, SEAL_UNKNOWN_KEY);
	/* A forged key id cannot help: the tag is the AEAD key's. */
	memcpy(value + 8, v2 + 8, 4);
	ck_assert_int_eq(seal_open(stranger, &geo, &ident, value, vlen, rkey, out, &why), -EBADMSG);
	ck_assert_int_eq(why, SEAL_TAG);

	/* A ring with no current key opens but never seals. */
	struct seal_keyring *reader;

	ck_assert_int_eq(seal_keyring_new(&reader), 0);
	ck_assert_int_eq(seal_keyring_add(reader, k1, 0, NULL), 0);
	ck_assert_int_eq(seal_seal(reader, &geo, &ident, payload, rkey, v2), -EINVAL);
	seal_keyring_free(reader);
	seal_keyring_free(stranger);
	seal_keyring_free(newer);
	free(v2);
}
END_TEST

static char dir[] = "/tmp/test-seal-XXXXXX";

static void write_file(const char *path, const void *data, size_t n, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, data, n), (ssize_t)n);
	ck_assert_int_eq(fchmod(fd, mode), 0);
	close(fd);
}

START_TEST(key_files)
{
	uint8_t key[SEAL_KEY_BYTES], got[SEAL_KEY_BYTES], big[SEAL_KEY_BYTES + 1];
	char path[128], link[160], err[256];

	ck_assert_ptr_nonnull(mkdtemp(dir));
	key_of(key, 9);
	snprintf(path, sizeof(path), "%s/remote.key", dir);

	ck_assert_int_eq(seal_key_load(path, got, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, path));

	write_file(path, key, SEAL_KEY_BYTES, 0600);
	ck_assert_int_eq(seal_key_load(path, got, err, sizeof(err)), 0);
	ck_assert_mem_eq(got, key, SEAL_KEY_BYTES);

	memset(got, 0x55, sizeof(got));
	write_file(path, key, SEAL_KEY_BYTES - 1, 0600);
	ck_assert_int_eq(seal_key_load(path, got, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, path));
	ck_assert_ptr_nonnull(strstr(err, "shorter"));
	ck_assert_uint_eq(got[0], 0x55); /* untouched on failure */

	memcpy(big, key, SEAL_KEY_BYTES);
	big[SEAL_KEY_BYTES] = '\n';
	write_file(path, big, sizeof(big), 0600);
	ck_assert_int_eq(seal_key_load(path, got, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "longer"));

	write_file(path, key, SEAL_KEY_BYTES, 0640);
	ck_assert_int_eq(seal_key_load(path, got, err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, path));
	ck_assert_ptr_nonnull(strstr(err, "0640"));
	write_file(path, key, SEAL_KEY_BYTES, 0604);
	ck_assert_int_eq(seal_key_load(path, got, err, sizeof(err)), -EPERM);

	write_file(path, key, SEAL_KEY_BYTES, 0600);
	snprintf(link, sizeof(link), "%s/link.key", dir);
	ck_assert_int_eq(symlink(path, link), 0);
	ck_assert_int_eq(seal_key_load(link, got, err, sizeof(err)), -ELOOP);
	ck_assert_ptr_nonnull(strstr(err, "symbolic link"));
	ck_assert_int_eq(seal_key_load(dir, got, err, sizeof(err)), -EINVAL); /* a directory */

	unlink(link);
	unlink(path);
	rmdir(dir);
}
END_TEST

static Suite *seal_suite(void)
{
	Suite *s = suite_create("seal");
	TCase *tc = tcase_create("seal");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, round_trip);
	tcase_add_test(tc, in_place);
	tcase_add_test(tc, nonce_per_value);
	tcase_add_loop_test(tc, tamper, 0, sizeof(tampers) / sizeof(tampers[0]));
	tcase_add_test(tc, truncated);
	tcase_add_test(tc, streamed);
	tcase_add_loop_test(tc, streamed_tamper, 0, sizeof(tampers) / sizeof(tampers[0]));
	tcase_add_test(tc, streamed_cut);
	tcase_add_test(tc, other_redis_key);
	tcase_add_test(tc, expectations);
	tcase_add_test(tc, rotation);
	tcase_add_test(tc, key_files);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return run_suite(seal_suite());
}

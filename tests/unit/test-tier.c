/* SPDX-License-Identifier: MIT */
/*
 * The storage tiers on real memory and real files: round trips, loads of writes still in
 * flight, corruption found by the checksums, persistence across reopen, swap files that are not
 * safely the daemon's own refused, and a file system that refuses writes (RLIMIT_FSIZE)
 * reported through the lost callback.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/tier/tier.h"
#include "tests/check-runner.h"
#include "tests/slot-forge.h"

#define TOKENS 16
#define MAX_SLOTS 256
/* Not a multiple of 4096, so the data region's padding is exercised. */
#define BLOCK_BYTES (3 * 4096 + 100)
#define GEOMETRY UINT64_C(0x7b0000000000a1)

static uint64_t mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Block `id`: a key derived from id, its tokens and its bytes (version changes the bytes). */
struct block {
	struct tier_key key;
	uint32_t tokens[TOKENS];
};

static void make_block(struct block *b, uint32_t id)
{
	for (uint32_t i = 0; i < TOKENS; i++)
		b->tokens[i] = (uint32_t)(mix(id * 131 + i) % 32000);
	b->key = (struct tier_key){
		.hash_lo = mix(id),
		.hash_hi = mix(id + 1000000),
		.parent_lo = id ? mix(id - 1) : 0,
		.parent_hi = id ? mix(id - 1 + 1000000) : 0,
		.salt = 42,
		.extra = id % 3,
		.tokens = b->tokens,
	};
}

static void fill_data(uint8_t *d, size_t n, uint32_t id, uint32_t version)
{
	uint64_t seed = mix(((uint64_t)id << 32) | version);

	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = mix(seed + i);

		memcpy(d + i, &v, n - i < 8 ? n - i : 8);
	}
}

/* No Check asserts here: these also run in forked children, where Check must not be used. */
static uint8_t *data_of(uint32_t id, uint32_t version, size_t n)
{
	uint8_t *d = malloc(n);

	if (!d)
		abort();
	fill_data(d, n, id, version);
	return d;
}

/* ---- host tier ---------------------------------------------------------------------------- */

START_TEST(test_host_round_trip)
{
	enum { SLOTS = 8, BYTES = 4096 + 17 };
	struct host_tier *t = NULL;
	struct block b[SLOTS];
	uint8_t src[BYTES], dst[BYTES], junk[BYTES];
	struct tier_key k;

	ck_assert_int_eq(host_tier_new(0, BYTES, TOKENS, NULL, &t), -EINVAL);
	ck_assert_int_eq(host_tier_new(SLOTS, BYTES, TOKENS, NULL, &t), 0);

	/* A slot never stored matches nothing, not even an all-zero key. */
	{
		uint32_t zeros[TOKENS] = { 0 };
		struct tier_key zero = { .tokens = zeros };

		ck_assert_int_eq(host_tier_load(t, 3, &zero, dst), -EBADMSG);
	}
	for (uint32_t i = 0; i < SLOTS; i++) {
		make_block(&b[i], i);
		fill_data(src, BYTES, i, 0);
		host_tier_store(t, i, &b[i].key, src);
	}
	for (uint32_t i = 0; i < SLOTS; i++) {
		fill_data(src, BYTES, i, 0);
		memset(dst, 0, BYTES);
		ck_assert_int_eq(host_tier_load(t, i, &b[i].key, dst), 0);
		ck_assert_mem_eq(dst, src, BYTES);
		ck_assert_mem_eq(host_tier_data(t, i), src, BYTES);
		host_tier_key(t, i, &k);
		ck_assert_uint_eq(k.hash_lo, b[i].key.hash_lo);
		ck_assert_uint_eq(k.hash_hi, b[i].key.hash_hi);
		ck_assert_uint_eq(k.parent_lo, b[i].key.parent_lo);
		ck_assert_uint_eq(k.parent_hi, b[i].key.parent_hi);
		ck_assert_uint_eq(k.salt, b[i].key.salt);
		ck_assert_uint_eq(k.extra, b[i].key.extra);
		ck_assert_mem_eq(k.tokens, b[i].tokens, sizeof(b[i].tokens));
	}

	/* Each field of the identity is checked; a refused load leaves dst alone. */
	memset(junk, 0xa5, BYTES);
	for (int field = 0; field < 7; field++) {
		struct block w = b[5];

		w.key.tokens = w.tokens;
		switch (field) {
		case 0: w.key.hash_lo ^= 1; break;
		case 1: w.key.hash_hi ^= 1; break;
		case 2: w.key.parent_lo ^= 1; break;
		case 3: w.key.parent_hi ^= 1; break;
		case 4: w.key.salt ^= 1; break;
		case 5: w.key.extra ^= 1; break;
		case 6: w.tokens[TOKENS - 1] ^= 1; break;
		}
		memcpy(dst, junk, BYTES);
		ck_assert_int_eq(host_tier_load(t, 5, &w.key, dst), -EBADMSG);
		ck_assert_mem_eq(dst, junk, BYTES);
	}
	/* Another block's key in this slot. */
	ck_assert_int_eq(host_tier_load(t, 5, &b[4].key, dst), -EBADMSG);

	/* Overwritten: the new identity and bytes, the old key refused. */
	{
		struct block nb;

		make_block(&nb, 100);
		fill_data(src, BYTES, 100, 1);
		host_tier_store(t, 5, &nb.key, src);
		ck_assert_int_eq(host_tier_load(t, 5, &b[5].key, dst), -EBADMSG);
		ck_assert_int_eq(host_tier_load(t, 5, &nb.key, dst), 0);
		ck_assert_mem_eq(dst, src, BYTES);
	}
	ck_assert_ptr_null(host_tier_free(t));
	ck_assert_ptr_null(host_tier_free(NULL));
}
END_TEST

/* An arena from elsewhere (a backend's pinned memory in the daemon): counted, and checked. */
struct test_arena {
	int allocs, frees, fail;
	void *mem;
	uint64_t bytes;
};

static int test_arena_alloc(void *ctx, uint64_t bytes, void **ret)
{
	struct test_arena *a = ctx;

	if (a->fail)
		return a->fail;
	a->allocs++;
	a->bytes = bytes;
	a->mem = malloc(bytes);
	if (!a->mem)
		return -ENOMEM;
	/* Whatever the memory held, a new tier must not find it. */
	memset(a->mem, 0x5a, bytes);
	*ret = a->mem;
	return 0;
}

static void test_arena_free(void *ctx, void *mem, uint64_t bytes)
{
	struct test_arena *a = ctx;

	ck_assert_ptr_eq(mem, a->mem);
	ck_assert_uint_eq(bytes, a->bytes);
	a->frees++;
	free(mem);
}

/*
 * The two-step store and the lookup that moves to and from a device use, on an arena given by
 * the caller: the bytes written into a slot come back through lookup under its key only, and
 * a slot being written matches no key, not even the one it held before.
 */
START_TEST(test_host_arena_and_slot_access)
{
	enum { SLOTS = 6, BYTES = 1000 };
	struct test_arena a = { 0 };
	const struct host_tier_arena arena = { test_arena_alloc, test_arena_free, &a };
	const struct host_tier_arena half = { test_arena_alloc, NULL, &a };
	struct host_tier *t = NULL;
	struct block b[SLOTS], nb;
	uint8_t src[BYTES], dst[BYTES];
	const uint8_t *at;
	uint8_t *w;

	ck_assert_int_eq(host_tier_new(SLOTS, BYTES, TOKENS, &half, &t), -EINVAL);
	a.fail = -ENOSPC;
	ck_assert_int_eq(host_tier_new(SLOTS, BYTES, TOKENS, &arena, &t), -ENOSPC);
	ck_assert_ptr_null(t);
	a.fail = 0;
	ck_assert_int_eq(host_tier_new(SLOTS, BYTES, TOKENS, &arena, &t), 0);
	ck_assert_int_eq(a.allocs, 1);
	ck_assert_uint_eq(a.bytes, (uint64_t)SLOTS * BYTES);

	for (uint32_t i = 0; i < SLOTS; i++) {
		make_block(&b[i], i);
		ck_assert_ptr_null(host_tier_lookup(t, i, &b[i].key));
		w = host_tier_slot_for_write(t, i);
		/* The slot is the arena's, in order: a device writes it in place. */
		ck_assert_ptr_eq(w, (uint8_t *)a.mem + (size_t)i * BYTES);
		fill_data(w, BYTES, i, 0);
		ck_assert_ptr_null(host_tier_lookup(t, i, &b[i].key)); /* not committed yet */
		host_tier_commit(t, i, &b[i].key);
	}
	for (uint32_t i = 0; i < SLOTS; i++) {
		fill_data(src, BYTES, i, 0);
		at = host_tier_lookup(t, i, &b[i].key);
		ck_assert_ptr_eq(at, host_tier_data(t, i));
		ck_assert_mem_eq(at, src, BYTES);
		ck_assert_ptr_null(host_tier_lookup(t, i, &b[(i + 1) % SLOTS].key));
		ck_assert_int_eq(host_tier_load(t, i, &b[i].key, dst), 0);
		ck_assert_mem_eq(dst, src, BYTES);
	}

	/* Rewriting a slot forgets its block at once: a failed write leaves no stale hit. */
	host_tier_slot_for_write(t, 2);
	ck_assert_ptr_null(host_tier_lookup(t, 2, &b[2].key));
	ck_assert_int_eq(host_tier_load(t, 2, &b[2].key, dst), -EBADMSG);
	/* And host_tier_store() into an arena slot is the same as a written and committed one. */
	make_block(&nb, 77);
	fill_data(src, BYTES, 77, 3);
	host_tier_store(t, 2, &nb.key, src);
	ck_assert_mem_eq(host_tier_lookup(t, 2, &nb.key), src, BYTES);
	ck_assert_ptr_nonnull(host_tier_lookup(t, 3, &b[3].key));

	ck_assert_ptr_null(host_tier_free(t));
	ck_assert_int_eq(a.frees, 1);
}
END_TEST

/* ---- file tier helpers -------------------------------------------------------------------- */

struct dir {
	char path[64];
	char files[2][96];
	const char *paths[2];
};

static void dir_make(struct dir *d, const char *base)
{
	snprintf(d->path, sizeof(d->path), "%s/kvpaged-tier.XXXXXX", base);
	ck_assert_ptr_nonnull(mkdtemp(d->path));
	for (int i = 0; i < 2; i++) {
		snprintf(d->files[i], sizeof(d->files[i]), "%s/swap%d", d->path, i);
		d->paths[i] = d->files[i];
	}
}

/* The key of the checksums with persist: beside the first swap file. */
static void key_path(const struct dir *d, char *path, size_t len)
{
	snprintf(path, len, "%s.key", d->files[0]);
}

static void dir_remove(struct dir *d)
{
	char key[128];

	for (int i = 0; i < 2; i++)
		unlink(d->files[i]);
	key_path(d, key, sizeof(key));
	unlink(key);
	ck_assert_int_eq(rmdir(d->path), 0);
}

struct lost_log {
	uint32_t count;
	bool slot[MAX_SLOTS];
	int last_err;
};

static void on_lost(void *ctx, uint32_t slot, int err)
{
	struct lost_log *l = ctx;

	if (slot >= MAX_SLOTS)
		abort(); /* may run in a forked child: no Check there */
	l->count++;
	l->slot[slot] = true;
	l->last_err = err;
}

static struct file_tier_config config(struct dir *d, uint32_t npaths, uint32_t nslots,
				      uint32_t queue_depth, bool persist, struct lost_log *lost)
{
	return (struct file_tier_config){
		.paths = d->paths,
		.npaths = npaths,
		.nslots = nslots,
		.block_bytes = BLOCK_BYTES,
		.block_tokens = TOKENS,
		.geometry = GEOMETRY,
		.persist = persist,
		.queue_depth = queue_depth,
		.lost = on_lost,
		.lost_ctx = lost,
	};
}

static struct file_tier *open_tier(const struct file_tier_config *cfg)
{
	struct file_tier *t = NULL;

	ck_assert_int_eq(file_tier_open(cfg, &t), 0);
	ck_assert_ptr_nonnull(t);
	return t;
}

static int store_raw(struct file_tier *t, uint32_t slot, uint32_t id, uint32_t version)
{
	struct block b;
	uint8_t *d = data_of(id, version, BLOCK_BYTES);
	int r;

	make_block(&b, id);
	r = file_tier_store(t, slot, &b.key, d);
	free(d);
	return r;
}

static void store_block(struct file_tier *t, uint32_t slot, uint32_t id, uint32_t version)
{
	ck_assert_int_eq(store_raw(t, slot, id, version), 0);
}

/*
 * Loads one slot expecting block id: its result, or 1000 when the bytes are wrong (a success
 * with other bytes, or dst touched by a failure: nothing unverified may reach it).
 */
static int load_raw(struct file_tier *t, uint32_t slot, uint32_t id, uint32_t version)
{
	struct block b;
	uint8_t *want = data_of(id, version, BLOCK_BYTES), *dst = data_of(0, 0, BLOCK_BYTES);
	void *dsts[1] = { dst };
	int result = 1;

	make_block(&b, id);
	memset(dst, 0x5a, BLOCK_BYTES);
	file_tier_load(t, 1, &slot, &b.key, dsts, &result);
	if (result == 0 && memcmp(dst, want, BLOCK_BYTES))
		result = 1000;
	for (size_t i = 0; result < 0 && i < BLOCK_BYTES; i++)
		if (dst[i] != 0x5a)
			result = 1000;
	free(want);
	free(dst);
	return result;
}

static int load_block(struct file_tier *t, uint32_t slot, uint32_t id, uint32_t version)
{
	int r = load_raw(t, slot, id, version);

	ck_assert_msg(r != 1000, "slot %u: wrong bytes", slot);
	return r;
}

/* Loads n slots (block id = slot + id_base) in one batch and checks every byte. */
static void load_all(struct file_tier *t, uint32_t n, uint32_t id_base, uint32_t version)
{
	struct block *b = calloc(n, sizeof(*b));
	struct tier_key *keys = calloc(n, sizeof(*keys));
	uint32_t *slots = calloc(n, sizeof(*slots));
	void **dsts = calloc(n, sizeof(*dsts));
	int *results = calloc(n, sizeof(*results));
	uint8_t *want = malloc(BLOCK_BYTES);

	for (uint32_t i = 0; i < n; i++) {
		make_block(&b[i], i + id_base);
		keys[i] = b[i].key;
		slots[i] = i;
		dsts[i] = malloc(BLOCK_BYTES);
		results[i] = 1;
	}
	file_tier_load(t, n, slots, keys, dsts, results);
	for (uint32_t i = 0; i < n; i++) {
		ck_assert_msg(results[i] == 0, "slot %u: %d", i, results[i]);
		fill_data(want, BLOCK_BYTES, i + id_base, version);
		ck_assert_mem_eq(dsts[i], want, BLOCK_BYTES);
		free(dsts[i]);
	}
	free(want);
	free(results);
	free(dsts);
	free(slots);
	free(keys);
	free(b);
}

static uint64_t slot_offset(struct file_tier *t, uint32_t npaths, uint32_t slot)
{
	return (uint64_t)(slot / npaths) * file_tier_slot_bytes(t);
}

/* Flips one byte of a file through its own descriptor (buffered: O_DIRECT reads see it). */
static void flip_byte(const char *path, uint64_t off)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);
	uint8_t c;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &c, 1, (off_t)off), 1);
	c ^= 0x10;
	ck_assert_int_eq(pwrite(fd, &c, 1, (off_t)off), 1);
	ck_assert_int_eq(fsync(fd), 0);
	close(fd);
}

struct found_log {
	uint32_t count;
	bool slot[MAX_SLOTS];
	uint32_t id_base;
};

static void on_found(void *ctx, uint32_t slot, const struct tier_key *key)
{
	struct found_log *f = ctx;
	struct block b;

	ck_assert_uint_lt(slot, MAX_SLOTS);
	ck_assert(!f->slot[slot]);
	f->slot[slot] = true;
	f->count++;
	/* The identity is the one stored there. */
	make_block(&b, slot + f->id_base);
	ck_assert_uint_eq(key->hash_lo, b.key.hash_lo);
	ck_assert_uint_eq(key->hash_hi, b.key.hash_hi);
	ck_assert_uint_eq(key->parent_lo, b.key.parent_lo);
	ck_assert_uint_eq(key->parent_hi, b.key.parent_hi);
	ck_assert_uint_eq(key->salt, b.key.salt);
	ck_assert_uint_eq(key->extra, b.key.extra);
	ck_assert_mem_eq(key->tokens, b.tokens, sizeof(b.tokens));
}

/* ---- file tier ---------------------------------------------------------------------------- */

START_TEST(test_file_bad_config)
{
	struct dir d;
	struct file_tier_config cfg;
	struct file_tier *t = NULL;

	dir_make(&d, "/tmp");
	cfg = config(&d, 2, 8, 4, false, NULL);
	cfg.queue_depth = 0;
	ck_assert_int_eq(file_tier_open(&cfg, &t), -EINVAL);
	cfg = config(&d, 0, 8, 4, false, NULL);
	ck_assert_int_eq(file_tier_open(&cfg, &t), -EINVAL);
	cfg = config(&d, 1, 8, 4, false, NULL);
	cfg.block_bytes = 0;
	ck_assert_int_eq(file_tier_open(&cfg, &t), -EINVAL);
	ck_assert_ptr_null(t);
	ck_assert_ptr_null(file_tier_close(NULL));
	/* Files in a directory that does not exist. */
	d.paths[0] = "/nonexistent/kvpaged-swap";
	cfg = config(&d, 1, 8, 4, false, NULL);
	ck_assert_int_eq(file_tier_open(&cfg, &t), -ENOENT);
	d.paths[0] = d.files[0];
	dir_remove(&d);
}
END_TEST

static void round_trip(const char *base)
{
	enum { SLOTS = 200 };
	struct lost_log lost = { 0 };
	struct file_tier_stats st;
	struct file_tier_config cfg;
	struct file_tier *t;
	struct stat sb;
	struct dir d;

	dir_make(&d, base);
	cfg = config(&d, 2, SLOTS, 8, false, &lost);
	t = open_tier(&cfg);
	/* Header (104 + 64 bytes) and data each rounded up to 4096. */
	ck_assert_uint_eq(file_tier_slot_bytes(t), 4096 + 4 * 4096);
	/* Each file sized to its share of the slots. */
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(stat(d.files[i], &sb), 0);
		ck_assert_uint_eq(sb.st_size, SLOTS / 2 * file_tier_slot_bytes(t));
	}
	for (uint32_t i = 0; i < SLOTS; i++)
		store_block(t, i, i, 0);
	/* Some still in flight, some on disk: all load whole. */
	load_all(t, SLOTS, 0, 0);
	file_tier_flush(t);
	load_all(t, SLOTS, 0, 0);

	file_tier_get_stats(t, &st);
	ck_assert_uint_eq(st.writes, SLOTS);
	ck_assert_uint_eq(st.write_bytes, SLOTS * file_tier_slot_bytes(t));
	ck_assert_uint_eq(st.write_errors, 0);
	ck_assert_uint_ge(st.reads, SLOTS);
	ck_assert_uint_eq(st.read_errors, 0);
	ck_assert_uint_eq(st.checksum_errors, 0);
	ck_assert_uint_eq(st.identity_errors, 0);
	ck_assert_uint_eq(lost.count, 0);

	/* Overwrite half with other blocks: the old identity is refused, the new one loads. */
	for (uint32_t i = 0; i < SLOTS; i += 2)
		store_block(t, i, i + 1000, 1);
	file_tier_flush(t);
	ck_assert_int_eq(load_block(t, 4, 4, 0), -EBADMSG);
	ck_assert_int_eq(load_block(t, 4, 1004, 1), 0);
	ck_assert_int_eq(load_block(t, 5, 5, 0), 0);
	file_tier_get_stats(t, &st);
	ck_assert_uint_eq(st.identity_errors, 1);
	ck_assert_uint_eq(st.checksum_errors, 0);
	/* Out of range. */
	ck_assert_int_eq(load_block(t, SLOTS, 0, 0), -EINVAL);
	ck_assert_int_eq(file_tier_store(t, SLOTS, &(struct tier_key){ 0 }, NULL), -EINVAL);
	ck_assert_ptr_null(file_tier_close(t));
	dir_remove(&d);
}

START_TEST(test_file_round_trip)
{
	round_trip("/tmp");
}
END_TEST

/* tmpfs: O_DIRECT or its buffered fallback, whichever this kernel gives. */
START_TEST(test_file_round_trip_shm)
{
	struct stat sb;

	/* Every Linux system has it: its absence is a broken machine, not a reason to pass. */
	ck_assert_msg(stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode), "no /dev/shm here");
	round_trip("/dev/shm");
}
END_TEST

START_TEST(test_file_load_in_flight)
{
	struct file_tier_stats before, after;
	struct file_tier_config cfg;
	struct file_tier *t;
	struct dir d;

	dir_make(&d, "/tmp");
	/* One buffer: the second store must wait for the first write. */
	cfg = config(&d, 1, 16, 1, false, NULL);
	t = open_tier(&cfg);
	store_block(t, 3, 3, 0);
	/* Not reaped yet: served from the staging buffer, no read of the file. */
	file_tier_get_stats(t, &before);
	ck_assert_int_eq(load_block(t, 3, 3, 0), 0);
	file_tier_get_stats(t, &after);
	ck_assert_uint_eq(after.reads, before.reads);
	/* And verified the same way: another key is refused. */
	ck_assert_int_eq(load_block(t, 3, 4, 0), -EBADMSG);

	/* Stored again while in flight: the second version wins, on disk too. */
	store_block(t, 3, 3, 1);
	ck_assert_int_eq(load_block(t, 3, 3, 1), 0);
	store_block(t, 4, 4, 0); /* waits for slot 3's write: the only buffer */
	ck_assert_int_eq(load_block(t, 3, 3, 1), 0);
	ck_assert_int_eq(load_block(t, 4, 4, 0), 0);
	file_tier_flush(t);
	ck_assert_int_eq(load_block(t, 3, 3, 1), 0);
	ck_assert_int_eq(load_block(t, 4, 4, 0), 0);
	file_tier_get_stats(t, &after);
	ck_assert_uint_eq(after.writes, 3);
	ck_assert_uint_eq(after.identity_errors, 1);
	file_tier_close(t);
	dir_remove(&d);
}
END_TEST

START_TEST(test_file_corrupt_data)
{
	enum { SLOTS = 16 };
	struct found_log found = { 0 };
	struct file_tier_stats st;
	struct file_tier_config cfg;
	struct file_tier *t;
	struct dir d;
	uint64_t hdr;

	dir_make(&d, "/tmp");
	cfg = config(&d, 2, SLOTS, 4, false, NULL);
	t = open_tier(&cfg);
	hdr = 4096;
	for (uint32_t i = 0; i < SLOTS; i++)
		store_block(t, i, i, 0);
	file_tier_flush(t);

	/* Slot 5 is in file 1: one bit of its data. */
	flip_byte(d.files[1], slot_offset(t, 2, 5) + hdr + 777);
	ck_assert_int_eq(load_block(t, 5, 5, 0), -EBADMSG);
	file_tier_get_stats(t, &st);
	ck_assert_uint_eq(st.checksum_errors, 1);
	ck_assert_uint_eq(st.identity_errors, 0);
	ck_assert_int_eq(load_block(t, 4, 4, 0), 0);
	ck_assert_int_eq(load_block(t, 6, 6, 0), 0);
	/* The data checksum is the load's job: the header is intact, so scan still finds it. */
	ck_assert_int_eq(file_tier_scan(t, on_found, &found), SLOTS);

	/* Slot 8 (file 0): one bit of a token in its header. */
	flip_byte(d.files[0], slot_offset(t, 2, 8) + 104 + 4 * 3);
	memset(&found, 0, sizeof(found));
	ck_assert_int_eq(file_tier_scan(t, on_found, &found), SLOTS - 1);
	ck_assert(!found.slot[8]);
	ck_assert_int_eq(load_block(t, 8, 8, 0), -EBADMSG);
	/* And one bit of the parent hash in slot 9's header. */
	flip_byte(d.files[1], slot_offset(t, 2, 9) + 56);
	memset(&found, 0, sizeof(found));
	ck_assert_int_eq(file_tier_scan(t, on_found, &found), SLOTS - 2);
	ck_assert(!found.slot[8] && !found.slot[9] && found.slot[5]);
	ck_assert_int_eq(load_block(t, 9, 9, 0), -EBADMSG);
	file_tier_get_stats(t, &st);
	ck_assert_uint_eq(st.identity_errors, 0);
	ck_assert_uint_ge(st.checksum_errors, 3);

	/* Stored again, the slot is whole again. */
	store_block(t, 5, 5, 0);
	file_tier_flush(t);
	ck_assert_int_eq(load_block(t, 5, 5, 0), 0);
	file_tier_close(t);
	dir_remove(&d);
}
END_TEST

START_TEST(test_file_persist)
{
	enum { SLOTS = 64 };
	struct found_log found = { .id_base = 500 };
	struct file_tier_stats st;
	struct file_tier_config cfg;
	struct file_tier *t;
	struct dir d;

	dir_make(&d, "/tmp");
	cfg = config(&d, 2, SLOTS, 4, true, NULL);
	t = open_tier(&cfg);
	/* Every third slot, block id = slot + 500. */
	for (uint32_t i = 0; i < SLOTS; i += 3)
		store_block(t, i, i + 500, 0);
	ck_assert_ptr_null(file_tier_close(t)); /* waits for the writes */

	t = open_tier(&cfg);
	ck_assert_int_eq(file_tier_scan(t, on_found, &found), (SLOTS + 2) / 3);
	ck_assert_uint_eq(found.count, (SLOTS + 2) / 3);
	for (uint32_t i = 0; i < SLOTS; i++)
		ck_assert_msg(found.slot[i] == (i % 3 == 0), "slot %u", i);
	for (uint32_t i = 0; i < SLOTS; i += 3)
		ck_assert_int_eq(load_block(t, i, i + 500, 0), 0);
	ck_assert_int_eq(load_block(t, 1, 501, 0), -EBADMSG); /* never written */
	file_tier_get_stats(t, &st);
	ck_assert_uint_eq(st.read_errors, 0);
	file_tier_close(t);

	/* Another geometry: the slots are someone else's, never used. */
	cfg.geometry = GEOMETRY + 1;
	t = open_tier(&cfg);
	memset(&found, 0, sizeof(found));
	ck_assert_int_eq(file_tier_scan(t, on_found, &found), 0);
	ck_assert_int_eq(load_block(t, 0, 500, 0), -EBADMSG);
	file_tier_get_stats(t, &st);
	ck_assert_uint_eq(st.identity_errors, 1);
	ck_assert_uint_eq(st.checksum_errors, 0);
	file_tier_close(t);

	/*
	 * Striped differently (file 0 alone): its slot j was written as slot 2j, and the slot
	 * field says so.  Only slot 0 is where it was.
	 */
	cfg.geometry = GEOMETRY;
	cfg.npaths = 1;
	cfg.nslots = SLOTS / 2;
	t = open_tier(&cfg);
	memset(&found, 0, sizeof(found));
	found.id_base = 500;
	ck_assert_int_eq(file_tier_scan(t, on_found, &found), 1);
	ck_assert(found.slot[0]);
	ck_assert_int_eq(load_block(t, 3, 506, 0), -EBADMSG);
	file_tier_close(t);

	/* The geometry unchanged, the slots still there. */
	cfg = config(&d, 2, SLOTS, 4, true, NULL);
	t = open_tier(&cfg);
	memset(&found, 0, sizeof(found));
	found.id_base = 500;
	ck_assert_int_eq(file_tier_scan(t, on_found, &found), (SLOTS + 2) / 3);
	file_tier_close(t);

	/* Without persist: forgotten. */
	cfg.persist = false;
	t = open_tier(&cfg);
	memset(&found, 0, sizeof(found));
	ck_assert_int_eq(file_tier_scan(t, on_found, &found), 0);
	ck_assert_int_eq(load_block(t, 0, 500, 0), -EBADMSG);
	file_tier_close(t);
	dir_remove(&d);
}
END_TEST

/* Slot off of path forged (tests/slot-forge.h) with the bytes of block (id, version). */
static void forge(const char *path, uint64_t off, uint32_t version, uint32_t id,
		  uint32_t data_version)
{
	uint8_t *data = data_of(id, data_version, BLOCK_BYTES);

	ck_assert_int_eq(forge_slot(path, off, 4096, TOKENS, data, BLOCK_BYTES, version), 0);
	free(data);
}

/* The key file's bytes (40: a magic and 32 random bytes), checked to be private. */
static void read_key(const struct dir *d, uint8_t key[40])
{
	char path[128];
	struct stat st;
	int fd;

	key_path(d, path, sizeof(path));
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert(S_ISREG(st.st_mode));
	ck_assert_uint_eq(st.st_mode & 07777, 0600);
	ck_assert_uint_eq(st.st_size, 40);
	ck_assert_int_eq(read(fd, key, 40), 40);
	close(fd);
}

/* Scans a reopened tier: the number of slots found.  *log gets what the tier logged. */
static int reopen_and_scan(struct file_tier_config *cfg, struct file_tier **t, char *log,
			   size_t len)
{
	struct found_log found = { 0 };
	char path[] = "/tmp/kvpaged-tier-log.XXXXXX";
	int fd = mkostemp(path, O_CLOEXEC), saved = dup(STDERR_FILENO), n;
	ssize_t got;

	ck_assert_int_ge(fd, 0);
	unlink(path);
	dup2(fd, STDERR_FILENO);
	*t = open_tier(cfg);
	n = file_tier_scan(*t, on_found, &found);
	dup2(saved, STDERR_FILENO);
	close(saved);
	got = pread(fd, log, len - 1, 0);
	log[got > 0 ? got : 0] = '\0';
	close(fd);
	return n;
}

/*
 * The checksums are keyed with the key beside the swap files: a slot forged by someone who
 * knows the format but not the key, or one of the format before (plain XXH3), is neither found
 * nor served, while the genuine ones come back.  A key that is missing, unreadable or readable
 * by others is replaced, and what the files held is forgotten (logged); a key file someone
 * could have planted is refused like a swap file.
 */
START_TEST(test_file_keyed_checksums)
{
	enum { SLOTS = 16 };
	struct file_tier_config cfg;
	struct file_tier_stats st;
	struct file_tier *t;
	uint8_t key[40], key2[40];
	uint64_t off3, off5;
	char log[4096], path[128];
	struct stat sb;
	struct dir d;

	dir_make(&d, "/tmp");
	key_path(&d, path, sizeof(path));
	cfg = config(&d, 1, SLOTS, 4, true, NULL);
	t = open_tier(&cfg);
	for (uint32_t i = 0; i < 8; i++)
		store_block(t, i, i, 0);
	off3 = slot_offset(t, 1, 3);
	off5 = slot_offset(t, 1, 5);
	file_tier_close(t);
	read_key(&d, key);

	forge(d.files[0], off3, 0, 3, 9);
	forge(d.files[0], off5, 1, 5, 9);
	ck_assert_int_eq(reopen_and_scan(&cfg, &t, log, sizeof(log)), 6);
	ck_assert_msg(strstr(log, "1 slots of another format version"), "%s", log);
	ck_assert_int_eq(load_block(t, 3, 3, 9), -EBADMSG);
	ck_assert_int_eq(load_block(t, 3, 3, 0), -EBADMSG);
	ck_assert_int_eq(load_block(t, 5, 5, 9), -EBADMSG);
	for (uint32_t i = 0; i < 8; i++)
		if (i != 3 && i != 5)
			ck_assert_int_eq(load_block(t, i, i, 0), 0);
	file_tier_get_stats(t, &st);
	ck_assert_uint_ge(st.checksum_errors, 2); /* slot 3, at the scan and at each load */
	ck_assert_uint_eq(st.identity_errors, 1);   /* slot 5: another format */
	file_tier_close(t);
	read_key(&d, key2);
	ck_assert_mem_eq(key, key2, 40);

	/* No key: a new one, and the files start empty (truncated, nothing allocated). */
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(reopen_and_scan(&cfg, &t, log, sizeof(log)), 0);
	ck_assert_msg(strstr(log, "there was none; a new key replaces it"), "%s", log);
	ck_assert_int_eq(load_block(t, 0, 0, 0), -EBADMSG);
	ck_assert_int_eq(stat(d.files[0], &sb), 0);
	ck_assert_uint_eq(sb.st_blocks, 0);
	read_key(&d, key2);
	ck_assert_mem_ne(key + 8, key2 + 8, 32);
	/* Kept from then on. */
	store_block(t, 2, 2, 0);
	file_tier_close(t);
	ck_assert_int_eq(reopen_and_scan(&cfg, &t, log, sizeof(log)), 1);
	ck_assert_int_eq(load_block(t, 2, 2, 0), 0);
	file_tier_close(t);

	/* A key file that is not one, then one that others could read: replaced, files empty. */
	ck_assert_int_eq(truncate(path, 5), 0);
	ck_assert_int_eq(reopen_and_scan(&cfg, &t, log, sizeof(log)), 0);
	ck_assert_msg(strstr(log, "it is not a key file; a new key replaces it"), "%s", log);
	store_block(t, 2, 2, 0);
	file_tier_close(t);
	read_key(&d, key);
	ck_assert_int_eq(chmod(path, 0644), 0);
	ck_assert_int_eq(reopen_and_scan(&cfg, &t, log, sizeof(log)), 0);
	ck_assert_msg(strstr(log, "others could read it; a new key replaces it"), "%s", log);
	file_tier_close(t);
	read_key(&d, key2); /* 0600 again */
	ck_assert_mem_ne(key + 8, key2 + 8, 32);

	/* A key file someone may have planted: the tier does not open. */
	ck_assert_int_eq(chmod(path, 0660), 0);
	ck_assert_int_eq(file_tier_open(&cfg, &t), -EPERM);
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(symlink(d.files[1], path), 0);
	ck_assert_int_eq(file_tier_open(&cfg, &t), -ELOOP);
	ck_assert_int_eq(lstat(d.files[1], &sb), -1); /* not created through the link */
	dir_remove(&d);
}
END_TEST

START_TEST(test_file_locked)
{
	struct file_tier_config cfg;
	struct file_tier *t, *t2 = NULL;
	struct dir d;

	dir_make(&d, "/tmp");
	cfg = config(&d, 1, 4, 2, false, NULL);
	t = open_tier(&cfg);
	/* A second owner of the same file would overwrite the first one's slots. */
	ck_assert_int_eq(file_tier_open(&cfg, &t2), -EBUSY);
	file_tier_close(t);
	t = open_tier(&cfg);
	file_tier_close(t);
	dir_remove(&d);
}
END_TEST

/* A file of n bytes of 0xa5 at path, mode 0600: someone's data the tier must never touch. */
static void make_victim(const char *path, size_t n)
{
	char buf[4096];
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	ck_assert_int_ge(fd, 0);
	memset(buf, 0xa5, sizeof(buf));
	for (size_t off = 0; off < n; off += sizeof(buf))
		ck_assert_int_eq(write(fd, buf, n - off < sizeof(buf) ? n - off : sizeof(buf)),
				 (ssize_t)(n - off < sizeof(buf) ? n - off : sizeof(buf)));
	close(fd);
}

static bool victim_intact(const char *path, size_t n)
{
	uint8_t buf[4096];
	struct stat st;
	size_t got = 0;
	ssize_t k;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0 || fstat(fd, &st) < 0 || (size_t)st.st_size != n)
		goto bad;
	while ((k = read(fd, buf, sizeof(buf))) > 0) {
		for (ssize_t i = 0; i < k; i++)
			if (buf[i] != 0xa5)
				goto bad;
		got += (size_t)k;
	}
	close(fd);
	return got == n;
bad:
	if (fd >= 0)
		close(fd);
	return false;
}

/* Opening must fail with err, with or without persist, and leave the victim as it was. */
static void assert_refused(struct file_tier_config *cfg, int err, const char *victim, size_t n)
{
	struct file_tier *t = NULL;

	for (int persist = 0; persist < 2; persist++) {
		cfg->persist = persist;
		ck_assert_int_eq(file_tier_open(cfg, &t), err);
		ck_assert_ptr_null(t);
		ck_assert_msg(victim_intact(victim, n), "%s changed (persist %d)", victim, persist);
	}
}

/*
 * A swap path in a directory someone else can write: a symbolic link or a hard link planted
 * there, or a file another user owns or may write, is refused before anything is truncated or
 * sized, whatever file it leads to; the daemon's own file opens as before.
 */
START_TEST(test_file_refuses_unsafe_files)
{
	enum { VICTIM_BYTES = 10000 };
	struct file_tier_config cfg;
	struct file_tier *t;
	char victim[128], dangling[128];
	struct stat st;
	struct dir d;
	mode_t mask;

	dir_make(&d, "/tmp");
	snprintf(victim, sizeof(victim), "%s/victim", d.path);
	snprintf(dangling, sizeof(dangling), "%s/nothing-yet", d.path);
	make_victim(victim, VICTIM_BYTES);
	cfg = config(&d, 1, 8, 4, false, NULL);

	/* A symbolic link to the victim, and one to where nothing is yet (never created). */
	ck_assert_int_eq(symlink(victim, d.files[0]), 0);
	assert_refused(&cfg, -ELOOP, victim, VICTIM_BYTES);
	ck_assert_int_eq(unlink(d.files[0]), 0);
	ck_assert_int_eq(symlink(dangling, d.files[0]), 0);
	assert_refused(&cfg, -ELOOP, victim, VICTIM_BYTES);
	ck_assert_int_eq(lstat(dangling, &st), -1);
	ck_assert_int_eq(unlink(d.files[0]), 0);

	/* A hard link to the victim. */
	ck_assert_int_eq(link(victim, d.files[0]), 0);
	assert_refused(&cfg, -EMLINK, victim, VICTIM_BYTES);
	ck_assert_int_eq(unlink(d.files[0]), 0);

	/* The file itself, writable by its group, then by others. */
	make_victim(d.files[0], VICTIM_BYTES);
	ck_assert_int_eq(chmod(d.files[0], 0620), 0);
	assert_refused(&cfg, -EPERM, d.files[0], VICTIM_BYTES);
	ck_assert_int_eq(chmod(d.files[0], 0602), 0);
	assert_refused(&cfg, -EPERM, d.files[0], VICTIM_BYTES);

	/* Owned by another uid (only root can give a file away). */
	if (geteuid() == 0) {
		ck_assert_int_eq(chmod(d.files[0], 0600), 0);
		ck_assert_int_eq(chown(d.files[0], 4242, 4242), 0);
		assert_refused(&cfg, -EPERM, d.files[0], VICTIM_BYTES);
	} else {
		printf("unsafe swap files: skipped the file of another uid (not root)\n");
	}
	ck_assert_int_eq(unlink(d.files[0]), 0);

	/* Not a regular file: a FIFO does not even hold the open. */
	ck_assert_int_eq(mkfifo(d.files[0], 0600), 0);
	assert_refused(&cfg, -EINVAL, victim, VICTIM_BYTES);
	ck_assert_int_eq(unlink(d.files[0]), 0);

	/* The normal path: created 0600 (whatever the umask), then opened again as the tier's. */
	cfg.persist = true;
	mask = umask(0);
	t = open_tier(&cfg);
	umask(mask);
	ck_assert_int_eq(stat(d.files[0], &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0600);
	ck_assert_uint_eq(st.st_uid, geteuid());
	store_block(t, 1, 1, 0);
	file_tier_close(t);
	/* Readable by others (made so by hand): its slots stay, the file becomes private. */
	ck_assert_int_eq(chmod(d.files[0], 0644), 0);
	cfg.persist = true;
	t = open_tier(&cfg);
	ck_assert_int_eq(stat(d.files[0], &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0600);
	ck_assert_int_eq(load_block(t, 1, 1, 0), 0);
	file_tier_close(t);
	ck_assert(victim_intact(victim, VICTIM_BYTES));
	unlink(victim);
	dir_remove(&d);
}
END_TEST

/* Entries of a directory, . and .. aside. */
static int dir_entries(const char *path)
{
	DIR *dir = opendir(path);
	struct dirent *e;
	int n = 0;

	ck_assert_ptr_nonnull(dir);
	while ((e = readdir(dir)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(dir);
	return n;
}

/*
 * A scratch tier's one file has no name: nothing appears in the directory, whatever sits at
 * the path it was given (here a link someone planted), and nothing is left when it closes.
 */
START_TEST(test_file_scratch)
{
	struct file_tier_config cfg;
	struct file_tier *t = NULL;
	char victim[128];
	struct dir d;

	dir_make(&d, "/tmp");
	snprintf(victim, sizeof(victim), "%s/victim", d.path);
	make_victim(victim, 4096);
	ck_assert_int_eq(symlink(victim, d.files[0]), 0);
	cfg = config(&d, 1, 8, 4, false, NULL);
	cfg.scratch = true;
	t = open_tier(&cfg);
	ck_assert_int_eq(dir_entries(d.path), 2);
	for (uint32_t i = 0; i < 8; i++)
		store_block(t, i, i, 0);
	file_tier_flush(t);
	load_all(t, 8, 0, 0);
	file_tier_close(t);
	ck_assert_int_eq(dir_entries(d.path), 2);
	ck_assert(victim_intact(victim, 4096));

	/* One file, never persistent: there is nothing to find again. */
	cfg.persist = true;
	ck_assert_int_eq(file_tier_open(&cfg, &t), -EINVAL);
	cfg = config(&d, 2, 8, 4, false, NULL);
	cfg.scratch = true;
	ck_assert_int_eq(file_tier_open(&cfg, &t), -EINVAL);
	unlink(victim);
	dir_remove(&d);
}
END_TEST

/* Reads the eventfd's counter: 0 when there was nothing to read (EAGAIN). */
static uint64_t drain_event_fd(int fd)
{
	uint64_t v = 0;
	ssize_t r = read(fd, &v, sizeof(v));

	ck_assert_msg(r == sizeof(v) || (r < 0 && errno == EAGAIN), "read: %zd", r);
	return r == sizeof(v) ? v : 0;
}

static bool event_fd_readable(int fd, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int r = poll(&p, 1, timeout_ms);

	ck_assert_int_ge(r, 0);
	return r == 1 && (p.revents & POLLIN);
}

/* The eventfd: close-on-exec, non-blocking, and woken by the ring's completions. */
START_TEST(test_file_event_fd)
{
	struct file_tier_config cfg;
	struct file_tier *t;
	struct dir d;
	int fd;

	dir_make(&d, "/tmp");
	cfg = config(&d, 1, 8, 2, false, NULL);
	t = open_tier(&cfg);
	fd = file_tier_event_fd(t);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	ck_assert_int_eq(fcntl(fd, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
	ck_assert(!event_fd_readable(fd, 0));
	ck_assert_uint_eq(drain_event_fd(fd), 0);
	store_block(t, 1, 1, 0);
	/* The write's completion is posted whether or not anyone reaps it yet. */
	ck_assert(event_fd_readable(fd, 5000));
	ck_assert_uint_ge(drain_event_fd(fd), 1);
	ck_assert(!event_fd_readable(fd, 0));
	file_tier_flush(t);
	ck_assert_int_eq(load_block(t, 1, 1, 0), 0);
	file_tier_close(t);
	/* Closed with the tier. */
	ck_assert_int_eq(fcntl(fd, F_GETFD), -1);
	dir_remove(&d);
}
END_TEST

/* ---- asynchronous loads ------------------------------------------------------------------ */

/* Counts done calls, and those that came from anywhere but file_tier_poll(). */
struct async_done {
	int calls;
	int calls_outside_poll;
	bool in_poll;
};

static void on_done(void *ctx)
{
	struct async_done *a = ctx;

	a->calls++;
	if (!a->in_poll)
		a->calls_outside_poll++;
}

/* What an event loop does: wait for the eventfd, drain it, poll; until done has run. */
static void poll_until_called(struct file_tier *t, struct async_done *a)
{
	int fd = file_tier_event_fd(t);

	for (int rounds = 0; a->calls == 0; rounds++) {
		ck_assert_msg(rounds < 100000, "done never called");
		/* A batch not done must have something that will wake the loop. */
		ck_assert_msg(event_fd_readable(fd, 5000), "eventfd not readable, done not called");
		drain_event_fd(fd);
		a->in_poll = true;
		file_tier_poll(t);
		a->in_poll = false;
	}
	ck_assert_int_eq(a->calls, 1);
	ck_assert_int_eq(a->calls_outside_poll, 0);
}

/* And the batch is gone: no other was started from done. */
static void poll_until_done(struct file_tier *t, struct async_done *a)
{
	poll_until_called(t, a);
	ck_assert(!file_tier_loading(t));
}

/* A load's arrays; entry i expects block ids[i], version versions[i], in slots[i]. */
struct load_set {
	uint32_t n;
	struct block *b;
	struct tier_key *keys;
	uint32_t *slots;
	uint32_t *ids, *versions;
	void **dsts;
	int *results;
};

static void set_make(struct load_set *ls, uint32_t n)
{
	ls->n = n;
	ls->b = calloc(n, sizeof(*ls->b));
	ls->keys = calloc(n, sizeof(*ls->keys));
	ls->slots = calloc(n, sizeof(*ls->slots));
	ls->ids = calloc(n, sizeof(*ls->ids));
	ls->versions = calloc(n, sizeof(*ls->versions));
	ls->dsts = calloc(n, sizeof(*ls->dsts));
	ls->results = calloc(n, sizeof(*ls->results));
	ck_assert(ls->b && ls->keys && ls->slots && ls->ids && ls->versions && ls->dsts &&
		  ls->results);
	for (uint32_t i = 0; i < n; i++) {
		ls->dsts[i] = malloc(BLOCK_BYTES);
		ck_assert_ptr_nonnull(ls->dsts[i]);
		memset(ls->dsts[i], 0x5a, BLOCK_BYTES);
		ls->results[i] = 1; /* no result yet */
	}
}

static void set_entry(struct load_set *ls, uint32_t i, uint32_t slot, uint32_t id,
		      uint32_t version)
{
	make_block(&ls->b[i], id);
	ls->keys[i] = ls->b[i].key;
	ls->slots[i] = slot;
	ls->ids[i] = id;
	ls->versions[i] = version;
}

/* Checks each entry's result is want[i] and its bytes: the block's, or untouched on failure. */
static void set_check(const struct load_set *ls, const int *want)
{
	uint8_t *expect = malloc(BLOCK_BYTES), *untouched = malloc(BLOCK_BYTES);

	memset(untouched, 0x5a, BLOCK_BYTES);
	for (uint32_t i = 0; i < ls->n; i++) {
		ck_assert_msg(ls->results[i] == want[i], "entry %u (slot %u): %d, want %d", i,
			      ls->slots[i], ls->results[i], want[i]);
		if (want[i] == 0) {
			fill_data(expect, BLOCK_BYTES, ls->ids[i], ls->versions[i]);
			ck_assert_msg(!memcmp(ls->dsts[i], expect, BLOCK_BYTES),
				      "entry %u (slot %u): wrong bytes", i, ls->slots[i]);
		} else {
			ck_assert_msg(!memcmp(ls->dsts[i], untouched, BLOCK_BYTES),
				      "entry %u (slot %u): failed, yet dst written", i, ls->slots[i]);
		}
	}
	free(untouched);
	free(expect);
}

static void set_free(struct load_set *ls)
{
	for (uint32_t i = 0; i < ls->n; i++)
		free(ls->dsts[i]);
	free(ls->b);
	free(ls->keys);
	free(ls->slots);
	free(ls->ids);
	free(ls->versions);
	free(ls->dsts);
	free(ls->results);
}

static int set_start(struct file_tier *t, struct load_set *ls, struct async_done *a)
{
	return file_tier_load_start(t, ls->n, ls->slots, ls->keys, (void *const *)ls->dsts,
				    ls->results, on_done, a);
}

/*
 * Many more slots than buffers, some on disk, some perhaps still in staging, some never
 * written, out of range, asked for under another key, or asked for twice: the asynchronous
 * load gives what the synchronous one gives, byte for byte, and done once, from a poll.
 */
START_TEST(test_file_async_load)
{
	enum { SLOTS = 64, WRITTEN = 48, N = SLOTS + 6 };
	struct async_done a = { 0 };
	struct load_set as, ss;
	struct file_tier_stats st;
	struct file_tier_config cfg;
	struct file_tier *t;
	struct dir d;
	int want[N];

	dir_make(&d, "/tmp");
	cfg = config(&d, 2, SLOTS, 4, false, NULL);
	t = open_tier(&cfg);
	for (uint32_t i = 0; i < WRITTEN; i++)
		store_block(t, i, i + 100, 0);
	file_tier_flush(t);
	/* Stored again, not flushed: served from staging or read, whichever it is by then. */
	for (uint32_t i = WRITTEN - 4; i < WRITTEN; i++)
		store_block(t, i, i + 100, 1);

	set_make(&as, N);
	set_make(&ss, N);
	for (struct load_set *ls = &as; ls; ls = ls == &as ? &ss : NULL) {
		for (uint32_t i = 0; i < SLOTS; i++)
			set_entry(ls, i, i, i + 100, i >= WRITTEN - 4 ? 1 : 0);
		set_entry(ls, SLOTS + 0, SLOTS, 7, 0);       /* out of range */
		set_entry(ls, SLOTS + 1, UINT32_MAX, 7, 0);  /* out of range */
		set_entry(ls, SLOTS + 2, 3, 999, 0);         /* another block's key */
		set_entry(ls, SLOTS + 3, 10, 110, 0);        /* twice */
		set_entry(ls, SLOTS + 4, SLOTS - 1, 999, 0); /* never written */
		set_entry(ls, SLOTS + 5, WRITTEN - 1, WRITTEN - 1 + 100, 1);
	}
	for (uint32_t i = 0; i < N; i++)
		want[i] = i < WRITTEN ? 0 : i < SLOTS ? -EBADMSG : 0;
	want[SLOTS + 0] = want[SLOTS + 1] = -EINVAL;
	want[SLOTS + 2] = want[SLOTS + 4] = -EBADMSG;

	ck_assert(!file_tier_loading(t));
	ck_assert_int_eq(set_start(t, &as, &a), 0);
	ck_assert(file_tier_loading(t));
	ck_assert_int_eq(a.calls, 0);
	/* No more reads than buffers went out, and none was reaped: loading is not waiting. */
	file_tier_get_stats(t, &st);
	ck_assert_uint_eq(st.reads, 0);
	poll_until_done(t, &a);
	set_check(&as, want);

	file_tier_load(t, ss.n, ss.slots, ss.keys, (void *const *)ss.dsts, ss.results);
	set_check(&ss, want);
	ck_assert_mem_eq(as.results, ss.results, N * sizeof(int));
	/* Polling on runs done no more. */
	file_tier_poll(t);
	ck_assert_int_eq(a.calls, 1);
	file_tier_get_stats(t, &st);
	ck_assert_uint_eq(st.read_errors, 0);
	set_free(&as);
	set_free(&ss);
	file_tier_close(t);
	dir_remove(&d);
}
END_TEST

/* A flipped bit in a slot's data or header: -EBADMSG in the batch, the others whole. */
START_TEST(test_file_async_corrupt)
{
	enum { SLOTS = 16 };
	struct async_done a = { 0 };
	struct file_tier_stats st;
	struct file_tier_config cfg;
	struct file_tier *t;
	struct load_set ls;
	struct dir d;
	int want[SLOTS];

	dir_make(&d, "/tmp");
	cfg = config(&d, 2, SLOTS, 2, false, NULL);
	t = open_tier(&cfg);
	for (uint32_t i = 0; i < SLOTS; i++)
		store_block(t, i, i, 0);
	file_tier_flush(t);
	flip_byte(d.files[1], slot_offset(t, 2, 5) + 4096 + 777); /* slot 5's data */
	flip_byte(d.files[0], slot_offset(t, 2, 8) + 104 + 4 * 3); /* a token of slot 8 */

	set_make(&ls, SLOTS);
	for (uint32_t i = 0; i < SLOTS; i++) {
		set_entry(&ls, i, i, i, 0);
		want[i] = i == 5 || i == 8 ? -EBADMSG : 0;
	}
	ck_assert_int_eq(set_start(t, &ls, &a), 0);
	poll_until_done(t, &a);
	set_check(&ls, want);
	file_tier_get_stats(t, &st);
	ck_assert_uint_eq(st.checksum_errors, 2);
	ck_assert_uint_eq(st.identity_errors, 0);
	set_free(&ls);
	file_tier_close(t);
	dir_remove(&d);
}
END_TEST

/*
 * Two buffers, and stores while a batch of 32 reads is in flight: each store waits for a
 * buffer, gets the first one freed (not after the whole batch), and the batch still finishes
 * with the right bytes; so does what was stored.
 */
START_TEST(test_file_async_with_stores)
{
	enum { SLOTS = 64, N = 32, STORES = 16 };
	struct async_done a = { 0 };
	struct file_tier_stats st;
	struct file_tier_config cfg;
	struct file_tier *t;
	struct load_set ls;
	struct dir d;
	int want[N] = { 0 };

	dir_make(&d, "/tmp");
	cfg = config(&d, 1, SLOTS, 2, false, NULL);
	t = open_tier(&cfg);
	for (uint32_t i = 0; i < N; i++)
		store_block(t, i, i, 0);
	file_tier_flush(t);

	set_make(&ls, N);
	for (uint32_t i = 0; i < N; i++)
		set_entry(&ls, i, i, i, 0);
	ck_assert_int_eq(set_start(t, &ls, &a), 0);
	for (uint32_t i = 0; i < STORES; i++) {
		ck_assert(file_tier_loading(t));
		store_block(t, N + i, N + i, 2);
		if (i == 0) {
			/*
			 * Both buffers were the batch's: the store waited for one read to land
			 * and took the first freed, not the batch's next.
			 */
			file_tier_get_stats(t, &st);
			ck_assert_uint_ge(st.reads + st.read_errors, 1);
			ck_assert_uint_le(st.reads, 2);
		}
	}
	/* And one of the batch's own slots, stored again with the same block. */
	store_block(t, 7, 7, 0);
	ck_assert_int_eq(a.calls, 0);
	poll_until_done(t, &a);
	set_check(&ls, want);
	file_tier_flush(t);
	for (uint32_t i = 0; i < STORES; i++)
		ck_assert_int_eq(load_block(t, N + i, N + i, 2), 0);
	file_tier_get_stats(t, &st);
	ck_assert_uint_eq(st.writes, N + STORES + 1);
	ck_assert_uint_eq(st.write_errors, 0);
	set_free(&ls);
	file_tier_close(t);
	dir_remove(&d);
}
END_TEST

/* A synchronous load, a scan and a flush while a batch is in flight: none of them runs done. */
START_TEST(test_file_async_with_sync_calls)
{
	enum { SLOTS = 24 };
	struct found_log found = { 0 };
	struct async_done a = { 0 };
	struct file_tier_config cfg;
	struct file_tier *t;
	struct load_set ls;
	struct dir d;
	int want[SLOTS] = { 0 };

	dir_make(&d, "/tmp");
	cfg = config(&d, 2, SLOTS, 2, false, NULL);
	t = open_tier(&cfg);
	for (uint32_t i = 0; i < SLOTS; i++)
		store_block(t, i, i, 0);
	file_tier_flush(t);
	set_make(&ls, SLOTS);
	for (uint32_t i = 0; i < SLOTS; i++)
		set_entry(&ls, i, i, i, 0);

	/* A sync load first lets every read of the batch finish; done waits for the poll. */
	ck_assert_int_eq(set_start(t, &ls, &a), 0);
	ck_assert_int_eq(load_block(t, 4, 4, 0), 0);
	for (uint32_t i = 0; i < SLOTS; i++)
		ck_assert_int_ne(ls.results[i], 1);
	ck_assert_int_eq(a.calls, 0);
	ck_assert(file_tier_loading(t));
	/* Still busy until done has run. */
	ck_assert_int_eq(set_start(t, &ls, &a), -EBUSY);
	poll_until_done(t, &a);
	set_check(&ls, want);

	/* A scan likewise. */
	a = (struct async_done){ 0 };
	for (uint32_t i = 0; i < SLOTS; i++) {
		ls.results[i] = 1;
		memset(ls.dsts[i], 0x5a, BLOCK_BYTES);
	}
	ck_assert_int_eq(set_start(t, &ls, &a), 0);
	ck_assert_int_eq(file_tier_scan(t, on_found, &found), SLOTS);
	for (uint32_t i = 0; i < SLOTS; i++)
		ck_assert_int_ne(ls.results[i], 1);
	ck_assert_int_eq(a.calls, 0);
	poll_until_done(t, &a);
	set_check(&ls, want);

	/* A flush only waits for writes; the batch goes on and finishes at the polls. */
	a = (struct async_done){ 0 };
	for (uint32_t i = 0; i < SLOTS; i++) {
		ls.results[i] = 1;
		memset(ls.dsts[i], 0x5a, BLOCK_BYTES);
	}
	ck_assert_int_eq(set_start(t, &ls, &a), 0);
	store_block(t, 0, 0, 0);
	file_tier_flush(t);
	ck_assert_int_eq(a.calls, 0);
	poll_until_done(t, &a);
	set_check(&ls, want);
	set_free(&ls);
	file_tier_close(t);
	dir_remove(&d);
}
END_TEST

/* done starts the next batch, as an event loop's would. */
struct chain {
	struct file_tier *t;
	struct load_set *next;
	struct async_done *next_done;
	struct async_done first;
	int start_result;
};

static void on_done_chain(void *ctx)
{
	struct chain *c = ctx;

	on_done(&c->first);
	c->start_result = set_start(c->t, c->next, c->next_done);
}

/* One batch at a time; arguments checked; the next batch may start from done. */
START_TEST(test_file_async_busy)
{
	struct async_done a = { 0 }, b = { 0 };
	struct file_tier_config cfg;
	struct load_set l1, l2;
	struct file_tier *t;
	struct chain c;
	struct dir d;
	int want[8] = { 0 };

	dir_make(&d, "/tmp");
	cfg = config(&d, 1, 8, 2, false, NULL);
	t = open_tier(&cfg);
	for (uint32_t i = 0; i < 8; i++)
		store_block(t, i, i, 0);
	file_tier_flush(t);
	set_make(&l1, 8);
	set_make(&l2, 8);
	for (uint32_t i = 0; i < 8; i++) {
		set_entry(&l1, i, i, i, 0);
		set_entry(&l2, i, 7 - i, 7 - i, 0);
	}
	ck_assert_int_eq(file_tier_load_start(t, 8, l1.slots, l1.keys, (void *const *)l1.dsts,
					      l1.results, NULL, NULL), -EINVAL);
	ck_assert_int_eq(file_tier_load_start(t, 8, NULL, l1.keys, (void *const *)l1.dsts,
					      l1.results, on_done, &a), -EINVAL);
	ck_assert(!file_tier_loading(t));

	ck_assert_int_eq(set_start(t, &l1, &a), 0);
	ck_assert_int_eq(set_start(t, &l2, &b), -EBUSY);
	ck_assert_int_eq(set_start(t, &l1, &a), -EBUSY);
	poll_until_done(t, &a);
	set_check(&l1, want);
	/* The refused batch was never started: nothing written, done never called. */
	for (uint32_t i = 0; i < 8; i++)
		ck_assert_int_eq(l2.results[i], 1);
	ck_assert_int_eq(b.calls, 0);

	/* From done: the next batch starts, and its done comes from a later poll. */
	for (uint32_t i = 0; i < 8; i++) {
		l1.results[i] = 1;
		memset(l1.dsts[i], 0x5a, BLOCK_BYTES);
	}
	c = (struct chain){ .t = t, .next = &l2, .next_done = &b, .start_result = 1 };
	ck_assert_int_eq(file_tier_load_start(t, l1.n, l1.slots, l1.keys,
					      (void *const *)l1.dsts, l1.results, on_done_chain,
					      &c), 0);
	poll_until_called(t, &c.first);
	ck_assert_int_eq(c.start_result, 0);
	ck_assert_int_eq(b.calls, 0);
	ck_assert(file_tier_loading(t));
	poll_until_done(t, &b);
	set_check(&l1, want);
	set_check(&l2, want);
	set_free(&l1);
	set_free(&l2);
	file_tier_close(t);
	dir_remove(&d);
}
END_TEST

/*
 * A batch with nothing to read (n == 0; every slot in staging or out of range) has all its
 * results at once, yet done waits for the poll, and the eventfd says when.
 */
START_TEST(test_file_async_no_reads)
{
	struct async_done a = { 0 };
	struct file_tier_stats before, after;
	struct file_tier_config cfg;
	struct file_tier *t;
	struct load_set ls;
	struct dir d;
	int fd;
	const int want[3] = { 0, -EINVAL, -EBADMSG };

	dir_make(&d, "/tmp");
	cfg = config(&d, 1, 8, 4, false, NULL);
	t = open_tier(&cfg);
	fd = file_tier_event_fd(t);

	ck_assert_int_eq(file_tier_load_start(t, 0, NULL, NULL, NULL, NULL, on_done, &a), 0);
	ck_assert(file_tier_loading(t));
	ck_assert_int_eq(a.calls, 0);
	/* No I/O at all, yet the loop is woken for the poll that runs done. */
	ck_assert(event_fd_readable(fd, 5000));
	poll_until_done(t, &a);

	/* Slot 3's write is not reaped (nothing reaps in load_start): served from staging. */
	store_block(t, 3, 3, 0);
	set_make(&ls, 3);
	set_entry(&ls, 0, 3, 3, 0);
	set_entry(&ls, 1, 99, 3, 0);
	set_entry(&ls, 2, 3, 4, 0);
	file_tier_get_stats(t, &before);
	drain_event_fd(fd);
	a = (struct async_done){ 0 };
	ck_assert_int_eq(set_start(t, &ls, &a), 0);
	set_check(&ls, want);
	ck_assert_int_eq(a.calls, 0);
	/* Neither a store nor a flush runs done. */
	store_block(t, 5, 5, 0);
	file_tier_flush(t);
	ck_assert_int_eq(a.calls, 0);
	ck_assert(file_tier_loading(t));
	poll_until_done(t, &a);
	set_check(&ls, want);
	file_tier_get_stats(t, &after);
	ck_assert_uint_eq(after.reads, before.reads);
	ck_assert_uint_eq(after.identity_errors, before.identity_errors + 1);
	set_free(&ls);
	file_tier_close(t);
	dir_remove(&d);
}
END_TEST

/*
 * The child's checks: a file system that takes only the first 4 slots of each file.  Returns
 * 0 or the number of the check that failed (Check's asserts do not cross this fork).
 */
static int full_fs_child(struct dir *d)
{
	enum { SLOTS = 32, LIMIT_SLOTS = 4 };
	struct lost_log lost = { 0 };
	struct file_tier_config cfg = config(d, 2, SLOTS, 4, false, &lost);
	struct file_tier_stats st;
	struct file_tier *t = NULL;
	struct rlimit rl;

	/* Opened (and the files sized) before the limit, as on a disk that fills up later. */
	if (file_tier_open(&cfg, &t) < 0)
		return 1;
	rl.rlim_cur = rl.rlim_max = LIMIT_SLOTS * file_tier_slot_bytes(t);
	if (signal(SIGXFSZ, SIG_IGN) == SIG_ERR || setrlimit(RLIMIT_FSIZE, &rl) < 0)
		return 2;
	for (uint32_t i = 0; i < SLOTS; i++)
		if (store_raw(t, i, i, 0) < 0)
			return 10;
	file_tier_flush(t);
	file_tier_get_stats(t, &st);
	if (st.writes != 2 * LIMIT_SLOTS || st.write_errors != SLOTS - 2 * LIMIT_SLOTS)
		return 3;
	if (lost.count != SLOTS - 2 * LIMIT_SLOTS || lost.last_err != -EFBIG)
		return 4;
	for (uint32_t i = 0; i < SLOTS; i++) {
		bool fits = i < 2 * LIMIT_SLOTS;
		int r = load_raw(t, i, i, 0);

		if (lost.slot[i] == fits)
			return 5;
		if (fits ? r != 0 : r != -EBADMSG && r != -EIO)
			return 6;
	}
	/* A slot lost then stored again (still refused) is reported again, not silently kept. */
	if (store_raw(t, 20, 20, 1) < 0)
		return 11;
	file_tier_flush(t);
	if (lost.count != SLOTS - 2 * LIMIT_SLOTS + 1)
		return 7;
	file_tier_close(t);
	return 0;
}

START_TEST(test_file_full)
{
	struct dir d;
	pid_t pid;
	int status;

	dir_make(&d, "/tmp");
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(full_fs_child(&d));
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "child failed check %d (status 0x%x)", WEXITSTATUS(status), status);
	dir_remove(&d);
}
END_TEST

/* A failure of a write that a newer store of the slot replaced is not reported. */
START_TEST(test_file_lost_superseded)
{
	struct lost_log lost = { 0 };
	struct file_tier_config cfg;
	struct file_tier *t;
	struct dir d;
	struct rlimit rl;
	pid_t pid;
	int status;

	dir_make(&d, "/tmp");
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		cfg = config(&d, 1, 8, 4, false, &lost);
		t = NULL;
		if (file_tier_open(&cfg, &t) < 0)
			_exit(1);
		/* Slot 4 onwards does not fit. */
		rl.rlim_cur = rl.rlim_max = 4 * file_tier_slot_bytes(t);
		signal(SIGXFSZ, SIG_IGN);
		if (setrlimit(RLIMIT_FSIZE, &rl) < 0)
			_exit(2);
		/* Stored again before the failure was reaped: only the newest write counts. */
		if (store_raw(t, 5, 5, 0) < 0 || store_raw(t, 5, 5, 1) < 0)
			_exit(4);
		file_tier_flush(t);
		_exit(lost.count == 1 && lost.slot[5] ? 0 : 3);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x", status);
	dir_remove(&d);
}
END_TEST

/* Drops CAP_IPC_LOCK, under which io_uring does not charge RLIMIT_MEMLOCK. */
static int drop_ipc_lock(void)
{
	struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];

	if (syscall(SYS_capget, &hdr, data) < 0)
		return -errno;
	data[CAP_TO_INDEX(CAP_IPC_LOCK)].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
	return syscall(SYS_capset, &hdr, data) < 0 ? -errno : 0;
}

static int no_memlock_child(struct dir *d, const char *log_path)
{
	struct file_tier_config cfg = config(d, 2, 32, 4, false, NULL);
	/* Room for the ring itself (recent kernels charge it too), not for 4 x 20 KiB buffers. */
	struct rlimit rl = { 64 << 10, 64 << 10 };
	struct file_tier *t = NULL;
	char log[4096] = "";
	int fd;

	fd = open(log_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || dup2(fd, STDERR_FILENO) < 0)
		return 1;
	if (drop_ipc_lock() < 0 || setrlimit(RLIMIT_MEMLOCK, &rl) < 0)
		return 2;
	if (file_tier_open(&cfg, &t) < 0)
		return 3;
	/* The ring could not pin the staging buffers, and said so. */
	if (pread(fd, log, sizeof(log) - 1, 0) < 0 || !strstr(log, "unregistered buffers"))
		return 4;
	for (uint32_t i = 0; i < 32; i++)
		if (store_raw(t, i, i, 0) < 0)
			return 5;
	for (uint32_t i = 0; i < 32; i++)
		if (load_raw(t, i, i, 0) != 0)
			return 6;
	file_tier_flush(t);
	for (uint32_t i = 0; i < 32; i++)
		if (load_raw(t, i, i, 0) != 0)
			return 7;
	file_tier_close(t);
	return 0;
}

/* An unprivileged daemon without LimitMEMLOCK: plain reads and writes, the same results. */
START_TEST(test_file_no_memlock)
{
	char log_path[96];
	struct dir d;
	pid_t pid;
	int status;

	dir_make(&d, "/tmp");
	snprintf(log_path, sizeof(log_path), "%s/log", d.path);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(no_memlock_child(&d, log_path));
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "child failed check %d (status 0x%x)", WEXITSTATUS(status), status);
	unlink(log_path);
	dir_remove(&d);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("tier");
	TCase *host = tcase_create("host"), *file = tcase_create("file");

	tcase_add_test(host, test_host_round_trip);
	tcase_add_test(host, test_host_arena_and_slot_access);
	tcase_add_test(file, test_file_bad_config);
	tcase_add_test(file, test_file_round_trip);
	tcase_add_test(file, test_file_round_trip_shm);
	tcase_add_test(file, test_file_load_in_flight);
	tcase_add_test(file, test_file_corrupt_data);
	tcase_add_test(file, test_file_persist);
	tcase_add_test(file, test_file_keyed_checksums);
	tcase_add_test(file, test_file_locked);
	tcase_add_test(file, test_file_refuses_unsafe_files);
	tcase_add_test(file, test_file_scratch);
	tcase_add_test(file, test_file_event_fd);
	tcase_add_test(file, test_file_async_load);
	tcase_add_test(file, test_file_async_corrupt);
	tcase_add_test(file, test_file_async_with_stores);
	tcase_add_test(file, test_file_async_with_sync_calls);
	tcase_add_test(file, test_file_async_busy);
	tcase_add_test(file, test_file_async_no_reads);
	tcase_add_test(file, test_file_full);
	tcase_add_test(file, test_file_lost_superseded);
	tcase_add_test(file, test_file_no_memlock);
	suite_add_tcase(s, host);
	suite_add_tcase(s, file);
	return run_suite(s);
}

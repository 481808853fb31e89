/* SPDX-License-Identifier: MIT */
/*
 * What someone who knows the file tier's slot format (docs/tiers-storage.md) but not its key
 * can write: a slot that keeps its identity, gets other data, and checksums computed the only
 * way such a forger can, as plain XXH3 (which is also what the format before keyed checksums,
 * version 1, wrote).  For the tests that check such a slot is never found nor served.
 */
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Offsets in the slot header (the doc's table). */
#define FORGE_VERSION_AT 8
#define FORGE_DATA_SUM_AT 88
#define FORGE_HEADER_SUM_AT 96
#define FORGE_TOKENS_AT 104

/*
 * Rewrites the slot at off of the file at path: its header region (header_bytes, the identity
 * read back as it is) and data_bytes of data; version 0 keeps the header's version.  0 or
 * -errno.
 */
static inline int forge_slot(const char *path, uint64_t off, uint32_t header_bytes,
			     uint32_t block_tokens, const void *data, size_t data_bytes,
			     uint32_t version)
{
	uint8_t *mem = malloc(header_bytes + data_bytes);
	uint64_t sum;
	XXH3_state_t st;
	ssize_t n = -1;
	int fd = open(path, O_RDWR | O_CLOEXEC), r = -EIO;

	if (fd < 0 || !mem)
		goto out;
	if (pread(fd, mem, header_bytes, (off_t)off) != (ssize_t)header_bytes)
		goto out;
	if (version)
		memcpy(mem + FORGE_VERSION_AT, &version, sizeof(version));
	memcpy(mem + header_bytes, data, data_bytes);
	sum = XXH3_64bits(data, data_bytes);
	memcpy(mem + FORGE_DATA_SUM_AT, &sum, sizeof(sum));
	memset(mem + FORGE_HEADER_SUM_AT, 0, sizeof(sum));
	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, mem, FORGE_TOKENS_AT);
	XXH3_64bits_update(&st, mem + FORGE_TOKENS_AT, (size_t)block_tokens * sizeof(uint32_t));
	sum = XXH3_64bits_digest(&st);
	memcpy(mem + FORGE_HEADER_SUM_AT, &sum, sizeof(sum));
	n = pwrite(fd, mem, header_bytes + data_bytes, (off_t)off);
	/* Written through the page cache: fsync, so O_DIRECT reads see it. */
	if (n == (ssize_t)(header_bytes + data_bytes) && fsync(fd) == 0)
		r = 0;
out:
	if (fd >= 0)
		close(fd);
	free(mem);
	return r;
}

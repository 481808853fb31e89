/* SPDX-License-Identifier: MIT */
/*
 * A main() for the libFuzzer targets without libFuzzer: runs LLVMFuzzerTestOneInput once on
 * each file named, and on each file in each directory named (in name order, dot files
 * skipped), after LLVMFuzzerInitialize when the target has one -- what `fuzzer FILE...` does,
 * with any compiler.  make check replays the committed seeds this way (tests/fuzz/replay.test),
 * in the plain build and under the sanitizers.
 *
 * Each input is copied into a buffer of exactly its size, so that a read past its end is one
 * AddressSanitizer sees.  Exits 0 after at least one input, 1 when there was none or a path
 * could not be read; a target that finds a bug aborts, as under libFuzzer.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

/* Reads the whole file into a buffer of its size.  0 or -errno. */
static int read_input(const char *path, uint8_t **ret, size_t *ret_len)
{
	struct stat st;
	uint8_t *buf;
	size_t off = 0;
	int fd, r = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		r = -errno;
		goto out;
	}
	/* 1 byte for an empty file: malloc(0) may return NULL. */
	buf = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	while (off < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + off, (size_t)st.st_size - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EIO; /* the file shrank under us */
			free(buf);
			goto out;
		}
		off += (size_t)n;
	}
	*ret = buf;
	*ret_len = off;
out:
	close(fd);
	return r;
}

static int run_file(const char *path, unsigned *count)
{
	uint8_t *data = NULL;
	size_t len = 0;
	int r = read_input(path, &data, &len);

	if (r < 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(-r));
		return r;
	}
	LLVMFuzzerTestOneInput(data, len);
	free(data);
	(*count)++;
	return 0;
}

static int skip_dot_files(const struct dirent *d)
{
	return d->d_name[0] != '.';
}

static int run_path(const char *path, unsigned *count)
{
	struct dirent **names;
	struct stat st;
	int n, r = 0;

	if (stat(path, &st) < 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -errno;
	}
	if (!S_ISDIR(st.st_mode))
		return run_file(path, count);
	n = scandir(path, &names, skip_dot_files, alphasort);
	if (n < 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -errno;
	}
	for (int i = 0; i < n; i++) {
		size_t len = strlen(path) + strlen(names[i]->d_name) + 2;
		char *file = malloc(len);

		if (!file) {
			r = -ENOMEM;
		} else {
			snprintf(file, len, "%s/%s", path, names[i]->d_name);
			if (run_file(file, count) < 0)
				r = -EIO;
			free(file);
		}
		free(names[i]);
	}
	free(names);
	return r;
}

int main(int argc, char **argv)
{
	unsigned count = 0;
	int status = EXIT_SUCCESS;

	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE|DIRECTORY...\n", argv[0]);
		return 2;
	}
	if (LLVMFuzzerInitialize)
		LLVMFuzzerInitialize(&argc, &argv);
	for (int i = 1; i < argc; i++)
		if (run_path(argv[i], &count) < 0)
			status = EXIT_FAILURE;
	printf("%s: %u inputs replayed\n", argv[0], count);
	if (count == 0) {
		fprintf(stderr, "%s: no inputs found\n", argv[0]);
		status = EXIT_FAILURE;
	}
	return status;
}

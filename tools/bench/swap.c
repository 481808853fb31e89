/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-bench swap: the storage tiers against their limits, measured in the same run.
 *   - the file tier's write and read GB/s on a file in DIR, beside fio (io_uring, O_DIRECT)
 *     on the same file with the same block size (the tier's slot bytes) and queue depth;
 *   - the host tier's store+load GB/s, beside plain memcpy of the same bytes.
 * Medians over --runs.  Both sides move the same bytes: the tier's figures count whole slots
 * (header and data, what reaches the disk), as fio's do.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/tier/tier.h"
#include "tools/bench/bench.h"

#define SWAP_TOKENS 16
#define SWAP_GEOMETRY UINT64_C(0x5357415042454e43) /* any fixed value: one writer, one reader */
#define SWAP_DEFAULT_BYTES (UINT64_C(1) << 30)

extern char **environ;

struct swap_opts {
	const char *dir;
	uint32_t block_bytes;
	uint32_t slots;
	uint32_t queue_depth;
	uint32_t runs;
	bool json;
};

struct swap_blocks {
	uint8_t **srcs; /* queue_depth distinct source blocks, cycled over the slots */
	uint8_t **dsts;
	struct tier_key *keys;
	uint32_t *tokens;
	uint32_t n; /* of srcs and dsts */
};

static void swap_usage(FILE *f)
{
	fputs("usage: kvpaged-bench swap [--dir DIR] [--block-bytes N] [--slots N]\n"
	      "                          [--queue-depth N] [--runs N] [--json]\n"
	      "defaults: DIR=/var/tmp (a real disk: /tmp may be tmpfs), block 2 MiB (a 7B model's\n"
	      "16-token block), slots for ~1 GiB, queue depth 32, 5 runs; fio from PATH\n",
	      f);
}

static double gbps(uint64_t bytes, uint64_t ns)
{
	return ns ? (double)bytes / (double)ns : 0; /* bytes per ns = GB/s */
}

static void *alloc_block(size_t n)
{
	void *p = NULL;

	if (posix_memalign(&p, 4096, n))
		return NULL;
	return p;
}

static void blocks_free(struct swap_blocks *b)
{
	for (uint32_t i = 0; i < b->n; i++) {
		if (b->srcs)
			free(b->srcs[i]);
		if (b->dsts)
			free(b->dsts[i]);
	}
	free(b->srcs);
	free(b->dsts);
	free(b->keys);
	free(b->tokens);
}

static int blocks_init(struct swap_blocks *b, const struct swap_opts *o)
{
	*b = (struct swap_blocks){ .n = o->queue_depth };
	b->srcs = calloc(b->n, sizeof(*b->srcs));
	b->dsts = calloc(b->n, sizeof(*b->dsts));
	b->keys = calloc(o->slots, sizeof(*b->keys));
	b->tokens = calloc((size_t)o->slots * SWAP_TOKENS, sizeof(*b->tokens));
	if (!b->srcs || !b->dsts || !b->keys || !b->tokens)
		return -ENOMEM;
	for (uint32_t i = 0; i < b->n; i++) {
		b->srcs[i] = alloc_block(o->block_bytes);
		b->dsts[i] = alloc_block(o->block_bytes);
		if (!b->srcs[i] || !b->dsts[i])
			return -ENOMEM;
		for (uint32_t j = 0; j + 8 <= o->block_bytes; j += 8) {
			uint64_t v = mix64((uint64_t)i << 32 | j);

			memcpy(b->srcs[i] + j, &v, 8);
		}
		memset(b->dsts[i], 0, o->block_bytes);
	}
	for (uint32_t s = 0; s < o->slots; s++) {
		uint32_t *tok = b->tokens + (size_t)s * SWAP_TOKENS;

		for (uint32_t j = 0; j < SWAP_TOKENS; j++)
			tok[j] = token_of(s, j);
		b->keys[s] = (struct tier_key){
			.hash_lo = mix64(s),
			.hash_hi = mix64(s ^ 0xffffffffull),
			.parent_lo = s ? mix64(s - 1) : 0,
			.parent_hi = s ? mix64((s - 1) ^ 0xffffffffull) : 0,
			.salt = 1,
			.tokens = tok,
		};
	}
	return 0;
}

/* ---- file tier ---------------------------------------------------------------------------- */

static void count_lost(void *ctx, uint32_t slot, int err)
{
	(*(uint64_t *)ctx)++;
}

static int store_all(struct file_tier *t, const struct swap_opts *o, const struct swap_blocks *b)
{
	for (uint32_t s = 0; s < o->slots; s++) {
		int r = file_tier_store(t, s, &b->keys[s], b->srcs[s % b->n]);

		if (r < 0)
			return r;
	}
	file_tier_flush(t);
	return 0;
}

/* Loads every slot in batches of queue_depth; returns how many failed. */
static uint64_t load_all(struct file_tier *t, const struct swap_opts *o, struct swap_blocks *b,
			 uint32_t *slots, int *results)
{
	uint64_t failed = 0;

	for (uint32_t first = 0; first < o->slots; first += o->queue_depth) {
		uint32_t n = o->slots - first < o->queue_depth ? o->slots - first : o->queue_depth;

		for (uint32_t i = 0; i < n; i++)
			slots[i] = first + i;
		file_tier_load(t, n, slots, &b->keys[first], (void *const *)b->dsts, results);
		for (uint32_t i = 0; i < n; i++)
			failed += results[i] != 0;
	}
	return failed;
}

/* ---- fio ---------------------------------------------------------------------------------- */

/*
 * Runs fio once on path and returns its bandwidth in bytes/s for the job's direction.
 * -ENOENT when fio is not installed; why holds a short reason on any failure.
 */
static int run_fio(const char *path, const char *rw, uint64_t bs, uint64_t size, uint32_t qd,
		   bool fixed, double *ret_bw, char *why, size_t whylen)
{
	char a_file[4200], a_rw[32], a_bs[48], a_size[48], a_qd[48];
	/* Registered buffers and files, as the tier uses when RLIMIT_MEMLOCK allows. */
	char *argv[] = { "fio", "--name=kvpaged-swap", a_file, a_rw, a_bs, a_size, a_qd,
			 "--ioengine=io_uring", "--direct=1", "--numjobs=1", "--invalidate=1",
			 "--output-format=json", "--registerfiles", fixed ? "--fixedbufs" : NULL,
			 NULL };
	posix_spawn_file_actions_t fa;
	int pipefd[2], status = -1, r;
	char *out = NULL;
	size_t len = 0, cap = 0;
	json_object *root = NULL, *jobs, *job, *dir, *bw, *err;
	pid_t pid;

	snprintf(a_file, sizeof(a_file), "--filename=%s", path);
	snprintf(a_rw, sizeof(a_rw), "--rw=%s", rw);
	snprintf(a_bs, sizeof(a_bs), "--bs=%llu", (unsigned long long)bs);
	snprintf(a_size, sizeof(a_size), "--size=%llu", (unsigned long long)size);
	snprintf(a_qd, sizeof(a_qd), "--iodepth=%u", qd);

	if (pipe2(pipefd, O_CLOEXEC) < 0) {
		snprintf(why, whylen, "pipe: %s", strerror(errno));
		return -errno;
	}
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, pipefd[1], STDOUT_FILENO);
	posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
	r = posix_spawnp(&pid, "fio", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(pipefd[1]);
	if (r != 0) {
		close(pipefd[0]);
		if (r == ENOENT)
			snprintf(why, whylen, "fio not found (Debian: apt install fio)");
		else
			snprintf(why, whylen, "cannot run fio: %s", strerror(r));
		return -r;
	}
	for (;;) {
		ssize_t n;

		if (cap - len < 65536) {
			char *p = realloc(out, cap + 65536 + 1);

			if (!p)
				break;
			out = p;
			cap += 65536;
		}
		n = read(pipefd[0], out + len, cap - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(pipefd[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	r = -EIO;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		snprintf(why, whylen, "fio --rw=%s failed (status 0x%x)", rw, status);
		goto out;
	}
	if (!out) {
		snprintf(why, whylen, "no output from fio");
		goto out;
	}
	out[len] = '\0';
	/* Some fio versions print notes before the JSON document. */
	root = strchr(out, '{') ? json_tokener_parse(strchr(out, '{')) : NULL;
	if (!root || !json_object_object_get_ex(root, "jobs", &jobs) ||
	    !json_object_is_type(jobs, json_type_array) || json_object_array_length(jobs) < 1 ||
	    !(job = json_object_array_get_idx(jobs, 0)) ||
	    !json_object_object_get_ex(job, rw, &dir) ||
	    !json_object_object_get_ex(dir, "bw_bytes", &bw)) {
		snprintf(why, whylen, "cannot parse fio's JSON output");
		goto out;
	}
	if (json_object_object_get_ex(job, "error", &err) && json_object_get_int(err) != 0) {
		snprintf(why, whylen, "fio job error %d", json_object_get_int(err));
		goto out;
	}
	*ret_bw = json_object_get_double(bw);
	r = 0;
out:
	json_object_put(root);
	free(out);
	return r;
}

struct fio_result {
	bool ok;
	bool fixed; /* fio ran with --fixedbufs */
	double write_gbps, read_gbps;
	char why[160];
};

/*
 * One fio pass each way in bytes/s.  Registered buffers count against RLIMIT_MEMLOCK: when fio
 * fails with them, it runs (from then on) without, as the tier does.
 */
static int fio_pass(const struct swap_opts *o, const char *path, uint64_t slot_bytes,
		    struct fio_result *res, uint64_t *ret_w, uint64_t *ret_r)
{
	uint64_t size = (uint64_t)o->slots * slot_bytes;
	double w, rd;
	int r;

	for (;;) {
		r = run_fio(path, "write", slot_bytes, size, o->queue_depth, res->fixed, &w,
			    res->why, sizeof(res->why));
		if (r == 0)
			r = run_fio(path, "read", slot_bytes, size, o->queue_depth, res->fixed, &rd,
				    res->why, sizeof(res->why));
		if (r == 0 || r == -ENOENT || !res->fixed)
			break;
		res->fixed = false;
	}
	if (r < 0)
		return r;
	*ret_w = (uint64_t)w;
	*ret_r = (uint64_t)rd;
	return 0;
}

struct tier_result {
	uint64_t slot_bytes;
	double write_gbps, read_gbps;
	uint64_t errors;
};

/*
 * The tier and fio alternate run by run on the same file, so that a disk whose speed drifts
 * (a shared virtual disk does) drifts for both.
 */
static int bench_file_tier(const struct swap_opts *o, const char *path, struct swap_blocks *b,
			   struct tier_result *res, struct fio_result *fio)
{
	const char *paths[1] = { path };
	uint64_t lost = 0, *wns = calloc(o->runs, sizeof(uint64_t)),
		 *rns = calloc(o->runs, sizeof(uint64_t)),
		 *fw = calloc(o->runs, sizeof(uint64_t)), *fr = calloc(o->runs, sizeof(uint64_t));
	uint32_t *slots = calloc(o->queue_depth, sizeof(*slots));
	int *results = calloc(o->queue_depth, sizeof(*results));
	struct file_tier_config cfg = {
		.paths = paths,
		.npaths = 1,
		.nslots = o->slots,
		.block_bytes = o->block_bytes,
		.block_tokens = SWAP_TOKENS,
		.geometry = SWAP_GEOMETRY,
		.queue_depth = o->queue_depth,
		.lost = count_lost,
		.lost_ctx = &lost,
	};
	struct file_tier *t = NULL;
	int r = -ENOMEM;

	if (!wns || !rns || !fw || !fr || !slots || !results)
		goto out;
	r = file_tier_open(&cfg, &t);
	if (r < 0) {
		fprintf(stderr, "kvpaged-bench: cannot open a file tier on %s: %s\n", path,
			strerror(-r));
		goto out;
	}
	res->slot_bytes = file_tier_slot_bytes(t);
	res->errors = 0;
	/*
	 * Untimed first pass: allocates the file's blocks, so the timed writes overwrite as
	 * fio's do (fio lays its file out before it measures).
	 */
	r = store_all(t, o, b);
	if (r < 0)
		goto out;
	for (uint32_t run = 0; run < o->runs; run++) {
		uint64_t t0, t1, t2;

		/* Who goes first alternates too: a write after a read may find the disk idler. */
		if (run % 2 && fio->ok &&
		    fio_pass(o, path, res->slot_bytes, fio, &fw[run], &fr[run]) < 0)
			fio->ok = false;
		t0 = now_ns();
		r = store_all(t, o, b);
		if (r < 0)
			goto out;
		t1 = now_ns();
		res->errors += load_all(t, o, b, slots, results);
		t2 = now_ns();
		wns[run] = t1 - t0;
		rns[run] = t2 - t1;
		if (run % 2 == 0 && fio->ok &&
		    fio_pass(o, path, res->slot_bytes, fio, &fw[run], &fr[run]) < 0)
			fio->ok = false;
	}
	if (fio->ok) {
		fio->write_gbps = median_u64(fw, o->runs) / 1e9;
		fio->read_gbps = median_u64(fr, o->runs) / 1e9;
	}
	res->errors += lost;
	res->write_gbps = gbps(o->slots * res->slot_bytes, (uint64_t)median_u64(wns, o->runs));
	res->read_gbps = gbps(o->slots * res->slot_bytes, (uint64_t)median_u64(rns, o->runs));
	r = 0;
out:
	file_tier_close(t);
	free(wns);
	free(rns);
	free(fw);
	free(fr);
	free(slots);
	free(results);
	return r;
}

/* ---- host tier ---------------------------------------------------------------------------- */

struct host_result {
	double tier_gbps, memcpy_gbps;
	uint64_t errors;
};

static int bench_host_tier(const struct swap_opts *o, struct swap_blocks *b,
			   struct host_result *res)
{
	size_t bb = o->block_bytes, bytes = (size_t)o->slots * bb;
	uint64_t *tns = calloc(o->runs, sizeof(uint64_t)), *mns = calloc(o->runs, sizeof(uint64_t));
	struct host_tier *t = NULL;
	uint8_t *plain = MAP_FAILED;
	int r = -ENOMEM;

	res->errors = 0;
	if (!tns || !mns)
		goto out;
	r = host_tier_new(o->slots, o->block_bytes, SWAP_TOKENS, NULL, &t);
	if (r < 0)
		goto out;
	/* The baseline's memory is the tier's kind: anonymous, huge pages where granted. */
	plain = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (plain == MAP_FAILED) {
		r = -ENOMEM;
		goto out;
	}
	(void)madvise(plain, bytes, MADV_HUGEPAGE);
	/* Run 0 is untimed: both sides fault their pages in. */
	for (uint32_t run = 0; run <= o->runs; run++) {
		uint64_t t0 = now_ns(), t1, t2;

		for (uint32_t s = 0; s < o->slots; s++)
			host_tier_store(t, s, &b->keys[s], b->srcs[s % b->n]);
		for (uint32_t s = 0; s < o->slots; s++)
			res->errors += host_tier_load(t, s, &b->keys[s], b->dsts[s % b->n]) != 0;
		t1 = now_ns();
		for (uint32_t s = 0; s < o->slots; s++)
			memcpy(plain + (size_t)s * bb, b->srcs[s % b->n], bb);
		for (uint32_t s = 0; s < o->slots; s++)
			memcpy(b->dsts[s % b->n], plain + (size_t)s * bb, bb);
		t2 = now_ns();
		if (run > 0) {
			tns[run - 1] = t1 - t0;
			mns[run - 1] = t2 - t1;
		}
	}
	/* Each byte is copied twice: in by store (memcpy), out by load (memcpy). */
	res->tier_gbps = gbps(2 * (uint64_t)bytes, (uint64_t)median_u64(tns, o->runs));
	res->memcpy_gbps = gbps(2 * (uint64_t)bytes, (uint64_t)median_u64(mns, o->runs));
	r = 0;
out:
	if (plain != MAP_FAILED)
		munmap(plain, bytes);
	host_tier_free(t);
	free(tns);
	free(mns);
	return r;
}

/* ---- the command -------------------------------------------------------------------------- */

static void add(json_object *o, const char *key, json_object *v)
{
	json_object_object_add(o, key, v);
}

/* null when there is nothing to compare with */
static void add_ratio(json_object *o, const char *key, double num, double den, bool ok)
{
	add(o, key, ok && den > 0 ? json_object_new_double(num / den) : NULL);
}

int cmd_swap(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dir", required_argument, NULL, 'd' },
		{ "block-bytes", required_argument, NULL, 'b' },
		{ "slots", required_argument, NULL, 's' },
		{ "queue-depth", required_argument, NULL, 'q' },
		{ "runs", required_argument, NULL, 'r' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{}
	};
	struct swap_opts o = {
		.dir = "/var/tmp",
		/* 7B: 32 layers x 8 kv heads x 128 dims x fp16 x K and V x 16 tokens = 2 MiB */
		.block_bytes = 32 * 8 * 128 * 2 * 2 * 16,
		.queue_depth = 32,
		.runs = 5,
	};
	struct swap_blocks blocks = { 0 };
	struct tier_result tier = { 0 };
	struct fio_result fio = { 0 };
	struct host_result host = { 0 };
	char path[4096];
	uint32_t *target;
	int opt, fd, r;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		target = NULL;
		switch (opt) {
		case 'd': o.dir = optarg; break;
		case 'b': target = &o.block_bytes; break;
		case 's': target = &o.slots; break;
		case 'q': target = &o.queue_depth; break;
		case 'r': target = &o.runs; break;
		case 'j': o.json = true; break;
		case 'h': swap_usage(stdout); return 0;
		default: swap_usage(stderr); return 2;
		}
		if (target && (parse_u32(optarg, target) < 0 || *target == 0)) {
			fprintf(stderr, "kvpaged-bench: %s: not a positive integer\n", optarg);
			return 2;
		}
	}
	if (optind != argc || o.block_bytes > (1u << 30) || o.queue_depth > 4096 || o.runs > 1000) {
		swap_usage(stderr);
		return 2;
	}
	if (!o.slots)
		o.slots = (uint32_t)(SWAP_DEFAULT_BYTES / o.block_bytes);
	if (!o.slots)
		o.slots = 1;

	r = snprintf(path, sizeof(path), "%s/kvpaged-bench-swap.XXXXXX", o.dir);
	if (r < 0 || (size_t)r >= sizeof(path)) {
		fprintf(stderr, "kvpaged-bench: --dir too long\n");
		return 2;
	}
	fd = mkostemp(path, O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "kvpaged-bench: cannot create a file in %s: %s\n", o.dir,
			strerror(errno));
		return 1;
	}
	close(fd);

	r = blocks_init(&blocks, &o);
	fio.ok = fio.fixed = true;
	if (r >= 0)
		r = bench_file_tier(&o, path, &blocks, &tier, &fio);
	unlink(path);
	if (r >= 0)
		r = bench_host_tier(&o, &blocks, &host);
	blocks_free(&blocks);
	if (r < 0) {
		fprintf(stderr, "kvpaged-bench: swap: %s\n", strerror(-r));
		return 1;
	}

	if (o.json) {
		json_object *j = json_object_new_object();

		add(j, "dir", json_object_new_string(o.dir));
		add(j, "block_bytes", json_object_new_int64(o.block_bytes));
		add(j, "slot_bytes", json_object_new_int64((int64_t)tier.slot_bytes));
		add(j, "slots", json_object_new_int64(o.slots));
		add(j, "queue_depth", json_object_new_int64(o.queue_depth));
		add(j, "runs", json_object_new_int64(o.runs));
		add(j, "tier_write_gbps", json_object_new_double(tier.write_gbps));
		add(j, "tier_read_gbps", json_object_new_double(tier.read_gbps));
		add(j, "tier_errors", json_object_new_int64((int64_t)tier.errors));
		add(j, "fio", json_object_new_boolean(fio.ok));
		add(j, "fio_fixedbufs", json_object_new_boolean(fio.ok && fio.fixed));
		if (!fio.ok)
			add(j, "fio_error", json_object_new_string(fio.why));
		add(j, "fio_write_gbps", fio.ok ? json_object_new_double(fio.write_gbps) : NULL);
		add(j, "fio_read_gbps", fio.ok ? json_object_new_double(fio.read_gbps) : NULL);
		add_ratio(j, "write_ratio", tier.write_gbps, fio.write_gbps, fio.ok);
		add_ratio(j, "read_ratio", tier.read_gbps, fio.read_gbps, fio.ok);
		add(j, "host_gbps", json_object_new_double(host.tier_gbps));
		add(j, "memcpy_gbps", json_object_new_double(host.memcpy_gbps));
		add_ratio(j, "host_ratio", host.tier_gbps, host.memcpy_gbps, true);
		add(j, "host_errors", json_object_new_int64((int64_t)host.errors));
		json_print(j);
	} else {
		printf("swap: %u slots of %u bytes (%llu on disk), depth %u, %s, median of %u\n",
		       o.slots, o.block_bytes, (unsigned long long)tier.slot_bytes, o.queue_depth, o.dir,
		       o.runs);
		if (fio.ok) {
			printf("file tier write %6.2f GB/s   fio %6.2f GB/s   ratio %.2f\n",
			       tier.write_gbps, fio.write_gbps, tier.write_gbps / fio.write_gbps);
			printf("file tier read  %6.2f GB/s   fio %6.2f GB/s   ratio %.2f\n",
			       tier.read_gbps, fio.read_gbps, tier.read_gbps / fio.read_gbps);
		} else {
			printf("file tier write %6.2f GB/s   read %6.2f GB/s   (no fio: %s)\n",
			       tier.write_gbps, tier.read_gbps, fio.why);
		}
		printf("host tier       %6.2f GB/s   memcpy %6.2f GB/s   ratio %.2f\n",
		       host.tier_gbps, host.memcpy_gbps, host.tier_gbps / host.memcpy_gbps);
		if (tier.errors || host.errors)
			printf("errors: file tier %llu, host tier %llu\n",
			       (unsigned long long)tier.errors, (unsigned long long)host.errors);
	}
	/* A tier that lost or refused its own blocks measured something other than swapping. */
	return tier.errors || host.errors ? 1 : 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend through the real daemon and real client processes: two processes map the
 * same GPU pool and read each other's bytes; the daemon's copy-on-write and token gather give
 * identical bytes on the GPU; blocks swapped out through the host and file tiers come back
 * byte for byte (through both swap paths), the host tier's moving straight between the pool
 * and its pinned slots; a client killed while writing leaves the pool and the daemon intact;
 * the pool's device key picks the GPU.  Exits 77 without a GPU.
 *
 * The test process itself never initializes CUDA before Check forks a test (see gpu.h); each
 * test, and each client process it forks, does on its own.
 */
#include "tests/gpu/gpu.h"
#include "tests/integration/harness.h"

static struct daemon d;

/* 2 layers, 2 heads, dim 64, bf16, 16 tokens: 16 KiB blocks of 256-byte slots. */
#define GEOMETRY                                                                               \
	"[pool main]\nbackend = cuda\nlayers = 2\nkv_heads = 2\nhead_dim = 64\n"               \
	"element_bytes = 2\nblock_tokens = 16\n"

static struct kvp_client *gpu_connect(void)
{
	struct kvp_connect_options o = { .size = sizeof(o), .client_name = "gpu-test" };
	struct kvp_client *c = NULL;
	char err[256] = "";

	o.error_buf = err;
	o.error_len = sizeof(err);
	if (kvp_connect(&o, &c) < 0) {
		fprintf(stderr, "kvp_connect: %s\n", err);
		return NULL;
	}
	if (strcmp(kvp_pool(c)->backend, "cuda") || !kvp_pool_device_ptr(c) || kvp_pool_base(c)) {
		fprintf(stderr, "the pool is not a mapped GPU pool (backend %s)\n",
			kvp_pool(c)->backend);
		return kvp_disconnect(c);
	}
	gpu_use(0);
	return c;
}

static uint64_t block_addr(struct kvp_client *c, uint32_t block)
{
	return kvp_pool_device_ptr(c) + (uint64_t)block * kvp_pool(c)->block_stride;
}

static void write_block(struct kvp_client *c, uint32_t block, uint64_t tag)
{
	uint64_t n = kvp_pool(c)->block_bytes;
	uint8_t *buf = malloc(n);

	gpu_fill(buf, n, tag);
	gpu_write(block_addr(c, block), buf, n);
	free(buf);
}

static bool block_is(struct kvp_client *c, uint32_t block, uint64_t tag)
{
	uint64_t n = kvp_pool(c)->block_bytes;
	uint8_t *want = malloc(n), *got = malloc(n);
	bool same;

	gpu_fill(want, n, tag);
	gpu_read(got, block_addr(c, block), n);
	same = !memcmp(want, got, n);
	free(want);
	free(got);
	return same;
}

static bool blocks_equal(struct kvp_client *c, uint32_t a, uint32_t b)
{
	uint64_t n = kvp_pool(c)->block_bytes;
	uint8_t *x = malloc(n), *y = malloc(n);
	bool same;

	gpu_read(x, block_addr(c, a), n);
	gpu_read(y, block_addr(c, b), n);
	same = !memcmp(x, y, n);
	free(x);
	free(y);
	return same;
}

static void wait_byte(int fd)
{
	char b;

	if (read(fd, &b, 1) != 1)
		_exit(3);
}

/* A client process: 0 when everything it checked held. */
static int writer(int to_reader, int from_reader)
{
	struct kvp_client *c = gpu_connect();

	if (!c)
		return 1;
	for (uint32_t b = 0; b < 4; b++)
		write_block(c, b, 100 + b);
	if (write(to_reader, "w", 1) != 1)
		return 2;
	wait_byte(from_reader);
	/* What the other process wrote, read here while both have the pool mapped. */
	for (uint32_t b = 4; b < 6; b++)
		if (!block_is(c, b, 200 + b))
			return 4;
	kvp_disconnect(c);
	return 0;
}

static int reader(int from_writer, int to_writer)
{
	struct kvp_client *c;

	wait_byte(from_writer);
	c = gpu_connect();
	if (!c)
		return 1;
	for (uint32_t b = 0; b < 4; b++)
		if (!block_is(c, b, 100 + b))
			return 4;
	for (uint32_t b = 4; b < 6; b++)
		write_block(c, b, 200 + b);
	if (write(to_writer, "r", 1) != 1)
		return 2;
	kvp_disconnect(c);
	return 0;
}

static void expect_exit0(pid_t pid, const char *who)
{
	int status;

	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: status %d", who, status);
}

START_TEST(test_two_processes_share)
{
	int wr[2], rw[2];
	pid_t a, b;

	daemon_start(&d, GEOMETRY "capacity_blocks = 64\n");
	ck_assert_int_eq(pipe2(wr, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(rw, O_CLOEXEC), 0);
	a = fork();
	if (a == 0)
		_exit(writer(wr[1], rw[0]));
	b = fork();
	if (b == 0)
		_exit(reader(wr[0], rw[1]));
	expect_exit0(a, "writer");
	expect_exit0(b, "reader");
	assert_verified(&d);
	daemon_stop(&d);
}
END_TEST

/* The byte run of position pos's K (kv 0) or V (kv 1) in layer l. */
static void slot_bytes(uint8_t *buf, uint64_t n, uint32_t pos, uint32_t l, uint32_t kv)
{
	gpu_fill(buf, n, (uint64_t)pos * 1000 + l * 10 + kv + 1);
}

/* Writes (or checks) a slot's K and V in every layer. */
static bool slot_kv(struct kvp_client *c, uint32_t block, uint32_t slot, uint32_t pos, bool write)
{
	const struct kvp_pool_info *p = kvp_pool(c);
	uint8_t want[4096], got[4096];
	bool same = true;

	ck_assert_uint_le(p->slot_stride, sizeof(want));
	for (uint32_t l = 0; l < p->layers; l++)
		for (uint32_t kv = 0; kv < 2; kv++) {
			uint64_t at = block_addr(c, block) + l * p->layer_stride + kv * p->kv_stride +
				      slot * p->slot_stride;

			slot_bytes(want, p->slot_stride, pos, l, kv);
			if (write) {
				gpu_write(at, want, p->slot_stride);
				continue;
			}
			gpu_read(got, at, p->slot_stride);
			same = same && !memcmp(want, got, p->slot_stride);
		}
	return same;
}

/*
 * Copy-on-write: a forked sequence appending into a shared, partly filled block gets a copy,
 * made by the daemon on the GPU, equal to the original.  Token gather: h2o at token
 * granularity packs survivors into new blocks; each packed slot holds its position's K/V.
 */
START_TEST(test_cow_and_gather)
{
	struct kvp_retention keep = { .size = sizeof(keep), .policy = KVP_RETAIN_H2O,
				      .recent = 16, .budget = 32, .granularity = 1 };
	struct kvp_table t = { 0 }, ct = { 0 }, packed = { 0 }, pos = { 0 };
	uint32_t p[64], tok = 7;
	uint64_t s, child;
	struct kvp_client *c;
	float w[16];

	daemon_start(&d, GEOMETRY "capacity_blocks = 64\n");
	c = gpu_connect();
	ck_assert_ptr_nonnull(c);
	prompt(p, 24, 1);
	ck_assert_int_eq(kvp_open(c, p, 24, 0, 0, &s, NULL, &t), 0);
	ck_assert_uint_eq(t.len, 2);
	write_block(c, t.blocks[0], 1);
	write_block(c, t.blocks[1], 2);
	ck_assert_int_eq(kvp_commit(c, s, 24, &t), 0);
	ck_assert_int_eq(kvp_fork(c, s, &child, &ct), 0);
	ck_assert_uint_eq(ct.blocks[1], t.blocks[1]);
	ck_assert_int_eq(kvp_append(c, child, &tok, 1, &ct), 0);
	ck_assert_uint_ne(ct.blocks[1], t.blocks[1]); /* copied before the child writes */
	ck_assert_uint_eq(ct.blocks[0], t.blocks[0]); /* full blocks stay shared */
	ck_assert_msg(blocks_equal(c, ct.blocks[1], t.blocks[1]), "the copy differs");
	ck_assert(block_is(c, t.blocks[1], 2));
	ck_assert_int_eq(kvp_close(c, child), 0);
	ck_assert_int_eq(kvp_close(c, s), 0);

	prompt(p, 64, 5000);
	ck_assert_int_eq(kvp_open_retained(c, p, 64, 0, 0, &keep, &s, NULL, &t), 0);
	for (uint32_t q = 0; q < 64; q++)
		slot_kv(c, t.blocks[q / 16], q % 16, q, true);
	for (uint32_t b = 0; b < 4; b++) {
		for (uint32_t i = 0; i < 16; i++)
			w[i] = b * 16 + i >= 48 ? 1.0f : (b * 16 + i) % 7 == 0 ? 10.0f : 0.01f;
		ck_assert_int_eq(kvp_report_scores(c, s, b * 16, w, 16), 0);
	}
	ck_assert_int_eq(kvp_commit(c, s, 64, NULL), 0);
	ck_assert_int_eq(kvp_seq_packed(c, s, &packed, &pos), 0);
	ck_assert_uint_eq(pos.len, 16);
	for (uint32_t k = 0; k < pos.len; k++)
		ck_assert_msg(slot_kv(c, packed.blocks[k / 16], k % 16, pos.blocks[k], false),
			      "packed slot %u does not hold position %u's K/V", k, pos.blocks[k]);
	assert_verified(&d);
	kvp_table_free(&t);
	kvp_table_free(&ct);
	kvp_table_free(&packed);
	kvp_table_free(&pos);
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

/*
 * A client killed while it writes into its blocks: the daemon, the pool and others go on.  The
 * victim is forked before this process initializes CUDA (a child of a process that did cannot
 * use it).
 */
START_TEST(test_killed_client)
{
	struct kvp_table t = { 0 };
	struct kvp_client *c;
	uint32_t p[32], cached = 0;
	int ready[2], status;
	uint64_t s;
	pid_t victim;

	daemon_start(&d, GEOMETRY "capacity_blocks = 64\n");
	ck_assert_int_eq(pipe2(ready, O_CLOEXEC), 0);
	victim = fork();
	if (victim == 0) {
		struct kvp_client *v = gpu_connect();
		struct kvp_table vt = { 0 };
		uint32_t vp[64];
		uint64_t vs;

		if (!v)
			_exit(1);
		prompt(vp, 64, 9000);
		if (kvp_open(v, vp, 64, 0, 0, &vs, NULL, &vt) < 0)
			_exit(2);
		if (write(ready[1], "k", 1) != 1)
			_exit(3);
		for (uint64_t i = 0;; i++)
			write_block(v, vt.blocks[i % vt.len], i);
	}
	close(ready[1]);
	wait_byte(ready[0]);

	c = gpu_connect();
	ck_assert_ptr_nonnull(c);
	prompt(p, 32, 1);
	ck_assert_int_eq(kvp_open(c, p, 32, 0, 0, &s, NULL, &t), 0);
	write_block(c, t.blocks[0], 11);
	write_block(c, t.blocks[1], 12);
	ck_assert_int_eq(kvp_commit(c, s, 32, &t), 0);
	kill(victim, SIGKILL);
	ck_assert_int_eq(waitpid(victim, &status, 0), victim);
	ck_assert(WIFSIGNALED(status));

	/* The daemon notices the hang-up, releases the victim's blocks, and still serves. */
	msleep(200);
	assert_verified(&d);
	ck_assert(block_is(c, t.blocks[0], 11));
	ck_assert(block_is(c, t.blocks[1], 12));
	kvp_disconnect(c);
	c = gpu_connect();
	ck_assert_ptr_nonnull(c);
	ck_assert_int_eq(kvp_open(c, p, 32, 0, 0, &s, &cached, &t), 0);
	ck_assert_uint_eq(cached, 32);
	ck_assert(block_is(c, t.blocks[0], 11));
	ck_assert(block_is(c, t.blocks[1], 12));
	kvp_table_free(&t);
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

/* Opens a prompt of n tokens, writes each block's pattern (tag + i), commits, returns the id. */
static uint64_t fill(struct kvp_client *c, const uint32_t *t, uint32_t n, uint64_t tag,
		     struct kvp_table *tab)
{
	uint32_t cached = 0;
	uint64_t s;

	ck_assert_int_eq(kvp_open(c, t, n, 0, KVP_OPEN_PRIORITY(5), &s, &cached, tab), 0);
	for (uint32_t i = cached / 16; i < tab->len; i++)
		write_block(c, tab->blocks[i], tag + i);
	ck_assert_int_eq(kvp_commit(c, s, n, tab), 0);
	return s;
}

/*
 * The tiers through the GPU pool (as tests/integration/test-tiers.c on a host pool): a parked
 * sequence is swapped out to the host tier, pushed on to the swap file, and resumed; another
 * prompt comes back whole from the tiers.  Every block is compared on the GPU.
 */
static void swap_through_tiers(const char *swap)
{
	uint32_t ta[64], tb[128], tc[128], rec = 99, cached = 0;
	struct kvp_table tab_a = { 0 }, tab_b = { 0 }, tab_c = { 0 }, tr = { 0 };
	char dir[64], pool[1024];
	struct kvp_client *c1, *c2;
	uint64_t sa, sb, sc;

	setenv("KVPAGED_TEST_CUDA_SWAP", swap, 1);
	strcpy(dir, "/tmp/kvpaged-gpu-swap-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(pool, sizeof(pool),
		 GEOMETRY "capacity_blocks = 8\nhost_tier_blocks = 4\nfile_tier_blocks = 64\n"
			  "swap_files = %s/swap0\n",
		 dir);
	daemon_start(&d, pool);
	/* The host tier is pinned, so pool <-> host tier moves skip the staging. */
	ck_assert_msg(daemon_log_has(&d, "pinned for direct moves"), "the host tier is not pinned");
	prompt(ta, 64, 100);
	prompt(tb, 128, 3000);
	prompt(tc, 128, 6000);
	c1 = gpu_connect();
	c2 = gpu_connect();
	ck_assert_ptr_nonnull(c1);
	ck_assert_ptr_nonnull(c2);

	sa = fill(c1, ta, 64, 0x10, &tab_a);
	ck_assert_int_eq(kvp_park(c1, sa), 0);
	sb = fill(c2, tb, 128, 0x30, &tab_b); /* 8 blocks: a goes to the host tier */
	ck_assert_int_eq(kvp_close(c2, sb), 0);
	sc = fill(c2, tc, 128, 0x50, &tab_c); /* b goes down too, pushing a on to the file */
	ck_assert_int_eq(kvp_close(c2, sc), 0);
	assert_verified(&d);

	ck_assert_int_eq(kvp_resume(c1, sa, &rec, &tr), 0);
	ck_assert_uint_eq(tr.len, 4);
	ck_assert_uint_le(rec, 16);
	for (uint32_t i = 0; i < 3; i++)
		ck_assert_msg(block_is(c1, tr.blocks[i], 0x10 + i),
			      "block %u of the resumed sequence differs (%s)", i, swap);
	ck_assert_int_eq(kvp_close(c1, sa), 0);
	ck_assert_int_eq(kvp_open(c2, tb, 128, 0, 0, &sb, &cached, &tab_b), 0);
	ck_assert_uint_eq(cached, 128);
	for (uint32_t i = 0; i < 8; i++)
		ck_assert_msg(block_is(c2, tab_b.blocks[i], 0x30 + i),
			      "block %u of b differs after the tiers (%s)", i, swap);
	assert_verified(&d);
	kvp_table_free(&tab_a);
	kvp_table_free(&tab_b);
	kvp_table_free(&tab_c);
	kvp_table_free(&tr);
	kvp_disconnect(c1);
	kvp_disconnect(c2);
	daemon_stop(&d);
	snprintf(pool, sizeof(pool), "%s/swap0", dir);
	unlink(pool);
	rmdir(dir);
}

START_TEST(test_swap_dma)
{
	swap_through_tiers("dma");
}
END_TEST

START_TEST(test_swap_kernel)
{
	swap_through_tiers("kernel");
}
END_TEST

/*
 * The host tier alone (no file tier): every swap goes straight between the pool and a pinned
 * slot, one move per store and one per load.  A parked sequence goes out and comes back; a
 * closed prompt's cached blocks go out and are found again whole.
 */
static void swap_through_host_tier(const char *swap)
{
	uint32_t ta[64], tb[128], tc[128], rec = 99, cached = 0;
	struct kvp_table tab_a = { 0 }, tab_b = { 0 }, tab_c = { 0 }, tr = { 0 };
	struct kvp_client *c1, *c2;
	uint64_t sa, sb, sc;

	setenv("KVPAGED_TEST_CUDA_SWAP", swap, 1);
	daemon_start(&d, GEOMETRY "capacity_blocks = 8\nhost_tier_blocks = 16\n"
				  "host_tier_bandwidth = auto\n");
	ck_assert_msg(daemon_log_has(&d, "pinned for direct moves"), "the host tier is not pinned");
	/* auto times the pool's own moves to pinned memory: the bus, never 0 on a working GPU. */
	ck_assert_msg(daemon_log_has(&d, "measured tier bandwidth: host") &&
			      !daemon_log_has(&d, "host 0.00 GB/s"),
		      "the host tier's bandwidth was not measured through the device");
	prompt(ta, 64, 100);
	prompt(tb, 128, 3000);
	prompt(tc, 128, 6000);
	c1 = gpu_connect();
	c2 = gpu_connect();
	ck_assert_ptr_nonnull(c1);
	ck_assert_ptr_nonnull(c2);

	sa = fill(c1, ta, 64, 0x10, &tab_a);
	ck_assert_int_eq(kvp_park(c1, sa), 0);
	sb = fill(c2, tb, 128, 0x30, &tab_b); /* 8 blocks: a goes out to the host tier */
	ck_assert_int_eq(kvp_close(c2, sb), 0);
	sc = fill(c2, tc, 128, 0x50, &tab_c); /* b's cached blocks go out too */
	ck_assert_int_eq(kvp_close(c2, sc), 0);
	assert_verified(&d);

	ck_assert_int_eq(kvp_resume(c1, sa, &rec, &tr), 0);
	ck_assert_uint_eq(tr.len, 4);
	ck_assert_uint_le(rec, 16);
	for (uint32_t i = 0; i < 3; i++)
		ck_assert_msg(block_is(c1, tr.blocks[i], 0x10 + i),
			      "block %u of the resumed sequence differs (%s)", i, swap);
	ck_assert_int_eq(kvp_close(c1, sa), 0);
	ck_assert_int_eq(kvp_open(c2, tb, 128, 0, 0, &sb, &cached, &tab_b), 0);
	ck_assert_uint_eq(cached, 128);
	for (uint32_t i = 0; i < 8; i++)
		ck_assert_msg(block_is(c2, tab_b.blocks[i], 0x30 + i),
			      "block %u of b differs after the host tier (%s)", i, swap);
	assert_verified(&d);
	kvp_table_free(&tab_a);
	kvp_table_free(&tab_b);
	kvp_table_free(&tab_c);
	kvp_table_free(&tr);
	kvp_disconnect(c1);
	kvp_disconnect(c2);
	daemon_stop(&d);
}

START_TEST(test_host_tier_dma)
{
	swap_through_host_tier("dma");
}
END_TEST

START_TEST(test_host_tier_kernel)
{
	swap_through_host_tier("kernel");
}
END_TEST

/*
 * The pool's device key reaches the module: a pool on the last device is mapped there by a
 * client; one past it stops a cuda pool with a message naming the ordinal, and makes an auto
 * pool use host memory.
 */
START_TEST(test_device_key)
{
	char conf[512], log[8192], want[64];
	struct kvp_client *c;
	int count = 0, ordinal = -1;

	gpu_use(0);
	GPU_OK(cu.cuDeviceGetCount(&count));
	ck_assert_int_ge(count, 1);

	snprintf(conf, sizeof(conf), GEOMETRY "capacity_blocks = 64\ndevice = %d\n", count - 1);
	daemon_start(&d, conf);
	c = gpu_connect();
	ck_assert_ptr_nonnull(c);
	GPU_OK(cu.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
					(CUdeviceptr)kvp_pool_device_ptr(c)));
	ck_assert_int_eq(ordinal, count - 1);
	kvp_disconnect(c);
	assert_verified(&d);
	daemon_stop(&d);

	snprintf(conf, sizeof(conf), GEOMETRY "capacity_blocks = 64\ndevice = %d\n", count);
	snprintf(want, sizeof(want), "no CUDA device %d", count);
	ck_assert_int_ne(daemon_refuses(conf, log, sizeof(log)), 0);
	ck_assert_msg(strstr(log, "pool main: backend = cuda") && strstr(log, want),
		      "unclear refusal: %s", log);

	snprintf(conf, sizeof(conf),
		 "[pool main]\nbackend = auto\ndevice = %d\nlayers = 2\nkv_heads = 2\n"
		 "head_dim = 64\nelement_bytes = 2\nblock_tokens = 16\ncapacity_blocks = 64\n",
		 count);
	daemon_start(&d, conf);
	ck_assert(daemon_log_has(&d, "backend = auto: using host memory"));
	c = connect_ns(NULL, 0);
	ck_assert_str_eq(kvp_pool(c)->backend, "host");
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("gpu-share");
	TCase *tc = tcase_create("gpu-share");

	if (gpu_skip())
		return GPU_SKIP;
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_two_processes_share);
	tcase_add_test(tc, test_cow_and_gather);
	tcase_add_test(tc, test_killed_client);
	tcase_add_test(tc, test_swap_dma);
	tcase_add_test(tc, test_swap_kernel);
	tcase_add_test(tc, test_host_tier_dma);
	tcase_add_test(tc, test_host_tier_kernel);
	tcase_add_test(tc, test_device_key);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

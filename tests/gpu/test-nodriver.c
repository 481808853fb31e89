/* SPDX-License-Identifier: MIT */
/*
 * The daemon where the CUDA backend cannot be had (no module, or no driver, as on the machine
 * that builds kvpaged): a pool with backend = cuda stops the daemon at start with a message
 * that says why; backend = auto falls back to host memory and serves.  Runs in every build;
 * with the module built ($KVPAGED_CUDA_MODULE_BUILT) and no driver, the real module is tried
 * too (with a driver, tests/gpu/run.sh covers the GPU instead).
 */
#include <dlfcn.h>

#include "tests/integration/harness.h"

#define POOL(backend)                                                                          \
	"[pool main]\nbackend = " backend "\nlayers = 2\nkv_heads = 2\nhead_dim = 4\n"          \
	"element_bytes = 4\nblock_tokens = 16\ncapacity_blocks = 64\n"

static void assert_serves_host(void)
{
	struct kvp_client *c = connect_ns(NULL, 0);
	struct kvp_table t = { 0 };
	uint32_t p[32];
	uint64_t s;

	ck_assert_str_eq(kvp_pool(c)->backend, "host");
	ck_assert_ptr_nonnull(kvp_pool_base(c));
	ck_assert_uint_eq(kvp_pool_device_ptr(c), 0);
	prompt(p, 32, 1);
	ck_assert_int_eq(kvp_open(c, p, 32, 0, 0, &s, NULL, &t), 0);
	memset((uint8_t *)kvp_pool_base(c) + (uint64_t)t.blocks[0] * kvp_pool(c)->block_stride, 7,
	       kvp_pool(c)->block_bytes);
	ck_assert_int_eq(kvp_commit(c, s, 32, &t), 0);
	ck_assert_int_eq(kvp_close(c, s), 0);
	kvp_table_free(&t);
	kvp_disconnect(c);
}

/* No module where the pool says: refused, naming the pool, the backend and the file. */
START_TEST(test_cuda_without_module_is_refused)
{
	char log[8192];
	int status;

	setenv("KVPAGED_CUDA_MODULE", "/nonexistent/kvpaged-cuda.so", 1);
	status = daemon_refuses(POOL("cuda"), log, sizeof(log));
	ck_assert_int_ne(status, 0);
	ck_assert_msg(strstr(log, "pool main: backend = cuda") &&
			      strstr(log, "/nonexistent/kvpaged-cuda.so") &&
			      strstr(log, "backend = auto"),
		      "unclear refusal: %s", log);
}
END_TEST

START_TEST(test_auto_without_module_serves_host)
{
	struct daemon d;

	setenv("KVPAGED_CUDA_MODULE", "/nonexistent/kvpaged-cuda.so", 1);
	daemon_start(&d, POOL("auto"));
	assert_serves_host();
	assert_verified(&d);
	daemon_stop(&d);
}
END_TEST

/* The module that was built: without a driver (or a GPU) cuda is refused, auto is host. */
START_TEST(test_built_module)
{
	const char *module = getenv("KVPAGED_CUDA_MODULE_BUILT");
	struct daemon d;
	char log[8192];

	if (!module || !*module)
		return; /* configured without --with-cuda */
	/* With a driver there may be a GPU, and the pool served: tests/gpu/run.sh covers that. */
	if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL))
		return;
	setenv("KVPAGED_CUDA_MODULE", module, 1);
	ck_assert_int_ne(daemon_refuses(POOL("cuda"), log, sizeof(log)), 0);
	ck_assert_msg(strstr(log, "pool main: backend = cuda") && strstr(log, "no CUDA driver"),
		      "unclear refusal: %s", log);
	daemon_start(&d, POOL("auto"));
	assert_serves_host();
	daemon_stop(&d);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("nodriver");
	TCase *tc = tcase_create("nodriver");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_cuda_without_module_is_refused);
	tcase_add_test(tc, test_auto_without_module_serves_host);
	tcase_add_test(tc, test_built_module);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

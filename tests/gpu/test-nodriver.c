/* SPDX-License-Identifier: MIT */
/*
 * The daemon where the CUDA backend cannot be had (no module, or no driver, as on the machine
 * that builds kvpaged): a pool with backend = cuda stops the daemon at start with a message
 * that says why; backend = auto falls back to host memory and serves.  Runs in every build;
 * with the module built ($KVPAGED_TEST_CUDA_MODULE) and no driver, the real module is tried
 * too (with a driver, tests/gpu/run.sh covers the GPU instead).
 */
#include <dlfcn.h>

#include "tests/integration/harness.h"

/* A pool on backend, whose module is the file at module. */
#define POOL(backend, module)                                                                  \
	"[pool main]\nbackend = " backend "\nbackend_module = " module "\nlayers = 2\n"          \
	"kv_heads = 2\nhead_dim = 4\nelement_bytes = 4\nblock_tokens = 16\ncapacity_blocks = 64\n"
#define NO_MODULE "/nonexistent/kvpaged-cuda.so"

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

/*
 * No module where the pool says: refused, naming the pool, the backend and the file.  The
 * configuration is the only source of the module and the device: variables that earlier builds
 * read change nothing, and are not even mentioned.
 */
START_TEST(test_cuda_without_module_is_refused)
{
	char log[8192];
	int status;

	setenv("KVPAGED_CUDA_MODULE", "/nonexistent/from-the-environment.so", 1);
	setenv("KVPAGED_CUDA_DEVICE", "1", 1);
	status = daemon_refuses(POOL("cuda", NO_MODULE), log, sizeof(log));
	ck_assert_int_ne(status, 0);
	ck_assert_msg(strstr(log, "pool main: backend = cuda") && strstr(log, NO_MODULE) &&
			      strstr(log, "backend = auto"),
		      "unclear refusal: %s", log);
	ck_assert_msg(!strstr(log, "from-the-environment") && !strstr(log, "KVPAGED_CUDA"),
		      "the daemon took the environment: %s", log);
}
END_TEST

START_TEST(test_auto_without_module_serves_host)
{
	struct daemon d;

	daemon_start(&d, POOL("auto", NO_MODULE));
	assert_serves_host();
	assert_verified(&d);
	daemon_stop(&d);
}
END_TEST

/* The module that was built: without a driver (or a GPU) cuda is refused, auto is host. */
START_TEST(test_built_module)
{
	const char *module = getenv("KVPAGED_TEST_CUDA_MODULE");
	struct daemon d;
	char log[8192], conf[512];

	snprintf(conf, sizeof(conf), POOL("cuda", "%s"), module);
	ck_assert_int_ne(daemon_refuses(conf, log, sizeof(log)), 0);
	ck_assert_msg(strstr(log, "pool main: backend = cuda") && strstr(log, "no CUDA driver"),
		      "unclear refusal: %s", log);
	snprintf(conf, sizeof(conf), POOL("auto", "%s"), module);
	daemon_start(&d, conf);
	assert_serves_host();
	daemon_stop(&d);
}
END_TEST

int main(void)
{
	const char *module = getenv("KVPAGED_TEST_CUDA_MODULE");
	Suite *s = suite_create("nodriver");
	TCase *tc = tcase_create("nodriver");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_cuda_without_module_is_refused);
	tcase_add_test(tc, test_auto_without_module_serves_host);
	/*
	 * Only where it can say something: a build with the module (--with-cuda), on a machine
	 * without a driver (with one there may be a GPU, and the pool served: tests/gpu/run.sh
	 * covers that).  Otherwise there is no such case, rather than one that passes unrun.
	 */
	if (module && *module && !dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL))
		tcase_add_test(tc, test_built_module);
	else
		printf("nodriver: the built module is not tried (%s)\n",
		       module && *module ? "a CUDA driver is here" : "built without --with-cuda");
	suite_add_tcase(s, tc);
	return run_suite(s);
}

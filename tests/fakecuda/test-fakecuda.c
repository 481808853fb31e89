/* SPDX-License-Identifier: MIT */
/*
 * The driver emulation itself (tests/fakecuda/fakecuda.c), under which fakecuda.test runs this:
 * that it refuses what a GPU would refuse -- work with no context, CUDA calls from a host
 * function, device memory touched by the host or before cuMemSetAccess, fds that are no CUDA
 * handle -- and that an error is sticky and stops host functions.  Then the daemon on it: a
 * device operation failing (FAKECUDA_FAIL_OP) in the middle of a run must stop the daemon with
 * status 1 and its log must say why (docs/cuda.md, "Device errors").
 *
 * Each test loads the driver in its own forked process (Check forks them), after setting the
 * environment the fake reads when it is loaded.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>

#include "cuda/kernels.h"
#include "tests/gpu/gpu.h"
#include "tests/integration/harness.h"

extern const unsigned char kvpd_cuda_fatbin[];

#define POOL (UINT64_C(2) << 20)

/* Expects call to return want. */
#define CU_IS(call, want)                                                                          \
	do {                                                                                       \
		CUresult got_ = (call);                                                            \
		ck_assert_msg(got_ == (want), "%s: %d, want %d", #call, (int)got_, (int)(want));   \
	} while (0)

static void load(void)
{
	char why[512];

	ck_assert_msg(cu_load(why, sizeof(why)) == 0, "%s (is LD_LIBRARY_PATH the fake's?)", why);
}

/* A pool as backend.c makes one: created, reserved, mapped; access set if asked. */
static CUdeviceptr pool(CUmemGenericAllocationHandle *h, bool access)
{
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 },
				     .requestedHandleTypes =
					     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR };
	CUmemAccessDesc desc = { .location = prop.location,
				 .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUdeviceptr base;

	GPU_OK(cu.cuMemCreate(h, POOL, &prop, 0));
	GPU_OK(cu.cuMemAddressReserve(&base, POOL, 0, 0, 0));
	GPU_OK(cu.cuMemMap(base, POOL, 0, *h, 0));
	if (access)
		GPU_OK(cu.cuMemSetAccess(base, POOL, &desc, 1));
	return base;
}

static CUfunction copy_blocks_fn(void)
{
	CUmodule m;
	CUfunction f;

	GPU_OK(cu.cuModuleLoadData(&m, kvpd_cuda_fatbin));
	GPU_OK(cu.cuModuleGetFunction(&f, m, "kvpd_copy_blocks"));
	CU_IS(cu.cuModuleGetFunction(&f, m, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
	return f;
}

static CUresult launch_copy(CUfunction f, CUstream s, uint64_t dst, uint64_t src, uint64_t bytes)
{
	struct kvpd_copy_args a = { .bytes = bytes, .n = 1, .width = 16 };
	void *params[] = { &a };

	a.e[0] = (struct kvpd_copy){ .dst = dst, .src = src };
	return cu.cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, s, params, NULL);
}

/* Work queued behind a failing operation may see its error already: the stream runs meanwhile. */
static void queued_or(CUresult r, CUresult error)
{
	ck_assert_msg(r == CUDA_SUCCESS || r == error, "%d, want 0 or %d", (int)r, (int)error);
}

/* Whether the host can read p: write(2) says EFAULT where it cannot, without a signal. */
static bool host_readable(const void *p)
{
	int fds[2];
	bool ok;

	ck_assert_int_eq(pipe2(fds, O_CLOEXEC), 0);
	ok = write(fds[1], p, 1) == 1;
	close(fds[0]);
	close(fds[1]);
	return ok;
}

START_TEST(test_context_needed)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr d;
	CUstream s;
	CUcontext ctx;

	load();
	CU_IS(cu.cuMemAlloc(&d, 4096), CUDA_ERROR_INVALID_CONTEXT);
	CU_IS(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_ERROR_INVALID_CONTEXT);
	/* The virtual memory calls name the device themselves: no context needed. */
	(void)pool(&h, true);
	GPU_OK(cu.cuDevicePrimaryCtxRetain(&ctx, 0));
	GPU_OK(cu.cuCtxPushCurrent(ctx));
	GPU_OK(cu.cuMemAlloc(&d, 4096));
	GPU_OK(cu.cuCtxPopCurrent(&ctx));
	CU_IS(cu.cuMemFree(d), CUDA_ERROR_INVALID_CONTEXT);
	CU_IS(cu.cuCtxPopCurrent(&ctx), CUDA_ERROR_INVALID_CONTEXT);
	GPU_OK(cu.cuDevicePrimaryCtxRelease(0));
	CU_IS(cu.cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
}
END_TEST

START_TEST(test_device_memory)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr d, base;
	uint8_t buf[64], *pinned;

	load();
	gpu_use(0);
	GPU_OK(cu.cuMemAlloc(&d, 4096));
	GPU_OK(cu.cuMemHostAlloc((void **)&pinned, 4096, CU_MEMHOSTALLOC_PORTABLE));
	/* Device memory faults on the host, as on a GPU; pinned memory does not. */
	ck_assert(!host_readable((void *)d));
	ck_assert(host_readable(pinned));
	base = pool(&h, false);
	ck_assert(!host_readable((void *)base));
	/* Mapped, but without cuMemSetAccess not even the driver's copies reach it. */
	CU_IS(cu.cuMemcpyHtoD(base, buf, sizeof(buf)), CUDA_ERROR_INVALID_VALUE);
	/* A copy's host side may not be device memory, nor its device side host memory. */
	CU_IS(cu.cuMemcpyDtoH((void *)d, d, 16), CUDA_ERROR_INVALID_VALUE);
	CU_IS(cu.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)buf, buf, 16), CUDA_ERROR_INVALID_VALUE);
	/* Freed memory is gone; a double free or release is refused. */
	GPU_OK(cu.cuMemFree(d));
	CU_IS(cu.cuMemFree(d), CUDA_ERROR_INVALID_VALUE);
	GPU_OK(cu.cuMemUnmap(base, POOL));
	GPU_OK(cu.cuMemAddressFree(base, POOL));
	GPU_OK(cu.cuMemRelease(h));
	CU_IS(cu.cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
	GPU_OK(cu.cuMemFreeHost(pinned));
}
END_TEST

static void CUDA_CB note_call(void *arg)
{
	CUresult *r = arg;

	/* Forbidden in a host function: the fake refuses it, and counts it. */
	*r = cu.cuStreamQuery(NULL);
}

static void CUDA_CB count(void *arg)
{
	(*(int *)arg)++;
}

START_TEST(test_host_function_may_not_call)
{
	CUresult r = CUDA_SUCCESS;
	CUstream s;

	load();
	gpu_use(0);
	GPU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	GPU_OK(cu.cuLaunchHostFunc(s, note_call, &r));
	GPU_OK(cu.cuStreamSynchronize(s));
	ck_assert_int_eq(r, CUDA_ERROR_NOT_PERMITTED);
	GPU_OK(cu.cuStreamDestroy(s));
	CU_IS(cu.cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
}
END_TEST

/*
 * A kernel reading memory the device may not access fails the context: the error is sticky,
 * later work and host functions do not run, every call returns it.  The last release resets
 * the primary context, and a new retain starts clean.
 */
START_TEST(test_sticky_error)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr base, d;
	CUcontext ctx;
	CUfunction f;
	CUstream s;
	int ran = 0;

	load();
	GPU_OK(cu.cuDevicePrimaryCtxRetain(&ctx, 0));
	GPU_OK(cu.cuCtxPushCurrent(ctx));
	base = pool(&h, false);
	f = copy_blocks_fn();
	GPU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	/* Out of the device's limits: refused at the launch. */
	{
		struct kvpd_copy_args a = { 0 };
		void *params[] = { &a };

		CU_IS(cu.cuLaunchKernel(f, 1, 1, 1, 2048, 1, 1, 0, s, params, NULL),
		      CUDA_ERROR_INVALID_VALUE);
	}
	GPU_OK(launch_copy(f, s, base + 4096, base, 4096));
	queued_or(cu.cuLaunchHostFunc(s, count, &ran), CUDA_ERROR_ILLEGAL_ADDRESS);
	CU_IS(cu.cuStreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
	ck_assert_int_eq(ran, 0);
	CU_IS(cu.cuStreamQuery(s), CUDA_ERROR_ILLEGAL_ADDRESS);
	CU_IS(cu.cuMemAlloc(&d, 4096), CUDA_ERROR_ILLEGAL_ADDRESS);
	GPU_OK(cu.cuCtxPopCurrent(&ctx));
	GPU_OK(cu.cuDevicePrimaryCtxRelease(0));
	GPU_OK(cu.cuDevicePrimaryCtxRetain(&ctx, 0));
	GPU_OK(cu.cuCtxPushCurrent(ctx));
	CU_IS(cu.cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE); /* reset with the context */
	GPU_OK(cu.cuMemAlloc(&d, 4096));
	GPU_OK(cu.cuMemUnmap(base, POOL));
	GPU_OK(cu.cuMemAddressFree(base, POOL));
	GPU_OK(cu.cuMemRelease(h));
}
END_TEST

/* A stream callback's calls and the status each was given. */
struct callbacks {
	int calls;
	CUresult status[4];
};

static void CUDA_CB callback(CUstream stream, CUresult status, void *arg)
{
	struct callbacks *c = arg;

	if (c->calls < 4)
		c->status[c->calls] = status;
	c->calls++;
}

/*
 * FAKECUDA_FAIL_OP: the second device operation fails, nothing after it runs: no host function,
 * but a stream callback queued behind the failure does, given the error (the CUDA module's
 * completions rely on that to wake the daemon).
 */
START_TEST(test_fail_op)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr base;
	CUstream s;
	uint8_t buf[16] = { 0 };
	struct callbacks cb = { 0 };
	CUresult late;
	int ran = 0;

	setenv("FAKECUDA_FAIL_OP", "2", 1);
	load();
	gpu_use(0);
	base = pool(&h, true);
	GPU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	GPU_OK(cu.cuMemsetD8Async(base, 1, 16, s));
	GPU_OK(cu.cuLaunchHostFunc(s, count, &ran));
	GPU_OK(cu.cuStreamAddCallback(s, callback, &cb, 0));
	GPU_OK(cu.cuMemsetD8Async(base, 2, 16, s));
	queued_or(cu.cuLaunchHostFunc(s, count, &ran), CUDA_ERROR_LAUNCH_FAILED);
	late = cu.cuStreamAddCallback(s, callback, &cb, 0);
	queued_or(late, CUDA_ERROR_LAUNCH_FAILED);
	CU_IS(cu.cuStreamSynchronize(s), CUDA_ERROR_LAUNCH_FAILED);
	ck_assert_int_eq(ran, 1);
	/* The first callback ran clean; the second, if it was queued, ran with the error. */
	ck_assert_int_eq(cb.calls, late == CUDA_SUCCESS ? 2 : 1);
	ck_assert_int_eq(cb.status[0], CUDA_SUCCESS);
	if (late == CUDA_SUCCESS)
		ck_assert_int_eq(cb.status[1], CUDA_ERROR_LAUNCH_FAILED);
	CU_IS(cu.cuMemcpyDtoH(buf, base, sizeof(buf)), CUDA_ERROR_LAUNCH_FAILED);
}
END_TEST

/* Only what cuMemExportToShareableHandle gave is a handle; it is a new fd, not close-on-exec. */
START_TEST(test_shareable_handles)
{
	CUmemGenericAllocationHandle h, imported;
	CUmemAllocationProp prop;
	int fd = -1, memfd;

	load();
	(void)pool(&h, true);
	GPU_OK(cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	ck_assert_int_ge(fd, 0);
	ck_assert(!(fcntl(fd, F_GETFD) & FD_CLOEXEC));
	GPU_OK(cu.cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)fd,
						 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	close(fd); /* the handle keeps its own */
	GPU_OK(cu.cuMemGetAllocationPropertiesFromHandle(&prop, imported));
	ck_assert_int_eq(prop.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
	ck_assert_int_eq(prop.location.id, 0);
	GPU_OK(cu.cuMemRelease(imported));
	memfd = memfd_create("host-pool", MFD_CLOEXEC);
	ck_assert_int_eq(ftruncate(memfd, POOL), 0);
	CU_IS(cu.cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)memfd,
						CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
	      CUDA_ERROR_INVALID_VALUE);
	close(memfd);
}
END_TEST

/* 2 layers, 2 heads, dim 64, bf16, 16 tokens: 16 KiB blocks. */
#define GEOMETRY                                                                               \
	"[pool main]\nbackend = cuda\nlayers = 2\nkv_heads = 2\nhead_dim = 64\n"               \
	"element_bytes = 2\nblock_tokens = 16\ncapacity_blocks = 64\n"

/*
 * The daemon's device fails under a client's request: the copy-on-write of a forked sequence
 * is the daemon's second device operation (the first clears the pool at start), and
 * FAKECUDA_FAIL_OP=2 fails it.  The daemon must stop by itself with status 1, saying why; the
 * client's request that waited for the copy fails.
 */
START_TEST(test_daemon_device_failure)
{
	struct kvp_table t = { 0 }, ct = { 0 };
	struct kvp_client *c;
	uint32_t p[24], tok = 7;
	uint64_t s, child;
	int status, r;
	struct daemon d;

	setenv("FAKECUDA_FAIL_OP", "2", 1);
	daemon_start(&d, GEOMETRY);
	unsetenv("FAKECUDA_FAIL_OP"); /* the daemon has it; this process counts its own */
	c = connect_ns(NULL, 0);
	ck_assert_str_eq(kvp_pool(c)->backend, "cuda");
	prompt(p, 24, 1);
	ck_assert_int_eq(kvp_open(c, p, 24, 0, 0, &s, NULL, &t), 0);
	ck_assert_int_eq(kvp_commit(c, s, 24, &t), 0);
	ck_assert_int_eq(kvp_fork(c, s, &child, &ct), 0);
	r = kvp_append(c, child, &tok, 1, &ct); /* the copy-on-write: fails on the device */
	ck_assert_msg(r < 0, "an append whose copy failed on the device succeeded");
	status = daemon_wait_exit(&d);
	ck_assert_msg(status == 1, "kvpaged exited with status %d, not 1", status);
	/* In the daemon's words, with the driver's (not only the fake's note, also on stderr). */
	ck_assert_msg(daemon_log_has(&d, "the cuda backend failed") &&
			      daemon_log_has(&d, "CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure"),
		      "the log does not say the device failed, in the driver's words");
	kvp_table_free(&t);
	kvp_table_free(&ct);
	kvp_disconnect(c);
	daemon_remove_files(&d);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fakecuda");
	TCase *tc = tcase_create("fakecuda");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_context_needed);
	tcase_add_test(tc, test_device_memory);
	tcase_add_test(tc, test_host_function_may_not_call);
	tcase_add_test(tc, test_sticky_error);
	tcase_add_test(tc, test_fail_op);
	tcase_add_test(tc, test_shareable_handles);
	tcase_add_test(tc, test_daemon_device_failure);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

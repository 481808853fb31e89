/* SPDX-License-Identifier: MIT */
/*
 * Helpers of the GPU tests and benchmark: the CUDA driver through cuda/cu.h (dlopen, so a
 * test links no driver and can say "skipped" where there is none), and the skip protocol:
 * exit 77 when no GPU can be used.
 *
 * A process that initialized CUDA cannot use it in children it forks, and Check forks each
 * test: gpu_skip() probes in a child of its own, so the test's main() never initializes CUDA.
 */
#pragma once

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda/cu.h"

#define GPU_SKIP 77

/*
 * 0 when a GPU can be used, else GPU_SKIP (and why, on stderr).  The GPU tests and benchmark
 * force each swap path through a test hook ($KVPAGED_TEST_CUDA_SWAP): a build without the
 * hooks would run the automatic path twice and claim both, so it is skipped too.
 */
static inline int gpu_skip(void)
{
	int status = 0;
	pid_t pid;

#ifndef KVPAGED_TEST_HOOKS
	fprintf(stderr, "SKIP: the swap paths are forced through a test hook "
			"(configure --enable-test-hooks)\n");
	return GPU_SKIP;
#endif
	pid = fork();
	if (pid < 0)
		return GPU_SKIP;
	if (pid == 0) {
		char why[512];
		int n = 0;

		if (cu_load(why, sizeof(why)) < 0) {
			fprintf(stderr, "SKIP: %s\n", why);
			_exit(GPU_SKIP);
		}
		if (cu.cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
			fprintf(stderr, "SKIP: no CUDA device\n");
			_exit(GPU_SKIP);
		}
		_exit(0);
	}
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return GPU_SKIP;
	return WEXITSTATUS(status) == 0 ? 0 : GPU_SKIP;
}

/* Fails the calling test with the driver's words. */
#define GPU_OK(call)                                                                               \
	do {                                                                                       \
		CUresult cr_ = (call);                                                             \
		char e_[200];                                                                      \
		if (cr_ != CUDA_SUCCESS) {                                                         \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,              \
				cu_error(cr_, e_, sizeof(e_)));                                    \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

/* Makes device's primary context (the one kvpaged and libkvpaged use) current here. */
static inline void gpu_use(int device)
{
	char why[512];
	CUcontext ctx;
	CUdevice dev;

	if (cu_load(why, sizeof(why)) < 0) {
		fprintf(stderr, "%s\n", why);
		abort();
	}
	GPU_OK(cu.cuDeviceGet(&dev, device));
	GPU_OK(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
	GPU_OK(cu.cuCtxPushCurrent(ctx));
}

/*
 * Returns once the bytes are in device memory: a copy from pageable memory may return before
 * its DMA is done, and nothing orders it against the daemon's stream (another process's).
 */
static inline void gpu_write(uint64_t dst, const void *src, size_t n)
{
	GPU_OK(cu.cuMemcpyHtoD((CUdeviceptr)dst, src, n));
	GPU_OK(cu.cuCtxSynchronize());
}

static inline void gpu_read(void *dst, uint64_t src, size_t n)
{
	GPU_OK(cu.cuMemcpyDtoH(dst, (CUdeviceptr)src, n));
}

/* Deterministic bytes: every byte depends on the seed and its offset. */
static inline void gpu_fill(uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)x;
	}
}

/* SPDX-License-Identifier: MIT */
/* The CUDA driver API through dlopen(3): see cu.h. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cu.h"

struct cu_api cu;

#define CU_STR2(x) #x
#define CU_STR(x) CU_STR2(x)

int cu_load(char *why, size_t why_len)
{
	static int result = 1; /* 1: not tried yet */
	static char first_why[512];
	void *lib;
	CUresult cr;

	if (result <= 0) {
		snprintf(why, why_len, "%s", first_why);
		return result;
	}
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		const char *e = dlerror();

		snprintf(first_why, sizeof(first_why), "no CUDA driver (%s)",
			 e ? e : "libcuda.so.1 not found");
		result = -ENOENT;
		goto out;
	}
	/* The argument is macro-expanded first: cuCtxPushCurrent looks up cuCtxPushCurrent_v2. */
#define CU_RESOLVE(fn)                                                                             \
	cu.fn = (__typeof__(fn) *)dlsym(lib, CU_STR(fn));                                          \
	if (!cu.fn) {                                                                              \
		snprintf(first_why, sizeof(first_why),                                             \
			 "the CUDA driver lacks %s: it is older than the toolkit kvpaged was built " \
			 "with",                                                                   \
			 CU_STR(fn));                                                              \
		result = -ENOSYS;                                                                  \
		goto out;                                                                          \
	}
	CU_FUNCTIONS(CU_RESOLVE)
#undef CU_RESOLVE
	cr = cu.cuInit(0);
	if (cr != CUDA_SUCCESS) {
		char e[160];

		snprintf(first_why, sizeof(first_why), "the CUDA driver did not start: %s",
			 cu_error(cr, e, sizeof(e)));
		result = -ENODEV;
		goto out;
	}
	result = 0;
out:
	/* A failed load keeps libcuda open: its symbols may be half resolved, and it is cheap. */
	snprintf(why, why_len, "%s", first_why);
	return result;
}

const char *cu_error(CUresult r, char *buf, size_t len)
{
	const char *name = NULL, *text = NULL;

	if (cu.cuGetErrorName)
		cu.cuGetErrorName(r, &name);
	if (cu.cuGetErrorString)
		cu.cuGetErrorString(r, &text);
	if (name && text)
		snprintf(buf, len, "%s: %s", name, text);
	else
		snprintf(buf, len, "CUDA error %d", (int)r);
	return buf;
}

int cu_errno(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return 0;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
	case CUDA_ERROR_INVALID_HANDLE:
		return -EINVAL;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_INVALID_DEVICE:
		return -ENODEV;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	case CUDA_ERROR_NOT_READY:
		return -EAGAIN;
	default:
		return -EIO;
	}
}

/* SPDX-License-Identifier: MIT */
/*
 * The CUDA driver API, loaded at run time: libcuda.so.1 is opened with dlopen(3) on first use,
 * so that nothing built here links the driver and a machine without one still loads the
 * module (and is told so by cu_load()).  The types are cuda.h's; the functions are called
 * through the table, as cu.cuMemCreate(...).  cuda.h's versioned names (cuMemcpyHtoD is
 * cuMemcpyHtoD_v2) are resolved the way a program linked with -lcuda would resolve them.
 *
 * Only cuda/ and the GPU tests include this (and cuda.h); the rest of kvpaged sees
 * daemon/backend/backend.h.
 */
#pragma once

#include <cuda.h>
#include <stddef.h>

#define CU_FUNCTIONS(X)                                                                            \
	X(cuInit)                                                                                  \
	X(cuDriverGetVersion)                                                                      \
	X(cuGetErrorName)                                                                          \
	X(cuGetErrorString)                                                                        \
	X(cuDeviceGet)                                                                             \
	X(cuDeviceGetCount)                                                                        \
	X(cuDeviceGetAttribute)                                                                    \
	X(cuDeviceGetName)                                                                         \
	X(cuDevicePrimaryCtxRetain)                                                                \
	X(cuDevicePrimaryCtxRelease)                                                               \
	X(cuCtxPushCurrent)                                                                        \
	X(cuCtxPopCurrent)                                                                         \
	X(cuCtxSynchronize)                                                                        \
	X(cuMemGetAllocationGranularity)                                                           \
	X(cuMemCreate)                                                                             \
	X(cuMemRelease)                                                                            \
	X(cuMemAddressReserve)                                                                     \
	X(cuMemAddressFree)                                                                        \
	X(cuMemMap)                                                                                \
	X(cuMemUnmap)                                                                              \
	X(cuMemSetAccess)                                                                          \
	X(cuMemExportToShareableHandle)                                                            \
	X(cuMemImportFromShareableHandle)                                                          \
	X(cuMemGetAllocationPropertiesFromHandle)                                                  \
	X(cuMemAlloc)                                                                              \
	X(cuMemFree)                                                                               \
	X(cuMemHostAlloc)                                                                          \
	X(cuMemFreeHost)                                                                           \
	X(cuMemsetD8Async)                                                                         \
	X(cuMemcpyAsync)                                                                           \
	X(cuMemcpyDtoDAsync)                                                                       \
	X(cuMemcpyDtoHAsync)                                                                       \
	X(cuMemcpyHtoDAsync)                                                                       \
	X(cuMemcpyDtoH)                                                                            \
	X(cuMemcpyHtoD)                                                                            \
	X(cuStreamCreate)                                                                          \
	X(cuStreamDestroy)                                                                         \
	X(cuStreamSynchronize)                                                                     \
	X(cuStreamQuery)                                                                           \
	X(cuLaunchHostFunc)                                                                        \
	X(cuStreamAddCallback)                                                                     \
	X(cuLaunchKernel)                                                                          \
	X(cuModuleLoadData)                                                                        \
	X(cuModuleUnload)                                                                          \
	X(cuModuleGetFunction)                                                                     \
	X(cuPointerGetAttribute)

struct cu_api {
#define CU_MEMBER(fn) __typeof__(fn) *fn;
	CU_FUNCTIONS(CU_MEMBER)
#undef CU_MEMBER
};

extern struct cu_api cu;

/*
 * Opens libcuda.so.1 and calls cuInit(0), once (later calls return the first result).
 * 0; -ENOENT no driver library; -ENOSYS a symbol is missing (a driver older than the
 * toolkit); -ENODEV cuInit failed (no device, driver not loaded).  why says which in words.
 * Not thread-safe: call it from one thread first.
 */
int cu_load(char *why, size_t why_len);

/* "CUDA_ERROR_OUT_OF_MEMORY: out of memory", for messages. */
const char *cu_error(CUresult r, char *buf, size_t len);

/* A driver error as a negative errno. */
int cu_errno(CUresult r);

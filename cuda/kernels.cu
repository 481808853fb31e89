// SPDX-License-Identifier: MIT
/*
 * The CUDA backend's kernels, compiled by nvcc into a fatbin that backend.c embeds and loads
 * with cuModuleLoadData (no CUDA runtime).  They only move bytes; every access is width-wide
 * (16 bytes when the layout allows), and each thread keeps four loads in flight before it
 * stores, which is what it takes to reach memory (or PCIe) bandwidth with plain loads.  The
 * grids are sized by backend.c to about what the device holds at once; the loops stride.
 */
#include <stdint.h>

#include "cuda/kernels.h"

template <typename T>
__device__ __forceinline__ void copy_run(T *dst, const T *src, uint64_t n, uint64_t first,
					 uint64_t stride)
{
	uint64_t i = first;

	for (; i + 3 * stride < n; i += 4 * stride) {
		T a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];

		dst[i] = a;
		dst[i + stride] = b;
		dst[i + 2 * stride] = c;
		dst[i + 3 * stride] = d;
	}
	for (; i < n; i += stride)
		dst[i] = src[i];
}

/* grid.y walks the copies, grid.x spreads each one over the device. */
template <typename T>
__device__ __forceinline__ void copy_blocks(const kvpd_copy_args &a, const kvpd_copy *list)
{
	const uint64_t n = a.bytes / sizeof(T);
	const uint64_t first = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;

	for (uint32_t e = blockIdx.y; e < a.n; e += gridDim.y)
		copy_run<T>((T *)list[e].dst, (const T *)list[e].src, n, first, stride);
}

extern "C" __global__ void kvpd_copy_blocks(const __grid_constant__ kvpd_copy_args a)
{
	const kvpd_copy *list = a.ext ? (const kvpd_copy *)a.ext : a.e;

	if (a.width == 16)
		copy_blocks<uint4>(a, list);
	else if (a.width == 4)
		copy_blocks<uint32_t>(a, list);
	else
		copy_blocks<uint8_t>(a, list);
}

/* One warp per run of slot_stride bytes (2 KiB for a 7B model: 32 lanes x 4 x 16 bytes). */
template <typename T>
__device__ __forceinline__ void copy_slots(const kvpd_slot_args &a, const kvpd_slot *list)
{
	const uint32_t lane = threadIdx.x % 32;
	const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
	const uint64_t warps = (uint64_t)gridDim.x * blockDim.x / 32;
	const uint32_t runs_per_slot = 2 * a.layers;
	const uint64_t runs = (uint64_t)runs_per_slot * a.n;
	const uint64_t n = a.slot_stride / sizeof(T);

	for (uint64_t r = warp; r < runs; r += warps) {
		const uint32_t e = (uint32_t)(r / runs_per_slot), run = (uint32_t)(r % runs_per_slot);
		const uint64_t off = (run / 2) * a.layer_stride + (run % 2) * a.kv_stride;
		const kvpd_slot s = list[e];
		const uint8_t *src = (const uint8_t *)a.base + s.src * a.block_bytes +
				     s.src_slot * a.slot_stride + off;
		uint8_t *dst = (uint8_t *)a.base + s.dst * a.block_bytes + s.dst_slot * a.slot_stride +
			       off;

		copy_run<T>((T *)dst, (const T *)src, n, lane, 32);
	}
}

extern "C" __global__ void kvpd_copy_slots(const __grid_constant__ kvpd_slot_args a)
{
	const kvpd_slot *list = a.ext ? (const kvpd_slot *)a.ext : a.e;

	if (a.width == 16)
		copy_slots<uint4>(a, list);
	else if (a.width == 4)
		copy_slots<uint32_t>(a, list);
	else
		copy_slots<uint8_t>(a, list);
}

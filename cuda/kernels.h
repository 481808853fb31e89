/* SPDX-License-Identifier: MIT */
/*
 * The kernels' parameters, shared by kernels.cu (nvcc) and backend.c (the C compiler).  Each
 * kernel takes one of these structs by value (__grid_constant__): the driver copies it when the
 * launch is queued, so a launch of up to KVPD_INLINE entries needs no buffer of its own, and
 * nothing that must outlive the call (every launch is asynchronous: queued on the pool's
 * stream).  A longer list is uploaded to device memory first and passed as ext; backend.c
 * keeps that buffer until the operation that used it completed.  Both structs stay under the
 * 4 KiB of parameters every device and driver accepts.
 */
#pragma once

#include <stdint.h>

#define KVPD_INLINE 200

/* One copy of kvpd_copy_blocks: device addresses (pinned host memory has one too, under UVA). */
struct kvpd_copy {
	uint64_t dst, src;
};

/*
 * kvpd_copy_blocks: n copies of bytes each.  width (16, 4 or 1) divides bytes and every
 * address.  It serves copy-on-write (pool to pool) and the batched gather and scatter of
 * swapping (pool blocks to contiguous pinned staging and back).
 */
struct kvpd_copy_args {
	uint64_t bytes;
	uint64_t ext; /* device address of n struct kvpd_copy, or 0: they are in e */
	uint32_t n;
	uint32_t width;
	struct kvpd_copy e[KVPD_INLINE];
};

/* One token slot of kvpd_copy_slots. */
struct kvpd_slot {
	uint32_t dst, dst_slot, src, src_slot;
};

/*
 * kvpd_copy_slots: n token slots of the pool at base, each every layer's K and V: 2 * layers
 * runs of slot_stride bytes at block * block_bytes + layer * layer_stride + kv * kv_stride +
 * slot * slot_stride.  width (16, 4 or 1) divides slot_stride and every stride.
 */
struct kvpd_slot_args {
	uint64_t base;
	uint64_t block_bytes, layer_stride, kv_stride, slot_stride;
	uint64_t ext; /* device address of n struct kvpd_slot, or 0: they are in e */
	uint32_t layers;
	uint32_t n;
	uint32_t width;
	uint32_t pad;
	struct kvpd_slot e[KVPD_INLINE];
};

#ifdef __cplusplus
static_assert(sizeof(struct kvpd_copy_args) <= 4096, "kernel parameters over 4 KiB");
static_assert(sizeof(struct kvpd_slot_args) <= 4096, "kernel parameters over 4 KiB");
#else
_Static_assert(sizeof(struct kvpd_copy_args) <= 4096, "kernel parameters over 4 KiB");
_Static_assert(sizeof(struct kvpd_slot_args) <= 4096, "kernel parameters over 4 KiB");
#endif

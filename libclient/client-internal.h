/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>

#include "libclient/include/kvpaged.h"
#include "proto/frame.h"
#include "proto/kvpaged.pb-c.h"
#include "proto/ring.h"

struct ring_slot {
	uint64_t user_data;
	uint32_t *table_out;
	uint32_t table_cap;
	uint32_t data_len; /* bytes of the data area this operation holds (wrap waste included) */
	bool done;
};

/*
 * The few CUDA driver calls a client needs, with plain C types (nothing outside cuda/ includes
 * CUDA headers): CUresult is int, CUdeviceptr and CUmemGenericAllocationHandle are 64 bits,
 * CUdevice is int, CUcontext a pointer.
 */
struct client_cuda_api {
	int (*init)(unsigned flags);
	int (*error_string)(int r, const char **ret);
	int (*import)(uint64_t *ret_handle, void *os_handle, int handle_type);
	int (*properties)(void *ret_prop, uint64_t handle);
	int (*granularity)(size_t *ret, const void *prop, int option);
	int (*ctx_retain)(void **ret_ctx, int device);
	int (*ctx_release)(int device);
	int (*ctx_push)(void *ctx);
	int (*ctx_pop)(void **ret_ctx);
	int (*reserve)(uint64_t *ret_ptr, size_t size, size_t alignment, uint64_t addr,
		       unsigned long long flags);
	int (*map)(uint64_t ptr, size_t size, size_t offset, uint64_t handle,
		   unsigned long long flags);
	int (*set_access)(uint64_t ptr, size_t size, const void *desc, size_t count);
	int (*unmap)(uint64_t ptr, size_t size);
	int (*address_free)(uint64_t ptr, size_t size);
	int (*release)(uint64_t handle);
};

/* A pool in GPU memory, imported through libcuda (opened with dlopen: nothing links it). */
struct client_cuda {
	struct client_cuda_api api;
	void *lib;
	uint64_t handle;  /* CUmemGenericAllocationHandle */
	uint64_t ptr;     /* CUdeviceptr: where the pool is mapped */
	uint64_t bytes;
	int device;
	bool ctx_retained, have_handle, reserved, mapped;
};

struct kvp_client {
	int fd;
	uint32_t next_seq;
	uint64_t session_id;
	struct kvp_pool_info pool;
	int pool_fd;
	void *pool_base;
	struct client_cuda cuda; /* pool.backend "cuda" */
	char ns[96];
	char err[256];
	uint32_t wait_ms; /* kvp_set_wait */
	struct kvp_probe_info probe; /* from the Welcome */

	/* rings */
	int ring_fd, sq_efd, cq_efd;
	int cq_epfd;   /* kvp_completion_fd(): made on first use, -1 until then */
	bool cq_armed; /* kvp_complete_arm() left the daemon's wake-up asked for */
	void *ring_mem;
	uint64_t ring_bytes;
	struct kvp_ring_indices *sq, *cq;
	struct kvp_sqe *sqes;
	struct kvp_cqe *cqes;
	uint8_t *data;
	uint64_t data_bytes;
	uint32_t entries, mask;
	uint32_t sq_tail, cq_head;   /* local copies */
	uint32_t slot_head;          /* oldest submission still holding data */
	uint64_t data_head, data_tail; /* free-running byte counters of the data FIFO */
	struct ring_slot *slots;
	uint32_t spin_us;
};

int client_fail(struct kvp_client *c, int r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int client_ring_init(struct kvp_client *c, uint32_t entries, uint32_t data_bytes, uint64_t bytes);
void client_ring_done(struct kvp_client *c);

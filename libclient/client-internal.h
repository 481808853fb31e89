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

struct kvp_client {
	int fd;
	uint32_t next_seq;
	uint64_t session_id;
	struct kvp_pool_info pool;
	int pool_fd;
	void *pool_base;
	char ns[96];
	char err[256];
	uint32_t wait_ms; /* kvp_set_wait */

	/* rings */
	int ring_fd, sq_efd, cq_efd;
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

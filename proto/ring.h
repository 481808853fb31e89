/* SPDX-License-Identifier: MIT */
/*
 * The shared-memory ring ABI between libkvpaged and kvpaged, modeled on io_uring.
 *
 * One memfd per session, laid out as struct kvp_ring_header says (offsets, not pointers):
 *
 *   header | SQ indices | CQ indices | SQ entries | CQ entries | data area
 *
 * - Submission queue (SQ): the client produces entries (advances sq.tail), the daemon consumes
 *   them (advances sq.head).  Completion queue (CQ): the daemon produces, the client consumes.
 * - head, tail and flags each sit on their own cache line; indices are free-running u32,
 *   entry = index & (entries - 1), entries is a power of two.
 * - Ordering: a producer fills the entry, then stores tail with release; a consumer loads tail
 *   with acquire, then reads the entry, then stores head with release.
 * - Wake-ups: the daemon sets KVP_SQ_NEED_WAKEUP in sq.flags before it sleeps; a client that
 *   sees it after publishing writes the submission eventfd.  The client sets
 *   KVP_CQ_NEED_WAKEUP in cq.flags before it sleeps; the daemon then writes the completion
 *   eventfd after publishing.  Each side re-checks the ring after setting its flag, so no
 *   wake-up is lost; a busy peer costs no syscall.
 * - The data area belongs to the client: an entry names where its input is (in_off, in_len)
 *   and where the daemon may write its output (out_off, out_len), in bytes from data_off.
 *
 * Shared memory is hostile to its reader: the daemon copies every entry before it looks at
 * it, keeps its own head/tail copies, and checks every index, offset and length.
 */
#pragma once

#include <stdint.h>

#define KVP_RING_MAGIC UINT32_C(0x474e524b) /* "KRNG" */
#define KVP_RING_ABI_VERSION 1
#define KVP_RING_CACHELINE 64

/* Feature bits in kvp_ring_header.features (none defined in ABI 1). */

struct kvp_ring_header {
	uint32_t magic;
	uint32_t abi_version;
	uint32_t features;
	uint32_t header_bytes; /* sizeof(struct kvp_ring_header) */
	uint32_t sq_entries;
	uint32_t cq_entries;
	uint32_t sqe_bytes; /* sizeof(struct kvp_sqe) */
	uint32_t cqe_bytes; /* sizeof(struct kvp_cqe) */
	uint64_t sq_off;    /* struct kvp_ring_indices */
	uint64_t cq_off;    /* struct kvp_ring_indices */
	uint64_t sqes_off;  /* sq_entries x struct kvp_sqe */
	uint64_t cqes_off;  /* cq_entries x struct kvp_cqe */
	uint64_t data_off;
	uint64_t data_bytes;
	uint64_t reserved[6];
};

struct kvp_ring_indices {
	uint32_t head;
	uint8_t pad0[KVP_RING_CACHELINE - 4];
	uint32_t tail;
	uint8_t pad1[KVP_RING_CACHELINE - 4];
	uint32_t flags;
	uint8_t pad2[KVP_RING_CACHELINE - 4];
};

#define KVP_SQ_NEED_WAKEUP (1u << 0) /* in sq.flags, set by the daemon */
#define KVP_CQ_NEED_WAKEUP (1u << 0) /* in cq.flags, set by the client */

/*
 * The only ways either side touches the indices and flags.  The mapping is written by another
 * process: plain C accesses would let the compiler reload or tear them.
 *
 * Acquire: what the peer wrote before it published this index (entries, data) is visible
 * after the load.
 */
static inline uint32_t kvp_ring_load_acquire(const uint32_t *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

/* Release: everything written before (an entry, its data; or the reading of consumed entries)
 * is visible to a peer that loads the new value with acquire. */
static inline void kvp_ring_store_release(uint32_t *p, uint32_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}

/*
 * Full fence between publishing (a tail, or a NEED_WAKEUP flag) and reading the peer's flag
 * or index: without it the load may be ordered before the store, and both sides sleep.
 */
static inline void kvp_ring_fence(void)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}

enum kvp_ring_op {
	KVP_OP_NOP = 0,      /* completes with res 0: measures the round trip */
	KVP_OP_OPEN = 1,     /* in: tokens; extra; arg: flags | priority << 8; out: table;
				value: seq; aux: cached.  With flag 2 (sinks retention), seq
				carries n_sink << 32 | recent; with flag 4 (h2o), budget << 32 |
				recent */
	KVP_OP_APPEND = 2,   /* seq; in: tokens; out: table from aux; aux: first changed entry */
	KVP_OP_COMMIT = 3,   /* seq; arg: tokens written; out: table if aux > 0 or value > 0;
				aux: replaced; value: entries released by the retention policy */
	KVP_OP_FORK = 4,     /* seq; out: child's table; value: child seq */
	KVP_OP_CLOSE = 5,    /* seq */
	KVP_OP_LOOKUP = 6,   /* in: tokens; extra; arg: flags; aux: cached tokens */
	KVP_OP_SEQ_INFO = 7, /* seq; out: table; value: tokens << 32 | committed */
	KVP_OP_PARK = 8,     /* seq */
	KVP_OP_RESUME = 9,   /* seq; out: table; aux: tokens to recompute */
	KVP_OP_SCORES = 10,  /* seq; arg: first position; in: float32 weights (h2o) */
	KVP_OP_PACKED = 11,  /* seq; out: packed blocks, then their slots' positions (h2o
				tokens); aux: packed blocks; value: positions */
	KVP_OP_MAX
};

/*
 * KVP_OP_OPEN's arg: flag bits 0..7, the priority in bits 8..31.  libkvpaged's public names
 * (KVP_OPEN_*, kvpaged.h) are asserted equal to these where both are seen (libclient/ring.c).
 */
#define KVP_RING_OPEN_RECOMPUTE_LAST (1u << 0) /* leave the last token uncached */
#define KVP_RING_OPEN_SINKS (1u << 1)          /* seq: n_sink << 32 | recent */
#define KVP_RING_OPEN_H2O (1u << 2)            /* seq: budget << 32 | recent */
#define KVP_RING_OPEN_RETENTION (KVP_RING_OPEN_SINKS | KVP_RING_OPEN_H2O) /* at most one */
#define KVP_RING_OPEN_FLAGS 0xffu
#define KVP_RING_OPEN_PRIORITY_SHIFT 8

struct kvp_sqe {
	uint8_t opcode; /* enum kvp_ring_op */
	uint8_t flags;  /* 0 */
	uint16_t reserved0;
	uint32_t arg;
	uint64_t user_data; /* echoed in the completion */
	uint64_t seq;
	uint64_t extra;
	uint32_t in_off, in_len;   /* bytes in the data area */
	uint32_t out_off, out_len; /* bytes in the data area */
	uint64_t reserved[2];
};

/* The output did not fit in out_len: the operation took effect; fetch the table with SEQ_INFO. */
#define KVP_CQE_TRUNCATED (1u << 0)

struct kvp_cqe {
	uint64_t user_data;
	int32_t res; /* 0 or a negative errno */
	uint32_t flags;
	uint64_t value;
	uint32_t out_len; /* bytes written at the entry's out_off */
	uint32_t aux;
};

_Static_assert(sizeof(struct kvp_ring_header) == 128, "ring header ABI");
_Static_assert(sizeof(struct kvp_ring_indices) == 3 * KVP_RING_CACHELINE, "ring indices ABI");
_Static_assert(sizeof(struct kvp_sqe) == 64, "sqe ABI");
_Static_assert(sizeof(struct kvp_cqe) == 32, "cqe ABI");

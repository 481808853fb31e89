/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/core/pool.h"
#include "daemon/core/value.h"

/* Metadata is allocated in one array; keep the product within what calloc can index. */
#define POOL_MAX_BLOCKS (UINT32_C(1) << 30)

int pool_init(struct pool *p, uint32_t capacity, pool_evict_fn evict, void *evict_ctx)
{
	struct core_block *blocks;

	if (capacity == 0 || capacity > POOL_MAX_BLOCKS)
		return -EINVAL;
	/* One cache line per block: a lookup touches exactly one line of metadata per block. */
	if (posix_memalign((void **)&blocks, 64, (size_t)capacity * sizeof(*blocks)))
		return -ENOMEM;
	memset(blocks, 0, (size_t)capacity * sizeof(*blocks));

	*p = (struct pool){
		.blocks = blocks,
		.capacity = capacity,
		.nfree = capacity,
		.free_head = 0,
		.lru_head = CORE_NONE,
		.lru_tail = CORE_NONE,
		.evict = evict,
		.evict_ctx = evict_ctx,
	};
	/* The free list is doubly linked so pool_claim can take any free block in O(1). */
	for (uint32_t i = 0; i < capacity; i++) {
		blocks[i].next = i + 1 < capacity ? i + 1 : CORE_NONE;
		blocks[i].prev = i > 0 ? i - 1 : CORE_NONE;
	}
	return 0;
}

void pool_done(struct pool *p)
{
	free(p->blocks);
	p->blocks = NULL;
}

static void lru_unlink(struct pool *p, uint32_t b)
{
	struct core_block *blk = &p->blocks[b];

	if (blk->prev != CORE_NONE)
		p->blocks[blk->prev].next = blk->next;
	else
		p->lru_head = blk->next;
	if (blk->next != CORE_NONE)
		p->blocks[blk->next].prev = blk->prev;
	else
		p->lru_tail = blk->prev;
	blk->prev = blk->next = CORE_NONE;
	blk->flags &= ~CORE_BLOCK_ON_LRU;
	p->ncached--;
	if (p->value)
		value_uncached(p->value, b);
}

static void lru_push_newest(struct pool *p, uint32_t b)
{
	struct core_block *blk = &p->blocks[b];

	blk->prev = p->lru_tail;
	blk->next = CORE_NONE;
	if (p->lru_tail != CORE_NONE)
		p->blocks[p->lru_tail].next = b;
	else
		p->lru_head = b;
	p->lru_tail = b;
	blk->flags |= CORE_BLOCK_ON_LRU;
	p->ncached++;
	if (p->value)
		value_cached(p->value, b);
}

static void push_free(struct pool *p, uint32_t b)
{
	struct core_block *blk = &p->blocks[b];

	if (p->value)
		value_freed(p->value, b);
	*blk = (struct core_block){
		.next = p->free_head,
		.prev = CORE_NONE,
		.state = CORE_BLOCK_FREE,
	};
	if (p->free_head != CORE_NONE)
		p->blocks[p->free_head].prev = b;
	p->free_head = b;
	p->nfree++;
}

uint32_t pool_alloc(struct pool *p)
{
	uint32_t b = p->free_head;

	if (b != CORE_NONE) {
		p->free_head = p->blocks[b].next;
		if (p->free_head != CORE_NONE)
			p->blocks[p->free_head].prev = CORE_NONE;
		p->nfree--;
	} else {
		/*
		 * Leaf-first holds by construction: a block becomes cached only after every
		 * cached child did (tables release back to front, and whoever holds a child
		 * holds its parent), so the oldest cached block has no cached child.
		 * core_verify() checks this ordering.  (Blocks a retention policy released, or
		 * a store held past their children, are the exceptions: PRUNED, LATE.)
		 */
		b = p->value ? value_victim(p->value, p->lru_head) : p->lru_head;
		if (b == CORE_NONE)
			return CORE_NONE;
		lru_unlink(p, b);
		p->evict(p->evict_ctx, b);
		if (p->value)
			value_freed(p->value, b);
		p->reused++;
	}
	p->blocks[b] = (struct core_block){
		.prev = CORE_NONE,
		.next = CORE_NONE,
		.refcount = 1,
		.state = CORE_BLOCK_FILLING,
	};
	return b;
}

int pool_claim(struct pool *p, uint32_t b)
{
	struct core_block *blk;

	if (b >= p->capacity || p->blocks[b].state != CORE_BLOCK_FREE || p->blocks[b].refcount)
		return -EBUSY;
	blk = &p->blocks[b];
	if (blk->prev != CORE_NONE)
		p->blocks[blk->prev].next = blk->next;
	else
		p->free_head = blk->next;
	if (blk->next != CORE_NONE)
		p->blocks[blk->next].prev = blk->prev;
	p->nfree--;
	*blk = (struct core_block){
		.prev = CORE_NONE,
		.next = CORE_NONE,
		.refcount = 1,
		.state = CORE_BLOCK_FILLING,
	};
	return 0;
}

void pool_ref(struct pool *p, uint32_t b)
{
	struct core_block *blk = &p->blocks[b];

	/* Someone wants it again: it is worth keeping below the pool after all. */
	blk->flags &= ~CORE_BLOCK_NODEMOTE;
	if (blk->refcount == 0 && (blk->flags & CORE_BLOCK_ON_LRU))
		lru_unlink(p, b);
	blk->refcount++;
}

void pool_unref(struct pool *p, uint32_t b)
{
	struct core_block *blk = &p->blocks[b];

	if (--blk->refcount > 0)
		return;
	if (blk->flags & CORE_BLOCK_INDEXED)
		lru_push_newest(p, b);
	else
		push_free(p, b);
}

void pool_unref_before(struct pool *p, uint32_t b, uint32_t older_than)
{
	struct core_block *blk = &p->blocks[b], *next;

	if (older_than == CORE_NONE || blk->refcount > 1 || !(blk->flags & CORE_BLOCK_INDEXED)) {
		pool_unref(p, b);
		return;
	}
	blk->refcount = 0;
	next = &p->blocks[older_than];
	blk->prev = next->prev;
	blk->next = older_than;
	if (next->prev != CORE_NONE)
		p->blocks[next->prev].next = b;
	else
		p->lru_head = b;
	next->prev = b;
	blk->flags |= CORE_BLOCK_ON_LRU;
	p->ncached++;
	if (p->value)
		value_cached(p->value, b);
}

void pool_evict(struct pool *p, uint32_t b)
{
	lru_unlink(p, b);
	p->evict(p->evict_ctx, b);
	push_free(p, b);
}

bool pool_evict_oldest(struct pool *p)
{
	if (p->lru_head == CORE_NONE)
		return false;
	pool_evict(p, p->lru_head);
	return true;
}

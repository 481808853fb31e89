/* SPDX-License-Identifier: MIT */
/*
 * The remote tier's thread (remote.h, docs/remote.md).  Two queues, each a singly linked list
 * of the caller's jobs under its own mutex: submitted (the loop links, the thread takes the
 * whole list at once) and completed (the thread links, remote_reap takes the whole list at
 * once).  Neither lock is held across I/O, sealing or a callback, so the loop's side costs a
 * few pointer writes.  An eventfd says completions wait; the counters sit under a third short
 * lock.
 *
 * The thread takes everything queued as one round: the fetches first (a session waits for
 * them), then the stores in chunks of STORE_CHUNK blocks (sealed into buffers the thread keeps,
 * so a chunk holds STORE_CHUNK sealed values at most).  Every job has its own deadline, from its
 * submit.  A batch (the fetches' GETs, or a chunk's SETs) runs until the earliest deadline of
 * the jobs in it; the commands of jobs whose deadline is still ahead that timed out only
 * because of that earlier one are asked again in the next batch, until their own deadline.  A
 * job completes as soon as every block of it has its outcome (a fetch mid-batch, in fetch_done;
 * a store after its chunk).  Between two chunks of stores the thread looks at the queue: a
 * fetch waiting there (or remote_free) goes first, and the stores not yet run stay on the
 * thread's list for after it.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "daemon/tier/remote.h"

#define STORE_CHUNK 16
#define LATENCY_SAMPLES 1024

struct fetch_ref {
	struct remote_job *job;
	struct remote_block *block;
	char key[SEAL_REDIS_KEY_LEN + 1];
	bool opening; /* stream begun: the value is being opened as it arrives */
	struct seal_stream stream;
};

struct remote {
	struct seal_geometry geometry;
	uint32_t timeout_ms, store_timeout_ms, max_inflight;
	uint64_t ttl_ms;
	struct seal_keyring *keys;
	struct redis_cluster *cluster; /* the thread's only */
	int efd;

	pthread_t thread;
	bool started;

	pthread_mutex_t queue_lock;
	pthread_cond_t queue_cond;
	struct remote_job *queue_head, *queue_tail;
	uint32_t inflight; /* blocks submitted and not yet reaped */
	uint32_t queued_fetches; /* fetch jobs in the queue (the stores look between chunks) */
	bool stop;

	pthread_mutex_t done_lock;
	struct remote_job *done_head, *done_tail;

	pthread_mutex_t stats_lock;
	struct remote_stats stats;
	uint64_t latency[LATENCY_SAMPLES];
	size_t nlatency; /* samples taken; the ring holds the last LATENCY_SAMPLES */

	/* The thread's working memory, kept across rounds. */
	struct redis_cmd *cmds;
	struct fetch_ref *refs;
	size_t cmds_cap;
	void *bufs[STORE_CHUNK];
	char store_keys[STORE_CHUNK][SEAL_REDIS_KEY_LEN + 1];
	struct redis_node_info nodes[REMOTE_MAX_NODES];
	struct remote_job *stores; /* taken, not completed: run between the rounds' fetches */
	struct remote_job *fetching; /* the round's fetches not completed yet */
};

static const char *const status_names[REMOTE_NSTATUS] = {
	[REMOTE_PENDING] = "pending", [REMOTE_OK] = "ok",	   [REMOTE_ABSENT] = "absent",
	[REMOTE_LATE] = "late",	      [REMOTE_VERIFY] = "verify failed",
	[REMOTE_DOWN] = "node down",  [REMOTE_BUSY] = "busy",	   [REMOTE_ERROR] = "error",
	[REMOTE_CANCELLED] = "cancelled",
};

const char *remote_status_name(enum remote_status s)
{
	return (unsigned)s < REMOTE_NSTATUS ? status_names[s] : "?";
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A job's deadline: timeout_ms (a fetch) or store_timeout_ms (a store) from its submit. */
static uint64_t deadline_of(const struct remote *r, const struct remote_job *job)
{
	uint32_t ms = job->kind == REMOTE_FETCH ? r->timeout_ms : r->store_timeout_ms;

	return job->submit_ns + (uint64_t)ms * 1000000u;
}

static bool job_pending(const struct remote_job *job)
{
	for (size_t i = 0; i < job->nblocks; i++)
		if (job->blocks[i].status == REMOTE_PENDING)
			return true;
	return false;
}

static enum remote_status from_redis(enum redis_status s)
{
	switch (s) {
	case REDIS_CMD_OK:
		return REMOTE_OK;
	case REDIS_CMD_NIL:
		return REMOTE_ABSENT;
	case REDIS_CMD_TIMEOUT:
		return REMOTE_LATE;
	case REDIS_CMD_DOWN:
		return REMOTE_DOWN;
	default:
		return REMOTE_ERROR;
	}
}

/* ---- the thread ------------------------------------------------------------------------- */

/*
 * Hands a finished job to the loop: it joins the done list (it leaves the inflight count when
 * reaped: until then the caller still holds its blocks).
 */
static void complete(struct remote *r, struct remote_job *job)
{
	const uint64_t one = 1;
	ssize_t n;

	job->latency_ns = now_ns() - job->submit_ns;
	job->next = NULL;
	if (job->kind == REMOTE_FETCH) {
		pthread_mutex_lock(&r->stats_lock);
		r->latency[r->nlatency++ % LATENCY_SAMPLES] = job->latency_ns;
		pthread_mutex_unlock(&r->stats_lock);
	}
	pthread_mutex_lock(&r->done_lock);
	if (r->done_tail)
		r->done_tail->next = job;
	else
		r->done_head = job;
	r->done_tail = job;
	pthread_mutex_unlock(&r->done_lock);
	/* Only EAGAIN can fail (the counter near 2^64): the loop is woken already then. */
	n = write(r->efd, &one, sizeof(one));
	(void)n;
}

static int reserve_cmds(struct remote *r, size_t n)
{
	struct redis_cmd *cmds;
	struct fetch_ref *refs;
	size_t cap = r->cmds_cap ? r->cmds_cap : 64;

	if (n <= r->cmds_cap)
		return 0;
	while (cap < n)
		cap *= 2;
	cmds = realloc(r->cmds, cap * sizeof(*cmds));
	if (!cmds)
		return -ENOMEM;
	r->cmds = cmds;
	refs = realloc(r->refs, cap * sizeof(*refs));
	if (!refs)
		return -ENOMEM;
	r->refs = refs;
	r->cmds_cap = cap;
	return 0;
}

static void count_block(struct remote *r, const struct remote_block *b, size_t bytes)
{
	pthread_mutex_lock(&r->stats_lock);
	if (b->status == REMOTE_OK)
		r->stats.hits++;
	else
		r->stats.misses[b->status]++;
	if (b->status == REMOTE_VERIFY)
		r->stats.verify[b->reason]++;
	r->stats.bytes_in += bytes;
	pthread_mutex_unlock(&r->stats_lock);
}

static void finish_job(struct remote *r, struct remote_job *job);

/* The value's opening begins: straight into the block's destination, as it arrives. */
static void fetch_begin(struct remote *r, struct fetch_ref *ref, size_t len)
{
	struct remote_block *b = ref->block;
	struct seal_identity id = { .ns = ref->job->ns, .ns_len = ref->job->ns_len,
				    .tokens = b->tokens };

	memcpy(id.hash, b->hash, 16);
	memcpy(id.parent, b->parent, 16);
	seal_stream_begin(&ref->stream, r->keys, &r->geometry, &id, ref->key, len, b->data);
	ref->opening = true;
}

/*
 * Each piece of a value, as the client reads it: decrypted while the rest is on its way (the
 * kernel keeps receiving meanwhile), from a read buffer still in the cache.
 */
static void fetch_piece(struct redis_cmd *cmd, size_t off, const void *piece, size_t n,
			size_t total, void *arg)
{
	struct remote *r = arg;
	struct fetch_ref *ref = &r->refs[cmd - r->cmds];

	if (!off)
		fetch_begin(r, ref, total);
	seal_stream_feed(&ref->stream, piece, n);
}

/* As each GET finishes: its opening ends (verified, or the block wiped), the value counted. */
static void fetch_done(struct redis_cmd *cmd, void *arg)
{
	struct remote *r = arg;
	struct fetch_ref *ref = &r->refs[cmd - r->cmds];
	struct remote_block *b = ref->block;
	const enum redis_status st = cmd->status;
	enum seal_reason reason = SEAL_OK;
	size_t bytes = 0;
	int e = 0;

	/* An empty value has no pieces: opened (and refused) here. */
	if (st == REDIS_CMD_OK && !ref->opening)
		fetch_begin(r, ref, 0);
	/* A value cut short (the deadline, the node lost) is ended too: the block is wiped. */
	if (ref->opening) {
		e = seal_stream_end(&ref->stream, &reason);
		ref->opening = false;
	}
	if (cmd->status == REDIS_CMD_TIMEOUT && now_ns() < deadline_of(r, ref->job)) {
		/* The batch's deadline was another job's: asked again in the next batch. */
		redis_cmd_release(cmd);
		return;
	}
	b->status = from_redis(cmd->status);
	if (b->status == REMOTE_OK) {
		bytes = cmd->data_len;
		if (e == -EBADMSG) {
			b->status = REMOTE_VERIFY;
			b->reason = reason;
		} else if (e < 0) {
			b->status = REMOTE_ERROR;
		}
	}
	redis_cmd_release(cmd);
	count_block(r, b, bytes);
	/*
	 * Its last block, answered by its node: back to the loop now, not when the batch ends.
	 * A failure (down, a stream hiredis could not parse) waits for the batch's end, where the
	 * node's state is snapshotted first: the client finishes the commands before it marks the
	 * node, so the job would otherwise overtake what the counters say.
	 */
	if ((st == REDIS_CMD_OK || st == REDIS_CMD_NIL || st == REDIS_CMD_SERVER) &&
	    !job_pending(ref->job)) {
		for (struct remote_job **p = &r->fetching; *p; p = &(*p)->next)
			if (*p == ref->job) {
				*p = ref->job->next;
				finish_job(r, ref->job);
				break;
			}
	}
}

static void snapshot_nodes(struct remote *r)
{
	size_t n = redis_cluster_nodes(r->cluster, r->nodes, REMOTE_MAX_NODES);

	pthread_mutex_lock(&r->stats_lock);
	r->stats.nnodes = n < REMOTE_MAX_NODES ? n : REMOTE_MAX_NODES;
	memcpy(r->stats.nodes, r->nodes, r->stats.nnodes * sizeof(r->nodes[0]));
	pthread_mutex_unlock(&r->stats_lock);
}

/* Marks a job's blocks not yet done s (counted for a fetch). */
static void fail_pending(struct remote *r, struct remote_job *job, enum remote_status s)
{
	for (size_t i = 0; i < job->nblocks; i++) {
		if (job->blocks[i].status != REMOTE_PENDING)
			continue;
		job->blocks[i].status = s;
		if (job->kind == REMOTE_FETCH)
			count_block(r, &job->blocks[i], 0);
	}
}

/*
 * Counts a store's blocks (any not OK, cancelled included, in stores_failed) and completes it.
 * Fetches are counted block by block as they finish.
 */
static void finish_job(struct remote *r, struct remote_job *job)
{
	if (job->kind == REMOTE_STORE) {
		uint64_t ok = 0, failed = 0;

		for (size_t k = 0; k < job->nblocks; k++)
			job->blocks[k].status == REMOTE_OK ? ok++ : failed++;
		pthread_mutex_lock(&r->stats_lock);
		r->stats.stores_ok += ok;
		r->stats.stores_failed += failed;
		pthread_mutex_unlock(&r->stats_lock);
	}
	complete(r, job);
}

/*
 * Fails what is past its deadline (LATE) and completes every job of *list that has no block
 * pending, keeping the others in order; returns the earliest deadline of those left.
 */
static uint64_t reap_finished(struct remote *r, struct remote_job **list)
{
	const uint64_t now = now_ns();
	uint64_t earliest = UINT64_MAX;

	while (*list) {
		struct remote_job *j = *list;
		uint64_t d = deadline_of(r, j);

		if (d <= now)
			fail_pending(r, j, REMOTE_LATE);
		if (!job_pending(j)) {
			*list = j->next;
			finish_job(r, j);
			continue;
		}
		if (d < earliest)
			earliest = d;
		list = &j->next;
	}
	return earliest;
}

/*
 * The fetches taken, as pipelined batches: each runs until the earliest deadline of the jobs
 * still in it, each job completes as its last block is done (in fetch_done, mid-batch) or at
 * its own deadline, and the GETs that timed out at another job's deadline are asked again in
 * the next batch.
 */
static void run_fetches(struct remote *r, struct remote_job *jobs)
{
	size_t n = 0;

	for (struct remote_job *j = jobs; j; j = j->next)
		n += j->nblocks;
	if (n && reserve_cmds(r, n) < 0) {
		for (struct remote_job *j = jobs; j; j = j->next)
			fail_pending(r, j, REMOTE_ERROR);
	}
	/* On r->fetching, so that fetch_done can complete a job as its last block arrives. */
	r->fetching = jobs;
	for (;;) {
		uint64_t deadline = reap_finished(r, &r->fetching), now;
		uint32_t ms;

		if (!r->fetching)
			break;
		n = 0;
		for (struct remote_job *j = r->fetching; j; j = j->next) {
			for (size_t i = 0; i < j->nblocks; i++) {
				struct fetch_ref *ref = &r->refs[n];
				struct redis_cmd *c = &r->cmds[n];

				if (j->blocks[i].status != REMOTE_PENDING)
					continue; /* done in an earlier batch */
				ref->job = j;
				ref->block = &j->blocks[i];
				ref->opening = false;
				if (seal_redis_key(r->keys, j->ns, j->ns_len, j->blocks[i].hash,
						   ref->key) < 0) {
					j->blocks[i].status = REMOTE_ERROR;
					count_block(r, &j->blocks[i], 0);
					continue;
				}
				memset(c, 0, sizeof(*c));
				c->op = REDIS_GET;
				c->key = ref->key;
				c->key_len = SEAL_REDIS_KEY_LEN;
				c->sink = fetch_piece;
				c->sink_arg = r;
				n++;
			}
		}
		if (!n)
			continue; /* all failed above: completed by the next reap */
		now = now_ns();
		ms = deadline > now ? (uint32_t)((deadline - now + 999999) / 1000000) : 1;
		/* -ENOMEM leaves the commands not run as DOWN, each with its done call. */
		(void)redis_cluster_run_cb(r->cluster, r->cmds, n, ms ? ms : 1, fetch_done, r);
		snapshot_nodes(r);
	}
}

/* What the stores look at between two chunks: remote_free, a fetch queued behind them. */
static void queue_state(struct remote *r, bool *stop, bool *fetch)
{
	pthread_mutex_lock(&r->queue_lock);
	*stop = r->stop;
	*fetch = r->queued_fetches;
	pthread_mutex_unlock(&r->queue_lock);
}

/*
 * The thread's stores in chunks: seal up to STORE_CHUNK pending blocks, SET them in one batch
 * until the earliest deadline of the jobs in the chunk, next chunk.  A SET that timed out at
 * another job's deadline is sealed and sent again in a later chunk.  Returns when every store
 * is completed, or between two chunks when a fetch is queued or remote_free stops the thread:
 * the stores left stay on r->stores.
 */
static void run_stores(struct remote *r)
{
	for (;;) {
		struct remote_block *blocks[STORE_CHUNK];
		struct remote_job *owner[STORE_CHUNK];
		uint64_t deadline = UINT64_MAX, now;
		size_t n = 0;
		uint32_t ms;
		bool stop, fetch;

		/* Stopped: what was never sent is cancelled, whatever its deadline. */
		queue_state(r, &stop, &fetch);
		if (stop)
			return;
		reap_finished(r, &r->stores);
		if (!r->stores || fetch)
			return;
		for (struct remote_job *j = r->stores; j && n < STORE_CHUNK; j = j->next) {
			for (size_t i = 0; i < j->nblocks && n < STORE_CHUNK; i++) {
				struct remote_block *b = &j->blocks[i];
				struct seal_identity id = { .ns = j->ns, .ns_len = j->ns_len,
							    .tokens = b->tokens };
				struct redis_cmd *c = &r->cmds[n];

				if (b->status != REMOTE_PENDING)
					continue;
				memcpy(id.hash, b->hash, 16);
				memcpy(id.parent, b->parent, 16);
				if (seal_redis_key(r->keys, j->ns, j->ns_len, b->hash,
						   r->store_keys[n]) < 0 ||
				    seal_seal(r->keys, &r->geometry, &id, b->data, r->store_keys[n],
					      r->bufs[n]) < 0) {
					b->status = REMOTE_ERROR;
					continue;
				}
				memset(c, 0, sizeof(*c));
				c->op = REDIS_SET;
				c->key = r->store_keys[n];
				c->key_len = SEAL_REDIS_KEY_LEN;
				c->value = r->bufs[n];
				c->value_len = seal_size(&r->geometry, j->ns_len);
				c->ttl_ms = r->ttl_ms;
				if (deadline_of(r, j) < deadline)
					deadline = deadline_of(r, j);
				owner[n] = j;
				blocks[n++] = b;
			}
		}
		if (!n)
			continue; /* all failed sealing: completed by the next reap */
		now = now_ns();
		ms = deadline > now ? (uint32_t)((deadline - now + 999999) / 1000000) : 1;
		(void)redis_cluster_run(r->cluster, r->cmds, n, ms ? ms : 1);
		now = now_ns();
		pthread_mutex_lock(&r->stats_lock);
		for (size_t k = 0; k < n; k++) {
			/* Timed out at another job's deadline: this one has time left, again. */
			if (r->cmds[k].status != REDIS_CMD_TIMEOUT || now >= deadline_of(r, owner[k]))
				blocks[k]->status = from_redis(r->cmds[k].status);
			if (blocks[k]->status == REMOTE_OK)
				r->stats.bytes_out += r->cmds[k].value_len;
			redis_cmd_release(&r->cmds[k]);
		}
		pthread_mutex_unlock(&r->stats_lock);
		snapshot_nodes(r);
	}
}

static void *remote_thread(void *arg)
{
	struct remote *r = arg;
	sigset_t all;

	/* Signals are the loop's (signalfd); a SIGPIPE from hiredis's write(2) stays pending. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (;;) {
		struct remote_job *taken, *fetches = NULL, **ft = &fetches, **st = &r->stores;

		pthread_mutex_lock(&r->queue_lock);
		while (!r->queue_head && !r->stop && !r->stores)
			pthread_cond_wait(&r->queue_cond, &r->queue_lock);
		if (r->stop) {
			pthread_mutex_unlock(&r->queue_lock);
			break;
		}
		taken = r->queue_head;
		r->queue_head = r->queue_tail = NULL;
		r->queued_fetches = 0;
		pthread_mutex_unlock(&r->queue_lock);

		/*
		 * Split in submit order: fetches first, a session waits for them; the new stores
		 * go behind those left from earlier rounds.
		 */
		while (*st)
			st = &(*st)->next;
		while (taken) {
			struct remote_job *next = taken->next;

			taken->next = NULL;
			if (taken->kind == REMOTE_FETCH) {
				*ft = taken;
				ft = &taken->next;
			} else {
				*st = taken;
				st = &taken->next;
			}
			taken = next;
		}
		run_fetches(r, fetches);
		run_stores(r);
	}
	/* Stopped between two chunks: what is left of the stores is cancelled (counted). */
	while (r->stores) {
		struct remote_job *j = r->stores;

		r->stores = j->next;
		fail_pending(r, j, REMOTE_CANCELLED);
		finish_job(r, j);
	}
	return NULL;
}

/* ---- the loop's side -------------------------------------------------------------------- */

static int submit(struct remote *r, struct remote_job *job)
{
	if (!job->nblocks || !job->blocks || job->ns_len > SEAL_MAX_NAMESPACE)
		return -EINVAL;
	for (size_t i = 0; i < job->nblocks; i++) {
		job->blocks[i].status = REMOTE_PENDING;
		job->blocks[i].reason = SEAL_OK;
	}
	job->next = NULL;
	job->latency_ns = 0;
	job->submit_ns = now_ns();
	pthread_mutex_lock(&r->queue_lock);
	if (r->stop || r->inflight + job->nblocks > r->max_inflight) {
		pthread_mutex_unlock(&r->queue_lock);
		return -EBUSY;
	}
	r->inflight += (uint32_t)job->nblocks;
	r->queued_fetches += job->kind == REMOTE_FETCH;
	if (r->queue_tail)
		r->queue_tail->next = job;
	else
		r->queue_head = job;
	r->queue_tail = job;
	pthread_cond_signal(&r->queue_cond);
	pthread_mutex_unlock(&r->queue_lock);
	return 0;
}

int remote_store(struct remote *r, struct remote_job *job)
{
	int e;

	if (job->kind != REMOTE_STORE)
		return -EINVAL;
	e = submit(r, job);
	if (e == -EBUSY) {
		pthread_mutex_lock(&r->stats_lock);
		r->stats.stores_dropped += job->nblocks;
		pthread_mutex_unlock(&r->stats_lock);
	}
	return e;
}

int remote_fetch(struct remote *r, struct remote_job *job)
{
	int e;

	if (job->kind != REMOTE_FETCH)
		return -EINVAL;
	e = submit(r, job);
	if (e == -EBUSY) {
		for (size_t i = 0; i < job->nblocks; i++)
			job->blocks[i].status = REMOTE_BUSY;
		pthread_mutex_lock(&r->stats_lock);
		r->stats.fetches++;
		r->stats.fetches_busy++;
		r->stats.misses[REMOTE_BUSY] += job->nblocks;
		pthread_mutex_unlock(&r->stats_lock);
	} else if (e == 0) {
		pthread_mutex_lock(&r->stats_lock);
		r->stats.fetches++;
		pthread_mutex_unlock(&r->stats_lock);
	}
	return e;
}

int remote_fd(const struct remote *r)
{
	return r->efd;
}

size_t remote_reap(struct remote *r, remote_done_fn *done, void *arg)
{
	struct remote_job *jobs;
	uint64_t count, blocks = 0;
	size_t n = 0;

	/* Cleared before the list is taken: a completion after this wakes the loop again. */
	if (read(r->efd, &count, sizeof(count)) < 0) {
		/* EAGAIN: nothing signalled; the list may still hold what a reap missed. */
	}
	pthread_mutex_lock(&r->done_lock);
	jobs = r->done_head;
	r->done_head = r->done_tail = NULL;
	pthread_mutex_unlock(&r->done_lock);
	/* Their blocks leave the bound now, before done can reuse or free the jobs. */
	for (struct remote_job *j = jobs; j; j = j->next)
		blocks += j->nblocks;
	pthread_mutex_lock(&r->queue_lock);
	r->inflight -= (uint32_t)blocks;
	pthread_mutex_unlock(&r->queue_lock);
	while (jobs) {
		struct remote_job *next = jobs->next;

		jobs->next = NULL;
		done(jobs, arg);
		jobs = next;
		n++;
	}
	return n;
}

int remote_namespace_salt(const struct remote *r, const void *name, size_t len, uint64_t *ret)
{
	return seal_root_salt(r->keys, name, len, ret);
}

static int compare_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

void remote_get_stats(struct remote *r, struct remote_stats *out)
{
	uint64_t samples[LATENCY_SAMPLES];
	size_t n;

	pthread_mutex_lock(&r->stats_lock);
	*out = r->stats;
	n = r->nlatency < LATENCY_SAMPLES ? r->nlatency : LATENCY_SAMPLES;
	memcpy(samples, r->latency, n * sizeof(samples[0]));
	pthread_mutex_unlock(&r->stats_lock);
	pthread_mutex_lock(&r->queue_lock);
	out->inflight = r->inflight;
	pthread_mutex_unlock(&r->queue_lock);
	out->latency_p50_ns = out->latency_p99_ns = 0;
	if (n) {
		qsort(samples, n, sizeof(samples[0]), compare_u64);
		out->latency_p50_ns = samples[(n - 1) / 2];
		out->latency_p99_ns = samples[(n - 1) * 99 / 100];
	}
}

/* ---- setup ------------------------------------------------------------------------------ */

static int add_key(struct remote *r, const char *path, int current, char *err, size_t errlen)
{
	uint8_t key[SEAL_KEY_BYTES];
	int e;

	e = seal_key_load(path, key, err, errlen);
	if (e < 0)
		return e;
	e = seal_keyring_add(r->keys, key, current, NULL);
	explicit_bzero(key, sizeof(key));
	if (e == -EEXIST)
		snprintf(err, errlen, "%s: the same key as another key file", path);
	else if (e < 0)
		snprintf(err, errlen, "%s: cannot add the key: %s", path, strerror(-e));
	return e;
}

int remote_new(const struct remote_config *cfg, char *err, size_t errlen, struct remote **ret)
{
	struct redis_addr *seeds = NULL;
	struct remote *r;
	size_t nseeds = 0;
	int e;

	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->efd = -EBADF;
	pthread_mutex_init(&r->queue_lock, NULL);
	pthread_cond_init(&r->queue_cond, NULL);
	pthread_mutex_init(&r->done_lock, NULL);
	pthread_mutex_init(&r->stats_lock, NULL);
	r->geometry = cfg->geometry;
	r->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 50;
	r->store_timeout_ms = cfg->store_timeout_ms ? cfg->store_timeout_ms
			      : r->timeout_ms * 20 > 1000 ? r->timeout_ms * 20 : 1000;
	r->max_inflight = cfg->max_inflight ? cfg->max_inflight : 64;
	r->ttl_ms = cfg->ttl_ms;

	seeds = calloc(REDIS_MAX_SEEDS, sizeof(*seeds));
	if (!seeds) {
		e = -ENOMEM;
		goto fail;
	}
	e = redis_parse_url(cfg->url ? cfg->url : "", seeds, REDIS_MAX_SEEDS, &nseeds, err,
			    errlen);
	if (e < 0)
		goto fail;
	e = seal_keyring_new(&r->keys);
	if (e < 0)
		goto fail;
	/*
	 * Old keys first: the keyring's first key names values and salts namespaces, so while a
	 * rotation lists the retired key here every Redis key stays where it was.
	 */
	for (size_t i = 0; i < cfg->n_old_key_files; i++) {
		e = add_key(r, cfg->old_key_files[i], 0, err, errlen);
		if (e < 0)
			goto fail;
	}
	e = add_key(r, cfg->key_file ? cfg->key_file : "", 1, err, errlen);
	if (e < 0)
		goto fail;
	e = redis_cluster_new(seeds, nseeds, &cfg->redis, &r->cluster);
	if (e < 0)
		goto fail;
	/* The seeds, idle, until the first batch: the stats name them from the start. */
	snapshot_nodes(r);
	e = reserve_cmds(r, 64);
	if (e < 0)
		goto fail;
	for (size_t i = 0; i < STORE_CHUNK; i++) {
		r->bufs[i] = malloc(seal_size(&r->geometry, SEAL_MAX_NAMESPACE));
		if (!r->bufs[i]) {
			e = -ENOMEM;
			goto fail;
		}
	}
	e = reserve_cmds(r, STORE_CHUNK);
	if (e < 0)
		goto fail;
	r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (r->efd < 0) {
		e = -errno;
		goto fail;
	}
	e = -pthread_create(&r->thread, NULL, remote_thread, r);
	if (e < 0) {
		snprintf(err, errlen, "cannot start the remote tier's thread: %s", strerror(-e));
		goto fail;
	}
	r->started = true;
	free(seeds);
	*ret = r;
	return 0;
fail:
	if (e == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	free(seeds);
	remote_free(r, NULL, NULL);
	return e;
}

struct remote *remote_free(struct remote *r, remote_done_fn *done, void *arg)
{
	struct remote_job *queued;

	if (!r)
		return NULL;
	if (r->started) {
		pthread_mutex_lock(&r->queue_lock);
		r->stop = true;
		pthread_cond_signal(&r->queue_cond);
		pthread_mutex_unlock(&r->queue_lock);
		pthread_join(r->thread, NULL);
	}
	/* What the thread never took is cancelled; it goes out with what it completed. */
	queued = r->queue_head;
	r->queue_head = r->queue_tail = NULL;
	while (queued) {
		struct remote_job *next = queued->next;

		for (size_t i = 0; i < queued->nblocks; i++)
			queued->blocks[i].status = REMOTE_CANCELLED;
		if (queued->kind == REMOTE_FETCH)
			r->stats.misses[REMOTE_CANCELLED] += queued->nblocks;
		else
			r->stats.stores_failed += queued->nblocks;
		complete(r, queued);
		queued = next;
	}
	if (done && r->efd >= 0)
		remote_reap(r, done, arg);
	redis_cluster_free(r->cluster);
	seal_keyring_free(r->keys);
	for (size_t i = 0; i < STORE_CHUNK; i++)
		free(r->bufs[i]);
	free(r->cmds);
	free(r->refs);
	if (r->efd >= 0)
		close(r->efd);
	pthread_mutex_destroy(&r->queue_lock);
	pthread_cond_destroy(&r->queue_cond);
	pthread_mutex_destroy(&r->done_lock);
	pthread_mutex_destroy(&r->stats_lock);
	free(r);
	return NULL;
}

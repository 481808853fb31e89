/* SPDX-License-Identifier: MIT */
/*
 * kvpaged-bench against a running daemon: sequence calls through the socket or the rings,
 * admin queries, and client processes that start together (so that connecting is not timed and
 * the clients overlap from their first call).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto/frame.h"
#include "proto/kvpaged.pb-c.h"
#include "tools/bench/bench.h"
#include "tools/bench/remote.h"

uint32_t pow2_at_least(uint32_t x)
{
	uint32_t p = 1;

	while (p < x)
		p <<= 1;
	return p;
}

int remote_connect(struct remote_conn *k, const struct remote_options *o, const char *who)
{
	struct kvp_connect_options co = {
		.size = sizeof(co),
		.socket_path = o->socket,
		.ns = o->ns,
		.client_name = "kvpaged-bench",
	};
	int r;

	*k = (struct remote_conn){ .ring = o->ring };
	if (o->ring) {
		co.ring_entries = o->ring_entries;
		co.ring_data_bytes = o->ring_data_bytes;
		co.spin_us = o->spin_us;
		k->ring_table_cap = o->max_blocks ? o->max_blocks : 1;
		k->ring_table = malloc((size_t)k->ring_table_cap * sizeof(*k->ring_table));
		if (!k->ring_table)
			return -ENOMEM;
	}
	r = kvp_connect(&co, &k->c);
	if (r < 0) {
		if (o->ring)
			fprintf(stderr, "kvpaged-bench: %s: cannot connect to %s with rings of %u "
				"entries and %u data bytes: %s\n", who, o->socket,
				o->ring_entries, o->ring_data_bytes, strerror(-r));
		else
			fprintf(stderr, "kvpaged-bench: %s: cannot connect to %s: %s\n", who,
				o->socket, strerror(-r));
		free(k->ring_table);
		*k = (struct remote_conn){ 0 };
		return r;
	}
	return 0;
}

void remote_disconnect(struct remote_conn *k)
{
	k->c = kvp_disconnect(k->c);
	kvp_table_free(&k->table);
	free(k->ring_table);
	k->ring_table = NULL;
}

int remote_ring_call(struct kvp_client *c, const struct kvp_op *op, struct kvp_completion *ret)
{
	int r = kvp_submit(c, op, 1);

	/* Nothing else is in flight, so a ring that takes nothing has too small a data area. */
	if (r == 0)
		return -ENOBUFS;
	if (r < 0)
		return r;
	r = kvp_complete(c, ret, 1, 1, REMOTE_TIMEOUT_MS);
	if (r < 0)
		return r;
	return ret->res;
}

/* Table entries an operation over n tokens can return (an engine sizes its output the same way). */
static uint32_t table_cap(const struct remote_conn *k, uint64_t n)
{
	uint64_t B = kvp_pool(k->c)->block_tokens, cap = (n + B - 1) / B + 1;

	return cap < k->ring_table_cap ? (uint32_t)cap : k->ring_table_cap;
}

int remote_open(struct remote_conn *k, const uint32_t *tokens, uint32_t n, uint64_t *ret_seq,
		uint32_t *ret_cached)
{
	struct kvp_op op = { .opcode = KVP_OPEN, .tokens = tokens, .ntokens = n,
			     .table_out = k->ring_table };
	struct kvp_completion cqe;
	int r;

	if (!k->ring)
		return kvp_open(k->c, tokens, n, 0, 0, ret_seq, ret_cached, &k->table);
	op.table_cap = table_cap(k, n);
	r = remote_ring_call(k->c, &op, &cqe);
	if (r < 0)
		return r;
	*ret_seq = cqe.value;
	*ret_cached = cqe.aux;
	return 0;
}

int remote_commit(struct remote_conn *k, uint64_t seq, uint32_t ntokens)
{
	struct kvp_op op = { .opcode = KVP_COMMIT, .seq = seq, .arg = ntokens,
			     .table_out = k->ring_table };
	struct kvp_completion cqe;
	int r;

	if (!k->ring)
		return kvp_commit(k->c, seq, ntokens, &k->table);
	op.table_cap = table_cap(k, ntokens);
	r = remote_ring_call(k->c, &op, &cqe);
	return r < 0 ? r : (int)cqe.aux;
}

int remote_append(struct remote_conn *k, uint64_t seq, const uint32_t *tokens, uint32_t n)
{
	struct kvp_op op = { .opcode = KVP_APPEND, .seq = seq, .tokens = tokens, .ntokens = n,
			     .table_out = k->ring_table };
	struct kvp_completion cqe;

	if (!k->ring)
		return kvp_append(k->c, seq, tokens, n, &k->table);
	op.table_cap = table_cap(k, n);
	return remote_ring_call(k->c, &op, &cqe);
}

int remote_close(struct remote_conn *k, uint64_t seq)
{
	struct kvp_op op = { .opcode = KVP_CLOSE, .seq = seq };
	struct kvp_completion cqe;

	if (!k->ring)
		return kvp_close(k->c, seq);
	return remote_ring_call(k->c, &op, &cqe);
}

/* ------------------------------------------------------------------ admin socket */

/* One admin request and its unpacked reply (as kvpagedctl does); -errno after printing why. */
static int admin_request(int fd, uint16_t type, const char *pool,
			 const ProtobufCMessageDescriptor *desc, ProtobufCMessage **ret)
{
	Kvpaged__V1__AdminRequest req = KVPAGED__V1__ADMIN_REQUEST__INIT;
	struct kvp_frame_header h;
	uint8_t *payload;
	unsigned nfds;
	int r;

	req.pool = (char *)pool;
	r = kvp_frame_send(fd, type, 1, &req.base, NULL, 0);
	if (r == 0)
		r = kvp_frame_recv(fd, 256u << 20, &h, &payload, NULL, 0, &nfds);
	if (r < 0) {
		fprintf(stderr, "kvpaged-bench: admin socket: %s\n", strerror(-r));
		return r;
	}
	if (h.type == KVPAGED__V1__MESSAGE_TYPE__ERROR) {
		Kvpaged__V1__Error *e = kvpaged__v1__error__unpack(NULL, h.len, payload);

		fprintf(stderr, "kvpaged-bench: admin socket: %s\n",
			e ? e->message : "malformed error");
		r = e && e->code > 0 ? -e->code : -EPROTO;
		if (e)
			kvpaged__v1__error__free_unpacked(e, NULL);
	} else if (h.type != type + KVP_REPLY_OFFSET ||
		   !(*ret = protobuf_c_message_unpack(desc, NULL, h.len, payload))) {
		fprintf(stderr, "kvpaged-bench: admin socket: unexpected reply\n");
		r = -EPROTO;
	}
	free(payload);
	return r;
}

int admin_pool_query(const char *path, const char *pool, struct admin_pool *ret)
{
	Kvpaged__V1__Stats *st = NULL;
	Kvpaged__V1__Pools *ps = NULL;
	struct admin_pool a = { 0 };
	int fd, r, found = 0;

	fd = kvp_unix_connect(path);
	if (fd < 0) {
		fprintf(stderr, "kvpaged-bench: cannot connect to %s: %s\n", path, strerror(-fd));
		return fd;
	}
	r = admin_request(fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_STATS, pool,
			  &kvpaged__v1__stats__descriptor, (ProtobufCMessage **)&st);
	if (r == 0)
		r = admin_request(fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_POOLS, pool,
				  &kvpaged__v1__pools__descriptor, (ProtobufCMessage **)&ps);
	close(fd);
	if (r < 0)
		goto out;
	for (size_t i = 0; i < st->n_pools; i++) {
		const Kvpaged__V1__PoolStats *p = st->pools[i];

		if (strcmp(p->pool, pool))
			continue;
		a.query_blocks = p->query_blocks;
		a.hit_blocks = p->hit_blocks;
		a.evictions = p->evictions;
		a.collisions = p->collisions;
		a.value = p->eviction != NULL;
		found++;
	}
	for (size_t i = 0; i < ps->n_pools; i++) {
		const Kvpaged__V1__PoolUsage *u = ps->pools[i];

		if (!u->description || strcmp(u->description->name, pool))
			continue;
		a.free = u->free;
		a.cached = u->cached;
		a.in_use = u->in_use;
		a.sequences = u->sequences;
		found++;
	}
	if (found != 2) {
		fprintf(stderr, "kvpaged-bench: admin socket: no pool %s\n", pool);
		r = -ENOENT;
		goto out;
	}
	*ret = a;
out:
	if (st)
		kvpaged__v1__stats__free_unpacked(st, NULL);
	if (ps)
		kvpaged__v1__pools__free_unpacked(ps, NULL);
	return r;
}

/* ------------------------------------------------------------------ client processes */

static int write_full(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Reads exactly len bytes; -EPIPE when the writer went away first (a child died). */
static int read_full(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EPIPE;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int worker_ready(struct worker_io *io, int error)
{
	int32_t e = error;
	char c;
	ssize_t n;
	int r;

	r = write_full(io->result_fd, &e, sizeof(e));
	if (r < 0 || error < 0)
		return r < 0 ? r : error;
	/* The parent closes its end once every child is ready: end of file means go. */
	do
		n = read(io->go_fd, &c, 1);
	while (n < 0 && errno == EINTR);
	close(io->go_fd);
	io->go_fd = -1;
	return n < 0 ? -errno : 0;
}

int worker_send(struct worker_io *io, const void *buf, size_t len)
{
	return write_full(io->result_fd, buf, len);
}

int workers_spawn(struct workers *ws, uint32_t n, worker_fn fn, void *ctx)
{
	pid_t parent = getpid();
	int go[2], r;

	*ws = (struct workers){ .go_fd = -1 };
	ws->pids = calloc(n, sizeof(*ws->pids));
	ws->result_fds = calloc(n, sizeof(*ws->result_fds));
	if (!ws->pids || !ws->result_fds) {
		workers_finish(ws, true);
		return -ENOMEM;
	}
	if (pipe2(go, O_CLOEXEC) < 0) {
		r = -errno;
		workers_finish(ws, true);
		return r;
	}
	ws->go_fd = go[1];
	/* Whatever the parent has buffered must not come out of the children too. */
	fflush(stdout);
	fflush(stderr);
	for (uint32_t i = 0; i < n; i++) {
		int res[2];
		pid_t pid;

		if (pipe2(res, O_CLOEXEC) < 0) {
			r = -errno;
			goto fail;
		}
		pid = fork();
		if (pid < 0) {
			r = -errno;
			close(res[0]);
			close(res[1]);
			goto fail;
		}
		if (pid == 0) {
			struct worker_io io = { .result_fd = res[1], .go_fd = go[0] };

			/* A child never outlives the run, even when the parent is killed. */
			if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
				_exit(1);
			close(res[0]);
			close(go[1]);
			for (uint32_t j = 0; j < i; j++)
				close(ws->result_fds[j]);
			_exit(fn(i, ctx, &io) < 0 ? 1 : 0);
		}
		close(res[1]);
		ws->pids[i] = pid;
		ws->result_fds[i] = res[0];
		ws->n++;
	}
	close(go[0]);
	return 0;
fail:
	close(go[0]);
	workers_finish(ws, true);
	return r;
}

int workers_start(struct workers *ws)
{
	int first = 0;

	for (uint32_t i = 0; i < ws->n; i++) {
		int32_t e;
		int r = read_full(ws->result_fds[i], &e, sizeof(e));

		if (r == 0 && e < 0)
			r = e;
		if (r < 0 && !first)
			first = r;
	}
	if (first < 0)
		return first;
	ws->start_ns = now_ns();
	close(ws->go_fd);
	ws->go_fd = -1;
	return 0;
}

int workers_collect(struct workers *ws, uint32_t i, void *buf, size_t len)
{
	return read_full(ws->result_fds[i], buf, len);
}

int workers_finish(struct workers *ws, bool kill_them)
{
	int r = 0;

	if (ws->go_fd >= 0)
		close(ws->go_fd);
	for (uint32_t i = 0; i < ws->n; i++) {
		int status = 0;
		pid_t got;

		if (kill_them)
			kill(ws->pids[i], SIGKILL);
		do
			got = waitpid(ws->pids[i], &status, 0);
		while (got < 0 && errno == EINTR);
		if (got < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
			r = -ECHILD;
		close(ws->result_fds[i]);
	}
	free(ws->pids);
	free(ws->result_fds);
	*ws = (struct workers){ .go_fd = -1 };
	return r;
}

int admin_remote_query(const char *path, const char *pool, struct admin_remote *ret)
{
	Kvpaged__V1__Stats *st = NULL;
	struct admin_remote a = { 0 };
	bool found = false;
	int fd, r;

	fd = kvp_unix_connect(path);
	if (fd < 0) {
		fprintf(stderr, "kvpaged-bench: cannot connect to %s: %s\n", path, strerror(-fd));
		return fd;
	}
	r = admin_request(fd, KVPAGED__V1__MESSAGE_TYPE__ADMIN_STATS, pool,
			  &kvpaged__v1__stats__descriptor, (ProtobufCMessage **)&st);
	close(fd);
	if (r < 0)
		return r;
	for (size_t i = 0; i < st->n_pools; i++) {
		const Kvpaged__V1__PoolStats *p = st->pools[i];
		const Kvpaged__V1__RemoteTier *t = p->remote;

		if (strcmp(p->pool, pool))
			continue;
		found = true;
		if (!t)
			continue;
		a.present = true;
		a.inflight = t->inflight;
		a.fetches = t->fetches;
		a.fetches_busy = t->fetches_busy;
		a.hits = t->hits;
		for (size_t k = 0; k < t->n_misses; k++)
			a.misses += t->misses[k]->count;
		a.stores_ok = t->stores_ok;
		a.stores_dropped = t->stores_dropped;
		a.stores_failed = t->stores_failed;
	}
	kvpaged__v1__stats__free_unpacked(st, NULL);
	if (!found) {
		fprintf(stderr, "kvpaged-bench: admin socket: no pool %s\n", pool);
		return -ENOENT;
	}
	*ret = a;
	return 0;
}

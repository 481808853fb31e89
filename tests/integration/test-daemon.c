/* SPDX-License-Identifier: MIT */
/*
 * The real daemon with real client processes: prefix sharing across processes, shared memory,
 * fork and copy-on-write, quotas, a client killed mid-stream, namespaces, the rings, the
 * remote tier in kvpagedctl and the metrics.  (Other users: test-users; what needs the test
 * hooks: test-hooks.)
 */
#include <poll.h>
#include <sys/mman.h>

#include "tests/integration/harness.h"

static struct daemon d;

/* Fills every byte of a block with a pattern that names the block's position in the prompt. */
static void write_block(struct kvp_client *c, uint32_t block, uint8_t tag)
{
	const struct kvp_pool_info *p = kvp_pool(c);

	memset((uint8_t *)kvp_pool_base(c) + (uint64_t)block * p->block_stride, tag, p->block_bytes);
}

static bool block_is(struct kvp_client *c, uint32_t block, uint8_t tag)
{
	const struct kvp_pool_info *p = kvp_pool(c);
	const uint8_t *b = (uint8_t *)kvp_pool_base(c) + (uint64_t)block * p->block_stride;

	for (uint64_t i = 0; i < p->block_bytes; i++)
		if (b[i] != tag)
			return false;
	return true;
}

START_TEST(test_eight_processes_share_a_prompt)
{
	uint32_t t[1500], cached = 1;
	struct kvp_table tab = { 0 };
	struct kvp_client *c;
	pid_t kids[7];
	uint64_t seq;
	char out[8192];

	daemon_start(&d, NULL);
	prompt(t, 1500, 1000);
	c = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_open(c, t, 1500, 0, 0, &seq, &cached, &tab), 0);
	ck_assert_uint_eq(cached, 0);
	ck_assert_uint_eq(tab.len, 94); /* 93 full blocks of 16 and one of 12 tokens */
	for (uint32_t i = 0; i < tab.len; i++)
		write_block(c, tab.blocks[i], (uint8_t)(i * 13 + 1));
	ck_assert_int_eq(kvp_commit(c, seq, 1500, &tab), 0);

	for (int k = 0; k < 7; k++) {
		kids[k] = fork();
		ck_assert_int_ge(kids[k], 0);
		if (kids[k] == 0) {
			struct kvp_table mine = { 0 };
			struct kvp_client *cc = connect_ns(NULL, 0);
			uint64_t s;
			uint32_t got;

			alarm(20);
			if (kvp_open(cc, t, 1500, 0, 0, &s, &got, &mine) < 0 || got != 93 * 16)
				_exit(1);
			for (uint32_t i = 0; i < 93; i++)
				if (mine.blocks[i] != tab.blocks[i] ||
				    !block_is(cc, mine.blocks[i], (uint8_t)(i * 13 + 1)))
					_exit(2);
			if (mine.blocks[93] == tab.blocks[93])
				_exit(3); /* the partial block is never shared */
			_exit(kvp_close(cc, s) == 0 ? 0 : 4);
		}
	}
	for (int k = 0; k < 7; k++)
		ck_assert_int_eq(wait_child(kids[k]), 0);

	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(json_int(out, "hit_blocks"), 7 * 93);
	ck_assert_int_eq(json_int(out, "query_blocks"), 8 * 94);
	assert_verified(&d);
	ck_assert_int_eq(kvp_close(c, seq), 0);
	ck_assert_int_eq(kvp_close(c, seq), -ENOENT);
	kvp_disconnect(c);
	kvp_table_free(&tab);
	daemon_stop(&d);
}
END_TEST

START_TEST(test_fork_and_copy_on_write_across_processes)
{
	uint32_t t[20], x = 99, cached;
	struct kvp_table tab = { 0 }, kid = { 0 };
	struct kvp_client *c;
	uint64_t seq, child;
	pid_t pid;
	char out[8192];

	daemon_start(&d, NULL);
	prompt(t, 20, 5);
	c = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_open(c, t, 20, 0, 0, &seq, &cached, &tab), 0);
	write_block(c, tab.blocks[0], 0xa1);
	write_block(c, tab.blocks[1], 0xb2);
	ck_assert_int_eq(kvp_commit(c, seq, 20, &tab), 0);

	ck_assert_int_eq(kvp_fork(c, seq, &child, &kid), 0);
	ck_assert_uint_eq(kid.len, 2);
	ck_assert_mem_eq(kid.blocks, tab.blocks, 2 * sizeof(uint32_t));
	/* Writing slot 20 lands in the shared partial block: the daemon copies it first. */
	ck_assert_int_eq(kvp_append(c, child, &x, 1, &kid), 0);
	ck_assert_uint_eq(kid.blocks[0], tab.blocks[0]);
	ck_assert_uint_ne(kid.blocks[1], tab.blocks[1]);
	ck_assert(block_is(c, kid.blocks[1], 0xb2)); /* the copy holds the K/V bytes */
	write_block(c, kid.blocks[1], 0xc3);
	ck_assert(block_is(c, tab.blocks[1], 0xb2)); /* the original is untouched */

	/* Another process shares the committed full block and reads the same bytes. */
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct kvp_client *cc = connect_ns(NULL, 0);
		struct kvp_table mine = { 0 };
		uint64_t s;
		uint32_t got;

		alarm(20);
		if (kvp_open(cc, t, 20, 0, 0, &s, &got, &mine) < 0 || got != 16)
			_exit(1);
		_exit(mine.blocks[0] == tab.blocks[0] && block_is(cc, mine.blocks[0], 0xa1) ? 0 : 2);
	}
	ck_assert_int_eq(wait_child(pid), 0);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(json_int(out, "cow_copies"), 1);
	assert_verified(&d);
	kvp_disconnect(c);
	kvp_table_free(&tab);
	kvp_table_free(&kid);
	daemon_stop(&d);
}
END_TEST

START_TEST(test_quotas_and_limits)
{
	uint32_t t[200], cached;
	uint64_t s[8], extra;
	struct kvp_client *c, *others[4];
	int r;

	daemon_start(&d, "[limits]\nmax_sequences = 4\nmax_blocks = 20\nmax_tokens_per_request = 100\n\n"
			 "[pool main]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 4\n"
			 "block_tokens = 16\ncapacity_blocks = 64\n");
	prompt(t, 200, 3);
	c = connect_ns(NULL, 0);
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(kvp_open(c, t + i, 1, 0, 0, &s[i], &cached, NULL), 0);
	ck_assert_int_eq(kvp_open(c, t, 1, 0, 0, &extra, &cached, NULL), -EMFILE);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "max_sequences"));
	ck_assert_int_eq(kvp_fork(c, s[0], &extra, NULL), -EMFILE);
	ck_assert_int_eq(kvp_close(c, s[3]), 0);

	ck_assert_int_eq(kvp_open(c, t, 101, 0, 0, &extra, &cached, NULL), -E2BIG);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "max_tokens_per_request"));
	ck_assert_int_eq(kvp_open(c, t, 100, 0, 0, &s[3], &cached, NULL), 0); /* 3 + 7 blocks */
	ck_assert_int_eq(kvp_append(c, s[3], t, 100, NULL), 0);                /* 16 blocks */
	r = kvp_append(c, s[3], t, 80, NULL);                                  /* 21 > 20 */
	ck_assert_int_eq(r, -EDQUOT);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "max_blocks"));
	ck_assert_int_eq(kvp_append(c, s[3], t, 60, NULL), 0); /* exactly 20 */
	/* Bad requests are refused without harming the session. */
	ck_assert_int_eq(kvp_append(c, 12345, t, 1, NULL), -ENOENT);
	ck_assert_int_eq(kvp_commit(c, s[3], 100000, NULL), -EINVAL);
	ck_assert_int_eq(kvp_open(c, t, 0, 0, 0, &extra, &cached, NULL), -EINVAL);

	/* The pool (64 blocks) runs out before four more sessions' quotas do. */
	r = 0;
	for (int i = 0; i < 4; i++) {
		uint32_t u[96];

		prompt(u, 96, 100000 + 1000 * (uint32_t)i);
		others[i] = connect_ns(NULL, 0);
		for (int k = 0; k < 3 && r == 0; k++)
			r = kvp_open(others[i], u, 96 - (uint32_t)k, 0, 0, &extra, &cached, NULL);
	}
	ck_assert_int_eq(r, -ENOSPC);
	assert_verified(&d);
	for (int i = 0; i < 4; i++)
		kvp_disconnect(others[i]);
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

START_TEST(test_max_sessions)
{
	struct kvp_connect_options o = { .size = sizeof(o) };
	struct kvp_client *a, *b, *c = NULL;

	daemon_start_with(&d, "max_sessions = 2\n", NULL);
	/* The harness's readiness probe holds a session until the daemon sees it close. */
	for (int i = 0; i < 200 && kvp_connect(&o, &a) < 0; i++)
		msleep(10);
	b = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_connect(&o, &c), -EUSERS);
	ck_assert_ptr_null(c);
	kvp_disconnect(b);
	/* A slot frees up once the daemon has seen the disconnect. */
	for (int i = 0; i < 200 && kvp_connect(&o, &c) < 0; i++)
		msleep(10);
	ck_assert_ptr_nonnull(c);
	kvp_disconnect(c);
	kvp_disconnect(a);
	daemon_stop(&d);
}
END_TEST

START_TEST(test_client_killed_mid_stream)
{
	uint32_t t[64], cached;
	struct kvp_client *c;
	int pipefd[2];
	uint64_t seq;
	pid_t pid;
	char out[8192], ch;

	daemon_start(&d, NULL);
	prompt(t, 64, 77);
	c = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_open(c, t, 40, 0, 0, &seq, &cached, NULL), 0);

	ck_assert_int_eq(pipe(pipefd), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct kvp_client *cc = connect_ns(NULL, 0);
		uint64_t s, f;
		uint32_t got, tok = 5;

		if (kvp_open(cc, t, 64, 0, 0, &s, &got, NULL) < 0 || kvp_commit(cc, s, 64, NULL) < 0 ||
		    kvp_fork(cc, s, &f, NULL) < 0)
			_exit(1);
		for (uint32_t n = 65;; n++) {
			if (kvp_append(cc, s, &tok, 1, NULL) < 0 || kvp_commit(cc, s, n, NULL) < 0)
				_exit(2);
			if (n == 200 && write(pipefd[1], "x", 1) != 1)
				_exit(3);
		}
	}
	close(pipefd[1]);
	ck_assert_int_eq(read(pipefd[0], &ch, 1), 1); /* it is mid-stream now */
	kill(pid, SIGKILL);
	ck_assert_int_eq(wait_child(pid), 128 + SIGKILL);

	/* Its blocks come back once the daemon sees the connection drop. */
	for (int i = 0; i < 200; i++) {
		ck_assert_int_eq(ctl(&d, "pools", out, sizeof(out)), 0);
		if (json_int(out, "in_use") == 3)
			break;
		msleep(20);
	}
	ck_assert_int_eq(json_int(out, "in_use"), 3); /* our own 40-token sequence */
	ck_assert_int_eq(json_int(out, "sequences"), 1);
	assert_verified(&d);
	/* The survivor carries on. */
	ck_assert_int_eq(kvp_append(c, seq, t, 10, NULL), 0);
	/* >= 0: the child committed the same leading blocks first, so ours may be deduplicated. */
	ck_assert_int_ge(kvp_commit(c, seq, 50, NULL), 0);
	ck_assert_int_eq(kvp_close(c, seq), 0);
	ck_assert_int_eq(ctl(&d, "pools", out, sizeof(out)), 0);
	ck_assert_int_eq(json_int(out, "in_use"), 0);
	assert_verified(&d);
	kvp_disconnect(c);
	close(pipefd[0]);
	daemon_stop(&d);
}
END_TEST

START_TEST(test_namespaces_never_share)
{
	uint32_t t[64], cached;
	struct kvp_table ta = { 0 }, tb = { 0 };
	struct kvp_client *a, *b, *a2;
	uint64_t sa, sb;
	char out[8192];

	daemon_start(&d, NULL);
	prompt(t, 64, 9);
	a = connect_ns("tenant-a", 0);
	b = connect_ns("tenant-b", 0);
	ck_assert_str_eq(kvp_namespace(a), "uid:0/tenant-a");
	ck_assert_int_eq(kvp_open(a, t, 64, 0, 0, &sa, &cached, &ta), 0);
	ck_assert_int_eq(kvp_commit(a, sa, 64, NULL), 0);
	ck_assert_int_eq(kvp_open(b, t, 64, 0, 0, &sb, &cached, &tb), 0);
	ck_assert_uint_eq(cached, 0);
	for (uint32_t i = 0; i < 4; i++)
		for (uint32_t j = 0; j < 4; j++)
			ck_assert_uint_ne(ta.blocks[i], tb.blocks[j]);
	/* The same namespace from another session does share. */
	a2 = connect_ns("tenant-a", 0);
	ck_assert_int_eq(kvp_lookup(a2, t, 64, 0, 0, &cached), 0);
	ck_assert_uint_eq(cached, 64);
	/* A sequence id of another session is unknown here. */
	ck_assert_int_eq(kvp_append(b, sa, t, 1, NULL), -ENOENT);
	ck_assert_int_eq(kvp_close(a2, sa), -ENOENT);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_ptr_nonnull(strstr(out, "uid:0/tenant-b"));
	assert_verified(&d);
	kvp_disconnect(a);
	kvp_disconnect(b);
	kvp_disconnect(a2);
	kvp_table_free(&ta);
	kvp_table_free(&tb);
	daemon_stop(&d);
}
END_TEST

/* Ring operations end to end, with the daemon either sleeping on the doorbell or polling. */
static void ring_scenario(const char *daemon_extra)
{
	uint32_t t[40], table[8], x = 3;
	struct kvp_completion comp[8];
	struct kvp_client *r;
	struct kvp_op op;
	uint64_t seq, child;

	daemon_start_with(&d, daemon_extra, NULL);
	r = connect_ns(NULL, 64);
	prompt(t, 40, 11);

	op = (struct kvp_op){ .opcode = KVP_OPEN, .user_data = 7, .tokens = t, .ntokens = 40,
			      .table_cap = 8, .table_out = table };
	ck_assert_int_eq(kvp_submit(r, &op, 1), 1);
	ck_assert_int_eq(kvp_complete(r, comp, 8, 1, 5000), 1);
	ck_assert_uint_eq(comp[0].user_data, 7);
	ck_assert_int_eq(comp[0].res, 0);
	ck_assert_uint_eq(comp[0].table_len, 3);
	seq = comp[0].value;

	/* A batch: commit, fork, then close the fork. */
	struct kvp_op batch[2] = {
		{ .opcode = KVP_COMMIT, .user_data = 1, .seq = seq, .arg = 40 },
		{ .opcode = KVP_FORK, .user_data = 2, .seq = seq, .table_cap = 8, .table_out = table },
	};
	ck_assert_int_eq(kvp_submit(r, batch, 2), 2);
	ck_assert_int_eq(kvp_complete(r, comp, 8, 2, 5000), 2);
	ck_assert_int_eq(comp[0].res, 0);
	ck_assert_int_eq(comp[1].res, 0);
	child = comp[1].value;
	op = (struct kvp_op){ .opcode = KVP_APPEND, .user_data = 3, .seq = child, .tokens = &x,
			      .ntokens = 1, .table_cap = 8, .table_out = table };
	ck_assert_int_eq(kvp_submit(r, &op, 1), 1);
	ck_assert_int_eq(kvp_complete(r, comp, 8, 1, 5000), 1);
	ck_assert_int_eq(comp[0].res, 0);
	ck_assert_uint_eq(comp[0].aux, 2); /* the partial block was copied */

	/* Errors come back as completions. */
	op = (struct kvp_op){ .opcode = KVP_CLOSE, .user_data = 4, .seq = 999999 };
	ck_assert_int_eq(kvp_submit(r, &op, 1), 1);
	ck_assert_int_eq(kvp_complete(r, comp, 8, 1, 5000), 1);
	ck_assert_int_eq(comp[0].res, -ENOENT);

	/* The socket path sees the same sequences. */
	uint32_t ntok, ncommit;
	ck_assert_int_eq(kvp_seq_info(r, child, &ntok, &ncommit, NULL), 0);
	ck_assert_uint_eq(ntok, 41);
	ck_assert_uint_eq(ncommit, 40);

	/* A burst larger than one submission: the client keeps at most a ring's worth in flight. */
	unsigned done = 0, sent = 0;
	struct kvp_op burst[100];
	for (unsigned i = 0; i < 100; i++)
		burst[i] = (struct kvp_op){ .opcode = KVP_LOOKUP, .user_data = 1000 + i,
					    .tokens = t, .ntokens = 40 };
	while (done < 100) {
		int n = kvp_submit(r, burst + sent, 100 - sent);

		ck_assert_int_ge(n, 0);
		sent += (unsigned)n;
		n = kvp_complete(r, comp, 8, 1, 5000);
		ck_assert_int_ge(n, 1);
		for (int i = 0; i < n; i++) {
			ck_assert_uint_eq(comp[i].user_data, 1000 + done + (unsigned)i);
			ck_assert_uint_eq(comp[i].aux, 32); /* two committed full blocks */
		}
		done += (unsigned)n;
	}
	assert_verified(&d);
	kvp_disconnect(r);
	daemon_stop(&d);
}

/*
 * Liveness: while one client keeps the daemon busy-polling its ring, another client's socket
 * requests are still served (a starved socket would hang this test until Check kills it).
 */
START_TEST(test_socket_served_while_polling)
{
	uint32_t t[16], cached;
	struct kvp_client *c;
	int stop[2];
	uint64_t seq;
	pid_t pid;
	char b;

	daemon_start_with(&d, "ring_poll_us = 100000\n", NULL);
	ck_assert_int_eq(pipe(stop), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		/* Spinning, it never needs a wake-up, so the daemon never has to write to it. */
		struct kvp_connect_options o = { .size = sizeof(o), .ring_entries = 16,
						 .ring_data_bytes = 4096, .spin_us = 1000000 };
		struct kvp_op nop = { .opcode = KVP_NOP };
		struct kvp_client *r;

		if (kvp_connect(&o, &r) < 0)
			_exit(2);
		struct kvp_completion comp;

		close(stop[1]);
		fcntl(stop[0], F_SETFL, O_NONBLOCK);
		alarm(30);
		while (read(stop[0], &b, 1) < 0)
			if (kvp_submit(r, &nop, 1) != 1 || kvp_complete(r, &comp, 1, 1, 5000) != 1)
				_exit(1);
		_exit(0);
	}
	close(stop[0]);
	c = connect_ns(NULL, 0);
	prompt(t, 16, 3);
	for (int i = 0; i < 50; i++) {
		ck_assert_int_eq(kvp_open(c, t, 16, 0, 0, &seq, &cached, NULL), 0);
		ck_assert_int_eq(kvp_close(c, seq), 0);
	}
	ck_assert_int_eq(write(stop[1], "x", 1), 1);
	ck_assert_int_eq(wait_child(pid), 0);
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

/*
 * Completions in an event loop: kvp_completion_fd() stays quiet until a completion arrives
 * after kvp_complete_arm(), and again once kvp_complete() has reaped it and the loop armed it
 * anew; arming with completions waiting says so (1); a session ended by the daemon makes it
 * readable, and arming then says -ECONNRESET.  Without rings both are -ENOTSUP.
 */
START_TEST(test_completion_fd)
{
	struct kvp_op nop = { .opcode = KVP_NOP, .user_data = 5 };
	struct kvp_completion comp[4];
	struct kvp_client *r, *plain;
	struct pollfd p = { .events = POLLIN };
	int fd, armed;

	daemon_start(&d, NULL);
	plain = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_completion_fd(plain), -ENOTSUP);
	ck_assert_int_eq(kvp_complete_arm(plain), -ENOTSUP);
	r = connect_ns(NULL, 16);
	fd = kvp_completion_fd(r);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(kvp_completion_fd(r), fd);
	p.fd = fd;
	ck_assert_int_eq(kvp_complete_arm(r), 0);
	ck_assert_int_eq(poll(&p, 1, 50), 0);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(kvp_submit(r, &nop, 1), 1);
		ck_assert_int_eq(poll(&p, 1, 5000), 1);
		ck_assert_int_eq(kvp_complete(r, comp, 4, 0, 0), 1);
		ck_assert_uint_eq(comp[0].user_data, 5);
		ck_assert_int_eq(kvp_complete_arm(r), 0);
		ck_assert_int_eq(poll(&p, 1, 0), 0);
	}
	/* Submitted, then armed until the completion is there: arming says 1 and waits for none. */
	ck_assert_int_eq(kvp_submit(r, &nop, 1), 1);
	while ((armed = kvp_complete_arm(r)) == 0)
		ck_assert_int_eq(poll(&p, 1, 5000), 1);
	ck_assert_int_eq(armed, 1);
	ck_assert_int_eq(kvp_complete(r, comp, 4, 0, 0), 1);
	ck_assert_int_eq(kvp_complete(r, comp, 4, 0, 0), 0);

	/* The daemon goes: the descriptor turns readable, and nothing is left to reap. */
	ck_assert_int_eq(kvp_complete_arm(r), 0);
	kill(d.pid, SIGTERM);
	ck_assert_int_eq(poll(&p, 1, 5000), 1);
	daemon_wait_stopped(&d);
	ck_assert_int_eq(kvp_complete(r, comp, 4, 0, 0), 0);
	ck_assert_int_eq(kvp_complete_arm(r), -ECONNRESET);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(r), "closed"));
	kvp_disconnect(r);
	kvp_disconnect(plain);
}
END_TEST

START_TEST(test_rings)
{
	ring_scenario(NULL);
}
END_TEST

START_TEST(test_rings_polled)
{
	ring_scenario("ring_poll_us = 200\n");
}
END_TEST

/*
 * Park and resume through the daemon: another session's request drops a parked sequence,
 * whose committed blocks stay cached; resume takes back what is cached and reports the rest.
 */
START_TEST(test_park_drop_resume)
{
	static const char *pools =
		"[pool main]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 4\n"
		"block_tokens = 16\ncapacity_blocks = 16\npolicy = priority\n";
	uint32_t t[64], u[200], x = 1, rec = 99, cached;
	struct kvp_table ta = { 0 }, tr = { 0 };
	struct kvp_client *a, *b;
	uint64_t sa, sb;
	char out[8192];

	daemon_start(&d, pools);
	prompt(t, 64, 10);
	prompt(u, 200, 5000);
	a = connect_ns(NULL, 0);
	b = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_open(a, t, 64, 0, KVP_OPEN_PRIORITY(5), &sa, &cached, &ta), 0);
	for (uint32_t i = 0; i < 4; i++)
		write_block(a, ta.blocks[i], (uint8_t)(0x40 + i));
	ck_assert_int_eq(kvp_commit(a, sa, 64, &ta), 0);
	ck_assert_int_eq(kvp_park(a, sa), 0);
	ck_assert_int_eq(kvp_append(a, sa, &x, 1, NULL), -EBUSY);
	ck_assert_int_eq(kvp_park(a, sa), -EBUSY);

	/* 12 blocks free, 13 needed: a less important request may not drop a ... */
	ck_assert_int_eq(kvp_open(b, u, 200, 0, KVP_OPEN_PRIORITY(1), &sb, &cached, NULL), -ENOSPC);
	/* ... an equally important one may: a's 4 blocks are released, its 3 leading blocks
	 * stay cached (the request takes free blocks first, then the oldest cached: a's leaf). */
	ck_assert_int_eq(kvp_open(b, u, 200, 0, KVP_OPEN_PRIORITY(5), &sb, &cached, NULL), 0);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(json_int(out, "preemptions"), 1);
	assert_verified(&d);
	ck_assert_int_eq(kvp_resume(a, sa, &rec, &tr), -ENOSPC); /* no room yet */
	ck_assert_int_eq(kvp_close(b, sb), 0);

	ck_assert_int_eq(kvp_resume(a, sa, &rec, &tr), 0);
	ck_assert_uint_eq(rec, 16); /* the evicted last block */
	ck_assert_uint_eq(tr.len, 4);
	for (uint32_t i = 0; i < 3; i++) {
		ck_assert_uint_eq(tr.blocks[i], ta.blocks[i]);
		ck_assert(block_is(a, tr.blocks[i], (uint8_t)(0x40 + i))); /* the K/V survived */
	}
	ck_assert_int_ge(kvp_append(a, sa, &x, 1, &tr), 0);
	ck_assert_int_eq(kvp_resume(a, sa, &rec, NULL), -EINVAL); /* active */
	assert_verified(&d);
	kvp_disconnect(a);
	kvp_disconnect(b);
	kvp_table_free(&ta);
	kvp_table_free(&tr);
	daemon_stop(&d);
}
END_TEST

static uint64_t elapsed_ms(const struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (uint64_t)(t1.tv_sec - t0->tv_sec) * 1000 + (uint64_t)(t1.tv_nsec / 1000000) -
	       (uint64_t)(t0->tv_nsec / 1000000);
}

/* A child that opens 80 tokens waiting up to wait_ms; exits 0 if it got them after >= 150 ms. */
static pid_t waiting_opener(uint32_t wait_ms)
{
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct kvp_client *b = connect_ns(NULL, 0);
		struct timespec t0;
		uint32_t t[80];
		uint64_t s;
		int r;

		prompt(t, 80, 7000);
		kvp_set_wait(b, wait_ms);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		r = kvp_open(b, t, 80, 0, 0, &s, NULL, NULL);
		_exit(r != 0 ? 1 : elapsed_ms(&t0) < 150 ? 2 : 0);
	}
	return pid;
}

/*
 * A request may wait for memory: it is retried as blocks come free and fails at its deadline;
 * meanwhile the daemon serves everyone else, and a waiter that dies is forgotten.
 */
START_TEST(test_wait_for_memory)
{
	static const char *pools =
		"[limits]\nmax_wait_ms = 5000\n"
		"[pool main]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 4\n"
		"block_tokens = 16\ncapacity_blocks = 16\n";
	uint32_t ta[200], tb[80], cached;
	struct kvp_client *a, *b, *c;
	struct timespec t0;
	uint64_t sa, sb, sc;
	long long lookups, requests, per_status;
	char out[8192];
	pid_t child;

	daemon_start(&d, pools);
	prompt(ta, 200, 10);
	prompt(tb, 80, 9000);
	a = connect_ns(NULL, 0);
	b = connect_ns(NULL, 0);
	c = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_open(a, ta, 200, 0, 0, &sa, NULL, NULL), 0); /* 13 of 16 blocks */

	/* Freed while it waits: the open goes through. */
	child = waiting_opener(3000);
	msleep(300);
	ck_assert_int_eq(kvp_lookup(c, ta, 200, 0, 0, &cached), 0); /* others are served */
	ck_assert_int_eq(kvp_close(a, sa), 0);
	ck_assert_int_eq(wait_child(child), 0);

	/*
	 * Retried each time blocks come free (too few), yet a request is counted once: the
	 * daemon counts what was sent, however often it ran.
	 */
	ck_assert_int_eq(kvp_open(a, ta, 200, 0, 0, &sa, NULL, NULL), 0);
	ck_assert_int_eq(ctl(&d, "status", out, sizeof(out)), 0);
	requests = json_int(out, "requests");
	ck_assert_int_eq(ctl(&d, "status", out, sizeof(out)), 0);
	per_status = json_int(out, "requests") - requests;
	requests += per_status;
	child = waiting_opener(3000);
	msleep(300);
	for (int i = 0; i < 5; i++) {
		ck_assert_int_eq(kvp_open(c, tb, 16, 0, 0, &sc, NULL, NULL), 0); /* 1 of 3 blocks */
		ck_assert_int_eq(kvp_close(c, sc), 0);
		msleep(20);
	}
	ck_assert_int_eq(kvp_close(a, sa), 0);
	ck_assert_int_eq(wait_child(child), 0);
	ck_assert_int_eq(ctl(&d, "status", out, sizeof(out)), 0);
	/* The waiter's Hello and open, c's ten, a's close, and this status. */
	ck_assert_int_eq(json_int(out, "requests") - requests, 2 + 10 + 1 + per_status);

	/* Never freed: ENOSPC at the deadline, not before. */
	ck_assert_int_eq(kvp_open(a, ta, 200, 0, 0, &sa, NULL, NULL), 0);
	kvp_set_wait(b, 300);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ck_assert_int_eq(kvp_open(b, tb, 80, 0, 0, &sb, NULL, NULL), -ENOSPC);
	ck_assert_uint_ge(elapsed_ms(&t0), 280);
	ck_assert_uint_lt(elapsed_ms(&t0), 3000);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(b), "within wait_ms"));
	kvp_set_wait(b, 6000);
	ck_assert_int_eq(kvp_open(b, tb, 80, 0, 0, &sb, NULL, NULL), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(b), "max_wait_ms"));

	/* Refused before it runs: with memory free, no sequence appears. */
	ck_assert_int_eq(kvp_close(a, sa), 0);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	lookups = json_int(out, "lookups");
	ck_assert_int_eq(kvp_open(b, tb, 80, 0, 0, &sb, NULL, NULL), -EINVAL);
	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	ck_assert_int_eq(json_int(out, "lookups"), lookups);
	ck_assert_int_eq(kvp_open(a, ta, 200, 0, 0, &sa, NULL, NULL), 0);

	/* A waiter killed while it waits: nothing is left behind. */
	child = waiting_opener(5000);
	msleep(200);
	kill(child, SIGKILL);
	ck_assert_int_eq(wait_child(child), 128 + SIGKILL);
	msleep(100);
	assert_verified(&d);
	ck_assert_int_eq(kvp_close(a, sa), 0);
	kvp_set_wait(b, 0);
	ck_assert_int_eq(kvp_open(b, tb, 80, 0, 0, &sb, NULL, NULL), 0);
	kvp_disconnect(a);
	kvp_disconnect(b);
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

/* Regressions: a ring without a data area is refused; an emptied data area is reused whole. */
START_TEST(test_ring_data_area)
{
	struct kvp_connect_options o = { .size = sizeof(o), .ring_entries = 8 };
	struct kvp_completion comp[2];
	struct kvp_client *c = NULL;
	static uint32_t t[1000];
	struct kvp_op op;

	daemon_start(&d, NULL);
	ck_assert_int_eq(kvp_connect(&o, &c), -EINVAL);
	o.ring_data_bytes = 4096;
	ck_assert_int_eq(kvp_connect(&o, &c), 0);
	prompt(t, 1000, 1);
	op = (struct kvp_op){ .opcode = KVP_LOOKUP, .tokens = t, .ntokens = 100 };
	ck_assert_int_eq(kvp_submit(c, &op, 1), 1);
	ck_assert_int_eq(kvp_complete(c, comp, 2, 1, 5000), 1);
	/* 4,000 bytes: more than what is left after the first operation, less than the area. */
	op.ntokens = 1000;
	ck_assert_int_eq(kvp_submit(c, &op, 1), 1);
	ck_assert_int_eq(kvp_complete(c, comp, 2, 1, 5000), 1);
	ck_assert_int_eq(comp[0].res, 0);
	op.ntokens = 1025; /* 4,100 bytes never fit */
	ck_assert_int_eq(kvp_submit(c, &op, 1), -E2BIG);
	kvp_disconnect(c);
	daemon_stop(&d);
}
END_TEST

/* Runs kvpagedctl without --json (human tables, or the metrics text). */
static int ctl_plain(const struct daemon *dm, const char *cmd, char *out, size_t out_len)
{
	char *argv[] = { "kvpagedctl", "--socket", (char *)dm->admin, (char *)cmd, NULL };

	return run_output(dm->ctl[0] ? dm->ctl : bin("KVPAGEDCTL_BIN", "./kvpagedctl"), argv, out,
			  out_len);
}

/* Whether text has key (as "key":) at all before end. */
static bool has_key_before(const char *text, const char *end, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(text, pat);
	return p && p < end;
}

/*
 * A pool with a remote tier whose only node is down, next to one without: pools and stats
 * (JSON and tables) and the metrics show the tier, its node down and the fetch a miss, for
 * that pool only.
 */
START_TEST(test_remote_tier_shown)
{
	static char out[65536];
	char kdir[] = "/tmp/kvpaged-key-XXXXXX", kpath[64], conf[1024];
	struct kvp_connect_options o = { .size = sizeof(o), .pool = "shared", .client_name = "t" };
	const char *shared;
	uint32_t t[32], cached;
	struct kvp_client *c;
	uint64_t seq;

	ck_assert_ptr_nonnull(mkdtemp(kdir));
	snprintf(kpath, sizeof(kpath), "%s/remote.key", kdir);
	write_remote_key(kpath, 4);
	snprintf(conf, sizeof(conf),
		 "[pool main]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 4\n"
		 "block_tokens = 16\ncapacity_blocks = 64\n"
		 "[pool shared]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 4\n"
		 "block_tokens = 16\ncapacity_blocks = 64\nnamespace = shared\n"
		 "remote_tier = redis://127.0.0.1:1\nremote_tier_key_file = %s\n"
		 "remote_tier_timeout_ms = 2000\n", kpath);
	daemon_start_with(&d, NULL, conf);
	/* A prompt the remote tier is asked for, two blocks: its node refuses, so two misses. */
	ck_assert_int_eq(kvp_connect(&o, &c), 0);
	prompt(t, 32, 5);
	ck_assert_int_eq(kvp_open(c, t, 32, 0, 0, &seq, &cached, NULL), 0);
	ck_assert_uint_eq(cached, 0);

	ck_assert_int_eq(ctl(&d, "pools", out, sizeof(out)), 0);
	shared = strstr(out, "\"shared\"");
	ck_assert_ptr_nonnull(shared);
	ck_assert_msg(!has_key_before(out, shared, "remote"), "remote for pool main: %s", out);
	ck_assert_msg(has_key_before(shared, shared + strlen(shared), "remote"), "%s", out);
	ck_assert_ptr_nonnull(strstr(shared, "\"127.0.0.1:1\""));
	ck_assert_ptr_nonnull(strstr(shared, "\"down\""));
	ck_assert_int_eq(json_int(shared, "fetches"), 1);
	ck_assert_int_eq(json_int(shared, "inflight"), 0);

	ck_assert_int_eq(ctl(&d, "stats", out, sizeof(out)), 0);
	shared = strstr(out, "\"shared\"");
	ck_assert_ptr_nonnull(shared);
	ck_assert_msg(!has_key_before(out, shared, "remote"), "remote for pool main: %s", out);
	ck_assert_int_eq(json_int(shared, "hits"), 0);
	ck_assert_int_eq(json_int(strstr(shared, "\"misses\": {"), "down"), 2);
	ck_assert_int_eq(json_int(strstr(shared, "\"verify_failures\""), "tag"), 0);
	ck_assert_int_ge(json_int(strstr(shared, "\"remote\":"), "probes"), 1);
	ck_assert_int_eq(json_int(shared, "stores_dropped"), 0);
	ck_assert_int_eq(json_int(shared, "latency_p99_ns") >= 0, 1);

	ck_assert_int_eq(ctl_plain(&d, "pools", out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "remote node   127.0.0.1:1: down"), "%s", out);
	ck_assert_int_eq(ctl_plain(&d, "stats", out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "shared: remote tier:") && strstr(out, "(down 2)"), "%s", out);
	ck_assert_ptr_null(strstr(out, "main: remote tier"));

	ck_assert_int_eq(ctl_plain(&d, "metrics", out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "\nkvpaged_remote_misses_total{pool=\"shared\","
				  "reason=\"down\"} 2\n"), "%s", out);
	ck_assert_ptr_nonnull(strstr(out, "\nkvpaged_remote_node_state{pool=\"shared\","
					  "node=\"127.0.0.1:1\",state=\"down\"} 1\n"));
	ck_assert_ptr_nonnull(strstr(out, "\nkvpaged_remote_fetches_total{pool=\"shared\"} 1\n"));
	ck_assert_ptr_null(strstr(out, "kvpaged_remote_hits_total{pool=\"main\"}"));
	kvp_disconnect(c);
	daemon_stop(&d);
	unlink(kpath);
	rmdir(kdir);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("daemon");
	TCase *tc = tcase_create("daemon");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_eight_processes_share_a_prompt);
	tcase_add_test(tc, test_fork_and_copy_on_write_across_processes);
	tcase_add_test(tc, test_quotas_and_limits);
	tcase_add_test(tc, test_max_sessions);
	tcase_add_test(tc, test_client_killed_mid_stream);
	tcase_add_test(tc, test_namespaces_never_share);
	tcase_add_test(tc, test_rings);
	tcase_add_test(tc, test_rings_polled);
	tcase_add_test(tc, test_completion_fd);
	tcase_add_test(tc, test_socket_served_while_polling);
	tcase_add_test(tc, test_ring_data_area);
	tcase_add_test(tc, test_park_drop_resume);
	tcase_add_test(tc, test_wait_for_memory);
	tcase_add_test(tc, test_remote_tier_shown);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

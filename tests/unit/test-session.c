/* SPDX-License-Identifier: MIT */
/*
 * A session's lifetime against its ring (daemon/server/session.c, ring.c), driven by hand on a
 * real pool and a real io_uring whose completions the test delivers itself:
 *
 *   - a ring request that closes its session from inside ring_process (here: its reply waits
 *     for a copy on a pool whose device failed) leaves the ring usable until the session's last
 *     reference goes, even when the doorbell's poll had ended: the doorbell handler goes on
 *     touching the ring after ring_process returns (a use after free before, which
 *     AddressSanitizer reports);
 *   - when the last reference goes, everything the session was charged is given back, at the
 *     session's, the uid's, the namespace's and the daemon's level.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/server/server.h"
#include "proto/memfd.h"
#include "tests/check-runner.h"
#include "tests/unit/memfd-probe.h"

static const char conf[] = "[daemon]\nsocket = /nonexistent/c.sock\nadmin_socket = /nonexistent/a.sock\n"
			   "[pool main]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 4\n"
			   "block_tokens = 16\ncapacity_blocks = 64\n";

/* A shared memfd's seals: size fixed, seals final, and never executable where it can be said. */
static void assert_shared_seals(int fd, const char *what)
{
	int seals = fcntl(fd, F_GET_SEALS);

	ck_assert_int_ge(seals, 0);
	ck_assert_int_eq(seals & (F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL),
			 F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
	if (kernel_has_noexec_seal())
		ck_assert_msg(seals & F_SEAL_EXEC, "%s: no F_SEAL_EXEC (seals %#x)", what, seals);
	else
		fprintf(stderr, "%s: this kernel has no MFD_NOEXEC_SEAL (Linux 6.3): F_SEAL_EXEC "
			"not checked\n", what);
}

START_TEST(test_ring_outlives_a_close_inside_ring_process)
{
	static struct server srv;
	struct kvpd_config cfg;
	struct ucred cred = { .pid = getpid(), .uid = getuid(), .gid = getgid() };
	struct io_uring_cqe cqe = { .res = POLLIN, .flags = 0 /* the poll ended */ };
	struct uid_account *acct;
	struct session_ring *r;
	struct session *s;
	struct dpool *p;
	char err[256];
	int sv[2];

	ck_assert_int_eq(config_load_string(conf, "test", &cfg, err, sizeof(err)), 0);
	srv.cfg = &cfg;
	ck_assert_int_eq(io_uring_queue_init(64, &srv.ring, 0), 0);
	srv.pools = calloc(1, sizeof(*srv.pools));
	ck_assert_int_eq(dpool_init(&srv.pools[0], &cfg.pools[0]), 0);
	srv.pools[0].srv = &srv;
	srv.npools = 1;
	p = &srv.pools[0];
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);

	/* A welcomed session with rings (what on_hello does), its recv and doorbell armed. */
	acct = account_uid_get(&srv, cred.uid);
	s = session_new(&srv, sv[0], false, &cred, acct);
	ck_assert_ptr_nonnull(s);
	s->pool = p;
	s->welcomed = true;
	p->sessions++;
	account_join_ns(s, dpool_ns_stats(p, 1, "uid:0", cred.uid));
	ck_assert_int_eq(ring_setup(s, 16, 4096), 0);
	r = s->ring;
	ck_assert(r->doorbell_armed);
	/* The ring memory clients map: sealed as the pool is, and never executable. */
	assert_shared_seals(r->mem_fd, "ring memfd");

	/* One OPEN in the ring; its blocks look written by a queued copy of a failed device. */
	uint32_t tokens[16];

	for (uint32_t i = 0; i < 16; i++)
		tokens[i] = i + 1;
	memcpy(r->data, tokens, sizeof(tokens));
	r->sqes[0] = (struct kvp_sqe){ .opcode = KVP_OP_OPEN, .in_off = 0,
				       .in_len = sizeof(tokens), .out_off = 1024, .out_len = 64,
				       .user_data = 7 };
	__atomic_store_n(&r->sq->tail, 1, __ATOMIC_RELEASE);
	p->issued = 1000;
	for (uint32_t b = 0; b < cfg.pools[0].capacity_blocks; b++)
		p->block_ticket[b] = 1000;
	p->failed = -EIO;

	ring_on_doorbell(s, &cqe); /* closes s inside ring_process, then touches the ring */
	ck_assert(s->closing);
	ck_assert_ptr_eq(s->ring, r); /* still there: the recv holds the session */
	ck_assert_uint_eq(r->sq_head, 1);

	/* The last reference: the armed recv completes (cancelled). */
	cqe = (struct io_uring_cqe){ .res = -ECANCELED };
	session_on_recv(s, &cqe);
	ck_assert_ptr_null(srv.sessions);
	ck_assert_uint_eq(srv.use.bytes, 0);
	ck_assert_uint_eq(srv.use.sessions, 0);
	ck_assert_uint_eq(srv.session_fds, 0);
	ck_assert_ptr_null(account_uid_find(&srv, cred.uid));
	ck_assert_uint_eq(p->ns[0]->use.bytes, 0);
	ck_assert_uint_eq(p->ns[0]->use.sessions, 0);
	close(sv[1]);
	dpool_done(p);
	free(srv.pools);
	io_uring_queue_exit(&srv.ring);
	config_free(&cfg);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("session");
	TCase *tc = tcase_create("session");

	tcase_add_test(tc, test_ring_outlives_a_close_inside_ring_process);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

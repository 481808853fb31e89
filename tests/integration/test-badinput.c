/* SPDX-License-Identifier: MIT */
/*
 * Hostile peers: bad frames on the socket and bad entries in the rings.  Each gets an error
 * and loses its session; the daemon, and a well-behaved session opened before, go on.
 */
#include <sys/mman.h>

#include "proto/ring.h"
#include "tests/integration/peer.h"

static struct daemon d;
static struct kvp_client *good;
static uint64_t good_seq;

/* After every attack: the daemon is consistent and the good session still works. */
static void still_fine(void)
{
	uint32_t tok = 1;

	assert_verified(&d);
	ck_assert_int_eq(kvp_append(good, good_seq, &tok, 1, NULL), 0);
}

static void setup(void)
{
	uint32_t t[20], cached;

	daemon_start(&d, NULL);
	good = connect_ns(NULL, 0);
	prompt(t, 20, 1);
	ck_assert_int_eq(kvp_open(good, t, 20, 0, 0, &good_seq, &cached, NULL), 0);
}

static void teardown(void)
{
	kvp_disconnect(good);
	daemon_stop(&d);
}

START_TEST(test_garbage_before_handshake)
{
	int fd = raw_connect(d.sock);

	send_bytes(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
	expect_error_and_close(fd, EPROTO, "bad frame header");
	still_fine();
}
END_TEST

START_TEST(test_first_message_not_hello)
{
	Kvpaged__V1__Close m = KVPAGED__V1__CLOSE__INIT;
	int fd = raw_connect(d.sock);

	m.seq = good_seq; /* someone else's sequence, without a handshake */
	ck_assert_int_eq(kvp_frame_send(fd, KVPAGED__V1__MESSAGE_TYPE__CLOSE, 1, &m.base, NULL, 0), 0);
	expect_error_and_close(fd, EPROTO, "Hello");
	still_fine();
}
END_TEST

START_TEST(test_wrong_version)
{
	Kvpaged__V1__Hello h = KVPAGED__V1__HELLO__INIT;
	int fd = raw_connect(d.sock);

	h.protocol_version = 99;
	ck_assert_int_eq(kvp_frame_send(fd, KVPAGED__V1__MESSAGE_TYPE__HELLO, 1, &h.base, NULL, 0), 0);
	expect_error_and_close(fd, EPROTONOSUPPORT, "version");
	still_fine();
}
END_TEST

START_TEST(test_oversized_frame)
{
	int fd = raw_connect(d.sock);

	send_header(fd, 1u << 30, KVPAGED__V1__MESSAGE_TYPE__HELLO, 0);
	expect_error_and_close(fd, EMSGSIZE, "max_frame_bytes");
	still_fine();
}
END_TEST

START_TEST(test_unknown_type)
{
	int fd = raw_connect(d.sock);
	unsigned nfds;
	int fds[4];

	hello(fd, 0, fds, &nfds);
	close(fds[0]);
	send_header(fd, 0, 999, 0);
	expect_error_and_close(fd, EPROTO, "unknown message type");
	still_fine();
}
END_TEST

START_TEST(test_truncated_protobuf)
{
	/* Open{tokens: packed, claims 50 bytes, 3 follow} */
	static const uint8_t bad[] = { 0x0a, 0x32, 0x01, 0x02, 0x03 };
	int fd = raw_connect(d.sock), fds[4];
	unsigned nfds;

	hello(fd, 0, fds, &nfds);
	close(fds[0]);
	send_header(fd, sizeof(bad), KVPAGED__V1__MESSAGE_TYPE__OPEN, 0);
	send_bytes(fd, bad, sizeof(bad));
	expect_error_and_close(fd, EPROTO, "malformed");
	still_fine();
}
END_TEST

START_TEST(test_frame_announcing_fds)
{
	int fd = raw_connect(d.sock);

	send_header(fd, 0, KVPAGED__V1__MESSAGE_TYPE__HELLO, 1);
	expect_error_and_close(fd, EPROTO, "file descriptors");
	still_fine();
}
END_TEST

START_TEST(test_unexpected_fds)
{
	Kvpaged__V1__Hello h = KVPAGED__V1__HELLO__INIT;
	int fd = raw_connect(d.sock), passed = open("/dev/null", O_RDONLY | O_CLOEXEC);

	h.protocol_version = KVP_PROTOCOL_VERSION;
	/* A well-formed Hello, but an fd rides along (and the header says none). */
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		size_t align; /* cmsghdr alignment */
	} control = { 0 };
	uint8_t frame[256];
	size_t len = protobuf_c_message_get_packed_size(&h.base);
	struct kvp_frame_header fh = { .len = (uint32_t)len, .seq = 1,
				       .type = KVPAGED__V1__MESSAGE_TYPE__HELLO };
	struct iovec iov = { .iov_base = frame, .iov_len = KVP_FRAME_HEADER_BYTES + len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
			     .msg_controllen = sizeof(control.buf) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);

	kvp_frame_header_encode(&fh, frame);
	protobuf_c_message_pack(&h.base, frame + KVP_FRAME_HEADER_BYTES);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &passed, sizeof(int));
	ck_assert_int_ge(sendmsg(fd, &mh, MSG_NOSIGNAL), 0);
	close(passed);
	expect_error_and_close(fd, EPROTO, "file descriptors");
	still_fine();
}
END_TEST

/* A raw ring session: the mapping and the doorbell. */
struct raw_ring {
	int fd, fds[4];
	uint8_t *mem;
	struct kvp_ring_header *h;
	struct kvp_ring_indices *sq, *cq;
	struct kvp_sqe *sqes;
	struct kvp_cqe *cqes;
};

static void raw_ring_open(struct raw_ring *r)
{
	unsigned nfds;
	struct stat st;

	r->fd = raw_connect(d.sock);
	hello(r->fd, 8, r->fds, &nfds);
	ck_assert_uint_eq(nfds, 4);
	ck_assert_int_eq(fstat(r->fds[1], &st), 0);
	r->mem = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fds[1], 0);
	ck_assert_ptr_ne(r->mem, MAP_FAILED);
	r->h = (struct kvp_ring_header *)r->mem;
	ck_assert_uint_eq(r->h->magic, KVP_RING_MAGIC);
	r->sq = (struct kvp_ring_indices *)(r->mem + r->h->sq_off);
	r->cq = (struct kvp_ring_indices *)(r->mem + r->h->cq_off);
	r->sqes = (struct kvp_sqe *)(r->mem + r->h->sqes_off);
	r->cqes = (struct kvp_cqe *)(r->mem + r->h->cqes_off);
}

static void ring_doorbell(struct raw_ring *r)
{
	uint64_t one = 1;

	ck_assert_int_eq(write(r->fds[2], &one, sizeof(one)), 8);
}

START_TEST(test_ring_nop_round_trip)
{
	struct raw_ring r;

	raw_ring_open(&r);
	r.sqes[0] = (struct kvp_sqe){ .opcode = KVP_OP_NOP, .user_data = 42 };
	__atomic_store_n(&r.sq->tail, 1, __ATOMIC_RELEASE);
	ring_doorbell(&r);
	for (int i = 0; i < 500 && __atomic_load_n(&r.cq->tail, __ATOMIC_ACQUIRE) == 0; i++)
		msleep(10);
	ck_assert_uint_eq(r.cq->tail, 1);
	ck_assert_uint_eq(r.cqes[0].user_data, 42);
	ck_assert_int_eq(r.cqes[0].res, 0);
	still_fine();
}
END_TEST

START_TEST(test_ring_tail_far_ahead)
{
	struct raw_ring r;

	raw_ring_open(&r);
	__atomic_store_n(&r.sq->tail, 1000, __ATOMIC_RELEASE);
	ring_doorbell(&r);
	expect_error_and_close(r.fd, EPROTO, "tail");
	still_fine();
}
END_TEST

START_TEST(test_ring_offsets_out_of_range)
{
	struct raw_ring r;

	raw_ring_open(&r);
	r.sqes[0] = (struct kvp_sqe){ .opcode = KVP_OP_OPEN, .in_off = 4000, .in_len = 400 };
	__atomic_store_n(&r.sq->tail, 1, __ATOMIC_RELEASE);
	ring_doorbell(&r);
	expect_error_and_close(r.fd, EPROTO, "offset");
	still_fine();
}
END_TEST

START_TEST(test_ring_bad_opcode_and_overflowing_length)
{
	struct raw_ring r, r2;

	raw_ring_open(&r);
	r.sqes[0] = (struct kvp_sqe){ .opcode = 200 };
	__atomic_store_n(&r.sq->tail, 1, __ATOMIC_RELEASE);
	ring_doorbell(&r);
	expect_error_and_close(r.fd, EPROTO, "opcode");
	raw_ring_open(&r2);
	r2.sqes[0] = (struct kvp_sqe){ .opcode = KVP_OP_LOOKUP, .in_off = 8,
				       .in_len = UINT32_MAX - 3 };
	__atomic_store_n(&r2.sq->tail, 1, __ATOMIC_RELEASE);
	ring_doorbell(&r2);
	expect_error_and_close(r2.fd, EPROTO, "length");
	still_fine();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("badinput");
	TCase *tc = tcase_create("badinput");

	tcase_set_timeout(tc, 60);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_garbage_before_handshake);
	tcase_add_test(tc, test_first_message_not_hello);
	tcase_add_test(tc, test_wrong_version);
	tcase_add_test(tc, test_oversized_frame);
	tcase_add_test(tc, test_unknown_type);
	tcase_add_test(tc, test_truncated_protobuf);
	tcase_add_test(tc, test_frame_announcing_fds);
	tcase_add_test(tc, test_unexpected_fds);
	tcase_add_test(tc, test_ring_nop_round_trip);
	tcase_add_test(tc, test_ring_tail_far_ahead);
	tcase_add_test(tc, test_ring_offsets_out_of_range);
	tcase_add_test(tc, test_ring_bad_opcode_and_overflowing_length);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

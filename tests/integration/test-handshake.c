/* SPDX-License-Identifier: MIT */
/*
 * What a client and the daemon tell each other about versions: the library's release
 * (kvpaged-version.h at compile time, kvp_version() at run time, the symbol versions that tie
 * them), the protocol version agreed in Hello/Welcome within the daemon's range, and the
 * feature bits and opcodes kvp_probe() reports.
 */
#include <dlfcn.h>

#include "proto/ring.h"
#include "tests/integration/peer.h"

static struct daemon d;

static void setup(void)
{
	daemon_start(&d, NULL);
}

static void teardown(void)
{
	daemon_stop(&d);
}

/* A raw Hello saying it speaks [oldest, newest] (oldest 0: the field left out, as version 1
 * clients do); returns the Welcome, or NULL after checking it was refused with needle. */
static Kvpaged__V1__Welcome *hello_versions(uint32_t newest, uint32_t oldest, const char *needle)
{
	Kvpaged__V1__Hello h = KVPAGED__V1__HELLO__INIT;
	Kvpaged__V1__Welcome *w;
	struct kvp_frame_header rh;
	int fd = raw_connect(d.sock), fds[4];
	uint8_t *payload;
	unsigned nfds;

	h.protocol_version = newest;
	h.min_protocol_version = oldest;
	ck_assert_int_eq(kvp_frame_send(fd, KVPAGED__V1__MESSAGE_TYPE__HELLO, 1, &h.base, NULL, 0), 0);
	if (needle) {
		expect_error_and_close(fd, EPROTONOSUPPORT, needle);
		return NULL;
	}
	ck_assert_int_eq(kvp_frame_recv(fd, 1 << 20, &rh, &payload, fds, 4, &nfds), 0);
	ck_assert_uint_eq(rh.type, KVPAGED__V1__MESSAGE_TYPE__WELCOME);
	w = kvpaged__v1__welcome__unpack(NULL, rh.len, payload);
	ck_assert_ptr_nonnull(w);
	ck_assert_ptr_nonnull(w->pool);
	ck_assert_uint_eq(nfds, 1); /* the pool: the session is set up like any other */
	close(fds[0]);
	free(payload);
	close(fd);
	return w;
}

/* The headers can be asked at preprocessing time, as an engine would. */
#if !KVP_CHECK_VERSION(0, 2, 0) || KVP_CHECK_VERSION(KVP_VERSION_MAJOR + 1, 0, 0)
#error "KVP_CHECK_VERSION in #if"
#endif

START_TEST(test_version)
{
	char s[32];

	/* The library loaded is the one these headers came with. */
	ck_assert_uint_eq(kvp_version(), KVP_VERSION_NUMBER);
	ck_assert_uint_eq(kvp_version(),
			  (uint32_t)KVP_VERSION_MAJOR << 16 | KVP_VERSION_MINOR << 8 | KVP_VERSION_PATCH);
	snprintf(s, sizeof(s), "%d.%d.%d", KVP_VERSION_MAJOR, KVP_VERSION_MINOR, KVP_VERSION_PATCH);
	ck_assert_str_eq(s, KVP_VERSION_STRING);
	ck_assert_str_eq(KVP_VERSION_STRING, PACKAGE_VERSION); /* configure.ac's */

	/* At least this release, not a later one. */
	ck_assert(KVP_CHECK_VERSION(KVP_VERSION_MAJOR, KVP_VERSION_MINOR, KVP_VERSION_PATCH));
	ck_assert(KVP_CHECK_VERSION(0, 0, 0));
	ck_assert(!KVP_CHECK_VERSION(KVP_VERSION_MAJOR, KVP_VERSION_MINOR, KVP_VERSION_PATCH + 1));
	ck_assert(!KVP_CHECK_VERSION(KVP_VERSION_MAJOR, KVP_VERSION_MINOR + 1, 0));
	ck_assert(!KVP_CHECK_VERSION(KVP_VERSION_MAJOR + 1, 0, 0));
	/* The encoding orders releases: a later patch, minor or major is a larger number. */
	ck_assert_uint_lt(KVP_VERSION_ENCODE(0, 1, 255), KVP_VERSION_ENCODE(0, 2, 0));
	ck_assert_uint_lt(KVP_VERSION_ENCODE(0, 255, 255), KVP_VERSION_ENCODE(1, 0, 0));
}
END_TEST

/* Each symbol is in the version node of the release that added it (libclient/libkvpaged.sym):
 * an engine built against 0.1.0 binds kvp_connect@LIBKVPAGED_0.1, and a library without
 * kvp_version@LIBKVPAGED_0.2 is refused at load time rather than failing at the call. */
START_TEST(test_symbol_versions)
{
	ck_assert_ptr_nonnull(dlvsym(RTLD_DEFAULT, "kvp_connect", "LIBKVPAGED_0.1"));
	ck_assert_ptr_nonnull(dlvsym(RTLD_DEFAULT, "kvp_complete", "LIBKVPAGED_0.1"));
	ck_assert_ptr_eq(dlvsym(RTLD_DEFAULT, "kvp_version", "LIBKVPAGED_0.2"), (void *)kvp_version);
	ck_assert_ptr_null(dlvsym(RTLD_DEFAULT, "kvp_version", "LIBKVPAGED_0.1"));
	ck_assert_ptr_eq(dlvsym(RTLD_DEFAULT, "kvp_completion_fd", "LIBKVPAGED_0.3"),
			 (void *)kvp_completion_fd);
	ck_assert_ptr_eq(dlvsym(RTLD_DEFAULT, "kvp_complete_arm", "LIBKVPAGED_0.3"),
			 (void *)kvp_complete_arm);
	ck_assert_ptr_null(dlvsym(RTLD_DEFAULT, "kvp_completion_fd", "LIBKVPAGED_0.2"));
}
END_TEST

/* An older client, speaking only version 1 (as libkvpaged 0.1.0 does: no min_protocol_version),
 * is welcomed with version 1, which is what it checks for. */
START_TEST(test_older_version_accepted)
{
	Kvpaged__V1__Welcome *w = hello_versions(KVP_PROTOCOL_MIN_VERSION, 0, NULL);

	ck_assert_uint_eq(KVP_PROTOCOL_MIN_VERSION, 1);
	ck_assert_uint_lt(KVP_PROTOCOL_MIN_VERSION, KVP_PROTOCOL_VERSION);
	ck_assert_uint_eq(w->protocol_version, 1);
	ck_assert_uint_eq(w->min_protocol_version, KVP_PROTOCOL_MIN_VERSION);
	ck_assert_uint_eq(w->max_protocol_version, KVP_PROTOCOL_VERSION);
	kvpaged__v1__welcome__free_unpacked(w, NULL);

	/* Every version in the range is taken as it is. */
	for (uint32_t v = KVP_PROTOCOL_MIN_VERSION; v <= KVP_PROTOCOL_VERSION; v++) {
		w = hello_versions(v, 0, NULL);
		ck_assert_uint_eq(w->protocol_version, v);
		kvpaged__v1__welcome__free_unpacked(w, NULL);
	}
}
END_TEST

/* A newer client that accepts older versions gets the newest the daemon speaks. */
START_TEST(test_newer_client_agrees_on_newest_common)
{
	Kvpaged__V1__Welcome *w = hello_versions(KVP_PROTOCOL_VERSION + 5, 1, NULL);

	ck_assert_uint_eq(w->protocol_version, KVP_PROTOCOL_VERSION);
	kvpaged__v1__welcome__free_unpacked(w, NULL);
	w = hello_versions(KVP_PROTOCOL_VERSION + 5, KVP_PROTOCOL_VERSION, NULL);
	ck_assert_uint_eq(w->protocol_version, KVP_PROTOCOL_VERSION);
	kvpaged__v1__welcome__free_unpacked(w, NULL);
}
END_TEST

/* Below the range, above it, or a range that is empty: refused, saying both ranges. */
START_TEST(test_outside_range_refused)
{
	char want[96];
	int fd;

	snprintf(want, sizeof(want), "protocol version 0..0 not supported (this daemon speaks %u..%u)",
		 KVP_PROTOCOL_MIN_VERSION, KVP_PROTOCOL_VERSION);
	hello_versions(KVP_PROTOCOL_MIN_VERSION - 1, 0, want);
	snprintf(want, sizeof(want), "protocol version %u..%u not supported",
		 KVP_PROTOCOL_VERSION + 1, KVP_PROTOCOL_VERSION + 3);
	hello_versions(KVP_PROTOCOL_VERSION + 3, KVP_PROTOCOL_VERSION + 1, want);
	hello_versions(1, 2, "protocol version 2..1 not supported");
	/* The daemon is fine, and the library still gets in. */
	kvp_disconnect(connect_ns(NULL, 0));
	fd = raw_connect(d.sock);
	close(fd);
	assert_verified(&d);
}
END_TEST

#define ALL_OPCODES ((UINT64_C(1) << (KVP_PACKED + 1)) - 1)

START_TEST(test_probe_reports_welcome)
{
	struct kvp_client *c = connect_ns(NULL, 8);
	struct kvp_probe_info p = { .size = sizeof(p) };
	struct kvp_op op = { .opcode = KVP_PACKED + 1 };
	struct kvp_completion done;

	ck_assert_int_eq(kvp_probe(c, &p), 0);
	ck_assert_uint_eq(p.size, sizeof(p));
	ck_assert_uint_eq(p.protocol_version, KVP_PROTOCOL_VERSION);
	ck_assert_uint_eq(p.min_protocol_version, KVP_PROTOCOL_MIN_VERSION);
	ck_assert_uint_eq(p.max_protocol_version, KVP_PROTOCOL_VERSION);
	/* The default daemon: rings, park, both retention policies, waits (max_wait_ms 60 s); a pool
	 * without tiers. */
	ck_assert_uint_eq(p.features, KVP_FEATURE_RINGS | KVP_FEATURE_WAIT | KVP_FEATURE_PARK |
					      KVP_FEATURE_SINKS | KVP_FEATURE_H2O);
	/* Every opcode the header names, and none it does not: the next one is refused. */
	ck_assert_uint_eq(p.opcodes, ALL_OPCODES);
	ck_assert_int_eq(kvp_submit(c, &op, 1), -EINVAL);
	op = (struct kvp_op){ .opcode = KVP_NOP, .user_data = 7 };
	ck_assert_int_eq(kvp_submit(c, &op, 1), 1);
	ck_assert_int_eq(kvp_complete(c, &done, 1, 1, 5000), 1);
	ck_assert_uint_eq(done.user_data, 7);

	/* A caller built against a larger struct gets what this library has; a smaller one than
	 * 0.2.0's is refused and left alone. */
	struct {
		struct kvp_probe_info p;
		uint64_t later;
	} big = { .p.size = sizeof(big), .later = 99 };
	ck_assert_int_eq(kvp_probe(c, &big.p), 0);
	ck_assert_uint_eq(big.p.size, sizeof(struct kvp_probe_info));
	ck_assert_uint_eq(big.p.features, p.features);
	ck_assert_uint_eq(big.later, 99);
	struct kvp_probe_info small = { .size = offsetof(struct kvp_probe_info, opcodes),
					.features = 42 };
	ck_assert_int_eq(kvp_probe(c, &small), -EINVAL);
	ck_assert_uint_eq(small.features, 42);
	kvp_disconnect(c);
}
END_TEST

/* The bits follow the configuration: a pool with a host tier says so, a daemon that allows no
 * wait does not announce waits (and refuses one). */
START_TEST(test_probe_follows_configuration)
{
	struct kvp_probe_info p = { .size = sizeof(p) };
	struct kvp_client *c;
	uint32_t t[16], cached;
	uint64_t seq;

	daemon_stop(&d);
	daemon_start(&d, "[limits]\nmax_wait_ms = 0\n"
			 "[pool main]\nlayers = 1\nkv_heads = 1\nhead_dim = 4\nelement_bytes = 4\n"
			 "block_tokens = 16\ncapacity_blocks = 64\nhost_tier_blocks = 8\n");
	c = connect_ns(NULL, 0);
	ck_assert_int_eq(kvp_probe(c, &p), 0);
	ck_assert_uint_eq(p.features, KVP_FEATURE_RINGS | KVP_FEATURE_PARK | KVP_FEATURE_SINKS |
					      KVP_FEATURE_H2O | KVP_FEATURE_HOST_TIER);
	prompt(t, 16, 1);
	kvp_set_wait(c, 10);
	ck_assert_int_eq(kvp_open(c, t, 16, 0, 0, &seq, &cached, NULL), -EINVAL);
	ck_assert_ptr_nonnull(strstr(kvp_last_error(c), "max_wait_ms"));
	kvp_disconnect(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("handshake");
	TCase *tc = tcase_create("version");
	TCase *wire = tcase_create("protocol");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_version);
	tcase_add_test(tc, test_symbol_versions);
	suite_add_tcase(s, tc);
	tcase_set_timeout(wire, 60);
	tcase_add_checked_fixture(wire, setup, teardown);
	tcase_add_test(wire, test_older_version_accepted);
	tcase_add_test(wire, test_newer_client_agrees_on_newest_common);
	tcase_add_test(wire, test_outside_range_refused);
	tcase_add_test(wire, test_probe_reports_welcome);
	tcase_add_test(wire, test_probe_follows_configuration);
	suite_add_tcase(s, wire);
	return run_suite(s);
}

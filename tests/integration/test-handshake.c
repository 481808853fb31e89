/* SPDX-License-Identifier: MIT */
/*
 * What a client and the daemon tell each other about versions: the library's release
 * (kvpaged-version.h at compile time, kvp_version() at run time, the symbol versions that tie
 * them).
 */
#include <dlfcn.h>

#include "tests/integration/harness.h"

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
}
END_TEST

int main(void)
{
	Suite *s = suite_create("handshake");
	TCase *tc = tcase_create("version");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_version);
	tcase_add_test(tc, test_symbol_versions);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

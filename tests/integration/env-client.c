/* SPDX-License-Identifier: MIT */
/*
 * For secure-env.test: connects where libkvpaged's kvp_connect() goes by default (no
 * socket_path: $KVPAGED_SOCKET, else the system socket) and prints its effective uid, the
 * result and the error, which names the socket it tried.  It is built with the library's
 * sources, not against libkvpaged.so from the build tree, so that a setuid copy of it runs
 * anywhere (the dynamic linker ignores LD_LIBRARY_PATH in a setuid program).
 */
#include <stdio.h>
#include <unistd.h>

#include "libclient/include/kvpaged.h"

/*
 * Under the sanitizers (configure --enable-sanitizers), LeakSanitizer would stop this program's
 * threads at exit, which it cannot do in a setuid process (not dumpable), and a setuid process
 * does not see $ASAN_OPTIONS: its hook turns it off here.  Unused in other builds.
 */
__attribute__((visibility("default"))) int __lsan_is_turned_off(void);
__attribute__((visibility("default"))) int __lsan_is_turned_off(void)
{
	return 1;
}

int main(void)
{
	char why[512] = "";
	struct kvp_connect_options o = { .size = sizeof(o), .error_buf = why,
					 .error_len = sizeof(why) };
	struct kvp_client *c = NULL;
	int r = kvp_connect(&o, &c);

	printf("euid %u: %d %s\n", (unsigned)geteuid(), r, r < 0 ? why : "connected");
	kvp_disconnect(c);
	return 0;
}

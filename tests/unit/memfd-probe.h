/* SPDX-License-Identifier: MIT */
/* What the running kernel's memfds can do, for tests that check the daemon's seals. */
#pragma once

#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <unistd.h>

#include "proto/memfd.h"

/*
 * Whether this kernel has MFD_NOEXEC_SEAL (Linux 6.3); older ones refuse it with EINVAL, and
 * their memfds cannot carry F_SEAL_EXEC.  Any other error is a broken test machine.
 */
static inline bool kernel_has_noexec_seal(void)
{
	int fd = memfd_create("probe", MFD_CLOEXEC | MFD_NOEXEC_SEAL);

	if (fd < 0) {
		ck_assert_int_eq(errno, EINVAL);
		return false;
	}
	close(fd);
	return true;
}

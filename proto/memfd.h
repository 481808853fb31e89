/* SPDX-License-Identifier: MIT */
/*
 * memfd_create() for memory the daemon shares: close-on-exec, sealable, and never executable
 * where the kernel can promise that (MFD_NOEXEC_SEAL, Linux 6.3: the file loses its exec bits
 * and gets F_SEAL_EXEC, so no one it is passed to can make it executable).  Older kernels
 * refuse the flag with EINVAL; the memfd is then made without it, sealable as before.  The
 * caller adds its own seals (F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL once it is sized):
 * MFD_NOEXEC_SEAL leaves F_SEAL_SEAL off, so that still works.
 */
#pragma once

#include <errno.h>
#include <sys/mman.h>

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif
#ifndef F_SEAL_EXEC
#define F_SEAL_EXEC 0x0020
#endif

/* Returns the fd, or -errno. */
static inline int memfd_new_sealable(const char *name)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);

	if (fd < 0 && errno == EINVAL)
		fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	return fd < 0 ? -errno : fd;
}

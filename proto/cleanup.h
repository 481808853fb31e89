/* SPDX-License-Identifier: MIT */
/*
 * Ownership helpers in systemd's manner (docs/CODING_STYLE.md there): a variable declared
 * _cleanup_free_ is freed, one declared _cleanup_close_ (initialised to -EBADF) closed, when it
 * goes out of scope; TAKE_PTR() and TAKE_FD() hand the value on and leave NULL / -EBADF behind,
 * so what a function gives its caller is never released by the function itself.
 *
 * Macros and static inline functions only: no I/O of its own, nothing to link, so daemon/,
 * libclient/ and the tests can all include it (proto/ depends on nothing in the tree).
 */
#pragma once

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

/* Calls fn(&var) when var goes out of scope. */
#define _cleanup_(fn) __attribute__((cleanup(fn)))

static inline void freep(void *p)
{
	free(*(void **)p);
}

/* Closes a non-negative fd, keeping errno: cleanup runs on error paths that return -errno. */
static inline void closep(int *fd)
{
	if (*fd >= 0) {
		int saved = errno;

		close(*fd);
		errno = saved;
	}
}

#define _cleanup_free_ _cleanup_(freep)
#define _cleanup_close_ _cleanup_(closep)

/* The value of var, and var reset to null (so its cleanup does nothing). */
#define TAKE_GENERIC(var, type, null)                                                          \
	({                                                                                     \
		type *_pvar_ = &(var);                                                         \
		type _var_ = *_pvar_;                                                          \
		*_pvar_ = (null);                                                              \
		_var_;                                                                         \
	})
#define TAKE_PTR(p) TAKE_GENERIC(p, __typeof__(p), NULL)
#define TAKE_FD(fd) TAKE_GENERIC(fd, int, -EBADF)

/* SPDX-License-Identifier: MIT */
/*
 * systemd integration through libsystemd.  Socket activation takes the daemon's two sockets by
 * name (FileDescriptorName=client / admin), so the units may pass them in any order, or only
 * one of them; the notify calls are sd_notify(3) and cost nothing outside systemd.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/sd.h"

static void close_passed(int n)
{
	for (int i = 0; i < n; i++)
		close(SD_LISTEN_FDS_START + i);
}

int systemd_take_sockets(int *ret_client, int *ret_admin)
{
	int client = -EBADF, admin = -EBADF, n, r = 0;
	char **names = NULL;

	/* Unsets LISTEN_* so that nothing we might start inherits them; sets FD_CLOEXEC. */
	n = sd_listen_fds_with_names(1, &names);
	if (n < 0)
		return log_error_errno(n, "socket activation: cannot read LISTEN_FDS: %m");
	for (int i = 0; i < n; i++) {
		const char *name = names && names[i] ? names[i] : "unknown";
		int fd = SD_LISTEN_FDS_START + i;
		int *slot = !strcmp(name, SYSTEMD_FDNAME_CLIENT)  ? &client
			    : !strcmp(name, SYSTEMD_FDNAME_ADMIN) ? &admin
								  : NULL;

		if (!slot) {
			log_warning("socket activation: ignoring fd %d named '%s' (kvpaged "
				    "takes '" SYSTEMD_FDNAME_CLIENT "' and '" SYSTEMD_FDNAME_ADMIN
				    "': set FileDescriptorName=)", fd, name);
			close(fd);
			continue;
		}
		if (*slot >= 0) {
			r = log_error_errno(EINVAL, "socket activation: two sockets named '%s'",
					    name);
			break;
		}
		if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
			r = log_error_errno(EINVAL, "socket activation: the socket named '%s' "
					    "is not a listening AF_UNIX stream socket "
					    "(ListenStream= with a path)", name);
			break;
		}
		*slot = fd;
	}
	for (int i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
	if (r < 0) {
		close_passed(n);
		return r;
	}
	*ret_client = client;
	*ret_admin = admin;
	return (client >= 0) + (admin >= 0);
}

uint64_t systemd_watchdog_interval_ns(void)
{
	uint64_t usec = 0;

	/* 0 with no WATCHDOG_USEC, or a WATCHDOG_PID that is not ours; leave the variables. */
	if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
		return 0;
	return usec * 1000u / 2;
}

int systemd_notify(const char *fmt, ...)
{
	char *msg = NULL;
	va_list ap;
	int r;

	va_start(ap, fmt);
	r = vasprintf(&msg, fmt, ap);
	va_end(ap);
	if (r < 0)
		return -ENOMEM;
	r = sd_notify(0, msg);
	if (r < 0)
		(void)log_full_errno(LOG_DEBUG, r, "sd_notify(%s): %m", msg);
	free(msg);
	return r;
}

int systemd_notify_ready(const char *status)
{
	return systemd_notify("READY=1\nSTATUS=%s", status);
}

int systemd_notify_reloading(const char *status)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return systemd_notify("RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=%s",
			      (unsigned long long)ts.tv_sec * 1000000ull +
				      (unsigned long long)ts.tv_nsec / 1000u,
			      status);
}

int systemd_notify_stopping(const char *status)
{
	return systemd_notify("STOPPING=1\nSTATUS=%s", status);
}

int systemd_notify_status(const char *status)
{
	return systemd_notify("STATUS=%s", status);
}

int systemd_notify_watchdog(void)
{
	return systemd_notify("WATCHDOG=1");
}

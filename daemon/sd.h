/* SPDX-License-Identifier: MIT */
/*
 * systemd integration, in one place (libsystemd): socket activation by name and the notify
 * protocol (READY, STATUS, RELOADING, STOPPING, WATCHDOG).  Outside systemd (no LISTEN_FDS, no
 * NOTIFY_SOCKET, no WATCHDOG_USEC) every call does nothing, so the daemon runs the same from a
 * shell.  The daemon's one thread calls these; nothing here is thread-safe.
 */
#pragma once

#include <stdint.h>

/* The names the socket units give the daemon's two sockets (FileDescriptorName=). */
#define SYSTEMD_FDNAME_CLIENT "client"
#define SYSTEMD_FDNAME_ADMIN "admin"

/*
 * Takes the listening sockets systemd passed (LISTEN_FDS, LISTEN_FDNAMES) and removes those
 * variables from the environment.  *ret_client and *ret_admin get the sockets named "client"
 * and "admin" (close-on-exec), or -EBADF for one that was not passed: the daemon binds that one
 * itself.  A passed fd with any other name is closed with a warning.  Returns how many of the
 * two were passed (0 without socket activation), or -errno after logging why: -EINVAL when a
 * name comes twice or a named fd is not a listening AF_UNIX stream socket (every passed fd is
 * closed then, and the outputs are untouched).
 */
int systemd_take_sockets(int *ret_client, int *ret_admin);

/*
 * How often to send WATCHDOG=1: half of WATCHDOG_USEC, in nanoseconds; 0 when systemd asks for
 * no watchdog (or WATCHDOG_PID names another process).
 */
uint64_t systemd_watchdog_interval_ns(void);

/*
 * Sends one notify message (sd_notify(3) syntax, "KEY=value" lines).  Returns 1 when sent, 0
 * when there is no NOTIFY_SOCKET, -errno when sending failed (logged at debug level: systemd
 * going away must not stop the daemon).
 */
int systemd_notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* READY=1 with a STATUS= line: every pool is allocated and both sockets listen. */
int systemd_notify_ready(const char *status);
/* RELOADING=1 (with MONOTONIC_USEC=, which newer systemd wants); READY=1 ends the reload. */
int systemd_notify_reloading(const char *status);
/* STOPPING=1 with a STATUS= line: the graceful drain has begun. */
int systemd_notify_stopping(const char *status);
int systemd_notify_status(const char *status);
int systemd_notify_watchdog(void);

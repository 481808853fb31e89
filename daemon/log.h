/* SPDX-License-Identifier: MIT */
/*
 * The daemon's log: stderr lines with a "<N>" syslog priority prefix, which journald turns
 * into levels.  Only the daemon logs; daemon/core never does.
 */
#pragma once

#include <syslog.h>

/* Messages above this priority are dropped (LOG_INFO by default; LOG_DEBUG with --verbose). */
void log_set_max_level(int level);

/*
 * Logs at level; %m prints strerror(error).  Returns -abs(error), so error paths read
 * `return log_error_errno(r, "cannot bind %s: %m", path);`.  error 0 returns 0.
 */
int log_full_errno(int level, int error, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define log_debug(...) log_full_errno(LOG_DEBUG, 0, __VA_ARGS__)
#define log_info(...) log_full_errno(LOG_INFO, 0, __VA_ARGS__)
#define log_notice(...) log_full_errno(LOG_NOTICE, 0, __VA_ARGS__)
#define log_warning(...) log_full_errno(LOG_WARNING, 0, __VA_ARGS__)
#define log_error(...) log_full_errno(LOG_ERR, 0, __VA_ARGS__)
#define log_warning_errno(e, ...) log_full_errno(LOG_WARNING, (e), __VA_ARGS__)
#define log_error_errno(e, ...) log_full_errno(LOG_ERR, (e), __VA_ARGS__)

/* SPDX-License-Identifier: MIT */
/*
 * The daemon's log: stderr lines with a "<N>" syslog priority prefix, which journald turns
 * into levels.  Only the daemon logs; daemon/core never does.
 *
 * Every line is made safe to read before it is written: a control character (a newline, an
 * escape, a NUL's neighbours) becomes "\xNN", so text a peer sent can never start a line of
 * its own, with a priority of its choosing.
 *
 * Rate limited per call site (like journald's RateLimitBurst, per message source): at most
 * burst lines of one format string per interval; the rest are counted, and once the interval
 * is over one line says how many were dropped.  Not thread-safe: the daemon's one thread logs.
 */
#pragma once

#include <stdint.h>
#include <syslog.h>

/* Messages above this priority are dropped (LOG_INFO by default; LOG_DEBUG with --verbose). */
void log_set_max_level(int level);

/*
 * At most burst lines per interval_ms from one call site; burst 0 turns the limit off.
 * Defaults: 200 lines per 30 s.
 */
void log_set_rate_limit(uint32_t interval_ms, uint32_t burst);

/*
 * Writes the "suppressed" lines of call sites whose interval is over (the daemon calls it
 * now and then, so a burst that stopped is still reported).  Returns how many lines of that
 * kind it wrote.
 */
unsigned log_flush_suppressed(void);

/* Lines dropped by the rate limit since start, for the daemon's statistics. */
uint64_t log_suppressed_total(void);

/*
 * Logs at level; %m prints strerror(error).  Returns -abs(error), so error paths read
 * `return log_error_errno(r, "cannot bind %s: %m", path);`.  error 0 returns 0.
 *
 * %m belongs to the _errno variants: with error 0 (log_info() and the like) it prints
 * "(no error given)", never strerror(0) ("Success") nor whatever errno happens to hold; pass
 * the error (log_warning_errno(errno, ...)) to have it named.  errno is left as it was.
 */
int log_full_errno(int level, int error, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define log_debug(...) log_full_errno(LOG_DEBUG, 0, __VA_ARGS__)
#define log_info(...) log_full_errno(LOG_INFO, 0, __VA_ARGS__)
#define log_notice(...) log_full_errno(LOG_NOTICE, 0, __VA_ARGS__)
#define log_warning(...) log_full_errno(LOG_WARNING, 0, __VA_ARGS__)
#define log_error(...) log_full_errno(LOG_ERR, 0, __VA_ARGS__)
#define log_warning_errno(e, ...) log_full_errno(LOG_WARNING, (e), __VA_ARGS__)
#define log_error_errno(e, ...) log_full_errno(LOG_ERR, (e), __VA_ARGS__)

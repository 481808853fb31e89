/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/log.h"

/* Call sites tracked at once; a new one takes the place of the longest quiet. */
#define LOG_SITES 128

struct log_site {
	const char *fmt;    /* the call site's format string: one per call site */
	uint64_t window_ns; /* start of its current interval */
	uint32_t lines;     /* written in it */
	uint32_t dropped;   /* dropped in it */
	int level;          /* of the dropped lines: the summary goes out at the same level */
};

static int max_level = LOG_INFO;
static uint64_t interval_ns = 30000000000ull;
static uint32_t burst = 200;
static struct log_site sites[LOG_SITES];
static uint64_t suppressed_total;

void log_set_max_level(int level)
{
	max_level = level;
}

void log_set_rate_limit(uint32_t interval_ms, uint32_t lines)
{
	interval_ns = (uint64_t)interval_ms * 1000000u;
	burst = lines;
}

uint64_t log_suppressed_total(void)
{
	return suppressed_total;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * Copies text into out, every control character (and DEL) written as \xNN: what a peer put in
 * a string can neither end the line nor start one that journald would read as another
 * message or another priority.  Backslashes stay: the escape is for reading, not reversing.
 */
static void sanitize(const char *text, char *out, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	size_t j = 0;

	for (const unsigned char *c = (const unsigned char *)text; *c && j + 5 < len; c++) {
		if (*c < 0x20 || *c == 0x7f) {
			out[j++] = '\\';
			out[j++] = 'x';
			out[j++] = hex[*c >> 4];
			out[j++] = hex[*c & 15];
		} else {
			out[j++] = (char)*c;
		}
	}
	out[j] = '\0';
}

static void emit(int level, const char *line)
{
	char safe[2048];

	sanitize(line, safe, sizeof(safe));
	fprintf(stderr, "<%d>%s\n", level, safe);
}

/* The summary of what a site dropped in its last interval; the site starts afresh. */
static void report_dropped(struct log_site *s)
{
	char line[256];

	if (s->dropped) {
		snprintf(line, sizeof(line),
			 "log: %u more lines like \"%.80s\" dropped in %llu s (at most %u per "
			 "interval: log_rate_limit_burst)",
			 s->dropped, s->fmt, (unsigned long long)(interval_ns / 1000000000u), burst);
		emit(s->level, line);
	}
	s->dropped = 0;
	s->lines = 0;
}

/* The site of fmt, taking the slot of the site quiet the longest when all are in use. */
static struct log_site *site_of(const char *fmt, uint64_t now)
{
	size_t h = ((uintptr_t)fmt >> 3) * 0x9e3779b97f4a7c15ull >> 57; /* 7 bits: LOG_SITES */
	struct log_site *oldest = NULL;

	for (size_t i = 0; i < LOG_SITES; i++) {
		struct log_site *s = &sites[(h + i) % LOG_SITES];

		if (s->fmt == fmt)
			return s;
		if (!s->fmt) {
			*s = (struct log_site){ .fmt = fmt, .window_ns = now };
			return s;
		}
		if (!oldest || s->window_ns < oldest->window_ns)
			oldest = s;
	}
	report_dropped(oldest);
	*oldest = (struct log_site){ .fmt = fmt, .window_ns = now };
	return oldest;
}

/* Whether a line from fmt may go out now; counts it either way. */
static bool admit(const char *fmt, int level)
{
	uint64_t now;
	struct log_site *s;

	if (!burst)
		return true;
	now = now_ns();
	s = site_of(fmt, now);
	if (now - s->window_ns >= interval_ns) {
		report_dropped(s);
		s->window_ns = now;
	}
	if (s->lines < burst) {
		s->lines++;
		return true;
	}
	if (!s->dropped || level < s->level)
		s->level = level; /* the summary is as loud as the loudest line it stands for */
	s->dropped++;
	suppressed_total++;
	return false;
}

unsigned log_flush_suppressed(void)
{
	uint64_t now = now_ns();
	unsigned n = 0;

	for (size_t i = 0; i < LOG_SITES; i++) {
		struct log_site *s = &sites[i];

		if (!s->fmt || now - s->window_ns < interval_ns)
			continue;
		n += s->dropped > 0;
		report_dropped(s);
		s->window_ns = now;
	}
	return n;
}

/* What %m says in a call without an error: never strerror(0), "Success". */
#define LOG_NO_ERROR "(no error given)"

/*
 * fmt with each %m (not %%m) replaced by LOG_NO_ERROR, into buf if it fits, else into memory
 * the caller frees (*ret_alloc).  NULL when there is no memory for it.
 */
static const char *without_errno(const char *fmt, char *buf, size_t len, char **ret_alloc)
{
	size_t need = 1, j = 0;
	char *out = buf;

	for (const char *c = fmt; *c; c++) {
		if (c[0] == '%' && c[1] == 'm') {
			need += strlen(LOG_NO_ERROR);
			c++;
		} else if (c[0] == '%' && c[1] == '%') {
			need += 2;
			c++;
		} else {
			need++;
		}
	}
	*ret_alloc = NULL;
	if (need > len) {
		out = *ret_alloc = malloc(need);
		if (!out)
			return NULL;
	}
	for (const char *c = fmt; *c; c++) {
		if (c[0] == '%' && c[1] == 'm') {
			memcpy(out + j, LOG_NO_ERROR, strlen(LOG_NO_ERROR));
			j += strlen(LOG_NO_ERROR);
			c++;
		} else if (c[0] == '%' && c[1] == '%') {
			out[j++] = *c++;
			out[j++] = *c;
		} else {
			out[j++] = *c;
		}
	}
	out[j] = '\0';
	return out;
}

int log_full_errno(int level, int error, const char *fmt, ...)
{
	int saved = errno;
	char line[1024];
	va_list ap;

	error = abs(error);
	if (level <= max_level && admit(fmt, level)) {
		va_start(ap, fmt);
		if (error) {
			errno = error; /* for %m */
			vsnprintf(line, sizeof(line), fmt, ap);
		} else if (!strstr(fmt, "%m")) {
			vsnprintf(line, sizeof(line), fmt, ap);
		} else {
			/*
			 * %m is the _errno variants' (systemd's rule): here it has no error to
			 * name, and errno, whatever it holds, is not this message's.
			 */
			char buf[1024], *alloc;
			const char *f = without_errno(fmt, buf, sizeof(buf), &alloc);

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
			if (f)
				vsnprintf(line, sizeof(line), f, ap);
			else
				snprintf(line, sizeof(line), "%s", fmt); /* no memory: unexpanded */
#pragma GCC diagnostic pop
			free(alloc);
		}
		va_end(ap);
		emit(level, line);
	}
	errno = saved;
	return -error;
}

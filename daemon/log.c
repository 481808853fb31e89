/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/log.h"

static int max_level = LOG_INFO;

void log_set_max_level(int level)
{
	max_level = level;
}

int log_full_errno(int level, int error, const char *fmt, ...)
{
	int saved = errno;
	char line[1024];
	va_list ap;

	error = abs(error);
	if (level <= max_level) {
		errno = error; /* for %m */
		va_start(ap, fmt);
		vsnprintf(line, sizeof(line), fmt, ap);
		va_end(ap);
		fprintf(stderr, "<%d>%s\n", level, line);
	}
	errno = saved;
	return -error;
}

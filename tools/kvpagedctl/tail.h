/* SPDX-License-Identifier: MIT */
/*
 * kvpagedctl events: a live tail of a pool's KV event stream (docs/events.md), decoded by
 * vLLM's schema, as text or one JSON object per batch.
 */
#pragma once

#include <stdbool.h>

/*
 * Subscribes to endpoint and prints batches until count of them (0: for good) or a signal.
 * server_key (Z85) non-empty: the stream speaks CURVE, and key_file holds this client's
 * secret key (as events_curve_secret_key_file does the daemon's).  Returns 0, or 1 after
 * printing why to stderr.
 */
int events_tail(const char *endpoint, const char *server_key, const char *key_file,
		unsigned long count, bool json);

/* SPDX-License-Identifier: MIT */
/* The schema table's types, shared by config.c (loading, printing) and config-reload.c only. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "daemon/config.h"

enum config_section {
	SECTION_DAEMON,
	SECTION_LIMITS,
	SECTION_POOL,
};

enum config_type {
	TYPE_U32,
	TYPE_U64,
	TYPE_SIZE,
	TYPE_PATH,      /* an absolute path that fits in a Unix socket address (KEY_FILE: a
			   file's, up to PATH_MAX); no def_path: unset is NULL */
	TYPE_GROUP,     /* a group name or gid; aux_offset is the bool saying it is set */
	TYPE_NAMESPACE, /* enum kvpd_namespace_mode */
	TYPE_POLICY,    /* enum kvpd_policy */
	TYPE_EVICTION,  /* enum kvpd_eviction */
	TYPE_BACKEND,   /* enum kvpd_backend */
	TYPE_UIDS,      /* user names or uids; aux_offset is the size_t count */
	TYPE_GIDS,      /* group names or gids; aux_offset is the size_t count */
	TYPE_BOOL,      /* yes/no, true/false, on/off, 1/0 */
	TYPE_FILES,     /* absolute paths, comma separated; aux_offset is the size_t count */
	TYPE_NUMBER,    /* a non-negative real number, optionally with a K, M, G, T or P suffix
			   (powers of 1000): 7e9, 7G and 7000M are the same */
	TYPE_LISTEN,    /* a TCP address, IPV4:PORT or [IPV6]:PORT; empty: off (NULL) */
	TYPE_REDIS_URL, /* redis://HOST:PORT[,HOST:PORT...] (redis_parse_url); unset: NULL */
	TYPE_REMOTE_WRITE, /* enum kvpd_remote_write */
	TYPE_STRING,    /* text checked by the key's check (may be NULL); def_path the default,
			   none: unset is NULL */
};

/* flags: KEY_* in config.c */
struct config_key {
	const char *name;
	enum config_section section;
	enum config_type type;
	unsigned flags;
	uint64_t def, min, max; /* numbers and TYPE_NAMESPACE */
	const char *def_path;
	size_t offset; /* into struct kvpd_pool_config for pool keys, else struct kvpd_config */
	size_t aux_offset;
	/* TYPE_STRING: 0, or -EINVAL with why (len bytes) saying what is wrong with value. */
	int (*check)(const char *value, char *why, size_t len);
};

/* The schema table in config.c: every key of every section. */
extern const struct config_key *const config_schema;
extern const size_t config_nkeys;

static inline void *field_at(void *base, size_t offset)
{
	return (char *)base + offset;
}

static inline const void *cfield_at(const void *base, size_t offset)
{
	return (const char *)base + offset;
}

/* A key's value as config_print() spells it, cut to fit buf; returns buf. */
const char *config_format_value(const struct config_key *key, const void *base, char *buf,
				size_t len);

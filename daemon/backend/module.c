/* SPDX-License-Identifier: MIT */
/*
 * Backend modules: shared objects loaded with dlopen(3) when a pool asks for them, so that the
 * daemon starts and serves host pools where a module's driver is missing.  A module is loaded
 * once per path and never unloaded: its code may be on a driver's callback threads until exit.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/backend/backend.h"

struct loaded_module {
	struct loaded_module *next;
	const struct backend_module *module;
	char path[];
};

static struct loaded_module *loaded;

int backend_module_load(const char *path, uint32_t device, const struct backend_module **ret,
			char *why, size_t why_len)
{
	const struct backend_module *m = NULL;
	struct loaded_module *l;
	void *handle;
	int r;

	for (l = loaded; l; l = l->next)
		if (!strcmp(l->path, path)) {
			m = l->module;
			break;
		}
	if (!m) {
		/* RTLD_LOCAL: a module's dependencies never resolve the daemon's symbols. */
		handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		if (!handle) {
			const char *e = dlerror();

			/* dlerror() names the file. */
			snprintf(why, why_len, "cannot load the module: %s", e ? e : path);
			return -ENOENT;
		}
		m = dlsym(handle, BACKEND_MODULE_SYMBOL);
		if (!m || m->abi != BACKEND_MODULE_ABI || !m->ops || !m->probe) {
			if (m)
				snprintf(why, why_len,
					 "%s: module ABI %u, the daemon speaks %u (install the "
					 "module that came with this kvpaged)",
					 path, m->abi, BACKEND_MODULE_ABI);
			else
				snprintf(why, why_len, "%s: not a kvpaged backend module (no %s)",
					 path, BACKEND_MODULE_SYMBOL);
			dlclose(handle);
			return -ENOEXEC;
		}
		l = malloc(sizeof(*l) + strlen(path) + 1);
		if (!l) {
			dlclose(handle);
			snprintf(why, why_len, "out of memory");
			return -ENOMEM;
		}
		l->module = m;
		strcpy(l->path, path);
		l->next = loaded;
		loaded = l;
	}
	r = m->probe(device, why, why_len);
	if (r < 0)
		return r;
	*ret = m;
	return 0;
}

/*
 * Loading libibverbs, librdmacm and libmlx5 at run time.
 *
 * Each library is loaded at most once per process, by pthread_once, on the first call of any
 * of its functions (or of rdma_mummy_load()). The once routine resolves every exported
 * function into its cache slot, so the forwarding functions pay one dlsym() per symbol per
 * process, and records the file name and the dlerror() text of a failure for
 * rdma_mummy_load_error(). After the once routine nothing here is written again, which is
 * what makes the strings and slots safe to hand to any thread.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mummy.h"

struct mummy_library {
	const char *env;		/* variable that overrides the file name */
	const char *default_path;	/* soname: ABI 1 is what the headers describe */
	const struct mummy_symbol *symbols;
	pthread_once_t once;
	void *handle;			/* NULL when loading failed */
	const char *path;		/* what dlopen() was given */
	char error[512];		/* dlerror() text of a failed load, "" otherwise */
};

static struct mummy_library libraries[] = {
	[MUMMY_LIB_IBVERBS] = {
		.env = "RDMA_MUMMY_LIBIBVERBS",
		.default_path = "libibverbs.so.1",
		.symbols = mummy_ibverbs_symbols,
		.once = PTHREAD_ONCE_INIT,
	},
	[MUMMY_LIB_RDMACM] = {
		.env = "RDMA_MUMMY_LIBRDMACM",
		.default_path = "librdmacm.so.1",
		.symbols = mummy_rdmacm_symbols,
		.once = PTHREAD_ONCE_INIT,
	},
	/*
	 * libmlx5 links libibverbs.so.1 itself and is the very file libibverbs loads as its
	 * mlx5 provider (libibverbs/libmlx5-rdmavNN.so is a link to it): the dynamic loader maps
	 * one copy, so mlx5dv_is_supported() recognises the devices libibverbs opened.
	 */
	[MUMMY_LIB_MLX5] = {
		.env = "RDMA_MUMMY_LIBMLX5",
		.default_path = "libmlx5.so.1",
		.symbols = mummy_mlx5_symbols,
		.once = PTHREAD_ONCE_INIT,
	},
};

#define MUMMY_NLIBS (sizeof(libraries) / sizeof(libraries[0]))

static void load_library(struct mummy_library *lib)
{
	const struct mummy_symbol *sym;
	const char *override = getenv(lib->env);
	const char *err;

	lib->path = (override && *override) ? override : lib->default_path;
	/*
	 * RTLD_NOW: a library that cannot resolve its own dependencies should fail here, where
	 * the reason is recorded, not later in the middle of a verb. RTLD_LOCAL: the shim is the
	 * only client of these symbols, and keeping them out of the global scope stops them from
	 * interposing on anything else in the process.
	 */
	dlerror();
	lib->handle = dlopen(lib->path, RTLD_NOW | RTLD_LOCAL);
	if (!lib->handle) {
		err = dlerror();
		snprintf(lib->error, sizeof(lib->error), "%s",
			 err ? err : "dlopen failed without a dlerror() message");
		return;
	}
	for (sym = lib->symbols; sym->name; sym++) {
		/* A symbol absent from an older rdma-core stays NULL: that verb reports EOPNOTSUPP. */
		*sym->slot = dlsym(lib->handle, sym->name);
	}
}

static void load_ibverbs(void)
{
	load_library(&libraries[MUMMY_LIB_IBVERBS]);
}

static void load_rdmacm(void)
{
	load_library(&libraries[MUMMY_LIB_RDMACM]);
}

static void load_mlx5(void)
{
	load_library(&libraries[MUMMY_LIB_MLX5]);
}

static void (*const load_routines[])(void) = {
	[MUMMY_LIB_IBVERBS] = load_ibverbs,
	[MUMMY_LIB_RDMACM] = load_rdmacm,
	[MUMMY_LIB_MLX5] = load_mlx5,
};

void mummy_load(enum mummy_lib lib)
{
	pthread_once(&libraries[lib].once, load_routines[lib]);
}

static struct mummy_library *known(enum rdma_mummy_library lib)
{
	/* The enum comes from callers in other languages: check it rather than index blindly. */
	if ((unsigned int)lib >= MUMMY_NLIBS)
		return NULL;
	mummy_load((enum mummy_lib)lib);
	return &libraries[lib];
}

int rdma_mummy_load(enum rdma_mummy_library lib)
{
	struct mummy_library *l = known(lib);

	if (!l) {
		errno = EINVAL;
		return -1;
	}
	if (!l->handle) {
		errno = EOPNOTSUPP;
		return -1;
	}
	return 0;
}

const char *rdma_mummy_load_path(enum rdma_mummy_library lib)
{
	struct mummy_library *l = known(lib);

	return l ? l->path : NULL;
}

const char *rdma_mummy_load_error(enum rdma_mummy_library lib)
{
	struct mummy_library *l = known(lib);

	return (l && !l->handle) ? l->error : NULL;
}

int rdma_mummy_has_symbol(enum rdma_mummy_library lib, const char *name)
{
	struct mummy_library *l = known(lib);

	if (!l || !l->handle || !name)
		return 0;
	return dlsym(l->handle, name) != NULL;
}

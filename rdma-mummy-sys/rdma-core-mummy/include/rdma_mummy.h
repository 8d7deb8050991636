/*
 * rdma-core-mummy: a link-time stand-in for libibverbs and librdmacm.
 *
 * Link librdma-core-mummy.a (plus -ldl -lpthread) instead of -libverbs -lrdmacm. Every
 * function the two libraries export for programs (their public symbol versions, rsocket's
 * r* functions included; see the lists in exports/) is defined here under its real name and
 * forwards to the library, which is dlopen()ed on first use. When a library or one of its functions cannot be
 * found, the call fails the way the verb documents (NULL, -1, or an errno value) with errno set
 * to EOPNOTSUPP, and the functions below say why.
 *
 * The static inline functions of verbs.h keep working as they are; the control-path ones are
 * also exported as rdma_mummy_<name>() (see rdma_mummy_inline.h) for languages that cannot
 * compile C inlines.
 *
 * The same goes for libmlx5.so.1, the mlx5 provider's direct-verbs library (mlx5dv.h, shipped
 * with the provider: Debian's ibverbs-providers): every mlx5dv_* function it exports is defined
 * here and loads it on first use; mlx5dv.h's static inlines are exported as rdma_mummy_mlx5dv_*.
 * Without it, mlx5dv_is_supported() is false and the other mlx5dv_* calls fail with EOPNOTSUPP.
 *
 * Environment: RDMA_MUMMY_LIBIBVERBS, RDMA_MUMMY_LIBRDMACM and RDMA_MUMMY_LIBMLX5 replace the
 * file names passed to dlopen() (default "libibverbs.so.1", "librdmacm.so.1", "libmlx5.so.1").
 */
#ifndef RDMA_MUMMY_H
#define RDMA_MUMMY_H

#include <rdma/rsocket.h>

#include "rdma_mummy_extra.h"
#include "rdma_mummy_inline.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The libraries the shim loads. */
enum rdma_mummy_library {
	RDMA_MUMMY_LIB_IBVERBS = 0,
	RDMA_MUMMY_LIB_RDMACM = 1,
	/* mlx5's direct verbs (mlx5dv.h), a provider library: optional, loaded on first use. */
	RDMA_MUMMY_LIB_MLX5 = 2,
};

/*
 * Load the library now (once per process; later calls return the first result).
 * Returns 0 when it is loaded, -1 (errno = EOPNOTSUPP) when it could not be, or when lib is
 * not a known library (errno = EINVAL).
 */
int rdma_mummy_load(enum rdma_mummy_library lib);

/*
 * The file name dlopen() was given for lib (after the environment override), or NULL when
 * lib is unknown. Like the two functions below, it loads lib first if nothing has yet. The
 * string lives as long as the process.
 */
const char *rdma_mummy_load_path(enum rdma_mummy_library lib);

/*
 * Why loading lib failed: the dlerror() text, or NULL when it loaded (or lib is unknown).
 * The string lives as long as the process.
 */
const char *rdma_mummy_load_error(enum rdma_mummy_library lib);

/*
 * 1 when the loaded lib exports the function called name, 0 when it does not or the
 * library is not loaded (this call loads it first). Lets a caller tell "older rdma-core
 * without this verb" from a failing verb.
 */
int rdma_mummy_has_symbol(enum rdma_mummy_library lib, const char *name);

#ifdef __cplusplus
}
#endif

#endif

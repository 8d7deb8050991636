/* Internal interface between the loader and the generated forwarding functions. */
#ifndef MUMMY_INTERNAL_H
#define MUMMY_INTERNAL_H

#include <errno.h>
#include <stddef.h>

#include "rdma_mummy.h"

enum mummy_lib {
	MUMMY_LIB_IBVERBS = RDMA_MUMMY_LIB_IBVERBS,
	MUMMY_LIB_RDMACM = RDMA_MUMMY_LIB_RDMACM,
	MUMMY_LIB_MLX5 = RDMA_MUMMY_LIB_MLX5,
};

/* One exported function: its name and the slot its dlsym() result is cached in. */
struct mummy_symbol {
	const char *name;
	void **slot;
};

/* Generated tables (forward.c), each ending with a { NULL, NULL } entry. */
extern const struct mummy_symbol mummy_ibverbs_symbols[];
extern const struct mummy_symbol mummy_rdmacm_symbols[];
extern const struct mummy_symbol mummy_mlx5_symbols[];

/*
 * Load lib once. Every slot of its table is filled (or left NULL) inside the pthread_once
 * routine, so a thread that returns from this call reads the slots race-free.
 */
void mummy_load(enum mummy_lib lib);

#endif

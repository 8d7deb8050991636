/* On-demand paging on the null provider: see null_provider_odp.c. */
#ifndef BENCHES_NULL_PROVIDER_ODP_H
#define BENCHES_NULL_PROVIDER_ODP_H

#include <stdint.h>
#include <infiniband/verbs.h>

#define NULL_ODP_LKEY 0x0d0d1u
#define NULL_ODP_RKEY 0x0d0d2u
#define NULL_ODP_MAX_SGES 4

/* What the last advise_mr got, and how many calls there were. */
struct null_odp_advice {
	uint64_t calls;
	struct ibv_pd *pd;
	uint32_t advice;
	uint32_t flags;
	uint32_t num_sge;
	struct ibv_sge sges[NULL_ODP_MAX_SGES]; /* the first NULL_ODP_MAX_SGES of them */
};

struct null_odp;

/* Sets ctx's query_device_ex and advise_mr ops (NULL when out of slots or memory); pd is
 * what the fake implicit region belongs to. Detach before the provider is freed. */
struct null_odp *null_odp_attach(struct ibv_context *ctx, struct ibv_pd *pd);
void null_odp_detach(struct null_odp *o);
/* What query_device_ex reports in odp_caps and xrc_odp_caps (all 0 at first). */
void null_odp_set_caps(struct null_odp *o, uint64_t general, uint32_t rc, uint32_t uc,
		       uint32_t ud, uint32_t xrc);
/* What advise_mr returns (0 at first). */
void null_odp_set_advise_ret(struct null_odp *o, int ret);
/* The fake implicit region: addr NULL, length SIZE_MAX, NULL_ODP_LKEY/RKEY. */
struct ibv_mr *null_odp_mr(struct null_odp *o);
const struct null_odp_advice *null_odp_seen(const struct null_odp *o);

#endif

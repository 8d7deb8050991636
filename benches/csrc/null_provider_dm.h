/*
 * Device memory for the null provider: verbs_context ops alloc_dm, free_dm and reg_dm_mr and
 * the ibv_dm copy functions, reached through verbs.h's inlines (ibv_alloc_dm, ibv_free_dm,
 * ibv_memcpy_to_dm, ibv_memcpy_from_dm, ibv_reg_dm_mr). The "device memory" is heap memory
 * of the test double; every call is counted and its arguments recorded.
 *
 * A provider gets device memory with null_dm_enable; without it, ibv_alloc_dm answers
 * EOPNOTSUPP as on a device without device memory (rxe).
 */
#ifndef BENCHES_NULL_PROVIDER_DM_H
#define BENCHES_NULL_PROVIDER_DM_H

#include <stdint.h>
#include <infiniband/verbs.h>

/* The most device memory one alloc_dm hands out; more fails with ENOMEM. */
#define NULL_DM_MAX (64 * 1024)
/* The most regions reg_dm_mr makes over one device memory; more fails with ENOSPC. */
#define NULL_DM_MAX_MRS 4
/* The lkey of the n-th region over a device memory (from 0): NULL_DM_LKEY_BASE + n. */
#define NULL_DM_LKEY_BASE 0xd000

struct null_dm_counters {
	uint64_t alloc_dm_calls;
	uint64_t free_dm_calls;
	uint64_t copy_to_calls;
	uint64_t copy_from_calls;
	uint64_t reg_dm_mr_calls;
	uint64_t live_dms; /* allocated and not yet freed */
	uint64_t live_mrs; /* regions over device memory that is not yet freed */
	uint64_t last_alloc_length;
	uint32_t last_log_align_req;
	uint32_t last_alloc_comp_mask;
	uint64_t last_copy_offset;
	uint64_t last_copy_length;
	uint64_t last_reg_offset;
	uint64_t last_reg_length;
	uint32_t last_reg_access;
	uint32_t pad;
	struct ibv_pd *last_reg_pd;
	struct ibv_dm *last_reg_dm;
};

struct null_dm_state;

/*
 * Gives the provider whose context is ctx device memory: sets its alloc_dm, free_dm and
 * reg_dm_mr ops. NULL when out of memory. null_dm_disable clears the ops and frees the state,
 * or leaves that to the free_dm of the last device memory still allocated through it.
 */
struct null_dm_state *null_dm_enable(struct ibv_context *ctx);
void null_dm_disable(struct null_dm_state *st);
const struct null_dm_counters *null_dm_counters(const struct null_dm_state *st);
/* Makes every later copy fail with err (0: copies succeed again). */
void null_dm_fail_copies(struct null_dm_state *st, int err);

#endif

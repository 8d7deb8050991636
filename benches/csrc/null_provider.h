/*
 * The null provider: verbs objects (context, PD, classic and extended QP, classic and
 * extended CQ) built in memory, whose provider operations only count what they are given
 * and, for polling, hand back canned completions. It lets the data path of sideway and of C
 * be timed on any machine, without an RDMA device or rdma-core's libraries: nothing here
 * calls a libibverbs function, only verbs.h's static inlines reach these operations.
 *
 * One provider holds one context, one PD, one CQ (usable as classic and as extended) and
 * one QP (usable as classic and as extended) whose send and receive CQ is that CQ.
 */
#ifndef BENCHES_NULL_PROVIDER_H
#define BENCHES_NULL_PROVIDER_H

#include <errno.h>
#include <stdint.h>
#include <infiniband/verbs.h>

/* What the provider's operations saw, for tests to compare the Rust and C sides. */
struct null_counters {
	uint64_t post_send_calls; /* ops.post_send */
	uint64_t send_wrs; /* work requests in those chains */
	uint64_t post_recv_calls; /* ops.post_recv */
	uint64_t recv_wrs;
	uint64_t wr_starts; /* qp_ex->wr_start */
	uint64_t wr_ops; /* qp_ex->wr_<opcode> calls */
	uint64_t wr_sges; /* qp_ex->wr_set_sge calls */
	uint64_t wr_completes; /* qp_ex->wr_complete */
	uint64_t wr_aborts; /* qp_ex->wr_abort */
	uint64_t poll_calls; /* ops.poll_cq, cq_ex->start_poll and next_poll */
	uint64_t completions; /* completions handed back */
	uint64_t end_polls; /* cq_ex->end_poll */
	uint64_t signaled; /* signaled send work requests (each adds a pending completion) */
	uint64_t wr_id_sum; /* sum of the wr_id of every send and receive request posted */
	uint64_t length_sum; /* sum of the SGE lengths of every request posted */
};

/* What the thread- and parent-domain operations saw. */
struct null_domains {
	uint64_t alloc_td_calls;
	uint64_t dealloc_td_calls;
	uint64_t alloc_parent_domain_calls;
	uint64_t create_cq_ex_calls;
	uint64_t create_qp_ex_calls;
	uint64_t alloc_calls; /* the parent domain's alloc callback */
	uint64_t default_allocs; /* ... answered IBV_ALLOCATOR_USE_DEFAULT */
	uint64_t free_calls; /* the parent domain's free callback */
	uint64_t live_buffers; /* allocated and not yet freed */
	uint64_t order_errors; /* dealloc_td while buffers of its objects were live */
	uint64_t td_live;
	uint32_t last_cq_comp_mask;
	uint32_t last_qp_comp_mask;
	struct ibv_pd *last_cq_parent_domain; /* NULL without IBV_CQ_INIT_ATTR_MASK_PD */
	struct ibv_pd *last_qp_pd;
	struct ibv_cq *last_qp_send_cq;
};

/* The buffer every object made on a parent domain asks its allocator for. */
#define NULL_BUFFER_SIZE 4096
#define NULL_BUFFER_ALIGN 64
#define NULL_RES_QP 1 /* resource_type of a QP's buffer */
#define NULL_RES_CQ 2 /* resource_type of a CQ's buffer */
/* The errno create_qp_ex fails with once it has checked and recorded its arguments. */
#define NULL_QP_REFUSED ENOMSG
#define NULL_MAX_BUFFERS 8

struct null_provider;

/* A new provider (NULL when out of memory); free it with null_provider_free. */
struct null_provider *null_provider_new(void);
void null_provider_free(struct null_provider *np);

struct ibv_context *null_provider_context(struct null_provider *np);
struct ibv_pd *null_provider_pd(struct null_provider *np);
struct ibv_qp *null_provider_qp(struct null_provider *np);
struct ibv_qp_ex *null_provider_qp_ex(struct null_provider *np);
struct ibv_cq *null_provider_cq(struct null_provider *np);
struct ibv_cq_ex *null_provider_cq_ex(struct null_provider *np);
const struct null_counters *null_provider_counters(const struct null_provider *np);

/*
 * The completion timestamp cq_ex->read_completion_ts reports: NULL_TS_BASE plus the wr_id of
 * the current entry, so a test can tell which entry it was read on.
 */
#define NULL_TS_BASE 1000000

/* The array the last ops.poll_cq call wrote into (NULL before the first). */
const struct ibv_wc *null_cq_last_poll_array(const struct null_provider *np);

/* The thread/parent-domain counters. */
const struct null_domains *null_provider_domains(const struct null_provider *np);
/* Gives every buffer from the parent domain's allocator back through its free callback, as
 * a provider does when the objects are destroyed (which a test double's sideway objects do
 * not reach). */
void null_domain_release(struct null_provider *np);
/* Clears alloc_td, dealloc_td and alloc_parent_domain: a provider without domains. */
void null_provider_disable_domains(struct null_provider *np);

/* Makes n more completions ready on a CQ of a null provider. */
void null_cq_add(struct ibv_cq *cq, uint32_t n);

#endif

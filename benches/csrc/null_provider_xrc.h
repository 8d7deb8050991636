/*
 * XRC on the null provider (null_provider_xrc.c): an XRC domain, an XRC SRQ, an XRC receive
 * QP and an XRC send QP, reached through verbs.h's inlines (ibv_open_xrcd, ibv_close_xrcd,
 * ibv_create_srq_ex, ibv_get_srq_num, ibv_create_qp_ex) and the send QP's posting functions.
 * Off until null_xrc_enable: the provider's other operations, and what the benchmarks
 * measure, stay as they are.
 */
#ifndef BENCHES_NULL_PROVIDER_XRC_H
#define BENCHES_NULL_PROVIDER_XRC_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

/* What the XRC operations saw. */
struct null_xrc_seen {
	uint64_t open_xrcd_calls;
	uint64_t close_xrcd_calls;
	uint64_t xrcd_live;
	uint32_t xrcd_comp_mask; /* of the last open_xrcd */
	int32_t xrcd_fd;
	int32_t xrcd_oflags;
	uint32_t srq_comp_mask; /* of the last create_srq_ex */
	uint64_t create_srq_ex_calls;
	uint32_t srq_type;
	uint32_t srq_max_wr;
	uint32_t srq_max_sge;
	uint32_t _pad;
	struct ibv_pd *srq_pd;
	struct ibv_xrcd *srq_xrcd;
	struct ibv_cq *srq_cq;
	uint64_t get_srq_num_calls;
	uint64_t create_qp_ex_calls; /* XRC ones */
	uint32_t qp_comp_mask; /* of the last XRC create_qp_ex */
	uint32_t qp_type;
	struct ibv_xrcd *qp_xrcd;
	struct ibv_pd *qp_pd;
	struct ibv_cq *qp_send_cq;
	struct ibv_cq *qp_recv_cq;
	struct ibv_srq *qp_srq;
	uint32_t qp_max_send_wr;
	uint32_t qp_max_recv_wr;
	uint32_t qp_max_send_sge;
	uint32_t qp_max_recv_sge;
	uint64_t send_qp_ops_flags; /* send_ops_flags of the last XRC send create_qp_ex */
	uint64_t post_send_calls; /* the XRC send QP's ops.post_send */
	uint64_t send_wrs;
	uint64_t wr_xrc_srqns; /* qp_ex->wr_set_xrc_srqn calls */
	uint64_t wr_sends; /* qp_ex->wr_send calls */
	uint64_t wr_completes;
	uint32_t last_remote_srqn; /* of the last request, either API */
	uint32_t last_opcode; /* of the last classic request */
	uint64_t srqn_sum; /* of every request posted, either API */
	uint64_t wr_aborts; /* qp_ex->wr_abort calls */
};

/* The SRQ number ibv_get_srq_num reports. */
#define NULL_XRC_SRQN 0x2a5
/* The QP number of the XRC receive QP. */
#define NULL_XRC_RECV_QPN 0x31
/* The errno create_qp_ex fails an XRC send QP with, once it has recorded its arguments
 * (ibv_qp_to_qp_ex, which would follow, is libibverbs'). */
#define NULL_XRC_SEND_REFUSED ENOMSG

struct null_xrc;

/* Installs the XRC operations on the null provider of context; 0, or ENOMEM. */
int null_xrc_enable(struct ibv_context *context);
/* What they saw (NULL before null_xrc_enable). */
const struct null_xrc_seen *null_xrc_seen(struct ibv_context *context);
/* The XRC send QP, classic and extended (NULL before null_xrc_enable). */
struct ibv_qp *null_xrc_send_qp(struct ibv_context *context);
struct ibv_qp_ex *null_xrc_send_qp_ex(struct ibv_context *context);

/* sizeof(struct null_xrc_seen), for the Rust mirror's size test. */
size_t null_xrc_seen_size(void);

/* null_provider.c: where a provider keeps its XRC state, and freeing it. */
struct null_xrc **null_provider_xrc(struct ibv_context *context);
void null_xrc_free(struct null_xrc *x);

#endif

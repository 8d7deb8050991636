/*
 * XRC on the null provider; see null_provider_xrc.h. Each operation records what it was
 * given, so that tests can check sideway's arguments, and hands out one object of its own.
 */
#include "null_provider_xrc.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>

struct null_xrc {
	struct null_xrc_seen seen;
	struct ibv_xrcd xrcd;
	struct ibv_srq srq;
	struct ibv_qp recv_qp;
	/* The send QP has a context of its own whose ops.post_send is xrc_post_send: the
	 * provider's post_send belongs to its one QP. Only the data path reads it. */
	struct ibv_context send_ctx;
	struct ibv_qp_ex send_qp;
	struct ibv_qp *(*prev_create_qp_ex)(struct ibv_context *, struct ibv_qp_init_attr_ex *);
};

#define OF(ptr, member) ((struct null_xrc *)((char *)(ptr) - offsetof(struct null_xrc, member)))

static struct null_xrc *of_ctx(struct ibv_context *context)
{
	return *null_provider_xrc(context);
}

static struct ibv_xrcd *xrc_open_xrcd(struct ibv_context *context,
				      struct ibv_xrcd_init_attr *attr)
{
	struct null_xrc *x = of_ctx(context);
	x->seen.open_xrcd_calls++;
	x->seen.xrcd_comp_mask = attr->comp_mask;
	x->seen.xrcd_fd = attr->fd;
	x->seen.xrcd_oflags = attr->oflags;
	if (x->seen.xrcd_live) {
		errno = EBUSY; /* one domain at a time */
		return NULL;
	}
	x->seen.xrcd_live = 1;
	x->xrcd.context = context;
	return &x->xrcd;
}

static int xrc_close_xrcd(struct ibv_xrcd *xrcd)
{
	struct null_xrc *x = OF(xrcd, xrcd);
	x->seen.close_xrcd_calls++;
	if (!x->seen.xrcd_live)
		return EINVAL;
	x->seen.xrcd_live = 0;
	return 0;
}

static struct ibv_srq *xrc_create_srq_ex(struct ibv_context *context,
					 struct ibv_srq_init_attr_ex *attr)
{
	struct null_xrc *x = of_ctx(context);
	x->seen.create_srq_ex_calls++;
	x->seen.srq_comp_mask = attr->comp_mask;
	x->seen.srq_type = attr->srq_type;
	x->seen.srq_pd = attr->pd;
	x->seen.srq_xrcd = attr->xrcd;
	x->seen.srq_cq = attr->cq;
	x->seen.srq_max_wr = attr->attr.max_wr;
	x->seen.srq_max_sge = attr->attr.max_sge;
	if (attr->srq_type != IBV_SRQT_XRC || attr->xrcd != &x->xrcd || !x->seen.xrcd_live) {
		errno = EINVAL;
		return NULL;
	}
	x->srq.context = context;
	x->srq.pd = attr->pd;
	x->srq.handle = 7;
	return &x->srq;
}

static int xrc_get_srq_num(struct ibv_srq *srq, uint32_t *srq_num)
{
	struct null_xrc *x = OF(srq, srq);
	x->seen.get_srq_num_calls++;
	*srq_num = NULL_XRC_SRQN;
	return 0;
}

static struct ibv_qp *xrc_create_qp_ex(struct ibv_context *context,
				       struct ibv_qp_init_attr_ex *attr)
{
	struct null_xrc *x = of_ctx(context);
	if (attr->qp_type != IBV_QPT_XRC_RECV && attr->qp_type != IBV_QPT_XRC_SEND)
		return x->prev_create_qp_ex(context, attr);
	x->seen.create_qp_ex_calls++;
	x->seen.qp_comp_mask = attr->comp_mask;
	x->seen.qp_type = attr->qp_type;
	x->seen.qp_xrcd = (attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) ? attr->xrcd : NULL;
	x->seen.qp_pd = (attr->comp_mask & IBV_QP_INIT_ATTR_PD) ? attr->pd : NULL;
	x->seen.qp_send_cq = attr->send_cq;
	x->seen.qp_recv_cq = attr->recv_cq;
	x->seen.qp_srq = attr->srq;
	x->seen.qp_max_send_wr = attr->cap.max_send_wr;
	x->seen.qp_max_recv_wr = attr->cap.max_recv_wr;
	x->seen.qp_max_send_sge = attr->cap.max_send_sge;
	x->seen.qp_max_recv_sge = attr->cap.max_recv_sge;
	if (attr->qp_type == IBV_QPT_XRC_SEND) {
		x->seen.send_qp_ops_flags = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) ?
			attr->send_ops_flags : 0;
		errno = NULL_XRC_SEND_REFUSED;
		return NULL;
	}
	/* A receive QP: on its domain, with nothing else. */
	if (x->seen.qp_xrcd != &x->xrcd || x->seen.qp_pd || attr->send_cq || attr->recv_cq ||
	    attr->srq) {
		errno = EINVAL;
		return NULL;
	}
	x->recv_qp.context = context;
	x->recv_qp.qp_num = NULL_XRC_RECV_QPN;
	x->recv_qp.qp_type = IBV_QPT_XRC_RECV;
	x->recv_qp.state = IBV_QPS_RESET;
	return &x->recv_qp;
}

static int xrc_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct null_xrc *x = OF(qp, send_qp.qp_base);
	x->seen.post_send_calls++;
	for (; wr; wr = wr->next) {
		x->seen.send_wrs++;
		x->seen.last_remote_srqn = wr->qp_type.xrc.remote_srqn;
		x->seen.last_opcode = wr->opcode;
		x->seen.srqn_sum += wr->qp_type.xrc.remote_srqn;
	}
	(void)bad_wr;
	return 0;
}

static int xrc_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	(void)qp;
	*bad_wr = wr;
	return EINVAL; /* an XRC send QP has no receive queue */
}

static void xrc_wr_start(struct ibv_qp_ex *qp) { (void)qp; }

static int xrc_wr_complete(struct ibv_qp_ex *qp)
{
	OF(qp, send_qp)->seen.wr_completes++;
	return 0;
}

static void xrc_wr_abort(struct ibv_qp_ex *qp)
{
	OF(qp, send_qp)->seen.wr_aborts++;
}

static void xrc_wr_send(struct ibv_qp_ex *qp)
{
	OF(qp, send_qp)->seen.wr_sends++;
}

static void xrc_wr_set_sge(struct ibv_qp_ex *qp, uint32_t lkey, uint64_t addr, uint32_t length)
{
	(void)qp;
	(void)lkey;
	(void)addr;
	(void)length;
}

static void xrc_wr_set_xrc_srqn(struct ibv_qp_ex *qp, uint32_t remote_srqn)
{
	struct null_xrc *x = OF(qp, send_qp);
	x->seen.wr_xrc_srqns++;
	x->seen.last_remote_srqn = remote_srqn;
	x->seen.srqn_sum += remote_srqn;
}

int null_xrc_enable(struct ibv_context *context)
{
	struct null_xrc **slot = null_provider_xrc(context);
	if (*slot)
		return 0;
	struct null_xrc *x = calloc(1, sizeof(*x));
	if (!x)
		return ENOMEM;
	struct verbs_context *vctx = verbs_get_ctx(context);
	x->prev_create_qp_ex = vctx->create_qp_ex;
	x->send_ctx.ops.post_send = xrc_post_send;
	x->send_ctx.ops.post_recv = xrc_post_recv;
	struct ibv_qp_ex *qp = &x->send_qp;
	qp->qp_base.context = &x->send_ctx;
	qp->qp_base.qp_num = 0x32;
	qp->qp_base.qp_type = IBV_QPT_XRC_SEND;
	qp->qp_base.state = IBV_QPS_RTS;
	qp->wr_start = xrc_wr_start;
	qp->wr_complete = xrc_wr_complete;
	qp->wr_abort = xrc_wr_abort;
	qp->wr_send = xrc_wr_send;
	qp->wr_set_sge = xrc_wr_set_sge;
	qp->wr_set_xrc_srqn = xrc_wr_set_xrc_srqn;
	*slot = x;
	vctx->open_xrcd = xrc_open_xrcd;
	vctx->close_xrcd = xrc_close_xrcd;
	vctx->create_srq_ex = xrc_create_srq_ex;
	vctx->get_srq_num = xrc_get_srq_num;
	vctx->create_qp_ex = xrc_create_qp_ex;
	return 0;
}

const struct null_xrc_seen *null_xrc_seen(struct ibv_context *context)
{
	struct null_xrc *x = *null_provider_xrc(context);
	return x ? &x->seen : NULL;
}

struct ibv_qp *null_xrc_send_qp(struct ibv_context *context)
{
	struct null_xrc *x = *null_provider_xrc(context);
	return x ? &x->send_qp.qp_base : NULL;
}

struct ibv_qp_ex *null_xrc_send_qp_ex(struct ibv_context *context)
{
	struct null_xrc *x = *null_provider_xrc(context);
	return x ? &x->send_qp : NULL;
}

void null_xrc_free(struct null_xrc *x)
{
	free(x);
}

size_t null_xrc_seen_size(void)
{
	return sizeof(struct null_xrc_seen);
}

/*
 * The null provider's objects and operations; see null_provider.h.
 *
 * The operations do what a provider must at least do with its arguments (walk the chain it
 * is given, read each request's fields) and count, so both sides of a comparison pay the
 * same provider cost and tests can check that both posted the same requests. They live in
 * their own translation unit so the C compiler cannot see through the function pointers
 * into the benchmarks' loops (neither can rustc): every call stays an indirect call, as
 * with a real provider.
 */
#include "null_provider.h"
#include "null_provider_xrc.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>

#define NULL_QP_NUM 0x11
#define CANNED_BYTE_LEN 64

struct null_provider {
	struct verbs_context vctx; /* its last field is the struct ibv_context */
	struct ibv_pd pd;
	struct ibv_cq_ex cq; /* its first fields are a struct ibv_cq */
	struct ibv_qp_ex qp; /* its first field is a struct ibv_qp */
	struct null_counters c;
	uint64_t pending; /* completions ready on the CQ */
	uint64_t next_wr_id; /* wr_id of the next canned completion */
	uint64_t batch_signaled; /* signaled requests in the open wr_start batch */
	struct ibv_wc *last_poll_array; /* the array the last ops.poll_cq wrote into */
	/* Thread and parent domains, and QPs/CQs made on them. */
	struct null_domains d;
	struct ibv_td td;
	struct ibv_pd parent;
	struct ibv_parent_domain_init_attr parent_attr; /* as alloc_parent_domain got it */
	void *buffers[NULL_MAX_BUFFERS]; /* from the parent domain's alloc, not yet freed */
	uint64_t buffer_types[NULL_MAX_BUFFERS];
	struct null_xrc *xrc; /* null_provider_xrc.c's, once enabled */
};

#define FROM(ptr, member) \
	((struct null_provider *)((char *)(ptr) - offsetof(struct null_provider, member)))

static struct null_provider *of_qp(struct ibv_qp *qp) { return FROM(qp, qp); }
static struct null_provider *of_qp_ex(struct ibv_qp_ex *qp) { return FROM(qp, qp); }
static struct null_provider *of_cq(struct ibv_cq *cq) { return FROM(cq, cq); }
static struct null_provider *of_cq_ex(struct ibv_cq_ex *cq) { return FROM(cq, cq); }
static struct null_provider *of_ctx(struct ibv_context *ctx) { return FROM(ctx, vctx.context); }

/* Classic posting: ops.post_send, ops.post_recv. */

static int null_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct null_provider *np = of_qp(qp);
	np->c.post_send_calls++;
	for (; wr; wr = wr->next) {
		np->c.send_wrs++;
		np->c.wr_id_sum += wr->wr_id;
		for (int i = 0; i < wr->num_sge; i++)
			np->c.length_sum += wr->sg_list[i].length;
		if (wr->send_flags & IBV_SEND_SIGNALED) {
			np->c.signaled++;
			np->pending++;
		}
	}
	(void)bad_wr;
	return 0;
}

static int null_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct null_provider *np = of_qp(qp);
	np->c.post_recv_calls++;
	for (; wr; wr = wr->next) {
		np->c.recv_wrs++;
		np->c.wr_id_sum += wr->wr_id;
		for (int i = 0; i < wr->num_sge; i++)
			np->c.length_sum += wr->sg_list[i].length;
	}
	(void)bad_wr;
	return 0;
}

/* Classic polling: ops.poll_cq. */

static int null_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	struct null_provider *np = of_cq(cq);
	np->c.poll_calls++;
	np->last_poll_array = wc;
	int n = 0;
	for (; n < num_entries && np->pending; n++) {
		np->pending--;
		wc[n] = (struct ibv_wc){
			.wr_id = np->next_wr_id++,
			.status = IBV_WC_SUCCESS,
			.opcode = IBV_WC_RDMA_WRITE,
			.byte_len = CANNED_BYTE_LEN,
			.qp_num = NULL_QP_NUM,
		};
	}
	np->c.completions += n;
	return n;
}

static int null_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	(void)cq;
	(void)solicited_only;
	return 0;
}

/* Extended posting: qp_ex->wr_*. */

static void null_wr_start(struct ibv_qp_ex *qp)
{
	struct null_provider *np = of_qp_ex(qp);
	np->c.wr_starts++;
	np->batch_signaled = 0;
}

static void null_wr_op(struct null_provider *np, struct ibv_qp_ex *qp)
{
	np->c.wr_ops++;
	np->c.wr_id_sum += qp->wr_id;
	if (qp->wr_flags & IBV_SEND_SIGNALED)
		np->batch_signaled++;
}

static void null_wr_rdma_write(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr)
{
	(void)rkey;
	(void)remote_addr;
	null_wr_op(of_qp_ex(qp), qp);
}

static void null_wr_rdma_write_imm(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
				   __be32 imm)
{
	(void)rkey;
	(void)remote_addr;
	(void)imm;
	null_wr_op(of_qp_ex(qp), qp);
}

static void null_wr_rdma_read(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr)
{
	(void)rkey;
	(void)remote_addr;
	null_wr_op(of_qp_ex(qp), qp);
}

static void null_wr_send(struct ibv_qp_ex *qp)
{
	null_wr_op(of_qp_ex(qp), qp);
}

static void null_wr_send_imm(struct ibv_qp_ex *qp, __be32 imm)
{
	(void)imm;
	null_wr_op(of_qp_ex(qp), qp);
}

static void null_wr_atomic_cmp_swp(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
				   uint64_t compare, uint64_t swap)
{
	(void)rkey;
	(void)remote_addr;
	(void)compare;
	(void)swap;
	null_wr_op(of_qp_ex(qp), qp);
}

static void null_wr_atomic_fetch_add(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
				     uint64_t add)
{
	(void)rkey;
	(void)remote_addr;
	(void)add;
	null_wr_op(of_qp_ex(qp), qp);
}

static void null_wr_set_sge(struct ibv_qp_ex *qp, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct null_provider *np = of_qp_ex(qp);
	(void)lkey;
	(void)addr;
	np->c.wr_sges++;
	np->c.length_sum += length;
}

static void null_wr_set_sge_list(struct ibv_qp_ex *qp, size_t num_sge,
				 const struct ibv_sge *sg_list)
{
	struct null_provider *np = of_qp_ex(qp);
	np->c.wr_sges++;
	for (size_t i = 0; i < num_sge; i++)
		np->c.length_sum += sg_list[i].length;
}

static void null_wr_set_inline_data(struct ibv_qp_ex *qp, void *addr, size_t length)
{
	struct null_provider *np = of_qp_ex(qp);
	(void)addr;
	np->c.wr_sges++;
	np->c.length_sum += length;
}

static int null_wr_complete(struct ibv_qp_ex *qp)
{
	struct null_provider *np = of_qp_ex(qp);
	np->c.wr_completes++;
	np->c.signaled += np->batch_signaled;
	np->pending += np->batch_signaled;
	np->batch_signaled = 0;
	return 0;
}

static void null_wr_abort(struct ibv_qp_ex *qp)
{
	struct null_provider *np = of_qp_ex(qp);
	np->c.wr_aborts++;
	np->batch_signaled = 0;
}

/* Extended polling: cq_ex->start_poll, next_poll, end_poll, read_*. */

static int null_next_poll(struct ibv_cq_ex *cq)
{
	struct null_provider *np = of_cq_ex(cq);
	np->c.poll_calls++;
	if (!np->pending)
		return ENOENT;
	np->pending--;
	np->c.completions++;
	cq->wr_id = np->next_wr_id++;
	cq->status = IBV_WC_SUCCESS;
	return 0;
}

static int null_start_poll(struct ibv_cq_ex *cq, struct ibv_poll_cq_attr *attr)
{
	(void)attr;
	return null_next_poll(cq);
}

static void null_end_poll(struct ibv_cq_ex *cq)
{
	of_cq_ex(cq)->c.end_polls++;
}

static enum ibv_wc_opcode null_read_opcode(struct ibv_cq_ex *cq)
{
	(void)cq;
	return IBV_WC_RDMA_WRITE;
}

static uint32_t null_read_zero_u32(struct ibv_cq_ex *cq)
{
	(void)cq;
	return 0;
}

static uint32_t null_read_byte_len(struct ibv_cq_ex *cq)
{
	(void)cq;
	return CANNED_BYTE_LEN;
}

static uint32_t null_read_qp_num(struct ibv_cq_ex *cq)
{
	(void)cq;
	return NULL_QP_NUM;
}

static unsigned int null_read_wc_flags(struct ibv_cq_ex *cq)
{
	(void)cq;
	return 0;
}

static uint8_t null_read_zero_u8(struct ibv_cq_ex *cq)
{
	(void)cq;
	return 0;
}

static uint64_t null_read_completion_ts(struct ibv_cq_ex *cq)
{
	return NULL_TS_BASE + cq->wr_id;
}

/* Thread and parent domains: verbs_context ops, reached through verbs.h's inlines. */

static struct ibv_td *null_alloc_td(struct ibv_context *context, struct ibv_td_init_attr *attr)
{
	struct null_provider *np = of_ctx(context);
	np->d.alloc_td_calls++;
	if (attr->comp_mask || np->d.td_live) {
		errno = attr->comp_mask ? EINVAL : EBUSY; /* one thread domain at a time */
		return NULL;
	}
	np->d.td_live = 1;
	np->td.context = context;
	return &np->td;
}

static int null_dealloc_td(struct ibv_td *td)
{
	struct null_provider *np = FROM(td, td);
	np->d.dealloc_td_calls++;
	if (!np->d.td_live)
		return EINVAL;
	/* A thread domain goes after every parent domain and every buffer bound to it. */
	if (np->d.live_buffers)
		np->d.order_errors++;
	np->d.td_live = 0;
	return 0;
}

static struct ibv_pd *null_alloc_parent_domain(struct ibv_context *context,
					       struct ibv_parent_domain_init_attr *attr)
{
	struct null_provider *np = of_ctx(context);
	np->d.alloc_parent_domain_calls++;
	if (attr->td && !np->d.td_live) {
		errno = EINVAL;
		return NULL;
	}
	np->parent_attr = *attr;
	np->parent.context = context;
	np->parent.handle = attr->pd->handle; /* a parent domain speaks for its PD */
	return &np->parent;
}

/* Allocates one buffer of an object made on the parent domain the way mlx5 does: through
 * the domain's alloc callback when it has one, which may also say "use the default". */
static int null_domain_alloc(struct null_provider *np, struct ibv_pd *pd, uint64_t resource_type)
{
	if (pd != &np->parent || !(np->parent_attr.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS))
		return 0;
	np->d.alloc_calls++;
	void *buf = np->parent_attr.alloc(pd, np->parent_attr.pd_context, NULL_BUFFER_SIZE,
					  NULL_BUFFER_ALIGN, resource_type);
	if (!buf)
		return ENOMEM;
	if (buf == IBV_ALLOCATOR_USE_DEFAULT) {
		np->d.default_allocs++;
		return 0;
	}
	if (np->d.live_buffers == NULL_MAX_BUFFERS)
		return ENOMEM;
	np->buffers[np->d.live_buffers] = buf;
	np->buffer_types[np->d.live_buffers] = resource_type;
	np->d.live_buffers++;
	return 0;
}

/* Gives the newest live buffer back through the parent domain's free callback. */
static void null_domain_free_last(struct null_provider *np)
{
	np->d.live_buffers--;
	np->d.free_calls++;
	np->parent_attr.free(&np->parent, np->parent_attr.pd_context,
			     np->buffers[np->d.live_buffers], np->buffer_types[np->d.live_buffers]);
}

static struct ibv_cq_ex *null_create_cq_ex(struct ibv_context *context,
					   struct ibv_cq_init_attr_ex *attr)
{
	struct null_provider *np = of_ctx(context);
	np->d.create_cq_ex_calls++;
	np->d.last_cq_comp_mask = attr->comp_mask;
	np->d.last_cq_parent_domain = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) ?
		attr->parent_domain : NULL;
	int err = null_domain_alloc(np, np->d.last_cq_parent_domain, NULL_RES_CQ);
	if (err) {
		errno = err;
		return NULL;
	}
	return &np->cq;
}

static struct ibv_qp *null_create_qp_ex(struct ibv_context *context,
					struct ibv_qp_init_attr_ex *attr)
{
	struct null_provider *np = of_ctx(context);
	np->d.create_qp_ex_calls++;
	np->d.last_qp_comp_mask = attr->comp_mask;
	np->d.last_qp_pd = attr->pd;
	np->d.last_qp_send_cq = attr->send_cq;
	uint64_t before = np->d.live_buffers;
	int err = null_domain_alloc(np, attr->pd, NULL_RES_QP);
	if (err) {
		errno = err;
		return NULL;
	}
	/* The QP cannot be handed out: turning it into an ibv_qp_ex and destroying it are
	 * libibverbs functions, which a test double's objects never reach. It fails after
	 * taking its buffer, and gives it back as a provider does. */
	if (np->d.live_buffers > before)
		null_domain_free_last(np);
	errno = NULL_QP_REFUSED;
	return NULL;
}

void null_domain_release(struct null_provider *np)
{
	while (np->d.live_buffers)
		null_domain_free_last(np);
}

void null_provider_disable_domains(struct null_provider *np)
{
	np->vctx.alloc_td = NULL;
	np->vctx.dealloc_td = NULL;
	np->vctx.alloc_parent_domain = NULL;
}

const struct null_domains *null_provider_domains(const struct null_provider *np)
{
	return &np->d;
}

struct null_provider *null_provider_new(void)
{
	struct null_provider *np = calloc(1, sizeof(*np));
	if (!np)
		return NULL;

	/* device stays NULL: nothing may ask libibverbs about this context. */
	np->vctx.context.ops.post_send = null_post_send;
	np->vctx.context.ops.post_recv = null_post_recv;
	np->vctx.context.ops.poll_cq = null_poll_cq;
	np->vctx.context.ops.req_notify_cq = null_req_notify_cq;
	np->vctx.context.num_comp_vectors = 1;
	/* An extended context: verbs.h's inlines of the extended verbs reach these. */
	np->vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	np->vctx.sz = sizeof(np->vctx);
	np->vctx.alloc_td = null_alloc_td;
	np->vctx.dealloc_td = null_dealloc_td;
	np->vctx.alloc_parent_domain = null_alloc_parent_domain;
	np->vctx.create_cq_ex = null_create_cq_ex;
	np->vctx.create_qp_ex = null_create_qp_ex;

	np->pd.context = &np->vctx.context;
	np->pd.handle = 1;

	struct ibv_cq_ex *cq = &np->cq;
	cq->context = &np->vctx.context;
	cq->cqe = 4096;
	cq->start_poll = null_start_poll;
	cq->next_poll = null_next_poll;
	cq->end_poll = null_end_poll;
	cq->read_opcode = null_read_opcode;
	cq->read_vendor_err = null_read_zero_u32;
	cq->read_byte_len = null_read_byte_len;
	cq->read_imm_data = null_read_zero_u32;
	cq->read_qp_num = null_read_qp_num;
	cq->read_src_qp = null_read_zero_u32;
	cq->read_wc_flags = null_read_wc_flags;
	cq->read_slid = null_read_zero_u32;
	cq->read_sl = null_read_zero_u8;
	cq->read_dlid_path_bits = null_read_zero_u8;
	cq->read_completion_ts = null_read_completion_ts;

	struct ibv_qp_ex *qp = &np->qp;
	qp->qp_base.context = &np->vctx.context;
	qp->qp_base.pd = &np->pd;
	qp->qp_base.send_cq = ibv_cq_ex_to_cq(cq);
	qp->qp_base.recv_cq = ibv_cq_ex_to_cq(cq);
	qp->qp_base.qp_num = NULL_QP_NUM;
	qp->qp_base.state = IBV_QPS_RTS;
	qp->qp_base.qp_type = IBV_QPT_RC;
	qp->wr_start = null_wr_start;
	qp->wr_complete = null_wr_complete;
	qp->wr_abort = null_wr_abort;
	qp->wr_rdma_write = null_wr_rdma_write;
	qp->wr_rdma_write_imm = null_wr_rdma_write_imm;
	qp->wr_rdma_read = null_wr_rdma_read;
	qp->wr_send = null_wr_send;
	qp->wr_send_imm = null_wr_send_imm;
	qp->wr_atomic_cmp_swp = null_wr_atomic_cmp_swp;
	qp->wr_atomic_fetch_add = null_wr_atomic_fetch_add;
	qp->wr_set_sge = null_wr_set_sge;
	qp->wr_set_sge_list = null_wr_set_sge_list;
	qp->wr_set_inline_data = null_wr_set_inline_data;
	return np;
}

void null_provider_free(struct null_provider *np)
{
	null_xrc_free(np->xrc);
	free(np);
}

struct ibv_context *null_provider_context(struct null_provider *np) { return &np->vctx.context; }
struct ibv_pd *null_provider_pd(struct null_provider *np) { return &np->pd; }
struct ibv_qp *null_provider_qp(struct null_provider *np) { return &np->qp.qp_base; }
struct ibv_qp_ex *null_provider_qp_ex(struct null_provider *np) { return &np->qp; }
struct ibv_cq *null_provider_cq(struct null_provider *np) { return ibv_cq_ex_to_cq(&np->cq); }
struct ibv_cq_ex *null_provider_cq_ex(struct null_provider *np) { return &np->cq; }

const struct null_counters *null_provider_counters(const struct null_provider *np)
{
	return &np->c;
}

const struct ibv_wc *null_cq_last_poll_array(const struct null_provider *np)
{
	return np->last_poll_array;
}

void null_cq_add(struct ibv_cq *cq, uint32_t n)
{
	of_cq(cq)->pending += n;
}

struct null_xrc **null_provider_xrc(struct ibv_context *context)
{
	return &of_ctx(context)->xrc;
}

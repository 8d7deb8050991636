/*
 * The second C baseline: the same operations as data_path.c, written by a C programmer who
 * reads the provider's function pointers once, before the loop, and calls them directly, as
 * sideway does (it copies them into its QP and CQ objects when it creates them). verbs.h's
 * inlines instead load `qp->context->ops.post_send`, `qp->wr_rdma_write`,
 * `cq->read_opcode`, ... on every call, and since the provider may change what they point
 * at, the compiler must reload them after every provider call.
 *
 * Each function does exactly the work of its twin in data_path.c (same requests, same
 * completion fields read, same checks); benches/tests/null_provider.rs checks that both hand
 * the provider the same calls.
 */
#include "data_path.h"
#include "null_provider.h"

#include <errno.h>

#define MAX_BATCH 64
#define MAX_POLL 32
#define BENCH_ALIGNED __attribute__((aligned(64)))

typedef int (*post_send_fn)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
typedef int (*post_recv_fn)(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **);
typedef int (*poll_cq_fn)(struct ibv_cq *, int, struct ibv_wc *);

/* An extended QP's functions that a WRITE with one SGE needs. */
struct wr_fns {
	void (*start)(struct ibv_qp_ex *);
	void (*rdma_write)(struct ibv_qp_ex *, uint32_t, uint64_t);
	void (*set_sge)(struct ibv_qp_ex *, uint32_t, uint64_t, uint32_t);
	int (*complete)(struct ibv_qp_ex *);
};

static inline struct wr_fns wr_fns_of(const struct ibv_qp_ex *qp)
{
	return (struct wr_fns){
		.start = qp->wr_start,
		.rdma_write = qp->wr_rdma_write,
		.set_sge = qp->wr_set_sge,
		.complete = qp->wr_complete,
	};
}

/* An extended CQ's functions that polling with the standard WC flags needs. */
struct poll_fns {
	int (*start)(struct ibv_cq_ex *, struct ibv_poll_cq_attr *);
	int (*next)(struct ibv_cq_ex *);
	void (*end)(struct ibv_cq_ex *);
	enum ibv_wc_opcode (*opcode)(struct ibv_cq_ex *);
	uint32_t (*vendor_err)(struct ibv_cq_ex *);
	unsigned int (*wc_flags)(struct ibv_cq_ex *);
	uint32_t (*byte_len)(struct ibv_cq_ex *);
	__be32 (*imm_data)(struct ibv_cq_ex *);
	uint32_t (*qp_num)(struct ibv_cq_ex *);
	uint32_t (*src_qp)(struct ibv_cq_ex *);
	uint32_t (*slid)(struct ibv_cq_ex *);
	uint8_t (*sl)(struct ibv_cq_ex *);
	uint8_t (*dlid_path_bits)(struct ibv_cq_ex *);
};

static inline struct poll_fns poll_fns_of(const struct ibv_cq_ex *cq)
{
	return (struct poll_fns){
		.start = cq->start_poll,
		.next = cq->next_poll,
		.end = cq->end_poll,
		.opcode = cq->read_opcode,
		.vendor_err = cq->read_vendor_err,
		.wc_flags = cq->read_wc_flags,
		.byte_len = cq->read_byte_len,
		.imm_data = cq->read_imm_data,
		.qp_num = cq->read_qp_num,
		.src_qp = cq->read_src_qp,
		.slid = cq->read_slid,
		.sl = cq->read_sl,
		.dlid_path_bits = cq->read_dlid_path_bits,
	};
}

int bench_cc_post_write(struct ibv_qp *qp, const struct bench_write *w, uint64_t iters)
{
	post_send_fn post_send = qp->context->ops.post_send;
	for (uint64_t i = 0; i < iters; i++) {
		struct ibv_sge sge = w->sge;
		struct ibv_send_wr wr = {
			.wr_id = i,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = IBV_WR_RDMA_WRITE,
			.send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = w->remote_addr, .rkey = w->rkey },
		};
		struct ibv_send_wr *bad;
		int ret = post_send(qp, &wr, &bad);
		if (ret)
			return ret;
	}
	return 0;
}

int bench_cc_post_write_ex(struct ibv_qp_ex *qp, const struct bench_write *w, uint64_t iters)
{
	const struct wr_fns f = wr_fns_of(qp);
	for (uint64_t i = 0; i < iters; i++) {
		f.start(qp);
		qp->wr_id = i;
		qp->wr_flags = IBV_SEND_SIGNALED;
		f.rdma_write(qp, w->rkey, w->remote_addr);
		f.set_sge(qp, w->sge.lkey, w->sge.addr, w->sge.length);
		int ret = f.complete(qp);
		if (ret)
			return ret;
	}
	return 0;
}

int bench_cc_post_write_batch(struct ibv_qp *qp, const struct bench_write *w, uint32_t batch,
			      uint64_t iters)
{
	post_send_fn post_send = qp->context->ops.post_send;
	struct ibv_send_wr wrs[MAX_BATCH];
	struct ibv_sge sges[MAX_BATCH];
	if (batch == 0 || batch > MAX_BATCH)
		return EINVAL;
	for (uint64_t i = 0; i < iters; i++) {
		for (uint32_t k = 0; k < batch; k++) {
			sges[k] = w->sge;
			wrs[k] = (struct ibv_send_wr){
				.wr_id = i * batch + k,
				.next = k + 1 < batch ? &wrs[k + 1] : NULL,
				.sg_list = &sges[k],
				.num_sge = 1,
				.opcode = IBV_WR_RDMA_WRITE,
				.send_flags = k + 1 == batch ? IBV_SEND_SIGNALED : 0,
				.wr.rdma = { .remote_addr = w->remote_addr, .rkey = w->rkey },
			};
		}
		struct ibv_send_wr *bad;
		int ret = post_send(qp, wrs, &bad);
		if (ret)
			return ret;
	}
	return 0;
}

int bench_cc_post_write_batch_ex(struct ibv_qp_ex *qp, const struct bench_write *w,
				 uint32_t batch, uint64_t iters)
{
	const struct wr_fns f = wr_fns_of(qp);
	if (batch == 0 || batch > MAX_BATCH)
		return EINVAL;
	for (uint64_t i = 0; i < iters; i++) {
		f.start(qp);
		for (uint32_t k = 0; k < batch; k++) {
			qp->wr_id = i * batch + k;
			qp->wr_flags = k + 1 == batch ? IBV_SEND_SIGNALED : 0;
			f.rdma_write(qp, w->rkey, w->remote_addr);
			f.set_sge(qp, w->sge.lkey, w->sge.addr, w->sge.length);
		}
		int ret = f.complete(qp);
		if (ret)
			return ret;
	}
	return 0;
}

int bench_cc_post_recv(struct ibv_qp *qp, const struct ibv_sge *sge, uint64_t iters)
{
	post_recv_fn post_recv = qp->context->ops.post_recv;
	for (uint64_t i = 0; i < iters; i++) {
		struct ibv_sge s = *sge;
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &s, .num_sge = 1 };
		struct ibv_recv_wr *bad;
		int ret = post_recv(qp, &wr, &bad);
		if (ret)
			return ret;
	}
	return 0;
}

/* read_wc_ex of data_path.c, through the copied pointers. */
static inline void read_wc_ex(struct ibv_cq_ex *cq, const struct poll_fns *f, struct ibv_wc *wc)
{
	wc->wr_id = cq->wr_id;
	wc->status = cq->status;
	wc->opcode = f->opcode(cq);
	wc->vendor_err = f->vendor_err(cq);
	wc->wc_flags = f->wc_flags(cq);
	wc->byte_len = f->byte_len(cq);
	/* verbs.h reads the invalidated rkey with read_imm_data too. */
	if (wc->wc_flags & IBV_WC_WITH_INV)
		wc->invalidated_rkey = (uint32_t)f->imm_data(cq);
	else if (wc->wc_flags & IBV_WC_WITH_IMM)
		wc->imm_data = f->imm_data(cq);
	wc->qp_num = f->qp_num(cq);
	wc->src_qp = f->src_qp(cq);
	wc->slid = (uint16_t)f->slid(cq);
	wc->sl = f->sl(cq);
	wc->dlid_path_bits = f->dlid_path_bits(cq);
}

int bench_cc_poll_iter(struct ibv_cq *cq, uint32_t n, uint64_t iters, uint64_t *sum)
{
	poll_cq_fn poll_cq = cq->context->ops.poll_cq;
	uint64_t s = 0;
	for (uint64_t i = 0; i < iters; i++) {
		null_cq_add(cq, n);
		struct ibv_wc wc;
		int got;
		while ((got = poll_cq(cq, 1, &wc)) == 1) {
			if (wc.status != IBV_WC_SUCCESS)
				return EIO;
			s += wc.wr_id;
		}
		if (got < 0)
			return -got;
	}
	*sum += s;
	return 0;
}

int bench_cc_poll_batch(struct ibv_cq *cq, uint32_t n, uint64_t iters, uint64_t *sum)
{
	poll_cq_fn poll_cq = cq->context->ops.poll_cq;
	struct ibv_wc wc[MAX_POLL] BENCH_ALIGNED;
	uint64_t s = 0;
	if (n > MAX_POLL)
		return EINVAL;
	for (uint64_t i = 0; i < iters; i++) {
		null_cq_add(cq, n);
		int got = poll_cq(cq, (int)n, wc);
		if (got < 0)
			return -got;
		for (int k = 0; k < got; k++) {
			if (wc[k].status != IBV_WC_SUCCESS)
				return EIO;
			s += wc[k].wr_id;
		}
	}
	*sum += s;
	return 0;
}

int bench_cc_poll_iter_ex(struct ibv_cq_ex *cq, uint32_t n, uint64_t iters, uint64_t *sum)
{
	const struct poll_fns f = poll_fns_of(cq);
	uint64_t s = 0;
	for (uint64_t i = 0; i < iters; i++) {
		null_cq_add(ibv_cq_ex_to_cq(cq), n);
		struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
		int ret = f.start(cq, &attr);
		if (ret == ENOENT)
			continue;
		if (ret)
			return ret;
		do {
			struct ibv_wc wc;
			read_wc_ex(cq, &f, &wc);
			if (wc.status != IBV_WC_SUCCESS) {
				f.end(cq);
				return EIO;
			}
			s += wc.wr_id;
		} while ((ret = f.next(cq)) == 0);
		f.end(cq);
		if (ret != ENOENT)
			return ret;
	}
	*sum += s;
	return 0;
}

int bench_cc_poll_batch_ex(struct ibv_cq_ex *cq, uint32_t n, uint64_t iters, uint64_t *sum)
{
	const struct poll_fns f = poll_fns_of(cq);
	struct ibv_wc wc[MAX_POLL] BENCH_ALIGNED;
	uint64_t s = 0;
	if (n == 0 || n > MAX_POLL)
		return EINVAL;
	for (uint64_t i = 0; i < iters; i++) {
		null_cq_add(ibv_cq_ex_to_cq(cq), n);
		struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
		int ret = f.start(cq, &attr);
		if (ret == ENOENT)
			continue;
		if (ret)
			return ret;
		uint32_t got = 0;
		for (;;) {
			read_wc_ex(cq, &f, &wc[got++]);
			if (got == n)
				break;
			ret = f.next(cq);
			if (ret == ENOENT)
				break;
			if (ret) {
				f.end(cq);
				return ret;
			}
		}
		f.end(cq);
		for (uint32_t k = 0; k < got; k++) {
			if (wc[k].status != IBV_WC_SUCCESS)
				return EIO;
			s += wc[k].wr_id;
		}
	}
	*sum += s;
	return 0;
}

int bench_cc_cycle(struct ibv_qp *qp, struct ibv_cq *cq, const struct bench_write *w,
		   uint64_t iters, uint64_t *sum)
{
	post_send_fn post_send = qp->context->ops.post_send;
	poll_cq_fn poll_cq = cq->context->ops.poll_cq;
	uint64_t s = 0;
	for (uint64_t i = 0; i < iters; i++) {
		struct ibv_sge sge = w->sge;
		struct ibv_send_wr wr = {
			.wr_id = i,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = IBV_WR_RDMA_WRITE,
			.send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = w->remote_addr, .rkey = w->rkey },
		};
		struct ibv_send_wr *bad;
		int ret = post_send(qp, &wr, &bad);
		if (ret)
			return ret;
		struct ibv_wc wc BENCH_ALIGNED;
		int got;
		while ((got = poll_cq(cq, 1, &wc)) == 0)
			;
		if (got < 0)
			return -got;
		if (wc.status != IBV_WC_SUCCESS)
			return EIO;
		s += wc.wr_id;
	}
	*sum += s;
	return 0;
}

int bench_cc_cycle_ex(struct ibv_qp_ex *qp, struct ibv_cq_ex *cq, const struct bench_write *w,
		      uint64_t iters, uint64_t *sum)
{
	const struct wr_fns wf = wr_fns_of(qp);
	const struct poll_fns pf = poll_fns_of(cq);
	uint64_t s = 0;
	for (uint64_t i = 0; i < iters; i++) {
		wf.start(qp);
		qp->wr_id = i;
		qp->wr_flags = IBV_SEND_SIGNALED;
		wf.rdma_write(qp, w->rkey, w->remote_addr);
		wf.set_sge(qp, w->sge.lkey, w->sge.addr, w->sge.length);
		int ret = wf.complete(qp);
		if (ret)
			return ret;
		struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
		while ((ret = pf.start(cq, &attr)) == ENOENT)
			;
		if (ret)
			return ret;
		struct ibv_wc wc BENCH_ALIGNED;
		read_wc_ex(cq, &pf, &wc);
		pf.end(cq);
		if (wc.status != IBV_WC_SUCCESS)
			return EIO;
		s += wc.wr_id;
	}
	*sum += s;
	return 0;
}

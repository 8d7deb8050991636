/* The C side of the benchmarks; see data_path.h. */
#include "data_path.h"
#include "null_provider.h"

#include <errno.h>

#define MAX_BATCH 64
#define MAX_POLL 32

/*
 * The completion arrays the provider writes into sit on a cache line of their own, as the
 * Rust side's do (`Aligned` in data_path.rs): where the compiler puts an array decides how
 * many of the provider's stores split a cache line, and that is not what is being compared.
 */
#define BENCH_ALIGNED __attribute__((aligned(64)))

int bench_c_post_write(struct ibv_qp *qp, const struct bench_write *w, uint64_t iters)
{
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
		int ret = ibv_post_send(qp, &wr, &bad);
		if (ret)
			return ret;
	}
	return 0;
}

int bench_c_post_write_ex(struct ibv_qp_ex *qp, const struct bench_write *w, uint64_t iters)
{
	for (uint64_t i = 0; i < iters; i++) {
		ibv_wr_start(qp);
		qp->wr_id = i;
		qp->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(qp, w->rkey, w->remote_addr);
		ibv_wr_set_sge(qp, w->sge.lkey, w->sge.addr, w->sge.length);
		int ret = ibv_wr_complete(qp);
		if (ret)
			return ret;
	}
	return 0;
}

int bench_c_post_write_batch(struct ibv_qp *qp, const struct bench_write *w, uint32_t batch,
			     uint64_t iters)
{
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
		int ret = ibv_post_send(qp, wrs, &bad);
		if (ret)
			return ret;
	}
	return 0;
}

int bench_c_post_write_batch_ex(struct ibv_qp_ex *qp, const struct bench_write *w,
				uint32_t batch, uint64_t iters)
{
	if (batch == 0 || batch > MAX_BATCH)
		return EINVAL;
	for (uint64_t i = 0; i < iters; i++) {
		ibv_wr_start(qp);
		for (uint32_t k = 0; k < batch; k++) {
			qp->wr_id = i * batch + k;
			qp->wr_flags = k + 1 == batch ? IBV_SEND_SIGNALED : 0;
			ibv_wr_rdma_write(qp, w->rkey, w->remote_addr);
			ibv_wr_set_sge(qp, w->sge.lkey, w->sge.addr, w->sge.length);
		}
		int ret = ibv_wr_complete(qp);
		if (ret)
			return ret;
	}
	return 0;
}

int bench_c_post_recv(struct ibv_qp *qp, const struct ibv_sge *sge, uint64_t iters)
{
	for (uint64_t i = 0; i < iters; i++) {
		struct ibv_sge s = *sge;
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &s, .num_sge = 1 };
		struct ibv_recv_wr *bad;
		int ret = ibv_post_recv(qp, &wr, &bad);
		if (ret)
			return ret;
	}
	return 0;
}

/*
 * What sideway reads from an extended CQ created with the standard WC flags (those of a
 * classic struct ibv_wc): the same reads, in a C program's usual form.
 */
static inline void read_wc_ex(struct ibv_cq_ex *cq, struct ibv_wc *wc)
{
	wc->wr_id = cq->wr_id;
	wc->status = cq->status;
	wc->opcode = ibv_wc_read_opcode(cq);
	wc->vendor_err = ibv_wc_read_vendor_err(cq);
	wc->wc_flags = ibv_wc_read_wc_flags(cq);
	wc->byte_len = ibv_wc_read_byte_len(cq);
	if (wc->wc_flags & IBV_WC_WITH_INV)
		wc->invalidated_rkey = ibv_wc_read_invalidated_rkey(cq);
	else if (wc->wc_flags & IBV_WC_WITH_IMM)
		wc->imm_data = ibv_wc_read_imm_data(cq);
	wc->qp_num = ibv_wc_read_qp_num(cq);
	wc->src_qp = ibv_wc_read_src_qp(cq);
	wc->slid = (uint16_t)ibv_wc_read_slid(cq);
	wc->sl = ibv_wc_read_sl(cq);
	wc->dlid_path_bits = ibv_wc_read_dlid_path_bits(cq);
}

int bench_c_poll_iter(struct ibv_cq *cq, uint32_t n, uint64_t iters, uint64_t *sum)
{
	uint64_t s = 0;
	for (uint64_t i = 0; i < iters; i++) {
		null_cq_add(cq, n);
		struct ibv_wc wc;
		int got;
		while ((got = ibv_poll_cq(cq, 1, &wc)) == 1) {
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

int bench_c_poll_batch(struct ibv_cq *cq, uint32_t n, uint64_t iters, uint64_t *sum)
{
	struct ibv_wc wc[MAX_POLL] BENCH_ALIGNED;
	uint64_t s = 0;
	if (n > MAX_POLL)
		return EINVAL;
	for (uint64_t i = 0; i < iters; i++) {
		null_cq_add(cq, n);
		int got = ibv_poll_cq(cq, (int)n, wc);
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

int bench_c_poll_iter_ex(struct ibv_cq_ex *cq, uint32_t n, uint64_t iters, uint64_t *sum)
{
	uint64_t s = 0;
	for (uint64_t i = 0; i < iters; i++) {
		null_cq_add(ibv_cq_ex_to_cq(cq), n);
		struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
		int ret = ibv_start_poll(cq, &attr);
		if (ret == ENOENT)
			continue;
		if (ret)
			return ret;
		do {
			struct ibv_wc wc;
			read_wc_ex(cq, &wc);
			if (wc.status != IBV_WC_SUCCESS) {
				ibv_end_poll(cq);
				return EIO;
			}
			s += wc.wr_id;
		} while ((ret = ibv_next_poll(cq)) == 0);
		ibv_end_poll(cq);
		if (ret != ENOENT)
			return ret;
	}
	*sum += s;
	return 0;
}

int bench_c_poll_batch_ex(struct ibv_cq_ex *cq, uint32_t n, uint64_t iters, uint64_t *sum)
{
	struct ibv_wc wc[MAX_POLL] BENCH_ALIGNED;
	uint64_t s = 0;
	if (n == 0 || n > MAX_POLL)
		return EINVAL;
	for (uint64_t i = 0; i < iters; i++) {
		null_cq_add(ibv_cq_ex_to_cq(cq), n);
		struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
		int ret = ibv_start_poll(cq, &attr);
		if (ret == ENOENT)
			continue;
		if (ret)
			return ret;
		uint32_t got = 0;
		for (;;) {
			read_wc_ex(cq, &wc[got++]);
			if (got == n)
				break;
			ret = ibv_next_poll(cq);
			if (ret == ENOENT)
				break;
			if (ret) {
				ibv_end_poll(cq);
				return ret;
			}
		}
		ibv_end_poll(cq);
		for (uint32_t k = 0; k < got; k++) {
			if (wc[k].status != IBV_WC_SUCCESS)
				return EIO;
			s += wc[k].wr_id;
		}
	}
	*sum += s;
	return 0;
}

int bench_c_cycle(struct ibv_qp *qp, struct ibv_cq *cq, const struct bench_write *w,
		  uint64_t iters, uint64_t *sum)
{
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
		int ret = ibv_post_send(qp, &wr, &bad);
		if (ret)
			return ret;
		struct ibv_wc wc BENCH_ALIGNED;
		int got;
		while ((got = ibv_poll_cq(cq, 1, &wc)) == 0)
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

int bench_c_cycle_ex(struct ibv_qp_ex *qp, struct ibv_cq_ex *cq, const struct bench_write *w,
		     uint64_t iters, uint64_t *sum)
{
	uint64_t s = 0;
	for (uint64_t i = 0; i < iters; i++) {
		ibv_wr_start(qp);
		qp->wr_id = i;
		qp->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(qp, w->rkey, w->remote_addr);
		ibv_wr_set_sge(qp, w->sge.lkey, w->sge.addr, w->sge.length);
		int ret = ibv_wr_complete(qp);
		if (ret)
			return ret;
		struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
		while ((ret = ibv_start_poll(cq, &attr)) == ENOENT)
			;
		if (ret)
			return ret;
		struct ibv_wc wc BENCH_ALIGNED;
		read_wc_ex(cq, &wc);
		ibv_end_poll(cq);
		if (wc.status != IBV_WC_SUCCESS)
			return EIO;
		s += wc.wr_id;
	}
	*sum += s;
	return 0;
}

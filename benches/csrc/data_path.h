/*
 * The C side of each benchmark: the same operation as the Rust side, written the way a C
 * program writes it with verbs.h's static inlines (ibv_post_send, ibv_wr_*, ibv_poll_cq,
 * ibv_start_poll, ...). Each function runs `iters` operations and returns 0, or the error
 * number of the first failure. Results that a program would use are summed into *sum so the
 * compiler cannot drop the reads.
 */
#ifndef BENCHES_DATA_PATH_H
#define BENCHES_DATA_PATH_H

#include <stdint.h>
#include <infiniband/verbs.h>

/* The operands of every RDMA WRITE the benchmarks post. */
struct bench_write {
	uint32_t rkey;
	uint64_t remote_addr;
	struct ibv_sge sge;
};

/* Post one signaled WRITE per iteration (classic: ibv_post_send). */
int bench_c_post_write(struct ibv_qp *qp, const struct bench_write *w, uint64_t iters);
/* Post one signaled WRITE per iteration (extended: ibv_wr_start .. ibv_wr_complete). */
int bench_c_post_write_ex(struct ibv_qp_ex *qp, const struct bench_write *w, uint64_t iters);
/* Post `batch` WRITEs (the last signaled) with one doorbell per iteration; batch <= 64. */
int bench_c_post_write_batch(struct ibv_qp *qp, const struct bench_write *w, uint32_t batch,
			     uint64_t iters);
int bench_c_post_write_batch_ex(struct ibv_qp_ex *qp, const struct bench_write *w,
				uint32_t batch, uint64_t iters);
/* Post one receive per iteration (ibv_post_recv). */
int bench_c_post_recv(struct ibv_qp *qp, const struct ibv_sge *sge, uint64_t iters);

/*
 * Make `n` completions ready on a null-provider CQ, then poll them, per iteration: one at a
 * time until the CQ is empty ("iter"), or into an array with one call ("batch"; n <= 32).
 */
int bench_c_poll_iter(struct ibv_cq *cq, uint32_t n, uint64_t iters, uint64_t *sum);
int bench_c_poll_batch(struct ibv_cq *cq, uint32_t n, uint64_t iters, uint64_t *sum);
int bench_c_poll_iter_ex(struct ibv_cq_ex *cq, uint32_t n, uint64_t iters, uint64_t *sum);
int bench_c_poll_batch_ex(struct ibv_cq_ex *cq, uint32_t n, uint64_t iters, uint64_t *sum);

/* Post one signaled WRITE, then poll the CQ until its completion arrives, per iteration. */
int bench_c_cycle(struct ibv_qp *qp, struct ibv_cq *cq, const struct bench_write *w,
		  uint64_t iters, uint64_t *sum);
int bench_c_cycle_ex(struct ibv_qp_ex *qp, struct ibv_cq_ex *cq, const struct bench_write *w,
		     uint64_t iters, uint64_t *sum);

/*
 * The same operations with the provider's function pointers read once per call, before the
 * loop, as sideway reads them once when it creates its objects (data_path_cached.c).
 */
int bench_cc_post_write(struct ibv_qp *qp, const struct bench_write *w, uint64_t iters);
int bench_cc_post_write_ex(struct ibv_qp_ex *qp, const struct bench_write *w, uint64_t iters);
int bench_cc_post_write_batch(struct ibv_qp *qp, const struct bench_write *w, uint32_t batch,
			      uint64_t iters);
int bench_cc_post_write_batch_ex(struct ibv_qp_ex *qp, const struct bench_write *w,
				 uint32_t batch, uint64_t iters);
int bench_cc_post_recv(struct ibv_qp *qp, const struct ibv_sge *sge, uint64_t iters);
int bench_cc_poll_iter(struct ibv_cq *cq, uint32_t n, uint64_t iters, uint64_t *sum);
int bench_cc_poll_batch(struct ibv_cq *cq, uint32_t n, uint64_t iters, uint64_t *sum);
int bench_cc_poll_iter_ex(struct ibv_cq_ex *cq, uint32_t n, uint64_t iters, uint64_t *sum);
int bench_cc_poll_batch_ex(struct ibv_cq_ex *cq, uint32_t n, uint64_t iters, uint64_t *sum);
int bench_cc_cycle(struct ibv_qp *qp, struct ibv_cq *cq, const struct bench_write *w,
		   uint64_t iters, uint64_t *sum);
int bench_cc_cycle_ex(struct ibv_qp_ex *qp, struct ibv_cq_ex *cq, const struct bench_write *w,
		      uint64_t iters, uint64_t *sum);

#endif

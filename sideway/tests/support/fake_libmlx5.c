/*
 * A TEST DOUBLE of libmlx5.so.1 (mlx5's direct verbs), for sideway's dv::mlx5 tests. Not mlx5,
 * not a NIC: nothing here reaches hardware or the kernel.
 *
 * It exports the mlx5dv_* functions sideway calls, under their real names and the C
 * signatures of <infiniband/mlx5dv.h>, and records every call with its arguments, one line
 * per call, in the file named by FAKE_MLX5_LOG, so the tests can check the attribute
 * plumbing (QP type, comp_mask bits, DC type, DCT access key, send_ops_flags) and the order
 * of a DCI's posting calls without an mlx5 device:
 *
 *   - mlx5dv_is_supported: true for a device whose name starts with "mlx5" (the real one
 *     compares the provider's operation table);
 *   - mlx5dv_query_device: answers version 1, CQE_V1, and of the parts asked for, the dynamic
 *     bfregs (8), LAG ports (2) and DCI streams (4, 2), leaving the others unanswered;
 *   - mlx5dv_create_qp: makes a QP laid out as libibverbs' struct verbs_qp (so the real
 *     ibv_qp_to_qp_ex finds its ibv_qp_ex when send_ops_flags were asked for), with qp_num
 *     0xdc0 + n, whose wr_* entries and mlx5dv_qp_ex.wr_set_dc_addr record their arguments;
 *     FAKE_MLX5_CREATE_ERRNO=N makes it fail with errno N instead.
 *   - mlx5dv_qp_ex_from_ibv_qp_ex: the QP's mlx5dv_qp_ex.
 *
 * QPs live until the process ends (the tests wrap them with a test double's context, whose
 * objects sideway never destroys).
 *
 * Build: cc -shared -fPIC -o libmlx5.so.1 fake_libmlx5.c
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/mlx5dv.h>

/* libibverbs' struct verbs_qp (driver.h) and its VERBS_QP_EX bit: what ibv_qp_to_qp_ex reads. */
struct fake_verbs_qp {
	union {
		struct ibv_qp qp;
		struct ibv_qp_ex qp_ex;
	};
	uint32_t comp_mask;
	void *xrcd;
};
#define FAKE_VERBS_QP_EX (1u << 1)

struct fake_qp {
	struct fake_verbs_qp vqp;
	struct mlx5dv_qp_ex mqp;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t next_qpn = 0xdc0;

static void record(const char *fmt, ...)
{
	const char *path = getenv("FAKE_MLX5_LOG");
	FILE *f;
	va_list ap;

	if (!path)
		return;
	pthread_mutex_lock(&lock);
	f = fopen(path, "a");
	if (f) {
		va_start(ap, fmt);
		vfprintf(f, fmt, ap);
		va_end(ap);
		fputc('\n', f);
		fclose(f);
	}
	pthread_mutex_unlock(&lock);
}

bool mlx5dv_is_supported(struct ibv_device *device)
{
	bool yes = device && strncmp(device->name, "mlx5", 4) == 0;

	record("mlx5dv_is_supported name=%s -> %d", device ? device->name : "(null)", yes);
	return yes;
}

int mlx5dv_query_device(struct ibv_context *ctx, struct mlx5dv_context *attrs)
{
	uint64_t asked = attrs->comp_mask;
	uint64_t answered = asked & (MLX5DV_CONTEXT_MASK_DYN_BFREGS |
				     MLX5DV_CONTEXT_MASK_NUM_LAG_PORTS |
				     MLX5DV_CONTEXT_MASK_DCI_STREAMS);

	record("mlx5dv_query_device comp_mask=0x%llx", (unsigned long long)asked);
	attrs->version = 1;
	attrs->flags = MLX5DV_CONTEXT_FLAGS_CQE_V1;
	attrs->comp_mask = answered;
	if (answered & MLX5DV_CONTEXT_MASK_DYN_BFREGS)
		attrs->max_dynamic_bfregs = 8;
	if (answered & MLX5DV_CONTEXT_MASK_NUM_LAG_PORTS)
		attrs->num_lag_ports = 2;
	if (answered & MLX5DV_CONTEXT_MASK_DCI_STREAMS) {
		attrs->dci_streams_caps.max_log_num_concurent = 4;
		attrs->dci_streams_caps.max_log_num_errored = 2;
	}
	return 0;
}

static struct fake_qp *of_ex(struct ibv_qp_ex *qp)
{
	return (struct fake_qp *)((char *)qp - offsetof(struct fake_qp, vqp.qp_ex));
}

static void wr_start(struct ibv_qp_ex *qp)
{
	record("wr_start qp=0x%x", qp->qp_base.qp_num);
}

static int wr_complete(struct ibv_qp_ex *qp)
{
	record("wr_complete qp=0x%x", qp->qp_base.qp_num);
	return 0;
}

static void wr_abort(struct ibv_qp_ex *qp)
{
	record("wr_abort qp=0x%x", qp->qp_base.qp_num);
}

static void wr_send(struct ibv_qp_ex *qp)
{
	record("wr_send wr_id=%llu flags=0x%x", (unsigned long long)qp->wr_id, qp->wr_flags);
}

static void wr_send_imm(struct ibv_qp_ex *qp, __be32 imm)
{
	record("wr_send_imm wr_id=%llu flags=0x%x imm_be=0x%x", (unsigned long long)qp->wr_id,
	       qp->wr_flags, imm);
}

static void wr_rdma_write(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t addr)
{
	record("wr_rdma_write wr_id=%llu flags=0x%x rkey=0x%x addr=0x%llx",
	       (unsigned long long)qp->wr_id, qp->wr_flags, rkey, (unsigned long long)addr);
}

static void wr_rdma_read(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t addr)
{
	record("wr_rdma_read wr_id=%llu flags=0x%x rkey=0x%x addr=0x%llx",
	       (unsigned long long)qp->wr_id, qp->wr_flags, rkey, (unsigned long long)addr);
}

static void wr_atomic_fetch_add(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t addr, uint64_t add)
{
	record("wr_atomic_fetch_add wr_id=%llu rkey=0x%x addr=0x%llx add=%llu",
	       (unsigned long long)qp->wr_id, rkey, (unsigned long long)addr,
	       (unsigned long long)add);
}

static void wr_set_sge_list(struct ibv_qp_ex *qp, size_t n, const struct ibv_sge *sge)
{
	record("wr_set_sge_list n=%zu lkey=0x%x addr=0x%llx length=%u", n, n ? sge[0].lkey : 0,
	       n ? (unsigned long long)sge[0].addr : 0ULL, n ? sge[0].length : 0);
}

static void wr_set_dc_addr(struct mlx5dv_qp_ex *mqp, struct ibv_ah *ah, uint32_t remote_dctn,
			   uint64_t remote_dc_key)
{
	record("wr_set_dc_addr ah_pd_handle=0x%x dctn=0x%x key=0x%llx", ah ? ah->handle : 0,
	       remote_dctn, (unsigned long long)remote_dc_key);
}

struct ibv_qp *mlx5dv_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr,
				struct mlx5dv_qp_init_attr *mlx5_attr)
{
	const char *fail = getenv("FAKE_MLX5_CREATE_ERRNO");
	struct fake_qp *q;
	bool has_ops = attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	bool dc = mlx5_attr->comp_mask & MLX5DV_QP_INIT_ATTR_MASK_DC;

	record("mlx5dv_create_qp qp_type=%d comp_mask=0x%x pd=%d send_ops_flags=0x%llx "
	       "srq=%d send_cq=%d recv_cq=%d max_send_wr=%u max_send_sge=%u "
	       "dv_comp_mask=0x%llx dc_type=%d dct_access_key=0x%llx",
	       attr->qp_type, attr->comp_mask, attr->pd != NULL,
	       has_ops ? (unsigned long long)attr->send_ops_flags : 0ULL, attr->srq != NULL,
	       attr->send_cq != NULL, attr->recv_cq != NULL, attr->cap.max_send_wr,
	       attr->cap.max_send_sge, (unsigned long long)mlx5_attr->comp_mask,
	       dc ? (int)mlx5_attr->dc_init_attr.dc_type : 0,
	       dc && mlx5_attr->dc_init_attr.dc_type == MLX5DV_DCTYPE_DCT ?
		       (unsigned long long)mlx5_attr->dc_init_attr.dct_access_key : 0ULL);
	if (fail) {
		errno = atoi(fail);
		return NULL;
	}
	q = calloc(1, sizeof(*q));
	if (!q) {
		errno = ENOMEM;
		return NULL;
	}
	q->vqp.qp.context = context;
	q->vqp.qp.pd = attr->pd;
	q->vqp.qp.send_cq = attr->send_cq;
	q->vqp.qp.recv_cq = attr->recv_cq;
	q->vqp.qp.srq = attr->srq;
	q->vqp.qp.qp_type = attr->qp_type;
	q->vqp.qp.state = IBV_QPS_RESET;
	pthread_mutex_lock(&lock);
	q->vqp.qp.qp_num = next_qpn++;
	pthread_mutex_unlock(&lock);
	if (has_ops) {
		q->vqp.comp_mask = FAKE_VERBS_QP_EX;
		q->vqp.qp_ex.wr_start = wr_start;
		q->vqp.qp_ex.wr_complete = wr_complete;
		q->vqp.qp_ex.wr_abort = wr_abort;
		q->vqp.qp_ex.wr_set_sge_list = wr_set_sge_list;
		if (attr->send_ops_flags & IBV_QP_EX_WITH_SEND)
			q->vqp.qp_ex.wr_send = wr_send;
		if (attr->send_ops_flags & IBV_QP_EX_WITH_SEND_WITH_IMM)
			q->vqp.qp_ex.wr_send_imm = wr_send_imm;
		if (attr->send_ops_flags & IBV_QP_EX_WITH_RDMA_WRITE)
			q->vqp.qp_ex.wr_rdma_write = wr_rdma_write;
		if (attr->send_ops_flags & IBV_QP_EX_WITH_RDMA_READ)
			q->vqp.qp_ex.wr_rdma_read = wr_rdma_read;
		if (attr->send_ops_flags & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
			q->vqp.qp_ex.wr_atomic_fetch_add = wr_atomic_fetch_add;
		if (dc && mlx5_attr->dc_init_attr.dc_type == MLX5DV_DCTYPE_DCI)
			q->mqp.wr_set_dc_addr = wr_set_dc_addr;
	}
	return &q->vqp.qp;
}

struct mlx5dv_qp_ex *mlx5dv_qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *qp)
{
	record("mlx5dv_qp_ex_from_ibv_qp_ex qp=0x%x", qp->qp_base.qp_num);
	return &of_ex(qp)->mqp;
}

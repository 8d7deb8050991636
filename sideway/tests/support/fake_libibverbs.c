/*
 * A TEST DOUBLE of libibverbs.so.1, for sideway's tests of the verbs that only libibverbs and
 * a provider answer (importing a context, PD and MR; ECE; the data-in-order query). Not
 * rdma-core, not a device: nothing here reaches the kernel.
 *
 * It exports, under their real names and the C signatures of <infiniband/verbs.h>, the
 * functions those tests reach, and records every call with its arguments, one line per call,
 * in the file named by FAKE_IBV_LOG:
 *
 *   - ibv_get_device_list / ibv_free_device_list: an empty list (the loader's marker);
 *   - ibv_import_device(fd): a context of the device "fakeverbs0" that owns fd (logged with
 *     whether fd is open); fd -1 fails with EINVAL; ibv_close_device closes fd and frees it;
 *   - ibv_alloc_pd / ibv_dealloc_pd, ibv_create_cq / ibv_destroy_cq, ibv_create_qp /
 *     ibv_destroy_qp: plain objects (QP numbers 0x100 + n), so a QP can be made;
 *   - ibv_import_pd(ctx, handle), ibv_import_mr(pd, handle): a PD, or a region at 0x7000000
 *     of 4096 bytes with lkey handle + 0x100 and rkey handle + 0x200 (handle 10: an implicit
 *     on-demand region's, at NULL of SIZE_MAX bytes); handle 0 fails with EOPNOTSUPP; ibv_unimport_pd / ibv_unimport_mr / ibv_dereg_mr free them;
 *   - ibv_query_ece: vendor 0x2c9, options 0x5; ibv_set_ece: options 0xdead fail with EINVAL;
 *   - ibv_query_qp_data_in_order: RDMA WRITE answers 3 with RETURN_CAPS and 1 without; other
 *     operations 0.
 *
 * Build: cc -shared -fPIC -o libibverbs.so.1 fake_libibverbs.c
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

static struct ibv_device fake_device = { .name = "fakeverbs0" };
static unsigned next_qp;

static void logf_(const char *fmt, ...)
{
	const char *path = getenv("FAKE_IBV_LOG");
	FILE *f;
	va_list ap;

	if (!path || !(f = fopen(path, "a")))
		return;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fclose(f);
}

struct ibv_device **ibv_get_device_list(int *num)
{
	if (num)
		*num = 0;
	return calloc(1, sizeof(struct ibv_device *));
}

void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

struct ibv_context *ibv_import_device(int cmd_fd)
{
	struct ibv_context *ctx;
	int open_fd = fcntl(cmd_fd, F_GETFD) != -1;

	logf_("ibv_import_device open=%d", open_fd);
	if (!open_fd) {
		errno = EINVAL;
		return NULL;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx) {
		errno = ENOMEM;
		return NULL;
	}
	ctx->device = &fake_device;
	ctx->cmd_fd = cmd_fd;
	ctx->async_fd = -1;
	ctx->num_comp_vectors = 1;
	return ctx;
}

int ibv_close_device(struct ibv_context *ctx)
{
	int closed = close(ctx->cmd_fd);

	logf_("ibv_close_device closed=%d", closed == 0);
	free(ctx);
	return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	struct ibv_pd *pd = calloc(1, sizeof(*pd));

	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->context = ctx;
	pd->handle = 0x42;
	logf_("ibv_alloc_pd");
	return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	logf_("ibv_dealloc_pd handle=%u", pd->handle);
	free(pd);
	return 0;
}

struct ibv_pd *ibv_import_pd(struct ibv_context *ctx, uint32_t handle)
{
	struct ibv_pd *pd;

	logf_("ibv_import_pd handle=%u", handle);
	if (!handle) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	pd = calloc(1, sizeof(*pd));
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->context = ctx;
	pd->handle = handle;
	return pd;
}

void ibv_unimport_pd(struct ibv_pd *pd)
{
	logf_("ibv_unimport_pd handle=%u", pd->handle);
	free(pd);
}

struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t handle)
{
	struct ibv_mr *mr;

	logf_("ibv_import_mr pd=%u handle=%u", pd->handle, handle);
	if (!handle) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	mr->context = pd->context;
	mr->pd = pd;
	if (handle == 10) {
		mr->addr = NULL;
		mr->length = SIZE_MAX;
	} else {
		mr->addr = (void *)0x7000000;
		mr->length = 4096;
	}
	mr->handle = handle;
	mr->lkey = handle + 0x100;
	mr->rkey = handle + 0x200;
	return mr;
}

void ibv_unimport_mr(struct ibv_mr *mr)
{
	logf_("ibv_unimport_mr handle=%u", mr->handle);
	free(mr);
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	logf_("ibv_dereg_mr handle=%u", mr->handle);
	free(mr);
	return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	struct ibv_cq *cq = calloc(1, sizeof(*cq));

	(void)comp_vector;
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	cq->context = ctx;
	cq->cqe = cqe;
	cq->cq_context = cq_context;
	cq->channel = channel;
	return cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
	free(cq);
	return 0;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct ibv_qp *qp = calloc(1, sizeof(*qp));

	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	qp->context = pd->context;
	qp->pd = pd;
	qp->send_cq = attr->send_cq;
	qp->recv_cq = attr->recv_cq;
	qp->qp_type = attr->qp_type;
	qp->state = IBV_QPS_RESET;
	qp->qp_num = 0x100 + next_qp++;
	return qp;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	free(qp);
	return 0;
}

int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	logf_("ibv_query_ece qp=%#x", qp->qp_num);
	ece->vendor_id = 0x2c9;
	ece->options = 0x5;
	ece->comp_mask = 0;
	return 0;
}

int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	logf_("ibv_set_ece qp=%#x vendor=%#x options=%#x comp_mask=%u", qp->qp_num,
	      ece->vendor_id, ece->options, ece->comp_mask);
	return ece->options == 0xdead ? EINVAL : 0;
}

int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	logf_("ibv_query_qp_data_in_order qp=%#x op=%d flags=%u", qp->qp_num, (int)op, flags);
	if (op != IBV_WR_RDMA_WRITE)
		return 0;
	return (flags & 1) ? 3 : 1;
}

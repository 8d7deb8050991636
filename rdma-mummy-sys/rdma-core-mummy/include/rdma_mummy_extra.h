/*
 * Exports of libibverbs that its installed headers do not declare.
 *
 * libibverbs exports these under its public version nodes (or, for ibv_query_gid_type, uses
 * them in rdma-core's own ibv_devinfo), but declares them only in rdma-core's internal
 * headers (driver.h, marshall.h), which distributions do not install. The shim forwards them
 * like every other export, so programs built from rdma-core's sources link against the shim;
 * these declarations, with the prototypes of those internal headers, are what the shim and
 * bindgen compile against. A translation unit that includes rdma-core's driver.h or
 * marshall.h (whose include guards are checked here) should include it before this file.
 */
#ifndef RDMA_MUMMY_EXTRA_H
#define RDMA_MUMMY_EXTRA_H

#include <stddef.h>
#include <stdint.h>

#include <infiniband/mlx5dv.h>
#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* verbs.h of rdma-core 56 declares it too (a compatible redeclaration); 44's does not. */
const char *ibv_wr_opcode_str(enum ibv_wr_opcode opcode);

/* libmlx5 exports of rdma-core 56 that 44's mlx5dv.h does not declare (56's declares them
 * with these very prototypes). */
struct ibv_mr *mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
				    uint64_t iova, int fd, int access, int mlx5_access);
int mlx5dv_get_data_direct_sysfs_path(struct ibv_context *context, char *buf, size_t buf_len);

#ifndef INFINIBAND_DRIVER_H
/* The GID types ibv_query_gid_type() reports (driver.h's enum). */
enum ibv_gid_type_sysfs {
	IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
	IBV_GID_TYPE_SYSFS_ROCE_V2,
};

int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);
const char *ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
		       enum ibv_gid_type_sysfs *type);
#endif

#ifndef INFINIBAND_MARSHALL_H
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src);
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);
#endif

#ifdef __cplusplus
}
#endif

#endif

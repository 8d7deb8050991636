/*
 * devinfo: list RDMA devices, each port's state and its GID table, like a tiny
 * ibv_devinfo + show_gids. It links librdma-core-mummy.a instead of -libverbs, so it starts
 * (and says what is missing) on a machine without rdma-core.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "rdma_mummy.h"

static const char *gid_type_str(uint32_t type)
{
	switch (type) {
	case IBV_GID_TYPE_IB:
		return "IB";
	case IBV_GID_TYPE_ROCE_V1:
		return "RoCE v1";
	case IBV_GID_TYPE_ROCE_V2:
		return "RoCE v2";
	default:
		return "unknown";
	}
}

static void print_gid(const union ibv_gid *gid)
{
	char text[INET6_ADDRSTRLEN];

	if (!inet_ntop(AF_INET6, gid->raw, text, sizeof(text)))
		snprintf(text, sizeof(text), "?");
	printf("%s", text);
}

/* Walks the GID table with ibv_query_gid_ex, which also reports each entry's type. */
static void print_gids(struct ibv_context *ctx, uint8_t port, int table_len)
{
	struct ibv_gid_entry entry;
	int i, ret;

	for (i = 0; i < table_len; i++) {
		ret = ibv_query_gid_ex(ctx, port, i, &entry, 0);
		if (ret == ENODATA)	/* an empty slot of the table */
			continue;
		if (ret) {
			printf("\t\tGID[%3d]: query failed: %s\n", i, strerror(ret));
			continue;
		}
		printf("\t\tGID[%3d]: ", i);
		print_gid(&entry.gid);
		printf(", %s\n", gid_type_str(entry.gid_type));
	}
}

static int print_device(struct ibv_device *dev)
{
	struct ibv_device_attr attr;
	struct ibv_port_attr port_attr;
	struct ibv_context *ctx;
	uint8_t port;
	int ret;

	printf("hca_id:\t%s\n", ibv_get_device_name(dev));
	ctx = ibv_open_device(dev);
	if (!ctx) {
		printf("\tcannot open: %s\n", strerror(errno));
		return 1;
	}
	ret = ibv_query_device(ctx, &attr);
	if (ret) {
		printf("\tibv_query_device failed: %s\n", strerror(ret));
		ibv_close_device(ctx);
		return 1;
	}
	printf("\tfw_ver:\t\t%s\n\tphys_port_cnt:\t%u\n", attr.fw_ver, attr.phys_port_cnt);
	for (port = 1; port <= attr.phys_port_cnt; port++) {
		ret = ibv_query_port(ctx, port, &port_attr);
		if (ret) {
			printf("\tport %u: ibv_query_port failed: %s\n", port, strerror(ret));
			continue;
		}
		printf("\tport:\t%u\n", port);
		printf("\t\tstate:\t\t%s (%d)\n", ibv_port_state_str(port_attr.state),
		       port_attr.state);
		printf("\t\tlink_layer:\t%s\n",
		       port_attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand");
		print_gids(ctx, port, port_attr.gid_tbl_len);
	}
	ibv_close_device(ctx);
	return 0;
}

int main(void)
{
	struct ibv_device **list;
	int i, num, failed = 0;

	list = ibv_get_device_list(&num);
	if (!list) {
		const char *why = rdma_mummy_load_error(RDMA_MUMMY_LIB_IBVERBS);

		if (why)
			fprintf(stderr, "cannot load libibverbs (%s): %s\n"
				"install it (Debian/Ubuntu: apt install libibverbs1 librdmacm1) or "
				"set RDMA_MUMMY_LIBIBVERBS\n",
				rdma_mummy_load_path(RDMA_MUMMY_LIB_IBVERBS), why);
		else
			fprintf(stderr, "ibv_get_device_list failed: %s\n", strerror(errno));
		return 1;
	}
	if (num == 0)
		printf("no RDMA devices found\n");
	for (i = 0; i < num; i++)
		failed |= print_device(list[i]);
	ibv_free_device_list(list);
	return failed;
}

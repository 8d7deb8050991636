/*
 * On-demand paging on the null provider: the verbs_context ops that verbs.h's inlines
 * ibv_query_device_ex and ibv_advise_mr reach, answering with capabilities a test sets and
 * recording what advise_mr was given, plus an in-memory ibv_mr standing for an implicit
 * on-demand region (addr NULL, length SIZE_MAX). Like the rest of the null provider it calls
 * no libibverbs function. Attach one to a provider's context with null_odp_attach.
 */
#include "null_provider_odp.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct null_odp {
	struct ibv_context *ctx;
	struct ibv_mr mr;
	struct ibv_odp_caps caps;
	uint32_t xrc_caps;
	int advise_ret;
	struct null_odp_advice seen;
};

/* The ops get a context or a PD, not this struct: find it by context. */
#define NULL_ODP_SLOTS 64
static struct null_odp *slots[NULL_ODP_SLOTS];
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;

static struct null_odp *of_context(struct ibv_context *ctx)
{
	struct null_odp *found = NULL;
	pthread_mutex_lock(&slots_lock);
	for (int i = 0; i < NULL_ODP_SLOTS && !found; i++)
		if (slots[i] && slots[i]->ctx == ctx)
			found = slots[i];
	pthread_mutex_unlock(&slots_lock);
	return found;
}

static int null_query_device_ex(struct ibv_context *context,
				const struct ibv_query_device_ex_input *input,
				struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct null_odp *o = of_context(context);
	(void)input;
	if (!o || attr_size < sizeof(*attr))
		return EINVAL;
	memset(attr, 0, attr_size);
	attr->orig_attr.phys_port_cnt = 1;
	attr->odp_caps = o->caps;
	attr->xrc_odp_caps = o->xrc_caps;
	return 0;
}

static int null_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags,
			  struct ibv_sge *sg_list, uint32_t num_sge)
{
	struct null_odp *o = of_context(pd->context);
	if (!o)
		return EINVAL;
	o->seen.calls++;
	o->seen.pd = pd;
	o->seen.advice = (uint32_t)advice;
	o->seen.flags = flags;
	o->seen.num_sge = num_sge;
	for (uint32_t i = 0; i < num_sge && i < NULL_ODP_MAX_SGES; i++)
		o->seen.sges[i] = sg_list[i];
	return o->advise_ret;
}

struct null_odp *null_odp_attach(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct null_odp *o = calloc(1, sizeof(*o));
	if (!o)
		return NULL;
	o->ctx = ctx;
	o->mr.context = ctx;
	o->mr.pd = pd;
	o->mr.addr = NULL;
	o->mr.length = SIZE_MAX;
	o->mr.lkey = NULL_ODP_LKEY;
	o->mr.rkey = NULL_ODP_RKEY;
	pthread_mutex_lock(&slots_lock);
	int i = 0;
	while (i < NULL_ODP_SLOTS && slots[i])
		i++;
	if (i < NULL_ODP_SLOTS)
		slots[i] = o;
	pthread_mutex_unlock(&slots_lock);
	if (i == NULL_ODP_SLOTS) {
		free(o);
		return NULL;
	}
	struct verbs_context *vctx = verbs_get_ctx(ctx);
	vctx->query_device_ex = null_query_device_ex;
	vctx->advise_mr = null_advise_mr;
	return o;
}

void null_odp_detach(struct null_odp *o)
{
	struct verbs_context *vctx = verbs_get_ctx(o->ctx);
	vctx->query_device_ex = NULL;
	vctx->advise_mr = NULL;
	pthread_mutex_lock(&slots_lock);
	for (int i = 0; i < NULL_ODP_SLOTS; i++)
		if (slots[i] == o)
			slots[i] = NULL;
	pthread_mutex_unlock(&slots_lock);
	free(o);
}

void null_odp_set_caps(struct null_odp *o, uint64_t general, uint32_t rc, uint32_t uc,
		       uint32_t ud, uint32_t xrc)
{
	o->caps.general_caps = general;
	o->caps.per_transport_caps.rc_odp_caps = rc;
	o->caps.per_transport_caps.uc_odp_caps = uc;
	o->caps.per_transport_caps.ud_odp_caps = ud;
	o->xrc_caps = xrc;
}

void null_odp_set_advise_ret(struct null_odp *o, int ret) { o->advise_ret = ret; }
struct ibv_mr *null_odp_mr(struct null_odp *o) { return &o->mr; }
const struct null_odp_advice *null_odp_seen(const struct null_odp *o) { return &o->seen; }

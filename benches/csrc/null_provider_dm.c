/* Device memory for the null provider; see null_provider_dm.h. */
#include "null_provider_dm.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct null_dm_state {
	struct null_dm_state *next; /* in the registry */
	struct ibv_context *ctx;
	struct null_dm_counters c;
	int copy_error;
	int disabled; /* null_dm_disable ran: freed with its last device memory */
};

struct null_dm {
	struct ibv_dm dm;
	struct null_dm_state *st;
	size_t length;
	unsigned n_mrs;
	struct ibv_mr mrs[NULL_DM_MAX_MRS];
	unsigned char bytes[];
};

/* Which state serves which context: alloc_dm is given only the context. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct null_dm_state *registry;

static struct null_dm_state *state_of(struct ibv_context *ctx)
{
	struct null_dm_state *st;

	pthread_mutex_lock(&registry_lock);
	for (st = registry; st && st->ctx != ctx; st = st->next)
		;
	pthread_mutex_unlock(&registry_lock);
	return st;
}

static struct null_dm *of_dm(struct ibv_dm *dm)
{
	return (struct null_dm *)((char *)dm - offsetof(struct null_dm, dm));
}

static int in_range(struct null_dm *d, uint64_t offset, size_t length)
{
	return offset <= d->length && length <= d->length - offset;
}

static int null_memcpy_to_dm(struct ibv_dm *dm, uint64_t offset, const void *src, size_t length)
{
	struct null_dm *d = of_dm(dm);

	d->st->c.copy_to_calls++;
	d->st->c.last_copy_offset = offset;
	d->st->c.last_copy_length = length;
	if (d->st->copy_error)
		return d->st->copy_error;
	if (!in_range(d, offset, length))
		return EFAULT; /* as mlx5 answers */
	memcpy(d->bytes + offset, src, length);
	return 0;
}

static int null_memcpy_from_dm(void *dst, struct ibv_dm *dm, uint64_t offset, size_t length)
{
	struct null_dm *d = of_dm(dm);

	d->st->c.copy_from_calls++;
	d->st->c.last_copy_offset = offset;
	d->st->c.last_copy_length = length;
	if (d->st->copy_error)
		return d->st->copy_error;
	if (!in_range(d, offset, length))
		return EFAULT;
	memcpy(dst, d->bytes + offset, length);
	return 0;
}

static struct ibv_dm *null_alloc_dm(struct ibv_context *ctx, struct ibv_alloc_dm_attr *attr)
{
	struct null_dm_state *st = state_of(ctx);
	struct null_dm *d;

	if (!st) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	st->c.alloc_dm_calls++;
	st->c.last_alloc_length = attr->length;
	st->c.last_log_align_req = attr->log_align_req;
	st->c.last_alloc_comp_mask = attr->comp_mask;
	if (attr->length > NULL_DM_MAX) {
		errno = ENOMEM;
		return NULL;
	}
	d = calloc(1, sizeof(*d) + attr->length);
	if (!d) {
		errno = ENOMEM;
		return NULL;
	}
	d->dm.context = ctx;
	d->dm.memcpy_to_dm = null_memcpy_to_dm;
	d->dm.memcpy_from_dm = null_memcpy_from_dm;
	d->dm.handle = (uint32_t)st->c.alloc_dm_calls;
	d->st = st;
	d->length = attr->length;
	st->c.live_dms++;
	return &d->dm;
}

static int null_free_dm(struct ibv_dm *dm)
{
	struct null_dm *d = of_dm(dm);

	d->st->c.free_dm_calls++;
	d->st->c.live_dms--;
	/* Its regions go with it: a test double's region is never deregistered through
	 * libibverbs, so freeing the memory is where they end. */
	d->st->c.live_mrs -= d->n_mrs;
	if (d->st->disabled && !d->st->c.live_dms)
		free(d->st);
	free(d);
	return 0;
}

static struct ibv_mr *null_reg_dm_mr(struct ibv_pd *pd, struct ibv_dm *dm, uint64_t offset,
				     size_t length, unsigned int access)
{
	struct null_dm *d = of_dm(dm);
	struct null_dm_state *st = d->st;
	struct ibv_mr *mr;

	st->c.reg_dm_mr_calls++;
	st->c.last_reg_offset = offset;
	st->c.last_reg_length = length;
	st->c.last_reg_access = access;
	st->c.last_reg_pd = pd;
	st->c.last_reg_dm = dm;
	if (!(access & IBV_ACCESS_ZERO_BASED) || !in_range(d, offset, length)) {
		errno = EINVAL; /* what the kernel answers */
		return NULL;
	}
	if (d->n_mrs == NULL_DM_MAX_MRS) {
		errno = ENOSPC;
		return NULL;
	}
	mr = &d->mrs[d->n_mrs];
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = NULL; /* zero-based */
	mr->length = length;
	mr->handle = d->n_mrs;
	mr->lkey = NULL_DM_LKEY_BASE + d->n_mrs;
	mr->rkey = NULL_DM_LKEY_BASE + d->n_mrs;
	d->n_mrs++;
	st->c.live_mrs++;
	return mr;
}

struct null_dm_state *null_dm_enable(struct ibv_context *ctx)
{
	struct verbs_context *vctx = verbs_get_ctx(ctx);
	struct null_dm_state *st = calloc(1, sizeof(*st));

	if (!st || !vctx) {
		free(st);
		return NULL;
	}
	st->ctx = ctx;
	pthread_mutex_lock(&registry_lock);
	st->next = registry;
	registry = st;
	pthread_mutex_unlock(&registry_lock);
	vctx->alloc_dm = null_alloc_dm;
	vctx->free_dm = null_free_dm;
	vctx->reg_dm_mr = null_reg_dm_mr;
	return st;
}

void null_dm_disable(struct null_dm_state *st)
{
	struct verbs_context *vctx = verbs_get_ctx(st->ctx);
	struct null_dm_state **p;

	if (vctx) {
		vctx->alloc_dm = NULL;
		vctx->free_dm = NULL;
		vctx->reg_dm_mr = NULL;
	}
	pthread_mutex_lock(&registry_lock);
	for (p = &registry; *p && *p != st; p = &(*p)->next)
		;
	if (*p)
		*p = st->next;
	pthread_mutex_unlock(&registry_lock);
	/* Device memory still allocated through it frees it last (free_dm). */
	st->disabled = 1;
	if (!st->c.live_dms)
		free(st);
}

const struct null_dm_counters *null_dm_counters(const struct null_dm_state *st)
{
	return &st->c;
}

void null_dm_fail_copies(struct null_dm_state *st, int err)
{
	st->copy_error = err;
}

/*
 * A TEST DOUBLE of the CUDA driver library, for stride-perf's tests. Not CUDA, not a GPU.
 *
 * It exports the driver API entry points that stride's loader (stride/src/cuda.rs) resolves,
 * under their real names and C signatures, and implements them over host memory, so that the
 * loader, the GPU buffer code and their error paths run on machines without an NVIDIA GPU:
 *
 *   - "device memory" is host memory from posix_memalign, handed out 256 bytes past a page
 *     boundary so that the caller's own alignment to GPU pages is exercised;
 *   - the "dma-buf" that cuMemGetHandleForAddressRange exports is a memfd of the right size
 *     (a NIC driver with dma-buf support would reject it; SoftRoCE rejects every dma-buf);
 *   - like the real driver, it insists on cuInit first, on a current context for memory
 *     calls, on ranges inside an allocation, and on page-aligned export ranges.
 *
 * Knobs, read from the environment at cuInit:
 *   FAKE_CUDA_GPUS    how many GPUs (default 1; 0 makes cuInit return CUDA_ERROR_NO_DEVICE)
 *   FAKE_CUDA_DMABUF  the value of CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (default 1)
 *   FAKE_CUDA_COPY_LOG  a file to which the process appends, when it exits, one line counting
 *                     the copies it made: "fake-libcuda copies: pid P dtoh_calls N dtoh_bytes N
 *                     htod_calls N htod_bytes N" (how a test of a whole program sees that
 *                     stride-perf --staging copies around each transfer)
 * Built with -DFAKE_CUDA_NO_DMABUF_EXPORT it lacks cuMemGetHandleForAddressRange, like a driver
 * older than CUDA 11.7.
 *
 * For the tests' own checks it also exports fake_cuda_live_allocations(),
 * fake_cuda_context_refs(), fake_cuda_sync_memops(ptr) and fake_cuda_copies(which) (the
 * successful cuMemcpyDtoH calls and bytes, then cuMemcpyHtoD's: which 0 to 3).
 *
 * Build: cc -shared -fPIC -o libcuda.so.1 fake_libcuda.c
 */

#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

/* CUresult values, as cuda.h defines them. */
enum {
	FAKE_SUCCESS = 0,
	FAKE_ERROR_INVALID_VALUE = 1,
	FAKE_ERROR_OUT_OF_MEMORY = 2,
	FAKE_ERROR_NOT_INITIALIZED = 3,
	FAKE_ERROR_NO_DEVICE = 100,
	FAKE_ERROR_INVALID_DEVICE = 101,
	FAKE_ERROR_INVALID_CONTEXT = 201,
	FAKE_ERROR_OPERATING_SYSTEM = 304,
	FAKE_ERROR_NOT_SUPPORTED = 801,
};

#define FAKE_MAX_GPUS 16
#define FAKE_MAX_ALLOCATIONS 1024
#define FAKE_SKEW 256

struct fake_allocation {
	void *block;         /* what posix_memalign returned; NULL: slot unused */
	CUdeviceptr start;   /* what cuMemAlloc returned */
	size_t size;
	int device;
	int sync_memops;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;
static int gpu_count = 1;
static int dma_buf_supported = 1;
static int context_refs[FAKE_MAX_GPUS];
/* One context per GPU: its address is the CUcontext handle. */
static char contexts[FAKE_MAX_GPUS];
static struct fake_allocation allocations[FAKE_MAX_ALLOCATIONS];
static __thread CUcontext current;
/* Successful copies: DtoH calls, DtoH bytes, HtoD calls, HtoD bytes. */
static unsigned long long copies[4];

static int env_int(const char *name, int fallback)
{
	const char *value = getenv(name);
	return value && *value ? atoi(value) : fallback;
}

static int current_device(void)
{
	if (current == NULL)
		return -1;
	return (int)((char *)current - contexts);
}

/* The allocation holding [ptr, ptr + len); call with the lock held. */
static struct fake_allocation *find(CUdeviceptr ptr, size_t len)
{
	for (int i = 0; i < FAKE_MAX_ALLOCATIONS; i++) {
		struct fake_allocation *a = &allocations[i];
		if (a->block && ptr >= a->start && len <= a->size &&
		    ptr - a->start <= a->size - len)
			return a;
	}
	return NULL;
}

/* Common checks of a memory call: initialised, and a context current on this thread. */
static CUresult ready(void)
{
	if (!initialised)
		return FAKE_ERROR_NOT_INITIALIZED;
	if (current_device() < 0)
		return FAKE_ERROR_INVALID_CONTEXT;
	return FAKE_SUCCESS;
}

/* Common checks of a call about one GPU: initialised, and a GPU that exists. */
static CUresult device_ready(CUdevice device)
{
	if (!initialised)
		return FAKE_ERROR_NOT_INITIALIZED;
	if (device < 0 || device >= gpu_count)
		return FAKE_ERROR_INVALID_DEVICE;
	return FAKE_SUCCESS;
}

CUresult cuInit(unsigned int flags)
{
	if (flags != 0)
		return FAKE_ERROR_INVALID_VALUE;
	gpu_count = env_int("FAKE_CUDA_GPUS", 1);
	dma_buf_supported = env_int("FAKE_CUDA_DMABUF", 1);
	if (gpu_count < 0 || gpu_count > FAKE_MAX_GPUS)
		gpu_count = FAKE_MAX_GPUS;
	if (gpu_count == 0)
		return FAKE_ERROR_NO_DEVICE;
	initialised = 1;
	return FAKE_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
	if (!initialised)
		return FAKE_ERROR_NOT_INITIALIZED;
	if (!count)
		return FAKE_ERROR_INVALID_VALUE;
	*count = gpu_count;
	return FAKE_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	if (!initialised)
		return FAKE_ERROR_NOT_INITIALIZED;
	if (!device)
		return FAKE_ERROR_INVALID_VALUE;
	if (ordinal < 0 || ordinal >= gpu_count)
		return FAKE_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return FAKE_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice device)
{
	CUresult ret = device_ready(device);
	if (ret != FAKE_SUCCESS)
		return ret;
	if (!name || len <= 0)
		return FAKE_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "Fake GPU %d (stride test double)", device);
	return FAKE_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device)
{
	CUresult ret = device_ready(device);
	if (ret != FAKE_SUCCESS)
		return ret;
	if (!value)
		return FAKE_ERROR_INVALID_VALUE;
	switch (attribute) {
	case 33: /* CU_DEVICE_ATTRIBUTE_PCI_BUS_ID */
		*value = 0x1b + device;
		return FAKE_SUCCESS;
	case 34: /* CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID */
		*value = 0;
		return FAKE_SUCCESS;
	case 50: /* CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID */
		*value = 0;
		return FAKE_SUCCESS;
	case 124: /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */
		*value = dma_buf_supported;
		return FAKE_SUCCESS;
	default:
		return FAKE_ERROR_INVALID_VALUE;
	}
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device)
{
	CUresult ret = device_ready(device);
	if (ret != FAKE_SUCCESS)
		return ret;
	if (!context)
		return FAKE_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	context_refs[device]++;
	pthread_mutex_unlock(&lock);
	*context = &contexts[device];
	return FAKE_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device)
{
	CUresult ret = device_ready(device);
	if (ret != FAKE_SUCCESS)
		return ret;
	pthread_mutex_lock(&lock);
	if (context_refs[device] == 0)
		ret = FAKE_ERROR_INVALID_CONTEXT;
	else
		context_refs[device]--;
	pthread_mutex_unlock(&lock);
	return ret;
}

CUresult cuCtxSetCurrent(CUcontext context)
{
	if (!initialised)
		return FAKE_ERROR_NOT_INITIALIZED;
	if (context != NULL) {
		uintptr_t at = (uintptr_t)context, first = (uintptr_t)contexts;
		if (at < first || at - first >= (uintptr_t)gpu_count)
			return FAKE_ERROR_INVALID_CONTEXT;
		int device = (int)(at - first);
		pthread_mutex_lock(&lock);
		int retained = context_refs[device] > 0;
		pthread_mutex_unlock(&lock);
		if (!retained)
			return FAKE_ERROR_INVALID_CONTEXT;
	}
	current = context;
	return FAKE_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size)
{
	CUresult ret = ready();
	if (ret != FAKE_SUCCESS)
		return ret;
	if (!ptr || size == 0)
		return FAKE_ERROR_INVALID_VALUE;
	void *block = NULL;
	if (posix_memalign(&block, 4096, size + FAKE_SKEW) != 0)
		return FAKE_ERROR_OUT_OF_MEMORY;
	/* Device memory holds garbage until written; so does this. */
	memset(block, 0xa5, size + FAKE_SKEW);
	pthread_mutex_lock(&lock);
	for (int i = 0; i < FAKE_MAX_ALLOCATIONS; i++) {
		struct fake_allocation *a = &allocations[i];
		if (!a->block) {
			a->block = block;
			a->start = (CUdeviceptr)(uintptr_t)block + FAKE_SKEW;
			a->size = size;
			a->device = current_device();
			a->sync_memops = 0;
			*ptr = a->start;
			pthread_mutex_unlock(&lock);
			return FAKE_SUCCESS;
		}
	}
	pthread_mutex_unlock(&lock);
	free(block);
	return FAKE_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFree_v2(CUdeviceptr ptr)
{
	CUresult ret = ready();
	if (ret != FAKE_SUCCESS)
		return ret;
	pthread_mutex_lock(&lock);
	for (int i = 0; i < FAKE_MAX_ALLOCATIONS; i++) {
		struct fake_allocation *a = &allocations[i];
		if (a->block && a->start == ptr) {
			free(a->block);
			memset(a, 0, sizeof(*a));
			pthread_mutex_unlock(&lock);
			return FAKE_SUCCESS;
		}
	}
	pthread_mutex_unlock(&lock);
	return FAKE_ERROR_INVALID_VALUE;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t len)
{
	CUresult ret = ready();
	if (ret != FAKE_SUCCESS)
		return ret;
	pthread_mutex_lock(&lock);
	int inside = find(dst, len) != NULL;
	pthread_mutex_unlock(&lock);
	if (!inside || !src)
		return FAKE_ERROR_INVALID_VALUE;
	memcpy((void *)(uintptr_t)dst, src, len);
	pthread_mutex_lock(&lock);
	copies[2]++;
	copies[3] += len;
	pthread_mutex_unlock(&lock);
	return FAKE_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t len)
{
	CUresult ret = ready();
	if (ret != FAKE_SUCCESS)
		return ret;
	pthread_mutex_lock(&lock);
	int inside = find(src, len) != NULL;
	pthread_mutex_unlock(&lock);
	if (!inside || !dst)
		return FAKE_ERROR_INVALID_VALUE;
	memcpy(dst, (const void *)(uintptr_t)src, len);
	pthread_mutex_lock(&lock);
	copies[0]++;
	copies[1] += len;
	pthread_mutex_unlock(&lock);
	return FAKE_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t len)
{
	CUresult ret = ready();
	if (ret != FAKE_SUCCESS)
		return ret;
	pthread_mutex_lock(&lock);
	int inside = find(dst, len) != NULL;
	pthread_mutex_unlock(&lock);
	if (!inside)
		return FAKE_ERROR_INVALID_VALUE;
	memset((void *)(uintptr_t)dst, value, len);
	return FAKE_SUCCESS;
}

CUresult cuPointerSetAttribute(const void *value, int attribute, CUdeviceptr ptr)
{
	CUresult ret = ready();
	if (ret != FAKE_SUCCESS)
		return ret;
	if (attribute != 6 /* CU_POINTER_ATTRIBUTE_SYNC_MEMOPS */ || !value)
		return FAKE_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	struct fake_allocation *a = find(ptr, 1);
	if (a)
		a->sync_memops = *(const unsigned int *)value != 0;
	pthread_mutex_unlock(&lock);
	return a ? FAKE_SUCCESS : FAKE_ERROR_INVALID_VALUE;
}

#ifndef FAKE_CUDA_NO_DMABUF_EXPORT
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr ptr, size_t size, int type,
				       unsigned long long flags)
{
	CUresult ret = ready();
	if (ret != FAKE_SUCCESS)
		return ret;
	if (!handle || type != 1 /* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */ || flags != 0 ||
	    size == 0)
		return FAKE_ERROR_INVALID_VALUE;
	if (!dma_buf_supported)
		return FAKE_ERROR_NOT_SUPPORTED;
	/* The real driver wants host-page-aligned ranges. */
	long page = sysconf(_SC_PAGESIZE);
	if (page <= 0 || ptr % (unsigned long long)page != 0 || size % (size_t)page != 0)
		return FAKE_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	int inside = find(ptr, size) != NULL;
	pthread_mutex_unlock(&lock);
	if (!inside)
		return FAKE_ERROR_INVALID_VALUE;
	int fd = memfd_create("fake-cuda-dmabuf", MFD_CLOEXEC);
	if (fd < 0)
		return FAKE_ERROR_OPERATING_SYSTEM;
	if (ftruncate(fd, (off_t)size) != 0) {
		close(fd);
		return FAKE_ERROR_OPERATING_SYSTEM;
	}
	*(int *)handle = fd;
	return FAKE_SUCCESS;
}
#endif

struct fake_error {
	CUresult code;
	const char *name;
	const char *text;
};

static const struct fake_error errors[] = {
	{ FAKE_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ FAKE_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ FAKE_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ FAKE_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ FAKE_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ FAKE_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ FAKE_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ FAKE_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed" },
	{ FAKE_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
};

static const struct fake_error *lookup(CUresult code)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].code == code)
			return &errors[i];
	return NULL;
}

/* Like the real driver: an unknown code is CUDA_ERROR_INVALID_VALUE and a NULL string. */
CUresult cuGetErrorName(CUresult code, const char **name)
{
	const struct fake_error *e = lookup(code);
	if (!name)
		return FAKE_ERROR_INVALID_VALUE;
	*name = e ? e->name : NULL;
	return e ? FAKE_SUCCESS : FAKE_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult code, const char **text)
{
	const struct fake_error *e = lookup(code);
	if (!text)
		return FAKE_ERROR_INVALID_VALUE;
	*text = e ? e->text : NULL;
	return e ? FAKE_SUCCESS : FAKE_ERROR_INVALID_VALUE;
}

/* The tests' own window into the double. */

int fake_cuda_live_allocations(void)
{
	int n = 0;
	pthread_mutex_lock(&lock);
	for (int i = 0; i < FAKE_MAX_ALLOCATIONS; i++)
		n += allocations[i].block != NULL;
	pthread_mutex_unlock(&lock);
	return n;
}

int fake_cuda_context_refs(void)
{
	int n = 0;
	pthread_mutex_lock(&lock);
	for (int i = 0; i < FAKE_MAX_GPUS; i++)
		n += context_refs[i];
	pthread_mutex_unlock(&lock);
	return n;
}

/* 1 when the allocation holding ptr was marked SYNC_MEMOPS, 0 when not, -1 when none. */
int fake_cuda_sync_memops(CUdeviceptr ptr)
{
	pthread_mutex_lock(&lock);
	struct fake_allocation *a = find(ptr, 1);
	int value = a ? a->sync_memops : -1;
	pthread_mutex_unlock(&lock);
	return value;
}

/* The successful copies so far: 0 DtoH calls, 1 DtoH bytes, 2 HtoD calls, 3 HtoD bytes. */
unsigned long long fake_cuda_copies(int which)
{
	if (which < 0 || which > 3)
		return 0;
	pthread_mutex_lock(&lock);
	unsigned long long value = copies[which];
	pthread_mutex_unlock(&lock);
	return value;
}

/* At exit (exit() runs the destructors of loaded libraries): FAKE_CUDA_COPY_LOG's line. */
__attribute__((destructor)) static void log_copies(void)
{
	const char *path = getenv("FAKE_CUDA_COPY_LOG");
	if (!path || !*path)
		return;
	FILE *f = fopen(path, "a");
	if (!f)
		return;
	pthread_mutex_lock(&lock);
	fprintf(f,
		"fake-libcuda copies: pid %d dtoh_calls %llu dtoh_bytes %llu htod_calls %llu "
		"htod_bytes %llu\n",
		(int)getpid(), copies[0], copies[1], copies[2], copies[3]);
	pthread_mutex_unlock(&lock);
	fclose(f);
}

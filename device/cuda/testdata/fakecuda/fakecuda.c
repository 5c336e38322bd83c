// A fake libcuda.so.1 for the package tests on machines without a GPU. It
// implements the entry points package cuda resolves, with host memory behind
// them, and checks what a real driver checks: a current context where one is
// needed, the CUmemAllocationProp / CUmemAccessDesc fields, granularity
// multiples, capacity. Behaviour knobs come from the environment:
//   FAKECUDA_INIT_ERROR=N  cuInit returns N
//   FAKECUDA_DEVICES=N     number of devices (default 2)
//   FAKECUDA_NO_VMM=1      devices report no VMM support
// Device i has (i+1)*64 MiB of memory. Stream 0x77 never completes its work.
//
// Build: gcc -shared -fPIC -o libcuda.so.1 fakecuda.c

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long handle_t;

typedef struct {
	int type;
	int id;
} loc_t;
typedef struct {
	int type;
	int requestedHandleTypes;
	loc_t location;
	void *win32HandleMetaData;
	unsigned char compressionType, gpuDirectRDMACapable;
	unsigned short usage;
	unsigned char reserved[4];
} prop_t;
typedef struct {
	loc_t location;
	int flags;
} access_t;

enum {
	OK = 0,
	INVALID_VALUE = 1,
	OUT_OF_MEMORY = 2,
	NOT_INITIALIZED = 3,
	NO_DEVICE = 100,
	INVALID_DEVICE = 101,
	INVALID_CONTEXT = 201,
	NOT_READY = 600,
};

#define GRAN (2u << 20)
#define MAXDEV 8

struct ctx {
	int dev;
	int refs;
};

static struct ctx ctxs[MAXDEV];
static int ndev = 2, initialized, no_vmm;
static size_t used[MAXDEV];
static __thread struct ctx *current;

static size_t capacity(int dev) { return (size_t)(dev + 1) * (64u << 20); }

#define NEED_INIT() \
	if (!initialized) return NOT_INITIALIZED
#define NEED_CTX()                    \
	NEED_INIT();                        \
	if (current == NULL || current->refs == 0) return INVALID_CONTEXT

CUresult cuInit(unsigned int flags) {
	const char *e = getenv("FAKECUDA_INIT_ERROR");
	if (flags != 0) return INVALID_VALUE;
	if (e && *e) return atoi(e);
	e = getenv("FAKECUDA_DEVICES");
	if (e && *e) ndev = atoi(e);
	if (ndev > MAXDEV) ndev = MAXDEV;
	e = getenv("FAKECUDA_NO_VMM");
	no_vmm = e && *e == '1';
	initialized = 1;
	return OK;
}

CUresult cuDriverGetVersion(int *v) {
	*v = 12040;
	return OK;
}

CUresult cuGetErrorName(CUresult r, const char **s) {
	switch (r) {
	case OK: *s = "CUDA_SUCCESS"; return OK;
	case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
	case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
	case NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; return OK;
	case NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; return OK;
	case INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; return OK;
	case INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; return OK;
	case NOT_READY: *s = "CUDA_ERROR_NOT_READY"; return OK;
	}
	*s = NULL;
	return INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
	switch (r) {
	case OUT_OF_MEMORY: *s = "out of memory"; return OK;
	case NO_DEVICE: *s = "no CUDA-capable device is detected"; return OK;
	case INVALID_VALUE: *s = "invalid argument"; return OK;
	}
	*s = NULL;
	return INVALID_VALUE;
}

CUresult cuDeviceGetCount(int *n) {
	NEED_INIT();
	*n = ndev;
	return OK;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	NEED_INIT();
	if (ordinal < 0 || ordinal >= ndev) return INVALID_DEVICE;
	*d = ordinal;
	return OK;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= ndev) return INVALID_DEVICE;
	snprintf(name, len, "Fake GPU %d", d);
	return OK;
}

CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= ndev) return INVALID_DEVICE;
	*b = capacity(d);
	return OK;
}

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= ndev) return INVALID_DEVICE;
	if (attr != 102) return INVALID_VALUE;
	*v = !no_vmm;
	return OK;
}

CUresult cuDevicePrimaryCtxRetain(struct ctx **c, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= ndev) return INVALID_DEVICE;
	ctxs[d].dev = d;
	ctxs[d].refs++;
	*c = &ctxs[d];
	return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= ndev || ctxs[d].refs == 0) return INVALID_CONTEXT;
	ctxs[d].refs--;
	return OK;
}

CUresult cuCtxGetCurrent(struct ctx **c) {
	NEED_INIT();
	*c = current;
	return OK;
}

CUresult cuCtxSetCurrent(struct ctx *c) {
	NEED_INIT();
	current = c;
	return OK;
}

CUresult cuCtxSynchronize(void) {
	NEED_CTX();
	return OK;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
	NEED_CTX();
	*total = capacity(current->dev);
	*free = *total - used[current->dev];
	return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CTX();
	if (n == 0) return INVALID_VALUE;
	if (n > capacity(current->dev) - used[current->dev]) return OUT_OF_MEMORY;
	void *m = malloc(n + 16);
	if (!m) return OUT_OF_MEMORY;
	*(size_t *)m = n;
	used[current->dev] += n;
	*p = (CUdeviceptr)((char *)m + 16);
	return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	NEED_CTX();
	char *m = (char *)p - 16;
	used[current->dev] -= *(size_t *)m;
	free(m);
	return OK;
}

CUresult cuMemAllocHost_v2(void **p, size_t n) {
	NEED_CTX();
	*p = malloc(n);
	return *p ? OK : OUT_OF_MEMORY;
}

CUresult cuMemFreeHost(void *p) {
	NEED_CTX();
	free(p);
	return OK;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *stream) {
	(void)stream;
	NEED_CTX();
	memcpy(dst, (void *)src, n);
	return OK;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *stream) {
	(void)stream;
	NEED_CTX();
	memcpy((void *)dst, src, n);
	return OK;
}

CUresult cuStreamSynchronize(void *stream) {
	NEED_CTX();
	return (uintptr_t)stream == 0x77 ? INVALID_VALUE : OK;
}

struct event {
	int recorded_on_stuck;
};

CUresult cuEventCreate(struct event **e, unsigned int flags) {
	NEED_CTX();
	if (flags != 0x2) return INVALID_VALUE; // memscale always disables timing
	*e = calloc(1, sizeof(**e));
	return OK;
}

CUresult cuEventRecord(struct event *e, void *stream) {
	NEED_CTX();
	e->recorded_on_stuck = (uintptr_t)stream == 0x77;
	return OK;
}

CUresult cuEventQuery(struct event *e) {
	NEED_CTX();
	return e->recorded_on_stuck ? NOT_READY : OK;
}

CUresult cuEventSynchronize(struct event *e) {
	NEED_CTX();
	return e->recorded_on_stuck ? INVALID_VALUE : OK;
}

CUresult cuEventDestroy_v2(struct event *e) {
	NEED_CTX();
	free(e);
	return OK;
}

static int check_prop(const prop_t *p) {
	static const unsigned char zero[4];
	return p->type == 1 && p->requestedHandleTypes == 0 && p->location.type == 1 &&
	       p->location.id >= 0 && p->location.id < ndev && p->win32HandleMetaData == NULL &&
	       p->compressionType == 0 && p->gpuDirectRDMACapable == 0 && p->usage == 0 &&
	       memcmp(p->reserved, zero, 4) == 0;
}

CUresult cuMemGetAllocationGranularity(size_t *g, const prop_t *p, int option) {
	NEED_INIT();
	if (!check_prop(p) || (option != 0 && option != 1)) return INVALID_VALUE;
	*g = GRAN;
	return OK;
}

CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
	NEED_CTX();
	if (size == 0 || size % GRAN || addr != 0 || flags != 0 || (align && align % GRAN)) return INVALID_VALUE;
	char *raw = mmap(NULL, size + GRAN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (raw == MAP_FAILED) return OUT_OF_MEMORY;
	uintptr_t base = ((uintptr_t)raw + GRAN - 1) / GRAN * GRAN;
	*p = base; // the slack around it is leaked; fine for a test fake
	return OK;
}

CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
	NEED_CTX();
	return munmap((void *)p, size) == 0 ? OK : INVALID_VALUE;
}

struct phys {
	int fd;
	int dev;
	size_t size;
};

CUresult cuMemCreate(handle_t *h, size_t size, const prop_t *p, unsigned long long flags) {
	NEED_CTX();
	if (!check_prop(p) || flags != 0 || size == 0 || size % GRAN) return INVALID_VALUE;
	int dev = p->location.id;
	if (size > capacity(dev) - used[dev]) return OUT_OF_MEMORY;
	int fd = memfd_create("fakecuda", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, size) != 0) return OUT_OF_MEMORY;
	struct phys *ph = malloc(sizeof(*ph));
	ph->fd = fd;
	ph->dev = dev;
	ph->size = size;
	used[dev] += size;
	*h = (handle_t)(uintptr_t)ph;
	return OK;
}

CUresult cuMemRelease(handle_t h) {
	NEED_CTX();
	struct phys *ph = (struct phys *)(uintptr_t)h;
	used[ph->dev] -= ph->size;
	close(ph->fd);
	free(ph);
	return OK;
}

CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, handle_t h, unsigned long long flags) {
	NEED_CTX();
	struct phys *ph = (struct phys *)(uintptr_t)h;
	if (off != 0 || flags != 0 || size != ph->size || p % GRAN) return INVALID_VALUE;
	void *m = mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd, 0);
	return m == MAP_FAILED ? INVALID_VALUE : OK;
}

CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const access_t *d, size_t count) {
	NEED_CTX();
	if (count != 1 || d->location.type != 1 || d->location.id != current->dev || d->flags != 3) return INVALID_VALUE;
	return mprotect((void *)p, size, PROT_READ | PROT_WRITE) == 0 ? OK : INVALID_VALUE;
}

CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
	NEED_CTX();
	void *m = mmap((void *)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
	return m == MAP_FAILED ? INVALID_VALUE : OK;
}

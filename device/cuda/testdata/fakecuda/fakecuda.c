// A fake libcuda.so.1 for the package tests on machines without a GPU. It
// implements the entry points package cuda resolves, with host memory behind
// them, and checks what a real driver checks: a current context where one is
// needed, the CUmemAllocationProp / CUmemAccessDesc fields, granularity
// multiples, capacity. Behaviour knobs come from the environment:
//   FAKECUDA_INIT_ERROR=N  cuInit returns N
//   FAKECUDA_DEVICES=N     number of devices (default 2)
//   FAKECUDA_NO_VMM=1      devices report no VMM support
//   FAKECUDA_NO_PEER=1     no device can access another's memory (default: all can)
//   FAKECUDA_MEMORY=BYTES  every device has BYTES (default: device i has (i+1)*64 MiB)
//   FAKECUDA_COUNTS=PATH   write "name count" per counted entry point at exit and
//                          whenever the last primary context reference is released
//                          (a Go process exits without running destructors)
// Streams are checked as a real driver checks them: only 0, CU_STREAM_LEGACY (1),
// CU_STREAM_PER_THREAD (2), the stuck stream 0x77 (whose work never completes)
// and streams made by cuStreamCreate and not yet destroyed are accepted;
// anything else is CUDA_ERROR_INVALID_HANDLE. Mappings are tracked: cuMemMap
// refuses mapped addresses, cuMemSetAccess needs a wholly mapped range and
// access descriptors for the owning device or its peers, cuMemUnmap needs whole
// mappings (one or several adjacent ones).
//
// Build: gcc -shared -fPIC -o libcuda.so.1 fakecuda.c

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>
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
	INVALID_HANDLE = 400,
	NOT_READY = 600,
};

// Call counters, written to $FAKECUDA_COUNTS at exit.
enum {
	C_cuMemCreate,
	C_cuMemRelease,
	C_cuMemMap,
	C_cuMemUnmap,
	C_cuMemSetAccess,
	C_cuEventRecord,
	C_cuStreamCreate,
	C_cuStreamDestroy,
	C_cuMemcpyDtoHAsync,
	C_cuMemcpyHtoDAsync,
	C_cuStreamSynchronize,
	C_cuCtxSynchronize,
	C_invalid_handle,
	NCOUNT
};
static const char *count_names[NCOUNT] = {
	"cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuEventRecord",
	"cuStreamCreate", "cuStreamDestroy", "cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync",
	"cuStreamSynchronize", "cuCtxSynchronize", "invalid_handle",
};
static long counts[NCOUNT];
#define COUNT(c) __atomic_fetch_add(&counts[C_##c], 1, __ATOMIC_RELAXED)

__attribute__((destructor)) static void dump_counts(void) {
	const char *path = getenv("FAKECUDA_COUNTS");
	if (!path || !*path) return;
	FILE *f = fopen(path, "w");
	if (!f) return;
	for (int i = 0; i < NCOUNT; i++) fprintf(f, "%s %ld\n", count_names[i], counts[i]);
	fclose(f);
}

#define GRAN (2u << 20)
#define MAXDEV 8

struct ctx {
	int dev;
	int refs;
};

static struct ctx ctxs[MAXDEV];
static int ndev = 2, initialized, no_vmm, no_peer;
static size_t memory_override;
static size_t used[MAXDEV];
static __thread struct ctx *current;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static size_t capacity(int dev) { return memory_override ? memory_override : (size_t)(dev + 1) * (64u << 20); }

// Streams made by cuStreamCreate and not destroyed; stream_ok accepts them,
// the special handles, and nothing else.
struct stream {
	struct ctx *ctx;
	struct stream *next;
};
static struct stream *streams;
#define STUCK ((uintptr_t)0x77)

static int stream_ok(void *s) {
	uintptr_t v = (uintptr_t)s;
	if (v == 0 || v == 1 || v == 2 || v == STUCK) return 1;
	pthread_mutex_lock(&mu);
	int ok = 0;
	for (struct stream *p = streams; p; p = p->next) {
		if ((void *)p == s) ok = 1;
	}
	pthread_mutex_unlock(&mu);
	if (!ok) COUNT(invalid_handle);
	return ok;
}

#define NEED_STREAM(s) \
	if (!stream_ok(s)) return INVALID_HANDLE

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
	e = getenv("FAKECUDA_NO_PEER");
	no_peer = e && *e == '1';
	e = getenv("FAKECUDA_MEMORY");
	if (e && *e) memory_override = strtoull(e, NULL, 10);
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
	case INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; return OK;
	}
	*s = NULL;
	return INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
	switch (r) {
	case OUT_OF_MEMORY: *s = "out of memory"; return OK;
	case NO_DEVICE: *s = "no CUDA-capable device is detected"; return OK;
	case INVALID_VALUE: *s = "invalid argument"; return OK;
	case INVALID_HANDLE: *s = "invalid resource handle"; return OK;
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
	int refs = 0;
	for (int i = 0; i < ndev; i++) refs += ctxs[i].refs;
	if (refs == 0) dump_counts();
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

CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) {
	NEED_INIT();
	if (d < 0 || d >= ndev || peer < 0 || peer >= ndev) return INVALID_DEVICE;
	*can = !no_peer && d != peer;
	return OK;
}

CUresult cuCtxSynchronize(void) {
	NEED_CTX();
	COUNT(cuCtxSynchronize);
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
	NEED_CTX();
	NEED_STREAM(stream);
	COUNT(cuMemcpyDtoHAsync);
	memcpy(dst, (void *)src, n);
	return OK;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *stream) {
	NEED_CTX();
	NEED_STREAM(stream);
	COUNT(cuMemcpyHtoDAsync);
	memcpy((void *)dst, src, n);
	return OK;
}

CUresult cuStreamSynchronize(void *stream) {
	NEED_CTX();
	NEED_STREAM(stream);
	COUNT(cuStreamSynchronize);
	return (uintptr_t)stream == STUCK ? INVALID_VALUE : OK;
}

CUresult cuStreamCreate(void **s, unsigned int flags) {
	NEED_CTX();
	if (flags > 1) return INVALID_VALUE;
	struct stream *st = calloc(1, sizeof(*st));
	st->ctx = current;
	pthread_mutex_lock(&mu);
	st->next = streams;
	streams = st;
	pthread_mutex_unlock(&mu);
	COUNT(cuStreamCreate);
	*s = st;
	return OK;
}

CUresult cuStreamDestroy_v2(void *s) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	for (struct stream **p = &streams; *p; p = &(*p)->next) {
		if ((void *)*p == s) {
			struct stream *st = *p;
			*p = st->next;
			pthread_mutex_unlock(&mu);
			free(st);
			COUNT(cuStreamDestroy);
			return OK;
		}
	}
	pthread_mutex_unlock(&mu);
	COUNT(invalid_handle);
	return INVALID_HANDLE;
}

// cuStreamGetCtx: the special handles belong to the current context.
CUresult cuStreamGetCtx(void *s, struct ctx **c) {
	NEED_CTX();
	NEED_STREAM(s);
	uintptr_t v = (uintptr_t)s;
	*c = (v <= 2 || v == STUCK) ? current : ((struct stream *)s)->ctx;
	return OK;
}

struct event {
	int recorded_on_stuck;
	struct ctx *ctx;
};

CUresult cuEventCreate(struct event **e, unsigned int flags) {
	NEED_CTX();
	if (flags != 0x2) return INVALID_VALUE; // memscale always disables timing
	*e = calloc(1, sizeof(**e));
	(*e)->ctx = current;
	return OK;
}

CUresult cuEventRecord(struct event *e, void *stream) {
	NEED_CTX();
	NEED_STREAM(stream);
	COUNT(cuEventRecord);
	uintptr_t v = (uintptr_t)stream;
	if (v > 2 && v != STUCK && ((struct stream *)stream)->ctx != e->ctx) return INVALID_HANDLE; // another context's stream
	e->recorded_on_stuck = (uintptr_t)stream == STUCK;
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

// The mappings made by cuMemMap and not unmapped, kept sorted by address.
struct mapping {
	uintptr_t addr;
	size_t size;
	int dev;
};
static struct mapping *maps;
static size_t nmaps, capmaps;

// find_map returns the index of the first mapping ending after p.
static size_t find_map(uintptr_t p) {
	size_t lo = 0, hi = nmaps;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (maps[mid].addr + maps[mid].size <= p) lo = mid + 1;
		else hi = mid;
	}
	return lo;
}

// covered reports whether [p, p+size) is exactly a run of adjacent whole
// mappings (whole = 1) or lies inside adjacent mappings (whole = 0); *first
// and *count give the run. Called with mu held.
static int covered(uintptr_t p, size_t size, int whole, size_t *first, size_t *count) {
	size_t i = find_map(p);
	*first = i;
	uintptr_t at = p, end = p + size;
	if (i == nmaps || maps[i].addr > p || (whole && maps[i].addr != p)) return 0;
	while (at < end) {
		if (i == nmaps || maps[i].addr > at) return 0;
		at = maps[i].addr + maps[i].size;
		i++;
	}
	*count = i - *first;
	return !whole || at == end;
}

CUresult cuMemCreate(handle_t *h, size_t size, const prop_t *p, unsigned long long flags) {
	NEED_CTX();
	COUNT(cuMemCreate);
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
	COUNT(cuMemRelease);
	struct phys *ph = (struct phys *)(uintptr_t)h;
	used[ph->dev] -= ph->size;
	close(ph->fd);
	free(ph);
	return OK;
}

CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, handle_t h, unsigned long long flags) {
	NEED_CTX();
	COUNT(cuMemMap);
	struct phys *ph = (struct phys *)(uintptr_t)h;
	if (off != 0 || flags != 0 || size != ph->size || p % GRAN) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	size_t i = find_map(p);
	if (i < nmaps && maps[i].addr < p + size) {
		pthread_mutex_unlock(&mu);
		return INVALID_VALUE; // already mapped
	}
	void *m = mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd, 0);
	if (m == MAP_FAILED) {
		pthread_mutex_unlock(&mu);
		return INVALID_VALUE;
	}
	if (nmaps == capmaps) {
		capmaps = capmaps ? 2 * capmaps : 64;
		maps = realloc(maps, capmaps * sizeof(*maps));
	}
	memmove(&maps[i + 1], &maps[i], (nmaps - i) * sizeof(*maps));
	maps[i] = (struct mapping){(uintptr_t)p, size, ph->dev};
	nmaps++;
	pthread_mutex_unlock(&mu);
	return OK;
}

// cuMemSetAccess: the range must be mapped, every descriptor must name the
// memory's device or a device that can access it as a peer.
CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const access_t *d, size_t count) {
	NEED_CTX();
	COUNT(cuMemSetAccess);
	if (count == 0 || size == 0 || p % GRAN || size % GRAN) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	size_t first, n;
	int ok = covered(p, size, 0, &first, &n);
	int dev = ok ? maps[first].dev : -1;
	pthread_mutex_unlock(&mu);
	if (!ok) return INVALID_VALUE;
	for (size_t i = 0; i < count; i++) {
		int id = d[i].location.id;
		if (d[i].location.type != 1 || d[i].flags != 3 || id < 0 || id >= ndev) return INVALID_VALUE;
		if (id != dev && no_peer) return INVALID_DEVICE;
	}
	return mprotect((void *)p, size, PROT_READ | PROT_WRITE) == 0 ? OK : INVALID_VALUE;
}

CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
	NEED_CTX();
	COUNT(cuMemUnmap);
	pthread_mutex_lock(&mu);
	size_t first, n;
	if (size == 0 || !covered(p, size, 1, &first, &n)) {
		pthread_mutex_unlock(&mu);
		return INVALID_VALUE; // not a run of whole mappings
	}
	memmove(&maps[first], &maps[first + n], (nmaps - first - n) * sizeof(*maps));
	nmaps -= n;
	pthread_mutex_unlock(&mu);
	void *m = mmap((void *)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
	return m == MAP_FAILED ? INVALID_VALUE : OK;
}

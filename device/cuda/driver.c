// Run-time binding to the CUDA driver: see driver.h.
//
// Every wrapper that needs a context takes the device's primary context, makes
// it current on the calling thread when it is not (one cheap cuCtxGetCurrent
// when it already is), performs the call, and puts the thread's previous
// context back, so the caller's (PyTorch's) notion of the current device is
// never changed behind its back. A Go goroutine can move between threads only
// between cgo calls, so doing all of this inside one C call is what makes it
// correct.

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "driver.h"

// The driver entry points. Filled once by ms_load, read-only afterwards.
static struct {
	CUresult (*cuInit)(unsigned int);
	CUresult (*cuDriverGetVersion)(int *);
	CUresult (*cuGetErrorName)(CUresult, const char **);
	CUresult (*cuGetErrorString)(CUresult, const char **);
	CUresult (*cuDeviceGetCount)(int *);
	CUresult (*cuDeviceGet)(CUdevice *, int);
	CUresult (*cuDeviceGetName)(char *, int, CUdevice);
	CUresult (*cuDeviceTotalMem_v2)(size_t *, CUdevice);
	CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice);
	CUresult (*cuCtxGetCurrent)(CUcontext *);
	CUresult (*cuCtxSetCurrent)(CUcontext);
	CUresult (*cuCtxSynchronize)(void);
	CUresult (*cuMemGetInfo_v2)(size_t *, size_t *);
	CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
	CUresult (*cuMemFree_v2)(CUdeviceptr);
	CUresult (*cuMemAllocHost_v2)(void **, size_t);
	CUresult (*cuMemFreeHost)(void *);
	CUresult (*cuMemcpyDtoHAsync_v2)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemcpyHtoDAsync_v2)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*cuStreamSynchronize)(CUstream);
	CUresult (*cuEventCreate)(CUevent *, unsigned int);
	CUresult (*cuEventRecord)(CUevent, CUstream);
	CUresult (*cuEventQuery)(CUevent);
	CUresult (*cuEventSynchronize)(CUevent);
	CUresult (*cuEventDestroy_v2)(CUevent);
	// Optional: peer access, stream ownership, stream creation.
	CUresult (*cuDeviceCanAccessPeer)(int *, CUdevice, CUdevice);
	CUresult (*cuStreamGetCtx)(CUstream, CUcontext *);
	CUresult (*cuStreamCreate)(CUstream *, unsigned int);
	CUresult (*cuStreamDestroy_v2)(CUstream);
	// Virtual memory management (CUDA 10.2+); optional.
	CUresult (*cuMemGetAllocationGranularity)(size_t *, const ms_CUmemAllocationProp *, int);
	CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
	CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const ms_CUmemAllocationProp *, unsigned long long);
	CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
	CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const ms_CUmemAccessDesc *, size_t);
	CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
} api;

static int have_vmm;

// The declared layouts must match cuda.h on 64-bit Linux.
_Static_assert(sizeof(ms_CUmemAllocationProp) == 32, "CUmemAllocationProp layout");
_Static_assert(sizeof(ms_CUmemAccessDesc) == 12, "CUmemAccessDesc layout");
_Static_assert(sizeof(CUdeviceptr) == 8, "CUdeviceptr is 64-bit");
_Static_assert(offsetof(ms_CUmemAllocationProp, location) == 8, "CUmemAllocationProp.location");
_Static_assert(offsetof(ms_CUmemAllocationProp, win32HandleMetaData) == 16, "CUmemAllocationProp.win32HandleMetaData");
_Static_assert(offsetof(ms_CUmemAllocationProp, allocFlags) == 24, "CUmemAllocationProp.allocFlags");
_Static_assert(offsetof(ms_CUmemAccessDesc, flags) == 8, "CUmemAccessDesc.flags");

#define SYM(name, required) {#name, (void **)&api.name, required}

int ms_load(char *err, size_t errlen) {
	struct {
		const char *name;
		void **slot;
		int required; // 0 optional, 1 required, 2 VMM
	} syms[] = {
		SYM(cuInit, 1),
		SYM(cuDriverGetVersion, 1),
		SYM(cuGetErrorName, 0),
		SYM(cuGetErrorString, 0),
		SYM(cuDeviceGetCount, 1),
		SYM(cuDeviceGet, 1),
		SYM(cuDeviceGetName, 1),
		SYM(cuDeviceTotalMem_v2, 1),
		SYM(cuDeviceGetAttribute, 1),
		SYM(cuDevicePrimaryCtxRetain, 1),
		SYM(cuDevicePrimaryCtxRelease_v2, 1),
		SYM(cuCtxGetCurrent, 1),
		SYM(cuCtxSetCurrent, 1),
		SYM(cuCtxSynchronize, 1),
		SYM(cuMemGetInfo_v2, 1),
		SYM(cuMemAlloc_v2, 1),
		SYM(cuMemFree_v2, 1),
		SYM(cuMemAllocHost_v2, 1),
		SYM(cuMemFreeHost, 1),
		SYM(cuMemcpyDtoHAsync_v2, 1),
		SYM(cuMemcpyHtoDAsync_v2, 1),
		SYM(cuStreamSynchronize, 1),
		SYM(cuEventCreate, 1),
		SYM(cuEventRecord, 1),
		SYM(cuEventQuery, 1),
		SYM(cuEventSynchronize, 1),
		SYM(cuEventDestroy_v2, 1),
		SYM(cuDeviceCanAccessPeer, 0),
		SYM(cuStreamGetCtx, 0),
		SYM(cuStreamCreate, 0),
		SYM(cuStreamDestroy_v2, 0),
		SYM(cuMemGetAllocationGranularity, 2),
		SYM(cuMemAddressReserve, 2),
		SYM(cuMemAddressFree, 2),
		SYM(cuMemCreate, 2),
		SYM(cuMemRelease, 2),
		SYM(cuMemMap, 2),
		SYM(cuMemSetAccess, 2),
		SYM(cuMemUnmap, 2),
	};
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "dlopen libcuda.so.1: %s", e ? e : "unknown error");
		return -1;
	}
	int vmm = 1;
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		*syms[i].slot = dlsym(lib, syms[i].name);
		if (*syms[i].slot != NULL) {
			continue;
		}
		if (syms[i].required == 1) {
			snprintf(err, errlen, "libcuda.so.1 has no symbol %s (driver too old?)", syms[i].name);
			return -1; // the library stays loaded; it is never unloaded anyway
		}
		if (syms[i].required == 2) {
			vmm = 0;
		}
	}
	have_vmm = vmm;
	return 0;
}

int ms_vmm(void) { return have_vmm; }

const char *ms_error_name(CUresult r) {
	const char *s = NULL;
	if (api.cuGetErrorName == NULL || api.cuGetErrorName(r, &s) != 0) {
		return NULL;
	}
	return s;
}

const char *ms_error_string(CUresult r) {
	const char *s = NULL;
	if (api.cuGetErrorString == NULL || api.cuGetErrorString(r, &s) != 0) {
		return NULL;
	}
	return s;
}

static const ms_res ok = {0, NULL};

#define CALL(fn, ...)                                                                   \
	do {                                                                                  \
		CUresult r_ = api.fn(__VA_ARGS__);                                                  \
		if (r_ != 0) {                                                                      \
			res = (ms_res){r_, #fn};                                                          \
			goto out;                                                                         \
		}                                                                                   \
	} while (0)

// ENTER makes ctx current on this thread, remembering the previous context in
// prev_; LEAVE restores it. Between them, failed calls jump to out.
#define ENTER(ctx)                                                                      \
	ms_res res = ok;                                                                      \
	CUcontext prev_ = NULL;                                                               \
	int swapped_ = 0;                                                                     \
	do {                                                                                  \
		CUresult r_ = api.cuCtxGetCurrent(&prev_);                                          \
		if (r_ != 0) {                                                                      \
			return (ms_res){r_, "cuCtxGetCurrent"};                                           \
		}                                                                                   \
		if (prev_ != (ctx)) {                                                               \
			r_ = api.cuCtxSetCurrent(ctx);                                                    \
			if (r_ != 0) {                                                                    \
				return (ms_res){r_, "cuCtxSetCurrent"};                                         \
			}                                                                                 \
			swapped_ = 1;                                                                     \
		}                                                                                   \
	} while (0)

#define LEAVE                                                                           \
	out:                                                                                  \
	if (swapped_) {                                                                       \
		CUresult r_ = api.cuCtxSetCurrent(prev_);                                           \
		if (r_ != 0 && res.r == 0) {                                                        \
			res = (ms_res){r_, "cuCtxSetCurrent (restoring the previous context)"};           \
		}                                                                                   \
	}                                                                                     \
	return res

ms_res ms_init(void) {
	CUresult r = api.cuInit(0);
	return r ? (ms_res){r, "cuInit"} : ok;
}

ms_res ms_ctx_get(uintptr_t *ctx) {
	CUcontext c = NULL;
	CUresult r = api.cuCtxGetCurrent(&c);
	*ctx = (uintptr_t)c;
	return r ? (ms_res){r, "cuCtxGetCurrent"} : ok;
}

ms_res ms_ctx_set(uintptr_t ctx) {
	CUresult r = api.cuCtxSetCurrent((CUcontext)ctx);
	return r ? (ms_res){r, "cuCtxSetCurrent"} : ok;
}

ms_res ms_driver_version(int *v) {
	CUresult r = api.cuDriverGetVersion(v);
	return r ? (ms_res){r, "cuDriverGetVersion"} : ok;
}

ms_res ms_device_count(int *n) {
	CUresult r = api.cuDeviceGetCount(n);
	return r ? (ms_res){r, "cuDeviceGetCount"} : ok;
}

ms_res ms_device_get(int ordinal, CUdevice *dev) {
	CUresult r = api.cuDeviceGet(dev, ordinal);
	return r ? (ms_res){r, "cuDeviceGet"} : ok;
}

ms_res ms_retain(CUdevice dev, CUcontext *ctx) {
	CUresult r = api.cuDevicePrimaryCtxRetain(ctx, dev);
	return r ? (ms_res){r, "cuDevicePrimaryCtxRetain"} : ok;
}

ms_res ms_release(CUdevice dev) {
	CUresult r = api.cuDevicePrimaryCtxRelease_v2(dev);
	return r ? (ms_res){r, "cuDevicePrimaryCtxRelease_v2"} : ok;
}

static ms_CUmemAllocationProp device_prop(int ordinal) {
	ms_CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = MS_CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = MS_CU_MEM_HANDLE_TYPE_NONE;
	prop.location.type = MS_CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = ordinal;
	return prop;
}

ms_res ms_device_props(CUcontext ctx, CUdevice dev, int ordinal, char *name, int namelen,
                       size_t *total, int *vmm, size_t *granularity) {
	ENTER(ctx);
	CALL(cuDeviceGetName, name, namelen, dev);
	CALL(cuDeviceTotalMem_v2, total, dev);
	*vmm = 0;
	*granularity = 0;
	if (have_vmm) {
		CALL(cuDeviceGetAttribute, vmm, MS_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
		if (*vmm) {
			ms_CUmemAllocationProp prop = device_prop(ordinal);
			CALL(cuMemGetAllocationGranularity, granularity, &prop, MS_CU_MEM_ALLOC_GRANULARITY_MINIMUM);
		}
	}
	LEAVE;
}

ms_res ms_mem_info(CUcontext ctx, size_t *free, size_t *total) {
	ENTER(ctx);
	CALL(cuMemGetInfo_v2, free, total);
	LEAVE;
}

ms_res ms_reserve(CUcontext ctx, size_t size, size_t align, CUdeviceptr *p) {
	ENTER(ctx);
	CALL(cuMemAddressReserve, p, size, align, 0, 0);
	LEAVE;
}

ms_res ms_address_free(CUcontext ctx, CUdeviceptr p, size_t size) {
	ENTER(ctx);
	CALL(cuMemAddressFree, p, size);
	LEAVE;
}

ms_res ms_create(CUcontext ctx, int ordinal, size_t size, CUmemGenericAllocationHandle *h) {
	ENTER(ctx);
	ms_CUmemAllocationProp prop = device_prop(ordinal);
	CALL(cuMemCreate, h, size, &prop, 0);
	LEAVE;
}

ms_res ms_release_physical(CUcontext ctx, CUmemGenericAllocationHandle h) {
	ENTER(ctx);
	CALL(cuMemRelease, h);
	LEAVE;
}

ms_res ms_map_range(CUcontext ctx, int ordinal, CUdeviceptr p, size_t each, const CUmemGenericAllocationHandle *hs,
                    size_t n, const int *peers, int npeers, int *peers_dropped) {
	ENTER(ctx);
	*peers_dropped = 0;
	size_t mapped = 0;
	for (; mapped < n; mapped++) {
		CUresult r = api.cuMemMap(p + mapped * each, each, 0, hs[mapped], 0);
		if (r != 0) {
			res = (ms_res){r, "cuMemMap"};
			break;
		}
	}
	if (res.r == 0) {
		ms_CUmemAccessDesc desc[16];
		int nd = 1 + (npeers < 15 ? npeers : 15);
		memset(desc, 0, sizeof(desc));
		for (int i = 0; i < nd; i++) {
			desc[i].location.type = MS_CU_MEM_LOCATION_TYPE_DEVICE;
			desc[i].location.id = i == 0 ? ordinal : peers[i - 1];
			desc[i].flags = MS_CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		}
		CUresult r = api.cuMemSetAccess(p, n * each, desc, (size_t)nd);
		if (r != 0 && nd > 1) {
			r = api.cuMemSetAccess(p, n * each, desc, 1);
			*peers_dropped = r == 0;
		}
		if (r != 0) {
			res = (ms_res){r, "cuMemSetAccess"};
		}
	}
	if (res.r != 0 && mapped > 0) {
		api.cuMemUnmap(p, mapped * each); // undo; report the first error
	}
	goto out;
	LEAVE;
}

ms_res ms_can_access_peer(CUdevice dev, CUdevice peer, int *can) {
	*can = 0;
	if (api.cuDeviceCanAccessPeer == NULL) {
		return ok;
	}
	CUresult r = api.cuDeviceCanAccessPeer(can, dev, peer);
	return r ? (ms_res){r, "cuDeviceCanAccessPeer"} : ok;
}

ms_res ms_stream_ctx(CUcontext ctx, uintptr_t stream, int *same) {
	*same = 1;
	if (stream <= 2 || api.cuStreamGetCtx == NULL) {
		return ok;
	}
	ENTER(ctx);
	CUcontext sc = NULL;
	CALL(cuStreamGetCtx, (CUstream)stream, &sc);
	*same = sc == ctx;
	LEAVE;
}

ms_res ms_stream_create(CUcontext ctx, uintptr_t *stream) {
	if (api.cuStreamCreate == NULL) {
		return (ms_res){MS_CUDA_ERROR_NOT_FOUND, "cuStreamCreate (not in this driver)"};
	}
	ENTER(ctx);
	CUstream s = NULL;
	CALL(cuStreamCreate, &s, 1); // CU_STREAM_NON_BLOCKING
	*stream = (uintptr_t)s;
	LEAVE;
}

ms_res ms_stream_destroy(CUcontext ctx, uintptr_t stream) {
	if (api.cuStreamDestroy_v2 == NULL) {
		return (ms_res){MS_CUDA_ERROR_NOT_FOUND, "cuStreamDestroy_v2 (not in this driver)"};
	}
	ENTER(ctx);
	CALL(cuStreamDestroy_v2, (CUstream)stream);
	LEAVE;
}

ms_res ms_unmap(CUcontext ctx, CUdeviceptr p, size_t size) {
	ENTER(ctx);
	CALL(cuMemUnmap, p, size);
	LEAVE;
}

ms_res ms_alloc(CUcontext ctx, size_t size, CUdeviceptr *p) {
	ENTER(ctx);
	CALL(cuMemAlloc_v2, p, size);
	LEAVE;
}

ms_res ms_free(CUcontext ctx, CUdeviceptr p) {
	ENTER(ctx);
	CALL(cuMemFree_v2, p);
	LEAVE;
}

ms_res ms_event_create(CUcontext ctx, uintptr_t *e) {
	ENTER(ctx);
	CUevent ev = NULL;
	CALL(cuEventCreate, &ev, MS_CU_EVENT_DISABLE_TIMING);
	*e = (uintptr_t)ev;
	LEAVE;
}

ms_res ms_event_record(CUcontext ctx, uintptr_t e, uintptr_t stream) {
	ENTER(ctx);
	CALL(cuEventRecord, (CUevent)e, (CUstream)stream);
	LEAVE;
}

ms_res ms_event_query(CUcontext ctx, uintptr_t e, int *done) {
	ENTER(ctx);
	CUresult r = api.cuEventQuery((CUevent)e);
	*done = r == 0;
	if (r != 0 && r != MS_CUDA_ERROR_NOT_READY) {
		res = (ms_res){r, "cuEventQuery"};
	}
	goto out;
	LEAVE;
}

ms_res ms_event_sync(CUcontext ctx, uintptr_t e) {
	ENTER(ctx);
	CALL(cuEventSynchronize, (CUevent)e);
	LEAVE;
}

ms_res ms_event_destroy(CUcontext ctx, uintptr_t e) {
	ENTER(ctx);
	CALL(cuEventDestroy_v2, (CUevent)e);
	LEAVE;
}

ms_res ms_synchronize(CUcontext ctx) {
	ENTER(ctx);
	CALL(cuCtxSynchronize);
	LEAVE;
}

ms_res ms_alloc_host(CUcontext ctx, size_t size, uintptr_t *p) {
	ENTER(ctx);
	void *hp = NULL;
	CALL(cuMemAllocHost_v2, &hp, size);
	*p = (uintptr_t)hp;
	LEAVE;
}

ms_res ms_free_host(CUcontext ctx, uintptr_t p) {
	ENTER(ctx);
	CALL(cuMemFreeHost, (void *)p);
	LEAVE;
}

ms_res ms_copy_dtoh(CUcontext ctx, uintptr_t dst, CUdeviceptr src, size_t n, uintptr_t stream) {
	ENTER(ctx);
	CALL(cuMemcpyDtoHAsync_v2, (void *)dst, src, n, (CUstream)stream);
	CALL(cuStreamSynchronize, (CUstream)stream);
	LEAVE;
}

ms_res ms_copy_htod(CUcontext ctx, CUdeviceptr dst, uintptr_t src, size_t n, uintptr_t stream) {
	ENTER(ctx);
	CALL(cuMemcpyHtoDAsync_v2, dst, (const void *)src, n, (CUstream)stream);
	CALL(cuStreamSynchronize, (CUstream)stream);
	LEAVE;
}

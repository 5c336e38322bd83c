// The slice of the CUDA driver API memscale uses, declared here so that no CUDA
// header or library is needed at build time. The driver is loaded at run time
// with dlopen("libcuda.so.1") and its symbols resolved with dlsym; nothing here
// leaves an undefined symbol in the final binary except dlopen/dlsym/dlerror.
//
// Layouts follow cuda.h (CUDA 10.2 and later; unchanged through CUDA 13).

#ifndef MEMSCALE_CUDA_DRIVER_H
#define MEMSCALE_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

enum {
	MS_CUDA_SUCCESS = 0,
	MS_CUDA_ERROR_OUT_OF_MEMORY = 2,
	MS_CUDA_ERROR_NOT_FOUND = 500,
	MS_CUDA_ERROR_NOT_READY = 600,
};

// CUmemAllocationType, CUmemLocationType, CUmemAllocationHandleType,
// CUmemAccess_flags, CUmemAllocationGranularity_flags, CUdevice_attribute values.
enum {
	MS_CU_MEM_ALLOCATION_TYPE_PINNED = 0x1,
	MS_CU_MEM_HANDLE_TYPE_NONE = 0x0,
	MS_CU_MEM_LOCATION_TYPE_DEVICE = 0x1,
	MS_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3,
	MS_CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
	MS_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1,
	MS_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
	MS_CU_EVENT_DISABLE_TIMING = 0x2,
};

// CUmemLocation.
typedef struct {
	int type; // CUmemLocationType
	int id;
} ms_CUmemLocation;

// CUmemAllocationProp.
typedef struct {
	int type;                 // CUmemAllocationType
	int requestedHandleTypes; // CUmemAllocationHandleType
	ms_CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} ms_CUmemAllocationProp;

// CUmemAccessDesc.
typedef struct {
	ms_CUmemLocation location;
	int flags; // CUmemAccess_flags
} ms_CUmemAccessDesc;

// ms_res is the outcome of a wrapper: r is the CUresult of the call named by
// call (a static string), r == 0 on success.
typedef struct {
	CUresult r;
	const char *call;
} ms_res;

// ms_load dlopens the driver and resolves the symbols. It returns 0, or -1
// with a message in err (errlen bytes).
int ms_load(char *err, size_t errlen);
// ms_vmm reports whether all VMM entry points were found.
int ms_vmm(void);
// ms_error_name / ms_error_string describe r, or return NULL.
const char *ms_error_name(CUresult r);
const char *ms_error_string(CUresult r);

ms_res ms_init(void);
// ms_ctx_get / ms_ctx_set read and set the calling thread's current context
// (used by tests to check that wrappers restore it).
ms_res ms_ctx_get(uintptr_t *ctx);
ms_res ms_ctx_set(uintptr_t ctx);
ms_res ms_driver_version(int *v);
ms_res ms_device_count(int *n);
ms_res ms_device_get(int ordinal, CUdevice *dev);
ms_res ms_retain(CUdevice dev, CUcontext *ctx);
ms_res ms_release(CUdevice dev);
ms_res ms_device_props(CUcontext ctx, CUdevice dev, int ordinal, char *name, int namelen,
                       size_t *total, int *vmm, size_t *granularity);
ms_res ms_mem_info(CUcontext ctx, size_t *free, size_t *total);

ms_res ms_reserve(CUcontext ctx, size_t size, size_t align, CUdeviceptr *p);
ms_res ms_address_free(CUcontext ctx, CUdeviceptr p, size_t size);
ms_res ms_create(CUcontext ctx, int ordinal, size_t size, CUmemGenericAllocationHandle *h);
ms_res ms_release_physical(CUcontext ctx, CUmemGenericAllocationHandle h);
// ms_map_range maps the n handles hs, each of size each, one after another
// from p, then grants access to the whole range with one cuMemSetAccess: to
// ordinal and to the npeers devices in peers. If access with the peers is
// refused it is set for ordinal alone and *peers_dropped is set to 1. On
// failure nothing stays mapped.
ms_res ms_map_range(CUcontext ctx, int ordinal, CUdeviceptr p, size_t each, const CUmemGenericAllocationHandle *hs,
                    size_t n, const int *peers, int npeers, int *peers_dropped);
// ms_can_access_peer sets *can to whether device dev can access peer's
// memory (0 when the driver lacks cuDeviceCanAccessPeer).
ms_res ms_can_access_peer(CUdevice dev, CUdevice peer, int *can);
// ms_stream_ctx sets *same to 1 when stream belongs to ctx (the special
// handles 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD always do; without
// cuStreamGetCtx every stream is assumed to).
ms_res ms_stream_ctx(CUcontext ctx, uintptr_t stream, int *same);
// ms_stream_create / ms_stream_destroy make and destroy a non-blocking
// stream in ctx (tests, and the GPU smoke check).
ms_res ms_stream_create(CUcontext ctx, uintptr_t *stream);
ms_res ms_stream_destroy(CUcontext ctx, uintptr_t stream);
ms_res ms_unmap(CUcontext ctx, CUdeviceptr p, size_t size);

ms_res ms_alloc(CUcontext ctx, size_t size, CUdeviceptr *p);
ms_res ms_free(CUcontext ctx, CUdeviceptr p);

ms_res ms_event_create(CUcontext ctx, uintptr_t *e);
ms_res ms_event_record(CUcontext ctx, uintptr_t e, uintptr_t stream);
ms_res ms_event_query(CUcontext ctx, uintptr_t e, int *done);
ms_res ms_event_sync(CUcontext ctx, uintptr_t e);
ms_res ms_event_destroy(CUcontext ctx, uintptr_t e);
ms_res ms_synchronize(CUcontext ctx);

ms_res ms_alloc_host(CUcontext ctx, size_t size, uintptr_t *p);
ms_res ms_free_host(CUcontext ctx, uintptr_t p);
ms_res ms_copy_dtoh(CUcontext ctx, uintptr_t dst, CUdeviceptr src, size_t n, uintptr_t stream);
ms_res ms_copy_htod(CUcontext ctx, CUdeviceptr dst, uintptr_t src, size_t n, uintptr_t stream);

#endif

// throwing.cpp - memscale_malloc_or_throw: memscale_malloc for C++ callers
// that do not check for NULL (PyTorch's CUDAPluggableAllocator).
//
// cgo compiles this file with g++ as part of package main, and go build then
// links the library with g++, so libmemscale.so needs libstdc++ and libgcc_s
// (tests/c/check_so.sh allows their versioned symbols). The exception is
// thrown here, after memscale_malloc (the public C wrapper, so the fork guard
// applies) has returned: no Go frame is ever on the stack it unwinds.

#include <cstdio>
#include <stdexcept>
#include <string>

#include "memscale.h"

namespace memscale {

// OutOfMemoryError is thrown by memscale_malloc_or_throw when memscale_malloc
// returns NULL; what() is "memscale: out of memory: " + memscale_last_error().
// Its type information is hidden (not part of the library's ABI): callers
// catch std::runtime_error.
class __attribute__((visibility("hidden"))) OutOfMemoryError : public std::runtime_error {
public:
	explicit OutOfMemoryError(const std::string& why) : std::runtime_error("memscale: out of memory: " + why) {}
};

// GraphCaptureError is thrown by memscale_begin_allocate_to_pool.
class __attribute__((visibility("hidden"))) GraphCaptureError : public std::runtime_error {
public:
	explicit GraphCaptureError(const char* what) : std::runtime_error(what) {}
};

} // namespace memscale

extern "C" void* memscale_malloc_or_throw(ssize_t size, int device, cudaStream_t stream) {
	void* p = memscale_malloc(size, device, stream);
	if (p == nullptr) {
		throw memscale::OutOfMemoryError(memscale_last_error());
	}
	return p;
}

extern "C" void memscale_begin_allocate_to_pool(int device, unsigned long long pool_id_first,
                                                unsigned long long pool_id_second, const void* filter) {
	(void)filter;
	// snprintf, not std::to_string: its inline instantiations would be exported.
	char what[640];
	std::snprintf(what, sizeof what,
	              "memscale: CUDA graph capture is not supported under the memscale allocator (device %d, pool (%llu, "
	              "%llu)): it has no private memory pools, so memory freed inside a graph would be reused while the "
	              "graph still uses it. Run without CUDA graphs: torch.compile(mode=\"default\") or "
	              "mode=\"max-autotune-no-cudagraphs\" instead of \"reduce-overhead\", no torch.cuda.graph / "
	              "make_graphed_callables / torch.cuda.MemPool; or run without memscale",
	              device, pool_id_first, pool_id_second);
	throw memscale::GraphCaptureError(what);
}

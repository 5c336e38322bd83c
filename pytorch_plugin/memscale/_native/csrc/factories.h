// Factory operators (no tensor argument: zeros, randn, arange, empty...)
// inside a region reach the region's kernel.
//
// A factory op has no tensor to take the region's key from, and its
// BackendSelect kernel redispatches to the backend its TensorOptions name
// with a key set of that backend alone: the thread-local include set, which
// brings every other op of an entry to the region, is not consulted there.
// Their results used to stay plain, pinned externals the engine could never
// evict (a batch drawn with torch.randn inside the step; the Python region's
// dispatch mode sees them). Each such aten operator gets a BackendSelect
// kernel of the region's that, while a region is entered on the thread and
// the op makes a dense CPU or CUDA tensor, redispatches with the region's key
// added, so the op is recorded like any other (re-run to rebuild; seeded ones
// with their generator state); everywhere else - no entry, the region's own
// calls on real tensors, meta, sparse or quantized results - it calls the
// BackendSelect kernel it replaced, unchanged. Empty tensors (uninitialized
// buffers the program writes) stay plain, as do the few factories whose
// result is no function of their arguments (factories.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace memscale {

// Whether `op` is a factory the region takes: an aten operator with no tensor
// argument, a `device` argument and a BackendSelect kernel.
bool region_takes_factory(const c10::OperatorHandle& op);

// The BackendSelect kernel for such an op, which calls `original` (the
// kernel it replaces) outside an entry.
c10::KernelFunction factory_kernel(c10::SafeKernelFunction original);

}  // namespace memscale

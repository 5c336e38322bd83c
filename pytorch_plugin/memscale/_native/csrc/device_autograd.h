// Autograd on the wrappers as on plain tensors of their device, for the ops
// whose autograd differs by device.
//
// An operator with a CompositeImplicitAutograd kernel and a kernel of its own
// for some backends (torch 2.15: `_fused_rms_norm` has a CUDA kernel only,
// `native_channel_shuffle` a CPU one) decomposes above autograd on the other
// backends and runs its own kernel, under its autograd formula, on those. The
// region's kernel on the op's PrivateUse2 key (kernels.h) is a kernel of its
// own for the wrappers' backend: their autograd key, AutogradPrivateUse2,
// would run the autograd formula on every device - on the CPU it records
// `_fused_rms_norm_backward`, which has no CPU kernel. Such ops get a second
// kernel, on AutogradPrivateUse2, that runs what the dispatcher computed for
// the autograd key of the device the wrappers' data is on: the decomposition
// where plain tensors decompose (its ops reach the region one by one), the
// autograd kernel where they do not (it reaches the region's kernel below
// autograd). Ops whose autograd is the same on the CPU and CUDA (silu_backward
// has kernels for both) keep the ordinary Autograd kernel on the wrappers.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace memscale {

// Whether `op`'s autograd on plain tensors differs between the CPU and CUDA:
// a CompositeImplicitAutograd kernel beside a kernel of its own for one of them.
bool autograd_differs_by_device(const c10::OperatorHandle& op);

// The kernel for such an op's AutogradPrivateUse2 key.
c10::KernelFunction device_autograd_kernel();

}  // namespace memscale

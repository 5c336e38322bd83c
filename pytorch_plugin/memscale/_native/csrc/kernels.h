// The region's kernel and its registration on the region key.
//
// One boxed function (region_kernel) serves every operator but the most called
// ones, which get an unboxed entry to the same logic (unboxed.h). It is registered
// per operator, not only as a backend fallback: a fallback is shadowed by the
// CompositeExplicitAutograd kernels many ops have (add.Tensor, mm,
// mul.Scalar), which cover every backend key, PrivateUse2 included. Ops with
// a CompositeImplicitAutograd kernel and no CPU or CUDA kernel of their own
// are skipped: they decompose above autograd into ops that reach the region
// one by one (a kernel of ours would take precedence over the decomposition
// and leave autograd without a formula). Ops with both (silu_backward) get
// ours, so they run their own kernels as they do on plain tensors (the
// decomposition differs in the last bits). The fallback still catches ops with no kernel of any kind for the
// key. Operators defined after the first registration (a library imported
// later, a torch.library custom op) are seen by a registration listener and
// registered at the next region entry (refresh_kernels). Two kinds of op get
// a second kernel: factories, on BackendSelect (factories.h), and ops whose
// autograd differs between the CPU and CUDA, on AutogradPrivateUse2
// (device_autograd.h).
#pragma once

#include <string>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace memscale {

class BorrowedArgs;

// The region's logic for one call: the active session's dispatch, or the op
// run as outside any region. `borrowed` names the stack's borrowed tensors
// (an unboxed entry's call, unboxed.h), or is null.
void region_call(const c10::OperatorHandle& op, torch::jit::Stack* stack, BorrowedArgs* borrowed);

// Registers the kernel on every operator (once per process). Returns "" on
// success, else why the native region cannot be used (the key is taken).
std::string install_kernels();

// Registers operators defined since the last call (cheap when there are none).
void refresh_kernels();

// How many operators carry the region's kernel.
size_t registered_kernels();

// How many of them through an unboxed entry (unboxed.h).
size_t unboxed_kernels();

}  // namespace memscale

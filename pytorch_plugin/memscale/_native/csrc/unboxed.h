// Unboxed entries of the region's kernel for the operators programs call
// most (unboxed.cpp lists them).
//
// The region's kernel is boxed (kernels.h): PyTorch boxes the arguments of
// every call that reaches it, copying each tensor into the stack. A copy of a
// tensor Python owns takes the GIL (borrowed.h says why), which the Python
// bindings released around the op: two GIL round trips per tensor argument.
// An unboxed entry receives the arguments by reference, boxes them itself with
// the tensors borrowed (no reference taken) and hands the stack to the same
// region logic, which replaces the borrowed inputs by their real tensors
// before anything copies an argument. Everything else is the boxed kernel's:
// the entry is a faster door to it, not a second implementation. An operator
// not listed keeps the boxed kernel; a listed one whose signature this torch
// spells differently is skipped at registration (the boxed kernel again).
#pragma once

#include <string>

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/dispatch/CppSignature.h>
#include <c10/util/Optional.h>

namespace memscale {

// An unboxed entry for the operator "name.overload" (overload "" for the
// default), or none when it is not one of the listed operators.
struct UnboxedKernel {
  c10::KernelFunction kernel;
  c10::impl::CppSignature signature;
};
c10::optional<UnboxedKernel> unboxed_kernel(const std::string& name, const std::string& overload);

}  // namespace memscale

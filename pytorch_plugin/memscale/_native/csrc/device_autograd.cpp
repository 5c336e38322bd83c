#include "device_autograd.h"

#include <optional>

#include <ATen/core/stack.h>
#include <c10/core/TensorOptions.h>

#include "arg_tensors.h"
#include "wrapper.h"

namespace memscale {

namespace {

// The device of the op's data: the first wrapper's among the arguments (a
// plain argument may be a CPU scalar beside CUDA wrappers), else the first
// defined tensor's.
std::optional<c10::Device> data_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t n = op.schema().arguments().size();
  std::optional<c10::Device> wrapper, first;
  for (auto it = stack.end() - static_cast<std::ptrdiff_t>(n); it != stack.end() && !wrapper; ++it) {
    for_tensors(*it, [&](const at::Tensor& t, int) {
      if (!t.defined() || wrapper) return;
      if (wrapper_of(t) != nullptr) wrapper = t.device();
      if (!first) first = t.device();
    });
  }
  return wrapper ? wrapper : first;
}

void device_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const std::optional<c10::Device> device = data_device(op, *stack);
  TORCH_CHECK(device.has_value(), "memscale: ", op.schema().name(),
              " reached the region's autograd kernel with no tensor argument; report this as a memscale bug");
  const c10::DispatchKey dense = c10::computeDispatchKey(std::nullopt, c10::kStrided, *device);
  const c10::DispatchKey autograd = c10::getAutogradKeyFromBackend(c10::toBackendComponent(dense));
  // What plain tensors on that device get: the decomposition or the autograd
  // kernel, as the dispatcher computed it for their autograd key. Called with
  // the wrappers' key set, so what it dispatches below autograd reaches the
  // region's kernel.
  op.getComputedKernelForDispatchKey(autograd).callBoxed(op, ks, stack);
}

}  // namespace

bool autograd_differs_by_device(const c10::OperatorHandle& op) {
  using c10::DispatchKey;
  // Plain tensors of a backend with a kernel of the op's own (or under a
  // CompositeExplicitAutograd one, which covers every backend) run the
  // autograd kernel, as the wrappers do; the others decompose. The devices
  // the region runs on are the CPU's and CUDA's.
  if (!op.hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd) ||
      op.hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) ||
      op.hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutogradNonFunctional)) {
    return false;
  }
  return op.hasKernelForDispatchKey(DispatchKey::CPU) != op.hasKernelForDispatchKey(DispatchKey::CUDA);
}

c10::KernelFunction device_autograd_kernel() { return c10::KernelFunction::makeFromBoxedFunction<&device_autograd>(); }

}  // namespace memscale

#include "factories.h"

#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/stack.h>
#include <c10/core/TensorOptions.h>

#include "dispatch_key.h"
#include "op_facts.h"

namespace memscale {

namespace {

// A factory's TensorOptions arguments: where each sits among the arguments.
struct OptionArgs {
  int dtype = -1;
  int layout = -1;
  int device = -1;
};

OptionArgs option_args(const c10::FunctionSchema& schema) {
  OptionArgs at;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& name = args[i].name();
    if (name == "dtype") at.dtype = static_cast<int>(i);
    if (name == "layout") at.layout = static_cast<int>(i);
    if (name == "device") at.device = static_cast<int>(i);
  }
  return at;
}

template <class T>
std::optional<T> optional_arg(const c10::IValue* args, int pos) {
  if (pos < 0 || args[pos].isNone()) return std::nullopt;
  return args[pos].to<T>();
}

class FactoryKernel final : public c10::OperatorKernel {
 public:
  FactoryKernel(c10::SafeKernelFunction original, OptionArgs at) : original_(std::move(original)), at_(at) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    if (region_included()) {
      const c10::IValue* args = stack->data() + (stack->size() - op.schema().arguments().size());
      const c10::DispatchKey dense =
          c10::computeDispatchKey(optional_arg<c10::ScalarType>(args, at_.dtype),
                                  optional_arg<c10::Layout>(args, at_.layout), optional_arg<c10::Device>(args, at_.device));
      if (dense == c10::DispatchKey::CPU || dense == c10::DispatchKey::CUDA) {
        // The backend's key and the region's: the region's backend bit is the
        // higher, so the region's kernel runs, and runs the op on that backend.
        op.redispatchBoxed(c10::DispatchKeySet(dense) | c10::DispatchKeySet(kRegionKey), stack);
        return;
      }
    }
    original_.callBoxed(op, ks, stack);
  }

 private:
  c10::SafeKernelFunction original_;
  OptionArgs at_;
};

}  // namespace

bool region_takes_factory(const c10::OperatorHandle& op) {
  constexpr std::string_view kAten = "aten::";
  // Factories whose result is no function of their arguments - uninitialized
  // memory (an empty tensor is a buffer the program writes, often through an
  // out= op that resizes it, which the region does not follow for its own
  // tensors), a cuDNN dropout state, a tensor of the ZeroTensor kind, a
  // file's contents, a dependency token - stay plain, as before.
  constexpr std::string_view kLeftPlain[] = {
      "aten::empty",
      "aten::empty_strided",
      "aten::empty_permuted",
      "aten::_cudnn_init_dropout_state",
      "aten::_efficientzerotensor",
      "aten::from_file",
      "aten::_make_dep_token",
  };
  const c10::FunctionSchema& schema = op.schema();
  if (schema.name().rfind(kAten, 0) != 0) return false;
  for (std::string_view plain : kLeftPlain) {
    if (schema.name() == plain) return false;
  }
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::BackendSelect)) return false;
  bool device = false;
  for (const c10::Argument& a : schema.arguments()) {
    if (is_tensor_type(a.type())) return false;
    if (a.name() == "device") device = true;
  }
  return device;
}

c10::KernelFunction factory_kernel(c10::SafeKernelFunction original) {
  // The options' positions are the op's: read from the schema the original
  // kernel's handle names.
  OptionArgs at = option_args(original.opHandle().schema());
  return c10::KernelFunction::makeFromBoxedFunctor(std::make_unique<FactoryKernel>(std::move(original), at));
}

}  // namespace memscale

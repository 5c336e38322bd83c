#include "kernels.h"

#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/op_registration.h>

#include <c10/core/InferenceMode.h>

#include "borrowed.h"
#include "device_autograd.h"
#include "dispatch_key.h"
#include "errors.h"
#include "factories.h"
#include "session.h"
#include "unboxed.h"

namespace memscale {

void region_call(const c10::OperatorHandle& op, torch::jit::Stack* stack, BorrowedArgs* borrowed) {
  Session* s = active_session();
  // Under torch.inference_mode ops run as outside the region: a wrapper made
  // there is an inference tensor, which autograd's view tracking refuses for
  // views of normal tensors ("Cannot set version_counter for inference
  // tensor"); plain results are what inference code gets without memscale.
  if (s != nullptr && !s->suspended.load(std::memory_order_relaxed) && !c10::InferenceMode::is_enabled()) {
    s->dispatch(op, stack, borrowed);
  } else {
    if (borrowed != nullptr) borrowed->own();
    run_outside(op, stack);
  }
}

namespace {

void region_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  region_call(op, stack, nullptr);
}

// A sparse tensor reaching an op inside the region (the key in the include
// set) selects the region backend's sparse keys, which have no kernels: the
// op is refused with memscale's error naming the layout, as on the Python
// region, instead of the dispatcher's "could not run" error.
void refuse_sparse(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  for (const c10::IValue& v : *stack) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().layout() != at::kStrided) {
      refuse_layout(v.toTensor().layout(), op.schema().name());
    }
  }
  // The sparse tensor is in a list: its layout is named "non-strided".
  refuse_layout(c10::Layout::NumOptions, op.schema().name());
}

constexpr const char* kDebug = "memscale native DTR region (pytorch_plugin/memscale/_native/csrc/kernels.cpp)";

class Registry {
 public:
  std::string install() {
    std::lock_guard<std::mutex> guard(mu_);
    if (installed_) return "";
    auto& d = c10::Dispatcher::singleton();
    if (d.hasBackendFallbackForDispatchKey(kRegionKey)) {
      return "another library registered a fallback on the PrivateUse2 dispatch key";
    }
    fallback_.push_back(d.registerFallback(kRegionKey, c10::KernelFunction::makeFromBoxedFunction<&region_kernel>(),
                                           kDebug));
    for (c10::DispatchKey sparse : {c10::DispatchKey::Sparse, c10::DispatchKey::SparseCsr}) {
      const c10::DispatchKey key = c10::toRuntimePerBackendFunctionalityKey(sparse, kRegionBackend);
      if (d.hasBackendFallbackForDispatchKey(key)) continue;  // someone else's: leave it
      fallback_.push_back(
          d.registerFallback(key, c10::KernelFunction::makeFromBoxedFunction<&refuse_sparse>(), kDebug));
    }
    listener_.push_back(d.addRegistrationListener(std::make_unique<Listener>(this)));
    installed_ = true;
    register_pending();
    return "";
  }

  void refresh() {
    std::lock_guard<std::mutex> guard(mu_);
    register_pending();
  }

  size_t count() {
    std::lock_guard<std::mutex> guard(mu_);
    return done_.size();
  }

  size_t unboxed() {
    std::lock_guard<std::mutex> guard(mu_);
    return unboxed_;
  }

 private:
  class Listener : public c10::OpRegistrationListener {
   public:
    explicit Listener(Registry* r) : r_(r) {}
    void onOperatorRegistered(const c10::OperatorHandle& op) override {
      std::lock_guard<std::mutex> guard(r_->pending_mu_);
      r_->pending_.push_back(op.operator_name());
    }
    void onOperatorDeregistered(const c10::OperatorHandle&) override {}

   private:
    Registry* r_;
  };

  void register_pending() {
    std::vector<c10::OperatorName> names;
    {
      std::lock_guard<std::mutex> guard(pending_mu_);
      names.swap(pending_);
    }
    auto& d = c10::Dispatcher::singleton();
    for (const auto& name : names) {
      std::string key = name.name + "." + name.overload_name;
      if (done_.count(key)) continue;
      auto op = d.findOp(name);
      if (!op.has_value() || !op->hasSchema()) continue;
      // An op that decomposes for every backend (no kernel of its own for
      // the CPU or CUDA) decomposes above the region too; one with kernels
      // of its own (silu_backward) runs them, as on plain tensors.
      if (op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
          !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) && !op->hasKernelForDispatchKey(c10::DispatchKey::CUDA)) {
        continue;
      }
      if (op->hasKernelForDispatchKey(kRegionKey)) continue;  // someone else's: leave it
      // The most called operators get an unboxed entry (unboxed.h); one
      // whose signature this torch spells differently keeps the boxed kernel.
      bool unboxed = false;
      constexpr std::string_view kAten = "aten::";
      auto entry = name.name.rfind(kAten, 0) == 0 ? unboxed_kernel(name.name.substr(kAten.size()), name.overload_name)
                                                  : c10::nullopt;
      if (entry) {
        try {
          handles_.push_back(d.registerImpl(name, kRegionKey, std::move(entry->kernel), entry->signature, nullptr, kDebug));
          unboxed = true;
          unboxed_++;
        } catch (const c10::Error&) {
          // Another kernel fixed a different C++ signature for it: boxed below.
        }
      }
      if (!unboxed) {
        handles_.push_back(d.registerImpl(name, kRegionKey, c10::KernelFunction::makeFromBoxedFunction<&region_kernel>(),
                                          std::nullopt, nullptr, kDebug));
      }
      // Factory ops reach the region from their BackendSelect kernel (factories.h).
      if (region_takes_factory(*op)) {
        c10::SafeKernelFunction original = op->getComputedKernelForDispatchKey(c10::DispatchKey::BackendSelect);
        handles_.push_back(d.registerImpl(name, c10::DispatchKey::BackendSelect, factory_kernel(std::move(original)),
                                          std::nullopt, nullptr, kDebug));
      }
      // Autograd as plain tensors of the wrappers' device get it (device_autograd.h).
      if (autograd_differs_by_device(*op) && !op->hasKernelForDispatchKey(kRegionAutogradKey)) {
        handles_.push_back(
            d.registerImpl(name, kRegionAutogradKey, device_autograd_kernel(), std::nullopt, nullptr, kDebug));
      }
      done_.insert(std::move(key));
    }
  }

  std::mutex mu_;
  bool installed_ = false;
  std::vector<c10::RegistrationHandleRAII> fallback_;
  std::vector<c10::RegistrationHandleRAII> listener_;
  std::vector<c10::RegistrationHandleRAII> handles_;
  std::unordered_set<std::string> done_;
  size_t unboxed_ = 0;
  std::mutex pending_mu_;
  std::vector<c10::OperatorName> pending_;
};

Registry& registry() {
  // Never destroyed: registrations must outlive every tensor of the process.
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

std::string install_kernels() { return registry().install(); }
void refresh_kernels() { registry().refresh(); }
size_t registered_kernels() { return registry().count(); }
size_t unboxed_kernels() { return registry().unboxed(); }

}  // namespace memscale

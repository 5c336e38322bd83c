// The dispatch key of the native region, and the thread-local switches around it.
//
// Region tensors (DTRTensorImpl) carry the PrivateUse2 backend: the runtime
// key of dense tensors on that backend is DispatchKey::PrivateUse2, and the
// autograd key they get is AutogradPrivateUse2, which runs the ordinary
// Autograd kernels. While a region is entered, the same key is in the
// thread-local *include* set, so ops on plain tensors (parameters, inputs)
// reach the region's kernel too, as a TorchDispatchMode would, but in C++.
// The include set travels to autograd's worker threads with the rest of the
// thread-local state (at::ThreadLocalState).
//
// Why PrivateUse2: it is the one backend key PyTorch reserves for out-of-tree
// use that real accelerator backends do not take (they register as
// PrivateUse1); c10/core/DispatchKey.h says the PrivateUse keys are not meant
// for libraries, so registration checks that nothing else registered on it
// (kernels.cpp) and the Python path is used when something did.
//
// Turning the key off for the region's own calls needs the raw bits:
// DispatchKeySet::remove(PrivateUse2) clears the Dense functionality bit but
// keeps the PrivateUse2 backend bit, and that bit alone still makes every
// dense op pick the PrivateUse2 kernel (the highest backend bit wins).
#pragma once

#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace memscale {

constexpr c10::DispatchKey kRegionKey = c10::DispatchKey::PrivateUse2;
constexpr c10::BackendComponent kRegionBackend = c10::BackendComponent::PrivateUse2Bit;
// The autograd key of region tensors.
constexpr c10::DispatchKey kRegionAutogradKey = c10::DispatchKey::AutogradPrivateUse2;

// The raw bits of the region key (Dense functionality + PrivateUse2 backend).
inline uint64_t region_bits() { return c10::DispatchKeySet(kRegionKey).raw_repr(); }

// Whether the region key is in this thread's include set (an entry is open
// on the thread and this is not one of the region's own calls on real tensors).
inline bool region_included() {
  const uint64_t raw = c10::impl::tls_local_dispatch_key_set().included_.raw_repr();
  return (raw & region_bits()) == region_bits();
}

// Sets or clears the region key in this thread's include set; returns whether it was on.
inline bool set_region_included(bool on) {
  auto local = c10::impl::tls_local_dispatch_key_set();
  uint64_t raw = local.included_.raw_repr();
  bool was = (raw & region_bits()) == region_bits();
  uint64_t next = on ? (raw | region_bits()) : (raw & ~region_bits());
  if (next != raw) {
    local.included_ = c10::DispatchKeySet(c10::DispatchKeySet::RAW, next);
    c10::impl::_force_tls_local_dispatch_key_set(local);
  }
  return was;
}

// For the region's own kernel calls on real tensors: the region key off and
// everything at or above ADInplaceOrView skipped (autograd already ran on
// the wrappers), restored when it goes out of scope.
class KernelGuard {
 public:
  KernelGuard() : saved_(c10::impl::tls_local_dispatch_key_set()) {
    auto local = saved_;
    local.included_ = c10::DispatchKeySet(c10::DispatchKeySet::RAW, local.included_.raw_repr() & ~region_bits());
    local.excluded_ = local.excluded_ | c10::autograd_dispatch_keyset_with_ADInplaceOrView;
    c10::impl::_force_tls_local_dispatch_key_set(local);
  }
  ~KernelGuard() { c10::impl::_force_tls_local_dispatch_key_set(saved_); }
  KernelGuard(const KernelGuard&) = delete;
  KernelGuard& operator=(const KernelGuard&) = delete;

 private:
  c10::impl::LocalDispatchKeySet saved_;
};

}  // namespace memscale

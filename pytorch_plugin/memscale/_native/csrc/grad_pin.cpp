// Gradients pinned once accumulated: the process-wide record of hooked leaves
// and the session's pin (grad_pin.h).
#include "grad_pin.h"

#include <algorithm>
#include <iterator>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "session.h"
#include "session_util.h"
#include "wrapper.h"

namespace memscale {

namespace {

// The leaves handed to the hooker, by TensorImpl. The weak reference keeps
// the address from being reused by another tensor while it is recorded; the
// dead ones are pruned as the table doubles.
struct HookedLeaves {
  std::mutex mu;
  LeafHooker hooker;
  std::unordered_map<const c10::TensorImpl*, WeakImpl> leaves;
  size_t prune_at = 1024;

  void prune() {
    for (auto it = leaves.begin(); it != leaves.end();) {
      it = it->second.expired() ? leaves.erase(it) : std::next(it);
    }
    prune_at = std::max<size_t>(1024, 2 * leaves.size());
  }
};

HookedLeaves& hooked() {
  static auto* table = new HookedLeaves();  // never destroyed: hooks may run at the interpreter's exit
  return *table;
}

}  // namespace

void set_leaf_hooker(LeafHooker hooker) {
  HookedLeaves& h = hooked();
  std::lock_guard<std::mutex> guard(h.mu);
  h.hooker = std::move(hooker);
}

bool needs_hook(const at::Tensor& leaf) {
  HookedLeaves& h = hooked();
  std::lock_guard<std::mutex> guard(h.mu);
  return h.hooker && h.leaves.find(leaf.unsafeGetTensorImpl()) == h.leaves.end();
}

void hook_leaves(std::vector<at::Tensor> leaves) {
  LeafHooker hooker;
  {
    HookedLeaves& h = hooked();
    std::lock_guard<std::mutex> guard(h.mu);
    if (!h.hooker) return;
    hooker = h.hooker;
    // Only the first hand-over of each leaf (another session may have hooked it meanwhile).
    auto fresh = std::remove_if(leaves.begin(), leaves.end(), [&](const at::Tensor& leaf) {
      return !h.leaves.emplace(leaf.unsafeGetTensorImpl(), WeakImpl(leaf.getIntrusivePtr())).second;
    });
    leaves.erase(fresh, leaves.end());
    if (h.leaves.size() >= h.prune_at) h.prune();
  }
  if (!leaves.empty()) hooker(leaves);
}

void pin_accumulated(const at::Tensor& leaf) {
  if (!leaf.defined()) return;
  DTRTensorImpl* w = wrapper_of(leaf.grad());
  if (w == nullptr) return;
  CellPtr cell = w->cell();
  Session* s = cell->session.load();
  if (s != nullptr) s->pin_gradient(cell);
}

// ------------------------------------------------------------ Session members

void Session::pin_gradient(const CellPtr& cell) {
  std::lock_guard<std::recursive_mutex> guard(mu_);
  if (closed_ || cell->grad_pinned || cell->released || cell->session.load() != this) return;
  Busy busy(*this);
  {
    // Resident first (rebuilt if evicted), locked until pinned.
    Held held(*this);
    rebuild(cell, held);
    if (engine().pin(h_, cell->id) < 0) fail("memscale_dtr_pin");
  }
  cell->grad_pinned = true;
  counters_.gradients_pinned++;
  after_op();
}

void Session::note_leaves(size_t first) {
  for (size_t i = first; i < leaves_.size(); ++i) {
    ImplPtr impl = leaves_[i].lock();
    if (!impl) continue;
    at::Tensor leaf(std::move(impl));
    if (needs_hook(leaf)) to_hook_.push_back(std::move(leaf));
  }
}

}  // namespace memscale

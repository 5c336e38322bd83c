// Session members: the exit - room for everything that escapes, its rebuild,
// the parameters' gradients made plain, every cell detached.
#include "session.h"

#include <unordered_set>

#include "session_util.h"
#include "wrapper.h"

namespace memscale {

// --------------------------------------------------------------------- close

void Session::room_to_leave(const std::vector<CellPtr>& escaping, Held& held) {
  // Under a budget: room for every escaping storage at once, before any is
  // rebuilt - the resident ones locked, the others' bytes requested - so a
  // rebuild of one never evicts another that leaves, and a budget below what
  // leaves the step fails here, naming that bound (the Python session's
  // _room_to_leave).
  if (!budgeted_ || status_->budget <= 0) return;
  std::unordered_set<int64_t> seen;
  int64_t missing = 0;
  for (const CellPtr& c : escaping) {
    if (!seen.insert(c->root).second) continue;
    if (derive(c)) {
      held.lock(c->id);
    } else if (const Group* g = groups_.find(c->root); g != nullptr && !g->resident()) {
      missing += g->nbytes;
    }
  }
  if (missing > 0) make_room(missing, "what leaves the step");
}

std::vector<std::pair<at::Tensor, at::Tensor>> Session::close(bool ok) {
  std::lock_guard<std::recursive_mutex> guard(mu_);
  Busy busy(*this);
  std::vector<std::pair<at::Tensor, at::Tensor>> handed;
  if (closed_) return handed;
  try {
    take_releases();
    if (ok) {
      send_releases();
      if (engine().finish(h_) < 0) fail("memscale_dtr_finish");
      std::vector<CellPtr> escaping;
      groups_.for_each([&](int64_t, Group& g) {
        for (const CellPtr& c : g.cells) {
          if (!c->released && c->wrappers.load() > 0) escaping.push_back(c);
        }
      });
      // Everything that leaves stays locked until all of it is resident (the
      // engine lets usage exceed the budget after finish, but still evicts
      // what is unlocked to stay within it).
      Held held(*this);
      room_to_leave(escaping, held);
      for (const CellPtr& c : escaping) rebuild(c, held);
      // Gradients of the parameters seen: plain tensors again.
      for (auto& weak : leaves_) {
        ImplPtr impl = weak.lock();
        if (!impl) continue;
        at::Tensor param(std::move(impl));
        const at::Tensor& grad = param.grad();
        if (DTRTensorImpl* w = wrapper_of(grad)) {
          at::Tensor real = w->cell()->tensor;
          if (real.defined()) param.mutable_grad() = real;
        }
      }
      send_releases();
    }
  } catch (...) {
    closed_ = true;
    groups_.for_each([](int64_t, Group& g) {
      for (const CellPtr& c : g.cells) c->session.store(nullptr);
    });
    throw;
  }
  closed_ = true;
  groups_.for_each([&](int64_t, Group& g) {
    for (const CellPtr& c : g.cells) {
      c->session.store(nullptr, std::memory_order_release);
      if (c->wrappers.load() > 0 && !c->released) {
        derive(c);
        if (ok && c->tensor.defined() && c->wrapper.has_value()) {
          ImplPtr impl = c->wrapper->lock();
          if (impl && !impl->requires_grad()) handed.emplace_back(at::Tensor(std::move(impl)), c->tensor);
        }
      } else {
        c->tensor.reset();
      }
      // Detached from the session, a wrapper holds what its cell keeps - the
      // real tensor's storage, which no engine evicts any more - or nothing.
      share_storage(*c, c->tensor.defined() ? c->tensor.storage() : c10::Storage());
      c->wrapper.reset();
      c->others.clear();
    }
  });
  groups_.clear();
  ops_.clear();
  externals_.clear();
  external_roots_.clear();
  leaves_.clear();
  graph_seen_.clear();
  to_hook_.clear();  // not handed over (an op failed): the next entry notes them again
  {
    std::lock_guard<std::mutex> g(release_mu_);
    released_.clear();
  }
  return handed;
}

}  // namespace memscale

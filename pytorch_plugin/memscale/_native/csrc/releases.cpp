// Session members: what leaves the device - releases (wrappers that died,
// exposure locks, externals no longer referenced, sent to the engine) and
// evictions (the engine's victims carried out: dropped, or copied to host
// memory first; room made under the budget).
#include "session.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "dispatch_key.h"
#include "errors.h"
#include "session_util.h"
#include "wrapper.h"

namespace memscale {

namespace {

constexpr int32_t kEvictBatch = 256;  // victims per memscale_dtr_evict call

}  // namespace

// ---------------------------------------------------------------- releases

void Session::queue_release(const CellPtr& cell) {
  // Without a budget the data goes the moment the last wrapper does, as a
  // plain tensor's would: freed before the next op allocates, CPU allocators
  // such as glibc's give the heap's top back and fault it in again (a 3 MiB
  // output re-faulted per op). Only when no op of this session is under way
  // on any thread: inside one the release waits for its end.
  {
    std::unique_lock<std::recursive_mutex> lock(mu_, std::try_to_lock);
    if (lock.owns_lock() && busy_ == 0 && !closed_ && !budgeted_) {
      release(cell);
      return;
    }
  }
  std::lock_guard<std::mutex> guard(release_mu_);
  released_.push_back(cell);
  any_released_.store(true, std::memory_order_release);
}

void Session::expose(const CellPtr& cell) {
  std::lock_guard<std::recursive_mutex> guard(mu_);
  // Inside an op of this session (this thread) wrappers are the session's to
  // read: an access there is no pointer handed to the program.
  if (closed_ || busy_ > 0 || cell->exposed || cell->released || cell->session.load() != this) return;
  Busy busy(*this);
  {
    Held held(*this);
    rebuild(cell, held);
  }
  if (engine().lock(h_, cell->id) < 0) fail("memscale_dtr_lock");
  cell->exposed = true;
  counters_.exposed++;
  after_op();
}

void Session::unexpose(const CellPtr& cell) {
  if (!cell->exposed) return;
  cell->exposed = false;
  if (engine().unlock(h_, cell->id) < 0) fail("memscale_dtr_unlock");
}

void Session::move_exposure(const CellPtr& old, const CellPtr& fresh) {
  if (!old->exposed) return;
  // Raw pointers into the storage stay valid: the new version keeps it locked.
  unexpose(old);
  if (engine().lock(h_, fresh->id) < 0) fail("memscale_dtr_lock");
  fresh->exposed = true;
}

void Session::release(const CellPtr& cell) {
  if (cell->released || cell->session.load() != this || cell->wrappers.load() > 0) return;
  unexpose(cell);
  cell->released = true;
  // No wrapper names it any more: the dead ones' memory goes now, not at the
  // exit (a cell's weak reference keeps a dead TensorImpl allocated).
  cell->wrapper.reset();
  cell->others.clear();
  release_ids_.push_back(cell->id);
  Group* g = groups_.find(cell->root);
  if (g == nullptr) return;
  if (--g->live > 0) return;
  if (!budgeted_) {
    drop(*g);  // the engine frees it anyway: drop the data now
  } else if (g->resident()) {
    dead_bytes_ += g->nbytes;  // the engine decides (it may keep it for a rebuild): see dispatch
  }
}

void Session::take_releases() {
  if (!any_released_.load(std::memory_order_acquire)) return;
  std::vector<CellPtr> batch;
  {
    std::lock_guard<std::mutex> guard(release_mu_);
    any_released_.store(false, std::memory_order_relaxed);
    if (released_.empty()) return;
    batch.swap(released_);
  }
  for (const CellPtr& cell : batch) release(cell);
}

void Session::send_releases() {
  if (release_ids_.empty()) return;
  if (batch_ops_ > 0) flush();  // before the frame is written: flush uses it too
  size_t n = release_ids_.size();
  size_t words = 6 + n;
  if (frame_.size() < std::max<size_t>(words, 1 + 2 * kHandOut)) frame_.resize(std::max<size_t>(words, 2 * kHandOut + 1) * 2);
  int64_t* w = frame_.data();
  w[0] = static_cast<int64_t>(n);
  w[1] = -1;
  w[2] = 0;
  w[3] = 0;
  w[4] = 0;
  w[5] = 0;
  std::memcpy(w + 6, release_ids_.data(), n * sizeof(int64_t));
  release_ids_.clear();
  dead_bytes_ = 0;
  if (abi_.op(h_, nullptr, w) < 0) fail("memscale_dtr_op (releases)");
}

void Session::release_expired_externals() {
  for (auto it = externals_.begin(); it != externals_.end();) {
    if (it->second.weak.expired()) {
      const CellPtr& cell = it->second.cell;
      if (!cell->released && cell->wrappers.load() == 0) {
        unexpose(cell);
        cell->released = true;
        release_ids_.push_back(cell->id);
        Group* g = groups_.find(cell->root);
        if (g != nullptr && --g->live <= 0) {
          external_roots_.erase(g->storage.unsafeGetStorageImpl());
        }
      }
      it = externals_.erase(it);
    } else {
      ++it;
    }
  }
}

// --------------------------------------------------------------- evictions

void Session::drop(Group& g) {
  g.storage = c10::Storage();
  for (const CellPtr& c : g.cells) c->tensor.reset();
  share(g);  // the wrappers let go too: nothing keeps the evicted storage alive
}

void Session::share(Group& g) {
  for (const CellPtr& c : g.cells) share_storage(*c, g.storage);
}

const c10::Storage& Session::storage_of(const CellPtr& cell) const {
  static const c10::Storage none;
  const Group* g = groups_.find(cell->root);
  return g != nullptr ? g->storage : none;
}

void Session::carry_out(int64_t root, int32_t action) {
  Group* found = groups_.find(root);
  TORCH_CHECK(found != nullptr, "memscale.dtr: the engine evicted unknown storage ", root);
  Group& g = *found;
  // Already dropped (a released storage, freed at its release without a
  // budget, that the engine now banishes): its wrappers hold nothing already.
  if (!g.resident()) return;
  if (action == kActionSwap) {
    const c10::Device device = g.cells.front()->device;
    at::Tensor bytes = bytes_of(g.storage, device);
    KernelGuard guard;
    g.host = bytes.to(at::kCPU);
  }
  drop(g);
}

void Session::evict(int64_t extra, const std::string& why) {
  send_releases();
  int64_t ids[kEvictBatch];
  int32_t actions[kEvictBatch];
  while (true) {
    // The engine makes room beyond its own count: for `extra` and for what
    // this op allocated that it has not heard of yet.
    int32_t n = engine().evict(h_, extra + unregistered_, ids, actions, kEvictBatch);
    if (n < 0) fail("memscale_dtr_evict" + (why.empty() ? std::string() : " " + why));
    if (n == 0) return;
    for (int32_t i = 0; i < n; ++i) carry_out(ids[i], actions[i]);
  }
}

void Session::make_room(int64_t extra, const std::string& what) {
  if (usage_now() + extra <= status_->budget) return;
  const std::string why = "making room for " + std::to_string(extra) + " bytes of " + what;
  try {
    evict(extra, why);
  } catch (const NoRoomError&) {
    if (!park_outer_levels(extra)) throw;
    evict(extra, why);
  }
}

void Session::after_op() {
  if (status_->pending >= drain_at_ || (budgeted_ && usage_now() > status_->budget)) evict(0, "");
}

}  // namespace memscale

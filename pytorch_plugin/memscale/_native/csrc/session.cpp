#include "session.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string_view>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/view_as_real.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <c10/util/hash.h>

#include "dispatch_key.h"
#include "errors.h"
#include "graph_leaves.h"
#include "output_sizes.h"
#include "wrapper.h"

namespace memscale {

namespace {

std::atomic<Session*> g_active{nullptr};

constexpr int32_t kHandOut = 64;      // storages memscale_dtr_op hands back per call
constexpr int32_t kEvictBatch = 256;  // victims per memscale_dtr_evict call
constexpr int64_t kBatchOps = 64;     // registrations queued per memscale_dtr_ops crossing (no budget)
constexpr int kMaxPlansPerCell = 64;
constexpr int kNestedRestarts = 4;  // times the outermost rebuild starts over (see Session::rebuild)
constexpr int64_t kScanExternalsEvery = 1024;

// Calls `fn(tensor, elem)` for every tensor of an argument (a tensor, a list
// of tensors, a list of optional tensors); elem is -1 for a lone tensor.
template <typename Fn>
void for_tensors(const c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) {
    fn(v.toTensor(), -1);
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    for (size_t i = 0; i < list.size(); ++i) fn(list.get(i), static_cast<int>(i));
  } else if (v.isList()) {
    auto list = v.toListRef();
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].isTensor()) fn(list[i].toTensor(), static_cast<int>(i));
    }
  }
}

// Sets element `elem` (-1: the whole value) of argument `v` to `t`; lists are
// copied first, so the caller's list objects are never changed.
void set_tensor(c10::IValue& v, int elem, const at::Tensor& t) {
  if (elem < 0) {
    v = t;
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    list.set(elem, t);
  } else {
    auto list = v.toList();
    list.set(elem, t);
  }
}

// A copy of a list argument that can be changed without touching the original.
void own_lists(c10::IValue& v) {
  if (v.isTensorList()) {
    v = v.toTensorList().copy();
  } else if (v.isList()) {
    v = v.toList().copy();
  }
}

c10::DispatchKeySet plain_keys(const c10::Device& device, caffe2::TypeMeta dtype) {
  return c10::DispatchKeySet(c10::computeDispatchKey(c10::typeMetaToScalarType(dtype), at::kStrided, device));
}

}  // namespace

// The bytes of a whole storage, as a uint8 tensor.
at::Tensor bytes_of(const c10::Storage& storage, const c10::Device& device) {
  Cell bytes(0, 0, 0);
  bytes.dtype = caffe2::TypeMeta::Make<uint8_t>();
  bytes.device = device;
  bytes.sizes = {static_cast<int64_t>(storage.nbytes())};
  bytes.strides = {1};
  return view_of(storage, bytes);
}

namespace {

// A copy of a whole storage (every view of it keeps its geometry on the copy).
c10::Storage copy_storage(const c10::Storage& storage, const c10::Device& device) {
  at::Tensor src = bytes_of(storage, device);
  KernelGuard guard;
  return src.clone().storage();
}

// A number per kind of argument value, for the size-prediction key.
uint64_t kind_of(const c10::IValue& v) {
  if (v.isTensor()) return 1;
  if (v.isInt()) return 2;
  if (v.isDouble()) return 3;
  if (v.isBool()) return 4;
  if (v.isIntList()) return 5;
  if (v.isNone()) return 6;
  if (v.isBoolList()) return 9;
  if (v.isDoubleList()) return 10;
  if (v.isTensorList()) return 11;
  if (v.isString()) return 12;
  if (v.isList()) return 7;
  return 8;
}

uint64_t mix(uint64_t seed, uint64_t v) { return c10::hash_combine(seed, v); }

// What of an argument decides what an op allocates, mixed into `h`: a
// tensor's sizes, strides and dtype, a scalar's value, every element of a
// list (convolution_backward's output_mask decides which gradients it
// allocates), a string's text (padding="same"); other objects their kind only.
uint64_t mix_signature(uint64_t h, const c10::IValue& v) {
  h = mix(h, kind_of(v));
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return mix(h, 0);
    // Strides too: what an op allocates can depend on them (contiguous()
    // of a contiguous tensor is a view, of a transposed one a copy).
    for (int64_t s : t.sizes()) h = mix(h, static_cast<uint64_t>(s));
    for (int64_t s : t.strides()) h = mix(h, static_cast<uint64_t>(s) * 31 + 7);
    return mix(h, static_cast<uint64_t>(t.scalar_type()));
  }
  if (v.isInt()) return mix(h, static_cast<uint64_t>(v.toInt()));
  if (v.isDouble()) {
    double d = v.toDouble();
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof(bits));
    return mix(h, bits);
  }
  if (v.isBool()) return mix(h, v.toBool());
  if (v.isString()) return mix(h, std::hash<std::string_view>()(v.toStringView()));
  if (v.isIntList()) {
    for (int64_t x : v.toIntList()) h = mix(h, static_cast<uint64_t>(x));
    return mix(h, v.toIntList().size());
  }
  if (v.isBoolList()) {
    for (bool x : v.toBoolList()) h = mix(h, x ? 2 : 1);
    return mix(h, v.toBoolList().size());
  }
  if (v.isList() || v.isTensorList() || v.isDoubleList()) {
    size_t n = 0;
    for (const c10::IValue& x : v.toListRef()) {
      h = mix_signature(h, x);
      ++n;
    }
    return mix(h, n);
  }
  return h;
}

// MEMSCALE_NATIVE_TRACE=1: one line per registered op on stderr (debugging).
bool trace_ops() {
  static const bool on = [] {
    const char* v = std::getenv("MEMSCALE_NATIVE_TRACE");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

}  // namespace

// ------------------------------------------------------------------ helpers

Session* active_session() { return g_active.load(std::memory_order_acquire); }
void set_active_session(Session* session) { g_active.store(session, std::memory_order_release); }

at::Tensor view_of(const c10::Storage& storage, const Cell& cell) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), plain_keys(cell.device, cell.dtype),
                                                          cell.dtype);
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(cell.sizes, cell.strides, cell.offset);
  if (cell.conj) impl->_set_conj(true);
  if (cell.neg) impl->_set_neg(true);
  return t;
}

// The op's input cells and where each sits in its arguments.
// Small vectors: most ops read and return a few tensors (no allocation then).
struct Session::Inputs {
  c10::SmallVector<CellPtr, 4> cells;
  c10::SmallVector<Slot, 4> slots;
  c10::SmallVector<int64_t, 4> ids;
  bool missing = false;
};

// The tensors of an op's results: where each sits (result, list element).
struct Session::Outputs {
  c10::SmallVector<at::Tensor, 2> tensors;
  c10::SmallVector<std::pair<int, int>, 2> places;
};

// Engine locks held until it goes out of scope.
class Session::Held {
 public:
  explicit Held(Session& s) : s_(s) {}
  ~Held() {
    for (int64_t id : ids_) s_.engine().unlock(s_.h_, id);
  }
  void lock(int64_t id) {
    if (s_.engine().lock(s_.h_, id) < 0) s_.fail("memscale_dtr_lock");
    ids_.push_back(id);
  }
  bool empty() const { return ids_.empty(); }
  void release() {
    for (int64_t id : ids_) s_.engine().unlock(s_.h_, id);
    ids_.clear();
  }

 private:
  Session& s_;
  std::vector<int64_t> ids_;
};

Session::Session(const SessionOptions& o)
    : abi_(EngineAbi::load(o.library)),
      h_(o.handle),
      status_(abi_.status_of(o.handle)),
      recording_(o.recording),
      usage_live_(o.usage_address ? reinterpret_cast<const std::atomic<int64_t>*>(o.usage_address) : nullptr),
      drain_batch_(o.drain_batch),
      clock_(o.test_op_cost_ns, o.test_op_cost_seed),
      test_device_ns_(o.test_device_ns),
      verify_(o.verify) {
  TORCH_CHECK(status_ != nullptr, "memscale native region: engine handle ", o.handle, " is unknown: ",
              abi_.last_error());
  set_budgeted(o.budgeted);
  frame_.resize(1024);
}

Session::~Session() {
  if (!closed_) {
    try {
      close(false);
    } catch (...) {
    }
  }
}

void Session::set_budgeted(bool budgeted) {
  flush();
  budgeted_ = budgeted;
  drain_at_ = budgeted ? 1 : drain_batch_;
}

void Session::fail(const std::string& what) const {
  const char* message = abi_.last_error();
  const std::string text = (message && *message) ? message : "no error message recorded";
  // Go's evict.ErrNoEvictable, as memscale._native.engine tells it apart.
  if (text.find("nothing evictable") != std::string::npos) throw NoRoomError("memscale.dtr: " + what + ": " + text);
  TORCH_CHECK(false, "memscale.dtr: ", what, ": ", text);
}

int64_t Session::usage_now() const {
  // With registrations queued the engine's count lags by what they allocated
  // (their releases are not subtracted: an upper bound, safe for the budget),
  // and by the op's copies on write until they are registered.
  return usage_live_ != nullptr ? usage_live_->load(std::memory_order_relaxed)
                                : status_->usage + queued_fresh_ + unregistered_;
}

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
  std::vector<CellPtr> batch;
  {
    std::lock_guard<std::mutex> guard(release_mu_);
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
  if (action == kActionSwap && g.resident()) {
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

class Session::Level {
 public:
  Level(Session& s, c10::ArrayRef<CellPtr> cells) : s_(s) { s_.levels_.push_back(cells); }
  ~Level() { s_.levels_.pop_back(); }
  Level(const Level&) = delete;
  Level& operator=(const Level&) = delete;

 private:
  Session& s_;
};

bool Session::park_outer_levels(int64_t extra) {
  if (levels_.size() < 2) return false;
  std::unordered_set<int64_t> seen;  // the innermost level's storages, then each one tried
  for (const CellPtr& c : levels_.back()) seen.insert(c->root);
  bool parked = false;
  for (size_t l = 0; l + 1 < levels_.size(); ++l) {
    for (const CellPtr& cell : levels_[l]) {
      if (!cell->tensor.defined() || !seen.insert(cell->root).second) continue;
      Group* g = groups_.find(cell->root);
      if (g == nullptr || !g->resident()) continue;
      int took = engine().park(h_, cell->root);
      if (took < 0) fail("memscale_dtr_park(" + std::to_string(cell->root) + ")");
      if (took == 0) continue;  // parking off, pinned, over the offload limit
      carry_out(cell->root, kActionSwap);
      counters_.parked++;
      parked = true;
      if (usage_now() + extra <= status_->budget) return true;
    }
  }
  return parked;
}

void Session::unpark(c10::ArrayRef<CellPtr> cells, Held& held) {
  // A cell the budget loop evicted meanwhile is rebuilt by its plan, which
  // may park the others again: a bounded number of rounds, then an error.
  size_t rounds = 0;
  for (bool missing = true; missing;) {
    missing = false;
    for (const CellPtr& c : cells) {
      if (derive(c)) continue;
      missing = true;
      TORCH_CHECK(++rounds <= cells.size() * kMaxPlansPerCell, "memscale.dtr: the inputs of a rebuild could not be ",
                  "made resident together (", cells.size(), " tensors; each rebuild took back another): the budget ",
                  "is too small for this step; raise it (summary()['min_budget'] of an unbudgeted run is a lower ",
                  "bound)");
      materialize(c, held);
    }
  }
}

void Session::after_op() {
  if (status_->pending >= drain_at_ || (budgeted_ && usage_now() > status_->budget)) evict(0, "");
}

// --------------------------------------------------------------- externals

CellPtr Session::cell_of(const at::Tensor& t) {
  if (DTRTensorImpl* w = wrapper_of(t)) {
    const CellPtr& cell = w->cell();
    if (cell->session.load() == this) return cell;
    // A wrapper of an earlier entry: its real tensor is an external here, and
    // the graph that entry built may accumulate gradients in this one.
    graph_leaves(t, graph_seen_, leaves_);
    TORCH_CHECK(cell->tensor.defined(),
                "memscale.dtr: a tensor of an earlier region entry was evicted when that entry exited with an "
                "error; its data cannot be rebuilt");
    return extern_cell(cell->tensor);
  }
  return extern_cell(t);
}

CellPtr Session::extern_cell(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  auto it = externals_.find(impl);
  if (it != externals_.end()) {
    if (!it->second.weak.expired() && !it->second.cell->released) return it->second.cell;
    externals_.erase(it);
  }
  if (t.layout() == at::kStrided && t._is_zerotensor()) return CellPtr();  // no storage: a constant
  TORCH_CHECK(t.layout() == at::kStrided, "memscale.dtr: a ", t.layout(),
              " tensor was passed to an op; only strided (dense) tensors can be used in a DTR region - convert "
              "it with .to_dense() first");
  const c10::Storage& storage = t.storage();
  const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
  CellPtr cell;
  auto root = external_roots_.find(key);
  if (root != external_roots_.end() && !root->second->released && groups_.at(root->second->root).resident()) {
    send_releases();
    int64_t size = static_cast<int64_t>(t.nbytes());
    int32_t alias = 0;
    int64_t id = -1;
    int64_t base = root->second->id;
    if (engine().call(h_, "alias", &base, 1, &size, &alias, 1, 0, kNoRecompute, &id) < 0) fail("memscale_dtr_call(alias)");
    cell = c10::make_intrusive<Cell>(id, root->second->root, -1, t);
    cell->tensor = view_of(storage, *cell);
    Group& g = groups_.at(cell->root);
    g.cells.push_back(cell);
    g.live++;
  } else {
    int64_t nbytes = static_cast<int64_t>(storage.nbytes());
    if (budgeted_ && nbytes) make_room(nbytes, "an external tensor");
    send_releases();
    int64_t id = engine().tensor(h_, nbytes, 1);
    if (id < 0) fail("memscale_dtr_tensor");
    cell = c10::make_intrusive<Cell>(id, id, -1, t);
    cell->tensor = view_of(storage, *cell);
    Group& g = groups_[id];
    g.storage = storage;
    g.nbytes = nbytes;
    g.cells.push_back(cell);
    g.live = 1;
    if (key != nullptr && storage.data() != nullptr) external_roots_[key] = cell;
  }
  cell->pinned = true;
  cell->external = true;
  cell->session.store(this);
  externals_.emplace(impl, External{WeakImpl(t.getIntrusivePtr()), cell});
  if (t.requires_grad() && t.is_leaf()) leaves_.emplace_back(t.getIntrusivePtr());
  graph_leaves(t, graph_seen_, leaves_);  // a graph built outside the entry
  counters_.externals++;
  return cell;
}

// ---------------------------------------------------------------- arguments

void Session::collect(const OpFacts& f, c10::IValue* args, Inputs& in) {
  for (size_t i = 0; i < f.n_args; ++i) {
    if (i == 0 && f.shape_only) continue;  // read for its metadata only: not an input
    for_tensors(args[i], [&](const at::Tensor& t, int elem) {
      // A Python number passed where a tensor goes (y + 1.0) is a constant:
      // it stays in the recorded arguments as it is.
      if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
      CellPtr cell = cell_of(t);
      if (!cell) return;  // a constant
      in.slots.push_back(Slot{static_cast<int>(i), elem, static_cast<int>(in.cells.size())});
      in.ids.push_back(cell->id);
      in.cells.push_back(std::move(cell));
    });
  }
  for (const CellPtr& c : in.cells) {
    if (!derive(c)) in.missing = true;
  }
}

bool Session::derive(const CellPtr& cell, bool view_planned) {
  if (cell->tensor.defined()) return true;
  // A view of a storage that came back is re-derived only once the engine's
  // plan re-ran its view op (until then the engine holds it undefined).
  if (cell->root != cell->id && !cell->pinned && !view_planned) return false;
  const Group* g = groups_.find(cell->root);
  if (g == nullptr || !g->resident()) return false;
  cell->tensor = view_of(g->storage, *cell);
  return true;
}

void Session::make_inputs_resident(Inputs& in, Held& held) {
  Level level(*this, in.cells);
  for (const CellPtr& c : in.cells) {
    if (derive(c)) {
      held.lock(c->id);
    } else {
      rebuild(c, held);
    }
  }
  unpark(in.cells, held);
  in.missing = false;
}

namespace {
}  // namespace

void Session::rebuild(const CellPtr& cell, Held& held) {
  // The outermost rebuild. When plans nest (an input a step needs was evicted
  // while an earlier step ran) a tight budget may leave no room for the
  // innermost one: the plans are abandoned and the rebuild starts over, first
  // rebuilding the cells whose rebuilds found no room, innermost first, each
  // with nothing else held (memscale/_region/rebuild.py's restarts).
  std::vector<CellPtr> chain;
  for (int restart = 0;; ++restart) {
    room_failed_.clear();
    try {
      for (const CellPtr& first : chain) {
        if (!derive(first)) {
          Held alone(*this);
          materialize(first, alone);
        }
      }
      materialize(cell, held);
      return;
    } catch (const NoRoomError&) {
      if (restart == kNestedRestarts) throw;
      chain.assign(room_failed_.begin(), room_failed_.begin() + std::min<size_t>(room_failed_.size(), restart + 1));
      if (engine().abandon_plans(h_) <= 0) throw;
      counters_.nested_restarts++;
    }
  }
}

void Session::fill(c10::IValue* args, c10::ArrayRef<Slot> slots, c10::ArrayRef<at::Tensor> reals) {
  int last_owned = -1;
  for (const Slot& s : slots) {
    if (s.elem >= 0 && s.arg != last_owned) {
      own_lists(args[s.arg]);
      last_owned = s.arg;
    }
    set_tensor(args[s.arg], s.elem, reals[s.input]);
  }
}

// ----------------------------------------------------------------- results

void Session::flatten_results(c10::IValue* results, size_t n, Outputs& out) {
  for (size_t r = 0; r < n; ++r) {
    for_tensors(results[r], [&](const at::Tensor& t, int elem) {
      if (!t.defined()) return;
      if (t.layout() == at::kStrided && t._is_zerotensor()) return;  // a constant, handed back as it is
      TORCH_CHECK(t.layout() == at::kStrided, "memscale.dtr: an op returned a ", t.layout(),
                  " tensor; only strided (dense) tensors can live in a DTR region (run this op outside the "
                  "region, or with MEMSCALE_NATIVE=0 for the Python region's message)");
      out.tensors.push_back(t);
      out.places.emplace_back(static_cast<int>(r), elem);
    });
  }
}

std::vector<CellPtr> Session::register_call(const OpFacts& f, const Inputs& in, const Outputs& out, int64_t cost,
                                            int64_t* fresh_bytes) {
  const size_t n_in = in.cells.size();
  const size_t n_out = out.tensors.size();
  c10::SmallVector<int64_t, 4> sizes(n_out);
  c10::SmallVector<int64_t, 4> aliases(n_out, -1);
  int64_t fresh = 0;
  c10::SmallVector<const void*, 4> input_data;
  for (size_t k = 0; k < n_out; ++k) {
    const at::Tensor& o = out.tensors[k];
    if (f.views_first && n_in) {
      aliases[k] = 0;
      sizes[k] = static_cast<int64_t>(o.nbytes());
      continue;
    }
    const void* ptr = o.storage().data();
    if (ptr != nullptr && n_in) {
      if (input_data.empty()) {
        input_data.reserve(n_in);
        for (const CellPtr& c : in.cells) input_data.push_back(c->tensor.storage().data());
      }
      auto hit = std::find(input_data.begin(), input_data.end(), ptr);
      if (hit != input_data.end()) aliases[k] = hit - input_data.begin();
    }
    if (aliases[k] < 0) {
      sizes[k] = static_cast<int64_t>(o.storage().nbytes());
      fresh += sizes[k];
    } else {
      sizes[k] = static_cast<int64_t>(o.nbytes());
    }
  }
  size_t n_rel = release_ids_.size();
  // Queued when no decision waits on it: without a budget, or with room for
  // what it allocated (the engine's next call sees it first).
  if (!budgeted_ || usage_now() + fresh <= status_->budget) {
    return queue_call(f, in, out, cost, sizes, aliases, fresh, fresh_bytes);
  }
  if (batch_ops_ > 0) flush();  // the frame below is flush's too
  size_t words = 6 + n_rel + n_in + 2 * n_out;
  size_t need = std::max(words, n_out + 1 + 2 * kHandOut);
  if (frame_.size() < need) frame_.resize(need * 2);
  int64_t* w = frame_.data();
  w[0] = static_cast<int64_t>(n_rel);
  w[1] = static_cast<int64_t>(n_in);
  w[2] = static_cast<int64_t>(n_out);
  w[3] = cost;
  w[4] = f.flags | (recording_ ? 0 : kNoRecompute);
  w[5] = kHandOut;
  int64_t* p = w + 6;
  if (n_rel) std::memcpy(p, release_ids_.data(), n_rel * sizeof(int64_t));
  p += n_rel;
  if (n_in) std::memcpy(p, in.ids.data(), n_in * sizeof(int64_t));
  p += n_in;
  if (n_out) std::memcpy(p, sizes.data(), n_out * sizeof(int64_t));
  p += n_out;
  for (size_t k = 0; k < n_out; ++k) p[k] = aliases[k];
  release_ids_.clear();
  dead_bytes_ = 0;  // the engine hands back what it freed with this call
  int64_t op_id = abi_.op(h_, f.name.c_str(), w);
  if (op_id < 0) fail("memscale_dtr_op(" + f.name + ")");
  if (trace_ops()) {
    fprintf(stderr, "memscale native: op %lld %s in=%zu out=%zu released=%zu usage=%lld\n",
            static_cast<long long>(op_id), f.name.c_str(), n_in, n_out, n_rel,
            static_cast<long long>(status_->usage));
  }
  std::vector<CellPtr> cells = make_cells(in, out, op_id, w, sizes, aliases);
  int64_t handed = w[n_out];
  carry_out_handed(w + n_out + 1, handed);
  *fresh_bytes = fresh;
  return cells;
}

std::vector<CellPtr> Session::make_cells(const Inputs& in, const Outputs& out, int64_t op_id, const int64_t* ids,
                                         c10::ArrayRef<int64_t> sizes, c10::ArrayRef<int64_t> aliases) {
  const size_t n_out = out.tensors.size();
  std::vector<CellPtr> cells;
  cells.reserve(n_out);
  for (size_t k = 0; k < n_out; ++k) {
    const at::Tensor& o = out.tensors[k];
    int64_t id = ids[k];
    CellPtr cell;
    if (aliases[k] < 0) {
      cell = c10::make_intrusive<Cell>(id, id, op_id, o);
      Group& g = groups_[id];
      g.storage = o.storage();
      g.nbytes = sizes[k];
      g.cells.push_back(cell);
      g.live = 1;
    } else {
      const CellPtr& source = in.cells[aliases[k]];
      cell = c10::make_intrusive<Cell>(id, source->root, op_id, o);
      cell->pinned = source->pinned;
      Group& g = groups_.at(source->root);
      g.cells.push_back(cell);
      g.live++;
    }
    cell->session.store(this);
    cells.push_back(std::move(cell));
  }
  return cells;
}

std::vector<CellPtr> Session::queue_call(const OpFacts& f, const Inputs& in, const Outputs& out, int64_t cost,
                                         c10::ArrayRef<int64_t> sizes, c10::ArrayRef<int64_t> aliases,
                                         int64_t fresh, int64_t* fresh_bytes) {
  // No decision waits on this op: its record is queued with the ids the
  // engine will give it (they run in sequence; memscale_dtr_ops checks them).
  if (batch_ops_ == 0) {
    next_op_ = status_->next_op;
    next_tensor_ = status_->next_tensor;
  }
  const size_t n_rel = release_ids_.size(), n_in = in.cells.size(), n_out = out.tensors.size();
  const int64_t op_id = next_op_++;
  const int64_t first = next_tensor_;
  next_tensor_ += static_cast<int64_t>(n_out);
  const int64_t header[8] = {name_id(f), static_cast<int64_t>(n_rel), static_cast<int64_t>(n_in),
                             static_cast<int64_t>(n_out), cost, f.flags | (recording_ ? 0 : kNoRecompute), op_id,
                             first};
  batch_.insert(batch_.end(), header, header + 8);
  batch_.insert(batch_.end(), release_ids_.begin(), release_ids_.end());
  batch_.insert(batch_.end(), in.ids.begin(), in.ids.end());
  batch_.insert(batch_.end(), sizes.begin(), sizes.end());
  batch_.insert(batch_.end(), aliases.begin(), aliases.end());
  release_ids_.clear();
  ++batch_ops_;
  queued_fresh_ += fresh;
  if (trace_ops()) {
    fprintf(stderr, "memscale native: op %lld %s in=%zu out=%zu released=%zu (queued)\n",
            static_cast<long long>(op_id), f.name.c_str(), n_in, n_out, n_rel);
  }
  c10::SmallVector<int64_t, 4> ids;
  for (size_t k = 0; k < n_out; ++k) ids.push_back(first + static_cast<int64_t>(k));
  std::vector<CellPtr> cells = make_cells(in, out, op_id, ids.data(), sizes, aliases);
  if (batch_ops_ >= kBatchOps) flush();
  *fresh_bytes = fresh;
  return cells;
}

void Session::flush() {
  if (batch_ops_ == 0) return;
  const size_t words = 2 + batch_.size();
  const size_t need = std::max<size_t>(words, 1 + 2 * kHandOut);
  if (frame_.size() < need) frame_.resize(need * 2);
  int64_t* w = frame_.data();
  w[0] = batch_ops_;
  w[1] = kHandOut;
  std::memcpy(w + 2, batch_.data(), batch_.size() * sizeof(int64_t));
  batch_.clear();
  batch_ops_ = 0;
  queued_fresh_ = 0;
  if (abi_.ops(h_, w) < 0) fail("memscale_dtr_ops");
  const int64_t handed = w[0];
  carry_out_handed(w + 1, handed);
}

void Session::carry_out_handed(const int64_t* pairs, int64_t n) {
  // Copied out first: carrying them out does not touch the frame, but a flush could.
  std::vector<int64_t> freed(pairs, pairs + 2 * n);
  for (int64_t j = 0; j < n; ++j) carry_out(freed[2 * j], static_cast<int32_t>(freed[2 * j + 1]));
}

int64_t Session::name_id(const OpFacts& f) {
  auto it = name_ids_.find(&f);
  if (it != name_ids_.end()) return it->second;
  int64_t id = abi_.name(h_, f.name.c_str());
  if (id < 0) fail("memscale_dtr_name(" + f.name + ")");
  name_ids_.emplace(&f, id);
  return id;
}

void Session::wrap_results(c10::IValue* results, Outputs& out, const std::vector<CellPtr>& cells) {
  int owned = -1;
  for (size_t k = 0; k < cells.size(); ++k) {
    auto [r, elem] = out.places[k];
    // The group may be evicted already (a storage the registration handed out).
    at::Tensor wrapper = make_wrapper(cells[k], storage_of(cells[k]));
    if (elem >= 0 && r != owned) {
      own_lists(results[r]);
      owned = r;
    }
    set_tensor(results[r], elem, wrapper);
  }
}

// --------------------------------------------------------------- recording

std::unique_ptr<RecordedOp> Session::start_record(const c10::OperatorHandle& op, const OpFacts& f,
                                                  const c10::IValue* args, const Inputs& in) {
  auto rec = std::make_unique<RecordedOp>(op);
  rec->args.assign(args, args + f.n_args);
  rec->slots.assign(in.slots.begin(), in.slots.end());
  rec->inputs.assign(in.cells.begin(), in.cells.end());
  rec->shape_only = f.shape_only;
  rec->grad_mode = c10::GradMode::is_enabled();
  // Tensors are not kept: each slot names its cell (a list argument is copied).
  int last = -1;
  for (const Slot& s : in.slots) {
    if (s.elem >= 0 && s.arg != last) {
      own_lists(rec->args[s.arg]);
      last = s.arg;
    }
    set_tensor(rec->args[s.arg], s.elem, at::Tensor());
  }
  if (f.shape_only) {
    // The stand-in for `self` is re-made from its metadata at a re-run.
    const at::Tensor& self = args[0].toTensor();
    KernelGuard guard;
    rec->args[0] = at::empty_strided(self.sizes(), self.strides(), self.options().device(at::kMeta));
  }
  for (const CellPtr& c : in.cells) {
    if (c->pinned) c->consumed = true;
  }
  if (f.seeded) {
    c10::optional<at::Generator> gen;
    c10::optional<c10::Device> device;
    for (size_t i = 0; i < f.n_args; ++i) {
      const c10::IValue& v = args[i];
      if (v.isGenerator()) gen = v.toGenerator();
      if (!device && v.isTensor() && v.toTensor().defined()) device = v.toTensor().device();
      if (!device && v.isDevice()) device = v.toDevice();
    }
    if (!gen.has_value() || !gen->defined()) {
      c10::Device d = device.value_or(c10::Device(c10::kCPU));
      gen = d.is_cpu() ? at::detail::getDefaultCPUGenerator() : at::globalContext().defaultGenerator(d);
    }
    std::lock_guard<std::mutex> lock(gen->mutex());
    rec->rng_state = gen->get_state();
    rec->generator = gen;
  }
  return rec;
}

void Session::signature(const c10::OperatorHandle& op, const OpFacts& f, const c10::IValue* args, uint64_t* key) {
  uint64_t h = reinterpret_cast<uintptr_t>(&op.schema());
  for (size_t i = 0; i < f.n_args; ++i) h = mix_signature(h, args[i]);
  *key = h;
}

int64_t Session::predict(const c10::OperatorHandle& op, const OpFacts& f, const c10::IValue* args, uint64_t* key) {
  signature(op, f, args, key);
  last_meta_ = -1;
  int64_t known = output_sizes().learned(*key);
  if (known >= 0) return known;
  // First sight: ask the op's meta kernel what it allocates.
  KernelGuard convert;
  std::vector<c10::IValue> meta(args, args + f.n_args);
  std::vector<const c10::StorageImpl*> inputs;
  for (size_t i = 0; i < f.n_args; ++i) {
    if (static_cast<int>(i) == f.device_arg && meta[i].isDevice()) {
      meta[i] = c10::Device(at::kMeta);
      continue;
    }
    bool list = meta[i].isTensorList() || meta[i].isList();
    if (list) own_lists(meta[i]);
    std::vector<std::pair<int, at::Tensor>> converted;
    for_tensors(meta[i], [&](const at::Tensor& t, int elem) {
      if (!t.defined()) return;
      at::Tensor m = at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
      inputs.push_back(m.storage().unsafeGetStorageImpl());
      converted.emplace_back(elem, m);
    });
    for (auto& [elem, m] : converted) set_tensor(meta[i], elem, m);
  }
  int64_t bytes = -1;
  KernelGuard guard;
  try {
    torch::jit::Stack stack(meta.begin(), meta.end());
    op.callBoxed(&stack);
    bytes = 0;
    std::vector<const c10::StorageImpl*> seen;
    for (const c10::IValue& r : stack) {
      for_tensors(r, [&](const at::Tensor& t, int) {
        if (!t.defined() || t.device().type() != at::kMeta) return;
        const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
        if (std::find(inputs.begin(), inputs.end(), s) != inputs.end()) return;
        if (std::find(seen.begin(), seen.end(), s) != seen.end()) return;
        seen.push_back(s);
        bytes += static_cast<int64_t>(t.storage().nbytes());
      });
    }
  } catch (const std::exception&) {
    bytes = -1;  // no meta kernel: learned after the first run
  }
  counters_.predictions++;
  last_meta_ = bytes;
  if (bytes <= 0) return 0;
  return static_cast<int64_t>(static_cast<double>(bytes) * output_sizes().ratio(&op.schema()) + 0.5);
}

// ---------------------------------------------------------- verification

namespace {

// Two reductions of a tensor's bits read as integers: their sum and a sum
// weighted by position (same tensor -> same fingerprint; a pass over the
// data, no copy kept). The C++ twin of memscale/_region/verify.py's.
std::pair<int64_t, int64_t> fingerprint(const at::Tensor& t) {
  KernelGuard guard;
  at::Tensor flat = t.detach().resolve_conj().resolve_neg().contiguous();
  if (flat.is_complex()) flat = at::view_as_real(flat);
  flat = flat.reshape(-1);
  if (flat.numel() == 0) return {0, 0};
  at::ScalarType bits = at::kByte;
  switch (flat.element_size()) {
    case 2: bits = at::kShort; break;
    case 4: bits = at::kInt; break;
    case 8: bits = at::kLong; break;
    default: bits = at::kByte;
  }
  at::Tensor wide = flat.view(bits).to(at::kLong);
  at::Tensor weights = at::arange(flat.numel(), wide.options()).remainder(65521).add(1);
  return {wide.sum().item<int64_t>(), wide.mul(weights).sum().item<int64_t>()};
}

}  // namespace

void Session::fingerprint_outputs(const OpFacts& f, const std::vector<CellPtr>& cells) {
  if (!verify_ || !f.reproducible) return;
  for (const CellPtr& c : cells) {
    if (c->root == c->id && c->tensor.defined()) prints_[c->id] = fingerprint(c->tensor);
  }
}

void Session::check_rebuilt(const RecordedOp& r, size_t k, const at::Tensor& rebuilt) {
  auto it = prints_.find(r.outputs[k]->id);
  if (it == prints_.end()) return;
  TORCH_CHECK(fingerprint(rebuilt) == it->second, "memscale.check: re-running ", r.op.schema().name(),
              " gave different values for its output ", k,
              " than its first run; this op cannot be rematerialized bitwise");
}

// ------------------------------------------------------------------ dispatch

bool Session::after_failed_backward() {
  if (!watch_backward.load(std::memory_order_relaxed)) return false;
  switch (backward_.see()) {
    case BackwardWatch::Verdict::kRunning:
      return false;
    case BackwardWatch::Verdict::kFailed:
      return true;
    case BackwardWatch::Verdict::kRaised:
      break;
  }
  // The step is over: what it planned goes, and its budget binds no more.
  std::lock_guard<std::recursive_mutex> guard(mu_);
  if (!closed_) {
    flush();
    abi_.abandon_plans(h_);
    abi_.finish(h_);
  }
  return true;
}

bool Session::backward_failed() {
  after_failed_backward();
  return backward_.failed();
}

void Session::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (after_failed_backward()) {
    run_outside(op, stack);
    return;
  }
  std::lock_guard<std::recursive_mutex> guard(mu_);
  Busy busy(*this);
  TORCH_CHECK(!closed_, "memscale.dtr: an op reached a region entry that is closed");
  take_releases();
  if (dead_bytes_ >= kPromptReleaseBytes) {
    // Under a budget the engine frees what the program released (the
    // registrations queued meanwhile carry no releases back): large ones are
    // sent now, so their memory goes before the next op allocates, as a plain
    // tensor's would. Left for the next crossing instead, a step's working
    // set grows by up to kBatchOps outputs: GPT-2 on the CPU ran 1.28x plain's
    // CPU time at 100 % of its peak (cold caches, page faults), 1.06x without.
    dead_bytes_ = 0;
    evict(0, "");
  }
  if (++ops_since_scan_ >= kScanExternalsEvery) {
    ops_since_scan_ = 0;
    release_expired_externals();
  }
  counters_.ops++;
  const OpFacts& f = facts_table().of(op);
  c10::IValue* args = stack->data() + (stack->size() - f.n_args);
  if (f.inplace_view) {
    dispatch_inplace_view(op, f, stack);
  } else if (f.writes(args)) {
    dispatch_mutating(op, f, stack);
  } else {
    dispatch_pure(op, f, stack);
  }
}

void Session::room_for_op(const OpFacts& f, int64_t extra, const Inputs& in, Held& held) {
  // Under a budget: room for the bytes the op is about to allocate, its
  // inputs locked meanwhile.
  if (!budgeted_ || usage_now() + extra <= status_->budget) return;
  if (held.empty()) {
    for (const CellPtr& c : in.cells) held.lock(c->id);
  }
  make_room(extra, f.name);
  for (const CellPtr& c : in.cells) derive(c);
}

int64_t Session::run_on_reals(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::IValue* args,
                              const Inputs& in) {
  // The op on the real tensors (the stack's wrappers replaced), timed.
  c10::SmallVector<at::Tensor, 4> reals;
  reals.reserve(in.cells.size());
  for (const CellPtr& c : in.cells) reals.push_back(c->tensor);
  fill(args, in.slots, reals);
  reals.clear();
  int64_t t0 = clock_.start();
  {
    KernelGuard kernel;
    op.callBoxed(stack);
  }
  return clock_.since(t0);
}

int64_t Session::device_cost(const c10::OperatorHandle& op, const at::Tensor& first,
                             std::unique_ptr<DeviceEvent> started, int64_t host_ns) {
  if (device_timer_) return device_timer_->stop(&op.schema(), first.nbytes(), std::move(started), first.device(), host_ns);
  if (first.is_cuda()) {
    device_timer_ = std::make_unique<DeviceTimer>(make_cuda_event);
    timer_device_ = first.device();
  } else if (test_device_ns_ > 0) {
    const int64_t ns = test_device_ns_;
    device_timer_ = std::make_unique<DeviceTimer>([ns] { return make_fixed_event(ns); });
    timer_device_ = first.device();
  }
  return host_ns;  // the calls after this one are timed
}

void Session::dispatch_pure(const c10::OperatorHandle& op, const OpFacts& f, torch::jit::Stack* stack) {
  c10::IValue* args = stack->data() + (stack->size() - f.n_args);
  Inputs in;
  collect(f, args, in);
  Held held(*this);
  if (in.missing) make_inputs_resident(in, held);
  uint64_t size_key = 0;
  int64_t extra = 0;
  bool predicted = false;
  if (!f.all_views && (budgeted_ || !unbudgeted_seen_.count(&op.schema()))) {
    // Without a budget only the first call of each overload in this session
    // is looked at: its meta prediction against its real bytes (the ratio
    // the budgeted regions scale their predictions by).
    if (!budgeted_) unbudgeted_seen_.insert(&op.schema());
    extra = predict(op, f, args, &size_key);
    if (!budgeted_) extra = 0;
    predicted = true;
    room_for_op(f, extra, in, held);
  }
  std::unique_ptr<RecordedOp> rec = recording_ ? start_record(op, f, args, in) : nullptr;
  std::unique_ptr<DeviceEvent> started = device_timer_ ? device_timer_->start(&op.schema(), timer_device_) : nullptr;
  if (f.shape_only) {
    // `self` gives metadata only: its own data if resident, else a stand-in.
    const at::Tensor self = args[0].toTensor();
    if (DTRTensorImpl* w = wrapper_of(self)) {
      const CellPtr& c = w->cell();
      if (c->session.load() == this && derive(c)) {
        args[0] = c->tensor;
      } else if (c->session.load() != this && c->tensor.defined()) {
        args[0] = c->tensor;
      } else {
        KernelGuard guard;
        args[0] = at::empty_strided(self.sizes(), self.strides(), self.options().device(c->device));
      }
    }
  }
  int64_t cost = run_on_reals(op, stack, args, in);
  c10::IValue* results = stack->data() + (stack->size() - f.n_returns);
  Outputs out;
  flatten_results(results, f.n_returns, out);
  if (out.tensors.empty()) return;
  cost = device_cost(op, out.tensors.front(), std::move(started), cost);
  int64_t fresh = 0;
  std::vector<CellPtr> cells = register_call(f, in, out, cost, &fresh);
  if (predicted) output_sizes().learn(size_key, &op.schema(), fresh, last_meta_);
  if (rec) {
    rec->outputs.assign(cells.begin(), cells.end());
    rec->fresh_bytes = fresh;
    ops_[cells.front()->op] = std::move(rec);
    fingerprint_outputs(f, cells);
  }
  wrap_results(results, out, cells);
  held.release();  // the inputs may go now
  after_op();
}

void Session::dispatch_inplace_view(const c10::OperatorHandle& op, const OpFacts& f, torch::jit::Stack* stack) {
  // transpose_, squeeze_, as_strided_...: the op changes `self`'s geometry.
  // On a region tensor it becomes a new view of the same storage (registered
  // like `alias` followed by the out-of-place op), and the wrapper is rebased
  // onto it; on a plain tensor it runs on that tensor, which is registered
  // anew at its next use.
  c10::IValue* args = stack->data() + (stack->size() - f.n_args);
  const at::Tensor self = args[0].toTensor();
  DTRTensorImpl* w = wrapper_of(self);
  if (w == nullptr || w->cell()->session.load() != this) {
    externals_.erase(self.unsafeGetTensorImpl());
    std::vector<c10::IValue> originals(args, args + f.n_args);
    for (size_t i = 0; i < f.n_args; ++i) {
      for_tensors(args[i], [&](const at::Tensor& t, int elem) {
        if (DTRTensorImpl* x = wrapper_of(t)) set_tensor(args[i], elem, read(x->cell()));
      });
    }
    KernelGuard kernel;
    op.callBoxed(stack);
    return;
  }
  Inputs in;
  collect(f, args, in);
  Held held(*this);
  if (in.missing) make_inputs_resident(in, held);
  std::unique_ptr<RecordedOp> rec = recording_ ? start_record(op, f, args, in) : nullptr;
  // The op runs on a fresh view, so the cell's own tensor keeps its geometry.
  c10::SmallVector<at::Tensor, 4> reals;
  for (const CellPtr& c : in.cells) reals.push_back(c == w->cell() ? view_of(c->tensor.storage(), *c) : c->tensor);
  at::Tensor view = reals[0];
  std::vector<c10::IValue> originals(args, args + f.n_args);
  fill(args, in.slots, reals);
  int64_t t0 = clock_.start();
  {
    KernelGuard kernel;
    op.callBoxed(stack);
  }
  int64_t cost = clock_.since(t0);
  Outputs out;
  out.tensors.push_back(view);
  out.places.emplace_back(0, -1);
  int64_t fresh = 0;
  std::vector<CellPtr> cells = register_call(f, in, out, cost, &fresh);
  if (rec) {
    rec->outputs.assign(cells.begin(), cells.end());
    ops_[cells.front()->op] = std::move(rec);
  }
  w->set_sizes_and_strides(view.sizes(), view.strides(), view.storage_offset());
  name_cell(w, cells.front(), storage_of(cells.front()));
  c10::IValue* results = stack->data() + (stack->size() - f.n_returns);
  for (size_t r = 0; r < f.n_returns; ++r) {
    int source = f.returns_arg[r];
    if (source >= 0) results[r] = originals[source];
  }
  after_op();
}

c10::Storage Session::copy_old_data(const CellPtr& cell) {
  // A pinned storage (an external: running statistics, an input) is about to
  // be overwritten while a recorded op read its old data (or the op computes
  // fresh results from it): its data is copied first, counted in the budget.
  Group& g = groups_.at(cell->root);
  if (budgeted_) make_room(g.nbytes, "the old version of an overwritten external");
  counters_.copies_on_write++;
  c10::Storage copy = copy_storage(g.storage, cell->device);
  // Counted until move_old_version registers it: room made later for this
  // op (its outputs, a second copy) must not take this copy's room again.
  unregistered_ += static_cast<int64_t>(copy.nbytes());
  return copy;
}

void Session::move_old_version(const CellPtr& cell, const c10::Storage& copy) {
  // After the op overwrote the storage: the old version (its engine ids,
  // which recorded ops and plans name) reads the copy, and the program's
  // tensors, which see the new data, are registered anew. The engine is told
  // of no mutation: to it the old storage stayed resident and pinned, and a
  // new one appeared.
  unregistered_ -= static_cast<int64_t>(copy.nbytes());  // registered below, or never used
  c10::Storage program = groups_.at(cell->root).storage;
  {
    Group& g = groups_.at(cell->root);
    g.storage = copy;
    for (const CellPtr& c : g.cells) {
      if (c->tensor.defined()) c->tensor = view_of(g.storage, *c);
    }
  }
  const auto& now = groups_.at(cell->root).cells;
  std::vector<CellPtr> named(now.begin(), now.end());  // the cells the program's tensors name now
  CellPtr new_root;
  for (const CellPtr& old : named) {
    if (old->released) continue;
    if (!old->external && old->wrappers.load() == 0) continue;
    at::Tensor t = view_of(program, *old);
    CellPtr fresh;
    if (!new_root) {
      int64_t nbytes = static_cast<int64_t>(program.nbytes());
      send_releases();
      int64_t id = engine().tensor(h_, nbytes, 1);
      if (id < 0) fail("memscale_dtr_tensor");
      Group& ng = groups_[id];
      ng.storage = program;
      ng.nbytes = nbytes;
      external_roots_[program.unsafeGetStorageImpl()] = c10::make_intrusive<Cell>(id, id, -1, t);
      new_root = external_roots_[program.unsafeGetStorageImpl()];
      new_root->pinned = true;
      new_root->session.store(this);
      ng.cells.push_back(new_root);
      ng.live = 1;
      fresh = new_root;
      counters_.externals++;
    } else {
      int64_t base = new_root->id;
      int64_t size = static_cast<int64_t>(t.nbytes());
      int32_t alias = 0;
      int64_t id = -1;
      send_releases();
      if (engine().call(h_, "alias", &base, 1, &size, &alias, 1, 0, kNoRecompute, &id) < 0) fail("memscale_dtr_call(alias)");
      fresh = c10::make_intrusive<Cell>(id, new_root->root, -1, t);
      fresh->pinned = true;
      fresh->session.store(this);
      groups_.at(new_root->root).cells.push_back(fresh);
      groups_.at(new_root->root).live++;
    }
    move_externals(old, fresh);
    repoint(old, fresh);
  }
  // The program's wrappers moved to the new storage; any left on the old
  // version read the copy, as its cells do.
  share(groups_.at(cell->root));
}

void Session::move_externals(const CellPtr& old, const CellPtr& fresh) {
  if (!old->external) return;
  for (auto& [impl, e] : externals_) {
    if (e.cell.get() == old.get()) e.cell = fresh;
  }
  old->external = false;
  fresh->external = true;
}

void Session::repoint(const CellPtr& old, const CellPtr& fresh) {
  std::vector<WeakImpl> all;
  all.swap(old->others);
  if (old->wrapper.has_value()) {
    all.push_back(*old->wrapper);
    old->wrapper.reset();
  }
  for (WeakImpl& weak : all) {
    ImplPtr impl = weak.lock();
    if (!impl) continue;
    auto* w = dynamic_cast<DTRTensorImpl*>(impl.get());
    if (w == nullptr || w->cell().get() != old.get()) continue;
    if (fresh->wrapper.has_value()) fresh->others.push_back(*fresh->wrapper);
    name_cell(w, fresh, storage_of(fresh));
  }
}

void Session::dispatch_mutating(const c10::OperatorHandle& op, const OpFacts& f, torch::jit::Stack* stack) {
  c10::IValue* args = stack->data() + (stack->size() - f.n_args);
  std::vector<c10::IValue> originals(args, args + f.n_args);
  Inputs in;
  collect(f, args, in);
  // The inputs it writes, once each.
  std::vector<int> unique;
  for (const Slot& s : in.slots) {
    if (std::find(f.mutated.begin(), f.mutated.end(), s.arg) == f.mutated.end()) continue;
    bool seen = false;
    for (int u : unique) seen = seen || in.cells[u].get() == in.cells[s.input].get();
    if (!seen) unique.push_back(s.input);
  }
  bool fresh_results = false;
  for (size_t r = 0; r < f.n_returns; ++r) fresh_results = fresh_results || f.returns_arg[r] < 0;
  Held held(*this);
  if (in.missing) make_inputs_resident(in, held);
  // Copy-on-write: pinned storages it overwrites whose old data a re-run may need.
  std::vector<std::pair<CellPtr, c10::Storage>> copies;
  // Copies dropped by an error were never registered: they stop counting.
  struct Uncount {
    int64_t& bytes;
    const int64_t before;
    ~Uncount() { bytes = before; }
  } uncount{unregistered_, unregistered_};
  if (recording_) {
    for (int u : unique) {
      const CellPtr& c = in.cells[u];
      if (!c->pinned || !c->tensor.defined()) continue;
      bool done = false;
      for (auto& [x, s] : copies) done = done || x->root == c->root;
      if (done) continue;
      const Group& g = groups_.at(c->root);
      bool consumed = fresh_results;
      for (const CellPtr& x : g.cells) consumed = consumed || x->consumed;
      if (!consumed) continue;
      if (budgeted_ && held.empty()) {
        for (const CellPtr& x : in.cells) held.lock(x->id);
      }
      copies.emplace_back(c, copy_old_data(c));
      for (const CellPtr& x : in.cells) derive(x);
    }
  }
  uint64_t size_key = 0;
  int64_t extra = 0;
  if (budgeted_ && fresh_results) {
    extra = predict(op, f, args, &size_key);
    room_for_op(f, extra, in, held);
  }
  std::unique_ptr<RecordedOp> rec = recording_ ? start_record(op, f, args, in) : nullptr;
  // A written argument that is a plain tensor of the program is passed itself,
  // not an alias of its storage: an out= op may resize it (arange, cat), and
  // the program's tensor must be what changes. What each written argument
  // was, to tell a resize afterwards.
  struct Written {
    int input;
    at::Tensor real;
    c10::StorageImpl* storage;
    std::vector<int64_t> sizes;
    bool plain;
  };
  std::vector<Written> written;
  c10::SmallVector<at::Tensor, 4> reals;
  reals.reserve(in.cells.size());
  for (const CellPtr& c : in.cells) reals.push_back(c->tensor);
  for (const Slot& s : in.slots) {
    if (std::find(f.mutated.begin(), f.mutated.end(), s.arg) == f.mutated.end()) continue;
    bool plain = false;
    for_tensors(originals[s.arg], [&](const at::Tensor& t, int elem) {
      if (elem == s.elem && wrapper_of(t) == nullptr) {
        reals[s.input] = t;
        plain = true;
      }
    });
    const at::Tensor& r = reals[s.input];
    written.push_back(Written{s.input, r, r.storage().unsafeGetStorageImpl(), r.sizes().vec(), plain});
  }
  fill(args, in.slots, reals);
  reals.clear();
  int64_t t0 = clock_.start();
  {
    KernelGuard kernel;
    op.callBoxed(stack);
  }
  int64_t cost = clock_.since(t0);
  std::vector<int> resized;
  for (const Written& w : written) {
    if (w.real.storage().unsafeGetStorageImpl() == w.storage && w.real.sizes().vec() == w.sizes) continue;
    TORCH_CHECK(w.plain, "memscale.dtr: ", f.name,
                " resized a tensor of the region in place; the native region does not follow resizes of its own "
                "tensors yet (run this step with MEMSCALE_NATIVE=0)");
    // The program's tensor got new geometry or memory: its old version stays
    // as it was, and the tensor is registered anew at its next use.
    externals_.erase(w.real.unsafeGetTensorImpl());
    resized.push_back(w.input);
  }
  c10::IValue* results = stack->data() + (stack->size() - f.n_returns);
  // Results that are written arguments go back as the program's objects.
  Outputs out;
  for (size_t r = 0; r < f.n_returns; ++r) {
    int source = f.returns_arg[r];
    if (source >= 0) {
      results[r] = originals[source];
      continue;
    }
    for_tensors(results[r], [&](const at::Tensor& t, int elem) {
      if (!t.defined() || (t.layout() == at::kStrided && t._is_zerotensor())) return;
      out.tensors.push_back(t);
      out.places.emplace_back(static_cast<int>(r), elem);
    });
  }
  if (!out.tensors.empty()) {
    // Fresh results (batch norm's, besides its running statistics): their
    // re-run writes into scratch copies of the written arguments.
    int64_t fresh = 0;
    std::vector<CellPtr> cells = register_call(f, in, out, cost, &fresh);
    if (extra || size_key) output_sizes().learn(size_key, &op.schema(), fresh, last_meta_);
    if (rec) {
      auto call = std::make_unique<RecordedOp>(*rec);
      call->outputs.assign(cells.begin(), cells.end());
      call->fresh_bytes = fresh;
      call->scratch = f.mutated;
      ops_[cells.front()->op] = std::move(call);
      fingerprint_outputs(f, cells);
    }
    wrap_results(results, out, cells);
  }
  // The old versions of the copied storages read the copies; the rest get new versions.
  std::vector<int> versioned;
  for (int u : unique) {
    bool copied = false;
    for (auto& [x, s] : copies) copied = copied || x->root == in.cells[u]->root;
    bool moved = std::find(resized.begin(), resized.end(), u) != resized.end();
    if (!copied && !moved) versioned.push_back(u);
  }
  for (auto& [c, copy] : copies) move_old_version(c, copy);
  if (!versioned.empty()) register_mutation(f, op, in, versioned, originals, rec.get(), cost);
  held.release();
  after_op();
}

void Session::register_mutation(const OpFacts& f, const c10::OperatorHandle& op, Inputs& in,
                                 const std::vector<int>& unique, const std::vector<c10::IValue>& originals,
                                 RecordedOp* record, int64_t cost) {
  send_releases();
  std::vector<int32_t> mutated(unique.begin(), unique.end());
  std::vector<int64_t> new_ids(unique.size());
  int64_t op_id = engine().mutate(h_, f.name.c_str(), in.ids.data(), static_cast<int32_t>(in.ids.size()), mutated.data(),
                              static_cast<int32_t>(mutated.size()), cost, f.flags, new_ids.data());
  if (op_id < 0) fail("memscale_dtr_mutate(" + f.name + ")");
  std::vector<CellPtr> versions;
  for (size_t j = 0; j < unique.size(); ++j) {
    const CellPtr old = in.cells[unique[j]];
    Group& old_group = groups_.at(old->root);
    // The new version takes over the old memory and its pins.
    CellPtr fresh = c10::make_intrusive<Cell>(new_ids[j], new_ids[j], op_id, old->tensor);
    fresh->pinned = old->pinned;
    fresh->session.store(this);
    Group& g = groups_[fresh->id];
    g.storage = old_group.storage;
    g.nbytes = old_group.nbytes;
    g.cells.push_back(fresh);
    g.live = 1;
    if (old->pinned) {
      auto root = external_roots_.find(old_group.storage.unsafeGetStorageImpl());
      if (root != external_roots_.end()) root->second = fresh;
    }
    move_externals(old, fresh);
    repoint(old, fresh);
    move_exposure(old, fresh);
    // Wrappers of the written argument on the stack name the new version too.
    for (const Slot& s : in.slots) {
      if (s.input != unique[j]) continue;
      for_tensors(originals[s.arg], [&](const at::Tensor& t, int elem) {
        if (elem != s.elem) return;
        if (DTRTensorImpl* w = wrapper_of(t)) {
          if (w->cell().get() == old.get()) name_cell(w, fresh, g.storage);
        }
      });
    }
    // The engine released the old version; other live views of the storage
    // now see the new data: each is re-registered as a view of the new version.
    old->released = true;
    old_group.live--;
    for (const CellPtr& alias : std::vector<CellPtr>(old_group.cells.begin(), old_group.cells.end())) {
      if (alias.get() == old.get() || alias->released) continue;
      if (alias->wrappers.load() == 0 && !alias->external) continue;
      int64_t b = fresh->id;
      int64_t size = 1;
      for (int64_t s : alias->sizes) size *= s;
      size *= static_cast<int64_t>(alias->dtype.itemsize());
      int32_t zero = 0;
      int64_t id = -1;
      int64_t view_op = engine().call(h_, "alias", &b, 1, &size, &zero, 1, 0, recording_ ? 0 : kNoRecompute, &id);
      if (view_op < 0) fail("memscale_dtr_call(alias)");
      CellPtr view = c10::make_intrusive<Cell>(id, fresh->root, view_op);
      view->sizes = alias->sizes;
      view->strides = alias->strides;
      view->offset = alias->offset;
      view->dtype = alias->dtype;
      view->device = alias->device;
      view->conj = alias->conj;
      view->neg = alias->neg;
      view->pinned = fresh->pinned;
      view->session.store(this);
      g.cells.push_back(view);
      g.live++;
      if (recording_) {
        auto rec = std::make_unique<RecordedOp>(op);
        rec->kind = RerunKind::kView;
        rec->inputs = {fresh};
        rec->outputs = {view};
        ops_[view_op] = std::move(rec);
      }
      repoint(alias, view);
      move_externals(alias, view);
      move_exposure(alias, view);
      alias->released = true;  // the engine keeps it only as the old version's view
      release_ids_.push_back(alias->id);
      old_group.live--;
    }
    old_group.storage = c10::Storage();
    for (const CellPtr& c : old_group.cells) c->tensor.reset();
    share(old_group);  // a wrapper still naming an old version (none should) holds nothing
    versions.push_back(fresh);
  }
  if (record != nullptr) {
    auto rec = std::make_unique<RecordedOp>(*record);
    rec->kind = RerunKind::kMutation;
    rec->outputs.assign(versions.begin(), versions.end());
    rec->mutated = unique;
    // Every other written argument is left alone by a re-run (scratch copies).
    rec->scratch.clear();
    for (int pos : f.mutated) {
      bool versioned = false;
      for (int u : unique) {
        for (const Slot& s : in.slots) versioned = versioned || (s.input == u && s.arg == pos);
      }
      if (!versioned) rec->scratch.push_back(pos);
    }
    rec->fresh_bytes = 0;
    for (const CellPtr& v : versions) rec->fresh_bytes += groups_.at(v->root).nbytes;
    ops_[op_id] = std::move(rec);
    fingerprint_outputs(f, versions);
  }
}

// ---------------------------------------------------------------- rebuilding

void Session::materialize(const CellPtr& cell, Held& held) {
  for (int attempt = 0; attempt < kMaxPlansPerCell; ++attempt) {
    if (derive(cell)) {
      held.lock(cell->id);
      return;
    }
    send_releases();
    int32_t kinds[1024];
    int64_t ids[1024];
    int32_t n = engine().plan(h_, cell->id, kinds, ids, 1024);
    if (n < 0) fail("memscale_dtr_plan(" + std::to_string(cell->id) + ")");
    TORCH_CHECK(n <= 1024, "memscale.dtr: a rebuild plan of ", n, " steps is longer than the native region's 1024");
    TORCH_CHECK(n > 0 || groups_.at(cell->root).resident(), "memscale.dtr: the engine holds storage ", cell->root,
                " resident, but the region has no data for it");
    if (n == 0 && derive(cell, true)) continue;  // the engine holds it defined: re-derive it
    for (int32_t i = 0; i < n; ++i) {
      if (kinds[i] == kStepSwapIn) {
        swap_in(ids[i]);
      } else {
        rerun(ids[i]);
      }
    }
  }
  TORCH_CHECK(false, "memscale.dtr: tensor ", cell->id, " was evicted again by every one of ", kMaxPlansPerCell,
              " rebuild plans; raise the budget");
}

void Session::swap_in(int64_t root) {
  Group& g = groups_.at(root);
  TORCH_CHECK(g.host.defined(), "memscale.dtr: the engine asked to copy back storage ", root,
              ", which was never copied out");
  const c10::Device device = g.cells.front()->device;
  if (budgeted_) make_room(g.nbytes, "a copy back from host memory");
  {
    KernelGuard guard;
    g.storage = g.host.to(device).storage();
  }
  g.host.reset();
  share(g);
  if (engine().swapped_in(h_, root) < 0) fail("memscale_dtr_swapped_in");
}

void Session::rerun(int64_t op_id) {
  std::unique_ptr<RecordedOp>* found = ops_.find(op_id);
  TORCH_CHECK(found != nullptr && *found, "memscale.dtr: the engine asked to re-run op ", op_id,
              ", which was not recorded");
  RecordedOp& r = **found;
  Held held(*this);
  Level level(*this, r.inputs);
  for (const CellPtr& c : r.inputs) {
    if (derive(c)) {
      held.lock(c->id);
    } else {
      materialize(c, held);
    }
  }
  unpark(r.inputs, held);
  if (r.kind == RerunKind::kView) {
    // Its base is resident now: the view is derived from it.
    for (const CellPtr& c : r.outputs) derive(c, true);
    if (engine().rematerialized(h_, op_id, 0) < 0) fail("memscale_dtr_rematerialized");
    return;
  }
  // Room for what the re-run allocates: its fresh results, and the scratch
  // copies of the arguments it must not write again (batch norm's running
  // statistics) - the copies of a mutation's old versions are in fresh_bytes.
  int64_t scratch_bytes = 0;
  for (size_t k = 0; k < r.inputs.size(); ++k) {
    for (const Slot& s : r.slots) {
      if (s.input == static_cast<int>(k) && std::find(r.scratch.begin(), r.scratch.end(), s.arg) != r.scratch.end()) {
        scratch_bytes += groups_.at(r.inputs[k]->root).nbytes;
        break;
      }
    }
  }
  if (budgeted_ && r.fresh_bytes + scratch_bytes) {
    try {
      make_room(r.fresh_bytes + scratch_bytes, "a re-run of " + r.op.schema().name());
    } catch (const NoRoomError&) {
      if (!r.outputs.empty()) room_failed_.push_back(r.outputs.front());
      throw;
    }
  }
  c10::SmallVector<at::Tensor, 4> reals;
  reals.reserve(r.inputs.size());
  std::vector<c10::Storage> copies(r.inputs.size());
  for (size_t k = 0; k < r.inputs.size(); ++k) {
    const CellPtr& c = r.inputs[k];
    derive(c);
    bool copy = false;
    if (r.kind == RerunKind::kMutation) {
      copy = std::find(r.mutated.begin(), r.mutated.end(), static_cast<int>(k)) != r.mutated.end();
    }
    for (const Slot& s : r.slots) {
      if (s.input == static_cast<int>(k) && std::find(r.scratch.begin(), r.scratch.end(), s.arg) != r.scratch.end()) {
        copy = true;
      }
    }
    if (copy) {
      copies[k] = copy_storage(c->tensor.storage(), c->device);
      reals.push_back(view_of(copies[k], *c));
    } else {
      reals.push_back(c->tensor);
    }
  }
  torch::jit::Stack stack(r.args.begin(), r.args.end());
  if (r.shape_only) {
    const at::Tensor& meta = r.args[0].toTensor();
    const CellPtr& any = r.outputs.front();
    KernelGuard guard;
    stack[0] = at::empty_strided(meta.sizes(), meta.strides(), meta.options().device(any->device));
  }
  fill(stack.data(), r.slots, reals);
  c10::optional<at::Tensor> saved;
  if (r.rng_state.defined()) {
    std::lock_guard<std::mutex> lock(r.generator->mutex());
    saved = r.generator->get_state();
    r.generator->set_state(r.rng_state);
  }
  int64_t t0 = clock_.start();
  try {
    KernelGuard kernel;
    c10::AutoGradMode grad_mode(r.grad_mode);
    r.op.callBoxed(&stack);
  } catch (...) {
    if (saved) {
      std::lock_guard<std::mutex> lock(r.generator->mutex());
      r.generator->set_state(*saved);
    }
    throw;
  }
  int64_t cost = clock_.since(t0);
  if (saved) {
    std::lock_guard<std::mutex> lock(r.generator->mutex());
    r.generator->set_state(*saved);
  }
  counters_.reruns++;
  if (r.kind == RerunKind::kMutation) {
    for (size_t j = 0; j < r.outputs.size(); ++j) {
      Group& g = groups_.at(r.outputs[j]->root);
      if (!g.resident()) {
        g.storage = copies[r.mutated[j]];
        share(g);
        if (verify_) check_rebuilt(r, j, view_of(g.storage, *r.outputs[j]));
      }
    }
  } else {
    std::vector<at::Tensor> outs;
    for (const c10::IValue& v : stack) {
      for_tensors(v, [&](const at::Tensor& t, int) {
        if (!t.defined() || (t.layout() == at::kStrided && t._is_zerotensor())) return;
        outs.push_back(t);
      });
    }
    TORCH_CHECK(outs.size() == r.outputs.size(), "memscale.dtr: a re-run of ", r.op.schema().name(), " returned ",
                outs.size(), " tensors, its first run ", r.outputs.size());
    for (size_t k = 0; k < outs.size(); ++k) {
      const CellPtr& c = r.outputs[k];
      if (c->root != c->id) {
        // A view: it is what the re-run returned (on its base's storage).
        if (!c->tensor.defined() && groups_.at(c->root).resident()) c->tensor = outs[k];
        continue;
      }
      Group& g = groups_.at(c->root);
      if (!g.resident()) {
        g.storage = outs[k].storage();
        share(g);
        if (verify_) check_rebuilt(r, k, outs[k]);
      }
    }
  }
  if (engine().rematerialized(h_, op_id, cost) < 0) fail("memscale_dtr_rematerialized");
}

at::Tensor Session::read(const CellPtr& cell) {
  std::lock_guard<std::recursive_mutex> guard(mu_);
  Busy busy(*this);
  if (cell->session.load() != this || closed_) {
    TORCH_CHECK(cell->tensor.defined(),
                "memscale.dtr: this tensor was evicted inside a memscale.dtr region that exited with an error; "
                "its data cannot be rebuilt");
    return cell->tensor;
  }
  {
    Held held(*this);
    rebuild(cell, held);
  }
  at::Tensor t = cell->tensor;
  after_op();
  return t;
}

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
      c->session.store(nullptr);
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
  {
    std::lock_guard<std::mutex> g(release_mu_);
    released_.clear();
  }
  return handed;
}

// ----------------------------------------------------------------- outside

void run_outside(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  c10::IValue* args = stack->data() + (stack->size() - n);
  for (size_t i = 0; i < n; ++i) {
    bool owned = false;
    std::vector<std::pair<int, at::Tensor>> reals;
    for_tensors(args[i], [&](const at::Tensor& t, int elem) {
      DTRTensorImpl* w = wrapper_of(t);
      if (w == nullptr) return;
      const CellPtr& cell = w->cell();
      Session* s = cell->session.load();
      at::Tensor real = s != nullptr ? s->read(cell) : cell->tensor;
      TORCH_CHECK(real.defined(),
                  "memscale.dtr: this tensor was evicted inside a memscale.dtr region that exited with an error; "
                  "its data cannot be rebuilt");
      reals.emplace_back(elem, real);
    });
    for (auto& [elem, real] : reals) {
      if (elem >= 0 && !owned) {
        own_lists(args[i]);
        owned = true;
      }
      set_tensor(args[i], elem, real);
    }
  }
  KernelGuard kernel;
  op.callBoxed(stack);
}

}  // namespace memscale

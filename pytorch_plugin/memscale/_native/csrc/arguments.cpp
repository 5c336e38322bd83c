// Session members: an op's arguments and results - the cells its tensors
// name (plain tensors registered as pinned externals on first sight), the
// real tensors put in their place, and the registration of its results with
// the engine (memscale_dtr_op, or queued for memscale_dtr_ops) as new cells.
#include "session.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "errors.h"
#include "graph_leaves.h"
#include "session_util.h"
#include "wrapper.h"

namespace memscale {

namespace {

constexpr int64_t kBatchOps = 64;  // registrations queued per memscale_dtr_ops crossing (no budget)

// MEMSCALE_NATIVE_TRACE=1: one line per registered op on stderr (debugging).
bool trace_ops() {
  static const bool on = [] {
    const char* v = std::getenv("MEMSCALE_NATIVE_TRACE");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

}  // namespace

// --------------------------------------------------------------- externals

CellPtr Session::cell_of(const at::Tensor& t) {
  if (DTRTensorImpl* w = wrapper_of(t)) {
    const CellPtr& cell = w->cell();
    if (cell->session.load() == this) return cell;
    // A wrapper of an earlier entry: its real tensor is an external here, and
    // the graph that entry built may accumulate gradients in this one.
    const size_t first = leaves_.size();
    graph_leaves(t, graph_seen_, leaves_);
    if (leaves_.size() > first) note_leaves(first);
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
  if (t.layout() != at::kStrided) refuse_layout(t.layout(), "an op");
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
  const size_t first = leaves_.size();
  if (t.requires_grad() && t.is_leaf()) leaves_.emplace_back(t.getIntrusivePtr());
  graph_leaves(t, graph_seen_, leaves_);  // a graph built outside the entry
  if (leaves_.size() > first) note_leaves(first);  // their gradients pinned once accumulated
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

// Puts `real(slot.input)` where each slot says (lists copied first, once).
template <typename Real>
void fill_slots(c10::IValue* args, c10::ArrayRef<Slot> slots, Real&& real) {
  int last_owned = -1;
  for (const Slot& s : slots) {
    if (s.elem >= 0 && s.arg != last_owned) {
      own_lists(args[s.arg]);
      last_owned = s.arg;
    }
    set_tensor(args[s.arg], s.elem, real(s.input));
  }
}

}  // namespace

void Session::fill(c10::IValue* args, c10::ArrayRef<Slot> slots, c10::ArrayRef<at::Tensor> reals) {
  fill_slots(args, slots, [&](int i) -> const at::Tensor& { return reals[i]; });
}

void Session::fill(c10::IValue* args, c10::ArrayRef<Slot> slots, c10::ArrayRef<CellPtr> cells) {
  fill_slots(args, slots, [&](int i) -> const at::Tensor& { return cells[i]->tensor; });
}

// ----------------------------------------------------------------- results

void Session::flatten_results(c10::IValue* results, size_t n, Outputs& out) {
  for (size_t r = 0; r < n; ++r) {
    for_tensors(results[r], [&](const at::Tensor& t, int elem) {
      if (!t.defined()) return;
      if (t.layout() == at::kStrided && t._is_zerotensor()) return;  // a constant, handed back as it is
      if (t.layout() != at::kStrided) {
        throw RefusedError("memscale.dtr: an op returned a " + python_layout_name(t.layout()) +
                           " tensor; only strided (dense) tensors can live in a DTR region (run this op outside "
                           "the region)");
      }
      out.tensors.push_back(t);
      out.places.emplace_back(static_cast<int>(r), elem);
    });
  }
}

CellList Session::register_call(const OpFacts& f, const Inputs& in, const Outputs& out, int64_t cost,
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
  CellList cells = make_cells(in, out, op_id, w, sizes, aliases);
  int64_t handed = w[n_out];
  carry_out_handed(w + n_out + 1, handed);
  *fresh_bytes = fresh;
  return cells;
}

CellList Session::make_cells(const Inputs& in, const Outputs& out, int64_t op_id, const int64_t* ids,
                             c10::ArrayRef<int64_t> sizes, c10::ArrayRef<int64_t> aliases) {
  const size_t n_out = out.tensors.size();
  CellList cells;
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
    cell->session.store(this, std::memory_order_release);
    cells.push_back(std::move(cell));
  }
  return cells;
}

CellList Session::queue_call(const OpFacts& f, const Inputs& in, const Outputs& out, int64_t cost,
                             c10::ArrayRef<int64_t> sizes, c10::ArrayRef<int64_t> aliases, int64_t fresh,
                             int64_t* fresh_bytes) {
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
  const size_t at = batch_.size();
  batch_.resize(at + 8 + n_rel + n_in + 2 * n_out);
  int64_t* w = batch_.data() + at;
  std::memcpy(w, header, sizeof(header));
  w += 8;
  if (n_rel) std::memcpy(w, release_ids_.data(), n_rel * sizeof(int64_t));
  w += n_rel;
  if (n_in) std::memcpy(w, in.ids.data(), n_in * sizeof(int64_t));
  w += n_in;
  if (n_out) {
    std::memcpy(w, sizes.data(), n_out * sizeof(int64_t));
    std::memcpy(w + n_out, aliases.data(), n_out * sizeof(int64_t));
  }
  release_ids_.clear();
  ++batch_ops_;
  queued_fresh_ += fresh;
  if (trace_ops()) {
    fprintf(stderr, "memscale native: op %lld %s in=%zu out=%zu released=%zu (queued)\n",
            static_cast<long long>(op_id), f.name.c_str(), n_in, n_out, n_rel);
  }
  c10::SmallVector<int64_t, 4> ids;
  for (size_t k = 0; k < n_out; ++k) ids.push_back(first + static_cast<int64_t>(k));
  CellList cells = make_cells(in, out, op_id, ids.data(), sizes, aliases);
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
  if (f.index < name_ids_.size() && name_ids_[f.index] >= 0) return name_ids_[f.index];
  int64_t id = abi_.name(h_, f.name.c_str());
  if (id < 0) fail("memscale_dtr_name(" + f.name + ")");
  if (name_ids_.size() <= f.index) name_ids_.resize(f.index + 1, -1);
  name_ids_[f.index] = id;
  return id;
}

void Session::wrap_results(c10::IValue* results, Outputs& out, c10::ArrayRef<CellPtr> cells) {
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

}  // namespace memscale

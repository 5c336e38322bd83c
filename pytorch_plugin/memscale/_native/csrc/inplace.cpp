// Session members: in-place ops - a view op that changes its tensor's
// geometry, and ops that write their arguments: new versions of what they
// write (memscale_dtr_mutate), copies on write of pinned storages a recorded
// op read, the program's wrappers and externals moved to the new versions.
#include "session.h"

#include <algorithm>
#include <string>

#include "dispatch_key.h"
#include "errors.h"
#include "output_sizes.h"
#include "session_util.h"
#include "wrapper.h"

namespace memscale {

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
    Running running(*this, in.cells);  // a reclaim during the kernel leaves its inputs alone
    KernelGuard kernel;
    op.callBoxed(stack);
  }
  int64_t cost = clock_.since(t0);
  Outputs out;
  out.tensors.push_back(view);
  out.places.emplace_back(0, -1);
  int64_t fresh = 0;
  CellList cells = register_call(f, in, out, cost, &fresh);
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
    Running running(*this, in.cells);  // a reclaim during the kernel leaves its inputs alone
    KernelGuard kernel;
    op.callBoxed(stack);
  }
  int64_t cost = clock_.since(t0);
  std::vector<int> resized;
  for (const Written& w : written) {
    if (w.real.storage().unsafeGetStorageImpl() == w.storage && w.real.sizes().vec() == w.sizes) continue;
    if (!w.plain) {
      throw RefusedError(c10::str("memscale.dtr: ", f.name, " resized a region tensor in place from ",
                                  c10::IntArrayRef(w.sizes), " to ", w.real.sizes(),
                                  "; the native region does not follow resizes of its own tensors (the Python "
                                  "region, MEMSCALE_NATIVE=0, follows those that stay within the tensor's memory); "
                                  "use the out-of-place op instead"));
    }
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
    CellList cells = register_call(f, in, out, cost, &fresh);
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

}  // namespace memscale

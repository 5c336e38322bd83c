// Session members: rebuilding an evicted tensor from the engine's plans
// (re-runs of recorded ops, copies back from host memory), the nested
// restarts and the parking of outer levels when a plan finds no room, and
// read(), a cell's real tensor.
#include "session.h"

#include <algorithm>
#include <string>
#include <unordered_set>

#include <ATen/ScalarOps.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>

#include "dispatch_key.h"
#include "errors.h"
#include "session_util.h"

namespace memscale {

namespace {

constexpr int kMaxPlansPerCell = 64;
constexpr int kNestedRestarts = 4;  // times the outermost rebuild starts over (see Session::rebuild)

}  // namespace

// ---------------------------------------------------------------- rebuilding

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

void Session::materialize(const CellPtr& cell, Held& held) {
  for (int attempt = 0; attempt < kMaxPlansPerCell; ++attempt) {
    if (derive(cell)) {
      held.lock(cell->id);
      return;
    }
    send_releases();
    // Plans of any length: a longer one than the buffer holds is counted,
    // not written or held, and asked for again into a buffer of its size
    // (the engine's state is the same, so is the plan).
    c10::SmallVector<int32_t, 32> kinds(32);
    c10::SmallVector<int64_t, 32> ids(32);
    int32_t n = engine().plan(h_, cell->id, kinds.data(), ids.data(), static_cast<int32_t>(kinds.size()));
    if (n > static_cast<int32_t>(kinds.size())) {
      kinds.resize(n);
      ids.resize(n);
      n = engine().plan(h_, cell->id, kinds.data(), ids.data(), n);
      TORCH_CHECK(n <= static_cast<int32_t>(kinds.size()), "memscale.dtr: the engine's plan for tensor ", cell->id,
                  " grew between two calls (", kinds.size(), " then ", n, " steps)");
    }
    if (n < 0) fail("memscale_dtr_plan(" + std::to_string(cell->id) + ")");
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
  for (size_t i = 0; i < stack.size() && i < RecordedOp::kNumberArgs; ++i) {
    if (r.numbers & (uint32_t{1} << i)) stack[i] = at::native::wrapped_scalar_tensor(stack[i].toScalar());
  }
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

// ------------------------------------------------------------------ parking

bool Session::park_outer_levels(int64_t extra) {
  if (levels_.size() < 2) return false;
  std::unordered_set<int64_t> seen;  // the innermost level's storages, then each one tried
  for (const CellPtr& c : levels_.back()) seen.insert(c->root);
  bool parked = false;
  for (size_t l = 0; l + 1 < levels_.size(); ++l) {
    for (const CellPtr& cell : levels_[l]) {
      // By its storage, not its tensor: a view whose storage came back (a
      // copy back, its base re-run) has no tensor until its own view op
      // re-runs (derive), yet its storage is resident and locked all the
      // same. Skipped, it kept the room an inner level needed: GPT-2 with
      // checkpointing at 30 % failed so (a bmm's view input, locked by the
      // op's level, came back while the other input's nested plans ran,
      // and their next step found nothing evictable). The Python region's
      // copy back re-makes the views it copied out, so its own tensor check
      // missed fewer of them.
      if (!seen.insert(cell->root).second) continue;
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

}  // namespace memscale

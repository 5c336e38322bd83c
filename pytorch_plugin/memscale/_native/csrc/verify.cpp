// Session members: verified rebuilds (memscale.check) - a fingerprint of each
// fresh tensor's first run, checked against every rebuild of it.
#include "session.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/view_as_real.h>

#include "dispatch_key.h"

namespace memscale {

// ---------------------------------------------------------- verification

namespace {

// Two reductions of a tensor's bits read as integers: their sum and a sum
// weighted by position (same tensor -> same fingerprint; a pass over the
// data, no copy kept). The C++ twin of memscale/_region/verify.py's. Each
// of the two sums read by the host is a synchronization on a GPU.
constexpr int64_t kFingerprintSyncs = 2;

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

void Session::fingerprint_outputs(const OpFacts& f, c10::ArrayRef<CellPtr> cells) {
  if (!verify_ || !f.reproducible) return;
  for (const CellPtr& c : cells) {
    if (c->root == c->id && c->tensor.defined()) {
      prints_[c->id] = fingerprint(c->tensor);
      counters_.synchronizations += kFingerprintSyncs;
    }
  }
}

void Session::check_rebuilt(const RecordedOp& r, size_t k, const at::Tensor& rebuilt) {
  auto it = prints_.find(r.outputs[k]->id);
  if (it == prints_.end()) return;
  counters_.synchronizations += kFingerprintSyncs;
  TORCH_CHECK(fingerprint(rebuilt) == it->second, "memscale.check: re-running ", r.op.schema().name(),
              " gave different values for its output ", k,
              " than its first run; this op cannot be rematerialized bitwise");
}

}  // namespace memscale

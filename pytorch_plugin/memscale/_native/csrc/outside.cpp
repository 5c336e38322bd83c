// run_outside: an op run as outside any region (wrappers replaced by their
// real tensors, rebuilt through their open session when evicted).
#include "session.h"

#include "dispatch_key.h"
#include "session_util.h"
#include "wrapper.h"

namespace memscale {

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

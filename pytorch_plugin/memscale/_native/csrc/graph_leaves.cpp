#include "graph_leaves.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

namespace memscale {

void graph_leaves(const at::Tensor& t, std::unordered_set<const void*>& seen, std::vector<WeakImpl>& leaves) {
  const auto root = t.grad_fn();  // a shared_ptr before torch 2.15, an intrusive_ptr since
  if (!root) return;
  std::vector<torch::autograd::Node*> stack{root.get()};
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      const at::Tensor& leaf = acc->variable;
      if (leaf.defined() && leaf.requires_grad() && seen.insert(leaf.unsafeGetTensorImpl()).second) {
        leaves.emplace_back(leaf.getIntrusivePtr());
      }
      continue;
    }
    for (const torch::autograd::Edge& edge : node->next_edges()) stack.push_back(edge.function.get());
  }
}

}  // namespace memscale

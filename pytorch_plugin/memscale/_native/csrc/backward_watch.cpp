#include "backward_watch.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

namespace memscale {

BackwardWatch::BackwardWatch() : passes_(std::make_shared<Passes>()) {}

BackwardWatch::Verdict BackwardWatch::see() {
  if (failed()) return Verdict::kFailed;
  const int task = torch::autograd::get_current_graph_task_id();
  std::lock_guard<std::mutex> lock(passes_->mu);
  if (task != -1) {
    if (passes_->open.insert(task).second) {
      std::weak_ptr<Passes> weak = passes_;
      torch::autograd::Engine::get_default_engine().queue_callback([weak, task] {
        if (std::shared_ptr<Passes> p = weak.lock()) {
          std::lock_guard<std::mutex> done(p->mu);
          p->open.erase(task);
        }
      });
    }
    return Verdict::kRunning;
  }
  if (passes_->open.empty()) return Verdict::kRunning;
  passes_->open.clear();
  failed_.store(true, std::memory_order_release);
  return Verdict::kRaised;
}

}  // namespace memscale

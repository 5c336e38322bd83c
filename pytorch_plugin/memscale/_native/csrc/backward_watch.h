// Which backward passes ran ops of a native session, and whether one raised.
//
// The C++ twin of RegionMode._watch (memscale/_region/mode.py), for the
// drop-in steps (DTRRegion.ends_on_failed_backward). A backward pass that
// runs an op of the entry queues a callback for its end, and autograd's
// engine runs queued callbacks only when a pass completes: an op that runs
// outside every backward pass while a pass it saw is still unfinished means
// that pass raised and the program caught the error. The step is over then:
// that op and every op after it run as outside the region.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_set>

namespace memscale {

class BackwardWatch {
 public:
  enum class Verdict {
    kRunning,  // no pass raised (or one is under way)
    kRaised,   // a pass raised: found just now (the caller ends the step)
    kFailed,   // a pass raised: found before
  };

  BackwardWatch();

  // What an op about to run (on any thread) says of the passes.
  Verdict see();
  bool failed() const { return failed_.load(std::memory_order_acquire); }

 private:
  // Shared with the callbacks, which may run after the session is gone.
  struct Passes {
    std::mutex mu;
    std::unordered_set<int> open;  // graph task ids seen, not yet completed
  };
  std::shared_ptr<Passes> passes_;
  std::atomic<bool> failed_{false};
};

}  // namespace memscale

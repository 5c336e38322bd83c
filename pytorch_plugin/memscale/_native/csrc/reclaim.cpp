// The allocator's reclaim on the native path: an allocation of this session's
// device that failed asks the engine for victims whatever the budget
// (memscale_dtr_reclaim) and drops or swaps them out, which frees their
// memory while the allocator waits (memscale/_region/reclaim.py calls it,
// newest session first; the Python session's reclaim does the same).

#include <mutex>

#include "session.h"
#include "session_util.h"

namespace memscale {

namespace {
constexpr int32_t kReclaimBatch = 64;  // victims per memscale_dtr_reclaim call
}  // namespace

int64_t Session::reclaim(int64_t need) {
  // The thread running this session's op - whose kernel's allocation is what
  // usually fails - holds mu_ already and may go on (recursive); another
  // thread gets -1 rather than changing the session under it.
  std::unique_lock<std::recursive_mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return -1;
  if (closed_ || need <= 0) return 0;
  Busy busy(*this);
  // The inputs of the kernel under way are locked while the engine chooses
  // (those of a re-run are locked already, by its plan's hold).
  Held held(*this);
  for (const CellPtr& c : running_) {
    if (derive(c)) held.lock(c->id);
  }
  int64_t ids[kReclaimBatch];
  int32_t actions[kReclaimBatch];
  int64_t freed = 0;
  while (true) {
    const int32_t n = engine().reclaim(h_, need, ids, actions, kReclaimBatch);
    if (n < 0) fail("memscale_dtr_reclaim(" + std::to_string(need) + ")");
    for (int32_t i = 0; i < n; ++i) {
      if (const Group* g = groups_.find(ids[i]); g != nullptr && g->resident()) freed += g->nbytes;
      carry_out(ids[i], actions[i]);
    }
    if (n < kReclaimBatch) return freed;  // the engine found all it could
  }
}

}  // namespace memscale

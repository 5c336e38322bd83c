// One entry of a native DTR region: its engine handle and its bookkeeping.
//
// The C++ twin of memscale/_region/session.py + dispatch.py + rebuild.py for
// the per-op path. A Session lives from a region's entry to its exit; the
// engine instance is created and destroyed by Python (memscale._native.engine),
// which hands its handle over. For every op the region's kernel hands over
// (Session::dispatch):
//
//  1. releases queued by dying wrappers go to the engine with the op;
//  2. the arguments become cells: wrappers name theirs, plain tensors are
//     registered as pinned externals on first sight;
//  3. evicted inputs are rebuilt from the engine's plans (re-runs of recorded
//     ops, copies back from host memory), every input locked meanwhile;
//  4. under a budget the engine makes room first for the bytes the op is about
//     to allocate (learned per op and argument shapes; predicted on the meta
//     device the first time);
//  5. the op runs on the real tensors, is registered (memscale_dtr_op: one
//     call with the releases, handing back the storages the engine freed;
//     queued instead when no decision waits on it - no budget, or room for
//     what it allocated - kBatchOps records to a crossing of
//     memscale_dtr_ops, the ids predicted from the status block) and
//     recorded for re-runs; its results come back as wrappers;
//  6. the budget loop runs when the engine's status block says it has work.
//
// In-place ops make new versions (memscale_dtr_mutate): the wrapper moves to the
// new version, the old one stays recomputable; a pinned storage that a
// recorded op read is copied before it is overwritten. Decides nothing: the
// engine chooses victims and plans rebuilds.
//
// Its members are defined by concern, one file each: session.cpp
// (construction, dispatch), releases.cpp (releases, evictions), arguments.cpp
// (externals, arguments, the registration of results), recording.cpp (records
// for re-runs, size predictions), verify.cpp (verified rebuilds), inplace.cpp
// (in-place ops, copy-on-write), rebuild.cpp (rebuilds, parking), close.cpp
// (the exit), grad_pin.cpp (gradients pinned once accumulated); run_outside
// is outside.cpp's. What several of them share (the private nested types,
// helpers on arguments) is in session_util.h.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "backward_watch.h"
#include "borrowed.h"
#include "cell.h"
#include "device_timer.h"
#include "engine_abi.h"
#include "id_table.h"
#include "op_clock.h"
#include "op_facts.h"

namespace memscale {

// What Python tells a session about its entry.
struct SessionOptions {
  int64_t handle = 0;          // the engine instance (memscale_dtr_create)
  std::string library;         // the loaded libmemscale.so
  bool budgeted = false;       // a budget > 0, or the stress setting
  bool recording = true;       // ops are recorded (recompute allowed)
  int64_t usage_address = 0;   // the allocator's published usage (usage "allocator"), or 0
  int64_t drain_batch = 256;   // without a budget: freed storages fetched this many at a time
  bool verify = false;         // every rebuild is checked against its first run (memscale.check)
  int64_t test_op_cost_ns = 0;     // tests: every op costs this (0: measured; op_clock.h)
  uint64_t test_op_cost_seed = 0;  // tests: nonzero, costs drawn around it from this seed
  int64_t test_device_ns = 0;      // tests: CPU ops timed with events that say this (device_timer.h)
};

// Counters of the native path itself (the engine keeps the DTR counters).
struct SessionCounters {
  int64_t ops = 0;
  int64_t reruns = 0;
  int64_t predictions = 0;       // output sizes predicted on the meta device
  int64_t copies_on_write = 0;
  int64_t externals = 0;
  int64_t nested_restarts = 0;   // rebuilds started over after nested plans found no room
  int64_t parked = 0;            // storages outer levels of a rebuild held, parked in host memory
  int64_t exposed = 0;           // cells whose data pointer or storage was taken (Session::expose)
  int64_t device_timed = 0;      // calls whose device time was read from events (device_timer.h)
  int64_t synchronizations = 0;  // host reads of device values (verified rebuilds' fingerprints)
  int64_t gradients_pinned = 0;  // accumulated gradients pinned (Session::pin_gradient)
};

class Session {
 public:
  explicit Session(const SessionOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Runs one op inside the region (the kernel's job while this session is
  // active). `borrowed`: the stack's tensors the caller lent without a
  // reference (an unboxed entry's, borrowed.h), or null.
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack, BorrowedArgs* borrowed = nullptr);

  // The real tensor of a cell of this session, rebuilt if evicted.
  at::Tensor read(const CellPtr& cell);

  // A wrapper's data pointer or storage is taken: the cell is rebuilt if
  // evicted and locked until released (a raw pointer may be read after later
  // ops: ctc_loss reads its lengths' after running _ctc_loss).
  void expose(const CellPtr& cell);

  // Autograd accumulated `cell`, a leaf's gradient (the leaf's hook,
  // grad_pin.h): made resident - rebuilt if evicted - and pinned in the
  // engine, once per cell; nothing once closed or for another session's cell.
  void pin_gradient(const CellPtr& cell);

  // A wrapper died: its cell is released at the next op (any thread).
  void queue_release(const CellPtr& cell);

  // Ends the entry: with ok, what escapes is made resident first; gradients
  // of the parameters seen become plain tensors. Returns the escaping
  // wrappers that do not require grad, each with its real tensor (Python
  // hands them back as plain tensors). Every cell is detached afterwards.
  std::vector<std::pair<at::Tensor, at::Tensor>> close(bool ok);

  // The allocator could not meet a request of this session's device (the
  // reclaimer, memscale/_region/reclaim.py): evicts about `need` bytes,
  // whatever the budget, and returns the bytes of the storages it freed; -1
  // when another thread is inside the session (nothing changed under it).
  // The inputs of an op under way are locked, so never chosen (reclaim.cpp).
  int64_t reclaim(int64_t need);

  void set_budgeted(bool budgeted);
  // Sends the queued registrations (before Python calls the engine itself).
  void flush();
  bool closed() const { return closed_; }
  SessionCounters counters() const {
    SessionCounters c = counters_;
    c.device_timed = device_timer_ ? device_timer_->measured() : 0;
    return c;
  }

  // While suspended (an optimizer step) ops run as outside the region.
  std::atomic<bool> suspended{false};

  // Set by the drop-in steps (DTRRegion.ends_on_failed_backward): a backward
  // pass that ran ops of this entry and raised (the program caught the
  // error) ends the step - its plans abandoned, the engine finished - and
  // every op after it runs as outside the region (backward_watch.h).
  std::atomic<bool> watch_backward{false};
  // Whether such a pass raised, first looking (outside any pass) for one.
  bool backward_failed();

 private:
  struct Inputs;
  struct Outputs;
  class Held;
  struct External {
    WeakImpl weak;
    CellPtr cell;
  };

  // Arguments and results.
  void collect(const OpFacts& f, c10::IValue* args, Inputs& in);
  CellPtr cell_of(const at::Tensor& t);
  CellPtr extern_cell(const at::Tensor& t);
  void make_inputs_resident(Inputs& in, Held& held);
  void fill(c10::IValue* args, c10::ArrayRef<Slot> slots, c10::ArrayRef<at::Tensor> reals);
  // The same with each input's real tensor (all resident, derived).
  void fill(c10::IValue* args, c10::ArrayRef<Slot> slots, c10::ArrayRef<CellPtr> cells);
  void flatten_results(c10::IValue* results, size_t n, Outputs& out);
  CellList register_call(const OpFacts& f, const Inputs& in, const Outputs& out, int64_t cost,
                         int64_t* fresh_bytes);
  CellList queue_call(const OpFacts& f, const Inputs& in, const Outputs& out, int64_t cost,
                      c10::ArrayRef<int64_t> sizes, c10::ArrayRef<int64_t> aliases, int64_t fresh,
                      int64_t* fresh_bytes);
  CellList make_cells(const Inputs& in, const Outputs& out, int64_t op_id, const int64_t* ids,
                      c10::ArrayRef<int64_t> sizes, c10::ArrayRef<int64_t> aliases);
  void wrap_results(c10::IValue* results, Outputs& out, c10::ArrayRef<CellPtr> cells);

  // The paths of dispatch.
  void room_for_op(const OpFacts& f, int64_t extra, const Inputs& in, Held& held);
  int64_t run_on_reals(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::IValue* args, const Inputs& in);
  // An op's cost for the engine: its device time where events measure it
  // (the first result on CUDA starts the timer), else `host_ns`.
  int64_t device_cost(const c10::OperatorHandle& op, const at::Tensor& first, std::unique_ptr<DeviceEvent> started,
                      int64_t host_ns);
  void dispatch_pure(const c10::OperatorHandle& op, const OpFacts& f, torch::jit::Stack* stack, BorrowedArgs* borrowed);
  void dispatch_mutating(const c10::OperatorHandle& op, const OpFacts& f, torch::jit::Stack* stack);
  void dispatch_inplace_view(const c10::OperatorHandle& op, const OpFacts& f, torch::jit::Stack* stack);
  c10::Storage copy_old_data(const CellPtr& cell);
  void move_old_version(const CellPtr& cell, const c10::Storage& copy);
  void register_mutation(const OpFacts& f, const c10::OperatorHandle& op, Inputs& in, const std::vector<int>& unique,
                         const std::vector<c10::IValue>& originals, RecordedOp* record, int64_t cost);
  void repoint(const CellPtr& old, const CellPtr& fresh);
  void move_externals(const CellPtr& old, const CellPtr& fresh);

  // Sizes and recording.
  int64_t predict(const c10::OperatorHandle& op, const OpFacts& f, const c10::IValue* args, uint64_t* key);
  void signature(const c10::OperatorHandle& op, const OpFacts& f, const c10::IValue* args, uint64_t* key);
  std::unique_ptr<RecordedOp> start_record(const c10::OperatorHandle& op, const OpFacts& f, const c10::IValue* args,
                                           const Inputs& in);

  // Rebuilding.
  void materialize(const CellPtr& cell, Held& held);
  // Parking (memscale/_region/rebuild.py's): each level of a rebuild (the
  // running op's inputs, then each re-run step's) is on levels_ while it
  // makes its inputs resident. The innermost level that finds nothing
  // evictable has the storages the outer levels hold copied to host memory,
  // outermost first (it reads them last), their locks kept; each level
  // brings back what was parked of its inputs before reading them. So a
  // rebuild needs room for one level's working set at a time.
  class Level;
  bool park_outer_levels(int64_t extra);
  void unpark(c10::ArrayRef<CellPtr> cells, Held& held);
  void rebuild(const CellPtr& cell, Held& held);
  void room_to_leave(const std::vector<CellPtr>& escaping, Held& held);  // the exit, under a budget
  bool derive(const CellPtr& cell, bool view_planned = false);
  void rerun(int64_t op_id);
  void swap_in(int64_t root);

  // The engine. engine() is the way to every entry point: it sends the
  // queued registrations first, so the engine never answers from a past.
  const EngineAbi& engine() {
    if (batch_ops_ > 0) flush();
    return abi_;
  }
  int64_t name_id(const OpFacts& f);
  // Whether this is the session's first call of f's overload without a
  // budget (true once per overload: it is marked seen).
  bool first_unbudgeted_call(const OpFacts& f) {
    if (unbudgeted_seen_.size() <= f.index) unbudgeted_seen_.resize(f.index + 1, false);
    if (unbudgeted_seen_[f.index]) return false;
    unbudgeted_seen_[f.index] = true;
    return true;
  }
  void after_op();
  void make_room(int64_t extra, const std::string& what);
  void evict(int64_t extra, const std::string& why);
  void carry_out(int64_t root, int32_t action);
  void carry_out_handed(const int64_t* pairs, int64_t n);  // (root, action) pairs the engine handed out
  void drop(Group& g);
  // Every wrapper of the group's cells holds its storage (none while evicted):
  // called wherever a group's storage changes.
  void share(Group& g);
  const c10::Storage& storage_of(const CellPtr& cell) const;  // its group's (none: evicted)
  void take_releases();
  void release(const CellPtr& cell);  // mu_ held
  void unexpose(const CellPtr& cell);  // its exposure lock goes (before the cell is released)
  void move_exposure(const CellPtr& old, const CellPtr& fresh);  // an in-place op's new version keeps the lock
  void send_releases();
  void release_expired_externals();
  int64_t usage_now() const;
  [[noreturn]] void fail(const std::string& what) const;
  // Whether this op runs as outside the region: a watched backward pass raised.
  bool after_failed_backward();

  const EngineAbi& abi_;
  const int64_t h_;
  const EngineStatus* status_;
  const bool recording_;
  const std::atomic<int64_t>* usage_live_;
  const int64_t drain_batch_;
  OpClock clock_;
  const int64_t test_device_ns_;
  std::unique_ptr<DeviceTimer> device_timer_;  // from the first result on a timed device
  c10::Device timer_device_{c10::kCPU};
  bool budgeted_ = false;
  int64_t drain_at_ = 1;
  bool closed_ = false;

  std::recursive_mutex mu_;
  // Depth of dispatch/read/close under way (mu_ held): a wrapper dying inside
  // them queues its release instead of changing the groups they walk.
  int busy_ = 0;
  struct Busy {
    explicit Busy(Session& s) : s_(s) { ++s_.busy_; }
    ~Busy() { --s_.busy_; }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;
    Session& s_;
  };
  IdTable<Group> groups_;                      // by root tensor id
  IdTable<std::unique_ptr<RecordedOp>> ops_;   // by op id
  std::unordered_map<const c10::TensorImpl*, External> externals_;
  std::unordered_map<const c10::StorageImpl*, CellPtr> external_roots_;
  // Leaves whose gradients the exit hands back plain: those the entry's ops
  // read, and those of graphs built outside it (graph_leaves.h).
  std::vector<WeakImpl> leaves_;
  std::unordered_set<const void*> graph_seen_;  // graph_leaves' walked nodes and leaves
  // Leaves noted since leaves_[first] that no session handed to the gradient
  // hooker yet go to to_hook_, handed over at the end of the outermost
  // dispatch, mu_ released (grad_pin.h).
  void note_leaves(size_t first);
  std::vector<at::Tensor> to_hook_;
  int64_t last_meta_ = -1;  // what the last prediction's meta run said (-1: none)
  // Overloads (OpFacts::index) whose first call without a budget was looked at.
  std::vector<bool> unbudgeted_seen_;
  // Verified rebuilds: a fingerprint of each fresh tensor's first run.
  const bool verify_;
  std::unordered_map<int64_t, std::pair<int64_t, int64_t>> prints_;
  void fingerprint_outputs(const OpFacts& f, c10::ArrayRef<CellPtr> cells);
  void check_rebuilt(const RecordedOp& r, size_t k, const at::Tensor& rebuilt);

  std::mutex release_mu_;
  std::vector<CellPtr> released_;       // queued by dying wrappers
  std::atomic<bool> any_released_{false};  // released_ may be non-empty (read without the lock per op)
  std::vector<int64_t> release_ids_;    // told to the engine with its next call
  std::vector<int64_t> frame_;
  // Queued registrations (memscale_dtr_ops records) and the ids they take.
  std::vector<int64_t> batch_;
  int64_t batch_ops_ = 0;
  int64_t next_op_ = 0;
  int64_t next_tensor_ = 0;
  int64_t queued_fresh_ = 0;  // bytes the queued registrations allocated
  // Bytes the op under way allocated that the engine has not heard of yet
  // (copies on write, registered after the op ran): in usage_now() and in
  // every room the engine is asked to make meanwhile.
  int64_t unregistered_ = 0;
  // Under a budget: bytes of resident storages the program released since the
  // engine last heard of releases; at kPromptReleaseBytes they are sent at once.
  int64_t dead_bytes_ = 0;
  static constexpr int64_t kPromptReleaseBytes = 1 << 20;
  std::vector<int64_t> name_ids_;  // the engine's name id per overload (OpFacts::index), -1: not named yet
  SessionCounters counters_;
  BackwardWatch backward_;
  int64_t ops_since_scan_ = 0;
  std::vector<CellPtr> room_failed_;  // cells whose nested rebuilds found no room, innermost first
  std::vector<c10::ArrayRef<CellPtr>> levels_;  // what each open level of a rebuild reads, outermost first
  // The inputs of the op whose kernel runs (none: empty), which a reclaim
  // during the kernel locks first (reclaim.cpp). Set around the kernel only:
  // an op's inputs are not locked in the engine otherwise (no crossing).
  c10::ArrayRef<CellPtr> running_;
  struct Running {
    Running(Session& s, c10::ArrayRef<CellPtr> cells) : s_(s), was_(s.running_) { s_.running_ = cells; }
    ~Running() { s_.running_ = was_; }
    Running(const Running&) = delete;
    Running& operator=(const Running&) = delete;
    Session& s_;
    c10::ArrayRef<CellPtr> was_;
  };
};

// The session ops go to, or null (set by the region's entry, process-wide:
// autograd's worker threads run the backward ops of the entered region).
Session* active_session();
void set_active_session(Session* session);

// Runs an op as outside any region: wrappers replaced by their real tensors
// (rebuilt through their open session when evicted), plain results.
void run_outside(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// A tensor on `storage` with the geometry of `cell` (no dispatch).
at::Tensor view_of(const c10::Storage& storage, const Cell& cell);

// The bytes of a whole storage, as a uint8 tensor (no dispatch).
at::Tensor bytes_of(const c10::Storage& storage, const c10::Device& device);

}  // namespace memscale

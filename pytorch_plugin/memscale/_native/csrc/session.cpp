// A session's construction and its dispatch of each op (session.h); its other
// members are defined by concern: releases.cpp, arguments.cpp, recording.cpp,
// verify.cpp, inplace.cpp, rebuild.cpp, close.cpp; run_outside in outside.cpp.
#include "session.h"

#include <string>

#include <ATen/ops/empty_strided.h>
#include <c10/core/ScalarType.h>

#include "dispatch_key.h"
#include "errors.h"
#include "grad_pin.h"
#include "output_sizes.h"
#include "session_util.h"
#include "wrapper.h"

namespace memscale {

namespace {

std::atomic<Session*> g_active{nullptr};

constexpr int64_t kScanExternalsEvery = 1024;

c10::DispatchKeySet plain_keys(const c10::Device& device, caffe2::TypeMeta dtype) {
  return c10::DispatchKeySet(c10::computeDispatchKey(c10::typeMetaToScalarType(dtype), at::kStrided, device));
}

}  // namespace

// The bytes of a whole storage, as a uint8 tensor.
at::Tensor bytes_of(const c10::Storage& storage, const c10::Device& device) {
  Cell bytes(0, 0, 0);
  bytes.dtype = caffe2::TypeMeta::Make<uint8_t>();
  bytes.device = device;
  bytes.sizes = {static_cast<int64_t>(storage.nbytes())};
  bytes.strides = {1};
  return view_of(storage, bytes);
}

// ------------------------------------------------------------------ helpers

Session* active_session() { return g_active.load(std::memory_order_acquire); }
void set_active_session(Session* session) { g_active.store(session, std::memory_order_release); }

at::Tensor view_of(const c10::Storage& storage, const Cell& cell) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), plain_keys(cell.device, cell.dtype),
                                                          cell.dtype);
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(cell.sizes, cell.strides, cell.offset);
  if (cell.conj) impl->_set_conj(true);
  if (cell.neg) impl->_set_neg(true);
  return t;
}

Session::Session(const SessionOptions& o)
    : abi_(EngineAbi::load(o.library)),
      h_(o.handle),
      status_(abi_.status_of(o.handle)),
      recording_(o.recording),
      usage_live_(o.usage_address ? reinterpret_cast<const std::atomic<int64_t>*>(o.usage_address) : nullptr),
      drain_batch_(o.drain_batch),
      clock_(o.test_op_cost_ns, o.test_op_cost_seed),
      test_device_ns_(o.test_device_ns),
      verify_(o.verify) {
  TORCH_CHECK(status_ != nullptr, "memscale native region: engine handle ", o.handle, " is unknown: ",
              abi_.last_error());
  set_budgeted(o.budgeted);
  frame_.resize(1024);
}

Session::~Session() {
  if (!closed_) {
    try {
      close(false);
    } catch (...) {
    }
  }
}

void Session::set_budgeted(bool budgeted) {
  flush();
  budgeted_ = budgeted;
  drain_at_ = budgeted ? 1 : drain_batch_;
}

void Session::fail(const std::string& what) const {
  const char* message = abi_.last_error();
  const std::string text = (message && *message) ? message : "no error message recorded";
  // Go's evict.ErrNoEvictable, as memscale._native.engine tells it apart.
  if (text.find("nothing evictable") != std::string::npos) throw NoRoomError("memscale.dtr: " + what + ": " + text);
  TORCH_CHECK(false, "memscale.dtr: ", what, ": ", text);
}

int64_t Session::usage_now() const {
  // With registrations queued the engine's count lags by what they allocated
  // (their releases are not subtracted: an upper bound, safe for the budget),
  // and by the op's copies on write until they are registered.
  return usage_live_ != nullptr ? usage_live_->load(std::memory_order_relaxed)
                                : status_->usage + queued_fresh_ + unregistered_;
}

// ------------------------------------------------------------------ dispatch

bool Session::after_failed_backward() {
  if (!watch_backward.load(std::memory_order_relaxed)) return false;
  switch (backward_.see()) {
    case BackwardWatch::Verdict::kRunning:
      return false;
    case BackwardWatch::Verdict::kFailed:
      return true;
    case BackwardWatch::Verdict::kRaised:
      break;
  }
  // The step is over: what it planned goes, and its budget binds no more.
  std::lock_guard<std::recursive_mutex> guard(mu_);
  if (!closed_) {
    flush();
    abi_.abandon_plans(h_);
    abi_.finish(h_);
  }
  return true;
}

bool Session::backward_failed() {
  after_failed_backward();
  return backward_.failed();
}

void Session::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack, BorrowedArgs* borrowed) {
  if (after_failed_backward()) {
    if (borrowed != nullptr) borrowed->own();
    run_outside(op, stack);
    return;
  }
  std::vector<at::Tensor> leaves;  // first seen by this op, not hooked yet (grad_pin.h): empty, no allocation
  {
    std::lock_guard<std::recursive_mutex> guard(mu_);
    Busy busy(*this);
    TORCH_CHECK(!closed_, "memscale.dtr: an op reached a region entry that is closed");
    take_releases();
    if (dead_bytes_ >= kPromptReleaseBytes) {
      // Under a budget the engine frees what the program released (the
      // registrations queued meanwhile carry no releases back): large ones are
      // sent now, so their memory goes before the next op allocates, as a plain
      // tensor's would. Left for the next crossing instead, a step's working
      // set grows by up to kBatchOps outputs: GPT-2 on the CPU ran 1.28x plain's
      // CPU time at 100 % of its peak (cold caches, page faults), 1.06x without.
      dead_bytes_ = 0;
      evict(0, "");
    }
    if (++ops_since_scan_ >= kScanExternalsEvery) {
      ops_since_scan_ = 0;
      release_expired_externals();
    }
    counters_.ops++;
    const OpFacts& f = facts_table().of(op);
    c10::IValue* args = stack->data() + (stack->size() - f.n_args);
    const bool writes = !f.inplace_view && f.writes(args);
    // Only a pure op's path replaces borrowed inputs before copying arguments;
    // the others (and a shape-only op, whose `self` is read and replaced)
    // get ordinary references first.
    if (borrowed != nullptr && (f.inplace_view || writes || f.shape_only)) borrowed->own();
    if (f.inplace_view) {
      dispatch_inplace_view(op, f, stack);
    } else if (writes) {
      dispatch_mutating(op, f, stack);
    } else {
      dispatch_pure(op, f, stack, borrowed);
    }
    if (!to_hook_.empty() && busy_ == 1) leaves.swap(to_hook_);  // the outermost dispatch on this thread
  }
  // Python registers the hooks: with mu_ held, taking the GIL could deadlock
  // against a Python thread waiting for mu_ (an unwrap, the gradient hook).
  if (!leaves.empty()) hook_leaves(std::move(leaves));
}

void Session::room_for_op(const OpFacts& f, int64_t extra, const Inputs& in, Held& held) {
  // Under a budget: room for the bytes the op is about to allocate, its
  // inputs locked meanwhile.
  if (!budgeted_ || usage_now() + extra <= status_->budget) return;
  if (held.empty()) {
    for (const CellPtr& c : in.cells) held.lock(c->id);
  }
  make_room(extra, f.name);
  for (const CellPtr& c : in.cells) derive(c);
}

int64_t Session::run_on_reals(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::IValue* args,
                              const Inputs& in) {
  // The op on the real tensors (the stack's wrappers replaced), timed.
  fill(args, in.slots, in.cells);
  int64_t t0 = clock_.start();
  {
    // An allocation of the kernel that fails asks this session to evict
    // (reclaim): it must not take the inputs the kernel reads.
    Running running(*this, in.cells);
    KernelGuard kernel;
    op.callBoxed(stack);
  }
  return clock_.since(t0);
}

int64_t Session::device_cost(const c10::OperatorHandle& op, const at::Tensor& first,
                             std::unique_ptr<DeviceEvent> started, int64_t host_ns) {
  if (device_timer_) return device_timer_->stop(&op.schema(), first.nbytes(), std::move(started), first.device(), host_ns);
  if (first.is_cuda()) {
    device_timer_ = std::make_unique<DeviceTimer>(make_cuda_event);
    timer_device_ = first.device();
  } else if (test_device_ns_ > 0) {
    const int64_t ns = test_device_ns_;
    device_timer_ = std::make_unique<DeviceTimer>([ns] { return make_fixed_event(ns); });
    timer_device_ = first.device();
  }
  return host_ns;  // the calls after this one are timed
}

void Session::dispatch_pure(const c10::OperatorHandle& op, const OpFacts& f, torch::jit::Stack* stack,
                            BorrowedArgs* borrowed) {
  c10::IValue* args = stack->data() + (stack->size() - f.n_args);
  Inputs in;
  collect(f, args, in);
  Held held(*this);
  if (in.missing) make_inputs_resident(in, held);
  if (borrowed != nullptr && borrowed->any()) {
    // The program's tensors are borrowed (an unboxed entry): every input
    // takes its real tensor now, before anything below copies an argument
    // (a copy of a tensor Python owns takes the GIL); what is left (a
    // wrapped number, a zero tensor) becomes an ordinary reference.
    const size_t base = stack->size() - f.n_args;
    for (const Slot& s : in.slots) {
      if (s.elem < 0) borrowed->take(base + static_cast<size_t>(s.arg));
    }
    fill(args, in.slots, in.cells);
    borrowed->own();
  }
  uint64_t size_key = 0;
  int64_t extra = 0;
  bool predicted = false;
  if (!f.all_views && (budgeted_ || first_unbudgeted_call(f))) {
    // Without a budget only the first call of each overload in this session
    // is looked at: its meta prediction against its real bytes (the ratio
    // the budgeted regions scale their predictions by).
    extra = predict(op, f, args, &size_key);
    if (!budgeted_) extra = 0;
    predicted = true;
    room_for_op(f, extra, in, held);
  }
  std::unique_ptr<RecordedOp> rec = recording_ ? start_record(op, f, args, in) : nullptr;
  std::unique_ptr<DeviceEvent> started = device_timer_ ? device_timer_->start(&op.schema(), timer_device_) : nullptr;
  if (f.shape_only) {
    // `self` gives metadata only: its own data if resident, else a stand-in.
    const at::Tensor self = args[0].toTensor();
    if (DTRTensorImpl* w = wrapper_of(self)) {
      const CellPtr& c = w->cell();
      if (c->session.load() == this && derive(c)) {
        args[0] = c->tensor;
      } else if (c->session.load() != this && c->tensor.defined()) {
        args[0] = c->tensor;
      } else {
        KernelGuard guard;
        args[0] = at::empty_strided(self.sizes(), self.strides(), self.options().device(c->device));
      }
    }
  }
  int64_t cost = run_on_reals(op, stack, args, in);
  c10::IValue* results = stack->data() + (stack->size() - f.n_returns);
  Outputs out;
  flatten_results(results, f.n_returns, out);
  if (out.tensors.empty()) return;
  cost = device_cost(op, out.tensors.front(), std::move(started), cost);
  int64_t fresh = 0;
  CellList cells = register_call(f, in, out, cost, &fresh);
  if (predicted) output_sizes().learn(size_key, &op.schema(), fresh, last_meta_);
  if (rec) {
    rec->outputs.assign(cells.begin(), cells.end());
    rec->fresh_bytes = fresh;
    ops_[cells.front()->op] = std::move(rec);
    fingerprint_outputs(f, cells);
  }
  wrap_results(results, out, cells);
  held.release();  // the inputs may go now
  after_op();
}

}  // namespace memscale

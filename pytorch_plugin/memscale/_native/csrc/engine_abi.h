// The DTR engine's C ABI (cabi/memscale.h), reached from C++.
//
// The engine is the Go library the Python package already loaded
// (libmemscale.so, through ctypes). The extension does not link against it:
// EngineAbi::load() finds the loaded copy with dlopen(RTLD_NOLOAD) and reads
// the memscale_dtr_* entry points it calls per op, so both languages talk to
// the same engine instances (a handle made in Python is used here).
#pragma once

#include <cstdint>
#include <string>

namespace memscale {

// memscale_dtr_status: the engine's status block, kept current by every call.
struct EngineStatus {
  int64_t usage;
  int64_t budget;
  int64_t pending;
  int64_t bytes_evicted;
  int64_t peak_usage;
  int64_t next_op;
  int64_t next_tensor;
};

// Eviction actions of memscale_dtr_evict and plan step kinds of memscale_dtr_plan.
constexpr int32_t kActionDrop = 0;
constexpr int32_t kActionSwap = 1;
constexpr int32_t kStepRerun = 0;
constexpr int32_t kStepSwapIn = 1;
// The flags bit of a registration whose op must never be re-run.
constexpr int32_t kNoRecompute = 1;

// The engine entry points the region calls (see cabi/memscale.h for each).
struct EngineAbi {
  int64_t (*tensor)(int64_t h, int64_t nbytes, int32_t pinned);
  int64_t (*call)(int64_t h, const char* name, const int64_t* inputs, int32_t n_in, const int64_t* out_sizes,
                  const int32_t* out_alias, int32_t n_out, int64_t cost_ns, int32_t flags, int64_t* out_ids);
  int64_t (*op)(int64_t h, const char* name, int64_t* frame);
  int64_t (*ops)(int64_t h, int64_t* frame);
  int64_t (*name)(int64_t h, const char* name);
  int64_t (*mutate)(int64_t h, const char* name, const int64_t* inputs, int32_t n_in, const int32_t* mutated,
                    int32_t n_mut, int64_t cost_ns, int32_t flags, int64_t* out_ids);
  int (*lock)(int64_t h, int64_t t);
  int (*unlock)(int64_t h, int64_t t);
  int (*pin)(int64_t h, int64_t t);
  int32_t (*evict)(int64_t h, int64_t extra, int64_t* ids, int32_t* actions, int32_t cap);
  int32_t (*reclaim)(int64_t h, int64_t need, int64_t* ids, int32_t* actions, int32_t cap);
  int32_t (*plan)(int64_t h, int64_t t, int32_t* kinds, int64_t* ids, int32_t cap);
  int (*abandon_plans)(int64_t h);
  int (*rematerialized)(int64_t h, int64_t op, int64_t cost_ns);
  int (*swapped_in)(int64_t h, int64_t t);
  int (*park)(int64_t h, int64_t t);
  int (*finish)(int64_t h);
  const EngineStatus* (*status_of)(int64_t h);
  const char* (*last_error)();

  // The entry points of the library at `path`, which must be loaded already
  // (the Python package loads it first). Throws c10::Error naming what is missing.
  static const EngineAbi& load(const std::string& path);
};

}  // namespace memscale

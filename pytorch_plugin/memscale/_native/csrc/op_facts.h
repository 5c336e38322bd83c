// What the region knows about one operator overload, read once from its schema.
//
// The C++ twin of memscale/_region/schema.py's OpInfo: which arguments are
// written in place (declared `(a!)`, and the running statistics batch norm
// writes without declaring them), which results are those arguments, whether
// every result is a view of the first argument, whether the op draws random
// numbers, and whether it may be re-run at all. Computed at an overload's
// first call in a region and cached for the process (OpFactsTable).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>

namespace memscale {

struct OpFacts {
  std::string name;                // "add.Tensor", the engine's name of the op
  size_t n_args = 0;               // schema arguments (all on the stack when boxed)
  size_t n_returns = 0;
  std::vector<int> mutated;        // argument positions written in place
  int writes_if = -1;              // undeclared writes happen only when this bool argument is true
  bool undeclared_only = false;    // every write is undeclared (batch norm's running statistics)
  std::vector<int> returns_arg;    // per result: the argument position it is, or -1
  bool views_first = false;        // every result views the first argument
  bool all_views = false;          // every result views an argument: nothing allocated
  bool seeded = false;             // draws random numbers (generator state recorded)
  bool inplace_view = false;       // changes a tensor's shape or strides in place
  bool shape_only = false;         // `self` is read for its metadata only (empty_like, new_zeros...)
  bool reproducible = true;        // the same inputs give bitwise the same results (not empty*)
  int32_t flags = 0;               // engine flags of its registrations (kNoRecompute)
  int device_arg = -1;             // position of a `device` argument, or -1
  size_t index = 0;                // this overload's number in the process (0, 1, ...): sessions index by it

  // Whether this call writes any argument (false for batch norm in eval mode).
  bool writes(const c10::IValue* args) const;
};

// Whether a schema type holds tensors: Tensor, Tensor?, Tensor[], Tensor?[].
bool is_tensor_type(const c10::TypePtr& type);

// The facts of every overload seen, computed once each (thread-safe). Each
// thread keeps its own map of what it looked up (no lock per op); the table's
// is read under the lock the first time a thread meets an overload.
class OpFactsTable {
 public:
  const OpFacts& of(const c10::OperatorHandle& op);

 private:
  const OpFacts& shared(const c10::OperatorHandle& op);

  std::mutex mu_;
  std::unordered_map<const void*, std::unique_ptr<OpFacts>> facts_;
};

// The process's table.
OpFactsTable& facts_table();

}  // namespace memscale

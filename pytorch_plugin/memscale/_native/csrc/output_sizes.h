// What ops allocate, learned for the process: the bytes of an op's fresh
// results per operator and argument signature (a hash of the shapes, dtypes
// and scalar arguments), so a budgeted region makes room for them before the
// op runs. A signature never seen is predicted by running the op on `meta`
// tensors, scaled by the largest real/meta ratio the operator showed (some
// meta kernels under-report: the CPU mkldnn_rnn_layer's workspace by 16x).
// Every real run corrects the table; unbudgeted regions fill it too, so a
// probe step teaches the budgeted ones. The C++ twin of
// memscale/_region/arguments.py's OUTPUT_SIZES.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace memscale {

class OutputSizes {
 public:
  // The bytes learned for `key`, or -1.
  int64_t learned(uint64_t key);
  // The largest real/meta ratio operator `op` showed (1 when none).
  double ratio(const void* op);
  // A real run of signature `key` of `op` allocated `real` bytes; `meta` is
  // what its meta run predicted (-1: not predicted).
  void learn(uint64_t key, const void* op, int64_t real, int64_t meta);

 private:
  std::mutex mu_;
  std::unordered_map<uint64_t, int64_t> bytes_;
  std::unordered_map<const void*, double> ratios_;
};

// The process's table (shared by every session, as the region's ops are).
OutputSizes& output_sizes();

}  // namespace memscale

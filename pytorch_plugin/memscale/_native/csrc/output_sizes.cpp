#include "output_sizes.h"

#include <algorithm>

namespace memscale {

int64_t OutputSizes::learned(uint64_t key) {
  std::lock_guard<std::mutex> guard(mu_);
  auto it = bytes_.find(key);
  return it == bytes_.end() ? -1 : it->second;
}

double OutputSizes::ratio(const void* op) {
  std::lock_guard<std::mutex> guard(mu_);
  auto it = ratios_.find(op);
  return it == ratios_.end() ? 1.0 : it->second;
}

void OutputSizes::learn(uint64_t key, const void* op, int64_t real, int64_t meta) {
  std::lock_guard<std::mutex> guard(mu_);
  bytes_[key] = real;
  if (meta > 0 && real > meta) {
    double r = static_cast<double>(real) / static_cast<double>(meta);
    double& known = ratios_[op];
    known = std::max(known, r);
  }
}

OutputSizes& output_sizes() {
  static OutputSizes* table = new OutputSizes();
  return *table;
}

}  // namespace memscale

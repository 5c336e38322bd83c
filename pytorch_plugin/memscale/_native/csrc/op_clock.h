// How long an op took, as the engine hears it.
//
// By default the host's steady clock around the op's kernel (on CUDA the
// kernel's launch, not its run: see docs/limits.md). Tests ask for costs that
// depend on the program alone, so that whether a step fits a tight budget
// never depends on the machine's load: every op at a fixed cost, or costs
// drawn from a seeded generator (a fixed seed reproduces one run's victims
// exactly; many seeds explore the orders real timings produce).
#pragma once

#include <chrono>
#include <cstdint>

namespace memscale {

class OpClock {
 public:
  // fixed_ns 0: the steady clock. Else every op costs fixed_ns, or with a
  // nonzero seed a draw from [1, 2 * fixed_ns] (mean fixed_ns).
  OpClock(int64_t fixed_ns, uint64_t seed) : fixed_ns_(fixed_ns), state_(seed) {}

  // A mark before the op runs.
  int64_t start() const { return fixed_ns_ > 0 ? 0 : host_ns(); }

  // The op's cost since `mark`.
  int64_t since(int64_t mark) {
    if (fixed_ns_ <= 0) return host_ns() - mark;
    if (state_ == 0) return fixed_ns_;
    return 1 + static_cast<int64_t>(next() % static_cast<uint64_t>(2 * fixed_ns_));
  }

 private:
  static int64_t host_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // splitmix64: a full-period 64-bit generator, one multiply-xorshift per draw.
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  const int64_t fixed_ns_;
  uint64_t state_;
};

}  // namespace memscale

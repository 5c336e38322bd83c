// An op's device time from timing events read without waiting: the C++ twin
// of memscale/_region/device.py's CudaTimer.
//
// On a GPU the host's clock around an op measures its launch, not its run,
// and the engine's choices (what is cheap to recompute) need the run. Events
// recorded around a call on its stream say how long it ran once they
// complete, which is after the engine wanted the cost (at registration), so
// a call's cost is the device time last measured for the same (op, output
// bytes); for a size not measured yet the op's measured time per output byte
// times this size; with nothing measured, the host time. Never the less of
// host and device time, never a synchronization: completed events are read
// with query() when the next timed call ends.
//
// Recording two events per op costs more than the rest of the native path's
// work on it, and a training step runs the same ops with the same sizes
// again and again: an op is timed for its first kSamples calls, then one
// call in kStride (new sizes and drift are still learned).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/core/Device.h>

namespace memscale {

// One timing event on a device's current stream.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  virtual void record(const c10::Device& device) = 0;
  virtual bool query() const = 0;                                 // completed?
  virtual double elapsed_ms(const DeviceEvent& later) const = 0;  // both completed
};

// CUDA's timing events through c10's device-generic Event (no CUDA headers).
std::unique_ptr<DeviceEvent> make_cuda_event();

// For tests on the CPU: every timed call ran `ns` on the "device".
std::unique_ptr<DeviceEvent> make_fixed_event(int64_t ns);

class DeviceTimer {
 public:
  static constexpr int64_t kSamples = 4;
  static constexpr int64_t kStride = 32;
  static constexpr size_t kMaxPending = 256;  // events still waited for beyond this are dropped

  explicit DeviceTimer(std::function<std::unique_ptr<DeviceEvent>()> make_event)
      : make_event_(std::move(make_event)) {}

  // A call of `op` is about to be launched on `device`: its start event, or
  // null when this call is not timed.
  std::unique_ptr<DeviceEvent> start(const void* op, const c10::Device& device);

  // The call of `op` whose results have `bytes` was launched after `start`
  // (null: not timed), taking `host_ns` on the host: its cost (ns).
  int64_t stop(const void* op, int64_t bytes, std::unique_ptr<DeviceEvent> start, const c10::Device& device,
               int64_t host_ns);

  int64_t measured() const { return measured_; }  // calls whose device time was read

 private:
  struct Key {
    const void* op;
    int64_t bytes;
    bool operator==(const Key& o) const { return op == o.op && bytes == o.bytes; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.op) ^ (std::hash<int64_t>()(k.bytes) * 0x9e3779b97f4a7c15ULL);
    }
  };
  struct Pending {
    Key key;
    std::unique_ptr<DeviceEvent> start, end;
  };

  std::unique_ptr<DeviceEvent> event();
  void read_completed();

  std::function<std::unique_ptr<DeviceEvent>()> make_event_;
  std::unordered_map<Key, int64_t, KeyHash> device_ns_;
  std::unordered_map<const void*, std::pair<int64_t, int64_t>> rate_;  // per op: (device ns, output bytes) measured
  std::unordered_map<const void*, int64_t> calls_;
  std::deque<Pending> pending_;
  std::vector<std::unique_ptr<DeviceEvent>> spare_;
  int64_t measured_ = 0;
};

}  // namespace memscale

#include "device_timer.h"

#include <algorithm>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace memscale {

namespace {

class CudaEvent final : public DeviceEvent {
 public:
  CudaEvent() : event_(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT) {}  // timing enabled

  void record(const c10::Device& device) override {
    c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
    event_.record(guard.getStream(device));
  }
  bool query() const override { return event_.query(); }
  double elapsed_ms(const DeviceEvent& later) const override {
    return event_.elapsedTime(static_cast<const CudaEvent&>(later).event_);
  }

 private:
  c10::Event event_;
};

class FixedEvent final : public DeviceEvent {
 public:
  explicit FixedEvent(int64_t ns) : ns_(ns) {}
  void record(const c10::Device&) override {}
  bool query() const override { return true; }
  double elapsed_ms(const DeviceEvent&) const override { return static_cast<double>(ns_) / 1e6; }

 private:
  const int64_t ns_;
};

}  // namespace

std::unique_ptr<DeviceEvent> make_cuda_event() { return std::make_unique<CudaEvent>(); }

std::unique_ptr<DeviceEvent> make_fixed_event(int64_t ns) { return std::make_unique<FixedEvent>(ns); }

std::unique_ptr<DeviceEvent> DeviceTimer::event() {
  if (spare_.empty()) return make_event_();
  std::unique_ptr<DeviceEvent> e = std::move(spare_.back());
  spare_.pop_back();
  return e;
}

std::unique_ptr<DeviceEvent> DeviceTimer::start(const void* op, const c10::Device& device) {
  int64_t n = calls_[op]++;
  if (n >= kSamples && n % kStride != 0) return nullptr;
  std::unique_ptr<DeviceEvent> e = event();
  e->record(device);
  return e;
}

void DeviceTimer::read_completed() {
  while (!pending_.empty() && pending_.front().end->query()) {
    Pending& p = pending_.front();
    auto ns = static_cast<int64_t>(p.start->elapsed_ms(*p.end) * 1e6);
    device_ns_[p.key] = ns;
    auto& [total_ns, total_bytes] = rate_[p.key.op];
    total_ns += ns;
    total_bytes += p.key.bytes;
    ++measured_;
    spare_.push_back(std::move(p.start));
    spare_.push_back(std::move(p.end));
    pending_.pop_front();
  }
  while (pending_.size() > kMaxPending) {
    spare_.push_back(std::move(pending_.front().start));
    spare_.push_back(std::move(pending_.front().end));
    pending_.pop_front();
  }
}

int64_t DeviceTimer::stop(const void* op, int64_t bytes, std::unique_ptr<DeviceEvent> start,
                          const c10::Device& device, int64_t host_ns) {
  const Key key{op, bytes};
  if (start) {
    std::unique_ptr<DeviceEvent> end = event();
    end->record(device);
    pending_.push_back(Pending{key, std::move(start), std::move(end)});
  }
  read_completed();
  int64_t known = 0;
  auto hit = device_ns_.find(key);
  if (hit != device_ns_.end()) {
    known = hit->second;
  } else {
    auto r = rate_.find(op);
    if (r != rate_.end() && r->second.second > 0) {
      known = static_cast<int64_t>(static_cast<double>(r->second.first) * static_cast<double>(bytes) /
                                   static_cast<double>(r->second.second));
    }
  }
  return std::max(host_ns, known);
}

}  // namespace memscale

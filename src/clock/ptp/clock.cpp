#include "clock/ptp/clock.hpp"

#include <sys/timex.h>
#include <time.h>

#include <cerrno>
#include <cmath>

namespace chorus::clock::ptp {

VirtualClockMapping::VirtualClockMapping(int64_t base_start_ns, int64_t inject_offset_ns, double inject_drift_ppb)
    : anchor_base_(base_start_ns), anchor_virtual_(base_start_ns + inject_offset_ns), drift_ppb_(inject_drift_ppb) {}

int64_t VirtualClockMapping::toVirtual(int64_t base_ns) const {
  const int64_t d = base_ns - anchor_base_;
  // The rate is (1 + drift)(1 + correction); the product term is < 1e-6 of
  // the correction, below a nanosecond over any re-anchoring interval.
  const double ppb = drift_ppb_ + correction_ppb_ + drift_ppb_ * correction_ppb_ * 1e-9;
  return anchor_virtual_ + d + std::llround(static_cast<double>(d) * ppb * 1e-9);
}

void VirtualClockMapping::reanchor(int64_t base_now_ns) {
  anchor_virtual_ = toVirtual(base_now_ns);
  anchor_base_ = base_now_ns;
}

void VirtualClockMapping::step(int64_t base_now_ns, int64_t delta_ns) {
  reanchor(base_now_ns);
  anchor_virtual_ += delta_ns;
}

void VirtualClockMapping::setFrequency(int64_t base_now_ns, double correction_ppb) {
  reanchor(base_now_ns);
  correction_ppb_ = correction_ppb;
}

int64_t realtimeNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

int64_t monotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

namespace {

int64_t readNs(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

class VirtualRealtimeClock final : public PtpClock {
 public:
  VirtualRealtimeClock(clockid_t base, int64_t offset, double drift)
      : base_(base), map_(readNs(base), offset, drift) {}
  int64_t now() override { return map_.toVirtual(readNs(base_)); }
  int64_t fromRealtime(int64_t realtime_ns) override { return map_.toVirtual(realtime_ns); }
  Status step(int64_t delta_ns) override {
    map_.step(readNs(base_), delta_ns);
    return Status::ok();
  }
  Status setFrequency(double ppb) override {
    map_.setFrequency(readNs(base_), ppb);
    return Status::ok();
  }
  [[nodiscard]] double frequency() const override { return map_.frequency(); }
  std::optional<int64_t> offsetFromRealtime() override {
    const int64_t r = readNs(base_);
    return map_.toVirtual(r) - r;
  }

 private:
  clockid_t base_;
  VirtualClockMapping map_;
};

class SystemClock final : public PtpClock {
 public:
  explicit SystemClock(clockid_t id) : id_(id) {}
  int64_t now() override { return readNs(id_); }
  int64_t fromRealtime(int64_t realtime_ns) override { return realtime_ns; }
  Status step(int64_t delta_ns) override {
    timex tx{};
    tx.modes = ADJ_SETOFFSET | ADJ_NANO;
    int64_t sec = delta_ns / 1'000'000'000;
    int64_t nsec = delta_ns % 1'000'000'000;
    if (nsec < 0) {  // the kernel wants 0 <= tv_usec(ns) < 1e9
      sec -= 1;
      nsec += 1'000'000'000;
    }
    tx.time.tv_sec = sec;
    tx.time.tv_usec = nsec;
    if (clock_adjtime(id_, &tx) < 0)
      return errnoError(fmt::format("chorus-ptp: stepping the clock by {} ns (needs CAP_SYS_TIME; "
                                    "drop --adjust-system to steer a virtual clock instead)",
                                    delta_ns),
                        errno);
    return Status::ok();
  }
  Status setFrequency(double ppb) override {
    timex tx{};
    tx.modes = ADJ_FREQUENCY;
    // freq is scaled ppm: ppm * 2^16 = ppb * 65.536.
    tx.freq = std::lround(ppb * 65.536);
    if (clock_adjtime(id_, &tx) < 0)
      return errnoError(fmt::format("chorus-ptp: setting the clock's frequency to {:.1f} ppb (needs "
                                    "CAP_SYS_TIME)",
                                    ppb),
                        errno);
    freq_ = ppb;
    return Status::ok();
  }
  [[nodiscard]] double frequency() const override { return freq_; }
  std::optional<int64_t> offsetFromRealtime() override { return std::nullopt; }

 private:
  clockid_t id_;
  double freq_ = 0;
};

}  // namespace

std::unique_ptr<PtpClock> makeVirtualRealtimeClock(int64_t inject_offset_ns, double inject_drift_ppb) {
  return makeVirtualClock(CLOCK_REALTIME, inject_offset_ns, inject_drift_ppb);
}
std::unique_ptr<PtpClock> makeSystemClock() { return makeSystemClock(CLOCK_REALTIME); }
std::unique_ptr<PtpClock> makeVirtualClock(clockid_t base, int64_t inject_offset_ns, double inject_drift_ppb) {
  return std::make_unique<VirtualRealtimeClock>(base, inject_offset_ns, inject_drift_ppb);
}
std::unique_ptr<PtpClock> makeSystemClock(clockid_t id) { return std::make_unique<SystemClock>(id); }

}  // namespace chorus::clock::ptp

// The clocks a PTP port reads and steers.
//
// VirtualClockMapping is pure arithmetic: a piecewise-linear map from a base
// clock (CLOCK_REALTIME, or simulated time in tests) to the PTP time chorus
// keeps, with an injected "oscillator" error (offset, drift) the servo must
// find and a servo correction (steps, frequency) it applies.  Because the
// kernel's software timestamps are CLOCK_REALTIME readings, the same map turns
// them into virtual-clock timestamps exactly.
//
// PtpClock is what the daemon uses: the virtual clock over CLOCK_REALTIME
// (default; never touches the host clock) or the system clock itself
// (--adjust-system, clock_adjtime on CLOCK_REALTIME).  Single-threaded.
#pragma once

#include <time.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "common/status.hpp"

namespace chorus::clock::ptp {

class VirtualClockMapping {
 public:
  // At base time `base_start_ns`, the virtual clock reads base + inject_offset
  // and then runs inject_drift_ppb fast (plus the servo's correction).
  VirtualClockMapping(int64_t base_start_ns, int64_t inject_offset_ns, double inject_drift_ppb);

  [[nodiscard]] int64_t toVirtual(int64_t base_ns) const;
  // Adds delta to the clock from base time `base_now_ns` on.
  void step(int64_t base_now_ns, int64_t delta_ns);
  // Sets the servo's frequency correction (ppb, absolute) from `base_now_ns` on.
  void setFrequency(int64_t base_now_ns, double correction_ppb);
  [[nodiscard]] double frequency() const { return correction_ppb_; }
  [[nodiscard]] double injectedDrift() const { return drift_ppb_; }

 private:
  void reanchor(int64_t base_now_ns);
  int64_t anchor_base_;
  int64_t anchor_virtual_;
  double drift_ppb_;
  double correction_ppb_ = 0;
};

class PtpClock {
 public:
  virtual ~PtpClock() = default;
  // PTP time now, ns since the epoch of the timescale in use (UTC here:
  // chorus sends ARB-timescale Announces, as a software-timestamping ptp4l does).
  virtual int64_t now() = 0;
  // A kernel timestamp on this clock.  The timestamp is a reading of the base
  // clock: CLOCK_REALTIME for software timestamps, the NIC's PTP hardware
  // clock (PHC) for hardware ones.
  virtual int64_t fromRealtime(int64_t realtime_ns) = 0;
  virtual Status step(int64_t delta_ns) = 0;
  virtual Status setFrequency(double correction_ppb) = 0;
  [[nodiscard]] virtual double frequency() const = 0;
  // Virtual clock only: now() - CLOCK_REALTIME, i.e. the clock's true error
  // when the master runs on this host's CLOCK_REALTIME too.
  virtual std::optional<int64_t> offsetFromRealtime() = 0;
};

int64_t realtimeNs();
int64_t monotonicNs();

std::unique_ptr<PtpClock> makeVirtualRealtimeClock(int64_t inject_offset_ns, double inject_drift_ppb);
// clock_adjtime on CLOCK_REALTIME: needs CAP_SYS_TIME; moves the host's clock.
std::unique_ptr<PtpClock> makeSystemClock();
// The same over another base clock: a PHC's dynamic clock id
// (phcClockId), for hardware timestamps.  The system variant then steers
// the PHC (as ptp4l does), not CLOCK_REALTIME.
std::unique_ptr<PtpClock> makeVirtualClock(clockid_t base, int64_t inject_offset_ns, double inject_drift_ppb);
std::unique_ptr<PtpClock> makeSystemClock(clockid_t id);
// The clock id of an open /dev/ptpN descriptor (FD_TO_CLOCKID).
inline clockid_t phcClockId(int fd) { return static_cast<clockid_t>((~static_cast<unsigned>(fd) << 3) | 3); }

}  // namespace chorus::clock::ptp

// Clock servos: turn a stream of (offset from master, local time) samples into
// clock corrections, a phase step and an absolute frequency correction.
//
// Sign convention (as linuxptp): offset = local - master, so a positive
// offset means the local clock is ahead and must slow down (negative ppb).
// Frequencies are in ppb (= ns of correction per second).
//
// Not thread-safe; one servo per port, driven by the port's thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "common/status.hpp"

namespace chorus::clock::ptp {

enum class ServoState : uint8_t {
  Unlocked,  // s0: collecting samples for the first frequency estimate
  Jump,      // s1: this sample stepped the clock / set the first estimate
  Locked,    // s2: tracking
};
[[nodiscard]] std::string_view servoStateName(ServoState s);  // "s0", "s1", "s2"

struct ServoOutput {
  ServoState state = ServoState::Unlocked;
  std::optional<int64_t> step_ns;  // add this to the clock now (before applying freq)
  double freq_ppb = 0;             // absolute correction to apply from now on
};

enum class ServoKind : uint8_t { Pi, LinReg };
Result<ServoKind> parseServoKind(std::string_view name);  // "pi" | "linreg"

struct ServoConfig {
  ServoKind kind = ServoKind::Pi;
  double interval_s = 1.0;  // nominal sync interval, sets the gains' time scale
  // PI gains per sample: a phase error e is corrected by kp_per_sample * e
  // over one interval; the integral adds ki_per_sample * e per interval.
  // 0.1 / 0.005 give a damping ratio ~0.7 and a ~20-sample time constant: at
  // 16 Hz the loop settles in ~1.5 s and averages software-timestamp noise
  // over ~20 samples.  (linuxptp's software-timestamp gains are ~0.014 /
  // 2e-5 per sample at 16 Hz: quieter but ~50x slower to settle.)
  double kp_per_sample = 0.1;
  double ki_per_sample = 0.005;
  // Once locked the gains move from the ones above to these, by
  // exp(-n / gain_decay_samples) after n locked samples (kp_locked 0: keep
  // the gains above).  0.02 / 0.0002 (damping ~0.7, ~70-sample time constant)
  // leave ~0.1 x the per-sample noise in the clock instead of ~0.25 x: on a
  // bridge whose path delay jitters by microseconds the fast gains follow the
  // jitter (docs/ptp.md, "Bridged network").
  double kp_locked_per_sample = 0.02;
  double ki_locked_per_sample = 0.0002;
  double gain_decay_samples = 48;
  // Spike filter when locked: a sample whose |offset| exceeds outlier_factor x
  // the median |offset| of the last 32 samples (and 1 us) only moves the
  // clock by the integral term; more than outlier_max_run in a row are taken
  // (a real change).  0 disables it.  ptp4l has no such filter.
  double outlier_factor = 4;
  int outlier_max_run = 4;
  // Seconds of samples fitted (least squares) for the first frequency
  // estimate; at least two samples are always used.
  double estimate_window_s = 1.0;
  int64_t first_step_threshold_ns = 20'000;  // step at lock if |offset| is larger (linuxptp's default)
  int64_t step_threshold_ns = 0;             // step when locked if |offset| is larger; 0 = never
  double max_freq_ppb = 500'000;             // clamp (the kernel's limit is 500 ppm)
  size_t linreg_window = 16;                 // samples in the linear-regression window
  double initial_freq_ppb = 0;               // the clock's correction when the servo starts
};

class Servo {
 public:
  virtual ~Servo() = default;
  // One measurement: `offset_ns` of the local clock against the master at
  // local time `local_ns` (the Sync's receive time on the local clock).
  virtual ServoOutput sample(int64_t offset_ns, int64_t local_ns) = 0;
  // Forget everything but the current frequency (new master, clock stepped by someone else).
  virtual void reset() = 0;
  [[nodiscard]] virtual double frequencyPpb() const = 0;
};

Result<std::unique_ptr<Servo>> makeServo(const ServoConfig& config);

}  // namespace chorus::clock::ptp

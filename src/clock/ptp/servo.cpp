#include "clock/ptp/servo.hpp"

#include <algorithm>
#include <cmath>

namespace chorus::clock::ptp {
namespace {

struct Point {
  double x;  // local time, s (relative to the first point)
  double y;  // offset, ns
};

// Least-squares slope (ns/s = ppb) and intercept at x = xs.back().
struct Fit {
  double slope = 0;
  double at_last = 0;
};
Fit fitLine(const std::vector<Point>& p) {
  double mx = 0, my = 0;
  for (const Point& q : p) {
    mx += q.x;
    my += q.y;
  }
  mx /= static_cast<double>(p.size());
  my /= static_cast<double>(p.size());
  double sxx = 0, sxy = 0;
  for (const Point& q : p) {
    sxx += (q.x - mx) * (q.x - mx);
    sxy += (q.x - mx) * (q.y - my);
  }
  Fit f;
  f.slope = sxx > 0 ? sxy / sxx : 0;
  f.at_last = my + f.slope * (p.back().x - mx);
  return f;
}

class PiServo final : public Servo {
 public:
  explicit PiServo(const ServoConfig& c)
      : c_(c), kp_(c.kp_per_sample / c.interval_s), ki_(c.ki_per_sample / c.interval_s), freq_(c.initial_freq_ppb) {}

  ServoOutput sample(int64_t offset_ns, int64_t local_ns) override {
    ServoOutput out;
    if (state_ == ServoState::Unlocked) {
      if (window_.empty()) first_local_ = local_ns;
      window_.push_back({static_cast<double>(local_ns - first_local_) * 1e-9, static_cast<double>(offset_ns)});
      const double span = window_.back().x - window_.front().x;
      if (window_.size() < 2 || span < c_.estimate_window_s) {
        out.state = ServoState::Unlocked;
        out.freq_ppb = freq_;
        return out;
      }
      // The offset grows at the oscillator's rate error (ppb): remove it.
      const Fit f = fitLine(window_);
      freq_ = clamp(freq_ - f.slope);
      window_.clear();
      state_ = ServoState::Locked;
      out.state = ServoState::Jump;
      const auto residual = static_cast<int64_t>(std::llround(f.at_last));
      if (std::llabs(residual) > c_.first_step_threshold_ns) out.step_ns = -residual;
      out.freq_ppb = freq_;
      return out;
    }
    if (c_.step_threshold_ns > 0 && std::llabs(offset_ns) > c_.step_threshold_ns) {
      out.state = ServoState::Jump;
      out.step_ns = -offset_ns;
      out.freq_ppb = freq_;
      return out;
    }
    const double e = static_cast<double>(offset_ns);
    out.state = ServoState::Locked;
    const bool spike = isSpike(e);
    recent_abs_.push_back(std::fabs(e));
    if (recent_abs_.size() > kRecent) recent_abs_.pop_front();
    if (spike) {
      // Hold the frequency: one delayed timestamp must not kick the clock.
      out.freq_ppb = freq_;
      return out;
    }
    // Gains decay from the acquisition ones to the locked ones.
    double kp = kp_, ki = ki_;
    if (c_.kp_locked_per_sample > 0 && c_.gain_decay_samples > 0) {
      const double w = std::exp(-static_cast<double>(locked_samples_) / c_.gain_decay_samples);
      kp = (c_.kp_locked_per_sample + (c_.kp_per_sample - c_.kp_locked_per_sample) * w) / c_.interval_s;
      ki = (c_.ki_locked_per_sample + (c_.ki_per_sample - c_.ki_locked_per_sample) * w) / c_.interval_s;
    }
    ++locked_samples_;
    freq_ = clamp(freq_ - ki * e);
    out.freq_ppb = clamp(freq_ - kp * e);
    return out;
  }

  void reset() override {
    state_ = ServoState::Unlocked;
    window_.clear();
    recent_abs_.clear();
    locked_samples_ = 0;
    spike_run_ = 0;
  }
  [[nodiscard]] double frequencyPpb() const override { return freq_; }

 private:
  double clamp(double f) const { return std::clamp(f, -c_.max_freq_ppb, c_.max_freq_ppb); }

  // A spike: |e| far above the recent median |offset| (needs 8 samples of
  // history), at most outlier_max_run in a row.
  bool isSpike(double e) {
    if (c_.outlier_factor <= 0 || recent_abs_.size() < 8) return false;
    std::vector<double> v(recent_abs_.begin(), recent_abs_.end());
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    const double limit = std::max(c_.outlier_factor * v[v.size() / 2], 1000.0);
    if (std::fabs(e) > limit && spike_run_ < c_.outlier_max_run) {
      ++spike_run_;
      return true;
    }
    spike_run_ = 0;
    return false;
  }
  static constexpr size_t kRecent = 32;
  std::deque<double> recent_abs_;
  int64_t locked_samples_ = 0;
  int spike_run_ = 0;

  ServoConfig c_;
  double kp_;  // ppb per ns of offset
  double ki_;
  ServoState state_ = ServoState::Unlocked;
  std::vector<Point> window_;
  int64_t first_local_ = 0;
  double freq_ = 0;  // integral term: the estimated oscillator error, negated
};

// Linear regression over the last N samples of (local time, master time),
// in the frame of the clock as it is now: after each correction the stored
// local times are rewritten as if the new rate and step had always applied,
// so the fit sees one straight line (linuxptp's linreg does the same with
// its update history).  The new frequency removes the fitted rate error and
// spreads the remaining phase error over a few intervals.
class LinRegServo final : public Servo {
 public:
  explicit LinRegServo(const ServoConfig& c) : c_(c), freq_(c.initial_freq_ppb) {}

  ServoOutput sample(int64_t offset_ns, int64_t local_ns) override {
    ServoOutput out;
    if (points_.empty()) origin_ = local_ns;
    const double x = static_cast<double>(local_ns - origin_);
    points_.push_back({x, x - static_cast<double>(offset_ns)});  // master time, same origin
    while (points_.size() > std::max<size_t>(c_.linreg_window, 2)) points_.pop_front();
    const double span_s = (points_.back().x - points_.front().x) * 1e-9;
    const bool window_full = points_.size() >= std::max<size_t>(c_.linreg_window, 2);
    if (points_.size() < 2 || (state_ == ServoState::Unlocked && span_s < c_.estimate_window_s && !window_full)) {
      out.state = state_ == ServoState::Unlocked ? ServoState::Unlocked : ServoState::Locked;
      out.freq_ppb = freq_;
      return out;
    }
    // Fit master = a + b * local around the mean (precision), in seconds.
    double mx = 0, my = 0;
    for (const Point& p : points_) {
      mx += p.x;
      my += p.y;
    }
    mx /= static_cast<double>(points_.size());
    my /= static_cast<double>(points_.size());
    double sxx = 0, sxy = 0;
    for (const Point& p : points_) {
      sxx += (p.x - mx) * (p.x - mx);
      sxy += (p.x - mx) * (p.y - my);
    }
    const double b = sxx > 0 ? sxy / sxx : 1.0;
    const double master_now = my + b * (x - mx);
    const double err = x - master_now;  // local ahead of master by err ns
    const double horizon_s = 4 * c_.interval_s;
    double new_freq = freq_ + (b - 1.0) * 1e9;
    std::optional<int64_t> step;
    const bool first = state_ == ServoState::Unlocked;
    const int64_t threshold = first ? c_.first_step_threshold_ns : c_.step_threshold_ns;
    if ((first || threshold > 0) && std::fabs(err) > static_cast<double>(threshold)) {
      step = -static_cast<int64_t>(std::llround(err));
    } else {
      new_freq -= err / horizon_s;
    }
    new_freq = std::clamp(new_freq, -c_.max_freq_ppb, c_.max_freq_ppb);
    // Re-express the stored local times in the corrected clock's frame.
    const double ratio = 1.0 + (new_freq - freq_) * 1e-9;
    const double shift = step ? static_cast<double>(*step) : 0.0;
    for (Point& p : points_) p.x = x + (p.x - x) * ratio + shift;
    freq_ = new_freq;
    out.state = first || step ? ServoState::Jump : ServoState::Locked;
    state_ = ServoState::Locked;
    out.step_ns = step;
    out.freq_ppb = freq_;
    return out;
  }

  void reset() override {
    state_ = ServoState::Unlocked;
    points_.clear();
  }
  [[nodiscard]] double frequencyPpb() const override { return freq_; }

 private:
  struct Point {
    double x;  // local time, ns since origin_
    double y;  // master time, ns since origin_
  };
  ServoConfig c_;
  ServoState state_ = ServoState::Unlocked;
  std::deque<Point> points_;
  int64_t origin_ = 0;
  double freq_ = 0;
};

}  // namespace

std::string_view servoStateName(ServoState s) {
  switch (s) {
    case ServoState::Unlocked: return "s0";
    case ServoState::Jump: return "s1";
    case ServoState::Locked: return "s2";
  }
  return "?";
}

Result<ServoKind> parseServoKind(std::string_view name) {
  if (name == "pi") return ServoKind::Pi;
  if (name == "linreg") return ServoKind::LinReg;
  return invalidArgument("ptp: unknown servo '{}' (use pi or linreg)", name);
}

Result<std::unique_ptr<Servo>> makeServo(const ServoConfig& c) {
  if (!(c.interval_s > 0)) return invalidArgument("ptp servo: interval_s {} must be > 0", c.interval_s);
  if (!(c.kp_per_sample > 0 && c.kp_per_sample < 2) || !(c.ki_per_sample >= 0 && c.ki_per_sample < 1))
    return invalidArgument("ptp servo: gains kp={} ki={} per sample are outside the stable range (0,2) x [0,1)",
                           c.kp_per_sample, c.ki_per_sample);
  if (!(c.kp_locked_per_sample >= 0 && c.kp_locked_per_sample < 2) ||
      !(c.ki_locked_per_sample >= 0 && c.ki_locked_per_sample < 1) || !(c.gain_decay_samples >= 0) ||
      !(c.outlier_factor >= 0) || c.outlier_max_run < 0)
    return invalidArgument("ptp servo: locked gains kp={} ki={} (stable range (0,2) x [0,1)), gain decay {} samples, "
                           "spike factor {} and run {} must not be negative",
                           c.kp_locked_per_sample, c.ki_locked_per_sample, c.gain_decay_samples, c.outlier_factor,
                           c.outlier_max_run);
  if (c.kind == ServoKind::Pi) return std::unique_ptr<Servo>(std::make_unique<PiServo>(c));
  return std::unique_ptr<Servo>(std::make_unique<LinRegServo>(c));
}

}  // namespace chorus::clock::ptp

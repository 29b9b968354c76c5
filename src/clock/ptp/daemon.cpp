#include "clock/ptp/daemon.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <deque>
#include <memory>

#include <nlohmann/json.hpp>

#include "clock/ptp/clock.hpp"
#include "clock/ptp/port.hpp"
#include "clock/ptp/udp_transport.hpp"

namespace chorus::clock::ptp {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f && f != stdout) std::fclose(f);
  }
};

struct Stats {
  uint64_t n = 0;
  double sum = 0, sum_sq = 0, max_abs = 0, delay_sum = 0;
  uint64_t nc = 0;
  double csum = 0, csum_sq = 0;
  void add(double off, double delay, std::optional<double> clock_off) {
    ++n;
    sum += off;
    sum_sq += off * off;
    max_abs = std::max(max_abs, std::fabs(off));
    delay_sum += delay;
    if (clock_off) {
      ++nc;
      csum += *clock_off;
      csum_sq += *clock_off * *clock_off;
    }
  }
};

// Everything one run holds; the loop below reads top to bottom.
class Daemon {
 public:
  Daemon(const PtpOptions& o, std::FILE* events, double settle_s) : o_(o), events_(events), settle_s_(settle_s) {}
  ~Daemon() {
    clock_.reset();  // it may read the PHC through phc_fd_
    if (phc_fd_ >= 0) ::close(phc_fd_);
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  Status setup() {
    if (o_.adjust_system && o_.measure_only)
      return invalidArgument("chorus-ptp: --adjust-system and --measure-only contradict each other (pick one)");
    if (o_.adjust_system && (o_.inject_offset_ns != 0 || o_.inject_drift_ppb != 0))
      return invalidArgument("chorus-ptp: --inject-offset-ns/--inject-drift-ppb shift the virtual clock; they "
                             "cannot be combined with --adjust-system");
    int phc_index = -1;
    CHORUS_ASSIGN_OR_RETURN(transport_, openTransport(o_.network, o_.iface, o_.tx_timestamp_timeout_ms,
                                                      o_.timestamping, &phc_index));
    clockid_t base = CLOCK_REALTIME;
    if (o_.timestamping == Timestamping::Hardware) {
      // Hardware timestamps are readings of the NIC's clock: that clock is the
      // base of everything (as ptp4l with time_stamping hardware).
      const std::string dev = fmt::format("/dev/ptp{}", phc_index);
      phc_fd_ = ::open(dev.c_str(), O_RDWR | O_CLOEXEC);
      if (phc_fd_ < 0) return errnoError(fmt::format("chorus-ptp: opening {} (the PHC of {})", dev, o_.iface), errno);
      base = phcClockId(phc_fd_);
    }
    clock_ = o_.adjust_system ? makeSystemClock(base) : makeVirtualClock(base, o_.inject_offset_ns, o_.inject_drift_ppb);
    PortConfig pc;
    pc.clock_identity = transport_->clockIdentity();
    pc.domain = o_.domain;
    pc.priority1 = o_.priority1;
    pc.priority2 = o_.priority2;
    pc.log_sync_interval = o_.log_sync_interval;
    pc.log_announce_interval = o_.log_announce_interval;
    pc.log_min_delay_req_interval = o_.log_min_delay_req_interval;
    pc.announce_receipt_timeout = o_.announce_receipt_timeout;
    pc.delay_filter_length = std::max<size_t>(o_.delay_filter_length, 1);
    pc.slave_only = o_.role == Role::Slave;
    pc.master_only = o_.role == Role::Master;
    pc.random_seed = o_.random_seed != 0 ? o_.random_seed : static_cast<uint32_t>(monotonicNs() ^ pc.clock_identity[7]);
    port_ = std::make_unique<Port>(pc);
    if (o_.json_log == "-") {
      json_.reset(stdout);
    } else if (!o_.json_log.empty()) {
      json_.reset(std::fopen(o_.json_log.c_str(), "w"));
      if (!json_) return errnoError(fmt::format("chorus-ptp: opening --json-log {}", o_.json_log), errno);
    }
    summary_.clock_identity = toString(pc.clock_identity);
    return Status::ok();
  }

  Status run(int stop_fd) {
    const int64_t start = monotonicNs();
    const int64_t end = o_.duration_s > 0 ? start + static_cast<int64_t>(o_.duration_s * 1e9) : INT64_MAX;
    PortEvents ev;
    port_->start(now(), ev);
    drain(ev);
    for (;;) {
      const int64_t t = monotonicNs();
      if (t >= end) break;
      const int64_t wake = std::min(port_->nextDeadline(), end);
      const int64_t wait_ns = std::max<int64_t>(wake - t, 0);
      pollfd fds[3] = {{transport_->eventFd(), POLLIN, 0}, {transport_->generalFd(), POLLIN, 0}, {stop_fd, POLLIN, 0}};
      const timespec ts{static_cast<time_t>(wait_ns / 1'000'000'000), static_cast<long>(wait_ns % 1'000'000'000)};
      const int r = ::ppoll(fds, stop_fd >= 0 ? 3 : 2, &ts, nullptr);
      if (r < 0 && errno != EINTR) return errnoError("chorus-ptp: ppoll", errno);
      if (r > 0 && stop_fd >= 0 && (fds[2].revents & POLLIN)) break;
      // One socket carries both classes over Layer 2: read it once.
      const int nfds = fds[1].fd == fds[0].fd ? 1 : 2;
      for (int i = 0; i < nfds && r > 0; ++i) {
        // POLLERR: transmit stamps nobody waits for; unread, they would wake
        // every ppoll at once (a busy loop that took a core from the network).
        if (fds[i].revents & POLLERR) {
          auto dropped = transport_->discardErrorQueue(fds[i].fd);
          if (!dropped.isOk()) {
            PortEvents fev;
            port_->fault(now(), dropped.status().message(), fev);
            drain(fev);
          }
        }
        if (fds[i].revents & POLLIN) receiveAll(fds[i].fd);
      }
      port_->tick(now(), ev);
      drain(ev);
    }
    summary_.final_state = std::string(portStateName(port_->state()));
    return Status::ok();
  }

  PtpSummary summary() {
    PtpSummary& s = summary_;
    s.counted = stats_.n;
    if (stats_.n > 0) {
      const double n = static_cast<double>(stats_.n);
      s.mean_offset_ns = stats_.sum / n;
      s.rms_offset_ns = std::sqrt(stats_.sum_sq / n);
      s.max_abs_offset_ns = stats_.max_abs;
      s.mean_path_delay_ns = stats_.delay_sum / n;
    }
    if (stats_.nc > 0) {
      const double n = static_cast<double>(stats_.nc);
      s.mean_clock_offset_ns = stats_.csum / n;
      s.rms_clock_offset_ns = std::sqrt(stats_.csum_sq / n);
    }
    return s;
  }

 private:
  Now now() { return {monotonicNs(), clock_->now()}; }

  void receiveAll(int fd) {
    PortEvents ev;
    for (int budget = 64; budget > 0; --budget) {
      auto got = transport_->receive(fd);
      if (!got.isOk()) {
        port_->fault(now(), got.status().message(), ev);
        break;
      }
      if (!got->has_value()) break;
      const Datagram& d = **got;
      auto msg = parseMessage(d.bytes);
      if (!msg.isOk()) continue;  // not ours to judge: other PTP versions, garbage
      if (isEventMessage(msg->header.type) && !d.rx_realtime_ns) {
        ev.warnings.push_back(fmt::format("no receive timestamp on a {}; dropped", messageTypeName(msg->header.type)));
        continue;
      }
      const int64_t rx = d.rx_realtime_ns ? clock_->fromRealtime(*d.rx_realtime_ns) : 0;
      port_->receive(*msg, rx, now(), ev);
      drain(ev);
    }
    drain(ev);
  }

  // Sends what the port produced (a transmit timestamp may produce more, e.g.
  // the Follow_Up), then handles samples and transitions.
  void drain(PortEvents& ev) {
    for (size_t i = 0; i < ev.send.size(); ++i) {
      const Outbound out = ev.send[i];  // copy: txTimestamp may grow ev.send
      auto tx = transport_->send(out.bytes, out.event());
      if (!tx.isOk()) {
        port_->fault(now(), tx.status().message(), ev);
        break;
      }
      if (out.event()) {
        if (tx->has_value()) {
          port_->txTimestamp(out.type, out.sequence_id, clock_->fromRealtime(**tx), now(), ev);
        } else {
          ev.warnings.push_back(fmt::format("no transmit timestamp for {} #{} within {} ms",
                                            messageTypeName(out.type), out.sequence_id, o_.tx_timestamp_timeout_ms));
        }
      }
    }
    ev.send.clear();
    if (ev.parent_changed) {
      servo_.reset();
      lock_start_.reset();
    }
    for (const Transition& t : ev.transitions)
      if (events_)
        std::fprintf(events_, "chorus-ptp: port 1: %s to %s on %s\n", std::string(portStateName(t.from)).c_str(),
                     std::string(portStateName(t.to)).c_str(), t.reason.c_str());
    for (const std::string& w : ev.warnings)
      if (events_) std::fprintf(events_, "chorus-ptp: warning: %s\n", w.c_str());
    if (events_) std::fflush(events_);
    std::vector<SyncSample> samples = std::move(ev.samples);
    ev.clear();
    for (const SyncSample& s : samples) onSample(s, ev);
    if (!ev.send.empty() || !ev.transitions.empty()) drain(ev);
  }

  void onSample(const SyncSample& s, PortEvents& ev) {
    ++summary_.samples;
    const double interval_s = std::ldexp(1.0, std::clamp<int>(s.log_sync_interval, -10, 10));
    if (!servo_ || servo_interval_ != interval_s) {
      ServoConfig sc = o_.servo;
      sc.interval_s = interval_s;
      sc.initial_freq_ppb = clock_->frequency();
      auto made = makeServo(sc);
      if (!made.isOk()) {
        ev.warnings.push_back(made.status().message());
        return;
      }
      servo_ = std::move(made).value();
      servo_interval_ = interval_s;
    }
    const std::optional<int64_t> clock_off = clock_->offsetFromRealtime();
    const int64_t mono = monotonicNs();
    if (!first_sample_mono_) first_sample_mono_ = mono;
    ServoOutput so;
    if (o_.measure_only) {
      so.state = ServoState::Locked;
      so.freq_ppb = 0;
    } else {
      so = servo_->sample(s.offset_ns, s.t2);
      if (so.step_ns) {
        Status st = clock_->step(*so.step_ns);
        if (!st.isOk()) ev.warnings.push_back(st.message());
        port_->clockStepped();
      }
      Status st = clock_->setFrequency(so.freq_ppb);
      if (!st.isOk()) ev.warnings.push_back(st.message());
    }
    if (so.state != ServoState::Unlocked) {
      port_->setCalibrated(true, ev);
      if (!lock_start_) {
        lock_start_ = mono;
        if (!summary_.lock_time_s) summary_.lock_time_s = static_cast<double>(mono - *first_sample_mono_) * 1e-9;
      }
    }
    const bool counted = so.state == ServoState::Locked && lock_start_ &&
                         static_cast<double>(mono - *lock_start_) * 1e-9 >= settle_s_;
    if (counted)
      stats_.add(static_cast<double>(s.offset_ns), static_cast<double>(s.path_delay_ns),
                 clock_off ? std::optional<double>(static_cast<double>(*clock_off)) : std::nullopt);
    if (json_) {
      nlohmann::json j;
      j["time"] = static_cast<double>(s.t2) * 1e-9;
      j["seq"] = s.sequence_id;
      j["offset_ns"] = s.offset_ns;
      j["path_delay_ns"] = s.path_delay_ns;
      j["freq_ppb"] = o_.measure_only ? 0.0 : so.freq_ppb;
      j["state"] = portStateName(port_->state());
      j["servo"] = servoStateName(so.state);
      if (clock_off) j["clock_offset_ns"] = *clock_off;
      if (so.step_ns) j["step_ns"] = *so.step_ns;
      std::fprintf(json_.get(), "%s\n", j.dump().c_str());
      std::fflush(json_.get());
    }
  }

  const PtpOptions& o_;
  std::FILE* events_;
  double settle_s_;
  std::unique_ptr<PtpClock> clock_;
  std::unique_ptr<NetTransport> transport_;
  int phc_fd_ = -1;  // with hardware timestamps: the open /dev/ptpN (closed by the destructor)
  std::unique_ptr<Port> port_;
  std::unique_ptr<Servo> servo_;
  double servo_interval_ = 0;
  std::unique_ptr<std::FILE, FileCloser> json_;
  std::optional<int64_t> first_sample_mono_;
  std::optional<int64_t> lock_start_;
  Stats stats_;
  PtpSummary summary_;
};

}  // namespace

Result<PtpSummary> runPtp(const PtpOptions& options, int stop_fd, std::FILE* events, double settle_s) {
  Daemon d(options, events, settle_s);
  CHORUS_RETURN_IF_ERROR(d.setup());
  CHORUS_RETURN_IF_ERROR(d.run(stop_fd));
  return d.summary();
}

}  // namespace chorus::clock::ptp

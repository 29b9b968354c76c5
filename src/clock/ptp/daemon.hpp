// chorus-ptp's run loop: one ordinary-clock port on one interface over
// UDP/IPv4 or Layer 2, a servo steering a PtpClock, and a JSON line per sync.
//
// runPtp() owns everything it opens and returns when `stop_fd` becomes
// readable (the tool passes a signalfd for SIGINT/SIGTERM), when
// duration_s has passed, or on a setup error.  Runtime transport errors put
// the port in FAULTY (and it retries) rather than ending the run.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "clock/ptp/servo.hpp"
#include "clock/ptp/udp_transport.hpp"
#include "common/status.hpp"

namespace chorus::clock::ptp {

enum class Role : uint8_t { Auto, Master, Slave };

struct PtpOptions {
  std::string iface;
  Network network = Network::UdpIpv4;  // or Layer 2 (EtherType 0x88F7), as ptp4l -4 / -2
  // Software (CLOCK_REALTIME) or hardware timestamps (the NIC's PHC, which then
  // is the base of the virtual clock, or the clock --adjust-system steers).
  Timestamping timestamping = Timestamping::Software;
  Role role = Role::Auto;  // Master: master-only; Slave: slave-only (clockClass 255)
  uint8_t domain = 0;
  int8_t log_sync_interval = 0;
  int8_t log_announce_interval = 1;
  int8_t log_min_delay_req_interval = 0;
  uint8_t announce_receipt_timeout = 3;
  uint8_t priority1 = 128;
  uint8_t priority2 = 128;
  bool adjust_system = false;  // steer CLOCK_REALTIME (clock_adjtime) instead of a virtual clock
  bool measure_only = false;   // never correct any clock; just report offsets
  ServoConfig servo;           // interval_s is taken from the master's Sync interval
  int64_t inject_offset_ns = 0;    // virtual clock: start this far from CLOCK_REALTIME
  double inject_drift_ppb = 0;     // virtual clock: run this much fast
  int tx_timestamp_timeout_ms = 10;
  // Moving median of the path delay.  ptp4l's delay_filter_length is 10; 64
  // (4 s at 16 Delay_Reqs/s) because a bridge under load jitters the raw
  // delay by microseconds and a median of 10 then wanders by ~2 us (SD; the
  // difference of two co-located slaves' delays had SD 2.5 us), which goes
  // straight into every offset.  The cost: a real path change is followed
  // after half a window.
  size_t delay_filter_length = 64;
  std::string json_log;   // "" none, "-" stdout, else a file path (truncated)
  double duration_s = 0;  // 0: until stopped
  uint32_t random_seed = 0;  // 0: from the clock identity and time
};

// Statistics of the samples taken while the servo was locked (or, with
// measure_only, all samples), after `settle_s` seconds of lock.
struct PtpSummary {
  uint64_t samples = 0;
  uint64_t counted = 0;
  double mean_offset_ns = 0;
  double rms_offset_ns = 0;
  double max_abs_offset_ns = 0;
  double mean_path_delay_ns = 0;
  std::optional<double> mean_clock_offset_ns;  // virtual clock vs CLOCK_REALTIME (the truth on one host)
  std::optional<double> rms_clock_offset_ns;
  std::optional<double> lock_time_s;  // from the first sample to the first locked one
  std::string final_state;
  std::string clock_identity;
};

// `events` receives one human line per state change (nullptr: silent).
Result<PtpSummary> runPtp(const PtpOptions& options, int stop_fd, std::FILE* events, double settle_s = 0);

}  // namespace chorus::clock::ptp

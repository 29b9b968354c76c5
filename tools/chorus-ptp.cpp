// chorus-ptp: an IEEE 1588-2008 ordinary clock (UDP/IPv4, E2E, two-step,
// software timestamps) that interoperates with linuxptp's ptp4l.
//
//   chorus-ptp -i IFACE [--master|--slave] [--domain N] [--log-sync-interval K]
//              [--measure-only | --adjust-system] [--json-log FILE] [--duration-s S]
//
// Prints state changes to stderr and, at exit, one JSON summary line to stdout.
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>

#include "clock/ptp/daemon.hpp"

int main(int argc, char** argv) {
  using namespace chorus::clock::ptp;
  CLI::App app{"chorus-ptp: IEEE 1588-2008 (PTPv2) ordinary clock over UDP/IPv4 or Layer 2, interoperable with ptp4l"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  PtpOptions o;
  bool master = false, slave = false;
  int domain = 0, log_sync = 0, log_announce = 1, log_delay = 0, prio1 = 128, prio2 = 128, ann_timeout = 3;
  std::string servo = "pi", network = "udp4", stamping = "software";
  bool l2 = false;
  double settle_s = 0;
  app.add_option("-i,--interface", o.iface, "network interface (with UDP: must have an IPv4 address)")->required();
  app.add_option("--transport", network, "udp4: UDP/IPv4 ports 319/320 (default); l2: Ethernet, EtherType 0x88F7")
      ->check(CLI::IsMember({"udp4", "l2"}));
  app.add_flag("-2,--l2", l2, "Layer 2 transport (as ptp4l -2); same as --transport l2");
  app.add_option("--timestamping", stamping,
                 "software (kernel, CLOCK_REALTIME; default) or hardware (the NIC's PTP hardware clock, which then "
                 "bases the virtual clock or is what --adjust-system steers)")
      ->check(CLI::IsMember({"software", "hardware"}));
  app.add_flag("--master", master, "master only: never follow another clock");
  app.add_flag("--slave", slave, "slave only: never become master (clockClass 255, as ptp4l -s)");
  app.add_option("--domain", domain, "PTP domain number")->check(CLI::Range(0, 255));
  app.add_option("--log-sync-interval", log_sync, "log2 seconds between Syncs as master (-4 = 16/s)")
      ->check(CLI::Range(-7, 4));
  app.add_option("--log-announce-interval", log_announce, "log2 seconds between Announces")->check(CLI::Range(-3, 4));
  app.add_option("--log-min-delay-req-interval", log_delay, "log2 seconds between Delay_Reqs (a master's value wins)")
      ->check(CLI::Range(-7, 6));
  app.add_option("--announce-receipt-timeout", ann_timeout, "Announce intervals before a master is presumed gone")
      ->check(CLI::Range(2, 255));
  app.add_option("--priority1", prio1, "BMCA priority1 (lower wins)")->check(CLI::Range(0, 255));
  app.add_option("--priority2", prio2, "BMCA priority2 (lower wins)")->check(CLI::Range(0, 255));
  app.add_flag("--measure-only", o.measure_only, "report offsets, never correct any clock");
  app.add_flag("--adjust-system", o.adjust_system, "steer CLOCK_REALTIME with clock_adjtime (default: a virtual clock)");
  app.add_option("--servo", servo, "pi or linreg")->check(CLI::IsMember({"pi", "linreg"}));
  app.add_option("--pi-kp", o.servo.kp_per_sample, "PI proportional gain per sample");
  app.add_option("--pi-ki", o.servo.ki_per_sample, "PI integral gain per sample");
  app.add_option("--pi-kp-locked", o.servo.kp_locked_per_sample,
                 "PI proportional gain per sample once locked (the gain decays to it; 0 with --pi-ki-locked 0: "
                 "keep --pi-kp)");
  app.add_option("--pi-ki-locked", o.servo.ki_locked_per_sample, "PI integral gain per sample once locked");
  app.add_option("--spike-factor", o.servo.outlier_factor,
                 "locked PI: a sample above this x the recent median |offset| only moves the integral (0: off)");
  app.add_option("--delay-filter-length", o.delay_filter_length,
                 "samples in the moving median of the path delay (ptp4l's delay_filter_length, whose default is 10)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--step-threshold-ns", o.servo.step_threshold_ns, "step when |offset| exceeds this once locked (0: never)");
  app.add_option("--first-step-threshold-ns", o.servo.first_step_threshold_ns, "step at lock if |offset| exceeds this");
  app.add_option("--inject-offset-ns", o.inject_offset_ns, "start the virtual clock this far from CLOCK_REALTIME");
  app.add_option("--inject-drift-ppb", o.inject_drift_ppb, "make the virtual clock run this much fast");
  app.add_option("--tx-timestamp-timeout-ms", o.tx_timestamp_timeout_ms, "wait for a transmit timestamp")
      ->check(CLI::Range(1, 1000));
  app.add_option("--json-log", o.json_log, "one JSON object per sync to FILE ('-' = stdout)")
      ->default_str("none");
  app.add_option("--duration-s", o.duration_s, "stop after S seconds (0: run until SIGINT/SIGTERM)");
  app.add_option("--settle-s", settle_s, "summary statistics skip the first S seconds after lock");
  app.add_option("--seed", o.random_seed, "seed of the timer jitter (0: from time)");
  CLI11_PARSE(app, argc, argv);
  if (master && slave) {
    std::fprintf(stderr, "chorus-ptp: --master and --slave are exclusive\n");
    return 1;
  }
  o.role = master ? Role::Master : slave ? Role::Slave : Role::Auto;
  o.network = l2 || network == "l2" ? Network::L2 : Network::UdpIpv4;
  o.timestamping = stamping == "hardware" ? Timestamping::Hardware : Timestamping::Software;
  o.domain = static_cast<uint8_t>(domain);
  o.log_sync_interval = static_cast<int8_t>(log_sync);
  o.log_announce_interval = static_cast<int8_t>(log_announce);
  o.log_min_delay_req_interval = static_cast<int8_t>(log_delay);
  o.announce_receipt_timeout = static_cast<uint8_t>(ann_timeout);
  o.priority1 = static_cast<uint8_t>(prio1);
  o.priority2 = static_cast<uint8_t>(prio2);
  o.servo.kind = parseServoKind(servo).value();

  // SIGINT/SIGTERM arrive on a signalfd the run loop polls: a clean stop
  // that still prints the summary.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  const int sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);

  auto r = runPtp(o, sfd, stderr, settle_s);
  if (sfd >= 0) ::close(sfd);
  if (!r.isOk()) {
    std::fprintf(stderr, "%s\n", r.status().message().c_str());
    return 1;
  }
  const PtpSummary& s = *r;
  nlohmann::json j;
  j["summary"] = true;
  j["clock_identity"] = s.clock_identity;
  j["final_state"] = s.final_state;
  j["samples"] = s.samples;
  j["counted"] = s.counted;
  j["mean_offset_ns"] = s.mean_offset_ns;
  j["rms_offset_ns"] = s.rms_offset_ns;
  j["max_abs_offset_ns"] = s.max_abs_offset_ns;
  j["mean_path_delay_ns"] = s.mean_path_delay_ns;
  if (s.mean_clock_offset_ns) j["mean_clock_offset_ns"] = *s.mean_clock_offset_ns;
  if (s.rms_clock_offset_ns) j["rms_clock_offset_ns"] = *s.rms_clock_offset_ns;
  if (s.lock_time_s) j["lock_time_s"] = *s.lock_time_s;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

// One PTP port of an ordinary clock: the port state machine (IEEE 1588-2008
// 9.2.5), the foreign-master table and BMCA, the master's Announce / two-step
// Sync + Follow_Up / Delay_Resp, and the slave's end-to-end delay request-
// response measurement (11.3), which yields one offset sample per Sync.
//
// The port is pure logic: it owns no socket, no clock and no thread.  The
// caller (daemon.cpp, or a simulation in a test) feeds it received messages
// with their receive timestamps, transmit timestamps of the event messages it
// sent, and the passage of time; it answers with messages to send, offset
// samples and state transitions in a PortEvents.  Timers run on a monotonic
// time base (Now::mono_ns); PTP timestamps are on the PTP clock (Now::ptp_ns,
// rx/tx timestamps), which the servo may step.
//
// Not thread-safe: one thread drives a port.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "clock/ptp/bmca.hpp"
#include "clock/ptp/message.hpp"

namespace chorus::clock::ptp {

// portState enumeration values of 8.2.5.3.1 (also PORT_DATA_SET's encoding).
enum class PortState : uint8_t {
  Initializing = 1,
  Faulty = 2,
  Disabled = 3,
  Listening = 4,
  PreMaster = 5,
  Master = 6,
  Passive = 7,
  Uncalibrated = 8,
  Slave = 9,
};
[[nodiscard]] std::string_view portStateName(PortState s);  // "SLAVE", as ptp4l prints

struct PortConfig {
  ClockIdentity clock_identity{};
  uint16_t port_number = 1;
  uint8_t domain = 0;
  uint8_t priority1 = 128;
  uint8_t priority2 = 128;
  ClockQuality quality{248, 0xFE, 0xFFFF};
  int16_t current_utc_offset = 37;
  int8_t log_sync_interval = 0;
  int8_t log_announce_interval = 1;
  int8_t log_min_delay_req_interval = 0;
  uint8_t announce_receipt_timeout = 3;
  bool slave_only = false;   // never MASTER; clockClass 255 (as ptp4l -s)
  bool master_only = false;  // never SLAVE or PASSIVE
  size_t delay_filter_length = 10;  // moving median of the path delay (ptp4l's default)
  int64_t fault_reset_ns = 16'000'000'000;  // FAULTY -> INITIALIZING (ptp4l: 2^4 s)
  uint32_t random_seed = 1;  // timer jitter (Delay_Req spacing, announce timeout)
};

struct Now {
  int64_t mono_ns = 0;  // timers
  int64_t ptp_ns = 0;   // the PTP clock, for originTimestamps
};

struct Outbound {
  MessageType type = MessageType::Sync;
  uint16_t sequence_id = 0;
  std::vector<uint8_t> bytes;
  // Event messages: the caller must report the transmit timestamp through
  // Port::txTimestamp (two-step Sync -> Follow_Up, Delay_Req -> t3).
  [[nodiscard]] bool event() const { return isEventMessage(type); }
};

// One end-to-end measurement, all on the PTP clock, ns.
struct SyncSample {
  uint16_t sequence_id = 0;
  int64_t t1 = 0;  // master's Sync transmit time, corrections applied
  int64_t t2 = 0;  // local Sync receive time
  int64_t offset_ns = 0;      // t2 - t1 - path delay = local - master
  int64_t path_delay_ns = 0;  // filtered mean path delay
  int8_t log_sync_interval = 0;  // the master's, from the Sync header
};

struct Transition {
  PortState from;
  PortState to;
  std::string reason;
};

// What one call produced; the caller drains it.
struct PortEvents {
  std::vector<Outbound> send;
  std::vector<SyncSample> samples;
  std::vector<Transition> transitions;
  bool parent_changed = false;  // a new master was selected: reset the servo
  std::vector<std::string> warnings;
  void clear() { *this = PortEvents{}; }
};

class Port {
 public:
  explicit Port(PortConfig config);

  // INITIALIZING -> LISTENING.
  void start(const Now& now, PortEvents& out);
  // A message received on either socket; `rx_ptp_ns` is its receive timestamp
  // on the PTP clock (only used for event messages).
  void receive(const Message& m, int64_t rx_ptp_ns, const Now& now, PortEvents& out);
  // The transmit timestamp of an event message this port asked to send.
  void txTimestamp(MessageType type, uint16_t sequence_id, int64_t tx_ptp_ns, const Now& now, PortEvents& out);
  // Runs every timer that is due at `now.mono_ns`.
  void tick(const Now& now, PortEvents& out);
  // The earliest mono time at which tick() has work; INT64_MAX when none.
  [[nodiscard]] int64_t nextDeadline() const;

  // A transport failure: FAULTY, then INITIALIZING after fault_reset_ns.
  void fault(const Now& now, std::string_view why, PortEvents& out);
  // The servo locked (UNCALIBRATED -> SLAVE) or lost lock (SLAVE -> UNCALIBRATED).
  void setCalibrated(bool calibrated, PortEvents& out);
  // The PTP clock was stepped: local timestamps taken before are void.
  void clockStepped();

  [[nodiscard]] PortState state() const { return state_; }
  [[nodiscard]] PortIdentity identity() const { return {config_.clock_identity, config_.port_number}; }
  [[nodiscard]] const std::optional<PortIdentity>& parent() const { return parent_; }
  [[nodiscard]] std::optional<int64_t> meanPathDelay() const { return mean_delay_; }
  [[nodiscard]] const PortConfig& config() const { return config_; }
  [[nodiscard]] Dataset localDataset() const;

 private:
  struct ForeignMaster {
    PortIdentity sender;
    std::deque<int64_t> rx_mono;  // receipt times inside the qualification window
    Header header;
    AnnounceBody announce;
  };

  void setState(PortState to, std::string reason, PortEvents& out);
  void decide(const Now& now, std::string_view why, bool listening, PortEvents& out);
  void enterMaster(const Now& now, std::string reason, PortEvents& out);
  void enterSlave(const PortIdentity& parent, const Now& now, std::string reason, PortEvents& out);
  void armAnnounceReceipt(const Now& now);
  void armDelayReq(const Now& now);
  void resetMeasurement();
  void pruneForeign(const Now& now);
  std::optional<Dataset> bestForeign(const Now& now, PortIdentity* sender) ;

  void onAnnounce(const Message& m, const Now& now, PortEvents& out);
  void onSync(const Message& m, int64_t rx, PortEvents& out);
  void onFollowUp(const Message& m, PortEvents& out);
  void onDelayReq(const Message& m, int64_t rx, PortEvents& out);
  void onDelayResp(const Message& m, PortEvents& out);
  void onManagement(const Message& m, PortEvents& out);
  void completeSync(PortEvents& out);

  Header header(MessageType type, uint16_t seq, int8_t log_interval) const;
  void emit(Message m, PortEvents& out);
  int64_t randomNs(int64_t max_ns);

  PortConfig config_;
  PortState state_ = PortState::Initializing;
  std::mt19937_64 rng_;
  std::vector<ForeignMaster> foreign_;
  std::optional<PortIdentity> parent_;
  AnnounceBody parent_announce_;

  // Timers (mono ns; INT64_MAX = disarmed).
  int64_t announce_receipt_at_ = INT64_MAX;
  int64_t announce_tx_at_ = INT64_MAX;
  int64_t sync_tx_at_ = INT64_MAX;
  int64_t delay_req_at_ = INT64_MAX;
  int64_t fault_reset_at_ = INT64_MAX;

  // Sequence ids, one counter per message type (7.3.7).
  uint16_t announce_seq_ = 0;
  uint16_t sync_seq_ = 0;
  uint16_t delay_req_seq_ = 0;

  // Master: the Sync awaiting its transmit timestamp.
  std::optional<uint16_t> sync_awaiting_tx_;

  // Slave: the Sync / Follow_Up pair being assembled, and the latest complete one.
  struct PendingSync {
    uint16_t seq = 0;
    bool have_sync = false;
    bool two_step = false;
    int64_t t2 = 0;
    int64_t sync_correction_ns = 0;
    int8_t log_interval = 0;
    bool have_follow_up = false;
    int64_t precise_origin = 0;
    int64_t fup_correction_ns = 0;
  };
  PendingSync pending_;
  std::optional<std::pair<int64_t, int64_t>> last_t1_t2_;
  std::optional<uint16_t> delay_req_outstanding_;
  std::optional<int64_t> t3_;
  int8_t master_log_min_delay_req_ = 0;
  std::deque<int64_t> delay_window_;
  std::optional<int64_t> mean_delay_;
  int64_t last_offset_ns_ = 0;
};

}  // namespace chorus::clock::ptp

// PTP over UDP/IPv4 (IEEE 1588-2008 annex D): event messages on port 319,
// general messages on port 320, both to the multicast group 224.0.1.129 on
// one interface, with kernel software timestamps (SO_TIMESTAMPING): receive
// timestamps from the control messages, transmit timestamps of event
// messages from the socket's error queue.
//
// Owns its two sockets; single-threaded.  Binding ports 319/320 needs root
// (or CAP_NET_BIND_SERVICE).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "clock/ptp/message.hpp"
#include "common/status.hpp"

namespace chorus::clock::ptp {

inline constexpr uint16_t kPtpEventPort = 319;
inline constexpr uint16_t kPtpGeneralPort = 320;
inline constexpr const char* kPtpPrimaryMulticast = "224.0.1.129";

struct Datagram {
  std::vector<uint8_t> bytes;
  std::optional<int64_t> rx_realtime_ns;  // software receive timestamp (CLOCK_REALTIME)
};

class UdpTransport {
 public:
  // Opens both sockets on `iface` (SO_BINDTODEVICE, IP_ADD_MEMBERSHIP on it,
  // multicast TTL 1, no loopback) and enables software timestamping.
  // `tx_timestamp_timeout_ms` bounds the wait for a transmit timestamp.
  static Result<std::unique_ptr<UdpTransport>> open(const std::string& iface, int tx_timestamp_timeout_ms);
  ~UdpTransport();
  UdpTransport(const UdpTransport&) = delete;
  UdpTransport& operator=(const UdpTransport&) = delete;

  [[nodiscard]] int eventFd() const { return event_fd_; }
  [[nodiscard]] int generalFd() const { return general_fd_; }
  // EUI-64 from the interface's MAC (as ptp4l): mac[0..2] ff fe mac[3..5].
  [[nodiscard]] const ClockIdentity& clockIdentity() const { return identity_; }

  // Sends to the multicast group (event port for event messages).  For an
  // event message returns its software transmit timestamp (CLOCK_REALTIME),
  // or nullopt if the kernel gave none within the timeout.
  Result<std::optional<int64_t>> send(std::span<const uint8_t> bytes, bool event);
  // One datagram from `fd` (non-blocking), nullopt when none is queued.
  Result<std::optional<Datagram>> receive(int fd);

 private:
  UdpTransport() = default;
  std::string iface_;
  int event_fd_ = -1;
  int general_fd_ = -1;
  int tx_timeout_ms_ = 10;
  uint32_t tx_counter_ = 0;  // SOF_TIMESTAMPING_OPT_ID: the id the next event send gets
  ClockIdentity identity_{};
};

}  // namespace chorus::clock::ptp

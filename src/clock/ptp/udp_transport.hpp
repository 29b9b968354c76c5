// PTP's network mappings, with kernel software timestamps (SO_TIMESTAMPING):
// receive timestamps from the control messages, transmit timestamps of event
// messages from the socket's error queue.
//
// - UDP over IPv4 (IEEE 1588-2008 annex D): event messages on port 319,
//   general messages on port 320, both to the multicast group 224.0.1.129 on
//   one interface.  Binding ports 319/320 needs root (or
//   CAP_NET_BIND_SERVICE).
// - IEEE 802.3 / Ethernet (annex F, "Layer 2"): every message in a frame of
//   EtherType 0x88F7 to the multicast address 01-1B-19-00-00-00, on one
//   packet socket (CAP_NET_RAW).  ptp4l's `-2`.
//
// Each owns its sockets; single-threaded.
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

inline constexpr uint16_t kPtpEtherType = 0x88F7;
inline constexpr uint8_t kPtpPrimaryMac[6] = {0x01, 0x1B, 0x19, 0x00, 0x00, 0x00};

enum class Network : uint8_t { UdpIpv4, L2 };

// What the daemon needs of a network mapping.
class NetTransport {
 public:
  virtual ~NetTransport() = default;
  // The descriptors to poll (equal when one socket carries both classes).
  [[nodiscard]] virtual int eventFd() const = 0;
  [[nodiscard]] virtual int generalFd() const = 0;
  // EUI-64 from the interface's MAC (as ptp4l): mac[0..2] ff fe mac[3..5].
  [[nodiscard]] virtual const ClockIdentity& clockIdentity() const = 0;
  // Sends to the PTP multicast address.  For an event message returns its
  // software transmit timestamp (CLOCK_REALTIME), or nullopt if the kernel
  // gave none within the timeout.
  virtual Result<std::optional<int64_t>> send(std::span<const uint8_t> bytes, bool event) = 0;
  // One message from `fd` (non-blocking), nullopt when none is queued.
  virtual Result<std::optional<Datagram>> receive(int fd) = 0;
  // Drops the transmit stamps nobody waits for from fd's error queue (poll
  // reports POLLERR while it holds any); returns how many.
  virtual Result<int> discardErrorQueue(int fd) = 0;
};

// Software timestamps (CLOCK_REALTIME, any interface) or hardware ones (the
// NIC's PTP hardware clock; the interface must have one: `ethtool -T`).
enum class Timestamping : uint8_t { Software, Hardware };

// Opens the mapping `net` on `iface`.  With hardware timestamping, enables it
// on the NIC (SIOCSHWTSTAMP: every PTP v2 event message stamped) and reports
// the PHC's index (/dev/ptpN) in *phc_index; an interface without a PHC is an
// error that says so.
Result<std::unique_ptr<NetTransport>> openTransport(Network net, const std::string& iface, int tx_timestamp_timeout_ms,
                                                    Timestamping ts = Timestamping::Software, int* phc_index = nullptr);

class UdpTransport final : public NetTransport {
 public:
  // Opens both sockets on `iface` (SO_BINDTODEVICE, IP_ADD_MEMBERSHIP on it,
  // multicast TTL 1, no loopback) and enables timestamping on the event one.
  // `tx_timestamp_timeout_ms` bounds the wait for a transmit timestamp.
  static Result<std::unique_ptr<UdpTransport>> open(const std::string& iface, int tx_timestamp_timeout_ms,
                                                    Timestamping ts = Timestamping::Software);
  ~UdpTransport();
  UdpTransport(const UdpTransport&) = delete;
  UdpTransport& operator=(const UdpTransport&) = delete;

  [[nodiscard]] int eventFd() const override { return event_fd_; }
  [[nodiscard]] int generalFd() const override { return general_fd_; }
  [[nodiscard]] const ClockIdentity& clockIdentity() const override { return identity_; }
  // To the multicast group (event port for event messages).
  Result<std::optional<int64_t>> send(std::span<const uint8_t> bytes, bool event) override;
  Result<std::optional<Datagram>> receive(int fd) override;
  Result<int> discardErrorQueue(int fd) override;

 private:
  UdpTransport() = default;
  std::string iface_;
  int event_fd_ = -1;
  int general_fd_ = -1;
  int tx_timeout_ms_ = 10;
  uint32_t tx_counter_ = 0;  // SOF_TIMESTAMPING_OPT_ID: the id the next event send gets
  int ts_index_ = 0;          // scm_timestamping slot: 0 software, 2 raw hardware
  ClockIdentity identity_{};
};

class L2Transport final : public NetTransport {
 public:
  // One AF_PACKET datagram socket for EtherType 0x88F7 on `iface`, member of
  // 01-1B-19-00-00-00, ignoring its own outgoing frames, with software
  // timestamping.
  static Result<std::unique_ptr<L2Transport>> open(const std::string& iface, int tx_timestamp_timeout_ms,
                                                   Timestamping ts = Timestamping::Software);
  ~L2Transport() override;
  L2Transport(const L2Transport&) = delete;
  L2Transport& operator=(const L2Transport&) = delete;

  [[nodiscard]] int eventFd() const override { return fd_; }
  [[nodiscard]] int generalFd() const override { return fd_; }
  [[nodiscard]] const ClockIdentity& clockIdentity() const override { return identity_; }
  Result<std::optional<int64_t>> send(std::span<const uint8_t> bytes, bool event) override;
  Result<std::optional<Datagram>> receive(int fd) override;
  Result<int> discardErrorQueue(int fd) override;

 private:
  L2Transport() = default;
  std::string iface_;
  int ifindex_ = 0;
  int fd_ = -1;
  int tx_timeout_ms_ = 10;
  uint32_t tx_counter_ = 0;
  int ts_index_ = 0;
  ClockIdentity identity_{};
};

}  // namespace chorus::clock::ptp

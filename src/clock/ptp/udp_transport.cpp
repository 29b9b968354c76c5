#include "clock/ptp/udp_transport.hpp"

#include <arpa/inet.h>
#include <linux/errqueue.h>
#include <linux/ethtool.h>
#include <linux/if_packet.h>
#include <linux/sockios.h>
#include <linux/net_tstamp.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "clock/ptp/clock.hpp"

namespace chorus::clock::ptp {
namespace {

// Software timestamps on receive and transmit; the transmit ones come back on
// the error queue without the packet (TSONLY), tagged with a per-socket
// counter (OPT_ID) that pairs each with its send.
constexpr int kSoftwareTimestamping = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_RX_SOFTWARE |
                                      SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_ID |
                                      SOF_TIMESTAMPING_OPT_TSONLY;
constexpr int kHardwareTimestamping = SOF_TIMESTAMPING_TX_HARDWARE | SOF_TIMESTAMPING_RX_HARDWARE |
                                      SOF_TIMESTAMPING_RAW_HARDWARE | SOF_TIMESTAMPING_OPT_ID |
                                      SOF_TIMESTAMPING_OPT_TSONLY;

// Asks the driver what it can stamp (ETHTOOL_GET_TS_INFO) and turns hardware
// stamping on (SIOCSHWTSTAMP): transmit on, receive every PTP v2 event
// message (or everything, where the driver has no finer filter).  Returns
// the PHC index.
Result<int> enableHardwareTimestamping(int fd, const std::string& iface) {
  ethtool_ts_info info{};
  info.cmd = ETHTOOL_GET_TS_INFO;
  ifreq req{};
  std::snprintf(req.ifr_name, sizeof req.ifr_name, "%s", iface.c_str());
  req.ifr_data = reinterpret_cast<char*>(&info);
  if (ioctl(fd, SIOCETHTOOL, &req) < 0)
    return errnoError(fmt::format("chorus-ptp: asking {} for its timestamping capabilities (ETHTOOL_GET_TS_INFO)", iface),
                      errno);
  const unsigned need = SOF_TIMESTAMPING_TX_HARDWARE | SOF_TIMESTAMPING_RX_HARDWARE | SOF_TIMESTAMPING_RAW_HARDWARE;
  if (info.phc_index < 0 || (info.so_timestamping & need) != need)
    return invalidArgument("chorus-ptp: {} has no PTP hardware clock (phc index {}, capabilities {:#x}; `ethtool -T {}` "
                           "lists them): use software timestamping (the default)",
                           iface, info.phc_index, info.so_timestamping, iface);
  hwtstamp_config cfg{};
  cfg.tx_type = HWTSTAMP_TX_ON;
  cfg.rx_filter = HWTSTAMP_FILTER_PTP_V2_EVENT;
  req.ifr_data = reinterpret_cast<char*>(&cfg);
  if (ioctl(fd, SIOCSHWTSTAMP, &req) < 0) {
    cfg.rx_filter = HWTSTAMP_FILTER_ALL;
    if (ioctl(fd, SIOCSHWTSTAMP, &req) < 0)
      return errnoError(fmt::format("chorus-ptp: enabling hardware timestamps on {} (SIOCSHWTSTAMP; needs root)", iface),
                        errno);
  }
  return info.phc_index;
}



Status openSocket(const std::string& iface, int ifindex, uint16_t port, int ts_flags, int* out_fd) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errnoError("chorus-ptp: socket(AF_INET, SOCK_DGRAM)", errno);
  *out_fd = fd;  // owned by the caller from here, closed on any error below
  const int one = 1, zero = 0;
  // ptp4l sets SO_REUSEADDR too, so both can share a namespace.
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
    return errnoError("chorus-ptp: SO_REUSEADDR", errno);
  if (setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, iface.c_str(), static_cast<socklen_t>(iface.size())) < 0)
    return errnoError(fmt::format("chorus-ptp: SO_BINDTODEVICE {} (needs root/CAP_NET_RAW)", iface), errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0)
    return errnoError(fmt::format("chorus-ptp: bind UDP port {} on {} (needs root; is another PTP daemon "
                                  "running without SO_REUSEADDR?)",
                                  port, iface),
                      errno);
  ip_mreqn mreq{};
  inet_pton(AF_INET, kPtpPrimaryMulticast, &mreq.imr_multiaddr);
  mreq.imr_ifindex = ifindex;
  if (setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mreq, sizeof mreq) < 0)
    return errnoError(fmt::format("chorus-ptp: joining {} on {} (does the interface have an IPv4 address "
                                  "and is it up?)",
                                  kPtpPrimaryMulticast, iface),
                      errno);
  ip_mreqn ifreq{};
  ifreq.imr_ifindex = ifindex;
  if (setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &ifreq, sizeof ifreq) < 0)
    return errnoError("chorus-ptp: IP_MULTICAST_IF", errno);
  const int ttl = 1;
  if (setsockopt(fd, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof ttl) < 0)
    return errnoError("chorus-ptp: IP_MULTICAST_TTL", errno);
  if (setsockopt(fd, IPPROTO_IP, IP_MULTICAST_LOOP, &zero, sizeof zero) < 0)
    return errnoError("chorus-ptp: IP_MULTICAST_LOOP", errno);
  // Software timestamps on receive and transmit; the transmit ones come back
  // on the error queue without the packet (TSONLY), tagged with a per-socket
  // counter (OPT_ID) that pairs each with its send.  Only the event socket
  // stamps (ts_flags 0 for the general one, as ptp4l): a transmit stamp of
  // each Follow_Up, Delay_Resp and Announce would sit unread on the general
  // socket's error queue, whose POLLERR then never clears.
  if (ts_flags == 0) return Status::ok();
  if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &ts_flags, sizeof ts_flags) < 0)
    return errnoError(fmt::format("chorus-ptp: SO_TIMESTAMPING on {} (ethtool -T {} lists what "
                                  "the driver supports)",
                                  iface, iface),
                      errno);
  return Status::ok();
}

// The timestamp in slot `index` of the SO_TIMESTAMPING control message
// (0: software, 2: raw hardware).
std::optional<int64_t> kernelTimestamp(msghdr& msg, int index) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPING &&
        c->cmsg_len >= CMSG_LEN(sizeof(scm_timestamping))) {
      scm_timestamping ts;
      std::memcpy(&ts, CMSG_DATA(c), sizeof ts);
      const timespec& t = ts.ts[index];
      if (t.tv_sec == 0 && t.tv_nsec == 0) return std::nullopt;
      return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
    }
  }
  return std::nullopt;
}

// One message of a socket's error queue (a transmit timestamp): its control
// data, and the looped-back packet's bytes, which are not needed.
struct ErrQueueMessage {
  alignas(cmsghdr) char control[512];
  char junk[1600];
  iovec iov{junk, sizeof junk};
  msghdr msg{};
  ErrQueueMessage() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  ErrQueueMessage(const ErrQueueMessage&) = delete;
  ErrQueueMessage& operator=(const ErrQueueMessage&) = delete;
  // recvmsg(MSG_ERRQUEUE), not blocking: bytes read, or -1 with errno.
  ssize_t read(int fd) { return ::recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT); }
};

// Waits up to timeout_ms for the transmit timestamp of the send numbered id
// (SOF_TIMESTAMPING_OPT_ID) on fd's error queue; older ones (of a send whose
// wait timed out) are skipped.  The extended error comes as IP_RECVERR on a
// UDP socket and as PACKET_TX_TIMESTAMP on a packet socket.
Result<std::optional<int64_t>> waitTxTimestamp(int fd, uint32_t id, int timeout_ms, int index) {
  const int64_t deadline = monotonicNs() + int64_t{timeout_ms} * 1'000'000;
  for (;;) {
    const int64_t left_ms = (deadline - monotonicNs()) / 1'000'000;
    pollfd p{fd, POLLPRI, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left_ms, 0)));
    if (r < 0 && errno != EINTR) return errnoError("chorus-ptp: poll for a transmit timestamp", errno);
    if (r <= 0 || !(p.revents & (POLLERR | POLLPRI))) {
      if (monotonicNs() >= deadline) return std::optional<int64_t>{};
      continue;
    }
    ErrQueueMessage eq;
    msghdr& msg = eq.msg;
    const ssize_t got = eq.read(fd);
    if (got < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return errnoError("chorus-ptp: recvmsg(MSG_ERRQUEUE)", errno);
    }
    std::optional<uint32_t> got_id;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      const bool ext = (c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
                       (c->cmsg_level == SOL_PACKET && c->cmsg_type == PACKET_TX_TIMESTAMP);
      if (ext && c->cmsg_len >= CMSG_LEN(sizeof(sock_extended_err))) {
        sock_extended_err ee;
        std::memcpy(&ee, CMSG_DATA(c), sizeof ee);
        if (ee.ee_origin == SO_EE_ORIGIN_TIMESTAMPING) got_id = ee.ee_data;
      }
    }
    const auto ts = kernelTimestamp(msg, index);
    if (got_id && *got_id == id && ts) return std::optional<int64_t>{*ts};
    // A stale timestamp of an earlier send, or one without the id: keep waiting.
  }
}

// Reads and drops whatever waits on fd's error queue: transmit stamps of
// sends nobody waits for (a general message over Layer 2, an event message
// whose wait timed out).  Returns how many were dropped.
Result<int> drainErrorQueue(int fd) {
  int dropped = 0;
  for (int budget = 256; budget > 0; --budget) {
    ErrQueueMessage eq;
    if (eq.read(fd) < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      return errnoError("chorus-ptp: recvmsg(MSG_ERRQUEUE)", errno);
    }
    ++dropped;
  }
  return dropped;
}

ClockIdentity identityOf(int fd, const std::string& iface, Status* st) {
  ifreq req{};
  std::snprintf(req.ifr_name, sizeof req.ifr_name, "%s", iface.c_str());
  if (ioctl(fd, SIOCGIFHWADDR, &req) < 0) {
    *st = errnoError(fmt::format("chorus-ptp: reading the MAC address of {}", iface), errno);
    return {};
  }
  const auto* mac = reinterpret_cast<const uint8_t*>(req.ifr_hwaddr.sa_data);
  return {mac[0], mac[1], mac[2], 0xFF, 0xFE, mac[3], mac[4], mac[5]};
}

}  // namespace

Result<std::unique_ptr<NetTransport>> openTransport(Network net, const std::string& iface, int tx_timestamp_timeout_ms,
                                                    Timestamping ts, int* phc_index) {
  if (ts == Timestamping::Hardware) {
    // Any socket serves for the interface ioctls.
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return errnoError("chorus-ptp: socket for the timestamping ioctls", errno);
    auto phc = enableHardwareTimestamping(fd, iface);
    ::close(fd);
    if (!phc.isOk()) return phc.status();
    if (phc_index) *phc_index = *phc;
  }
  if (net == Network::L2) {
    CHORUS_ASSIGN_OR_RETURN(auto t, L2Transport::open(iface, tx_timestamp_timeout_ms, ts));
    return std::unique_ptr<NetTransport>(std::move(t));
  }
  CHORUS_ASSIGN_OR_RETURN(auto t, UdpTransport::open(iface, tx_timestamp_timeout_ms, ts));
  return std::unique_ptr<NetTransport>(std::move(t));
}

Result<std::unique_ptr<UdpTransport>> UdpTransport::open(const std::string& iface, int tx_timestamp_timeout_ms,
                                                        Timestamping ts) {
  const unsigned ifindex = if_nametoindex(iface.c_str());
  if (ifindex == 0)
    return errnoError(fmt::format("chorus-ptp: interface '{}' not found (ip link lists the interfaces)", iface), errno);
  std::unique_ptr<UdpTransport> t(new UdpTransport());
  t->iface_ = iface;
  t->tx_timeout_ms_ = tx_timestamp_timeout_ms;
  const bool hw = ts == Timestamping::Hardware;
  const int flags = hw ? kHardwareTimestamping : kSoftwareTimestamping;
  t->ts_index_ = hw ? 2 : 0;
  CHORUS_RETURN_IF_ERROR(openSocket(iface, static_cast<int>(ifindex), kPtpEventPort, flags, &t->event_fd_));
  CHORUS_RETURN_IF_ERROR(openSocket(iface, static_cast<int>(ifindex), kPtpGeneralPort, 0, &t->general_fd_));
  Status st;
  t->identity_ = identityOf(t->event_fd_, iface, &st);
  CHORUS_RETURN_IF_ERROR(st);
  return t;
}

UdpTransport::~UdpTransport() {
  if (event_fd_ >= 0) ::close(event_fd_);
  if (general_fd_ >= 0) ::close(general_fd_);
}

Result<std::optional<int64_t>> UdpTransport::send(std::span<const uint8_t> bytes, bool event) {
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(event ? kPtpEventPort : kPtpGeneralPort);
  inet_pton(AF_INET, kPtpPrimaryMulticast, &dst.sin_addr);
  const int fd = event ? event_fd_ : general_fd_;
  const ssize_t n = ::sendto(fd, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&dst), sizeof dst);
  if (n < 0) return errnoError(fmt::format("chorus-ptp: sendto {}:{} on {}", kPtpPrimaryMulticast,
                                           event ? kPtpEventPort : kPtpGeneralPort, iface_),
                               errno);
  if (!event) return std::optional<int64_t>{};
  return waitTxTimestamp(fd, tx_counter_++, tx_timeout_ms_, ts_index_);
}

Result<int> UdpTransport::discardErrorQueue(int fd) { return drainErrorQueue(fd); }
Result<int> L2Transport::discardErrorQueue(int fd) { return drainErrorQueue(fd); }

Result<std::optional<Datagram>> UdpTransport::receive(int fd) {
  Datagram d;
  d.bytes.resize(1500);
  alignas(cmsghdr) char control[512];
  iovec iov{d.bytes.data(), d.bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return std::optional<Datagram>{};
    return errnoError(fmt::format("chorus-ptp: recvmsg on {}", iface_), errno);
  }
  d.bytes.resize(static_cast<size_t>(n));
  d.rx_realtime_ns = kernelTimestamp(msg, ts_index_);
  return std::optional<Datagram>{std::move(d)};
}

// ---- Layer 2 -------------------------------------------------------------------

Result<std::unique_ptr<L2Transport>> L2Transport::open(const std::string& iface, int tx_timestamp_timeout_ms,
                                                      Timestamping ts) {
  const unsigned ifindex = if_nametoindex(iface.c_str());
  if (ifindex == 0)
    return errnoError(fmt::format("chorus-ptp: interface '{}' not found (ip link lists the interfaces)", iface), errno);
  std::unique_ptr<L2Transport> t(new L2Transport());
  t->iface_ = iface;
  t->ifindex_ = static_cast<int>(ifindex);
  t->tx_timeout_ms_ = tx_timestamp_timeout_ms;
  // A datagram packet socket: the kernel builds and strips the Ethernet
  // header; only frames of EtherType 0x88F7 arrive.
  t->fd_ = ::socket(AF_PACKET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(kPtpEtherType));
  if (t->fd_ < 0) return errnoError("chorus-ptp: socket(AF_PACKET) for Layer 2 PTP (needs root/CAP_NET_RAW)", errno);
  sockaddr_ll addr{};
  addr.sll_family = AF_PACKET;
  addr.sll_protocol = htons(kPtpEtherType);
  addr.sll_ifindex = t->ifindex_;
  if (::bind(t->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0)
    return errnoError(fmt::format("chorus-ptp: binding the packet socket to {}", iface), errno);
  packet_mreq mreq{};
  mreq.mr_ifindex = t->ifindex_;
  mreq.mr_type = PACKET_MR_MULTICAST;
  mreq.mr_alen = 6;
  std::memcpy(mreq.mr_address, kPtpPrimaryMac, 6);
  if (setsockopt(t->fd_, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mreq, sizeof mreq) < 0)
    return errnoError(fmt::format("chorus-ptp: joining 01-1B-19-00-00-00 on {}", iface), errno);
  // A packet socket also sees its own transmissions; receive() drops them by
  // type as well, for kernels without this option.
  const int one = 1;
  (void)setsockopt(t->fd_, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
  const bool hw = ts == Timestamping::Hardware;
  const int flags = hw ? kHardwareTimestamping : kSoftwareTimestamping;
  t->ts_index_ = hw ? 2 : 0;
  if (setsockopt(t->fd_, SOL_SOCKET, SO_TIMESTAMPING, &flags, sizeof flags) < 0)
    return errnoError(fmt::format("chorus-ptp: SO_TIMESTAMPING on {}", iface), errno);
  Status st;
  t->identity_ = identityOf(t->fd_, iface, &st);
  CHORUS_RETURN_IF_ERROR(st);
  return t;
}

L2Transport::~L2Transport() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::optional<int64_t>> L2Transport::send(std::span<const uint8_t> bytes, bool event) {
  sockaddr_ll dst{};
  dst.sll_family = AF_PACKET;
  dst.sll_protocol = htons(kPtpEtherType);
  dst.sll_ifindex = ifindex_;
  dst.sll_halen = 6;
  std::memcpy(dst.sll_addr, kPtpPrimaryMac, 6);
  const ssize_t n = ::sendto(fd_, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&dst), sizeof dst);
  if (n < 0) return errnoError(fmt::format("chorus-ptp: sending a Layer 2 frame on {}", iface_), errno);
  // Every send bumps the OPT_ID counter (one socket carries both classes).
  const uint32_t id = tx_counter_++;
  if (!event) return std::optional<int64_t>{};
  return waitTxTimestamp(fd_, id, tx_timeout_ms_, ts_index_);
}

Result<std::optional<Datagram>> L2Transport::receive(int fd) {
  Datagram d;
  d.bytes.resize(1500);
  alignas(cmsghdr) char control[512];
  iovec iov{d.bytes.data(), d.bytes.size()};
  sockaddr_ll from{};
  msghdr msg{};
  msg.msg_name = &from;
  msg.msg_namelen = sizeof from;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  for (;;) {
    const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return std::optional<Datagram>{};
      return errnoError(fmt::format("chorus-ptp: recvmsg on the packet socket of {}", iface_), errno);
    }
    if (from.sll_pkttype == PACKET_OUTGOING) {  // our own frame
      msg.msg_controllen = sizeof control;
      msg.msg_namelen = sizeof from;
      continue;
    }
    d.bytes.resize(static_cast<size_t>(n));
    d.rx_realtime_ns = kernelTimestamp(msg, ts_index_);
    return std::optional<Datagram>{std::move(d)};
  }
}

}  // namespace chorus::clock::ptp

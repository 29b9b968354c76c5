#include "clock/ptp/message.hpp"

#include <fmt/format.h>

#include <type_traits>

namespace chorus::clock::ptp {
namespace {

// Big-endian reader over a span whose bounds were checked by the caller: every
// read below is preceded by a size check against the span it reads.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  uint8_t u8(size_t off) const { return b_[off]; }
  uint16_t u16(size_t off) const { return static_cast<uint16_t>((b_[off] << 8) | b_[off + 1]); }
  uint32_t u32(size_t off) const { return (uint32_t{u16(off)} << 16) | u16(off + 2); }
  uint64_t u48(size_t off) const { return (uint64_t{u16(off)} << 32) | u32(off + 2); }
  uint64_t u64(size_t off) const { return (uint64_t{u32(off)} << 32) | u32(off + 4); }
  Timestamp timestamp(size_t off) const { return {u48(off), u32(off + 6)}; }
  ClockIdentity identity(size_t off) const {
    ClockIdentity id;
    for (size_t i = 0; i < 8; ++i) id[i] = b_[off + i];
    return id;
  }
  PortIdentity portIdentity(size_t off) const { return {identity(off), u16(off + 8)}; }

 private:
  std::span<const uint8_t> b_;
};

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(v); }
  void u16(uint16_t v) {
    u8(static_cast<uint8_t>(v >> 8));
    u8(static_cast<uint8_t>(v));
  }
  void u32(uint32_t v) {
    u16(static_cast<uint16_t>(v >> 16));
    u16(static_cast<uint16_t>(v));
  }
  void u48(uint64_t v) {
    u16(static_cast<uint16_t>(v >> 32));
    u32(static_cast<uint32_t>(v));
  }
  void u64(uint64_t v) {
    u32(static_cast<uint32_t>(v >> 32));
    u32(static_cast<uint32_t>(v));
  }
  void zeros(size_t n) { out_.insert(out_.end(), n, 0); }
  void timestamp(const Timestamp& t) {
    u48(t.seconds);
    u32(t.nanoseconds);
  }
  void identity(const ClockIdentity& id) { out_.insert(out_.end(), id.begin(), id.end()); }
  void portIdentity(const PortIdentity& p) {
    identity(p.clock);
    u16(p.port);
  }
  void quality(const ClockQuality& q) {
    u8(q.clock_class);
    u8(q.clock_accuracy);
    u16(q.offset_scaled_log_variance);
  }
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

size_t fixedSize(MessageType t) {
  switch (t) {
    case MessageType::Sync: return kSyncBytes;
    case MessageType::DelayReq: return kDelayReqBytes;
    case MessageType::FollowUp: return kFollowUpBytes;
    case MessageType::DelayResp: return kDelayRespBytes;
    case MessageType::Announce: return kAnnounceBytes;
    case MessageType::Management: return kManagementBytes;
    case MessageType::PdelayReq:
    case MessageType::PdelayResp:
    case MessageType::PdelayRespFollowUp: return 54;
    case MessageType::Signaling: return 44;
  }
  return kHeaderBytes;
}

uint8_t controlFor(MessageType t) {
  switch (t) {
    case MessageType::Sync: return 0;
    case MessageType::DelayReq: return 1;
    case MessageType::FollowUp: return 2;
    case MessageType::DelayResp: return 3;
    case MessageType::Management: return 4;
    default: return 5;
  }
}

bool knownType(uint8_t t) {
  return t <= 0x3 || (t >= 0x8 && t <= 0xD);
}

template <typename T>
constexpr MessageType typeOfBody() {
  if constexpr (std::is_same_v<T, SyncBody>) return MessageType::Sync;
  if constexpr (std::is_same_v<T, DelayReqBody>) return MessageType::DelayReq;
  if constexpr (std::is_same_v<T, FollowUpBody>) return MessageType::FollowUp;
  if constexpr (std::is_same_v<T, DelayRespBody>) return MessageType::DelayResp;
  if constexpr (std::is_same_v<T, AnnounceBody>) return MessageType::Announce;
  if constexpr (std::is_same_v<T, ManagementBody>) return MessageType::Management;
  return MessageType::Signaling;
}

}  // namespace

std::string_view messageTypeName(MessageType t) {
  switch (t) {
    case MessageType::Sync: return "Sync";
    case MessageType::DelayReq: return "Delay_Req";
    case MessageType::PdelayReq: return "Pdelay_Req";
    case MessageType::PdelayResp: return "Pdelay_Resp";
    case MessageType::FollowUp: return "Follow_Up";
    case MessageType::DelayResp: return "Delay_Resp";
    case MessageType::PdelayRespFollowUp: return "Pdelay_Resp_Follow_Up";
    case MessageType::Announce: return "Announce";
    case MessageType::Signaling: return "Signaling";
    case MessageType::Management: return "Management";
  }
  return "unknown";
}

std::string toString(const ClockIdentity& id) {
  return fmt::format("{:02x}{:02x}{:02x}.{:02x}{:02x}.{:02x}{:02x}{:02x}", id[0], id[1], id[2], id[3], id[4], id[5],
                     id[6], id[7]);
}

std::string toString(const PortIdentity& id) { return fmt::format("{}-{}", toString(id.clock), id.port); }

Timestamp timestampFromNs(int64_t ns) {
  if (ns < 0) return {};
  return {static_cast<uint64_t>(ns / 1'000'000'000), static_cast<uint32_t>(ns % 1'000'000'000)};
}

int64_t timestampToNs(const Timestamp& ts) {
  // 2^48 s does not fit int64 ns; such a time is garbage from the wire, and
  // the saturated value makes the resulting offset absurd rather than UB.
  constexpr uint64_t kMaxSeconds = 9'000'000'000ULL;
  if (ts.seconds > kMaxSeconds) return INT64_MAX;
  return static_cast<int64_t>(ts.seconds) * 1'000'000'000 + ts.nanoseconds;
}

Result<Message> parseMessage(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderBytes)
    return invalidArgument("ptp: message of {} bytes is shorter than the {}-byte PTP header", bytes.size(),
                           kHeaderBytes);
  Reader r(bytes);
  Message m;
  Header& h = m.header;
  h.transport_specific = r.u8(0) >> 4;
  const uint8_t type = r.u8(0) & 0x0F;
  h.version = r.u8(1) & 0x0F;
  h.minor_version = r.u8(1) >> 4;
  if (h.version != 2)
    return invalidArgument("ptp: versionPTP is {}, only PTPv2 (IEEE 1588-2008) is understood", h.version);
  if (!knownType(type)) return invalidArgument("ptp: unknown messageType 0x{:x}", type);
  h.type = static_cast<MessageType>(type);
  h.length = r.u16(2);
  h.domain = r.u8(4);
  h.flags = r.u16(6);
  h.correction = static_cast<int64_t>(r.u64(8));
  h.source = r.portIdentity(20);
  h.sequence_id = r.u16(30);
  h.control = r.u8(32);
  h.log_message_interval = static_cast<int8_t>(r.u8(33));

  const size_t need = fixedSize(h.type);
  if (h.length > bytes.size())
    return invalidArgument("ptp: {} messageLength {} exceeds the {} bytes received (truncated?)",
                           messageTypeName(h.type), h.length, bytes.size());
  if (h.length < need)
    return invalidArgument("ptp: {} messageLength {} is below its fixed size {}", messageTypeName(h.type), h.length,
                           need);
  // From here on only bytes below h.length are read.
  switch (h.type) {
    case MessageType::Sync: m.body = SyncBody{r.timestamp(34)}; break;
    case MessageType::DelayReq: m.body = DelayReqBody{r.timestamp(34)}; break;
    case MessageType::FollowUp: m.body = FollowUpBody{r.timestamp(34)}; break;
    case MessageType::DelayResp: m.body = DelayRespBody{r.timestamp(34), r.portIdentity(44)}; break;
    case MessageType::Announce: {
      AnnounceBody a;
      a.origin = r.timestamp(34);
      a.current_utc_offset = static_cast<int16_t>(r.u16(44));
      a.gm_priority1 = r.u8(47);
      a.gm_quality = {r.u8(48), r.u8(49), r.u16(50)};
      a.gm_priority2 = r.u8(52);
      a.gm_identity = r.identity(53);
      a.steps_removed = r.u16(61);
      a.time_source = r.u8(63);
      m.body = a;
      break;
    }
    case MessageType::Management: {
      ManagementBody mb;
      mb.target = r.portIdentity(34);
      mb.starting_boundary_hops = r.u8(44);
      mb.boundary_hops = r.u8(45);
      mb.action = static_cast<ManagementAction>(r.u8(46) & 0x0F);
      if (r.u8(46) & 0x0F) {
        if ((r.u8(46) & 0x0F) > 4)
          return invalidArgument("ptp: Management actionField {} is not GET/SET/RESPONSE/COMMAND/ACKNOWLEDGE",
                                 r.u8(46) & 0x0F);
      }
      // One TLV is required by 15.4.1; a bare header is malformed.
      if (h.length < kManagementBytes + 6)
        return invalidArgument("ptp: Management messageLength {} leaves no room for its TLV (needs >= {})", h.length,
                               kManagementBytes + 6);
      mb.tlv_type = r.u16(48);
      const uint16_t tlv_len = r.u16(50);
      if (tlv_len < 2 || kManagementBytes + 4 + size_t{tlv_len} > h.length)
        return invalidArgument("ptp: Management TLV lengthField {} does not fit messageLength {}", tlv_len, h.length);
      mb.management_id = r.u16(52);
      mb.data.assign(bytes.begin() + kManagementBytes + 6, bytes.begin() + kManagementBytes + 4 + tlv_len);
      m.body = std::move(mb);
      break;
    }
    default: m.body = IgnoredBody{}; break;
  }
  return m;
}

Result<std::vector<uint8_t>> buildMessage(const Message& m) {
  const Header& h = m.header;
  const MessageType body_type = std::visit([](const auto& b) { return typeOfBody<std::decay_t<decltype(b)>>(); }, m.body);
  if (std::holds_alternative<IgnoredBody>(m.body))
    return invalidArgument("ptp: cannot build a {} message (chorus does not send it)", messageTypeName(h.type));
  if (body_type != h.type)
    return invalidArgument("ptp: header type {} does not match the {} body", messageTypeName(h.type),
                           messageTypeName(body_type));
  Writer w;
  w.u8(static_cast<uint8_t>((h.transport_specific << 4) | static_cast<uint8_t>(h.type)));
  w.u8(static_cast<uint8_t>((h.minor_version << 4) | (h.version & 0x0F)));
  w.u16(0);  // length, patched below
  w.u8(h.domain);
  w.u8(0);
  w.u16(h.flags);
  w.u64(static_cast<uint64_t>(h.correction));
  w.zeros(4);
  w.portIdentity(h.source);
  w.u16(h.sequence_id);
  w.u8(controlFor(h.type));
  w.u8(static_cast<uint8_t>(h.log_message_interval));

  std::visit(
      [&](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, SyncBody> || std::is_same_v<T, DelayReqBody>) {
          w.timestamp(b.origin);
        } else if constexpr (std::is_same_v<T, FollowUpBody>) {
          w.timestamp(b.precise_origin);
        } else if constexpr (std::is_same_v<T, DelayRespBody>) {
          w.timestamp(b.receive);
          w.portIdentity(b.requesting);
        } else if constexpr (std::is_same_v<T, AnnounceBody>) {
          w.timestamp(b.origin);
          w.u16(static_cast<uint16_t>(b.current_utc_offset));
          w.u8(0);
          w.u8(b.gm_priority1);
          w.quality(b.gm_quality);
          w.u8(b.gm_priority2);
          w.identity(b.gm_identity);
          w.u16(b.steps_removed);
          w.u8(b.time_source);
        } else if constexpr (std::is_same_v<T, ManagementBody>) {
          w.portIdentity(b.target);
          w.u8(b.starting_boundary_hops);
          w.u8(b.boundary_hops);
          w.u8(static_cast<uint8_t>(b.action) & 0x0F);
          w.u8(0);
          w.u16(b.tlv_type);
          w.u16(static_cast<uint16_t>(2 + b.data.size()));
          w.u16(b.management_id);
          for (uint8_t v : b.data) w.u8(v);
        }
      },
      m.body);
  std::vector<uint8_t>& out = w.bytes();
  if (out.size() > 0xFFFF) return invalidArgument("ptp: message of {} bytes exceeds messageLength's range", out.size());
  out[2] = static_cast<uint8_t>(out.size() >> 8);
  out[3] = static_cast<uint8_t>(out.size());
  return std::move(out);
}

std::vector<uint8_t> encodeDefaultDataSet(const DefaultDataSetFields& f) {
  Writer w;
  w.u8(static_cast<uint8_t>((f.two_step ? 0x01 : 0) | (f.slave_only ? 0x02 : 0)));
  w.u8(0);
  w.u16(f.number_ports);
  w.u8(f.priority1);
  w.quality(f.quality);
  w.u8(f.priority2);
  w.identity(f.identity);
  w.u8(f.domain);
  w.u8(0);
  return std::move(w.bytes());
}

std::vector<uint8_t> encodeCurrentDataSet(const CurrentDataSetFields& f) {
  Writer w;
  w.u16(f.steps_removed);
  w.u64(static_cast<uint64_t>(f.offset_from_master_scaled));
  w.u64(static_cast<uint64_t>(f.mean_path_delay_scaled));
  return std::move(w.bytes());
}

std::vector<uint8_t> encodeParentDataSet(const ParentDataSetFields& f) {
  Writer w;
  w.portIdentity(f.parent);
  w.u8(0);         // parentStats: no observed statistics
  w.u8(0);         // reserved
  w.u16(0xFFFF);   // observedParentOffsetScaledLogVariance
  w.u32(0x7FFFFFFF);  // observedParentClockPhaseChangeRate: not computed
  w.u8(f.gm_priority1);
  w.quality(f.gm_quality);
  w.u8(f.gm_priority2);
  w.identity(f.gm_identity);
  return std::move(w.bytes());
}

std::vector<uint8_t> encodePortDataSet(const PortDataSetFields& f) {
  Writer w;
  w.portIdentity(f.identity);
  w.u8(f.state);
  w.u8(static_cast<uint8_t>(f.log_min_delay_req_interval));
  w.u64(0);  // peerMeanPathDelay: E2E port
  w.u8(static_cast<uint8_t>(f.log_announce_interval));
  w.u8(f.announce_receipt_timeout);
  w.u8(static_cast<uint8_t>(f.log_sync_interval));
  w.u8(1);  // delayMechanism: E2E
  w.u8(0);  // logMinPdelayReqInterval
  w.u8(2);  // versionNumber
  return std::move(w.bytes());
}

}  // namespace chorus::clock::ptp

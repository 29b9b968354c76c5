// IEEE 1588-2008 (PTPv2) messages: exact wire layouts, a bounds-checked parser
// over a byte span and a builder.
//
// Layouts (all fields big-endian; offsets in bytes), IEEE 1588-2008 clause 13:
//
//   common header (13.3), 34 bytes
//     0  transportSpecific(4 bits) | messageType(4 bits)
//     1  reserved/minorVersionPTP(4 bits) | versionPTP(4 bits) = 2
//     2  messageLength (uint16, whole message incl. TLVs)
//     4  domainNumber
//     5  reserved
//     6  flagField (uint16; byte 6 = octet 0: ALT_MASTER 0x01, TWO_STEP 0x02,
//        UNICAST 0x04; byte 7 = octet 1: LI_61 0x01, LI_59 0x02,
//        UTC_OFFSET_VALID 0x04, PTP_TIMESCALE 0x08, TIME_TRACEABLE 0x10,
//        FREQUENCY_TRACEABLE 0x20)
//     8  correctionField (int64, ns * 2^16)
//    16  reserved (4)
//    20  sourcePortIdentity: clockIdentity (8) + portNumber (uint16)
//    30  sequenceId (uint16)
//    32  controlField (Sync 0, Delay_Req 1, Follow_Up 2, Delay_Resp 3,
//        Management 4, all others 5)
//    33  logMessageInterval (int8; 0x7F for Delay_Req and Management)
//
//   Timestamp (5.3.3), 10 bytes: secondsField (uint48) + nanosecondsField (uint32)
//
//   Sync / Delay_Req (13.6, 13.7)  34 + originTimestamp(10)            = 44
//   Follow_Up (13.8)               34 + preciseOriginTimestamp(10)     = 44
//   Delay_Resp (13.9)              34 + receiveTimestamp(10)
//                                     + requestingPortIdentity(10)     = 54
//   Announce (13.5)                34 + originTimestamp(10)
//                                     + currentUtcOffset(int16) + reserved(1)
//                                     + grandmasterPriority1(1)
//                                     + grandmasterClockQuality(4: class,
//                                       accuracy, offsetScaledLogVariance u16)
//                                     + grandmasterPriority2(1)
//                                     + grandmasterIdentity(8)
//                                     + stepsRemoved(u16) + timeSource(1) = 64
//   Management (15.4)              34 + targetPortIdentity(10)
//                                     + startingBoundaryHops(1) + boundaryHops(1)
//                                     + reserved(4 bits) | actionField(4 bits)
//                                     + reserved(1)                     = 48
//                                     then one TLV: tlvType(u16) lengthField(u16)
//                                     managementId(u16) dataField(length-2)
//
// Pdelay_* and Signaling are recognised (header parsed, body ignored) so a
// port on a mixed network skips them instead of reporting errors.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/status.hpp"

namespace chorus::clock::ptp {

inline constexpr size_t kHeaderBytes = 34;
inline constexpr size_t kTimestampBytes = 10;
inline constexpr size_t kSyncBytes = 44;
inline constexpr size_t kDelayReqBytes = 44;
inline constexpr size_t kFollowUpBytes = 44;
inline constexpr size_t kDelayRespBytes = 54;
inline constexpr size_t kAnnounceBytes = 64;
inline constexpr size_t kManagementBytes = 48;  // without its TLV
inline constexpr int8_t kLogIntervalUnused = 0x7F;

// flagField as a big-endian uint16: octet 0 is the high byte.
inline constexpr uint16_t kFlagAlternateMaster = 0x0100;
inline constexpr uint16_t kFlagTwoStep = 0x0200;
inline constexpr uint16_t kFlagUnicast = 0x0400;
inline constexpr uint16_t kFlagLeap61 = 0x0001;
inline constexpr uint16_t kFlagLeap59 = 0x0002;
inline constexpr uint16_t kFlagUtcOffsetValid = 0x0004;
inline constexpr uint16_t kFlagPtpTimescale = 0x0008;
inline constexpr uint16_t kFlagTimeTraceable = 0x0010;
inline constexpr uint16_t kFlagFrequencyTraceable = 0x0020;

enum class MessageType : uint8_t {
  Sync = 0x0,
  DelayReq = 0x1,
  PdelayReq = 0x2,
  PdelayResp = 0x3,
  FollowUp = 0x8,
  DelayResp = 0x9,
  PdelayRespFollowUp = 0xA,
  Announce = 0xB,
  Signaling = 0xC,
  Management = 0xD,
};
[[nodiscard]] std::string_view messageTypeName(MessageType t);
[[nodiscard]] constexpr bool isEventMessage(MessageType t) { return static_cast<uint8_t>(t) < 0x8; }

using ClockIdentity = std::array<uint8_t, 8>;

struct PortIdentity {
  ClockIdentity clock{};
  uint16_t port = 0;
  auto operator<=>(const PortIdentity&) const = default;
};
// "b60997.fffe.d4a5fd-1", as ptp4l prints it.
[[nodiscard]] std::string toString(const ClockIdentity& id);
[[nodiscard]] std::string toString(const PortIdentity& id);

// A PTP timestamp; seconds is 48 bits on the wire.
struct Timestamp {
  uint64_t seconds = 0;
  uint32_t nanoseconds = 0;
  bool operator==(const Timestamp&) const = default;
};
// Nanoseconds since the PTP epoch; negative times are not representable on
// the wire and clamp to 0.
[[nodiscard]] Timestamp timestampFromNs(int64_t ns);
[[nodiscard]] int64_t timestampToNs(const Timestamp& ts);

struct ClockQuality {
  uint8_t clock_class = 248;
  uint8_t clock_accuracy = 0xFE;  // unknown
  uint16_t offset_scaled_log_variance = 0xFFFF;
  bool operator==(const ClockQuality&) const = default;
};

struct Header {
  uint8_t transport_specific = 0;
  MessageType type = MessageType::Sync;
  uint8_t version = 2;
  uint8_t minor_version = 0;
  uint16_t length = 0;  // set by buildMessage
  uint8_t domain = 0;
  uint16_t flags = 0;
  int64_t correction = 0;  // ns * 2^16
  PortIdentity source;
  uint16_t sequence_id = 0;
  uint8_t control = 0;  // set by buildMessage from type
  int8_t log_message_interval = kLogIntervalUnused;
};

struct SyncBody {
  Timestamp origin;
};
struct DelayReqBody {
  Timestamp origin;
};
struct FollowUpBody {
  Timestamp precise_origin;
};
struct DelayRespBody {
  Timestamp receive;
  PortIdentity requesting;
};
struct AnnounceBody {
  Timestamp origin;
  int16_t current_utc_offset = 0;
  uint8_t gm_priority1 = 128;
  ClockQuality gm_quality;
  uint8_t gm_priority2 = 128;
  ClockIdentity gm_identity{};
  uint16_t steps_removed = 0;
  uint8_t time_source = 0xA0;  // INTERNAL_OSCILLATOR
};

enum class ManagementAction : uint8_t { Get = 0, Set = 1, Response = 2, Command = 3, Acknowledge = 4 };
inline constexpr uint16_t kTlvManagement = 0x0001;
inline constexpr uint16_t kTlvManagementErrorStatus = 0x0002;
// managementId values (15.5.2.3) answered by chorus-ptp.
inline constexpr uint16_t kMgmtNullManagement = 0x0000;
inline constexpr uint16_t kMgmtDefaultDataSet = 0x2000;
inline constexpr uint16_t kMgmtCurrentDataSet = 0x2001;
inline constexpr uint16_t kMgmtParentDataSet = 0x2002;
inline constexpr uint16_t kMgmtTimePropertiesDataSet = 0x2003;
inline constexpr uint16_t kMgmtPortDataSet = 0x2004;
inline constexpr uint16_t kMgmtErrorNotSupported = 0x0006;

// A Management message with its one TLV.  For a MANAGEMENT TLV `data` is the
// dataField; for MANAGEMENT_ERROR_STATUS it is everything after the
// managementErrorId (managementId, reserved, displayData).
struct ManagementBody {
  PortIdentity target;
  uint8_t starting_boundary_hops = 0;
  uint8_t boundary_hops = 0;
  ManagementAction action = ManagementAction::Get;
  uint16_t tlv_type = kTlvManagement;
  uint16_t management_id = 0;  // for an error TLV: managementErrorId
  std::vector<uint8_t> data;
};

// A recognised message whose body chorus does not use (Pdelay_*, Signaling).
struct IgnoredBody {};

using Body = std::variant<SyncBody, DelayReqBody, FollowUpBody, DelayRespBody, AnnounceBody, ManagementBody,
                          IgnoredBody>;

struct Message {
  Header header;
  Body body;
};

// Parses one PTP message from `bytes` (a UDP payload or an Ethernet payload
// after the EtherType).  Checks: at least a header, versionPTP 2, a type
// chorus knows, messageLength <= bytes.size() and >= the type's fixed size,
// and for Management a TLV that fits inside messageLength.  Bytes after
// messageLength are ignored (padding of short Ethernet frames); TLVs after a
// fixed-size body are skipped.
Result<Message> parseMessage(std::span<const uint8_t> bytes);

// Serialises `m`: header.length and header.control are computed from the body,
// header.type must match the body's alternative (checked: invalidArgument).
Result<std::vector<uint8_t>> buildMessage(const Message& m);

// Management dataField encoders for the data sets chorus answers (15.5.3).
struct DefaultDataSetFields {
  bool two_step = true;
  bool slave_only = false;
  uint16_t number_ports = 1;
  uint8_t priority1 = 128;
  ClockQuality quality;
  uint8_t priority2 = 128;
  ClockIdentity identity{};
  uint8_t domain = 0;
};
std::vector<uint8_t> encodeDefaultDataSet(const DefaultDataSetFields& f);  // 20 bytes
struct CurrentDataSetFields {
  uint16_t steps_removed = 0;
  int64_t offset_from_master_scaled = 0;  // TimeInterval: ns * 2^16
  int64_t mean_path_delay_scaled = 0;
};
std::vector<uint8_t> encodeCurrentDataSet(const CurrentDataSetFields& f);  // 18 bytes
struct ParentDataSetFields {
  PortIdentity parent;
  uint8_t gm_priority1 = 128;
  ClockQuality gm_quality;
  uint8_t gm_priority2 = 128;
  ClockIdentity gm_identity{};
};
std::vector<uint8_t> encodeParentDataSet(const ParentDataSetFields& f);  // 32 bytes
struct PortDataSetFields {
  PortIdentity identity;
  uint8_t state = 1;
  int8_t log_min_delay_req_interval = 0;
  int8_t log_announce_interval = 1;
  uint8_t announce_receipt_timeout = 3;
  int8_t log_sync_interval = 0;
};
std::vector<uint8_t> encodePortDataSet(const PortDataSetFields& f);  // 26 bytes

}  // namespace chorus::clock::ptp

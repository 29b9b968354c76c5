// PTP message layouts: byte-exact golden packets written out field by field
// from IEEE 1588-2008 clause 13 (see the layout comment in
// src/clock/ptp/message.hpp), parsed and rebuilt; and every way a packet can
// be malformed is refused.
#include <gtest/gtest.h>

#include <vector>

#include "clock/ptp/message.hpp"

namespace chorus::clock::ptp {
namespace {

const ClockIdentity kId{0x00, 0x11, 0x22, 0xFF, 0xFE, 0x33, 0x44, 0x55};
const ClockIdentity kOther{0xB6, 0x09, 0x97, 0xFF, 0xFE, 0xD4, 0xA5, 0xFD};

// Sync, two-step, domain 0, correction 1 ns, seq 0x1234, logSyncInterval -4,
// originTimestamp 0x12345678 s + 500000000 ns.
const std::vector<uint8_t> kSync = {
    0x00,                                            // transportSpecific 0 | messageType 0 (Sync)
    0x02,                                            // minorVersion 0 | versionPTP 2
    0x00, 0x2C,                                      // messageLength 44
    0x00,                                            // domainNumber
    0x00,                                            // reserved
    0x02, 0x00,                                      // flagField: TWO_STEP
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,  // correctionField: 1 ns << 16
    0x00, 0x00, 0x00, 0x00,                          // reserved
    0x00, 0x11, 0x22, 0xFF, 0xFE, 0x33, 0x44, 0x55,  // sourcePortIdentity.clockIdentity
    0x00, 0x01,                                      // sourcePortIdentity.portNumber
    0x12, 0x34,                                      // sequenceId
    0x00,                                            // controlField: Sync
    0xFC,                                            // logMessageInterval -4
    0x00, 0x00, 0x12, 0x34, 0x56, 0x78,              // originTimestamp.seconds (48 bits)
    0x1D, 0xCD, 0x65, 0x00,                          // originTimestamp.nanoseconds 500000000
};

// Delay_Resp, domain 3, seq 7, logMinDelayReqInterval 0, receiveTimestamp
// 1 s + 2 ns, requestingPortIdentity kOther-1.
const std::vector<uint8_t> kDelayResp = {
    0x09, 0x02, 0x00, 0x36,                          // Delay_Resp, v2, length 54
    0x03, 0x00, 0x00, 0x00,                          // domain 3, reserved, flags 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // correctionField
    0x00, 0x00, 0x00, 0x00,                          // reserved
    0x00, 0x11, 0x22, 0xFF, 0xFE, 0x33, 0x44, 0x55, 0x00, 0x01,  // sourcePortIdentity
    0x00, 0x07,                                      // sequenceId 7
    0x03,                                            // controlField: Delay_Resp
    0x00,                                            // logMessageInterval 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01,              // receiveTimestamp.seconds 1
    0x00, 0x00, 0x00, 0x02,                          // receiveTimestamp.nanoseconds 2
    0xB6, 0x09, 0x97, 0xFF, 0xFE, 0xD4, 0xA5, 0xFD, 0x00, 0x01,  // requestingPortIdentity
};

// Announce: priority1 127, class 248, accuracy 0xFE, variance 0xFFFF,
// priority2 128, GM kId, stepsRemoved 0, timeSource INTERNAL_OSCILLATOR,
// currentUtcOffset 37, logAnnounceInterval 1, seq 0x0102.
const std::vector<uint8_t> kAnnounce = {
    0x0B, 0x02, 0x00, 0x40,                          // Announce, v2, length 64
    0x00, 0x00, 0x00, 0x00,                          // domain 0, reserved, flags 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // correctionField
    0x00, 0x00, 0x00, 0x00,                          // reserved
    0x00, 0x11, 0x22, 0xFF, 0xFE, 0x33, 0x44, 0x55, 0x00, 0x01,  // sourcePortIdentity
    0x01, 0x02,                                      // sequenceId
    0x05,                                            // controlField: other
    0x01,                                            // logMessageInterval 1
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // originTimestamp 0
    0x00, 0x25,                                      // currentUtcOffset 37
    0x00,                                            // reserved
    0x7F,                                            // grandmasterPriority1 127
    0xF8, 0xFE, 0xFF, 0xFF,                          // grandmasterClockQuality
    0x80,                                            // grandmasterPriority2 128
    0x00, 0x11, 0x22, 0xFF, 0xFE, 0x33, 0x44, 0x55,  // grandmasterIdentity
    0x00, 0x00,                                      // stepsRemoved
    0xA0,                                            // timeSource INTERNAL_OSCILLATOR
};

// Management GET CURRENT_DATA_SET to all clocks, as `pmc -b 0` sends it.
const std::vector<uint8_t> kMgmtGet = {
    0x0D, 0x02, 0x00, 0x36,                          // Management, v2, length 54
    0x00, 0x00, 0x00, 0x00,                          // domain, reserved, flags
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // correctionField
    0x00, 0x00, 0x00, 0x00,                          // reserved
    0xB6, 0x09, 0x97, 0xFF, 0xFE, 0xD4, 0xA5, 0xFD, 0x00, 0x02,  // sourcePortIdentity
    0x00, 0x05,                                      // sequenceId 5
    0x04,                                            // controlField: Management
    0x7F,                                            // logMessageInterval: unused
    0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,  // targetPortIdentity: all
    0x00, 0x00,                                      // startingBoundaryHops, boundaryHops
    0x00,                                            // actionField GET
    0x00,                                            // reserved
    0x00, 0x01,                                      // tlvType MANAGEMENT
    0x00, 0x02,                                      // lengthField 2
    0x20, 0x01,                                      // managementId CURRENT_DATA_SET
};

Header makeHeader(MessageType t, ClockIdentity id, uint16_t port, uint16_t seq, int8_t log_interval) {
  Header h;
  h.type = t;
  h.source = {id, port};
  h.sequence_id = seq;
  h.log_message_interval = log_interval;
  return h;
}

TEST(PtpMessage, SyncGoldenBuildAndParse) {
  Header h = makeHeader(MessageType::Sync, kId, 1, 0x1234, -4);
  h.flags = kFlagTwoStep;
  h.correction = int64_t{1} << 16;
  auto built = buildMessage({h, SyncBody{{0x12345678, 500'000'000}}});
  ASSERT_TRUE(built.isOk()) << built.status().message();
  EXPECT_EQ(*built, kSync);

  auto m = parseMessage(kSync);
  ASSERT_TRUE(m.isOk()) << m.status().message();
  EXPECT_EQ(m->header.type, MessageType::Sync);
  EXPECT_EQ(m->header.length, 44);
  EXPECT_EQ(m->header.flags, kFlagTwoStep);
  EXPECT_EQ(m->header.correction, 65536);
  EXPECT_EQ(m->header.source.clock, kId);
  EXPECT_EQ(m->header.source.port, 1);
  EXPECT_EQ(m->header.sequence_id, 0x1234);
  EXPECT_EQ(m->header.control, 0);
  EXPECT_EQ(m->header.log_message_interval, -4);
  const auto& s = std::get<SyncBody>(m->body);
  EXPECT_EQ(s.origin.seconds, 0x12345678u);
  EXPECT_EQ(s.origin.nanoseconds, 500'000'000u);
}

TEST(PtpMessage, DelayRespGoldenBuildAndParse) {
  Header h = makeHeader(MessageType::DelayResp, kId, 1, 7, 0);
  h.domain = 3;
  auto built = buildMessage({h, DelayRespBody{{1, 2}, {kOther, 1}}});
  ASSERT_TRUE(built.isOk());
  EXPECT_EQ(*built, kDelayResp);
  auto m = parseMessage(kDelayResp);
  ASSERT_TRUE(m.isOk());
  EXPECT_EQ(m->header.domain, 3);
  EXPECT_EQ(m->header.control, 3);
  const auto& r = std::get<DelayRespBody>(m->body);
  EXPECT_EQ(timestampToNs(r.receive), 1'000'000'002);
  EXPECT_EQ(r.requesting.clock, kOther);
  EXPECT_EQ(r.requesting.port, 1);
}

TEST(PtpMessage, AnnounceGoldenBuildAndParse) {
  AnnounceBody a;
  a.current_utc_offset = 37;
  a.gm_priority1 = 127;
  a.gm_quality = {248, 0xFE, 0xFFFF};
  a.gm_priority2 = 128;
  a.gm_identity = kId;
  auto built = buildMessage({makeHeader(MessageType::Announce, kId, 1, 0x0102, 1), a});
  ASSERT_TRUE(built.isOk());
  EXPECT_EQ(*built, kAnnounce);
  auto m = parseMessage(kAnnounce);
  ASSERT_TRUE(m.isOk());
  const auto& p = std::get<AnnounceBody>(m->body);
  EXPECT_EQ(p.current_utc_offset, 37);
  EXPECT_EQ(p.gm_priority1, 127);
  EXPECT_EQ(p.gm_quality, (ClockQuality{248, 0xFE, 0xFFFF}));
  EXPECT_EQ(p.gm_identity, kId);
  EXPECT_EQ(p.steps_removed, 0);
  EXPECT_EQ(p.time_source, 0xA0);
}

TEST(PtpMessage, ManagementGetGoldenBuildAndParse) {
  ManagementBody b;
  b.target = {ClockIdentity{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, 0xFFFF};
  b.management_id = kMgmtCurrentDataSet;
  auto built = buildMessage({makeHeader(MessageType::Management, kOther, 2, 5, kLogIntervalUnused), b});
  ASSERT_TRUE(built.isOk());
  EXPECT_EQ(*built, kMgmtGet);
  auto m = parseMessage(kMgmtGet);
  ASSERT_TRUE(m.isOk()) << m.status().message();
  const auto& p = std::get<ManagementBody>(m->body);
  EXPECT_EQ(p.action, ManagementAction::Get);
  EXPECT_EQ(p.tlv_type, kTlvManagement);
  EXPECT_EQ(p.management_id, kMgmtCurrentDataSet);
  EXPECT_TRUE(p.data.empty());
}

TEST(PtpMessage, DataSetEncodingsHaveTheSpecSizes) {
  EXPECT_EQ(encodeDefaultDataSet({}).size(), 20u);
  EXPECT_EQ(encodeCurrentDataSet({}).size(), 18u);
  EXPECT_EQ(encodeParentDataSet({}).size(), 32u);
  EXPECT_EQ(encodePortDataSet({}).size(), 26u);
  // CURRENT_DATA_SET: stepsRemoved 1, offsetFromMaster -1 ns (two's complement, scaled).
  auto c = encodeCurrentDataSet({1, -65536, 0});
  EXPECT_EQ(c[0], 0x00);
  EXPECT_EQ(c[1], 0x01);
  EXPECT_EQ(c[2], 0xFF);
  EXPECT_EQ(c[7], 0xFF);
  EXPECT_EQ(c[8], 0x00);
  EXPECT_EQ(c[9], 0x00);
}

TEST(PtpMessage, EveryTruncationIsRefused) {
  for (const auto* golden : {&kSync, &kDelayResp, &kAnnounce, &kMgmtGet}) {
    for (size_t n = 0; n < golden->size(); ++n) {
      std::span<const uint8_t> prefix(golden->data(), n);
      EXPECT_FALSE(parseMessage(prefix).isOk()) << "prefix of " << n << " bytes of a " << golden->size()
                                                << "-byte message parsed";
    }
  }
}

TEST(PtpMessage, TrailingPaddingIsIgnored) {
  std::vector<uint8_t> padded = kSync;
  padded.resize(64, 0);  // a short Ethernet frame's padding
  auto m = parseMessage(padded);
  ASSERT_TRUE(m.isOk());
  EXPECT_EQ(m->header.length, 44);
}

TEST(PtpMessage, MalformedFieldsAreRefused) {
  auto bad = kSync;
  bad[1] = 0x01;  // PTPv1
  EXPECT_FALSE(parseMessage(bad).isOk());
  bad = kSync;
  bad[0] = 0x04;  // messageType 4 is reserved
  EXPECT_FALSE(parseMessage(bad).isOk());
  bad = kSync;
  bad[3] = 0x20;  // messageLength 32 < header
  EXPECT_FALSE(parseMessage(bad).isOk());
  bad = kAnnounce;
  bad[3] = 0x2C;  // an Announce claiming 44 bytes
  EXPECT_FALSE(parseMessage(bad).isOk());
  bad = kMgmtGet;
  bad[51] = 0x04;  // TLV lengthField 4 runs past messageLength
  EXPECT_FALSE(parseMessage(bad).isOk());
  bad = kMgmtGet;
  bad[46] = 0x09;  // actionField 9
  EXPECT_FALSE(parseMessage(bad).isOk());
}

TEST(PtpMessage, PdelayIsRecognisedButIgnored) {
  std::vector<uint8_t> p(54, 0);
  p[0] = 0x02;  // Pdelay_Req
  p[1] = 0x02;
  p[3] = 54;
  auto m = parseMessage(p);
  ASSERT_TRUE(m.isOk());
  EXPECT_TRUE(std::holds_alternative<IgnoredBody>(m->body));
}

TEST(PtpMessage, BuildRefusesMismatchedHeaderType) {
  auto r = buildMessage({makeHeader(MessageType::FollowUp, kId, 1, 0, 0), SyncBody{}});
  EXPECT_FALSE(r.isOk());
}

TEST(PtpMessage, TimestampConversions) {
  EXPECT_EQ(timestampToNs(timestampFromNs(1'795'965'578'716'979'500)), 1'795'965'578'716'979'500);
  EXPECT_EQ(timestampFromNs(-5), Timestamp{});
  EXPECT_EQ(toString(kOther), "b60997.fffe.d4a5fd");
  EXPECT_EQ(toString(PortIdentity{kOther, 1}), "b60997.fffe.d4a5fd-1");
}

}  // namespace
}  // namespace chorus::clock::ptp

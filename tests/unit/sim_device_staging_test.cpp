// The staging term of collectives on device buffers (sim/device_staging.hpp):
// its bounds for every mode, and its calibration's parser.
#include "sim/device_staging.hpp"

#include <gtest/gtest.h>

namespace chorus::sim {
namespace {

// A host collective of 5 us latency and 2 GB/s.
double hostUs(uint64_t b) { return 5.0 + static_cast<double>(b) / 2e3; }

DeviceStagingCalibration calib(double cmd, double gbps, bool unified) {
  DeviceStagingCalibration c;
  c.command_us = cmd;
  c.copy_gbps = gbps;
  c.unified = unified;
  return c;
}

TEST(SimDeviceStaging, MapOnUnifiedMemoryCostsOneRoundTripWhateverTheSize) {
  const auto c = calib(12.0, 8.0, true);
  for (uint64_t bytes : {uint64_t{0}, uint64_t{8}, uint64_t{1} << 20, uint64_t{64} << 20}) {
    StagedShape s{StagingModel::Map, bytes, bytes};
    const StagedPrice p = priceStaged(s, c, hostUs);
    EXPECT_DOUBLE_EQ(p.host_us, hostUs(bytes));
    EXPECT_DOUBLE_EQ(p.staging_us, 12.0) << bytes;
  }
  // Not unified: the map is a copy each way.
  StagedShape s{StagingModel::Map, 8u << 20, 8u << 20};
  EXPECT_DOUBLE_EQ(priceStaged(s, calib(12.0, 8.0, false), hostUs).staging_us, 12.0 + 2 * (8u << 20) / 8e3);
}

TEST(SimDeviceStaging, WholeAddsBothCopiesAndPipelineStaysWithinItsBounds) {
  const auto c = calib(10.0, 4.0, true);
  for (uint64_t mib : {2, 3, 16, 64}) {
    const uint64_t bytes = mib << 20;
    StagedShape whole{StagingModel::Whole, bytes, bytes};
    const StagedPrice w = priceStaged(whole, c, hostUs);
    const double copies = 2.0 * static_cast<double>(bytes) / 4e3;
    EXPECT_DOUBLE_EQ(w.staging_us, 10.0 + copies);

    StagedShape pipe{StagingModel::Pipeline, bytes, bytes, uint64_t{1} << 20};
    const StagedPrice p = priceStaged(pipe, c, hostUs);
    EXPECT_EQ(p.ran_as, StagingModel::Pipeline);
    EXPECT_EQ(p.chunks, mib);
    double chunked_host = 0;
    for (uint64_t k = 0; k < mib; ++k) chunked_host += hostUs(uint64_t{1} << 20);
    // Never faster than its slower side (the chunks' host parts, or all the
    // copies), never slower than doing both one after the other plus a
    // chunk's copies at each end.
    EXPECT_GE(p.total_us, 10.0 + std::max(chunked_host, copies) - 1e-9);
    EXPECT_LE(p.total_us, 10.0 + chunked_host + copies + 2.0 * (1 << 20) / 4e3 + 1e-9);
    EXPECT_GE(p.staging_us, 0.0);
  }
}

TEST(SimDeviceStaging, PipelineFallsBackToWholeAsTheStreamDoes) {
  const auto c = calib(10.0, 4.0, true);
  StagedShape one_chunk{StagingModel::Pipeline, 1u << 20, 1u << 20, 1u << 20};
  EXPECT_EQ(priceStaged(one_chunk, c, hostUs).ran_as, StagingModel::Whole);
  StagedShape gather{StagingModel::Pipeline, 1u << 20, 4u << 20, 1u << 20};
  gather.elementwise = false;
  const StagedPrice g = priceStaged(gather, c, hostUs);
  EXPECT_EQ(g.ran_as, StagingModel::Whole);
  EXPECT_DOUBLE_EQ(g.staging_us, 10.0 + (5.0 * (1 << 20)) / 4e3);
}

TEST(SimDeviceStaging, MonotoneInBytesAndRoundTrip) {
  for (StagingModel m : {StagingModel::Map, StagingModel::Whole, StagingModel::Pipeline}) {
    double prev = -1;
    for (uint64_t bytes = 8; bytes <= (uint64_t{64} << 20); bytes *= 4) {
      StagedShape s{m, bytes, bytes};
      const double t = priceStaged(s, calib(10.0, 4.0, true), hostUs).total_us;
      EXPECT_GE(t, prev) << stagingModelName(m) << " " << bytes;
      prev = t;
      EXPECT_LT(t, priceStaged(s, calib(20.0, 4.0, true), hostUs).total_us);
    }
  }
}

TEST(SimDeviceStaging, CalibrationParserChecksEveryField) {
  auto ok = parseDeviceStagingCalibration(R"({"command_us": 11.5, "copy_gbps": 6.25, "unified": false})");
  ASSERT_TRUE(ok.isOk()) << ok.status().message();
  EXPECT_DOUBLE_EQ(ok->command_us, 11.5);
  EXPECT_DOUBLE_EQ(ok->copy_gbps, 6.25);
  EXPECT_FALSE(ok->unified);
  EXPECT_TRUE(parseDeviceStagingCalibration(R"({"command_us": 1, "copy_gbps": 1})").value().unified);
  for (const char* bad : {"", "[]", "{", R"({"copy_gbps": 1})", R"({"command_us": 1})",
                          R"({"command_us": "1", "copy_gbps": 1})", R"({"command_us": -1, "copy_gbps": 1})",
                          R"({"command_us": 1, "copy_gbps": 0})", R"({"command_us": 1e300, "copy_gbps": 1})",
                          R"({"command_us": 1, "copy_gbps": 1e9})", R"({"command_us": 1, "copy_gbps": 1, "unified": 1})"})
    EXPECT_FALSE(parseDeviceStagingCalibration(bad).isOk()) << bad;
}

}  // namespace
}  // namespace chorus::sim

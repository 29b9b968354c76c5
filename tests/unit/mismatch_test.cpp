// Ranks that call different collectives, counts, dtypes, ops or roots get
// chorusMismatch naming the ranks and fields — never a hang or corruption.
#include <gtest/gtest.h>

#include <chrono>

#include "support/rank_threads.hpp"

namespace chorus::testing {
namespace {

// CHORUS_CHECK=1.
Config checked() {
  Config cfg;
  cfg.check = true;
  return cfg;
}

TEST(Mismatch, CountMismatchWithChecksNamesRankAndField) {
  const int n = 4;
  auto msgs = runRanks(n, checked(), [&](int r, chorusComm_t comm) -> std::string {
    std::vector<float> x(4096, 1.0f);
    // A matching call first, so the mismatch is not the always-checked first one.
    if (chorusAllReduce(x.data(), x.data(), 16, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess)
      return "first call failed";
    const size_t count = r == 2 ? 2048 : 1024;
    chorusResult_t res = chorusAllReduce(x.data(), x.data(), count, chorusFloat32, chorusSum, comm, nullptr);
    if (res != chorusMismatch) return "rank " + std::to_string(r) + " got " + std::to_string(res);
    std::string m = chorusGetLastError(comm);
    if (m.find("rank 2 called allreduce #1 count=2048") == std::string::npos || m.find("differs in count") == std::string::npos ||
        m.find("rank 0 called allreduce #1 count=1024") == std::string::npos)
      return "message lacks the facts: " + m;
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

TEST(Mismatch, FirstCallIsAlwaysChecked) {
  const int n = 3;
  auto msgs = runRanks(n, [&](int r, chorusComm_t comm) -> std::string {
    std::vector<float> x(64, 1.0f);
    chorusResult_t res = r == 1 ? chorusBroadcast(x.data(), x.data(), 64, chorusFloat32, 0, comm, nullptr)
                                : chorusAllReduce(x.data(), x.data(), 64, chorusFloat32, chorusSum, comm, nullptr);
    if (res != chorusMismatch) return "rank " + std::to_string(r) + " got " + std::to_string(res);
    std::string m = chorusGetLastError(comm);
    if (m.find("rank 1 called broadcast #0") == std::string::npos || m.find("collective") == std::string::npos)
      return "message lacks the facts: " + m;
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

TEST(Mismatch, DtypeOpAndRootDifferences) {
  auto msgs = runRanks(2, checked(), [&](int r, chorusComm_t comm) -> std::string {
    std::vector<double> x(64, 1.0);
    std::string out;
    chorusResult_t a = chorusAllReduce(x.data(), x.data(), 8, r ? chorusFloat64 : chorusInt64, chorusSum, comm, nullptr);
    if (a != chorusMismatch || std::string(chorusGetLastError(comm)).find("dtype") == std::string::npos)
      out += "dtype not reported; ";
    return out;
  });
  EXPECT_EQ(failures(msgs), "");
}

// Ranks that disagree on a call's compression (one bf16, one fp8 or none)
// get chorusMismatch naming it, checked and on the always-checked first
// call; never a message-length error from the wire formats' sizes.
TEST(Mismatch, CompressionDifferencesAreNamed) {
  for (bool check : {true, false}) {
    SCOPED_TRACE(check ? "CHORUS_CHECK" : "first call");
    Config cfg;
    cfg.check = check;
    auto msgs = runRanks(2, cfg, [&](int r, chorusComm_t comm) -> std::string {
      std::vector<float> x(4096, 1.0f);
      if (check && chorusAllReduce(x.data(), x.data(), 16, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess)
        return "first call failed";
      chorusCallOptions_t o = CHORUS_CALL_OPTIONS_INITIALIZER;
      o.compress = r == 0 ? CHORUS_COMPRESS_BF16 : CHORUS_COMPRESS_FP8;
      chorusResult_t res = chorusAllReduceEx(x.data(), x.data(), 4096, chorusFloat32, chorusSum, comm, nullptr, &o);
      if (res != chorusMismatch) return "rank " + std::to_string(r) + " got " + std::to_string(res);
      std::string m = chorusGetLastError(comm);
      if (m.find("compression (") == std::string::npos || m.find("compress=bf16") == std::string::npos ||
          m.find("compress=fp8") == std::string::npos)
        return "message lacks the facts: " + m;
      return "";
    });
    EXPECT_EQ(failures(msgs), "");
  }
}

// Without CHORUS_CHECK, a later count mismatch is still caught by the
// transports' length check on the receiving side; every rank returns an
// error within the timeout instead of hanging or overrunning a buffer.
TEST(Mismatch, UncheckedCountMismatchFailsNotHangs) {
  Config cfg;
  cfg.timeout = std::chrono::milliseconds(3000);
  const int n = 3;
  auto msgs = runRanks(n, cfg, [&](int r, chorusComm_t comm) -> std::string {
    std::vector<float> x(1 << 20, 1.0f);
    if (chorusAllReduce(x.data(), x.data(), 8, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess) return std::string("first failed: ") + chorusGetLastError(comm);
    const size_t count = r == 1 ? 300000 : 200000;
    chorusResult_t res = chorusAllReduce(x.data(), x.data(), count, chorusFloat32, chorusSum, comm, nullptr);
    if (res == chorusSuccess) return "rank " + std::to_string(r) + ": mismatch went unnoticed";
    if (res != chorusMismatch && res != chorusTimeout && res != chorusRemoteError)
      return "rank " + std::to_string(r) + ": unexpected " + std::to_string(res) + ": " + chorusGetLastError(comm);
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

}  // namespace
}  // namespace chorus::testing

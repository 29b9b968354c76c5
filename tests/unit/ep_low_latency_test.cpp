// The low-latency mode of expert parallelism (chorusEpLowLatencyDispatch /
// Combine, prim/ep_ll_*.cpp): the same rows, weights and combined output as
// the normal layout + dispatch + combine (each expert's rows at its fixed
// offset, the padding untouched, the combine bitwise equal), and an overflow
// of the fixed buffers or any bad argument a clear error on every rank with
// nothing written.
#include <chorus/chorus.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/dtype.hpp"
#include "support/rank_threads.hpp"

namespace {

using chorus::testing::failures;
using chorus::testing::runRanks;

struct Case {
  int n, experts, topk;
  size_t hidden;
  chorusDataType_t dtype;
  int compress;
  int max_tokens;
};

chorusEpHandle_t make(const Case& k, chorusComm_t c, int max_tokens, std::string* err) {
  chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
  cfg.numExperts = k.experts, cfg.topk = k.topk, cfg.hidden = k.hidden, cfg.datatype = k.dtype;
  cfg.indexType = chorusInt32, cfg.dispatchCompress = k.compress, cfg.lowLatencyMaxTokens = max_tokens;
  chorusEpHandle_t ep = nullptr;
  if (chorusEpCreate(&ep, &cfg, c) != chorusSuccess) *err = fmt::format("create: {}", chorusGetLastError(c));
  return ep;
}

// One rank's step both ways; "" when they agree.
std::string compare(const Case& k, uint32_t seed, int r, chorusComm_t c) {
  std::string err;
  chorusEpHandle_t ep = make(k, c, k.max_tokens, &err);
  if (ep == nullptr) return err;
  std::mt19937 g(seed * 131 + static_cast<uint32_t>(r));
  const size_t tokens = g() % (static_cast<size_t>(k.max_tokens) + 1);  // 0..M, each rank its own
  const auto K = static_cast<size_t>(k.topk);
  const size_t elem = k.dtype == chorusBfloat16 ? 2 : 4, row = k.hidden * elem;
  std::vector<int32_t> ids(tokens * K);
  for (size_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(k.experts));
    for (int e = 0; e < k.experts; ++e) all[static_cast<size_t>(e)] = e;
    std::shuffle(all.begin(), all.end(), g);
    std::copy_n(all.begin(), K, &ids[t * K]);
  }
  std::vector<uint8_t> x(tokens * row);
  std::vector<float> w(tokens * K);
  std::uniform_real_distribution<float> u(-2, 2);
  for (size_t i = 0; i < tokens * k.hidden; ++i) chorus::kernels::storeFromDouble(&x[i * elem], k.dtype, u(g));
  for (float& v : w) v = u(g);

  // The normal path.
  size_t num_recv = 0;
  int hosts = 0, L = 0;
  chorusEpGetInfo(ep, &hosts, &L);
  std::vector<size_t> per_expert(static_cast<size_t>(L));
  std::string out;
  auto fail = [&](const char* what) { return fmt::format("rank {} {}: {}", r, what, chorusGetLastError(c)); };
  if (chorusEpLayout(ep, ids.data(), tokens, nullptr, nullptr, nullptr, per_expert.data(), &num_recv, c, nullptr))
    return fail("layout");
  std::vector<uint8_t> rx(num_recv * row + 1);
  std::vector<float> rw(num_recv + 1);
  if (chorusEpDispatch(ep, x.data(), w.data(), rx.data(), rw.data(), num_recv, c, nullptr)) return fail("dispatch");
  std::vector<uint8_t> eo(rx.size());  // the experts: row i scaled by (1 + i % 3)
  for (size_t i = 0; i < num_recv * k.hidden; ++i)
    chorus::kernels::storeFromDouble(&eo[i * elem], k.dtype,
                                     chorus::kernels::loadAsDouble(&rx[i * elem], k.dtype) * (1 + (i / k.hidden) % 3));
  std::vector<uint8_t> o1(tokens * row + 1);
  if (chorusEpCombine(ep, eo.data(), rw.data(), o1.data(), c, nullptr)) return fail("combine");

  // The low-latency path, buffers filled with a sentinel.
  const size_t cap = static_cast<size_t>(k.n) * static_cast<size_t>(k.max_tokens);
  std::vector<uint8_t> lx(static_cast<size_t>(L) * cap * row, 0xa5);
  std::vector<float> lw(static_cast<size_t>(L) * cap, -7.0f);
  std::vector<size_t> count(static_cast<size_t>(L), 99);
  if (chorusEpLowLatencyDispatch(ep, ids.data(), tokens, x.data(), w.data(), lx.data(), lw.data(), count.data(), c,
                                 nullptr))
    return fail("low-latency dispatch");
  std::vector<uint8_t> leo(lx.size(), 0);
  size_t base = 0;
  for (size_t e = 0; e < static_cast<size_t>(L); ++e) {
    if (count[e] != per_expert[e]) return fmt::format("rank {} expert {}: {} rows, normal {}", r, e, count[e], per_expert[e]);
    for (size_t i = 0; i < count[e]; ++i) {
      const size_t slot = e * cap + i, ref = base + i;
      if (std::memcmp(&lx[slot * row], &rx[ref * row], row) != 0)
        return fmt::format("rank {} expert {} row {} differs from the normal dispatch's row {}", r, e, i, ref);
      if (std::memcmp(&lw[slot], &rw[ref], sizeof(float)) != 0)
        return fmt::format("rank {} expert {} row {}: weight {} vs {}", r, e, i, lw[slot], rw[ref]);
      std::memcpy(&leo[slot * row], &eo[ref * row], row);
    }
    for (size_t i = count[e]; i < cap; ++i) {
      for (size_t b = 0; b < row; ++b)
        if (lx[(e * cap + i) * row + b] != 0xa5) return fmt::format("rank {} expert {}: padding row {} written", r, e, i);
      if (lw[e * cap + i] != -7.0f) return fmt::format("rank {} expert {}: padding weight {} written", r, e, i);
    }
    base += count[e];
  }
  std::vector<uint8_t> o2(o1.size(), 0x5a);
  o2.back() = o1.back();
  if (chorusEpLowLatencyCombine(ep, leo.data(), lw.data(), o2.data(), c, nullptr)) return fail("low-latency combine");
  if (o1 != o2) return fmt::format("rank {}: the low-latency combine differs from the normal combine", r);
  chorusEpDestroy(ep);
  return "";
}

class EpLowLatency : public ::testing::TestWithParam<Case> {};
TEST_P(EpLowLatency, SameRowsWeightsAndBitsAsTheNormalPath) {
  const Case k = GetParam();
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    auto msgs = runRanks(k.n, [&](int r, chorusComm_t c) { return compare(k, seed, r, c); });
    EXPECT_EQ(failures(msgs), "") << "seed " << seed;
  }
}
INSTANTIATE_TEST_SUITE_P(
    Cases, EpLowLatency,
    ::testing::Values(Case{2, 4, 2, 8, chorusFloat32, CHORUS_COMPRESS_OFF, 5},
                      Case{3, 12, 4, 7, chorusBfloat16, CHORUS_COMPRESS_OFF, 9},
                      Case{4, 8, 3, 33, chorusFloat32, CHORUS_COMPRESS_OFF, 6},
                      Case{4, 16, 5, 64, chorusBfloat16, CHORUS_COMPRESS_FP8, 4},
                      Case{3, 6, 6, 5, chorusFloat32, CHORUS_COMPRESS_BF16, 3}));

// A rank with more tokens than the fixed buffers hold fails every rank, and no
// rank's recvX, recvWeights or recvCount is written.
TEST(EpLowLatencyFaults, OverflowIsAClearErrorOnEveryRank) {
  const Case k{3, 6, 2, 4, chorusFloat32, CHORUS_COMPRESS_OFF, 4};
  auto msgs = runRanks(3, [&](int r, chorusComm_t c) -> std::string {
    std::string err;
    chorusEpHandle_t ep = make(k, c, 4, &err);
    if (ep == nullptr) return err;
    const size_t tokens = r == 1 ? 5 : 2;
    std::vector<int32_t> ids(tokens * 2);
    for (size_t t = 0; t < tokens; ++t) ids[t * 2] = static_cast<int32_t>(t % 6), ids[t * 2 + 1] = static_cast<int32_t>((t + 1) % 6);
    std::vector<float> x(tokens * 4, 1.0f);
    std::vector<float> rx(2 * 12 * 4, -3.0f), rw(2 * 12, -3.0f);
    std::vector<size_t> count(2, 77);
    const chorusResult_t got =
        chorusEpLowLatencyDispatch(ep, ids.data(), tokens, x.data(), nullptr, rx.data(), rw.data(), count.data(), c, nullptr);
    const std::string msg = chorusGetLastError(c);
    chorusEpDestroy(ep);
    if (got != chorusInvalidArgument) return fmt::format("rank {}: result {} ({})", r, static_cast<int>(got), msg);
    const std::string want = r == 1 ? "numTokens=5 exceeds config.lowLatencyMaxTokens=4" : "rank 1 refused its arguments";
    if (msg.find(want) == std::string::npos) return fmt::format("rank {}: '{}' lacks '{}'", r, msg, want);
    for (float v : rx)
      if (v != -3.0f) return fmt::format("rank {}: recvX written", r);
    for (float v : rw)
      if (v != -3.0f) return fmt::format("rank {}: recvWeights written", r);
    if (count[0] != 77 || count[1] != 77) return fmt::format("rank {}: recvCount written", r);
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

// Bad ids on one rank, a combine without a low-latency dispatch, the mode
// off, and a node limit with the mode: each refused, on every rank alike.
TEST(EpLowLatencyFaults, BadUseIsRefusedOnEveryRank) {
  const Case k{2, 4, 2, 4, chorusFloat32, CHORUS_COMPRESS_OFF, 4};
  auto msgs = runRanks(2, [&](int r, chorusComm_t c) -> std::string {
    std::string err;
    chorusEpHandle_t ep = make(k, c, 4, &err);
    if (ep == nullptr) return err;
    std::vector<float> rx(2 * 8 * 4), out(4 * 4), x(4 * 4);
    std::vector<size_t> count(2);
    std::string bad;
    if (chorusEpLowLatencyCombine(ep, rx.data(), nullptr, out.data(), c, nullptr) != chorusInvalidUsage)
      bad += fmt::format("rank {}: combine without a dispatch not refused; ", r);
    std::vector<int32_t> ids = {0, 1, 2, r == 0 ? 9 : 3};
    if (chorusEpLowLatencyDispatch(ep, ids.data(), 2, x.data(), nullptr, rx.data(), nullptr, count.data(), c, nullptr) !=
        chorusInvalidArgument)
      bad += fmt::format("rank {}: bad ids not refused; ", r);
    const std::string want = r == 0 ? "topkIdx[3] (token 1, choice 1) = 9 is not an expert id" : "rank 0 refused";
    if (std::string(chorusGetLastError(c)).find(want) == std::string::npos)
      bad += fmt::format("rank {}: '{}' lacks '{}'; ", r, chorusGetLastError(c), want);
    chorusEpDestroy(ep);
    chorusEpHandle_t off = make(k, c, 0, &err);
    if (off == nullptr) return err;
    if (chorusEpLowLatencyDispatch(off, ids.data(), 0, x.data(), nullptr, rx.data(), nullptr, count.data(), c,
                                   nullptr) != chorusInvalidUsage)
      bad += fmt::format("rank {}: mode off not refused; ", r);
    chorusEpDestroy(off);
    chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
    cfg.numExperts = 4, cfg.topk = 2, cfg.hidden = 4, cfg.datatype = chorusFloat32, cfg.maxHostsPerToken = 1;
    cfg.lowLatencyMaxTokens = 8;
    chorusEpHandle_t nl = nullptr;
    if (chorusEpCreate(&nl, &cfg, c) != chorusInvalidArgument ||
        std::string(chorusGetLastError(c)).find("config.lowLatencyMaxTokens=8 with maxHostsPerToken=1") == std::string::npos)
      bad += fmt::format("rank {}: node limit with low latency: '{}'; ", r, chorusGetLastError(c));
    return bad;
  });
  EXPECT_EQ(failures(msgs), "");
}

}  // namespace

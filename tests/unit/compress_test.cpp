// Compressed collectives through the C API (issue 19): ranks as threads over
// shared memory and TCP, bf16 and fp8 at several block sizes, in and out of
// place.  Every output element is checked against the error bound that
// docs/algorithms.md ("Compressed reductions") derives from the plan's
// quantization count; all-equal data must come back exact; every rank must
// hold the same bits; and unsupported requests are refused, naming the
// argument and the supported values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <random>
#include <string_view>
#include <tuple>

#include <unistd.h>

#include "api/config.hpp"
#include "kernels/quantize.hpp"
#include "support/rank_threads.hpp"
#include "trace/record.hpp"

namespace chorus::testing {
namespace {

using kernels::WireFormat;

enum class Data { Random, Outliers, AllEqual };
const char* dataName(Data d) { return d == Data::Random ? "random" : d == Data::Outliers ? "outliers" : "all-equal"; }

// Rank r's input of `count` elements.  All-equal: (r + 1) / 4, which bf16
// and fp8 carry exactly, as they carry the sums (multiples of 1/4 up to 9).
std::vector<float> inputOf(Data d, int r, size_t count) {
  std::vector<float> x(count);
  std::mt19937 gen(1234u + 77u * static_cast<unsigned>(r) + static_cast<unsigned>(count));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> small(-1e-3f, 1e-3f);
  for (size_t i = 0; i < count; ++i) {
    switch (d) {
      case Data::Random: x[i] = normal(gen); break;
      case Data::Outliers: x[i] = (i + static_cast<size_t>(r)) % 97 == 0 ? (i % 2 ? 1e6f : -1e6f) : small(gen); break;
      case Data::AllEqual: x[i] = static_cast<float>(r + 1) / 4.0f; break;
    }
  }
  return x;
}

// The per-quantization bound E(x) (kernels/quantize.hpp) with `amax` any
// value >= the amax of x's block.  Which elements share an fp8 block depends
// on how the plan cuts the data into runs; every block holding element i
// lies in [i - block + 1, i + block - 1], so the largest |value| there is >= its
// block's amax, and E grows with amax: a bound independent of the plan.
double perQuant(const WireFormat& f, double x, double amax) {
  return f.kind == WireFormat::Bf16 ? kernels::bf16ErrorBound(static_cast<float>(x))
                                    : kernels::fp8ErrorBound(static_cast<float>(x), static_cast<float>(amax));
}
std::vector<double> windowMax(const WireFormat& f, const std::vector<double>& a) {
  const size_t w = f.kind == WireFormat::Bf16 ? 1 : static_cast<size_t>(f.block);
  // Sliding maximum over [i - w + 1, i + w - 1] (a monotone deque of indices).
  std::vector<double> m(a.size());
  std::deque<size_t> q;
  size_t next = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    for (; next < std::min(a.size(), i + w); ++next) {
      while (!q.empty() && std::abs(a[q.back()]) <= std::abs(a[next])) q.pop_back();
      q.push_back(next);
    }
    while (q.front() + w <= i) q.pop_front();
    m[i] = std::abs(a[q.front()]);
  }
  return m;
}

// The reference and the bound of every output element of a reduction of the
// contributions xs (already cut to the output's elements): k = 2 (allreduce)
// adds the quantization of the fp32 sum, k = 1 (reduce-scatter) does not.
//   |out - S| <= sum_r E(x_r) + gamma_{n-1} sum_r (|x_r| + E(x_r)) [+ E(S')]
struct Expect {
  std::vector<double> ref, bound;
};
Expect reductionBound(const WireFormat& f, const std::vector<std::vector<double>>& xs, bool requantized) {
  const size_t m = xs[0].size();
  const double n = static_cast<double>(xs.size());
  const double gamma = (n - 1) * 0x1p-24 / (1 - (n - 1) * 0x1p-24);
  Expect e{std::vector<double>(m, 0.0), std::vector<double>(m, 0.0)};
  for (const auto& x : xs) {
    const std::vector<double> amax = windowMax(f, x);
    for (size_t i = 0; i < m; ++i) {
      const double q = perQuant(f, x[i], amax[i]);
      e.ref[i] += x[i];
      e.bound[i] += q + gamma * (std::abs(x[i]) + q);
    }
  }
  if (requantized) {
    // S' (the fp32 sum that is quantized again) lies within the bound so far
    // of S: |S'| <= |S| + bound, which bounds both S' and its blocks' amax.
    std::vector<double> hi(m);
    for (size_t i = 0; i < m; ++i) hi[i] = std::abs(e.ref[i]) + e.bound[i];
    const std::vector<double> amax = windowMax(f, hi);
    for (size_t i = 0; i < m; ++i) e.bound[i] += perQuant(f, hi[i], amax[i]);
  }
  return e;
}

enum class Coll { AllReduce, ReduceScatter, AllGather };
const char* collName(Coll c) {
  return c == Coll::AllReduce ? "allreduce" : c == Coll::ReduceScatter ? "reducescatter" : "allgather";
}

struct Case {
  Coll coll;
  size_t count;  // the call's count argument
  Data data;
  bool inplace;
};

chorusCallOptions_t optionsFor(const WireFormat& f) {
  chorusCallOptions_t o = CHORUS_CALL_OPTIONS_INITIALIZER;
  o.compress = f.kind == WireFormat::Bf16 ? CHORUS_COMPRESS_BF16 : CHORUS_COMPRESS_FP8;
  o.fp8Block = f.kind == WireFormat::Bf16 ? -1 : f.block;
  return o;
}

// Worst |error| / bound over a rank's outputs, collected per data kind.
struct Worst {
  double ratio[3] = {0, 0, 0};  // by data kind
  double by[2][3] = {};         // random data: [bf16, fp8][collective]
};

// Runs one case on rank r and checks its output; "" = ok.
std::string runCase(int r, int n, chorusComm_t comm, const WireFormat& f, const Case& c, Worst* worst) {
  const size_t un = static_cast<size_t>(n);
  const size_t in_n = c.coll == Coll::ReduceScatter ? c.count * un : c.count;
  const size_t out_n = c.coll == Coll::AllGather ? c.count * un : c.count;
  std::vector<float> mine = inputOf(c.data, r, in_n);
  // In place: NCCL's conventions (the input is the rank's slot of the output
  // for allgather, the output the rank's slot of the input for reduce-scatter).
  std::vector<float> buf(std::max(in_n, out_n));
  std::vector<float> out_storage(out_n);
  const float* send = mine.data();
  float* recv = out_storage.data();
  if (c.inplace) {
    if (c.coll == Coll::AllGather) {
      if (in_n != 0) std::memcpy(buf.data() + r * c.count, mine.data(), in_n * 4);
      send = buf.data() + r * c.count;
      recv = buf.data();
    } else {
      if (in_n != 0) std::memcpy(buf.data(), mine.data(), in_n * 4);
      send = buf.data();
      recv = c.coll == Coll::ReduceScatter ? buf.data() + r * c.count : buf.data();
    }
  }
  const chorusCallOptions_t opts = optionsFor(f);
  chorusResult_t res = chorusSuccess;
  switch (c.coll) {
    case Coll::AllReduce:
      res = chorusAllReduceEx(send, recv, c.count, chorusFloat32, chorusSum, comm, nullptr, &opts);
      break;
    case Coll::ReduceScatter:
      res = chorusReduceScatterEx(send, recv, c.count, chorusFloat32, chorusSum, comm, nullptr, &opts);
      break;
    case Coll::AllGather: res = chorusAllGatherEx(send, recv, c.count, chorusFloat32, comm, nullptr, &opts); break;
  }
  const std::string what = fmt::format("rank {}: {} {} {} count {}{}", r, kernels::wireFormatName(f), collName(c.coll),
                                       dataName(c.data), c.count, c.inplace ? " in place" : "");
  if (res != chorusSuccess) return fmt::format("{}: failed: {}", what, chorusGetLastError(comm));

  // The contributions to each output element, and the bound.
  Expect e;
  if (c.coll == Coll::AllGather) {
    e.ref.resize(out_n);
    e.bound.resize(out_n);
    for (int j = 0; j < n; ++j) {
      const std::vector<float> xj = inputOf(c.data, j, c.count);
      const std::vector<double> xd(xj.begin(), xj.end());
      const std::vector<double> amax = windowMax(f, xd);
      for (size_t i = 0; i < c.count; ++i) {
        e.ref[j * c.count + i] = xd[i];
        e.bound[j * c.count + i] = perQuant(f, xd[i], amax[i]);
      }
    }
  } else {
    std::vector<std::vector<double>> xs;
    const size_t base = c.coll == Coll::ReduceScatter ? static_cast<size_t>(r) * c.count : 0;
    for (int j = 0; j < n; ++j) {
      const std::vector<float> xj = inputOf(c.data, j, in_n);
      xs.emplace_back(xj.begin() + base, xj.begin() + base + c.count);
    }
    e = reductionBound(f, xs, c.coll == Coll::AllReduce && n > 1);
  }
  if (n == 1) std::fill(e.bound.begin(), e.bound.end(), 0.0);  // a copy
  for (size_t i = 0; i < out_n; ++i) {
    const double got = recv[i], err = std::abs(got - e.ref[i]);
    if (c.data == Data::AllEqual && err != 0)
      return fmt::format("{}: all-equal element {} is {} but should be exactly {}", what, i, got, e.ref[i]);
    if (!(err <= e.bound[i]))
      return fmt::format("{}: element {} is {} but should be {} within {} (error {})", what, i, got, e.ref[i],
                         e.bound[i], err);
    if (e.bound[i] > 0) {
      double& w = worst->ratio[static_cast<int>(c.data)];
      w = std::max(w, err / e.bound[i]);
      if (c.data == Data::Random) {
        double& b = worst->by[f.kind == WireFormat::Bf16 ? 0 : 1][static_cast<int>(c.coll)];
        b = std::max(b, err / e.bound[i]);
      }
    }
  }
  return "";
}

std::vector<Case> casesFor(int n) {
  std::vector<Case> cs;
  for (Coll coll : {Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather})
    for (Data d : {Data::Random, Data::Outliers, Data::AllEqual})
      for (bool inplace : {false, true})
        for (size_t count : {size_t{0}, size_t{1}, size_t{1031}, coll == Coll::AllReduce ? size_t{70001} : size_t{9001}})
          if (count * static_cast<size_t>(n) <= 600000) cs.push_back({coll, count, d, inplace});
  return cs;
}

struct Param {
  int nranks;
  bool tcp;
};
class CompressedCollectives : public ::testing::TestWithParam<Param> {};

TEST_P(CompressedCollectives, ErrorWithinTheDerivedBound) {
  const Param p = GetParam();
  Config cfg;
  cfg.net.transport = p.tcp ? "tcp" : "auto";
  cfg.tune.chunk_bytes = 64 << 10;  // several slices per block: runs cut off the fp8 block grid
  const std::vector<Case> cases = casesFor(p.nranks);
  const WireFormat formats[] = {{WireFormat::Bf16, 128}, {WireFormat::Fp8E4m3, 128}, {WireFormat::Fp8E4m3, 32},
                                {WireFormat::Fp8E4m3, 1000}};
  std::vector<Worst> worst(static_cast<size_t>(p.nranks));
  auto msgs = runRanks(p.nranks, cfg, [&](int r, chorusComm_t comm) -> std::string {
    for (const WireFormat& f : formats)
      for (const Case& c : cases)
        if (std::string err = runCase(r, p.nranks, comm, f, c, &worst[r]); !err.empty()) return err;
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
  double w[3] = {0, 0, 0}, by[2][3] = {};
  for (const Worst& x : worst)
    for (int k = 0; k < 3; ++k) {
      w[k] = std::max(w[k], x.ratio[k]);
      for (int f = 0; f < 2; ++f) by[f][k] = std::max(by[f][k], x.by[f][k]);
    }
  // The measured error as a fraction of the bound (reported, not asserted
  // beyond <= 1: the tightness is the kernels' test's business).
  RecordProperty("worst_random", fmt::format("{:.3f}", w[0]));
  RecordProperty("worst_outliers", fmt::format("{:.3f}", w[1]));
  fprintf(stderr,
          "%d ranks%s: worst error / bound: random %.3f, outliers %.3f; random by collective (allreduce, "
          "reducescatter, allgather): bf16 %.3f %.3f %.3f, fp8 %.3f %.3f %.3f\n",
          p.nranks, p.tcp ? " (tcp)" : "", w[0], w[1], by[0][0], by[0][1], by[0][2], by[1][0], by[1][1], by[1][2]);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CompressedCollectives,
                         ::testing::Values(Param{1, false}, Param{2, false}, Param{3, false}, Param{4, false},
                                           Param{8, false}, Param{2, true}, Param{3, true}, Param{5, true}),
                         [](const auto& info) {
                           return fmt::format("{}{}", info.param.nranks, info.param.tcp ? "_tcp" : "_shm");
                         });

// Every rank holds the same bits (the owner decodes its own quantized sum).
TEST(CompressedCollectives, EveryRankGetsTheSameBits) {
  const int n = 4;
  const size_t count = 10007;
  std::vector<std::vector<float>> outs(n, std::vector<float>(count));
  auto msgs = runRanks(n, Config{}, [&](int r, chorusComm_t comm) -> std::string {
    const std::vector<float> x = inputOf(Data::Random, r, count);
    chorusCallOptions_t o = CHORUS_CALL_OPTIONS_INITIALIZER;
    o.compress = CHORUS_COMPRESS_FP8;
    if (chorusAllReduceEx(x.data(), outs[r].data(), count, chorusFloat32, chorusSum, comm, nullptr, &o) !=
        chorusSuccess)
      return chorusGetLastError(comm);
    return "";
  });
  ASSERT_EQ(failures(msgs), "");
  for (int r = 1; r < n; ++r) EXPECT_EQ(std::memcmp(outs[0].data(), outs[r].data(), count * 4), 0) << "rank " << r;
}

// The communicator's default (Config::compress, i.e. CHORUS_COMPRESS or
// chorusConfig_t.compress) compresses plain fp32 calls, leaves calls it cannot
// compress (int32, max) exact, and a call's CHORUS_COMPRESS_OFF opts out.
TEST(CompressedCollectives, CommunicatorDefaultAppliesWhereItCan) {
  Config cfg;
  cfg.compress.kind = CompressKind::Bf16;
  const int n = 2;
  const size_t count = 4096;
  auto msgs = runRanks(n, cfg, [&](int r, chorusComm_t comm) -> std::string {
    // 1 + 2^-12 is not a bf16 value: compressed, 2 (1 + 2^-12) comes back as 2.
    std::vector<float> x(count, 1.0f + 0x1p-12f), y(count);
    if (chorusAllReduce(x.data(), y.data(), count, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess)
      return chorusGetLastError(comm);
    if (y[0] != 2.0f) return fmt::format("rank {}: the default did not compress: {}", r, y[0]);
    chorusCallOptions_t off = CHORUS_CALL_OPTIONS_INITIALIZER;
    off.compress = CHORUS_COMPRESS_OFF;
    if (chorusAllReduceEx(x.data(), y.data(), count, chorusFloat32, chorusSum, comm, nullptr, &off) != chorusSuccess)
      return chorusGetLastError(comm);
    if (y[0] != 2.0f + 0x1p-11f) return fmt::format("rank {}: CHORUS_COMPRESS_OFF still compressed: {}", r, y[0]);
    if (chorusAllReduce(x.data(), y.data(), count, chorusFloat32, chorusMax, comm, nullptr) != chorusSuccess)
      return chorusGetLastError(comm);
    if (y[0] != 1.0f + 0x1p-12f) return fmt::format("rank {}: max was compressed: {}", r, y[0]);
    std::vector<int32_t> a(count, (1 << 24) + 1), b(count);
    if (chorusAllReduce(a.data(), b.data(), count, chorusInt32, chorusSum, comm, nullptr) != chorusSuccess)
      return chorusGetLastError(comm);
    if (b[0] != 2 * ((1 << 24) + 1)) return fmt::format("rank {}: int32 was not exact: {}", r, b[0]);
    // The prediction describes the call as it runs: compressed for the float
    // sum (chorus-bench's rows carry it), not for int32 or a broadcast.
    char algo[64] = "";
    double us = 0;
    for (auto [coll, dt, want] : {std::tuple{"allreduce", chorusFloat32, true}, std::tuple{"allgather", chorusFloat32, true},
                                  std::tuple{"allreduce", chorusInt32, false}, std::tuple{"broadcast", chorusFloat32, false}}) {
      if (chorusCommPredict(comm, coll, count, dt, 0, algo, sizeof algo, &us) != chorusSuccess)
        return chorusGetLastError(comm);
      if (std::string_view(algo).starts_with("compressed") != want || !(us > 0))
        return fmt::format("rank {}: predict({}, {}) gave {} ({} us)", r, coll, static_cast<int>(dt), algo, us);
    }
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

// Avg and premulsum go through the same plans (the sum, then divided; the
// scaled inputs, then summed).
TEST(CompressedCollectives, AvgAndPreMulSum) {
  const int n = 3;
  const size_t count = 1000;
  auto msgs = runRanks(n, Config{}, [&](int r, chorusComm_t comm) -> std::string {
    std::vector<float> x(count, static_cast<float>(r + 1)), y(count);
    chorusCallOptions_t o = CHORUS_CALL_OPTIONS_INITIALIZER;
    o.compress = CHORUS_COMPRESS_BF16;
    if (chorusAllReduceEx(x.data(), y.data(), count, chorusFloat32, chorusAvg, comm, nullptr, &o) != chorusSuccess)
      return chorusGetLastError(comm);
    if (y[count - 1] != 2.0f) return fmt::format("rank {}: avg gave {}", r, y[count - 1]);
    float scale = 0.5f;
    chorusRedOp_t pm;
    if (chorusRedOpCreatePreMulSum(&pm, &scale, chorusFloat32, chorusScalarHostImmediate, comm) != chorusSuccess)
      return chorusGetLastError(comm);
    if (chorusAllReduceEx(x.data(), y.data(), count, chorusFloat32, pm, comm, nullptr, &o) != chorusSuccess)
      return chorusGetLastError(comm);
    if (y[0] != 3.0f) return fmt::format("rank {}: premulsum gave {}", r, y[0]);
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

// Unsupported requests: an invalid-argument error on every rank, naming the
// argument and what is supported; the communicator stays usable.
TEST(CompressedCollectives, UnsupportedRequestsAreRefusedOnEveryRank) {
  auto msgs = runRanks(2, Config{}, [&](int r, chorusComm_t comm) -> std::string {
    std::vector<float> x(64, 1.0f), y(128);
    std::vector<int32_t> xi(64, 1), yi(128);
    std::vector<double> xd(64, 1.0), yd(128);
    chorusCallOptions_t bf = CHORUS_CALL_OPTIONS_INITIALIZER;
    bf.compress = CHORUS_COMPRESS_BF16;
    chorusCallOptions_t fp = CHORUS_CALL_OPTIONS_INITIALIZER;
    fp.compress = CHORUS_COMPRESS_FP8;
    struct Bad {
      std::function<chorusResult_t()> call;
      std::vector<std::string> needles;
    };
    chorusCallOptions_t small_block = fp, big_block = fp, bad_mode = bf, raw{};
    small_block.fp8Block = 16;
    big_block.fp8Block = 4096;
    bad_mode.compress = 7;
    const std::vector<Bad> bad = {
        {[&] { return chorusAllReduceEx(x.data(), y.data(), 64, chorusFloat32, chorusProd, comm, nullptr, &bf); },
         {"chorusAllReduceEx", "options.compress=CHORUS_COMPRESS_BF16", "op=chorusProd", "chorusSum", "chorusAvg"}},
        {[&] { return chorusAllReduceEx(x.data(), y.data(), 64, chorusFloat32, chorusMax, comm, nullptr, &fp); },
         {"op=chorusMax", "premulsum"}},
        {[&] { return chorusAllReduceEx(xi.data(), yi.data(), 64, chorusInt32, chorusSum, comm, nullptr, &bf); },
         {"datatype=int32", "chorusFloat32"}},
        {[&] { return chorusReduceScatterEx(xi.data(), yi.data(), 32, chorusInt32, chorusSum, comm, nullptr, &fp); },
         {"chorusReduceScatterEx", "datatype=int32"}},
        {[&] { return chorusAllGatherEx(xd.data(), yd.data(), 64, chorusFloat64, comm, nullptr, &bf); },
         {"chorusAllGatherEx", "datatype=float64"}},
        {[&] { return chorusAllReduceEx(x.data(), y.data(), 64, chorusFloat32, chorusSum, comm, nullptr, &small_block); },
         {"options.fp8Block", "32", "1024"}},
        {[&] { return chorusAllReduceEx(x.data(), y.data(), 64, chorusFloat32, chorusSum, comm, nullptr, &big_block); },
         {"options.fp8Block", "4096"}},
        {[&] { return chorusAllReduceEx(x.data(), y.data(), 64, chorusFloat32, chorusSum, comm, nullptr, &bad_mode); },
         {"options.compress=7", "CHORUS_COMPRESS_BF16=1", "CHORUS_COMPRESS_FP8=2"}},
        {[&] { return chorusAllReduceEx(x.data(), y.data(), 64, chorusFloat32, chorusSum, comm, nullptr, &raw); },
         {"CHORUS_CALL_OPTIONS_INITIALIZER"}},
    };
    for (size_t k = 0; k < bad.size(); ++k) {
      const chorusResult_t res = bad[k].call();
      const std::string msg = chorusGetLastError(comm);
      if (res != chorusInvalidArgument) return fmt::format("rank {}: bad call {} returned {} ({})", r, k, int(res), msg);
      for (const std::string& needle : bad[k].needles)
        if (msg.find(needle) == std::string::npos)
          return fmt::format("rank {}: bad call {}: '{}' does not name '{}'", r, k, msg, needle);
    }
    // Still usable, compressed.
    if (chorusAllReduceEx(x.data(), y.data(), 64, chorusFloat32, chorusSum, comm, nullptr, &bf) != chorusSuccess)
      return chorusGetLastError(comm);
    return y[0] == 2.0f ? "" : fmt::format("rank {}: got {}", r, y[0]);
  });
  EXPECT_EQ(failures(msgs), "");
}

TEST(CompressedCollectives, ReproducibleModesRefuseCompression) {
  Config cfg;
  cfg.reproducible = Reproducible::Canonical;
  auto msgs = runRanks(2, cfg, [&](int r, chorusComm_t comm) -> std::string {
    std::vector<float> x(8, 1.0f), y(8);
    chorusCallOptions_t o = CHORUS_CALL_OPTIONS_INITIALIZER;
    o.compress = CHORUS_COMPRESS_BF16;
    if (chorusAllReduceEx(x.data(), y.data(), 8, chorusFloat32, chorusSum, comm, nullptr, &o) != chorusInvalidArgument)
      return fmt::format("rank {}: accepted", r);
    const std::string msg = chorusGetLastError(comm);
    return msg.find("CHORUS_REPRODUCIBLE") != std::string::npos ? "" : msg;
  });
  EXPECT_EQ(failures(msgs), "");
}

// A traced compressed call writes records of the (de)quantize steps that the
// trace reader accepts.
TEST(CompressedCollectives, TracedCallsRecordTheQuantizeSteps) {
  const std::string dir = (std::filesystem::temp_directory_path() / fmt::format("chorus-compress-trace-{}", getpid())).string();
  std::filesystem::remove_all(dir);
  Config cfg;
  cfg.trace.dir = dir;
  auto msgs = runRanks(2, cfg, [&](int r, chorusComm_t comm) -> std::string {
    std::vector<float> x(4096, 1.0f), y(4096);
    chorusCallOptions_t o = CHORUS_CALL_OPTIONS_INITIALIZER;
    o.compress = CHORUS_COMPRESS_FP8;
    if (chorusAllReduceEx(x.data(), y.data(), 4096, chorusFloat32, chorusSum, comm, nullptr, &o) != chorusSuccess)
      return chorusGetLastError(comm);
    return y[0] == 2.0f ? "" : fmt::format("rank {}: {}", r, y[0]);
  });
  ASSERT_EQ(failures(msgs), "");
  int files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".trace") continue;
    ++files;
    auto t = trace::readTraceFile(e.path().string());
    ASSERT_TRUE(t.isOk()) << t.status().message();
    int kinds[8] = {};
    for (const auto& s : t->steps) ++kinds[s.kind];
    EXPECT_GT(kinds[static_cast<int>(trace::StepKind::Quantize)], 0);
    EXPECT_GT(kinds[static_cast<int>(trace::StepKind::DequantizeReduce)], 0);
    EXPECT_GT(kinds[static_cast<int>(trace::StepKind::Dequantize)], 0);
  }
  EXPECT_EQ(files, 2);
  std::filesystem::remove_all(dir);
}

// CHORUS_COMPRESS (read only in src/api/config.cpp).
TEST(CompressConfig, EnvironmentKnob) {
  auto parse = [](std::string v) {
    return api::parseConfig([v](std::string_view name) -> std::optional<std::string> {
      if (name == "CHORUS_COMPRESS") return v;
      return std::nullopt;
    });
  };
  auto c = parse("fp8:64");
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(c.value().compress.kind, CompressKind::Fp8);
  EXPECT_EQ(c.value().compress.block, 64);
  c = parse("bf16");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c.value().compress.kind, CompressKind::Bf16);
  c = parse("fp8");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c.value().compress.block, 128);
  c = parse("off");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c.value().compress.kind, CompressKind::Off);
  for (const char* bad : {"fp8:16", "fp8:2048", "fp8:x", "zstd", "fp16"}) {
    c = parse(bad);
    ASSERT_FALSE(c.isOk()) << bad;
    EXPECT_NE(c.status().message().find("CHORUS_COMPRESS"), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find("bf16"), std::string::npos) << c.status().message();
  }
}

}  // namespace
}  // namespace chorus::testing

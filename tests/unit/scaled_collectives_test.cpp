// PreMulSum and Avg through the C API now that their arithmetic is steps of
// the plan (plan::Scaling): every reducing collective with every algorithm
// forced in turn (CHORUS_ALGO's syntax), under canonical and exact mode, and
// compressed, each element checked against the independent reference in
// support/collective_check (or, compressed, values the wire carries exactly);
// and the user's input is never written unless it is the output.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <numeric>

#include "plan/plan.hpp"
#include "trace/record.hpp"
#include "support/collective_check.hpp"
#include "support/rank_threads.hpp"

namespace chorus::testing {
namespace {

constexpr auto kPreMulSum = static_cast<chorusRedOp_t>(chorusNumOps);  // collective_check: scalar 2

Coll collOf(plan::Collective c) {
  switch (c) {
    case plan::Collective::Reduce: return Coll::Reduce;
    case plan::Collective::ReduceScatter: return Coll::ReduceScatter;
    default: return Coll::AllReduce;
  }
}

// Avg and PreMulSum cases of one collective: a float, a narrow float and an
// integer type, small ragged counts and one that cuts into pipeline slices.
std::vector<Case> scaledCases(Coll coll, int nranks, bool floats_only) {
  std::vector<Case> out;
  for (const Case& c : standardCases(nranks, {0, 1, 7, 4099}, /*all_dtypes=*/true)) {
    if (c.coll != coll || (c.op != chorusAvg && c.op != kPreMulSum)) continue;
    const bool fp = c.dtype == chorusFloat32 || c.dtype == chorusBfloat16 || c.dtype == chorusFloat64;
    if (!(fp || (!floats_only && c.dtype == chorusInt32))) continue;
    out.push_back(c);
  }
  return out;
}

std::string runAll(chorusComm_t comm, const std::vector<Case>& cases) {
  for (const Case& c : cases)
    if (std::string err = runCase(comm, c); !err.empty()) return err;
  return "";
}

Config configWith(const std::string& algo_spec, bool tcp, Reproducible repro = Reproducible::Off) {
  Config cfg;
  cfg.tune.algo_spec = algo_spec;
  cfg.net.transport = tcp ? "tcp" : "auto";
  cfg.reproducible = repro;
  return cfg;
}

// Every uncompressed algorithm of allreduce, reduce and reduce-scatter,
// forced, on 2..5 ranks (where it takes the shape; the hierarchical plans
// over TCP, every rank a host of its own), each rank asserting that the
// forced one ran (chorusCommPredict).
TEST(ScaledCollectives, EveryAlgorithmMatchesTheReference) {
  const plan::Registry reg = plan::Registry::builtin();
  int runs = 0;
  for (plan::Collective coll :
       {plan::Collective::AllReduce, plan::Collective::Reduce, plan::Collective::ReduceScatter}) {
    for (const plan::Algorithm* algo : reg.forCollective(coll)) {
      if (algo->compressed()) continue;
      const bool tcp = algo->name() == "hierarchical";
      for (int n : {2, 3, 4, 5}) {
        plan::Shape sh;
        sh.coll = coll;
        sh.nranks = n;
        sh.count = 7;
        std::vector<int> hosts(static_cast<size_t>(n));
        if (tcp) std::iota(hosts.begin(), hosts.end(), 0);
        sh.hosts = hosts;
        if (!algo->supports(sh)) continue;
        const std::string name(plan::collectiveName(coll));
        const std::vector<Case> cases = scaledCases(collOf(coll), n, false);
        auto msgs = runRanks(n, configWith(fmt::format("{}:{}", name, algo->name()), tcp),
                             [&](int r, chorusComm_t c) -> std::string {
          char ran[64] = {};
          double us = 0;
          if (chorusCommPredict(c, name.c_str(), 7, chorusFloat32, 0, ran, sizeof ran, &us) != chorusSuccess)
            return chorusGetLastError(c);
          if (std::string(ran) != algo->name())
            return fmt::format("rank {}: forced {} but the tuner ran {}", r, algo->name(), ran);
          return runAll(c, cases);
        });
        EXPECT_EQ(failures(msgs), "") << name << ":" << algo->name() << " on " << n << " ranks";
        ++runs;
      }
    }
  }
  EXPECT_GT(runs, 20);
}

// Canonical mode runs the canonical plans (or the one-shot plan) with the
// steps; exact mode scales as it converts the input and divides the rounded
// result (its plans sum accumulator words).
TEST(ScaledCollectives, CanonicalAndExact) {
  for (Reproducible repro : {Reproducible::Canonical, Reproducible::Exact})
    for (int n : {3, 4}) {
      std::vector<Case> cases;
      for (Coll coll : {Coll::AllReduce, Coll::Reduce, Coll::ReduceScatter}) {
        auto more = scaledCases(coll, n, repro == Reproducible::Exact);
        cases.insert(cases.end(), more.begin(), more.end());
      }
      auto msgs = runRanks(n, configWith("", false, repro), [&](int, chorusComm_t c) { return runAll(c, cases); });
      EXPECT_EQ(failures(msgs), "") << (repro == Reproducible::Exact ? "exact" : "canonical") << " on " << n;
    }
}

// Compressed (bf16 on the wire): every compressed algorithm of allreduce and
// reduce-scatter, forced, with Avg and a PreMulSum of 0.5.  The inputs are
// small integers, which bf16 carries exactly, so the sums are exact and the
// results must equal the fp32 reference bit for bit.
std::string compressedCall(chorusComm_t comm, int r, int n, plan::Collective coll, chorusRedOp_t op, float scalar) {
  const size_t count = 1000, in_n = coll == plan::Collective::ReduceScatter ? count * n : count;
  std::vector<float> x(in_n), y(count);
  for (size_t i = 0; i < in_n; ++i) x[i] = static_cast<float>((i + 3 * r) % 11);
  chorusCallOptions_t o = CHORUS_CALL_OPTIONS_INITIALIZER;
  o.compress = CHORUS_COMPRESS_BF16;
  const chorusResult_t res = coll == plan::Collective::AllReduce
                                 ? chorusAllReduceEx(x.data(), y.data(), count, chorusFloat32, op, comm, nullptr, &o)
                                 : chorusReduceScatterEx(x.data(), y.data(), count, chorusFloat32, op, comm, nullptr, &o);
  if (res != chorusSuccess) return chorusGetLastError(comm);
  const size_t base = coll == plan::Collective::ReduceScatter ? static_cast<size_t>(r) * count : 0;
  for (size_t i = 0; i < count; ++i) {
    float sum = 0;
    for (int q = 0; q < n; ++q) sum += static_cast<float>((base + i + 3 * q) % 11) * scalar;
    const float want = op == chorusAvg ? sum / static_cast<float>(n) : sum;
    if (y[i] != want) return fmt::format("rank {}: element {} is {}, want {}", r, i, y[i], want);
  }
  return "";
}

TEST(ScaledCollectives, Compressed) {
  const plan::Registry reg = plan::Registry::builtin();
  int runs = 0;
  for (plan::Collective coll : {plan::Collective::AllReduce, plan::Collective::ReduceScatter})
    for (const plan::Algorithm* algo : reg.forCollective(coll)) {
      // The two-level plan needs several hosts of several ranks each, which
      // threads of one process are not (tests/integration runs it).
      if (!algo->compressed() || algo->name() == "compressed_hierarchical") continue;
      const int n = 3;
      const std::string spec = fmt::format("{}:{}", plan::collectiveName(coll), algo->name());
      auto msgs = runRanks(n, configWith(spec, false), [&](int r, chorusComm_t comm) -> std::string {
        if (std::string e = compressedCall(comm, r, n, coll, chorusAvg, 1.0f); !e.empty()) return "avg: " + e;
        float half = 0.5f;
        chorusRedOp_t pm;
        if (chorusRedOpCreatePreMulSum(&pm, &half, chorusFloat32, chorusScalarHostImmediate, comm) != chorusSuccess)
          return chorusGetLastError(comm);
        std::string e = compressedCall(comm, r, n, coll, pm, 0.5f);
        chorusRedOpDestroy(pm, comm);
        return e.empty() ? "" : "premulsum: " + e;
      });
      EXPECT_EQ(failures(msgs), "") << spec;
      ++runs;
    }
  EXPECT_GE(runs, 2);
}

// PreMulSum scales a staged copy: the user's input is left as it was, out of
// place and for an in-place reduce-scatter (whose output is one block of the
// input); only an in-place allreduce's or reduce's buffer, the output itself,
// is overwritten.  The scalar lives in device memory (read at each call).
TEST(ScaledCollectives, PreMulSumLeavesTheInputAlone) {
  const int n = 3;
  const size_t count = 33;
  auto msgs = runRanks(n, [&](int r, chorusComm_t comm) -> std::string {
    float scalar = 3.0f;
    chorusRedOp_t pm;
    if (chorusRedOpCreatePreMulSum(&pm, &scalar, chorusFloat32, chorusScalarDevice, comm) != chorusSuccess)
      return chorusGetLastError(comm);
    std::vector<float> x(count * n), y(count * n, -1.0f);
    std::iota(x.begin(), x.end(), static_cast<float>(r));
    const std::vector<float> x0 = x;
    std::string err;
    auto expectSum = [&](const float* got, size_t base, const char* what) {
      for (size_t i = 0; i < count && err.empty(); ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += 3.0f * static_cast<float>(base + i + q);
        if (got[i] != want) err = fmt::format("rank {}: {}: element {} is {}, want {}", r, what, i, got[i], want);
      }
    };
    if (chorusAllReduce(x.data(), y.data(), count, chorusFloat32, pm, comm, nullptr) != chorusSuccess)
      return chorusGetLastError(comm);
    expectSum(y.data(), 0, "allreduce");
    if (x != x0) err = fmt::format("rank {}: an out-of-place allreduce wrote its input", r);
    if (chorusReduceScatter(x.data(), x.data() + r * count, count, chorusFloat32, pm, comm, nullptr) != chorusSuccess)
      return chorusGetLastError(comm);
    expectSum(x.data() + r * count, r * count, "in-place reducescatter");
    for (size_t i = 0; i < x.size() && err.empty(); ++i)
      if ((i / count) != static_cast<size_t>(r) && x[i] != x0[i])
        err = fmt::format("rank {}: an in-place reducescatter wrote input element {} outside its output", r, i);
    scalar = 1.0f;  // a device scalar is read at each call
    x = x0;
    if (chorusAllReduce(x.data(), x.data(), count, chorusFloat32, pm, comm, nullptr) != chorusSuccess)
      return chorusGetLastError(comm);
    for (size_t i = 0; i < count && err.empty(); ++i) {
      const float want = static_cast<float>(n * i + n * (n - 1) / 2);
      if (x[i] != want) err = fmt::format("rank {}: in-place allreduce element {} is {}, want {}", r, i, x[i], want);
    }
    chorusRedOpDestroy(pm, comm);
    return err;
  });
  EXPECT_EQ(failures(msgs), "");
}

// A traced call records its Scale and Divide steps like any other step, and
// the trace reader accepts them.
TEST(ScaledCollectives, TracedCallsRecordTheSteps) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / fmt::format("chorus-scaled-trace-{}", getpid())).string();
  std::filesystem::remove_all(dir);
  Config cfg;
  cfg.trace.dir = dir;
  auto msgs = runRanks(2, cfg, [&](int r, chorusComm_t comm) -> std::string {
    std::vector<float> x(4096, 1.0f), y(4096);
    float scalar = 2.0f;
    chorusRedOp_t pm;
    if (chorusRedOpCreatePreMulSum(&pm, &scalar, chorusFloat32, chorusScalarHostImmediate, comm) != chorusSuccess ||
        chorusAllReduce(x.data(), y.data(), x.size(), chorusFloat32, pm, comm, nullptr) != chorusSuccess ||
        y[0] != 4.0f || chorusAllReduce(x.data(), y.data(), x.size(), chorusFloat32, chorusAvg, comm, nullptr) !=
                            chorusSuccess)
      return fmt::format("rank {}: {} ({})", r, chorusGetLastError(comm), y[0]);
    chorusRedOpDestroy(pm, comm);
    return y[0] == 1.0f ? "" : fmt::format("rank {}: avg {}", r, y[0]);
  });
  ASSERT_EQ(failures(msgs), "");
  int files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".trace") continue;
    ++files;
    auto t = trace::readTraceFile(e.path().string());
    ASSERT_TRUE(t.isOk()) << t.status().message();
    int scales = 0, divides = 0;
    for (const auto& s : t->steps) {
      scales += s.kind == static_cast<uint8_t>(trace::StepKind::Scale);
      divides += s.kind == static_cast<uint8_t>(trace::StepKind::Divide);
    }
    EXPECT_EQ(scales, 1);
    EXPECT_EQ(divides, 1);
  }
  EXPECT_EQ(files, 2);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace chorus::testing

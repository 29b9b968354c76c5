// chorus_collectives_main: one rank of a multi-process collectives check.
//
// Started N times by a launcher (chorus-run, or tests/cluster/netns_cluster_test.sh
// with CHORUS_* set by hand), each process inits from the environment, runs the
// standard case matrix of tests/support/collective_check (every element checked
// against an independent reference), repeats a few cases on a stream, and prints
// one JSON line:
//
//   {"rank":r,"nranks":n,"cases":c,"failures":f,"first_failure":"..."}
//
// Exit status: 0 when every case passed on this rank, 1 otherwise (including an
// init or destroy failure, reported as a JSON line with "error").  The ctest
// driver (run_job.cmake) asserts on these fields and on the launcher's status.
//
//   chorus-run -n 4 chorus_collectives_main [--counts 0,1,7] [--float-counts 1000003]
//                                           [--fail-rank R --fail-status S]
//                                           [--repro canonical|exact]  (with CHORUS_REPRODUCIBLE set:
//                                            support/repro_check's bitwise checks as one case)
//                                           [--compress bf16|fp8]  (compressed allreduces: every rank the same
//                                            bits, all-equal data exact, bf16 within its two-rounding bound,
//                                            avg and premulsum of all-equal data exact)
#include <CLI/CLI.hpp>
#include <chorus/chorus.h>
#include <fmt/format.h>

#include <cstdio>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/collective_check.hpp"
#include "support/repro_check.hpp"

namespace {

using chorus::testing::Case;
using chorus::testing::Coll;

// "0,1,7" -> {0,1,7}; "" -> {}.  Sizes are plain element counts.
bool parseCounts(const std::string& text, std::vector<size_t>* out, std::string* why) {
  out->clear();
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    char* stop = nullptr;
    const unsigned long long v = std::strtoull(item.c_str(), &stop, 10);
    if (item.empty() || *stop != '\0') {
      *why = fmt::format("'{}' in '{}' is not an element count (use e.g. 0,1,7)", item, text);
      return false;
    }
    out->push_back(static_cast<size_t>(v));
    pos = end + 1;
  }
  return true;
}

void printJson(const nlohmann::json& j) {
  // One write per line: the launcher relays whole lines, so ranks never interleave.
  std::string line = j.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

// Compressed allreduces (chorusAllReduceEx) of float32 sums: every rank must
// get the same bits (a hash of the result, allgathered); all-equal inputs
// come back exact; bf16 results lie within its bound for two quantizations
// (each rounds to 8 significant bits, a relative error of at most 2^-8 of
// a partial sum no larger than the sum of magnitudes: docs/algorithms.md),
// with 5 % to spare for the fp32 additions.  fp8's block-scaled bound is
// checked per element by tests/unit/compress_test.cpp.
// Avg and PreMulSum (the plan's Divide and Scale steps) through the same
// compressed plan: rank r's elements all equal r + 1, which every format
// carries exactly (an all-equal block decodes to its amax), as it does the
// sums, so the results are exact: (n + 1) / 2 and n (n + 1) / 4 for a
// scalar of 0.5.
std::string compressScaledRank(int rank, int n, chorusComm_t comm, const chorusCallOptions_t& o) {
  const size_t count = 1031;
  std::vector<float> x(count, static_cast<float>(rank + 1)), y(count, -1.0f);
  float half = 0.5f;
  chorusRedOp_t pm;
  if (chorusRedOpCreatePreMulSum(&pm, &half, chorusFloat32, chorusScalarHostImmediate, comm) != chorusSuccess)
    return chorusGetLastError(comm);
  for (chorusRedOp_t op : {chorusAvg, pm}) {
    if (chorusAllReduceEx(x.data(), y.data(), count, chorusFloat32, op, comm, nullptr, &o) != chorusSuccess)
      return fmt::format("compressed {} allreduce: {}", op == chorusAvg ? "avg" : "premulsum", chorusGetLastError(comm));
    const float want = op == chorusAvg ? static_cast<float>(n + 1) / 2 : static_cast<float>(n * (n + 1)) / 4;
    for (size_t i = 0; i < count; ++i)
      if (y[i] != want)
        return fmt::format("compressed {} allreduce: element {} is {}, want {}", op == chorusAvg ? "avg" : "premulsum",
                           i, y[i], want);
  }
  chorusRedOpDestroy(pm, comm);
  return "";
}

std::string compressRank(int rank, int n, chorusComm_t comm, const std::string& format) {
  chorusCallOptions_t o = CHORUS_CALL_OPTIONS_INITIALIZER;
  o.compress = format == "fp8" ? CHORUS_COMPRESS_FP8 : CHORUS_COMPRESS_BF16;
  if (std::string e = compressScaledRank(rank, n, comm, o); !e.empty()) return e;
  auto value = [](int r, size_t i) {
    return static_cast<float>(std::sin(static_cast<double>(i + 1) * 0.37 + r) * static_cast<double>(1 + (i * 7 + r) % 13));
  };
  for (size_t count : {size_t{1}, size_t{1031}, size_t{70001}, size_t{300007}}) {
    for (bool equal : {false, true}) {
      std::vector<float> x(count), y(count, -1.0f);
      for (size_t i = 0; i < count; ++i) x[i] = equal ? 1.5f : value(rank, i);
      if (chorusAllReduceEx(x.data(), y.data(), count, chorusFloat32, chorusSum, comm, nullptr, &o) != chorusSuccess)
        return fmt::format("{} allreduce of {} floats: {}", format, count, chorusGetLastError(comm));
      uint64_t h = 1469598103934665603ull;
      for (float v : y) {
        uint32_t b;
        std::memcpy(&b, &v, 4);
        h = (h ^ b) * 1099511628211ull;
      }
      std::vector<uint64_t> all(static_cast<size_t>(n));
      if (chorusAllGather(&h, all.data(), 1, chorusUint64, comm, nullptr) != chorusSuccess)
        return fmt::format("allgather of the result hashes: {}", chorusGetLastError(comm));
      for (int r = 0; r < n; ++r)
        if (all[static_cast<size_t>(r)] != h)
          return fmt::format("{} allreduce of {} floats: rank {} got other bits than rank {}", format, count, r, rank);
      for (size_t i = 0; i < count; ++i) {
        double ref = 0, mag = 0;
        for (int r = 0; r < n; ++r) {
          const double v = equal ? 1.5 : static_cast<double>(value(r, i));
          ref += v;
          mag += std::abs(v);
        }
        const double err = std::abs(static_cast<double>(y[i]) - ref);
        if (equal ? err != 0 : (format == "bf16" && err > 1.05 * 2 * std::ldexp(mag, -8)))
          return fmt::format("{} allreduce of {} floats{}: element {} is {}, the sum is {} (error {}, bound {})", format,
                             count, equal ? " (all equal)" : "", i, y[i], ref, err, 1.05 * 2 * std::ldexp(mag, -8));
      }
    }
  }
  return "";
}

int main(int argc, char** argv) {
  CLI::App app{"one rank of the multi-process collectives check (run it under chorus-run)"};
  std::string counts_s = "0,1,7", float_counts_s = "1000003";
  int fail_rank = -1, fail_status = 3;
  bool stream_cases = true;
  app.add_option("--counts", counts_s, "element counts run for every collective x dtype x op (comma list, may be empty)")
      ->capture_default_str();
  app.add_option("--float-counts", float_counts_s, "element counts run for every collective in float32 only")
      ->capture_default_str();
  app.add_option("--fail-rank", fail_rank, "this rank exits with --fail-status right after init (failure tests)");
  app.add_option("--fail-status", fail_status, "exit status of --fail-rank")->capture_default_str();
  app.add_option("--stream", stream_cases, "also run a few cases on a chorus stream")->capture_default_str();
  bool matrix = true;
  app.add_option("--matrix", matrix, "run the standard case matrix (--counts, --float-counts)")->capture_default_str();
  std::string repro;
  app.add_option("--repro", repro,
                 "canonical: every reducing algorithm's results bitwise the canonical tree's; exact: correctly "
                 "rounded (run with CHORUS_REPRODUCIBLE set to the same mode)")
      ->check(CLI::IsMember({"canonical", "exact"}));
  std::string compress;
  app.add_option("--compress", compress, "compressed allreduces in this wire format (see compressRank)")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  std::vector<std::string> expect_algos;
  app.add_option("--expect-algo", expect_algos,
                 "COLL:NAME: fail unless the tuner runs NAME for COLL (checked at the --float-counts); repeatable");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::vector<size_t> counts, float_counts;
  std::string why;
  if (!parseCounts(counts_s, &counts, &why) || !parseCounts(float_counts_s, &float_counts, &why)) {
    fmt::print(stderr, "chorus_collectives_main: {}\n", why);
    return 2;
  }

  chorusComm_t comm = nullptr;
  if (chorusResult_t r = chorusCommInitFromEnv(&comm); r != chorusSuccess) {
    printJson({{"rank", nullptr},
               {"error", fmt::format("chorusCommInitFromEnv: {}: {}", chorusGetErrorString(r), chorusGetLastError(nullptr))}});
    return 1;
  }
  int rank = 0, n = 0;
  chorusCommUserRank(comm, &rank);
  chorusCommCount(comm, &n);
  if (rank == fail_rank) {
    // Dies without destroying the communicator, as a crashed process would:
    // the others must notice (remote error or timeout) and the launcher must
    // report this rank's status.
    return fail_status;
  }

  std::vector<Case> cases;
  if (!matrix) {
    counts.clear();
    float_counts.clear();
  }
  if (!counts.empty()) cases = chorus::testing::standardCases(n, counts, /*all_dtypes=*/true);
  if (!float_counts.empty()) {
    auto big = chorus::testing::standardCases(n, float_counts, /*all_dtypes=*/false);
    cases.insert(cases.end(), big.begin(), big.end());
  }

  int failures = 0, run = 0;
  std::string first_failure;
  auto record = [&](const std::string& msg) {
    ++run;
    if (msg.empty()) return;
    if (failures++ == 0) first_failure = msg;
    fmt::print(stderr, "rank {}: {}\n", rank, msg);
  };
  // A forced algorithm (CHORUS_ALGO) that does not handle the job's layout is
  // silently replaced by the tuner's choice: make sure it is the one running.
  for (const std::string& e : expect_algos) {
    const size_t colon = e.find(':');
    const std::string coll = e.substr(0, colon), want = colon == std::string::npos ? "" : e.substr(colon + 1);
    for (size_t count : float_counts) {
      char got[64] = {};
      double us = 0;
      if (chorusCommPredict(comm, coll.c_str(), count, chorusFloat32, 0, got, sizeof got, &us) != chorusSuccess)
        record(fmt::format("chorusCommPredict({}): {}", coll, chorusGetLastError(comm)));
      else if (want != got)
        record(fmt::format("{} of {} floats: expected algorithm {}, the tuner runs {}", coll, count, want, got));
      else
        record("");
    }
  }
  for (const Case& c : cases) record(chorus::testing::runCase(comm, c));
  if (repro == "canonical") record(chorus::testing::canonicalRank(rank, n, comm));
  if (repro == "exact") record(chorus::testing::exactRank(rank, n, comm, nullptr));
  if (!compress.empty()) record(compressRank(rank, n, comm, compress));

  if (stream_cases) {
    // The same checks with the work queued on a stream (runCase synchronises it
    // before checking), interleaving collectives of different shapes.
    chorusStream_t stream = nullptr;
    if (chorusStreamCreate(&stream) != chorusSuccess) {
      record(fmt::format("chorusStreamCreate failed: {}", chorusGetLastError(comm)));
    } else {
      const int root = n > 1 ? 1 : 0;
      const Case stream_list[] = {
          {Coll::AllReduce, chorusFloat32, chorusSum, 100003, 0, false},
          {Coll::AllReduce, chorusBfloat16, chorusMax, 4099, 0, true},
          {Coll::Broadcast, chorusInt32, chorusSum, 777, root, false},
          {Coll::AllGather, chorusFloat64, chorusSum, 1001, 0, false},
          {Coll::ReduceScatter, chorusInt64, chorusSum, 513, 0, false},
          {Coll::SendRecv, chorusUint8, chorusSum, 12345, 0, false},
          {Coll::Barrier, chorusFloat32, chorusSum, 0, 0, false},
      };
      for (const Case& c : stream_list) record(chorus::testing::runCase(comm, c, stream));
      if (chorusStreamDestroy(stream) != chorusSuccess)
        record(fmt::format("chorusStreamDestroy failed: {}", chorusGetLastError(comm)));
    }
  }

  std::string destroy_error;
  if (chorusResult_t r = chorusCommDestroy(comm); r != chorusSuccess)
    destroy_error = fmt::format("chorusCommDestroy: {}: {}", chorusGetErrorString(r), chorusGetLastError(nullptr));

  nlohmann::json line = {{"rank", rank}, {"nranks", n}, {"cases", run}, {"failures", failures}};
  if (!first_failure.empty()) line["first_failure"] = first_failure;
  if (!destroy_error.empty()) line["error"] = destroy_error;
  printJson(line);
  return failures == 0 && destroy_error.empty() ? 0 : 1;
}

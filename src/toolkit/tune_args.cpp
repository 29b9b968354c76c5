#include "toolkit/tune_args.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "common/size.hpp"
#include "plan/plan.hpp"
#include "toolkit/launcher.hpp"
#include "transport/registry.hpp"

namespace chorus::tools {

Result<TuneOptions> tuneOptionsFromArgs(const TuneArgs& a) {
  TuneOptions o;
  o.reps = a.reps;
  {
    const std::vector<std::string> registered = transport::registry().names();
    std::vector<std::string> names;
    if (a.transports == "all") {
      names = registered;
    } else {
      std::stringstream ts(a.transports);
      for (std::string t; std::getline(ts, t, ',');) {
        if (transport::registry().find(t) == nullptr)
          return invalidUsage("chorus-tune: --transports: '{}' is not a registered transport (registered: {})", t,
                              transport::registry().namesText());
        names.push_back(t);
      }
    }
    if (a.no_tcp) names.erase(std::remove(names.begin(), names.end(), "tcp"), names.end());
    o.transports = names;
  }
  o.correction_reps = a.correction_reps;
  o.max_passes = a.passes;
  o.agree = a.agree;
  o.collectives.clear();
  if (a.collectives != "none") {
    std::stringstream ss(a.collectives);
    for (std::string c; std::getline(ss, c, ',');) {
      plan::Collective pc;
      if (!plan::parseCollective(c, &pc) || pc == plan::Collective::AllGatherV || pc == plan::Collective::AllToAllV)
        return invalidUsage("chorus-tune: --collectives: '{}' is not a priced collective (allreduce, allgather, "
                            "reducescatter, alltoall, broadcast, reduce, gather, scatter, barrier)",
                            c);
      o.collectives.push_back(c);
    }
  }
  auto max_bytes = parseSize(a.max_bytes, "--max-bytes");
  if (!max_bytes.isOk()) return invalidUsage("chorus-tune: {}", max_bytes.status().message());
  if (max_bytes.value() < 16)
    return invalidUsage("chorus-tune: --max-bytes '{}' is {} bytes: it must be at least 16 bytes (e.g. 64M)",
                        a.max_bytes, max_bytes.value());
  o.max_bytes = max_bytes.value();
  return o;
}

std::vector<int> parseRankCounts(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 2 || v > 64) return {};
    out.push_back(static_cast<int>(v));
  }
  return out;
}

int launchTuneJobs(const TuneArgs& a, int argc, char** argv) {
  const std::vector<int> counts = parseRankCounts(a.np);
  if (counts.empty()) {
    fmt::print(stderr, "chorus-tune: --np '{}' must be rank counts in [2, 64], comma-separated\n", a.np);
    return 2;
  }
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  for (size_t i = 0; i < counts.size(); ++i) {
    LaunchOptions lo;
    lo.nranks = counts[i];
    lo.argv.push_back(ec ? std::string(argv[0]) : self.string());
    for (int k = 1; k < argc; ++k) lo.argv.emplace_back(argv[k]);
    // Later rank counts add their corrections to the profile the first wrote.
    if (i > 0 && !a.append) lo.argv.emplace_back("--append");
    lo.name = "chorus-tune";
    auto report = launch(lo);
    if (!report.isOk()) {
      fmt::print(stderr, "{}\n", report.status().message());
      return 1;
    }
    if (report->exit_code != 0) return report->exit_code;
  }
  return 0;
}

int runTuneRank(TuneOptions o, const TuneArgs& a, bool rank0) {
  const std::string& out = a.output;
  if (a.append) {
    std::ifstream in(out);
    std::stringstream text;
    text << in.rdbuf();
    auto base = tune::CostProfile::fromJson(text.str());
    if (!in || !base.isOk()) {
      fmt::print(stderr, "chorus-tune: --append needs a readable profile at {}: {}\n", out,
                 in ? base.status().message() : "cannot read it");
      return 1;
    }
    base->source = "chorus-tune";
    o.base = std::move(base.value());
  }
  auto p = measureProfile(o);
  if (!p.isOk()) {
    fmt::print(stderr, "{}\n", p.status().message());
    return 1;
  }
  if (!rank0) return 0;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(out).parent_path(), ec);
  std::ofstream f(out, std::ios::trunc);
  f << p->toJson();
  if (!f) {
    fmt::print(stderr, "chorus-tune: cannot write {}\n", out);
    return 1;
  }
  fmt::print("{}", p->toJson());
  fmt::print("chorus-tune: wrote {}\n", out);
  return 0;
}

}  // namespace chorus::tools

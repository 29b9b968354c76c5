// chorus-tune: calibrates the cost model on this machine and writes the
// profile the tuner reads (CHORUS_TUNE_FILE, default ~/.cache/chorus/profile.json).
//
//   chorus-tune                 (launches 2 local ranks of itself)
//   chorus-tune --np 2,4 -o FILE   (one job per rank count; the second adds its corrections)
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "api/config.hpp"
#include "common/env.hpp"
#include "common/size.hpp"
#include "plan/plan.hpp"
#include "tools/bench.hpp"
#include "tools/launcher.hpp"
#include "tools/tune.hpp"
#include "transport/registry.hpp"

namespace {

// "2,4" -> {2, 4}: each in [2, 64].
std::vector<int> parseCounts(const std::string& text) {
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-tune: measure latency, bandwidth and reduction costs and every algorithm's measured "
               "correction; write the tuning profile"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  std::string np_text = "2", collectives = "allreduce,allgather,reducescatter,alltoall,broadcast", max_text = "64M";
  int reps = 7, correction_reps = 3, passes = 4;
  double agree = 0.10;
  // The job's configuration: its tuning profile is the default output, and
  // the measuring communicators are made from it.
  auto cfg = chorus::api::configFromEnv();
  if (!cfg.isOk()) {
    fmt::print(stderr, "chorus-tune: {}\n", cfg.status().message());
    return 2;
  }
  std::string out = cfg->tune.profile_path;
  bool no_tcp = false, append = false;
  std::string transports_text = "all";
  app.add_option("--np", np_text, "rank counts to calibrate, e.g. 2,4 (one job each, run in turn; when not already a "
                                  "rank of a job)")
      ->capture_default_str();
  app.add_option("-o,--output", out, "where to write the profile")->capture_default_str();
  app.add_option("--reps", reps, "repetitions per figure (the median is kept)")
      ->capture_default_str()
      ->check(CLI::Range(1, 101));
  app.add_option("--transports", transports_text, "transports whose links are measured (comma-separated registered "
                                                "names, or 'all')")
      ->capture_default_str();
  app.add_flag("--no-tcp", no_tcp, "do not measure the TCP transport");
  app.add_option("--collectives", collectives, "collectives whose algorithms get measured corrections "
                                               "(comma-separated; 'none' for the α-β-γ figures only)")
      ->capture_default_str();
  app.add_option("--max-bytes", max_text, "largest calibrated size (16 B x 4^k up to this); "
                                           "suffixes K, M, G are powers of 1024")
      ->capture_default_str();
  app.add_option("--correction-reps", correction_reps, "sweeps per correction (the median is kept)")
      ->capture_default_str()
      ->check(CLI::Range(1, 21));
  app.add_flag("--append", append, "keep the profile at --output and add only this job's corrections");
  app.add_option("--passes", passes, "measure the figures until two passes in a row agree, at most this many (1: one "
                                     "pass, no check); the profile records the passes and any figure that still moved")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  app.add_option("--agree", agree, "how close two passes must be on every figure (relative)")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1.0));
  CLI11_PARSE(app, argc, argv);

  chorus::tools::TuneOptions o;
  o.reps = reps;
  {
    const std::vector<std::string> registered = chorus::transport::registry().names();
    std::vector<std::string> names;
    if (transports_text == "all") {
      names = registered;
    } else {
      std::stringstream ts(transports_text);
      for (std::string t; std::getline(ts, t, ',');) {
        if (chorus::transport::registry().find(t) == nullptr) {
          fmt::print(stderr, "chorus-tune: --transports: '{}' is not a registered transport (registered: {})\n", t,
                     chorus::transport::registry().namesText());
          return 2;
        }
        names.push_back(t);
      }
    }
    if (no_tcp) names.erase(std::remove(names.begin(), names.end(), "tcp"), names.end());
    o.transports = names;
  }
  o.correction_reps = correction_reps;
  o.max_passes = passes;
  o.agree = agree;
  o.collectives.clear();
  if (collectives != "none") {
    std::stringstream ss(collectives);
    for (std::string c; std::getline(ss, c, ',');) {
      chorus::plan::Collective pc;
      if (!chorus::plan::parseCollective(c, &pc) ||
          pc == chorus::plan::Collective::AllGatherV || pc == chorus::plan::Collective::AllToAllV) {
        fmt::print(stderr, "chorus-tune: --collectives: '{}' is not a priced collective (allreduce, allgather, "
                           "reducescatter, alltoall, broadcast, reduce, gather, scatter, barrier)\n", c);
        return 2;
      }
      o.collectives.push_back(c);
    }
  }
  auto max_bytes = chorus::parseSize(max_text, "--max-bytes");
  if (!max_bytes.isOk()) {
    fmt::print(stderr, "chorus-tune: {}\n", max_bytes.status().message());
    return 2;
  }
  if (max_bytes.value() < 16) {
    fmt::print(stderr, "chorus-tune: --max-bytes '{}' is {} bytes: it must be at least 16 bytes (e.g. 64M)\n",
               max_text, max_bytes.value());
    return 2;
  }
  o.max_bytes = max_bytes.value();

  if (!chorus::env::raw("CHORUS_RANK")) {
    const std::vector<int> counts = parseCounts(np_text);
    if (counts.empty()) {
      fmt::print(stderr, "chorus-tune: --np '{}' must be rank counts in [2, 64], comma-separated\n", np_text);
      return 2;
    }
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    for (size_t i = 0; i < counts.size(); ++i) {
      chorus::tools::LaunchOptions lo;
      lo.nranks = counts[i];
      lo.argv.push_back(ec ? std::string(argv[0]) : self.string());
      for (int a = 1; a < argc; ++a) lo.argv.emplace_back(argv[a]);
      // Later rank counts add their corrections to the profile the first wrote.
      if (i > 0 && !append) lo.argv.emplace_back("--append");
      lo.name = "chorus-tune";
      auto report = chorus::tools::launch(lo);
      if (!report.isOk()) {
        fmt::print(stderr, "{}\n", report.status().message());
        return 1;
      }
      if (report->exit_code != 0) return report->exit_code;
    }
    return 0;
  }
  if (append) {
    std::ifstream in(out);
    std::stringstream text;
    text << in.rdbuf();
    auto base = chorus::tune::CostProfile::fromJson(text.str());
    if (!in || !base.isOk()) {
      fmt::print(stderr, "chorus-tune: --append needs a readable profile at {}: {}\n", out,
                 in ? base.status().message() : "cannot read it");
      return 1;
    }
    base->source = "chorus-tune";
    o.base = std::move(base.value());
  }
  o.config = cfg.value();
  auto p = chorus::tools::measureProfile(o);
  if (!p.isOk()) {
    fmt::print(stderr, "{}\n", p.status().message());
    return 1;
  }
  if (chorus::env::getString("CHORUS_RANK") != "0") return 0;
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

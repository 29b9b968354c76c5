// chorus-tune: calibrates the cost model on this machine and writes the
// profile the tuner reads (CHORUS_TUNE_FILE, default ~/.cache/chorus/profile.json).
//
//   chorus-tune                 (launches 2 local ranks of itself)
//   chorus-tune --np 2 -o FILE
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "common/env.hpp"
#include "tools/launcher.hpp"
#include "tools/tune.hpp"

int main(int argc, char** argv) {
  CLI::App app{"chorus-tune: measure latency, bandwidth and reduction costs; write the tuning profile"};
  int np = 2, reps = 7;
  std::string out = chorus::tune::CostProfile::defaultPath();
  bool no_tcp = false;
  app.add_option("--np", np, "ranks to launch (when not already a rank of a job)")->check(CLI::Range(2, 64));
  app.add_option("-o,--output", out, "where to write the profile");
  app.add_option("--reps", reps, "repetitions per figure (the median is kept)")->check(CLI::Range(1, 101));
  app.add_flag("--no-tcp", no_tcp, "do not measure the TCP transport");
  CLI11_PARSE(app, argc, argv);

  if (!chorus::env::raw("CHORUS_RANK")) {
    chorus::tools::LaunchOptions lo;
    lo.nranks = np;
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    lo.argv.push_back(ec ? std::string(argv[0]) : self.string());
    for (int i = 1; i < argc; ++i) lo.argv.emplace_back(argv[i]);
    lo.name = "chorus-tune";
    auto report = chorus::tools::launch(lo);
    if (!report.isOk()) {
      fmt::print(stderr, "{}\n", report.status().message());
      return 1;
    }
    return report->exit_code;
  }
  chorus::tools::TuneOptions o;
  o.reps = reps;
  o.tcp = !no_tcp;
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

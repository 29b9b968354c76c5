// chorus-tune: calibrates the cost model on this machine and writes the
// profile the tuner reads (CHORUS_TUNE_FILE, default ~/.cache/chorus/profile.json).
//
//   chorus-tune                 (launches 2 local ranks of itself)
//   chorus-tune --np 2,4 -o FILE   (one job per rank count; the second adds its corrections)
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <utility>

#include "api/config.hpp"
#include "common/env.hpp"
#include "toolkit/tune_args.hpp"

int main(int argc, char** argv) {
  namespace tools = chorus::tools;
  CLI::App app{"chorus-tune: measure latency, bandwidth and reduction costs and every algorithm's measured "
               "correction; write the tuning profile"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  // The job's configuration: its tuning profile is the default output, and
  // the measuring communicators are made from it.
  auto cfg = chorus::api::configFromEnv();
  if (!cfg.isOk()) {
    fmt::print(stderr, "chorus-tune: {}\n", cfg.status().message());
    return 2;
  }
  tools::TuneArgs a;  // the defaults are TuneArgs'
  a.output = cfg->tune.profile_path;
  app.add_option("--np", a.np, "rank counts to calibrate, e.g. 2,4 (one job each, run in turn; when not already a "
                               "rank of a job)")
      ->capture_default_str();
  app.add_option("-o,--output", a.output, "where to write the profile")->capture_default_str();
  app.add_option("--reps", a.reps, "repetitions per figure (the median is kept)")
      ->capture_default_str()
      ->check(CLI::Range(1, 101));
  app.add_option("--transports", a.transports, "transports whose links are measured (comma-separated registered "
                                                "names, or 'all')")
      ->capture_default_str();
  app.add_flag("--no-tcp", a.no_tcp, "do not measure the TCP transport");
  app.add_option("--collectives", a.collectives, "collectives whose algorithms get measured corrections "
                                                 "(comma-separated; 'none' for the α-β-γ figures only)")
      ->capture_default_str();
  app.add_option("--max-bytes", a.max_bytes, "largest calibrated size (16 B x 4^k up to this); "
                                             "suffixes K, M, G are powers of 1024")
      ->capture_default_str();
  app.add_option("--correction-reps", a.correction_reps, "sweeps per correction (the median is kept)")
      ->capture_default_str()
      ->check(CLI::Range(1, 21));
  app.add_flag("--append", a.append, "keep the profile at --output and add only this job's corrections");
  app.add_option("--passes", a.passes, "measure the figures until two passes in a row agree, at most this many (1: "
                                       "one pass, no check); the profile records the passes and any figure that "
                                       "still moved")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  app.add_option("--agree", a.agree, "how close two passes must be on every figure (relative)")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1.0));
  CLI11_PARSE(app, argc, argv);

  auto o = tools::tuneOptionsFromArgs(a);
  if (!o.isOk()) {
    fmt::print(stderr, "{}\n", o.status().message());
    return 2;
  }
  // Outside a job: one job of ourselves per rank count of --np.
  if (!chorus::env::raw("CHORUS_RANK")) return tools::launchTuneJobs(a, argc, argv);
  o->config = cfg.value();
  return tools::runTuneRank(std::move(o.value()), a, chorus::env::getString("CHORUS_RANK") == "0");
}

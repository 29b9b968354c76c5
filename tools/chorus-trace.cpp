// chorus-trace: reads what a job's ranks recorded.
//
//   chorus-trace hang DIR                 who waits where, from the flight recorders in DIR (CHORUS_FLIGHT_DIR)
//   chorus-trace merge DIR -o trace.json  every rank's trace (CHORUS_TRACE) on one timeline, as a Chrome trace
//   chorus-trace report DIR [--json]      stragglers, slow links, achieved vs predicted (docs/tracing.md)
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fstream>

#include "comm/hang_report.hpp"
#include "trace/analysis.hpp"

int main(int argc, char** argv) {
  CLI::App app{"chorus-trace: flight recorders and traces of a chorus job"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();  // --help shows every default
  std::string dir, out;
  bool json = false;
  auto* hang = app.add_subcommand("hang", "say which ranks wait in which collective, from CHORUS_FLIGHT_DIR dumps");
  hang->add_option("dir", dir, "the directory the ranks dumped their flight recorders to")->required();
  auto* merge = app.add_subcommand("merge", "merge the ranks' CHORUS_TRACE files into one Chrome trace (Perfetto)");
  merge->add_option("dir", dir, "the CHORUS_TRACE directory")->required();
  merge->add_option("-o,--output", out, "the JSON file to write ('-': stdout)")->default_str("stdout");
  auto* report = app.add_subcommand("report", "name the straggler and the slow link; achieved vs predicted times");
  report->add_option("dir", dir, "the CHORUS_TRACE directory")->required();
  report->add_flag("--json", json, "print JSON instead of text");
  CLI11_PARSE(app, argc, argv);

  if (hang->parsed()) {
    auto r = chorus::hangReport(dir);
    if (!r.isOk()) {
      fmt::print(stderr, "{}\n", r.status().message());
      return 1;
    }
    fmt::print("{}", r.value());
    return 0;
  }
  auto comms = chorus::trace::loadTraceDir(dir);
  if (!comms.isOk()) {
    fmt::print(stderr, "chorus-trace: {}\n", comms.status().message());
    return 1;
  }
  if (merge->parsed()) {
    const std::string text = chorus::trace::chromeTrace(comms.value()).dump();
    if (out.empty() || out == "-") {
      fmt::print("{}\n", text);
    } else {
      std::ofstream f(out);
      f << text << '\n';
      if (!f) {
        fmt::print(stderr, "chorus-trace: cannot write '{}'\n", out);
        return 1;
      }
      size_t ranks = 0;
      for (const auto& c : comms.value()) ranks += static_cast<size_t>(c.nranks);
      fmt::print(stderr, "chorus-trace: wrote {} ({} communicator(s), {} rank traces)\n", out, comms->size(), ranks);
    }
    return 0;
  }
  // report: every communicator, the largest first.
  nlohmann::json all = nlohmann::json::array();
  for (const auto& c : comms.value()) {
    const auto r = chorus::trace::analyse(c);
    if (json)
      all.push_back(chorus::trace::reportJson(r));
    else
      fmt::print("{}\n", chorus::trace::formatReport(r));
  }
  if (json) fmt::print("{}\n", all.size() == 1 ? all[0].dump(2) : all.dump(2));
  return 0;
}

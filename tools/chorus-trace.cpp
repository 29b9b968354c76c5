// chorus-trace: reads what a job's ranks recorded.
//
//   chorus-trace hang DIR     who waits where, from the flight recorders in DIR (CHORUS_FLIGHT_DIR)
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "comm/hang_report.hpp"

int main(int argc, char** argv) {
  CLI::App app{"chorus-trace: flight recorders and traces of a chorus job"};
  app.require_subcommand(1);
  std::string dir;
  auto* hang = app.add_subcommand("hang", "say which ranks wait in which collective, from CHORUS_FLIGHT_DIR dumps");
  hang->add_option("dir", dir, "the directory the ranks dumped their flight recorders to")->required();
  CLI11_PARSE(app, argc, argv);
  auto report = chorus::hangReport(dir);
  if (!report.isOk()) {
    fmt::print(stderr, "{}\n", report.status().message());
    return 1;
  }
  fmt::print("{}", report.value());
  return 0;
}

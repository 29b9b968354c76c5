// chorus-run: starts N local ranks of a program as one chorus job.
//
//   chorus-run -n 4 [--timeout SEC] [--no-prefix] [--] prog args...
//   chorus-run --print-env
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

#include "toolkit/launcher.hpp"

int main(int argc, char** argv) {
  CLI::App app{"chorus-run: launch N local ranks of a chorus program (each gets CHORUS_RANK, CHORUS_WORLD_SIZE, "
               "CHORUS_MASTER_ADDR/PORT and a fresh CHORUS_SECRET, and for torch.distributed's env:// MASTER_ADDR, "
               "MASTER_PORT (a port of its own), RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  app.footer("Usage: chorus-run -n N [OPTIONS] [--] prog args...\n"
             "Exit status: 0 when every rank succeeds; else the first failing rank's status (128+signal if it "
             "was killed); 124 on --timeout.");
  app.prefix_command();  // everything from the program name on belongs to the program
  chorus::tools::LaunchOptions opts;
  bool print_env = false;
  bool no_prefix = false;
  bool tag_output = true;  // accepted for mpirun users; prefixing is already the default
  double timeout_s = 0;
  double grace_s = 3;
  // Range checks with messages of our own: CLI11's PositiveNumber says "Value 0
  // not in range 0 to 1.797...e+308", a 300-digit bound.
  const CLI::Validator ranks_check(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          long long n = std::stoll(v, &used);
          if (used == v.size() && n >= 1 && n <= 1 << 20) return {};
        } catch (const std::exception&) {
        }
        return fmt::format("-n {}: the number of ranks must be a whole number from 1 to {}", v, 1 << 20);
      },
      "1..1048576");
  const CLI::Validator seconds_check(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          double s = std::stod(v, &used);
          if (used == v.size() && s > 0 && s <= 1e9) return {};
        } catch (const std::exception&) {
        }
        return fmt::format("--timeout {}: must be a number of seconds above 0 (at most 1e9); omit it for no timeout",
                           v);
      },
      "SEC > 0");
  app.add_option("-n,--np", opts.nranks, "number of ranks")->check(ranks_check);
  app.add_option("--timeout", timeout_s, "kill the job after SEC seconds and exit 124")
      ->check(seconds_check)
      ->default_str("none");
  app.add_option("--kill-grace", grace_s, "seconds between SIGTERM and SIGKILL when stopping ranks")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--tag-output", tag_output, "prefix each output line with \"[rank] \" (the default)");
  app.add_flag("--no-prefix", no_prefix, "relay output lines without the \"[rank] \" prefix");
  std::string bind = "none";
  app.add_option("--bind-to", bind, "none (default) or core: pin rank r to the r-th allowed CPU (round robin), as "
                                    "mpirun --bind-to core")
      ->check(CLI::IsMember({"none", "core"}));
  app.add_flag("--print-env", print_env, "list every CHORUS_* knob with its default and meaning, then exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (print_env) {
    std::fputs(chorus::tools::formatKnobTable().c_str(), stdout);
    std::fputs(("\n" + chorus::tools::formatMemorySpaces("")).c_str(), stdout);
    return 0;
  }
  opts.argv = app.remaining();
  if (!opts.argv.empty() && opts.argv.front() == "--") opts.argv.erase(opts.argv.begin());
  if (opts.argv.empty()) {
    fmt::print(stderr, "chorus-run: no program given\n{}", app.help());
    return 2;
  }
  opts.prefix_stdout = opts.prefix_stderr = !no_prefix;
  opts.bind_cores = bind == "core";
  if (timeout_s > 0)
    opts.timeout = std::chrono::ceil<std::chrono::milliseconds>(std::chrono::duration<double>(timeout_s));
  opts.kill_grace = std::chrono::ceil<std::chrono::milliseconds>(std::chrono::duration<double>(grace_s));

  auto report = chorus::tools::launch(opts);
  if (!report.isOk()) {
    fmt::print(stderr, "{}\n", report.status().message());
    return 1;
  }
  return report->exit_code;
}

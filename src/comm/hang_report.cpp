#include "comm/hang_report.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "comm/flight.hpp"

namespace chorus {

Result<std::string> hangReport(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return invalidArgument("chorus-trace hang: '{}' is not a directory", dir);
  std::map<int, FlightSummary> by_rank;
  int nranks = 0;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("flight-", 0) != 0 || entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    std::stringstream ss;
    ss << in.rdbuf();
    int n = 0;
    auto s = summaryFromJson(ss.str(), &n);
    if (!s.isOk()) return s.status().withContext(fmt::format("{}: ", entry.path().string()));
    nranks = std::max({nranks, n, s->rank + 1});
    by_rank[s->rank] = s.value();
  }
  if (by_rank.empty()) return invalidArgument("chorus-trace hang: no flight-*.json files in '{}' (was CHORUS_FLIGHT_DIR set?)", dir);
  // The operation in trouble: the oldest one still running on some rank.
  FlightEntry stuck;
  bool found = false;
  for (const auto& [r, s] : by_rank)
    if (s.has_current && (!found || s.current.seq < stuck.seq)) {
      stuck = s.current;
      found = true;
    }
  std::vector<FlightSummary> all(nranks);  // rank -1: no file
  for (const auto& [r, s] : by_rank)
    if (r >= 0 && r < nranks) all[r] = s;
  if (!found) {
    std::string missing;
    for (int r = 0; r < nranks; ++r)
      if (all[r].rank < 0) missing += fmt::format("; rank {}: no flight record (did it start?)", r);
    return fmt::format("{} rank(s) dumped a flight recorder; none was inside a collective{}\n", by_rank.size(), missing);
  }
  return fmt::format("{}: {}\n", describeEntry(stuck), diagnoseHang(stuck, all, /*offline=*/true));
}

}  // namespace chorus

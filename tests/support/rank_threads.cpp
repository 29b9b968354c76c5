#include "support/rank_threads.hpp"

#include <fmt/format.h>

#include <thread>

#include "api/config.hpp"

namespace chorus::testing {

namespace {
// cfg nullptr and cfg_of empty: chorusCommInitRank (the environment's configuration).
std::vector<std::string> run(int nranks, const Config* cfg,
                             const std::function<std::string(int, chorusComm_t)>& body,
                             const std::function<Config(int)>& cfg_of = {}) {
  std::vector<std::string> msgs(nranks);
  chorusUniqueId id;
  if (chorusGetUniqueId(&id) != chorusSuccess) {
    msgs[0] = fmt::format("chorusGetUniqueId: {}", chorusGetLastError(nullptr));
    return msgs;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      chorusComm_t comm = nullptr;
      const chorusResult_t made = cfg_of    ? api::commInitRank(&comm, nranks, id, r, cfg_of(r))
                                  : cfg != nullptr ? api::commInitRank(&comm, nranks, id, r, *cfg)
                                                   : chorusCommInitRank(&comm, nranks, id, r);
      if (made != chorusSuccess) {
        msgs[r] = fmt::format("rank {}: init: {}", r, chorusGetLastError(nullptr));
        return;
      }
      msgs[r] = body(r, comm);
      if (chorusCommDestroy(comm) != chorusSuccess && msgs[r].empty())
        msgs[r] = fmt::format("rank {}: destroy: {}", r, chorusGetLastError(nullptr));
    });
  }
  for (auto& t : threads) t.join();
  return msgs;
}
}  // namespace

std::vector<std::string> runRanks(int nranks, const std::function<std::string(int, chorusComm_t)>& body) {
  return run(nranks, nullptr, body);
}

std::vector<std::string> runRanks(int nranks, const Config& cfg,
                                  const std::function<std::string(int, chorusComm_t)>& body) {
  return run(nranks, &cfg, body);
}

std::vector<std::string> runRanksPerRank(int nranks, const std::function<Config(int)>& cfg_of,
                                         const std::function<std::string(int, chorusComm_t)>& body) {
  return run(nranks, nullptr, body, cfg_of);
}

std::string failures(const std::vector<std::string>& msgs) {
  std::string s;
  for (const auto& m : msgs)
    if (!m.empty()) s += m + "\n";
  return s;
}

}  // namespace chorus::testing

// Runs N ranks as threads of this process, each with its own communicator
// made by chorusCommInitRank (or, given a chorus::Config, api::commInitRank,
// which configures it without the environment) from one unique id.  Breadth tests use it to
// cover many rank counts cheaply; real processes are in tests/integration.
#pragma once

#include <chorus/chorus.h>

#include <functional>
#include <string>
#include <vector>

#include "common/config.hpp"

namespace chorus::testing {

// Calls body(rank, comm) on nranks threads; returns one message per rank
// ("" = ok).  Init and destroy failures are reported as messages too.
std::vector<std::string> runRanks(int nranks, const std::function<std::string(int, chorusComm_t)>& body);
// The same with every communicator configured by cfg (api::commInitRank).
std::vector<std::string> runRanks(int nranks, const Config& cfg,
                                  const std::function<std::string(int, chorusComm_t)>& body);

// The same with rank r's communicator configured by cfg_of(r) (e.g. a
// net.host_id per rank: ranks of one process on several "hosts").
std::vector<std::string> runRanksPerRank(int nranks, const std::function<Config(int)>& cfg_of,
                                         const std::function<std::string(int, chorusComm_t)>& body);

// Joins the non-empty messages (for a gtest failure message).
std::string failures(const std::vector<std::string>& msgs);

}  // namespace chorus::testing

// Runs N ranks as threads of this process, each with its own communicator
// made by chorusCommInitRank from one unique id.  Breadth tests use it to
// cover many rank counts cheaply; real processes are in tests/integration.
#pragma once

#include <chorus/chorus.h>

#include <functional>
#include <string>
#include <vector>

namespace chorus::testing {

// Calls body(rank, comm) on nranks threads; returns one message per rank
// ("" = ok).  Init and destroy failures are reported as messages too.
std::vector<std::string> runRanks(int nranks, const std::function<std::string(int, chorusComm_t)>& body);

// Joins the non-empty messages (for a gtest failure message).
std::string failures(const std::vector<std::string>& msgs);

}  // namespace chorus::testing
